#!/usr/bin/env bash
# STLM weight tying on the bundled WikiText-2: slim_fairseq_lab/recipes/stlm_tying_wikitext2.py (options: --help).
PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.recipes.stlm_tying_wikitext2 "$@"
