#!/usr/bin/env bash
# `make demo`: slim_fairseq_lab/demo.py (options and settings: --help).
PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.demo "$@"
