#!/usr/bin/env python3
"""Export a fairseq checkpoint to Hugging Face transformers (the console script
``slim-fairseq-export-hf``; README, "Use your model outside fairseq").

Usage::

    python scripts/export_hf.py checkpoints/stlm/checkpoint_best.pt data-bin/mylm hf/stlm
"""
import sys

from slim_fairseq.export_hf.cli import main

if __name__ == "__main__":
    sys.exit(main())
