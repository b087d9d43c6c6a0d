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


def shaped_mixing(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, gamma: Tensor,
                  attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
                  dropout_p: float, scale: float, causal: bool = False) -> Tensor:
    """``(alpha I + beta softmax - gamma C) V`` per head. q (B, H, Tq, d_h), unscaled, are the
    last Tq of the Tk positions of k, v (B, KV, Tk, d_h), KV dividing H (query head h reads
    key/value head h // (H / KV)); ``attn_mask`` (Tq, Tk) additive with -inf where a key is
    hidden (None: every key visible), ``causal``: it is the decoder's future mask;
    ``key_padding_mask`` (B, Tk) True at pads. Returns (B, H, Tq, d_h).

    Without padding, under the future mask (or one query reading the whole cache) the softmax
    term is torch's fused attention and the uniform term ``C V`` the running mean of the values;
    the per-head factors broadcast over the heads of each key/value head, so no key or value is
    copied per query head."""
    bsz, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.size(1), k.size(2)
    group = heads // kv_heads
    if alpha.dtype != v.dtype:
        alpha, beta, gamma = (s.to(v.dtype) for s in (alpha, beta, gamma))
    if key_padding_mask is None and (causal or (attn_mask is None and q_len == 1)):
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                                  is_causal=q_len > 1, scale=scale,
                                                  enable_gqa=group > 1)
        current = v[:, :, k_len - q_len:]
        if q_len == 1:
            mean = v.mean(dim=2, keepdim=True)
        else:
            counts = torch.arange(1, k_len + 1, device=v.device, dtype=v.dtype).view(-1, 1)
            mean = v.cumsum(dim=2) / counts
        if group == 1:
            per_head = (1, heads, 1, 1)
        else:  # the query heads of each key/value head: (B, KV, group, T, d)
            per_head = (1, kv_heads, group, 1, 1)
            current, mean = current.unsqueeze(2), mean.unsqueeze(2)
            attended = attended.view(bsz, kv_heads, group, q_len, head_dim)
        out = torch.addcmul(alpha.view(per_head) * current, beta.view(per_head), attended)
        out = torch.addcmul(out, gamma.view(per_head), mean, value=-1)
        return out if group == 1 else out.view(bsz, heads, q_len, head_dim)
    k = k.repeat_interleave(group, dim=1) if group > 1 else k
    v = v.repeat_interleave(group, dim=1) if group > 1 else v
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
    if attn_mask is not None:
        allowed = ~torch.isneginf(attn_mask)
    allowed = allowed.view(1, 1, q_len, k_len)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, k_len)
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    softmax_dtype = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
    scores = scores.to(softmax_dtype).masked_fill(~allowed, torch.finfo(softmax_dtype).min)
    probs = torch.softmax(scores, dim=-1) * allowed  # a row with no visible key gives zeros
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0).to(v.dtype)
    visible = allowed.to(v.dtype)
    uniform = visible / visible.sum(dim=-1, keepdim=True).clamp(min=1.0)
    alpha, beta, gamma = (s.view(1, heads, 1, 1) for s in (alpha, beta, gamma))
    current = v[:, :, k_len - q_len:, :]
    return alpha * current + torch.matmul(beta * probs - gamma * uniform, v)
