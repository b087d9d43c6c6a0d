"""Where the lab finds things: the repository checkout it belongs to (installed editable, as
``make setup`` does) and the plugin directory fairseq's ``--user-dir`` takes."""
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO_ROOT, "slim_fairseq")


def output_dir(name, out=None):
    """``out``, else ``results/<name>`` in the checkout (the tools' ``--out`` / ``--name``)."""
    return out or os.path.join(REPO_ROOT, "results", name)
