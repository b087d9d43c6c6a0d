#!/usr/bin/env bash
# Perplexity of a language model with fairseq-eval-lm: slim_fairseq_lab/recipes/evaluate_lm.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.evaluate_lm "$@"
