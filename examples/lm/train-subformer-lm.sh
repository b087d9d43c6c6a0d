#!/usr/bin/env bash
# Train a Subformer language model on WikiText-103: slim_fairseq_lab/recipes/train_subformer_lm.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.train_subformer_lm "$@"
