"""Subformer / sandwich presets (arXiv:2101.00234 App. B) on ``slim_transformer`` and ``slim_lm``;
counts in docs/TECHNIQUES.md#subformer-presets-and-parameter-counts.

Each preset only fills what the command line left unset (:func:`~slim_fairseq.models.presets.fill`)
and then calls the base arch. Encoder-decoder presets: post-LN, ``--share-all-embeddings`` (joined
dictionary), f_m = 4 d_m, heads = width // 64. The paper trained with BERT-style init: add ``--bert-init``.
LM presets (Wikitext-103): adaptive input / tied adaptive softmax instead of SAFE, 12 layers,
pre-norm, sandwich sharing; the decoder has no encoder attention, so every parameter is used.

Every width a preset derives (f_m, heads, the middle d_s and f_s, SAFE's d_e, the LM's input and
output widths) follows a model width given on the command line in the preset's proportions:
``--arch subformer_base --encoder-embed-dim 128`` is a 128-wide Subformer with a 256-wide middle
(FFN 768) and d_e 80, not a 128-wide model with the 1024-wide middle of the paper's.
"""
from fairseq.models import register_model_architecture

from slim_fairseq.models.presets import fill, heads_for, scaled, width_of
from slim_fairseq.models.slim_lm import slim_lm_base
from slim_fairseq.models.slim_transformer import slim_transformer_base


def _subformer(args, model_dim, middle_dim, middle_ffn, safe_dim, layers):
    """Encoder-decoder Subformer preset at the paper's d_m: d_s, f_s, d_e (0 = no SAFE), L per
    side; at another width everything scales with it."""
    width = width_of(args, model_dim)
    ffn, heads = scaled(4 * model_dim, width, model_dim), heads_for(width)
    fill(args,
         encoder_embed_dim=width, decoder_embed_dim=width,
         encoder_ffn_embed_dim=ffn, decoder_ffn_embed_dim=ffn,
         encoder_attention_heads=heads, decoder_attention_heads=heads,
         encoder_layers=layers, decoder_layers=layers,
         encoder_normalize_before=False, decoder_normalize_before=False,
         share_all_embeddings=True,
         sandwich=True, sandwich_dim=scaled(middle_dim, width, model_dim),
         sandwich_ffn_dim=scaled(middle_ffn, width, model_dim),
         safe_embed_dim=scaled(safe_dim, width, model_dim) if safe_dim else 0)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "sandwich_base")
def sandwich_base(args):
    """Sandwich sharing at d_s = d_m = 512 (paper 38M)."""
    _subformer(args, 512, 512, 2048, 0, 6)


@register_model_architecture("slim_transformer", "sandwich_big")
def sandwich_big(args):
    """Sandwich sharing at d_s = d_m = 1024 (paper 122M)."""
    _subformer(args, 1024, 1024, 4096, 0, 6)


@register_model_architecture("slim_transformer", "subformer_small")
def subformer_small(args):
    """SAFE d_e 256, d_m 512, middle 768 / 2048, 8 layers per side (paper 38M)."""
    _subformer(args, 512, 768, 2048, 256, 8)


@register_model_architecture("slim_transformer", "subformer_base")
def subformer_base(args):
    """SAFE d_e 320, d_m 512, middle 1024 / 3072, 6 layers (paper 52M)."""
    _subformer(args, 512, 1024, 3072, 320, 6)


@register_model_architecture("slim_transformer", "subformer_mid")
def subformer_mid(args):
    """SAFE d_e 350, d_m 768, middle 768 / 3072, 6 layers (paper 63M)."""
    _subformer(args, 768, 768, 3072, 350, 6)


@register_model_architecture("slim_transformer", "subformer_large")
def subformer_large(args):
    """SAFE d_e 512, d_m 1024, middle 2048 / 8192, 6 layers (paper 197M)."""
    _subformer(args, 1024, 2048, 8192, 512, 6)


@register_model_architecture("slim_transformer", "subformer_enro_small")
def subformer_enro_small(args):
    """WMT16 en-ro: SAFE d_e 192, d_m 320, middle 512 / 2048, 6 layers (paper 20M)."""
    _subformer(args, 320, 512, 2048, 192, 6)


@register_model_architecture("slim_transformer", "subformer_enro_base")
def subformer_enro_base(args):
    """WMT16 en-ro: SAFE d_e 384, d_m 512, middle 640 / 2560, 6 layers (paper 48M; the paper
    does not give f_s, 4 d_s is assumed)."""
    _subformer(args, 512, 640, 2560, 384, 6)


def _subformer_lm(args, model_dim, model_ffn, middle_dim, middle_ffn, layers=12):
    """Wikitext-103 Subformer LM: adaptive input + tied adaptive softmax, sandwich sharing."""
    width = width_of(args, model_dim, sides=("decoder",))
    fill(args,
         decoder_embed_dim=width, decoder_input_dim=width, decoder_output_dim=width,
         decoder_ffn_embed_dim=scaled(model_ffn, width, model_dim),
         decoder_attention_heads=heads_for(width),
         decoder_layers=layers, decoder_normalize_before=True,
         sandwich=True, sandwich_dim=scaled(middle_dim, width, model_dim),
         sandwich_ffn_dim=scaled(middle_ffn, width, model_dim),
         adaptive_input=True, adaptive_input_factor=4, adaptive_input_cutoff="20000,60000",
         adaptive_softmax_cutoff="20000,60000", adaptive_softmax_factor=4,
         adaptive_softmax_dropout=0.2, tie_adaptive_weights=True, tie_adaptive_proj=True,
         dropout=0.3, attention_dropout=0.1, activation_dropout=0.1)
    slim_lm_base(args)


@register_model_architecture("slim_lm", "subformer_lm_wiki103_83m")
def subformer_lm_wiki103_83m(args):
    """(d_m, f_m, d_s, f_s) = (768, 3072, 1536, 6144), 12 layers (paper 83M)."""
    _subformer_lm(args, 768, 3072, 1536, 6144)


@register_model_architecture("slim_lm", "subformer_lm_wiki103_96m")
def subformer_lm_wiki103_96m(args):
    """(d_m, f_m, d_s, f_s) = (768, 4096, 2048, 6144), 12 layers (paper 96M)."""
    _subformer_lm(args, 768, 4096, 2048, 6144)


@register_model_architecture("slim_lm", "subformer_lm_wiki103_122m")
def subformer_lm_wiki103_122m(args):
    """(d_m, f_m, d_s, f_s) = (1024, 4096, 2048, 6144), 12 layers (paper 122M)."""
    _subformer_lm(args, 1024, 4096, 2048, 6144)
