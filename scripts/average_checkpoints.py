#!/usr/bin/env python3
"""Average the parameters of several fairseq checkpoints (the usual last-N averaging before
evaluation; fairseq's own scripts/average_checkpoints.py is not part of its wheel).

Checkpoints are read with ``torch.load(weights_only=True)``; the only non-tensor objects allowed
are those fairseq checkpoints contain (docs/TECHNIQUES.md#safe-checkpoint-loading: argparse.Namespace, a few numpy and
omegaconf types). The output keeps every field of the newest input (cfg / args, extra state)
with the averaged ``model`` weights; optimizer state is dropped (the result is for inference).
A folder's checkpoints are picked by their number (checkpoint10.pt is newer than
checkpoint9.pt); the averaged files are listed, oldest first, on stdout (one per line).
Refused, in one line: checkpoints whose parameters or model options differ from the first's
(the average would keep the first one's settings), checkpoints of different runs (each
checkpoint records the run it belongs to; independently trained models do not average to a
model) unless --allow-several-runs, an --output that is one of the inputs, and an existing
--output without --force.
The library is slim_fairseq_lab.checkpoints.

usage:
  average_checkpoints.py --inputs DIR --num-update-checkpoints 5 --output avg.pt
  average_checkpoints.py --inputs DIR --num-epoch-checkpoints 5 --output avg.pt
  average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt
"""

from __future__ import annotations

import argparse
import os
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.checkpoints import (  # noqa: F401 (re-exported: the script's library)
    EPOCH_PATTERN, SEVERAL_RUNS, UPDATE_PATTERN, OptionError, average, last_checkpoints, load)

load_checkpoint = load
PROG = "average_checkpoints"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="checkpoint files, or one folder with --num-*-checkpoints")
    parser.add_argument("--output", required=True, help="file to write the averaged checkpoint to")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, help="last N checkpointEPOCH.pt files")
    group.add_argument("--num-update-checkpoints", type=int, help="last N checkpoint_E_U.pt files")
    parser.add_argument("--checkpoint-upper-bound", type=int,
                        help="ignore checkpoints after this epoch / update number")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --output (refused without it)")
    parser.add_argument(SEVERAL_RUNS, action="store_true",
                        help="average checkpoints of different runs on purpose (refused without it: "
                        "each checkpoint records its run, and independent runs do not average to a model)")
    parser.add_argument("--quiet", action="store_true",
                        help="no messages on stderr (errors excepted); stdout still lists the inputs")
    args = parser.parse_args(argv)

    count = args.num_epoch_checkpoints or args.num_update_checkpoints
    if count is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-*-checkpoints needs exactly one folder in --inputs")
        pattern = EPOCH_PATTERN if args.num_epoch_checkpoints else UPDATE_PATTERN
        try:
            paths = last_checkpoints(args.inputs[0], count, pattern, args.checkpoint_upper_bound)
        except OptionError as err:
            return command.refused(err, PROG)
    else:
        paths = args.inputs
        missing = [path for path in paths if not os.path.isfile(path)]
        if missing:
            return command.refused(f"--inputs: {missing[0]} is not a checkpoint file", PROG)
    for path in paths:
        if os.path.exists(args.output) and os.path.samefile(args.output, path):
            return command.refused(f"--output={args.output}: is the input {path}, which averaging "
                                   "would overwrite; allowed: another file", PROG)
    if os.path.isdir(args.output):
        return command.refused(f"--output={args.output}: is a folder; allowed: a file name", PROG)
    if os.path.lexists(args.output) and not args.force:
        return command.refused(f"--output={args.output}: exists; allowed: --force to replace it, or "
                               "another file", PROG)
    if not args.quiet:
        print("averaging:", *paths, sep="\n  ", file=sys.stderr)
    try:
        state = average(paths, several_runs=args.allow_several_runs)
    except OptionError as err:
        return command.refused(err, PROG)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    import torch
    torch.save(state, args.output)
    print(*reversed(paths) if count is not None else paths, sep="\n")
    if not args.quiet:
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
