"""The maths of H-SoftPOS with l levels (Anthe, arXiv:2305.10991; docs/TECHNIQUES.md#h-softpos):

    d_sp = floor(d / 2l),  n_sp = d_sp,  d_emb = d - (2l - 1) d_sp
    X_i = CausalConv1d(width(X_{i-1}) -> d_sp, kernel 3, dilation 2**(i-2))(X_{i-1}), i = 2..l
    SoftPOS_i(X) = softmax(X[..., :n_sp]) @ W_sp_i
    output = [X_1, SoftPOS_1(X_1), X_2, SoftPOS_2(X_2), ...]   (width d)

given X_1 (the scaled token table plus positions). Pad positions are zeroed before every
convolution. A convolution runs as one matrix product over windows of ``kernel`` taps
(:func:`causal_conv`) in the full pass and in each decoding step alike (see
:mod:`slim_fairseq.modules.hsoftpos`, which wraps this file for fairseq).

Plain torch (no fairseq): the fairseq embedding and the transformers code an export writes both
run this file.
"""
import torch
import torch.nn.functional as F

KERNEL_SIZE = 3


def conv_weight(conv):
    """``nn.Conv1d`` weight (C_out, C_in, K) as the matrix of a window flattened (channel,
    tap): (C_out, C_in K)."""
    return conv.weight.view(conv.out_channels, -1)


def causal_conv(conv, x, dilation):
    """``conv`` over ``x`` (B, T, C_in), causal (left zero padding), as one matrix product
    over windows: ``window[b, t, c, j] = x[b, t - (K-1-j) dilation, c]``. Returns (B, T, C_out)."""
    bsz, length, channels = x.shape
    reach = (KERNEL_SIZE - 1) * dilation
    padded = F.pad(x, (0, 0, reach, 0)).contiguous()
    windows = padded.as_strided((bsz, length, channels, KERNEL_SIZE),
                                (padded.stride(0), channels, 1, dilation * channels))
    return F.linear(windows.reshape(bsz, length, channels * KERNEL_SIZE), conv_weight(conv),
                    conv.bias)


def conv_step(conv, x, history, dilation):
    """``conv`` at one new position ``x`` (B, 1, C_in) after ``history`` (B, (K-1) dilation,
    C_in), the inputs of earlier positions (None: none, zeros). Returns (output (B, 1, C_out),
    the history for the next step)."""
    if history is None:
        history = x.new_zeros(x.size(0), (KERNEL_SIZE - 1) * dilation, x.size(2))
    window = torch.cat([history, x], dim=1)
    taps = window if dilation == 1 else window[:, ::dilation]
    taps = taps.transpose(1, 2).reshape(x.size(0), 1, -1)  # (channel, tap)
    return F.linear(taps, conv_weight(conv), conv.bias), window[:, 1:]


def hsoftpos_dims(model_dim, levels, min_token_dim=0):
    """(d_sp, n_sp, d_emb) for model width d and l levels (512, 2 -> 128, 128, 128).

    ``min_token_dim`` (``--hsoftpos-min-token-dim``, 0 = the paper's split) widens the token
    table to at least that width by narrowing the soft-position slots:
    d_sp = floor((d - min_token_dim) / (2l - 1)) when the paper's d_emb is narrower.
    """
    assert levels >= 1, levels
    d_sp = model_dim // (2 * levels)
    if model_dim - (2 * levels - 1) * d_sp < min_token_dim:
        d_sp = (model_dim - min_token_dim) // (2 * levels - 1)
    assert d_sp >= 1, (model_dim, levels, min_token_dim)  # (the options' rule: widths fit)
    return d_sp, d_sp, model_dim - (2 * levels - 1) * d_sp


def level_dilations(levels):
    """The dilations of the convolutions of levels 2..l: ``2 ** (i - 2)``."""
    return [2 ** (i - 2) for i in range(2, levels + 1)]


def soft_positions(x, weight, n_sp):
    """SoftPOS of ``x``: ``softmax(x[..., :n_sp]) @ weight`` (no slice where ``x`` is
    ``n_sp`` wide)."""
    if x.size(-1) != n_sp:
        x = x[..., : n_sp]
    return torch.softmax(x, dim=-1) @ weight


def hsoftpos_levels(x, keep, convs, dilations, softpos, n_sp, histories=None):
    """``[X_1, SoftPOS_1(X_1), X_2, ...]`` from ``x`` = X_1 (B, T, d_emb); ``keep`` (B, T, 1)
    bool, False at padding; ``convs``, ``dilations``, ``softpos``: the levels' convolutions,
    dilations and W_sp. ``histories``: None for a whole sequence; for one decoding step
    (T = 1) a dict {level: inputs of earlier steps} that is read and updated."""
    x = x * keep
    parts = [x, soft_positions(x, softpos[0], n_sp)]
    for level, (conv, dil) in enumerate(zip(convs, dilations), start=1):
        if histories is None:
            x = causal_conv(conv, x, dil) * keep
        else:
            x, histories[str(level)] = conv_step(conv, x, histories.get(str(level)), dil)
            x = x * keep
        parts += [x, soft_positions(x, softpos[level], n_sp)]
    return torch.cat(parts, dim=-1)
