#!/usr/bin/env bash
# Skipless LM vs a pre-LN transformer LM on the bundled WikiText-2: slim_fairseq_lab/recipes/skipless_vs_preln.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.skipless_vs_preln "$@"
