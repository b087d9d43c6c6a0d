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
from slim_fairseq.option_errors import option_error

TIE_ALLOWED = "none or an integer K >= 0"


def _option(cfg, name, default=None):
    value = getattr(cfg, name, None)
    return default if value is None else value


def parse_tie_option(value, flag: str) -> Optional[int]:
    """``none``/None -> None (off); an int >= 0 (or its string) -> that int."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "none":
            return None
        try:
            value = int(text)
        except ValueError:
            raise option_error(flag, value, "not a layer offset", TIE_ALLOWED) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise option_error(flag, value, "not a layer offset", TIE_ALLOWED)
    return value


def tied_layer_range(k: Optional[int], num_layers: int) -> List[int]:
    """0-based layers sharing the weights of layer 1+k: ``[1+k, ..., D-k-1]`` ([] if off)."""
    if k is None:
        return []
    return list(range(1 + k, num_layers - k))


def validate_tying(cfg, num_layers: int):
    """Check the tying options against the layer count; one-line error otherwise.

    Returns ``(ffn_k, attn_proj_k, lora_rank, lora_alpha)`` with ks as int or None.
    """
    ffn_k = parse_tie_option(_option(cfg, "tie_ffn"), "--tie-ffn")
    proj_k = parse_tie_option(_option(cfg, "tie_attn_proj"), "--tie-attn-proj")
    for k, flag in ((ffn_k, "--tie-ffn"), (proj_k, "--tie-attn-proj")):
        if k is not None and len(tied_layer_range(k, num_layers)) < 2:
            if num_layers < 3:
                raise option_error(flag, k, f"needs at least 3 layers, the model has {num_layers}",
                                   "none, or 3 layers or more")
            raise option_error(flag, k, f"too large for {num_layers} layers (layers 1+K..D-K-1 "
                               "must hold at least 2 layers)", f"K <= {(num_layers - 3) // 2}")
    rank = _option(cfg, "ffn_lora_rank", 0)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise option_error("--ffn-lora-rank", rank, "not a rank", "an integer >= 0")
    alpha = _option(cfg, "ffn_lora_alpha", None)
    if rank > 0 and ffn_k is None:
        raise option_error("--ffn-lora-rank", rank, "LoRA adapts shared FFN weights, and "
                           "--tie-ffn is off", "--tie-ffn K, or --ffn-lora-rank 0")
    if alpha is not None and rank == 0:
        raise option_error("--ffn-lora-alpha", alpha, "scales a LoRA adapter, and --ffn-lora-rank "
                           "is 0", "--ffn-lora-rank R, or drop --ffn-lora-alpha")
    if alpha is not None and float(alpha) <= 0:
        raise option_error("--ffn-lora-alpha", alpha, "not positive", "a number > 0")
    alpha = float(alpha) if alpha is not None else float(rank)
    if (ffn_k is not None or proj_k is not None) and _option(cfg, "sandwich", False):
        raise option_error("--tie-ffn" if ffn_k is not None else "--tie-attn-proj",
                           ffn_k if ffn_k is not None else proj_k, "cannot be combined with "
                           "--sandwich (it already shares the middle layers)", "none with --sandwich")
    if ffn_k is not None or proj_k is not None:
        _check_training_setup(cfg)
    return ffn_k, proj_k, rank, alpha


def _check_training_setup(cfg):
    """Reject distributed set-ups that mishandle shared Parameters (docs/TECHNIQUES.md#distributed-training-with-shared-weights)."""
    backend = _option(cfg, "ddp_backend", "")
    if backend == "fully_sharded":
        raise option_error("--ddp-backend", backend, "cannot hold weights shared across layers "
                           "(--tie-ffn/--tie-attn-proj)", "legacy_ddp|pytorch_ddp")
    world = _option(cfg, "distributed_world_size", 1)
    if (
        _option(cfg, "checkpoint_activations", False)
        and backend in ("pytorch_ddp", "c10d")
        and world > 1
    ):
        raise option_error("--ddp-backend", backend, "with --checkpoint-activations gives wrong "
                           "gradients for shared layers (--tie-ffn/--tie-attn-proj)", "legacy_ddp")


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
    raise ValueError(f"--tie-ffn: {type(layer).__name__} has no feed-forward fc1/fc2; allowed: "
                     "--tie-ffn none with this layer")


def default_attn_out_proj(layer: nn.Module) -> nn.Module:
    """``layer.self_attn.out_proj``."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or getattr(attn, "out_proj", None) is None:
        raise ValueError(f"--tie-attn-proj: {type(layer).__name__} has no self_attn.out_proj; "
                         "allowed: --tie-attn-proj none with this layer")
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
    cfg,
    ffn_linears: Callable[[nn.Module], Dict[str, nn.Module]] = default_ffn_linears,
    attn_out_proj: Callable[[nn.Module], nn.Module] = default_attn_out_proj,
) -> Dict[str, List[int]]:
    """Tie FFN / attention-projection Parameters over the interior layers and add LoRA.

    A no-op when every option is off. Returns ``{"ffn": [...], "attn_proj": [...],
    "lora": [...]}`` with the 0-based layer indices each scheme covers.
    """
    layers = list(layers)
    ffn_k, proj_k, rank, alpha = validate_tying(cfg, len(layers))
    ffn_range = tied_layer_range(ffn_k, len(layers))
    proj_range = tied_layer_range(proj_k, len(layers))

    if ffn_range:
        owner = ffn_linears(layers[ffn_range[0]])
        for index in ffn_range[1:]:
            mine = ffn_linears(layers[index])
            if set(mine) != set(owner):
                raise ValueError(f"--tie-ffn: layer {index} has another feed-forward layout "
                                 "than the layer it shares with; allowed: layers of one shape")
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


def tying_enabled(cfg) -> bool:
    """True when any tying option is on (callers may skip :func:`apply_weight_tying`)."""
    return (
        parse_tie_option(_option(cfg, "tie_ffn"), "--tie-ffn") is not None
        or parse_tie_option(_option(cfg, "tie_attn_proj"), "--tie-attn-proj") is not None
    )
