"""The GLU of a feed-forward, ``act(w1 x) * w3 x`` (Shazeer, arXiv:2002.05202; Anthe,
arXiv:2305.10991; docs/TECHNIQUES.md#glu-feed-forward), at inference.

Plain torch (no fairseq): :class:`~slim_fairseq.modules.glu.GLUProjection` runs it without
autograd, and the transformers code an export writes runs this file.
"""
import torch.nn.functional as F

# the activations a GLU gate takes (``--activation-fn`` under ``--ffn-glu``): SwiGLU, GEGLU, ReGLU
GLU_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def glu(x, w1, w3, activation):
    """``act(w1 x) * w3 x``; ``w1``, ``w3``: the two input linears (callables)."""
    act = GLU_ACTIVATIONS[activation]
    return act(w1(x)) * w3(x)
