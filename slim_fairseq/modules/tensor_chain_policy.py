"""How a Tensor-Chain layer runs on a device and dtype (docs/GPU.md#how-tensor-chains-choose):
materialise the weight or contract the input, over how many rows at a time, and what its
backward keeps. One table per device type and compute dtype (:data:`POLICIES`); the layers ask
:func:`contract_pays`, :func:`block_rows` and :func:`recompute_backward`.

The CPU entries were measured (scripts/tc_forward_timing.py and docs/RESULTS.md, "Tensor-Chain
rows in blocks" and "``--tc-backward store``"); the CUDA entries by the device check on an
H100 (docs/gpu/h100-2026-11-27/, docs/GPU.md#how-tensor-chains-choose).
"""
import contextlib
import math
from dataclasses import dataclass

import torch

FORWARD_MODES = ("auto", "materialise", "contract")
BACKWARD_MODES = ("auto", "recompute", "store")

# CPU: a two-core contraction runs over blocks of rows whose intermediate holds this many fp32
# floats (1 MiB; in other dtypes the same bytes), so that its second matmul reads it from cache:
# the Anthe feed-forward (two 512 -> 1365 chains and a 1365 -> 512 one, bond 2, 2,048 rows)
# trains 1.46x faster at 1 thread and 1.31x at 2 with it (docs/RESULTS.md, "Tensor-Chain rows in
# blocks"). scripts/benchmark.py --tc-one-pass sets it to inf.
BLOCK_FLOATS = 1 << 18
MIN_BLOCK_ROWS = 32


@dataclass(frozen=True)
class ChainPolicy:
    """The choices of one (device type, compute dtype).

    Contracting is chosen when materialise-and-multiply needs more than ``contract_small``
    (batches of at most ``small_batch_rows`` rows) or ``contract_large`` times its multiply-adds
    and saves at least ``min_saved_macs`` multiply-adds; ``row_blocks``: two-core contractions
    run over cache-sized blocks of rows; ``recompute_backward``: what ``--tc-backward auto``
    picks (True: keep only the input and the cores, recompute the intermediates);
    ``recompute_dense``: what a GLU keeps whose linears multiply by their weights, dense or
    chains that materialise W (True: its two hidden inputs only, recomputing the activation and
    its output in backward; False: plain autograd, no recomputation)."""
    small_batch_rows: int
    contract_small: float
    contract_large: float
    min_saved_macs: float
    row_blocks: bool
    recompute_backward: bool
    why: str
    recompute_dense: bool = True


CPU_POLICY = ChainPolicy(
    small_batch_rows=256, contract_small=1.5, contract_large=5.0, min_saved_macs=0.0,
    row_blocks=True, recompute_backward=True,
    why="measured on a 2-core CPU: contraction runs as small, memory-bound matmuls and pays off "
        "when it needs 1.5x (up to 256 rows) or 5x (more rows) fewer multiply-adds "
        "(scripts/tc_forward_timing.py); row blocks 1.3-1.5x faster; storing the intermediates "
        "bought no speed measurable against noise for 1.4-1.8x the memory")

# CUDA, measured on an H100 (docs/gpu/h100-2026-11-27/): inside the models, fp16 training with
# materialised chains ran 1.06x (d 512) and 1.56-1.81x (d 1024) as fast as with contractions,
# and generation with the weights built once (the dense export) at 0.84-1.21x fairseq's
# transformer against 0.30-0.72x rebuilding them; the chains alone (50 shapes x rows per dtype)
# ran both ways within each other's noise, launch-bound. So a chain on CUDA always multiplies by
# W (built once per step in training, once per weight in eval mode: TensorChainLinear.
# inference_weight). Backward: keeping the contraction's intermediates (store) trained 1.13-1.29x
# as fast for 4.1-6.9x the peak memory; recompute stays the default for --tc-forward contract.
# A dense GLU uses plain autograd on CUDA: an H200 step of stlm_tied fell from 0.92x to 0.62x
# transformer_lm's speed between 8,192 and 32,768 tokens, where elementwise passes over the
# hidden layer (its recomputation among them) grow with the batch. A GLU of chains that
# materialise has the same hidden layer and follows the same rule (not measured apart).
_CUDA_WHY = ("measured on an H100 (docs/gpu/h100-2026-11-27/): materialised chains trained "
             "1.06-1.81x as fast as contracted ones in fp16 and generate from W built once; no row "
             "blocks; a forced contraction recomputes in backward (store: 1.13-1.29x the speed for "
             "4.1-6.9x the memory); a dense GLU recomputes nothing (elementwise passes grow with "
             "the batch)")
CUDA_FP32_POLICY = ChainPolicy(
    small_batch_rows=256, contract_small=math.inf, contract_large=math.inf, min_saved_macs=0.0,
    row_blocks=False, recompute_backward=True, why=_CUDA_WHY, recompute_dense=False)
CUDA_HALF_POLICY = CUDA_FP32_POLICY

POLICIES = {
    ("cpu", torch.float32): CPU_POLICY,
    ("cpu", torch.float16): CPU_POLICY,
    ("cpu", torch.bfloat16): CPU_POLICY,
    ("cuda", torch.float32): CUDA_FP32_POLICY,
    ("cuda", torch.float16): CUDA_HALF_POLICY,
    ("cuda", torch.bfloat16): CUDA_HALF_POLICY,
}


def policy_for(device_type, dtype):
    """The :class:`ChainPolicy` of a device type ("cpu", "cuda"; others as "cuda": an
    accelerator) and compute dtype (other dtypes as fp32)."""
    device_type = "cpu" if device_type == "cpu" else "cuda"
    if dtype not in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return POLICIES[(device_type, dtype)]


_ASSUMED = []  # (device type, dtype) that :func:`target` answers instead, innermost last


@contextlib.contextmanager
def assume_target(device_type, dtype):
    """Inside the block, every chain chooses as on ``device_type`` in ``dtype`` wherever it runs:
    the CPU's op counts of a model as it would run on CUDA
    (slim_fairseq_lab/benchmark/op_count.py)."""
    _ASSUMED.append((device_type, dtype))
    try:
        yield
    finally:
        _ASSUMED.pop()


def device_and_autocast(like):
    """(device type of tensor ``like``, autocast's dtype where autocast is on for that device,
    else None)."""
    # is_cuda / is_cpu: a few times cheaper than building like.device (this runs per layer call)
    device_type = "cuda" if like.is_cuda else "cpu" if like.is_cpu else like.device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return device_type, torch.get_autocast_dtype(device_type)
    return device_type, None


def target(like):
    """(device type, compute dtype) of work on tensor ``like``: autocast's dtype where autocast
    is on for its device, else its own dtype (or what :func:`assume_target` says)."""
    if _ASSUMED:
        return _ASSUMED[-1]
    device_type, autocast = device_and_autocast(like)
    return device_type, like.dtype if autocast is None else autocast


def contract_pays(cost_ratio, materialise_macs, rows, device_type, dtype):
    """Whether contracting the input beats materialising W for ``rows`` rows: ``cost_ratio`` is
    materialise-and-multiply's multiply-adds (``materialise_macs``) over the contraction's."""
    policy = policy_for(device_type, dtype)
    needed = policy.contract_small if rows <= policy.small_batch_rows else policy.contract_large
    if math.isinf(needed):
        return False
    saved = materialise_macs * (1.0 - 1.0 / cost_ratio)
    return cost_ratio > needed and saved >= policy.min_saved_macs


def block_rows(rows, width, recorded, device_type, dtype, block_floats=BLOCK_FLOATS):
    """Rows per block of a two-core contraction whose intermediate is ``width`` wide, or None
    for one pass (no row blocks on this device, a batch that fits one block, or a contraction
    recorded by autograd, which would keep every block's intermediates)."""
    if recorded or not policy_for(device_type, dtype).row_blocks:
        return None
    per_block = block_floats * 4 / dtype.itemsize / width
    if math.isinf(per_block):
        return None
    per_block = max(MIN_BLOCK_ROWS, int(per_block))
    return per_block if rows > per_block else None


def recompute_backward(backward_mode, device_type, dtype):
    """``--tc-backward``: recompute (True), store (False) or, for auto, the device's policy."""
    if backward_mode == "auto":
        return policy_for(device_type, dtype).recompute_backward
    return backward_mode == "recompute"


def is_chain(module):
    """Whether ``module`` is a Tensor-Chain linear layer (its cores and a backward mode)."""
    return isinstance(module, BackwardModeMixin) and hasattr(module, "cores")


def has_chain(module):
    """Whether ``module`` is or holds a Tensor-Chain linear layer."""
    return any(is_chain(m) for m in module.modules())


class BackwardModeMixin:
    """``backward_mode`` (``--tc-backward``: auto | recompute | store) of a module whose backward
    can keep less by recomputing (a Tensor-Chain layer, a GLU), and the ``recompute_in_backward``
    it resolves to: for auto, the policy of the device and dtype of the module's parameters (and
    of autocast, when on): ``recompute_backward`` if the module holds a chain, else
    ``recompute_dense``."""

    backward_mode = "auto"
    _has_chain = None  # whether the module holds a chain (the layers it holds do not change)

    @property
    def recompute_in_backward(self):
        if self.backward_mode != "auto":
            return self.backward_mode == "recompute"
        if self._has_chain is None:
            self._has_chain = has_chain(self)
        param = next(self.parameters(), None)
        if param is None:
            return True
        policy = policy_for(*target(param))
        return policy.recompute_backward if self._has_chain else policy.recompute_dense

    @recompute_in_backward.setter
    def recompute_in_backward(self, value):
        self.backward_mode = "recompute" if value else "store"


def force_modes_(model, forward_mode="auto", backward_mode="auto"):
    """``--tc-forward`` / ``--tc-backward`` on every Tensor-Chain layer of ``model`` and every GLU
    whose projections are chains (dense layers keep their memory savings)."""
    # (the options' rules: --tc-forward's and --tc-backward's choices)
    assert forward_mode in FORWARD_MODES and backward_mode in BACKWARD_MODES, (forward_mode,
                                                                              backward_mode)
    for module in model.modules():
        if is_chain(module):
            module.forward_mode = forward_mode
        if isinstance(module, BackwardModeMixin) and has_chain(module):
            module.backward_mode = backward_mode
    return model
