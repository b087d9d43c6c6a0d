"""``OPTForCausalLM`` from a LayerNorm LM that XGLM does not hold: post-norm (fairseq 0.12.3's
``transformer_lm`` as its command line builds it), learned positions, or input/output
projections (``--decoder-input-dim``/``--decoder-output-dim``, OPT's ``word_embed_proj_dim``).

``do_layer_norm_before`` is fairseq's pre-/post-norm, ``_remove_final_layer_norm`` its
``--no-decoder-final-norm``. OPT's positions are a learned table read at position + 2, as
fairseq's are: a sinusoid is written into it; OPT has no embedding scale, so sqrt(d) is folded
into an untied token table.
"""
from slim_fairseq.export_hf.layers import copy_layer, copy_norm, same_parameter
from slim_fairseq.export_hf.source import (activation_name, input_embedding, is_scaled,
                                           sinusoid_table)
from slim_fairseq.option_errors import option_error

CLASS = "OPTForCausalLM"
AUTO = "AutoModelForCausalLM"


def check(src):
    """A one-line refusal for each thing OPT's class does not hold."""
    decoder = src.model.decoder
    embedding = input_embedding(src.model, "decoder")
    if embedding.positions == "none":
        yield option_error("--no-token-positional-embeddings", None, "a LayerNorm language model "
                           "(XGLM, OPT) needs positions", "sinusoidal or learned positions (no "
                           "--no-token-positional-embeddings)")
    if bool(embedding.project_in) != (decoder.project_out_dim is not None):
        yield option_error("--decoder-input-dim/--decoder-output-dim", None, "OPT projects in "
                           "and out through one width (word_embed_proj_dim)", "both the same")
    width = src.args.decoder_embed_dim
    if embedding.scale != 1.0 and not is_scaled(embedding, width):
        yield option_error("--no-scale-embedding", None, f"an embedding scale {embedding.scale} "
                           f"other than sqrt({width})", "the default scale")


def build(src, reader):
    from transformers import OPTConfig
    model, args = src.model, src.args
    decoder = model.decoder
    embedding = input_embedding(model, "decoder")
    width = args.decoder_embed_dim
    out = {}
    table = reader.take(embedding.table)
    tied = same_parameter(model, embedding.table, "decoder.output_projection.weight")
    output = reader.take("decoder.output_projection.weight")
    scaled = embedding.scale != 1.0
    out["model.decoder.embed_tokens.weight"] = table * embedding.scale if scaled else table
    out["lm_head.weight"] = output if (scaled or not tied) else out["model.decoder.embed_tokens.weight"]
    rows = decoder.max_positions() + embedding.padding_idx + 1
    if embedding.positions == "learned":
        positions = reader.take(embedding.positions_table)
    else:
        positions = sinusoid_table(rows, width, embedding.padding_idx)
    out["model.decoder.embed_positions.weight"] = positions
    if embedding.project_in:
        out["model.decoder.project_in.weight"] = reader.take(embedding.project_in)
        out["model.decoder.project_out.weight"] = reader.take("decoder.project_out_dim.weight")
    for i in range(len(decoder.layers)):
        copy_layer(reader, f"decoder.layers.{i}", f"model.decoder.layers.{i}", out)
    if decoder.layer_norm is not None:
        copy_norm(reader, "decoder.layer_norm", "model.decoder.final_layer_norm", out)
    first = decoder.layers[0]
    pre_norm = bool(first.normalize_before)
    config = OPTConfig(
        vocab_size=table.size(0), hidden_size=width, num_hidden_layers=len(decoder.layers),
        ffn_dim=out["model.decoder.layers.0.fc1.weight"].size(0),
        max_position_embeddings=positions.size(0) - 2, do_layer_norm_before=pre_norm,
        _remove_final_layer_norm=pre_norm and decoder.layer_norm is None,
        word_embed_proj_dim=table.size(1), dropout=0.0, attention_dropout=0.0, layerdrop=0.0,
        num_attention_heads=first.self_attn.num_heads, activation_function=activation_name(args),
        enable_bias=True, tie_word_embeddings=tied and not scaled,
        bos_token_id=src.dictionary.eos(), eos_token_id=src.dictionary.eos(),
        pad_token_id=src.dictionary.pad())
    return config, out
