#!/usr/bin/env python3
"""Aten ops per training step and per decoding step of plugin models against fairseq's model of
the same shape (default: 3 layers, width 128, 4 heads, FFN 512, a batch of 8 x 32 tokens), on
the CPU: the count that stands for kernel launches in docs/GPU.md and tests/test_op_counts.py; with
``--autocast`` the training step runs as ``fairseq-train --amp`` runs it.

    python scripts/op_counts.py --model stlm_tied --model skipless_lm --model anthe_base
    python scripts/op_counts.py --autocast fp16    # the counts tests/test_op_counts.py holds
    python scripts/op_counts.py --bytes --autocast fp16 --model anthe_base --batch 64 --length 128

prints a markdown table: ops of one step called from Python or autograd (``top``; torch's
F.rms_norm counted as the one kernel it is on CUDA), all ops the profiler lists (``all``), and
both against ``transformer_lm`` (pre-norm) or ``transformer``; with ``--bytes``, the bytes one
training step writes instead (what tests/test_bytes_written.py holds at the default shape). The
library is slim_fairseq_lab.benchmark.op_count.
"""
import argparse
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.benchmark import op_count

AUTOCAST = {"fp16": "float16", "bf16": "bfloat16"}


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="ARCH",
                   help="a plugin architecture (repeatable); default: the ones tests/test_op_counts.py holds")
    p.add_argument("--autocast", choices=sorted(AUTOCAST), default=None,
                   help="count the training step's forward and loss under the CPU's autocast to "
                        "this dtype (default: off, fp32)")
    p.add_argument("--bytes", action="store_true",
                   help="print the bytes one training step writes (fused attention and RMSNorm "
                        "as their CUDA kernels write) instead of op counts")
    defaults = op_count.OpShape()
    for name in ("dim", "layers", "heads", "ffn", "batch", "length", "decode_steps"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name),
                       help=f"default {getattr(defaults, name)}")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    import torch
    from slim_fairseq_lab import contract, specs
    from slim_fairseq_lab.gpu_check import prepare_data, task_argv
    archs = args.model or list(op_count.FAMILIES)
    known = contract.plugin_archs()
    unknown = [a for a in archs if a not in known]
    if unknown:
        raise SystemExit(f"op_counts.py: --model={unknown[0]}: not a plugin architecture; allowed: "
                         + ", ".join(sorted(known)))
    models = {arch: specs.is_language_model(arch) for arch in archs}
    shape = op_count.OpShape(args.dim, args.layers, args.heads, args.ffn, args.batch, args.length,
                             args.decode_steps)
    data = prepare_data()  # the small subsets of the bundled corpora the tests use

    def build(arch, overrides, lm):
        return contract.build(arch, overrides, task_argv(lm, data))

    autocast = getattr(torch, AUTOCAST[args.autocast]) if args.autocast else None
    if args.bytes:
        written = op_count.compare_bytes(build, models, shape, autocast=autocast)
        print(op_count.bytes_markdown(written, models))
        return written
    counts = op_count.compare(build, models, shape, autocast=autocast)
    print(op_count.markdown(counts, models))
    return counts


if __name__ == "__main__":
    sys.exit(command.run(main))
