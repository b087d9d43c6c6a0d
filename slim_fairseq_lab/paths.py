"""Where the lab finds things: the repository checkout it belongs to (installed editable, as
``make setup`` does) and the plugin directory fairseq's ``--user-dir`` takes."""
import functools
import importlib.util
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO_ROOT, "slim_fairseq")


def output_dir(name, out=None):
    """``out``, else ``results/<name>`` in the checkout (the tools' ``--out`` / ``--name``)."""
    return out or os.path.join(REPO_ROOT, "results", name)


@functools.lru_cache(maxsize=None)
def plugin_module(name):
    """slim_fairseq/NAME.py, loaded by path (once per process) so that the lab does not import
    fairseq for it (the package's __init__ registers every model); the loaded package's module
    when it is already imported. For the plugin's modules that import neither fairseq nor torch
    at import time (``option_errors``, ``checkpoint_safety``, ``data_record``)."""
    module = sys.modules.get(f"slim_fairseq.{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"_slim_fairseq_{name}",
                                                      os.path.join(PLUGIN_DIR, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module
