"""Stand-in for scipy.optimize: what transformers imports from it when it finds SciPy installed
(its object-detection loss, which the tests never run; tests/stand_ins/README.md)."""
from _unused import unused

linear_sum_assignment = unused("scipy.optimize.linear_sum_assignment")
