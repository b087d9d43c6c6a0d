"""The command line every recipe shares: argparse with the recipes' value types, the options
that pass on to a fairseq tool, ``--help``, and the one-line errors.

``--name=VALUE`` and ``--name VALUE`` are the same everywhere (argparse, without
abbreviations: an option the recipe does not know goes to the fairseq tool it runs, as written).
An option of the fairseq tool written before all positional arguments are given is refused: its
value and the next positional argument cannot be told apart (``--dropout 0.2 DATA`` would read
0.2 as DATA). A value is checked when it is read, by its kind: ``count`` (a whole number >= 1),
``whole`` (>= 0), ``positive`` (a number > 0), ``fraction`` (in (0, 1]), ``size`` (bytes with
an optional K, M, G or T) or ``choice:a|b|c``; the refusal of a value proposes the choices, or
dropping the option (its default).

Every refusal is one line, ``PROG: error: --name=VALUE: what is wrong; allowed: ...``, exit
status 2; a failure of a tool the recipe ran is one line too, exit status 1.
"""
import argparse
import re
import sys
import time

from slim_fairseq_lab.paths import plugin_module
from slim_fairseq_lab.recipes import tools

# the one refusal class and format, and the one value check (slim_fairseq/option_errors.py, which
# imports neither fairseq nor torch)
_errors = plugin_module("option_errors")
OptionError, refuse, SIZE = _errors.OptionError, _errors.refusal, _errors.SIZE
SIZE_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def step_failed(message):
    """A step that failed after the checks (a tool the recipe ran): one line, exit status 1."""
    return OptionError(message, status=_errors.FAILED)


def needs_value(flag):
    """The refusal of ``flag`` given without its value."""
    return refuse(flag, "needs a value", f"{flag} VALUE")


def log(message):
    """A progress line on stderr, as every recipe writes them: ``[HH:MM:SS] message``."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_size(value):
    """``9G`` -> bytes (K, M, G, T: powers of 1024)."""
    number, unit = SIZE.fullmatch(value).groups()
    return int(number) * 1024 ** SIZE_UNITS[unit.lower()]


def check_value(flag, value, kind, default=None):
    """``value`` of ``flag`` against its ``kind`` (None: any non-empty string; ``choice:a|b|c``,
    else a kind of :func:`slim_fairseq.option_errors.check_kind`); a refusal proposes the
    choices, or dropping ``flag`` (for its ``default``, when it has one the parser knows)."""
    if value == "":
        raise needs_value(flag)
    if not kind:
        return value
    if kind.startswith("choice:"):
        return _errors.check_kind(flag, value, "choice", choices=kind.split(":", 1)[1].split("|"))
    drop = f"drop {flag} (" + (f"default {default}" if default is not None else "its default") + ")"
    return _errors.check_kind(flag, value, kind, otherwise=drop)


class Value(argparse.Action):
    """An option with a value of a ``kind`` (see :func:`check_value`); ``append=True`` keeps every
    value given (a list)."""

    def __init__(self, option_strings, dest, kind=None, append=False, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.kind, self.append = kind, append

    def __call__(self, parser, namespace, values, option_string=None):
        default = None if isinstance(self.default, list) else self.default
        value = check_value(option_string, values, self.kind, default)
        if self.append:
            setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + [value])
        else:
            setattr(namespace, self.dest, value)


class Refused(argparse.Action):
    """An option the recipe sets itself: refused whatever its spelling, with ``why`` and what
    to do instead (``allowed``)."""

    def __init__(self, option_strings, dest, why="", allowed="", **kwargs):
        kwargs.setdefault("nargs", "?")
        super().__init__(option_strings, dest, **kwargs)
        self.why, self.allowed = why, allowed

    def __call__(self, parser, namespace, values, option_string=None):
        raise refuse(option_string, self.why, self.allowed)


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations or its own help, whose errors are the recipes' one line."""

    def __init__(self, prog, **kwargs):
        super().__init__(prog=prog, add_help=False, allow_abbrev=False, **kwargs)

    def value(self, *flags, kind=None, default=None, dest=None, append=False):
        """An option with a value (``kind``: :func:`check_value`)."""
        return self.add_argument(*flags, action=Value, kind=kind, default=default, dest=dest,
                                 append=append)

    def flag(self, *flags, dest=None, const=True, default=None):
        """An option without a value; it sets ``dest`` to ``const``."""
        return self.add_argument(*flags, action="store_const", const=const, default=default, dest=dest)

    def refused(self, flag, why, allowed):
        """``flag`` is the recipe's to set: refused with ``why`` and ``allowed`` (what to do
        instead)."""
        return self.add_argument(flag, action=Refused, why=why, allowed=allowed,
                                 dest=argparse.SUPPRESS, default=argparse.SUPPRESS)

    def error(self, message):
        raise argparse_refusal(message, "the options of --help")


def argparse_refusal(message, options):
    """argparse's error ``message`` as the one-line refusal (``options``: where the allowed ones
    are listed)."""
    match = re.match(r"argument (\S+?)(?:/\S+)?: (.*)$", message)
    if not match:
        required = re.match(r"the following arguments are required: (.*)$", message)
        if required:
            return refuse(required.group(1), "required", options)
        return refuse("command line", message, options)
    flag, problem = match.groups()
    if problem.startswith("expected one argument"):
        return needs_value(flag)
    given = re.match(r"ignored explicit argument '(.*)'", problem)
    if given:
        return refuse(f"{flag}={given.group(1)}", f"{flag} takes no value", flag)
    other = re.match(r"not allowed with argument (\S+)", problem)
    if other:
        return refuse(f"{other.group(1).split('/')[0]} and {flag}", "exclude each other", "one of them")
    choice = re.match(r"invalid choice: '(.*)' \(choose from (.*)\)$", problem)
    if choice:
        choices = "|".join(c.strip().strip("'") for c in choice.group(2).split(","))
        return refuse(f"{flag}={choice.group(1)}", "not one of the choices", choices)
    kind = re.match(r"invalid (int|float) value: '(.*)'$", problem)
    if kind:
        number = "a whole number" if kind.group(1) == "int" else "a number"
        return refuse(f"{flag}={kind.group(2)}", f"not {number}", f"{flag} N, N {number}")
    return refuse(flag, problem, options)


NEGATIVE = re.compile(r"-(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def negative_values_joined(words):
    """``--flag -1e-3`` as ``--flag=-1e-3``: argparse takes a word that starts with ``-`` and is
    not a plain ``-N`` / ``-N.N`` for an option, and would answer "expected one argument"."""
    joined, i = [], 0
    while i < len(words):
        word = words[i]
        if (word.startswith("--") and "=" not in word and i + 1 < len(words)
                and NEGATIVE.fullmatch(words[i + 1])):
            joined.append(f"{word}={words[i + 1]}")
            i += 2
            continue
        joined.append(word)
        i += 1
    return joined


class Help(Exception):
    """-h / --help was given."""


def split(parser, argv, positional=(), pass_through=False):
    """``argv`` read with ``parser`` (the recipe's options, in either spelling) and the names of
    its ``positional`` arguments (``"DATA_BIN"``, ...: their values are set as ``data_bin``, ...).

    Returns ``(args, passed)``: ``passed`` holds, as written, the options the recipe does not
    know and the words after them, for the fairseq tool (``pass_through``; without it they are
    refused). An unknown option before every positional argument is given is refused."""
    own, values, passed = [], [], []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word in ("-h", "--help"):
            raise Help()
        if not word.startswith("-") or word == "-":
            if len(values) < len(positional):
                values.append(word)
            elif pass_through:
                passed.append(word)
            else:
                raise refuse(word, "not an argument or option of this recipe",
                             "the arguments and options of --help")
            continue
        name = word.split("=", 1)[0] if word.startswith("--") else word
        action = parser._option_string_actions.get(name)
        if action is None:
            if not pass_through:
                raise refuse(name, "not an option of this recipe", "the options of --help")
            if len(values) < len(positional):
                missing = positional[len(values):]
                raise refuse(name, "an option for the fairseq tool, written before "
                             + " and ".join(missing), " ".join(missing)
                             + f" first, then the options ({name} V after them)")
            passed.append(word)
            continue
        own.append(word)
        takes_value = action.nargs != 0 and not isinstance(action, argparse._StoreConstAction)
        if takes_value and "=" not in word:
            if i < len(argv) and not argv[i].startswith("--"):
                own.append(argv[i])
                i += 1
            elif not isinstance(action, Refused):
                raise needs_value(name)
    args = parser.parse_args(own)
    for name in positional:
        setattr(args, name.lower(), None)
    for name, value in zip(positional, values):
        setattr(args, name.lower(), value)
    return args, passed


def help_text(doc):
    """A module docstring as its recipe's --help (the leading newline dropped)."""
    return doc.lstrip("\n")


def run(prog, doc, body, argv=None):
    """Run ``body(argv)`` as the recipe ``prog``: ``--help`` prints ``doc``, an
    :class:`OptionError` (or a signal, :class:`tools.Interrupted`) ends in its one line; returns
    the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with tools.signals_forwarded():
        try:
            status = body(argv)
        except Help:
            sys.stdout.write(help_text(doc))
            return 0
        except (OptionError, tools.Interrupted) as error:
            sys.stdout.flush()
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            return error.status
    return status or 0
