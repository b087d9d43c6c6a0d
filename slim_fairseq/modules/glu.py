"""GLU feed-forward (Anthe, arXiv:2305.10991): ``w2(act(w1 x) * w3 x)`` with hidden width
``floor(2f/3)`` (docs/TECHNIQUES.md#glu-feed-forward). Without autograd the GLU is
:func:`~slim_fairseq.modules.glu_function.glu` (plain torch, the file an export copies).

:class:`GLUProjection` is the "fc1" of the GLU FFN (``act(w1 x) * w3 x``); the layer keeps
``fc2`` (= w2) as its own Linear / Tensor-Chain layer and uses the identity activation, so
fairseq's layer forward runs unchanged.

Training memory: the product is computed by :class:`GatedActivation`, which keeps the two
hidden inputs but not the activation's output (dense ``w1``, ``w3`` under autocast: the halves of
one product with the stacked weights, one launch instead of two each way); with Tensor-Chain
``w1``, ``w3`` that contract the input, :class:`ChainGLU` keeps only the input and the cores and
recomputes both hidden activations in backward (two small contractions). Both give autograd's
results.
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from slim_fairseq.modules.glu_function import GLU_ACTIVATIONS, glu  # noqa: F401 (re-exported)
from slim_fairseq.modules.tc_autograd import (chain_backward, forward_autocast, in_autocast_dtype,
                                              linear_input_of,
                                              mark_recomputable, recompute_recipe,
                                              refuse_double_backward, remember_autocast)
from slim_fairseq.modules.tc_contraction import contract_input
from slim_fairseq.modules.tensor_chain import TensorChainLinear, built_together
from slim_fairseq.modules.tensor_chain_policy import (BackwardModeMixin, device_and_autocast,
                                                      policy_for, target)
from slim_fairseq.specs import DENSE, ChainSpec



def _activation_backward(name, grad, h):
    """Gradient of ``act(h)`` for ``grad`` with autograd's own kernels."""
    if name == "silu":
        return torch.ops.aten.silu_backward(grad, h)
    if name == "relu":
        return torch.ops.aten.threshold_backward(grad, h, 0)
    return torch.ops.aten.gelu_backward(grad, h)


class GatedActivation(torch.autograd.Function):
    """``act(h1) * h3`` saving ``h1`` and ``h3`` only (``act(h1)`` is recomputed in backward)."""

    @staticmethod
    def forward(ctx, h1, h3, activation):
        ctx.activation = activation
        ctx.save_for_backward(h1, h3)
        return GLU_ACTIVATIONS[activation](h1) * h3

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("GLU")
        h1, h3 = ctx.saved_tensors
        grad_h1 = grad_h3 = None
        if ctx.needs_input_grad[1]:
            grad_h3 = grad * GLU_ACTIVATIONS[ctx.activation](h1)
        if ctx.needs_input_grad[0]:
            grad_h1 = _activation_backward(ctx.activation, grad * h3, h1)
        return grad_h1, grad_h3, None


class ChainGLUSpec:
    """Non-tensor arguments of :class:`ChainGLU`: the activation, the number of cores of W1,
    and a one-slot stash through which a consumer that rebuilt the hidden activations in its
    backward (:func:`chain_glu_value`) hands them to ChainGLU's backward, which runs next."""

    def __init__(self, activation, n1):
        self.activation, self.n1, self.stash = activation, n1, {}


class ChainGLU(torch.autograd.Function):
    """``act(x W1 + b1) * (x W3 + b3)`` with W1, W3 Tensor Chains contracted with the input
    (never built), saving only ``x2d`` and the cores; both hidden activations are recomputed
    in backward. Biases may be None."""

    @staticmethod
    def forward(ctx, x2d, spec, b1, b3, *cores):
        remember_autocast(ctx, x2d)
        ctx.spec = spec
        ctx.save_for_backward(x2d, b1, b3, *cores)
        h1, h3 = _chain_hidden(x2d, cores[:spec.n1], b1, cores[spec.n1:], b3)
        return GLU_ACTIVATIONS[spec.activation](h1) * h3

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("GLU with Tensor-Chain linears")
        x2d, b1, b3, *cores = ctx.saved_tensors
        spec, needs = ctx.spec, ctx.needs_input_grad
        cores1, cores3 = cores[:spec.n1], cores[spec.n1:]
        with forward_autocast(ctx):
            hidden = spec.stash.pop("hidden", None)
            h1, h3 = hidden if hidden is not None else _chain_hidden(x2d, cores1, b1, cores3, b3)
            del hidden
            grad_h3 = grad * GLU_ACTIVATIONS[spec.activation](h1)
            grad_h1 = _activation_backward(spec.activation, grad * h3, h1)
            del h1, h3
            need_x = needs[0]
            g1 = chain_backward(x2d, cores1, grad_h1, (need_x, *needs[4:4 + spec.n1]))
            g3 = chain_backward(x2d, cores3, grad_h3, (need_x, *needs[4 + spec.n1:]))
        grad_x = None
        if need_x:
            grad_x = (g1[0] + g3[0]).to(x2d.dtype)
        grad_b1 = grad_h1.sum(0).to(b1.dtype) if needs[2] else None
        grad_b3 = grad_h3.sum(0).to(b3.dtype) if needs[3] else None
        core_grads = [None if g is None else g.to(c.dtype)
                      for g, c in zip(list(g1[1:]) + list(g3[1:]), cores)]
        return (grad_x, None, grad_b1, grad_b3, *core_grads)


@torch.no_grad()
def gated_activation_value(activation, h1, h3):
    """The output of :class:`GatedActivation`, without autograd."""
    return GLU_ACTIVATIONS[activation](h1) * h3


class RebuildingLinear(nn.Linear):
    """``nn.Linear`` (same parameters and init) that keeps, for backward, what rebuilds its
    input when the input is marked rebuildable (a GLU output), instead of the input itself."""

    def forward(self, x):
        if recompute_recipe(x) is None or not torch.is_grad_enabled():
            return super().forward(x)
        return linear_input_of(x, self.weight, self.bias)


@torch.no_grad()
def chain_glu_value(spec, x2d, b1, b3, *cores):
    """The output of :class:`ChainGLU` for these inputs, without autograd (used to rebuild it
    in a consumer's backward); the hidden activations go to ``spec``'s stash for ChainGLU's
    backward."""
    h1, h3 = _chain_hidden(x2d, cores[:spec.n1], b1, cores[spec.n1:], b3)
    spec.stash["hidden"] = (h1, h3)
    return GLU_ACTIVATIONS[spec.activation](h1) * h3


def _chain_hidden(x2d, cores1, b1, cores3, b3):
    h1 = contract_input(x2d, list(cores1))
    h3 = contract_input(x2d, list(cores3))
    if b1 is not None:
        h1 = h1 + b1
    if b3 is not None:
        h3 = h3 + b3
    return h1, h3


GLU_HIDDEN_RULES = ("two-thirds", "full")


def glu_hidden_dim(ffn_dim, rule="two-thirds"):
    """Hidden width of a GLU FFN for ``--*-ffn-embed-dim f`` (``--glu-hidden``): ``two-thirds``
    = floor(2f/3), the parameters of a plain FFN of width f (1365 for 2048; Anthe); ``full`` = f
    (STLM, LLaMA-style shapes)."""
    assert rule in GLU_HIDDEN_RULES, rule  # (the options' rule: --glu-hidden's choices)
    return ffn_dim if rule == "full" else (2 * ffn_dim) // 3


def build_linear(in_features, out_features, chain: ChainSpec = DENSE, bias=True,
                 rebuild_input=False):
    """Dense ``nn.Linear`` or the Tensor-Chain layer ``chain`` describes
    (docs/TECHNIQUES.md#tensor-chain). ``rebuild_input``: a dense layer is a
    :class:`RebuildingLinear` (a GLU's fc2)."""
    if chain.ratio:
        return TensorChainLinear(in_features, out_features, ratio=chain.ratio,
                                 length=chain.length, bias=bias, min_bond=chain.min_bond)
    return (RebuildingLinear if rebuild_input else nn.Linear)(in_features, out_features, bias=bias)


class GLUProjection(BackwardModeMixin, nn.Module):
    """``act(w1 x) * w3 x`` (biases unless ``bias=False``); activation silu (SwiGLU, the Anthe
    reference code and STLM), gelu (GEGLU, the Anthe paper's text) or relu (ReGLU)."""

    def __init__(self, in_features, hidden_features, activation="silu",
                 chain: ChainSpec = DENSE, bias=True):
        super().__init__()
        assert activation in GLU_ACTIVATIONS, activation  # (the options' rule: a gated form)
        self.in_features = in_features
        self.out_features = hidden_features
        self.activation = activation
        self.w1 = build_linear(in_features, hidden_features, chain, bias=bias)
        self.w3 = build_linear(in_features, hidden_features, chain, bias=bias)

    def extra_repr(self):
        return f"activation={self.activation}"

    def forward(self, x):
        if not torch.is_grad_enabled():
            return glu(x, self.w1, self.w3, self.activation)
        act = GLU_ACTIVATIONS[self.activation]
        rows = x.numel() // self.in_features
        recompute = self.recompute_in_backward
        if recompute and self._chain_contraction(rows):
            x2d = x.reshape(rows, self.in_features)
            cores1, cores3 = list(self.w1.cores), list(self.w3.cores)
            spec = ChainGLUSpec(self.activation, len(cores1))
            out = ChainGLU.apply(x2d, spec, self.w1.bias, self.w3.bias, *cores1, *cores3)
            out = out.reshape(*x.shape[:-1], self.out_features)
            # a Tensor-Chain fc2 may keep x2d instead of this (wider) output
            return mark_recomputable(out, functools.partial(chain_glu_value, spec),
                                     x2d, self.w1.bias, self.w3.bias, *cores1, *cores3)
        if self._stack_weights(x):
            # one product for both hidden halves: [w1; w3] x; under autocast, which casts a copy
            # of the weights for backward anyway (in fp32 the stack would be a copy of its own)
            weight = torch.cat([self.w1.weight, self.w3.weight])
            bias = None if self.w1.bias is None else torch.cat([self.w1.bias, self.w3.bias])
            h1, h3 = F.linear(x, weight, bias).chunk(2, dim=-1)
        else:
            x = in_autocast_dtype(x)  # (one cast for both linears)
            with built_together((self.w1, self.w3), rows, x):
                h1, h3 = self.w1(x), self.w3(x)
        if not self._recompute_activation(recompute):
            # plain autograd: keeps act(h1) and the output too, recomputes nothing
            return act(h1) * h3
        # GatedActivation keeps h1, h3 anyway: a consumer may keep them instead of the output
        return mark_recomputable(GatedActivation.apply(h1, h3, self.activation),
                                 functools.partial(gated_activation_value, self.activation),
                                 h1, h3)

    def _recompute_activation(self, recompute):
        """Whether a GLU whose linears multiply by their weights (dense, or chains that
        materialise W) keeps only its two hidden inputs and recomputes its output in backward:
        ``recompute`` where ``--tc-backward`` is given; for auto, the device's rule for a dense
        GLU (``recompute_dense``), since the hidden layer is the same whether the weights are
        parameters or built from chains (``recompute_backward`` is about the chains' own
        contraction, which this path does not run)."""
        if self.backward_mode != "auto":
            return recompute
        param = next(self.parameters(), None)
        return param is None or policy_for(*target(param)).recompute_dense

    def _stack_weights(self, x):
        """Whether both linears are dense and autocast is on for ``x``'s device."""
        return (type(self.w1) is nn.Linear and type(self.w3) is nn.Linear
                and device_and_autocast(x)[1] is not None)

    def _chain_contraction(self, rows):
        """Both linears are Tensor Chains that contract the input for this many rows."""
        return all(isinstance(w, TensorChainLinear) and w.use_contraction(rows)
                   for w in (self.w1, self.w3))
