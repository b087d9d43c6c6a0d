"""Models of the plugin. fairseq imports every module of this folder for ``--user-dir``;
importing the package does the same for a plain ``import slim_fairseq``."""
import importlib
import os

for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(f"{__name__}.{_file[:-3]}")
