#!/usr/bin/env python3
"""Remove W_Q (or W_K, W_V) and P from a trained skipless checkpoint, exactly (Graef, arXiv:2404.12362;
docs/TECHNIQUES.md#weight-removal).

Reads a fairseq checkpoint of a ``skipless_lm`` arch and writes a checkpoint of the same arch
with ``--removed-weights`` set, which fairseq-eval-lm / fairseq-generate / fairseq-interactive
load directly (with ``--user-dir slim_fairseq``). Serial layout: Q (or K, V) and P disappear
from every block. Parallel layout: only Q (or K, V) cancels exactly; P is kept and reported.
The optimizer state is dropped: to continue training, pass ``--reset-optimizer``.

Usage::

    python scripts/remove_weights.py checkpoints/checkpoint_best.pt reduced.pt --removed-weights q
"""
import argparse
import os
import sys

from slim_fairseq_lab import command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="fairseq checkpoint of a skipless_lm arch")
    parser.add_argument("output", help="where to write the reduced checkpoint")
    parser.add_argument("--removed-weights", default="q", help="q (default; MHA/MQA/GQA), k or v (MHA only)")
    parser.add_argument("--max-condition", type=float, default=None,
                        help="refuse a removed matrix whose condition number exceeds this (default 1e8)")
    parser.add_argument("--user-dir", default=os.path.join(REPO, "slim_fairseq"),
                        help="path of the slim_fairseq plugin")
    args = parser.parse_args(argv)

    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(args.user_dir)))
    from slim_fairseq.weight_removal import DEFAULT_MAX_CONDITION, convert_checkpoint

    max_condition = DEFAULT_MAX_CONDITION if args.max_condition is None else args.max_condition
    try:
        report = convert_checkpoint(args.checkpoint, args.output, args.removed_weights, max_condition)
    except ValueError as err:
        print(f"remove_weights: error: {err}", file=sys.stderr)
        return 2
    for line in report:
        print(line)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
