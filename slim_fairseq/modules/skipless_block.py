"""The output of a skipless block from its two branches (He & Hofmann, arXiv:2311.01906;
docs/TECHNIQUES.md#skipless-transformers): no residual and no norm, ``s`` the MLP branch's
scale (``--mlp-branch-scale``):

* serial:   ``y = s * FFN(Attn(x))``
* parallel: ``y = (Attn(x) + s * FFN(x)) / sqrt(1 + s^2)``

Plain torch (no fairseq): the fairseq block (:class:`~slim_fairseq.models.slim_layers.
SkiplessDecoderLayer`) and the transformers code an export writes both run this file.
"""
import math


def _kept(x):
    return x


def parallel_output_scale(mlp_branch_scale):
    """``1 / sqrt(1 + s^2)``: the parallel sum of two unit-variance branches at unit variance."""
    return 1.0 / math.sqrt(1.0 + mlp_branch_scale ** 2)


def skipless_output(x, attn, feed_forward, parallel, mlp_branch_scale, drop=_kept):
    """The block's output for input ``x`` and its attention branch's output ``attn``;
    ``feed_forward``: the MLP (a callable), ``drop``: the block's dropout (identity by
    default)."""
    if parallel:
        mixed = drop(attn) + mlp_branch_scale * drop(feed_forward(x))
        return parallel_output_scale(mlp_branch_scale) * mixed
    return mlp_branch_scale * drop(feed_forward(drop(attn)))
