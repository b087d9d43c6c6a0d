"""Stand-in for scipy.optimize: what transformers' model classes import from it at load time
(its object-detection losses; tests/stand_ins/README.md)."""
from _unused import unused

linear_sum_assignment = unused("scipy.optimize.linear_sum_assignment")
