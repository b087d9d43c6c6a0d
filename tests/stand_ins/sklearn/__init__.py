"""Stand-in for scikit-learn in the test suite (tests/stand_ins/README.md)."""
