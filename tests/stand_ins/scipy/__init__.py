"""Stand-in for SciPy in the test suite (tests/stand_ins/README.md)."""
