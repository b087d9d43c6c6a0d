#!/usr/bin/env bash
# Evaluate a translation model: BLEU (tuned length penalty) and perplexity: slim_fairseq_lab/recipes/evaluate.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.evaluate "$@"
