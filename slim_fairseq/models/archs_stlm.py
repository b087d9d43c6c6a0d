"""STLM presets (Super Tiny Language Models, arXiv:2405.14159; docs/TECHNIQUES.md#stlm-weight-tying)
on ``slim_lm``, rows of :class:`~slim_fairseq.models.presets.Preset`.

The STLM block is a set of ``slim_lm`` options (docs/TECHNIQUES.md#stlm-block)::

    h = x + Attn(RMSNorm(x))       # 16 query / 4 key-value heads, RoPE (theta 10000) on q, k
    y = h + SwiGLU(RMSNorm(h))     # w2(silu(w1 h) * w3 h), hidden F

no biases anywhere, no embedding scale and no absolute positions, a final RMSNorm, the output
projection tied to the token table (``stlm_untied``, or ``--no-share-decoder-input-output-embed``,
unties it), GPT-2 init with std 0.02. Default head width: ``2 * ((H // heads) // 2)`` (even, for
RoPE). The FFN width and the heads follow a width given with ``--decoder-embed-dim`` in the
preset's proportions (F / H, 16 heads of 4 key/value heads at H).

Presets: ``stlm_tied`` (the report's baseline) and one per row of the table in
docs/TECHNIQUES.md#stlm-presets-and-parameter-counts.
"""
from slim_fairseq.models.presets import Preset, Scaled, ScaledHeads, ScaledKVHeads, Width

# the STLM block's options: 16 query and 4 key/value heads at the preset's width, as many per
# channel at another width
STLM_BLOCK = dict(
    decoder_attention_heads=ScaledHeads(16), kv_heads=ScaledKVHeads(4, heads=16), head_dim=0,
    rope_theta=10000.0, norm="rmsnorm", rms_norm_eps=1e-6, decoder_normalize_before=True,
    ffn_glu=True, glu_hidden="full", activation_fn="silu", linear_bias=False,
    no_scale_embedding=True, no_token_positional_embeddings=True, dropout=0.0,
    attention_dropout=0.0, init_std=0.02)


def stlm(name, doc, layers, width, ffn, ffn_k=None, rank=0, proj_k=None, untied=False):
    """An STLM table row: D, H, F, FFN tie k, LoRA rank, attention-projection tie k, in/out
    untied; at another width F and the heads follow it."""
    return Preset.row(
        "slim_lm", name, doc, own_width=width, sides=("decoder",), decoder_layers=layers,
        decoder_embed_dim=Width(), decoder_ffn_embed_dim=Scaled(ffn),
        tie_ffn="none" if ffn_k is None else str(ffn_k), ffn_lora_rank=rank,
        tie_attn_proj="none" if proj_k is None else str(proj_k),
        share_decoder_input_output_embed=not untied, **STLM_BLOCK).register()


STLM_TIED = stlm("stlm_tied", "Report baseline: D 8, H 528, F 1361, 16 q heads / 4 kv heads, "
                 "tied in/out, no sharing.", layers=8, width=528, ffn=1361)
# one row per line of the table in docs/TECHNIQUES.md#stlm-presets-and-parameter-counts
STLM_UNTIED = stlm("stlm_untied", "D 8, H 528, F 1361; untied in/out embeddings.", layers=8,
                   width=528, ffn=1361, untied=True)
STLM_FFN_ALL_WIDE = stlm("stlm_ffn_all_wide", "D 8, H 672, F 1733; FFN tied over all layers but "
                         "the first.", layers=8, width=672, ffn=1733, ffn_k=0)
STLM_FFN_K1_WIDE = stlm("stlm_ffn_k1_wide", "D 8, H 608, F 1568; FFN tied from k=1.", layers=8,
                        width=608, ffn=1568, ffn_k=1)
STLM_FFN_K2_WIDE = stlm("stlm_ffn_k2_wide", "D 8, H 560, F 1444; FFN tied from k=2.", layers=8,
                        width=560, ffn=1444, ffn_k=2)
STLM_FFN_ALL_LONG = stlm("stlm_ffn_all_long", "D 14, H 608, F 1568; FFN tied over all layers but "
                         "the first.", layers=14, width=608, ffn=1568, ffn_k=0)
STLM_FFN_LORA_ALL_DEEP = stlm("stlm_ffn_lora_all_deep", "D 12, H 592, F 1527; FFN tied over all "
                              "layers but the first; LoRA rank 64.", layers=12, width=592,
                              ffn=1527, ffn_k=0, rank=64)
STLM_FFN_LORA_ALL_WIDE = stlm("stlm_ffn_lora_all_wide", "D 8, H 640, F 1650; FFN tied over all "
                              "layers but the first; LoRA rank 64.", layers=8, width=640,
                              ffn=1650, ffn_k=0, rank=64)
STLM_FFN_LORA_K1_WIDE = stlm("stlm_ffn_lora_k1_wide", "D 8, H 592, F 1527; FFN tied from k=1; "
                             "LoRA rank 64.", layers=8, width=592, ffn=1527, ffn_k=1, rank=64)
STLM_FFN_LORA_K2_DEEP = stlm("stlm_ffn_lora_k2_deep", "D 12, H 512, F 1440; FFN tied from k=2; "
                             "LoRA rank 64.", layers=12, width=512, ffn=1440, ffn_k=2, rank=64)
STLM_ATTN_PROJ_LONG = stlm("stlm_attn_proj_long", "D 10, H 512, F 1320; attention projection "
                           "tied over all layers but the first.", layers=10, width=512, ffn=1320,
                           proj_k=0)
