"""Gated pre-attention ("XgY"; Anthe, arXiv:2305.10991; docs/TECHNIQUES.md#gated-pre-attention,
#cross-attention-gates).

Gate ``AgB`` (A, B in {q, k, v}, C the third), with W_A, W_B, W_C the pre-attention
projections (no extra parameters):

    B_s = W_B(B * sigmoid(W_A A))      A_s = A      C_s = W_C C

then ordinary scaled-dot-product attention on (Q_s, K_s, V_s) and the (dense, ungated) output
projection. The attention module that applies the gates is
:class:`~slim_fairseq.modules.attention.SlimMultiheadAttention`.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from slim_fairseq.modules.gate_function import gated
from slim_fairseq.modules.tc_autograd import (as_dtype, forward_autocast, refuse_double_backward,
                                              remember_autocast)
from slim_fairseq.modules.tensor_chain import TensorChainLinear

GATES = ("none", "qgv", "kgv", "vgq", "vgk", "qgk", "kgq")
# in cross-attention Q comes from the target and K, V from the source: only gates whose two
# inputs sit on the same side are defined for S != T, and only they cannot leak the future
CROSS_GATES = ("none", "kgv", "vgk")
CROSS_GATE_WHY = ("gates one sequence with the other position by position, which is undefined "
                  "when source and target lengths differ and leaks future target tokens")
# with identity projections (--no-patt) a self-attention's q, k and v are all its input x, so a
# gate is decided by what it gates: these names are the same model as the one they map to
SAME_UNDER_NO_PATT = {"kgv": "qgv", "kgq": "vgq", "qgk": "vgk"}


class GatedLinear(torch.autograd.Function):
    """``(x * gate) @ w + bias`` (``w`` [in, out]) keeping ``x`` and ``gate`` (which the gate and
    the other projections keep anyway), not their product; the product is recomputed for the
    weight gradient. As few ops each way as :class:`~.tc_autograd.MaterialisedLinear`: no
    reshapes, the weight's gradient one ``tensordot`` over the leading dimensions, no casts of
    tensors already in their dtype. Same results as autograd through ``addmm``."""

    @staticmethod
    def forward(ctx, x, gate, w, bias):
        remember_autocast(ctx, x)
        ctx.save_for_backward(x, gate, w)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return F.linear(x * gate, w.t(), bias)

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("gated attention projection")
        x, gate, w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        lead = tuple(range(grad.dim() - 1))
        grad_x = grad_gate = grad_w = grad_bias = None
        with forward_autocast(ctx):
            if needs[0] or needs[1]:
                grad_xg = torch.matmul(grad, w.t())
                if needs[0]:
                    grad_x = as_dtype(grad_xg * gate, x.dtype)
                if needs[1]:
                    grad_gate = as_dtype(grad_xg * x, gate.dtype)
            if needs[2]:
                grad_w = as_dtype(torch.tensordot(x * gate, grad, dims=(lead, lead)), w.dtype)
        if ctx.bias_dtype is not None and needs[3]:
            grad_bias = as_dtype(grad.sum(lead), ctx.bias_dtype)
        return grad_x, grad_gate, grad_w, grad_bias


def gated_projection(proj, x, gate):
    """``proj(x * gate)`` for a gate's target projection (None = identity). A dense or
    materialising Tensor-Chain projection in training runs as :class:`GatedLinear`."""
    if proj is None:
        return gated(proj, x, gate)
    if torch.is_grad_enabled() and x.shape == gate.shape and x.dtype == gate.dtype:
        if type(proj) is nn.Linear:
            return GatedLinear.apply(x, gate, proj.weight.t(), proj.bias)
        rows = x.numel() // x.shape[-1]
        if isinstance(proj, TensorChainLinear) and not proj.use_contraction(rows):
            return GatedLinear.apply(x, gate, proj.full_weight(), proj.bias)
    return gated(proj, x, gate)
