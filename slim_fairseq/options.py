"""How the plugin describes an option and checks a rule, once each (docs/DESIGN.md, "Adding a
technique").

An option is a field of a spec, a frozen dataclass subclassing :class:`OptionSpec`: the field's
name is the option's dest, its default the option's default, and :func:`option` writes the rest
(flag, help, technique group, value rule, the model it applies to) into the field's metadata, as
fairseq's ``field(metadata=...)`` dataclasses do. A spec is registered in the vocabulary
(:func:`register`), which declares its options to fairseq's parser (:func:`add_arguments`),
fills their defaults (:func:`fill_defaults`) and writes the option table (:func:`markdown`).

A rule on a combination is a method of the spec it belongs to, marked :func:`rule`: it gets the
spec and the model's options and raises the refusal (an :class:`OptionError` made by
:func:`~slim_fairseq.option_errors.option_error`). :func:`check_value` is the rule of every
option's own value (a choice, a ratio, ...). :func:`check_rules` runs them all in the
vocabulary's order and names the rule that refused (``error.rule``).
"""
import argparse
import dataclasses
from dataclasses import dataclass
from typing import Tuple

from slim_fairseq.option_errors import OptionError, check_kind, option_error

MODELS = ("slim_transformer", "slim_lm")
VALUE_RULE = "value"
MODEL_RULE = "model"


class Choices:
    """The values of a choice option that a registry extends: the plugin's own, then each
    one registered (``slim_fairseq.models.slim_layers.register_norm``), in order."""

    def __init__(self, *values):
        self._values = list(values)

    def add(self, value):
        if value not in self._values:
            self._values.append(value)

    def __iter__(self):
        return iter(self._values)

    def __contains__(self, value):
        return value in self._values

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return f"Choices{tuple(self._values)!r}"


@dataclass(frozen=True)
class Option:
    """One option. ``check`` names the value rule (``nonneg``, ``positive``, ``ratio``,
    ``length``, ``tie``, or ``choice`` with ``choices``); ``only`` names the one model it applies
    to (None: both) and ``why_only`` says why in the other's refusal; ``negatable`` adds a
    ``--no-`` form to an on/off option that presets switch on; ``choice_why`` says why a value
    of ``refused_choices`` is refused."""

    flag: str
    default: object
    help: str
    group: str
    kind: type = str
    check: str = ""
    choices: Tuple[str, ...] = ()
    metavar: str = None
    only: str = None
    why_only: str = ""
    negatable: bool = False
    shown_default: str = None
    refused_choices: Tuple[str, ...] = ()
    choice_why: str = ""

    def default_text(self):
        """The default as docs/DESIGN.md shows it."""
        if self.shown_default is not None:
            return self.shown_default
        if self.kind is bool:
            return "on" if self.default else "off"
        return str(self.default)

    def flags(self):
        return (self.flag, "--no-" + self.flag[2:]) if self.negatable else (self.flag,)

    @property
    def dest(self):
        return self.flag[2:].replace("-", "_")

    def models(self):
        return (self.only,) if self.only else MODELS

    def is_set(self, value):
        """Whether ``value`` differs from the default (the option was given)."""
        return value is not None and value != self.default


def option(flag, default, help, group, **details):
    """A spec field that is the option ``flag`` (its dest is the field's name)."""
    return dataclasses.field(default=default,
                             metadata={"option": Option(flag, default, help, group, **details)})


def rule(method):
    """Mark a method of a spec as one rule: ``method(spec, options)`` raises its refusal (an
    OptionError). Rules run in the order they are written."""
    method.is_rule = True
    return method


class OptionSpec:
    """Base of the frozen dataclasses whose fields are options (:func:`option`) and whose
    :func:`rule` methods are the rules on them."""

    @classmethod
    def options(cls):
        out = []
        for spec_field in dataclasses.fields(cls):
            described = spec_field.metadata.get("option")
            if described is not None:
                assert described.dest == spec_field.name, (cls.__name__, spec_field.name)
                out.append(described)
        return out

    @classmethod
    def rules(cls):
        """(qualified name, function) of every rule of the spec, in the order written."""
        return [(f"{cls.__name__}.{name}", function) for name, function in vars(cls).items()
                if getattr(function, "is_rule", False)]

    @classmethod
    def from_args(cls, args):
        """The spec of the options in ``args`` (a Namespace or fairseq config holding them)."""
        return cls(**{spec_field.name: getattr(args, spec_field.name, spec_field.default)
                      for spec_field in dataclasses.fields(cls)})


# ---------------------------------------------------------------------------- the vocabulary

_SPECS = []


def register(spec_cls):
    """Add ``spec_cls``'s options and rules to the vocabulary (after those registered before;
    idempotent). Returns ``spec_cls``."""
    if spec_cls not in _SPECS:
        taken = {flag for described in all_options() for flag in described.flags()}
        clash = [flag for described in spec_cls.options() for flag in described.flags()
                 if flag in taken]
        assert not clash, f"{spec_cls.__name__}: {clash} already registered"
        _SPECS.append(spec_cls)
    return spec_cls


def specs():
    """The registered specs, in order."""
    return tuple(_SPECS)


def all_options():
    """Every option of the registered specs, in order."""
    return tuple(described for spec_cls in _SPECS for described in spec_cls.options())


def by_dest():
    return {described.dest: described for described in all_options()}


def add_arguments(parser, options):
    """Declare ``options`` on ``parser``, grouped by technique, without ``default=`` (fairseq
    parses model options with ``argument_default=SUPPRESS`` and a preset fills what the command
    line did not set). Values are checked by :func:`check_value`, not by argparse ``choices``
    (argparse prints its whole usage first)."""
    groups = {}
    for described in options:
        if described.group not in groups:
            groups[described.group] = parser.add_argument_group(f"slim_fairseq: {described.group}")
        group = groups[described.group]
        help_text = described.help + ("" if described.only is None else f" ({described.only} only)")
        if described.kind is bool:
            action = argparse.BooleanOptionalAction if described.negatable else "store_true"
            group.add_argument(described.flag, action=action, help=help_text)
        else:
            kind = str if described.check in ("choice", "tie") else described.kind
            group.add_argument(described.flag, type=kind, metavar=described.metavar, help=help_text)


def fill_defaults(args, options):
    """Set every option of ``options`` that ``args`` leaves unset to its default."""
    for described in options:
        if getattr(args, described.dest, None) is None and described.default is not None:
            setattr(args, described.dest, described.default)


def markdown(options, extra_header="", extra_rows=()):
    """The option table of docs/DESIGN.md: ``options`` grouped by technique (flag, models,
    default, meaning), then ``extra_rows`` ((flag, default, meaning)) under ``extra_header``."""
    def cell(text):
        return text.replace("|", "\\|")

    header = ["| flag | models | default | meaning |", "|---|---|---|---|"]
    groups = {}
    for described in options:
        groups.setdefault(described.group, []).append(described)
    lines = []
    for group, members in groups.items():
        lines += ["", f"**{group}**", ""] + header
        for described in members:
            flags = " / ".join(f"`{flag}`" for flag in described.flags())
            metavar = f" {described.metavar}" if described.metavar else ""
            flags = flags.replace(f"`{described.flag}`", f"`{described.flag}{metavar}`", 1)
            models = ", ".join(described.models())
            lines.append(f"| {flags} | {models} | {cell(described.default_text())} | "
                         f"{cell(described.help)} |")
    if extra_rows:
        lines += ["", extra_header, ""] + header
        for flag, default, meaning in extra_rows:
            lines.append(f"| `{flag}` | {', '.join(MODELS)} | {cell(default)} | {cell(meaning)} |")
    return "\n".join(lines[1:]) + "\n"


# ---------------------------------------------------------------------------- the rules

def check_value(described, value):
    """The rule of ``described``'s kind (a choice, a ratio, a length, ...) on one value
    (:func:`slim_fairseq.option_errors.check_kind`, which the recipes use too)."""
    integer = described.check == "nonneg" and described.kind is int
    check_kind(described.flag, value, described.check, choices=described.choices,
               allowed="an integer >= 0" if integer else None,
               refused_choices=described.refused_choices, choice_why=described.choice_why)


def check_rules(options, model):
    """Raise the first refusal of the vocabulary's rules for ``options`` (an object giving every
    option's value by dest, and ``get(spec_cls)``) in ``model``: every option's value
    (:data:`VALUE_RULE`), the options of the other model (:data:`MODEL_RULE`), then each
    spec's rules in the vocabulary's order. The refusal names its rule in ``error.rule``."""
    for described in all_options():
        value = getattr(options, described.dest)
        try:
            if described.check not in ("", "tie"):
                check_value(described, value)
        except OptionError as error:
            error.rule = VALUE_RULE
            raise
        if model not in described.models() and described.is_set(value):
            error = option_error(described.flag, value, f"not available in {model}: "
                                 f"{described.why_only}", "drop it")
            error.rule = MODEL_RULE
            raise error
    for spec_cls in _SPECS:
        spec = options.get(spec_cls)
        for name, method in spec_cls.rules():
            try:
                method(spec, options)
            except OptionError as error:
                error.rule = name
                raise


def rule_names():
    """Every rule of the vocabulary by name: the value and model rules, then each spec's."""
    return [VALUE_RULE, MODEL_RULE] + [name for spec_cls in _SPECS for name, _ in spec_cls.rules()]
