#!/usr/bin/env bash
# WikiText-103, binarized for fairseq: slim_fairseq_lab/recipes/prepare_wikitext_103.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.prepare_wikitext_103 "$@"
