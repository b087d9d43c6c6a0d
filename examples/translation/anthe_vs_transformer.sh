#!/usr/bin/env bash
# Anthe-shaped vs fairseq-transformer-shaped translation on the bundled en-de: slim_fairseq_lab/recipes/anthe_vs_transformer.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.anthe_vs_transformer "$@"
