"""Command-line options of the plugin's encoder-decoder model and LM (see docs/DESIGN.md).

Options are declared without ``default=`` (fairseq parses model args with
``argument_default=SUPPRESS``); :func:`set_slim_defaults` fills what an arch preset did not set.
Values are checked by :func:`validate_slim_args`, not by argparse ``choices``: it runs right
after parsing and fails with one line (argparse would print its whole usage first).
Plugin-only flags never start with ``encoder-``/``decoder-`` (docs/TECHNIQUES.md#plugin-option-names).
"""

from slim_fairseq.modules.gated_attention import CROSS_GATE_WHY, CROSS_GATES, GATES
from slim_fairseq.modules.tensor_chain_policy import BACKWARD_MODES as TC_BACKWARD_MODES
from slim_fairseq.modules.tensor_chain_policy import FORWARD_MODES as TC_FORWARD_MODES

GLU_ACTIVATIONS = ("silu", "gelu")
SAFE_OUTPUTS = ("linear", "mlp")
SANDWICH_CROSS_NORMS = ("layernorm", "none")
TC_PLACES = ("tc_ff", "tc_patt", "tc_layer", "tc_emb", "tc_output")
# options that only shape a Tensor Chain, with their defaults: the values a model without any
# chain must have (validate_slim_args; compression.without_tensor_chains restores them)
TC_SHAPE_DEFAULTS = (("tc_backward", "auto"), ("tc_forward", "auto"), ("tc_length", 2), ("tc_min_bond", 0))


def add_slim_args(parser):
    """Technique options shared by ``slim_transformer`` and ``slim_lm``."""
    g = parser.add_argument_group("slim_fairseq: Anthe (arXiv:2305.10991; docs/TECHNIQUES.md#anthe)")
    g.add_argument("--self-attn-gate", metavar="GATE",
                   help="gated pre-attention in every self-attention (Anthe, arXiv:2305.10991): "
                        + "|".join(GATES) + "; default none")
    g.add_argument("--cross-attn-gate", metavar="GATE",
                   help="gate of encoder-decoder attention: none|kgv|vgk (gates mixing the two "
                        "sequences are rejected: they need S == T and leak future tokens)")
    g.add_argument("--no-patt", action="store_true",
                   help="pre-attention projections W_Q, W_K, W_V become identity")
    g.add_argument("--ffn-glu", action="store_true",
                   help="GLU feed-forward w2(act(w1 x) * w3 x), hidden floor(2f/3) (Anthe, arXiv:2305.10991)")
    g.add_argument("--glu-activation", metavar="ACT",
                   help="GLU activation: silu|gelu; default silu (SwiGLU, as the Anthe reference code; the paper "
                        "text says GEGLU)")
    g.add_argument("--hsoftpos-levels", type=int, metavar="L",
                   help="H-SoftPOS hierarchical embedding with L levels; 0 = off (Anthe, arXiv:2305.10991)")
    for place, what in (("ff", "feed-forward linears"), ("patt", "W_Q, W_K, W_V"),
                        ("layer", "ff and patt"), ("emb", "token embedding"),
                        ("output", "vocabulary projection")):
        g.add_argument(f"--tc-{place}", type=float, metavar="R",
                       help=f"Tensor-Chain factorisation of the {what} with parameter ratio R "
                            "(0 = dense) (Anthe, arXiv:2305.10991)")
    g.add_argument("--tc-length", type=int, metavar="N", help="Tensor-Chain length n (>= 2)")
    g.add_argument("--tc-min-bond", type=int, metavar="B",
                   help="lowest bond dimension of every Tensor Chain; 0 = as the ratio gives (the "
                        "paper). At small widths a ratio like .005 gives bond 2, which all but "
                        "removes the layer; a floor keeps it useful at more parameters than R")
    g.add_argument("--tc-backward", metavar="MODE",
                   help="what Tensor-Chain layers keep for backward: recompute (the input and the "
                        "cores; intermediates are recomputed, least memory), store (plain autograd "
                        "keeps every intermediate: more memory, fewer matmuls in backward) or auto "
                        "(default: by device and dtype, docs/GPU.md; recompute on CPU and CUDA now)")
    g.add_argument("--tc-forward", metavar="MODE",
                   help="how Tensor-Chain linears multiply: materialise (build W, one matmul), "
                        "contract (the input core by core, W never built) or auto (default: by "
                        "shape, device and dtype, docs/GPU.md)")
    g.add_argument("--hsoftpos-min-token-dim", type=int, metavar="M",
                   help="H-SoftPOS token-table width of at least M (narrower soft-position slots); "
                        "0 = the paper's d - (2l-1) floor(d/2l), only d/4 at l=2")
    g.add_argument("--output-bias", action="store_true", help="bias on the vocabulary projection")

    g = parser.add_argument_group("slim_fairseq: Subformer (arXiv:2101.00234; docs/TECHNIQUES.md#subformer)")
    g.add_argument("--safe-embed-dim", type=int, metavar="E",
                   help="SAFE self-attentive factorised embeddings of width E; 0 = off (Subformer, arXiv:2101.00234)")
    g.add_argument("--safe-output", metavar="PATH",
                   help="SAFE output path d_m -> d_e: linear (reference, default) or mlp (with a "
                        "nonlinearity)")
    g.add_argument("--sandwich", action="store_true",
                   help="sandwich-style parameter sharing of the middle layers (Subformer, arXiv:2101.00234)")
    g.add_argument("--sandwich-dim", type=int, metavar="D",
                   help="width of the shared middle layers (0 = model width)")
    g.add_argument("--sandwich-ffn-dim", type=int, metavar="F",
                   help="FFN width of the shared middle layers (0 = model FFN width)")
    g.add_argument("--sandwich-heads", type=int, metavar="H",
                   help="attention heads of the shared middle layers (0 = width // 64)")
    g.add_argument("--sandwich-cross-norm", metavar="NORM",
                   help="closing norm of the wider middle decoder layers' cross-attention path: "
                        "layernorm (reference code, default) or none (trains better at small "
                        "widths; docs/TECHNIQUES.md#sandwich-sharing)")
    g.add_argument("--bert-init", action="store_true",
                   help="BERT-style init: N(0, 0.02) weights, zero biases, zero pad row")


def set_slim_defaults(args):
    """Defaults of every option of :func:`add_slim_args` (called by the base arch functions)."""
    defaults = dict(
        self_attn_gate="none", cross_attn_gate="none", no_patt=False,
        ffn_glu=False, glu_activation="silu", hsoftpos_levels=0,
        tc_ff=0.0, tc_patt=0.0, tc_layer=0.0, tc_emb=0.0, tc_output=0.0, **dict(TC_SHAPE_DEFAULTS),
        hsoftpos_min_token_dim=0,
        output_bias=False,
        safe_embed_dim=0, safe_output="linear", sandwich=False, sandwich_dim=0,
        sandwich_ffn_dim=0, sandwich_heads=0, sandwich_cross_norm="layernorm", bert_init=False,
    )
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def _fail(flag, value, allowed, why=""):
    raise ValueError(f"{flag}={value!r} is not allowed; allowed: {allowed}" + (f" ({why})" if why else ""))


def validate_slim_args(args):
    """One-line errors for bad option values, before anything is built."""
    if args.self_attn_gate not in GATES:
        _fail("--self-attn-gate", args.self_attn_gate, "|".join(GATES))
    if args.cross_attn_gate not in CROSS_GATES:
        _fail("--cross-attn-gate", args.cross_attn_gate, "|".join(CROSS_GATES), CROSS_GATE_WHY)
    if args.glu_activation not in GLU_ACTIVATIONS:
        _fail("--glu-activation", args.glu_activation, "|".join(GLU_ACTIVATIONS))
    if args.safe_output not in SAFE_OUTPUTS:
        _fail("--safe-output", args.safe_output, "|".join(SAFE_OUTPUTS))
    if args.sandwich_cross_norm not in SANDWICH_CROSS_NORMS:
        _fail("--sandwich-cross-norm", args.sandwich_cross_norm, "|".join(SANDWICH_CROSS_NORMS))
    if args.sandwich_cross_norm != "layernorm" and not args.sandwich:
        raise ValueError(f"--sandwich-cross-norm={args.sandwich_cross_norm} has no sandwich to act on; "
                         "add --sandwich with a --sandwich-dim wider than the model, or drop it")
    if args.hsoftpos_levels < 0:
        _fail("--hsoftpos-levels", args.hsoftpos_levels, "an integer >= 0")
    for place in TC_PLACES:
        r = getattr(args, place)
        if not 0.0 <= r <= 1.0:
            _fail("--" + place.replace("_", "-"), r, "a ratio in [0, 1] (0 = dense)")
    if args.tc_backward not in TC_BACKWARD_MODES:
        _fail("--tc-backward", args.tc_backward, "|".join(TC_BACKWARD_MODES))
    if args.tc_forward not in TC_FORWARD_MODES:
        _fail("--tc-forward", args.tc_forward, "|".join(TC_FORWARD_MODES))
    if args.tc_length < 2:
        _fail("--tc-length", args.tc_length, "an integer >= 2")
    for flag in ("safe_embed_dim", "sandwich_dim", "sandwich_ffn_dim", "sandwich_heads", "tc_min_bond",
                 "hsoftpos_min_token_dim"):
        if getattr(args, flag) < 0:
            _fail("--" + flag.replace("_", "-"), getattr(args, flag), "an integer >= 0")
    # options that only shape a technique which is off: refused, never silently ignored
    if not args.sandwich:
        for flag in ("sandwich_dim", "sandwich_ffn_dim", "sandwich_heads"):
            if getattr(args, flag):
                option = "--" + flag.replace("_", "-")
                raise ValueError(f"{option}={getattr(args, flag)} shapes the shared middle layers of "
                                 f"--sandwich, which is off; add --sandwich, or {option} 0")
    if args.safe_output != "linear" and not args.safe_embed_dim:
        raise ValueError(f"--safe-output={args.safe_output} needs SAFE; set --safe-embed-dim E, or drop "
                         "--safe-output")
    if args.glu_activation != "silu" and not args.ffn_glu:
        raise ValueError(f"--glu-activation={args.glu_activation} acts on the GLU feed-forward, which is "
                         "off; add --ffn-glu, or drop --glu-activation")
    if not any(getattr(args, place) for place in TC_PLACES):
        for key, default in TC_SHAPE_DEFAULTS:
            # recompute: what the saved options of chainless models may say; it acts on nothing either
            if getattr(args, key) != default and (key, getattr(args, key)) != ("tc_backward", "recompute"):
                flag = "--" + key.replace("_", "-")
                raise ValueError(f"{flag}={getattr(args, key)} has no Tensor Chain to act on; set one of "
                                 f"--tc-ff/--tc-patt/--tc-layer/--tc-emb/--tc-output, or drop {flag}")
    if args.hsoftpos_min_token_dim and not args.hsoftpos_levels:
        raise ValueError(f"--hsoftpos-min-token-dim={args.hsoftpos_min_token_dim} needs H-SoftPOS; "
                         "set --hsoftpos-levels L >= 1, or --hsoftpos-min-token-dim 0")
    if args.hsoftpos_levels and args.safe_embed_dim:
        raise ValueError("--hsoftpos-levels and --safe-embed-dim are alternative input embeddings; "
                         "choose one (set the other to 0)")
    for side in ("encoder", "decoder"):
        width = getattr(args, f"{side}_embed_dim", None)
        if args.safe_embed_dim and width and args.safe_embed_dim >= width:
            _fail("--safe-embed-dim", args.safe_embed_dim,
                  f"0 (off) or an integer below the model width {width}",
                  "SAFE factorises the embedding through a narrower width; at or above the "
                  "width it slims nothing")
    if args.no_patt and args.tc_patt:
        raise ValueError(f"--tc-patt={args.tc_patt!r} cannot be combined with --no-patt (W_Q, W_K, "
                         "W_V are the identity, there is nothing to factorise); set --tc-patt 0")
    if args.tc_emb and args.safe_embed_dim:
        raise ValueError("--tc-emb cannot be combined with --safe-embed-dim (SAFE already factorises "
                         "the embedding); set --tc-emb 0")
