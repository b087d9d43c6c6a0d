"""Root-mean-square layer normalisation (STLM block, docs/TECHNIQUES.md#stlm-block: eps 1e-6, weight only,
no bias)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x**2, -1) + eps) * weight``.

    The statistic is computed in float32 and the result cast back to the input dtype,
    so fp16/bf16 inputs normalise like fp32 ones. ``weight`` starts at ones.

    Args:
        dim: size of the last (normalised) dimension.
        eps: added to the mean square before the reciprocal square root.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_float = x.float()
        inv_rms = torch.rsqrt(x_float.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x_float * inv_rms).to(x.dtype) * self.weight

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
