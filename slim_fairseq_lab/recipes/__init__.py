"""The recipes of examples/ (``examples/*/*.sh``, each a one-line ``exec`` of a module here).

One module per recipe, ``main(argv)`` its command line (``python -m slim_fairseq_lab.recipes.NAME``),
and the parts they share:

* :mod:`.cli`: the command line (argparse; ``--name=VALUE`` is ``--name VALUE``; options the
  recipe does not know go to the fairseq tool it runs), ``--help`` (the module's docstring), the
  one-line errors and the exit statuses;
* :mod:`.tools`: the fairseq tools and other programs, run as subprocesses in their own process
  group, signals forwarded, output streamed, a failure reported in one line with its log;
* :mod:`.outputs`: results written only when a run succeeds, never over an input;
* :mod:`.downloads`, :mod:`.text`, :mod:`.pipelines`: downloads, the text steps and the two
  segmentations of the prepare recipes;
* :mod:`.training`: the launcher of the train recipes; :mod:`.checkpoints`: the checkpoint an
  evaluation reads; :mod:`.comparisons`: the bundled-corpus comparisons.

Every check runs before anything is written: a refused run leaves the files it found.
"""
