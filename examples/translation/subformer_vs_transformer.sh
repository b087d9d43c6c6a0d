#!/usr/bin/env bash
# Shrunk Subformer vs a transformer on the bundled en-de: slim_fairseq_lab/recipes/subformer_vs_transformer.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.subformer_vs_transformer "$@"
