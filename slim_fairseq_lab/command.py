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
import os
import sys

#: exit status of a refusal (argparse's) and of a command stopped by Ctrl-C (128 + SIGINT)
REFUSED, INTERRUPTED = 2, 130


def prog_name():
    """The running command's name, as argparse shows it."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def refused(message, prog=None):
    """Print the refusal ``PROG: error: message`` (one line) and return exit status 2."""
    sys.stdout.flush()
    print(f"{prog or prog_name()}: error: {message}", file=sys.stderr, flush=True)
    return REFUSED


def run(main, argv=None, prog=None):
    """``main(argv)`` as a command's exit status (its int, else 0: some return what they
    measured): a ``SystemExit`` carrying a message (a script's refusal) prints it and gives 2,
    Ctrl-C prints ``PROG: interrupted`` and gives 130."""
    try:
        status = main(argv) if argv is not None else main()
        return status if isinstance(status, int) else 0
    except KeyboardInterrupt:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - a broken stdout must not hide the line
            pass
        print(f"{prog or prog_name()}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            raise
        sys.stdout.flush()
        print(str(stop.code).rstrip("\n"), file=sys.stderr, flush=True)
        return REFUSED
