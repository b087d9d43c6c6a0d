"""The plugin and the lab refuse with one class and one format, and check a value against its
kind with one function (slim_fairseq/option_errors.py): the recipes' command line, fairseq's
options of the plugin, the compression and the checkpoint readers all raise
``OptionError``; a failed step is one too (exit status 1); a signal is not a refusal."""
import os
import signal

import pytest

from helpers import REPO, load_plugin

load_plugin()

from slim_fairseq import options as vocabulary  # noqa: E402
from slim_fairseq.models.slim_options import BY_DEST  # noqa: E402
from slim_fairseq.option_errors import FAILED, REFUSED, OptionError, check_kind  # noqa: E402
from slim_fairseq_lab import checkpoints  # noqa: E402
from slim_fairseq_lab.recipes import cli, tools  # noqa: E402


def test_the_lab_and_the_plugin_raise_one_class():
    """The lab's handle of the class is the plugin's: the same source,
    slim_fairseq/option_errors.py, loaded by its path when the lab needs it before fairseq is
    imported (then the lab catches its own refusals, and turns the plugin's into them where it
    calls the plugin: recipes/training.py)."""
    source = os.path.join(REPO, "slim_fairseq", "option_errors.py")
    for handle in (OptionError, cli.OptionError, tools._errors.OptionError,
                   checkpoints.OptionError):
        assert os.path.samefile(handle.__init__.__code__.co_filename, source)
        assert issubclass(handle, ValueError)


def test_a_refusal_and_a_failure_carry_their_exit_status():
    assert cli.refuse("--x=1", "wrong", "2").status == REFUSED
    failure = cli.step_failed("fairseq-train failed (exit 1): boom; see train.log")
    assert isinstance(failure, cli.OptionError) and failure.status == FAILED
    assert str(tools.tool_failed("tool", 3, None, "ValueError: boom")) == \
        "tool failed (exit 3): ValueError: boom (its output is above)"
    assert tools.tool_failed("tool", 3, None, "x").status == FAILED


def test_a_signal_is_no_refusal():
    """A signal that arrives inside ``except ValueError`` must not be caught there."""
    stopped = tools.Interrupted(signal.SIGTERM)
    assert not isinstance(stopped, ValueError) and stopped.status == 128 + signal.SIGTERM


def test_the_recipe_edge_prints_one_line_with_the_status(capsys):
    def fail(argv):
        raise cli.step_failed("step failed (exit 1): boom")

    def refused(argv):
        raise cli.refuse("--n=0", "not a whole number >= 1", "a whole number >= 1")

    assert cli.run("r.sh", "doc", fail, []) == FAILED
    assert capsys.readouterr().err == "r.sh: error: step failed (exit 1): boom\n"
    assert cli.run("r.sh", "doc", refused, []) == REFUSED
    assert capsys.readouterr().err == \
        "r.sh: error: --n=0: not a whole number >= 1; allowed: a whole number >= 1\n"


def test_a_checkpoint_that_does_not_exist_is_the_one_class(tmp_path):
    with pytest.raises(checkpoints.OptionError, match="checkpoint not found"):
        checkpoints.load(str(tmp_path / "none.pt"))


@pytest.mark.parametrize("kind, word, number, problem", [
    ("positive", "-1", -1.0, ("not a number > 0", "not positive")),
    ("count", "0", 0, ("not a whole number >= 1", "not a whole number >= 1")),
    ("ratio", "2", 2.0, ("not a ratio in [0, 1] (0 = dense)", "not a parameter ratio")),
])
def test_one_check_reads_a_word_and_a_number(kind, word, number, problem):
    """A word from a recipe's command line is "not" what the kind is (it may be no number);
    a number fairseq's parser read names what is wrong with it."""
    for value, wrong in zip((word, number), problem):
        with pytest.raises(OptionError) as caught:
            check_kind("--x", value, kind)
        assert str(caught.value).startswith(f"--x={value}: {wrong}; allowed: ")


def test_the_plugin_and_the_recipes_check_choices_alike():
    """The plugin's option rule and the recipes' value check are the same function."""
    described = BY_DEST["glu_hidden"]
    with pytest.raises(OptionError) as plugin:
        vocabulary.check_value(described, "half")
    choices = "|".join(described.choices)
    with pytest.raises(cli.OptionError) as recipe:
        cli.check_value("--glu-hidden", "half", "choice:" + choices)
    assert str(plugin.value) == str(recipe.value) == \
        f"--glu-hidden=half: not one of the choices; allowed: {choices}"


def test_the_plugin_has_no_unregister():
    """Registering is once per process; tests undo theirs with ``helpers.unregister``."""
    for folder, _, files in os.walk(os.path.join(REPO, "slim_fairseq")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    assert "def unregister" not in f.read(), os.path.join(folder, name)
