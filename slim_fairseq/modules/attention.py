"""The plugin's attention, a sibling of fairseq's ``MultiheadAttention`` for every technique that
changes how queries, keys and values are formed or combined (docs/DESIGN.md, "Attention"):

* gated pre-attention ``AgB`` and identity projections (``no_patt``; Anthe, arXiv:2305.10991;
  :mod:`~slim_fairseq.modules.gated_attention`), Tensor-Chain projections (``tc_ratio``);
* grouped-query attention (``kv_heads``: query head h reads key/value head
  ``h // (heads // kv_heads)``), a head width other than ``embed_dim // heads`` (``head_dim``),
  bias-free projections, RoPE on queries and keys (``rope_theta``; the STLM block,
  arXiv:2405.14159);
* shaped attention ``(alpha I + beta softmax - gamma C) V`` and the reduced form without W_Q (or
  W_K, W_V) and P (skipless blocks: He & Hofmann, arXiv:2311.01906 §4.1; Graef,
  arXiv:2404.12362; :mod:`~slim_fairseq.modules.shaped_attention`).

With none of them :func:`build_attention` builds fairseq's own class. This one takes fairseq's
arguments and returns what fairseq's returns, and keeps fairseq's incremental-state layout
(``prev_key`` / ``prev_value`` of shape ``(B, kv_heads, T, d_h)``, ``prev_key_padding_mask``
under the module's ``attn_state``), so beam search reorders it with fairseq's own code.

It is written for few kernel launches: heads are views of the projections, torch's fused
``scaled_dot_product_attention`` takes the scale and the grouped key/value heads itself
(``enable_gqa``; the cache keeps ``kv_heads`` heads and is never expanded), the decoder's
future mask becomes ``is_causal`` (:func:`mark_causal`), several beams reading one copy of the
encoder output are folded into query rows, and attention weights (asked for in cross-attention
during generation) come from an explicit softmax over the same grouped layout.
``tests/test_attention.py`` pins it to fairseq's output for the dense case.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import MultiheadAttention
from fairseq.modules.fairseq_dropout import FairseqDropout

from slim_fairseq.modules.gate_function import gated_inputs
from slim_fairseq.modules.gated_attention import gated_projection
from slim_fairseq.modules.rope import RotaryEmbedding
from slim_fairseq.modules.shaped_attention import shaped_mixing
from slim_fairseq.modules.tc_autograd import in_autocast_dtype
from slim_fairseq.modules.tensor_chain import TensorChainLinear, built_together
from slim_fairseq.modules.tensor_chain_policy import device_and_autocast
from slim_fairseq.specs import PLAIN_ATTENTION, AttentionSpec

ROLES = ("encoder_self", "decoder_self", "cross")
_CAUSAL = "_slim_causal_mask"

# the module of each attention extension, by its spec's class (docs/DESIGN.md, "Adding a
# technique"; slim_fairseq.models.slim_layers.register_attention_extension fills it)
EXTENSIONS = {}


def mark_causal(mask: Tensor) -> Tensor:
    """Mark ``mask`` (a decoder's future mask: -inf above the diagonal) so that the attention
    that receives it runs the fused causal kernel instead of reading it."""
    setattr(mask, _CAUSAL, True)
    return mask


def is_marked_causal(mask: Optional[Tensor]) -> bool:
    return mask is not None and getattr(mask, _CAUSAL, False)


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


def _heads(x: Tensor, heads: int, head_dim: int) -> Tensor:
    """(T, B, heads * d_h) -> (B, heads, T, d_h), a view when ``x`` is contiguous; one op for
    a decoding step's single position (T = 1: the same order of elements)."""
    if x.size(0) == 1:
        return x.reshape(x.size(1), heads, 1, head_dim)
    shape = (x.size(0), x.size(1), heads, head_dim)
    return (x.view(shape) if x.is_contiguous() else x.reshape(shape)).permute(1, 2, 0, 3)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, heads, T, d_h) -> (T, B, heads * d_h); one op for a single position (T = 1)."""
    bsz, heads, tgt_len, head_dim = x.shape
    if tgt_len == 1:
        return x.reshape(1, bsz, heads * head_dim)
    return x.permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * head_dim)


@with_incremental_state
class SlimMultiheadAttention(nn.Module):
    """Attention with the options of the module docstring; fairseq's ``MultiheadAttention``'s
    constructor arguments, ``forward`` and incremental state."""

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0,
                 self_attention=False, encoder_decoder_attention=False, *,
                 spec: AttentionSpec = PLAIN_ATTENTION):
        super().__init__()
        self.spec = spec
        removed = None if spec.removed == "none" else spec.removed
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.kv_heads = spec.kv_heads or num_heads
        self.head_dim = spec.head_dim or embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_width = num_heads * self.head_dim
        self.kv_width = self.kv_heads * self.head_dim
        self.self_attention = self_attention
        self.encoder_decoder_attention = encoder_decoder_attention
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.gate, self.no_patt, self.tc_ratio = spec.gate, spec.no_patt, spec.chain.ratio
        self.removed, self.shaped = removed, spec.shaped
        self.beam_size = 1
        self.onnx_trace = False

        in_dims = {"q": embed_dim, "k": self.kdim, "v": self.vdim}
        out_dims = {"q": self.q_width, "k": self.kv_width, "v": self.kv_width}
        # fairseq's registration order (k, v, q, out) and init: xavier_uniform, gain 1/sqrt(2)
        # for the input projections when queries, keys and values have the model width
        gain = 2 ** -0.5 if self.qkv_same_dim else 1.0
        for name in ("k", "v", "q"):
            if self.no_patt or name == removed:
                proj = None
            elif self.tc_ratio:
                proj = TensorChainLinear(
                    in_dims[name], out_dims[name], ratio=self.tc_ratio, length=spec.chain.length,
                    bias=spec.bias, min_bond=spec.chain.min_bond,
                    init_std=gain * (2.0 / (in_dims[name] + out_dims[name])) ** 0.5)
            else:
                proj = nn.Linear(in_dims[name], out_dims[name], bias=spec.bias)
            setattr(self, name + "_proj", proj)
        self.out_proj = (nn.Linear(self.q_width, embed_dim, bias=spec.bias) if spec.out_proj
                         else None)
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            if isinstance(proj, nn.Linear):
                nn.init.xavier_uniform_(proj.weight, gain=gain)
        if self.out_proj is not None:
            nn.init.xavier_uniform_(self.out_proj.weight)
            if self.out_proj.bias is not None:
                nn.init.zeros_(self.out_proj.bias)
        self.rope = RotaryEmbedding(self.head_dim, spec.rope_theta) if spec.rope_theta else None
        # each extension's module, under the name of its option (--attn-output-gate:
        # attn_output_gate), built after the attention's own parameters
        self.extensions = nn.ModuleDict({
            ext.flag.lstrip("-").replace("-", "_"): EXTENSIONS[type(ext)](ext, self)
            for ext in spec.extensions}) if spec.extensions else None
        self._score_biases = [m for m in (self.extensions or {}).values() if hasattr(m, "score_bias")]
        self._output_hooks = [m for m in (self.extensions or {}).values() if hasattr(m, "output")]
        self._position_hooks = [m for m in (self.extensions or {}).values()
                                if hasattr(m, "queries_keys")]
        # (the rules: a score bias joins self-attentions of softmax scores only, positions of
        # queries and keys self-attentions only)
        assert not (self._score_biases and (self.shaped or self.encoder_decoder_attention)), \
            "a score bias in a cross-attention or a shaped attention"
        assert not (self._position_hooks and self.encoder_decoder_attention), \
            "positions of queries and keys in a cross-attention"
        if self.shaped:
            self.alpha = nn.Parameter(torch.ones(num_heads))
            self.beta = nn.Parameter(torch.ones(num_heads))
            self.gamma = nn.Parameter(torch.ones(num_heads))
            self.reset_shaped_parameters()

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
    def has_out_proj(self):
        return self.out_proj is not None

    def extra_repr(self):
        parts = [f"heads={self.num_heads}", f"kv_heads={self.kv_heads}", f"head_dim={self.head_dim}"]
        if self.gate != "none":
            parts.append(f"gate={self.gate}")
        if self.shaped:
            parts.append(f"shaped, removed={self.removed}, out_proj={self.has_out_proj}")
        return ", ".join(parts)

    # ------------------------------------------------------------- fairseq's incremental state

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return {} if result is None else result

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search: fairseq's own reordering (the layouts agree)."""
        return MultiheadAttention.reorder_incremental_state(self, incremental_state, new_order)

    def set_beam_size(self, beam_size):
        """Beams per sentence: cross-attention keeps one copy of each encoder output."""
        self.beam_size = beam_size

    # ---------------------------------------------------------------------------- forward

    def _project(self, name, x):
        proj = getattr(self, name + "_proj")
        return x if proj is None else proj(x)

    def project_inputs(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor]
                       ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """(Q_s, K_s, V_s) of docs/TECHNIQUES.md#gated-pre-attention
        (:func:`~slim_fairseq.modules.gate_function.gated_inputs`, plain torch, the file an
        export copies). ``key``/``value`` None means cached (static) K, V. A removed or identity
        projection passes its input on."""
        if self._stacks_weights(query, key):
            return self._stacked_projections(query, key)
        return gated_inputs(self.gate, query, key, value, self._project, self._project_gated)

    def _stacks_weights(self, query, key):
        """Whether the dense projections that read one input (a self-attention's queries, keys
        and values; a cross-attention's keys and values) run as one product of their stacked
        weights: ungated, in training under autocast, which casts a copy of the weights for
        backward anyway (in fp32 the stack would be a copy of its own), as fairseq's own
        attention multiplies by its stacked input projection."""
        if self.gate != "none" or key is None or not torch.is_grad_enabled():
            return False
        if device_and_autocast(query)[1] is None:
            return False
        if self.self_attention:
            projections = (self.q_proj, self.k_proj, self.v_proj)
        elif self.encoder_decoder_attention:
            projections = (self.k_proj, self.v_proj)
        else:
            return False
        return all(type(p) is nn.Linear for p in projections)

    def _stacked_projections(self, query, key):
        """(q, k, v) of :meth:`_stacks_weights`: one product with the stacked weights and
        biases, split into views."""
        projections = ((self.q_proj, self.k_proj, self.v_proj) if self.self_attention
                       else (self.k_proj, self.v_proj))
        weight = torch.cat([p.weight for p in projections])
        bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
        out = F.linear(key, weight, bias).split([p.out_features for p in projections], dim=-1)
        if self.self_attention:
            return out
        return self.q_proj(query), out[0], out[1]

    def _project_gated(self, name, x, gate):
        return gated_projection(getattr(self, name + "_proj"), x, gate)

    def _dropout_p(self):
        dropout = self.dropout_module
        return dropout.p if (self.training or dropout.apply_during_inference) else 0.0

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
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.size()
        attention_input = query
        saved: Optional[Dict[str, Optional[Tensor]]] = None
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved:
                key = value = None
        if self.self_attention:
            # one contiguous input (the first layer gets a transposed view) in autocast's
            # dtype, shared by every projection and the gate, instead of one copy and one cast
            # per projection
            key = value = query = in_autocast_dtype(query.contiguous())
        elif self.encoder_decoder_attention and key is not None:
            if self.beam_size > 1 and bsz == key.size(1):
                # the encoder output is repeated per beam: keep one copy per sentence
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(
                        -1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
            value = key

        if torch.is_grad_enabled() and self.tc_ratio:
            with built_together((self.q_proj, self.k_proj, self.v_proj), tgt_len * bsz, query):
                q, k, v = self.project_inputs(query, key, value)
        else:  # (no weights to build together: a decoding step skips the context manager)
            q, k, v = self.project_inputs(query, key, value)
        q = _heads(q, self.num_heads, self.head_dim)
        if k is not None:
            k, v = _heads(k, self.kv_heads, self.head_dim), _heads(v, self.kv_heads, self.head_dim)
        rope = self.rope  # (one module lookup: nn.Module.__getattr__ costs Python per access)
        if rope is not None or self._position_hooks:
            past = 0 if saved is None or saved.get("prev_key") is None else saved["prev_key"].size(2)
            if rope is not None:
                rows = rope.rows(q, past)
                q, k = rope.rotate(q, *rows), rope.rotate(k, *rows)
            for extension in self._position_hooks:
                q, k = extension.queries_keys(q, k, past)

        kv_bsz = bsz if k is None else k.size(0)
        if saved is not None:
            prev_key = saved.get("prev_key")
            if prev_key is not None:
                kv_bsz = prev_key.size(0)
                k = prev_key if static_kv else torch.cat([prev_key, k], dim=2)
                prev_value = saved["prev_value"]
                v = prev_value if static_kv else torch.cat([prev_value, v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=kv_bsz, src_len=k.size(2), static_kv=static_kv)
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        if key_padding_mask is not None:
            if key_padding_mask.dim() == 0:
                key_padding_mask = None
            elif key_padding_mask.dtype != torch.bool:  # fairseq's cache may hold 0/1 floats
                key_padding_mask = key_padding_mask.to(torch.bool)
        if self._score_biases:
            attn_mask = self._add_score_biases(attn_mask, tgt_len, k.size(2), q)

        weights: Optional[Tensor] = None
        if self.shaped:
            attn = shaped_mixing(q, k, v, self.alpha, self.beta, self.gamma, attn_mask,
                                 key_padding_mask, self._dropout_p(), self.scaling,
                                 causal=is_marked_causal(attn_mask))
            attn = _merge_heads(attn)
        elif need_weights or before_softmax or (bsz != kv_bsz and attn_mask is not None):
            attn, weights = self._explicit_attention(q, k, v, attn_mask, key_padding_mask,
                                                     kv_bsz, before_softmax, need_weights,
                                                     need_head_weights)
            if before_softmax:
                return attn, weights
        else:
            attn = self._fused_attention(q, k, v, attn_mask, key_padding_mask, kv_bsz)
        for extension in self._output_hooks:
            attn = extension.output(attn, attention_input)
        out_proj = self.out_proj
        if out_proj is not None:
            attn = out_proj(attn)
        return attn, weights

    def _add_score_biases(self, attn_mask, tgt_len, src_len, q):
        """``attn_mask`` (T, S) or None plus every extension's ``score_bias(query_positions,
        key_positions)`` (heads, T, S): the queries are the last ``tgt_len`` of the ``src_len``
        positions the keys hold (a decoding step's query is the newest)."""
        keys = torch.arange(src_len, device=q.device)
        queries = keys[src_len - tgt_len:]
        for extension in self._score_biases:
            bias = extension.score_bias(queries, keys).to(q.dtype if not torch.is_autocast_enabled(
                q.device.type) else torch.float32)
            attn_mask = bias if attn_mask is None else attn_mask + bias
        return attn_mask

    def _fused_attention(self, q, k, v, attn_mask, key_padding_mask, kv_bsz):
        """torch's fused attention; returns (T, B, heads * d_h). Several beams per encoder
        sentence (``kv_bsz`` < B) are folded into query rows of their sentence."""
        bsz, heads, tgt_len, head_dim = q.shape
        beams = bsz // kv_bsz
        if beams > 1:  # (kv_bsz, beam, H, T, d) -> (kv_bsz, H, beam T, d)
            q = q.reshape(kv_bsz, beams, heads, tgt_len, head_dim).transpose(1, 2).reshape(
                kv_bsz, heads, beams * tgt_len, head_dim)
        causal = is_marked_causal(attn_mask) and key_padding_mask is None
        mask = None
        if key_padding_mask is not None:
            pads = key_padding_mask.view(kv_bsz, 1, 1, -1)
            mask = ~pads if attn_mask is None else torch.where(pads, float("-inf"), attn_mask)
        elif not causal:
            mask = attn_mask
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype \
                and not torch.is_autocast_enabled(q.device.type):
            mask = mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self._dropout_p(),
                                             is_causal=causal, scale=self.scaling,
                                             enable_gqa=self.kv_heads != self.num_heads)
        if beams > 1:  # (kv_bsz, H, beam, T, d) -> (T, kv_bsz, beam, H, d)
            out = out.view(kv_bsz, heads, beams, tgt_len, head_dim).permute(3, 0, 2, 1, 4)
            return out.reshape(tgt_len, bsz, heads * head_dim)
        return _merge_heads(out)

    def _explicit_attention(self, q, k, v, attn_mask, key_padding_mask, kv_bsz, before_softmax,
                            need_weights, need_head_weights):
        """Softmax attention with the probabilities at hand (attention weights, fairseq's
        ``before_softmax``), on rows grouped by key/value head and encoder sentence: query rows
        (group, beam, T) of each key/value head read its keys without copies of them. Returns
        ((T, B, heads * d_h), weights) as fairseq's forward does."""
        bsz, heads, tgt_len, head_dim = q.shape
        kv_heads, src_len = k.size(1), k.size(2)
        group, beams = heads // kv_heads, bsz // kv_bsz
        grouped = (kv_bsz, kv_heads, group, beams, tgt_len)
        if group == 1 and beams == 1:
            rows = q
        else:  # (kv_bsz, beam, KV, group, T, d) -> (kv_bsz, KV, group beam T, d)
            rows = q.reshape(kv_bsz, beams, kv_heads, group, tgt_len, head_dim).permute(
                0, 2, 3, 1, 4, 5).reshape(kv_bsz, kv_heads, group * beams * tgt_len, head_dim)
        scores = torch.matmul(rows * self.scaling, k.transpose(2, 3)).view(*grouped, src_len)
        if attn_mask is not None and attn_mask.dim() == 3:  # per head: (heads, T, S)
            scores = scores + attn_mask.view(kv_heads, group, 1, tgt_len, src_len)
        elif attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask.view(kv_bsz, 1, 1, 1, 1, src_len),
                                        float("-inf"))
        if before_softmax:  # fairseq's layout: (B heads, T, S) scores, (B heads, S, d) values
            order = (0, 3, 1, 2, 4, 5)
            values = v.view(kv_bsz, 1, kv_heads, 1, src_len, head_dim).expand(
                kv_bsz, beams, kv_heads, group, src_len, head_dim)
            return (scores.permute(*order).reshape(bsz * heads, tgt_len, src_len),
                    values.reshape(bsz * heads, src_len, head_dim))
        probs_float = torch.softmax(scores, dim=-1, dtype=torch.float32)
        probs = self.dropout_module(probs_float.type_as(scores))
        attn = torch.matmul(probs.view(kv_bsz, kv_heads, -1, src_len), v)
        # (kv_bsz, KV, group, beam, T, d) -> (T, kv_bsz, beam, KV, group, d)
        attn = attn.view(*grouped, head_dim).permute(4, 0, 3, 1, 2, 5).reshape(
            tgt_len, bsz, heads * head_dim)
        weights: Optional[Tensor] = None
        if need_weights:  # (heads, B, T, S), or the mean over heads
            weights = probs_float.permute(1, 2, 0, 3, 4, 5).reshape(heads, bsz, tgt_len, src_len)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights


def build_attention(spec: AttentionSpec, embed_dim, num_heads, *, role, dropout, kdim=None,
                    vdim=None, plugin=False, **kwargs):
    """Attention block for ``role`` in {"encoder_self", "decoder_self", "cross"} with the
    techniques of ``spec``: fairseq's ``MultiheadAttention`` when none is on (with fairseq's
    extra keyword arguments: q_noise, qn_block_size, xformers_att_config, add_bias_kv,
    add_zero_attn), else :class:`SlimMultiheadAttention`; with ``plugin``, the plugin's class
    also when none is on (fairseq's parameters, init and outputs in fewer launches), unless
    one of fairseq's own arguments asks for fairseq's."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: not an attention role; allowed: {'|'.join(ROLES)}")
    if role == "cross":
        kwargs.setdefault("encoder_decoder_attention", True)
    else:
        kwargs.setdefault("self_attention", True)
    fairseq_only = [name for name in ("q_noise", "add_bias_kv", "add_zero_attn", "xformers_att_config")
                    if kwargs.get(name)]
    if spec.plain and (not plugin or fairseq_only):
        return MultiheadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                                  **kwargs)
    for name in ("q_noise", "add_bias_kv", "add_zero_attn", "xformers_att_config"):
        kwargs.pop(name, None)
    kwargs.pop("qn_block_size", None)
    if fairseq_only:
        raise ValueError(f"{fairseq_only[0]}: an argument of fairseq's MultiheadAttention, which "
                         "this spec does not build; allowed: a plain spec with it")
    return SlimMultiheadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                                  spec=spec, **kwargs)
