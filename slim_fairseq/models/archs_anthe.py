"""Anthe presets (arXiv:2305.10991: Table 1 ablation ladder; LM of App. C), rows of
:class:`~slim_fairseq.models.presets.Preset`.

Counts: docs/TECHNIQUES.md#anthe-presets-and-parameter-counts. The FFN width and the heads
follow a width given on the command line. The flag set of each row is listed in
examples/translation/ANTHE.md.
"""
from slim_fairseq.models.presets import Heads, Preset, Scaled, Width

# paper base: d 512, 6+6 layers, 8 heads, f 2048, post-LN, dropout 0.1, sinusoidal (at another
# width d: f = 4 d, d // 64 heads)
TRANSFORMER_BASE = dict(
    encoder_embed_dim=Width(), encoder_ffn_embed_dim=Scaled(2048), encoder_layers=6,
    encoder_attention_heads=Heads(), decoder_embed_dim=Width(), decoder_ffn_embed_dim=Scaled(2048),
    decoder_layers=6, decoder_attention_heads=Heads(), encoder_normalize_before=False,
    decoder_normalize_before=False, dropout=0.1)
# "B": separate encoder embedding, decoder embedding and output projection, output bias
SEPARATE_EMBEDDINGS = dict(share_all_embeddings=False, share_decoder_input_output_embed=False,
                           output_bias=True)
# "B'": GLU feed-forward, SiLU as in the reference code (docs/TECHNIQUES.md#glu-feed-forward)
GLU = dict(ffn_glu=True, activation_fn="silu")
# qgv in self-attention, kgv in cross-attention, H-SoftPOS with 2 levels
GATES_AND_HSOFTPOS = dict(self_attn_gate="qgv", cross_attn_gate="kgv", hsoftpos_levels=2)
# TC_{ff:.005, patt:.07}, chain length 2
TENSOR_CHAIN = dict(tc_ff=0.005, tc_patt=0.07, tc_length=2)

ABLATION_SHARED = Preset.row(
    "slim_transformer", "anthe_ablation_transformer_shared",
    "Table 1 row \"Transformer + shared embeddings\" (60,522,496 params at V=32000).",
    own_width=512, **TRANSFORMER_BASE, share_all_embeddings=True, output_bias=False).register()
ABLATION_B = Preset.row(
    "slim_transformer", "anthe_ablation_b",
    "Table 1 row \"B\": no embedding sharing, output bias (93,322,496 params).",
    own_width=512, **TRANSFORMER_BASE, **SEPARATE_EMBEDDINGS).register()
ABLATION_B_GLU = ABLATION_B.but(
    "anthe_ablation_b_glu", "Table 1 row \"B'\" = B + GLU (93,324,536 params).", **GLU).register()
ABLATION_B_GLU_QGV_HSOFTPOS = ABLATION_B_GLU.but(
    "anthe_ablation_b_glu_qgv_hsoftpos", "Table 1 row \"B' + qgv + H-SoftPOS\" (68,912,632 "
    "params).", **GATES_AND_HSOFTPOS).register()
ANTHE_BASE = ABLATION_B_GLU_QGV_HSOFTPOS.but(
    "anthe_base", "Anthe = B' + qgv (cross: kgv) + H-SoftPOS(l=2) + TC_{ff:.005, patt:.07}, "
    "n = 2 (30,695,032 params).", **TENSOR_CHAIN).register()
ANTHE_BASE_NOPATT = ANTHE_BASE.but(
    "anthe_base_nopatt", "Anthe with identity pre-attention projections (paper Table 5; "
    "29,699,704 params); with no W_Q, W_K, W_V there is no TC on them (tc_patt 0).",
    no_patt=True, tc_patt=0.0).register()

# GPT-2 small: 12 layers, d 768, 12 heads, f 3072, GELU, 1024 positions (pre-LN, as fairseq's
# LMs always are; at another width d: f = 4 d, d // 64 heads)
GPT2_SMALL = dict(decoder_embed_dim=Width(), decoder_ffn_embed_dim=Scaled(3072), decoder_layers=12,
                  decoder_attention_heads=Heads(), dropout=0.1, attention_dropout=0.1,
                  activation_fn="gelu", max_target_positions=1024)

SLIM_LM_GPT2_SMALL = Preset.row(
    "slim_lm", "slim_lm_gpt2_small", "GPT-2-small-shaped baseline LM: learned positions, tied "
    "input/output embeddings.", own_width=768, sides=("decoder",), **GPT2_SMALL,
    decoder_learned_pos=True, share_decoder_input_output_embed=True).register()
ANTHE_LM_GPT2_SMALL = Preset.row(
    "slim_lm", "anthe_lm_gpt2_small", "Anthe recipe on the GPT-2-small shape: GLU (SiLU), qgv, "
    "H-SoftPOS(l=2, sinusoidal), TC_{ff:.005, patt:.07}, separate output projection with bias.",
    own_width=768, sides=("decoder",), **{**GPT2_SMALL, **dict(
        decoder_learned_pos=False, share_decoder_input_output_embed=False, output_bias=True,
        ffn_glu=True, activation_fn="silu", self_attn_gate="qgv", hsoftpos_levels=2),
        **TENSOR_CHAIN}).register()
