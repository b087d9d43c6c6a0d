"""Stand-in for sklearn.metrics: what fairseq imports from it (tests/stand_ins/README.md)."""
from _unused import unused

f1_score = unused("sklearn.metrics.f1_score")
matthews_corrcoef = unused("sklearn.metrics.matthews_corrcoef")
roc_auc_score = unused("sklearn.metrics.roc_auc_score")
roc_curve = unused("sklearn.metrics.roc_curve")
