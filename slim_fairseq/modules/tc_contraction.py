"""Contraction of a Tensor Chain with an input, without building its matrix (Anthe,
arXiv:2305.10991; docs/TECHNIQUES.md#tensor-chain): the arithmetic that
:mod:`~slim_fairseq.modules.tensor_chain` (the layers) and :mod:`~slim_fairseq.modules.tc_autograd`
(their memory-lean backward) share. Cores: the first ``[a_1, b, c_1]``, middle ones
``[a_i, b, b, c_i]``, the last ``[a_n, b, c_n]``; ``y = x @ W``.
"""
import torch

from slim_fairseq.modules import tensor_chain_policy


def materialise(cores):
    """Contract the chain into the full ``[N_a, N_c]`` matrix. Two cores: one product of the
    cores as ``[a1 c1, b] @ [b, a2 c2]`` and one reordering of its result."""
    if len(cores) == 2:
        (a1, bond, c1), (a2, _, c2) = cores[0].shape, cores[1].shape
        product = torch.mm(cores[0].transpose(1, 2).reshape(a1 * c1, bond),
                           cores[1].transpose(0, 1).reshape(bond, a2 * c2))  # [a1, c1, a2, c2]
        return product.view(a1, c1, a2, c2).transpose(1, 2).reshape(a1 * a2, c1 * c2)
    first = cores[0]  # [a1, b, c1]
    acc = first.permute(0, 2, 1)  # [A, C, b]
    for core in cores[1:-1]:  # [a, b, b', c]
        rows, cols, _ = acc.shape
        acc = torch.einsum("ACb,abec->AaCce", acc, core)
        acc = acc.reshape(rows * core.shape[0], cols * core.shape[3], core.shape[2])
    last = cores[-1]  # [a, b, c]
    rows, cols, _ = acc.shape
    out = torch.einsum("ACb,abc->AaCc", acc, last)
    return out.reshape(rows * last.shape[0], cols * last.shape[2])


def materialise_pairs(firsts, lasts):
    """:func:`materialise` of k two-core chains of one shape (``firsts``, ``lasts``: their first
    and last cores) in one batched product; returns their k matrices."""
    (a1, bond, c1), (a2, _, c2) = firsts[0].shape, lasts[0].shape
    count = len(firsts)
    left = torch.stack(firsts).transpose(2, 3).reshape(count, a1 * c1, bond)
    right = torch.stack(lasts).transpose(1, 2).reshape(count, bond, a2 * c2)
    product = torch.bmm(left, right).view(count, a1, c1, a2, c2)
    return product.transpose(2, 3).reshape(count, a1 * a2, c1 * c2).unbind(0)


def first_core_first(first, last):
    """Core order of :func:`contract_pair`: True when the input meets the first core first."""
    a1, bond, c1 = first.shape
    a2, _, c2 = last.shape
    return a1 * a2 + a2 * bond * c1 <= a1 * bond * c2 + c1 * c2


def row_block(x2d, first, last):
    """Rows per block for :func:`contract_pair` and its backward, or None for one pass
    (:func:`~slim_fairseq.modules.tensor_chain_policy.block_rows`: blocks on the CPU only, for a
    batch that does not fit one block and a contraction not recorded by autograd)."""
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in (x2d, first, last))
    a1, bond, c1 = first.shape
    a2, _, c2 = last.shape
    width = a2 * bond * c1 if first_core_first(first, last) else a1 * bond * c2
    # the policy's BLOCK_FLOATS read at each call (scripts/benchmark.py --tc-one-pass sets it)
    return tensor_chain_policy.block_rows(x2d.shape[0], width, recorded,
                                          *tensor_chain_policy.target(x2d),
                                          block_floats=tensor_chain_policy.BLOCK_FLOATS)


def contract_pair(x2d, first, last):
    """``x2d @ W`` for a two-core chain (``first`` [a1, b, c1], ``last`` [a2, b, c2]) as two
    matmuls (see :func:`contract_pair_rows`), over blocks of rows on the CPU (:func:`row_block`)."""
    rows = row_block(x2d, first, last)
    if rows is None:
        return contract_pair_rows(x2d, first, last)
    blocks = [contract_pair_rows(x2d[:rows], first, last)]
    out = blocks[0].new_empty(x2d.shape[0], blocks[0].shape[1])  # the dtype autocast gave
    out[:rows] = blocks[0]
    for start in range(rows, x2d.shape[0], rows):
        out[start:start + rows] = contract_pair_rows(x2d[start:start + rows], first, last)
    return out


def contract_pair_rows(x2d, first, last):
    """``x2d @ W`` for a two-core chain in one pass, as two matmuls. Both orders cost the same
    multiply-adds up to the intermediate's width; what differs is the layout copy each needs,
    so the order that copies fewer elements per row runs: first core first copies the input
    (a1 a2) and the intermediate (a2 b c1); last core first copies the intermediate (a1 b c2)
    and the output (c1 c2)."""
    m = x2d.shape[0]
    a1, bond, c1 = first.shape
    a2, _, c2 = last.shape
    if first_core_first(first, last):
        u = torch.matmul(x2d.reshape(m, a1, a2).transpose(1, 2),
                         first.reshape(a1, bond * c1))  # [m, a2, b c1]
        out = torch.matmul(u.reshape(m, a2 * bond, c1).transpose(1, 2),
                           last.reshape(a2 * bond, c2))  # [m, c1, c2]
    else:
        t = x2d.reshape(m * a1, a2) @ last.reshape(a2, bond * c2)  # [m a1, b c2]
        t = t.reshape(m, a1 * bond, c2).transpose(1, 2).reshape(m * c2, a1 * bond)
        out = (t @ first.reshape(a1 * bond, c1)).reshape(m, c2, c1).transpose(1, 2)
    return out.reshape(m, c1 * c2)


def contract_input(x2d, cores):
    """``x2d @ W`` without building W: contract the input with one core at a time."""
    if len(cores) == 2:
        return contract_pair(x2d, cores[0], cores[1])
    m = x2d.shape[0]
    a1 = cores[0].shape[0]
    t = x2d.reshape(m, a1, -1)  # [m, a1, R]
    t = torch.einsum("mar,abc->mrcb", t, cores[0])  # [m, R, C, b]
    for core in cores[1:-1]:
        a, _, bond_out, c = core.shape
        rest, cols = t.shape[1] // a, t.shape[2]
        t = t.reshape(m, a, rest, cols, t.shape[3])
        t = torch.einsum("marCb,abec->mrCce", t, core)
        t = t.reshape(m, rest, cols * c, bond_out)
    last = cores[-1]
    a, _, c = last.shape
    cols = t.shape[2]
    t = t.reshape(m, a, cols, t.shape[3])  # rest is 1 here
    out = torch.einsum("maCb,abc->mCc", t, last)
    return out.reshape(m, cols * c)
