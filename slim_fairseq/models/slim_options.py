"""The plugin's options, for both models (``slim_transformer`` and ``slim_lm``; docs/DESIGN.md,
"Options", is their table): one spec per technique, whose fields are its options (flag,
default, help, value rule: :func:`~slim_fairseq.options.option`) and whose :func:`rule`
methods are its rules on combinations, each written once (docs/DESIGN.md, "Adding a
technique"). The specs also turn the checked options into what a block is built from
(:mod:`slim_fairseq.specs`).

:class:`ModelOptions` reads a model's options from fairseq's config into these specs once and
validates them once (:meth:`ModelOptions.validate`, remembered for equal options): one-line
errors before anything is built, in the format of :func:`~slim_fairseq.option_errors.option_error`.

fairseq's own options keep their meaning, with two readings the plugin adds in every model:
``--activation-fn`` is the feed-forward's activation, the gate's activation under ``--ffn-glu``
(default relu, silu under ``--ffn-glu``; ``silu`` is added to fairseq's choices), and
``--share-decoder-input-output-embed`` gets a ``--no-`` form, for presets that tie by default.
Plugin-only flags never start with ``encoder-``/``decoder-`` (docs/TECHNIQUES.md#plugin-option-names).
"""
import argparse
import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Optional

from slim_fairseq import options as vocabulary
from slim_fairseq.modules.attention import EXTENSIONS as ATTENTION_EXTENSIONS
from slim_fairseq.modules.attention import attention_head_dim, heads_for
from slim_fairseq.modules.gated_attention import (CROSS_GATE_WHY, CROSS_GATES, GATES,
                                                  SAME_UNDER_NO_PATT)
from slim_fairseq.modules.glu import GLU_ACTIVATIONS, GLU_HIDDEN_RULES
from slim_fairseq.modules.input_embedding import token_table_dim as _token_table_dim
from slim_fairseq.modules.shaped_attention import REMOVABLE
from slim_fairseq.modules.tensor_chain_policy import BACKWARD_MODES as TC_BACKWARD_MODES
from slim_fairseq.modules.tensor_chain_policy import FORWARD_MODES as TC_FORWARD_MODES
from slim_fairseq.modules.weight_tying import tied_layer_range
from slim_fairseq.option_errors import OptionError, option_error
from slim_fairseq.options import MODELS, OptionSpec, check_value, option, register, rule  # noqa: F401
from slim_fairseq.specs import (
    AttentionSpec,
    ChainSpec,
    EmbeddingSpec,
    FeedForwardSpec,
    LayerSpec,
    NormSpec,
    SAFEOutputSpec,
    SandwichSpec,
    TyingSpec,
)

SIDES = ("encoder", "decoder")
TC_PLACES = ("tc_ff", "tc_patt", "tc_layer", "tc_emb", "tc_output")
# options that only shape a Tensor Chain, with their defaults: the values a model without any
# chain must have (ChainOptions.shape_needs_a_chain; compression.without_tensor_chains restores them)
TC_SHAPE_DEFAULTS = (("tc_backward", "auto"), ("tc_forward", "auto"), ("tc_length", 2),
                     ("tc_min_bond", 0))
# the plugin's norms and those registered (slim_layers.register_norm)
NORMS = vocabulary.Choices("layernorm", "rmsnorm", "none")
SKIPLESS_LAYOUTS = ("none", "serial", "parallel")
SAFE_OUTPUTS = ("linear", "mlp")
SANDWICH_CROSS_NORMS = ("layernorm", "none")
# fairseq's --activation-fn choices plus silu (SwiGLU's gate, and a plain feed-forward's)
ACTIVATIONS = ("relu", "gelu", "gelu_fast", "gelu_accurate", "tanh", "linear", "silu")
TIE_ALLOWED = "none or an integer K >= 0"

ANTHE = "Anthe (arXiv:2305.10991; docs/TECHNIQUES.md#anthe)"
SUBFORMER = "Subformer (arXiv:2101.00234; docs/TECHNIQUES.md#subformer)"
STLM = "STLM weight tying (arXiv:2405.14159; docs/TECHNIQUES.md#tying-schemes)"
BLOCK = "block: heads, positions, normalisation, biases, init (docs/TECHNIQUES.md#stlm-block)"
SKIPLESS = "skipless blocks (arXiv:2311.01906, arXiv:2404.12362; docs/TECHNIQUES.md#skipless-transformers)"
# the option table's order of the technique groups
GROUPS = (ANTHE, SUBFORMER, STLM, BLOCK, SKIPLESS)

_CROSS_ONLY = "it acts on cross-attention, which a language model does not have"
_LM_ONLY = "skipless blocks are defined for causal decoder-only models (He & Hofmann)"
_SHARDED_BACKENDS = ("fully_sharded",)
_DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING = ("pytorch_ddp", "c10d")


def _flag(dest):
    return "--" + dest.replace("_", "-")


def _off(flag, value, technique, fix):
    """Refusal of an option that shapes a technique which is off."""
    return option_error(flag, value, f"shapes {technique}, which is off", fix)


def _set(spec, dest):
    """Whether the option ``dest`` of ``spec`` differs from its default."""
    described = next(o for o in type(spec).options() if o.dest == dest)
    return described.is_set(getattr(spec, dest))


# ---------------------------------------------------------------------------- fairseq's shape

# fairseq's shape options of each side: (suffix, what a value must be)
SHAPE = (("layers", "a model needs at least one layer"), ("embed_dim", "a width must be positive"),
         ("ffn_embed_dim", "a width must be positive"),
         ("attention_heads", "a model needs at least one attention head"))
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout", "relu_dropout")


@register
@dataclass(frozen=True)
class FairseqShape(OptionSpec):
    """fairseq's own shape and dropout options, which it does not check: a width, depth or head
    count below one, or a dropout outside [0, 1), fails deep inside the build (a division by
    zero, a tensor of a size below zero) or after training started (a crash.pt)."""

    @rule
    def shapes_are_positive(self, m):
        for side in m.sides:
            for suffix, problem in SHAPE:
                value = m.get_side(side, suffix)
                if isinstance(value, int) and value < 1:
                    flag = f"--{side}-{suffix.replace('_', '-')}"
                    fix = -value if value < 0 else 1
                    change = {flag: fix}
                    if suffix == "embed_dim":  # the widths the preset copied from it
                        change.update({f"--{side}-{dep.replace('_', '-')}": fix
                                       for dep in ("input_dim", "output_dim")
                                       if m.get_side(side, dep) == value})
                    raise option_error(flag, value, problem, alternatives=[change])
        for suffix in ("input_dim", "output_dim"):
            value = m.get_side("decoder", suffix)
            if isinstance(value, int) and value < 1:
                flag = f"--decoder-{suffix.replace('_', '-')}"
                raise option_error(flag, value, "a width must be positive", alternatives=[
                    {flag: -value if value < 0 else m.decoder_embed_dim}])

    @rule
    def dropouts_are_probabilities(self, m):
        for dest in DROPOUTS:
            value = getattr(m, dest)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and not 0 <= value < 1:
                flag = f"--{dest.replace('_', '-')}"
                raise option_error(flag, value, "a dropout is a probability in [0, 1)",
                                   alternatives=[{flag: 0.1}])


# ---------------------------------------------------------------------------- STLM tying

@register
@dataclass(frozen=True)
class TyingOptions(OptionSpec):
    """STLM weight tying (arXiv:2405.14159, Sec. 3; docs/TECHNIQUES.md#tying-schemes) with LoRA
    on the tied feed-forward; each tied range ``1+K .. D-K-1`` holds two layers or more."""

    tie_ffn: str = option(
        "--tie-ffn", "none", "share the FFN of layer 1+K with layers 1+K..D-K-1 (0-based; layer 0 "
        "never shared; K=0 = all but the first); none = off", STLM, check="tie", metavar="K")
    ffn_lora_rank: int = option(
        "--ffn-lora-rank", 0, "rank of a per-layer LoRA adapter on every shared FFN linear; 0 = "
        "off; needs --tie-ffn", STLM, kind=int, check="nonneg", metavar="R")
    ffn_lora_alpha: Optional[float] = option(
        "--ffn-lora-alpha", None, "LoRA scale numerator: the update is multiplied by A/R "
        "(default A = R); needs --ffn-lora-rank", STLM, kind=float, check="positive", metavar="A",
        shown_default="R")
    tie_attn_proj: str = option(
        "--tie-attn-proj", "none", "share the self-attention output projection over layers "
        "1+K..D-K-1 like --tie-ffn; none = off", STLM, check="tie", metavar="K")

    @staticmethod
    def fill_derived_defaults(args):
        if getattr(args, "ffn_lora_alpha", None) is None:  # A = R (a scale of 1) unless given
            args.ffn_lora_alpha = float(args.ffn_lora_rank) if args.ffn_lora_rank else None

    @staticmethod
    def offset(value, flag):
        """``none``/None -> None (off); an int >= 0 (or its string) -> that int."""
        if value is None:
            return None
        parsed = value
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "none":
                return None
            try:
                parsed = int(text)
            except ValueError:
                parsed = None
        if isinstance(parsed, bool) or not isinstance(parsed, int) or parsed < 0:
            raise option_error(flag, value, "not a layer offset", TIE_ALLOWED)
        return parsed

    @property
    def ffn(self):
        return self.offset(self.tie_ffn, "--tie-ffn")

    @property
    def attn_proj(self):
        return self.offset(self.tie_attn_proj, "--tie-attn-proj")

    @property
    def on(self):
        return self.ffn is not None or self.attn_proj is not None

    def spec(self):
        """The :class:`~slim_fairseq.specs.TyingSpec`: an unset ``--ffn-lora-alpha`` is the
        rank (a scale of 1)."""
        rank = int(self.ffn_lora_rank or 0)
        alpha = self.ffn_lora_alpha
        return TyingSpec(ffn=self.ffn, attn_proj=self.attn_proj, lora_rank=rank,
                         lora_alpha=float(alpha) if alpha is not None else float(rank))

    @rule
    def offsets_are_layer_offsets(self, m):
        return self.ffn, self.attn_proj

    @rule
    def ranges_hold_two_layers(self, m):
        """Each tied range ``1+K .. D-K-1`` holds two layers or more, on every side."""
        for side in m.sides:
            num_layers = m.get_side(side, "layers")
            for k, flag in ((self.ffn, "--tie-ffn"), (self.attn_proj, "--tie-attn-proj")):
                if k is not None and len(tied_layer_range(k, num_layers)) < 2:
                    if num_layers < 3:
                        raise option_error(flag, k, f"needs at least 3 layers, the model has "
                                           f"{num_layers}", "none, or 3 layers or more")
                    raise option_error(flag, k, f"too large for {num_layers} layers (layers "
                                       "1+K..D-K-1 must hold at least 2 layers)",
                                       f"K <= {(num_layers - 3) // 2}")

    @rule
    def rank_is_an_integer(self, m):
        rank = self.ffn_lora_rank
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise option_error("--ffn-lora-rank", rank, "not a rank", "an integer >= 0")

    @rule
    def lora_adapts_a_tied_ffn(self, m):
        if self.ffn_lora_rank > 0 and self.ffn is None:
            raise option_error("--ffn-lora-rank", self.ffn_lora_rank, "LoRA adapts shared FFN "
                               "weights, and --tie-ffn is off", "--tie-ffn K, or --ffn-lora-rank 0")

    @rule
    def alpha_scales_lora(self, m):
        if self.ffn_lora_alpha is not None and self.ffn_lora_rank == 0:
            raise option_error("--ffn-lora-alpha", self.ffn_lora_alpha, "scales a LoRA adapter, "
                               "and --ffn-lora-rank is 0", "--ffn-lora-rank R, or drop "
                               "--ffn-lora-alpha")

    @rule
    def not_with_sandwich(self, m):
        if self.on and m.sandwich:
            raise option_error("--tie-ffn" if self.ffn is not None else "--tie-attn-proj",
                               self.ffn if self.ffn is not None else self.attn_proj,
                               "cannot be combined with --sandwich (it already shares the "
                               "middle layers)", "none with --sandwich")

    @rule
    def unsharded_backend(self, m):
        """One Parameter in several layers
        (docs/TECHNIQUES.md#distributed-training-with-shared-weights)."""
        if self.on and m.ddp_backend in _SHARDED_BACKENDS:
            raise option_error("--ddp-backend", m.ddp_backend, "cannot hold weights shared across "
                               "layers (--tie-ffn/--tie-attn-proj)", "legacy_ddp|pytorch_ddp")

    @rule
    def checkpointing_backend(self, m):
        backend = m.ddp_backend
        if (self.on and m.checkpoint_activations
                and backend in _DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING
                and (m.distributed_world_size or 1) > 1):
            raise option_error("--ddp-backend", backend, "with --checkpoint-activations gives "
                               "wrong gradients for shared layers (--tie-ffn/--tie-attn-proj)",
                               "legacy_ddp")

    @rule
    def lora_adapts_dense_linears(self, m):
        if self.ffn_lora_rank and (m.tc_ff or m.tc_layer):
            raise option_error("--ffn-lora-rank", self.ffn_lora_rank, "LoRA adapts dense "
                               "linears, and --tc-ff/--tc-layer make the feed-forward Tensor "
                               "Chains", "0 with a Tensor-Chain feed-forward")


# ---------------------------------------------------------------------------- techniques of every kind

class TechniqueSpec(OptionSpec):
    """What the spec of a technique of any kind has (docs/DESIGN.md, "Adding a technique"):
    ``on``, whether its options turn it on, and the option that names it (its first field)."""

    @property
    def on(self):
        raise NotImplementedError

    @property
    def flag(self):
        """The option that turns the technique on (the first of its fields)."""
        return type(self).options()[0].flag

    def value(self):
        """That option's value."""
        return getattr(self, type(self).options()[0].dest)


def techniques_on(m, kind):
    """The specs of ``kind`` (a subclass of :class:`TechniqueSpec`) whose options are on in the
    model options ``m``, in the order registered."""
    return tuple(spec for spec in m.specs if isinstance(spec, kind) and spec.on)


def one_of_a_kind(m, kind, own, problem):
    """Refuse a technique of ``kind`` registered from outside beside another of its kind:
    ``own``, the plugin's techniques of that kind that are on, as (flag, the change that turns
    it off); ``problem`` says what the first one is, ``{other}`` the other's flag."""
    registered = techniques_on(m, kind)
    if registered and len(own) + len(registered) > 1:
        other = own[0][0] if own else registered[1].flag
        raise option_error(registered[0].flag, registered[0].value(), problem.format(other=other),
                           alternatives=[*(change for _, change in own),
                                         *({spec.flag: None} for spec in registered)])


# ---------------------------------------------------------------------------- attention extensions

class AttentionExtension(TechniqueSpec):
    """Base of an attention extension's spec (docs/DESIGN.md, "Adding a technique"): its options,
    with ``on`` saying whether they turn it on and ``roles`` the attentions it joins (of
    ``encoder_self``, ``decoder_self``, ``cross``); each attention of those roles builds the
    module registered for it
    (:func:`slim_fairseq.models.slim_layers.register_attention_extension`). Several may be on
    together."""

    roles = ("encoder_self", "decoder_self", "cross")


def attention_extensions(m, role):
    """The specs of the extensions on in attentions of ``role``, in the order registered."""
    return tuple(spec for spec in techniques_on(m, AttentionExtension) if role in spec.roles)


# ---------------------------------------------------------------------------- input embeddings

class InputEmbeddingVariant(TechniqueSpec):
    """Base of the spec of an input embedding registered from outside (docs/DESIGN.md, "Adding
    a technique"): its options, with ``on`` saying whether they select it; both sides build the
    module registered for it
    (:func:`slim_fairseq.models.slim_layers.register_input_embedding`) in place of fairseq's
    scaled table plus positions, H-SoftPOS or SAFE."""


class OutputVariant(TechniqueSpec):
    """Base of the spec of a vocabulary projection registered from outside (docs/DESIGN.md,
    "Adding a technique"): the decoder builds the module registered for it
    (:func:`slim_fairseq.models.slim_layers.register_output_projection`) in place of its linear,
    Tensor-Chain or SAFE projection."""


class BlockLayout(TechniqueSpec):
    """Base of the spec of a block layout registered from outside (docs/DESIGN.md, "Adding a
    technique"): the layers of each side it registers a class for are built from that class
    (:func:`slim_fairseq.models.slim_layers.register_block_layout`) in place of the plugin's
    pre-/post-norm or skipless blocks."""


# ---------------------------------------------------------------------------- feed-forward

class FeedForwardVariant(TechniqueSpec):
    """Base of a feed-forward variant's spec (docs/DESIGN.md, "Adding a technique"): its
    options, with ``on`` saying whether they select it; the block builds the module registered
    for it (:func:`slim_fairseq.models.slim_layers.register_feed_forward`), or the dense
    feed-forward when no variant is on."""


@register
@dataclass(frozen=True)
class FeedForwardOptions(OptionSpec):
    """What every feed-forward shares: ``--activation-fn`` (fairseq's option, the plugin's
    reading) and one variant at a time."""

    @rule
    def activation(self, m):
        if m.activation not in ACTIVATIONS:
            raise option_error("--activation-fn", m.activation, "not an activation",
                               "|".join(ACTIVATIONS))

    @rule
    def one_variant(self, m):
        on = techniques_on(m, FeedForwardVariant)
        if len(on) > 1:
            raise option_error(on[1].flag, None, f"a feed-forward variant, and {on[0].flag} "
                               "selects another", f"one of {on[0].flag} and {on[1].flag}")


@register
@dataclass(frozen=True)
class GLUOptions(FeedForwardVariant):
    """The GLU feed-forward ``w2(act(w1 x) * w3 x)`` (Anthe, arXiv:2305.10991;
    docs/TECHNIQUES.md#glu-feed-forward)."""

    ffn_glu: bool = option(
        "--ffn-glu", False, "GLU feed-forward w2(act(w1 x) * w3 x); act = --activation-fn "
        "(default silu under --ffn-glu)", ANTHE, kind=bool, negatable=True)
    glu_hidden: str = option(
        "--glu-hidden", "two-thirds", "hidden width of the GLU: two-thirds = floor(2F/3) of the "
        "--*-ffn-embed-dim F (a plain FFN's parameters; Anthe), full = F (STLM, LLaMA-style "
        "shapes)", ANTHE, check="choice", choices=GLU_HIDDEN_RULES, metavar="RULE")

    @property
    def on(self):
        return bool(self.ffn_glu)

    @staticmethod
    def fill_derived_defaults(args):
        if getattr(args, "activation_fn", None) is None and args.ffn_glu:
            args.activation_fn = "silu"

    @rule
    def gate_activation(self, m):
        if self.ffn_glu and m.activation not in GLU_ACTIVATIONS:
            raise option_error("--activation-fn", m.activation, "not a GLU gate activation "
                               "(--ffn-glu)", "|".join(GLU_ACTIVATIONS))

    @rule
    def hidden_needs_glu(self, m):
        if self.glu_hidden != "two-thirds" and not self.ffn_glu:
            raise _off("--glu-hidden", self.glu_hidden, "the GLU feed-forward",
                       "add --ffn-glu, or drop --glu-hidden")


# ---------------------------------------------------------------------------- fairseq's extras

@register
@dataclass(frozen=True)
class FairseqExtras(OptionSpec):
    """fairseq's quant noise and xformers attention act on fairseq's own linears and attention,
    which the techniques replace."""

    @staticmethod
    def custom(m):
        """The flags of the options on that replace or bypass fairseq's linears or attention."""
        variants = [(spec.flag, True) for spec in techniques_on(m, FeedForwardVariant)]
        return [flag for flag, on in (
            *variants, ("--tc-ff/--tc-patt/--tc-layer",
                                       m.tc_ff or m.tc_patt or m.tc_layer),
            ("--self-attn-gate", m.self_attn_gate != "none"),
            ("--cross-attn-gate", (m.cross_attn_gate or "none") != "none"),
            ("--no-patt", m.no_patt), ("--skipless-layout", m.skipless_layout != "none"),
            ("--kv-heads", m.kv_heads), ("--head-dim", m.head_dim),
            ("--rope-theta", m.rope_theta), ("--no-linear-bias", not m.linear_bias)) if on]

    @rule
    def quant_noise(self, m):
        custom, noise = self.custom(m), m.quant_noise_pq or 0
        if noise and custom:
            raise option_error("--quant-noise-pq", noise, "acts on fairseq's dense linears, "
                               f"which {custom[0]} replaces or bypasses",
                               alternatives=[{"--quant-noise-pq": 0}])

    @rule
    def base_layers(self, m):
        if m.base_layers:
            raise option_error("--base-layers", m.base_layers, "not built by slim_fairseq models",
                               "0 (fairseq's transformer_lm for BASE layers)")

    @rule
    def xformers(self, m):
        custom = self.custom(m)
        for side in SIDES:
            if m.get_side(side, "xformers_att_config") and custom:
                raise option_error(f"--{side}-xformers-att-config", None, "configures fairseq's "
                                   f"own attention, which {custom[0]} replaces",
                                   "drop it with " + custom[0])


# ---------------------------------------------------------------------------- Tensor Chains

@register
@dataclass(frozen=True)
class ChainOptions(OptionSpec):
    """Tensor-Chain factorisations (Anthe, arXiv:2305.10991, Sec. 2.1;
    docs/TECHNIQUES.md#tensor-chain): where (``--tc-*`` ratios), their shape and how they run."""

    tc_ff: float = option("--tc-ff", 0.0, "Tensor-Chain factorisation of the feed-forward "
                          "linears with parameter ratio R; 0 = dense", ANTHE, kind=float,
                          check="ratio", metavar="R")
    tc_patt: float = option("--tc-patt", 0.0, "Tensor-Chain factorisation of W_Q, W_K, W_V with "
                            "parameter ratio R; 0 = dense", ANTHE, kind=float, check="ratio",
                            metavar="R")
    tc_layer: float = option("--tc-layer", 0.0, "Tensor-Chain ratio of both the feed-forward and "
                             "W_Q, W_K, W_V (--tc-ff / --tc-patt win where set); 0 = dense", ANTHE,
                             kind=float, check="ratio", metavar="R")
    tc_emb: float = option("--tc-emb", 0.0, "Tensor-Chain factorisation of the token table with "
                           "parameter ratio R; 0 = dense", ANTHE, kind=float, check="ratio",
                           metavar="R")
    tc_output: float = option("--tc-output", 0.0, "Tensor-Chain factorisation of the vocabulary "
                              "projection with parameter ratio R; 0 = dense", ANTHE, kind=float,
                              check="ratio", metavar="R")
    tc_length: int = option("--tc-length", 2, "Tensor-Chain length n (>= 2)", ANTHE, kind=int,
                            check="length", metavar="N")
    tc_min_bond: int = option("--tc-min-bond", 0, "lowest bond dimension of every Tensor Chain; 0 "
                              "= as the ratio gives (the paper). At small widths a ratio like "
                              ".005 gives bond 2, which all but removes the layer", ANTHE,
                              kind=int, check="nonneg", metavar="B")
    tc_backward: str = option(
        "--tc-backward", "auto", "what Tensor-Chain layers keep for backward: recompute (the "
        "input and the cores; least memory), store (plain autograd: more memory, fewer matmuls) "
        "or auto (by device and dtype: recompute on the CPU and CUDA now; docs/GPU.md)", ANTHE,
        check="choice", choices=TC_BACKWARD_MODES, metavar="MODE")
    tc_forward: str = option(
        "--tc-forward", "auto", "how Tensor-Chain linears multiply: materialise (build W, one "
        "matmul), contract (the input core by core, W never built) or auto (by shape, device and "
        "dtype; docs/GPU.md)", ANTHE, check="choice", choices=TC_FORWARD_MODES, metavar="MODE")

    def chain(self, place):
        """The Tensor Chain of one placement (``tc_ff``, ``tc_patt``, ``tc_emb``,
        ``tc_output``): ``--tc-layer`` covers ff and patt unless the placement's own option is
        set."""
        ratio = float(getattr(self, place) or 0.0)
        if not ratio and place in ("tc_ff", "tc_patt"):
            ratio = float(self.tc_layer or 0.0)
        return ChainSpec(ratio, int(self.tc_length), int(self.tc_min_bond)) if ratio else ChainSpec()

    @rule
    def shape_needs_a_chain(self, m):
        if not any(getattr(self, place) for place in TC_PLACES):
            for key, default in TC_SHAPE_DEFAULTS:
                value = getattr(self, key)
                # recompute: the default that options saved before --tc-backward auto may hold
                if value != default and (key, value) != ("tc_backward", "recompute"):
                    raise _off(_flag(key), value, "a Tensor Chain", "one of --tc-ff/--tc-patt/"
                               f"--tc-layer/--tc-emb/--tc-output, or drop {_flag(key)}")

    @rule
    def nothing_to_factorise_without_patt(self, m):
        if m.no_patt and (self.tc_patt or self.tc_layer and not self.tc_ff):
            ratio = self.tc_patt or self.tc_layer
            raise option_error("--tc-patt" if self.tc_patt else "--tc-layer", ratio,
                               "cannot be combined with --no-patt (W_Q, W_K, W_V are the "
                               "identity, nothing to factorise)", "--tc-patt 0 / --tc-ff "
                               "instead of --tc-layer")

    @rule
    def layer_ratio_decides_something(self, m):
        if self.tc_layer and self.tc_ff and (self.tc_patt or m.no_patt):
            decided = "--tc-patt" if self.tc_patt else "--no-patt"
            raise option_error("--tc-layer", self.tc_layer, f"covers the feed-forward and W_Q, "
                               f"W_K, W_V, which --tc-ff and {decided} already decide", "0, or "
                               f"drop --tc-ff or {decided}")

    @rule
    def table_not_with_safe(self, m):
        if self.tc_emb and m.safe_embed_dim:
            raise option_error("--tc-emb", self.tc_emb, "cannot be combined with --safe-embed-dim "
                               "(SAFE already factorises the embedding)", "--tc-emb 0")

    @rule
    def output_untied(self, m):
        if self.tc_output and m.tied_output:
            raise option_error("--tc-output", self.tc_output, "cannot be combined with tied "
                               "input/output embeddings", "--tc-output 0, or "
                               "--no-share-decoder-input-output-embed / no --share-all-embeddings")


# ---------------------------------------------------------------------------- embeddings

@register
@dataclass(frozen=True)
class EmbeddingOptions(OptionSpec):
    """The input embedding (H-SoftPOS, Anthe; SAFE, Subformer; docs/TECHNIQUES.md#h-softpos,
    #safe-embeddings) and the vocabulary projection it may be tied to."""

    hsoftpos_levels: int = option(
        "--hsoftpos-levels", 0, "H-SoftPOS hierarchical embedding with L levels; 0 = off", ANTHE,
        kind=int, check="nonneg", metavar="L")
    hsoftpos_min_token_dim: int = option(
        "--hsoftpos-min-token-dim", 0, "H-SoftPOS token-table width of at least M (narrower "
        "soft-position slots); 0 = the paper's d - (2l-1) floor(d/2l), only d/4 at l=2", ANTHE,
        kind=int, check="nonneg", metavar="M")
    output_bias: bool = option("--output-bias", False, "bias on the vocabulary projection", ANTHE,
                               kind=bool, negatable=True)
    safe_embed_dim: int = option(
        "--safe-embed-dim", 0, "SAFE self-attentive factorised embeddings of width E below the "
        "model width; 0 = off", SUBFORMER, kind=int, check="nonneg", metavar="E")
    safe_output: str = option(
        "--safe-output", "linear", "SAFE output path d -> E: linear (reference) or mlp (with a "
        "nonlinearity)", SUBFORMER, check="choice", choices=SAFE_OUTPUTS, metavar="PATH")

    @rule
    def narrow_table_is_not_the_output(self, m):
        narrow = ("--hsoftpos-levels", self.hsoftpos_levels) if self.hsoftpos_levels else (
            ("--tc-emb", m.tc_emb) if m.tc_emb else None)
        if m.tied_output and narrow and not self.safe_embed_dim:
            raise option_error(narrow[0], narrow[1], "its token table cannot be the vocabulary "
                               "projection (H-SoftPOS's is narrower than the model, a Tensor "
                               "Chain's is never built)", "untied embeddings "
                               "(--no-share-decoder-input-output-embed, no --share-all-embeddings), "
                               "or drop it")

    @rule
    def tied_output_reads_a_dense_table(self, m):
        """A tied vocabulary projection is the decoder's token table: a dense one as wide as the
        decoder's output (not an adaptive input; the narrow tables are refused above)."""
        if not m.tied_output or self.safe_embed_dim or m.adaptive_softmax_cutoff:
            return
        table_dim = m.decoder_input_dim if m.model == "slim_lm" else m.decoder_embed_dim
        output_dim = m.decoder_output_dim or table_dim
        if m.adaptive_input or (table_dim and table_dim != output_dim):
            raise option_error("--share-decoder-input-output-embed", None, "a tied output needs "
                               f"a dense token table of width {output_dim}, which this input "
                               "embedding does not have", "drop it (and --share-all-embeddings)")

    @rule
    def embed_path_fills_a_dense_table(self, m):
        for side in SIDES:
            path = m.get_side(side, "embed_path")
            if path and (m.tc_emb or self.hsoftpos_levels or self.safe_embed_dim):
                raise option_error("--encoder-embed-path/--decoder-embed-path", path, "needs the "
                                   "standard dense embedding of the model width", "no "
                                   "--hsoftpos-levels, --safe-embed-dim or --tc-emb with it")

    @rule
    def safe_output_is_tied(self, m):
        if self.safe_embed_dim and m.untie_output_given:
            raise option_error("--no-share-decoder-input-output-embed", None, "SAFE's output "
                               "path (--safe-embed-dim) is tied to its token table, so there is "
                               "no separate projection to untie",
                               alternatives=[{"--no-share-decoder-input-output-embed": None}])

    @rule
    def min_token_dim_needs_hsoftpos(self, m):
        if self.hsoftpos_min_token_dim and not self.hsoftpos_levels:
            raise _off("--hsoftpos-min-token-dim", self.hsoftpos_min_token_dim, "H-SoftPOS",
                       "--hsoftpos-levels L >= 1, or --hsoftpos-min-token-dim 0")

    @rule
    def one_input_embedding(self, m):
        if self.hsoftpos_levels and self.safe_embed_dim:
            raise option_error("--hsoftpos-levels", self.hsoftpos_levels, "and --safe-embed-dim "
                               "are alternative input embeddings", alternatives=[
                                   {"--hsoftpos-levels": 0}, {"--safe-embed-dim": 0}])
        own = [(flag, {flag: 0}) for flag, value in (("--hsoftpos-levels", self.hsoftpos_levels),
                                                     ("--safe-embed-dim", self.safe_embed_dim))
               if value]
        one_of_a_kind(m, InputEmbeddingVariant, own,
                      "an input embedding, and {other} selects another")

    @rule
    def safe_output_needs_safe(self, m):
        if self.safe_output != "linear" and not self.safe_embed_dim:
            raise _off("--safe-output", self.safe_output, "SAFE", "--safe-embed-dim E, or drop "
                       "--safe-output")

    @rule
    def hsoftpos_leaves_token_width(self, m):
        """H-SoftPOS's soft-position slots are floor(d / 2l) >= 1 wide, and >= 1 with
        ``--hsoftpos-min-token-dim``, on every side."""
        levels, min_dim = self.hsoftpos_levels, self.hsoftpos_min_token_dim
        for side in m.sides:
            width = m.get_side(side, "embed_dim")
            if not (levels and width):
                continue
            if width // (2 * levels) < 1:
                raise option_error("--hsoftpos-levels", levels, f"too many for model width "
                                   f"{width}", f"1..{width // 2}")
            if width - (2 * levels - 1) * (width // (2 * levels)) < min_dim and \
                    (width - min_dim) // (2 * levels - 1) < 1:
                raise option_error("--hsoftpos-min-token-dim", min_dim, "leaves no "
                                   f"soft-position width at d={width}, l={levels}",
                                   f"0..{width - (2 * levels - 1)}")

    @rule
    def safe_slims(self, m):
        for side in m.sides:
            width = m.get_side(side, "embed_dim")
            if self.safe_embed_dim and width and self.safe_embed_dim >= width:
                raise option_error("--safe-embed-dim", self.safe_embed_dim, "at or above the "
                                   f"model width {width}, SAFE slims nothing", f"0 (off) or an "
                                   f"integer below the model width {width}")

    @rule
    def learned_positions_exist(self, m):
        for side in m.sides:
            if m.get_side(side, "learned_pos") and m.no_token_positional_embeddings:
                raise option_error(f"--{side}-learned-pos", None, "shapes positions that "
                                   "--no-token-positional-embeddings removes", "one of the two")

    @rule
    def safe_replaces_the_output(self, m):
        if self.safe_embed_dim and (m.tc_output or self.output_bias):
            flag = "--tc-output" if m.tc_output else "--output-bias"
            off = {"--tc-output": 0} if m.tc_output else {"--no-output-bias": True}
            raise option_error(flag, m.tc_output or None, "acts on the vocabulary projection, "
                               "which SAFE replaces with its own path tied to the token table",
                               alternatives=[off, {"--safe-embed-dim": 0}])

    @rule
    def one_output_path(self, m):
        own = [(flag, change) for flag, value, change in (
            ("--safe-embed-dim", self.safe_embed_dim, {"--safe-embed-dim": 0}),
            ("--tc-output", m.tc_output, {"--tc-output": 0}),
            ("--output-bias", self.output_bias, {"--no-output-bias": True}),
            ("--adaptive-softmax-cutoff", m.adaptive_softmax_cutoff,
             {"--adaptive-softmax-cutoff": None})) if value]
        one_of_a_kind(m, OutputVariant, own,
                      "a vocabulary projection, and {other} acts on another")

    @rule
    def adaptive_softmax_replaces_the_output(self, m):
        if m.adaptive_softmax_cutoff and (m.tc_output or self.output_bias or self.safe_embed_dim):
            flag = ("--tc-output" if m.tc_output else "--output-bias" if self.output_bias
                    else "--safe-embed-dim")
            raise option_error(flag, None, "acts on the vocabulary projection, which "
                               "--adaptive-softmax-cutoff replaces", "one output layer")

    @rule
    def adaptive_softmax_criterion(self, m):
        if m.adaptive_softmax_cutoff and m.criterion not in (None, "adaptive_loss"):
            raise option_error("--criterion", m.criterion, "fairseq trains an adaptive softmax "
                               "(--adaptive-softmax-cutoff) with adaptive_loss only; the others "
                               "fail in backward", alternatives=[{"--criterion": "adaptive_loss"}])

    @rule
    def adaptive_input_replaces_the_table(self, m):
        if m.adaptive_input and (self.hsoftpos_levels or self.safe_embed_dim or m.tc_emb):
            raise option_error("--adaptive-input", None, "replaces the token table that "
                               "--hsoftpos-levels / --safe-embed-dim / --tc-emb build",
                               "one input embedding")

    def spec(self, m, cfg, side):
        """The :class:`~slim_fairseq.specs.EmbeddingSpec` of ``side`` (fairseq's config ``cfg``
        gives its width, positions, scale and dropout)."""
        sub = cfg.encoder if side == "encoder" else cfg.decoder
        return EmbeddingSpec(
            model_dim=sub.embed_dim,
            max_positions=cfg.max_source_positions if side == "encoder" else cfg.max_target_positions,
            causal=side == "decoder",
            learned_pos=bool(sub.learned_pos),
            normalize_before=bool(sub.normalize_before),
            scale=not cfg.no_scale_embedding,
            positions=not cfg.no_token_positional_embeddings,
            table=m.chain("tc_emb"),
            hsoftpos_levels=int(self.hsoftpos_levels),
            hsoftpos_min_token_dim=int(self.hsoftpos_min_token_dim),
            safe_dim=int(self.safe_embed_dim),
            dropout=float(cfg.dropout),
            attention_dropout=float(cfg.attention_dropout),
            variant=next(iter(techniques_on(m, InputEmbeddingVariant)), None))

    def token_table_dim(self, m, cfg, model_dim):
        """Width of the token table for an input embedding at ``model_dim`` (the table is built
        before the sides, and one table may serve both)."""
        return _token_table_dim(dataclasses.replace(self.spec(m, cfg, "decoder"),
                                                    model_dim=model_dim))

    def safe_output_spec(self, m):
        return SAFEOutputSpec(mlp=self.safe_output == "mlp", activation=m.activation)


# ---------------------------------------------------------------------------- sandwich

@register
@dataclass(frozen=True)
class SandwichOptions(OptionSpec):
    """Sandwich sharing of the middle layers (Subformer, arXiv:2101.00234, Sec. 2.2;
    docs/TECHNIQUES.md#sandwich-sharing)."""

    sandwich: bool = option("--sandwich", False, "sandwich-style sharing of the middle layers",
                            SUBFORMER, kind=bool, negatable=True)
    sandwich_dim: int = option("--sandwich-dim", 0, "width of the shared middle layers; 0 = the "
                               "model width", SUBFORMER, kind=int, check="nonneg", metavar="D")
    sandwich_ffn_dim: int = option("--sandwich-ffn-dim", 0, "FFN width of the shared middle "
                                   "layers; 0 = the model's FFN width", SUBFORMER, kind=int,
                                   check="nonneg", metavar="F")
    sandwich_heads: int = option("--sandwich-heads", 0, "attention heads of the shared middle "
                                 "layers; 0 = their width // 64", SUBFORMER, kind=int,
                                 check="nonneg", metavar="H")
    sandwich_cross_norm: str = option(
        "--sandwich-cross-norm", "layernorm", "closing norm of the wider middle decoder layers' "
        "cross-attention path: layernorm (reference) or none", SUBFORMER, check="choice",
        choices=SANDWICH_CROSS_NORMS, metavar="NORM", only="slim_transformer",
        why_only=_CROSS_ONLY)

    def middle(self, model_dim):
        """(width, heads) of the middle of a side ``model_dim`` wide: ``--sandwich-dim`` and
        ``--sandwich-heads``, at 0 the model's width and :func:`heads_for` the middle width."""
        middle_dim = self.sandwich_dim or model_dim
        return middle_dim, self.sandwich_heads or heads_for(middle_dim)

    @rule
    def shape_needs_a_sandwich(self, m):
        if self.sandwich:
            return
        for dest in ("sandwich_dim", "sandwich_ffn_dim", "sandwich_heads"):
            if getattr(self, dest):
                raise _off(_flag(dest), getattr(self, dest), "the shared middle layers of "
                           "--sandwich", f"add --sandwich, or {_flag(dest)} 0")
        if self.sandwich_cross_norm != "layernorm":
            raise _off("--sandwich-cross-norm", self.sandwich_cross_norm, "the sandwich's wider "
                       "middle", "add --sandwich with a --sandwich-dim wider than the model, or "
                       "drop it")

    def _sides(self, m):
        """(side, layers, model width, middle width, middle heads) of each sandwich stack."""
        if not self.sandwich:
            return []
        return [(side, m.get_side(side, "layers"), m.get_side(side, "embed_dim"),
                 *self.middle(m.get_side(side, "embed_dim"))) for side in m.sides]

    @rule
    def first_middle_and_last_layers(self, m):
        for side, layers, _, _, _ in self._sides(m):
            if layers < 3:
                raise option_error(f"--{side}-layers", layers, "too few for --sandwich (own "
                                   "first and last layer plus shared middle ones)", ">= 3")

    @rule
    def heads_divide_the_middle(self, m):
        for _, _, _, middle_dim, heads in self._sides(m):
            if middle_dim % heads:
                raise option_error("--sandwich-heads", heads, f"does not divide "
                                   f"--sandwich-dim={middle_dim}", "a divisor of the middle "
                                   "width (0 = width // 64)")

    @rule
    def no_layerdrop_at_a_width_change(self, m):
        for side, _, model_dim, middle_dim, _ in self._sides(m):
            layerdrop = m.get_side(side, "layerdrop") or 0.0
            if middle_dim != model_dim and layerdrop:
                raise option_error(f"--{side}-layerdrop", layerdrop, "cannot be combined with "
                                   "--sandwich and --sandwich-dim != model width (dropping a "
                                   "boundary layer drops its width projection)", "0")

    @rule
    def cross_norm_needs_a_wider_middle(self, m):
        for side, _, model_dim, middle_dim, _ in self._sides(m):
            cross_norm = self.sandwich_cross_norm
            if cross_norm != "layernorm" and side == "decoder" and middle_dim == model_dim:
                raise option_error("--sandwich-cross-norm", cross_norm, "acts on the "
                                   "cross-attention of a middle wider than the model, and "
                                   f"--sandwich-dim={middle_dim} is the model width", "a wider "
                                   "--sandwich-dim, or drop --sandwich-cross-norm")

    @rule
    def no_cross_self_attention_at_a_width_change(self, m):
        for side, _, model_dim, middle_dim, _ in self._sides(m):
            if middle_dim != model_dim and side == "decoder" and m.cross_self_attention:
                raise option_error("--cross-self-attention", None, "cannot be combined with "
                                   "--sandwich and --sandwich-dim != model width", "off")

    @rule
    def unsharded_backend(self, m):
        backend = m.ddp_backend or "pytorch_ddp"
        if self.sandwich and backend in _SHARDED_BACKENDS:
            raise option_error("--ddp-backend", backend, "cannot hold the sandwich's shared "
                               "middle-layer weights (one parameter in several FSDP units)",
                               "legacy_ddp|no_c10d|pytorch_ddp|c10d")

    @rule
    def checkpointing_backend(self, m):
        backend = m.ddp_backend or "pytorch_ddp"
        if self.sandwich and m.checkpoint_activations and \
                backend in _DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING:
            raise option_error("--checkpoint-activations", None, f"with --sandwich under "
                               f"--ddp-backend={backend} gives silently wrong gradients for "
                               "the shared layers", "--ddp-backend legacy_ddp|no_c10d")

    def spec(self, cfg, side):
        """The :class:`~slim_fairseq.specs.SandwichSpec` of ``side``, or None without
        ``--sandwich``: options at 0 take the model's width, FFN width and :func:`heads_for` the
        middle width."""
        if not self.sandwich:
            return None
        sub = cfg.encoder if side == "encoder" else cfg.decoder
        middle_dim, middle_heads = self.middle(sub.embed_dim)
        return SandwichSpec(layers=sub.layers, model_dim=sub.embed_dim, middle_dim=middle_dim,
                            middle_ffn=self.sandwich_ffn_dim or sub.ffn_embed_dim,
                            middle_heads=middle_heads, cross_norm=self.sandwich_cross_norm,
                            export=bool(cfg.export))

    @staticmethod
    def middle_layer_cfg(cfg, side, spec):
        """A copy of ``cfg`` whose ``side`` has the sandwich middle's width, FFN width and
        heads, for the middle layers (``cfg`` itself is not changed)."""
        mid = copy.deepcopy(cfg)
        sub = mid.encoder if side == "encoder" else mid.decoder
        sub.embed_dim, sub.ffn_embed_dim, sub.attention_heads = (spec.middle_dim, spec.middle_ffn,
                                                                 spec.middle_heads)
        if side == "decoder":
            # the middle-wide cross-attention the layer builds is replaced by the sandwich's own
            # (SandwichCrossAttention); it reads middle-wide keys meanwhile
            mid.encoder.embed_dim = spec.middle_dim
        return mid


# ---------------------------------------------------------------------------- attention

@register
@dataclass(frozen=True)
class AttentionOptions(OptionSpec):
    """The attention's techniques: Anthe's gates and identity projections (arXiv:2305.10991;
    docs/TECHNIQUES.md#gated-pre-attention), grouped key/value heads, the head width and RoPE
    (the STLM block, docs/TECHNIQUES.md#stlm-block)."""

    self_attn_gate: str = option(
        "--self-attn-gate", "none", "gated pre-attention in every self-attention: "
        + "|".join(GATES), ANTHE, check="choice", choices=GATES, metavar="GATE")
    cross_attn_gate: str = option(
        "--cross-attn-gate", "none", "gate of the encoder-decoder attention: "
        + "|".join(CROSS_GATES) + " (gates mixing the two sequences need S == T and leak future "
        "tokens)", ANTHE, check="choice", choices=CROSS_GATES, metavar="GATE",
        only="slim_transformer", why_only=_CROSS_ONLY, refused_choices=GATES,
        choice_why=CROSS_GATE_WHY)
    no_patt: bool = option("--no-patt", False, "the pre-attention projections W_Q, W_K, W_V are "
                           "the identity", ANTHE, kind=bool)
    kv_heads: int = option("--kv-heads", 0, "key/value heads: 0 = as many as the query heads "
                           "(MHA), 1 = MQA, a divisor of the heads = GQA", BLOCK, kind=int,
                           check="nonneg", metavar="N")
    head_dim: int = option("--head-dim", 0, "channels per head; 0 = width // heads, rounded down "
                           "to even with RoPE", BLOCK, kind=int, check="nonneg", metavar="N")
    rope_theta: float = option("--rope-theta", 0.0, "RoPE base on the self-attention's queries "
                               "and keys; 0 = no RoPE", BLOCK, kind=float, check="nonneg",
                               metavar="T")

    @rule
    def extensions_read_scores(self, m):
        """A skipless decoder's self-attention is shaped attention: an extension that adds to
        the scores has none to add to there."""
        if m.skipless_layout == "none":
            return
        for ext in attention_extensions(m, "decoder_self"):
            if hasattr(ATTENTION_EXTENSIONS[type(ext)], "score_bias"):
                raise option_error(ext.flag, ext.value(), "adds to the attention scores, and "
                                   "--skipless-layout makes the decoder's self-attention shaped "
                                   "attention, which has none", alternatives=[
                                       {ext.flag: None}, {"--skipless-layout": "none"}])

    @rule
    def heads_divide_the_width(self, m):
        for side in m.sides:
            width, heads = m.get_side(side, "embed_dim"), m.get_side(side, "attention_heads")
            if heads < 1 or width % heads:
                # the divisors nearest the count given (by ratio), of which those that pass
                # every other rule are proposed
                divisors = sorted((h for h in range(1, width + 1) if width % h == 0),
                                  key=lambda h: abs(math.log(h / max(heads, 1))))
                raise option_error(f"--{side}-attention-heads", heads, f"does not divide "
                                   f"--{side}-embed-dim={width}", alternatives=[
                                       {f"--{side}-attention-heads": h} for h in divisors], most=3)

    @rule
    def kv_heads_divide_the_heads(self, m):
        for side in m.sides:
            width, heads = m.get_side(side, "embed_dim"), m.get_side(side, "attention_heads")
            all_heads = [heads] + ([m.get(SandwichOptions).middle(width)[1]] if m.sandwich else [])
            for count in all_heads:
                if self.kv_heads and count % self.kv_heads:
                    raise option_error("--kv-heads", self.kv_heads, f"does not divide the {count} "
                                       "query heads", "0 (as many as the heads), 1 (MQA) or a "
                                       "divisor of the heads")

    @rule
    def rope_rotates_pairs(self, m):
        if self.rope_theta and self.head_dim % 2:
            raise option_error("--head-dim", self.head_dim, "odd, but RoPE rotates channel pairs",
                               "an even number, or 0")

    @rule
    def identity_projections_span_the_width(self, m):
        for side in m.sides:
            width, heads = m.get_side(side, "embed_dim"), m.get_side(side, "attention_heads")
            kv = self.kv_heads
            narrow = (kv and kv != heads) or (self.head_dim and self.head_dim * heads != width)
            if narrow and self.no_patt:
                raise option_error("--no-patt", None, "W_Q, W_K, W_V are the identity, so heads "
                                   "span the model width", "--kv-heads 0 and --head-dim 0 with "
                                   "--no-patt")

    @rule
    def one_name_per_gate(self, m):
        if self.no_patt and self.self_attn_gate in SAME_UNDER_NO_PATT:
            gate = self.self_attn_gate
            raise option_error("--self-attn-gate", gate, f"with --no-patt q, k and v are all the "
                               f"input, so {gate} is {SAME_UNDER_NO_PATT[gate]}", "none|qgv|vgq|vgk "
                               "with --no-patt (one name per gated input)")

    @rule
    def gate_widths_match(self, m):
        """A gate AgB multiplies B by sigmoid(W_A A): W_A's output must be as wide as B, in every
        attention the model builds. Refused with every change that makes it so: another gate, one
        key/value head per query head, the head width the model's, or a head count whose head
        width fills the model (under RoPE an even one)."""
        for attention in self._attentions(m):
            self._check_gate(*attention)

    def _attentions(self, m):
        """(gate flag, role, the side's heads flag, width, heads, key/value input width) of every
        attention the model builds: each side's self-attention (and the sandwich middle's), the
        decoder's cross-attention."""
        out = []
        for side in m.sides:
            width, heads = m.get_side(side, "embed_dim"), m.get_side(side, "attention_heads")
            out.append(("--self-attn-gate", "self", f"--{side}-attention-heads", width, heads,
                        width))
            if m.sandwich:
                middle, middle_heads = m.get(SandwichOptions).middle(width)
                out.append(("--self-attn-gate", "self", "--sandwich-heads", middle, middle_heads,
                            middle))
        if m.model == "slim_transformer":
            out.append(("--cross-attn-gate", "cross", "--decoder-attention-heads",
                        m.decoder_embed_dim, m.decoder_attention_heads, m.encoder_embed_dim))
        return out

    def _check_gate(self, flag, role, heads_flag, width, heads, kv_input):
        gate = getattr(self, flag[2:].replace("-", "_"), "none") or "none"
        if gate == "none":
            return
        rope = bool(self.rope_theta)
        head_dim = attention_head_dim(width, heads, self.head_dim, rope=rope)
        kv = self.kv_heads or heads
        inputs = {"q": width, "k": kv_input, "v": kv_input}
        outputs = {"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim}
        source, target = gate[0], gate[2]
        if outputs[source] == inputs[target]:
            return
        gates = CROSS_GATES if role == "cross" else GATES
        changes = [{flag: other} for other in gates if other != gate]
        changes += [{"--kv-heads": 0}] if self.kv_heads else []
        changes += [{"--head-dim": 0}] if self.head_dim else []
        # head counts near this one whose heads fill the width
        counts = sorted((h for h in range(1, width + 1) if width % h == 0 and h != heads
                         and (not rope or (width // h) % 2 == 0)), key=lambda h: abs(h - heads))
        changes += [{heads_flag: h} for h in counts[:3]]
        kv_text = "1 key/value head" if kv == 1 else f"{kv} key/value heads"
        raise option_error(flag, gate, f"sigmoid(W_{source.upper()} {source}) is "
                           f"{outputs[source]} wide but {target} is {inputs[target]} wide "
                           f"({heads} query heads of {head_dim}, {kv_text})", alternatives=changes)

    def spec(self, m, role, embed_dim, num_heads):
        """The :class:`~slim_fairseq.specs.AttentionSpec` of ``role`` (encoder_self,
        decoder_self or cross) at width ``embed_dim`` with ``num_heads`` heads: the gate of its
        kind, RoPE in self-attention only, shaped attention in a skipless decoder's
        self-attention; a key/value head count or head width equal to the default is stored as
        0 (so that a plain attention stays fairseq's)."""
        cross = role == "cross"
        shaped = role == "decoder_self" and m.skipless_layout != "none"
        removed = m.removed_weights if shaped else "none"
        kv_heads = self.kv_heads if self.kv_heads != num_heads else 0
        head_dim = attention_head_dim(embed_dim, num_heads, self.head_dim,
                                      rope=bool(self.rope_theta))
        return AttentionSpec(
            gate=self.cross_attn_gate if cross else self.self_attn_gate,
            no_patt=bool(self.no_patt),
            chain=m.chain("tc_patt"),
            kv_heads=kv_heads,
            head_dim=head_dim if head_dim * num_heads != embed_dim else 0,
            rope_theta=0.0 if cross else float(self.rope_theta),
            bias=bool(m.linear_bias),
            shaped=shaped,
            removed=removed,
            out_proj=removed == "none" or bool(m.keep_attn_out_proj),
            extensions=attention_extensions(m, role))


# ---------------------------------------------------------------------------- the block

@register
@dataclass(frozen=True)
class BlockOptions(OptionSpec):
    """The block's normalisation, biases and initialisation (docs/TECHNIQUES.md#stlm-block,
    #subformer-training-setup)."""

    norm: Optional[str] = option(
        "--norm", None, "normalisation of the blocks and the final norm: layernorm, rmsnorm, "
        "none or a registered norm (default layernorm; none, and only none, with skipless "
        "blocks)", BLOCK,
        check="choice", choices=NORMS, metavar="NORM",
        shown_default="layernorm; none with --skipless-layout")
    rms_norm_eps: float = option("--rms-norm-eps", 1e-6, "RMSNorm epsilon; needs --norm rmsnorm",
                                 BLOCK, kind=float, check="positive", metavar="E")
    linear_bias: bool = option(
        "--linear-bias", True, "biases on the attention and feed-forward linears "
        "(--no-linear-bias: none, as in the STLM and skipless presets)", BLOCK, kind=bool,
        negatable=True)
    bert_init: bool = option(
        "--bert-init", False, "BERT-style init: N(0, 0.02) weights, zero biases, zero pad row "
        "(the Subformer training setup)", SUBFORMER, kind=bool, negatable=True)
    init_std: float = option(
        "--init-std", 0.0, "GPT-2 init: N(0, S) tables and linears, residual outputs S / sqrt(2 x "
        "layers), zero pad row; 0 = the model's own init", BLOCK, kind=float, check="nonneg",
        metavar="S")

    @staticmethod
    def fill_derived_defaults(args):
        if getattr(args, "norm", None) is None:
            args.norm = "none" if args.skipless_layout != "none" else "layernorm"

    @rule
    def eps_needs_rmsnorm(self, m):
        if _set(self, "rms_norm_eps") and self.norm != "rmsnorm":
            raise _off("--rms-norm-eps", self.rms_norm_eps, "RMSNorm", "--norm rmsnorm, or drop "
                       "--rms-norm-eps")

    @rule
    def norms_placed_exist(self, m):
        if self.norm == "none" and m.model == "slim_transformer":  # (an LM is pre-norm by default)
            for side in SIDES:
                if m.get_side(side, "normalize_before"):
                    raise option_error(f"--{side}-normalize-before", None, "places norms, and "
                                       "--norm none has none", f"--norm layernorm|rmsnorm, or "
                                       f"drop --{side}-normalize-before")
        if self.norm == "none" and m.model == "slim_lm" and m.decoder_normalize_before is False:
            raise option_error("--no-decoder-normalize-before", None, "places a norm after each "
                               "block, and --norm none (the default with --skipless-layout) has "
                               "none", "--norm layernorm|rmsnorm, or drop "
                               "--no-decoder-normalize-before")

    @rule
    def one_init(self, m):
        if self.bert_init and self.init_std:
            raise option_error("--init-std", self.init_std, "and --bert-init are two inits",
                               "one of them")

    def norm_spec(self, export):
        return NormSpec(kind=self.norm, eps=float(self.rms_norm_eps), export=bool(export))


# ---------------------------------------------------------------------------- skipless blocks

@register
@dataclass(frozen=True)
class SkiplessOptions(OptionSpec):
    """Skipless blocks (He & Hofmann, arXiv:2311.01906) and their reduced form without W_Q (or
    W_K, W_V) and P (Graef, arXiv:2404.12362; docs/TECHNIQUES.md#skipless-transformers)."""

    skipless_layout: str = option(
        "--skipless-layout", "none", "skipless blocks (no residual, no norm, shaped attention): "
        "serial s * FFN(Attn(x)) or parallel (Attn(x) + s * FFN(x)) / sqrt(1 + s^2); none = "
        "residual blocks", SKIPLESS, check="choice", choices=SKIPLESS_LAYOUTS, metavar="LAYOUT",
        only="slim_lm", why_only=_LM_ONLY)
    mlp_branch_scale: float = option(
        "--mlp-branch-scale", 1.0, "the factor s on the FFN output of a skipless block", SKIPLESS,
        kind=float, check="positive", metavar="S", only="slim_lm", why_only=_LM_ONLY)
    removed_weights: str = option(
        "--removed-weights", "none", "reduced skipless form without W_Q (or W_K, W_V) and P: "
        "none|q|k|v; k and v need as many key/value heads as heads", SKIPLESS, check="choice",
        choices=("none",) + REMOVABLE, metavar="W", only="slim_lm", why_only=_LM_ONLY)
    keep_attn_out_proj: bool = option(
        "--keep-attn-out-proj", False, "reduced form that keeps P (exact conversion of a parallel "
        "model)", SKIPLESS, kind=bool, negatable=True, only="slim_lm", why_only=_LM_ONLY)

    @property
    def on(self):
        return self.skipless_layout != "none"

    @rule
    def one_block_layout(self, m):
        own = [("--skipless-layout", {"--skipless-layout": "none"})] if self.on else []
        one_of_a_kind(m, BlockLayout, own, "a block layout, and {other} selects another")

    @rule
    def shape_needs_skipless_blocks(self, m):
        if self.on:
            return
        for dest in ("mlp_branch_scale", "removed_weights", "keep_attn_out_proj"):
            if _set(self, dest):
                raise _off(_flag(dest), getattr(self, dest), "skipless blocks",
                           f"--skipless-layout serial|parallel, or drop {_flag(dest)}")

    @rule
    def no_norm(self, m):
        if self.on and m.norm != "none":
            raise option_error("--norm", m.norm, "skipless blocks have no normalisation",
                               "none (the default with --skipless-layout)")

    @rule
    def shaped_attention_starts_at_zero(self, m):
        if self.on and (m.tc_patt or m.tc_layer):
            raise option_error("--tc-patt" if m.tc_patt else "--tc-layer",
                               m.tc_patt or m.tc_layer, "shaped attention starts from W_Q = 0, "
                               "which a Tensor Chain cannot hold", "--tc-ff for the feed-forward")

    @rule
    def own_init(self, m):
        if self.on and (m.bert_init or m.init_std):
            raise option_error("--bert-init" if m.bert_init else "--init-std",
                               None if m.bert_init else m.init_std, "skipless blocks have their "
                               "own signal-preserving init", "drop it")

    @rule
    def keep_p_needs_the_reduced_form(self, m):
        if self.on and self.keep_attn_out_proj and self.removed_weights == "none":
            raise _off("--keep-attn-out-proj", None, "the reduced form", "--removed-weights q|k|v")

    @rule
    def removed_p_is_not_tied(self, m):
        tied = m.get(TyingOptions).attn_proj is not None
        if self.on and self.removed_weights != "none" and tied and not self.keep_attn_out_proj:
            raise option_error("--tie-attn-proj", m.tie_attn_proj, "shares the attention output "
                               f"projection P, which --removed-weights {self.removed_weights} "
                               "removes", "none, or --keep-attn-out-proj")

    @rule
    def removed_projection_is_plain(self, m):
        if self.on and self.removed_weights != "none" and (m.self_attn_gate != "none" or m.no_patt):
            raise option_error("--removed-weights", self.removed_weights, "the reduced form drops "
                               "a plain projection, which gates and --no-patt change",
                               "none with --self-attn-gate / --no-patt")

    @rule
    def removed_projection_is_square(self, m):
        """The reduced form replaces W by the identity: W must be square."""
        if not self.on or self.removed_weights == "none":
            return
        removed, width = self.removed_weights, m.decoder_embed_dim
        heads = m.decoder_attention_heads
        head_dim = attention_head_dim(width, heads, m.head_dim, rope=bool(m.rope_theta))
        kv = m.kv_heads or heads
        out = (heads if removed == "q" else kv) * head_dim
        if out != width:
            changes = [{"--removed-weights": other} for other in REMOVABLE if other != removed]
            changes += [{"--kv-heads": 0}] if m.kv_heads else []
            changes += [{"--head-dim": 0}] if m.head_dim else []
            raise option_error("--removed-weights", removed, f"W_{removed.upper()} is not square "
                               f"here ({width} -> {out}: {heads if removed == 'q' else kv} heads "
                               f"of {head_dim})", alternatives=changes)


# ---------------------------------------------------------------------------- a model's options

# the plugin's own options (a technique registered from outside the plugin adds its own)
OPTIONS = tuple(sorted(vocabulary.all_options(), key=lambda o: GROUPS.index(o.group)))
BY_DEST = {described.dest: described for described in OPTIONS}

# attributes the parser adds to note that a flag was written (not options of the model)
FLAG_NOTES = ("untie_output_given",)

# what dropping a flag of fairseq's parser undoes (the plugin's own flags take their default)
_DROPPED = {"--no-share-decoder-input-output-embed": (FLAG_NOTES[0], False)}

# fairseq's options the rules read, per side and for the model
SIDE_KEYS = ("layers", "embed_dim", "ffn_embed_dim", "attention_heads", "layerdrop",
             "learned_pos", "normalize_before", "xformers_att_config", "input_dim", "output_dim",
             "embed_path")
MODEL_KEYS = ("activation_fn", "quant_noise_pq", "share_decoder_input_output_embed",
              "share_all_embeddings", "no_token_positional_embeddings", "adaptive_softmax_cutoff",
              "adaptive_input", "criterion", "ddp_backend", "checkpoint_activations",
              "distributed_world_size", "cross_self_attention", "base_layers") + DROPOUTS \
    + FLAG_NOTES


def _frozen(value):
    """``value`` as a hashable constant (fairseq's lists and configs as tuples)."""
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return tuple(_frozen(v) for v in value)
    return value


def table_options():
    """Every registered option in the table's order (by technique group, then as registered)."""
    return sorted(vocabulary.all_options(),
                  key=lambda o: GROUPS.index(o.group) if o.group in GROUPS else len(GROUPS))


@dataclass(frozen=True)
class ModelOptions:
    """A model's options read from fairseq's config once: one instance of every registered spec
    and the values of fairseq's options the rules read. Every option and fairseq value reads
    as an attribute (``m.tc_ff``, ``m.decoder_layers``); :meth:`validate` runs the rules once
    for equal options; the ``*_spec`` methods give what the blocks are built from."""

    model: str
    specs: tuple
    fairseq: tuple

    @classmethod
    def of(cls, args, model=None):
        """The options of ``args`` (a Namespace or fairseq config) for ``model``
        (``slim_transformer`` or ``slim_lm``; by default the one whose options ``args`` holds)."""
        if model is None:
            model = "slim_transformer" if hasattr(args, "encoder_embed_dim") or \
                hasattr(args, "encoder") else "slim_lm"
        values = {}
        for key in MODEL_KEYS:
            values[key] = _frozen(getattr(args, key, None))
        for side in SIDES:
            sub = getattr(args, side, None)
            for key in SIDE_KEYS:
                flat = getattr(args, f"{side}_{key}", None)
                if flat is None and sub is not None and not isinstance(sub, (str, int)):
                    flat = getattr(sub, key, None)
                values[f"{side}_{key}"] = _frozen(flat)
        if values["quant_noise_pq"] is None and hasattr(args, "quant_noise"):
            values["quant_noise_pq"] = getattr(args.quant_noise, "pq", None)
        specs = tuple(spec_cls.from_args(args) for spec_cls in vocabulary.specs())
        return cls(model, specs, tuple(sorted(values.items())))

    def __getattr__(self, name):
        if not name.startswith("__") and name not in ("model", "specs", "fairseq"):
            for spec in self.specs:
                if name in type(spec).__dataclass_fields__:
                    return getattr(spec, name)
            for key, value in self.fairseq:
                if key == name:
                    return value
        raise AttributeError(f"{name}: not an option the plugin reads; allowed: a registered "
                             "option, or fairseq's of SIDE_KEYS and MODEL_KEYS")

    def get(self, spec_cls):
        return next(spec for spec in self.specs if type(spec) is spec_cls)

    def get_side(self, side, key):
        return getattr(self, f"{side}_{key}")

    @property
    def sides(self):
        return SIDES if self.model == "slim_transformer" else ("decoder",)

    @property
    def activation(self):
        return self.activation_fn or "relu"

    @property
    def tied_output(self):
        return bool(self.share_decoder_input_output_embed or self.share_all_embeddings)

    def changed(self, change):
        """These options with the command-line ``change`` ({flag: value}; None: the flag
        dropped) made."""
        specs, fairseq = list(self.specs), dict(self.fairseq)
        for flag, value in change.items():
            dest = flag[2:].replace("-", "_")
            described = next((o for o in vocabulary.all_options() if flag in o.flags()), None)
            if value is None:
                dest, value = (described.dest, described.default) if described else _DROPPED[flag]
            elif value is True and described is not None:  # a flag without a value: on, or off
                dest, value = described.dest, flag == described.flag
            current = getattr(self, dest, None)
            if isinstance(current, (int, float)) and not isinstance(current, bool) \
                    and value is not None:
                value = type(current)(value)
            for i, spec in enumerate(specs):
                if dest in type(spec).__dataclass_fields__:
                    specs[i] = dataclasses.replace(spec, **{dest: value})
                    break
            else:
                fairseq[dest] = value
        return ModelOptions(self.model, tuple(specs), tuple(sorted(fairseq.items())))

    # ------------------------------------------------------------------------ the rules

    def validate(self):
        """Every rule on these options, once for equal options (one line per refusal; a refusal
        that proposes changes of the command line names only those that pass every rule)."""
        _validated(self)

    def check(self):
        """Every rule, in order (:func:`slim_fairseq.options.check_rules`)."""
        vocabulary.check_rules(self, self.model)

    def _refusal_of(self, change):
        """The refusal of these options with ``change`` made (None: they pass every rule)."""
        try:
            self.changed(change).check()
        except (OptionError, ValueError) as error:
            return error
        return None

    def _accepts(self, change):
        return self._refusal_of(change) is None

    def _passing(self, changes):
        """The ``changes`` that pass every rule, in order: a refusal proposes only what works.
        When none does, each refused by another rule that proposes changes of its own is
        joined with the first of those that makes it pass (a head count that divides the
        width, with the gate that width allows: ``--decoder-attention-heads 3
        --cross-attn-gate none``)."""
        refusals = [(change, self._refusal_of(change)) for change in changes]
        kept = [change for change, refusal in refusals if refusal is None]
        if kept:
            return kept
        for change, refusal in refusals:
            for more in getattr(refusal, "alternatives", ()):
                joined = {**change, **more}
                if set(more) & set(change) or joined in kept:
                    continue
                if self._accepts(joined):
                    kept.append(joined)
                    break
        return kept

    # ------------------------------------------------------------------------ the specs

    def chain(self, place):
        return self.get(ChainOptions).chain(place)

    def attention_spec(self, role, embed_dim, num_heads):
        return self.get(AttentionOptions).spec(self, role, embed_dim, num_heads)

    def feed_forward_spec(self):
        """The :class:`~slim_fairseq.specs.FeedForwardSpec`: the variant whose options are on
        (None: the dense feed-forward), the activation, Tensor-Chain linears and biases."""
        variant = next(iter(techniques_on(self, FeedForwardVariant)), None)
        return FeedForwardSpec(variant=variant, activation=self.activation,
                               chain=self.chain("tc_ff"), bias=bool(self.linear_bias))

    def norm_spec(self, export=False):
        return self.get(BlockOptions).norm_spec(export)

    def layer_spec(self, cfg, side):
        """The layers of ``side`` at the widths ``cfg`` gives that side (a sandwich middle's
        config has the middle's)."""
        sub = cfg.encoder if side == "encoder" else cfg.decoder
        skipless = self.skipless_layout if side == "decoder" else "none"
        cross = (self.attention_spec("cross", sub.embed_dim, sub.attention_heads)
                 if side == "decoder" else AttentionSpec())
        return LayerSpec(self_attn=self.attention_spec(f"{side}_self", sub.embed_dim,
                                                       sub.attention_heads),
                         cross_attn=cross, ffn=self.feed_forward_spec(),
                         norm=self.norm_spec(cfg.export), skipless=skipless,
                         mlp_branch_scale=float(self.mlp_branch_scale),
                         layout=next(iter(techniques_on(self, BlockLayout)), None))

    def embedding_spec(self, cfg, side):
        return self.get(EmbeddingOptions).spec(self, cfg, side)

    def token_table_dim(self, cfg, model_dim):
        return self.get(EmbeddingOptions).token_table_dim(self, cfg, model_dim)

    def safe_output_spec(self):
        return self.get(EmbeddingOptions).safe_output_spec(self)

    def sandwich_spec(self, cfg, side):
        return self.get(SandwichOptions).spec(cfg, side)

    def tying_spec(self):
        return self.get(TyingOptions).spec()


@functools.lru_cache(maxsize=64)
def _validated(options):
    try:
        options.check()
    except OptionError as error:
        if not error.alternatives:
            raise
        raise error.with_alternatives(options._passing(error.alternatives)) from None
    return True


# ---------------------------------------------------------------------------- the parser

# fairseq's own options that read the same in both models, with the plugin's addition
FAIRSEQ_READINGS = (
    ("--activation-fn", "relu; silu with --ffn-glu", "the feed-forward's activation; under "
     "--ffn-glu the gate's (" + "|".join(GLU_ACTIVATIONS) + "); the plugin adds silu to fairseq's "
     "choices"),
    ("--no-share-decoder-input-output-embed", "tied as the preset says", "unties the vocabulary "
     "projection of a preset that ties it (stlm_tied and the STLM rows); refused with "
     "--safe-embed-dim, whose output path is tied to its token table"),
    ("--no-decoder-normalize-before", "slim_lm: pre-norm; slim_transformer: post-norm", "post-norm "
     "decoder layers; slim_lm is pre-norm by default, as fairseq's base_lm_architecture makes it"),
)


def options_markdown():
    """docs/DESIGN.md's option tables: every option of the plugin (flag, models, default,
    meaning), then fairseq's options the plugin reads in its own way. ``slim-fairseq-help
    --options`` prints it; tests/test_usability.py checks DESIGN.md holds exactly this."""
    return vocabulary.markdown(OPTIONS, "**fairseq's own options, with what the plugin adds** "
                               "(both models)", FAIRSEQ_READINGS)


def add_slim_args(parser):
    """Declare every registered option, grouped by technique."""
    vocabulary.add_arguments(parser, table_options())


class _Untie(argparse._StoreFalseAction):
    """``--no-share-decoder-input-output-embed``: store_false, and the flag noted, so that a
    model which cannot untie the projection (SAFE) refuses it instead of ignoring it."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, FLAG_NOTES[0], True)


ACTIVATION_HELP = ("the feed-forward's activation (under --ffn-glu: the gate's; default relu, silu "
                   "under --ffn-glu): " + "|".join(ACTIVATIONS))


@functools.lru_cache(maxsize=None)
def _read_by_the_plugin(config_cls):
    """fairseq's model dataclass ``config_cls`` with ``activation_fn`` taking :data:`ACTIVATIONS`."""
    from fairseq.dataclass import ChoiceEnum
    activation = dataclasses.field(default="relu", metadata={"help": ACTIVATION_HELP})
    return dataclasses.make_dataclass(config_cls.__name__, [
        ("activation_fn", ChoiceEnum(list(ACTIVATIONS)), activation)], bases=(config_cls,))


def add_fairseq_args(parser, config_cls, **how):
    """fairseq's options of its model dataclass ``config_cls``, declared as fairseq's own
    ``add_args`` declares them (``gen_parser_from_dataclass`` with ``how``), with the plugin's
    reading: ``--activation-fn`` also takes silu (the GLU gate's default)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass
    gen_parser_from_dataclass(parser, _read_by_the_plugin(config_cls)(), **how)


def extend_fairseq_args(parser):
    """The ``--no-`` forms the plugin adds to fairseq's ``--share-decoder-input-output-embed``
    and ``--decoder-normalize-before`` (declared by :func:`add_fairseq_args`)."""
    parser.add_argument("--no-share-decoder-input-output-embed", action=_Untie,
                        dest="share_decoder_input_output_embed",
                        help="separate vocabulary projection (for presets that tie it)")
    parser.add_argument("--no-decoder-normalize-before", action="store_false",
                        dest="decoder_normalize_before",
                        help="post-norm decoder layers (slim_lm is pre-norm unless given this)")


def set_slim_defaults(args):
    """Fill every registered option the command line and the preset left unset, then the
    defaults that follow a rule (each spec's ``fill_derived_defaults``: ``--norm`` none with
    skipless blocks, else layernorm; ``--activation-fn`` silu under ``--ffn-glu``;
    ``--ffn-lora-alpha`` the rank)."""
    vocabulary.fill_defaults(args, vocabulary.all_options())
    for spec_cls in vocabulary.specs():
        derived = getattr(spec_cls, "fill_derived_defaults", None)
        if derived is not None:
            derived(args)


def validate_slim_args(args, model):
    """The rules on the options of ``args`` in ``model`` (``slim_transformer`` or ``slim_lm``),
    once for equal options (:meth:`ModelOptions.validate`); returns the :class:`ModelOptions`."""
    options = ModelOptions.of(args, model)
    options.validate()
    return options


# fairseq's WikiText-103 cutoffs (20000,60000 of 267,744 types), as fractions of a dictionary
ADAPTIVE_CUTOFF_FRACTIONS = (20000 / 267744, 60000 / 267744)


def check_adaptive_cutoffs(args, vocab):
    """fairseq's adaptive input and softmax split the dictionary at increasing cutoffs up to its
    size (larger ones fail an assertion inside fairseq): refuse them in one line, proposing the
    WikiText-103 presets' proportions of this dictionary (both flags when the two are tied)."""
    flags = [flag for flag, on in (("--adaptive-input-cutoff", getattr(args, "adaptive_input", False)),
                                   ("--adaptive-softmax-cutoff", True))
             if on and getattr(args, flag[2:].replace("-", "_"), None)]
    for flag in flags:
        value = getattr(args, flag[2:].replace("-", "_"))
        if isinstance(value, (list, tuple)):  # fairseq's translation parser gives a list
            value = ",".join(str(c) for c in value)
        try:
            cutoffs = [int(c) for c in str(value).split(",")]
        except ValueError:
            raise option_error(flag, value, "not comma-separated whole numbers",
                               "e.g. 20000,60000") from None
        if all(c > 0 for c in cutoffs) and cutoffs == sorted(set(cutoffs)) and cutoffs[-1] <= vocab:
            continue
        first, second = (max(1, round(vocab * f)) for f in ADAPTIVE_CUTOFF_FRACTIONS)
        scaled = f"{first},{max(first + 1, second)}"
        change = {f: scaled for f in (flags if getattr(args, "tie_adaptive_weights", False) else [flag])}
        raise option_error(flag, value, f"cutoffs must increase and stay within the dictionary's "
                           f"{vocab:,} types", alternatives=[change] if first + 1 < vocab else (),
                           allowed=None if first + 1 < vocab else "a larger dictionary")
