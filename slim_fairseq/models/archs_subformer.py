"""Subformer / sandwich presets (arXiv:2101.00234 App. B) on ``slim_transformer`` and ``slim_lm``,
rows of :class:`~slim_fairseq.models.presets.Preset`; counts in
docs/TECHNIQUES.md#subformer-presets-and-parameter-counts.

Encoder-decoder presets: post-LN, ``--share-all-embeddings`` (joined dictionary), f_m = 4 d_m,
heads = width // 64. The paper trained with BERT-style init: add ``--bert-init``. LM presets
(Wikitext-103): adaptive input / tied adaptive softmax instead of SAFE, 12 layers, pre-norm,
sandwich sharing; the decoder has no encoder attention, so every parameter is used.

Every width a preset derives (f_m, heads, the middle d_s and f_s, SAFE's d_e, the LM's input and
output widths) follows a model width given on the command line in the preset's proportions:
``--arch subformer_base --encoder-embed-dim 128`` is a 128-wide Subformer with a 256-wide middle
(FFN 768) and d_e 80, not a 128-wide model with the 1024-wide middle of the paper's.
"""
from slim_fairseq.models.presets import Heads, Preset, Scaled, Width


def subformer(name, doc, model_dim, middle_dim, middle_ffn, layers, safe_dim=0):
    """An encoder-decoder Subformer row at the paper's d_m: middle d_s and f_s, L layers per
    side, SAFE's d_e (0 = no SAFE); at another width everything scales with it."""
    return Preset.row(
        "slim_transformer", name, doc, own_width=model_dim,
        encoder_embed_dim=Width(), decoder_embed_dim=Width(),
        encoder_ffn_embed_dim=Scaled(4 * model_dim), decoder_ffn_embed_dim=Scaled(4 * model_dim),
        encoder_attention_heads=Heads(), decoder_attention_heads=Heads(),
        encoder_layers=layers, decoder_layers=layers,
        encoder_normalize_before=False, decoder_normalize_before=False,
        share_all_embeddings=True, sandwich=True, sandwich_dim=Scaled(middle_dim),
        sandwich_ffn_dim=Scaled(middle_ffn), safe_embed_dim=Scaled(safe_dim) if safe_dim else 0
    ).register()


SANDWICH_BASE = subformer("sandwich_base", "Sandwich sharing at d_s = d_m = 512 (paper 38M).",
                          model_dim=512, middle_dim=512, middle_ffn=2048, layers=6)
SANDWICH_BIG = subformer("sandwich_big", "Sandwich sharing at d_s = d_m = 1024 (paper 122M).",
                         model_dim=1024, middle_dim=1024, middle_ffn=4096, layers=6)
SUBFORMER_SMALL = subformer("subformer_small", "SAFE d_e 256, d_m 512, middle 768 / 2048, 8 "
                            "layers per side (paper 38M).", model_dim=512, middle_dim=768,
                            middle_ffn=2048, layers=8, safe_dim=256)
SUBFORMER_BASE = subformer("subformer_base", "SAFE d_e 320, d_m 512, middle 1024 / 3072, 6 "
                           "layers (paper 52M).", model_dim=512, middle_dim=1024,
                           middle_ffn=3072, layers=6, safe_dim=320)
SUBFORMER_MID = subformer("subformer_mid", "SAFE d_e 350, d_m 768, middle 768 / 3072, 6 layers "
                          "(paper 63M).", model_dim=768, middle_dim=768, middle_ffn=3072,
                          layers=6, safe_dim=350)
SUBFORMER_LARGE = subformer("subformer_large", "SAFE d_e 512, d_m 1024, middle 2048 / 8192, 6 "
                            "layers (paper 197M).", model_dim=1024, middle_dim=2048,
                            middle_ffn=8192, layers=6, safe_dim=512)
SUBFORMER_ENRO_SMALL = subformer("subformer_enro_small", "WMT16 en-ro: SAFE d_e 192, d_m 320, "
                                 "middle 512 / 2048, 6 layers (paper 20M).", model_dim=320,
                                 middle_dim=512, middle_ffn=2048, layers=6, safe_dim=192)
SUBFORMER_ENRO_BASE = subformer("subformer_enro_base", "WMT16 en-ro: SAFE d_e 384, d_m 512, "
                                "middle 640 / 2560, 6 layers (paper 48M; the paper does not give "
                                "f_s, 4 d_s is assumed).", model_dim=512, middle_dim=640,
                                middle_ffn=2560, layers=6, safe_dim=384)


def subformer_lm(name, doc, model_dim, model_ffn, middle_dim, middle_ffn, layers=12):
    """A Wikitext-103 Subformer LM row: adaptive input + tied adaptive softmax, sandwich
    sharing."""
    return Preset.row(
        "slim_lm", name, doc, own_width=model_dim, sides=("decoder",),
        decoder_embed_dim=Width(), decoder_input_dim=Width(), decoder_output_dim=Width(),
        decoder_ffn_embed_dim=Scaled(model_ffn), decoder_attention_heads=Heads(),
        decoder_layers=layers, decoder_normalize_before=True,
        sandwich=True, sandwich_dim=Scaled(middle_dim), sandwich_ffn_dim=Scaled(middle_ffn),
        adaptive_input=True, adaptive_input_factor=4, adaptive_input_cutoff="20000,60000",
        adaptive_softmax_cutoff="20000,60000", adaptive_softmax_factor=4,
        adaptive_softmax_dropout=0.2, tie_adaptive_weights=True, tie_adaptive_proj=True,
        dropout=0.3, attention_dropout=0.1, activation_dropout=0.1).register()


SUBFORMER_LM_83M = subformer_lm("subformer_lm_wiki103_83m", "(d_m, f_m, d_s, f_s) = (768, 3072, "
                                "1536, 6144), 12 layers (paper 83M).", model_dim=768,
                                model_ffn=3072, middle_dim=1536, middle_ffn=6144)
SUBFORMER_LM_96M = subformer_lm("subformer_lm_wiki103_96m", "(d_m, f_m, d_s, f_s) = (768, 4096, "
                                "2048, 6144), 12 layers (paper 96M).", model_dim=768,
                                model_ffn=4096, middle_dim=2048, middle_ffn=6144)
SUBFORMER_LM_122M = subformer_lm("subformer_lm_wiki103_122m", "(d_m, f_m, d_s, f_s) = (1024, "
                                 "4096, 2048, 6144), 12 layers (paper 122M).", model_dim=1024,
                                 model_ffn=4096, middle_dim=2048, middle_ffn=6144)
