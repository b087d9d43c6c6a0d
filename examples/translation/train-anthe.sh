#!/usr/bin/env bash
# Train an Anthe translation model: slim_fairseq_lab/recipes/train_anthe.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.train_anthe "$@"
