"""Allow-list of the classes that fairseq checkpoints contain, for torch's ``weights_only`` loading.

torch >= 2.6 loads with ``weights_only=True``: only tensors, primitive containers and
explicitly allow-listed globals are rebuilt, so a checkpoint whose pickle would run code is
refused. fairseq checkpoints additionally hold (docs/TECHNIQUES.md#safe-checkpoint-loading):

* ``argparse.Namespace`` -- the config of legacy (``add_args``) models;
* with ``--eval-bleu``: numpy arrays in the meters' state;
* on multi-rank resume, ranks > 0 receive the state through ``torch.save``/``torch.load`` of
  omegaconf containers, fairseq's ``_TensorPlaceholder`` and a ``defaultdict``.

Exactly these are added; safety is never switched off.
"""
import argparse
import collections
import importlib
import typing

import torch


def _optional(module_name, attr):
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None


def allowed_globals():
    """The list of globals fairseq checkpoints need (those importable in this environment)."""
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
        obj = _optional(module_name, attr)
        if obj is not None and obj not in found:
            found.append(obj)
    return found


def install():
    """Register :func:`allowed_globals` with torch's weights-only unpickler (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(allowed_globals())
