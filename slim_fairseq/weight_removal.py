"""Exact removal of W_Q (or W_K, W_V) and P from a trained skipless model (Graef,
"Transformer tricks: removing weights for skipless transformers", arXiv:2404.12362;
docs/TECHNIQUES.md#weight-removal).

Row-vector convention: a linear layer is ``y = x M + b`` with ``M = weight^T``. For block i with
removed matrix D (= Q_i, K_i or V_i, d x d), bias b_D, and post-attention projection P_i:

* the producer of the block input absorbs D: the embedding ``E* = E D + b_D / scale`` for the
  first block, else the previous FFN output ``M2* = M2 D``, ``b2* = b2 D + b_D / s`` (serial; s
  = --mlp-branch-scale) or, in the parallel layout (block output ``c (Attn + s FFN)``,
  ``c = 1/sqrt(1 + s^2)``), ``P*_{i-1} = P_{i-1} D``, ``b_P* = b_P D + b_D / c``,
  ``M2* = M2 D``, ``b2* = b2 D``;
* the two other projections read the new input x' = x D + b_D: ``X* = D^-1 X``,
  ``b_X* = b_X - b_D D^-1 X``;
* serial: P merges into the FFN input linears (both GLU linears): ``M1* = P M1``,
  ``b1* = b1 + b_P M1``; parallel: the FFN also reads x', so ``M1* = D^-1 M1``,
  ``b1* = b1 - b_D D^-1 M1``, and P stays (it absorbs the next block's D): only one d x d
  matrix per block cancels exactly in the parallel layout.

Everything is computed in float64 and cast back. Tied input/output embeddings are untied
(the output projection keeps the original E). RoPE is untouched (it acts after projection).
"""

import argparse
import copy
import math
from typing import Dict, List, Tuple

import torch

from slim_fairseq.checkpoint_upgrade import upgrade_state_dict
from slim_fairseq.option_errors import option_error

DEFAULT_MAX_CONDITION = 1e8
REMOVABLE = ("q", "k", "v")


def _get(cfg, name, default=None):
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def _set(cfg, name, value):
    if isinstance(cfg, dict):
        cfg[name] = value
    else:
        setattr(cfg, name, value)


def check_removable(model_args, removed: str):
    """Raise a one-line ValueError if ``removed`` cannot be removed exactly from this model."""
    if removed not in REMOVABLE:
        raise option_error("--removed-weights", removed, "not a projection", "q|k|v")
    if (_get(model_args, "skipless_layout", "none") or "none") == "none":
        raise option_error("--removed-weights", removed, "exact removal needs a skipless model "
                           "(no residual, no norm)", "a skipless_* arch or --skipless-layout")
    already = _get(model_args, "removed_weights", "none") or "none"
    if already != "none":
        raise option_error("--removed-weights", removed, "the model is already reduced "
                           f"(--removed-weights {already})", "an unreduced model")
    refusal = _reduced_form_refusal(model_args, removed)
    if refusal is not None:
        # a trained model's heads and gates stay: only another projection can be removed
        others = [{"--removed-weights": other} for other in REMOVABLE
                  if other != removed and _reduced_form_refusal(model_args, other) is None]
        raise refusal.with_alternatives(others, "none (no projection of this model can go)")
    for flag, dest in (("--tc-ff", "tc_ff"), ("--tc-layer", "tc_layer"), ("--tc-emb", "tc_emb")):
        if _get(model_args, dest, None) not in (None, "none", 0, 0.0):
            raise option_error("--removed-weights", removed, f"exact removal merges dense "
                               f"projections, which {flag} changes", f"a model without {flag}")
    if _get(model_args, "layernorm_embedding", False):
        raise option_error("--removed-weights", removed, f"the first block's W_{removed.upper()} "
                           "cannot be absorbed through --layernorm-embedding (the embedding is "
                           "normalised before it)", "none")


def _reduced_form_refusal(model_args, removed):
    """The refusal of the option rules on the reduced form of this model, W_{removed} gone (a
    plain, square projection: ``SkiplessOptions.removed_projection_is_plain`` and
    ``removed_projection_is_square``), or None."""
    from slim_fairseq.models.slim_options import ModelOptions, SkiplessOptions
    from slim_fairseq.option_errors import OptionError
    reduced = argparse.Namespace(**model_args) if isinstance(model_args, dict) else copy.copy(model_args)
    _set(reduced, "removed_weights", removed)
    options = ModelOptions.of(reduced, "slim_lm")
    spec = options.get(SkiplessOptions)
    try:
        spec.removed_projection_is_plain(options)
        spec.removed_projection_is_square(options)
    except OptionError as error:
        return error
    return None


def _row(sd, key):
    """Row-vector matrix (in x out) in float64 of a linear layer's weight."""
    return sd[key].to(torch.float64).t()


def _bias(sd, key, width):
    t = sd.get(key)
    return torch.zeros(width, dtype=torch.float64) if t is None else t.to(torch.float64)


def _checked_matrix(sd, key, layer, removed, max_condition):
    mat = _row(sd, key)
    assert mat.shape[0] == mat.shape[1], (key, tuple(mat.shape))  # (check_removable's rule)
    cond = torch.linalg.cond(mat).item()
    if not math.isfinite(cond) or cond > max_condition:
        raise ValueError(
            f"--removed-weights={removed}: layer {layer} W_{removed.upper()} is singular or "
            f"ill-conditioned (condition number {cond:.3g} > --max-condition {max_condition:.3g}) "
            "and cannot be removed exactly; allowed: another of q|k|v, or a larger --max-condition"
        )
    return mat, cond


def convert_state_dict(
    state_dict: Dict[str, torch.Tensor], model_args, removed: str = "q",
    max_condition: float = DEFAULT_MAX_CONDITION,
) -> Tuple[Dict[str, torch.Tensor], object, List[str]]:
    """Reduce a skipless model's state dict (docs/TECHNIQUES.md#weight-removal).

    Args:
        state_dict: the ``model`` state dict of a skipless model (unreduced).
        model_args: its model config (Namespace or dict) with the arch defaults filled.
        removed: ``"q"``, ``"k"`` or ``"v"``.
        max_condition: largest accepted condition number of a removed matrix.

    Returns ``(new_state_dict, new_model_args, report_lines)``; ``new_model_args`` is a copy with
    ``removed_weights`` set (and ``keep_attn_out_proj`` for the parallel layout, and embeddings
    untied).
    """
    check_removable(model_args, removed)
    parallel = _get(model_args, "skipless_layout", "serial") == "parallel"
    layers = _get(model_args, "decoder_layers")
    dim = _get(model_args, "decoder_embed_dim")
    scale = 1.0 if _get(model_args, "no_scale_embedding", False) else math.sqrt(dim)
    mlp_scale = float(_get(model_args, "mlp_branch_scale", 1.0))
    parallel_scale = 1.0 / math.sqrt(1.0 + mlp_scale ** 2)  # SkiplessDecoderLayer.parallel_output_scale
    tied = bool(_get(model_args, "share_decoder_input_output_embed", False))
    has_bias = bool(_get(model_args, "linear_bias", False))
    if has_bias and not parallel and mlp_scale == 0.0:
        raise option_error("--mlp-branch-scale", 0.0, "makes the FFN output constant; nothing to "
                           "convert", "a number > 0")

    sd = {k: v for k, v in state_dict.items() if torch.is_tensor(v)}
    dtypes = {k: v.dtype for k, v in sd.items()}
    new = {}  # float64 results: key -> tensor (torch weight layout)
    others = [s for s in REMOVABLE if s != removed]
    report = []

    embed_key = "decoder.embed_tokens.table.weight"
    embedding = sd[embed_key].to(torch.float64)
    if tied:
        new["decoder.output_projection.weight"] = embedding.clone()
        dtypes["decoder.output_projection.weight"] = dtypes[embed_key]
        report.append("tied input/output embeddings untied (E* = E D_1 replaces the input table only)")

    def put(key, row_matrix):
        new[key] = row_matrix.t().contiguous()

    def put_bias(key, vec):
        if key in sd:
            new[key] = vec
        elif vec.abs().max().item() != 0.0:
            raise ValueError(f"{key}: a nonzero bias of a weight that is removed; allowed: none "
                             "(a defect of the plugin: report it with the command)")

    conds = []
    for i in range(layers):
        p = f"decoder.layers.{i}."
        attn, ffn = p + "self_attn.", p
        dmat, cond = _checked_matrix(sd, f"{attn}{removed}_proj.weight", i, removed, max_condition)
        conds.append(cond)
        b_d = _bias(sd, f"{attn}{removed}_proj.bias", dim)

        # 1. the producer of this block's input absorbs D
        if i == 0:
            new[embed_key] = embedding @ dmat + b_d / scale
        else:
            q = f"decoder.layers.{i - 1}."
            fc2 = _row(sd, q + "fc2.weight")
            b2 = _bias(sd, q + "fc2.bias", dim)
            put(q + "fc2.weight", fc2 @ dmat)
            if parallel:
                prev_p = new.pop(q + "self_attn.out_proj.weight").t()  # already reduced by step 3
                b_p = new.pop(q + "self_attn.out_proj.bias", _bias(sd, q + "self_attn.out_proj.bias", dim))
                put(q + "self_attn.out_proj.weight", prev_p @ dmat)
                put_bias(q + "self_attn.out_proj.bias", b_p @ dmat + b_d / parallel_scale)
                put_bias(q + "fc2.bias", b2 @ dmat)
            else:
                put_bias(q + "fc2.bias", b2 @ dmat + b_d / mlp_scale)

        # 2. the other two projections read x' = x D + b_D
        for name in others:
            mat = _row(sd, f"{attn}{name}_proj.weight")
            reduced = torch.linalg.solve(dmat, mat)
            put(f"{attn}{name}_proj.weight", reduced)
            put_bias(f"{attn}{name}_proj.bias", _bias(sd, f"{attn}{name}_proj.bias", mat.shape[1]) - b_d @ reduced)

        # 3. FFN input linears
        # a plain FFN's fc1, a GLU's two input linears (fc1.w1 through the activation, fc1.w3)
        ffn_inputs = [n for n in ("fc1", "fc1.w1", "fc1.w3") if f"{ffn}{n}.weight" in sd]
        if parallel:
            for n in ffn_inputs:
                mat = _row(sd, f"{ffn}{n}.weight")
                reduced = torch.linalg.solve(dmat, mat)
                put(f"{ffn}{n}.weight", reduced)
                put_bias(f"{ffn}{n}.bias", _bias(sd, f"{ffn}{n}.bias", mat.shape[1]) - b_d @ reduced)
            new[attn + "out_proj.weight"] = sd[attn + "out_proj.weight"].to(torch.float64)
            if attn + "out_proj.bias" in sd:
                new[attn + "out_proj.bias"] = sd[attn + "out_proj.bias"].to(torch.float64)
        else:
            proj = _row(sd, attn + "out_proj.weight")
            b_p = _bias(sd, attn + "out_proj.bias", dim)
            for n in ffn_inputs:
                mat = _row(sd, f"{ffn}{n}.weight")
                put(f"{ffn}{n}.weight", proj @ mat)
                put_bias(f"{ffn}{n}.bias", _bias(sd, f"{ffn}{n}.bias", mat.shape[1]) + b_p @ mat)

    drop = {f"decoder.layers.{i}.self_attn.{removed}_proj.{w}" for i in range(layers) for w in ("weight", "bias")}
    if not parallel:
        drop |= {f"decoder.layers.{i}.self_attn.out_proj.{w}" for i in range(layers) for w in ("weight", "bias")}
    out = {}
    for key, value in sd.items():
        if key in drop:
            continue
        out[key] = new[key].to(dtypes[key]) if key in new else value
    for key, value in new.items():
        if key not in out and key not in drop:
            out[key] = value.to(dtypes[key])
    # the record of the data and run (slim_fairseq/data_record.py) goes with the weights
    out.update({k: v for k, v in state_dict.items() if not torch.is_tensor(v)})

    new_args = copy.deepcopy(model_args)
    _set(new_args, "removed_weights", removed)
    _set(new_args, "share_decoder_input_output_embed", False)
    _set(new_args, "keep_attn_out_proj", parallel)
    removed_count = layers * dim * dim * (1 if parallel else 2)
    report.insert(0, f"removed W_{removed.upper()}" + ("" if parallel else " and P") +
                  f" from {layers} blocks: {removed_count:,} weights; condition numbers "
                  f"{min(conds):.3g}..{max(conds):.3g}")
    if parallel:
        report.append(
            f"parallel layout: the {layers} post-attention projections P ({layers * dim * dim:,} weights) remain; "
            "attention and FFN outputs are summed, so only one d x d matrix per block cancels exactly "
            "(train the reduced form --removed-weights q directly to have neither Q nor P)")
    return out, new_args, report


def reduce_model(model, removed: str = "q", max_condition: float = DEFAULT_MAX_CONDITION):
    """In-memory conversion: returns ``(reduced_model, report_lines)`` of the same class, with the
    same dtype as ``model`` (convert a float64 copy for the 1e-12 equivalence)."""
    state, new_args, report = convert_state_dict(model.state_dict(), model.args, removed,
                                                 max_condition)
    dictionary = model.decoder.dictionary
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    reduced = type(model).build_model(new_args, task)
    reduced.to(next(model.parameters()).dtype)
    reduced.load_state_dict(state, strict=True)
    return reduced, report


def convert_checkpoint(src_path: str, dst_path: str, removed: str = "q",
                       max_condition: float = DEFAULT_MAX_CONDITION) -> List[str]:
    """Read a fairseq checkpoint of a skipless arch, write one of its reduced form.

    The checkpoint keeps its structure (``cfg``/``args``, ``extra_state``, ``optimizer_history``)
    so fairseq-eval-lm / fairseq-generate load it as is (``weights_only=True``); the optimizer
    state is dropped (it belongs to the removed parameters): continue training with
    ``--reset-optimizer``. A DST_PATH that is SRC_PATH is refused (the input would be lost).
    """
    import os
    if os.path.realpath(src_path) == os.path.realpath(dst_path):
        raise option_error("OUTPUT", dst_path, f"is the checkpoint it reads ({src_path}), which writing "
                           "would overwrite", "another file")
    state = torch.load(src_path, map_location="cpu", weights_only=True)
    holders = []
    if state.get("args") is not None:
        holders.append((state, "args"))
    if state.get("cfg") is not None and _get(state["cfg"], "model") is not None:
        holders.append((state["cfg"], "model"))
    if not holders:
        raise ValueError(f"CHECKPOINT={src_path}: no model configuration (cfg.model / args); "
                         "allowed: a checkpoint written by fairseq-train")
    model_args = _get(*holders[0])
    arch = _get(model_args, "arch", _get(model_args, "_name"))
    if not (isinstance(arch, str) and arch.startswith("skipless")) and (
            _get(model_args, "skipless_layout", "none") or "none") == "none":
        raise ValueError(f"CHECKPOINT={src_path}: arch {arch!r} is not a skipless model; allowed: skipless_* "
                         "archs and models trained with --skipless-layout")
    filled = _with_arch_defaults(model_args)
    upgrade_state_dict(state["model"], tied=bool(_get(filled, "share_decoder_input_output_embed", False)))
    model_state, new_args, report = convert_state_dict(state["model"], filled, removed, max_condition)
    state["model"] = model_state
    for holder, name in holders:
        cfg = _get(holder, name)
        for key in ("removed_weights", "share_decoder_input_output_embed", "keep_attn_out_proj"):
            _set(cfg, key, _get(new_args, key))
    state.pop("last_optimizer_state", None)
    torch.save(state, dst_path)
    return report


def _with_arch_defaults(model_args):
    """Namespace copy of a stored model config with the skipless arch defaults filled in."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    if isinstance(model_args, dict):
        ns = argparse.Namespace(**model_args)
    else:
        ns = copy.deepcopy(model_args)
    arch = getattr(ns, "arch", None) or getattr(ns, "_name", None)
    ARCH_CONFIG_REGISTRY[arch](ns)
    return ns
