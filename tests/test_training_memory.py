"""Memory-lean autograd: the custom Functions keep fewer tensors for backward and
give autograd's results (gradcheck in float64, comparisons with the plain formulas)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import load_plugin

load_plugin()

from slim_fairseq.modules.dropout import SlimDropout  # noqa: E402
from slim_fairseq.modules.gated_attention import GatedLinear, gated_projection  # noqa: E402
from slim_fairseq.modules.glu import (  # noqa: E402
    GLU_ACTIVATIONS,
    ChainGLU,
    ChainGLUSpec,
    GatedActivation,
    GLUProjection,
)
from slim_fairseq.modules.tc_autograd import ChainContraction  # noqa: E402
from slim_fairseq.modules.tensor_chain import (  # noqa: E402
    TensorChainLinear,
    contract_input,
    first_core_first,
)
from slim_fairseq.specs import ChainSpec  # noqa: E402


def saved_bytes(fn, exclude=()):
    """Run ``fn()`` and return (result, bytes of the distinct storages autograd keeps for
    backward, leaving out the storages of the tensors in ``exclude``)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def grads_of(out, tensors, grad):
    return torch.autograd.grad(out, tensors, grad)


# --------------------------------------------------------------------- chain contraction

CHAINS = [(12, 20, 2, 3), (20, 12, 2, 3), (24, 30, 3, 2), (16, 36, 4, 2)]


@pytest.mark.parametrize("n_in,n_out,length,bond", CHAINS)
def test_chain_contraction_gradcheck(n_in, n_out, length, bond):
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=bond, length=length).double()
    if length == 2:  # both core orders are covered
        assert first_core_first(*layer.cores) == (n_in < n_out)
    cores = [c.detach().requires_grad_() for c in layer.cores]
    x = torch.randn(5, n_in, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *c: ChainContraction.apply(x, *c), (x, *cores))


@pytest.mark.parametrize("n_in,n_out,length,bond", CHAINS)
def test_contract_mode_equals_materialised_weight_with_gradients(n_in, n_out, length, bond):
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=bond, length=length, forward_mode="contract")
    nn.init.normal_(layer.bias)
    x = torch.randn(2, 4, n_in, requires_grad=True)
    grad = torch.randn(2, 4, n_out)
    tensors = [x, *layer.cores, layer.bias]
    got = grads_of(layer(x), tensors, grad)
    want = grads_of(x @ layer.full_weight() + layer.bias, tensors, grad)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)
    assert torch.allclose(layer(x), x @ layer.full_weight() + layer.bias, atol=1e-5)


@pytest.mark.parametrize("n_in,n_out,length,bond", CHAINS)
def test_chain_contraction_keeps_only_the_input(n_in, n_out, length, bond):
    """Plain autograd through contract_input keeps the chain's intermediates (several times
    the input); the Function keeps the input alone (the cores are parameters)."""
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=bond, length=length, forward_mode="contract")
    x = torch.randn(64, n_in, requires_grad=True)
    _, lean = saved_bytes(lambda: layer(x), exclude=[*layer.cores, layer.bias])
    _, plain = saved_bytes(lambda: contract_input(x, list(layer.cores)), exclude=layer.cores)
    assert lean == x.numel() * x.element_size()
    assert plain > 2 * lean


def test_chain_contraction_refuses_double_backward():
    layer = TensorChainLinear(12, 20, bond=3, forward_mode="contract")
    x = torch.randn(5, 12, requires_grad=True)
    with pytest.raises(RuntimeError, match="gradients of gradients"):
        torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    layer.forward_mode = "materialise"  # the way out the message names
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    gx.sum().backward()
    assert layer.cores[0].grad is not None


@pytest.mark.parametrize("n_in,n_out", [(96, 120), (120, 96)])
def test_chain_contraction_under_bf16_autocast(n_in, n_out):
    """CPU stand-in for mixed-precision CUDA training: backward runs in forward's autocast
    state; results match plain autograd through the same contraction under autocast."""
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=4, forward_mode="contract")
    x = torch.randn(16, n_in, requires_grad=True)
    tensors = [x, *layer.cores]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lean = ChainContraction.apply(x, *layer.cores)
        plain = contract_input(x, list(layer.cores))
    assert lean.dtype == plain.dtype == torch.bfloat16
    grad = torch.randn_like(lean)
    got, want = grads_of(lean, tensors, grad), grads_of(plain, tensors, grad)
    assert torch.equal(lean, plain)
    for g, w, t in zip(got, want, tensors):
        assert g.dtype == t.dtype == torch.float32
        assert torch.allclose(g, w.float(), rtol=2e-2, atol=2e-2 * w.abs().max().item())


# -------------------------------------------------------------------------------- GLU


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_chain_glu_gradcheck(activation):
    torch.manual_seed(0)
    glu = GLUProjection(12, 20, activation=activation, chain=ChainSpec(0.5)).double()
    nn.init.normal_(glu.w1.bias)
    nn.init.normal_(glu.w3.bias)
    cores1, cores3 = list(glu.w1.cores), list(glu.w3.cores)
    tensors = [t.detach().requires_grad_() for t in (glu.w1.bias, glu.w3.bias, *cores1, *cores3)]
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)

    def fn(x, b1, b3, *cores):
        return ChainGLU.apply(x, ChainGLUSpec(activation, len(cores1)), b1, b3, *cores)

    assert torch.autograd.gradcheck(fn, (x, *tensors))
    assert torch.autograd.gradcheck(lambda a, b: GatedActivation.apply(a, b, activation),
                                    (torch.randn(4, 6, dtype=torch.float64, requires_grad=True),
                                     torch.randn(4, 6, dtype=torch.float64, requires_grad=True)))


@pytest.mark.parametrize("tc_ratio", [0.0, 0.5])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_glu_projection_gradients_equal_the_formula(activation, tc_ratio):
    torch.manual_seed(0)
    glu = GLUProjection(12, 20, activation=activation, chain=ChainSpec(tc_ratio))
    if tc_ratio:
        glu.w1.forward_mode = glu.w3.forward_mode = "contract"
        assert glu._chain_contraction(6)
    x = torch.randn(2, 3, 12, requires_grad=True)
    tensors = [x, *glu.parameters()]
    grad = torch.randn(2, 3, 20)

    def weight(w):
        return w.full_weight() if tc_ratio else w.weight.t()

    want_out = GLU_ACTIVATIONS[activation](x @ weight(glu.w1) + glu.w1.bias) * (
        x @ weight(glu.w3) + glu.w3.bias)
    got_out = glu(x)
    assert torch.allclose(got_out, want_out, atol=1e-5)
    for g, w in zip(grads_of(got_out, tensors, grad), grads_of(want_out, tensors, grad)):
        assert torch.allclose(g, w, atol=1e-5)


def _tc_glu_ffn(hidden=40):
    torch.manual_seed(0)
    glu = GLUProjection(24, hidden, chain=ChainSpec(0.3))
    fc2 = TensorChainLinear(hidden, 24, ratio=0.3)
    for w in (glu.w1, glu.w3, fc2):
        w.forward_mode = "contract"
        nn.init.normal_(w.bias)
    return glu, fc2


def test_tc_glu_feed_forward_keeps_only_its_input():
    """GLU with Tensor-Chain w1, w3 followed by a Tensor-Chain fc2 (anthe_base's feed-forward):
    fc2 rebuilds the GLU output from the GLU's input in backward, so the whole block keeps
    only that input. Gradients equal those of the materialised weights."""
    glu, fc2 = _tc_glu_ffn()
    params = list(glu.parameters()) + list(fc2.parameters())
    x = torch.randn(3, 5, 24, requires_grad=True)
    out, kept = saved_bytes(lambda: fc2(glu(x)), exclude=params)
    assert kept == x.numel() * x.element_size()

    grad = torch.randn_like(out)
    w1, w3, w2 = glu.w1, glu.w3, fc2
    want = (F.silu(x @ w1.full_weight() + w1.bias) * (x @ w3.full_weight() + w3.bias)
            ) @ w2.full_weight() + w2.bias
    assert torch.allclose(out, want, atol=1e-5)
    for g, w in zip(grads_of(out, [x, *params], grad), grads_of(want, [x, *params], grad)):
        assert torch.allclose(g, w, atol=1e-5)


def test_glu_output_modified_in_place_is_kept_not_rebuilt():
    """The rebuild note is dropped once the GLU output changes in place: fc2 then keeps the
    changed tensor, and the gradients are those of the changed values."""
    glu, fc2 = _tc_glu_ffn()
    x = torch.randn(6, 24, requires_grad=True)
    hidden = glu(x)
    hidden.mul_(2.0)
    out, kept = saved_bytes(lambda: fc2(hidden), exclude=fc2.parameters())
    assert kept == hidden.numel() * hidden.element_size()
    grad = torch.randn_like(out)
    got = grads_of(out, list(fc2.cores), grad)
    want = grads_of(contract_input(hidden.detach(), list(fc2.cores)), list(fc2.cores), grad)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)


@pytest.mark.parametrize("fc2_kind", ["dense", "tc"])
def test_dense_glu_fc2_keeps_the_hidden_inputs_not_the_output(fc2_kind):
    """A dense (or materialising) GLU keeps h1 and h3 for its own backward; its fc2 (a
    RebuildingLinear, or a Tensor Chain multiplying by its full weight) keeps those instead of
    the GLU output, so the block keeps x, h1 and h3 only."""
    from slim_fairseq.modules.glu import RebuildingLinear
    from slim_fairseq.modules.tc_autograd import RecomputedInputLinear
    torch.manual_seed(0)
    glu = GLUProjection(24, 40)
    fc2 = (RebuildingLinear(40, 24) if fc2_kind == "dense"
           else TensorChainLinear(40, 24, bond=3, forward_mode="materialise"))
    params = list(glu.parameters()) + list(fc2.parameters())
    x = torch.randn(3, 5, 24, requires_grad=True)
    out, kept = saved_bytes(lambda: fc2(glu(x)), exclude=params)
    _, kept_unmarked = saved_bytes(lambda: fc2(glu(x).clone()), exclude=params)
    assert kept_unmarked - kept == 40 * 15 * 4  # the GLU output is no longer kept
    if fc2_kind == "dense":
        assert kept == (24 + 2 * 40) * 15 * 4  # x, h1, h3
    w2 = fc2.weight.t() if fc2_kind == "dense" else fc2.full_weight()
    want = F.silu(glu.w1(x)) * glu.w3(x) @ w2 + fc2.bias
    assert torch.allclose(out, want, atol=1e-5)
    grad = torch.randn_like(out)
    for g, w in zip(grads_of(out, [x, *params], grad), grads_of(want, [x, *params], grad)):
        assert torch.allclose(g, w, atol=1e-5)
    # gradcheck of the Function itself: x2d = 2 h, rebuilt from h
    h, w, b = (torch.randn(*shape, dtype=torch.float64, requires_grad=True)
               for shape in ((4, 6), (3, 6), (3,)))
    assert torch.autograd.gradcheck(
        lambda h, w, b: RecomputedInputLinear.apply(2 * h, w, b, lambda t: 2 * t, 1, h), (h, w, b))


# ------------------------------------------------------------------------- gated projection


def test_gated_linear_gradcheck():
    torch.manual_seed(0)
    args = [torch.randn(*shape, dtype=torch.float64, requires_grad=True)
            for shape in ((3, 2, 6), (3, 2, 6), (6, 5), (5,))]
    assert torch.autograd.gradcheck(GatedLinear.apply, args)


@pytest.mark.parametrize("kind", ["linear", "tc"])
def test_gated_projection_keeps_input_and_gate_not_their_product(kind):
    torch.manual_seed(0)
    proj = (nn.Linear(16, 16) if kind == "linear"
            else TensorChainLinear(16, 16, bond=3, forward_mode="materialise"))
    x = torch.randn(4, 3, 16, requires_grad=True)
    pre = torch.randn(4, 3, 16, requires_grad=True)

    def lean():
        gate = torch.sigmoid(pre)
        return gated_projection(proj, x, gate)

    def plain():
        return proj(x * torch.sigmoid(pre))

    weights = list(proj.parameters())
    out, lean_bytes = saved_bytes(lean, exclude=[x, pre, *weights])
    want, plain_bytes = saved_bytes(plain, exclude=[x, pre, *weights])
    assert lean_bytes <= plain_bytes - x.numel() * x.element_size()
    grad = torch.randn_like(out)
    tensors = [x, pre, *weights]
    assert torch.allclose(out, want, atol=1e-6)
    for g, w in zip(grads_of(out, tensors, grad), grads_of(want, tensors, grad)):
        assert torch.allclose(g, w, atol=1e-5)


# ---------------------------------------------------------------------------------- dropout


def test_slim_dropout_equals_torch_dropout_with_a_bool_mask():
    x = torch.randn(8, 33, requires_grad=True)
    torch.manual_seed(3)
    want = F.dropout(x, 0.3, training=True)
    torch.manual_seed(3)
    got, kept = saved_bytes(lambda: SlimDropout(0.3).train()(x))
    assert kept == x.numel()  # one byte per element
    assert torch.equal(got, want)
    grad = torch.randn_like(x)
    assert torch.equal(*(grads_of(t, [x], grad)[0] for t in (got, want)))


def test_slim_dropout_off_paths():
    x = torch.randn(4, 6, requires_grad=True)
    assert SlimDropout(0.3).eval()(x) is x
    assert SlimDropout(0.0).train()(x) is x
    with torch.no_grad():
        assert SlimDropout(0.3).train()(x).shape == x.shape


# ---------------------------------------------------------------- ReLU feed-forward of chains


def test_relu_chain_feed_forward_keeps_its_input_and_a_mask():
    """fc1 (Tensor Chain, output marked) -> ReLU -> fc2 (Tensor Chain), as in the `tc` preset:
    kept are fc1's input and a one-byte ReLU mask; gradients equal the materialised weights'."""
    from slim_fairseq.modules.tc_autograd import MaskReLU, rebuildable_relu
    torch.manual_seed(0)
    fc1, fc2 = TensorChainLinear(24, 40, ratio=0.3), TensorChainLinear(40, 24, ratio=0.3)
    for w in (fc1, fc2):
        w.forward_mode = "contract"
        nn.init.normal_(w.bias)
    fc1.rebuildable_output = True
    params = [*fc1.parameters(), *fc2.parameters()]
    x = torch.randn(3, 5, 24, requires_grad=True)
    out, kept = saved_bytes(lambda: fc2(rebuildable_relu(fc1(x))), exclude=params)
    assert kept == x.numel() * x.element_size() + 3 * 5 * 40  # input + bool mask
    want = F.relu(x @ fc1.full_weight() + fc1.bias) @ fc2.full_weight() + fc2.bias
    assert torch.allclose(out, want, atol=1e-5)
    grad = torch.randn_like(out)
    for g, w in zip(grads_of(out, [x, *params], grad), grads_of(want, [x, *params], grad)):
        assert torch.allclose(g, w, atol=1e-5)
    # an unmarked input gets the plain ReLU
    fc1.rebuildable_output = False
    assert rebuildable_relu(fc1(x)).grad_fn.name() != "MaskReLUBackward"
    h = torch.randn(4, 7, dtype=torch.float64)
    h = (h + h.sign() * 0.1).requires_grad_()  # away from the kink
    assert torch.autograd.gradcheck(MaskReLU.apply, (h,))


@pytest.mark.parametrize("arch,overrides", [
    ("anthe_base", []),
    ("slim_transformer", ["--tc-ff", "0.3", "--tc-patt", "0.3", "--self-attn-gate", "qgv",
                          "--cross-attn-gate", "kgv"]),
])
def test_model_gradients_equal_the_materialised_path(arch, overrides):
    """A whole translation model: every gradient of one training step with the memory-lean
    paths (chain contraction, ChainGLU, rebuilt fc2 inputs, gated projections) equals the
    gradient with every Tensor Chain materialised (plain autograd)."""
    from helpers import build
    shape = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-layers", "2",
             "--decoder-layers", "2", "--encoder-attention-heads", "4",
             "--decoder-attention-heads", "4", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--dropout", "0"]
    _, _, model = build(arch, shape + overrides, lm=False)
    model.train()
    src = torch.randint(4, 40, (3, 7))
    prev = torch.randint(4, 40, (3, 6))

    def step(mode):
        for m in model.modules():
            if isinstance(m, TensorChainLinear):
                m.forward_mode = mode
        model.zero_grad()
        out = model(src, torch.full((3,), 7), prev)[0]
        nodes, todo = set(), [out.grad_fn]
        while todo:
            fn = todo.pop()
            if fn is not None and fn not in nodes:
                nodes.add(fn)
                todo += [next_fn for next_fn, _ in fn.next_functions]
        out.float().pow(2).mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                              if p.grad is not None}, {fn.name() for fn in nodes}

    lean_out, lean, lean_fns = step("contract")
    plain_out, plain, plain_fns = step("materialise")
    assert {"ChainContractionBackward", "RecomputedInputContractionBackward"} <= lean_fns
    assert ("ChainGLUBackward" in lean_fns) == (arch == "anthe_base")
    assert ("MaskReLUBackward" in lean_fns) == (arch != "anthe_base")
    assert "GatedLinearBackward" in plain_fns
    assert ("RecomputedInputLinearBackward" in plain_fns) == (arch == "anthe_base")
    assert torch.allclose(lean_out, plain_out, atol=1e-5)
    assert set(lean) == set(plain) and len(lean) > 10
    for name in lean:
        assert torch.allclose(lean[name], plain[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("mode", ["contract", "materialise"])
def test_lean_paths_under_activation_checkpointing_and_bf16_autocast(mode):
    """fairseq's --checkpoint-activations re-runs each layer in backward (our Functions then run
    inside its backward) and must give the same gradients; bf16 autocast training gives fp32
    gradients close to the fp32 ones."""
    from helpers import build
    shape = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-layers", "2",
             "--decoder-layers", "2", "--encoder-attention-heads", "4",
             "--decoder-attention-heads", "4", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--dropout", "0"]
    src, prev = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 6))

    def grads(extra, autocast=False):
        _, _, model = build("anthe_base", shape + extra, lm=False)
        for m in model.modules():
            if isinstance(m, TensorChainLinear):
                m.forward_mode = mode
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(src, torch.full((3,), 7), prev)[0]
        out.float().pow(2).mean().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain = grads([])
    checkpointed = grads(["--checkpoint-activations"])
    assert set(checkpointed) == set(plain)
    for name in plain:
        assert torch.allclose(checkpointed[name], plain[name], rtol=1e-5, atol=1e-7), name
    low = grads([], autocast=True)
    assert set(low) == set(plain)
    for name in plain:
        assert low[name].dtype == torch.float32 and torch.isfinite(low[name]).all(), name
    flat = torch.cat([plain[n].flatten() for n in plain])
    flat_low = torch.cat([low[n].flatten() for n in plain])
    assert (flat_low - flat).norm() < 0.1 * flat.norm()


# --------------------------------------------------------------------- --tc-backward store

def _anthe_step(extra, state=None):
    """(model, loss, gradients by name, bytes kept for backward) of one training step of a small
    anthe_base (Tensor-Chain GLU feed-forward and attention, gates, H-SoftPOS)."""
    from helpers import build
    shape = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
             "--decoder-ffn-embed-dim", "256", "--encoder-layers", "1", "--decoder-layers", "1",
             "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0"]
    _args, task, model = build("anthe_base", shape, lm=False, extra=extra)
    if state is not None:
        model.load_state_dict(state)
    model.train()
    g = torch.Generator().manual_seed(0)
    vocab = len(task.source_dictionary)
    src = torch.randint(4, vocab, (4, 30), generator=g)
    prev = torch.randint(4, vocab, (4, 30), generator=g)
    lengths = torch.full((4,), 30)
    params = [p for _, p in model.named_parameters()]
    logits, loss_bytes = saved_bytes(lambda: model(src, lengths, prev)[0], exclude=params)
    loss = logits.float().logsumexp(-1).mean()
    grads = torch.autograd.grad(loss, params)
    return model, loss, dict(zip([n for n, _ in model.named_parameters()], grads)), loss_bytes


def test_tc_backward_store_gives_the_same_step_and_keeps_more_for_backward():
    """``--tc-backward store`` (plain autograd through the chains) trades memory for the
    recomputation: same loss and gradients as the default, more bytes kept for backward."""
    lean, loss, grads, lean_bytes = _anthe_step([])
    stored, loss_s, grads_s, stored_bytes = _anthe_step(["--tc-backward", "store"], lean.state_dict())
    assert not any(m.recompute_in_backward for m in stored.modules() if isinstance(m, TensorChainLinear))
    assert all(m.recompute_in_backward for m in lean.modules() if isinstance(m, TensorChainLinear))
    assert torch.allclose(loss, loss_s, atol=1e-6)
    for name, g in grads.items():
        assert torch.allclose(g, grads_s[name], atol=1e-5, rtol=1e-4), name
    assert stored_bytes > 1.2 * lean_bytes, (stored_bytes, lean_bytes)


@pytest.mark.parametrize("argv,message", [
    (["--arch", "anthe_base", "--tc-backward", "keep"], "--tc-backward=keep: not one of the choices; allowed: auto|recompute|store"),
    (["--arch", "slim_transformer", "--tc-backward", "store"], "--tc-backward=store: shapes a Tensor Chain, which is off"),
])
def test_tc_backward_option_errors(argv, message):
    from helpers import build
    from slim_fairseq.option_errors import OptionError
    with pytest.raises(OptionError) as err:
        build(argv[1], argv[2:], lm=False)
    assert message in str(err.value)


def test_dense_glu_under_autocast_runs_one_product_for_both_halves():
    """Under autocast (which casts a copy of the weights for backward anyway) a dense GLU
    multiplies by [w1; w3] once; the output and the gradients are the two-product formula's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name in ("aten::mm", "aten::addmm", "aten::bmm"):
                Products.count += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    glu = GLUProjection(16, 24)
    x = torch.randn(3, 5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with Products():
            out = glu(x)
        want = F.silu(glu.w1(x)) * glu.w3(x)
    assert Products.count == 1
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(out)
    got = grads_of(out, [x, glu.w1.weight, glu.w3.weight], grad)
    expected = grads_of(want, [x, glu.w1.weight, glu.w3.weight], grad)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_dense_glu_recomputes_nothing_on_cuda():
    """On CUDA a dense GLU runs plain autograd (no recomputation in backward); on the CPU it
    keeps its two hidden inputs and marks its output for the consumer to rebuild."""
    from slim_fairseq.modules import tensor_chain_policy
    from slim_fairseq.modules.tc_autograd import recompute_recipe
    torch.manual_seed(0)
    glu = GLUProjection(24, 40)
    x = torch.randn(3, 5, 24, requires_grad=True)
    params = list(glu.parameters())
    out, lean = saved_bytes(lambda: glu(x), exclude=params)
    assert recompute_recipe(out) is not None
    with tensor_chain_policy.assume_target("cuda", torch.float16):
        plain, kept = saved_bytes(lambda: glu(x), exclude=params)
    assert recompute_recipe(plain) is None and kept > lean
    torch.testing.assert_close(plain, out)


def test_chain_glu_that_materialises_follows_the_dense_rule():
    """A GLU of Tensor Chains that multiply by their built weights (CUDA's choice) has the
    hidden layer of a dense GLU and follows its rule: plain autograd on CUDA, the lean path on
    the CPU; ``--tc-backward recompute`` still recomputes on CUDA."""
    from slim_fairseq.modules import tensor_chain_policy
    from slim_fairseq.modules.tc_autograd import recompute_recipe
    torch.manual_seed(0)
    glu = GLUProjection(64, 96, chain=ChainSpec(ratio=0.3))
    x = torch.randn(2, 40, 64, requires_grad=True)
    with tensor_chain_policy.assume_target("cuda", torch.float16):
        assert not glu.w1.use_contraction(80)
        plain = glu(x)
        assert recompute_recipe(plain) is None
        glu.backward_mode = "recompute"
        lean = glu(x)
        assert recompute_recipe(lean) is not None
    glu.backward_mode = "auto"
    with tensor_chain_policy.assume_target("cpu", torch.float32):
        if not glu.w1.use_contraction(80):
            assert recompute_recipe(glu(x)) is not None
    torch.testing.assert_close(plain, lean)


@pytest.mark.parametrize("module", ["gated self-attention", "chain GLU"])
def test_an_input_read_by_several_products_is_cast_once_under_autocast(module):
    """Under autocast a gated self-attention's input (read by W_A, W_C, the gate's product and
    as A itself) and a chain GLU's input (read by w1 and w3) are cast to the compute dtype
    once, not once per product; their gradients meet in that dtype and are cast back once."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from slim_fairseq.modules import tensor_chain_policy
    from slim_fairseq.modules.attention import SlimMultiheadAttention
    from slim_fairseq.specs import AttentionSpec
    torch.manual_seed(0)
    if module == "chain GLU":
        layer = GLUProjection(64, 96, chain=ChainSpec(ratio=0.3))
        x = torch.randn(2, 40, 64, requires_grad=True)
        run = lambda: layer(x)  # noqa: E731
    else:
        layer = SlimMultiheadAttention(64, 4, self_attention=True, spec=AttentionSpec(
            gate="qgv", chain=ChainSpec(ratio=0.3)))
        x = torch.randn(40, 2, 64, requires_grad=True)
        run = lambda: layer(x, x, x, need_weights=False)[0]  # noqa: E731

    class Casts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].shape == x.shape \
                    and args[0].dtype == torch.float32:
                Casts.count += 1
            return func(*args, **(kwargs or {}))
    with tensor_chain_policy.assume_target("cuda", torch.float16):
        with torch.autocast("cpu", torch.float16), Casts():
            out = run()
        assert Casts.count == 1
        out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
