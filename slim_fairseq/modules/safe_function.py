"""The maths of SAFE, the Subformer's self-attentive factorised embeddings (arXiv:2101.00234,
Sec. 2.3; docs/TECHNIQUES.md#safe-embeddings), around its own attention at the table width
d_e and given the scaled token embedding plus positions ``x``:

    x   = LN_{d_e}(x + SelfAttn_{d_e}(x))             (pre-norm: x + SelfAttn_{d_e}(LN_{d_e}(x)))
    out = LN_{d_m}(fc2_{d_e->d_m}(relu(fc1_{d_e->d_e}(x))))

and its output side, tied to the token table E: ``logits = E(W_{d_m->d_e} h + b)``, with an
activation between the two under ``--safe-output mlp``.

Plain torch (no fairseq): the plugin's SAFE modules (:mod:`slim_fairseq.modules.safe`, which
add dropout, positions and fairseq's incremental state) and the transformers code an export
writes both run this file.
"""
import torch.nn.functional as F


def _identity(x):
    return x


def safe_embedding(x, attend, attention_norm, fc1, fc2, output_norm, normalize_before,
                   dropout=_identity):
    """SAFE's input side from ``x`` (the scaled tokens plus positions, d_e wide):
    ``attend(y)`` is its self-attention's output for ``y``; ``dropout`` follows the attention
    and the feed-forward (training only)."""
    residual = x
    if normalize_before:
        x = attention_norm(x)
    x = residual + dropout(attend(x))
    if not normalize_before:
        x = attention_norm(x)
    return output_norm(dropout(fc2(F.relu(fc1(x)))))


def safe_logits(features, proj, table_weight, activation=None):
    """SAFE's output side: ``E(W h + b)`` (``activation`` between the two under
    ``--safe-output mlp``)."""
    h = proj(features)
    if activation is not None:
        h = activation(h)
    return F.linear(h, table_weight)
