"""STLM weight tying across layers (Super Tiny Language Models, arXiv:2405.14159; docs/TECHNIQUES.md#tying-schemes): FFN tying over interior layers, per-layer LoRA
on the shared FFN linears, and attention output-projection sharing.

Interior range for a tie option ``k`` (an int >= 0; ``none`` turns the scheme off) over ``D``
layers (0-based): layers ``1+k .. D-k-1`` all use the Parameters of layer ``1+k``; layer 0 is
never shared, ``k = 0`` means "all layers but the first".

Sharing layers keep their own module objects (and so their own fairseq incremental state,
docs/TECHNIQUES.md#shared-layers-and-incremental-state); only Parameter objects are shared. With ``--ffn-lora-rank r`` every layer of the FFN
range (the owner included) replaces each shared FFN linear by a :class:`LoRALinear` holding
the shared Parameters plus its own adapter.

Works on any layer type through two resolver callbacks (the defaults handle fairseq-style
layers):

* ``ffn_linears(layer) -> {dotted_path: module}``: the FFN linears of a layer, e.g.
  ``{"fc1": ..., "fc2": ...}``, or ``{"fc1.w1": ..., "fc1.w3": ..., "fc2": ...}`` for a GLU;
* ``attn_out_proj(layer) -> module``: the attention output projection.
"""

from typing import Callable, Dict, List, Optional

from torch import nn

from slim_fairseq.modules.lora import LoRALinear
from slim_fairseq.specs import TyingSpec

def tied_layer_range(k: Optional[int], num_layers: int) -> List[int]:
    """0-based layers sharing the weights of layer 1+k: ``[1+k, ..., D-k-1]`` ([] if off)."""
    if k is None:
        return []
    return list(range(1 + k, num_layers - k))


# ----------------------------------------------------------------------------------------
# resolvers for the layer types of this plugin and of fairseq


def _linear_children(module: nn.Module, prefix: str) -> Dict[str, nn.Module]:
    """``module`` itself if it holds a 2-D weight, else its direct children that do."""
    if isinstance(getattr(module, "weight", None), nn.Parameter):
        return {prefix: module}
    found = {
        f"{prefix}.{name}": child
        for name, child in module.named_children()
        if isinstance(getattr(child, "weight", None), nn.Parameter)
    }
    if not found:
        return {prefix: module}  # not linear-like: shared Parameter-wise, LoRA refuses it
    return found


def default_ffn_linears(layer: nn.Module) -> Dict[str, nn.Module]:
    """FFN linears of a fairseq-style layer (``fc1``/``fc2``; a GLU ``fc1`` contributes its
    linear children w1 and w3)."""
    if hasattr(layer, "fc1") and hasattr(layer, "fc2"):
        found = _linear_children(layer.fc1, "fc1")
        found.update(_linear_children(layer.fc2, "fc2"))
        return found
    raise ValueError(f"layer={type(layer).__name__}: no feed-forward fc1/fc2 to tie; allowed: "
                     "a layer with fc1 and fc2, or an ffn_linears resolver for it")


def default_attn_out_proj(layer: nn.Module) -> nn.Module:
    """``layer.self_attn.out_proj``."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or getattr(attn, "out_proj", None) is None:
        raise ValueError(f"layer={type(layer).__name__}: no self_attn.out_proj to tie; allowed: "
                         "a layer with one, or an attn_out_proj resolver for it")
    return attn.out_proj


# ----------------------------------------------------------------------------------------


def _get_submodule(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path) if path else root


def _set_submodule(root: nn.Module, path: str, module: nn.Module):
    parent_path, _, leaf = path.rpartition(".")
    setattr(_get_submodule(root, parent_path), leaf, module)


def share_parameters(source: nn.Module, target: nn.Module):
    """Make every Parameter of ``target`` the very Parameter object of ``source`` at the same
    name (shapes must match). ``target`` stays a separate module object."""
    target_params = dict(target.named_parameters(remove_duplicate=False))
    for name, param in source.named_parameters(remove_duplicate=False):
        if name not in target_params or target_params[name].shape != param.shape:
            raise ValueError(f"{type(target).__name__}.{name}: does not match the layer it "
                             "shares weights with; allowed: layers of one shape")
        owner_path, _, leaf = name.rpartition(".")
        setattr(_get_submodule(target, owner_path), leaf, param)


def apply_weight_tying(
    layers,
    spec: TyingSpec,
    ffn_linears: Callable[[nn.Module], Dict[str, nn.Module]] = default_ffn_linears,
    attn_out_proj: Callable[[nn.Module], nn.Module] = default_attn_out_proj,
) -> Dict[str, List[int]]:
    """Tie FFN / attention-projection Parameters over the interior layers and add LoRA.

    A no-op when every scheme is off. Returns ``{"ffn": [...], "attn_proj": [...],
    "lora": [...]}`` with the 0-based layer indices each scheme covers. The options were
    checked against the layer count before (``TyingOptions``'s rules in
    ``slim_fairseq/models/slim_options.py``).
    """
    layers = list(layers)
    rank, alpha = spec.lora_rank, spec.lora_alpha
    ffn_range = tied_layer_range(spec.ffn, len(layers))
    proj_range = tied_layer_range(spec.attn_proj, len(layers))

    if ffn_range:
        owner = ffn_linears(layers[ffn_range[0]])
        for index in ffn_range[1:]:
            mine = ffn_linears(layers[index])
            if set(mine) != set(owner):
                raise ValueError(f"layers[{index}]: another feed-forward layout than the layer "
                                 "it shares with; allowed: layers of one shape")
            for path, module in owner.items():
                share_parameters(module, mine[path])
        if rank > 0:
            for index in ffn_range:
                for path in owner:
                    _set_submodule(layers[index], path, LoRALinear(owner[path], rank, alpha))

    if proj_range:
        owner_proj = attn_out_proj(layers[proj_range[0]])
        for index in proj_range[1:]:
            share_parameters(owner_proj, attn_out_proj(layers[index]))

    return {"ffn": ffn_range, "attn_proj": proj_range, "lora": ffn_range if rank > 0 else []}
