"""Stand-in for scipy.stats: what fairseq imports from it (tests/stand_ins/README.md)."""
from _unused import unused

pearsonr = unused("scipy.stats.pearsonr")
spearmanr = unused("scipy.stats.spearmanr")
