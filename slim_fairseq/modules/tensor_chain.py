"""Tensor-Chain (TC) linear layer and embedding (Anthe, arXiv:2305.10991; docs/TECHNIQUES.md#tensor-chain).

A weight ``W`` of shape ``[N_a, N_c]`` (``y = x @ W + bias``) is the contraction of ``n`` cores:
``N_a = a_1 ... a_n``, ``N_c = c_1 ... c_n``; the first core is ``[a_1, b, c_1]``, the middle
ones ``[a_i, b, b, c_i]`` and the last ``[a_n, b, c_n]`` (an open chain). For ``n = 2``
``W[(i1, i2), (k1, k2)] = sum_j A[i1, j, k1] B[i2, j, k2]``. Row/column multi-indices are
row-major (``i_1`` most significant).
"""
import contextlib
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from slim_fairseq.modules.tc_autograd import (chain_contract_input_of, chain_value, forward_autocast,
                                              linear_input_of, mark_recomputable, MaterialisedLinear,
                                              recompute_recipe,
                                              remember_autocast)
from slim_fairseq.modules import tensor_chain_policy
from slim_fairseq.modules.tc_contraction import (  # noqa: F401  (the chain's arithmetic, re-exported)
    contract_input, contract_pair, contract_pair_rows, first_core_first, materialise,
    materialise_pairs, row_block)
from slim_fairseq.modules.tensor_chain_policy import BackwardModeMixin


def prime_factors(n):
    """Prime factors of ``n`` in ascending order (with multiplicity)."""
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


def factorize(n, length):
    """Split ``n`` into ``length`` factors as close to ``n ** (1/length)`` as its prime
    factorisation allows (docs/TECHNIQUES.md#tensor-chain), largest first: 512 -> (32, 16), 1365 -> (39, 35).

    Among all ways to group the prime factors, the one with the smallest spread of
    log-factors wins. A dimension with fewer than ``length`` prime factors (e.g. a prime)
    gets factor 1 in the remaining slots and a warning.
    """
    if n < 1 or length < 1:
        raise ValueError(f"length={length}: no factorisation of {n} into {length} factors; "
                         "allowed: a dimension and a length >= 1")
    primes = prime_factors(n)
    if len(primes) < length:
        warnings.warn(f"Tensor Chain: {n} has fewer than {length} prime factors; "
                      f"using factor 1 in {length - len(primes)} slot(s)")
    # every distinct way to group the primes into `length` slots (slot multisets only)
    groupings = {(1,) * length}
    for p in reversed(primes):
        groupings = {tuple(sorted(slots[:i] + (slots[i] * p,) + slots[i + 1:], reverse=True))
                     for slots in groupings for i in range(length)}
    target = math.log(n) / length
    return min(sorted(groupings, reverse=True),
               key=lambda slots: sum((math.log(x) - target) ** 2 for x in slots))


def tc_param_count(in_factors, out_factors, bond):
    """Number of core parameters (bias excluded) of a chain with the given factors and bond."""
    ends = in_factors[0] * out_factors[0] + in_factors[-1] * out_factors[-1]
    middle = sum(a * c for a, c in zip(in_factors[1:-1], out_factors[1:-1]))
    return bond * ends + bond * bond * middle


def solve_bond(in_features, out_features, ratio, length=2, in_factors=None, out_factors=None,
               min_bond=0):
    """Bond dimension b for parameter ratio ``ratio`` = TC params / dense params
    (docs/TECHNIQUES.md#tensor-chain).

    Solves ``b (a_1 c_1 + a_n c_n) + b^2 sum_{i=2}^{n-1} a_i c_i = r N_a N_c``, takes the
    floor, at least 1; for n = 2 at least 2, like the reference code; at least ``min_bond``
    (``--tc-min-bond``, 0 = no floor: then the parameter count exceeds the ratio).
    512x512 at r=.07 -> 14; 512x1365 at r=.005 -> 2.
    """
    in_factors = in_factors or factorize(in_features, length)
    out_factors = out_factors or factorize(out_features, length)
    target = ratio * in_features * out_features
    linear = in_factors[0] * out_factors[0] + in_factors[-1] * out_factors[-1]
    quadratic = sum(a * c for a, c in zip(in_factors[1:-1], out_factors[1:-1]))
    if quadratic == 0:
        bond = target / linear
    else:
        bond = (-linear + math.sqrt(linear * linear + 4.0 * quadratic * target)) / (2.0 * quadratic)
    bond = max(int(math.floor(bond + 1e-9)), 1)
    if length == 2:
        bond = max(bond, 2)
    return max(bond, int(min_bond or 0))


def _core_shapes(in_factors, out_factors, bond):
    """End cores [a, b, c], middle cores [a, b, b, c]."""
    last = len(in_factors) - 1
    return [(a, bond, c) if i in (0, last) else (a, bond, bond, c)
            for i, (a, c) in enumerate(zip(in_factors, out_factors))]


def _core_std(target_std, bond, length):
    """Per-core std so that the materialised weight has std ``target_std``:
    Var(W) = b^(n-1) * prod_i sigma_i^2 (products of independent zero-mean entries)."""
    return (target_std ** 2 / bond ** (length - 1)) ** (1.0 / (2 * length))


def _cores_key(cores):
    """What a W built from ``cores`` (a ParameterList's parameter dict) depends on: the autocast
    state of their device, then each core's pointer, version and dtype (a flat list: a few times
    cheaper to build and compare than tuples)."""
    key = [tensor_chain_policy.device_and_autocast(cores["0"])[1]]
    for core in cores.values():
        key += (core.data_ptr(), core._version, core.dtype)
    return key


class TensorChainLinear(BackwardModeMixin, nn.Module):
    """Drop-in replacement for ``nn.Linear(in_features, out_features)`` whose weight is a
    Tensor Chain (docs/TECHNIQUES.md#tensor-chain). Give either ``ratio`` (TC params / dense params, bond solved by
    :func:`solve_bond`) or ``bond``. The cores are initialised so that the materialised weight
    has the variance of ``nn.Linear``'s default init (or std ``init_std``); bias starts at zero.

    ``forward_mode`` (``--tc-forward``): ``"auto"`` (pick by shape, device and dtype, see
    :meth:`use_contraction`), ``"materialise"`` or ``"contract"``; ``backward_mode``
    (``--tc-backward``): ``"auto"``, ``"recompute"`` or ``"store"`` (:class:`BackwardModeMixin`).
    """

    # set on a feed-forward's fc1 (the layer does it): in training, the contracted output is
    # marked so that a Tensor-Chain fc2 can rebuild it from this layer's input in backward
    rebuildable_output = False
    # kept between calls, not state: W while decoding (:meth:`inference_weight`), the answer
    # of a call while W is kept (:meth:`_kept_weight`), the group of :func:`built_together`
    # this chain is in
    _inference_weight = _kept_step = _group = None

    def __init__(self, in_features, out_features, ratio=None, bond=None, length=2, bias=True,
                 init_std=None, forward_mode="auto", min_bond=0):
        super().__init__()
        assert length >= 2, length  # (the options' rule: --tc-length)
        if (ratio is None) == (bond is None):
            raise ValueError(f"ratio={ratio}, bond={bond}: a chain needs exactly one of them; "
                             "allowed: a parameter ratio or a bond")
        assert forward_mode in tensor_chain_policy.FORWARD_MODES, forward_mode
        self.in_features = in_features
        self.out_features = out_features
        self.length = length
        self.in_factors = factorize(in_features, length)
        self.out_factors = factorize(out_features, length)
        if bond is None:
            bond = solve_bond(in_features, out_features, ratio, length,
                              self.in_factors, self.out_factors, min_bond)
        self.bond = int(bond)
        self.forward_mode = forward_mode
        self.cores = nn.ParameterList(
            [nn.Parameter(torch.empty(shape))
             for shape in _core_shapes(self.in_factors, self.out_factors, self.bond)])
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.init_std = init_std
        self.reset_parameters()

    def dense_init_std(self):
        """Std of the dense layer this chain replaces (nn.Linear default: U(+-1/sqrt(in)))."""
        if self.init_std is not None:
            return self.init_std
        return 1.0 / math.sqrt(3.0 * self.in_features)

    def reset_parameters(self):
        std = _core_std(self.dense_init_std(), self.bond, self.length)
        for core in self.cores:
            nn.init.normal_(core, 0.0, std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"factors={self.in_factors}x{self.out_factors}, bond={self.bond}, "
                f"bias={self.bias is not None}")

    def full_weight(self):
        """The materialised ``[in_features, out_features]`` matrix (``y = x @ W``), or the one
        :func:`built_together` builds with others of its shape."""
        group = self._group
        return group.weight(self) if group is not None else materialise(list(self.cores))

    def inference_weight(self):
        """:meth:`full_weight`, built once and reused while no gradient is recorded in eval
        mode and the cores are the same tensors, unmodified, in the same autocast state (a
        decoding step then multiplies by W instead of rebuilding it). Training mode, or a
        gradient through the cores, builds W at every call."""
        cores = self._modules["cores"]._parameters  # (not ParameterList's slower indexing)
        if self.training or (torch.is_grad_enabled() and cores["0"].requires_grad):
            return self.full_weight()
        key = _cores_key(cores)
        cached = self._inference_weight
        if cached is None or cached[0] != key:
            cached = self._inference_weight = (key, self.full_weight())
        return cached[1]

    def _kept_weight(self, x, cores):
        """For a call while W is kept (eval mode, no gradient through the cores; e.g. a
        decoding step): :meth:`inference_weight` in ``nn.Linear``'s layout (a view) to multiply
        ``x`` by, or None where the chain contracts ``x``. The answer is kept under one key
        (the cores' state, as :meth:`inference_weight` keys W, then the rows, the policy's
        target and ``forward_mode``), so that a step checks once and skips the policy."""
        key = _cores_key(cores)
        rows = x.numel() // self.in_features
        key += (rows, tensor_chain_policy.target(x), self.forward_mode)
        kept = self._kept_step
        if kept is not None and kept[0] == key:
            return kept[1]
        contracts = self.use_contraction(rows, x, weight_built=True)
        weight = None if contracts else self.inference_weight().t()
        self._kept_step = (key, weight)
        return weight

    def train(self, mode=True):
        self._inference_weight = self._kept_step = None  # parameters change in training
        return super().train(mode)

    @property
    def weight(self):
        """``nn.Linear``-layout weight ``[out_features, in_features]`` (materialised)."""
        return self.inference_weight().t()

    def cost_ratio(self, rows, weight_built=False):
        """Multiply-adds of materialising W and multiplying (N_a N_c (b + rows); with W already
        built, N_a N_c rows) divided by those of contracting the input core by core (rows x the
        per-core contraction sizes)."""
        na, nc, b = self.in_features, self.out_features, self.bond
        contract_cost = 0
        cols, remaining = 1, na
        for i, (a, c) in enumerate(zip(self.in_factors, self.out_factors)):
            bond_in = 1 if i == 0 else b
            bond_out = 1 if i == self.length - 1 else b
            contract_cost += remaining * cols * bond_in * c * bond_out
            remaining //= a
            cols *= c
        return na * nc * ((0 if weight_built else b) + rows) / (rows * contract_cost)

    def use_contraction(self, rows, like=None, weight_built=False):
        """Whether to contract the input rather than multiply by W for this many rows: as
        ``forward_mode`` says, or for "auto" as the policy of the device and compute dtype of
        ``like`` (the input; default the cores) expects to be faster
        (:mod:`~slim_fairseq.modules.tensor_chain_policy`); ``weight_built``: W is kept from
        an earlier call, so multiplying by it costs only the product."""
        if self.forward_mode != "auto":
            return self.forward_mode == "contract"
        materialise_macs = self.in_features * self.out_features * ((0 if weight_built else self.bond) + rows)
        return tensor_chain_policy.contract_pays(self.cost_ratio(rows, weight_built), materialise_macs, rows,
                                                 *tensor_chain_policy.target(self.cores[0] if like is None else like))

    def forward(self, x):
        # the parameters read from their dicts: through nn.Module.__getattr__ and
        # ParameterList's indexing they cost more than the F.linear of a decoding step
        cores = self._modules["cores"]._parameters
        bias = self._parameters.get("bias")
        grad = torch.is_grad_enabled()
        if not self.training and not (grad and cores["0"].requires_grad):
            weight = self._kept_weight(x, cores)  # W kept, e.g. a decoding step
        elif self.use_contraction(x.numel() // self.in_features, x):
            weight = None
        else:
            group = self._group
            weight = group.weight(self, layout="linear") if group is not None else self.full_weight().t()
        if weight is not None:
            if not grad:
                # one op: F.linear with W in nn.Linear's layout (a view), no reshapes around it
                return F.linear(x, weight, bias)
            if recompute_recipe(x) is None:
                return MaterialisedLinear.apply(x, weight, bias)
            return linear_input_of(x, weight, bias)
        shape = x.shape
        cores = list(cores.values())
        x2d = x.reshape(-1, self.in_features)
        recompute = grad and self.recompute_in_backward
        if recompute:
            # keeps only x2d (or what rebuilds it) and the cores for backward
            y = chain_contract_input_of(x, x2d, cores)
        else:  # plain autograd keeps every intermediate (or no grad: nothing to keep)
            y = contract_input(x2d, cores)
        if bias is not None:
            y = y + bias
        if recompute and self.rebuildable_output:
            return mark_recomputable(y.reshape(*shape[:-1], self.out_features), chain_value,
                                     x2d, bias, *cores)
        return y.reshape(*shape[:-1], self.out_features)

    @torch.no_grad()
    def to_dense(self):
        """Export as an ``nn.Linear`` with the materialised weight (for inference)."""
        dense = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        dense = dense.to(device=self.cores[0].device, dtype=self.cores[0].dtype)
        dense.weight.copy_(self.full_weight().t())
        if self.bias is not None:
            dense.bias.copy_(self.bias)
        return dense

    @classmethod
    @torch.no_grad()
    def from_dense(cls, linear_or_weight, bond, length=2):
        """Compress a dense layer by TT-SVD (sequential truncated SVDs, docs/TECHNIQUES.md#tensor-chain).

        ``linear_or_weight``: an ``nn.Linear`` (weight and bias are taken) or a weight in
        ``nn.Linear`` layout ``[out_features, in_features]``. With a bond at least the largest
        unfolding rank, the result reproduces the weight exactly (up to float rounding).
        """
        if isinstance(linear_or_weight, nn.Linear):
            weight, bias = linear_or_weight.weight, linear_or_weight.bias
        else:
            weight, bias = linear_or_weight, None
        out_features, in_features = weight.shape
        module = cls(in_features, out_features, bond=bond, length=length, bias=bias is not None)
        module = module.to(device=weight.device, dtype=weight.dtype)
        cores = tt_svd(weight.t().double(), module.in_factors, module.out_factors, module.bond)
        for param, core in zip(module.cores, cores):
            param.copy_(core.to(param.dtype))
        if bias is not None:
            module.bias.copy_(bias)
        return module


class ChainWeights(torch.autograd.Function):
    """The weights of k two-core chains of one shape (``cores``: their k first cores, then their
    k last cores) in one batched product, :func:`materialise_pairs`'s results in nn.Linear's
    layout (``[out_features, in_features]``); backward runs one
    batched product per core position for all k chains (a weight left unused gets a zero
    gradient). Each way the cores are stacked once and cast once (under autocast) and every
    product is one ``einsum`` (its layout changes are views of the product, not ops of their
    own). Gradients of gradients differentiate :func:`materialise_pairs` instead."""

    @staticmethod
    def forward(ctx, count, *cores):
        remember_autocast(ctx, cores[0])
        firsts, lasts = _compute_dtype(ctx, torch.stack(cores[:count]), torch.stack(cores[count:]))
        ctx.count = count
        ctx.save_for_backward(firsts, lasts, *cores)
        # W in nn.Linear's layout [c1 c2, a1 a2], the one a linear layer multiplies by
        product = torch.einsum("kabc,kdbe->kcead", firsts, lasts)
        (_, a1, _, c1), (_, a2, _, c2) = firsts.shape, lasts.shape
        return product.reshape(count, c1 * c2, a1 * a2).unbind(0)

    @staticmethod
    def backward(ctx, *grads):
        firsts, lasts, *cores = ctx.saved_tensors
        count = ctx.count
        if torch.is_grad_enabled():  # create_graph: plain autograd through the same product
            with torch.enable_grad(), forward_autocast(ctx):
                weights = [w.t() for w in materialise_pairs(cores[:count], cores[count:])]
            used = [(w, g) for w, g in zip(weights, grads) if g is not None]
            got = torch.autograd.grad([w for w, _ in used], cores, [g for _, g in used],
                                      create_graph=True, allow_unused=True)
            return (None, *(torch.zeros_like(c) if g is None else g for g, c in zip(got, cores)))
        (_, a1, _, c1), (_, a2, _, c2) = firsts.shape, lasts.shape
        like = next(g for g in grads if g is not None)
        grad = torch.stack([like.new_zeros(()).expand_as(like) if g is None else g
                            for g in grads]).view(count, c1, c2, a1, a2)
        # [k, a1, c1, a2, c2]: the layout both products read as a view (one copy, not one each)
        grad, = _compute_dtype(ctx, grad.permute(0, 3, 1, 4, 2).contiguous())
        grad_firsts = torch.einsum("kacde,kdbe->kabc", grad, lasts)
        grad_lasts = torch.einsum("kacde,kabc->kdbe", grad, firsts)
        dtype = cores[0].dtype
        return (None, *grad_firsts.to(dtype, memory_format=torch.contiguous_format).unbind(0),
                *grad_lasts.to(dtype, memory_format=torch.contiguous_format).unbind(0))


def _compute_dtype(ctx, *tensors):
    """``tensors`` in the dtype autocast computed ``ctx``'s forward in (as they are without
    autocast): one explicit cast each, so that the products run no casts of their own."""
    enabled, dtype = ctx.autocast
    if not enabled:
        return tensors
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)


class _ChainGroup:
    """Two-core chains of one shape whose weights are built together, at the first request of
    any of them (:func:`built_together`)."""

    def __init__(self, chains):
        self.chains, self.weights = chains, None

    def weight(self, chain, layout="chain"):
        """W of ``chain``: ``[in, out]`` (layout "chain") or nn.Linear's ``[out, in]`` ("linear"),
        each a view of the group's product."""
        if self.weights is None:
            cores = [c.cores[0] for c in self.chains] + [c.cores[1] for c in self.chains]
            self.weights = dict(zip(map(id, self.chains), ChainWeights.apply(len(self.chains), *cores)))
        weight = self.weights[id(chain)]
        return weight if layout == "linear" else weight.t()


@contextlib.contextmanager
def built_together(chains, rows=None, like=None):
    """Inside the block, the two-core chains of ``chains`` that share a shape and, with a
    gradient recorded, multiply by their weight, use weights built in one batched product
    (:class:`ChainWeights`): every chain of a model (its forward in training), or the queries',
    keys' and values' projections of an attention and a GLU's two input linears where they run
    alone. The group's weights are built when the first of them is asked for; a chain that
    contracts its input instead never asks. ``rows`` (of ``like``): leave out the chains that
    would contract that many rows. Chains in a group of an enclosing block stay in it."""
    groups = {}
    if torch.is_grad_enabled():
        for chain in chains:
            if (isinstance(chain, TensorChainLinear) and chain.length == 2
                    and chain._group is None and chain.cores[0].requires_grad
                    and (rows is None or not chain.use_contraction(rows, like))):
                core = chain.cores[0]
                key = (tuple(core.shape for core in chain.cores), core.dtype, core.device)
                groups.setdefault(key, []).append(chain)
    grouped = [group for group in groups.values() if len(group) > 1]
    try:
        for group in grouped:
            shared = _ChainGroup(group)
            for chain in group:
                chain._group = shared
        yield
    finally:
        for group in grouped:
            for chain in group:
                chain._group = None


def two_core_chains(model):
    """The two-core Tensor-Chain linear layers of ``model``."""
    return [m for m in model.modules() if isinstance(m, TensorChainLinear) and m.length == 2]


def tt_svd(w, in_factors, out_factors, bond):
    """Decompose ``w [N_a, N_c]`` into chain cores with every bond truncated (or zero-padded)
    to ``bond``."""
    n = len(in_factors)
    pair_sizes = [a * c for a, c in zip(in_factors, out_factors)]
    # [a1..an, c1..cn] -> [a1, c1, a2, c2, ...] -> [a1 c1, a2 c2, ...]
    t = w.reshape(*in_factors, *out_factors)
    order = [j for i in range(n) for j in (i, n + i)]
    t = t.permute(*order).reshape(*pair_sizes)
    cores = []
    remainder = t.reshape(pair_sizes[0], -1)  # [bond_in * a c, rest]
    bond_in = 1
    for i in range(n - 1):
        u, s, vh = torch.linalg.svd(remainder, full_matrices=False)
        rank = min(bond, s.shape[0])
        u = u[:, :rank]
        sv = s[:rank, None] * vh[:rank]
        if rank < bond:  # pad the link with zeros up to the requested bond
            u = torch.cat([u, u.new_zeros(u.shape[0], bond - rank)], dim=1)
            sv = torch.cat([sv, sv.new_zeros(bond - rank, sv.shape[1])], dim=0)
        a, c = in_factors[i], out_factors[i]
        core = u.reshape(bond_in, a, c, bond)
        if i == 0:
            cores.append(core[0].permute(0, 2, 1).contiguous())  # [a, b, c]
        else:
            cores.append(core.permute(1, 0, 3, 2).contiguous())  # [a, b, b', c]
        bond_in = bond
        remainder = sv.reshape(bond * pair_sizes[i + 1], -1)
    a, c = in_factors[-1], out_factors[-1]
    cores.append(remainder.reshape(bond, a, c).permute(1, 0, 2).contiguous())  # [a, b, c]
    return cores


class TensorChainEmbedding(nn.Module):
    """Token table ``[V, d]`` stored as a Tensor Chain (``--tc-emb``, docs/TECHNIQUES.md#tensor-chain). Rows are
    computed only for the looked-up tokens (the table is never built in ``forward``); the
    padding row is zero. Init matches fairseq's ``Embedding`` (N(0, d^-1/2)) in variance."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, ratio=None, length=2,
                 bond=None, min_bond=0):
        super().__init__()
        assert length >= 2, length  # (the options' rule: --tc-length)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.length = length
        self.in_factors = factorize(num_embeddings, length)
        self.out_factors = factorize(embedding_dim, length)
        if bond is None:
            if ratio is None:
                raise ValueError("ratio=None, bond=None: a chain needs one of them; allowed: a "
                                 "parameter ratio or a bond")
            bond = solve_bond(num_embeddings, embedding_dim, ratio, length,
                              self.in_factors, self.out_factors, min_bond)
        self.bond = int(bond)
        self.cores = nn.ParameterList(
            [nn.Parameter(torch.empty(shape))
             for shape in _core_shapes(self.in_factors, self.out_factors, self.bond)])
        self.reset_parameters()

    def reset_parameters(self):
        std = _core_std(self.embedding_dim ** -0.5, self.bond, self.length)
        for core in self.cores:
            nn.init.normal_(core, 0.0, std)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, "
                f"factors={self.in_factors}x{self.out_factors}, bond={self.bond}")

    @property
    def weight(self):
        """The full ``[V, d]`` table, materialised on demand (e.g. for a tied output)."""
        table = materialise(list(self.cores))
        if self.padding_idx is not None:
            keep = torch.ones(self.num_embeddings, 1, dtype=table.dtype, device=table.device)
            keep[self.padding_idx] = 0
            table = table * keep
        return table

    def forward(self, tokens):
        flat = tokens.reshape(-1)
        # mixed-radix digits of each token id (i_1 most significant)
        digits = []
        rest = flat
        for a in reversed(self.in_factors):
            digits.append(rest % a)
            rest = torch.div(rest, a, rounding_mode="floor")
        digits.reverse()
        acc = self.cores[0][digits[0]]  # [m, b, c1]
        acc = acc.transpose(1, 2)  # [m, C, b]
        for core, idx in zip(list(self.cores)[1:-1], digits[1:-1]):
            picked = core[idx]  # [m, b, b', c]
            acc = torch.einsum("mCb,mbec->mCce", acc, picked)
            acc = acc.reshape(acc.shape[0], -1, acc.shape[-1])
        picked = self.cores[-1][digits[-1]]  # [m, b, c]
        rows = torch.einsum("mCb,mbc->mCc", acc, picked).reshape(flat.shape[0], -1)
        if self.padding_idx is not None:
            rows = rows.masked_fill((flat == self.padding_idx).unsqueeze(-1), 0.0)
        return rows.reshape(*tokens.shape, self.embedding_dim)
