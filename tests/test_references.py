"""Independent references: each technique's forward written here, in plain torch, from its
paper's equations (never through the plugin's own helpers), and compared with the plugin's
module or model on random inputs in float64 at 1e-6.

Every parameter is drawn at random before a comparison (:func:`randomize_`): norm weights away
from one, LoRA's B away from zero, shaped attention's W_Q away from zero, so that no initial
value hides a term. The references follow the formulas of docs/TECHNIQUES.md; each names the
paper, section and equation it is written from. ``scripts/mutation_check.py`` applies realistic
one-line bugs to the modules and checks that these tests fail on each (docs/DESIGN.md,
"Tests of the maths").
"""
import argparse
import math
import types

import pytest
import torch
import torch.nn.functional as F

from helpers import load_plugin

load_plugin()

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY  # noqa: E402

from slim_fairseq.modules.attention import SlimMultiheadAttention  # noqa: E402
from slim_fairseq.modules.gated_attention import CROSS_GATES, GATES  # noqa: E402
from slim_fairseq.modules.glu import GLUProjection  # noqa: E402
from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding  # noqa: E402
from slim_fairseq.modules.lora import LoRALinear  # noqa: E402
from slim_fairseq.modules.rmsnorm import RMSNorm  # noqa: E402
from slim_fairseq.modules.rope import RotaryEmbedding  # noqa: E402
from slim_fairseq.modules.safe import SAFEInputEmbedding, SAFEOutputProjection  # noqa: E402
from slim_fairseq.modules.sandwich import (SandwichBoundaryLayer,  # noqa: E402
                                           SandwichCrossAttention, SandwichProjection)
from slim_fairseq.modules.tensor_chain import TensorChainEmbedding, TensorChainLinear  # noqa: E402
from slim_fairseq.specs import AttentionSpec, ChainSpec  # noqa: E402
from slim_fairseq_lab.params import make_dictionary  # noqa: E402

TOL = 1e-6
ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def assert_close(got, expected, tol=TOL):
    assert got.shape == expected.shape, (got.shape, expected.shape)
    worst = (got - expected).abs().max().item()
    assert worst <= tol * max(1.0, expected.abs().max().item()), worst


def randomize_(module, seed):
    """Every parameter of ``module`` drawn at random (shared ones once, so they stay shared):
    matrices and chain cores N(0, 1/fan_in), 1-D weights (norms) 1 + N(0, 0.3^2), shaped
    attention's alpha, beta, gamma in [0.5, 1.5), every other vector N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() >= 2:
                value = noise * p.shape[-1] ** -0.5
            elif leaf in ("alpha", "beta", "gamma"):
                value = 0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64)
            elif leaf == "weight":
                value = 1.0 + 0.3 * noise
            else:
                value = 0.3 * noise
            p.copy_(value.to(p.dtype))
    return module


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------------------ the references


def linear(x, weight, bias=None):
    """``x W^T + b`` (``weight`` in nn.Linear's (out, in) layout)."""
    y = x @ weight.t()
    return y if bias is None else y + bias


def rope(x, positions, theta):
    """RoPE (Su et al., arXiv:2104.09864, §3.4.2, eq. (34)) on (..., T, d): pair i of a head,
    channels i and i + d/2 (the pairing of GPT-NeoX and LLaMA), rotated by the angle
    ``position * theta^(-2i/d)`` with the matrix [[cos, -sin], [sin, cos]]."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = positions.to(torch.float64) * theta ** (-2.0 * i / d)
        cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * cos - b * sin
        out[..., i + d // 2] = a * sin + b * cos
    return out


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich, arXiv:1910.07467, eq. (4)): x / RMS(x) * g."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm (Ba et al., arXiv:1607.06450, §3) with gain and bias, eps 1e-5 as fairseq's."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def glu(x, w1, b1, w3, b3, w2, b2, activation):
    """GLU feed-forward (Shazeer, arXiv:2002.05202, §2; the GEGLU of Anthe, arXiv:2305.10991,
    §2): ``(act(x W1 + b1) * (x W3 + b3)) W2 + b2``."""
    return linear(ACTIVATIONS[activation](linear(x, w1, b1)) * linear(x, w3, b3), w2, b2)


def lora(x, weight, bias, a, b, alpha):
    """LoRA (Hu et al., arXiv:2106.09685, §4.1, eq. (3), scaled by alpha / r as §4.1 says):
    ``h = W0 x + (alpha / r) B A x``."""
    return linear(x, weight, bias) + (alpha / a.shape[0]) * (x @ a.t() @ b.t())


def chain_weight(cores):
    """A Tensor Chain's W (Anthe, arXiv:2305.10991, §2.1, eqs. (3)-(4);
    docs/TECHNIQUES.md#tensor-chain):
    ``W[(i_1..i_n), (k_1..k_n)] = sum_j G1[i_1, j_1, k_1] G2[i_2, j_1, j_2, k_2] ..
    Gn[i_n, j_{n-1}, k_n]``, row and column multi-indices row-major."""
    n = len(cores)
    rows, cols, bonds = "abcdef"[:n], "ghijkl"[:n], "mnopq"[:n - 1]
    terms = [rows[0] + bonds[0] + cols[0]]
    terms += [rows[i] + bonds[i - 1] + bonds[i] + cols[i] for i in range(1, n - 1)]
    terms += [rows[-1] + bonds[-1] + cols[-1]]
    w = torch.einsum(",".join(terms) + "->" + rows + cols, *cores)
    in_features = math.prod(core.shape[0] for core in cores)
    return w.reshape(in_features, -1)


def sinusoidal(length, dim, padding_idx, start=0):
    """fairseq's sinusoidal positions (Vaswani et al., arXiv:1706.03762, §3.5; fairseq lays out
    the sines of every frequency, then the cosines): rows ``padding_idx + 1 + start ..``."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))
    pos = torch.arange(padding_idx + 1 + start, padding_idx + 1 + start + length,
                       dtype=torch.float64)[:, None] * freq[None]
    table = torch.cat([torch.sin(pos), torch.cos(pos)], dim=1)
    return F.pad(table, (0, dim % 2))


def attention(x_q, x_kv, p, heads, kv_heads, head_dim, *, causal=False, key_pad=None,
              theta=0.0, gate="none", shaped=None):
    """Multi-head attention (Vaswani et al., arXiv:1706.03762, §3.2.2) on (B, T, C) inputs.

    ``p``: {"q"|"k"|"v"|"out": (weight, bias) or None (the identity: --no-patt, a removed W)}.
    Gate AgB (Anthe, arXiv:2305.10991, §2, eq. (1), named as docs/TECHNIQUES.md#gated-pre-attention
    names it): ``B_s = W_B(B * sigmoid(W_A A))``, ``A_s = A``.
    Grouped key/value heads (Ainslie et al., arXiv:2305.13245, §2.2): query head h reads
    key/value head ``h // (heads / kv_heads)``. RoPE on queries and keys (positions 0..T-1).
    ``shaped`` (alpha, beta, gamma per head; He & Hofmann, arXiv:2311.01906, §4.1):
    ``(alpha I + beta softmax - gamma C) V``, C the uniform causal matrix."""
    def proj(name, x):
        return x if p[name] is None else linear(x, *p[name])

    inputs = {"q": x_q, "k": x_kv, "v": x_kv}
    slots = {name: proj(name, inputs[name]) for name in "qkv"}
    if gate != "none":
        a, b = gate[0], gate[2]
        slots[a] = inputs[a]
        slots[b] = proj(b, inputs[b] * torch.sigmoid(proj(a, inputs[a])))
    bsz, tq, tk = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    q = slots["q"].reshape(bsz, tq, heads, head_dim).transpose(1, 2)
    k = slots["k"].reshape(bsz, tk, kv_heads, head_dim).transpose(1, 2)
    v = slots["v"].reshape(bsz, tk, kv_heads, head_dim).transpose(1, 2)
    if theta:
        q, k = rope(q, torch.arange(tq), theta), rope(k, torch.arange(tk), theta)
    visible = torch.ones(bsz, tq, tk, dtype=torch.bool)
    if causal:
        visible &= torch.ones(tq, tk, dtype=torch.bool).tril()
    if key_pad is not None:
        visible &= ~key_pad[:, None, :]
    outs = []
    for h in range(heads):
        kv = h // (heads // kv_heads)
        scores = q[:, h] @ k[:, kv].transpose(1, 2) / math.sqrt(head_dim)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        if shaped is not None:
            alpha, beta, gamma = (s[h] for s in shaped)
            uniform = visible / visible.sum(-1, keepdim=True)
            mix = alpha * torch.eye(tq, tk, dtype=x_q.dtype) + beta * probs - gamma * uniform
        else:
            mix = probs
        outs.append(mix @ v[:, kv])
    out = torch.stack(outs, 1).transpose(1, 2).reshape(bsz, tq, heads * head_dim)
    return proj("out", out)


def attention_params(sd, prefix):
    """{"q"|"k"|"v"|"out": (weight, bias) or None} of an attention's state dict entries."""
    out = {}
    for name in ("q", "k", "v", "out"):
        w = sd.get(f"{prefix}{name}_proj.weight")
        out[name] = None if w is None else (w, sd.get(f"{prefix}{name}_proj.bias"))
    return out


# --------------------------------------------------------------------------- building modules


def _task(vocab=40):
    d = make_dictionary(vocab)
    return types.SimpleNamespace(source_dictionary=d, target_dictionary=d)


def build_model(arch, seed=0, vocab=40, **options):
    """``arch`` built from option attributes through its preset, in float64, parameters at
    random (:func:`randomize_`), eval mode."""
    args = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, _task(vocab)).double()
    return args, randomize_(model, seed).eval()


def tokens_for(vocab, shape=(2, 7), seed=0):
    return torch.randint(4, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _attention_module(embed_dim=16, heads=4, seed=0, **spec):
    torch.manual_seed(seed)
    attn = SlimMultiheadAttention(embed_dim, heads, self_attention=True, spec=AttentionSpec(**spec))
    return randomize_(attn.double(), seed).eval()


def _module_params(attn):
    def pair(proj):
        return None if proj is None else (proj.weight, proj.bias)
    return {"q": pair(attn.q_proj), "k": pair(attn.k_proj), "v": pair(attn.v_proj),
            "out": pair(attn.out_proj)}


def _causal_mask(length):
    return torch.triu(torch.full((length, length), float("-inf"), dtype=torch.float64), 1)


# ------------------------------------------------------------------------------------ STLM block


@pytest.mark.parametrize("offset", [0, 5])
def test_rope_rotates_each_channel_pair_by_its_angle(offset):
    rot = RotaryEmbedding(12, theta=500.0)
    x = randn(2, 3, 6, 12, seed=offset).transpose(1, 2)  # strided, as the heads of a projection
    assert_close(rot(x, offset=offset), rope(x, torch.arange(offset, offset + x.shape[2]), 500.0))


def test_rope_matches_transformers_llama_rotary():
    """The rotation of transformers' LLaMA (where transformers is installed), in float32."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, rope_theta=500.0)
    hf = LlamaRotaryEmbedding(config=config)
    q, k = randn(2, 4, 9, 16, seed=1).float(), randn(2, 2, 9, 16, seed=2).float()
    offset = 3
    cos, sin = hf(q, torch.arange(offset, offset + 9)[None].expand(2, 9))
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    mine = RotaryEmbedding(16, theta=500.0)
    assert_close(mine(q, offset=offset), hq)
    assert_close(mine(k, offset=offset), hk)


@pytest.mark.parametrize("eps", [1e-6, 0.3])
def test_rmsnorm(eps):
    norm = randomize_(RMSNorm(10, eps=eps).double(), 1)
    x = 0.2 * randn(3, 4, 10)  # small: eps 0.3 weighs in the statistic
    assert_close(norm(x), rms_norm(x, norm.weight, eps))


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("path", ["no_grad", "store", "recompute", "autocast"])
def test_glu_feed_forward(activation, path, monkeypatch):
    """Every path of the GLU: inference, plain autograd, the recomputing autograd function, and
    autocast's product of stacked weights (float64 is outside autocast's casts, so the stacked
    path runs in float64 here)."""
    module = randomize_(GLUProjection(10, 14, activation).double(), 2)
    fc2 = randomize_(torch.nn.Linear(14, 10).double(), 3)
    x = randn(2, 5, 10, seed=4).requires_grad_(path != "no_grad")
    expected = glu(x, module.w1.weight, module.w1.bias, module.w3.weight, module.w3.bias,
                   fc2.weight, fc2.bias, activation)
    stacked = []
    original = GLUProjection._stack_weights
    monkeypatch.setattr(GLUProjection, "_stack_weights",
                        lambda self, x: stacked.append(original(self, x)) or stacked[-1])
    module.backward_mode = "recompute" if path == "recompute" else "store"
    with torch.set_grad_enabled(path != "no_grad"), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=path == "autocast"):
        out = fc2(module(x))
    assert_close(out, expected)
    assert stacked == ([] if path == "no_grad" else [path == "autocast"])
    if path != "no_grad":  # and the gradient of the input
        grad, = torch.autograd.grad(out.pow(2).sum(), x)
        assert_close(grad, torch.autograd.grad(expected.pow(2).sum(), x)[0])


@pytest.mark.parametrize("rank, alpha", [(3, 6.0), (2, 1.0)])
def test_lora_scales_its_update_by_alpha_over_r(rank, alpha):
    shared = torch.nn.Linear(8, 6).double()
    adapted = randomize_(LoRALinear(shared, rank, alpha), 5)
    x = randn(4, 8, seed=6)
    assert_close(adapted(x), lora(x, shared.weight, shared.bias, adapted.lora_A, adapted.lora_B,
                                  alpha))


# (kv heads, head width, RoPE theta) of 8 query heads at width 32: MHA without RoPE, GQA (2
# key/value heads, each read by 4 query heads) and MQA with RoPE and a head width other than
# width / heads
ATTENTION_CASES = [(8, 0, 0.0), (2, 0, 500.0), (1, 6, 500.0)]


@pytest.mark.parametrize("need_weights", [False, True])  # the fused and the explicit path
@pytest.mark.parametrize("kv_heads, head_dim, theta", ATTENTION_CASES)
def test_grouped_query_attention_with_rope(kv_heads, head_dim, theta, need_weights):
    attn = _attention_module(32, 8, kv_heads=kv_heads, head_dim=head_dim, rope_theta=theta,
                             bias=False)
    x = randn(2, 7, 32, seed=7)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    xt = x.transpose(0, 1)
    for key_pad in (None, pad):  # without padding, and a batch of which row 1 is right-padded
        expected = attention(x, x, _module_params(attn), 8, kv_heads, attn.head_dim,
                             causal=True, key_pad=key_pad, theta=theta)
        out, _ = attn(xt, xt, xt, attn_mask=_causal_mask(7), key_padding_mask=key_pad,
                      need_weights=need_weights)
        assert_close(out.transpose(0, 1), expected)


@pytest.mark.parametrize("kv_heads, head_dim, theta", ATTENTION_CASES)
def test_each_decoding_step_is_its_row_of_the_reference(kv_heads, head_dim, theta):
    """Incremental decoding: the cached keys and RoPE's positions of step t give row t."""
    attn = _attention_module(32, 8, kv_heads=kv_heads, head_dim=head_dim, rope_theta=theta,
                             bias=False)
    x = randn(2, 6, 32, seed=8)
    expected = attention(x, x, _module_params(attn), 8, kv_heads, attn.head_dim, causal=True,
                         theta=theta)
    state = {}
    for t in range(6):
        step = x[:, t:t + 1].transpose(0, 1)
        out, _ = attn(step, step, step, incremental_state=state, need_weights=False)
        assert_close(out[0], expected[:, t])


@pytest.mark.parametrize("grad", [False, True])  # eval, and the training path (GatedLinear)
@pytest.mark.parametrize("no_patt", [False, True])
@pytest.mark.parametrize("gate", [g for g in GATES if g != "none"])
def test_the_six_gates(gate, no_patt, grad):
    attn = _attention_module(embed_dim=16, gate=gate, no_patt=no_patt)
    x = randn(2, 5, 16, seed=9)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, :2] = True  # an encoder's left padding
    expected = attention(x, x, _module_params(attn), 4, 4, 4, key_pad=pad, gate=gate)
    xt = x.transpose(0, 1).requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out, _ = attn(xt, xt, xt, key_padding_mask=pad, need_weights=False)
    assert_close(out.transpose(0, 1), expected)


@pytest.mark.parametrize("gate", [g for g in CROSS_GATES if g != "none"])
def test_cross_attention_gates(gate):
    torch.manual_seed(0)
    attn = SlimMultiheadAttention(16, 4, encoder_decoder_attention=True,
                                  spec=AttentionSpec(gate=gate))
    attn = randomize_(attn.double(), 10).eval()
    query, enc = randn(2, 3, 16, seed=11), randn(2, 6, 16, seed=12)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, :2] = True
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out, _ = attn(query.transpose(0, 1), enc.transpose(0, 1), enc.transpose(0, 1),
                          key_padding_mask=pad, static_kv=True, need_weights=False)
        assert_close(out.transpose(0, 1),
                     attention(query, enc, _module_params(attn), 4, 4, 4, key_pad=pad, gate=gate))


def _stlm_layer_reference(sd, i, x, s):
    """Pre-norm STLM block (arXiv:2405.14159; docs/TECHNIQUES.md#stlm-block):
    ``h = x + Attn(RMSNorm(x))``, ``y = h + SwiGLU(RMSNorm(h))``; the FFN of layer
    ``s.ffn_owner(i)`` with layer i's own LoRA, the output projection of ``s.proj_owner(i)``
    (the tying schemes of the STLM weight-tying report, §2)."""
    own, ffn, proj = f"decoder.layers.{i}.", f"decoder.layers.{s.ffn_owner(i)}.", \
        f"decoder.layers.{s.proj_owner(i)}."
    p = attention_params(sd, own + "self_attn.")
    p["out"] = (sd[proj + "self_attn.out_proj.weight"], None)
    normed = rms_norm(x, sd[own + "self_attn_layer_norm.weight"], 1e-6)
    h = x + attention(normed, normed, p, s.heads, s.kv_heads, s.head_dim, causal=True,
                      theta=10000.0)

    def ffn_linear(path, z):
        weight = sd[ffn + path + ".weight"]
        if s.lora_rank and i in s.ffn_range:  # every layer of the tied range, the owner too
            return lora(z, weight, None, sd[own + path + ".lora_A"], sd[own + path + ".lora_B"],
                        s.lora_alpha)
        return linear(z, weight)

    normed = rms_norm(h, sd[own + "final_layer_norm.weight"], 1e-6)
    hidden = F.silu(ffn_linear("fc1.w1", normed)) * ffn_linear("fc1.w3", normed)
    return h + ffn_linear("fc2", hidden)


def _tied(k, layers):
    """The weight-tying report's rule (STLM, arXiv:2405.14159; report §2, FFN tying): layers
    1+k .. D-k-1 (0-based) use the weights of layer 1+k; none without tying."""
    return range(0) if k is None else range(1 + k, layers - k)


def _owner(k, layers):
    return lambda i: _tied(k, layers)[0] if i in _tied(k, layers) else i


@pytest.mark.parametrize("tie_ffn, tie_proj, lora_rank", [(0, None, 0), (1, None, 2),
                                                          (None, 1, 0)])
def test_stlm_model_with_tying_and_lora(tie_ffn, tie_proj, lora_rank):
    """A whole stlm_tied language model (RMSNorm, RoPE, GQA, SwiGLU, no biases, tied output)
    with FFN tying, LoRA on the tied FFN and output-projection tying."""
    options = dict(decoder_embed_dim=32, decoder_ffn_embed_dim=40, decoder_attention_heads=4,
                   kv_heads=2, decoder_layers=6)
    if tie_ffn is not None:
        options["tie_ffn"] = str(tie_ffn)
    if tie_proj is not None:
        options["tie_attn_proj"] = str(tie_proj)
    if lora_rank:
        options.update(ffn_lora_rank=lora_rank, ffn_lora_alpha=3.0)
    args, model = build_model("stlm_tied", **options)
    sd = {k: v for k, v in model.state_dict().items()}
    layers = 6
    s = types.SimpleNamespace(heads=4, kv_heads=2, head_dim=8, lora_rank=lora_rank,
                              lora_alpha=3.0, ffn_owner=_owner(tie_ffn, layers),
                              proj_owner=_owner(tie_proj, layers),
                              ffn_range=_tied(tie_ffn, layers))
    tokens = tokens_for(40)
    table = sd["decoder.embed_tokens.table.weight"]
    x = table[tokens]  # no embedding scale, no absolute positions
    for i in range(layers):
        x = _stlm_layer_reference(sd, i, x, s)
    x = rms_norm(x, sd["decoder.layer_norm.weight"], 1e-6)
    expected = x @ table.t()  # the output projection is the token table
    assert_close(model(tokens)[0], expected)


# ------------------------------------------------------------------------------------------ Anthe


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_hsoftpos(levels):
    """H-SoftPOS (Anthe, arXiv:2305.10991, §2.1, eq. (2); docs/TECHNIQUES.md#h-softpos, whose
    first convolution has dilation 1), a left-padded batch, and each incremental step against
    its row."""
    from fairseq.models.transformer import Embedding
    width, pad = 24, 1
    d_sp = width // (2 * levels)
    d_emb = width - (2 * levels - 1) * d_sp
    torch.manual_seed(0)
    module = HSoftPOSEmbedding(Embedding(40, d_emb, pad), width, levels, pad, 64)
    module = randomize_(module.double(), 13).eval()
    tokens = tokens_for(40, (2, 8), seed=14)
    tokens[1, :3] = pad
    keep = tokens.ne(pad).to(torch.float64)[..., None]
    positions = torch.zeros(2, 8, d_emb, dtype=torch.float64)
    for row in range(2):
        real = int(keep[row].sum())
        positions[row, 8 - real:] = sinusoidal(real, d_emb, pad)
    x = (math.sqrt(d_emb) * module.table.weight[tokens] + positions) * keep
    parts = [x, torch.softmax(x[..., :d_sp], -1) @ module.softpos[0]]
    for level in range(1, levels):
        conv = module.convs[level - 1]
        dilation = 2 ** (level - 1)  # X_i for i = 2..l: dilation 2^(i-2)
        x = F.conv1d(F.pad(x.transpose(1, 2), (2 * dilation, 0)), conv.weight, conv.bias,
                     dilation=dilation).transpose(1, 2) * keep
        parts += [x, torch.softmax(x[..., :d_sp], -1) @ module.softpos[level]]
    expected = torch.cat(parts, -1)
    assert_close(module(tokens), expected)
    state = {}
    for t in range(8):  # row 0 (no padding) step by step
        assert_close(module(tokens[:1, :t + 1], incremental_state=state)[:, 0], expected[:1, t])


CHAIN_SHAPES = [((12, 20), 2), ((20, 12), 2), ((24, 30), 3), ((16, 36), 4)]


@pytest.mark.parametrize("mode", ["materialise", "contract"])
@pytest.mark.parametrize("shape, length", CHAIN_SHAPES)
def test_tensor_chain_linear_is_x_times_w_of_its_cores(shape, length, mode):
    chain = TensorChainLinear(*shape, bond=3, length=length, forward_mode=mode)
    chain = randomize_(chain.double(), 15)
    w = chain_weight(list(chain.cores))
    assert w.shape == shape
    assert_close(chain.full_weight(), w)
    x = randn(2, 5, shape[0], seed=16)
    for grad in (False, True):
        chain.train(grad)
        with torch.set_grad_enabled(grad):
            assert_close(chain(x), x @ w + chain.bias)


@pytest.mark.parametrize("length", [2, 3])
def test_tensor_chain_embedding_rows(length):
    table = TensorChainEmbedding(60, 12, padding_idx=1, bond=3, length=length)
    table = randomize_(table.double(), 17)
    w = chain_weight(list(table.cores))
    tokens = torch.tensor([[1, 5, 59, 12], [33, 1, 0, 47]])
    expected = w[tokens] * tokens.ne(1)[..., None]
    assert_close(table(tokens), expected)
    assert_close(table.weight, w * (torch.arange(60) != 1)[:, None])


@pytest.mark.parametrize("backward_mode", ["store", "recompute"])
def test_glu_of_tensor_chains(backward_mode):
    """A GLU whose w1, w3 are Tensor Chains contracted with the input (the chain GLU path)."""
    module = GLUProjection(20, 12, "silu", chain=ChainSpec(ratio=0.5))
    module = randomize_(module.double(), 18)
    for chain in (module.w1, module.w3):
        chain.forward_mode = "contract"
    module.backward_mode = backward_mode
    x = randn(3, 4, 20, seed=19).requires_grad_()
    out = module(x)
    w1, w3 = chain_weight(list(module.w1.cores)), chain_weight(list(module.w3.cores))
    expected = F.silu(x @ w1 + module.w1.bias) * (x @ w3 + module.w3.bias)
    assert_close(out, expected)
    grad, = torch.autograd.grad(out.pow(2).sum(), x)
    assert_close(grad, torch.autograd.grad(expected.pow(2).sum(), x)[0])


# -------------------------------------------------------------------------------------- Subformer


def _safe_reference(module, tokens, causal, normalize_before):
    """SAFE's input side (Subformer, arXiv:2101.00234, §2.1; docs/TECHNIQUES.md#safe-embeddings):
    ``x = E(S) sqrt(d_e) + pos``, ``x = LN(x + SelfAttn(x))`` (LN first with pre-norm),
    ``out = LN_{d_m}(fc2(relu(fc1(x))))``."""
    d_e, pad = module.table.embedding_dim, module.padding_idx
    bsz, length = tokens.shape
    keep = tokens.ne(pad)
    positions = torch.zeros(bsz, length, d_e, dtype=torch.float64)
    for row in range(bsz):
        real = int(keep[row].sum())
        positions[row, length - real:] = sinusoidal(real, d_e, pad)
    x = math.sqrt(d_e) * module.table.weight[tokens] + positions
    a = module.self_attn
    heads = a.num_heads
    ln1 = (module.self_attn_layer_norm.weight, module.self_attn_layer_norm.bias)
    inner = layer_norm(x, *ln1) if normalize_before else x
    x = x + attention(inner, inner, _module_params(a), heads, heads, d_e // heads,
                      causal=causal, key_pad=~keep)
    if not normalize_before:
        x = layer_norm(x, *ln1)
    x = linear(F.relu(linear(x, module.fc1.weight, module.fc1.bias)), module.fc2.weight,
               module.fc2.bias)
    return layer_norm(x, module.output_layer_norm.weight, module.output_layer_norm.bias)


@pytest.mark.parametrize("causal, normalize_before", [(False, False), (True, False), (True, True)])
def test_safe_input_embedding(causal, normalize_before):
    from fairseq.models.transformer import Embedding
    torch.manual_seed(0)
    module = SAFEInputEmbedding(Embedding(40, 16, 1), 24, causal=causal,
                                normalize_before=normalize_before, attention_heads=2)
    module = randomize_(module.double(), 20).eval()
    tokens = tokens_for(40, (2, 6), seed=21)
    if not causal:
        tokens[1, :2] = 1  # an encoder's left padding
    expected = _safe_reference(module, tokens, causal, normalize_before)
    out = module(tokens)
    rows = ~tokens.eq(1)
    assert_close(out[rows], expected[rows])
    if causal:
        state = {}
        for t in range(6):
            assert_close(module(tokens[:, :t + 1], incremental_state=state)[:, 0],
                         expected[:, t])


@pytest.mark.parametrize("mlp", [False, True])
def test_safe_output(mlp):
    """``logits = E(W h + b)``, with the activation between the two in the MLP form."""
    from fairseq.models.transformer import Embedding
    module = randomize_(SAFEOutputProjection(Embedding(40, 16, 1), 24, mlp=mlp,
                                             activation="gelu").double(), 22)
    h = randn(2, 3, 24, seed=23)
    inner = linear(h, module.proj.weight, module.proj.bias)
    inner = F.gelu(inner) if mlp else inner
    assert_close(module(h), inner @ module.table.weight.t())


def test_sandwich_projections_and_cross_attention():
    """The width changes of the sandwich (Subformer, arXiv:2101.00234, §2.2, App. A;
    docs/TECHNIQUES.md#sandwich-sharing): ``LN(Linear(x))`` after the first layer and before
    the last; a wider middle's cross-attention ``LN(W_up Attn(LN(W_down q), enc))``: down to
    the model's width, attention over the encoder, back up (App. A projects without the two
    LayerNorms, which are the plugin's)."""
    up = randomize_(SandwichProjection(8, 12).double(), 24).eval()
    x = randn(2, 5, 8, seed=25)
    expected_up = layer_norm(linear(x, up.linear.weight, up.linear.bias), up.layer_norm.weight,
                             up.layer_norm.bias)
    assert_close(up(x), expected_up)
    down = randomize_(SandwichProjection(12, 8).double(), 26).eval()
    inner = randomize_(torch.nn.Linear(8, 8).double(), 27)
    y = randn(2, 5, 12, seed=28)
    down_y = layer_norm(linear(y, down.linear.weight, down.linear.bias), down.layer_norm.weight,
                        down.layer_norm.bias)
    assert_close(SandwichBoundaryLayer(inner, down, project_after=False)(y),
                 linear(down_y, inner.weight, inner.bias))
    assert_close(SandwichBoundaryLayer(inner, up, project_after=True)(x),
                 layer_norm(linear(linear(x, inner.weight, inner.bias), up.linear.weight,
                                   up.linear.bias), up.layer_norm.weight, up.layer_norm.bias))
    torch.manual_seed(0)
    attn = SlimMultiheadAttention(8, 2, encoder_decoder_attention=True,
                                  spec=AttentionSpec(bias=False))
    cross = randomize_(SandwichCrossAttention(attn, 12, 8).double(), 29).eval()
    enc = randn(2, 4, 8, seed=30)
    out, _ = cross(y.transpose(0, 1), enc.transpose(0, 1), enc.transpose(0, 1), static_kv=True,
                   need_weights=False)
    query = layer_norm(linear(y, cross.to_model.weight, cross.to_model.bias),
                       cross.to_model_norm.weight, cross.to_model_norm.bias)
    mixed = attention(query, enc, _module_params(attn), 2, 2, 4)
    expected = layer_norm(linear(mixed, cross.to_middle.weight, cross.to_middle.bias),
                          cross.to_middle_norm.weight, cross.to_middle_norm.bias)
    assert_close(out.transpose(0, 1), expected)


def _prenorm_layer(sd, prefix, x, heads, norms_prefix=None):
    """fairseq's pre-norm decoder layer: ``h = x + Attn(LN(x))``, ``y = h + FFN(LN(h))``
    (ReLU FFN with biases); the norms of ``norms_prefix`` (a layer of its own) when given."""
    norms = norms_prefix or prefix
    ln = [(sd[f"{norms}{n}.weight"], sd[f"{norms}{n}.bias"])
          for n in ("self_attn_layer_norm", "final_layer_norm")]
    width = x.shape[-1]
    normed = layer_norm(x, *ln[0])
    h = x + attention(normed, normed, attention_params(sd, prefix + "self_attn."), heads, heads,
                      width // heads, causal=True)
    normed = layer_norm(h, *ln[1])
    hidden = F.relu(linear(normed, sd[prefix + "fc1.weight"], sd[prefix + "fc1.bias"]))
    return h + linear(hidden, sd[prefix + "fc2.weight"], sd[prefix + "fc2.bias"])


def test_subformer_language_model_with_safe_and_a_wider_sandwich():
    """SAFE in and out, a sandwich of 4 layers whose two middle layers (width 24) share one set
    of attention and FFN weights and keep their own LayerNorms, projected up after the first
    layer and down before the last (arXiv:2101.00234, §2)."""
    args, model = build_model("slim_lm", decoder_embed_dim=16, decoder_ffn_embed_dim=24,
                              decoder_attention_heads=2, decoder_layers=4, sandwich=True,
                              sandwich_dim=24, sandwich_ffn_dim=32, sandwich_heads=2,
                              safe_embed_dim=8, dropout=0.0)
    sd = {k: v for k, v in model.state_dict().items()}
    tokens = tokens_for(40)
    x = _safe_reference(model.decoder.embed_tokens, tokens, causal=True, normalize_before=True)

    def projection(prefix, z):
        return layer_norm(linear(z, sd[prefix + "linear.weight"], sd[prefix + "linear.bias"]),
                          sd[prefix + "layer_norm.weight"], sd[prefix + "layer_norm.bias"])

    x = projection("decoder.layers.0.projection.", _prenorm_layer(sd, "decoder.layers.0.layer.",
                                                                  x, 2))
    for i in (1, 2):  # the weights of the first middle layer, each layer's own norms
        x = _prenorm_layer(sd, "decoder.layers.1.", x, 2, norms_prefix=f"decoder.layers.{i}.")
    x = _prenorm_layer(sd, "decoder.layers.3.layer.", projection("decoder.layers.3.projection.", x), 2)
    x = layer_norm(x, sd["decoder.layer_norm.weight"], sd["decoder.layer_norm.bias"])
    out = linear(x, sd["decoder.output_projection.proj.weight"],
                 sd["decoder.output_projection.proj.bias"])
    assert_close(model(tokens)[0], out @ sd["decoder.embed_tokens.table.weight"].t())


# ------------------------------------------------------------------------------------- skipless


def _skipless_reference(sd, tokens, s):
    """A skipless language model (He & Hofmann, arXiv:2311.01906, §4; no residual, no norm):
    serial ``y = s FFN(Attn(x))``, parallel ``y = (Attn(x) + s FFN(x)) / sqrt(1 + s^2)``, shaped
    attention; a removed projection (Graef, arXiv:2404.12362, §1-2) is the identity."""
    x = math.sqrt(s.width) * sd["decoder.embed_tokens.table.weight"][tokens]
    for i in range(s.layers):
        prefix = f"decoder.layers.{i}."
        shaped = tuple(sd[f"{prefix}self_attn.{n}"] for n in ("alpha", "beta", "gamma"))
        attn = attention(x, x, attention_params(sd, prefix + "self_attn."), s.heads, s.kv_heads,
                         s.width // s.heads, causal=True, theta=10000.0, shaped=shaped)

        def ffn(z):
            if s.glu:
                return glu(z, sd[prefix + "fc1.w1.weight"], None, sd[prefix + "fc1.w3.weight"],
                           None, sd[prefix + "fc2.weight"], None, "silu")
            return linear(F.relu(linear(z, sd[prefix + "fc1.weight"])), sd[prefix + "fc2.weight"])

        if s.parallel:
            x = (attn + s.scale * ffn(x)) / math.sqrt(1.0 + s.scale ** 2)
        else:
            x = s.scale * ffn(attn)
    return x @ sd["decoder.output_projection.weight"].t()


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_shaped_attention_with_padding(kv_heads):
    """Shaped attention over a right-padded batch (the explicit path): the uniform term is
    spread over each query's visible keys only."""
    attn = _attention_module(embed_dim=16, kv_heads=kv_heads, rope_theta=500.0, bias=False,
                             shaped=True)
    x = randn(2, 6, 16, seed=31)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    shaped = (attn.alpha, attn.beta, attn.gamma)
    expected = attention(x, x, _module_params(attn), 4, kv_heads, 4, causal=True, key_pad=pad,
                         theta=500.0, shaped=shaped)
    xt = x.transpose(0, 1)
    out, _ = attn(xt, xt, xt, attn_mask=_causal_mask(6), key_padding_mask=pad, need_weights=False)
    assert_close(out.transpose(0, 1), expected)


SKIPLESS_CASES = [("serial", 0, False, "none"), ("parallel", 2, True, "none"),
                  ("serial", 2, True, "q"), ("parallel", 0, False, "q")]


@pytest.mark.parametrize("layout, kv_heads, glu_ffn, removed", SKIPLESS_CASES)
def test_skipless_model(layout, kv_heads, glu_ffn, removed):
    options = dict(decoder_embed_dim=16, decoder_layers=2, decoder_attention_heads=4,
                   decoder_ffn_embed_dim=24, kv_heads=kv_heads, skipless_layout=layout,
                   mlp_branch_scale=0.7, removed_weights=removed)
    if glu_ffn:
        options.update(ffn_glu=True, glu_hidden="full", activation_fn="silu")
    args, model = build_model("skipless_lm", **options)
    sd = {k: v for k, v in model.state_dict().items()}
    s = types.SimpleNamespace(width=16, layers=2, heads=4, kv_heads=kv_heads or 4, glu=glu_ffn,
                              parallel=layout == "parallel", scale=0.7)
    tokens = tokens_for(40)
    assert_close(model(tokens)[0], _skipless_reference(sd, tokens, s))
    state = {}
    expected = _skipless_reference(sd, tokens, s)
    for t in range(tokens.shape[1]):
        step = model(tokens[:, :t + 1], incremental_state=state)[0]
        assert_close(step[:, 0], expected[:, t])


@pytest.mark.parametrize("removed", ["q", "k", "v"])
def test_weight_removal_follows_the_table_of_the_paper(removed):
    """Graef (arXiv:2404.12362, §1, Figure 1), serial layout with biases: the producer of block
    i's input absorbs D_i = W_removed (``O*_{i-1} = O_{i-1} D``, biases ``b D + b_D``), the
    other two projections read through it (``X* = D^-1 X``, ``b* = b_X - b_D D^-1 X``), and P
    merges into the FFN's input linear (``M* = P M``, ``b1* = b1 + b_P M``). The reduced
    model built from these weights by hand equals the original."""
    from slim_fairseq.weight_removal import reduce_model

    options = dict(decoder_embed_dim=16, decoder_layers=2, decoder_attention_heads=4,
                   decoder_ffn_embed_dim=24, skipless_layout="serial", linear_bias=True,
                   mlp_branch_scale=0.7)
    args, model = build_model("skipless_lm", **options)
    sd = model.state_dict()
    reduced, _ = reduce_model(model, removed)
    reduced.eval()
    got = reduced.state_dict()

    def row(key):  # row-vector matrix of a linear layer: y = x M + b
        return sd[key].t()

    scale, mlp_scale = math.sqrt(16), 0.7
    for i in range(2):
        a = f"decoder.layers.{i}.self_attn."
        d, b_d = row(f"{a}{removed}_proj.weight"), sd[f"{a}{removed}_proj.bias"]
        if i == 0:
            expected = sd["decoder.embed_tokens.table.weight"] @ d + b_d / scale
            assert_close(got["decoder.embed_tokens.table.weight"], expected)
        else:
            prev = f"decoder.layers.{i - 1}."
            assert_close(got[prev + "fc2.weight"].t(), row(prev + "fc2.weight") @ d)
            assert_close(got[prev + "fc2.bias"], sd[prev + "fc2.bias"] @ d + b_d / mlp_scale)
        for other in "qkv":
            if other == removed:
                assert f"{a}{other}_proj.weight" not in got
                continue
            x = row(f"{a}{other}_proj.weight")
            assert_close(got[f"{a}{other}_proj.weight"].t(), torch.linalg.inv(d) @ x)
            assert_close(got[f"{a}{other}_proj.bias"],
                         sd[f"{a}{other}_proj.bias"] - b_d @ torch.linalg.inv(d) @ x)
        f = f"decoder.layers.{i}."
        p, b_p = row(a + "out_proj.weight"), sd[a + "out_proj.bias"]
        assert a + "out_proj.weight" not in got
        assert_close(got[f + "fc1.weight"].t(), p @ row(f + "fc1.weight"))
        assert_close(got[f + "fc1.bias"], sd[f + "fc1.bias"] + b_p @ row(f + "fc1.weight"))
    tokens = tokens_for(40)
    assert_close(reduced(tokens)[0], model(tokens)[0])
