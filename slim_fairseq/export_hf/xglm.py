"""``XGLMForCausalLM`` from a pre-norm LayerNorm LM with sinusoidal positions (``slim_lm``,
fairseq's ``transformer_lm --decoder-normalize-before``).

XGLM is fairseq's decoder: the same sinusoid, looked up at position + 2 (fairseq counts
positions from pad + 1 = 2), ``scale_embedding`` for sqrt(d), a final LayerNorm.
"""
from slim_fairseq.export_hf.layers import copy_layer, copy_norm, same_parameter
from slim_fairseq.export_hf.source import activation_name, input_embedding, is_scaled

CLASS = "XGLMForCausalLM"
AUTO = "AutoModelForCausalLM"


def fits(src):
    """Whether XGLM holds ``src`` (else OPT does, or nothing)."""
    decoder = src.model.decoder
    embedding = input_embedding(src.model, "decoder")
    return (bool(src.args.decoder_normalize_before) and embedding.positions == "sinusoidal"
            and decoder.layer_norm is not None and not embedding.project_in
            and decoder.project_out_dim is None
            and (embedding.scale == 1.0 or is_scaled(embedding, src.args.decoder_embed_dim)))


def build(src, reader):
    from transformers import XGLMConfig
    model, args = src.model, src.args
    decoder = model.decoder
    embedding = input_embedding(model, "decoder")
    width = args.decoder_embed_dim
    out = {}
    table = reader.take(embedding.table)
    tied = same_parameter(model, embedding.table, "decoder.output_projection.weight")
    output = reader.take("decoder.output_projection.weight")
    out["model.embed_tokens.weight"] = table
    out["lm_head.weight"] = table if tied else output
    for i in range(len(decoder.layers)):
        copy_layer(reader, f"decoder.layers.{i}", f"model.layers.{i}", out)
    copy_norm(reader, "decoder.layer_norm", "model.layer_norm", out)
    first = decoder.layers[0]
    config = XGLMConfig(
        vocab_size=table.size(0), max_position_embeddings=decoder.max_positions(), d_model=width,
        ffn_dim=out["model.layers.0.fc1.weight"].size(0), num_layers=len(decoder.layers),
        attention_heads=first.self_attn.num_heads, activation_function=activation_name(args),
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        scale_embedding=embedding.scale != 1.0, tie_word_embeddings=tied,
        bos_token_id=src.dictionary.eos(), eos_token_id=src.dictionary.eos(),
        pad_token_id=src.dictionary.pad(), decoder_start_token_id=src.dictionary.eos())
    return config, out
