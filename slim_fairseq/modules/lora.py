"""Low-rank adapter on a shared linear layer (Hu et al., arXiv:2106.09685; "FFN tying + LoRA" in
docs/TECHNIQUES.md#tying-schemes).

``y = x W^T + b + (alpha / r) * (x A^T) B^T`` where ``W``/``b`` are the shared layer's
Parameters (the same Parameter objects as the layer being shared) and ``A`` (r x in),
``B`` (out x r) belong to this one layer. ``A`` is Kaiming-uniform initialised and ``B``
zero, so at initialisation the adapter adds exactly zero.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn



class LoRALinear(nn.Module):
    """A linear layer whose ``weight``/``bias`` are borrowed from ``shared`` plus a private
    rank-``rank`` update scaled by ``alpha / rank``.

    Args:
        shared: an ``nn.Linear`` (or any module with ``weight`` of shape (out, in) and an
            optional ``bias``) whose Parameters are reused, not copied.
        rank: adapter rank r >= 1.
        alpha: scaling numerator; the update is multiplied by ``alpha / rank``.
    """

    def __init__(self, shared: nn.Module, rank: int, alpha: float):
        super().__init__()
        weight = getattr(shared, "weight", None)
        # (the options' rules: LoRA adapts dense linears, of rank >= 1 where it is on)
        assert isinstance(weight, nn.Parameter) and weight.dim() == 2, type(shared).__name__
        assert rank >= 1, rank
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias: Optional[nn.Parameter] = getattr(shared, "bias", None)
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = self.alpha / rank
        factory = {"device": weight.device, "dtype": weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **factory))
        self.lora_B = nn.Parameter(torch.empty(self.out_features, rank, **factory))
        self.reset_lora_parameters()

    def reset_lora_parameters(self):
        """A: Kaiming-uniform (as nn.Linear's default), B: zeros."""
        if self.lora_A.device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def forward(self, x: Tensor) -> Tensor:
        base = F.linear(x, self.weight, self.bias)
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return base + self.scaling * update

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rank={self.rank}, alpha={self.alpha}, bias={self.bias is not None}"
        )
