"""Anthe layers, presets and models (docs/TECHNIQUES.md#anthe-presets-and-parameter-counts)."""
import argparse

import pytest
import torch

from helpers import assert_incremental_equals_full, build, load_plugin

load_plugin()  # registers the plugin the way --user-dir does; then its modules import normally

from slim_fairseq_lab.params import count_params  # noqa: E402
from fairseq.models.transformer import TransformerConfig, base_architecture  # noqa: E402
from fairseq.modules.transformer_layer import (  # noqa: E402
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from slim_fairseq.models.slim_layers import SlimDecoderLayer, SlimEncoderLayer  # noqa: E402
from slim_fairseq.models.slim_options import set_slim_defaults, validate_slim_args  # noqa: E402
from slim_fairseq.modules.attention import SlimMultiheadAttention  # noqa: E402
from slim_fairseq.modules.glu import GLUProjection  # noqa: E402
from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding  # noqa: E402
from slim_fairseq.modules.tensor_chain import TensorChainLinear  # noqa: E402

# arXiv:2305.10991 Table 1, reference parameter counts at V = 32000 (source and target)
TABLE_1 = {
    "anthe_ablation_transformer_shared": 60_522_496,
    "anthe_ablation_b": 93_322_496,
    "anthe_ablation_b_glu": 93_324_536,
    "anthe_ablation_b_glu_qgv_hsoftpos": 68_912_632,
    "anthe_base": 30_695_032,
    "anthe_base_nopatt": 29_699_704,
}


@pytest.mark.parametrize("arch", sorted(TABLE_1))
def test_parameter_counts_match_table_1(arch):
    info = count_params(arch, vocab=32000, joined=True, meta=True)
    assert abs(info["total"] - TABLE_1[arch]) <= 1e-3 * TABLE_1[arch], info["total"]


def test_anthe_base_breakdown():
    info = count_params("anthe_base", vocab=32000, joined=True, meta=True)
    components = info["components"]
    for side in ("encoder", "decoder"):
        embedding = sum(e["params"] for name, e in components.items()
                        if name.startswith(f"{side}.embed_tokens"))
        assert embedding == 4_178_048
    output = sum(e["params"] for name, e in components.items() if "output_projection" in name)
    assert output == 16_416_000


def _args(**options):
    args = argparse.Namespace(encoder_embed_dim=32, encoder_ffn_embed_dim=48,
                              encoder_attention_heads=4, decoder_embed_dim=32,
                              decoder_ffn_embed_dim=48, decoder_attention_heads=4, dropout=0.0,
                              **options)
    set_slim_defaults(args)
    base_architecture(args)
    return args


def _namespace(**options):
    return TransformerConfig.from_namespace(_args(**options))


def test_layers_with_options_off_are_fairseq_layers():
    cfg = _namespace()
    x, enc = torch.randn(5, 2, 32), torch.randn(6, 2, 32)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, :2] = True
    torch.manual_seed(0)
    ref = TransformerEncoderLayerBase(cfg)
    torch.manual_seed(0)
    mine = SlimEncoderLayer(cfg)
    assert torch.equal(ref(x, pad), mine(x, pad))
    torch.manual_seed(0)
    ref = TransformerDecoderLayerBase(cfg)
    torch.manual_seed(0)
    mine = SlimDecoderLayer(cfg)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in mine.named_parameters()]
    assert torch.equal(ref(x, enc, None)[0], mine(x, enc, None)[0])


def test_layer_options_build_the_anthe_blocks():
    cfg = _namespace(ffn_glu=True, tc_ff=0.3, tc_patt=0.3, self_attn_gate="qgv",
                     cross_attn_gate="vgk")
    layer = SlimDecoderLayer(cfg)
    assert isinstance(layer.fc1, GLUProjection) and layer.fc1.out_features == 32
    assert isinstance(layer.fc1.w1, TensorChainLinear) and isinstance(layer.fc2, TensorChainLinear)
    assert layer.self_attn.gate == "qgv" and layer.encoder_attn.gate == "vgk"
    assert isinstance(layer.self_attn.q_proj, TensorChainLinear)
    # one feed-forward module, whose parts are the layer's fc1 and fc2; the GLU applies the gate
    assert layer.feed_forward.fc1 is layer.fc1 and layer.feed_forward.fc2 is layer.fc2
    assert layer.activation_fn is torch.nn.functional.silu and layer.fc1.activation == "silu"
    x, enc = torch.randn(4, 2, 32), torch.randn(6, 2, 32)
    out = layer(x, enc, None)[0]
    out.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())
    # the options are checked before anything is built, in one place
    args = _args(cross_attn_gate="qgv")
    with pytest.raises(ValueError, match="^--cross-attn-gate=qgv: "):
        validate_slim_args(args, "slim_transformer")


def _tiny(arch, *extra):
    from slim_fairseq_lab.contract import tiny_overrides
    _, task, model = build(arch, tiny_overrides(arch), False,
                           extra=list(extra) + ["--dropout", "0"])
    return task, model.eval()


def test_anthe_base_preset_options_and_override():
    task, model = _tiny("anthe_base")
    layer = model.decoder.layers[0]
    assert layer.self_attn.gate == "qgv" and layer.encoder_attn.gate == "kgv"
    assert isinstance(model.decoder.embed_tokens, HSoftPOSEmbedding)
    assert isinstance(model.encoder.embed_tokens, HSoftPOSEmbedding)
    assert model.encoder.embed_tokens is not model.decoder.embed_tokens
    assert isinstance(layer.fc1, GLUProjection) and layer.fc1.activation == "silu"
    assert isinstance(layer.self_attn.k_proj, TensorChainLinear)
    assert model.decoder.output_projection.bias is not None
    _, model = _tiny("anthe_base", "--self-attn-gate", "vgk", "--activation-fn", "gelu")
    assert model.encoder.layers[0].self_attn.gate == "vgk"
    assert model.encoder.layers[0].fc1.activation == "gelu"


def test_anthe_base_has_no_future_leak():
    task, model = _tiny("anthe_base")
    d = task.target_dictionary
    torch.manual_seed(0)
    src = torch.randint(d.nspecial, len(task.source_dictionary), (2, 9))
    src[0, :3] = task.source_dictionary.pad()  # left padding
    lengths = src.ne(task.source_dictionary.pad()).sum(1)
    prev = torch.randint(d.nspecial, len(d), (2, 8))
    with torch.no_grad():
        base, _ = model(src, lengths, prev)
        for t in range(1, 8):
            changed = prev.clone()
            changed[:, t] = (prev[:, t] - d.nspecial + 1) % (len(d) - d.nspecial) + d.nspecial
            out, _ = model(src, lengths, changed)
            assert torch.allclose(out[:, :t], base[:, :t], atol=1e-5), t
            assert not torch.allclose(out[:, t:], base[:, t:], atol=1e-5)


def test_anthe_base_incremental_decoding_equals_full_forward():
    task, model = _tiny("anthe_base")
    assert_incremental_equals_full(task, model)


@pytest.mark.parametrize("length", [2, 3, 4])
def test_tensor_chain_lengths_build_and_train_in_the_model(length):
    task, model = _tiny("anthe_base", "--tc-length", str(length), "--tc-emb", "0.3")
    model.train()
    d = task.target_dictionary
    torch.manual_seed(0)
    src = torch.randint(d.nspecial, len(task.source_dictionary), (2, 6))
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    layer = model.decoder.layers[0]
    assert layer.self_attn.q_proj.length == length and len(layer.fc2.cores) == length
    logits, _ = model(src, torch.tensor([6, 6]), prev)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             prev.reshape(-1))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_lm_presets():
    base = count_params("slim_lm_gpt2_small", vocab=50257, meta=True)["total"]
    anthe = count_params("anthe_lm_gpt2_small", vocab=50257, meta=True)["total"]
    # GPT-2 small: 124,439,808 with 1024 learned positions; fairseq keeps 2 more position rows
    assert base == 124_439_808 + 2 * 768
    assert anthe < 0.5 * base
    from slim_fairseq_lab.contract import tiny_overrides
    _, _, model = build("anthe_lm_gpt2_small",
                        tiny_overrides("anthe_lm_gpt2_small"), True)
    layer = model.decoder.layers[0]
    assert isinstance(layer.self_attn, SlimMultiheadAttention) and layer.self_attn.gate == "qgv"
    assert layer.encoder_attn is None
    assert isinstance(model.decoder.embed_tokens, HSoftPOSEmbedding)
