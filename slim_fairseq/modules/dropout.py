"""Dropout that keeps a one-byte mask for backward.

On the CPU ``torch.nn.functional.dropout`` multiplies by a float noise tensor and autograd keeps
that tensor (four bytes per element) until backward; on CUDA it calls torch's fused
``native_dropout``, which keeps a boolean mask. :class:`SlimDropout` is fairseq's
``FairseqDropout`` that calls ``native_dropout`` on every device: on the CPU it draws the same
noise from the same generator (identical outputs and gradients), keeps a quarter of the memory
and runs one op forward and one backward.
"""
import torch

from fairseq.modules.fairseq_dropout import FairseqDropout


class SlimDropout(FairseqDropout):
    """``FairseqDropout`` keeping a boolean mask (``torch.native_dropout``) on every device."""

    @classmethod
    def from_fairseq(cls, dropout):
        """A copy of a ``FairseqDropout`` (same p, module name, inference flag)."""
        slim = cls(dropout.p, module_name=dropout.module_name)
        slim.apply_during_inference = dropout.apply_during_inference
        return slim

    def forward(self, x, inplace: bool = False):
        if 0 < self.p < 1 and (self.training or self.apply_during_inference) and not inplace:
            return torch.native_dropout(x, self.p, True)[0]
        return super().forward(x, inplace=inplace)


def slim_dropouts(module, names=("dropout_module", "activation_dropout_module")):
    """Replace the ``FairseqDropout`` attributes ``names`` of ``module`` by :class:`SlimDropout`."""
    for name in names:
        dropout = getattr(module, name, None)
        if type(dropout) is FairseqDropout:
            setattr(module, name, SlimDropout.from_fairseq(dropout))
