"""GLU feed-forward (Anthe, arXiv:2305.10991): ``w2(act(w1 x) * w3 x)`` with hidden width
``floor(2f/3)`` (docs/TECHNIQUES.md#glu-feed-forward).

:class:`GLUProjection` is the "fc1" of the GLU FFN (``act(w1 x) * w3 x``); the layer keeps
``fc2`` (= w2) as its own Linear / Tensor-Chain layer and uses the identity activation, so
fairseq's layer forward runs unchanged.
"""
import torch.nn as nn
import torch.nn.functional as F

GLU_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


def glu_hidden_dim(ffn_dim):
    """Hidden width of a GLU FFN replacing a ReLU FFN of width f: floor(2f/3) (1365 for 2048)."""
    return (2 * ffn_dim) // 3


def build_linear(in_features, out_features, tc_ratio=0.0, tc_length=2, bias=True, tc_min_bond=0):
    """Dense ``nn.Linear`` or a Tensor-Chain layer with parameter ratio ``tc_ratio``
    (docs/TECHNIQUES.md#tensor-chain)."""
    if tc_ratio:
        from slim_fairseq.modules.tensor_chain import TensorChainLinear
        return TensorChainLinear(in_features, out_features, ratio=tc_ratio, length=tc_length,
                                 bias=bias, min_bond=tc_min_bond)
    return nn.Linear(in_features, out_features, bias=bias)


class GLUProjection(nn.Module):
    """``act(w1 x) * w3 x`` with both linears carrying a bias; activation silu (SwiGLU, the
    Anthe reference code) or gelu (GEGLU, the paper's text)."""

    def __init__(self, in_features, hidden_features, activation="silu", tc_ratio=0.0,
                 tc_length=2, tc_min_bond=0):
        super().__init__()
        if activation not in GLU_ACTIVATIONS:
            raise ValueError(f"--glu-activation={activation!r} is not allowed; allowed: "
                             + "|".join(GLU_ACTIVATIONS))
        self.in_features = in_features
        self.out_features = hidden_features
        self.activation = activation
        self.w1 = build_linear(in_features, hidden_features, tc_ratio, tc_length, tc_min_bond=tc_min_bond)
        self.w3 = build_linear(in_features, hidden_features, tc_ratio, tc_length, tc_min_bond=tc_min_bond)

    def extra_repr(self):
        return f"activation={self.activation}"

    def forward(self, x):
        return GLU_ACTIVATIONS[self.activation](self.w1(x)) * self.w3(x)
