#!/usr/bin/env python3
"""Facts about a fairseq checkpoint that the evaluation recipes need, read from its saved
configuration without building the model (loading uses average_checkpoints.load_checkpoint:
``weights_only=True`` with fairseq's allow-list).

usage:
  checkpoint_info.py CKPT positions    the longest sequence the model accepts: its
                                       max_target_positions, else the tokens_per_sample it
                                       was trained with (fairseq's LMs default one to the other)
  checkpoint_info.py CKPT block        the tokens_per_sample it was trained with (its task's)
  checkpoint_info.py CKPT positions block   both, one per line
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from average_checkpoints import load_checkpoint  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not set(argv[1:]) <= {"positions", "block"}:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    path, queries = argv[0], argv[1:]
    if not os.path.isfile(path):
        print(f"error: checkpoint {path} not found", file=sys.stderr)
        return 1
    state = load_checkpoint(path)
    for what in queries:
        value = max_positions(state) if what == "positions" else training_block(state)
        if value is None:
            print(f"error: {path} records " + ("neither max_target_positions nor tokens_per_sample"
                                                if what == "positions" else "no tokens_per_sample"),
                  file=sys.stderr)
            return 1
        print(value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
