"""slim_fairseq: parameter-slimming transformers as a fairseq plugin (``--user-dir``).

Importing the package registers its models and architectures with fairseq and allow-lists
the classes fairseq checkpoints contain for torch's weights-only loading
(:mod:`slim_fairseq.checkpoint_safety`), stops fairseq's batch-prefetching thread at exit so
that a finished run cannot abort during interpreter shutdown (:mod:`slim_fairseq.clean_exit`),
ends a command refused by the plugin with one line and exit status 2, and one interrupted by
Ctrl-C with one line and status 130 (:func:`slim_fairseq.option_errors.install_command_edge`),
and hides the warnings fairseq 0.12.3's own code causes on every run, which no option of the
user changes (its use of Hydra 1.3 and of ``torch.cuda.amp.autocast``, its pinned memory on a
CPU: :data:`HARMLESS_FAIRSEQ_WARNINGS`). It prints nothing else and changes nothing else.
"""
import os
import warnings

from slim_fairseq import checkpoint_safety, clean_exit, option_errors

__version__ = "0.2.0"

checkpoint_safety.install()
clean_exit.install()
option_errors.install_command_edge()

#: (category, start of the message) of warnings that fairseq 0.12.3's code triggers on every run
#: and no user option changes: Hydra 1.3 on the API fairseq composes its config with, torch on
#: fairseq's autocast call and on its pin_memory=True where there is no GPU to pin for
HARMLESS_FAIRSEQ_WARNINGS = (
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental"),
    (UserWarning, r"\s*The version_base parameter is not specified"),
    (UserWarning, r"In 'config': Usage of deprecated keyword in package header"),
    (UserWarning, r"\s*'config' is validated against ConfigStore schema"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated"),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
)
for _category, _message in HARMLESS_FAIRSEQ_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=_category)

from slim_fairseq import models  # noqa: E402,F401  (registers models and archs)


def user_dir():
    """Absolute path to pass as ``--user-dir``."""
    return os.path.dirname(os.path.abspath(__file__))
