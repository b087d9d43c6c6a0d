#!/usr/bin/env python3
"""Facts about a fairseq checkpoint that the evaluation recipes need, read from its saved
configuration without building the model or importing fairseq (loading uses
scripts/average_checkpoints.py's load_checkpoint: weights_only=True with fairseq's allow-list).

  checkpoint_info.py CKPT positions    the longest sequence the model accepts: its
                                       max_target_positions, else the tokens_per_sample it
                                       was trained with (fairseq's LMs default one to the other)
  checkpoint_info.py CKPT block        the tokens_per_sample it was trained with (its task's)
  checkpoint_info.py CKPT positions block   both, one per line

Prints each value on a line of its own; exits 1 with a one-line error when the checkpoint is
missing or does not record a value asked for.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def load_checkpoint(path: str) -> dict:
    """scripts/average_checkpoints.py's ``load_checkpoint`` (that script is loaded by its path:
    scripts are not a package, and it reads checkpoints without importing fairseq)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_average_checkpoints", os.path.join(here, "average_checkpoints.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_checkpoint(path)


def _section(state: dict, name: str):
    """cfg.NAME of a fairseq >= 0.10 checkpoint, or the flat args Namespace of an older one."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get(name) is not None:
        return cfg[name]
    return state.get("args")


def _get(section, key: str):
    if section is None:
        return None
    if isinstance(section, dict) or hasattr(section, "get"):
        try:
            return section.get(key)
        except Exception:  # noqa: BLE001 - an omegaconf node without the key
            return None
    return getattr(section, key, None)


def max_positions(state: dict) -> int | None:
    """The model's max_target_positions, else the training tokens_per_sample (None if neither)."""
    value = _get(_section(state, "model"), "max_target_positions")
    if value is None:
        value = _get(_section(state, "task"), "tokens_per_sample")
    return int(value) if value is not None else None


def training_block(state: dict) -> int | None:
    """The tokens_per_sample of the task the model was trained with (None if not recorded)."""
    value = _get(_section(state, "task"), "tokens_per_sample")
    return int(value) if value is not None else None


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CKPT", help="a fairseq checkpoint (.pt)")
    parser.add_argument("what", nargs="+", choices=["positions", "block"],
                        help="the facts to print, in order: positions, block")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        print(f"error: checkpoint {args.checkpoint} not found", file=sys.stderr)
        return 1
    state = load_checkpoint(args.checkpoint)
    for what in args.what:
        value = max_positions(state) if what == "positions" else training_block(state)
        if value is None:
            missing = "neither max_target_positions nor tokens_per_sample" if what == "positions" else \
                "no tokens_per_sample"
            print(f"error: {args.checkpoint} records {missing}", file=sys.stderr)
            return 1
        print(value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
