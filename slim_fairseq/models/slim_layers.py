"""The plugin's layers: fairseq's encoder and decoder layers with the options' attention,
feed-forward and normalisation, and the skipless decoder block.

They subclass fairseq's layer bases and only override the ``build_*`` hooks (the attention:
:func:`~slim_fairseq.modules.attention.build_attention`; the feed-forward: GLU and Tensor-Chain
linears, with or without biases) and swap the norms (``--norm``), so fairseq's forward runs
unchanged; with every option off they are fairseq's layers (same parameters, same init order,
same outputs). A GLU FFN is ``fc2(fc1(x))`` with ``fc1`` = :class:`GLUProjection` and the
identity as the layer's activation.

:class:`SkiplessDecoderLayer` (``--skipless-layout``; He & Hofmann, arXiv:2311.01906) is the one
layer with its own forward: no residual and no norm, so fairseq's residual forward does not
apply.
"""
import math

import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from slim_fairseq.modules.activations import activation_function
from slim_fairseq.modules.attention import build_attention
from slim_fairseq.modules.dropout import slim_dropouts
from slim_fairseq.modules.gated_attention import tc_ratio_for
from slim_fairseq.modules.glu import GLUProjection, build_linear, glu_hidden_dim
from slim_fairseq.modules.rmsnorm import RMSNorm
from slim_fairseq.modules.skipless import init_skipless_feed_forward
from slim_fairseq.modules.tc_autograd import rebuildable_relu
from slim_fairseq.modules.tensor_chain import TensorChainLinear

def build_norm(cfg, dim):
    """The norm ``--norm`` selects at width ``dim``: fairseq's LayerNorm, RMSNorm (weight only,
    ``--rms-norm-eps``), or None (``none``)."""
    kind = getattr(cfg, "norm", "layernorm") or "layernorm"
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=getattr(cfg, "rms_norm_eps", 1e-6))
    if kind == "none":
        return None
    return LayerNorm(dim, export=getattr(cfg, "export", False))


class _Identity(nn.Module):
    """Stands in for a norm under ``--norm none`` (no parameters)."""

    def forward(self, x):
        return x


def _identity(x):
    return x


class _SlimLayerMixin:
    """Options read before fairseq's constructor runs the ``build_*`` hooks; the feed-forward
    hooks; the norm swap."""

    def _read_options(self, cfg):
        # build_* hooks run inside the base constructor: read the options first
        activation = getattr(cfg, "activation_fn", "relu") or "relu"
        object.__setattr__(self, "_ffn_glu", bool(getattr(cfg, "ffn_glu", False)))
        object.__setattr__(self, "_ffn_activation", activation)
        object.__setattr__(self, "_ffn_tc", (tc_ratio_for(cfg, "tc_ff"),
                                             int(getattr(cfg, "tc_length", 2) or 2),
                                             int(getattr(cfg, "tc_min_bond", 0) or 0)))
        object.__setattr__(self, "_glu_hidden", getattr(cfg, "glu_hidden", "two-thirds") or "two-thirds")
        object.__setattr__(self, "_linear_bias", bool(getattr(cfg, "linear_bias", True)))

    def _construct(self, cfg, construct):
        """Run fairseq's constructor; an activation fairseq does not know is set afterwards."""
        if self._ffn_activation != "silu":
            construct()
        else:  # an activation fairseq's layer cannot look up
            cfg.activation_fn = "relu"
            try:
                construct()
            finally:
                cfg.activation_fn = self._ffn_activation
            self.activation_fn = activation_function(self._ffn_activation)
        slim_dropouts(self)  # one-byte dropout masks on the CPU
        if self._ffn_glu:
            self.activation_fn = _identity  # the GLU projection applies its own activation
        self._lean_ffn()
        self._swap_norms(cfg)

    def _swap_norms(self, cfg):
        if (getattr(cfg, "norm", "layernorm") or "layernorm") == "layernorm":
            return
        for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
            if getattr(self, name, None) is not None:
                setattr(self, name, build_norm(cfg, self.embed_dim) or _Identity())

    def _lean_ffn(self):
        """A ReLU feed-forward of two Tensor Chains keeps fc1's input for backward, not the
        hidden layer: fc1 marks its output, the ReLU keeps a one-byte mask, fc2 rebuilds its
        input (``tc_autograd``)."""
        if (self.activation_fn is F.relu and isinstance(self.fc1, TensorChainLinear)
                and isinstance(self.fc2, TensorChainLinear)):
            self.fc1.rebuildable_output = True
            self.activation_fn = rebuildable_relu

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        tc_ff, tc_length, tc_min_bond = self._ffn_tc
        if self._ffn_glu:
            return GLUProjection(input_dim, glu_hidden_dim(output_dim, self._glu_hidden),
                                 activation=self._ffn_activation, tc_ratio=tc_ff,
                                 tc_length=tc_length, tc_min_bond=tc_min_bond,
                                 bias=self._linear_bias)
        if tc_ff or not self._linear_bias:
            return build_linear(input_dim, output_dim, tc_ff, tc_length, bias=self._linear_bias,
                                tc_min_bond=tc_min_bond)
        return super().build_fc1(input_dim, output_dim, q_noise, qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        tc_ff, tc_length, tc_min_bond = self._ffn_tc
        if self._ffn_glu:
            input_dim = glu_hidden_dim(input_dim, self._glu_hidden)
        if self._ffn_glu or tc_ff or not self._linear_bias:
            return build_linear(input_dim, output_dim, tc_ff, tc_length, bias=self._linear_bias,
                                rebuild_input=self._ffn_glu, tc_min_bond=tc_min_bond)
        return super().build_fc2(input_dim, output_dim, q_noise, qn_block_size)


def _attention_kwargs(layer, xformers):
    """fairseq's own extra arguments of the attention blocks of a layer."""
    return dict(q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size,
                xformers_att_config=xformers)


class SlimEncoderLayer(_SlimLayerMixin, TransformerEncoderLayerBase):
    """fairseq's encoder layer with the plugin's self-attention, feed-forward and norms."""

    def __init__(self, cfg, return_fc=False):
        self._read_options(cfg)
        self._construct(cfg, lambda: TransformerEncoderLayerBase.__init__(self, cfg, return_fc=return_fc))

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(cfg, embed_dim, cfg.encoder.attention_heads, role="encoder_self",
                               dropout=cfg.attention_dropout,
                               **_attention_kwargs(self, cfg.encoder.xformers_att_config))


class SlimDecoderLayer(_SlimLayerMixin, TransformerDecoderLayerBase):
    """fairseq's decoder layer with the plugin's self-/cross-attention, feed-forward and norms."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self._read_options(cfg)
        self._construct(cfg, lambda: TransformerDecoderLayerBase.__init__(
            self, cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn))

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        kwargs = _attention_kwargs(self, cfg.decoder.xformers_att_config)
        kwargs.update(add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        if cfg.cross_self_attention:
            kwargs["self_attention"] = False
        return build_attention(cfg, embed_dim, cfg.decoder.attention_heads, role="decoder_self",
                               dropout=cfg.attention_dropout, **kwargs)

    def build_encoder_attention(self, embed_dim, cfg):
        return build_attention(cfg, embed_dim, cfg.decoder.attention_heads, role="cross",
                               dropout=cfg.attention_dropout, kdim=cfg.encoder.embed_dim,
                               vdim=cfg.encoder.embed_dim,
                               **_attention_kwargs(self, cfg.encoder.xformers_att_config))


class SkiplessDecoderLayer(SlimDecoderLayer):
    """Skipless block (He & Hofmann, arXiv:2311.01906; docs/TECHNIQUES.md#skipless-transformers):
    no residual, no norm, shaped self-attention (built by the attention hook), ``s`` =
    ``--mlp-branch-scale``:

    * serial:   ``y = s * FFN(Attn(x))``
    * parallel: ``y = (Attn(x) + s * FFN(x)) / sqrt(1 + s^2)``

    Called like fairseq's decoder layer; returns ``(y, None, None)``.
    """

    def __init__(self, cfg, no_encoder_attn=True, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn=True, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)
        self.self_attn_layer_norm = self.final_layer_norm = None
        self.parallel = getattr(cfg, "skipless_layout", "serial") == "parallel"
        self.mlp_branch_scale = float(getattr(cfg, "mlp_branch_scale", 1.0))
        # parallel sum of two unit-variance branches, rescaled to unit variance at init
        self.parallel_output_scale = 1.0 / math.sqrt(1.0 + self.mlp_branch_scale ** 2)
        init_skipless_feed_forward(self.fc1, self.fc2, self._ffn_activation)

    def feed_forward(self, x):
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        return self.fc2(x)

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_layer_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
        attn, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                                 incremental_state=incremental_state, need_weights=False,
                                 attn_mask=self_attn_mask)
        drop = self.dropout_module
        if self.parallel:
            mixed = drop(attn) + self.mlp_branch_scale * drop(self.feed_forward(x))
            return self.parallel_output_scale * mixed, None, None
        return self.mlp_branch_scale * drop(self.feed_forward(drop(attn))), None, None
