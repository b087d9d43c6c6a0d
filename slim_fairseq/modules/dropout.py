"""Dropout that keeps a one-byte mask for backward.

On the CPU ``torch.nn.functional.dropout`` multiplies by a float noise tensor and autograd keeps
that tensor (four bytes per element) until backward; on CUDA torch's fused kernel already keeps
a boolean mask. :class:`SlimDropout` is fairseq's ``FairseqDropout`` whose CPU training path
draws the same noise from the same generator (identical outputs and gradients) but keeps only
a boolean mask: a quarter of the memory.
"""
import torch
import torch.nn.functional as F

from fairseq.modules.fairseq_dropout import FairseqDropout

from slim_fairseq.modules.tc_autograd import refuse_double_backward


class MaskDropout(torch.autograd.Function):
    """``x * bernoulli(1 - p) / (1 - p)`` as torch's CPU dropout computes it, saving a bool mask."""

    @staticmethod
    def forward(ctx, x, p):
        noise = torch.empty_like(x).bernoulli_(1 - p)
        ctx.p = p
        ctx.save_for_backward(noise.bool())
        return x * noise.div_(1 - p)

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("dropout")
        mask, = ctx.saved_tensors
        return grad * mask.to(grad.dtype).div_(1 - ctx.p), None


class SlimDropout(FairseqDropout):
    """``FairseqDropout`` keeping a boolean mask on the CPU (see :class:`MaskDropout`)."""

    @classmethod
    def from_fairseq(cls, dropout):
        """A copy of a ``FairseqDropout`` (same p, module name, inference flag)."""
        slim = cls(dropout.p, module_name=dropout.module_name)
        slim.apply_during_inference = dropout.apply_during_inference
        return slim

    def forward(self, x, inplace: bool = False):
        if (self.p > 0 and (self.training or self.apply_during_inference) and self.p < 1
                and not inplace and x.device.type == "cpu" and x.requires_grad
                and torch.is_grad_enabled()):
            return MaskDropout.apply(x, self.p)
        return super().forward(x, inplace=inplace)


def slim_dropouts(module, names=("dropout_module", "activation_dropout_module")):
    """Replace the ``FairseqDropout`` attributes ``names`` of ``module`` by :class:`SlimDropout`."""
    for name in names:
        dropout = getattr(module, name, None)
        if type(dropout) is FairseqDropout:
            setattr(module, name, SlimDropout.from_fairseq(dropout))
