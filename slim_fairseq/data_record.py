"""A checkpoint knows its data: the record of the dictionaries a model was trained with, and of
the run it belongs to.

A model of the plugin computes its record when it is built (from the task's dictionaries) and
keeps it in its state dict under torch's extra-state key (``_extra_state``), so every checkpoint
fairseq writes carries it, in plain types only (``torch.load(weights_only=True)`` reads it):

    {"format": 1, "run": "<hex id>", "data": "<data-bin path, a hint>",
     "dictionaries": {"dictionary" | "source" | "target":
                      {"file": "<dict file>", "size": N, "sha256": "<hex>", "symbols": [...]}}}

Loading a checkpoint into a model built against the current data (fairseq-generate, -eval-lm,
-interactive, fairseq-train --restore-file or a resume, the hub, the export) compares the two
records first: another dictionary, even a shuffled one of the same size, is refused in one line
naming the data-bin's dict file, the checkpoint and the first difference. A checkpoint written
before the record loads as it did. The run id is made when a model is built and taken over from
the checkpoint loaded into it, so a training resumed from its own checkpoint keeps its run
(averaging refuses checkpoints of different runs: slim_fairseq_lab.checkpoints).

This file imports nothing from fairseq or from the rest of the package (the lab loads it by
path to read checkpoints without importing fairseq).
"""
import hashlib
import os
import sys
import uuid

#: torch's key for a module's extra state (nn.Module.get_extra_state) at the model's top level
KEY = "_extra_state"
FORMAT = 1
#: the file, next to the checkpoints of a recipe's run of fairseq's own models, that holds the
#: same record (fairseq's models carry none in their checkpoints)
SAVE_DIR_FILE = "data_record.json"


def dictionary_entry(symbols, file=None):
    """The record of one dictionary: its symbols in order (fairseq's ``Dictionary.symbols``,
    special symbols first), their count and digest, and the file it was read from (a hint)."""
    symbols = [str(s) for s in symbols]
    digest = hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()
    return {"file": file, "size": len(symbols), "sha256": digest, "symbols": symbols}


def new_run_id():
    return uuid.uuid4().hex


def make(dictionaries, data=None, run=None):
    """A record of ``dictionaries`` ({name: entry of :func:`dictionary_entry`})."""
    return {"format": FORMAT, "run": run or new_run_id(), "data": data,
            "dictionaries": dict(dictionaries)}


def is_record(value):
    return isinstance(value, dict) and value.get("format") == FORMAT and "dictionaries" in value


def of_state(model_state):
    """The record in a checkpoint's ``model`` state dict, or None (a checkpoint without one)."""
    value = model_state.get(KEY) if isinstance(model_state, dict) else None
    return value if is_record(value) else None


def first_difference(current, trained):
    """How dictionary entry ``current`` (of the data read now) differs from ``trained`` (of the
    checkpoint), in words, or None when they are the same."""
    if current["size"] == trained["size"] and current["sha256"] == trained["sha256"]:
        return None
    if current["size"] != trained["size"]:
        return f"{current['size']} entries here, {trained['size']} in the checkpoint's"
    ours, theirs = current.get("symbols") or [], trained.get("symbols") or []
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return (f"the same size, {current['size']}; entry {index} is {a!r} here, {b!r} in the "
                    "checkpoint's")
    return f"the same size, {current['size']}, other entries"


def mismatch(current, trained, checkpoint="the checkpoint",
             otherwise="a checkpoint trained on this data-bin"):
    """The one-line refusal (without the program's prefix) of data ``current`` for a checkpoint
    whose record is ``trained``, or None when every dictionary they both name is the same
    (``otherwise``: the second thing that works, after the data-bin it was trained with)."""
    for name, entry in current["dictionaries"].items():
        other = trained["dictionaries"].get(name)
        if other is None:
            continue
        difference = first_difference(entry, other)
        if difference is None:
            continue
        where = entry.get("file") or f"the {name} dictionary"
        hint = trained.get("data") or other.get("file")
        allowed = (f"the data-bin {checkpoint} was trained with" + (f" ({hint})" if hint else "")
                   + f", or {otherwise}")
        return (f"{where}: another dictionary than the one {checkpoint} was trained with "
                f"({difference}); allowed: {allowed}")
    return None


def checkpoint_being_loaded():
    """The file of the checkpoint whose weights are being loaded, from the caller's frames:
    fairseq's loaders (``filename``) or the plugin's (``path``); None when not found."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        names = ("filename",) if module.startswith("fairseq") else (
            ("path", "checkpoint") if module.startswith(("slim_fairseq", "__main__")) else ())
        for name in names:
            value = frame.f_locals.get(name)
            if isinstance(value, str) and os.path.isfile(value):
                return value
        frame = frame.f_back
    return None
