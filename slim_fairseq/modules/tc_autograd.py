"""Memory-lean autograd for the Tensor-Chain contraction ``x @ W`` (W never built).

Autograd through :func:`~slim_fairseq.modules.tc_contraction.contract_input` keeps every
intermediate of the chain and its layout copies for the backward pass: for a 512 -> 1365
feed-forward chain of bond 2 that is 3.4 times the width of the input per row.
:class:`ChainContraction` keeps only the input and the cores and recomputes the one intermediate
the gradients need in backward (a two-core chain: one extra small matmul; longer chains: the
forward again). The results are those of plain autograd through ``contract_input``.

A feed-forward's hidden layer need not be kept either when it is cheap to rebuild from the
layer's (narrower) input: the producer marks its output (:func:`mark_recomputable`; the Tensor-
Chain GLU, or a chain fc1 followed by :func:`rebuildable_relu`) and a chain fc2 keeps what
rebuilds it instead (:class:`RecomputedInputContraction`).

Gradients of gradients (``create_graph=True``) are not supported; asking for them raises.
"""
import contextlib
import functools

import torch

from slim_fairseq.modules.tc_contraction import contract_input, first_core_first, row_block
from slim_fairseq.modules.tensor_chain_policy import device_and_autocast


def _autocast_state(device_type):
    """(enabled, dtype) of autocast for ``device_type`` in the current context."""
    if device_type not in ("cpu", "cuda"):
        return False, None
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def in_autocast_dtype(x):
    """``x`` in autocast's dtype where autocast is on for its device (itself otherwise): one
    cast for all the products that read ``x`` instead of one each, whose gradients then meet in
    that dtype and are cast back once."""
    dtype = device_and_autocast(x)[1]
    if dtype is None or x.dtype == dtype or not x.is_floating_point():
        return x
    return x.to(dtype)


class ChainContraction(torch.autograd.Function):
    """``x2d @ W`` for the chain ``cores`` (first [a1, b, c1], middle [a, b, b, c], last
    [an, b, cn]) saving only ``x2d`` and the cores."""

    @staticmethod
    def forward(ctx, x2d, *cores):
        remember_autocast(ctx, x2d)
        ctx.save_for_backward(x2d, *cores)
        return contract_input(x2d, list(cores))

    @staticmethod
    def backward(ctx, grad_out):
        refuse_double_backward("Tensor-Chain contraction")
        x2d, *cores = ctx.saved_tensors
        with forward_autocast(ctx):
            grads = chain_backward(x2d, cores, grad_out, ctx.needs_input_grad)
        return tuple(None if g is None else g.to(t.dtype) for g, t in zip(grads, [x2d, *cores]))


def remember_autocast(ctx, like):
    """Store the autocast state of a custom Function's forward (run again in its backward)."""
    ctx.device_type = like.device.type
    ctx.autocast = _autocast_state(ctx.device_type)


def forward_autocast(ctx):
    """Context manager: the autocast state :func:`remember_autocast` stored, so that backward
    matmuls run in the precision of forward (bf16 / fp16 training)."""
    enabled, dtype = ctx.autocast
    if ctx.device_type not in ("cpu", "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(ctx.device_type, dtype=dtype, enabled=enabled)


def refuse_double_backward(what):
    """Raise if a custom backward runs with ``create_graph=True`` (its gradients would be
    detached, silently wrong for gradients of gradients)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{what}: gradients of gradients (create_graph=True) are not supported; allowed: "
            "TensorChainLinear(forward_mode='materialise') for them")


def chain_backward(x2d, cores, grad_out, needs):
    """Gradients (x2d, *cores) of ``contract_input(x2d, cores)`` for ``grad_out``."""
    if len(cores) == 2:
        return pair_backward(x2d, cores[0], cores[1], grad_out, needs)
    return _recompute_backward(x2d, cores, grad_out, needs)


def pair_backward(x2d, first, last, grad_out, needs=(True, True, True)):
    """Gradients (x2d, first, last) of ``contract_pair(x2d, first, last)`` for ``grad_out``
    [m, c1 c2], over the same blocks of rows as the forward on the CPU (the core gradients are
    summed over the blocks)."""
    rows = row_block(x2d, first, last)
    if rows is None:
        return pair_backward_rows(x2d, first, last, grad_out, needs)
    grads = list(pair_backward_rows(x2d[:rows], first, last, grad_out[:rows], needs))
    grad_x = None
    if grads[0] is not None:
        grad_x = grads[0].new_empty(x2d.shape)
        grad_x[:rows] = grads[0]
    for start in range(rows, x2d.shape[0], rows):
        block = pair_backward_rows(x2d[start:start + rows], first, last, grad_out[start:start + rows], needs)
        if grad_x is not None:
            grad_x[start:start + rows] = block[0]
        for i in (1, 2):
            if grads[i] is not None:
                grads[i] += block[i]
    return grad_x, grads[1], grads[2]


def pair_backward_rows(x2d, first, last, grad_out, needs=(True, True, True)):
    """:func:`pair_backward` in one pass, recomputing the one intermediate of the order the
    forward used."""
    m = x2d.shape[0]
    a1, bond, c1 = first.shape
    a2, _, c2 = last.shape
    grad_out = grad_out.contiguous()
    grad_x = grad_first = grad_last = None
    if first_core_first(first, last):
        x3 = x2d.reshape(m, a1, a2)
        f2 = first.reshape(a1, bond * c1)
        l2 = last.reshape(a2 * bond, c2)
        if needs[2]:
            u = torch.matmul(x3.transpose(1, 2), f2)  # [m, a2, b c1], as in forward
            u = u.reshape(m, a2 * bond, c1).transpose(0, 1).reshape(a2 * bond, m * c1)
            grad_last = (u @ grad_out.reshape(m * c1, c2)).reshape(a2, bond, c2)
            del u
        if needs[0] or needs[1]:
            # d u [m, c1, a2 b] -> [m, a2, b c1]
            du = (grad_out.reshape(m * c1, c2) @ l2.t()).reshape(m, c1, a2, bond)
            du = du.permute(0, 2, 3, 1).reshape(m, a2, bond * c1)
            if needs[1]:
                grad_first = (x3.permute(1, 0, 2).reshape(a1, m * a2)
                              @ du.reshape(m * a2, bond * c1)).reshape(a1, bond, c1)
            if needs[0]:
                grad_x = (du.reshape(m * a2, bond * c1) @ f2.t()).reshape(m, a2, a1)
                grad_x = grad_x.transpose(1, 2).reshape(m, a1 * a2)
    else:
        l2 = last.reshape(a2, bond * c2)
        f2 = first.reshape(a1 * bond, c1)
        # grad_out [m, c1, c2] -> [m c2, c1], the layout of the forward's second matmul
        g = grad_out.reshape(m, c1, c2).transpose(1, 2).reshape(m * c2, c1)
        if needs[1]:
            t = x2d.reshape(m * a1, a2) @ l2  # [m a1, b c2], as in forward
            t = t.reshape(m, a1 * bond, c2).transpose(1, 2).reshape(m * c2, a1 * bond)
            grad_first = (t.t() @ g).reshape(a1, bond, c1)
            del t
        if needs[0] or needs[2]:
            dt = (g @ f2.t()).reshape(m, c2, a1 * bond).transpose(1, 2).reshape(m * a1, bond * c2)
            if needs[2]:
                grad_last = (x2d.reshape(m * a1, a2).t() @ dt).reshape(a2, bond, c2)
            if needs[0]:
                grad_x = (dt @ l2.t()).reshape(m, a1 * a2)
    return grad_x, grad_first, grad_last


def _recompute_backward(x2d, cores, grad_out, needs):
    """Chains of three or more cores: run the contraction again with autograd and differentiate."""
    inputs = [t.detach().requires_grad_(need) for t, need in zip([x2d, *cores], needs)]
    wanted = [t for t in inputs if t.requires_grad]
    with torch.enable_grad():
        out = contract_input(inputs[0], inputs[1:])
    grads = iter(torch.autograd.grad(out, wanted, grad_out))
    return [next(grads) if t.requires_grad else None for t in inputs]


def chain_contract(x2d, cores):
    """``x2d @ W`` for the chain ``cores``: through :class:`ChainContraction` when a gradient
    is needed, else directly."""
    if torch.is_grad_enabled() and (x2d.requires_grad or any(c.requires_grad for c in cores)):
        return ChainContraction.apply(x2d, *cores)
    return contract_input(x2d, list(cores))


# ----------------------------------------------------------------------------------------------
# inputs that can be recomputed: a feed-forward's hidden activation need not be kept for the
# second linear when the first one can rebuild it cheaply from its own (smaller) input

RECOMPUTE_ATTR = "_slim_recompute"


def mark_recomputable(tensor, recompute, *inputs):
    """Note on ``tensor`` that ``recompute(*inputs)`` (no grad) rebuilds its values, so a
    Tensor-Chain layer consuming it may keep ``inputs`` instead of it. The note lives on this
    tensor object only (not on views or results of other ops) and is ignored once the tensor
    is modified in place."""
    setattr(tensor, RECOMPUTE_ATTR, (recompute, inputs, tensor._version))
    return tensor


def recompute_recipe(tensor):
    """``(recompute, inputs)`` noted by :func:`mark_recomputable`, or None."""
    note = getattr(tensor, RECOMPUTE_ATTR, None)
    if note is None or note[2] != tensor._version:
        return None
    return note[0], note[1]


class RecomputedInputContraction(torch.autograd.Function):
    """``x2d @ W`` (chain ``cores``) keeping the inputs of ``recompute`` (which rebuilds
    ``x2d``) instead of ``x2d``. Gradients flow to ``x2d`` and the cores only; ``x2d``'s own
    graph carries them to the recompute inputs."""

    @staticmethod
    def forward(ctx, x2d, recompute, n_inputs, *tensors):
        remember_autocast(ctx, x2d)
        ctx.recompute, ctx.n_inputs, ctx.x_shape = recompute, n_inputs, x2d.shape
        ctx.save_for_backward(*tensors)
        return contract_input(x2d, list(tensors[n_inputs:]))

    @staticmethod
    def backward(ctx, grad_out):
        refuse_double_backward("Tensor-Chain contraction")
        saved = ctx.saved_tensors
        inputs, cores = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
        needs = ctx.needs_input_grad
        with forward_autocast(ctx):
            x2d = ctx.recompute(*inputs).reshape(ctx.x_shape)
            grads = chain_backward(x2d, cores, grad_out, (needs[0], *needs[3 + ctx.n_inputs:]))
        del x2d
        core_grads = [None if g is None else g.to(c.dtype) for g, c in zip(grads[1:], cores)]
        return (grads[0], None, None, *([None] * ctx.n_inputs), *core_grads)


def chain_contract_input_of(x, x2d, cores):
    """Like :func:`chain_contract`, but when ``x`` was marked by :func:`mark_recomputable`,
    keep the recompute inputs instead of ``x2d``."""
    recipe = recompute_recipe(x)
    if recipe is None or not torch.is_grad_enabled():
        return chain_contract(x2d, cores)
    recompute, inputs = recipe
    return RecomputedInputContraction.apply(x2d, recompute, len(inputs), *inputs, *cores)


class RecomputedInputLinear(torch.autograd.Function):
    """``F.linear(x, w, bias)`` (``w`` [out, in]: dense or a materialised chain, in nn.Linear's
    layout; ``x`` of any leading shape) keeping the inputs of ``recompute`` (which rebuilds
    ``x``, in any shape of as many elements) instead of ``x``; the counterpart of
    :class:`RecomputedInputContraction` for a consumer that multiplies by its full weight. Each
    way as few ops as :class:`MaterialisedLinear`."""

    @staticmethod
    def forward(ctx, x, w, bias, recompute, n_inputs, *inputs):
        remember_autocast(ctx, x)
        ctx.recompute, ctx.x_shape = recompute, x.shape
        ctx.save_for_backward(w, bias, *inputs)
        return torch.nn.functional.linear(x, w, bias)

    @staticmethod
    def backward(ctx, grad_out):
        refuse_double_backward("linear layer")
        w, bias, *inputs = ctx.saved_tensors
        needs = ctx.needs_input_grad
        lead = tuple(range(grad_out.dim() - 1))
        grad_x = grad_w = grad_bias = None
        with forward_autocast(ctx):
            if needs[0]:
                grad_x = torch.matmul(grad_out, w)
            if needs[1]:
                x = ctx.recompute(*inputs).reshape(ctx.x_shape)
                grad_w = as_dtype(torch.tensordot(grad_out, x, dims=(lead, lead)), w.dtype)
                del x
        if bias is not None and needs[2]:
            grad_bias = as_dtype(grad_out.sum(lead), bias.dtype)
        return (grad_x, grad_w, grad_bias, None, None, *([None] * len(inputs)))


def as_dtype(tensor, dtype):
    """``tensor`` in ``dtype`` (itself when it is already)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


class MaterialisedLinear(torch.autograd.Function):
    """``F.linear(x, w, bias)`` (``w`` [out, in]: a materialised chain weight in nn.Linear's
    layout) for ``x`` of any leading shape, in as few ops each way as a dense layer: no reshapes
    in forward, one product per gradient in backward (the weight's over every leading dimension
    at once: ``tensordot``), no casts of tensors already in the right
    dtype. Under autocast ``x`` is kept in the compute dtype (as autograd through ``F.linear``
    keeps it). Same results as autograd through ``F.linear``, gradients of gradients included
    (outside autocast)."""

    @staticmethod
    def forward(ctx, x, w, bias):
        remember_autocast(ctx, x)
        enabled, dtype = ctx.autocast
        ctx.cast = enabled and x.dtype != dtype and x.is_floating_point()
        if ctx.cast:
            x = x.to(dtype)  # the cast autocast makes in F.linear, kept for backward
        ctx.save_for_backward(x, w)
        ctx.dtypes = (x.dtype, None if bias is None else bias.dtype)
        return torch.nn.functional.linear(x, w, bias)

    @staticmethod
    def backward(ctx, grad):
        if ctx.cast:  # (without the cast, backward's own ops record gradients of gradients)
            refuse_double_backward("Tensor-Chain linear layer under autocast")
        x, w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        lead = tuple(range(grad.dim() - 1))
        grad_x = grad_w = grad_bias = None
        with forward_autocast(ctx):
            if needs[0]:
                grad_x = torch.matmul(grad, w)
            if needs[1]:
                grad_w = torch.tensordot(grad, x, dims=(lead, lead))
        if needs[2] and ctx.dtypes[1] is not None:
            grad_bias = grad.sum(lead)
        return tuple(g if g is None else as_dtype(g, t)
                     for g, t in zip((grad_x, grad_w, grad_bias), (x.dtype, w.dtype, ctx.dtypes[1])))


def linear_input_of(x, w, bias):
    """``F.linear(x, w, bias)`` (``w`` [out, in]); when ``x`` was marked by
    :func:`mark_recomputable`, keep the recompute inputs instead of ``x`` (see
    :class:`RecomputedInputLinear`)."""
    recipe = recompute_recipe(x)
    if recipe is None or not torch.is_grad_enabled():
        return torch.nn.functional.linear(x, w, bias)
    recompute, inputs = recipe
    return RecomputedInputLinear.apply(x, w, bias, recompute, len(inputs), *inputs)


@torch.no_grad()
def chain_value(x2d, bias, *cores):
    """``x2d @ W + bias`` without autograd (rebuilds a marked Tensor-Chain output)."""
    y = contract_input(x2d, list(cores))
    return y if bias is None else y + bias


class MaskReLU(torch.autograd.Function):
    """ReLU keeping a one-byte mask for backward instead of its output."""

    @staticmethod
    def forward(ctx, x):
        out = torch.relu(x)
        ctx.save_for_backward(out > 0)
        return out

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("ReLU")
        mask, = ctx.saved_tensors
        return torch.where(mask, grad, grad.new_zeros(()))


@torch.no_grad()
def _relu_of(recompute, *inputs):
    return torch.relu(recompute(*inputs))


def rebuildable_relu(x):
    """``relu(x)``; when ``x`` is marked by :func:`mark_recomputable` (a Tensor-Chain fc1 with
    ``rebuildable_output``) and autograd records, the ReLU keeps a one-byte mask and its output
    is marked in turn, so a Tensor-Chain fc2 keeps fc1's input instead of the hidden layer."""
    recipe = recompute_recipe(x)
    if recipe is None or not torch.is_grad_enabled() or not x.requires_grad:
        return torch.relu(x)
    recompute, inputs = recipe
    return mark_recomputable(MaskReLU.apply(x), functools.partial(_relu_of, recompute), *inputs)
