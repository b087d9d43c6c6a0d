#!/usr/bin/env bash
# `make demo`: slim_fairseq_lab/demo.py (options and settings: --help),
# about 7 minutes on 2 idle cores, the first run's data preparation (1 minute) included.
PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m slim_fairseq_lab.demo "$@"
