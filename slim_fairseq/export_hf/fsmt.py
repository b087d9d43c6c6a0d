"""``FSMTForConditionalGeneration`` from a post-norm translation model (fairseq's
``transformer``, ``slim_transformer`` as fairseq's default builds it; a sandwich at the model's
own width has its middle layers copied).

FSMT is fairseq's post-norm transformer with two vocabularies: the same sinusoids (positions
from pad + 1, padding-aware), ``scale_embedding``, separate input and output tables. Its
tokenizer is Moses plus subword-nmt's BPE (:mod:`.tokenizer`). Scoring a whole target with its
cache on, FSMT builds no causal mask: the self-check calls it with ``use_cache=False``.
"""
from slim_fairseq.export_hf.layers import copy_layer
from slim_fairseq.export_hf.source import activation_name, input_embedding, sinusoid_table
from slim_fairseq.option_errors import option_error

CLASS = "FSMTForConditionalGeneration"
AUTO = "AutoModelForSeq2SeqLM"


def check_sides(src, family):
    """Refusals of what FSMT and M2M100 share: one width, sinusoidal positions and one
    embedding scale."""
    args = src.args
    if args.encoder_embed_dim != args.decoder_embed_dim:
        yield option_error("--decoder-embed-dim", args.decoder_embed_dim, f"{family} has one "
                           f"width, and the encoder's is {args.encoder_embed_dim}",
                           f"--decoder-embed-dim {args.encoder_embed_dim}")
    embeddings = [input_embedding(src.model, side) for side in ("encoder", "decoder")]
    for side, embedding in zip(("encoder", "decoder"), embeddings):
        if embedding.positions != "sinusoidal":
            flag = (f"--{side}-learned-pos" if embedding.positions == "learned"
                    else "--no-token-positional-embeddings")
            yield option_error(flag, None, f"{family} has sinusoidal positions only",
                               f"sinusoidal positions (no {flag})")
        if embedding.project_in:
            yield option_error("--decoder-input-dim", args.decoder_input_dim, f"{family} has no "
                               "input projection", "--decoder-input-dim equal to the width")
    if src.model.decoder.project_out_dim is not None:
        yield option_error("--decoder-output-dim", args.decoder_output_dim, f"{family} has no "
                           "output projection", "--decoder-output-dim equal to the width")
    if embeddings[0].scale != embeddings[1].scale:
        yield option_error("--no-scale-embedding", None, f"{family} scales both sides alike",
                           "the default scale")


def check(src):
    """A one-line refusal for each thing FSMT's class does not hold."""
    yield from check_sides(src, "FSMT")
    if src.model.encoder.layer_norm is not None or src.model.decoder.layer_norm is not None:
        yield option_error("--encoder-normalize-before", None, "FSMT is post-norm on both sides",
                           "post-norm on both sides")


def build(src, reader):
    from transformers import FSMTConfig
    model, args = src.model, src.args
    width = args.encoder_embed_dim
    out = {}
    max_positions = max(model.encoder.max_positions(), model.decoder.max_positions())
    tables = {}
    for side in ("encoder", "decoder"):
        embedding = input_embedding(model, side)
        tables[side] = reader.take(embedding.table)
        out[f"model.{side}.embed_tokens.weight"] = tables[side]
        out[f"model.{side}.embed_positions.weight"] = sinusoid_table(
            max_positions + embedding.padding_idx + 1, width, embedding.padding_idx)
        stack = getattr(model, side)
        for i in range(len(stack.layers)):
            copy_layer(reader, f"{side}.layers.{i}", f"model.{side}.layers.{i}", out,
                       cross=side == "decoder")
    out["model.decoder.output_projection.weight"] = reader.take("decoder.output_projection.weight")
    encoder_layer, decoder_layer = model.encoder.layers[0], model.decoder.layers[0]
    scale = input_embedding(model, "encoder").scale
    src_lang, tgt_lang = src.task.cfg.source_lang, src.task.cfg.target_lang
    config = FSMTConfig(
        langs=[src_lang, tgt_lang], src_vocab_size=tables["encoder"].size(0),
        tgt_vocab_size=tables["decoder"].size(0), activation_function=activation_name(args),
        d_model=width, max_position_embeddings=max_positions,
        encoder_ffn_dim=out["model.encoder.layers.0.fc1.weight"].size(0),
        encoder_layers=len(model.encoder.layers),
        encoder_attention_heads=encoder_layer.self_attn.num_heads,
        decoder_ffn_dim=out["model.decoder.layers.0.fc1.weight"].size(0),
        decoder_layers=len(model.decoder.layers),
        decoder_attention_heads=decoder_layer.self_attn.num_heads,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, scale_embedding=scale != 1.0, tie_word_embeddings=False,
        num_beams=1, pad_token_id=src.dictionary.pad(), bos_token_id=src.dictionary.bos(),
        eos_token_id=src.dictionary.eos(), forced_eos_token_id=src.dictionary.eos(),
        decoder_start_token_id=src.dictionary.eos())
    return config, out
