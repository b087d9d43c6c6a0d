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
import copy
import math

import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from slim_fairseq.models.slim_options import ModelOptions
from slim_fairseq.modules.activations import PLUGIN_ONLY, activation_function
from slim_fairseq.modules.attention import build_attention
from slim_fairseq.modules.dropout import slim_dropouts
from slim_fairseq.modules.glu import GLUProjection, build_linear, glu_hidden_dim
from slim_fairseq.modules.rmsnorm import RMSNorm
from slim_fairseq.modules.skipless import init_skipless_feed_forward
from slim_fairseq.modules.tc_autograd import rebuildable_relu
from slim_fairseq.modules.tensor_chain import TensorChainLinear
from slim_fairseq.specs import NormSpec


def build_norm(spec: NormSpec, dim):
    """The norm ``--norm`` selects at width ``dim``: fairseq's LayerNorm, RMSNorm (weight only,
    ``--rms-norm-eps``), or None (``none``)."""
    if spec.kind == "rmsnorm":
        return RMSNorm(dim, eps=spec.eps)
    if spec.kind == "none":
        return None
    return LayerNorm(dim, export=spec.export)


class _Identity(nn.Module):
    """Stands in for a norm under ``--norm none`` (no parameters)."""

    def forward(self, x):
        return x


def _identity(x):
    return x


class _SlimLayerMixin:
    """The layer's spec, read before fairseq's constructor runs the ``build_*`` hooks; the
    feed-forward hooks; the norm swap."""

    def _construct(self, cfg, side, construct):
        """Run fairseq's constructor ``construct(cfg)`` for a layer of ``side``. fairseq looks
        the activation up by name and knows no silu: it gets a copy of ``cfg`` that names relu,
        and the activation is set afterwards (``cfg`` itself is not changed)."""
        self.spec = ModelOptions.of(cfg).layer_spec(cfg, side)  # the build_* hooks read it
        activation = self.spec.ffn.activation
        if activation not in PLUGIN_ONLY:
            construct(cfg)
        else:
            fairseq_cfg = copy.copy(cfg)
            fairseq_cfg.activation_fn = "relu"
            construct(fairseq_cfg)
            if getattr(self, "cfg", None) is fairseq_cfg:
                self.cfg = cfg
            self.activation_fn = activation_function(activation)
        slim_dropouts(self)  # one-byte dropout masks on the CPU
        if self.spec.ffn.glu:
            self.activation_fn = _identity  # the GLU projection applies its own activation
        self._lean_ffn()
        self._swap_norms()

    def _swap_norms(self):
        if self.spec.norm.kind == "layernorm":
            return
        for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
            if getattr(self, name, None) is not None:
                setattr(self, name, build_norm(self.spec.norm, self.embed_dim) or _Identity())

    def _lean_ffn(self):
        """A ReLU feed-forward of two Tensor Chains keeps fc1's input for backward, not the
        hidden layer: fc1 marks its output, the ReLU keeps a one-byte mask, fc2 rebuilds its
        input (``tc_autograd``)."""
        if (self.activation_fn is F.relu and isinstance(self.fc1, TensorChainLinear)
                and isinstance(self.fc2, TensorChainLinear)):
            self.fc1.rebuildable_output = True
            self.activation_fn = rebuildable_relu

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        ffn = self.spec.ffn
        if ffn.glu:
            return GLUProjection(input_dim, glu_hidden_dim(output_dim, ffn.glu_hidden),
                                 activation=ffn.activation, chain=ffn.chain, bias=ffn.bias)
        if ffn.chain.ratio or not ffn.bias:
            return build_linear(input_dim, output_dim, ffn.chain, bias=ffn.bias)
        return super().build_fc1(input_dim, output_dim, q_noise, qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        ffn = self.spec.ffn
        if ffn.glu:
            input_dim = glu_hidden_dim(input_dim, ffn.glu_hidden)
        if ffn.glu or ffn.chain.ratio or not ffn.bias:
            return build_linear(input_dim, output_dim, ffn.chain, bias=ffn.bias,
                                rebuild_input=ffn.glu)
        return super().build_fc2(input_dim, output_dim, q_noise, qn_block_size)


def _attention_kwargs(layer, xformers):
    """fairseq's own extra arguments of the attention blocks of a layer."""
    return dict(q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size,
                xformers_att_config=xformers)


class SlimEncoderLayer(_SlimLayerMixin, TransformerEncoderLayerBase):
    """fairseq's encoder layer with the plugin's self-attention, feed-forward and norms."""

    def __init__(self, cfg, return_fc=False):
        self._construct(cfg, "encoder", lambda layer_cfg: TransformerEncoderLayerBase.__init__(
            self, layer_cfg, return_fc=return_fc))

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(self.spec.self_attn, embed_dim, cfg.encoder.attention_heads,
                               role="encoder_self", dropout=cfg.attention_dropout,
                               **_attention_kwargs(self, cfg.encoder.xformers_att_config))


class SlimDecoderLayer(_SlimLayerMixin, TransformerDecoderLayerBase):
    """fairseq's decoder layer with the plugin's self-/cross-attention, feed-forward and norms."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self._construct(cfg, "decoder", lambda layer_cfg: TransformerDecoderLayerBase.__init__(
            self, layer_cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn))

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        kwargs = _attention_kwargs(self, cfg.decoder.xformers_att_config)
        kwargs.update(add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        if cfg.cross_self_attention:
            kwargs["self_attention"] = False
        return build_attention(self.spec.self_attn, embed_dim, cfg.decoder.attention_heads,
                               role="decoder_self", dropout=cfg.attention_dropout, **kwargs)

    def build_encoder_attention(self, embed_dim, cfg):
        """fairseq's hook; also called by the sandwich stack for a middle layer's
        cross-attention at the model width, whose spec is the one at that width."""
        spec = (self.spec.cross_attn if embed_dim == self.embed_dim
                else ModelOptions.of(cfg).attention_spec("cross", embed_dim,
                                                         cfg.decoder.attention_heads))
        return build_attention(spec, embed_dim, cfg.decoder.attention_heads, role="cross",
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
        self.parallel = self.spec.skipless == "parallel"
        self.mlp_branch_scale = self.spec.mlp_branch_scale
        # parallel sum of two unit-variance branches, rescaled to unit variance at init
        self.parallel_output_scale = 1.0 / math.sqrt(1.0 + self.mlp_branch_scale ** 2)
        init_skipless_feed_forward(self.fc1, self.fc2, self.spec.ffn.activation)

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
