"""The edge of every script under ``scripts/``: how a command ends, in one line.

* a refusal (a bad command line or input, found before anything is written): one line on
  stderr and exit status 2, argparse's own;
* an interrupt (Ctrl-C, SIGINT): ``PROG: interrupted`` and exit status 130 (128 + SIGINT), the
  shells' convention;
* success: 0; a step that failed after the checks: 1.

The plugin's own commands (``slim-fairseq-help``, ``slim-fairseq-export-hf``, and fairseq's tools
with ``--user-dir slim_fairseq``) end the same way (:mod:`slim_fairseq.option_errors`). This
module imports neither fairseq nor torch.
"""
import sys

from slim_fairseq_lab.paths import plugin_module

# the plugin's command edge (slim_fairseq/option_errors.py, which imports neither fairseq nor
# torch): the exit statuses, the command's name and the two one-line endings, defined there once
_edge = plugin_module("option_errors")
#: exit status of a refusal (argparse's) and of a command stopped by Ctrl-C (128 + SIGINT)
REFUSED, INTERRUPTED = _edge.REFUSED, _edge.INTERRUPTED
prog_name = _edge.prog_name


def refused(message, prog=None):
    """Print the refusal ``PROG: error: message`` (one line) and return exit status 2."""
    return _edge.print_refusal(message, prog)


def run(main, argv=None, prog=None):
    """``main(argv)`` as a command's exit status (its int, else 0: some return what they
    measured): a ``SystemExit`` carrying a message (a script's refusal) prints it and gives 2,
    Ctrl-C prints ``PROG: interrupted`` and gives 130."""
    try:
        status = main(argv) if argv is not None else main()
        return status if isinstance(status, int) else 0
    except KeyboardInterrupt:
        return _edge.print_interrupted(prog)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            raise
        sys.stdout.flush()
        print(str(stop.code).rstrip("\n"), file=sys.stderr, flush=True)
        return REFUSED
