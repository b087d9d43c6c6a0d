"""Anthe modules (docs/TECHNIQUES.md#anthe): Tensor Chain, GLU, gated attention, H-SoftPOS."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import load_plugin

load_plugin()  # registers the plugin the way --user-dir does; then its modules import normally

from slim_fairseq.modules.attention import SlimMultiheadAttention
from slim_fairseq.modules.gated_attention import CROSS_GATES, GATES
from slim_fairseq.modules.glu import GLUProjection, glu_hidden_dim
from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding, hsoftpos_dims
from slim_fairseq.modules.tensor_chain import (
    TensorChainEmbedding,
    TensorChainLinear,
    factorize,
    solve_bond,
    tc_param_count,
)
from slim_fairseq.specs import AttentionSpec, ChainSpec


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------- Tensor Chain


def test_factorisation_examples():
    assert factorize(512, 2) == (32, 16)
    assert factorize(1365, 2) == (39, 35)
    for n, length in ((2048, 2), (32000, 2), (32000, 3), (1365, 4)):
        factors = factorize(n, length)
        assert len(factors) == length and math.prod(factors) == n


def test_prime_dimension_warns_and_uses_factor_one():
    with pytest.warns(UserWarning, match="prime factors"):
        assert factorize(509, 2) == (509, 1)


def test_bond_solver_reference_examples():
    assert solve_bond(512, 512, 0.07) == 14
    assert solve_bond(512, 1365, 0.005) == 2
    assert TensorChainLinear(512, 512, ratio=0.07).bond == 14
    layer = TensorChainLinear(512, 1365, ratio=0.005)
    assert sum(c.numel() for c in layer.cores) == 3616
    assert n_params(TensorChainLinear(512, 512, ratio=0.07)) == 17920 + 512


def test_bond_solver_longer_chains_meet_the_ratio():
    for length in (3, 4):
        bond = solve_bond(512, 2048, 0.05, length)
        ins, outs = factorize(512, length), factorize(2048, length)
        assert tc_param_count(ins, outs, bond) <= 0.05 * 512 * 2048
        assert tc_param_count(ins, outs, bond + 1) > 0.05 * 512 * 2048


@pytest.mark.parametrize("length", [2, 3, 4])
@pytest.mark.parametrize("mode", ["materialise", "contract"])
def test_every_core_gets_a_gradient(length, mode):
    torch.manual_seed(0)
    layer = TensorChainLinear(96, 120, bond=3, length=length, forward_mode=mode)
    layer(torch.randn(5, 96)).pow(2).sum().backward()
    for core in layer.cores:
        assert core.grad is not None and core.grad.abs().sum() > 0
    assert layer.bias.grad is not None


@pytest.mark.parametrize("length", [2, 3, 4])
def test_contraction_equals_materialised_weight(length):
    torch.manual_seed(0)
    layer = TensorChainLinear(96, 120, bond=4, length=length)
    nn.init.normal_(layer.bias)
    x = torch.randn(2, 3, 96)
    dense = x @ layer.full_weight() + layer.bias
    layer.forward_mode = "contract"
    assert torch.allclose(layer(x), dense, atol=1e-5)
    layer.forward_mode = "materialise"
    assert torch.allclose(layer(x), dense, atol=1e-5)
    assert torch.allclose(layer.to_dense()(x), dense, atol=1e-5)


@pytest.mark.parametrize("n_in,n_out", [(96, 120), (120, 96)])
def test_two_core_contraction_both_orders_match_dense_with_gradients(n_in, n_out):
    """contract_pair picks a different core order for these two shapes (fewer copied elements:
    first core first for 96 -> 120, last core first for 120 -> 96); output and every gradient
    must equal those of the materialised weight."""
    from slim_fairseq.modules.tensor_chain import contract_pair
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=4)
    (a1, a2), (c1, c2), b = layer.in_factors, layer.out_factors, layer.bond
    first_core_first = a1 * a2 + a2 * b * c1 <= a1 * b * c2 + c1 * c2
    assert first_core_first == (n_in < n_out)
    x = torch.randn(7, n_in, requires_grad=True)
    grad = torch.randn(7, n_out)
    results = []
    for fn in (lambda: contract_pair(x, *layer.cores), lambda: x @ layer.full_weight()):
        y = fn()
        y.backward(grad)
        results.append([y.detach()] + [t.grad.clone() for t in (x, *layer.cores)])
        for t in (x, *layer.cores):
            t.grad = None
    for got, want in zip(*results):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("n_in,n_out", [(512, 1365), (1365, 512)])
def test_two_core_contraction_in_row_blocks_equals_one_pass(n_in, n_out):
    """On the CPU the chain's forward and its backward run over blocks of rows (the Anthe
    feed-forward shapes, both core orders, a last block shorter than the others): same output and
    gradients as one pass, and the autocast dtype of one pass."""
    from slim_fairseq.modules.tc_autograd import ChainContraction, pair_backward, pair_backward_rows
    from slim_fairseq.modules.tensor_chain import contract_pair, contract_pair_rows, row_block
    torch.manual_seed(0)
    first, last = TensorChainLinear(n_in, n_out, bond=2).cores
    x = torch.randn(700, n_in)
    grad = torch.randn(700, n_out)
    with torch.no_grad():
        rows = row_block(x, first, last)
        assert rows is not None and 700 % rows and 700 // rows >= 2  # several blocks, a short last one
        assert torch.allclose(contract_pair(x, first, last), contract_pair_rows(x, first, last), atol=1e-5)
        for got, want in zip(pair_backward(x, first, last, grad), pair_backward_rows(x, first, last, grad)):
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert row_block(x[:rows], first, last) is None  # one block: one pass
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert contract_pair(x, first, last).dtype == torch.bfloat16
            assert pair_backward(x, first, last, grad.bfloat16())[1].dtype == torch.bfloat16
    # recorded by autograd (--tc-backward store), the contraction runs in one pass ...
    leaf = x.clone().requires_grad_()
    assert row_block(leaf, first, last) is None
    # ... and through the memory-lean function, forward and backward run in blocks
    y = ChainContraction.apply(leaf, first, last)
    y.backward(grad)
    assert torch.allclose(leaf.grad, pair_backward_rows(x, first.detach(), last.detach(), grad)[0], atol=1e-4)


@pytest.mark.parametrize("shape,ratio", [((512, 512), 0.07), ((512, 1365), 0.005),
                                         ((1365, 512), 0.005)])
def test_materialised_std_matches_dense_init(shape, ratio):
    torch.manual_seed(0)
    dense_std = nn.Linear(*shape).weight.std().item()
    tc_std = TensorChainLinear(*shape, ratio=ratio).full_weight().std().item()
    assert abs(tc_std - dense_std) / dense_std < 0.2, (tc_std, dense_std)


@pytest.mark.parametrize("length", [2, 3, 4])
def test_from_dense_full_bond_is_exact(length):
    torch.manual_seed(0)
    dense = nn.Linear(48, 60)
    pairs = [a * c for a, c in zip(factorize(48, length), factorize(60, length))]
    # full bond: the largest rank any unfolding (left pairs x right pairs) can have
    full_bond = max(min(math.prod(pairs[:i]), math.prod(pairs[i:])) for i in range(1, length))
    tc = TensorChainLinear.from_dense(dense, bond=full_bond, length=length)
    assert (tc.to_dense().weight - dense.weight).abs().max() < 1e-5
    assert torch.equal(tc.bias, dense.bias)
    x = torch.randn(4, 48)
    assert (tc(x) - dense(x)).abs().max() < 1e-5


def test_from_dense_truncation_is_best_rank_approximation():
    torch.manual_seed(0)
    weight = torch.randn(64, 64)
    errors = [(TensorChainLinear.from_dense(weight, bond=b).weight - weight).norm().item()
              for b in (2, 8, 32)]
    assert errors[0] > errors[1] > errors[2] > 0


@pytest.mark.parametrize("length", [2, 3, 4])
def test_chain_lengths_train(length):
    """Plain gradient descent on a regression task lowers the loss for every chain length."""
    torch.manual_seed(0)
    target = nn.Linear(64, 72)
    layer = TensorChainLinear(64, 72, bond=4, length=length)
    x = torch.randn(256, 64)
    with torch.no_grad():
        y = target(x)
    losses = []
    for _ in range(60):
        layer.zero_grad()
        loss = F.mse_loss(layer(x), y)
        loss.backward()
        with torch.no_grad():
            for p in layer.parameters():
                p -= 0.5 * p.grad
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses[::10]


def test_auto_forward_mode_picks_by_shape():
    layer = TensorChainLinear(512, 32000, bond=8)
    assert layer.use_contraction(1)
    assert not TensorChainLinear(512, 512, bond=14).use_contraction(4096)


@pytest.mark.parametrize("length", [2, 3])
def test_tc_embedding_rows_and_padding(length):
    torch.manual_seed(0)
    emb = TensorChainEmbedding(600, 48, padding_idx=1, ratio=0.1, length=length)
    tokens = torch.tensor([[1, 5, 599], [0, 1, 300]])
    rows = emb(tokens)
    table = emb.weight
    assert rows.shape == (2, 3, 48)
    assert torch.allclose(rows, table[tokens], atol=1e-6)
    assert rows[0, 0].abs().sum() == 0 and rows[1, 1].abs().sum() == 0
    assert n_params(emb) < 0.1 * 600 * 48 + 1
    rows.sum().backward()
    assert all(c.grad is not None and c.grad.abs().sum() > 0 for c in emb.cores)
    std = table[torch.arange(600) != 1].std().item()
    assert abs(std - 48 ** -0.5) / 48 ** -0.5 < 0.2


# ---------------------------------------------------------------------------------- GLU


def test_glu_projection_formula_and_width():
    assert glu_hidden_dim(2048) == 1365
    torch.manual_seed(0)
    for activation, act in (("silu", F.silu), ("gelu", F.gelu), ("relu", F.relu)):
        glu = GLUProjection(16, glu_hidden_dim(48), activation)
        x = torch.randn(3, 16)
        expected = act(x @ glu.w1.weight.t() + glu.w1.bias) * (x @ glu.w3.weight.t() + glu.w3.bias)
        assert glu(x).shape == (3, 32)
        assert torch.allclose(glu(x), expected, atol=1e-6)
    with pytest.raises(AssertionError):  # --activation-fn's rule refuses it (slim_options.py)
        GLUProjection(16, 32, "tanh")
    assert glu_hidden_dim(48, "full") == 48 and glu_hidden_dim(48, "two-thirds") == 32


def test_glu_with_tensor_chain():
    glu = GLUProjection(512, 1365, chain=ChainSpec(0.005))
    assert n_params(glu) == 2 * (3616 + 1365)


# ------------------------------------------------------------------------ gated attention


def _weights(proj, dim):
    if proj is None:
        return torch.eye(dim), torch.zeros(dim)
    return proj.weight, proj.bias


def _reference_attention(mha, query, key, value, attn_mask=None, key_padding_mask=None):
    """docs/TECHNIQUES.md#gated-pre-attention written out directly: slot inputs, projections, gate, per-head softmax."""
    d, h = mha.embed_dim, mha.num_heads
    wq, bq = _weights(mha.q_proj, d)
    wk, bk = _weights(mha.k_proj, d)
    wv, bv = _weights(mha.v_proj, d)
    inputs = {"q": query, "k": key, "v": value}
    weights = {"q": (wq, bq), "k": (wk, bk), "v": (wv, bv)}

    def proj(name, x):
        w, b = weights[name]
        return x @ w.t() + b

    slots = {name: proj(name, inputs[name]) for name in "qkv"}
    if mha.gate != "none":
        a, b = mha.gate[0], mha.gate[2]
        slots[a] = inputs[a]
        slots[b] = proj(b, inputs[b] * torch.sigmoid(proj(a, inputs[a])))
    q, k, v = slots["q"], slots["k"], slots["v"]  # (T, B, d)
    tq, bsz, _ = q.shape
    ts = k.shape[0]
    hd = d // h
    q = q.reshape(tq, bsz, h, hd).permute(1, 2, 0, 3)
    k = k.reshape(ts, bsz, h, hd).permute(1, 2, 0, 3)
    v = v.reshape(ts, bsz, h, hd).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if attn_mask is not None:
        scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    out = torch.softmax(scores, -1) @ v  # (B, h, T, hd)
    out = out.permute(2, 0, 1, 3).reshape(tq, bsz, d)
    return mha.out_proj(out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])  # False: the fused-kernel path
@pytest.mark.parametrize("no_patt", [False, True])
@pytest.mark.parametrize("gate", GATES)
def test_self_attention_gate_matches_formula(gate, no_patt, need_weights, causal):
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, self_attention=True, spec=AttentionSpec(gate=gate, no_patt=no_patt)).eval()
    x = torch.randn(5, 2, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    mask = None
    if causal:  # decoder: right padding and fairseq's additive future mask
        pad[1, 3:] = True
        mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    else:
        pad[1, :2] = True
    out, weights = mha(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=need_weights)
    assert (weights is None) == (not need_weights)
    expected = _reference_attention(mha, x, x, x, key_padding_mask=pad, attn_mask=mask)
    assert torch.allclose(out, expected, atol=1e-5)
    assert n_params(mha) == (1 if no_patt else 4) * (16 * 16 + 16)


def test_no_patt_qgv_is_v_times_sigmoid_q():
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(8, 1, self_attention=True, spec=AttentionSpec(gate="qgv", no_patt=True)).eval()
    x = torch.randn(4, 1, 8)
    q, k, v = mha.project_inputs(x, x, x)
    assert torch.equal(q, x) and torch.equal(k, x)
    assert torch.allclose(v, x * torch.sigmoid(x))


@pytest.mark.parametrize("gate", CROSS_GATES)
def test_cross_attention_gate_matches_formula(gate):
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, encoder_decoder_attention=True, spec=AttentionSpec(gate=gate)).eval()
    query, enc = torch.randn(3, 2, 16), torch.randn(7, 2, 16)
    out, _ = mha(query, enc, enc, static_kv=True)
    assert torch.allclose(out, _reference_attention(mha, query, enc, enc), atol=1e-5)


@pytest.mark.parametrize("gate", sorted(set(GATES) - set(CROSS_GATES)))
def test_forbidden_cross_gates_raise(gate):
    from slim_fairseq.models.slim_options import BY_DEST, check_value
    with pytest.raises(ValueError, match=r"^--cross-attn-gate=.*leaks.*; allowed: none\|kgv\|vgk$"):
        check_value(BY_DEST["cross_attn_gate"], gate)


def test_gate_none_is_fairseq_attention():
    from fairseq.modules import MultiheadAttention
    torch.manual_seed(0)
    ref = MultiheadAttention(16, 4, self_attention=True)
    torch.manual_seed(0)
    mine = SlimMultiheadAttention(16, 4, self_attention=True)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in mine.named_parameters()]
    x = torch.randn(5, 2, 16)
    assert torch.equal(ref(x, x, x)[0], mine(x, x, x)[0])


def _causal_mask(t):
    return torch.triu(torch.full((t, t), float("-inf")), 1)


@pytest.mark.parametrize("gate", ["qgv", "kgv", "vgq", "qgk"])
def test_decoder_self_attention_incremental_with_reorder(gate):
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, self_attention=True, spec=AttentionSpec(gate=gate, chain=ChainSpec(0.3))).eval()
    x = torch.randn(6, 3, 16)
    full, _ = mha(x, x, x, attn_mask=_causal_mask(6))
    state = {}
    steps = []
    for t in range(6):
        step, _ = mha(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)
        steps.append(step)
    assert torch.allclose(torch.cat(steps), full, atol=1e-5)
    # beam reorder: fairseq's reorder of the cached K/V follows the new order
    order = torch.tensor([2, 0, 1])
    mha.reorder_incremental_state(state, order)
    xr = x[:, order]
    nxt = torch.randn(1, 3, 16)
    step, _ = mha(nxt, nxt, nxt, incremental_state=state)
    seq = torch.cat([xr, nxt])
    expected, _ = mha(seq, seq, seq, attn_mask=_causal_mask(7))
    assert torch.allclose(step, expected[-1:], atol=1e-5)


@pytest.mark.parametrize("gate", CROSS_GATES)
def test_cross_attention_incremental_static_kv(gate):
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, encoder_decoder_attention=True, spec=AttentionSpec(gate=gate)).eval()
    query, enc = torch.randn(4, 2, 16), torch.randn(7, 2, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, :3] = True
    full, _ = mha(query, enc, enc, key_padding_mask=pad, static_kv=True)
    state = {}
    steps = [mha(query[t:t + 1], enc, enc, key_padding_mask=pad, incremental_state=state,
                 static_kv=True)[0] for t in range(4)]
    assert torch.allclose(torch.cat(steps), full, atol=1e-5)


@pytest.mark.parametrize("gate", ["kgv", "vgk"])
def test_cross_attention_beamable_encoder_output(gate):
    """With set_beam_size(k) the encoder output, repeated per beam, is projected once per
    sentence (fairseq's beamable enc-dec attention); results equal the unshared path."""
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, encoder_decoder_attention=True, spec=AttentionSpec(gate=gate)).eval()
    enc = torch.randn(7, 2, 16).repeat_interleave(3, dim=1)  # 2 sentences x 3 beams
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :2] = True
    pad = pad.repeat_interleave(3, dim=0)
    query = torch.randn(1, 6, 16)
    expected, _ = mha(query, enc, enc, key_padding_mask=pad, static_kv=True)
    mha.set_beam_size(3)
    state = {}
    out, _ = mha(query, enc, enc, key_padding_mask=pad, incremental_state=state, static_kv=True)
    assert mha._get_input_buffer(state)["prev_key"].shape[0] == 2
    assert torch.allclose(out, expected, atol=1e-5)


def test_tc_patt_projection_counts():
    mha = SlimMultiheadAttention(512, 8, self_attention=True, spec=AttentionSpec(gate="qgv", chain=ChainSpec(0.07)))
    assert n_params(mha) == 3 * 18432 + 262656
    x = torch.randn(3, 1, 512)
    out, _ = mha(x, x, x)
    out.sum().backward()
    assert all(p.grad is not None for p in mha.parameters())


# ------------------------------------------------------------------------------ H-SoftPOS


def _hsoftpos(vocab=40, dim=32, levels=2, pad=1):
    from fairseq.models.transformer import Embedding
    d_emb = hsoftpos_dims(dim, levels)[2]
    return HSoftPOSEmbedding(Embedding(vocab, d_emb, pad), dim, levels, pad, 256).eval()


def test_hsoftpos_width_and_parameter_count():
    module = _hsoftpos(vocab=32000, dim=512, levels=2)
    assert (module.d_sp, module.n_sp, module.d_emb) == (128, 128, 128)
    assert n_params(module) == 4_178_048
    out = module(torch.tensor([[5, 6, 7, 2]]))
    assert out.shape == (1, 4, 512)
    assert _hsoftpos(dim=40, levels=3)(torch.tensor([[4, 5]])).shape == (1, 2, 40)


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_hsoftpos_left_padding_invariance(levels):
    torch.manual_seed(0)
    module = _hsoftpos(levels=levels)
    alone = torch.tensor([[7, 8, 9, 10, 2]])
    batch = torch.tensor([[1, 1, 1, 7, 8, 9, 10, 2], [11, 12, 13, 14, 15, 16, 17, 2]])
    assert torch.allclose(module(alone)[0], module(batch)[0, 3:], atol=1e-6)


@pytest.mark.parametrize("levels", [2, 3])
def test_hsoftpos_incremental_equals_full_and_reorders(levels):
    torch.manual_seed(0)
    module = _hsoftpos(levels=levels)
    tokens = torch.randint(4, 40, (3, 7))
    full = module(tokens)
    state = {}
    steps = [module(tokens[:, : t + 1], incremental_state=state) for t in range(7)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    order = torch.tensor([1, 2, 0])
    module.reorder_incremental_state(state, order)
    longer = torch.cat([tokens[order], torch.randint(4, 40, (3, 1))], dim=1)
    step = module(longer, incremental_state=state)
    assert torch.allclose(step, module(longer)[:, -1:], atol=1e-5)


def test_hsoftpos_stores_its_cache_once_and_updates_it_in_place(monkeypatch):
    """The convolution inputs live in one dict the incremental state holds: stored at the first
    step, updated in place at the others (fairseq's key lookup and store cost Python a step)."""
    torch.manual_seed(0)
    module = _hsoftpos(levels=3)
    tokens = torch.randint(4, 40, (2, 5))
    stored = []
    real = HSoftPOSEmbedding.set_incremental_state
    monkeypatch.setattr(HSoftPOSEmbedding, "set_incremental_state",
                        lambda self, state, key, value: stored.append(key) or real(self, state, key, value))
    state = {}
    steps = [module(tokens[:, : t + 1], incremental_state=state) for t in range(5)]
    assert stored == ["conv_inputs"]
    assert torch.allclose(torch.cat(steps, dim=1), module(tokens), atol=1e-5)


def test_hsoftpos_is_causal():
    torch.manual_seed(0)
    module = _hsoftpos(levels=3)
    a = torch.randint(4, 40, (1, 9))
    b = a.clone()
    b[0, 6] = (a[0, 6] + 1 - 4) % 36 + 4
    assert torch.allclose(module(a)[0, :6], module(b)[0, :6])
    assert not torch.allclose(module(a)[0, 6:], module(b)[0, 6:])


def _aten_ops(fn):
    """Names of the aten ops ``fn()`` dispatches (as they reach the backend)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return names


def test_hsoftpos_convolutions_run_as_matrix_products():
    """The full pass and every incremental step run H-SoftPOS's convolutions as matrix products
    over windows of taps, never as a convolution kernel: on CUDA a convolution follows cuDNN's
    TF32 switch (on by default) with other algorithms for a sequence and for one step, and
    step-by-step decoding differed from the full pass by 4e-4 nats in fp32; matrix products
    follow torch.backends.cuda.matmul (fp32 by default). Same values as nn.Conv1d."""
    torch.manual_seed(0)
    module = _hsoftpos(levels=3).eval()
    tokens = torch.randint(4, 40, (2, 6))
    state = {}
    with torch.no_grad():
        ops = _aten_ops(lambda: module(tokens))
        for t in range(6):
            ops += _aten_ops(lambda: module(tokens[:, : t + 1], incremental_state=state))
        assert not [op for op in ops if "conv" in op]
        assert {"aten::addmm", "aten::mm"} & set(ops)
        # the windows give nn.Conv1d's causal convolution
        x = torch.randn(2, 6, module.convs[0].in_channels)
        from slim_fairseq.modules.hsoftpos import KERNEL_SIZE, causal_conv
        conv, dilation = module.convs[1], module.dilations[1]
        x = torch.randn(2, 6, conv.in_channels)
        padded = torch.nn.functional.pad(x.transpose(1, 2), ((KERNEL_SIZE - 1) * dilation, 0))
        torch.testing.assert_close(causal_conv(conv, x, dilation), conv(padded).transpose(1, 2),
                                   atol=1e-6, rtol=1e-5)


def test_chain_builds_its_weight_once_for_decoding(monkeypatch):
    """In eval mode without gradients a Tensor-Chain linear multiplies by W built once and
    reused while the cores are unchanged; a modified core, another dtype or training mode
    rebuild it (training at every call)."""
    import slim_fairseq.modules.tensor_chain as tensor_chain
    built = []
    real = tensor_chain.materialise
    monkeypatch.setattr(tensor_chain, "materialise", lambda cores: built.append(1) or real(cores))
    torch.manual_seed(0)
    layer = TensorChainLinear(16, 24, bond=3, forward_mode="materialise").eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        first = layer(x)
        for _ in range(3):
            torch.testing.assert_close(layer(x), first)
        assert len(built) == 1
        layer.cores[0].mul_(2)  # a parameter changed in place: rebuilt
        torch.testing.assert_close(layer(x), x @ real(list(layer.cores)) + layer.bias)
        assert len(built) == 2
        assert layer.double()(x.double()).dtype == torch.float64 and len(built) == 3
    layer.float().train()
    assert layer._inference_weight is None  # training mode drops it
    layer(x).sum().backward()
    layer(x)
    assert len(built) == 5 and layer._inference_weight is None


@pytest.mark.parametrize("bias", [True, False])
def test_chain_decoding_step_reads_parameters_from_their_dicts(monkeypatch, bias):
    """A decoding step of a chain (W kept) reads its cores and bias without nn.Module's
    ``__getattr__`` or ParameterList's indexing, which cost more Python than its one F.linear;
    the result is the same."""
    torch.manual_seed(0)
    layer = TensorChainLinear(16, 24, bond=3, bias=bias, forward_mode="materialise").eval()
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        first = layer(x)  # builds W
        slow = []
        real_getattr, real_getitem = nn.Module.__getattr__, nn.ParameterList.__getitem__
        monkeypatch.setattr(nn.Module, "__getattr__",
                            lambda self, name: slow.append(name) or real_getattr(self, name))
        monkeypatch.setattr(nn.ParameterList, "__getitem__",
                            lambda self, idx: slow.append(idx) or real_getitem(self, idx))
        again = layer(x)
    assert slow == []
    expected = x @ layer.full_weight() + (layer.bias if bias else 0)
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(again, first)


def test_chain_decoding_step_answer_follows_mode_rows_and_data(monkeypatch):
    """A decoding step's kept answer (multiply by the kept W, or contract) is asked again when
    --tc-forward, the number of rows or a core's data changes."""
    import slim_fairseq.modules.tensor_chain as tensor_chain
    contracted = []
    real = tensor_chain.contract_input
    monkeypatch.setattr(tensor_chain, "contract_input",
                        lambda x, cores: contracted.append(x.shape[0]) or real(x, cores))
    torch.manual_seed(0)
    layer = TensorChainLinear(16, 24, bond=3, forward_mode="materialise").eval()
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        layer(x)
        layer.forward_mode = "contract"
        torch.testing.assert_close(layer(x), x @ layer.full_weight() + layer.bias)
        assert contracted == [1]
        wide = TensorChainLinear(512, 32000, bond=8).eval()  # contracts one row, not 4,096
        assert wide.use_contraction(1) and not wide.use_contraction(4096)
        wide(torch.randn(1, 512))
        assert contracted == [1, 1]
        wide(torch.randn(4096, 512))
        assert contracted == [1, 1]
        layer.forward_mode = "materialise"
        layer(x)
        version = layer.cores[1]._version
        layer.cores[1].data = torch.randn_like(layer.cores[1])  # new data, same version
        assert layer.cores[1]._version == version
        torch.testing.assert_close(layer(x), x @ layer.full_weight() + layer.bias)


def test_frozen_chain_keeps_its_weight_and_passes_input_gradients(monkeypatch):
    """In eval mode with gradients recorded but frozen cores (a gradient wanted for the input
    only), a chain multiplies by W built once, as in decoding, and the input's gradient is
    the dense layer's."""
    import slim_fairseq.modules.tensor_chain as tensor_chain
    built = []
    real = tensor_chain.materialise
    monkeypatch.setattr(tensor_chain, "materialise", lambda cores: built.append(1) or real(cores))
    torch.manual_seed(0)
    layer = TensorChainLinear(16, 24, bond=3, forward_mode="materialise").eval()
    layer.cores.requires_grad_(False)
    weight = real(list(layer.cores))
    for _ in range(3):
        x = torch.randn(2, 3, 16, requires_grad=True)
        y = layer(x)
        torch.testing.assert_close(y, x @ weight + layer.bias)
        y.square().sum().backward()
        torch.testing.assert_close(x.grad, (2 * y.detach()) @ weight.t())
    assert len(built) == 1


def test_anthe_decoding_builds_each_chain_once(monkeypatch):
    """Generation-sized steps of an Anthe model build every Tensor-Chain weight once, not once
    per step (the policy picks the built weight on CUDA; forced here on the CPU)."""
    import slim_fairseq.modules.tensor_chain as tensor_chain
    from helpers import build
    _, task, model = build("anthe_base", ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                                          "--encoder-layers", "1", "--decoder-layers", "2",
                                          "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                                          "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
                                          "--tc-forward", "materialise"], lm=False)
    model.eval()
    chains = [m for m in model.modules() if isinstance(m, TensorChainLinear)]
    built = []
    real = tensor_chain.materialise
    monkeypatch.setattr(tensor_chain, "materialise", lambda cores: built.append(1) or real(cores))
    src = torch.randint(4, len(task.source_dictionary), (2, 5))
    prev = torch.randint(4, len(task.target_dictionary), (2, 6))
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.tensor([5, 5]))
        state = {}
        for t in range(6):
            model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
    assert chains and len(built) == len(chains)


def test_chains_of_one_shape_build_their_weights_together(monkeypatch):
    """In training, the query, key and value chains of an attention (one shape) build their
    weights in one batched product; outputs and gradients are those of building each alone."""
    import contextlib
    import slim_fairseq.modules.attention as attention
    import slim_fairseq.modules.tensor_chain as tensor_chain
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, self_attention=True, spec=AttentionSpec(gate="qgv", chain=ChainSpec(0.3)))
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
        proj.forward_mode = "materialise"
    x = torch.randn(5, 2, 16)
    calls = []
    real = tensor_chain.ChainWeights.apply
    monkeypatch.setattr(tensor_chain.ChainWeights, "apply",
                        lambda count, *cores: calls.append(count) or real(count, *cores))

    def run():
        out, _ = mha(x, x, x, need_weights=False)
        return out, torch.autograd.grad(out.square().sum(), list(mha.parameters()))

    together = run()
    assert calls == [3]
    monkeypatch.setattr(attention, "built_together", lambda *a: contextlib.nullcontext())
    alone = run()
    assert calls == [3]
    torch.testing.assert_close(together[0], alone[0])
    for a, b in zip(together[1], alone[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
