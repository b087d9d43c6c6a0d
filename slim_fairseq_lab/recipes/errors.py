"""What stops a recipe: :class:`RecipeError`, raised by the recipes and the tools they run,
printed in one line by the recipe's command line (:func:`slim_fairseq_lab.recipes.cli.run`)."""


class RecipeError(Exception):
    """What stops a recipe, as the one line to print after ``PROG: error: ``; ``status``: its
    exit status (2: refused before anything ran, 1: a step failed)."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status
