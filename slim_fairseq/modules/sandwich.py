"""Sandwich-style parameter sharing with a wider middle (Subformer, arXiv:2101.00234;
docs/TECHNIQUES.md#sandwich-sharing).

Layer stack of one side (L layers, model width d_m, middle width d_s, FFN f_s)::

    layer_1 (d_m, own weights) -> up: Linear(d_m, d_s) + Dropout(0.05) + LN(d_s)
    -> L-2 middle layers (d_s, f_s) sharing ONE set of attention/FFN weights
       (LayerNorms per layer)
    -> down: Linear(d_s, d_m) + Dropout(0.05) + LN(d_m) -> layer_L (d_m, own weights)

up/down exist only when d_s != d_m; they are folded into the first and last layer
(:class:`SandwichBoundaryLayer`), so the host's layer loops run unchanged. Middle decoder
layers attend to the encoder at d_m through shared projections (:class:`SandwichCrossAttention`).

Every middle layer is a separate module object holding the same Parameter objects, so each
depth keeps its own incremental state (fairseq keys the state by module instance) and beam
reordering visits each depth once. The reference shared one module object and decoded wrongly.
"""
from typing import List

import torch.nn as nn
from torch import Tensor

from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

from slim_fairseq.specs import SandwichSpec

SANDWICH_PROJECTION_DROPOUT = 0.05


def _is_norm(module):
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "Norm" in type(module).__name__


def tie_parameters_(target: nn.Module, source: nn.Module, keep_own=lambda name, module: False):
    """Make ``target`` hold ``source``'s Parameter objects (same structure), except in the
    submodules for which ``keep_own(name, module)`` is true."""
    for name, src_module in source.named_modules():
        if keep_own(name, src_module):
            continue
        dst_module = target.get_submodule(name) if name else target
        if type(dst_module) is not type(src_module):
            raise RuntimeError(f"{name or 'layer'}: cannot share weights between "
                               f"{type(src_module).__name__} and {type(dst_module).__name__}; "
                               "allowed: middle layers of one class")
        for pname, param in src_module._parameters.items():
            if param is None:
                continue
            if pname not in dst_module._parameters or dst_module._parameters[pname] is None:
                raise RuntimeError(f"{name}.{pname}: cannot be shared, missing in a middle "
                                   "layer; allowed: middle layers of one shape")
            if dst_module._parameters[pname].shape != param.shape:
                raise RuntimeError(f"{name}.{pname}: cannot be shared, shapes differ; "
                                   "allowed: middle layers of one shape")
            setattr(dst_module, pname, param)
    return target


class SandwichProjection(nn.Module):
    """Width change between the sandwich's parts: Linear + Dropout(0.05) + LayerNorm."""

    def __init__(self, in_dim, out_dim, export=False):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.dropout_module = FairseqDropout(SANDWICH_PROJECTION_DROPOUT,
                                             module_name=self.__class__.__name__)
        self.layer_norm = LayerNorm(out_dim, export=export)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer_norm(self.dropout_module(self.linear(x)))


class SandwichBoundaryLayer(nn.Module):
    """A d_m layer with the width projection folded in: ``layer`` then ``projection`` (entry
    into the middle), or ``projection`` then ``layer`` (exit). Called exactly like the wrapped
    layer; encoder ``(x, fc)`` and decoder ``(x, attn, state)`` tuples keep their tail."""

    def __init__(self, layer: nn.Module, projection: SandwichProjection, project_after: bool):
        super().__init__()
        self.layer = layer
        self.projection = projection
        self.project_after = project_after

    def forward(self, x, *args, **kwargs):
        if not self.project_after:
            return self.layer(self.projection(x), *args, **kwargs)
        out = self.layer(x, *args, **kwargs)
        if isinstance(out, tuple):
            return (self.projection(out[0]),) + tuple(out[1:])
        return self.projection(out)

    def upgrade_state_dict_named(self, state_dict, name):
        if hasattr(self.layer, "upgrade_state_dict_named"):
            self.layer.upgrade_state_dict_named(state_dict, f"{name}.layer")

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("layer"), name)


class SandwichCrossAttention(nn.Module):
    """Encoder-decoder attention of a middle decoder layer, at the model width d_m:
    Linear(d_s, d_m) + LN(d_m) -> attention over the encoder output -> Linear(d_m, d_s) + LN(d_s).
    The layer applies dropout, residual and its own LayerNorm at d_s. Called like fairseq's
    MultiheadAttention (the layer's ``self.encoder_attn``).

    ``output_norm=False`` (``--sandwich-cross-norm none``) drops the closing LN(d_s). With it, the
    path adds a unit-scale vector to every middle position from the first update on, while the
    attention is still near uniform over the source (docs/TECHNIQUES.md#sandwich-sharing)."""

    @classmethod
    def around(cls, attention: nn.Module, spec: SandwichSpec):
        """The path around ``attention`` (built at the model width) for the sandwich ``spec``."""
        return cls(attention, spec.middle_dim, spec.model_dim, spec.export,
                   output_norm=(spec.cross_norm == "layernorm"))

    def __init__(self, attention: nn.Module, middle_dim: int, model_dim: int, export=False,
                 output_norm=True):
        super().__init__()
        self.to_model = nn.Linear(middle_dim, model_dim)
        self.to_model_norm = LayerNorm(model_dim, export=export)
        self.attention = attention
        self.to_middle = nn.Linear(model_dim, middle_dim)
        self.to_middle_norm = LayerNorm(middle_dim, export=export) if output_norm else None

    def forward(self, query, key, value, *args, **kwargs):
        query = self.to_model_norm(self.to_model(query))
        x, attn = self.attention(query, key, value, *args, **kwargs)
        x = self.to_middle(x)
        if self.to_middle_norm is not None:
            x = self.to_middle_norm(x)
        return x, attn

    def _get_input_buffer(self, incremental_state):
        return self.attention._get_input_buffer(incremental_state)

    def _set_input_buffer(self, incremental_state, buffer):
        return self.attention._set_input_buffer(incremental_state, buffer)


def _share_middle_layers(middle: List[nn.Module]):
    """Make the middle layers hold the first one's attention/FFN Parameters (LayerNorms stay
    per layer); a model-width cross-attention path (:class:`SandwichCrossAttention`) is shared
    whole, its LayerNorms too."""
    template = middle[0]
    projected_cross = isinstance(getattr(template, "encoder_attn", None), SandwichCrossAttention)
    for layer in middle[1:]:
        if projected_cross:
            tie_parameters_(layer.encoder_attn, template.encoder_attn)

        def keep_own(name, module):
            if projected_cross and (name == "encoder_attn" or name.startswith("encoder_attn.")):
                return True  # tied above
            return _is_norm(module)

        tie_parameters_(layer, template, keep_own=keep_own)


def build_sandwich_stack(spec: SandwichSpec, first: nn.Module, middle: List[nn.Module],
                         last: nn.Module) -> List[nn.Module]:
    """The sandwich stack of one side (docs/TECHNIQUES.md#sandwich-sharing) from its layers:
    ``first`` and ``last`` at the model width, the ``layers - 2`` ``middle`` ones at the
    middle's (a wider middle's decoder layers with a :class:`SandwichCrossAttention` as their
    ``encoder_attn``), which come to share one set of weights; a wider middle gets its width
    projections folded into the first and last layer."""
    assert len(middle) == spec.layers - 2, (len(middle), spec.layers)
    _share_middle_layers(list(middle))
    if spec.wider:
        first = SandwichBoundaryLayer(first, SandwichProjection(spec.model_dim, spec.middle_dim,
                                                                spec.export), project_after=True)
        last = SandwichBoundaryLayer(last, SandwichProjection(spec.middle_dim, spec.model_dim,
                                                              spec.export), project_after=False)
    return [first] + list(middle) + [last]
