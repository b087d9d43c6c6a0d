"""Causal grouped-query self-attention with RoPE and fairseq incremental state (STLM block,
docs/TECHNIQUES.md#stlm-block).

``num_kv_heads == num_heads`` is multi-head attention, ``num_kv_heads == 1`` multi-query
attention, anything in between grouped-query attention: query head ``h`` reads key/value
head ``h // (num_heads // num_kv_heads)``.

Layout: inputs and outputs are **batch-first** ``(batch, time, embed_dim)``.

Incremental decoding: keys and values are cached *after* RoPE in fairseq's incremental
state (key ``"attn_state"``: ``prev_key``/``prev_value`` of shape (B, kv_heads, T, head_dim)
and, once a padding mask was seen, ``prev_key_padding_mask`` (B, T)). The RoPE offset of
new tokens is the cached length, so one-token-at-a-time decoding equals a full forward.
Each module object owns one cache slot: layers that share weights must be separate objects
holding the same Parameters (docs/TECHNIQUES.md#shared-layers-and-incremental-state).

Subclassing: override :meth:`compute_attention` to change how (q, k, v) are combined (e.g.
shaped attention); projection (:meth:`project`), RoPE, caching and the output projection
stay as they are. :func:`causal_allowed` gives the boolean visibility matrix.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from .rope import RotaryEmbedding


def causal_allowed(q_len: int, k_len: int, device=None) -> Tensor:
    """Bool (q_len, k_len): True where query i may see key j (the last q_len of k_len keys
    are the queries, so query i sits at absolute position ``k_len - q_len + i``)."""
    past = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + past
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    return k_pos <= q_pos


@with_incremental_state
class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``num_heads`` query heads and ``num_kv_heads`` K/V heads.

    Args:
        embed_dim: model width (input and output size).
        num_heads: query heads.
        num_kv_heads: key/value heads; must divide ``num_heads``.
        head_dim: channels per head (default ``embed_dim // num_heads``); may differ from
            ``embed_dim / num_heads`` (q projects to ``num_heads * head_dim``).
        bias: biases on the four projections.
        rope_theta: RoPE base applied to q and k, or None for no positional rotation.
        dropout: dropout on the attention probabilities (training only).

    Submodules: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (nn.Linear), ``rope``
    (RotaryEmbedding or None).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: Optional[int] = None,
        bias: bool = False,
        rope_theta: Optional[float] = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"attention: kv heads ({num_kv_heads}) must be >= 1 and divide heads ({num_heads})"
            )
        if head_dim is None:
            if embed_dim % num_heads != 0:
                raise ValueError(
                    f"attention: heads ({num_heads}) must divide embed_dim ({embed_dim})"
                )
            head_dim = embed_dim // num_heads
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group_size = num_heads // num_kv_heads
        self.dropout = dropout
        self.scaling = head_dim ** -0.5
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias)
        self.rope = RotaryEmbedding(head_dim, rope_theta) if rope_theta is not None else None

    # ----------------------------------------------------------------------------------
    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """x (B, T, C) -> q (B, H, T, Dh), k and v (B, KV, T, Dh), before RoPE."""
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def expand_kv(self, kv: Tensor) -> Tensor:
        """(B, KV, T, Dh) -> (B, H, T, Dh): each KV head serves ``group_size`` query heads."""
        if self.group_size == 1:
            return kv
        return kv.repeat_interleave(self.group_size, dim=1)

    def compute_attention(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor]
    ) -> Tensor:
        """Causal softmax attention. q (B, H, Tq, Dh); k, v (B, KV, Tk, Dh) including cached
        keys (queries are the last Tq positions); key_padding_mask (B, Tk) True at pads.
        Returns (B, H, Tq, Dh)."""
        q_len, k_len = q.size(2), k.size(2)
        k, v = self.expand_kv(k), self.expand_kv(v)
        dropout_p = self.dropout if self.training else 0.0
        if key_padding_mask is None and q_len == k_len:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scaling
            )
        allowed = causal_allowed(q_len, k_len, q.device).view(1, 1, q_len, k_len)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, k_len)
        # finite fill: a row with every key masked (a pad query) stays finite, never NaN
        additive = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        additive = additive.masked_fill(~allowed, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=additive, dropout_p=dropout_p, scale=self.scaling
        )

    # ----------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tuple[Tensor, None]:
        """x (B, T, C); key_padding_mask (B, T) True at pad positions of ``x``.

        With ``incremental_state``, ``x`` holds only the new positions; cached keys and
        values of earlier calls are prepended. Returns ``(output (B, T, C), None)``.
        """
        bsz, seq_len, _ = x.shape
        q, k, v = self.project(x)
        saved = self.get_incremental_state(incremental_state, "attn_state") if incremental_state is not None else None
        prev_key = saved.get("prev_key") if saved is not None else None
        past_len = prev_key.size(2) if prev_key is not None else 0
        if self.rope is not None:
            q = self.rope(q, offset=past_len)
            k = self.rope(k, offset=past_len)
        if incremental_state is not None:
            prev_mask = saved.get("prev_key_padding_mask") if saved is not None else None
            if prev_key is not None:
                k = torch.cat([prev_key, k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            if key_padding_mask is not None or prev_mask is not None:
                new_mask = (
                    key_padding_mask.bool()
                    if key_padding_mask is not None
                    else torch.zeros(bsz, seq_len, dtype=torch.bool, device=x.device)
                )
                if prev_mask is None and past_len > 0:
                    prev_mask = torch.zeros(bsz, past_len, dtype=torch.bool, device=x.device)
                key_padding_mask = (
                    torch.cat([prev_mask, new_mask], dim=1) if prev_mask is not None else new_mask
                )
            state: Dict[str, Optional[Tensor]] = {"prev_key": k, "prev_value": v}
            if key_padding_mask is not None:
                state["prev_key_padding_mask"] = key_padding_mask
            self.set_incremental_state(incremental_state, "attn_state", state)
        if key_padding_mask is not None and not key_padding_mask.any():
            key_padding_mask = None
        attn = self.compute_attention(q, k, v, key_padding_mask)
        attn = attn.transpose(1, 2).reshape(bsz, seq_len, self.num_heads * self.head_dim)
        return self.out_proj(attn), None

    def reorder_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor
    ):
        """Select cached batch rows by ``new_order`` (beam search)."""
        saved = self.get_incremental_state(incremental_state, "attn_state")
        if saved is None:
            return incremental_state
        reordered: Dict[str, Optional[Tensor]] = {}
        for name, value in saved.items():
            reordered[name] = value.index_select(0, new_order) if value is not None else None
        return self.set_incremental_state(incremental_state, "attn_state", reordered)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dropout={self.dropout}"
        )
