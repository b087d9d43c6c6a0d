#!/usr/bin/env python3
"""Facts about a fairseq checkpoint that the evaluation recipes need, read from its saved
configuration without building the model or importing fairseq (slim_fairseq_lab.checkpoints:
weights_only=True with fairseq's allow-list).

  checkpoint_info.py CKPT positions    the longest sequence the model accepts: its
                                       max_target_positions, else the tokens_per_sample it
                                       was trained with (fairseq's LMs default one to the other)
  checkpoint_info.py CKPT block        the tokens_per_sample it was trained with (its task's)
  checkpoint_info.py CKPT positions block   both, one per line

Prints each value on a line of its own; exits 2 with a one-line error when the checkpoint is
missing, not a complete checkpoint, or does not record a value asked for.
"""

from __future__ import annotations

import argparse
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.checkpoints import OptionError, load, max_positions, training_block


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CKPT", help="a fairseq checkpoint (.pt)")
    parser.add_argument("what", nargs="+", choices=["positions", "block"],
                        help="the facts to print, in order: positions, block")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        state = load(args.checkpoint)
    except OptionError as error:
        return command.refused(error, "checkpoint_info")
    for what in args.what:
        value = max_positions(state) if what == "positions" else training_block(state)
        if value is None:
            missing = "neither max_target_positions nor tokens_per_sample" if what == "positions" else \
                "no tokens_per_sample"
            return command.refused(f"{args.checkpoint} records {missing}", "checkpoint_info")
        print(value)
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
