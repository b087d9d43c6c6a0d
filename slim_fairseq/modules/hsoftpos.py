"""H-SoftPOS hierarchical embedding with l levels (Anthe, arXiv:2305.10991; docs/TECHNIQUES.md#h-softpos);
its maths is :mod:`slim_fairseq.modules.hsoftpos_function` (plain torch, the file an export copies),
this module fairseq's edge (positions, incremental state, beam reordering).

    d_sp = floor(d / 2l),  n_sp = d_sp,  d_emb = d - (2l - 1) d_sp
    X_1 = E(S) sqrt(d_emb) + sinusoidal positions(d_emb)
    X_i = CausalConv1d(width(X_{i-1}) -> d_sp, kernel 3, dilation 2**(i-2))(X_{i-1}), i = 2..l
    SoftPOS_i(X) = softmax(X[..., :n_sp]) @ W_sp_i      (W_sp_i: n_sp x d_sp, orthogonal init)
    output = [X_1, SoftPOS_1(X_1), X_2, SoftPOS_2(X_2), ...]   (width d)

Pad positions are zeroed before every convolution, so a left-padded sentence gives the same
output as alone. In incremental decoding each convolution keeps its last
``(kernel - 1) * dilation`` inputs in fairseq's incremental state.

The convolutions keep ``nn.Conv1d``'s parameters but run as one matrix product over windows of
``kernel`` taps (:func:`causal_conv`), in the full pass and in each incremental step alike: a
convolution kernel would follow cuDNN's TF32 switch (on by default) and pick other algorithms
for a sequence and for one step, and so step-by-step decoding would differ from the full
pass by 4e-4 nats in fp32 on CUDA; matrix products follow ``torch.backends.cuda.matmul``
(fp32 by default), and the two paths agree to fp32 rounding on every device.
"""
import math
from typing import Dict, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import PositionalEmbedding

from slim_fairseq.modules.hsoftpos_function import (  # noqa: F401 (causal_conv re-exported)
    KERNEL_SIZE, causal_conv, conv_weight, hsoftpos_dims, hsoftpos_levels, level_dilations,
    soft_positions)


@with_incremental_state
class HSoftPOSEmbedding(nn.Module):
    """Input embedding (docs/DESIGN.md interface) of docs/TECHNIQUES.md#h-softpos around a ``[V, d_emb]`` token
    table (``nn.Embedding`` or ``TensorChainEmbedding``); returns ``(B, T, d)`` without dropout."""

    def __init__(self, table, model_dim, levels, padding_idx, max_positions, learned_pos=False,
                 scale=True, min_token_dim=0, positions=True):
        super().__init__()
        self.d_sp, self.n_sp, self.d_emb = hsoftpos_dims(model_dim, levels, min_token_dim)
        if table.embedding_dim != self.d_emb:
            raise ValueError(f"table={table.embedding_dim} wide: {levels} levels at width "
                             f"{model_dim} read a token table {self.d_emb} wide; allowed: a table "
                             f"of width {self.d_emb}")
        self.table = table
        self.levels = levels
        self.embedding_dim = model_dim
        self.padding_idx = padding_idx
        self.num_embeddings = getattr(table, "num_embeddings", None)
        self.embed_scale = math.sqrt(self.d_emb) if scale else 1.0
        # X_1's positions (off with --no-token-positional-embeddings, e.g. under RoPE)
        self.embed_positions = (PositionalEmbedding(max_positions, self.d_emb, padding_idx,
                                                    learned=learned_pos) if positions else None)
        self.dilations = level_dilations(levels)
        widths = [self.d_emb] + [self.d_sp] * (levels - 1)
        self.convs = nn.ModuleList(
            nn.Conv1d(widths[i], self.d_sp, KERNEL_SIZE, dilation=dil)
            for i, dil in enumerate(self.dilations))
        self.softpos = nn.ParameterList(
            nn.Parameter(torch.empty(self.n_sp, self.d_sp)) for _ in range(levels))
        for w in self.softpos:
            nn.init.orthogonal_(w)

    @classmethod
    def from_spec(cls, spec, table):
        """For the side :class:`~slim_fairseq.specs.EmbeddingSpec` describes."""
        return cls(table, spec.model_dim, spec.hsoftpos_levels, table.padding_idx,
                   spec.max_positions, learned_pos=spec.learned_pos, scale=spec.scale,
                   min_token_dim=spec.hsoftpos_min_token_dim, positions=spec.positions)

    @property
    def weight(self):
        return self.table.weight

    def max_positions(self):
        return self.embed_positions.max_positions if self.embed_positions is not None else None

    def _positions(self, tokens, incremental_state):
        if self.embed_positions is None:
            return None
        return self.embed_positions(tokens, incremental_state=incremental_state)

    def soft_positions(self, level, x):
        return soft_positions(x, self.softpos[level], self.n_sp)

    def forward(self, tokens: Tensor,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        positions = self._positions(tokens, incremental_state)
        if incremental_state is not None:
            last = None if positions is None else positions[:, -1:]
            return self._step(tokens[:, -1:], last, incremental_state)
        x = self.embed_scale * self.table(tokens)
        if positions is not None:
            x = x + positions
        keep = tokens.ne(self.padding_idx).unsqueeze(-1)  # (B, T, 1), bool: x * keep is x or 0
        return hsoftpos_levels(x, keep, self.convs, self.dilations, self.softpos, self.n_sp)

    def _step(self, token, position, incremental_state):
        """One decoding step: ``token`` (B, 1); convolution inputs of earlier steps are cached."""
        x = self.embed_scale * self.table(token)
        if position is not None:
            x = x + position
        keep = token.ne(self.padding_idx).unsqueeze(-1)
        # {level: (B, (K-1) dilation, C_in)}: the convolution inputs of earlier steps, updated in
        # place (the state holds this dict itself: stored once, at the first step)
        cache = self.get_incremental_state(incremental_state, "conv_inputs")
        first = cache is None
        if first:
            cache = {}
        out = hsoftpos_levels(x, keep, self.convs, self.dilations, self.softpos, self.n_sp,
                              histories=cache)
        if first:
            self.set_incremental_state(incremental_state, "conv_inputs", cache)
        return out

    def reorder_incremental_state(self, incremental_state, new_order):
        """Beam search: reorder every cached convolution input."""
        cache = self.get_incremental_state(incremental_state, "conv_inputs")
        if cache is None:
            return
        for key, value in cache.items():
            if value is not None:
                cache[key] = value.index_select(0, new_order)
        self.set_incremental_state(incremental_state, "conv_inputs", cache)
