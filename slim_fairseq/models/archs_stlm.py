"""STLM presets (Super Tiny Language Models, arXiv:2405.14159; docs/TECHNIQUES.md#stlm-weight-tying)
on ``slim_lm``.

The STLM block is a set of ``slim_lm`` options (docs/TECHNIQUES.md#stlm-block)::

    h = x + Attn(RMSNorm(x))       # 16 query / 4 key-value heads, RoPE (theta 10000) on q, k
    y = h + SwiGLU(RMSNorm(h))     # w2(silu(w1 h) * w3 h), hidden F

no biases anywhere, no embedding scale and no absolute positions, a final RMSNorm, the output
projection tied to the token table (``stlm_untied``, or ``--no-share-decoder-input-output-embed``,
unties it), GPT-2 init with std 0.02. Default head width: ``2 * ((H // heads) // 2)`` (even, for
RoPE). Each preset only fills what the command line left unset; the FFN width and the heads
follow a width given with ``--decoder-embed-dim`` in the preset's proportions (F / H, 16 heads
of 4 key/value heads at H).

Presets: ``stlm_tied`` (the report's baseline) and one per row of the table in
docs/TECHNIQUES.md#stlm-presets-and-parameter-counts (:data:`STLM_PRESETS`).
"""
from fairseq.models import register_model_architecture

from slim_fairseq.models.presets import fill, scaled, scaled_heads, scaled_kv_heads, width_of
from slim_fairseq.models.slim_lm import slim_lm_base


def stlm_block(args, own_width):
    """The STLM block's options (module docstring) for a preset of width ``own_width``: 16 query
    and 4 key/value heads there, as many per channel at another width."""
    fill(args, decoder_attention_heads=scaled_heads(16, args.decoder_embed_dim, own_width))
    fill(args, kv_heads=scaled_kv_heads(4, args.decoder_attention_heads, 16), head_dim=0,
         rope_theta=10000.0, norm="rmsnorm", rms_norm_eps=1e-6, decoder_normalize_before=True,
         ffn_glu=True, glu_hidden="full", activation_fn="silu", linear_bias=False,
         no_scale_embedding=True, no_token_positional_embeddings=True, dropout=0.0,
         attention_dropout=0.0, init_std=0.02)


def stlm_preset(args, layers, width, ffn, ffn_k=None, rank=0, proj_k=None, untied=False):
    """An STLM table row: D, H, F, FFN tie k, LoRA rank, attention-projection tie k, in/out
    untied; at another width F and the heads follow it."""
    model_width = width_of(args, width, sides=("decoder",))
    fill(args, decoder_layers=layers, decoder_embed_dim=model_width,
         decoder_ffn_embed_dim=scaled(ffn, model_width, width),
         tie_ffn="none" if ffn_k is None else str(ffn_k), ffn_lora_rank=rank,
         tie_attn_proj="none" if proj_k is None else str(proj_k),
         share_decoder_input_output_embed=not untied)
    stlm_block(args, width)
    slim_lm_base(args)


@register_model_architecture("slim_lm", "stlm_tied")
def stlm_base(args):
    """Report baseline: D 8, H 528, F 1361, 16 q heads / 4 kv heads, tied in/out, no sharing."""
    stlm_preset(args, 8, 528, 1361)


# name: (D, H, F, ffn tie k, LoRA rank, attention-projection tie k, untied) -- docs/TECHNIQUES.md STLM table
STLM_PRESETS = {
    "stlm_untied": (8, 528, 1361, None, 0, None, True),
    "stlm_ffn_all_wide": (8, 672, 1733, 0, 0, None, False),
    "stlm_ffn_k1_wide": (8, 608, 1568, 1, 0, None, False),
    "stlm_ffn_k2_wide": (8, 560, 1444, 2, 0, None, False),
    "stlm_ffn_all_long": (14, 608, 1568, 0, 0, None, False),
    "stlm_ffn_lora_all_deep": (12, 592, 1527, 0, 64, None, False),
    "stlm_ffn_lora_all_wide": (8, 640, 1650, 0, 64, None, False),
    "stlm_ffn_lora_k1_wide": (8, 592, 1527, 1, 64, None, False),
    "stlm_ffn_lora_k2_deep": (12, 512, 1440, 2, 64, None, False),
    "stlm_attn_proj_long": (10, 512, 1320, None, 0, 0, False),
}

ARCH_FUNCTIONS = {"stlm_tied": stlm_base}


def _make_preset(name, row):
    def preset(args):
        stlm_preset(args, *row)

    layers, width, ffn, ffn_k, rank, proj_k, untied = row
    preset.__name__ = name
    preset.__doc__ = (
        f"STLM table row: D {layers}, H {width}, F {ffn}, FFN tie k={ffn_k}, LoRA r={rank}, "
        f"attention-projection tie k={proj_k}, {'untied' if untied else 'tied'} in/out."
    )
    return register_model_architecture("slim_lm", name)(preset)


for _name, _row in STLM_PRESETS.items():
    ARCH_FUNCTIONS[_name] = _make_preset(_name, _row)
