"""Reading fairseq checkpoints without building the model or importing fairseq, and averaging
them (scripts/average_checkpoints.py, scripts/checkpoint_info.py and the evaluation recipes).

Loading uses ``torch.load(weights_only=True)`` with the allow-list of
:mod:`slim_fairseq.checkpoint_safety` (docs/TECHNIQUES.md#safe-checkpoint-loading), which is
loaded by its path so that reading a checkpoint does not import fairseq. A file that is not a
complete checkpoint (a copy or a save that did not finish) is a one-line
:class:`OptionError` (the plugin's one error class) naming the file, not torch's traceback.
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys

from slim_fairseq_lab.paths import plugin_module

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")
# the sections of a fairseq >= 0.10 config besides "model" (their options do not shape the model)
RUN_SECTIONS = ("common", "common_eval", "distributed_training", "dataset", "optimization",
                "checkpoint", "bmuf", "generation", "eval_lm", "interactive", "task", "criterion",
                "optimizer", "lr_scheduler", "scoring", "bpe", "tokenizer", "ema")


#: a checkpoint that cannot be read or used: one line naming the file (slim_fairseq/option_errors.py)
OptionError = plugin_module("option_errors").OptionError


def _checkpoint_safety():
    return plugin_module("checkpoint_safety")


def _data_record():
    return plugin_module("data_record")


def data_record(path: str, state: dict) -> dict | None:
    """What checkpoint ``path`` (loaded as ``state``) records of its data and run
    (slim_fairseq/data_record.py): the record in its weights (the plugin's models), else the one a
    recipe wrote beside it (fairseq's own models trained through a recipe), else None."""
    records = _data_record()
    found = records.of_state(state.get("model"))
    if found is not None:
        return found
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), records.SAVE_DIR_FILE)
    try:
        with open(beside, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if records.is_record(found) else None


def read_dictionary(path: str) -> list[str]:
    """The symbols of a fairseq dictionary file in fairseq's order (its special symbols first),
    as fairseq's ``Dictionary.load`` reads them."""
    from fairseq.data import Dictionary
    return list(Dictionary.load(path).symbols)


def data_bin_record(data: str, trained: dict) -> dict:
    """The record of data-bin ``data``'s dictionaries named as in ``trained`` (``dictionary``:
    dict.txt; ``source`` / ``target``: the dict.LANG.txt files ``trained`` names)."""
    records = _data_record()
    entries = {}
    for name, entry in trained["dictionaries"].items():
        base = "dict.txt" if name == "dictionary" else os.path.basename(entry.get("file") or "")
        file = os.path.join(data, base)
        if base and os.path.isfile(file):
            entries[name] = records.dictionary_entry(read_dictionary(file), file)
    return records.make(entries, data)


def data_mismatch(path: str, state: dict, data: str) -> str | None:
    """The one-line refusal of evaluating checkpoint ``path`` on data-bin ``data`` when its
    dictionaries are not those the checkpoint was trained with; None when they are (or when
    the checkpoint records none)."""
    trained = data_record(path, state)
    if trained is None:
        return None
    return _data_record().mismatch(data_bin_record(data, trained), trained, path)


def run_of(path: str, state: dict) -> str | None:
    """The run id of checkpoint ``path`` (None: not recorded)."""
    found = data_record(path, state)
    return found.get("run") if found else None


def load(path: str, mmap: bool = False) -> dict:
    """The checkpoint at ``path`` (torch.load with weights_only=True and fairseq's allow-list);
    ``mmap``: tensors are mapped from the file, not read (to look at the configuration of a large
    checkpoint)."""
    if not os.path.isfile(path):
        raise OptionError(f"{path}: checkpoint not found")
    try:
        if mmap and _zip_format(path):
            import torch
            with _checkpoint_safety().allowed():
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return _checkpoint_safety().load(path)
    except Exception as error:  # noqa: BLE001 - torch raises several kinds for a damaged file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OptionError(f"{path}: not a complete checkpoint ({reason}): a copy or a save "
                              "that did not finish") from None


def _zip_format(path: str) -> bool:
    """Whether ``path`` is in torch's zip format (the one ``mmap`` reads; older files are not)."""
    import zipfile
    return zipfile.is_zipfile(path)


def section(state: dict, name: str):
    """cfg.NAME of a fairseq >= 0.10 checkpoint, or the flat args Namespace of an older one."""
    cfg = state.get("cfg")
    if cfg is not None and _get(cfg, name) is not None:
        return _get(cfg, name)
    return state.get("args")


def _get(holder, key: str):
    if holder is None:
        return None
    if isinstance(holder, dict) or hasattr(holder, "get"):
        try:
            return holder.get(key)
        except Exception:  # noqa: BLE001 - an omegaconf node without the key
            return None
    return getattr(holder, key, None)


def options(holder) -> dict:
    """A config section (dict, omegaconf node or Namespace) as a plain dict."""
    if holder is None:
        return {}
    if isinstance(holder, dict):
        return dict(holder)
    if hasattr(holder, "items"):
        return {key: holder.get(key) for key in holder}
    return dict(vars(holder))


def value(state: dict, section_name: str, key: str):
    return _get(section(state, section_name), key)


def arch(state: dict) -> str | None:
    model = section(state, "model")
    return _get(model, "arch") or _get(model, "_name")


def task_name(state: dict) -> str | None:
    return _get(section(state, "task"), "_name") or _get(section(state, "task"), "task")


def languages(state: dict) -> tuple[str | None, str | None]:
    """(source, target) language the model was trained to translate (None where not recorded)."""
    task = section(state, "task")
    model = section(state, "model")
    return (_get(task, "source_lang") or _get(model, "source_lang"),
            _get(task, "target_lang") or _get(model, "target_lang"))


def max_positions(state: dict) -> int | None:
    """The model's max_target_positions, else the training tokens_per_sample (None if neither)."""
    found = value(state, "model", "max_target_positions")
    if found is None:
        found = value(state, "task", "tokens_per_sample")
    return int(found) if found is not None else None


def training_block(state: dict) -> int | None:
    """The tokens_per_sample of the task the model was trained with (None if not recorded)."""
    found = value(state, "task", "tokens_per_sample")
    return int(found) if found is not None else None


def model_options(state: dict) -> dict:
    """The options that define the model: its config section without the options of the other
    sections (a model of fairseq's older kind keeps the whole command line there)."""
    model = options(section(state, "model"))
    cfg = state.get("cfg")
    run = set(RUN_SECTIONS)  # their names too (a model of the older kind records e.g. its criterion)
    for name in RUN_SECTIONS:
        run |= set(options(_get(cfg, name))) if cfg is not None else set()
    return {key: value for key, value in model.items() if key not in run}


def option_differences(a: dict, b: dict, limit: int = 3) -> list[str]:
    """``--flag A vs B`` for the options of two models that differ (at most ``limit``)."""
    found = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            found.append(f"--{key.replace('_', '-')} {a.get(key)} vs {b.get(key)}")
    return found[:limit] + (["..."] if len(found) > limit else [])


def last_checkpoints(folder: str, count: int, pattern: re.Pattern, upper_bound: int | None = None) -> list[str]:
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
        raise OptionError(f"--inputs: {folder} holds {len(found)} matching checkpoints, {count} requested")
    return [path for _, path in found[:count]]


def complete_neighbour(path: str) -> str | None:
    """The newest other checkpoint (checkpoint*.pt) in the folder of ``path`` that loads, or
    None: what to use in place of ``path`` when it is not complete."""
    folder = os.path.dirname(path) or "."
    found = []
    for name in os.listdir(folder):
        other = os.path.join(folder, name)
        if re.fullmatch(r"checkpoint.*\.pt", name) and name != os.path.basename(path) and os.path.isfile(other):
            found.append((-os.path.getmtime(other), name, other))
    for _, _, other in sorted(found):
        try:
            load(other, mmap=True)
        except OptionError:
            continue
        return other
    return None


def average(paths: list[str], several_runs: bool = False) -> dict:
    """Element-wise mean of the ``model`` weights of PATHS (their other fields, the record of
    their data and run included: the first's). Refused when the checkpoints hold other
    parameters, were trained with other model options (an average of two models would keep the
    first one's settings) or belong to other runs (independently trained models do not average
    to a model; ``several_runs``: allowed on purpose)."""
    import torch

    result = None
    sums: dict = {}
    keys = None
    first_options = None
    first_run = None
    for path in paths:
        state = load(path)
        model = {key: value for key, value in state["model"].items() if torch.is_tensor(value)}
        run = run_of(path, state)
        if keys is None:
            keys = list(model.keys())
            result = state
            first_options = model_options(state)
            first_run = run
        elif set(model.keys()) != set(keys):
            raise OptionError(f"--inputs: {path}: its parameters differ from those of {paths[0]}; "
                                  "allowed: checkpoints of one run")
        else:
            differences = option_differences(first_options, model_options(state))
            if differences:
                raise OptionError(f"--inputs: {path} was trained with other model options than "
                                      f"{paths[0]} ({', '.join(differences)}); allowed: checkpoints of "
                                      "one run (the same --arch and model options)")
            if not several_runs and run and first_run and run != first_run:
                raise OptionError(f"--inputs: {path} is a checkpoint of another run than {paths[0]} "
                                      f"(run {run[:8]}, and {first_run[:8]}): independently trained models do "
                                      f"not average to a model; allowed: checkpoints of one run, or "
                                      f"{SEVERAL_RUNS} to average them on purpose")
        for key in keys:
            tensor = model[key]
            if tuple(tensor.shape) != tuple(result["model"][key].shape):
                raise OptionError(f"--inputs: {path}: {key} is {tuple(tensor.shape)}, "
                                      f"{tuple(result['model'][key].shape)} in {paths[0]}; allowed: "
                                      "checkpoints of one run")
            if not torch.is_floating_point(tensor):
                sums.setdefault(key, tensor.clone())  # integer buffers are taken as they are
                continue
            total = tensor.to(torch.float64)
            sums[key] = total if key not in sums else sums[key] + total
    averaged = collections.OrderedDict()
    for key, value in result["model"].items():
        if not torch.is_tensor(value):
            averaged[key] = value  # the record of the data and the run (the first's)
        elif torch.is_floating_point(value):
            averaged[key] = (sums[key] / len(paths)).to(value.dtype)
        else:
            averaged[key] = sums[key]
    result["model"] = averaged
    result.pop("last_optimizer_state", None)
    return result


#: the option of scripts/average_checkpoints.py that averages checkpoints of several runs
SEVERAL_RUNS = "--allow-several-runs"
