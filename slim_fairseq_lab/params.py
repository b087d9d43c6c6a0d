"""Parameter counts of any registered fairseq architecture, the plugin's included.

The model is built through fairseq's own machinery -- ``options.get_training_parser`` /
``parse_args_and_arch`` on a CLI-style argument list, then ``task.build_model`` -- with dummy
dictionaries of exactly the requested sizes (a fairseq ``Dictionary`` starts with 4 special
symbols, so V - 4 ordinary symbols are added); ``meta=True`` builds on the meta device (no memory
is allocated), so a 7B-parameter configuration counts in seconds.

Reported (:func:`summarize`): the total with every shared parameter counted once, the total
counting each use of a shared parameter, the groups of names that share one tensor, and a
per-component breakdown (embeddings, every encoder/decoder layer, output projection, the rest).
A shared tensor is attributed to the first component that names it. scripts/count_params.py is
the command line::

    from slim_fairseq_lab.params import count_params
    info = count_params("transformer", ["--share-all-embeddings"], vocab=32768, joined=True)
    info["total"]
"""

import argparse
import os
from collections import OrderedDict

from slim_fairseq_lab.paths import PLUGIN_DIR

NUM_RESERVED_SYMBOLS = 4  # <s>, <pad>, </s>, <unk>


def load_plugin(user_dir=PLUGIN_DIR):
    """Register the plugin's models exactly as ``--user-dir`` does (idempotent)."""
    from fairseq import utils

    if user_dir and os.path.exists(os.path.join(user_dir, "__init__.py")):
        utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(user_dir)))


def make_dictionary(size):
    """A fairseq Dictionary with exactly ``size`` entries (4 special symbols + size - 4 words)."""
    from fairseq.data import Dictionary

    if size < NUM_RESERVED_SYMBOLS + 1:
        raise ValueError(f"vocabulary size must be > {NUM_RESERVED_SYMBOLS} (fairseq's special symbols), got {size}")
    dictionary = Dictionary()
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    assert len(dictionary) == size
    return dictionary


def _default_task(arch):
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoderDecoderModel

    if arch not in ARCH_MODEL_REGISTRY:
        from slim_fairseq.option_errors import unknown_arch
        raise unknown_arch(arch)  # one line naming the closest architectures
    model_cls = ARCH_MODEL_REGISTRY[arch]
    return "translation" if issubclass(model_cls, FairseqEncoderDecoderModel) else "language_modeling"


def _adaptive_softmax(arch):
    """Whether ``arch``'s preset builds an adaptive softmax."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY
    preset = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](preset)
    return bool(getattr(preset, "adaptive_softmax_cutoff", None))


def build_model(arch, overrides=(), vocab=None, src_vocab=None, tgt_vocab=None, joined=False,
                task=None, meta=False):
    """Build ``arch`` with fairseq's parser and a task holding dummy dictionaries; return (model, args)."""
    import torch
    from fairseq import options

    load_plugin()
    task_name = task or _default_task(arch)
    overrides = [str(o) for o in overrides]
    if "--criterion" not in overrides and _adaptive_softmax(arch):
        overrides += ["--criterion", "adaptive_loss"]  # what fairseq trains it with
    parser = options.get_training_parser(default_task=task_name)
    args = options.parse_args_and_arch(
        parser, ["dummy-data", "--task", task_name, "--arch", arch] + overrides
    )
    if task_name == "translation":
        from fairseq.tasks.translation import TranslationTask

        src_size = src_vocab or vocab
        tgt_size = tgt_vocab or vocab
        if src_size is None or tgt_size is None:
            raise ValueError("--vocab (or --src-vocab and --tgt-vocab) is required for translation models")
        if joined:
            if src_size != tgt_size:
                raise ValueError(f"--joined needs equal --src-vocab and --tgt-vocab, got {src_size} and {tgt_size}")
            src_dict = tgt_dict = make_dictionary(src_size)
        else:
            src_dict, tgt_dict = make_dictionary(src_size), make_dictionary(tgt_size)
        args.source_lang, args.target_lang = "src", "tgt"
        fairseq_task = TranslationTask(args, src_dict, tgt_dict)
    elif task_name == "language_modeling":
        from fairseq.tasks.language_modeling import LanguageModelingTask

        size = vocab or tgt_vocab or src_vocab
        if size is None:
            raise ValueError("--vocab is required for language models")
        dictionary = make_dictionary(size)
        fairseq_task = LanguageModelingTask(args, dictionary, dictionary)
    else:
        raise ValueError(f"--task: only translation and language_modeling are supported, got {task_name!r}")
    if meta:
        with torch.device("meta"):
            model = fairseq_task.build_model(args)
    else:
        model = fairseq_task.build_model(args)
    return model, args


def _is_norm_module(module):
    return "norm" in type(module).__name__.lower()


def _component_of(name):
    """Component key of a parameter name: ``encoder.layers.3``, ``decoder.embed_tokens``, ..."""
    parts = name.split(".")[:-1]  # drop the tensor's own name ("weight", "bias", ...)
    if not parts:
        return "(model)"
    for i, part in enumerate(parts[:3]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def _category_of(component):
    lowered = component.lower()
    if "output_projection" in lowered or "adaptive_softmax" in lowered or lowered.endswith("output"):
        return "output"
    if "embed" in lowered or "safe" in lowered or "softpos" in lowered:
        return "embeddings"
    if any(part.isdigit() for part in component.split(".")):
        return "layers"
    return "other"


def summarize(model, exclude_norms_biases=False):
    """Parameter totals and breakdown of a built model (dict, JSON-serialisable).

    ``exclude_norms_biases`` counts weight matrices only (docs/TECHNIQUES.md#skipless-weight-counts): normalisation weights,
    biases and any other parameter with fewer than 2 dimensions (e.g. per-head scalars) are
    left out and their sum is reported as ``excluded_norms_biases``.
    """
    excluded_ids = set()
    if exclude_norms_biases:
        for module in model.modules():
            for tensor_name, tensor in module.named_parameters(recurse=False):
                if (tensor.dim() < 2 or tensor_name == "bias" or tensor_name.endswith("_bias")
                        or _is_norm_module(module)):
                    excluded_ids.add(id(tensor))

    names_by_tensor = OrderedDict()
    tensors = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        names_by_tensor.setdefault(id(tensor), []).append(name)
        tensors[id(tensor)] = tensor

    components = OrderedDict()
    total = total_with_repeats = trainable = excluded = 0
    shared = []
    for tensor_id, names in names_by_tensor.items():
        numel = tensors[tensor_id].numel()
        if tensor_id in excluded_ids:
            excluded += numel
            continue
        total += numel
        total_with_repeats += numel * len(names)
        if tensors[tensor_id].requires_grad:
            trainable += numel
        owner = _component_of(names[0])
        entry = components.setdefault(owner, {"params": 0, "params_incl_shared": 0})
        entry["params"] += numel
        for component in OrderedDict.fromkeys(_component_of(n) for n in names):
            entry = components.setdefault(component, {"params": 0, "params_incl_shared": 0})
            entry["params_incl_shared"] += numel
        if len(names) > 1:
            shared.append({"names": names, "numel": numel})

    categories = OrderedDict((c, 0) for c in ("embeddings", "layers", "output", "other"))
    groups = OrderedDict()
    for component, entry in components.items():
        entry["category"] = _category_of(component)
        categories[entry["category"]] += entry["params"]
        if entry["category"] == "layers":
            group = ".".join(p for p in component.split(".") if not p.isdigit())
            groups.setdefault(group, {"layers": 0, "params": 0})
            groups[group]["layers"] += 1
            groups[group]["params"] += entry["params"]
    return {
        "total": total,
        "total_counting_each_use": total_with_repeats,
        "trainable": trainable,
        "excluded_norms_biases": excluded if exclude_norms_biases else None,
        "by_category": categories,
        "layer_groups": groups,
        "components": components,
        "shared": shared,
    }


def count_params(arch, overrides=(), vocab=None, src_vocab=None, tgt_vocab=None, joined=False,
                 task=None, meta=False, exclude_norms_biases=False):
    """Build ``arch`` (with CLI-style ``overrides``) and return :func:`summarize`'s dict.

    ``vocab`` sets both dictionary sizes (or the LM's); ``joined=True`` uses one dictionary
    object for source and target (needed by ``--share-all-embeddings``); ``meta=True`` builds
    on the meta device without allocating memory.
    """
    model, args = build_model(arch, overrides, vocab, src_vocab, tgt_vocab, joined, task, meta)
    info = summarize(model, exclude_norms_biases)
    info.update({"arch": arch, "overrides": [str(o) for o in overrides], "task": args.task,
                 "vocab": {"src": src_vocab or vocab, "tgt": tgt_vocab or vocab, "joined": joined},
                 "meta": meta})
    return info


def format_report(info):
    lines = [f"arch {info['arch']} ({info['task']}), vocab {info['vocab']}"
             + (f", overrides {' '.join(info['overrides'])}" if info["overrides"] else "")]
    if info["excluded_norms_biases"] is not None:
        lines.append(f"excluding norm weights and biases ({info['excluded_norms_biases']:,} parameters)")
    lines.append(f"total parameters (shared counted once): {info['total']:,}")
    lines.append(f"total counting each use of shared ones: {info['total_counting_each_use']:,}")
    lines.append("by category:")
    for category, n in info["by_category"].items():
        lines.append(f"  {category:<12} {n:>16,}")
    if info["layer_groups"]:
        lines.append("layer groups:")
        for group, g in info["layer_groups"].items():
            lines.append(f"  {group:<40} {g['layers']:>3} layers {g['params']:>16,}")
    lines.append("components (params owned / incl. shared):")
    for component, entry in info["components"].items():
        lines.append(f"  {component:<40} {entry['params']:>16,} {entry['params_incl_shared']:>16,}")
    if info["shared"]:
        lines.append("shared tensors:")
        for group in info["shared"]:
            lines.append(f"  {group['numel']:>12,}  {' = '.join(group['names'])}")
    return "\n".join(lines)
