"""Gated pre-attention ("XgY"), no-patt and Tensor-Chain projections (Anthe, arXiv:2305.10991;
docs/TECHNIQUES.md#gated-pre-attention, #cross-attention-gates, #no-patt, #tensor-chain).

Gate ``AgB`` (A, B in {q, k, v}, C the third), with W_A, W_B, W_C the pre-attention
projections (no extra parameters):

    B_s = W_B(B * sigmoid(W_A A))      A_s = A      C_s = W_C C

then ordinary scaled-dot-product multi-head attention on (Q_s, K_s, V_s) and the (dense,
ungated) output projection. ``no_patt`` makes W_Q, W_K, W_V the identity.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq import utils
from fairseq.modules import MultiheadAttention

GATES = ("none", "qgv", "kgv", "vgq", "vgk", "qgk", "kgq")
# in cross-attention Q comes from the target and K, V from the source: only gates whose two
# inputs sit on the same side are defined for S != T, and only they cannot leak the future
CROSS_GATES = ("none", "kgv", "vgk")
CROSS_GATE_WHY = ("qgv/qgk/vgq/kgq gate one sequence with the other position by position: "
                  "undefined when source and target lengths differ, and it leaks future target "
                  "tokens")
ROLES = ("encoder_self", "decoder_self", "cross")


def check_gate(gate, role):
    """One-line ValueError for a gate that is unknown, or not allowed in cross-attention."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {'|'.join(ROLES)}, got {role!r}")
    if role == "cross":
        if gate not in CROSS_GATES:
            raise ValueError(
                f"--cross-attn-gate={gate!r} is not allowed; allowed: {'|'.join(CROSS_GATES)} "
                f"({CROSS_GATE_WHY})")
    elif gate not in GATES:
        raise ValueError(f"--self-attn-gate={gate!r} is not allowed; allowed: {'|'.join(GATES)}")


class GatedMultiheadAttention(MultiheadAttention):
    """fairseq's ``MultiheadAttention`` with an ``AgB`` gate, optional identity pre-attention
    projections (``no_patt``) and optional Tensor-Chain q/k/v projections (``tc_ratio`` > 0).

    With ``gate="none"``, ``no_patt=False`` and no TC it *is* fairseq's module (same
    parameters, same init, same forward). Incremental state uses fairseq's buffer layout, so
    fairseq's ``reorder_incremental_state`` (beam search) applies unchanged.
    """

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, bias=True,
                 self_attention=False, encoder_decoder_attention=False, gate="none",
                 no_patt=False, tc_ratio=0.0, tc_length=2, tc_min_bond=0, **kwargs):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
                         self_attention=self_attention,
                         encoder_decoder_attention=encoder_decoder_attention, **kwargs)
        if gate not in GATES:
            raise ValueError(
                f"--self-attn-gate={gate!r} is not allowed; allowed: {'|'.join(GATES)}")
        if encoder_decoder_attention and gate not in CROSS_GATES:
            check_gate(gate, "cross")
        self.gate = gate
        self.no_patt = bool(no_patt)
        self.tc_ratio = float(tc_ratio or 0.0)
        if gate == "none" and not self.no_patt and not self.tc_ratio:
            return
        if self.use_xformers:
            raise ValueError("--xformers-att-config cannot be combined with attention gates, "
                             "--no-patt or --tc-patt")
        in_dims = {"q": embed_dim, "k": self.kdim, "v": self.vdim}
        if self.no_patt:
            if self.kdim != embed_dim or self.vdim != embed_dim:
                raise ValueError("--no-patt needs key/value width == model width "
                                 f"(got kdim={self.kdim}, vdim={self.vdim}, d={embed_dim})")
            self.q_proj = self.k_proj = self.v_proj = None
        elif self.tc_ratio:
            from slim_fairseq.modules.tensor_chain import TensorChainLinear
            for name in ("q", "k", "v"):
                dense = getattr(self, name + "_proj")
                # variance of fairseq's xavier_uniform init of this projection
                gain = 2 ** -0.5 if self.qkv_same_dim else 1.0
                std = gain * (2.0 / (in_dims[name] + embed_dim)) ** 0.5
                setattr(self, name + "_proj", TensorChainLinear(
                    in_dims[name], embed_dim, ratio=self.tc_ratio, length=tc_length,
                    bias=dense.bias is not None, init_std=std, min_bond=tc_min_bond))
        if gate != "none":
            source, target = gate[0], gate[2]
            raw = source  # the source's slot takes its input unprojected
            if in_dims[raw] != embed_dim or in_dims[target] != embed_dim:
                raise ValueError(f"attention gate {gate!r} needs key/value width == model width "
                                 f"(got kdim={self.kdim}, vdim={self.vdim}, d={embed_dim})")

    @property
    def plain(self):
        """No gate and three dense projections: exactly fairseq's attention, so fairseq's own
        forward runs (also after Tensor-Chain projections were exported with ``to_dense``)."""
        return self.gate == "none" and all(
            type(getattr(self, name + "_proj")) is nn.Linear for name in ("q", "k", "v"))

    def _project(self, name, x):
        proj = getattr(self, name + "_proj")
        return x if proj is None else proj(x)

    def project_inputs(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]
                       ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """(Q_s, K_s, V_s) of docs/TECHNIQUES.md#gated-pre-attention. ``key``/``value`` None means cached (static) K, V."""
        inputs = {"q": query, "k": key, "v": value}
        if self.gate == "none":
            names = ("q",) if key is None else ("q", "k", "v")
            out = {n: self._project(n, inputs[n]) for n in names}
            return out["q"], out.get("k"), out.get("v")
        source, target = self.gate[0], self.gate[2]
        out = {}
        for name in ("q", "k", "v"):
            if inputs[name] is None:
                out[name] = None
            elif name == source:
                out[name] = inputs[name]
            elif name == target:
                gate = torch.sigmoid(self._project(source, inputs[source]))
                out[name] = gated_projection(getattr(self, name + "_proj"), inputs[name], gate)
            else:
                out[name] = self._project(name, inputs[name])
        return out["q"], out["k"], out["v"]

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if self.plain:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=need_weights,
                                   static_kv=static_kv, attn_mask=attn_mask,
                                   before_softmax=before_softmax,
                                   need_head_weights=need_head_weights)
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim

        saved_state: Optional[Dict[str, Optional[Tensor]]] = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved_state:
                assert self.encoder_decoder_attention and not self.self_attention
                key = value = None
        if self.self_attention:
            # one contiguous copy (the first layer gets a transposed view), shared by every
            # projection and the gate, instead of one copy per projection
            key = value = query = query.contiguous()
        elif self.encoder_decoder_attention and key is not None:
            if self.beam_size > 1 and bsz == key.size(1):
                # the encoder output is repeated per beam: keep one copy per sentence
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(
                        -1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
            value = key

        q, k, v = self.project_inputs(query, key, value)
        q = q * self.scaling
        if self.bias_k is not None:
            assert self.bias_v is not None
            k, v, attn_mask, key_padding_mask = self._add_bias(
                k, v, attn_mask, key_padding_mask, bsz)

        q = q.contiguous().view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        kv_bsz = bsz
        if k is not None:
            kv_bsz = k.size(1)
            k = k.contiguous().view(-1, kv_bsz * heads, head_dim).transpose(0, 1)
        if v is not None:
            v = v.contiguous().view(-1, kv_bsz * heads, head_dim).transpose(0, 1)

        if saved_state is not None:
            if "prev_key" in saved_state:
                prev_key = saved_state["prev_key"]
                assert prev_key is not None
                kv_bsz = prev_key.size(0)
                prev_key = prev_key.view(kv_bsz * heads, -1, head_dim)
                k = prev_key if static_kv else torch.cat([prev_key, k], dim=1)
            if "prev_value" in saved_state:
                prev_value = saved_state["prev_value"]
                assert prev_value is not None
                prev_value = prev_value.view(kv_bsz * heads, -1, head_dim)
                v = prev_value if static_kv else torch.cat([prev_value, v], dim=1)
            assert k is not None and v is not None
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=kv_bsz, src_len=k.size(1), static_kv=static_kv)
            saved_state["prev_key"] = k.view(kv_bsz, heads, -1, head_dim)
            saved_state["prev_value"] = v.view(kv_bsz, heads, -1, head_dim)
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        assert k is not None and v is not None
        src_len = k.size(1)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        if self.add_zero_attn:
            src_len += 1
            k, v, key_padding_mask, attn_mask = self._append_zero_attn(
                k=k, v=v, key_padding_mask=key_padding_mask, attn_mask=attn_mask)

        if (not need_weights and not before_softmax and bsz == kv_bsz
                and (attn_mask is None or attn_mask.is_floating_point())
                and type(self).apply_sparse_mask is MultiheadAttention.apply_sparse_mask):
            return self._fused_attention(q, k, v, attn_mask, key_padding_mask, tgt_len, bsz), None

        shared_kv = self.encoder_decoder_attention and bsz != kv_bsz
        if shared_kv:  # several beams per encoder sentence
            scores = torch.einsum("bxhtd,bhsd->bxhts",
                                  q.view((kv_bsz, -1, heads) + q.size()[1:]),
                                  k.view((kv_bsz, heads) + k.size()[1:]))
            scores = scores.reshape((-1,) + scores.size()[-2:])
        else:
            scores = torch.bmm(q, k.transpose(1, 2))
        scores = self.apply_sparse_mask(scores, tgt_len, src_len, bsz)
        if attn_mask is not None:
            scores = scores + attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            scores = scores.view(kv_bsz, -1, heads, tgt_len, src_len)
            scores = scores.masked_fill(
                key_padding_mask.view(kv_bsz, 1, 1, 1, src_len).to(torch.bool), float("-inf"))
            scores = scores.view(bsz * heads, tgt_len, src_len)
        if before_softmax:
            return scores, v

        probs_float = utils.softmax(scores, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(probs_float.type_as(scores))
        if shared_kv:
            attn = torch.einsum("bxhts,bhsd->bxhtd",
                                probs.view((kv_bsz, -1, heads) + probs.size()[1:]),
                                v.view((kv_bsz, heads) + v.size()[1:]))
            attn = attn.reshape((-1,) + attn.size()[-2:])
        else:
            attn = torch.bmm(probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)
        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights

    def _fused_attention(self, q, k, v, attn_mask, key_padding_mask, tgt_len, bsz):
        """``out_proj(softmax(q k^T + attn_mask + padding) v)`` with torch's fused attention
        kernel; the same result as the explicit path below (q already carries the scaling)."""
        heads, head_dim = self.num_heads, self.head_dim
        src_len = k.size(1)
        q, k, v = (t.view(bsz, heads, -1, head_dim) for t in (q, k, v))
        mask = None if attn_mask is None else attn_mask.to(q.dtype).view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            padding = torch.zeros(bsz, 1, 1, src_len, dtype=q.dtype, device=q.device).masked_fill(
                key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
            mask = padding if mask is None else mask + padding
        dropout = self.dropout_module
        p = dropout.p if (self.training or dropout.apply_during_inference) else 0.0
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=1.0)
        attn = attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * head_dim)
        return self.out_proj(attn)


class GatedLinear(torch.autograd.Function):
    """``(x * gate) @ w + bias`` (``w`` [in, out]) keeping ``x`` and ``gate`` (which the gate and
    the other projections keep anyway), not their product; the product is recomputed for the
    weight gradient. Same results as autograd through ``addmm``."""

    @staticmethod
    def forward(ctx, x, gate, w, bias):
        from slim_fairseq.modules.tc_autograd import remember_autocast
        remember_autocast(ctx, x)
        ctx.save_for_backward(x, gate, w)
        ctx.bias_dtype = None if bias is None else bias.dtype
        xg = (x * gate).reshape(-1, w.shape[0])
        y = torch.addmm(bias, xg, w) if bias is not None else xg @ w
        return y.reshape(*x.shape[:-1], w.shape[1])

    @staticmethod
    def backward(ctx, grad):
        from slim_fairseq.modules.tc_autograd import forward_autocast, refuse_double_backward
        refuse_double_backward("gated attention projection")
        x, gate, w = ctx.saved_tensors
        grad2d = grad.reshape(-1, w.shape[1])
        grad_x = grad_gate = grad_w = grad_bias = None
        with forward_autocast(ctx):
            if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
                grad_xg = (grad2d @ w.t()).reshape(x.shape)
                if ctx.needs_input_grad[0]:
                    grad_x = (grad_xg * gate).to(x.dtype)
                if ctx.needs_input_grad[1]:
                    grad_gate = (grad_xg * x).to(gate.dtype)
            if ctx.needs_input_grad[2]:
                grad_w = ((x * gate).reshape(-1, w.shape[0]).t() @ grad2d).to(w.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[3]:
            grad_bias = grad2d.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_gate, grad_w, grad_bias


def gated_projection(proj, x, gate):
    """``proj(x * gate)`` for a gate's target projection (None = identity). A dense or
    materialising Tensor-Chain projection in training runs as :class:`GatedLinear`."""
    if proj is None:
        return x * gate
    if torch.is_grad_enabled() and x.shape == gate.shape and x.dtype == gate.dtype:
        if type(proj) is nn.Linear:
            return GatedLinear.apply(x, gate, proj.weight.t(), proj.bias)
        from slim_fairseq.modules.tensor_chain import TensorChainLinear
        rows = x.numel() // x.shape[-1]
        if isinstance(proj, TensorChainLinear) and not proj.use_contraction(rows):
            return GatedLinear.apply(x, gate, proj.full_weight(), proj.bias)
    return proj(x * gate)


def tc_ratio_for(cfg, place):
    """Ratio of one TC placement; ``tc_layer`` covers ff and patt unless the place is set."""
    specific = float(getattr(cfg, place, 0.0) or 0.0)
    return specific or float(getattr(cfg, "tc_layer", 0.0) or 0.0)


def build_attention(cfg, embed_dim, num_heads, *, role, dropout, kdim=None, vdim=None, **kwargs):
    """Attention block for ``role`` in {"encoder_self", "decoder_self", "cross"} configured by
    ``cfg.self_attn_gate`` / ``cfg.cross_attn_gate`` / ``cfg.no_patt`` / ``cfg.tc_patt`` /
    ``cfg.tc_layer`` / ``cfg.tc_length``. Extra keyword arguments go to fairseq's
    ``MultiheadAttention`` (q_noise, qn_block_size, xformers_att_config, add_bias_kv, ...)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {'|'.join(ROLES)}, got {role!r}")
    cross = role == "cross"
    gate = getattr(cfg, "cross_attn_gate" if cross else "self_attn_gate", "none") or "none"
    check_gate(gate, role)
    if cross:
        kwargs.setdefault("encoder_decoder_attention", True)
    else:
        kwargs.setdefault("self_attention", True)
    return GatedMultiheadAttention(
        embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, gate=gate,
        no_patt=bool(getattr(cfg, "no_patt", False)), tc_ratio=tc_ratio_for(cfg, "tc_patt"),
        tc_length=int(getattr(cfg, "tc_length", 2) or 2),
        tc_min_bond=int(getattr(cfg, "tc_min_bond", 0) or 0), **kwargs)
