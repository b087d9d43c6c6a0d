"""Activation functions by ``--activation-fn`` name: fairseq's, plus ``silu`` (SwiGLU's gate,
the default under ``--ffn-glu``), which fairseq's ``utils.get_activation_fn`` does not know."""
import torch.nn.functional as F
from fairseq import utils

# names fairseq's own lookup does not know (its layers are built with relu, then given these)
PLUGIN_ONLY = ("silu",)
# computed in the input's dtype (fairseq's gelu rounds through float32)
_EXACT = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


def activation_function(name):
    """The callable of an ``--activation-fn`` name."""
    return _EXACT.get(name) or utils.get_activation_fn(name)
