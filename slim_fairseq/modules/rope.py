"""Rotary position embedding (RoPE, Su et al., arXiv:2104.09864); STLM block
(docs/TECHNIQUES.md#stlm-block): theta 10000 on q and k.

Convention: "rotate half" -- channel ``i`` of the first half of a head is paired with
channel ``i + head_dim/2``; pair ``i`` rotates by angle ``pos * theta**(-2i/head_dim)``:

    rope(x) = x * cos + rotate_half(x) * sin,   rotate_half(x1, x2) = (-x2, x1)

``rotate_half(x)`` is ``roll(x, head_dim/2) * sign`` with ``sign = (-1, .., -1, 1, .., 1)``, so
the sign is folded into the cached sine table and a rotation costs one roll, one multiply and
one fused multiply-add (three kernels; HF's Llama code takes six). Positions are absolute token
indices: incremental decoding passes the number of tokens already cached as ``offset`` and
obtains exactly the rotation of a full forward pass.
"""
import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to tensors shaped ``(batch, heads, time, head_dim)`` (any strides).

    Holds no parameters and no persistent buffers (checkpoints are unaffected). The angle
    tables are computed in float32, then kept per dtype and device (float64 inputs get
    float64 tables), grown to the longest length seen.

    Args:
        head_dim: channels per head; must be even.
        theta: base of the geometric frequency progression (10000 in the STLM block).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        assert head_dim > 0 and head_dim % 2 == 0, head_dim  # (the options' rule: pairs)
        self.head_dim = head_dim
        self.theta = float(theta)
        self._tables = {}  # (dtype, device) -> (cos, signed sin), each (length, head_dim)

    def tables(self, length: int, like: torch.Tensor):
        """(cos, signed sin) of at least ``length`` positions in ``like``'s dtype and device."""
        key = (like.dtype, like.device)
        cached = self._tables.get(key)
        if cached is None or cached[0].size(0) < length:
            size = max(length, 2 * (cached[0].size(0) if cached is not None else 0), 64)
            exact = like.dtype == torch.float64  # never round float64 inputs
            work = torch.float64 if exact else torch.float32
            half = self.head_dim // 2
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=work)
                                             / self.head_dim))
            angles = torch.outer(torch.arange(size, dtype=work), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)  # (size, head_dim)
            sign = torch.cat((-torch.ones(half, dtype=work), torch.ones(half, dtype=work)))
            cached = (angles.cos().to(device=like.device, dtype=like.dtype),
                      (angles.sin() * sign).to(device=like.device, dtype=like.dtype))
            self._tables[key] = cached
        return cached

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate ``x`` (B, H, T, head_dim); ``offset``: absolute position of ``x[:, :, 0]``
        (tokens already cached)."""
        return self.rotate(x, *self.rows(x, offset))

    def rows(self, x: torch.Tensor, offset: int = 0):
        """(cos, signed sin) of the positions of ``x``'s time axis, for :meth:`rotate` (one
        lookup serves the queries and the keys of a step)."""
        seq_len = x.size(-2)
        cos, signed_sin = self.tables(offset + seq_len, x)
        return cos[offset: offset + seq_len], signed_sin[offset: offset + seq_len]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * cos, x.roll(self.head_dim // 2, dims=-1), signed_sin)

    def _apply(self, fn, recurse=True):
        self._tables = {}  # .to() / .half(): rebuilt for the new dtype or device on next use
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"
