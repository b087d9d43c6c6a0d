"""The plugin's attention: fairseq's ``MultiheadAttention`` with every technique that changes how
queries, keys and values are formed or combined (docs/DESIGN.md, "Attention").

* gated pre-attention ``AgB`` and identity projections (``no_patt``; Anthe, arXiv:2305.10991;
  :mod:`~slim_fairseq.modules.gated_attention`), Tensor-Chain projections (``tc_ratio``);
* grouped-query attention (``kv_heads``: query head h reads key/value head
  ``h // (heads // kv_heads)``), a head width other than ``embed_dim // heads`` (``head_dim``),
  bias-free projections, RoPE on queries and keys (``rope_theta``; the STLM block,
  arXiv:2405.14159);
* shaped attention ``(alpha I + beta softmax - gamma C) V`` and the reduced form without W_Q (or
  W_K, W_V) and P (skipless blocks: He & Hofmann, arXiv:2311.01906 §4.1; Graef,
  arXiv:2404.12362; :mod:`~slim_fairseq.modules.shaped_attention`).

With none of them it *is* fairseq's module (same parameters, init and forward: :attr:`plain`
runs fairseq's own ``forward``). Otherwise :meth:`forward` runs here. It is written for
``(B, heads, T, d_h)`` tensors because fairseq's forward assumes ``heads * d_h == embed_dim``
and as many key/value heads as query heads; it keeps fairseq's argument and return
conventions and its incremental-state layout (``prev_key``/``prev_value`` of shape
``(B, kv_heads, T, d_h)``), so fairseq's ``reorder_incremental_state`` (beam search) applies
unchanged. ``tests/test_attention.py`` pins this path to fairseq's output for the dense case.
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq import utils
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise

from slim_fairseq.modules.gated_attention import (CROSS_GATES, GATES, check_gate, gated_projection,
                                                  tc_ratio_for)
from slim_fairseq.modules.rope import RotaryEmbedding
from slim_fairseq.modules.shaped_attention import REMOVABLE, shaped_mixing
from slim_fairseq.modules.tensor_chain import TensorChainLinear
from slim_fairseq.option_errors import option_error

ROLES = ("encoder_self", "decoder_self", "cross")


def heads_for(width, head_width=64):
    """Attention heads of about ``head_width`` channels that divide ``width``: width // 64,
    lowered until it divides (at least 1); e.g. 350 -> 5 heads of 70. The presets' heads, the
    sandwich middle's and SAFE's attention's when not given."""
    heads = max(1, width // head_width)
    while width % heads:
        heads -= 1
    return heads


def attention_head_dim(embed_dim, num_heads, head_dim=0, rope=False):
    """Channels per head: ``head_dim``, or ``embed_dim // heads`` rounded down to an even number
    with RoPE (which rotates channel pairs; the STLM block: 528 / 16 heads -> 32)."""
    if head_dim:
        return head_dim
    width = embed_dim // num_heads
    return 2 * (width // 2) if rope else width


class SlimMultiheadAttention(MultiheadAttention):
    """fairseq's attention with the options of the module docstring (all off by default)."""

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, self_attention=False,
                 encoder_decoder_attention=False, q_noise=0.0, qn_block_size=8,
                 xformers_att_config=None, *, gate="none", no_patt=False, tc_ratio=0.0,
                 tc_length=2, tc_min_bond=0, kv_heads=0, head_dim=0, rope_theta=0.0,
                 shaped=False, removed=None, out_proj=True):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
                         add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                         self_attention=self_attention,
                         encoder_decoder_attention=encoder_decoder_attention, q_noise=q_noise,
                         qn_block_size=qn_block_size, xformers_att_config=xformers_att_config)
        if gate not in GATES:
            raise option_error("--self-attn-gate", gate, "not a gate", "|".join(GATES))
        if encoder_decoder_attention and gate not in CROSS_GATES:
            check_gate(gate, "cross")
        removed = None if removed in (None, "", "none") else removed
        if removed is not None and removed not in REMOVABLE:
            raise option_error("--removed-weights", removed, "not a projection",
                               "none|" + "|".join(REMOVABLE))
        self.gate, self.no_patt, self.tc_ratio = gate, bool(no_patt), float(tc_ratio or 0.0)
        self.kv_heads = int(kv_heads or num_heads)
        self.head_dim = int(head_dim or embed_dim // num_heads)
        self.scaling = self.head_dim ** -0.5
        self.q_width = num_heads * self.head_dim
        self.kv_width = self.kv_heads * self.head_dim
        self.removed = removed
        self.shaped = bool(shaped)
        self.rope = RotaryEmbedding(self.head_dim, rope_theta) if rope_theta else None
        if num_heads % self.kv_heads:
            raise option_error("--kv-heads", self.kv_heads, f"does not divide the {num_heads} "
                               "query heads", "0 (as many as the heads) or a divisor of the heads")
        if (self.q_width, self.kv_width) != (embed_dim, embed_dim):
            if add_bias_kv or add_zero_attn:
                raise option_error("--kv-heads", self.kv_heads, "fairseq's add_bias_kv / "
                                   "add_zero_attn need heads as wide as the model", "0 with them")
            self._reshape_projections(bias, q_noise, qn_block_size)
        if not (gate != "none" or self.no_patt or self.tc_ratio or removed is not None
                or not out_proj or self.rope is not None or self.shaped):
            return  # plain (fairseq's attention), perhaps with other head widths
        if self.use_xformers:
            raise option_error("--xformers-att-config", None, "works with fairseq's plain "
                               "attention only", "no gates, --no-patt, --tc-patt, --kv-heads, "
                               "--rope-theta, --no-linear-bias or skipless blocks with it")
        if (add_bias_kv or add_zero_attn) and (self.rope is not None or self.shaped):
            raise option_error("--rope-theta" if self.rope is not None else "--skipless-layout",
                               None, "cannot be combined with fairseq's add_bias_kv / add_zero_attn",
                               "plain attention with them")
        in_dims = {"q": embed_dim, "k": self.kdim, "v": self.vdim}
        out_dims = {"q": self.q_width, "k": self.kv_width, "v": self.kv_width}
        if self.no_patt:
            if set(in_dims.values()) | set(out_dims.values()) != {embed_dim}:
                raise option_error("--no-patt", None, "needs every input and head width to equal "
                                   f"the model width {embed_dim}", "--kv-heads 0 and --head-dim 0")
            self.q_proj = self.k_proj = self.v_proj = None
        elif self.tc_ratio:
            for name in ("q", "k", "v"):
                dense = getattr(self, name + "_proj")
                # variance of fairseq's xavier_uniform init of this projection
                gain = 2 ** -0.5 if self.qkv_same_dim else 1.0
                std = gain * (2.0 / (in_dims[name] + out_dims[name])) ** 0.5
                setattr(self, name + "_proj", TensorChainLinear(
                    in_dims[name], out_dims[name], ratio=self.tc_ratio, length=tc_length,
                    bias=dense.bias is not None, init_std=std, min_bond=tc_min_bond))
        if removed is not None:
            if in_dims[removed] != out_dims[removed]:
                raise option_error("--removed-weights", removed,
                                   f"W_{removed.upper()} is not square here ({in_dims[removed]} -> "
                                   f"{out_dims[removed]}: --kv-heads or --head-dim)",
                                   "q, or k|v with as many key/value heads as heads")
            setattr(self, removed + "_proj", None)
        if not out_proj:
            self.out_proj = None
        if gate != "none":
            source, target = gate[0], gate[2]
            if out_dims[source] != in_dims[target]:
                raise option_error("--self-attn-gate" if not encoder_decoder_attention
                                   else "--cross-attn-gate", gate,
                                   f"sigmoid(W_{source.upper()} {source}) is {out_dims[source]} "
                                   f"wide but {target} is {in_dims[target]} wide (--kv-heads, "
                                   "--head-dim)", "a gate whose first letter is q (qgv, qgk) with "
                                   "fewer key/value heads")
        if self.shaped:
            self.alpha = nn.Parameter(torch.ones(num_heads))
            self.beta = nn.Parameter(torch.ones(num_heads))
            self.gamma = nn.Parameter(torch.ones(num_heads))
            self.reset_shaped_parameters()

    # ------------------------------------------------------------------------------ set-up

    def _reshape_projections(self, bias, q_noise, qn_block_size):
        """Projections to ``heads * head_dim`` (queries) and ``kv_heads * head_dim`` (keys and
        values) instead of the model width, initialised as fairseq initialises its own."""
        def linear(n_in, n_out):
            return quant_noise(nn.Linear(n_in, n_out, bias=bias), q_noise, qn_block_size)

        self.q_proj = linear(self.embed_dim, self.q_width)
        self.k_proj = linear(self.kdim, self.kv_width)
        self.v_proj = linear(self.vdim, self.kv_width)
        self.out_proj = linear(self.q_width, self.embed_dim)
        gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.0
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def reset_shaped_parameters(self):
        """Shaped-attention init (He & Hofmann §4.1): projections N(0, 1/fan_in) so that values
        and output keep unit variance, W_Q zero, alpha = beta = gamma = 1: ``A`` starts as the
        identity."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if isinstance(proj, nn.Linear):
                nn.init.normal_(proj.weight, std=proj.in_features ** -0.5)
                if proj.bias is not None:
                    nn.init.zeros_(proj.bias)
        if isinstance(self.q_proj, nn.Linear):
            nn.init.zeros_(self.q_proj.weight)
        for scale in (self.alpha, self.beta, self.gamma):
            nn.init.ones_(scale)

    @property
    def plain(self):
        """Exactly fairseq's attention: fairseq's own forward runs (also after Tensor-Chain
        projections were exported with ``to_dense``)."""
        return (self.gate == "none" and self.rope is None and not self.shaped
                and self.q_width == self.embed_dim and self.kv_width == self.embed_dim
                and all(type(getattr(self, name + "_proj")) is nn.Linear
                        and getattr(self, name + "_proj").bias is not None  # fairseq's fast path
                        for name in ("q", "k", "v", "out")))

    @property
    def has_out_proj(self):
        return self.out_proj is not None

    def extra_repr(self):
        parts = [f"heads={self.num_heads}", f"kv_heads={self.kv_heads}", f"head_dim={self.head_dim}"]
        if self.gate != "none":
            parts.append(f"gate={self.gate}")
        if self.shaped:
            parts.append(f"shaped, removed={self.removed}, out_proj={self.has_out_proj}")
        return ", ".join(parts)

    # ---------------------------------------------------------------------------- forward

    def _project(self, name, x):
        proj = getattr(self, name + "_proj")
        return x if proj is None else proj(x)

    def project_inputs(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]
                       ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """(Q_s, K_s, V_s) of docs/TECHNIQUES.md#gated-pre-attention. ``key``/``value`` None
        means cached (static) K, V. A removed or identity projection passes its input on."""
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

    def _split_heads(self, x: Tensor, heads: int) -> Tensor:
        """(T, B, heads * d_h) -> (B, heads, T, d_h)."""
        return x.contiguous().view(x.size(0), x.size(1), heads, self.head_dim).permute(1, 2, 0, 3)

    def _expand_kv(self, x: Tensor) -> Tensor:
        """(B, kv_heads, S, d_h) -> (B, heads, S, d_h): each key/value head serves
        ``heads // kv_heads`` query heads."""
        group = self.num_heads // self.kv_heads
        return x if group == 1 else x.repeat_interleave(group, dim=1)

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
        tgt_len, bsz, _ = query.size()
        heads = self.num_heads

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
        if self.bias_k is not None and k is not None:
            k, v, attn_mask, key_padding_mask = self._add_bias(k, v, attn_mask, key_padding_mask, bsz)
        q = self._split_heads(q, heads)
        kv_bsz = bsz
        if k is not None:
            kv_bsz = k.size(1)
            k, v = self._split_heads(k, self.kv_heads), self._split_heads(v, self.kv_heads)
        if self.rope is not None:
            past = 0
            if saved_state is not None and saved_state.get("prev_key") is not None:
                past = saved_state["prev_key"].size(2)
            q, k = self.rope(q, offset=past), self.rope(k, offset=past)
        q = q * self.scaling

        if saved_state is not None:
            if "prev_key" in saved_state:
                prev_key = saved_state["prev_key"]
                assert prev_key is not None
                kv_bsz = prev_key.size(0)
                k = prev_key if static_kv else torch.cat([prev_key, k], dim=2)
            if "prev_value" in saved_state:
                prev_value = saved_state["prev_value"]
                assert prev_value is not None
                v = prev_value if static_kv else torch.cat([prev_value, v], dim=2)
            assert k is not None and v is not None
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=kv_bsz, src_len=k.size(2), static_kv=static_kv)
            saved_state["prev_key"] = k
            saved_state["prev_value"] = v
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        assert k is not None and v is not None
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        if self.add_zero_attn:
            k, v, key_padding_mask, attn_mask = self._append_zero_attn(
                k=k, v=v, key_padding_mask=key_padding_mask, attn_mask=attn_mask)

        weights: Optional[Tensor] = None
        if self.shaped:
            dropout = self.dropout_module
            p = dropout.p if (self.training or dropout.apply_during_inference) else 0.0
            attn = shaped_mixing(q, self._expand_kv(k), self._expand_kv(v), self.alpha, self.beta,
                                 self.gamma, attn_mask, key_padding_mask, p)
        elif (not need_weights and not before_softmax and bsz == kv_bsz
                and (attn_mask is None or attn_mask.is_floating_point())
                and type(self).apply_sparse_mask is MultiheadAttention.apply_sparse_mask):
            attn = self._fused_attention(q, self._expand_kv(k), self._expand_kv(v), attn_mask,
                                         key_padding_mask)
        else:
            attn, weights = self._explicit_attention(q, k, v, attn_mask, key_padding_mask, bsz,
                                                     kv_bsz, before_softmax, need_weights,
                                                     need_head_weights)
            if before_softmax:
                return attn, weights
        attn = attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.q_width)
        if self.out_proj is not None:
            attn = self.out_proj(attn)
        return attn, weights

    def _fused_attention(self, q, k, v, attn_mask, key_padding_mask):
        """``softmax(q k^T + attn_mask + padding) v`` with torch's fused kernel (q already
        carries the scaling); the result of :meth:`_explicit_attention`."""
        bsz, _, tgt_len, _ = q.shape
        src_len = k.size(2)
        mask = None if attn_mask is None else attn_mask.to(q.dtype).view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            padding = torch.zeros(bsz, 1, 1, src_len, dtype=q.dtype, device=q.device).masked_fill(
                key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
            mask = padding if mask is None else mask + padding
        dropout = self.dropout_module
        p = dropout.p if (self.training or dropout.apply_during_inference) else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=1.0)

    def _explicit_attention(self, q, k, v, attn_mask, key_padding_mask, bsz, kv_bsz,
                            before_softmax, need_weights, need_head_weights):
        """Softmax attention with the probabilities at hand (attention weights, fairseq's
        ``before_softmax``, and several beams reading one copy of the encoder output)."""
        heads = self.num_heads
        tgt_len, src_len = q.size(2), k.size(2)
        k, v = self._expand_kv(k), self._expand_kv(v)
        shared_kv = bsz != kv_bsz  # several beams per encoder sentence
        if shared_kv:
            scores = torch.einsum("bxhtd,bhsd->bxhts", q.view(kv_bsz, -1, heads, tgt_len, q.size(3)), k)
            scores = scores.reshape(bsz, heads, tgt_len, src_len)
        else:
            scores = torch.matmul(q, k.transpose(2, 3))
        scores = self.apply_sparse_mask(scores.view(bsz * heads, tgt_len, src_len), tgt_len,
                                        src_len, bsz).view(bsz, heads, tgt_len, src_len)
        if attn_mask is not None:
            scores = scores + attn_mask.view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            scores = scores.view(kv_bsz, -1, heads, tgt_len, src_len).masked_fill(
                key_padding_mask.view(kv_bsz, 1, 1, 1, src_len).to(torch.bool), float("-inf"))
            scores = scores.view(bsz, heads, tgt_len, src_len)
        if before_softmax:
            values = v if not shared_kv else v.repeat_interleave(bsz // kv_bsz, dim=0)
            return (scores.view(bsz * heads, tgt_len, src_len),
                    values.reshape(bsz * heads, src_len, self.head_dim))
        probs_float = utils.softmax(scores, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(probs_float.type_as(scores))
        if shared_kv:
            attn = torch.einsum("bxhts,bhsd->bxhtd",
                                probs.view(kv_bsz, -1, heads, tgt_len, src_len), v)
            attn = attn.reshape(bsz, heads, tgt_len, self.head_dim)
        else:
            attn = torch.matmul(probs, v)
        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs_float.transpose(1, 0)  # (heads, B, T, S)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights


def build_attention(cfg, embed_dim, num_heads, *, role, dropout, kdim=None, vdim=None, **kwargs):
    """Attention block for ``role`` in {"encoder_self", "decoder_self", "cross"} configured by the
    model's options (gates, ``--no-patt``, ``--tc-patt``/``--tc-layer``, ``--kv-heads``,
    ``--head-dim``, ``--rope-theta`` (self-attention only), ``--linear-bias``, and, in a skipless
    decoder, shaped attention with ``--removed-weights``/``--keep-attn-out-proj``). Extra keyword
    arguments go to fairseq's ``MultiheadAttention`` (q_noise, qn_block_size,
    xformers_att_config, add_bias_kv, ...)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {'|'.join(ROLES)}, got {role!r}")
    cross = role == "cross"
    gate = getattr(cfg, "cross_attn_gate" if cross else "self_attn_gate", "none") or "none"
    check_gate(gate, role)
    if cross:
        kwargs.setdefault("encoder_decoder_attention", True)
    else:
        kwargs.setdefault("self_attention", True)
    rope_theta = 0.0 if cross else float(getattr(cfg, "rope_theta", 0.0) or 0.0)
    shaped = role == "decoder_self" and getattr(cfg, "skipless_layout", "none") not in (None, "none")
    removed = getattr(cfg, "removed_weights", "none") if shaped else "none"
    kwargs.setdefault("bias", bool(getattr(cfg, "linear_bias", True)))
    return SlimMultiheadAttention(
        embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, gate=gate,
        no_patt=bool(getattr(cfg, "no_patt", False)), tc_ratio=tc_ratio_for(cfg, "tc_patt"),
        tc_length=int(getattr(cfg, "tc_length", 2) or 2),
        tc_min_bond=int(getattr(cfg, "tc_min_bond", 0) or 0),
        kv_heads=int(getattr(cfg, "kv_heads", 0) or 0),
        head_dim=attention_head_dim(embed_dim, num_heads, int(getattr(cfg, "head_dim", 0) or 0),
                                    rope=bool(getattr(cfg, "rope_theta", 0.0))),
        rope_theta=rope_theta, shaped=shaped, removed=removed,
        out_proj=not shaped or removed in (None, "none") or bool(getattr(cfg, "keep_attn_out_proj", False)),
        **kwargs)
