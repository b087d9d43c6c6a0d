#!/usr/bin/env bash
# Train a skipless language model: slim_fairseq_lab/recipes/train_skipless.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.train_skipless "$@"
