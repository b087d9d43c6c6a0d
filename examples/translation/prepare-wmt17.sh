#!/usr/bin/env bash
# WMT17 news translation (one pair with English), binarized for fairseq: slim_fairseq_lab/recipes/prepare_wmt17.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.prepare_wmt17 "$@"
