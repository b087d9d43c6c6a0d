"""Post-training Tensor-Chain compression of fairseq transformers, and dense export of TC models.

* :func:`compress_checkpoint`: a checkpoint of fairseq's own ``transformer`` (any of its
  archs, e.g. ``transformer_wmt_en_de``) or ``transformer_lm`` becomes a ``slim_transformer``
  / ``slim_lm`` checkpoint whose chosen linears are Tensor Chains. Each chain is the TT-SVD of
  the trained dense weight (Oseledets, "Tensor-Train Decomposition", SIAM J. Sci. Comput. 33(5),
  2011, Algorithm 1: sequential truncated SVDs) with the bond that ``--tc-ff/--tc-patt/...``
  give a freshly built layer, so the written model is exactly what ``--arch slim_transformer
  --tc-ff R ...`` builds and fairseq's tools load it with ``--user-dir``.
* :func:`export_dense_checkpoint`: every Tensor Chain of a ``slim_transformer`` / ``slim_lm``
  checkpoint (feed-forward, attention projections, token table, vocabulary projection) is
  materialised and the ``--tc-*`` options are set to 0, so the model rebuilds with plain
  ``nn.Linear`` / ``nn.Embedding``; with ``plain_fairseq`` a model without other techniques
  becomes fairseq's own ``transformer`` / ``transformer_lm`` again.

Both check what they write: with every chain off, the plugin's model must give the
checkpoint's outputs before a compression, and the export must give the Tensor-Chain model's
outputs (relative logit gap <= ``EQUAL_OUTPUTS``). slim_lm is always pre-norm, so a post-norm
``transformer_lm`` is refused.

Both write fairseq's checkpoint layout (``cfg`` with a legacy ``argparse.Namespace`` model
config, ``model``, ``optimizer_history``, ``extra_state``), loadable with torch's
``weights_only=True`` through :mod:`slim_fairseq.checkpoint_safety`. A compressed checkpoint
starts a new training run (epoch 1, 0 updates, no optimizer state): fine-tune it with
``fairseq-train --restore-file OUT --reset-optimizer`` and the flags :func:`model_flags` prints.
"""
import argparse
import copy

import torch

from slim_fairseq.models.slim_options import TC_PLACES, TC_SHAPE_DEFAULTS
from slim_fairseq.option_errors import OptionError

# fairseq model -> the plugin model with the same options and the same layer classes
SLIM_OF = {"transformer": "slim_transformer", "transformer_lm": "slim_lm"}


def _tc_classes():
    from slim_fairseq.modules.tensor_chain import TensorChainEmbedding, TensorChainLinear
    return TensorChainLinear, TensorChainEmbedding


def is_tensor_chain(module):
    return isinstance(module, _tc_classes())


# --------------------------------------------------------------------------- TT-SVD of one layer

@torch.no_grad()
def fill_from_dense(module, weight):
    """Set the cores of ``module`` (a :class:`TensorChainLinear` or :class:`TensorChainEmbedding`,
    whose factors and bond are already fixed) to the TT-SVD of ``weight`` -- ``nn.Linear`` layout
    ``[out, in]`` for a linear, the ``[V, d]`` table for an embedding -- truncated to the
    module's bond. Returns the relative Frobenius error ``||W - W_tc|| / ||W||`` (0 when the
    bond reaches every unfolding rank)."""
    from slim_fairseq.modules.tensor_chain import TensorChainLinear, materialise, tt_svd
    linear = isinstance(module, TensorChainLinear)
    matrix = (weight.t() if linear else weight).double()  # [N_a, N_c] as the chain stores it
    expected = (module.in_features, module.out_features) if linear else (
        module.num_embeddings, module.embedding_dim)
    if tuple(matrix.shape) != expected:
        raise OptionError(f"weight={tuple(weight.shape)}: does not fit a chain of "
                               f"{expected[0]}x{expected[1]}; allowed: the dense weight of the "
                               "layer the chain replaces")
    cores = tt_svd(matrix, module.in_factors, module.out_factors, module.bond)
    for param, core in zip(module.cores, cores):
        param.copy_(core.to(param.dtype))
    approx = materialise(cores)
    norm = matrix.norm().item()
    return (matrix - approx).norm().item() / norm if norm > 0 else 0.0


def _dense_key(slim_key):
    """State-dict key of fairseq's transformer for a key of the plugin's model: the plugin keeps
    the token table, the positions and the input projection (a table narrower than the model)
    inside its input embedding (``embed_tokens``)."""
    for side in ("encoder", "decoder"):
        for inner, outer in (("table", "embed_tokens"), ("embed_positions", "embed_positions"),
                             ("project_in_dim", "project_in_dim")):
            prefix = f"{side}.embed_tokens.{inner}."
            if slim_key.startswith(prefix):
                return f"{side}.{outer}." + slim_key[len(prefix):]
    return slim_key


@torch.no_grad()
def compress_model(dense_model, slim_model, log=None):
    """Copy a trained fairseq transformer into ``slim_model`` (built with the same options plus
    ``--tc-*``): dense tensors are copied, every Tensor Chain is the TT-SVD of the dense weight
    it replaces. Every tensor of both models must be accounted for (else an OptionError).
    Returns one record per chain: name, shape, bond, dense and chain parameters, relative error."""
    # tensors only: the record of the data a model keeps beside them is the slim model's own
    dense_state = {k: v for k, v in dense_model.state_dict().items() if torch.is_tensor(v)}
    slim_state = {k: v for k, v in slim_model.state_dict().items() if torch.is_tensor(v)}
    chains = {name: module for name, module in slim_model.named_modules() if is_tensor_chain(module)}
    filled, used, records = {}, set(), []
    for name, module in chains.items():
        weight_key = _dense_key(f"{name}.weight")
        if weight_key not in dense_state:
            raise OptionError(f"{name}: a Tensor Chain with no dense weight {weight_key} in "
                                   "the checkpoint; allowed: a checkpoint of the same model with "
                                   "the chain dense")
        weight = dense_state[weight_key]
        error = fill_from_dense(module, weight)
        used.add(weight_key)
        for i, core in enumerate(module.cores):
            filled[f"{name}.cores.{i}"] = core.detach().clone()
        tc_params = sum(core.numel() for core in module.cores)
        records.append(dict(name=name, shape=tuple(weight.shape), bond=module.bond,
                            dense_params=weight.numel(), tc_params=tc_params, rel_error=error))
        if log:
            log(f"{name}: {tuple(weight.shape)} -> bond {module.bond}, "
                f"{weight.numel():,} -> {tc_params:,} weights, relative error {error:.4f}")
    for key in slim_state:
        if key in filled:
            continue
        dense_key = _dense_key(key)
        if dense_key not in dense_state:
            raise OptionError(f"{key}: in the compressed model, and the checkpoint has no "
                                   f"{dense_key}; allowed: a checkpoint of the same model")
        if dense_state[dense_key].shape != slim_state[key].shape:
            raise OptionError(f"{dense_key}={tuple(dense_state[dense_key].shape)}: a shape "
                                   f"the compressed model does not take; allowed: "
                                   f"{tuple(slim_state[key].shape)}")
        filled[key] = dense_state[dense_key]
        used.add(dense_key)
    unused = [key for key in dense_state if key not in used]
    if unused:
        raise OptionError(f"{', '.join(unused[:5])}: checkpoint tensors with no place in "
                               "the compressed model; allowed: a checkpoint of the same model")
    slim_model.load_state_dict(filled, strict=True)
    return records


# ------------------------------------------------------------------------- checkpoint plumbing

def _load_state(path, data=None):
    """fairseq's checkpoint loader (upgrades old layouts, weights-only unpickling)."""
    import os
    from fairseq import checkpoint_utils
    if not os.path.isfile(path):
        raise OptionError(f"CHECKPOINT={path}: does not exist; allowed: a checkpoint file")
    overrides = {"data": data} if data else None
    return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=overrides)


def _model_cfg(state):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        cfg = convert_namespace_to_omegaconf(state["args"])
    if cfg is None or cfg.get("model") is None:
        raise OptionError("CHECKPOINT: has no model configuration (cfg.model / args); "
                               "allowed: a checkpoint written by fairseq-train")
    return cfg


def _namespace(model_cfg):
    """A copy of a model config as the ``argparse.Namespace`` the plugin's (legacy) models
    take; fairseq's dataclass models (``transformer_lm``) store a dict-like config."""
    if isinstance(model_cfg, argparse.Namespace):
        return copy.deepcopy(model_cfg)
    from omegaconf import OmegaConf
    values = (OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True)
              if OmegaConf.is_config(model_cfg) else dict(model_cfg))
    return argparse.Namespace(**values)


def _arch_of(model_cfg):
    return getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)


def _model_name(arch):
    """Registered fairseq model name of ``arch`` (e.g. transformer_wmt_en_de -> transformer)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    cls = ARCH_MODEL_REGISTRY.get(arch)
    if cls is None:
        return None
    return next((name for name, registered in MODEL_REGISTRY.items() if registered is cls), None)


def load_checkpoint(path, data=None):
    """``(cfg, state)`` of a fairseq checkpoint read the way fairseq reads it (old layouts
    upgraded, weights-only unpickling); ``data`` overrides its data directory."""
    state = _load_state(path, data)
    return _model_cfg(state), state


def build_checkpoint_model(cfg, state, data_name="--data"):
    """:func:`_build_task_and_model` of a checkpoint, a missing dictionary as a one-line error
    naming the data-bin as the command takes it (``data_name``: ``--data``, or ``DATA`` for a
    command that takes it as an argument)."""
    try:
        return _build_task_and_model(cfg, state)
    except FileNotFoundError as exc:
        given = f"{data_name} DIR" if data_name.startswith("--") else data_name
        raise OptionError(f"{data_name}: {_one_line(exc)}; allowed: {given}, the data-bin "
                               "with the model's dictionaries")


def _build_task_and_model(cfg, state, model_cfg=None):
    """(task, model) the way fairseq's own loader builds them, with the checkpoint's weights
    loaded strictly when ``model_cfg`` is None (else an untrained model of ``model_cfg``)."""
    from fairseq import tasks
    task = tasks.setup_task(cfg.task, from_checkpoint=True)
    if "task_state" in state:
        task.load_state_dict(state["task_state"])
    if model_cfg is None:
        model = task.build_model(cfg.model, from_checkpoint=True)
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    else:
        model = task.build_model(model_cfg, from_checkpoint=True)
    return task, model.eval()


@torch.no_grad()
def output_gap(model_a, model_b, vocab, seed=0):
    """Largest difference of the two models' logits on a random batch (no padding), relative
    to the largest logit of ``model_a``; both models in eval mode."""
    from fairseq.models import FairseqEncoderDecoderModel
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (2, 7), generator=generator)
    if isinstance(model_a, FairseqEncoderDecoderModel):
        prev = torch.randint(4, vocab, (2, 5), generator=generator)
        prev[:, 0] = 2
        run = lambda model: model(tokens, torch.full((2,), 7), prev)[0]  # noqa: E731
    else:
        run = lambda model: model(tokens)[0]  # noqa: E731
    a, b = run(model_a), run(model_b)
    return ((a - b).abs().max() / a.abs().max().clamp_min(1e-12)).item()


# relative logit difference accepted as "equal up to float32 rounding"
EQUAL_OUTPUTS = 1e-4


def _one_line(exc):
    return " ".join(str(exc).split()) or type(exc).__name__


def write_checkpoint(path, cfg, model_cfg, model, state):
    """Write ``model`` in fairseq's checkpoint layout, as a new training run: the config of
    ``cfg`` with ``model_cfg`` as its model section, no optimizer state, 0 updates, epoch 1
    (so ``fairseq-train --restore-file`` starts a fine-tune rather than resuming)."""
    from omegaconf import OmegaConf
    from fairseq import checkpoint_utils
    container = (OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
                 if OmegaConf.is_config(cfg) else dict(cfg))
    container["model"] = model_cfg
    last = (state.get("optimizer_history") or [{}])[-1]
    out = {
        "args": None,
        "cfg": container,
        "model": model.state_dict(),
        "optimizer_history": [{
            "criterion_name": last.get("criterion_name", "CrossEntropyCriterion"),
            "optimizer_name": last.get("optimizer_name", "FairseqAdam"),
            "lr_scheduler_state": {},
            "num_updates": 0,
        }],
        "task_state": state.get("task_state", {}),
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}},
        "last_optimizer_state": None,
    }
    checkpoint_utils.torch_persistent_save(out, path)
    return out


def model_flags(model_cfg, model_name):
    """fairseq-train flags that rebuild ``model_cfg`` with ``--arch <model_name>``: the model
    options whose value differs from what the arch function derives from the flags already
    chosen (so ``--decoder-output-dim`` is left out when it follows ``--decoder-embed-dim``),
    e.g. for fine-tuning a compressed checkpoint."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_REGISTRY
    from fairseq.models.transformer import (DEFAULT_MAX_SOURCE_POSITIONS,
                                            DEFAULT_MAX_TARGET_POSITIONS, DEFAULT_MIN_PARAMS_TO_WRAP)
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS, add_help=False)
    MODEL_REGISTRY[model_name].add_args(parser)
    with_defaults = argparse.ArgumentParser(add_help=False)
    MODEL_REGISTRY[model_name].add_args(with_defaults)
    fallback = vars(with_defaults.parse_args([]))
    if model_name == "slim_lm":  # its parser has no defaults; they live in fairseq's dataclass
        import dataclasses
        from fairseq.models.transformer_lm import TransformerLanguageModelConfig
        lm_defaults = TransformerLanguageModelConfig()
        for field in dataclasses.fields(lm_defaults):
            if fallback.get(field.name) is None:
                fallback[field.name] = getattr(lm_defaults, field.name)
    fallback.update(max_source_positions=DEFAULT_MAX_SOURCE_POSITIONS,  # set by build_model
                    max_target_positions=DEFAULT_MAX_TARGET_POSITIONS,
                    min_params_to_wrap=DEFAULT_MIN_PARAMS_TO_WRAP)
    actions = [a for a in parser._actions if a.option_strings]

    def same(a, b):
        return a == b or (a is not None and b is not None and str(a) == str(b))

    def derived(chosen):
        args = argparse.Namespace(**chosen)
        ARCH_CONFIG_REGISTRY[model_name](args)  # what --arch sets given the chosen flags
        for key, value in fallback.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        return args

    def differing(defaults):
        return {a.dest: getattr(model_cfg, a.dest) for a in actions
                if getattr(model_cfg, a.dest, None) is not None
                and not same(getattr(model_cfg, a.dest), getattr(defaults, a.dest, None))}

    def derivable(rest):
        try:
            return not differing(derived(rest)).keys() - rest.keys()
        except (ValueError, SystemExit):  # the arch refuses ``rest`` alone (e.g. --glu-hidden without --ffn-glu)
            return False

    chosen = differing(derived({}))
    for key in reversed(list(chosen)):  # drop what the arch derives from the other chosen flags
        rest = {k: v for k, v in chosen.items() if k != key}
        if derivable(rest):
            chosen = rest
    flags = ["--arch", model_name]
    for action in actions:
        if action.dest not in chosen:
            continue
        value, flag = chosen[action.dest], action.option_strings[-1]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags += [action.option_strings[0] if value else action.option_strings[1]]
        elif isinstance(action, argparse._StoreTrueAction):
            flags += [action.option_strings[0]] if value else []
        elif isinstance(action, argparse._StoreFalseAction):
            flags += [] if value else [flag]
        else:
            if isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            flags += [flag, str(value)]
    return flags


def check_output(path, out, force=False):
    """A checkpoint written from another never replaces it: the input, with its optimizer state
    and its update count, would be lost. Nor does it replace any other existing file unless
    ``force`` says to (the command's ``--force``)."""
    import os
    if os.path.realpath(path) == os.path.realpath(out) or (
            os.path.exists(path) and os.path.exists(out) and os.path.samefile(path, out)):
        raise OptionError(f"OUTPUT={out}: is the checkpoint it reads ({path}), which writing would "
                               "overwrite; allowed: another file")
    if os.path.isdir(out):
        raise OptionError(f"OUTPUT={out}: is a folder; allowed: a file name")
    if os.path.lexists(out) and not force:
        raise OptionError(f"OUTPUT={out}: exists; allowed: --force to replace it, or another file")


# ----------------------------------------------------------------------------------- compress

def compress_checkpoint(path, out, tc_ff=0.0, tc_patt=0.0, tc_layer=0.0, tc_emb=0.0,
                        tc_output=0.0, tc_length=2, data=None, log=None, force=False):
    """Compress a fairseq ``transformer`` / ``transformer_lm`` checkpoint (TT-SVD, see the
    module docstring). ``data`` overrides the checkpoint's data directory (only its
    dictionaries are read; an existing ``out`` is refused unless ``force``). Returns
    ``(records, flags)``: one record per chain (see :func:`compress_model`) and the fairseq-train
    model flags that rebuild the model."""
    from slim_fairseq.models.slim_options import (BY_DEST, check_value, set_slim_defaults,
                                                  validate_slim_args)
    check_output(path, out, force)
    ratios = dict(tc_ff=tc_ff, tc_patt=tc_patt, tc_layer=tc_layer, tc_emb=tc_emb, tc_output=tc_output)
    for dest, value in dict(ratios, tc_length=tc_length).items():  # each value's own rule
        check_value(BY_DEST[dest], value)
    if not any(ratios.values()):
        raise OptionError("--tc-*: nothing to compress; allowed: at least one of --tc-ff, "
                               "--tc-patt, --tc-layer, --tc-emb, --tc-output above 0")
    cfg, state = load_checkpoint(path, data)
    arch = _arch_of(cfg.model)
    model_name = _model_name(arch)
    if model_name not in SLIM_OF:
        raise OptionError(
            f"CHECKPOINT={path}: a checkpoint of arch {arch!r} (model {model_name or 'unknown'}); "
            f"allowed: fairseq's {' or '.join(SLIM_OF)} models "
            "(e.g. transformer, transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big)")
    if model_name == "transformer_lm" and not getattr(cfg.model, "decoder_normalize_before", False):
        raise OptionError(
            f"CHECKPOINT={path}: a post-norm transformer_lm (decoder_normalize_before False), "
            "and slim_lm is always pre-norm (fairseq's base_lm_architecture sets "
            "--decoder-normalize-before); allowed: a transformer_lm trained with "
            "--decoder-normalize-before")
    if log:
        log(f"loading {path} (arch {arch})")
    task, dense = build_checkpoint_model(cfg, state)
    slim_name = SLIM_OF[model_name]
    slim_cfg = _namespace(cfg.model)
    slim_cfg.arch = slim_cfg._name = slim_name
    set_slim_defaults(slim_cfg)
    for place, ratio in ratios.items():
        setattr(slim_cfg, place, float(ratio))
    slim_cfg.tc_length = int(tc_length)
    try:
        validate_slim_args(slim_cfg, slim_name)
        _, slim = _build_task_and_model(cfg, state, model_cfg=copy.deepcopy(slim_cfg))
        # the plugin's model with every chain off must be exactly the checkpoint's model
        same_cfg = without_tensor_chains(copy.deepcopy(slim_cfg))
        _, same = _build_task_and_model(cfg, state, model_cfg=same_cfg)
    except OptionError:  # already one line: --flag=value: problem; allowed: ...
        raise
    except ValueError as exc:
        raise OptionError(f"--tc-*: {_one_line(exc)}; allowed: other --tc-* ratios") from None
    try:
        compress_model(dense, same)
    except OptionError as exc:
        raise OptionError(f"CHECKPOINT={path}: {slim_name} built from its options differs "
                               f"from its model ({exc}); allowed: {' or '.join(SLIM_OF)} "
                               "checkpoints of the options compress_checkpoint supports")
    vocab = len(task.source_dictionary)
    gap = output_gap(dense, same.eval(), vocab)
    if gap > EQUAL_OUTPUTS:
        raise OptionError(
            f"CHECKPOINT={path}: {slim_name} built from its options does not reproduce its model "
            f"(relative logit gap {gap:.2e}); allowed: {arch} checkpoints of the option "
            "combinations compress_checkpoint supports")
    del same
    records = compress_model(dense, slim, log=log)
    if not records:
        raise OptionError("--tc-*: the places chosen hold no layer of this model; "
                               "allowed: --tc-ff, --tc-patt, --tc-layer, --tc-emb or --tc-output "
                               "of a place the model has")
    write_checkpoint(out, cfg, slim_cfg, slim, state)
    before = sum(p.numel() for p in dense.parameters())
    after = sum(p.numel() for p in slim.parameters())
    if log:
        log(f"wrote {out}: {slim_name}, {before:,} -> {after:,} parameters "
            f"({after / before:.1%}), {len(records)} Tensor Chains, mean relative error "
            f"{sum(r['rel_error'] for r in records) / len(records):.4f}")
    return records, model_flags(slim_cfg, slim_name)


# -------------------------------------------------------------------------------- dense export

@torch.no_grad()
def dense_state_dict(model):
    """State dict of ``model`` with every Tensor Chain replaced by the tensors of its dense
    counterpart: ``weight`` (+ ``bias``) of an ``nn.Linear`` for a TensorChainLinear, the
    materialised table (padding row zero) for a TensorChainEmbedding."""
    TensorChainLinear, TensorChainEmbedding = _tc_classes()
    state = model.state_dict()
    for name, module in model.named_modules():
        if not is_tensor_chain(module):
            continue
        for i in range(len(module.cores)):
            state.pop(f"{name}.cores.{i}", None)
        if isinstance(module, TensorChainLinear):
            state[f"{name}.weight"] = module.to_dense().weight.detach().clone()
        else:
            state[f"{name}.weight"] = module.weight.detach().clone()
    return state


def without_tensor_chains(model_cfg):
    """``model_cfg`` with every ``--tc-*`` ratio 0 and the options that only shape a chain
    (``--tc-length``, ``--tc-min-bond``, ``--tc-backward``) at their defaults, which the option
    checks require once no chain is left."""
    for place in TC_PLACES:
        setattr(model_cfg, place, 0.0)
    for key, default in TC_SHAPE_DEFAULTS:
        if hasattr(model_cfg, key):
            setattr(model_cfg, key, default)
    return model_cfg


def other_techniques(model_cfg):
    """Flags of every plugin technique except Tensor Chains that ``model_cfg`` switches on
    (empty: the dense export is exactly fairseq's transformer / transformer_lm)."""
    from slim_fairseq.models.slim_options import set_slim_defaults
    defaults = argparse.Namespace()
    set_slim_defaults(defaults)
    # the chains and the options that only shape them go with the export; inits: init only
    skip = {*TC_PLACES, *dict(TC_SHAPE_DEFAULTS), "ffn_lora_alpha", "bert_init", "init_std"}
    return ["--" + key.replace("_", "-") for key, default in vars(defaults).items()
            if key not in skip and getattr(model_cfg, key, default) not in (default, None)]


def _plain_fairseq(cfg, state, dense_cfg, dense, model_name):
    """(config, model) of fairseq's own model holding the tensors of the dense export."""
    from slim_fairseq.models.slim_options import set_slim_defaults
    plugin_only = argparse.Namespace()
    set_slim_defaults(plugin_only)
    plain_name = next(name for name, slim in SLIM_OF.items() if slim == model_name)
    plain_cfg = argparse.Namespace(**{k: v for k, v in vars(dense_cfg).items()
                                      if not hasattr(plugin_only, k)})
    plain_cfg.arch = plain_cfg._name = plain_name
    _, plain = _build_task_and_model(cfg, state, model_cfg=copy.deepcopy(plain_cfg))
    try:
        plain.load_state_dict({_dense_key(k): v for k, v in dense.state_dict().items()
                               if torch.is_tensor(v)}, strict=True)
    except RuntimeError as exc:
        raise OptionError(f"--plain-fairseq: fairseq's {plain_name} does not take the "
                               f"exported tensors ({_one_line(exc)[:300]}); allowed: the export "
                               "without --plain-fairseq")
    return plain_cfg, plain.eval()


def densify(cfg, state, model):
    """``(model config, model)``: the dense counterpart of ``model`` (built from checkpoint
    ``state`` with config ``cfg``), every Tensor Chain materialised and every ``--tc-*`` 0, in
    eval mode. Its outputs are the chains' up to float rounding (the callers check them)."""
    dense_cfg = without_tensor_chains(_namespace(cfg.model))
    _, dense = _build_task_and_model(cfg, state, model_cfg=copy.deepcopy(dense_cfg))
    try:
        dense.load_state_dict(dense_state_dict(model), strict=True)
    except RuntimeError as exc:
        raise OptionError(f"CHECKPOINT: the dense model does not take the exported tensors "
                               f"({_one_line(exc)[:300]}); allowed: none (a defect of the plugin: "
                               "report it with the command)")
    left = [name for name, module in dense.named_modules() if is_tensor_chain(module)]
    if left:
        raise OptionError(f"{', '.join(left[:5])}: Tensor Chains left after the export; "
                               "allowed: none (a defect of the plugin: report it with the command)")
    return dense_cfg, dense.eval()


def export_dense_checkpoint(path, out, data=None, plain_fairseq=False, log=None, force=False):
    """Materialise every Tensor Chain of a plugin checkpoint and set its ``--tc-*`` options to 0
    (see the module docstring). ``plain_fairseq``: write fairseq's own ``transformer`` /
    ``transformer_lm`` instead (refused when the model uses another technique of the plugin),
    which fairseq loads without ``--user-dir``. Returns ``(model, exported_model)``, both in
    eval mode."""
    check_output(path, out, force)
    cfg, state = load_checkpoint(path, data)
    arch = _arch_of(cfg.model)
    model_name = _model_name(arch)
    if model_name not in SLIM_OF.values():
        raise OptionError(
            f"CHECKPOINT={path}: a checkpoint of arch {arch!r} (model {model_name or 'unknown'}); "
            f"allowed: {' or '.join(SLIM_OF.values())} checkpoints (any arch of them)")
    if plain_fairseq and other_techniques(cfg.model):
        raise OptionError("--plain-fairseq: needs a model that uses no other technique of "
                               f"the plugin, and this one sets {', '.join(other_techniques(cfg.model))}; "
                               "allowed: the export without --plain-fairseq")
    places = [p for p in TC_PLACES if getattr(cfg.model, p, 0.0)]
    if log:
        log(f"loading {path} (arch {arch}, Tensor Chains: {', '.join(places) or 'none'})")
    task, model = build_checkpoint_model(cfg, state)
    dense_cfg, dense = densify(cfg, state, model)
    if plain_fairseq:
        dense_cfg, dense = _plain_fairseq(cfg, state, dense_cfg, dense, model_name)
    gap = output_gap(model, dense.eval(), len(task.source_dictionary))
    if gap > EQUAL_OUTPUTS:
        raise OptionError(f"CHECKPOINT={path}: the exported model's outputs differ from its "
                               f"(relative logit gap {gap:.2e}), nothing written; allowed: none "
                               "(a defect of the plugin: report it with the command)")
    write_checkpoint(out, cfg, dense_cfg, dense, state)
    if log:
        before = sum(p.numel() for p in model.parameters())
        after = sum(p.numel() for p in dense.parameters())
        log(f"wrote {out}: {dense_cfg.arch}" + ("" if plain_fairseq else " with every --tc-* 0")
            + f", {before:,} -> {after:,} parameters")
    return model, dense
