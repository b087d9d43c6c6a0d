"""``SlimForCausalLM`` (transformers custom code, :mod:`.custom`) from a pre-norm ``slim_lm``
with Anthe's techniques (arXiv:2305.10991; docs/TECHNIQUES.md#anthe): gated pre-attention,
identity projections (``--no-patt``), H-SoftPOS, a GLU or dense MLP, a bias on the output
projection; Tensor Chains are materialised
first, as for every layout. The ``anthe_lm*`` presets are such models.

No stock class has the gates or H-SoftPOS, so the model leaves as custom code whose maths is
the plugin's own files (``gate_function.py``, ``hsoftpos_function.py``, ``glu_function.py``,
``rope.py``). :func:`check` is an allow-list: whatever else the model has is refused by name.
"""
from slim_fairseq.export_hf.layers import (attention_shape, no_projections, other_activation,
                                           same_parameter)
from slim_fairseq.export_hf.source import input_embedding, sinusoid_table
from slim_fairseq.option_errors import option_error

CLASS = "SlimForCausalLM"
AUTO = "AutoModelForCausalLM"
CUSTOM = True
# the options of the list of what no stock class holds that this layout computes
COMPUTES = ("self_attn_gate", "hsoftpos_levels", "output_bias", "no_patt")
ACTIVATIONS = ("relu", "gelu", "silu")
WHAT = "the exported Anthe block (custom code)"


def applies(src):
    """A language model with Anthe's gates, identity projections or H-SoftPOS (skipless blocks
    have their layout)."""
    args = src.args
    return src.lm and (getattr(args, "self_attn_gate", "none") not in (None, "none")
                       or bool(getattr(args, "no_patt", False))
                       or bool(getattr(args, "hsoftpos_levels", 0)))


def _embedding(src):
    """``(kind, the embedding module)``: "hsoftpos" or "standard"."""
    from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding
    embed = src.model.decoder.embed_tokens
    return ("hsoftpos" if isinstance(embed, HSoftPOSEmbedding) else "standard"), embed


def _positions(module):
    from fairseq.modules import SinusoidalPositionalEmbedding
    positions = module.embed_positions
    return ("none" if positions is None else "sinusoidal"
            if isinstance(positions, SinusoidalPositionalEmbedding) else "learned")


def check(src):
    """A one-line refusal for each thing the exported Anthe model does not compute."""
    args, decoder = src.args, src.model.decoder
    kind, embed = _embedding(src)
    if not args.decoder_normalize_before:
        yield option_error("--decoder-normalize-before", None, f"{WHAT} is pre-norm",
                           "--decoder-normalize-before")
    if args.norm != "layernorm":
        yield option_error("--norm", args.norm, f"{WHAT} has LayerNorm", "--norm layernorm")
    if decoder.layer_norm is None and args.decoder_normalize_before:  # (post-norm has none)
        yield option_error("--no-decoder-final-norm", None, f"{WHAT} normalises the last "
                           "layer's output", "the final norm (no --no-decoder-final-norm)")
    if (args.activation_fn or "relu") not in ACTIVATIONS:
        yield other_activation(args.activation_fn, WHAT, ACTIVATIONS)
    standard = input_embedding(src.model, "decoder")
    if kind == "hsoftpos" or standard is not None:
        holder = embed if kind == "hsoftpos" else standard
        positions = _positions(embed) if kind == "hsoftpos" else holder.positions
        if positions == "learned":
            yield option_error("--decoder-learned-pos", None, f"{WHAT} has sinusoidal "
                               "positions or none", "no --decoder-learned-pos")
        if kind == "standard" and holder.project_in:
            yield no_projections(WHAT)
    if decoder.project_out_dim is not None and kind == "hsoftpos":
        yield no_projections(WHAT)
    if getattr(args, "sandwich", False):
        yield option_error("--sandwich", None, f"{WHAT} has layers of their own", "no --sandwich")
    for flag, name in (("--scale-attn", "attn_ln"), ("--scale-heads", "c_attn"),
                       ("--scale-fc", "ffn_layernorm"), ("--scale-resids", "w_resid")):
        if getattr(decoder.layers[0], name, None) is not None:
            yield option_error(flag, None, f"{WHAT} has no NormFormer scales", f"no {flag}")


def build(src, reader):
    """``(config values, state dict)`` of the :class:`SlimForCausalLM` of ``src``."""
    model, args = src.model, src.args
    decoder = model.decoder
    kind, embed = _embedding(src)
    prefix = "decoder.embed_tokens."
    width = args.decoder_embed_dim
    out = {}
    if kind == "hsoftpos":
        table_name, scale, positions = prefix + "table.weight", embed.embed_scale, _positions(embed)
        pad = embed.padding_idx
        for i in range(len(embed.convs)):
            for part in ("weight", "bias"):
                out[f"model.embed_tokens.convs.{i}.{part}"] = reader.take(
                    f"{prefix}convs.{i}.{part}")
        for i in range(embed.levels):
            out[f"model.embed_tokens.softpos.{i}"] = reader.take(f"{prefix}softpos.{i}")
        token_width = embed.d_emb
    else:
        holder = input_embedding(model, "decoder")
        table_name, scale, positions, pad = (holder.table, holder.scale, holder.positions,
                                             holder.padding_idx)
        token_width = width
    out["model.embed_tokens.table.weight"] = reader.take(table_name)
    rows = 0
    if positions == "sinusoidal":
        rows = decoder.max_positions() + pad + 1
        out["model.embed_tokens.positions.weight"] = sinusoid_table(rows, token_width, pad)
    tied = same_parameter(model, table_name, "decoder.output_projection.weight")
    out["lm_head.weight"] = reader.take("decoder.output_projection.weight")
    output_bias = reader.has("decoder.output_projection.bias")
    if output_bias:
        out["lm_head.bias"] = reader.take("decoder.output_projection.bias")
    bias = {}
    for i, layer in enumerate(decoder.layers):
        src_layer, dst = f"decoder.layers.{i}", f"model.layers.{i}"
        for name, target in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                             ("out_proj", "o_proj")):
            if getattr(layer.self_attn, name, None) is None:  # the identity (--no-patt)
                continue
            weight, b = reader.linear(f"{src_layer}.self_attn.{name}")
            out[f"{dst}.self_attn.{target}.weight"] = weight
            bias["attention"] = b is not None
            if b is not None:
                out[f"{dst}.self_attn.{target}.bias"] = b
        names = (("fc1.w1", "w1"), ("fc1.w3", "w3"), ("fc2", "fc2")) if args.ffn_glu else (
            ("fc1", "fc1"), ("fc2", "fc2"))
        for name, target in names:
            weight, b = reader.linear(f"{src_layer}.{name}")
            out[f"{dst}.mlp.{target}.weight"] = weight
            bias["mlp"] = b is not None
            if b is not None:
                out[f"{dst}.mlp.{target}.bias"] = b
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            weight, b, eps = reader.norm(f"{src_layer}.{norm}")
            out[f"{dst}.{norm}.weight"], out[f"{dst}.{norm}.bias"] = weight, b
    weight, b, eps = reader.norm("decoder.layer_norm")
    out["model.norm.weight"], out["model.norm.bias"] = weight, b
    heads, kv_heads, head_dim = attention_shape(decoder.layers[0].self_attn)
    values = dict(
        vocab_size=out["model.embed_tokens.table.weight"].size(0), hidden_size=width,
        intermediate_size=out["model.layers.0.mlp.fc2.weight"].size(1), glu=bool(args.ffn_glu),
        num_hidden_layers=len(decoder.layers), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, hidden_act=args.activation_fn or "relu",
        max_position_embeddings=decoder.max_positions(),
        rope_theta=float(args.rope_theta or 0), block="pre-norm",
        attention_gate=getattr(args, "self_attn_gate", None) or "none", norm_eps=eps,
        removed_projection="qkv" if getattr(args, "no_patt", False) else None,
        attention_bias=bias.get("attention", False), mlp_bias=bias.get("mlp", False),
        embed_scale=float(scale), output_bias=output_bias, tie_word_embeddings=tied,
        positions=positions, position_rows=rows,
        hsoftpos_levels=embed.levels if kind == "hsoftpos" else 0,
        hsoftpos_token_dim=token_width if kind == "hsoftpos" else 0,
        hsoftpos_slots=embed.d_sp if kind == "hsoftpos" else 0,
        bos_token_id=src.dictionary.eos(), eos_token_id=src.dictionary.eos(),
        pad_token_id=src.dictionary.pad())
    return values, out
