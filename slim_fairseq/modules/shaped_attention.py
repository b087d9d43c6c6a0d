"""Shaped attention for skipless transformers (He & Hofmann, arXiv:2311.01906 §4.1;
docs/TECHNIQUES.md#skipless-block-and-shaped-attention).

Per head ``h``::

    A_h = alpha_h * I + beta_h * softmax(Q_h K_h^T / sqrt(d_h) + causal mask) - gamma_h * C
    out_h = A_h V_h

``C`` is the uniform causal matrix (``C[i, j] = 1 / i`` for ``j <= i``, 1-based, over the
non-padding keys), alpha, beta, gamma are trainable per head and initialised to 1, and W_Q is
initialised to zero, so at initialisation the softmax equals ``C`` and ``A`` is the identity.

Built on :class:`~slim_fairseq.modules.gqa_attention.GroupedQueryAttention` (MHA / MQA / GQA,
RoPE after the projections, cached keys and values in fairseq's incremental state); only the
way q, k, v are combined changes. In incremental decoding the cache holds every value of the
prefix, so the uniform term is the mean of the cached values and the identity term is the
value of the current position -- exactly the rows of the full-forward matrices.

Reduced form (Graef, arXiv:2404.12362; docs/TECHNIQUES.md#weight-removal): ``removed="q"|"k"|"v"`` drops that projection -- the slot takes the
block input itself, split into heads -- and ``out_proj=False`` drops the post-attention
projection P (merged into the following linears by the converter).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .gqa_attention import GroupedQueryAttention, causal_allowed

REMOVABLE = ("q", "k", "v")


class ShapedAttention(GroupedQueryAttention):
    """Causal shaped self-attention on batch-first inputs ``(B, T, embed_dim)``.

    Args:
        embed_dim: model width d; heads have ``d_h = d // num_heads`` channels.
        num_heads: query heads.
        num_kv_heads: key/value heads (num_heads = MHA, 1 = MQA, a divisor = GQA).
        bias: biases on every projection.
        rope_theta: RoPE base, ``None`` = no positional rotation.
        dropout: dropout on the softmax probabilities (training only).
        removed: ``None`` or ``"q"``/``"k"``/``"v"``: reduced form without that matrix; removing
            K or V needs MHA (only then is the matrix square).
        out_proj: whether the post-attention projection P exists.
        zero_query_init: W_Q starts at zero (shaped-attention initialisation).

    ``forward(x, key_padding_mask=None, incremental_state=None) -> (out, None)``. The incremental
    state machinery (``@with_incremental_state``) is inherited from the base class.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: Optional[int] = None,
        bias: bool = False,
        rope_theta: Optional[float] = None,
        dropout: float = 0.0,
        removed: Optional[str] = None,
        out_proj: bool = True,
        zero_query_init: bool = True,
    ):
        num_kv_heads = num_kv_heads or num_heads
        if removed in ("none", ""):
            removed = None
        if removed is not None and removed not in REMOVABLE:
            raise ValueError(f"--removed-weights: got {removed!r}, allowed none|q|k|v")
        if removed in ("k", "v") and num_kv_heads != num_heads:
            raise ValueError(
                f"--removed-weights {removed}: W_{removed.upper()} is only square with MHA "
                f"(--kv-heads {num_kv_heads} != {num_heads} heads); allowed with MQA/GQA: none|q"
            )
        super().__init__(embed_dim, num_heads, num_kv_heads, bias=bias, rope_theta=rope_theta,
                         dropout=dropout)
        self.removed = removed
        if removed is not None:
            setattr(self, f"{removed}_proj", None)
        if not out_proj:
            self.out_proj = nn.Identity()
        self.alpha = nn.Parameter(torch.ones(num_heads))
        self.beta = nn.Parameter(torch.ones(num_heads))
        self.gamma = nn.Parameter(torch.ones(num_heads))
        self.reset_parameters(zero_query_init)

    @property
    def has_out_proj(self) -> bool:
        return isinstance(self.out_proj, nn.Linear)

    def reset_parameters(self, zero_query_init: bool = True):
        # N(0, 1/fan_in): with the identity-like initial A, values and output keep unit variance
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if isinstance(proj, nn.Linear):
                nn.init.normal_(proj.weight, std=proj.in_features ** -0.5)
                if proj.bias is not None:
                    nn.init.zeros_(proj.bias)
        if self.q_proj is not None and zero_query_init:
            nn.init.zeros_(self.q_proj.weight)
        for scale in (self.alpha, self.beta, self.gamma):
            nn.init.ones_(scale)

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """x (B, T, d) -> q (B, H, T, d_h), k and v (B, KV, T, d_h); a removed projection
        passes the input through."""
        bsz, seq_len, _ = x.shape

        def heads(proj, count):
            y = x if proj is None else proj(x)
            return y.view(bsz, seq_len, count, self.head_dim).transpose(1, 2)

        return (heads(self.q_proj, self.num_heads), heads(self.k_proj, self.num_kv_heads),
                heads(self.v_proj, self.num_kv_heads))

    def compute_attention(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor]
    ) -> Tensor:
        """(alpha I + beta softmax - gamma C) V per head; q (B, H, Tq, d_h) are the last Tq of
        the Tk cached positions of k, v (B, KV, Tk, d_h)."""
        q_len, k_len = q.size(2), k.size(2)
        k, v = self.expand_kv(k), self.expand_kv(v)
        alpha, beta, gamma = (s.to(v.dtype).view(1, -1, 1, 1) for s in (self.alpha, self.beta, self.gamma))
        if key_padding_mask is None and (q_len == k_len or q_len == 1):
            # no padding: the softmax term is fused causal attention (every key is visible to a
            # single new query) and the uniform term C V is the running mean of the values
            dropout_p = self.dropout if self.training else 0.0
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                                      is_causal=q_len > 1, scale=self.scaling)
            if q_len == 1:
                mean = v.mean(dim=2, keepdim=True)
            else:
                counts = torch.arange(1, k_len + 1, device=v.device, dtype=v.dtype).view(-1, 1)
                mean = v.cumsum(dim=2) / counts
            return alpha * v[:, :, k_len - q_len:, :] + beta * attended - gamma * mean
        allowed = causal_allowed(q_len, k_len, q.device).view(1, 1, q_len, k_len)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, k_len)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        softmax_dtype = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype
        scores = scores.to(softmax_dtype).masked_fill(~allowed, torch.finfo(softmax_dtype).min)
        probs = torch.softmax(scores, dim=-1) * allowed  # a row with no visible key gives zeros
        probs = F.dropout(probs, p=self.dropout, training=self.training).to(v.dtype)
        visible = allowed.to(v.dtype)
        uniform = visible / visible.sum(dim=-1, keepdim=True).clamp(min=1.0)
        return alpha * v[:, :, k_len - q_len:, :] + torch.matmul(beta * probs - gamma * uniform, v)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", removed={self.removed}, out_proj={self.has_out_proj}"
