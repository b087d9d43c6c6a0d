"""Encoder/decoder layers with the Anthe techniques (arXiv:2305.10991; docs/TECHNIQUES.md#anthe): gated / no-patt / Tensor-Chain
attention, GLU feed-forward, Tensor-Chain feed-forward.

They subclass fairseq's layer bases and only override the ``build_*`` hooks, so fairseq's
forward runs unchanged; with every option off they are fairseq's layers (same parameters,
same init order, same outputs). A GLU FFN is ``fc2(fc1(x))`` with ``fc1`` =
:class:`GLUProjection` and the identity as the layer's activation.
"""
import torch.nn.functional as F
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from slim_fairseq.modules.dropout import slim_dropouts
from slim_fairseq.modules.gated_attention import build_attention, tc_ratio_for
from slim_fairseq.modules.glu import GLUProjection, build_linear, glu_hidden_dim


def _identity(x):
    return x


def _ffn_settings(cfg):
    """(GLU on, TC ratio of the feed-forward linears, chain length, bond floor)."""
    return (bool(getattr(cfg, "ffn_glu", False)), tc_ratio_for(cfg, "tc_ff"),
            int(getattr(cfg, "tc_length", 2) or 2), int(getattr(cfg, "tc_min_bond", 0) or 0))


class _SlimFFNMixin:
    """``build_fc1`` / ``build_fc2`` for GLU and Tensor-Chain feed-forward layers."""

    def _lean_ffn(self):
        """A ReLU feed-forward of two Tensor Chains keeps fc1's input for backward, not the
        hidden layer: fc1 marks its output, the ReLU keeps a one-byte mask, fc2 rebuilds its
        input (``tc_autograd``)."""
        from slim_fairseq.modules.tensor_chain import TensorChainLinear
        from slim_fairseq.modules.tc_autograd import rebuildable_relu
        if (self.activation_fn is F.relu and isinstance(self.fc1, TensorChainLinear)
                and isinstance(self.fc2, TensorChainLinear)):
            self.fc1.rebuildable_output = True
            self.activation_fn = rebuildable_relu

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        glu, tc_ff, tc_length, tc_min_bond = self._ffn_options
        if glu:
            return GLUProjection(input_dim, glu_hidden_dim(output_dim),
                                 activation=self._ffn_glu_activation, tc_ratio=tc_ff,
                                 tc_length=tc_length, tc_min_bond=tc_min_bond)
        if tc_ff:
            return build_linear(input_dim, output_dim, tc_ff, tc_length, tc_min_bond=tc_min_bond)
        return super().build_fc1(input_dim, output_dim, q_noise, qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        glu, tc_ff, tc_length, tc_min_bond = self._ffn_options
        if glu:
            input_dim = glu_hidden_dim(input_dim)
        if glu or tc_ff:
            return build_linear(input_dim, output_dim, tc_ff, tc_length, rebuild_input=glu,
                                tc_min_bond=tc_min_bond)
        return super().build_fc2(input_dim, output_dim, q_noise, qn_block_size)


def _attention_kwargs(layer, xformers):
    """fairseq's own extra arguments of the attention blocks of a layer."""
    return dict(q_noise=layer.quant_noise, qn_block_size=layer.quant_noise_block_size,
                xformers_att_config=xformers)


class SlimEncoderLayer(_SlimFFNMixin, TransformerEncoderLayerBase):
    """fairseq's encoder layer with Anthe's self-attention and feed-forward options."""

    def __init__(self, cfg, return_fc=False):
        # build_* hooks run inside the base constructor: read the options first
        object.__setattr__(self, "_ffn_options", _ffn_settings(cfg))
        object.__setattr__(self, "_ffn_glu_activation",
                           getattr(cfg, "glu_activation", "silu") or "silu")
        super().__init__(cfg, return_fc=return_fc)
        slim_dropouts(self)  # one-byte dropout masks on the CPU
        if self._ffn_options[0]:
            self.activation_fn = _identity  # the GLU projection applies its own activation
        self._lean_ffn()

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(cfg, embed_dim, cfg.encoder.attention_heads, role="encoder_self",
                               dropout=cfg.attention_dropout,
                               **_attention_kwargs(self, cfg.encoder.xformers_att_config))


class SlimDecoderLayer(_SlimFFNMixin, TransformerDecoderLayerBase):
    """fairseq's decoder layer with Anthe's self-/cross-attention and feed-forward options."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        object.__setattr__(self, "_ffn_options", _ffn_settings(cfg))
        object.__setattr__(self, "_ffn_glu_activation",
                           getattr(cfg, "glu_activation", "silu") or "silu")
        super().__init__(cfg, no_encoder_attn=no_encoder_attn, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn)
        slim_dropouts(self)
        if self._ffn_options[0]:
            self.activation_fn = _identity
        self._lean_ffn()

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
