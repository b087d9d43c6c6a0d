"""Models of the plugin. fairseq imports every module of this folder for ``--user-dir``;
importing the package does the same for a plain ``import slim_fairseq``. Each architecture is a
:class:`~slim_fairseq.models.presets.Preset` registered with fairseq as it is: fairseq's parser
calls it right after parsing the command line, so the options are checked before any data is
loaded (one-line errors; :mod:`slim_fairseq.option_errors`)."""
import importlib
import os

# the two models first: the presets of the other files are architectures of them
_MODELS = ("slim_transformer", "slim_lm")
for _name in _MODELS + tuple(sorted(f[:-3] for f in os.listdir(os.path.dirname(__file__))
                                    if f.endswith(".py") and not f.startswith("_"))):
    importlib.import_module(f"{__name__}.{_name}")
