"""Root-mean-square layer normalisation (STLM block, docs/TECHNIQUES.md#stlm-block: eps 1e-6,
weight only, no bias), through torch's own fused ``F.rms_norm`` (one kernel on CUDA)."""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x**2, -1) + eps) * weight``; ``weight`` starts at ones.

    torch computes the statistic in float32 for fp16/bf16 inputs, so they normalise like fp32
    ones.

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
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
