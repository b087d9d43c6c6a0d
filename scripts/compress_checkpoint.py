#!/usr/bin/env python3
"""Compress a trained fairseq transformer into Tensor Chains (TT-SVD of the dense weights).

Reads a checkpoint of fairseq's own ``transformer`` (any of its archs, e.g. what the WMT
recipes produce) or ``transformer_lm`` and writes a ``slim_transformer`` / ``slim_lm``
checkpoint whose chosen linears are Tensor Chains with the bond that the same ``--tc-*`` ratio
gives a freshly built layer (see ``slim_fairseq/compression.py``). It loads with
``--user-dir slim_fairseq`` in fairseq-generate / fairseq-interactive / fairseq-eval-lm, and
fine-tunes with ``fairseq-train --restore-file OUT --reset-optimizer`` plus the model flags
this script prints.

Usage::

    python scripts/compress_checkpoint.py checkpoints/checkpoint_best.pt tc.pt --tc-ff 0.1 --tc-patt 0.3
"""
import argparse
import os
import shlex
import sys

from slim_fairseq_lab import command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="fairseq checkpoint of a transformer / transformer_lm arch")
    parser.add_argument("output", help="where to write the compressed checkpoint")
    for place, what in (("ff", "feed-forward linears fc1, fc2"), ("patt", "W_Q, W_K, W_V"),
                        ("layer", "ff and patt (a place given explicitly wins)"),
                        ("emb", "token table"), ("output", "vocabulary projection (not when tied)")):
        parser.add_argument(f"--tc-{place}", type=float, default=0.0, metavar="R",
                            help=f"Tensor-Chain ratio of the {what}: chain parameters / dense "
                                 "parameters, as the model option of the same name (0 = keep dense)")
    parser.add_argument("--tc-length", type=int, default=2, metavar="N", help="chain length (>= 2)")
    parser.add_argument("--data", help="directory with the dictionaries (default: the checkpoint's "
                                       "data directory)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing OUTPUT (refused without it)")
    parser.add_argument("--user-dir", default=os.path.join(REPO, "slim_fairseq"),
                        help="path of the slim_fairseq plugin")
    return parser


def main(argv=None):
    args = get_parser().parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING)
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(args.user_dir)))
    from slim_fairseq.compression import compress_checkpoint
    from slim_fairseq.option_errors import OptionError

    def log(message):
        print(f"[compress] {message}", file=sys.stderr, flush=True)

    try:
        _, flags = compress_checkpoint(
            args.checkpoint, args.output, tc_ff=args.tc_ff, tc_patt=args.tc_patt,
            tc_layer=args.tc_layer, tc_emb=args.tc_emb, tc_output=args.tc_output,
            tc_length=args.tc_length, data=args.data, log=log, force=args.force)
    except OptionError as err:
        print(f"compress_checkpoint: error: {err}", file=sys.stderr)
        return 2
    print("model flags: " + shlex.join(flags))
    print(f"fine-tune: fairseq-train DATA --user-dir {shlex.quote(args.user_dir)} {shlex.join(flags)} "
          f"--restore-file {shlex.quote(args.output)} --reset-optimizer ...")
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
