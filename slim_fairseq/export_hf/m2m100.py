"""``M2M100ForConditionalGeneration`` from a pre-norm translation model with one shared
vocabulary (``--share-all-embeddings``): fairseq's pre-norm transformer with a final LayerNorm
on each side, sinusoidal positions from pad + 1 and one table for encoder, decoder and output.
"""
from slim_fairseq.export_hf.fsmt import check_sides
from slim_fairseq.export_hf.layers import copy_layer, copy_norm, same_parameter
from slim_fairseq.export_hf.source import activation_name, input_embedding
from slim_fairseq.option_errors import option_error

CLASS = "M2M100ForConditionalGeneration"
AUTO = "AutoModelForSeq2SeqLM"


def check(src):
    """A one-line refusal for each thing M2M100's class does not hold."""
    model = src.model
    encoder, decoder = input_embedding(model, "encoder"), input_embedding(model, "decoder")
    if not (same_parameter(model, encoder.table, decoder.table)
            and same_parameter(model, decoder.table, "decoder.output_projection.weight")):
        yield option_error("--share-all-embeddings", None, "missing: M2M100, the pre-norm "
                           "class, has one table for encoder, decoder and output",
                           "--share-all-embeddings (a joined dictionary), or post-norm "
                           "(FSMT)")
    yield from check_sides(src, "M2M100")
    if model.decoder.layer_norm is None:
        yield option_error("--no-decoder-final-norm", None, "M2M100 normalises each side's "
                           "output", "the final norm (no --no-decoder-final-norm)")


def build(src, reader):
    from transformers import M2M100Config
    model, args = src.model, src.args
    width = args.encoder_embed_dim
    encoder, decoder = input_embedding(model, "encoder"), input_embedding(model, "decoder")
    table = reader.take(encoder.table)
    reader.take(decoder.table)
    reader.take("decoder.output_projection.weight")
    out = {"model.shared.weight": table, "model.encoder.embed_tokens.weight": table,
           "model.decoder.embed_tokens.weight": table, "lm_head.weight": table}
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        for i in range(len(stack.layers)):
            copy_layer(reader, f"{side}.layers.{i}", f"model.{side}.layers.{i}", out,
                       cross=side == "decoder")
        copy_norm(reader, f"{side}.layer_norm", f"model.{side}.layer_norm", out)
    encoder_layer, decoder_layer = model.encoder.layers[0], model.decoder.layers[0]
    config = M2M100Config(
        vocab_size=table.size(0), d_model=width,
        max_position_embeddings=max(model.encoder.max_positions(), model.decoder.max_positions()),
        encoder_layers=len(model.encoder.layers),
        encoder_ffn_dim=out["model.encoder.layers.0.fc1.weight"].size(0),
        encoder_attention_heads=encoder_layer.self_attn.num_heads,
        decoder_layers=len(model.decoder.layers),
        decoder_ffn_dim=out["model.decoder.layers.0.fc1.weight"].size(0),
        decoder_attention_heads=decoder_layer.self_attn.num_heads,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0, activation_function=activation_name(args),
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        scale_embedding=encoder.scale != 1.0, tie_word_embeddings=True,
        pad_token_id=src.dictionary.pad(), bos_token_id=src.dictionary.bos(),
        eos_token_id=src.dictionary.eos(), decoder_start_token_id=src.dictionary.eos())
    return config, out
