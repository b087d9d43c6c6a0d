#!/usr/bin/env bash
# WMT16 English-Romanian, binarized for fairseq: slim_fairseq_lab/recipes/prepare_wmt16enro.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.prepare_wmt16enro "$@"
