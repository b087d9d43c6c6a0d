"""Allow-list of the classes that fairseq checkpoints contain, for torch's ``weights_only`` loading.

torch >= 2.6 loads with ``weights_only=True``: only tensors, primitive containers and
explicitly allow-listed globals are rebuilt, so a checkpoint whose pickle would run code is
refused. fairseq checkpoints additionally hold (docs/TECHNIQUES.md#safe-checkpoint-loading):

* ``argparse.Namespace`` -- the config of legacy (``add_args``) models;
* with ``--eval-bleu``: numpy arrays in the meters' state;
* on multi-rank resume, ranks > 0 receive the state through ``torch.save``/``torch.load`` of
  omegaconf containers, fairseq's ``_TensorPlaceholder`` and a ``defaultdict``.

Exactly these are added; safety is never switched off.

This file imports nothing from fairseq or from the rest of the package, so scripts that only
read checkpoints load it by path (``scripts/average_checkpoints.py``) without importing fairseq.
"""
import argparse
import collections
import contextlib
import importlib
import sys
import typing

import torch


def _optional(module_name, attr, import_missing=True):
    if not import_missing and module_name not in sys.modules:
        return None
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None


def allowed_globals(import_fairseq=True):
    """The list of globals fairseq checkpoints need (those importable in this environment).

    With ``import_fairseq=False`` fairseq's own class is listed only if fairseq already loaded
    it: only fairseq's distributed code sends it, so a process without it reads none.
    """
    import numpy as np

    names = [
        ("numpy.core.multiarray", "_reconstruct"),   # numpy 1.x pickles
        ("numpy._core.multiarray", "_reconstruct"),  # numpy 2.x pickles
        ("omegaconf.dictconfig", "DictConfig"),
        ("omegaconf.listconfig", "ListConfig"),
        ("omegaconf.base", "ContainerMetadata"),
        ("omegaconf.base", "Metadata"),
        ("omegaconf.nodes", "AnyNode"),
        ("fairseq.distributed.utils", "_TensorPlaceholder"),
    ]
    found = [argparse.Namespace, np.ndarray, np.dtype, typing.Any, collections.defaultdict,
             dict, list, int, float, str, bool, tuple, set]
    # numpy >= 1.25 pickles dtypes through their per-type classes (numpy.dtypes.Float64DType, ...)
    dtypes = _optional("numpy", "dtypes")
    if dtypes is not None:
        for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType",
                     "Int16DType", "Int8DType", "UInt8DType", "BoolDType"):
            cls = getattr(dtypes, name, None)
            if cls is not None:
                found.append(cls)
    for module_name, attr in names:
        obj = _optional(module_name, attr, import_fairseq or not module_name.startswith("fairseq"))
        if obj is not None and obj not in found:
            found.append(obj)
    return found


@contextlib.contextmanager
def allowed():
    """The allow-list for the duration of a ``with`` block.

    Unlike ``torch.serialization.safe_globals``, whose exit removes every listed class even if
    it was registered before (by :func:`install` when the plugin is imported), this removes
    only what it added, so the process keeps the allow-list it had.
    """
    serialization = torch.serialization
    if not hasattr(serialization, "add_safe_globals"):  # torch < 2.4: no allow-list needed
        yield
        return
    before = list(serialization.get_safe_globals())
    added = [g for g in allowed_globals(import_fairseq=False) if g not in before]
    serialization.add_safe_globals(added)
    try:
        yield
    finally:
        remaining = [g for g in serialization.get_safe_globals() if g not in added]
        serialization.clear_safe_globals()
        serialization.add_safe_globals(remaining)


def load(path, map_location="cpu"):
    """``torch.load(path, weights_only=True)`` with the allow-list (and only it) in force."""
    with allowed():
        return torch.load(path, map_location=map_location, weights_only=True)


def install():
    """Register :func:`allowed_globals` with torch's weights-only unpickler (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(allowed_globals())
