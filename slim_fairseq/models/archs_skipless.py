"""Skipless presets (He & Hofmann, arXiv:2311.01906; Graef, arXiv:2404.12362;
docs/TECHNIQUES.md#skipless-transformers) on ``slim_lm``, rows of
:class:`~slim_fairseq.models.presets.Preset`.

A skipless block has no residual connection and no norm and trains thanks to shaped attention,
which starts as the identity (``--skipless-layout serial|parallel``; the block is
:class:`~slim_fairseq.models.slim_layers.SkiplessDecoderLayer`). The presets add RoPE and no
absolute positions, no biases, no dropout and untied embeddings (tie them with
``--share-decoder-input-output-embed``). The FFN width follows a width given with
``--decoder-embed-dim``.
"""
from slim_fairseq.models.presets import Preset, Scaled, ScaledHeads, ScaledKVHeads, Width


def skipless(name, doc, layout="serial", width=256, layers=4, heads=4, ffn_per_width=4.0,
             kv_heads=0, **values):
    """A skipless row: its layout, shape (at another width the FFN and the heads follow it)
    and ``values``."""
    kv = dict(kv_heads=ScaledKVHeads(kv_heads, heads=heads)) if kv_heads else {}
    return Preset.row(
        "slim_lm", name, doc, own_width=width, sides=("decoder",), **values,
        decoder_attention_heads=ScaledHeads(heads), **kv, decoder_embed_dim=Width(),
        decoder_layers=layers, decoder_ffn_embed_dim=Scaled(ffn_per_width * width),
        skipless_layout=layout, rope_theta=10000.0, no_token_positional_embeddings=True,
        linear_bias=False, dropout=0.0, attention_dropout=0.0).register()


SKIPLESS_LM = skipless("skipless_lm", "Small CPU-trainable preset: d 256, 4 serial blocks, 4 heads "
                       "(MHA), ReLU MLP 1024, RoPE, untied embeddings.")
SKIPLESS_LM_PARALLEL_NOQP = skipless(
    "skipless_lm_parallel_noqp", "Small parallel preset trained directly in the reduced form (no "
    "W_Q, no P; docs/TECHNIQUES.md#weight-removal).", layout="parallel", removed_weights="q",
    mlp_branch_scale=0.5)
SKIPLESS_LM_MISTRAL_7B = skipless(
    "skipless_lm_mistral_7b", "Mistral-7B shape: serial, d 4096, 32 layers, 32 heads, GQA 8 KV "
    "heads, SwiGLU 14336, untied embeddings (V 32000 comes from the dictionary), no biases, RoPE.",
    width=4096, layers=32, heads=32, ffn_per_width=14336 / 4096, kv_heads=8, ffn_glu=True,
    glu_hidden="full", activation_fn="silu")
SKIPLESS_LM_PYTHIA_6_9B = skipless(
    "skipless_lm_pythia_6_9b", "Pythia-6.9B shape: parallel, d 4096, 32 layers, 32 heads (MHA), "
    "GELU MLP 16384, untied embeddings (V 50400 from the dictionary), RoPE.", layout="parallel",
    width=4096, layers=32, heads=32, activation_fn="gelu")
