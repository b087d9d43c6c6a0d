"""slim_fairseq: parameter-slimming transformers as a fairseq plugin (``--user-dir``).

Importing the package registers its models and architectures with fairseq and allow-lists
the classes fairseq checkpoints contain for torch's weights-only loading
(:mod:`slim_fairseq.checkpoint_safety`), and stops fairseq's batch-prefetching thread at exit so
that a finished run cannot abort during interpreter shutdown (:mod:`slim_fairseq.clean_exit`).
It prints nothing and changes nothing else.
"""
import os

from slim_fairseq import checkpoint_safety, clean_exit

__version__ = "0.2.0"

checkpoint_safety.install()
clean_exit.install()

from slim_fairseq import models  # noqa: E402,F401  (registers models and archs)


def user_dir():
    """Absolute path to pass as ``--user-dir``."""
    return os.path.dirname(os.path.abspath(__file__))
