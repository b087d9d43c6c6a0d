#!/usr/bin/env bash
# Train an STLM weight-tying language model: slim_fairseq_lab/recipes/train_stlm.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.train_stlm "$@"
