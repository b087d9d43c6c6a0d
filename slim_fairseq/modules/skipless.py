"""Initialisation of skipless blocks (He & Hofmann, arXiv:2311.01906;
docs/TECHNIQUES.md#skipless-transformers). With no residual to carry the signal and no norm to
rescale it, every part starts so that it keeps the second moment of its input:

* token table rows of unit norm (every token enters with RMS 1 after the sqrt(d) scale; rows
  of norm sqrt(d) under ``--no-scale-embedding``);
* feed-forward input linears N(0, 1/d), the output linear N(0, 1/(f E[act(z)^2])) for
  z ~ N(0, 1);
* shaped attention (identity at init): :meth:`SlimMultiheadAttention.reset_shaped_parameters`.

The block itself is :class:`~slim_fairseq.models.slim_layers.SkiplessDecoderLayer`.
"""
import functools
import math

import torch
import torch.nn as nn

from slim_fairseq.modules.activations import activation_function
from slim_fairseq.modules.glu import GLUProjection
from slim_fairseq.modules.tensor_chain import TensorChainLinear


@functools.lru_cache(maxsize=None)
def activation_second_moment(name):
    """E[act(z)^2] for z ~ N(0, 1), by the trapezoid rule on [-12, 12] (deterministic; on the
    CPU even while a model is built on the meta device)."""
    z = torch.linspace(-12.0, 12.0, 24001, dtype=torch.float64, device="cpu")
    density = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return torch.trapezoid(activation_function(name)(z) ** 2 * density, z).item()


def normal_init_(linear, std):
    """N(0, std) weight and zero bias of a dense or Tensor-Chain linear (a chain: its
    materialised weight has that std)."""
    if isinstance(linear, TensorChainLinear):
        linear.init_std = std
        linear.reset_parameters()
        return
    nn.init.normal_(linear.weight, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def init_skipless_feed_forward(fc1, fc2, activation):
    """Second-moment-preserving init of a feed-forward ``fc2(act(fc1 x))`` or GLU (``fc1`` a
    :class:`GLUProjection`)."""
    inputs = [fc1.w1, fc1.w3] if isinstance(fc1, GLUProjection) else [fc1]
    for linear in inputs:
        normal_init_(linear, linear.in_features ** -0.5)
    normal_init_(fc2, math.sqrt(1.0 / (fc2.in_features * activation_second_moment(activation))))


@torch.no_grad()
def init_skipless_table_(table, padding_idx, row_norm=1.0):
    """Token table rows of norm ``row_norm`` (1: RMS 1 after the sqrt(d) scale), zero padding
    row (dense tables; a Tensor-Chain table keeps its own init)."""
    if not isinstance(table, nn.Embedding):
        return
    nn.init.normal_(table.weight)
    table.weight.div_(table.weight.norm(dim=1, keepdim=True)).mul_(row_norm)
    if padding_idx is not None:
        table.weight[padding_idx].zero_()
