#!/usr/bin/env python3
"""Average the parameters of several fairseq checkpoints (the usual last-N averaging before
evaluation; fairseq's own scripts/average_checkpoints.py is not part of its wheel).

Checkpoints are read with ``torch.load(weights_only=True)``; the only non-tensor objects allowed
are those fairseq checkpoints contain (docs/TECHNIQUES.md#safe-checkpoint-loading: argparse.Namespace, a few numpy and
omegaconf types). The output keeps every field of the newest input (cfg / args, extra state)
with the averaged ``model`` weights; optimizer state is dropped (the result is for inference).
A folder's checkpoints are picked by their number (checkpoint10.pt is newer than
checkpoint9.pt); the averaged files are listed, oldest first, on stdout (one per line).

usage:
  average_checkpoints.py --inputs DIR --num-update-checkpoints 5 --output avg.pt
  average_checkpoints.py --inputs DIR --num-epoch-checkpoints 5 --output avg.pt
  average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import os
import re
import sys

import torch

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


@functools.lru_cache(maxsize=None)
def _checkpoint_safety():
    """slim_fairseq/checkpoint_safety.py, loaded by path (once per process) so that reading a
    checkpoint does not import fairseq (the package's __init__ registers every model); the loaded
    package's module when it is already imported."""
    module = sys.modules.get("slim_fairseq.checkpoint_safety")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "slim_fairseq",
                            "checkpoint_safety.py")
        spec = importlib.util.spec_from_file_location("_slim_fairseq_checkpoint_safety", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def load_checkpoint(path: str) -> dict:
    """torch.load with weights_only=True and fairseq's allow-list (slim_fairseq.checkpoint_safety)."""
    return _checkpoint_safety().load(path)


def last_checkpoints(folder: str, count: int, pattern: re.Pattern, upper_bound: int | None) -> list[str]:
    """The COUNT checkpoints of FOLDER with the highest epoch / update number, compared as
    numbers (newest first)."""
    found = []
    for name in os.listdir(folder):
        match = pattern.match(name)
        if match:
            number = int(match.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, os.path.join(folder, name)))
    found.sort(reverse=True)
    if len(found) < count:
        raise ValueError(f"--inputs: {folder} holds {len(found)} matching checkpoints, {count} requested")
    return [path for _, path in found[:count]]


def average(paths: list[str]) -> dict:
    """Element-wise mean of the ``model`` weights of PATHS; other fields from the first path."""
    result = None
    sums: dict[str, torch.Tensor] = {}
    keys = None
    for path in paths:
        state = load_checkpoint(path)
        model = state["model"]
        if keys is None:
            keys = list(model.keys())
            result = state
        elif set(model.keys()) != set(keys):
            raise ValueError(f"{path}: its parameters differ from those of {paths[0]}")
        for key in keys:
            value = model[key]
            if not torch.is_floating_point(value):
                sums.setdefault(key, value.clone())  # integer buffers are taken as they are
                continue
            total = value.to(torch.float64)
            sums[key] = total if key not in sums else sums[key] + total
    averaged = collections.OrderedDict()
    for key in keys:
        value = result["model"][key]
        if torch.is_floating_point(value):
            averaged[key] = (sums[key] / len(paths)).to(value.dtype)
        else:
            averaged[key] = sums[key]
    result["model"] = averaged
    result.pop("last_optimizer_state", None)
    return result


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
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    else:
        paths = args.inputs
        missing = [path for path in paths if not os.path.isfile(path)]
        if missing:
            print(f"error: --inputs: {missing[0]} is not a checkpoint file", file=sys.stderr)
            return 1
    if not args.quiet:
        print("averaging:", *paths, sep="\n  ", file=sys.stderr)
    try:
        state = average(paths)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save(state, args.output)
    print(*reversed(paths) if count is not None else paths, sep="\n")
    if not args.quiet:
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
