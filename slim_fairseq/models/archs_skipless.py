"""Skipless presets (He & Hofmann, arXiv:2311.01906; Graef, arXiv:2404.12362;
docs/TECHNIQUES.md#skipless-transformers) on ``slim_lm``.

A skipless block has no residual connection and no norm and trains thanks to shaped attention,
which starts as the identity (``--skipless-layout serial|parallel``; the block is
:class:`~slim_fairseq.models.slim_layers.SkiplessDecoderLayer`). The presets add RoPE and no
absolute positions, no biases, no dropout and untied embeddings (tie them with
``--share-decoder-input-output-embed``). Each preset only fills what the command line left
unset; the FFN width follows a width given with ``--decoder-embed-dim``.
"""
from fairseq.models import register_model_architecture

from slim_fairseq.models.presets import fill, scaled, scaled_heads, scaled_kv_heads, width_of
from slim_fairseq.models.slim_lm import slim_lm_base


def skipless_base(args, layout="serial", width=256, layers=4, heads=4, ffn_per_width=4.0,
                  kv_heads=0):
    """Defaults of every skipless preset (only fills what is not set); at another width the
    FFN and the heads follow it."""
    model_width = width_of(args, width, sides=("decoder",))
    fill(args, decoder_attention_heads=scaled_heads(heads, model_width, width))
    if kv_heads:
        fill(args, kv_heads=scaled_kv_heads(kv_heads, args.decoder_attention_heads, heads))
    fill(args, decoder_embed_dim=model_width, decoder_layers=layers,
         decoder_ffn_embed_dim=scaled(ffn_per_width * width, model_width, width),
         skipless_layout=layout, rope_theta=10000.0, no_token_positional_embeddings=True,
         linear_bias=False, dropout=0.0, attention_dropout=0.0)
    slim_lm_base(args)


@register_model_architecture("slim_lm", "skipless_lm")
def skipless_lm(args):
    """Small CPU-trainable preset: d 256, 4 serial blocks, 4 heads (MHA), ReLU MLP 1024, RoPE,
    untied embeddings."""
    skipless_base(args)


@register_model_architecture("slim_lm", "skipless_lm_parallel_noqp")
def skipless_lm_parallel_noqp(args):
    """Small parallel preset trained directly in the reduced form (no W_Q, no P;
    docs/TECHNIQUES.md#weight-removal)."""
    fill(args, removed_weights="q", mlp_branch_scale=0.5)
    skipless_base(args, layout="parallel")


@register_model_architecture("slim_lm", "skipless_lm_mistral_7b")
def skipless_lm_mistral_7b(args):
    """Mistral-7B shape: serial, d 4096, 32 layers, 32 heads, GQA 8 KV heads, SwiGLU 14336,
    untied embeddings (V 32000 comes from the dictionary), no biases, RoPE."""
    fill(args, ffn_glu=True, glu_hidden="full", activation_fn="silu")
    skipless_base(args, width=4096, layers=32, heads=32, ffn_per_width=14336 / 4096, kv_heads=8)


@register_model_architecture("slim_lm", "skipless_lm_pythia_6_9b")
def skipless_lm_pythia_6_9b(args):
    """Pythia-6.9B shape: parallel, d 4096, 32 layers, 32 heads (MHA), GELU MLP 16384, untied
    embeddings (V 50400 from the dictionary), RoPE."""
    fill(args, activation_fn="gelu")
    skipless_base(args, layout="parallel", width=4096, layers=32, heads=32)
