"""The plugin's blocks: an encoder or decoder layer that owns its attention(s), one
feed-forward module and its norms, each built from the layer's
:class:`~slim_fairseq.specs.LayerSpec`; and the skipless decoder block.

:class:`SlimEncoderLayer` and :class:`SlimDecoderLayer` are fairseq's layers (they subclass
fairseq's layer bases, hold fairseq's attributes under fairseq's names, and run fairseq's
forward with the feed-forward as one call): with every option off their parameters, init order
and outputs are fairseq's (tests/test_anthe_models.py). The attention is
:func:`~slim_fairseq.modules.attention.build_attention`'s, the feed-forward the module
registered for the spec's variant (:func:`register_feed_forward`; the dense one when none is
on), the norms ``--norm``'s.

:class:`SkiplessDecoderLayer` (``--skipless-layout``; He & Hofmann, arXiv:2311.01906) has its
own forward: no residual and no norm.
"""
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq import utils
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor

from slim_fairseq import options as vocabulary
from slim_fairseq.models.slim_options import NORMS, GLUOptions, ModelOptions
from slim_fairseq.modules.attention import EXTENSIONS as ATTENTION_EXTENSIONS
from slim_fairseq.modules.attention import build_attention
from slim_fairseq.modules.dropout import SlimDropout
from slim_fairseq.modules.feed_forward import FeedForward, FeedForwardHolder, GLUFeedForward
from slim_fairseq.modules.input_embedding import INPUT_EMBEDDINGS
from slim_fairseq.modules.rmsnorm import RMSNorm
from slim_fairseq.modules.skipless_block import parallel_output_scale, skipless_output
from slim_fairseq.specs import FeedForwardSpec, LayerSpec, NormSpec

# ---------------------------------------------------------------------------- registration

def _register(registry, spec_cls, entry):
    """``spec_cls``'s options join the vocabulary, and ``registry`` maps it to ``entry``;
    returns ``entry``. Every kind of technique registers so (docs/DESIGN.md, "Adding a
    technique")."""
    vocabulary.register(spec_cls)
    registry[spec_cls] = entry
    return entry


# ---------------------------------------------------------------------------- feed-forwards

# the module of each feed-forward variant, by the variant's spec (docs/DESIGN.md, "Adding a
# technique"); with no variant on, FeedForward
FEED_FORWARDS = {GLUOptions: GLUFeedForward}


def register_feed_forward(spec_cls, module_cls):
    """Add a feed-forward variant: its spec ``spec_cls`` (a
    :class:`~slim_fairseq.models.slim_options.FeedForwardVariant` whose fields are its options)
    joins the option vocabulary, and a block whose options turn it on builds ``module_cls``
    (called as :class:`~slim_fairseq.modules.feed_forward.FeedForward` is)."""
    return _register(FEED_FORWARDS, spec_cls, module_cls)


def build_feed_forward(spec: FeedForwardSpec, dim, hidden_dim, dropout, quant_noise=(0.0, 8)):
    """The feed-forward module of ``spec``: its variant's, or the dense one."""
    module_cls = FeedForward if spec.variant is None else FEED_FORWARDS[type(spec.variant)]
    return module_cls(spec, dim, hidden_dim, dropout, quant_noise=quant_noise)


# ---------------------------------------------------------------------------- attention extensions

def register_attention_extension(spec_cls, module_cls):
    """Add an attention extension: its spec ``spec_cls`` (a
    :class:`~slim_fairseq.models.slim_options.AttentionExtension` whose fields are its options)
    joins the option vocabulary, and every attention of its ``roles`` whose options turn it on
    holds ``module_cls(spec, attention)``, which defines any of
    ``queries_keys(q, k, past) -> (q, k)``, applied to the new queries ``(B, heads, T, d_h)``
    and keys ``(B, kv_heads, T, d_h)`` of a self-attention before they are cached (``past``:
    the positions cached before them), ``score_bias(query_positions, key_positions) ->
    (heads, T, S)``, added to the attention scores, and ``output(attn, x) -> attn``, applied to
    the heads' output ``(T, B, heads d_h)`` before the output projection (``x``: the
    attention's input)."""
    return _register(ATTENTION_EXTENSIONS, spec_cls, module_cls)


# ---------------------------------------------------------------------------- input embeddings

def register_input_embedding(spec_cls, module_cls):
    """Add an input embedding: its spec ``spec_cls`` (a
    :class:`~slim_fairseq.models.slim_options.InputEmbeddingVariant`) joins the option
    vocabulary, and both sides of a model whose options turn it on build
    ``module_cls.from_spec(spec, table)`` (``spec`` the side's
    :class:`~slim_fairseq.specs.EmbeddingSpec`, whose ``variant`` is the technique's spec;
    ``table`` the token table, ``module_cls.table_dim(spec)`` wide when it defines that, else
    the model's width), called as ``forward(tokens, incremental_state=None)`` and returning
    ``(B, T, d)`` (with an incremental state, the last position only) before dropout."""
    return _register(INPUT_EMBEDDINGS, spec_cls, module_cls)


# ---------------------------------------------------------------------------- output projections

# the module of each vocabulary projection registered from outside, by its spec's class
OUTPUT_PROJECTIONS = {}


def register_output_projection(spec_cls, module_cls):
    """Add a vocabulary projection: its spec ``spec_cls`` (a
    :class:`~slim_fairseq.models.slim_options.OutputVariant`) joins the option vocabulary, and a
    decoder whose options turn it on builds ``module_cls(spec, table, dim, vocab, tied)`` as its
    ``output_projection`` (``table``: the token table; ``tied``: whether
    ``--share-decoder-input-output-embed`` or ``--share-all-embeddings`` ask to tie it), which
    maps the decoder's features ``(B, T, dim)`` to ``(B, T, vocab)`` logits."""
    return _register(OUTPUT_PROJECTIONS, spec_cls, module_cls)


# ---------------------------------------------------------------------------- block layouts

# the layer classes of each block layout registered from outside, by its spec's class:
# {"encoder": class or None, "decoder": class or None}
BLOCK_LAYOUTS = {}


def register_block_layout(spec_cls, encoder_layer=None, decoder_layer=None):
    """Add a block layout: its spec ``spec_cls`` (a
    :class:`~slim_fairseq.models.slim_options.BlockLayout`) joins the option vocabulary, and a
    model whose options turn it on builds its encoder layers as ``encoder_layer(cfg,
    return_fc=..., spec=layer_spec)`` and its decoder layers as ``decoder_layer(cfg,
    no_encoder_attn, spec=layer_spec)`` (subclasses of :class:`SlimEncoderLayer` and
    :class:`SlimDecoderLayer` with a forward of their own; a side without a class keeps the
    plugin's blocks)."""
    _register(BLOCK_LAYOUTS, spec_cls, {"encoder": encoder_layer, "decoder": decoder_layer})
    return spec_cls


def layout_class(spec: LayerSpec, side):
    """The layer class a registered block layout gives ``side``, or None."""
    if spec is None or spec.layout is None:
        return None
    return BLOCK_LAYOUTS[type(spec.layout)][side]


# ---------------------------------------------------------------------------- norms

# the module of each norm registered from outside (register_norm), by its --norm name
NORM_MODULES = {}


def register_norm(name, module_cls):
    """Add ``--norm NAME``: the blocks' norms and the final norm become ``module_cls(dim,
    spec)`` (``spec`` the :class:`~slim_fairseq.specs.NormSpec`), with the parameters it makes
    (docs/DESIGN.md, "Adding a technique")."""
    assert name not in NORMS or name in NORM_MODULES, f"--norm {name}: the plugin's own"
    NORMS.add(name)
    NORM_MODULES[name] = module_cls
    return module_cls


def build_norm(spec: NormSpec, dim):
    """The norm ``--norm`` selects at width ``dim``: fairseq's LayerNorm, RMSNorm (weight only,
    ``--rms-norm-eps``), a registered norm's module, or None (``none``)."""
    if spec.kind == "rmsnorm":
        return RMSNorm(dim, eps=spec.eps)
    if spec.kind == "none":
        return None
    if spec.kind in NORM_MODULES:
        return NORM_MODULES[spec.kind](dim, spec)
    return LayerNorm(dim, export=spec.export)


class _Identity(nn.Module):
    """Stands in for a norm under ``--norm none`` (no parameters)."""

    def forward(self, x):
        return x


# ---------------------------------------------------------------------------- blocks

class _Block(FeedForwardHolder):
    """What the encoder and decoder layers share: their spec, norms and feed-forward."""

    def _norm(self, dim):
        return build_norm(self.spec.norm, dim) or _Identity()

    def _dropouts(self, cfg):
        self.dropout_module = SlimDropout(cfg.dropout, module_name=type(self).__name__)
        activation_dropout_p = cfg.activation_dropout
        if activation_dropout_p == 0:
            # for backwards compatibility with models that use cfg.relu_dropout (fairseq's)
            activation_dropout_p = cfg.relu_dropout or 0
        return SlimDropout(float(activation_dropout_p), module_name=type(self).__name__)

    def _mount_feed_forward(self, ffn_dim, activation_dropout):
        quant_noise = (self.quant_noise, self.quant_noise_block_size)
        self.mount_feed_forward(build_feed_forward(self.spec.ffn, self.embed_dim, ffn_dim,
                                                   activation_dropout, quant_noise=quant_noise))

    @property
    def activation_fn(self):
        return self.feed_forward.activation_fn

    def _attention_kwargs(self, xformers):
        """fairseq's own extra arguments of the attention blocks of a layer."""
        return dict(q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
                    xformers_att_config=xformers)


class SlimEncoderLayer(_Block, TransformerEncoderLayerBase):
    """fairseq's encoder layer with the plugin's self-attention, feed-forward and norms."""

    def __init__(self, cfg, return_fc=False, spec: LayerSpec = None):
        nn.Module.__init__(self)
        self.spec = spec or ModelOptions.of(cfg).layer_spec(cfg, "encoder")
        self.cfg = cfg
        self.return_fc = return_fc
        self.embed_dim = cfg.encoder.embed_dim
        self.quant_noise = cfg.quant_noise.pq
        self.quant_noise_block_size = cfg.quant_noise.pq_block_size
        self.self_attn = self.build_self_attention(self.embed_dim, cfg)
        self.self_attn_layer_norm = self._norm(self.embed_dim)
        activation_dropout = self._dropouts(cfg)
        self.normalize_before = cfg.encoder.normalize_before
        self._mount_feed_forward(cfg.encoder.ffn_embed_dim, activation_dropout)
        self.final_layer_norm = self._norm(self.embed_dim)

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(self.spec.self_attn, embed_dim, cfg.encoder.attention_heads,
                               role="encoder_self", dropout=cfg.attention_dropout,
                               plugin=self.spec.plugin_attention,
                               **self._attention_kwargs(cfg.encoder.xformers_att_config))

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        """fairseq's ``TransformerEncoderLayerBase.forward`` with the feed-forward as one call
        (tests/test_anthe_models.py pins it to fairseq's output with every option off)."""
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.feed_forward(x)
        fc_result = x
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x


def _restore_state(attention, incremental_state, prev_state):
    """fairseq's ``prev_self_attn_state`` / ``prev_attn_state``: keys, values (and their padding
    mask) given as a list, written into ``attention``'s incremental state."""
    prev_key, prev_value = prev_state[:2]
    saved_state: Dict[str, Optional[Tensor]] = {"prev_key": prev_key, "prev_value": prev_value}
    if len(prev_state) >= 3:
        saved_state["prev_key_padding_mask"] = prev_state[2]
    assert incremental_state is not None
    attention._set_input_buffer(incremental_state, saved_state)


class SlimDecoderLayer(_Block, TransformerDecoderLayerBase):
    """fairseq's decoder layer with the plugin's self-/cross-attention, feed-forward and norms
    (and fairseq's NormFormer options: ``--scale-attn``, ``--scale-heads``, ``--scale-fc``,
    ``--scale-resids``)."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False,
                 spec: LayerSpec = None):
        nn.Module.__init__(self)
        self.spec = spec or ModelOptions.of(cfg).layer_spec(cfg, "decoder")
        self.embed_dim = cfg.decoder.embed_dim
        activation_dropout = self._dropouts(cfg)
        self.quant_noise = cfg.quant_noise.pq
        self.quant_noise_block_size = cfg.quant_noise.pq_block_size
        self.cross_self_attention = cfg.cross_self_attention
        self.self_attn = self.build_self_attention(self.embed_dim, cfg, add_bias_kv=add_bias_kv,
                                                   add_zero_attn=add_zero_attn)
        self.attn_ln = (LayerNorm(self.embed_dim) if utils.safe_getattr(cfg, "scale_attn", False)
                        else None)
        self.nh = self.self_attn.num_heads
        self.head_dim = self.self_attn.head_dim
        scale_heads = utils.safe_getattr(cfg, "scale_heads", False)
        self.c_attn = nn.Parameter(torch.ones((self.nh,)), requires_grad=True) if scale_heads else None
        self.normalize_before = cfg.decoder.normalize_before
        self.self_attn_layer_norm = self._norm(self.embed_dim)
        if no_encoder_attn:
            self.encoder_attn = None
            self.encoder_attn_layer_norm = None
        else:
            self.encoder_attn = self.build_encoder_attention(self.embed_dim, cfg)
            self.encoder_attn_layer_norm = self._norm(self.embed_dim)
        self.ffn_layernorm = (LayerNorm(cfg.decoder.ffn_embed_dim)
                              if utils.safe_getattr(cfg, "scale_fc", False) else None)
        self.w_resid = (nn.Parameter(torch.ones(self.embed_dim), requires_grad=True)
                        if utils.safe_getattr(cfg, "scale_resids", False) else None)
        self._mount_feed_forward(cfg.decoder.ffn_embed_dim, activation_dropout)
        self.final_layer_norm = self._norm(self.embed_dim)
        self.need_attn = True
        self.onnx_trace = False

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        kwargs = self._attention_kwargs(cfg.decoder.xformers_att_config)
        kwargs.update(add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        if cfg.cross_self_attention:
            kwargs["self_attention"] = False
        return build_attention(self.spec.self_attn, embed_dim, cfg.decoder.attention_heads,
                               role="decoder_self", dropout=cfg.attention_dropout,
                               plugin=self.spec.plugin_attention, **kwargs)

    def build_encoder_attention(self, embed_dim, cfg):
        """The cross-attention; also called by the sandwich stack for a middle layer's
        cross-attention at the model width, whose spec is the one at that width."""
        spec = (self.spec.cross_attn if embed_dim == self.embed_dim else
                ModelOptions.of(cfg).attention_spec("cross", embed_dim, cfg.decoder.attention_heads))
        return build_attention(spec, embed_dim, cfg.decoder.attention_heads, role="cross",
                               dropout=cfg.attention_dropout, kdim=cfg.encoder.embed_dim,
                               plugin=self.spec.plugin_attention,
                               vdim=cfg.encoder.embed_dim,
                               **self._attention_kwargs(cfg.encoder.xformers_att_config))

    def forward(
        self,
        x,
        encoder_out: Optional[torch.Tensor] = None,
        encoder_padding_mask: Optional[torch.Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[torch.Tensor]] = None,
        prev_attn_state: Optional[List[torch.Tensor]] = None,
        self_attn_mask: Optional[torch.Tensor] = None,
        self_attn_padding_mask: Optional[torch.Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """fairseq's ``TransformerDecoderLayerBase.forward`` with the feed-forward as one call
        (its hidden activations and its output when ``--scale-fc`` normalises between them;
        tests/test_anthe_models.py pins it to fairseq's output with every option off)."""
        if need_head_weights:
            need_attn = True

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        if prev_self_attn_state is not None:
            _restore_state(self.self_attn, incremental_state, prev_self_attn_state)
        # (the self-attention's cache is only looked up where cross-self-attention reads it)
        if self.cross_self_attention and not (
            incremental_state is not None
            and (buffer := self.self_attn._get_input_buffer(incremental_state)) is not None
            and "prev_key" in buffer
        ):
            if self_attn_mask is not None:
                assert encoder_out is not None
                self_attn_mask = torch.cat(
                    (x.new_zeros(x.size(0), encoder_out.size(0)), self_attn_mask), dim=1)
            if self_attn_padding_mask is not None:
                if encoder_padding_mask is None:
                    assert encoder_out is not None
                    encoder_padding_mask = self_attn_padding_mask.new_zeros(
                        encoder_out.size(1), encoder_out.size(0))
                self_attn_padding_mask = torch.cat(
                    (encoder_padding_mask, self_attn_padding_mask), dim=1)
            assert encoder_out is not None
            y = torch.cat((encoder_out, x), dim=0)
        else:
            y = x

        x, attn = self.self_attn(query=x, key=y, value=y, key_padding_mask=self_attn_padding_mask,
                                 incremental_state=incremental_state, need_weights=False,
                                 attn_mask=self_attn_mask)
        if self.c_attn is not None:
            tgt_len, bsz = x.size(0), x.size(1)
            x = x.view(tgt_len, bsz, self.nh, self.head_dim)
            x = torch.einsum("tbhd,h->tbhd", x, self.c_attn)
            x = x.reshape(tgt_len, bsz, self.embed_dim)
        if self.attn_ln is not None:
            x = self.attn_ln(x)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            if prev_attn_state is not None:
                _restore_state(self.encoder_attn, incremental_state, prev_attn_state)

            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out,
                key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights)
            x = self.dropout_module(x)
            x = self.residual_connection(x, residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        if self.ffn_layernorm is None:
            x = self.feed_forward(x)
        else:
            x = self.feed_forward.output(self.ffn_layernorm(self.feed_forward.hidden(x)))
        x = self.dropout_module(x)
        if self.w_resid is not None:
            residual = torch.mul(self.w_resid, residual)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        if self.onnx_trace and incremental_state is not None:
            saved_state = self.self_attn._get_input_buffer(incremental_state)
            assert saved_state is not None
            if self_attn_padding_mask is not None:
                self_attn_state = [saved_state["prev_key"], saved_state["prev_value"],
                                   saved_state["prev_key_padding_mask"]]
            else:
                self_attn_state = [saved_state["prev_key"], saved_state["prev_value"]]
            return x, attn, self_attn_state
        return x, attn, None


class SkiplessDecoderLayer(SlimDecoderLayer):
    """Skipless block (He & Hofmann, arXiv:2311.01906; docs/TECHNIQUES.md#skipless-transformers):
    no residual, no norm, shaped self-attention (built by the attention hook), ``s`` =
    ``--mlp-branch-scale``:

    * serial:   ``y = s * FFN(Attn(x))``
    * parallel: ``y = (Attn(x) + s * FFN(x)) / sqrt(1 + s^2)``

    Called like fairseq's decoder layer; returns ``(y, None, None)``. The output from the two
    branches is :func:`~slim_fairseq.modules.skipless_block.skipless_output` (plain torch, the
    file an export to transformers copies).
    """

    def __init__(self, cfg, no_encoder_attn=True, add_bias_kv=False, add_zero_attn=False,
                 spec: LayerSpec = None):
        super().__init__(cfg, no_encoder_attn=True, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn, spec=spec)
        self.self_attn_layer_norm = self.final_layer_norm = None
        self.parallel = self.spec.skipless == "parallel"
        self.mlp_branch_scale = self.spec.mlp_branch_scale
        # parallel sum of two unit-variance branches, rescaled to unit variance at init
        self.parallel_output_scale = parallel_output_scale(self.mlp_branch_scale)
        self.feed_forward.reset_skipless_parameters()

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_layer_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
        attn, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                                 incremental_state=incremental_state, need_weights=False,
                                 attn_mask=self_attn_mask)
        return skipless_output(x, attn, self.feed_forward, self.parallel, self.mlp_branch_scale,
                               self.dropout_module), None, None
