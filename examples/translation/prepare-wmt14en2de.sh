#!/usr/bin/env bash
# WMT14 English-German, binarized for fairseq: slim_fairseq_lab/recipes/prepare_wmt14en2de.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.prepare_wmt14en2de "$@"
