"""Shaped attention of skipless blocks (He & Hofmann, arXiv:2311.01906 §4.1;
docs/TECHNIQUES.md#skipless-block-and-shaped-attention).

Per head ``h``::

    A_h = alpha_h * I + beta_h * softmax(Q_h K_h^T / sqrt(d_h) + causal mask) - gamma_h * C
    out_h = A_h V_h

``C`` is the uniform causal matrix (``C[i, j] = 1 / i`` for ``j <= i``, 1-based, over the
non-padding keys), alpha, beta, gamma are trainable per head and start at 1, and W_Q starts at
zero, so at initialisation the softmax equals ``C`` and ``A`` is the identity.

:func:`shaped_mixing` combines queries, keys and values that
:class:`~slim_fairseq.modules.attention.SlimMultiheadAttention` formed (projections, grouped
key/value heads, RoPE, the incremental-state cache). In incremental decoding the cache holds every
value of the prefix, so the uniform term is the mean of the cached values and the identity term is
the value of the current position: exactly the rows of the full-forward matrices.

Reduced form (Graef, arXiv:2404.12362; docs/TECHNIQUES.md#weight-removal): the attention may
drop W_Q (or W_K, W_V; ``REMOVABLE``) -- that slot takes the block input itself -- and the
post-attention projection P.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

REMOVABLE = ("q", "k", "v")


def causal_allowed(q_len: int, k_len: int, device=None) -> Tensor:
    """Bool (q_len, k_len): True where query i may see key j (the last q_len of k_len keys are
    the queries, so query i sits at absolute position ``k_len - q_len + i``)."""
    past = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + past
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


def _is_causal(attn_mask: Optional[Tensor], q_len: int, k_len: int) -> bool:
    """The mask lets query i see exactly keys 0..i (fairseq's future mask), or it is absent and
    one query sees every cached key."""
    if attn_mask is None:
        return q_len == 1
    if q_len != k_len:
        return False
    return bool(torch.equal(torch.isneginf(attn_mask),
                            ~causal_allowed(q_len, k_len, attn_mask.device)))


def shaped_mixing(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, gamma: Tensor,
                  attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
                  dropout_p: float) -> Tensor:
    """``(alpha I + beta softmax - gamma C) V`` per head. q (B, H, Tq, d_h) already scaled, are the
    last Tq of the Tk positions of k, v (B, H, Tk, d_h); ``attn_mask`` (Tq, Tk) additive with
    -inf where a key is hidden (None: every key visible); ``key_padding_mask`` (B, Tk) True at
    pads. Returns (B, H, Tq, d_h)."""
    q_len, k_len = q.size(2), k.size(2)
    alpha, beta, gamma = (s.to(v.dtype).view(1, -1, 1, 1) for s in (alpha, beta, gamma))
    current = v[:, :, k_len - q_len:, :]
    if key_padding_mask is None and _is_causal(attn_mask, q_len, k_len):
        # fused causal attention; the uniform term C V is the running mean of the values
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                                  is_causal=q_len > 1, scale=1.0)
        if q_len == 1:
            mean = v.mean(dim=2, keepdim=True)
        else:
            counts = torch.arange(1, k_len + 1, device=v.device, dtype=v.dtype).view(-1, 1)
            mean = v.cumsum(dim=2) / counts
        return alpha * current + beta * attended - gamma * mean
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
    if attn_mask is not None:
        allowed = ~torch.isneginf(attn_mask)
    allowed = allowed.view(1, 1, q_len, k_len)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, k_len)
    scores = torch.matmul(q, k.transpose(-1, -2))
    softmax_dtype = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
    scores = scores.to(softmax_dtype).masked_fill(~allowed, torch.finfo(softmax_dtype).min)
    probs = torch.softmax(scores, dim=-1) * allowed  # a row with no visible key gives zeros
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0).to(v.dtype)
    visible = allowed.to(v.dtype)
    uniform = visible / visible.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return alpha * current + torch.matmul(beta * probs - gamma * uniform, v)
