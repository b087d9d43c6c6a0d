"""One-line errors for bad plugin options, on the command line and in Python.

:class:`OptionError` is a ``ValueError`` (``except ValueError`` and ``pytest.raises(ValueError)``
catch it in Python). fairseq's own commands (``fairseq-train``, ``fairseq-generate``, ...) are
not the plugin's, so its edge is :func:`install_command_edge`, a ``sys.excepthook`` set when the
plugin is imported: an uncaught refusal, also one fairseq wrapped in an exception of its own
while loading a checkpoint, prints ``PROG: error: --flag ...`` (argparse's format) and exits
with status 2, as argparse does; an interrupt (Ctrl-C) prints ``PROG: interrupted`` and exits
with status 130 (128 + SIGINT), the shells' convention. Every other error keeps its traceback.

Every refusal has one format, ``SUBJECT=VALUE: what is wrong; allowed: what would work``
(:func:`refusal`; :func:`option_error` for a flag, written without ``=value`` when it takes no
value), and one class, :class:`OptionError`, in the plugin and in the lab (its recipes and
scripts load this module by its path: it imports neither fairseq nor torch). Each command's edge
prints it as ``PROG: error: MESSAGE`` and exits with its :attr:`~OptionError.status`.
:func:`check_kind` is the one check of a value against its kind (a choice, a whole number, a
ratio, ...), for the plugin's options and the recipes' alike.

The plugin checks its options right after fairseq parses the command line (the architecture's
preset checks them, so nothing is loaded or logged before the error), and when the model is
built from a config that was not parsed so (a checkpoint, the hub route); equal options are
checked once (:class:`slim_fairseq.models.slim_options.ModelOptions`). The plugin's option
errors start with the flag they name (``--tie-ffn: ...``); :func:`one_line_option_errors` turns
those into :class:`OptionError` at the model boundary.
"""
import contextlib
import os
import re
import sys


#: exit status of a refused command line (argparse's), of a step that failed after the checks
#: and of an interrupted command (128 + SIGINT)
REFUSED, FAILED, INTERRUPTED = 2, 1, 130


def prog_name():
    """The running command's name, as argparse shows it."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"


class OptionError(ValueError):
    """A one-line refusal of a bad option, argument or input; the message names it first.
    ``alternatives``: the changes of the command line the refusal proposes, as dicts
    {flag: value}, value None for "drop the flag" (see :func:`option_error`). ``status``: the
    command's exit status, :data:`REFUSED` (nothing ran), or :data:`FAILED` for a step that failed
    after the checks (a recipe's tool)."""

    def __init__(self, message, alternatives=(), most=None, status=REFUSED):
        super().__init__(message)
        self.alternatives = list(alternatives)
        self.most = most  # how many of the alternatives that pass the refusal shows (None: all)
        self.rule = None  # the name of the rule that refused (slim_fairseq.options.check_rules)
        self.status = status

    def with_alternatives(self, alternatives, otherwise="another setting of the options named"):
        """The same refusal proposing only ``alternatives`` (a checker kept those that pass; the
        first :attr:`most` of them), or ``otherwise`` when none is left."""
        alternatives = list(alternatives)[:self.most]
        head, problem = str(self).rsplit("; allowed: ", 1)[0].split(": ", 1)
        allowed = render_alternatives(alternatives) if alternatives else otherwise
        changed = refusal(head, problem, allowed, alternatives)
        changed.rule = self.rule
        return changed


def render_alternatives(alternatives):
    """``allowed`` text of command-line changes: ``--a x|y, or --b 0 --c 1, or drop --d``
    (a value None drops the flag, True gives a flag that takes no value)."""
    single, parts = {}, []
    for change in alternatives:
        if len(change) == 1 and not any(value is None or value is True for value in change.values()):
            (flag, value), = change.items()
            single.setdefault(flag, []).append(str(value))
        else:
            dropped = [flag for flag, value in change.items() if value is None]
            words = (["drop " + " ".join(dropped)] if dropped else []) + [
                flag if value is True else f"{flag} {value}"
                for flag, value in change.items() if value is not None]
            parts.append(" ".join(words))
    return ", or ".join([f"{flag} {'|'.join(values)}" for flag, values in single.items()] + parts)


def refusal(subject, problem, allowed, alternatives=(), most=None):
    """The one refusal format: ``SUBJECT: problem; allowed: allowed`` (SUBJECT: ``--flag=value``,
    ``--flag``, ``FILE=path``, ...). Returns the :class:`OptionError` to raise."""
    return OptionError(f"{subject}: {problem}; allowed: {allowed}", alternatives, most)


def option_error(flag, value, problem, allowed=None, alternatives=(), most=None):
    """The plugin's one option-error format: ``--flag=value: problem; allowed: allowed``
    (``value`` None or True: a flag without a value). ``alternatives``, changes of the command
    line such as ``{"--kv-heads": 0}`` (``{"--flag": None}``: drop it; ``{"--no-flag": True}``:
    give a flag that takes no value), are what ``allowed`` says when it is None; a checker that
    can try them keeps only those that pass, and shows the first ``most``
    (``slim_options.validate_slim_args``). Returns the :class:`OptionError` to raise."""
    shown = flag if value is None or value is True else f"{flag}={value}"
    if allowed is None:
        allowed = render_alternatives(list(alternatives)[:most])
    return refusal(shown, problem, allowed, alternatives, most)


SIZE = re.compile(r"^([0-9]+)([KkMmGgTt]?)$")
WHOLE = re.compile(r"^[0-9]+$")


def _number(text):
    try:
        return float(text)
    except ValueError:
        return float("nan")  # fails every test below


def _whole(text):
    return int(text) if WHOLE.fullmatch(text) else float("nan")


#: kind -> (what a value of the kind is, the allowed text, how a command-line word is read, the
#: test of a value read, what is wrong with a number that fails it). A word that fails is "not"
#: what the kind is (it may be no number at all).
KINDS = {
    "count": ("a whole number >= 1", None, _whole, lambda n: n >= 1, "not a whole number >= 1"),
    "whole": ("a whole number >= 0", None, _whole, lambda n: n >= 0, "not a whole number >= 0"),
    "nonneg": ("a number >= 0", None, _number, lambda n: n >= 0, "negative"),
    "positive": ("a number > 0", None, _number, lambda n: n > 0, "not positive"),
    "fraction": ("a number in (0, 1]", None, _number, lambda n: 0 < n <= 1,
                 "not a number in (0, 1]"),
    "ratio": ("a ratio in [0, 1] (0 = dense)", None, _number, lambda n: 0 <= n <= 1,
              "not a parameter ratio"),
    "length": ("an integer >= 2", None, _whole, lambda n: n >= 2, "too short for a chain"),
    "size": ("a size", "a number of bytes with an optional K, M, G or T (e.g. 500M, 9G)",
             lambda text: text if SIZE.fullmatch(text) else None, lambda n: n is not None,
             "not a size"),
}


def check_kind(flag, value, kind, choices=(), allowed=None, otherwise=None, refused_choices=(),
               choice_why=""):
    """Refuse ``value`` of ``flag`` unless it is of ``kind``: ``choice`` (one of ``choices``; one
    of ``refused_choices`` is refused with ``choice_why``) or a row of :data:`KINDS`. ``value``
    is a number (an option fairseq's parser read; None: unset, it passes) or the word written on
    the command line (a recipe's). The refusal allows ``allowed`` (default: what the kind is),
    then ``otherwise`` (``drop --flag (default 5)``). Returns ``value``."""
    if kind == "choice":
        if value in choices:
            return value
        problem = choice_why if value in refused_choices else "not one of the choices"
        raise option_error(flag, value, problem, allowed or "|".join(choices))
    if kind not in KINDS:
        raise ValueError(f"kind={kind}: not a kind of value; allowed: choice|" + "|".join(KINDS))
    what, shown, read, test, problem = KINDS[kind]
    if value is None:
        return value
    if isinstance(value, str):
        number, problem = read(value), f"not {what}"
    else:
        number = value
    if not test(number):
        allowed = allowed or shown or what
        raise option_error(flag, value, problem,
                           allowed if otherwise is None else f"{allowed}, or {otherwise}")
    return value


def nearest(name, names, count=3):
    """The ``count`` names of ``names`` closest to ``name`` (difflib's ratio), best first."""
    import difflib
    return difflib.get_close_matches(name, list(names), n=count, cutoff=0.5)


def unknown_arch(arch):
    """The one-line refusal of an ``--arch`` fairseq does not know, naming the closest names."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    close = nearest(arch, ARCH_MODEL_REGISTRY)
    allowed = ("the closest: " + ", ".join(close) + "; " if close else "") + \
        "slim-fairseq-help --archs lists every architecture"
    return option_error("--arch", arch, "not an architecture", allowed)


def refusal_in(error):
    """The :class:`OptionError` that ``error`` is, or that it was raised from or while handling
    (fairseq wraps errors of a checkpoint's loading in its own ``Exception``); None if none."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OptionError):
            return error
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return None


def print_refusal(message, prog=None):
    """Print the one-line refusal ``PROG: error: message``; returns its exit status, 2."""
    sys.stdout.flush()
    print(f"{prog or prog_name()}: error: {message}", file=sys.stderr, flush=True)
    return REFUSED


def print_interrupted(prog=None):
    """Print ``PROG: interrupted`` (Ctrl-C); returns its exit status, 130."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a closed or broken stdout must not hide the line
        pass
    print(f"{prog or prog_name()}: interrupted", file=sys.stderr, flush=True)
    return INTERRUPTED


def exit_refused(message, prog=None):
    """End a command with its one-line refusal ``PROG: error: message``, status 2."""
    sys.exit(print_refusal(message, prog))


def exit_interrupted(prog=None):
    """End a command stopped by Ctrl-C: ``PROG: interrupted``, status 130."""
    sys.exit(print_interrupted(prog))


def _command_edge(kind, error, trace, previous):
    if issubclass(kind, KeyboardInterrupt):
        exit_interrupted()
    refusal = refusal_in(error)
    if refusal is not None and "\n" not in str(refusal):
        exit_refused(str(refusal))
    previous(kind, error, trace)


def install_command_edge():
    """Set ``sys.excepthook`` so that a command ending in an uncaught plugin refusal prints its one
    line and exits 2, and one ended by Ctrl-C prints one line and exits 130; any other error
    goes to the hook that was there. Python's ``SystemExit`` from the hook runs the ``atexit``
    handlers as a normal exit does. Installed once."""
    if getattr(sys.excepthook, "slim_fairseq_edge", False):
        return
    previous = sys.excepthook

    def hook(kind, error, trace):
        _command_edge(kind, error, trace, previous)

    hook.slim_fairseq_edge = True
    sys.excepthook = hook


def names_a_flag(error):
    return str(error).startswith("--")


@contextlib.contextmanager
def one_line_option_errors():
    """Re-raise a ``ValueError`` whose message starts with a flag as :class:`OptionError`."""
    try:
        yield
    except OptionError:
        raise
    except ValueError as error:
        if not names_a_flag(error) or "\n" in str(error):
            raise
        raise OptionError(str(error)) from error


def task_class(task):
    """The task class of a task object or of a ``--task`` name (None if unknown)."""
    if task is None:
        return None
    if isinstance(task, str):
        from fairseq.tasks import TASK_REGISTRY
        return TASK_REGISTRY.get(task)
    return type(task)


LM_ARCH_HINT = "slim_lm, anthe_lm_*, subformer_lm_*, stlm_*, skipless_lm*"


def check_task(is_lm, arch, task):
    """Refuse an encoder-decoder model on ``language_modeling`` and a language model on a
    translation task (fairseq would fail later with an unrelated message, or train nonsense)."""
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.translation import TranslationTask

    cls = task_class(task)
    if cls is None:
        return
    if not is_lm and issubclass(cls, LanguageModelingTask):
        raise option_error(
            "--arch", arch, f"an encoder-decoder (translation) model cannot be used with --task "
            f"{_task_name(task, cls)}", f"a language model ({LM_ARCH_HINT}); for a translation "
            "checkpoint fairseq-generate / fairseq-interactive with --task translation")
    if is_lm and issubclass(cls, TranslationTask):
        raise option_error(
            "--arch", arch, f"a language model cannot be used with --task {_task_name(task, cls)}",
            "--task language_modeling (fairseq-eval-lm, or fairseq-generate/-interactive with "
            "--task language_modeling), or an encoder-decoder arch such as anthe_base")


def _task_name(task, cls):
    if isinstance(task, str):
        return task
    from fairseq.tasks import TASK_REGISTRY
    for key, value in TASK_REGISTRY.items():
        if value is cls:
            return key
    return cls.__name__
