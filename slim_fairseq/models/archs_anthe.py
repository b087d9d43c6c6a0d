"""Anthe presets (arXiv:2305.10991: Table 1 ablation ladder; LM of App. C).

Counts: docs/TECHNIQUES.md#anthe-presets-and-parameter-counts.

Every preset only fills what the command line left unset (:func:`~slim_fairseq.models.presets.fill`)
and then calls the base arch function of ``slim_transformer`` / ``slim_lm``; the FFN width and
the heads follow a width given on the command line. The flag set of each row is listed in
examples/translation/ANTHE.md.
"""
from fairseq.models import register_model_architecture

from slim_fairseq.models.presets import fill, heads_for, scaled, width_of
from slim_fairseq.models.slim_lm import slim_lm_base
from slim_fairseq.models.slim_transformer import slim_transformer_base

def _transformer_base_shape(args):
    """Paper base: d 512, 6+6 layers, 8 heads, f 2048, post-LN, dropout 0.1, sinusoidal (at
    another width d: f = 4 d, d // 64 heads)."""
    width = width_of(args, 512)
    heads, ffn = heads_for(width), scaled(2048, width, 512)
    fill(args, encoder_embed_dim=width, encoder_ffn_embed_dim=ffn, encoder_layers=6,
             encoder_attention_heads=heads, decoder_embed_dim=width, decoder_ffn_embed_dim=ffn,
             decoder_layers=6, decoder_attention_heads=heads, encoder_normalize_before=False,
             decoder_normalize_before=False, dropout=0.1)


def _separate_embeddings(args):
    """"B": separate encoder embedding, decoder embedding and output projection, output bias."""
    fill(args, share_all_embeddings=False, share_decoder_input_output_embed=False,
             output_bias=True)


def _glu(args):
    """"B'": GLU feed-forward, SiLU as in the reference code (docs/TECHNIQUES.md#glu-feed-forward)."""
    fill(args, ffn_glu=True, activation_fn="silu")


def _gates_and_hsoftpos(args):
    """qgv in self-attention, kgv in cross-attention, H-SoftPOS with 2 levels."""
    fill(args, self_attn_gate="qgv", cross_attn_gate="kgv", hsoftpos_levels=2)


def _tensor_chain(args):
    """TC_{ff:.005, patt:.07}, chain length 2."""
    fill(args, tc_ff=0.005, tc_patt=0.07, tc_length=2)


@register_model_architecture("slim_transformer", "anthe_ablation_transformer_shared")
def anthe_ablation_transformer_shared(args):
    """Table 1 row "Transformer + shared embeddings" (60,522,496 params at V=32000)."""
    _transformer_base_shape(args)
    fill(args, share_all_embeddings=True, output_bias=False)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "anthe_ablation_b")
def anthe_ablation_b(args):
    """Table 1 row "B": no embedding sharing, output bias (93,322,496 params)."""
    _transformer_base_shape(args)
    _separate_embeddings(args)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "anthe_ablation_b_glu")
def anthe_ablation_b_glu(args):
    """Table 1 row "B'" = B + GLU (93,324,536 params)."""
    _transformer_base_shape(args)
    _separate_embeddings(args)
    _glu(args)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "anthe_ablation_b_glu_qgv_hsoftpos")
def anthe_ablation_b_glu_qgv_hsoftpos(args):
    """Table 1 row "B' + qgv + H-SoftPOS" (68,912,632 params)."""
    _transformer_base_shape(args)
    _separate_embeddings(args)
    _glu(args)
    _gates_and_hsoftpos(args)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "anthe_base")
def anthe_base(args):
    """Anthe = B' + qgv (cross: kgv) + H-SoftPOS(l=2) + TC_{ff:.005, patt:.07}, n = 2
    (30,695,032 params)."""
    _transformer_base_shape(args)
    _separate_embeddings(args)
    _glu(args)
    _gates_and_hsoftpos(args)
    _tensor_chain(args)
    slim_transformer_base(args)


@register_model_architecture("slim_transformer", "anthe_base_nopatt")
def anthe_base_nopatt(args):
    """Anthe with identity pre-attention projections (paper Table 5; 29,699,704 params); with
    no W_Q, W_K, W_V there is no TC on them (tc_patt 0)."""
    fill(args, no_patt=True, tc_patt=0.0)
    anthe_base(args)


def _gpt2_small_shape(args):
    """GPT-2 small: 12 layers, d 768, 12 heads, f 3072, GELU, 1024 positions (pre-LN, as
    fairseq's LMs always are; at another width d: f = 4 d, d // 64 heads)."""
    width = width_of(args, 768, sides=("decoder",))
    fill(args, decoder_embed_dim=width, decoder_ffn_embed_dim=scaled(3072, width, 768),
             decoder_layers=12, decoder_attention_heads=heads_for(width), dropout=0.1,
             attention_dropout=0.1, activation_fn="gelu", max_target_positions=1024)


@register_model_architecture("slim_lm", "slim_lm_gpt2_small")
def slim_lm_gpt2_small(args):
    """GPT-2-small-shaped baseline LM: learned positions, tied input/output embeddings."""
    _gpt2_small_shape(args)
    fill(args, decoder_learned_pos=True, share_decoder_input_output_embed=True)
    slim_lm_base(args)


@register_model_architecture("slim_lm", "anthe_lm_gpt2_small")
def anthe_lm_gpt2_small(args):
    """Anthe recipe on the GPT-2-small shape: GLU (SiLU), qgv, H-SoftPOS(l=2, sinusoidal),
    TC_{ff:.005, patt:.07}, separate output projection with bias."""
    fill(args, decoder_learned_pos=False, share_decoder_input_output_embed=False,
             output_bias=True, ffn_glu=True, activation_fn="silu", self_attn_gate="qgv",
             hsoftpos_levels=2)
    _gpt2_small_shape(args)
    _tensor_chain(args)
    slim_lm_base(args)
