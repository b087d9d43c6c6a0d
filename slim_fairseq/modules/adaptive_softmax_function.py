"""The log-probabilities of fairseq's adaptive softmax (``fairseq.modules.AdaptiveSoftmax``,
Grave et al., "Efficient softmax approximation for GPUs") over the whole vocabulary:

    head = log_softmax(head(h))                  (the first cutoff's words, then one per cluster)
    log p(w) = head[w]                           for w in the first cutoff
    log p(w) = head[cluster of w] + log_softmax(tail_i(h))[w - cutoff_i]   otherwise

Plain torch (no fairseq): the fairseq model keeps fairseq's own module (its training path
scores only the targets' clusters); the transformers code an export writes runs this file,
and tests/test_export_subformer_lm.py holds it to ``AdaptiveSoftmax.get_log_prob``.
"""
import torch
import torch.nn.functional as F


def adaptive_log_probs(features, head, tails, head_words):
    """Log-probabilities over the vocabulary from ``features`` (..., d): ``head(h)`` scores the
    ``head_words`` most frequent words then one entry per cluster, ``tails[i](h)`` the words of
    cluster i (its own projection and table); both read rows of h (N, d)."""
    rows = features.reshape(-1, features.size(-1))
    head_log_probs = F.log_softmax(head(rows), dim=-1)
    parts = [head_log_probs[:, :head_words]]
    for i, tail in enumerate(tails):
        prior = head_log_probs[:, head_words + i, None]
        parts.append(F.log_softmax(tail(rows), dim=-1) + prior)
    return torch.cat(parts, dim=-1).view(*features.shape[:-1], -1)
