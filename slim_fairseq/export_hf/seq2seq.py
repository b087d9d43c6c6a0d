"""``SlimForConditionalGeneration`` (transformers custom code, :mod:`.custom`) from a translation
model that no stock class computes: Anthe's gates in self- and cross-attention, H-SoftPOS on
either side, identity projections (``--no-patt``), a GLU, RoPE, a bias on the output projection
(arXiv:2305.10991; docs/TECHNIQUES.md#anthe); the Subformer's SAFE on both sides and a sandwich
middle of another width, FFN width or heads (arXiv:2101.00234; docs/TECHNIQUES.md#subformer);
post-norm or pre-norm per side; RMSNorm (which FSMT and M2M100 lack) and fairseq's learned
positions, ``--layernorm-embedding``. Tensor Chains are materialised first, as for every layout. The
``anthe_base*``, ``anthe_ablation_b*``, ``subformer_*`` and ``sandwich_*`` presets are such
models (a sandwich at the model's own shape without SAFE stays FSMT or M2M100).

The maths is the plugin's own files (:data:`.custom.MODULES`); :func:`check` is an allow-list:
whatever else the model has is refused by name.
"""
from slim_fairseq.export_hf.layers import (LAYER_NORM_EPS, attention_shape, copy_attention,
                                           copy_linear, copy_mlp, no_projections,
                                           normformer_scales, other_activation)
from slim_fairseq.export_hf.source import input_embedding, sinusoid_table
from slim_fairseq.option_errors import option_error

CLASS = "SlimForConditionalGeneration"
AUTO = "AutoModelForSeq2SeqLM"
CUSTOM = True
# the options of the list of what no stock class holds that this layout computes
COMPUTES = ("self_attn_gate", "cross_attn_gate", "hsoftpos_levels", "output_bias", "no_patt",
            "safe_embed_dim", "sandwich", "layernorm_embedding")
ACTIVATIONS = ("relu", "gelu", "silu")
WHAT = "the exported translation model (custom code)"
SIDES = ("encoder", "decoder")


def applies(src):
    """A translation model with what FSMT and M2M100 lack and the custom code computes."""
    args = src.args
    return not src.lm and (
        getattr(args, "self_attn_gate", "none") not in (None, "none")
        or getattr(args, "cross_attn_gate", "none") not in (None, "none")
        or bool(getattr(args, "hsoftpos_levels", 0)) or bool(getattr(args, "no_patt", False))
        or bool(getattr(args, "output_bias", False)) or bool(getattr(args, "ffn_glu", False))
        or bool(float(getattr(args, "rope_theta", 0) or 0))
        or bool(getattr(args, "safe_embed_dim", 0)) or args.norm == "rmsnorm"
        or bool(getattr(args, "layernorm_embedding", False)) or _other_middle(src))


def _other_middle(src):
    """Whether a sandwich middle has another width, FFN width or heads than its side."""
    from slim_fairseq.models.slim_options import SandwichOptions
    args = src.args
    if not getattr(args, "sandwich", False):
        return False
    for side in ("decoder",) if src.lm else SIDES:
        width = getattr(args, f"{side}_embed_dim")
        middle_dim, middle_heads = SandwichOptions.from_args(args).middle(width)
        if (middle_dim, args.sandwich_ffn_dim or getattr(args, f"{side}_ffn_embed_dim"),
                middle_heads) != (width, getattr(args, f"{side}_ffn_embed_dim"),
                                  getattr(args, f"{side}_attention_heads")):
            return True
    return False


def _embedding(src, side):
    """``(kind, the embedding module)``: "hsoftpos", "safe" or "standard"."""
    from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding
    from slim_fairseq.modules.safe import SAFEInputEmbedding
    embed = getattr(src.model, side).embed_tokens
    return ("hsoftpos" if isinstance(embed, HSoftPOSEmbedding) else "safe"
            if isinstance(embed, SAFEInputEmbedding) else "standard"), embed


def _positions(module):
    from fairseq.modules import SinusoidalPositionalEmbedding
    positions = module.embed_positions
    return ("none" if positions is None else "sinusoidal"
            if isinstance(positions, SinusoidalPositionalEmbedding) else "learned")


def check(src):
    """A one-line refusal for each thing the exported translation model does not compute."""
    args = src.args
    if (args.activation_fn or "relu") not in ACTIVATIONS:
        yield other_activation(args.activation_fn, WHAT, ACTIVATIONS)
    for side in SIDES:
        stack = getattr(src.model, side)
        if getattr(args, f"{side}_normalize_before") and stack.layer_norm is None:
            yield option_error(f"--no-{side}-final-norm", None, f"{WHAT} normalises the last "
                               "layer's output", f"the final norm (no --no-{side}-final-norm)")
        standard = input_embedding(src.model, side)
        if standard is not None and standard.project_in:
            yield no_projections(WHAT)
    if src.model.decoder.project_out_dim is not None:
        yield no_projections(WHAT)
    yield from normformer_scales(src.model.decoder, f"{WHAT} has no NormFormer scales")


def _norm(reader, src_name, dst_name, out):
    """A norm into ``out`` (LayerNorm, or RMSNorm: a weight only); its eps."""
    weight, bias, eps = reader.norm(src_name)
    out[f"{dst_name}.weight"] = weight
    if bias is not None:
        out[f"{dst_name}.bias"] = bias
    return eps


def _norm_values(args, eps):
    """The config values of the blocks' norms of ``eps``: RMSNorm's (``--norm rmsnorm``; SAFE's
    and a sandwich's LayerNorms keep fairseq's eps) or LayerNorm's."""
    if args.norm == "rmsnorm":
        return dict(norm="rmsnorm", rms_norm_eps=eps, norm_eps=LAYER_NORM_EPS)
    return dict(norm="layernorm", norm_eps=eps)


def _safe(reader, embed, prefix, dst, out):
    """SAFE's input side into ``out``; the shape of its attention."""
    copy_attention(reader, f"{prefix}self_attn", f"{dst}.self_attn", embed.self_attn, out, {})
    for name in ("fc1", "fc2"):
        copy_linear(reader, f"{prefix}{name}", f"{dst}.{name}", out)
    for name in ("self_attn_layer_norm", "output_layer_norm"):
        _norm(reader, f"{prefix}{name}", f"{dst}.{name}", out)
    heads, kv_heads, head_dim = attention_shape(embed.self_attn)
    return dict(hidden_size=embed.safe_dim, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, attention_gate="none",
                removed_projection=None, rope_theta=0.0, attention_bias=True,
                attention_out_proj=True)


def _cross(reader, src_name, dst_name, module, out, bias):
    """A decoder layer's cross-attention, through a sandwich's projections if it has them."""
    from slim_fairseq.modules.sandwich import SandwichCrossAttention
    if not isinstance(module, SandwichCrossAttention):
        return copy_attention(reader, src_name, dst_name, module, out, bias)
    copy_linear(reader, f"{src_name}.to_model", f"{dst_name}.to_model.linear", out)
    _norm(reader, f"{src_name}.to_model_norm", f"{dst_name}.to_model.layer_norm", out)
    copy_attention(reader, f"{src_name}.attention", f"{dst_name}.attention", module.attention,
                   out, bias)
    copy_linear(reader, f"{src_name}.to_middle", f"{dst_name}.to_middle", out)
    if module.to_middle_norm is not None:
        _norm(reader, f"{src_name}.to_middle_norm", f"{dst_name}.to_middle_norm", out)


def _middle(src, side, stack, out, dst, shape):
    """The values of a sandwich middle of another shape than its side (``shape``), or None."""
    from slim_fairseq.modules.sandwich import SandwichCrossAttention
    if not getattr(src.args, "sandwich", False) or len(stack.layers) < 3:
        return None
    layer = stack.layers[1]
    heads, kv_heads, head_dim = attention_shape(layer.self_attn)
    middle = dict(hidden_size=layer.embed_dim,
                  intermediate_size=out[f"{dst}.layers.1.mlp.fc2.weight"].size(1),
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)
    if all(shape[k] == v for k, v in middle.items()):
        return None
    cross = getattr(layer, "encoder_attn", None)
    projected = layer.embed_dim != shape["hidden_size"]
    return dict(middle, projected=projected, cross_norm=not isinstance(
        cross, SandwichCrossAttention) or cross.to_middle_norm is not None)


def _dense_adaptive_input(reader, holder):
    """fairseq's adaptive input (one table and projection per frequency band) as the one table
    it computes: row w is the band's projection of w's embedding (every parameter read)."""
    import torch
    prefix = holder.table[:-len("weight")]
    for name in list(reader.params):
        if name.startswith(prefix):
            reader.take(name)
    table = reader.module(prefix[:-1])
    with torch.no_grad():
        return table(torch.arange(table.cutoff[-1])[None])[0].float()


def _is_adaptive_input(reader, holder):
    from fairseq.modules import AdaptiveInput
    return holder is not None and isinstance(reader.module(holder.table[:-len(".weight")]),
                                             AdaptiveInput)


def _side(src, reader, side, out, dst=None):
    """The config values of ``side`` (its stack mapped into ``out`` under ``dst``, by default
    ``model.<side>``; a language model's has no cross-attention)."""
    model, args = src.model, src.args
    stack = getattr(model, side)
    kind, embed = _embedding(src, side)
    prefix, dst = f"{side}.embed_tokens.", dst or f"model.{side}"
    cross = side == "decoder" and not src.lm
    width = getattr(args, f"{side}_embed_dim")
    values = dict(hsoftpos_levels=0, hsoftpos_token_dim=0, hsoftpos_slots=0, safe=None)
    if kind == "safe":
        table, scale, positions, pad = (prefix + "table.weight", embed.embed_scale,
                                        _positions(embed), embed.padding_idx)
        token_width = embed.safe_dim
        values["safe"] = _safe(reader, embed, prefix, f"{dst}.embed_tokens", out)
    elif kind == "hsoftpos":
        table, scale, positions, pad = (prefix + "table.weight", embed.embed_scale,
                                        _positions(embed), embed.padding_idx)
        for i in range(len(embed.convs)):
            for part in ("weight", "bias"):
                out[f"{dst}.embed_tokens.convs.{i}.{part}"] = reader.take(
                    f"{prefix}convs.{i}.{part}")
        for i in range(embed.levels):
            out[f"{dst}.embed_tokens.softpos.{i}"] = reader.take(f"{prefix}softpos.{i}")
        token_width = embed.d_emb
        values.update(hsoftpos_levels=embed.levels, hsoftpos_token_dim=token_width,
                      hsoftpos_slots=embed.d_sp)
    else:
        holder = input_embedding(model, side)
        table, scale, positions, pad = (holder.table, holder.scale, holder.positions,
                                        holder.padding_idx)
        token_width = width
    if kind == "standard" and _is_adaptive_input(reader, holder):  # a transformation
        out[f"{dst}.embed_tokens.table.weight"] = _dense_adaptive_input(reader, holder)
    else:
        out[f"{dst}.embed_tokens.table.weight"] = reader.take(table)
    values["table"] = table
    rows = 0
    if positions == "sinusoidal":
        rows = stack.max_positions() + pad + 1
        out[f"{dst}.embed_tokens.positions.weight"] = sinusoid_table(rows, token_width, pad)
    elif positions == "learned":  # fairseq's table, read at its rows (padding_idx + 1 + p)
        learned = (holder.positions_table if kind == "standard"
                   else f"{prefix}embed_positions.weight")
        out[f"{dst}.embed_tokens.positions.weight"] = reader.take(learned)
        rows = out[f"{dst}.embed_tokens.positions.weight"].size(0)
    values["layernorm_embedding"] = reader.has(f"{side}.layernorm_embedding.weight")
    if values["layernorm_embedding"]:  # fairseq's LayerNorm on the embedding's output
        _norm(reader, f"{side}.layernorm_embedding", f"{dst}.layernorm_embedding", out)
    bias = {}
    norms = ("self_attn_layer_norm",) + (("encoder_attn_layer_norm",) if cross
                                         else ()) + ("final_layer_norm",)
    from slim_fairseq.modules.sandwich import SandwichBoundaryLayer
    for i, layer in enumerate(stack.layers):
        src_layer, dst_layer = f"{side}.layers.{i}", f"{dst}.layers.{i}"
        if isinstance(layer, SandwichBoundaryLayer):  # into a wider middle, or out of it
            which = "up" if i == 0 else "down"
            copy_linear(reader, f"{src_layer}.projection.linear", f"{dst}.{which}.linear", out)
            _norm(reader, f"{src_layer}.projection.layer_norm", f"{dst}.{which}.layer_norm", out)
            layer, src_layer = layer.layer, f"{src_layer}.layer"
        copy_attention(reader, f"{src_layer}.self_attn", f"{dst_layer}.self_attn",
                       layer.self_attn, out, bias)
        if cross:
            _cross(reader, f"{src_layer}.encoder_attn", f"{dst_layer}.encoder_attn",
                   layer.encoder_attn, out, bias)
        bias["mlp"] = copy_mlp(reader, src_layer, dst_layer, args.ffn_glu, out)
        for norm in norms:
            eps = _norm(reader, f"{src_layer}.{norm}", f"{dst_layer}.{norm}", out)
    pre_norm = bool(getattr(args, f"{side}_normalize_before"))
    if pre_norm:
        _norm(reader, f"{side}.layer_norm", f"{dst}.norm", out)
    heads, kv_heads, head_dim = attention_shape(stack.layers[0].self_attn)
    values.update(
        vocab_size=out[f"{dst}.embed_tokens.table.weight"].size(0), hidden_size=width,
        intermediate_size=out[f"{dst}.layers.0.mlp.fc2.weight"].size(1),
        num_hidden_layers=len(stack.layers), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=int(
            stack.max_positions()), block="pre-norm" if pre_norm else "post-norm",
        embed_scale=float(scale), positions=positions, position_rows=rows,
        attention_bias=bias.get("attention", False), mlp_bias=bias.get("mlp", False),
        **_norm_values(args, eps))
    values["sandwich"] = _middle(src, side, stack, out, dst, values)
    return values


def _output(src, reader, out):
    """The decoder's output projection into ``out`` (SAFE's ``W h + b`` then the token table,
    or one linear, its bias if it has one); ``(safe_output, output_bias)`` of the config."""
    from slim_fairseq.modules.safe import SAFEOutputProjection
    projection = src.model.decoder.output_projection
    if isinstance(projection, SAFEOutputProjection):  # E(W h + b), E the decoder's table
        copy_linear(reader, "decoder.output_projection.proj", "output_proj", out)
        out["lm_head.weight"] = reader.take("decoder.output_projection.table.weight")
        return ("linear" if projection.activation_fn is None else "mlp"), False
    has_bias = copy_linear(reader, "decoder.output_projection", "lm_head", out)
    return "none", has_bias


def build(src, reader):
    """``(config values, state dict)`` of the :class:`SlimForConditionalGeneration` of
    ``src``."""
    args, d = src.args, src.dictionary
    out = {}
    encoder = _side(src, reader, "encoder", out)
    decoder = _side(src, reader, "decoder", out)
    for side in (encoder, decoder):
        del side["table"]
    safe_output, output_bias = _output(src, reader, out)
    values = dict(
        decoder, glu=bool(args.ffn_glu), hidden_act=args.activation_fn or "relu",
        rope_theta=float(args.rope_theta or 0),
        attention_gate=getattr(args, "self_attn_gate", None) or "none",
        cross_attention_gate=getattr(args, "cross_attn_gate", None) or "none",
        removed_projection="qkv" if getattr(args, "no_patt", False) else None,
        output_bias=output_bias, safe_output=safe_output, tie_word_embeddings=False,
        is_encoder_decoder=True,
        encoder={k: v for k, v in encoder.items() if decoder.get(k) != v},
        bos_token_id=d.bos(), eos_token_id=d.eos(), pad_token_id=d.pad(),
        decoder_start_token_id=d.eos())
    return values, out
