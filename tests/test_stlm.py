"""STLM weight tying (docs/TECHNIQUES.md#stlm-weight-tying): parameter counts of the presets, shared
Parameters, per-layer LoRA, option errors, RMSNorm/RoPE/GQA behaviour, tying on slim_lm layers."""
import argparse

import pytest
import torch
from torch import nn

from helpers import build, load_plugin

load_plugin()

from fairseq.data import Dictionary  # noqa: E402
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY  # noqa: E402

from slim_fairseq.modules.attention import SlimMultiheadAttention  # noqa: E402
from slim_fairseq.modules.lora import LoRALinear  # noqa: E402
from slim_fairseq.modules.rmsnorm import RMSNorm  # noqa: E402
from slim_fairseq.modules.rope import RotaryEmbedding  # noqa: E402
from slim_fairseq.modules.weight_tying import apply_weight_tying, tied_layer_range  # noqa: E402
from slim_fairseq.specs import AttentionSpec, TyingSpec  # noqa: E402

# "report" column of docs/TECHNIQUES.md#stlm-presets-and-parameter-counts (millions of parameters, GPT-2 vocabulary)
REPORT_MILLIONS = {
    "stlm_tied": 49, "stlm_untied": 76, "stlm_ffn_all_wide": 50, "stlm_ffn_k1_wide": 49,
    "stlm_ffn_k2_wide": 49, "stlm_ffn_all_long": 49, "stlm_ffn_lora_all_deep": 50,
    "stlm_ffn_lora_all_wide": 50, "stlm_ffn_lora_k1_wide": 50, "stlm_ffn_lora_k2_deep": 50,
    "stlm_attn_proj_long": 50,
}


class _Task:
    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def _dictionary(size):
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"tok{i}")
    assert len(d) == size
    return d


@pytest.fixture(scope="module")
def gpt2_task():
    return _Task(_dictionary(50257))


@pytest.fixture(scope="module")
def small_task():
    return _Task(_dictionary(60))


def _build(arch, task, device=None, **options):
    args = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY[arch](args)
    if device is None:
        return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    with torch.device(device):
        return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


def _count(model):
    return sum(p.numel() for p in model.parameters())  # shared Parameters count once


FFN_LINEARS = {"w1": "fc1.w1", "w3": "fc1.w3", "w2": "fc2"}  # the SwiGLU's w1, w3 (fc1) and w2


def _ffn(layer, name):
    """Linear ``name`` (w1, w2, w3) of an STLM block's SwiGLU."""
    return layer.get_submodule(FFN_LINEARS[name])


TINY = dict(decoder_embed_dim=32, decoder_ffn_embed_dim=40, decoder_attention_heads=4,
            kv_heads=2, decoder_layers=7)


# ------------------------------------------------------------------------- presets


def test_every_table_row_has_a_preset():
    registered = {a for a, cls in ARCH_MODEL_REGISTRY.items() if a.startswith("stlm_")}
    assert registered == set(REPORT_MILLIONS)


@pytest.mark.parametrize("arch", sorted(REPORT_MILLIONS))
def test_preset_param_count_within_2_percent_of_report(arch, gpt2_task):
    model = _build(arch, gpt2_task, device="meta")
    n = _count(model)
    report = REPORT_MILLIONS[arch] * 1e6
    assert abs(n - report) / report <= 0.02, f"{arch}: {n:,} params vs report {report:,.0f}"


def test_baseline_count_matches_formula(gpt2_task):
    """D 8, H 528, F 1361, 16 q / 4 kv heads of width 32, tied: every weight accounted for."""
    model = _build("stlm_tied", gpt2_task, device="meta")
    h, f, v, heads, kv = 528, 1361, 50257, 16, 4
    hd = 2 * ((h // heads) // 2)
    attn = h * heads * hd * 2 + 2 * h * kv * hd
    layer = attn + 3 * h * f + 2 * h
    assert hd == 32
    assert _count(model) == v * h + 8 * layer + h


def test_tying_saves_exactly_the_shared_ffns(gpt2_task):
    """FFN tying all at the baseline shape removes 6 of 7 interior FFNs; LoRA adds r(in+out)
    per shared linear per layer; attention-projection tying removes 6 out-projections."""
    h, f, r = 528, 1361, 8
    base = _count(_build("stlm_tied", gpt2_task, device="meta"))
    tied = _count(_build("stlm_tied", gpt2_task, device="meta", tie_ffn=0))
    lora = _count(_build("stlm_tied", gpt2_task, device="meta", tie_ffn=0, ffn_lora_rank=r))
    proj = _count(_build("stlm_tied", gpt2_task, device="meta", tie_attn_proj=0))
    assert base - tied == 6 * 3 * h * f
    assert lora - tied == 7 * 3 * r * (h + f)
    assert base - proj == 6 * 512 * h


# ------------------------------------------------------------------------- sharing


@pytest.mark.parametrize("k", [0, 1, 2])
def test_shared_ffn_weights_are_the_same_tensors(k, small_task):
    torch.manual_seed(0)
    model = _build("stlm_tied", small_task, tie_ffn=k, **TINY)
    layers = model.decoder.layers
    shared = tied_layer_range(k, len(layers))
    assert shared == list(range(1 + k, 7 - k))
    owner = layers[shared[0]]
    for i, layer in enumerate(layers):
        assert layer.fc1 is not owner.fc1 or i == shared[0]  # separate module objects
        for name in ("w1", "w2", "w3"):
            same = _ffn(layer, name).weight is _ffn(owner, name).weight
            assert same == (i in shared), f"layer {i} {name}"
    assert _ffn(layers[0], "w1").weight is not _ffn(owner, "w1").weight  # layer 0 is never shared
    # attention stays per layer, and every module keeps its own incremental-state id
    ids = {layer.self_attn._incremental_state_id for layer in layers}
    assert len(ids) == len(layers)
    assert layers[shared[0]].self_attn.out_proj.weight is not layers[shared[1]].self_attn.out_proj.weight


def test_attention_projection_sharing_is_independent(small_task):
    model = _build("stlm_tied", small_task, tie_attn_proj=1, **TINY)
    layers = model.decoder.layers
    owner = layers[2].self_attn.out_proj.weight
    for i, layer in enumerate(layers):
        assert (layer.self_attn.out_proj.weight is owner) == (2 <= i <= 5)
        assert layer.self_attn.q_proj.weight is not layers[(i + 1) % 7].self_attn.q_proj.weight
    assert _ffn(layers[3], "w1").weight is not _ffn(layers[4], "w1").weight


def test_lora_adapters_are_per_layer(small_task):
    rank = 3
    model = _build("stlm_tied", small_task, tie_ffn=1, ffn_lora_rank=rank, ffn_lora_alpha=6.0,
                   **TINY)
    layers = model.decoder.layers
    adapters = []
    for i, layer in enumerate(layers):
        for name in ("w1", "w2", "w3"):
            linear = _ffn(layer, name)
            assert isinstance(linear, LoRALinear) == (2 <= i <= 5), f"layer {i} {name}"
            if isinstance(linear, LoRALinear):
                assert linear.weight is _ffn(layers[2], name).weight
                assert linear.scaling == 2.0 and linear.lora_A.shape[0] == rank
                adapters += [linear.lora_A, linear.lora_B]
    assert len({id(p) for p in adapters}) == 4 * 3 * 2
    names = [n for n, _ in model.named_parameters()]
    assert sum("lora_A" in n for n in names) == 4 * 3


def test_lora_adds_exactly_zero_at_init(small_task):
    torch.manual_seed(3)
    plain = _build("stlm_tied", small_task, tie_ffn=0, **TINY).eval()
    torch.manual_seed(3)
    adapted = _build("stlm_tied", small_task, tie_ffn=0, ffn_lora_rank=4, **TINY).eval()
    tokens = torch.randint(small_task.target_dictionary.nspecial, 60, (2, 9))
    with torch.no_grad():
        reference = plain(tokens)[0]
        out = adapted(tokens)[0]
        assert torch.equal(out, reference)
        _ffn(adapted.decoder.layers[3], "w2").lora_B.fill_(0.1)  # a trained adapter does change it
        assert not torch.allclose(adapted(tokens)[0], reference)


def test_shared_weight_gradient_is_the_sum_over_sharing_layers(small_task):
    """A tied model equals an untied one whose interior FFNs are copies of layer 1's; the
    shared weight's gradient is the sum of the copies' gradients."""
    torch.manual_seed(0)
    tied = _build("stlm_tied", small_task, tie_ffn=0, **TINY)
    untied = _build("stlm_tied", small_task, **TINY)
    untied.load_state_dict(tied.state_dict())  # tied keys hold layer 1's FFN at every depth
    tokens = torch.randint(small_task.target_dictionary.nspecial, 60, (2, 6))
    for model in (tied, untied):
        model(tokens)[0].pow(2).mean().backward()
    layers = untied.decoder.layers
    for name in ("w1", "w2", "w3"):
        shared = _ffn(tied.decoder.layers[1], name).weight.grad
        summed = sum(_ffn(layers[i], name).weight.grad for i in range(1, 7))
        assert shared.abs().sum() > 0
        assert torch.allclose(shared, summed, atol=1e-7, rtol=1e-4)
        assert not torch.allclose(shared, _ffn(layers[1], name).weight.grad)


# ------------------------------------------------------------------------- errors


@pytest.mark.parametrize("options, flag", [
    (dict(tie_ffn=3), "--tie-ffn"),                      # 8 layers: K <= 2
    (dict(tie_attn_proj=5), "--tie-attn-proj"),
    (dict(tie_ffn="two"), "--tie-ffn"),
    (dict(tie_ffn=-3), "--tie-ffn"),
    (dict(ffn_lora_rank=8), "--ffn-lora-rank"),           # LoRA without sharing
    (dict(tie_attn_proj=0, ffn_lora_rank=8), "--ffn-lora-rank"),
    (dict(tie_ffn=0, ffn_lora_rank=-1), "--ffn-lora-rank"),
    (dict(tie_ffn=0, ffn_lora_rank=4, ffn_lora_alpha=0.0), "--ffn-lora-alpha"),
    (dict(decoder_attention_heads=7), "--decoder-attention-heads"),
    (dict(kv_heads=3), "--kv-heads"),
    (dict(head_dim=5), "--head-dim"),
])
def test_invalid_options_raise_one_line_errors(options, flag, small_task):
    with pytest.raises(ValueError) as error:
        _build("stlm_tied", small_task, device="meta", **options)
    message = str(error.value)
    assert flag in message and "\n" not in message


def test_k_limit_is_exact(small_task):
    _build("stlm_tied", small_task, device="meta", tie_ffn=2)  # layers 3..5
    with pytest.raises(ValueError, match="K <= 2"):
        _build("stlm_tied", small_task, device="meta", tie_ffn=3)


def test_tie_option_parsing_and_distributed_refusals():
    from slim_fairseq.models.slim_options import TyingOptions, set_slim_defaults, validate_slim_args

    def ns(**given):
        args = argparse.Namespace(decoder_layers=8, decoder_embed_dim=32,
                                  decoder_attention_heads=4, **given)
        set_slim_defaults(args)
        return args

    assert TyingOptions.from_args(ns(tie_attn_proj="1")).spec() == TyingSpec(ffn=None, attn_proj=1)
    assert TyingOptions.from_args(ns(tie_ffn="0", ffn_lora_rank=4)).spec() == TyingSpec(0, None, 4, 4.0)
    with pytest.raises(ValueError, match="--ddp-backend"):
        validate_slim_args(ns(tie_ffn=0, ddp_backend="fully_sharded"), "slim_lm")
    with pytest.raises(ValueError, match="legacy_ddp"):
        validate_slim_args(ns(tie_attn_proj=0, ddp_backend="pytorch_ddp",
                              checkpoint_activations=True, distributed_world_size=2), "slim_lm")
    validate_slim_args(ns(tie_ffn=0, ddp_backend="legacy_ddp", checkpoint_activations=True,
                          distributed_world_size=2), "slim_lm")


# ------------------------------------------------------------------------- modules


def test_rmsnorm_formula():
    norm = RMSNorm(6)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 7.0))
    x = torch.randn(3, 6)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert norm.eps == 1e-6 and [n for n, _ in norm.named_parameters()] == ["weight"]


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(8, 10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    scores = [(rope(q, offset=p + 3) * rope(k, offset=p)).sum().item() for p in (0, 5, 40)]
    assert max(scores) - min(scores) < 1e-4
    assert abs((rope(q, offset=4) * rope(k, offset=0)).sum().item() - scores[0]) > 1e-4
    assert torch.allclose(rope(q, offset=0), q)  # position 0 is not rotated
    assert torch.allclose(rope(q.expand(1, 1, 5, 8))[..., 3, :], rope(q, offset=3)[..., 0, :])


def _causal(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


def _gqa(kv_heads, head_dim, rope_theta):
    spec = AttentionSpec(bias=False, kv_heads=kv_heads, head_dim=head_dim, rope_theta=rope_theta)
    return SlimMultiheadAttention(24 if head_dim == 6 else 16, 4, self_attention=True, spec=spec)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_gqa_incremental_equals_full_with_reorder(kv_heads):
    torch.manual_seed(kv_heads)
    attn = _gqa(kv_heads, 6, 10000.0).eval()
    x = torch.randn(8, 3, 24)  # (T, B, C)
    with torch.no_grad():
        full, _ = attn(x, x, x, attn_mask=_causal(8), need_weights=False)
        state, diffs = {}, []
        order = torch.tensor([2, 2, 0])
        for t in range(8):
            if t == 5:  # beam-like reordering of the cache, as fairseq's generator does
                attn.reorder_incremental_state(state, order)
                x = x[:, order]
                full = attn(x, x, x, attn_mask=_causal(8), need_weights=False)[0]
            step = attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state,
                        need_weights=False)[0]
            diffs.append((step - full[t : t + 1]).abs().max().item())
        assert max(diffs) <= 1e-5
    assert attn.k_proj.weight.shape == (kv_heads * 6, 24)


def test_gqa_matches_explicit_grouped_attention():
    """Query head h reads kv head h // (heads // kv_heads); causal softmax(q k^T / sqrt(d))."""
    torch.manual_seed(0)
    attn = _gqa(2, 4, 0.0).eval()
    x = torch.randn(2, 5, 16)
    q = attn.q_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    v = attn.v_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    heads = []
    for h in range(4):
        scores = q[:, h] @ k[:, h // 2].transpose(1, 2) / 2.0
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, h // 2])
    expected = attn.out_proj(torch.stack(heads, 1).transpose(1, 2).reshape(2, 5, 16))
    xt = x.transpose(0, 1)
    for need_weights in (False, True):  # the fused and the explicit path
        out = attn(xt, xt, xt, attn_mask=_causal(5), need_weights=need_weights)[0]
        assert torch.allclose(out.transpose(0, 1), expected, atol=1e-6)


def test_model_incremental_equals_full(small_task):
    torch.manual_seed(0)
    model = _build("stlm_ffn_lora_k1_wide", small_task, ffn_lora_rank=4, **TINY).eval()
    for layer in model.decoder.layers[2:5]:  # make the adapters non-trivial
        torch.nn.init.normal_(_ffn(layer, "w1").lora_B, std=0.1)
    tokens = torch.randint(small_task.target_dictionary.nspecial, 60, (2, 10))
    with torch.no_grad():
        full = model(tokens)[0]
        state = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(10)]
        assert (torch.cat(steps, 1) - full).abs().max() <= 1e-5


# ------------------------------------------------------------------------- other LMs


def test_tying_on_fairseq_style_glu_layers():
    """apply_weight_tying on layers with fc1 (a GLU holding w1 and w3), fc2, self_attn.out_proj."""
    from slim_fairseq.modules.glu import GLUProjection

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = GLUProjection(8, 10)
            self.fc2 = nn.Linear(10, 8)
            self.self_attn = nn.Module()
            self.self_attn.out_proj = nn.Linear(8, 8)

    layers = [Layer() for _ in range(5)]
    summary = apply_weight_tying(layers, TyingSpec(ffn=0, attn_proj=1, lora_rank=2, lora_alpha=2.0))
    assert summary == {"ffn": [1, 2, 3, 4], "attn_proj": [2, 3], "lora": [1, 2, 3, 4]}
    assert isinstance(layers[4].fc1.w3, LoRALinear) and isinstance(layers[2].fc2, LoRALinear)
    assert layers[4].fc1.w3.weight is layers[1].fc1.w3.weight
    assert layers[4].fc2.bias is layers[1].fc2.bias and layers[4].fc2.scaling == 1.0
    assert not isinstance(layers[0].fc1.w1, LoRALinear)
    assert layers[3].self_attn.out_proj.weight is layers[2].self_attn.out_proj.weight
    assert layers[1].self_attn.out_proj.weight is not layers[2].self_attn.out_proj.weight


def test_slim_lm_accepts_tying_options():
    tiny = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
            "--decoder-attention-heads", "4", "--decoder-layers", "5"]
    _, _, plain = build("slim_lm", tiny, True)
    _, _, tied = build("slim_lm", tiny, True, ["--tie-ffn", "0", "--ffn-lora-rank", "4",
                                                "--tie-attn-proj", "0"])
    layers = tied.decoder.layers
    assert layers[4].fc1.weight is layers[1].fc1.weight and isinstance(layers[3].fc2, LoRALinear)
    assert layers[4].self_attn.out_proj.weight is layers[1].self_attn.out_proj.weight
    saved_ffn = 3 * (2 * 32 * 48 + 48 + 32)
    lora = 4 * 2 * 4 * (32 + 48)  # 4 layers x (fc1, fc2) x r (in + out)
    saved_proj = 3 * (32 * 32 + 32)
    assert _count(plain) - _count(tied) == saved_ffn + saved_proj - lora
    with pytest.raises(ValueError, match="--ffn-lora-rank"):
        build("slim_lm", tiny, True, ["--ffn-lora-rank", "4"])


def test_gpt2_small_shaped_lm_with_ffn_tying(gpt2_task):
    """GPT-2 small shape (12 x 768, f 3072): --tie-ffn 0 leaves 2 FFNs of 12."""
    from fairseq.models.transformer_lm import TransformerLanguageModel  # noqa: F401

    def count(**options):
        args = argparse.Namespace(decoder_embed_dim=768, decoder_ffn_embed_dim=3072,
                                  decoder_layers=12, decoder_attention_heads=12,
                                  share_decoder_input_output_embed=True, **options)
        ARCH_CONFIG_REGISTRY["slim_lm"](args)
        args.tokens_per_sample = 1024
        with torch.device("meta"):
            return _count(ARCH_MODEL_REGISTRY["slim_lm"].build_model(args, gpt2_task))

    ffn = 2 * 768 * 3072 + 3072 + 768
    assert count() - count(tie_ffn=0) == 10 * ffn


def test_encoder_decoder_ties_each_stack_separately():
    """STLM tying in slim_transformer: the encoder and the decoder each tie their own layers (never
    to each other), on dense and on GLU + Tensor-Chain feed-forwards; the count drops by exactly
    the shared weights, decoding step by step still equals the full pass, a saved state loads
    back with the sharing intact, and --sandwich is refused."""
    from helpers import assert_incremental_equals_full
    shape = []
    for side in ("encoder", "decoder"):
        shape += [f"--{side}-embed-dim", "32", f"--{side}-ffn-embed-dim", "48",
                  f"--{side}-attention-heads", "4", f"--{side}-layers", "4"]
    _, _, plain = build("slim_transformer", shape, False)
    _, _, tied = build("slim_transformer", shape, False, ["--tie-ffn", "0"])
    for stack in (tied.encoder, tied.decoder):
        layers = stack.layers
        assert layers[3].fc1.weight is layers[1].fc1.weight and layers[2].fc2.bias is layers[1].fc2.bias
        assert layers[0].fc1.weight is not layers[1].fc1.weight
        assert layers[2].self_attn.out_proj.weight is not layers[1].self_attn.out_proj.weight
    assert tied.encoder.layers[1].fc1.weight is not tied.decoder.layers[1].fc1.weight
    ffn = 2 * 32 * 48 + 48 + 32
    assert _count(plain) - _count(tied) == 2 * 2 * ffn  # layers 2 and 3 of each stack reuse layer 1's
    _, _, proj = build("slim_transformer", shape, False, ["--tie-attn-proj", "0"])
    assert proj.decoder.layers[3].self_attn.out_proj.weight is proj.decoder.layers[1].self_attn.out_proj.weight

    args, task, anthe = build("anthe_base", shape, False, ["--tie-ffn", "0", "--tc-min-bond", "4"])
    layers = anthe.encoder.layers
    assert layers[2].fc1.w1.cores[0] is layers[1].fc1.w1.cores[0]
    assert layers[3].fc2.cores[1] is layers[1].fc2.cores[1]
    anthe.eval()
    assert_incremental_equals_full(task, anthe)
    _, _, again = build("anthe_base", shape, False, ["--tie-ffn", "0", "--tc-min-bond", "4"])
    again.load_state_dict(anthe.state_dict())
    assert again.decoder.layers[3].fc1.w3.cores[0] is again.decoder.layers[1].fc1.w3.cores[0]
    assert torch.equal(again.decoder.layers[3].fc1.w3.cores[0], anthe.decoder.layers[1].fc1.w3.cores[0])

    sandwich = ["--sandwich", "--sandwich-dim", "32", "--sandwich-ffn-dim", "48", "--sandwich-heads", "4"]
    for model, extra in (("slim_transformer", shape), ("slim_lm", ["--decoder-layers", "4"])):
        with pytest.raises(ValueError, match="cannot be combined with --sandwich"):
            build(model, extra, model == "slim_lm", ["--tie-ffn", "0", *sandwich])
    with pytest.raises((ValueError, SystemExit), match="K <= 0"):  # 1+1 .. 4-1-1 is one layer
        build("slim_transformer", shape, False, ["--tie-attn-proj", "1"])
