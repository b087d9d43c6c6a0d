"""``SlimForCausalLM`` (transformers custom code, :mod:`.custom`) from a ``slim_lm`` of skipless
blocks (He & Hofmann, arXiv:2311.01906; docs/TECHNIQUES.md#skipless-transformers): shaped
attention with RoPE, grouped key/value heads, the reduced form without W_Q (or W_K, W_V) and P
(Graef, arXiv:2404.12362), a dense or GLU MLP, serial or parallel, no norms.

No stock class has blocks without skips or norms, so the model leaves as custom code whose
maths is the plugin's own files (:data:`.custom.MODULES`): ``rope.py``,
``shaped_attention.py``, ``skipless_block.py``, ``glu_function.py``.
:func:`check` is an allow-list: whatever else the model has is refused by name.
"""
from slim_fairseq.export_hf.layers import (attention_shape, copy_attention, copy_linear, copy_mlp,
                                           no_projections, other_activation, same_parameter)
from slim_fairseq.export_hf.source import input_embedding
from slim_fairseq.option_errors import option_error

CLASS = "SlimForCausalLM"
AUTO = "AutoModelForCausalLM"
CUSTOM = True
# the options of the classes' list of what no class holds that this layout computes
COMPUTES = ("skipless_layout", "norm", "output_bias")
ACTIVATIONS = ("relu", "gelu", "silu")
WHAT = "the exported skipless block (custom code)"


def applies(src):
    return src.lm and getattr(src.args, "skipless_layout", "none") not in (None, "none")


def check(src):
    """A one-line refusal for each thing the exported skipless model does not compute."""
    args, decoder = src.args, src.model.decoder
    embedding = input_embedding(src.model, "decoder")
    if (args.activation_fn or "relu") not in ACTIVATIONS:
        yield other_activation(args.activation_fn, WHAT, ACTIVATIONS)
    if not float(args.rope_theta or 0):
        yield option_error("--rope-theta", args.rope_theta, f"{WHAT} places tokens by RoPE",
                           "--rope-theta 10000")
    # (another input embedding, None here, is refused among the options no class holds)
    if embedding is not None and embedding.positions != "none":
        yield option_error("--no-token-positional-embeddings", None, f"{WHAT} has no absolute "
                           "positions", "--no-token-positional-embeddings")
    if embedding is not None and embedding.project_in or decoder.project_out_dim is not None:
        yield no_projections(WHAT)
    if getattr(args, "sandwich", False):
        yield option_error("--sandwich", None, f"{WHAT} has layers of their own", "no --sandwich")
    if decoder.layer_norm is not None:
        yield option_error("--norm", args.norm, f"{WHAT} has no final norm", "--norm none")


def build(src, reader):
    """``(config values, state dict)`` of the :class:`SlimForCausalLM` of ``src``."""
    model, args = src.model, src.args
    decoder = model.decoder
    embedding = input_embedding(model, "decoder")
    first = decoder.layers[0]
    heads, kv_heads, head_dim = attention_shape(first.self_attn)
    out = {}
    out["model.embed_tokens.table.weight"] = reader.take(embedding.table)
    tied = same_parameter(model, embedding.table, "decoder.output_projection.weight")
    output_bias = copy_linear(reader, "decoder.output_projection", "lm_head", out)
    bias = {}
    for i, layer in enumerate(decoder.layers):
        src_layer, dst = f"decoder.layers.{i}", f"model.layers.{i}"
        copy_attention(reader, f"{src_layer}.self_attn", f"{dst}.self_attn", layer.self_attn,
                       out, bias)
        for name in ("alpha", "beta", "gamma"):
            out[f"{dst}.self_attn.{name}"] = reader.take(f"{src_layer}.self_attn.{name}")
        bias["mlp"] = copy_mlp(reader, src_layer, dst, args.ffn_glu, out)
    attention = first.self_attn
    values = dict(
        vocab_size=out["model.embed_tokens.table.weight"].size(0),
        hidden_size=args.decoder_embed_dim,
        intermediate_size=out["model.layers.0.mlp.fc2.weight"].size(1), glu=bool(args.ffn_glu),
        num_hidden_layers=len(decoder.layers), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, hidden_act=args.activation_fn or "relu",
        max_position_embeddings=decoder.max_positions(), rope_theta=float(args.rope_theta),
        block="skipless", skipless_layout="parallel" if first.parallel else "serial",
        mlp_branch_scale=float(first.mlp_branch_scale), removed_projection=attention.removed,
        attention_out_proj=attention.out_proj is not None,
        attention_bias=bias.get("attention", False), mlp_bias=bias.get("mlp", False),
        embed_scale=float(embedding.scale), output_bias=output_bias, tie_word_embeddings=tied,
        bos_token_id=src.dictionary.eos(), eos_token_id=src.dictionary.eos(),
        pad_token_id=src.dictionary.pad())
    return values, out
