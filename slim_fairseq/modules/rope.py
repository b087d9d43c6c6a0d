"""Rotary position embedding (RoPE, Su et al., arXiv:2104.09864); STLM block
(docs/TECHNIQUES.md#stlm-block): theta 10000 on q and k.

Convention: "rotate half" -- channel ``i`` of the first half of a head is paired with
channel ``i + head_dim/2``; pair ``i`` rotates by angle ``pos * theta**(-2i/head_dim)``.
Positions are absolute token indices, so incremental decoding passes the number of tokens
already cached as ``offset`` and obtains exactly the rotation of a full forward pass.
"""

from typing import Optional

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to tensors shaped ``(batch, heads, time, head_dim)``.

    Holds no parameters and no persistent buffers (checkpoints are unaffected); the
    cos/sin tables are computed in float32 and cached up to the longest length seen.

    Args:
        head_dim: channels per head; must be even.
        theta: base of the geometric frequency progression (10000 in the STLM block).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim <= 0 or head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim > 0, got {head_dim}")
        self.head_dim = head_dim
        self.theta = float(theta)
        inv_freq = 1.0 / (
            self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cos_cached: Optional[torch.Tensor] = None
        self._sin_cached: Optional[torch.Tensor] = None

    def _tables(self, length: int, device: torch.device):
        cached = self._cos_cached
        if cached is None or cached.size(0) < length or cached.device != device:
            size = max(length, 2 * (cached.size(0) if cached is not None else 0), 64)
            positions = torch.arange(size, dtype=torch.float32, device=device)
            angles = torch.outer(positions, self.inv_freq.to(device=device, dtype=torch.float32))
            angles = torch.cat((angles, angles), dim=-1)  # (size, head_dim)
            self._cos_cached, self._sin_cached = angles.cos(), angles.sin()
        return self._cos_cached, self._sin_cached

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Rotate ``x`` (B, H, T, head_dim).

        Args:
            offset: absolute position of ``x[:, :, 0]`` (tokens already cached).
            positions: optional explicit positions, shape (T,) or (B, T); overrides offset.
        """
        seq_len = x.size(-2)
        if positions is None:
            cos, sin = self._tables(offset + seq_len, x.device)
            cos, sin = cos[offset : offset + seq_len], sin[offset : offset + seq_len]
        else:
            cos, sin = self._tables(int(positions.max().item()) + 1, x.device)
            cos, sin = cos[positions], sin[positions]
            if positions.dim() == 2:  # (B, T, D) -> (B, 1, T, D) to broadcast over heads
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x_float = x if x.dtype == torch.float64 else x.float()  # never round float64 inputs
        rotated = x_float * cos + rotate_half(x_float) * sin
        return rotated.to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"
