"""Models of the plugin. fairseq imports every module of this folder for ``--user-dir``;
importing the package does the same for a plain ``import slim_fairseq``. Every preset is then
wrapped so that its model's ``check_args`` runs right after fairseq parses the command line
(one-line errors before any data is loaded; :mod:`slim_fairseq.option_errors`)."""
import importlib
import os

from slim_fairseq.option_errors import install_checked_presets

for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(f"{__name__}.{_file[:-3]}")

install_checked_presets(__name__)
