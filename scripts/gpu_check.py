#!/usr/bin/env python3
"""Device check of slim_fairseq on one CUDA GPU, or at tiny size on the CPU (docs/GPU.md).

    python scripts/gpu_check.py [--out DIR] [--budget SECONDS] [--stages LIST]   # one CUDA GPU
    python scripts/gpu_check.py --cpu --out DIR                                  # the same code, tiny, CPU

Writes DIR/report.md and DIR/report.json (after every stage); exits 1 when a check failed.
The logic lives in slim_fairseq_lab/gpu_check.py.
"""
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.gpu_check import main

if __name__ == "__main__":
    sys.exit(command.run(main))
