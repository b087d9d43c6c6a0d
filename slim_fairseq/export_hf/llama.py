"""``LlamaForCausalLM`` from a ``slim_lm`` with RMSNorm, pre-norm, a GLU feed-forward and RoPE
(the STLM block, arXiv:2405.14159 Sec. 3; docs/TECHNIQUES.md#stlm-block).

The plugin's RoPE is already "rotate half" (slim_fairseq/modules/rope.py), Llama's convention,
so queries and keys are copied without a permutation. Llama's ``gate_proj`` / ``up_proj`` /
``down_proj`` are the GLU's ``w1`` / ``w3`` / ``fc2``. Tied feed-forwards and shared attention
projections are written as one copy per layer, LoRA folded in; an embedding scale sqrt(d) is
folded into an untied input table.
"""
from slim_fairseq.export_hf.layers import (attention_shape, copy_linear, no_projections,
                                           same_parameter)
from slim_fairseq.export_hf.source import activation_name, input_embedding, is_scaled
from slim_fairseq.option_errors import option_error

CLASS = "LlamaForCausalLM"
AUTO = "AutoModelForCausalLM"
THE_BLOCK = ("--norm rmsnorm --decoder-normalize-before --ffn-glu --rope-theta 10000 "
             "--no-token-positional-embeddings (the STLM block)")


def check(src):
    """A one-line refusal for each thing Llama's class does not hold, naming the option."""
    args, decoder = src.args, src.model.decoder
    embedding = input_embedding(src.model, "decoder")
    wanted = (("--norm", args.norm != "rmsnorm", args.norm, "--norm rmsnorm"),
              ("--decoder-normalize-before", not args.decoder_normalize_before, None,
               "--decoder-normalize-before"),
              ("--ffn-glu", not args.ffn_glu, None, "--ffn-glu"),
              ("--rope-theta", not float(args.rope_theta or 0), args.rope_theta,
               "--rope-theta 10000"),
              ("--no-token-positional-embeddings", embedding.positions != "none", None,
               "--no-token-positional-embeddings"))
    missing = [(flag, value, allowed) for flag, lacks, value, allowed in wanted if lacks]
    if missing:  # named together, so that the advice is the whole block
        flag, value, _ = missing[0]
        yield option_error(flag, value, "Llama's layout, the one class with RMSNorm, RoPE or "
                           f"a GLU, needs all of {THE_BLOCK}",
                           " ".join(allowed for _, _, allowed in missing))
    if decoder.layer_norm is None:
        yield option_error("--no-decoder-final-norm", None, "Llama normalises the last layer's "
                           "output", "the final norm (no --no-decoder-final-norm)")
    if embedding.project_in or decoder.project_out_dim is not None:
        yield no_projections("Llama")
    # Llama's config also requires the width to be a multiple of the heads, even with an
    # explicit head_dim: the plugin's own option rules require it of every model


def build(src, reader):
    """``(config, state dict)`` of the Llama model of ``src``."""
    from transformers import LlamaConfig
    model, args = src.model, src.args
    decoder = model.decoder
    embedding = input_embedding(model, "decoder")
    first = decoder.layers[0]
    heads, kv_heads, head_dim = attention_shape(first.self_attn)
    width = args.decoder_embed_dim
    out = {}
    table = reader.take(embedding.table)
    tied = same_parameter(model, embedding.table, "decoder.output_projection.weight")
    scaled = is_scaled(embedding, width)
    output = reader.take("decoder.output_projection.weight")
    out["model.embed_tokens.weight"] = table * embedding.scale if scaled else table
    out["lm_head.weight"] = output if (scaled or not tied) else out["model.embed_tokens.weight"]
    for i in range(len(decoder.layers)):
        src_layer, dst = f"decoder.layers.{i}", f"model.layers.{i}"
        for name, target in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"),
                             ("out_proj", "o_proj")):
            copy_linear(reader, f"{src_layer}.self_attn.{name}", f"{dst}.self_attn.{target}", out)
        for name, target in (("fc1.w1", "gate_proj"), ("fc1.w3", "up_proj"), ("fc2", "down_proj")):
            copy_linear(reader, f"{src_layer}.{name}", f"{dst}.mlp.{target}", out)
        out[f"{dst}.input_layernorm.weight"] = reader.norm(f"{src_layer}.self_attn_layer_norm")[0]
        out[f"{dst}.post_attention_layernorm.weight"] = reader.norm(
            f"{src_layer}.final_layer_norm")[0]
    norm, _, eps = reader.norm("decoder.layer_norm")
    out["model.norm.weight"] = norm
    config = LlamaConfig(
        vocab_size=table.size(0), hidden_size=width,
        intermediate_size=out["model.layers.0.mlp.gate_proj.weight"].size(0),
        num_hidden_layers=len(decoder.layers), num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim,
        hidden_act=activation_name(args, glu=True), max_position_embeddings=decoder.max_positions(),
        rms_norm_eps=eps, tie_word_embeddings=tied and not scaled,
        rope_parameters={"rope_type": "default", "rope_theta": float(args.rope_theta)},
        attention_bias=bool(args.linear_bias), mlp_bias=bool(args.linear_bias),
        bos_token_id=src.dictionary.eos(), eos_token_id=src.dictionary.eos(),
        pad_token_id=src.dictionary.pad())
    return config, out
