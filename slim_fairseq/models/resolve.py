"""The model's options resolved into the frozen specs the modules are built from
(:mod:`slim_fairseq.specs`; docs/DESIGN.md, "From a flag to the code").

This is the one place after :mod:`slim_options` that reads fairseq's config: each function takes
the config a model or layer is built with (a ``TransformerConfig`` carrying the plugin's options,
filled and checked by :func:`~slim_fairseq.models.slim_options.set_slim_defaults` and
:func:`~slim_fairseq.models.slim_options.validate_slim_args`) and returns a spec. Rules are not
checked here: a config that reaches these functions has passed them.
"""
import copy
import dataclasses

from slim_fairseq.modules import input_embedding
from slim_fairseq.modules.attention import attention_head_dim, heads_for
from slim_fairseq.modules.weight_tying import parse_tie_option
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


def _side(cfg, side):
    if side not in SIDES:
        raise ValueError(f"side={side!r}: not a side of the model; allowed: encoder|decoder")
    return cfg.encoder if side == "encoder" else cfg.decoder


def chain(cfg, place):
    """The Tensor Chain of one placement (``tc_ff``, ``tc_patt``, ``tc_emb``, ``tc_output``):
    ``--tc-layer`` covers ff and patt unless the placement's own option is set."""
    ratio = float(getattr(cfg, place) or 0.0)
    if not ratio and place in ("tc_ff", "tc_patt"):
        ratio = float(cfg.tc_layer or 0.0)
    return ChainSpec(ratio, int(cfg.tc_length), int(cfg.tc_min_bond)) if ratio else ChainSpec()


def attention(cfg, role, embed_dim, num_heads):
    """The attention of ``role`` (encoder_self, decoder_self or cross) at width ``embed_dim``
    with ``num_heads`` heads: the gate of its kind, RoPE in self-attention only, shaped
    attention in a skipless decoder's self-attention."""
    cross = role == "cross"
    shaped = role == "decoder_self" and cfg.skipless_layout != "none"
    removed = cfg.removed_weights if shaped else "none"
    kv_heads = cfg.kv_heads if cfg.kv_heads != num_heads else 0
    head_dim = attention_head_dim(embed_dim, num_heads, cfg.head_dim, rope=bool(cfg.rope_theta))
    return AttentionSpec(
        gate=cfg.cross_attn_gate if cross else cfg.self_attn_gate,
        no_patt=bool(cfg.no_patt),
        chain=chain(cfg, "tc_patt"),
        kv_heads=kv_heads,
        head_dim=head_dim if head_dim * num_heads != embed_dim else 0,
        rope_theta=0.0 if cross else float(cfg.rope_theta),
        bias=bool(cfg.linear_bias),
        shaped=shaped,
        removed=removed,
        out_proj=removed == "none" or bool(cfg.keep_attn_out_proj))


def feed_forward(cfg):
    return FeedForwardSpec(glu=bool(cfg.ffn_glu), activation=cfg.activation_fn or "relu",
                           glu_hidden=cfg.glu_hidden, chain=chain(cfg, "tc_ff"),
                           bias=bool(cfg.linear_bias))


def norm(cfg):
    return NormSpec(kind=cfg.norm, eps=float(cfg.rms_norm_eps), export=bool(cfg.export))


def layer(cfg, side):
    """The layers of ``side`` at the widths ``cfg`` gives that side (a sandwich middle's
    config has the middle's)."""
    sub = _side(cfg, side)
    skipless = cfg.skipless_layout if side == "decoder" else "none"
    cross = (attention(cfg, "cross", sub.embed_dim, sub.attention_heads)
             if side == "decoder" else AttentionSpec())
    return LayerSpec(self_attn=attention(cfg, f"{side}_self", sub.embed_dim, sub.attention_heads),
                     cross_attn=cross, ffn=feed_forward(cfg), norm=norm(cfg), skipless=skipless,
                     mlp_branch_scale=float(cfg.mlp_branch_scale))


def embedding(cfg, side):
    """The input embedding of ``side``."""
    sub = _side(cfg, side)
    return EmbeddingSpec(
        model_dim=sub.embed_dim,
        max_positions=cfg.max_source_positions if side == "encoder" else cfg.max_target_positions,
        causal=side == "decoder",
        learned_pos=bool(sub.learned_pos),
        normalize_before=bool(sub.normalize_before),
        scale=not cfg.no_scale_embedding,
        positions=not cfg.no_token_positional_embeddings,
        table=chain(cfg, "tc_emb"),
        hsoftpos_levels=int(cfg.hsoftpos_levels),
        hsoftpos_min_token_dim=int(cfg.hsoftpos_min_token_dim),
        safe_dim=int(cfg.safe_embed_dim),
        dropout=float(cfg.dropout),
        attention_dropout=float(cfg.attention_dropout))


def token_table_dim(cfg, model_dim):
    """Width of the token table for an input embedding at ``model_dim`` (the table is built
    before the sides, and one table may serve both)."""
    return input_embedding.token_table_dim(
        dataclasses.replace(embedding(cfg, "decoder"), model_dim=model_dim))


def safe_output(cfg):
    return SAFEOutputSpec(mlp=cfg.safe_output == "mlp", activation=cfg.activation_fn or "relu")


def sandwich_middle(options, model_dim):
    """(width, heads) of the sandwich middle of a side ``model_dim`` wide: ``--sandwich-dim``
    and ``--sandwich-heads``, at 0 the model's width and :func:`heads_for` the middle width.
    ``options``: the parsed options or a config carrying them."""
    middle_dim = options.sandwich_dim or model_dim
    return middle_dim, options.sandwich_heads or heads_for(middle_dim)


def sandwich(cfg, side):
    """The sandwich stack of ``side``, or None without ``--sandwich``: options at 0 take the
    model's width, FFN width and :func:`heads_for` the middle width."""
    if not cfg.sandwich:
        return None
    sub = _side(cfg, side)
    middle_dim, middle_heads = sandwich_middle(cfg, sub.embed_dim)
    return SandwichSpec(layers=sub.layers, model_dim=sub.embed_dim, middle_dim=middle_dim,
                        middle_ffn=cfg.sandwich_ffn_dim or sub.ffn_embed_dim,
                        middle_heads=middle_heads, cross_norm=cfg.sandwich_cross_norm,
                        export=bool(cfg.export))


def middle_layer_cfg(cfg, side, spec):
    """A copy of ``cfg`` whose ``side`` has the sandwich middle's width, FFN width and heads,
    for fairseq's layer constructor (``cfg`` itself is not changed)."""
    mid = copy.deepcopy(cfg)
    sub = _side(mid, side)
    sub.embed_dim, sub.ffn_embed_dim, sub.attention_heads = (spec.middle_dim, spec.middle_ffn,
                                                             spec.middle_heads)
    if side == "decoder":
        # the middle-wide cross-attention the layer builds is replaced by the sandwich's own
        # (SandwichCrossAttention); it reads middle-wide keys meanwhile
        mid.encoder.embed_dim = spec.middle_dim
    return mid


def tying(cfg):
    """STLM tying: the offsets of ``--tie-ffn`` / ``--tie-attn-proj`` (None = off) and LoRA;
    an unset ``--ffn-lora-alpha`` is the rank (a scale of 1)."""
    rank = int(cfg.ffn_lora_rank or 0)
    alpha = cfg.ffn_lora_alpha
    return TyingSpec(ffn=parse_tie_option(cfg.tie_ffn, "--tie-ffn"),
                     attn_proj=parse_tie_option(cfg.tie_attn_proj, "--tie-attn-proj"),
                     lora_rank=rank, lora_alpha=float(alpha) if alpha is not None else float(rank))
