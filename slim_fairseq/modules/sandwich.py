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
import copy
from typing import Callable, List

import torch.nn as nn
from torch import Tensor

from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

from slim_fairseq.modules.attention import heads_for
from slim_fairseq.option_errors import option_error

SANDWICH_PROJECTION_DROPOUT = 0.05
_DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING = ("pytorch_ddp", "c10d")
_SHARDED_BACKENDS = ("fully_sharded",)


def sandwich_dims(cfg, side):
    """(layers, d_m, f_m, d_s, f_s, middle heads) of one side, with the options' 0 = default."""
    sub = cfg.encoder if side == "encoder" else cfg.decoder
    model_dim, model_ffn = sub.embed_dim, sub.ffn_embed_dim
    middle_dim = getattr(cfg, "sandwich_dim", 0) or model_dim
    middle_ffn = getattr(cfg, "sandwich_ffn_dim", 0) or model_ffn
    middle_heads = getattr(cfg, "sandwich_heads", 0) or heads_for(middle_dim)
    return sub.layers, model_dim, model_ffn, middle_dim, middle_ffn, middle_heads


def validate_sandwich(cfg, side):
    """One-line errors for option combinations the sandwich stack cannot honour."""
    layers, model_dim, _, middle_dim, _, heads = sandwich_dims(cfg, side)
    if layers < 3:
        raise option_error(f"--{side}-layers", layers, "too few for --sandwich (own first and "
                           "last layer plus shared middle ones)", ">= 3")
    if middle_dim % heads:
        raise option_error("--sandwich-heads", heads, f"does not divide --sandwich-dim={middle_dim}",
                           "a divisor of the middle width (0 = width // 64)")
    sub = cfg.encoder if side == "encoder" else cfg.decoder
    if middle_dim != model_dim and getattr(sub, "layerdrop", 0.0):
        raise option_error(f"--{side}-layerdrop", sub.layerdrop, "cannot be combined with "
                           "--sandwich and --sandwich-dim != model width (dropping a boundary "
                           "layer drops its width projection)", "0")
    cross_norm = getattr(cfg, "sandwich_cross_norm", "layernorm")
    if cross_norm != "layernorm" and side == "decoder" and middle_dim == model_dim:
        raise option_error("--sandwich-cross-norm", cross_norm, "acts on the cross-attention of a "
                           f"middle wider than the model, and --sandwich-dim={middle_dim} is the "
                           "model width", "a wider --sandwich-dim, or drop --sandwich-cross-norm")
    if middle_dim != model_dim and side == "decoder" and getattr(cfg, "cross_self_attention", False):
        raise option_error("--cross-self-attention", None, "cannot be combined with --sandwich "
                           "and --sandwich-dim != model width", "off")
    backend = getattr(cfg, "ddp_backend", "pytorch_ddp")
    if backend in _SHARDED_BACKENDS:
        raise option_error("--ddp-backend", backend, "cannot hold the sandwich's shared "
                           "middle-layer weights (one parameter in several FSDP units)",
                           "legacy_ddp|no_c10d|pytorch_ddp|c10d")
    if getattr(cfg, "checkpoint_activations", False) and backend in _DATA_PARALLEL_WITH_BROKEN_CHECKPOINTING:
        raise option_error("--checkpoint-activations", None, f"with --sandwich under "
                           f"--ddp-backend={backend} gives silently wrong gradients for the "
                           "shared layers", "--ddp-backend legacy_ddp|no_c10d")


def middle_layer_cfg(cfg, side):
    """Copy of ``cfg`` whose ``side`` has the middle width, FFN width and heads."""
    _, _, _, middle_dim, middle_ffn, heads = sandwich_dims(cfg, side)
    mid = copy.deepcopy(cfg)
    sub = mid.encoder if side == "encoder" else mid.decoder
    sub.embed_dim, sub.ffn_embed_dim, sub.attention_heads = middle_dim, middle_ffn, heads
    if side == "decoder":
        # the d_s-wide cross-attention the layer builds is replaced by SandwichCrossAttention;
        # let it read d_s-wide keys so that width checks of gated attention pass meanwhile
        mid.encoder.embed_dim = middle_dim
    return mid


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
            raise RuntimeError(f"--sandwich: cannot share {name} between "
                               f"{type(src_module).__name__} and {type(dst_module).__name__}; "
                               "allowed: middle layers of one class")
        for pname, param in src_module._parameters.items():
            if param is None:
                continue
            if pname not in dst_module._parameters or dst_module._parameters[pname] is None:
                raise RuntimeError(f"--sandwich: cannot share {name}.{pname}, missing in a "
                                   "middle layer; allowed: middle layers of one shape")
            if dst_module._parameters[pname].shape != param.shape:
                raise RuntimeError(f"--sandwich: cannot share {name}.{pname}, shapes differ; "
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


def _build_middle_layers(cfg, side, make_layer, count) -> List[nn.Module]:
    """``count`` middle layers: separate module objects, attention/FFN Parameters shared with
    the first of them, LayerNorms per layer."""
    _, model_dim, _, middle_dim, _, _ = sandwich_dims(cfg, side)
    mid_cfg = middle_layer_cfg(cfg, side)
    export = getattr(cfg, "export", False)
    cross_norm = getattr(cfg, "sandwich_cross_norm", "layernorm")
    layers = []
    for depth in range(count):
        layer = make_layer(mid_cfg)
        projected_cross = getattr(layer, "encoder_attn", None) is not None and middle_dim != model_dim
        if projected_cross:
            layer.encoder_attn = SandwichCrossAttention(
                layer.build_encoder_attention(model_dim, cfg), middle_dim, model_dim, export,
                output_norm=(cross_norm == "layernorm"))
        if depth > 0:
            template = layers[0]
            if projected_cross:
                # the cross-attention path (projections, their LayerNorms, attention) is shared whole
                tie_parameters_(layer.encoder_attn, template.encoder_attn)

            def keep_own(name, module, projected_cross=projected_cross):
                if projected_cross and (name == "encoder_attn" or name.startswith("encoder_attn.")):
                    return True  # tied above
                return _is_norm(module)

            tie_parameters_(layer, template, keep_own=keep_own)
        layers.append(layer)
    return layers


def build_layer_stack(cfg, side: str, make_layer: Callable[[object], nn.Module]) -> List[nn.Module]:
    """Layers of one side: plain (``cfg.sandwich`` off) or the sandwich stack (docs/TECHNIQUES.md#sandwich-sharing)."""
    if side not in ("encoder", "decoder"):
        raise ValueError(f"side={side!r}: not a side of the model; allowed: encoder|decoder")
    if not getattr(cfg, "sandwich", False):
        layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        return [make_layer(cfg) for _ in range(layers)]
    validate_sandwich(cfg, side)
    layers, model_dim, _, middle_dim, _, _ = sandwich_dims(cfg, side)
    export = getattr(cfg, "export", False)
    first = make_layer(cfg)
    middle = _build_middle_layers(cfg, side, make_layer, layers - 2)
    last = make_layer(cfg)
    if middle_dim != model_dim:
        first = SandwichBoundaryLayer(first, SandwichProjection(model_dim, middle_dim, export),
                                      project_after=True)
        last = SandwichBoundaryLayer(last, SandwichProjection(middle_dim, model_dim, export),
                                     project_after=False)
    return [first] + middle + [last]
