"""The plugin's option vocabulary: every option it adds to fairseq's, once, for both models
(``slim_transformer`` and ``slim_lm``; docs/DESIGN.md, "Options", is this table in prose).

:data:`OPTIONS` is the one list: flag, default, help, the technique it belongs to and the models
it applies to. :func:`add_slim_args` declares them (without ``default=``: fairseq parses model
options with ``argument_default=SUPPRESS``, and a preset fills what the command line did not
set), :func:`set_slim_defaults` fills the defaults, :func:`validate_slim_args` checks values and
combinations. Values are checked here, not by argparse ``choices`` (argparse prints its whole
usage first): every error is one line in the format of :func:`~slim_fairseq.option_errors.option_error`.

fairseq's own options keep their meaning, with two readings the plugin adds in every model:
``--activation-fn`` is the feed-forward's activation, the gate's activation under ``--ffn-glu``
(default relu, silu under ``--ffn-glu``; ``silu`` is added to fairseq's choices), and
``--share-decoder-input-output-embed`` gets a ``--no-`` form, for presets that tie by default.
Plugin-only flags never start with ``encoder-``/``decoder-`` (docs/TECHNIQUES.md#plugin-option-names).
"""
import argparse
import copy
from dataclasses import dataclass
from typing import Tuple

from slim_fairseq.models.resolve import sandwich_middle
from slim_fairseq.modules.attention import attention_head_dim
from slim_fairseq.modules.gated_attention import (CROSS_GATE_WHY, CROSS_GATES, GATES,
                                                  SAME_UNDER_NO_PATT)
from slim_fairseq.modules.glu import GLU_ACTIVATIONS, GLU_HIDDEN_RULES
from slim_fairseq.modules.hsoftpos import hsoftpos_dims
from slim_fairseq.modules.shaped_attention import REMOVABLE
from slim_fairseq.modules.tensor_chain_policy import BACKWARD_MODES as TC_BACKWARD_MODES
from slim_fairseq.modules.tensor_chain_policy import FORWARD_MODES as TC_FORWARD_MODES
from slim_fairseq.modules.weight_tying import parse_tie_option, tied_layer_range
from slim_fairseq.option_errors import OptionError, option_error

MODELS = ("slim_transformer", "slim_lm")
TC_PLACES = ("tc_ff", "tc_patt", "tc_layer", "tc_emb", "tc_output")
# options that only shape a Tensor Chain, with their defaults: the values a model without any
# chain must have (validate_slim_args; compression.without_tensor_chains restores them)
TC_SHAPE_DEFAULTS = (("tc_backward", "auto"), ("tc_forward", "auto"), ("tc_length", 2),
                     ("tc_min_bond", 0))
NORMS = ("layernorm", "rmsnorm", "none")
SKIPLESS_LAYOUTS = ("none", "serial", "parallel")
SAFE_OUTPUTS = ("linear", "mlp")
SANDWICH_CROSS_NORMS = ("layernorm", "none")
# fairseq's --activation-fn choices plus silu (SwiGLU's gate, and a plain feed-forward's)
ACTIVATIONS = ("relu", "gelu", "gelu_fast", "gelu_accurate", "tanh", "linear", "silu")

ANTHE = "Anthe (arXiv:2305.10991; docs/TECHNIQUES.md#anthe)"
SUBFORMER = "Subformer (arXiv:2101.00234; docs/TECHNIQUES.md#subformer)"
STLM = "STLM weight tying (arXiv:2405.14159; docs/TECHNIQUES.md#tying-schemes)"
BLOCK = "block: heads, positions, normalisation, biases, init (docs/TECHNIQUES.md#stlm-block)"
SKIPLESS = "skipless blocks (arXiv:2311.01906, arXiv:2404.12362; docs/TECHNIQUES.md#skipless-transformers)"


@dataclass(frozen=True)
class Option:
    """One plugin option. ``check`` names the value rule (``nonneg``, ``positive``, ``ratio``,
    ``length``, ``tie``, or ``choice`` with ``choices``); ``only`` names the one model it applies
    to (None: both) and ``why_only`` says why in the other's refusal; ``negatable`` adds a
    ``--no-`` form to an on/off option that presets switch on."""

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


_CROSS_ONLY = "it acts on cross-attention, which a language model does not have"
_LM_ONLY = "skipless blocks are defined for causal decoder-only models (He & Hofmann)"

OPTIONS = (
    # ------------------------------------------------------------------ Anthe
    Option("--self-attn-gate", "none", "gated pre-attention in every self-attention: "
           + "|".join(GATES), ANTHE, check="choice", choices=GATES, metavar="GATE"),
    Option("--cross-attn-gate", "none", "gate of the encoder-decoder attention: "
           + "|".join(CROSS_GATES) + " (gates mixing the two sequences need S == T and leak future "
           "tokens)", ANTHE, check="choice", choices=CROSS_GATES, metavar="GATE",
           only="slim_transformer", why_only=_CROSS_ONLY),
    Option("--no-patt", False, "the pre-attention projections W_Q, W_K, W_V are the identity",
           ANTHE, kind=bool),
    Option("--ffn-glu", False, "GLU feed-forward w2(act(w1 x) * w3 x); act = --activation-fn "
           "(default silu under --ffn-glu)", ANTHE, kind=bool, negatable=True),
    Option("--glu-hidden", "two-thirds", "hidden width of the GLU: two-thirds = floor(2F/3) of "
           "the --*-ffn-embed-dim F (a plain FFN's parameters; Anthe), full = F (STLM, "
           "LLaMA-style shapes)", ANTHE, check="choice", choices=GLU_HIDDEN_RULES, metavar="RULE"),
    Option("--hsoftpos-levels", 0, "H-SoftPOS hierarchical embedding with L levels; 0 = off",
           ANTHE, kind=int, check="nonneg", metavar="L"),
    Option("--hsoftpos-min-token-dim", 0, "H-SoftPOS token-table width of at least M (narrower "
           "soft-position slots); 0 = the paper's d - (2l-1) floor(d/2l), only d/4 at l=2",
           ANTHE, kind=int, check="nonneg", metavar="M"),
    Option("--tc-ff", 0.0, "Tensor-Chain factorisation of the feed-forward linears with "
           "parameter ratio R; 0 = dense", ANTHE, kind=float, check="ratio", metavar="R"),
    Option("--tc-patt", 0.0, "Tensor-Chain factorisation of W_Q, W_K, W_V with parameter ratio "
           "R; 0 = dense", ANTHE, kind=float, check="ratio", metavar="R"),
    Option("--tc-layer", 0.0, "Tensor-Chain ratio of both the feed-forward and W_Q, W_K, W_V "
           "(--tc-ff / --tc-patt win where set); 0 = dense", ANTHE, kind=float, check="ratio",
           metavar="R"),
    Option("--tc-emb", 0.0, "Tensor-Chain factorisation of the token table with parameter "
           "ratio R; 0 = dense", ANTHE, kind=float, check="ratio", metavar="R"),
    Option("--tc-output", 0.0, "Tensor-Chain factorisation of the vocabulary projection with "
           "parameter ratio R; 0 = dense", ANTHE, kind=float, check="ratio", metavar="R"),
    Option("--tc-length", 2, "Tensor-Chain length n (>= 2)", ANTHE, kind=int, check="length",
           metavar="N"),
    Option("--tc-min-bond", 0, "lowest bond dimension of every Tensor Chain; 0 = as the ratio "
           "gives (the paper). At small widths a ratio like .005 gives bond 2, which all but "
           "removes the layer", ANTHE, kind=int, check="nonneg", metavar="B"),
    Option("--tc-backward", "auto", "what Tensor-Chain layers keep for backward: recompute (the "
           "input and the cores; least memory), store (plain autograd: more memory, fewer "
           "matmuls) or auto (by device and dtype: recompute on the CPU and CUDA now; "
           "docs/GPU.md)", ANTHE, check="choice", choices=TC_BACKWARD_MODES, metavar="MODE"),
    Option("--tc-forward", "auto", "how Tensor-Chain linears multiply: materialise (build W, one "
           "matmul), contract (the input core by core, W never built) or auto (by shape, device "
           "and dtype; docs/GPU.md)", ANTHE, check="choice", choices=TC_FORWARD_MODES,
           metavar="MODE"),
    Option("--output-bias", False, "bias on the vocabulary projection", ANTHE, kind=bool,
           negatable=True),
    # ------------------------------------------------------------------ Subformer
    Option("--safe-embed-dim", 0, "SAFE self-attentive factorised embeddings of width E below "
           "the model width; 0 = off", SUBFORMER, kind=int, check="nonneg", metavar="E"),
    Option("--safe-output", "linear", "SAFE output path d -> E: linear (reference) or mlp (with "
           "a nonlinearity)", SUBFORMER, check="choice", choices=SAFE_OUTPUTS, metavar="PATH"),
    Option("--sandwich", False, "sandwich-style sharing of the middle layers", SUBFORMER,
           kind=bool, negatable=True),
    Option("--sandwich-dim", 0, "width of the shared middle layers; 0 = the model width",
           SUBFORMER, kind=int, check="nonneg", metavar="D"),
    Option("--sandwich-ffn-dim", 0, "FFN width of the shared middle layers; 0 = the model's FFN "
           "width", SUBFORMER, kind=int, check="nonneg", metavar="F"),
    Option("--sandwich-heads", 0, "attention heads of the shared middle layers; 0 = their width "
           "// 64", SUBFORMER, kind=int, check="nonneg", metavar="H"),
    Option("--sandwich-cross-norm", "layernorm", "closing norm of the wider middle decoder "
           "layers' cross-attention path: layernorm (reference) or none", SUBFORMER,
           check="choice", choices=SANDWICH_CROSS_NORMS, metavar="NORM", only="slim_transformer",
           why_only=_CROSS_ONLY),
    Option("--bert-init", False, "BERT-style init: N(0, 0.02) weights, zero biases, zero pad row "
           "(the Subformer training setup)", SUBFORMER, kind=bool, negatable=True),
    # ------------------------------------------------------------------ STLM tying
    Option("--tie-ffn", "none", "share the FFN of layer 1+K with layers 1+K..D-K-1 (0-based; "
           "layer 0 never shared; K=0 = all but the first); none = off", STLM, check="tie",
           metavar="K"),
    Option("--ffn-lora-rank", 0, "rank of a per-layer LoRA adapter on every shared FFN linear; "
           "0 = off; needs --tie-ffn", STLM, kind=int, check="nonneg", metavar="R"),
    Option("--ffn-lora-alpha", None, "LoRA scale numerator: the update is multiplied by A/R "
           "(default A = R); needs --ffn-lora-rank", STLM, kind=float, check="positive",
           metavar="A", shown_default="R"),
    Option("--tie-attn-proj", "none", "share the self-attention output projection over layers "
           "1+K..D-K-1 like --tie-ffn; none = off", STLM, check="tie", metavar="K"),
    # ------------------------------------------------------------------ block
    Option("--kv-heads", 0, "key/value heads: 0 = as many as the query heads (MHA), 1 = MQA, a "
           "divisor of the heads = GQA", BLOCK, kind=int, check="nonneg", metavar="N"),
    Option("--head-dim", 0, "channels per head; 0 = width // heads, rounded down to even with "
           "RoPE", BLOCK, kind=int, check="nonneg", metavar="N"),
    Option("--rope-theta", 0.0, "RoPE base on the self-attention's queries and keys; 0 = no "
           "RoPE", BLOCK, kind=float, check="nonneg", metavar="T"),
    Option("--norm", None, "normalisation of the blocks and the final norm: layernorm, "
           "rmsnorm or none (default layernorm; none, and only none, with skipless blocks)",
           BLOCK, check="choice", choices=NORMS, metavar="NORM",
           shown_default="layernorm; none with --skipless-layout"),
    Option("--rms-norm-eps", 1e-6, "RMSNorm epsilon; needs --norm rmsnorm", BLOCK, kind=float,
           check="positive", metavar="E"),
    Option("--linear-bias", True, "biases on the attention and feed-forward linears "
           "(--no-linear-bias: none, as in the STLM and skipless presets)", BLOCK, kind=bool,
           negatable=True),
    Option("--init-std", 0.0, "GPT-2 init: N(0, S) tables and linears, residual outputs "
           "S / sqrt(2 x layers), zero pad row; 0 = the model's own init", BLOCK, kind=float,
           check="nonneg", metavar="S"),
    # ------------------------------------------------------------------ skipless
    Option("--skipless-layout", "none", "skipless blocks (no residual, no norm, shaped "
           "attention): serial s * FFN(Attn(x)) or parallel (Attn(x) + s * FFN(x)) / sqrt(1 + "
           "s^2); none = residual blocks", SKIPLESS, check="choice", choices=SKIPLESS_LAYOUTS,
           metavar="LAYOUT", only="slim_lm", why_only=_LM_ONLY),
    Option("--mlp-branch-scale", 1.0, "the factor s on the FFN output of a skipless block",
           SKIPLESS, kind=float, check="positive", metavar="S", only="slim_lm",
           why_only=_LM_ONLY),
    Option("--removed-weights", "none", "reduced skipless form without W_Q (or W_K, W_V) and "
           "P: none|q|k|v; k and v need as many key/value heads as heads", SKIPLESS,
           check="choice", choices=("none",) + REMOVABLE, metavar="W", only="slim_lm",
           why_only=_LM_ONLY),
    Option("--keep-attn-out-proj", False, "reduced form that keeps P (exact conversion of a "
           "parallel model)", SKIPLESS, kind=bool, negatable=True, only="slim_lm",
           why_only=_LM_ONLY),
)
BY_DEST = {option.dest: option for option in OPTIONS}

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
    """docs/DESIGN.md's option tables: every option of :data:`OPTIONS` (flag, models, default,
    meaning), then fairseq's options the plugin reads in its own way. ``slim-fairseq-help
    --options`` prints it; tests/test_usability.py checks DESIGN.md holds exactly this."""
    def cell(text):
        return text.replace("|", "\\|")

    header = ["| flag | models | default | meaning |", "|---|---|---|---|"]
    lines, group = [], None
    for option in OPTIONS:
        if option.group != group:
            group = option.group
            lines += ["", f"**{group}**", ""] + header
        flags = " / ".join(f"`{flag}`" for flag in option.flags())
        metavar = f" {option.metavar}" if option.metavar else ""
        flags = flags.replace(f"`{option.flag}`", f"`{option.flag}{metavar}`", 1)
        models = ", ".join(option.models())
        lines.append(f"| {flags} | {models} | {cell(option.default_text())} | {cell(option.help)} |")
    lines += ["", "**fairseq's own options, with what the plugin adds** (both models)", ""] + header
    for flag, default, meaning in FAIRSEQ_READINGS:
        lines.append(f"| `{flag}` | {', '.join(MODELS)} | {cell(default)} | {cell(meaning)} |")
    return "\n".join(lines[1:]) + "\n"


def add_slim_args(parser):
    """Declare every option of :data:`OPTIONS`, grouped by technique."""
    groups = {}
    for option in OPTIONS:
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(f"slim_fairseq: {option.group}")
        group = groups[option.group]
        help_text = option.help + ("" if option.only is None else f" ({option.only} only)")
        if option.kind is bool:
            if option.negatable:
                group.add_argument(option.flag, action=argparse.BooleanOptionalAction,
                                   help=help_text)
            else:
                group.add_argument(option.flag, action="store_true", help=help_text)
        else:
            # choices and ranges are checked by validate_slim_args (one line, no usage dump)
            kind = str if option.check in ("choice", "tie") else option.kind
            group.add_argument(option.flag, type=kind, metavar=option.metavar, help=help_text)


# attributes the parser adds to note that a flag was written (not options of the model)
FLAG_NOTES = ("untie_output_given",)


class _Untie(argparse._StoreFalseAction):
    """``--no-share-decoder-input-output-embed``: store_false, and the flag noted, so that a
    model which cannot untie the projection (SAFE) refuses it instead of ignoring it."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, FLAG_NOTES[0], True)


def extend_fairseq_args(parser):
    """fairseq options with the plugin's reading in every model: ``--activation-fn`` also takes
    silu (the GLU gate's default), and ``--share-decoder-input-output-embed`` a ``--no-`` form."""
    for action in parser._actions:
        if "--activation-fn" in action.option_strings and action.choices is not None:
            action.choices = list(ACTIVATIONS)
            action.help = ("the feed-forward's activation (under --ffn-glu: the gate's; default "
                           "relu, silu under --ffn-glu): " + "|".join(ACTIVATIONS))
    if "--share-decoder-input-output-embed" in parser._option_string_actions:
        parser.add_argument("--no-share-decoder-input-output-embed", action=_Untie,
                            dest="share_decoder_input_output_embed",
                            help="separate vocabulary projection (for presets that tie it)")
    if "--decoder-normalize-before" in parser._option_string_actions:
        parser.add_argument("--no-decoder-normalize-before", action="store_false",
                            dest="decoder_normalize_before",
                            help="post-norm decoder layers (slim_lm is pre-norm unless given this)")


def set_slim_defaults(args):
    """Fill every option of :data:`OPTIONS` the command line and the preset left unset, and the
    defaults that follow a rule: ``--norm`` none with skipless blocks, else layernorm;
    ``--activation-fn`` silu under ``--ffn-glu``."""
    for option in OPTIONS:
        if getattr(args, option.dest, None) is None and option.default is not None:
            setattr(args, option.dest, option.default)
    if getattr(args, "ffn_lora_alpha", None) is None:  # A = R (a scale of 1) unless given
        args.ffn_lora_alpha = float(args.ffn_lora_rank) if args.ffn_lora_rank else None
    if getattr(args, "norm", None) is None:
        args.norm = "none" if args.skipless_layout != "none" else "layernorm"
    if getattr(args, "activation_fn", None) is None and args.ffn_glu:
        args.activation_fn = "silu"


def _flag(dest):
    return "--" + dest.replace("_", "-")


def check_value(option, value):
    """The rule of ``option``'s kind (a choice, a ratio, a length, ...) on one value."""
    allowed = {
        "nonneg": "an integer >= 0" if option.kind is int else "a number >= 0",
        "positive": "a number > 0",
        "ratio": "a ratio in [0, 1] (0 = dense)",
        "length": "an integer >= 2",
        "choice": "|".join(option.choices),
    }
    check = option.check
    if check == "choice" and value not in option.choices:
        if option.dest == "cross_attn_gate" and value in GATES:
            raise option_error(option.flag, value, CROSS_GATE_WHY, allowed[check])
        raise option_error(option.flag, value, "not one of the choices", allowed[check])
    if check == "nonneg" and value < 0:
        raise option_error(option.flag, value, "negative", allowed[check])
    if check == "positive" and value is not None and value <= 0:
        raise option_error(option.flag, value, "not positive", allowed[check])
    if check == "ratio" and not 0.0 <= value <= 1.0:
        raise option_error(option.flag, value, "not a parameter ratio", allowed[check])
    if check == "length" and value < 2:
        raise option_error(option.flag, value, "too short for a chain", allowed[check])


def _is_set(args, option):
    value = getattr(args, option.dest, option.default)
    return value is not None and value != option.default


def _off(flag, value, technique, fix):
    """Refusal of an option that shapes a technique which is off."""
    return option_error(flag, value, f"shapes {technique}, which is off", fix)


def _sides(args, model):
    return ("encoder", "decoder") if model == "slim_transformer" else ("decoder",)


def validate_slim_args(args, model):
    """One-line errors for bad values and for combinations that do nothing or make no sense,
    before anything is built (``model``: ``slim_transformer`` or ``slim_lm``). A refusal that
    proposes changes of the command line names only those that pass every check."""
    try:
        _validate(args, model)
    except OptionError as error:
        if not error.alternatives:
            raise
        kept = [change for change in error.alternatives if _accepts(args, model, change)]
        raise error.with_alternatives(kept) from None


# what dropping a flag of fairseq's parser undoes (the plugin's own flags take their default)
_DROPPED = {"--no-share-decoder-input-output-embed": (FLAG_NOTES[0], False)}


def _accepts(args, model, change):
    """Whether ``args`` with the command-line ``change`` ({flag: value}; None: the flag
    dropped) passes the checks."""
    changed = copy.copy(args)
    for flag, value in change.items():
        if value is None:
            option = next((o for o in OPTIONS if flag in o.flags()), None)
            dest, default = (option.dest, option.default) if option else _DROPPED[flag]
            setattr(changed, dest, default)
            continue
        dest = flag[2:].replace("-", "_")
        current = getattr(changed, dest, None)
        setattr(changed, dest, type(current)(value) if isinstance(current, (int, float))
                and not isinstance(current, bool) else value)
    try:
        _validate(changed, model)
    except (OptionError, ValueError):
        return False
    return True


def _validate(args, model):
    _check_shape(args, model)
    for option in OPTIONS:
        value = getattr(args, option.dest, option.default)
        if option.check not in ("", "tie"):
            check_value(option, value)
        if model not in option.models() and _is_set(args, option):
            raise option_error(option.flag, value, f"not available in {model}: {option.why_only}",
                               "drop it")
    for side in _sides(args, model):
        validate_tying(args, getattr(args, f"{side}_layers"))
    _check_feed_forward(args)
    _check_fairseq_extras(args)
    _check_tensor_chains(args)
    _check_embeddings(args, model)
    _check_sandwich(args, model)
    _check_attention(args, model)
    _check_norm_and_init(args, model)
    _check_skipless(args)


# fairseq's shape options of each side: (suffix, what a value must be)
SHAPE = (("layers", "a model needs at least one layer"), ("embed_dim", "a width must be positive"),
         ("ffn_embed_dim", "a width must be positive"),
         ("attention_heads", "a model needs at least one attention head"))
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout", "relu_dropout")


def _check_shape(args, model):
    """fairseq's own shape and dropout options, which it does not check: a width, depth or head
    count below one, or a dropout outside [0, 1), fails deep inside the build (a division by
    zero, a tensor of negative size) or after training started (a crash.pt)."""
    for side in _sides(args, model):
        for suffix, problem in SHAPE:
            value = getattr(args, f"{side}_{suffix}", None)
            if isinstance(value, int) and value < 1:
                flag = f"--{side}-{suffix.replace('_', '-')}"
                fix = -value if value < 0 else 1
                change = {flag: fix}
                if suffix == "embed_dim":  # the widths the preset copied from it
                    change.update({f"--{side}-{dep.replace('_', '-')}": fix for dep in ("input_dim", "output_dim")
                                   if getattr(args, f"{side}_{dep}", None) == value})
                raise option_error(flag, value, problem, alternatives=[change])
    for suffix in ("input_dim", "output_dim"):
        value = getattr(args, f"decoder_{suffix}", None)
        if isinstance(value, int) and value < 1:
            flag = f"--decoder-{suffix.replace('_', '-')}"
            raise option_error(flag, value, "a width must be positive", alternatives=[
                {flag: -value if value < 0 else args.decoder_embed_dim}])
    for dest in DROPOUTS:
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value < 1:
            flag = f"--{dest.replace('_', '-')}"
            raise option_error(flag, value, "a dropout is a probability in [0, 1)",
                               alternatives=[{flag: 0.1}])


def _check_feed_forward(args):
    if args.ffn_lora_rank and (args.tc_ff or args.tc_layer):
        raise option_error("--ffn-lora-rank", args.ffn_lora_rank, "LoRA adapts dense linears, and "
                           "--tc-ff/--tc-layer make the feed-forward Tensor Chains",
                           "0 with a Tensor-Chain feed-forward")
    activation = getattr(args, "activation_fn", None) or "relu"
    if args.ffn_glu and activation not in GLU_ACTIVATIONS:
        raise option_error("--activation-fn", activation, "not a GLU gate activation (--ffn-glu)",
                           "|".join(GLU_ACTIVATIONS))
    if activation not in ACTIVATIONS:
        raise option_error("--activation-fn", activation, "not an activation", "|".join(ACTIVATIONS))
    if args.glu_hidden != "two-thirds" and not args.ffn_glu:
        raise _off("--glu-hidden", args.glu_hidden, "the GLU feed-forward",
                   "add --ffn-glu, or drop --glu-hidden")


def _check_fairseq_extras(args):
    """fairseq's quant noise and xformers attention act on fairseq's own linears and attention,
    which the techniques replace."""
    custom = [flag for flag, on in (
        ("--ffn-glu", args.ffn_glu), ("--tc-ff/--tc-patt/--tc-layer",
                                      args.tc_ff or args.tc_patt or args.tc_layer),
        ("--self-attn-gate", args.self_attn_gate != "none"),
        ("--cross-attn-gate", getattr(args, "cross_attn_gate", "none") != "none"),
        ("--no-patt", args.no_patt), ("--skipless-layout", args.skipless_layout != "none"),
        ("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim),
        ("--rope-theta", args.rope_theta), ("--no-linear-bias", not args.linear_bias)) if on]
    noise = getattr(args, "quant_noise_pq", 0) or 0
    if noise and custom:
        raise option_error("--quant-noise-pq", noise, "acts on fairseq's dense linears, which "
                           f"{custom[0]} replaces or bypasses",
                           alternatives=[{"--quant-noise-pq": 0}])
    for side in ("encoder", "decoder"):
        xformers = getattr(args, f"{side}_xformers_att_config", None)
        if xformers and custom:
            raise option_error(f"--{side}-xformers-att-config", None, "configures fairseq's own "
                               f"attention, which {custom[0]} replaces", "drop it with " + custom[0])


def _check_tensor_chains(args):
    if not any(getattr(args, place) for place in TC_PLACES):
        for key, default in TC_SHAPE_DEFAULTS:
            # recompute: the default that options saved before --tc-backward auto may hold
            if getattr(args, key) != default and (key, getattr(args, key)) != ("tc_backward", "recompute"):
                raise _off(_flag(key), getattr(args, key), "a Tensor Chain",
                           f"one of --tc-ff/--tc-patt/--tc-layer/--tc-emb/--tc-output, or drop "
                           f"{_flag(key)}")
    if args.no_patt and (args.tc_patt or args.tc_layer and not args.tc_ff):
        ratio = args.tc_patt or args.tc_layer
        raise option_error("--tc-patt" if args.tc_patt else "--tc-layer", ratio,
                           "cannot be combined with --no-patt (W_Q, W_K, W_V are the identity, "
                           "nothing to factorise)", "--tc-patt 0 / --tc-ff instead of --tc-layer")
    if args.tc_layer and args.tc_ff and (args.tc_patt or args.no_patt):
        decided = "--tc-patt" if args.tc_patt else "--no-patt"
        raise option_error("--tc-layer", args.tc_layer, f"covers the feed-forward and W_Q, W_K, "
                           f"W_V, which --tc-ff and {decided} already decide", "0, or drop --tc-ff "
                           f"or {decided}")
    if args.tc_emb and args.safe_embed_dim:
        raise option_error("--tc-emb", args.tc_emb, "cannot be combined with --safe-embed-dim "
                           "(SAFE already factorises the embedding)", "--tc-emb 0")
    if args.tc_output and (getattr(args, "share_decoder_input_output_embed", False)
                           or getattr(args, "share_all_embeddings", False)):
        raise option_error("--tc-output", args.tc_output, "cannot be combined with tied input/"
                           "output embeddings", "--tc-output 0, or --no-share-decoder-input-"
                           "output-embed / no --share-all-embeddings")


def _check_embeddings(args, model):
    tied = (getattr(args, "share_decoder_input_output_embed", False)
            or getattr(args, "share_all_embeddings", False))
    narrow = ("--hsoftpos-levels", args.hsoftpos_levels) if args.hsoftpos_levels else (
        ("--tc-emb", args.tc_emb) if args.tc_emb else None)
    if tied and narrow and not args.safe_embed_dim:
        raise option_error(narrow[0], narrow[1], "its token table cannot be the vocabulary "
                           "projection (H-SoftPOS's is narrower than the model, a Tensor Chain's "
                           "is never built)", "untied embeddings (--no-share-decoder-input-output-"
                           "embed, no --share-all-embeddings), or drop it")
    if args.safe_embed_dim and getattr(args, FLAG_NOTES[0], False):
        raise option_error("--no-share-decoder-input-output-embed", None, "SAFE's output path "
                           "(--safe-embed-dim) is tied to its token table, so there is no "
                           "separate projection to untie",
                           alternatives=[{"--no-share-decoder-input-output-embed": None}])
    if args.hsoftpos_min_token_dim and not args.hsoftpos_levels:
        raise _off("--hsoftpos-min-token-dim", args.hsoftpos_min_token_dim, "H-SoftPOS",
                   "--hsoftpos-levels L >= 1, or --hsoftpos-min-token-dim 0")
    if args.hsoftpos_levels and args.safe_embed_dim:
        raise option_error("--hsoftpos-levels", args.hsoftpos_levels, "and --safe-embed-dim are "
                           "alternative input embeddings", "one of them (set the other to 0)")
    if args.safe_output != "linear" and not args.safe_embed_dim:
        raise _off("--safe-output", args.safe_output, "SAFE", "--safe-embed-dim E, or drop "
                   "--safe-output")
    for side in _sides(args, model):
        width = getattr(args, f"{side}_embed_dim", None)
        if args.hsoftpos_levels and width:
            hsoftpos_dims(width, args.hsoftpos_levels, args.hsoftpos_min_token_dim)
        if args.safe_embed_dim and width and args.safe_embed_dim >= width:
            raise option_error("--safe-embed-dim", args.safe_embed_dim, "at or above the model "
                               f"width {width}, SAFE slims nothing",
                               f"0 (off) or an integer below the model width {width}")
        learned = getattr(args, f"{side}_learned_pos", False)
        if learned and getattr(args, "no_token_positional_embeddings", False):
            raise option_error(f"--{side}-learned-pos", None, "shapes positions that "
                               "--no-token-positional-embeddings removes", "one of the two")
    if args.safe_embed_dim:
        if args.tc_output or args.output_bias:
            flag = "--tc-output" if args.tc_output else "--output-bias"
            raise option_error(flag, args.tc_output or None, "acts on the vocabulary projection, "
                               "which SAFE replaces with its own path tied to the token table",
                               "drop it with --safe-embed-dim")
    if getattr(args, "adaptive_softmax_cutoff", None) and (args.tc_output or args.output_bias
                                                           or args.safe_embed_dim):
        flag = ("--tc-output" if args.tc_output else "--output-bias" if args.output_bias
                else "--safe-embed-dim")
        raise option_error(flag, None, "acts on the vocabulary projection, which "
                           "--adaptive-softmax-cutoff replaces", "one output layer")
    criterion = getattr(args, "criterion", None)
    if getattr(args, "adaptive_softmax_cutoff", None) and criterion not in (None, "adaptive_loss"):
        raise option_error("--criterion", criterion, "fairseq trains an adaptive softmax "
                           "(--adaptive-softmax-cutoff) with adaptive_loss only; the others fail "
                           "in backward", alternatives=[{"--criterion": "adaptive_loss"}])
    if getattr(args, "adaptive_input", False) and (args.hsoftpos_levels or args.safe_embed_dim
                                                   or args.tc_emb):
        raise option_error("--adaptive-input", None, "replaces the token table that "
                           "--hsoftpos-levels / --safe-embed-dim / --tc-emb build",
                           "one input embedding")


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


_SHARDED_BACKENDS = ("fully_sharded",)
_DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING = ("pytorch_ddp", "c10d")


def validate_tying(args, num_layers):
    """STLM tying against a stack of ``num_layers`` layers (docs/TECHNIQUES.md#tying-schemes):
    each tied range ``1+K .. D-K-1`` holds two layers or more, LoRA adapts a tied FFN, and the
    distributed set-up keeps shared Parameters right
    (docs/TECHNIQUES.md#distributed-training-with-shared-weights)."""
    ffn_k = parse_tie_option(args.tie_ffn, "--tie-ffn")
    proj_k = parse_tie_option(args.tie_attn_proj, "--tie-attn-proj")
    for k, flag in ((ffn_k, "--tie-ffn"), (proj_k, "--tie-attn-proj")):
        if k is not None and len(tied_layer_range(k, num_layers)) < 2:
            if num_layers < 3:
                raise option_error(flag, k, f"needs at least 3 layers, the model has {num_layers}",
                                   "none, or 3 layers or more")
            raise option_error(flag, k, f"too large for {num_layers} layers (layers 1+K..D-K-1 "
                               "must hold at least 2 layers)", f"K <= {(num_layers - 3) // 2}")
    rank, alpha = args.ffn_lora_rank, args.ffn_lora_alpha
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise option_error("--ffn-lora-rank", rank, "not a rank", "an integer >= 0")
    if rank > 0 and ffn_k is None:
        raise option_error("--ffn-lora-rank", rank, "LoRA adapts shared FFN weights, and "
                           "--tie-ffn is off", "--tie-ffn K, or --ffn-lora-rank 0")
    if alpha is not None and rank == 0:
        raise option_error("--ffn-lora-alpha", alpha, "scales a LoRA adapter, and --ffn-lora-rank "
                           "is 0", "--ffn-lora-rank R, or drop --ffn-lora-alpha")
    if alpha is not None and float(alpha) <= 0:
        raise option_error("--ffn-lora-alpha", alpha, "not positive", "a number > 0")
    if ffn_k is None and proj_k is None:
        return
    if args.sandwich:
        raise option_error("--tie-ffn" if ffn_k is not None else "--tie-attn-proj",
                           ffn_k if ffn_k is not None else proj_k, "cannot be combined with "
                           "--sandwich (it already shares the middle layers)", "none with --sandwich")
    backend = getattr(args, "ddp_backend", "")
    if backend in _SHARDED_BACKENDS:
        raise option_error("--ddp-backend", backend, "cannot hold weights shared across layers "
                           "(--tie-ffn/--tie-attn-proj)", "legacy_ddp|pytorch_ddp")
    if (getattr(args, "checkpoint_activations", False) and backend in _DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING
            and (getattr(args, "distributed_world_size", 1) or 1) > 1):
        raise option_error("--ddp-backend", backend, "with --checkpoint-activations gives wrong "
                           "gradients for shared layers (--tie-ffn/--tie-attn-proj)", "legacy_ddp")


def _check_sandwich(args, model):
    if not args.sandwich:
        for dest in ("sandwich_dim", "sandwich_ffn_dim", "sandwich_heads"):
            if getattr(args, dest):
                raise _off(_flag(dest), getattr(args, dest), "the shared middle layers of "
                           "--sandwich", f"add --sandwich, or {_flag(dest)} 0")
        if args.sandwich_cross_norm != "layernorm":
            raise _off("--sandwich-cross-norm", args.sandwich_cross_norm, "the sandwich's wider "
                       "middle", "add --sandwich with a --sandwich-dim wider than the model, or "
                       "drop it")
        return
    for side in _sides(args, model):
        _check_sandwich_side(args, side)


def _check_sandwich_side(args, side):
    """What the sandwich stack of ``side`` cannot honour (docs/TECHNIQUES.md#sandwich-sharing)."""
    layers, model_dim = getattr(args, f"{side}_layers"), getattr(args, f"{side}_embed_dim")
    middle_dim, heads = sandwich_middle(args, model_dim)
    if layers < 3:
        raise option_error(f"--{side}-layers", layers, "too few for --sandwich (own first and "
                           "last layer plus shared middle ones)", ">= 3")
    if middle_dim % heads:
        raise option_error("--sandwich-heads", heads, f"does not divide --sandwich-dim={middle_dim}",
                           "a divisor of the middle width (0 = width // 64)")
    layerdrop = getattr(args, f"{side}_layerdrop", 0.0)
    if middle_dim != model_dim and layerdrop:
        raise option_error(f"--{side}-layerdrop", layerdrop, "cannot be combined with "
                           "--sandwich and --sandwich-dim != model width (dropping a boundary "
                           "layer drops its width projection)", "0")
    cross_norm = args.sandwich_cross_norm
    if cross_norm != "layernorm" and side == "decoder" and middle_dim == model_dim:
        raise option_error("--sandwich-cross-norm", cross_norm, "acts on the cross-attention of a "
                           f"middle wider than the model, and --sandwich-dim={middle_dim} is the "
                           "model width", "a wider --sandwich-dim, or drop --sandwich-cross-norm")
    if middle_dim != model_dim and side == "decoder" and getattr(args, "cross_self_attention", False):
        raise option_error("--cross-self-attention", None, "cannot be combined with --sandwich "
                           "and --sandwich-dim != model width", "off")
    backend = getattr(args, "ddp_backend", "pytorch_ddp")
    if backend in _SHARDED_BACKENDS:
        raise option_error("--ddp-backend", backend, "cannot hold the sandwich's shared "
                           "middle-layer weights (one parameter in several FSDP units)",
                           "legacy_ddp|no_c10d|pytorch_ddp|c10d")
    if getattr(args, "checkpoint_activations", False) and backend in _DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING:
        raise option_error("--checkpoint-activations", None, f"with --sandwich under "
                           f"--ddp-backend={backend} gives silently wrong gradients for the "
                           "shared layers", "--ddp-backend legacy_ddp|no_c10d")


def _check_attention(args, model):
    kv = args.kv_heads
    for side in _sides(args, model):
        width, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        if heads < 1 or width % heads:
            raise option_error(f"--{side}-attention-heads", heads, f"does not divide "
                               f"--{side}-embed-dim={width}", f"a divisor of {width}")
        all_heads = [heads] + ([sandwich_middle(args, width)[1]] if args.sandwich else [])
        for count in all_heads:
            if kv and count % kv:
                raise option_error("--kv-heads", kv, f"does not divide the {count} query heads",
                                   "0 (as many as the heads), 1 (MQA) or a divisor of the heads")
        if args.rope_theta and args.head_dim % 2:
            raise option_error("--head-dim", args.head_dim, "odd, but RoPE rotates channel pairs",
                               "an even number, or 0")
        narrow = (kv and kv != heads) or (args.head_dim and args.head_dim * heads != width)
        if narrow and args.no_patt:
            raise option_error("--no-patt", None, "W_Q, W_K, W_V are the identity, so heads span "
                               "the model width", "--kv-heads 0 and --head-dim 0 with --no-patt")
    if args.no_patt and args.self_attn_gate in SAME_UNDER_NO_PATT:
        gate = args.self_attn_gate
        raise option_error("--self-attn-gate", gate, f"with --no-patt q, k and v are all the "
                           f"input, so {gate} is {SAME_UNDER_NO_PATT[gate]}", "none|qgv|vgq|vgk "
                           "with --no-patt (one name per gated input)")
    for attention in _attentions(args, model):
        _check_gate(args, *attention)


def _attentions(args, model):
    """(gate flag, role, the side's heads flag, width, heads, key/value input width) of every
    attention the model builds: each side's self-attention (and the sandwich middle's), the
    decoder's cross-attention."""
    out = []
    for side in _sides(args, model):
        width, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        out.append(("--self-attn-gate", "self", f"--{side}-attention-heads", width, heads, width))
        if args.sandwich:
            middle, middle_heads = sandwich_middle(args, width)
            out.append(("--self-attn-gate", "self", "--sandwich-heads", middle, middle_heads,
                        middle))
    if model == "slim_transformer":
        out.append(("--cross-attn-gate", "cross", "--decoder-attention-heads",
                    args.decoder_embed_dim, args.decoder_attention_heads, args.encoder_embed_dim))
    return out


def _check_gate(args, flag, role, heads_flag, width, heads, kv_input):
    """A gate AgB multiplies B by sigmoid(W_A A): W_A's output must be as wide as B. Refused
    with every change that makes it so: another gate, one key/value head per query head, the
    head width the model's, or a head count whose head width fills the model (under RoPE an
    even one)."""
    gate = getattr(args, flag[2:].replace("-", "_"), "none") or "none"
    if gate == "none":
        return
    rope = bool(args.rope_theta)
    head_dim = attention_head_dim(width, heads, args.head_dim, rope=rope)
    kv = args.kv_heads or heads
    inputs = {"q": width, "k": kv_input, "v": kv_input}
    outputs = {"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim}
    source, target = gate[0], gate[2]
    if outputs[source] == inputs[target]:
        return
    gates = CROSS_GATES if role == "cross" else GATES
    changes = [{flag: other} for other in gates if other != gate]
    changes += [{"--kv-heads": 0}] if args.kv_heads else []
    changes += [{"--head-dim": 0}] if args.head_dim else []
    # head counts near this one whose heads fill the width
    counts = sorted((h for h in range(1, width + 1) if width % h == 0 and h != heads
                     and (not rope or (width // h) % 2 == 0)), key=lambda h: abs(h - heads))
    changes += [{heads_flag: h} for h in counts[:3]]
    kv_text = "1 key/value head" if kv == 1 else f"{kv} key/value heads"
    raise option_error(flag, gate, f"sigmoid(W_{source.upper()} {source}) is {outputs[source]} "
                       f"wide but {target} is {inputs[target]} wide ({heads} query heads of "
                       f"{head_dim}, {kv_text})", alternatives=changes)


def _check_norm_and_init(args, model):
    if args.rms_norm_eps != BY_DEST["rms_norm_eps"].default and args.norm != "rmsnorm":
        raise _off("--rms-norm-eps", args.rms_norm_eps, "RMSNorm", "--norm rmsnorm, or drop "
                   "--rms-norm-eps")
    if args.norm == "none" and model == "slim_transformer":  # (an LM is pre-norm by default)
        for side in ("encoder", "decoder"):
            if getattr(args, f"{side}_normalize_before", False):
                raise option_error(f"--{side}-normalize-before", None, "places norms, and --norm "
                                   "none has none", f"--norm layernorm|rmsnorm, or drop "
                                   f"--{side}-normalize-before")
    if args.norm == "none" and model == "slim_lm" and args.decoder_normalize_before is False:
        raise option_error("--no-decoder-normalize-before", None, "places a norm after each "
                           "block, and --norm none (the default with --skipless-layout) has none",
                           "--norm layernorm|rmsnorm, or drop --no-decoder-normalize-before")
    if args.bert_init and args.init_std:
        raise option_error("--init-std", args.init_std, "and --bert-init are two inits",
                           "one of them")


def _check_skipless(args):
    skipless = args.skipless_layout != "none"
    if not skipless:
        for dest in ("mlp_branch_scale", "removed_weights", "keep_attn_out_proj"):
            if _is_set(args, BY_DEST[dest]):
                raise _off(_flag(dest), getattr(args, dest), "skipless blocks",
                           f"--skipless-layout serial|parallel, or drop {_flag(dest)}")
        return
    if args.norm != "none":
        raise option_error("--norm", args.norm, "skipless blocks have no normalisation",
                           "none (the default with --skipless-layout)")
    if args.tc_patt or args.tc_layer:
        raise option_error("--tc-patt" if args.tc_patt else "--tc-layer",
                           args.tc_patt or args.tc_layer, "shaped attention starts from W_Q = 0, "
                           "which a Tensor Chain cannot hold", "--tc-ff for the feed-forward")
    if args.bert_init or args.init_std:
        raise option_error("--bert-init" if args.bert_init else "--init-std",
                           None if args.bert_init else args.init_std, "skipless blocks have "
                           "their own signal-preserving init", "drop it")
    if args.keep_attn_out_proj and args.removed_weights == "none":
        raise _off("--keep-attn-out-proj", None, "the reduced form", "--removed-weights q|k|v")
    if args.removed_weights != "none":
        tied = parse_tie_option(args.tie_attn_proj, "--tie-attn-proj")
        if tied is not None and not args.keep_attn_out_proj:
            raise option_error("--tie-attn-proj", args.tie_attn_proj, "shares the attention output "
                               f"projection P, which --removed-weights {args.removed_weights} "
                               "removes", "none, or --keep-attn-out-proj")
        if args.self_attn_gate != "none" or args.no_patt:
            raise option_error("--removed-weights", args.removed_weights, "the reduced form "
                               "drops a plain projection, which gates and --no-patt change",
                               "none with --self-attn-gate / --no-patt")
        removed, width = args.removed_weights, args.decoder_embed_dim
        heads = args.decoder_attention_heads
        head_dim = attention_head_dim(width, heads, args.head_dim, rope=bool(args.rope_theta))
        kv = args.kv_heads or heads
        out = (heads if removed == "q" else kv) * head_dim
        if out != width:  # the reduced form replaces W by the identity: W must be square
            changes = [{"--removed-weights": other} for other in REMOVABLE if other != removed]
            changes += [{"--kv-heads": 0}] if args.kv_heads else []
            changes += [{"--head-dim": 0}] if args.head_dim else []
            raise option_error("--removed-weights", removed, f"W_{removed.upper()} is not square "
                               f"here ({width} -> {out}: {heads if removed == 'q' else kv} heads "
                               f"of {head_dim})", alternatives=changes)
