"""Architecture presets: each named architecture is one row of option values by keyword
(:class:`Preset`), registered with fairseq once (:meth:`Preset.register`); docs/DESIGN.md,
"Presets".

A preset fills only the options the command line left unset, then the defaults of its model
(the plugin's options, then fairseq's base architecture), then checks the options
(one-line errors right after fairseq parses the command line, before anything is loaded).
fairseq calls an architecture's function again when it builds the model, and when it loads a
checkpoint: a config the preset already filled (it holds every value the preset would fill) is
left as it is, so a preset is applied once per build.

Dimensions a preset derives from its width (FFN, heads, the Subformer's middle and SAFE widths,
...) are written as the paper's value at the paper's width (:class:`Scaled`, :class:`Heads`,
:class:`ScaledHeads`, :class:`ScaledKVHeads`) and follow a width given on the command line
(``--encoder-embed-dim``/``--decoder-embed-dim``), so that a smaller width gives a
proportionally smaller model; ``slim-fairseq-help ARCH --decoder-embed-dim N`` shows what it
yields.

Heads: :class:`Heads` (width // 64, lowered until it divides) where the paper's heads are 64
channels wide; :class:`ScaledHeads` where the paper fixes a head count at its own width (the
STLM block's 16 heads at 528). docs/DESIGN.md, "Presets", says why both stay.
"""
import argparse
from dataclasses import dataclass
from typing import Tuple

from slim_fairseq import options
from slim_fairseq.checkpoint_upgrade import upgrade_args
from slim_fairseq.modules.attention import heads_for
from slim_fairseq.option_errors import one_line_option_errors


def width_of(args, own, sides=("encoder", "decoder")):
    """The model width: the first of ``--{side}-embed-dim`` given, else the preset's ``own``."""
    for side in sides:
        value = getattr(args, f"{side}_embed_dim", None)
        if value:
            return value
    return own


def scaled(value, width, own):
    """``value`` of the preset at its width ``own``, at width ``width`` (rounded, at least 1)."""
    return max(1, round(value * width / own))


def scaled_heads(heads, width, own):
    """The preset's ``heads`` at its width ``own``, at width ``width``: as many per channel,
    lowered until they divide the width (at least 1)."""
    count = scaled(heads, width, own)
    while width % count:
        count -= 1
    return count


def scaled_kv_heads(kv_heads, heads, own_heads):
    """Key/value heads in the preset's proportion to the query heads (dividing them)."""
    count = max(1, kv_heads * heads // own_heads)
    while heads % count:
        count -= 1
    return count


# ---------------------------------------------------------------------------- derived values

class Derived:
    """A preset's value computed from the model width: ``value(preset, args)``."""


@dataclass(frozen=True)
class Width(Derived):
    """The model width (:func:`width_of`)."""

    def value(self, preset, args):
        return preset.width(args)


@dataclass(frozen=True)
class Scaled(Derived):
    """``value`` at the preset's own width, at the model width (:func:`scaled`)."""

    at_own_width: float

    def value(self, preset, args):
        return scaled(self.at_own_width, preset.width(args), preset.own_width)


@dataclass(frozen=True)
class Heads(Derived):
    """Heads of about 64 channels at the model width (:func:`heads_for`)."""

    def value(self, preset, args):
        return heads_for(preset.width(args))


@dataclass(frozen=True)
class ScaledHeads(Derived):
    """``heads`` at the preset's own width, as many per channel at the model width
    (:func:`scaled_heads`)."""

    heads: int

    def value(self, preset, args):
        return scaled_heads(self.heads, preset.width(args), preset.own_width)


@dataclass(frozen=True)
class ScaledKVHeads(Derived):
    """``kv_heads`` key/value heads of the preset's ``heads`` query heads, in that proportion
    to the model's query heads (:func:`scaled_kv_heads`; the row fills the heads first)."""

    kv_heads: int
    heads: int

    def value(self, preset, args):
        return scaled_kv_heads(self.kv_heads, args.decoder_attention_heads, self.heads)


# ---------------------------------------------------------------------------- presets

_MODEL_DEFAULTS = {}


def model_defaults(model):
    """Register ``function(args)``: the defaults of ``model`` (the plugin's options, then
    fairseq's base architecture), which every preset of ``model`` applies after its row."""
    def register(function):
        _MODEL_DEFAULTS[model] = function
        return function
    return register


_FILLED_KEYS = {}


def _keys_filled_by(model):
    """The options ``model``'s defaults set on an empty config (with the options registered
    now)."""
    key = (model, options.specs())
    if key not in _FILLED_KEYS:
        blank = argparse.Namespace()
        _MODEL_DEFAULTS[model](blank)
        _FILLED_KEYS[key] = frozenset(vars(blank))
    return _FILLED_KEYS[key]


@dataclass(frozen=True)
class Preset:
    """One architecture: ``name`` of ``model`` (``slim_transformer`` or ``slim_lm``), its
    option values by keyword in ``values`` (a derived value is computed from the model width:
    ``own_width`` at the preset's own width, on ``sides``), documented by ``doc``."""

    model: str
    name: str
    doc: str
    values: Tuple[Tuple[str, object], ...] = ()
    own_width: int = None
    sides: Tuple[str, ...] = ("encoder", "decoder")

    @classmethod
    def row(cls, model, name, doc, own_width=None, sides=("encoder", "decoder"), **values):
        return cls(model, name, doc, tuple(values.items()), own_width, tuple(sides))

    def but(self, name, doc, **values):
        """Another row: this one's values with ``values`` in place (or added)."""
        merged = dict(self.values)
        merged.update(values)
        return Preset(self.model, name, doc, tuple(merged.items()), self.own_width, self.sides)

    def width(self, args):
        return width_of(args, self.own_width, self.sides)

    def keys(self):
        return {key for key, _ in self.values} | _keys_filled_by(self.model)

    def filled(self, args):
        """Whether ``args`` holds every value this preset fills (it was applied, or ``args``
        is a stored config)."""
        return all(hasattr(args, key) for key in self.keys())

    def fill(self, args):
        """Set the row's values that ``args`` leaves unset (absent or None), in the row's order,
        then the model's defaults."""
        for key, value in self.values:
            if getattr(args, key, None) is None:
                setattr(args, key, value.value(self, args) if isinstance(value, Derived) else value)
        _MODEL_DEFAULTS[self.model](args)

    def apply(self, args):
        """Options stored by earlier versions take today's names
        (:func:`~slim_fairseq.checkpoint_upgrade.upgrade_args`), and the preset fills what is
        unset, unless it did already."""
        upgrade_args(args)
        if not self.filled(args):
            self.fill(args)

    def __call__(self, args):
        """The architecture's function fairseq calls: :meth:`apply`, then the model checks the
        options (once for equal options), and a command line fairseq parsed is checked
        (:func:`slim_fairseq.run_checks.check_command_line`)."""
        from fairseq.models import ARCH_MODEL_REGISTRY

        from slim_fairseq import run_checks

        command_line = run_checks.take_command_line_mark(args)
        self.apply(args)
        with one_line_option_errors():
            ARCH_MODEL_REGISTRY[self.name].check_args(args)
            if command_line:
                run_checks.check_command_line(args)

    def register(self):
        """Register with fairseq as architecture ``name`` of ``model``."""
        from fairseq.models import register_model_architecture

        register_model_architecture(self.model, self.name)(self)
        return self


def apply_preset(args, model):
    """:meth:`Preset.apply` of the architecture ``args`` names, or of ``model``'s base
    architecture (a config built in Python, of no architecture of ``model``)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    preset = ARCH_CONFIG_REGISTRY.get(arch)
    if not isinstance(preset, Preset) or preset.model != model:
        preset = ARCH_CONFIG_REGISTRY[model]
    preset.apply(args)
