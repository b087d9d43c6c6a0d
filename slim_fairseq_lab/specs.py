"""Model specs of the study and the benchmark: ``[LABEL=]ARCH [fairseq overrides...]``, built
through fairseq's own parser with the plugin loaded as ``--user-dir`` loads it.

fairseq is imported inside the functions, so that the command-line tools answer ``--help``
and the shell launcher runs without importing it.
"""
import argparse
import re
import shlex

from slim_fairseq_lab.paths import PLUGIN_DIR


def load_plugin():
    """Register the plugin exactly as ``--user-dir`` does."""
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=PLUGIN_DIR))


def parse_model_spec(spec):
    """``"[LABEL=]ARCH [overrides...]"`` -> (label, arch, overrides)."""
    tokens = shlex.split(spec)
    if not tokens:
        raise ValueError("--model: empty spec; expected '[LABEL=]ARCH [overrides...]'")
    head = tokens[0]
    label, arch = head.split("=", 1) if "=" in head else (None, head)
    overrides = tokens[1:]
    if label is None:
        label = " ".join([arch] + overrides)
    return label, arch, overrides


def model_class(arch):
    from fairseq.models import ARCH_MODEL_REGISTRY
    if arch not in ARCH_MODEL_REGISTRY:
        raise ValueError(f"--model: unknown architecture {arch!r}")
    return ARCH_MODEL_REGISTRY[arch]


def is_language_model(arch):
    from fairseq.models import FairseqLanguageModel
    return issubclass(model_class(arch), FairseqLanguageModel)


def accepted_flags(arch):
    """Option strings the model class of ``arch`` understands."""
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_class(arch).add_args(parser)
    return set(parser._option_string_actions)


def shape_overrides(arch, lm, dim, layers, heads, ffn):
    """Shape flags for ``arch`` (encoder and decoder for translation models)."""
    flags = accepted_flags(arch)
    out = []
    for side in (("decoder",) if lm else ("encoder", "decoder")):
        for name, value in (("embed-dim", dim), ("layers", layers), ("attention-heads", heads),
                            ("ffn-embed-dim", ffn)):
            flag = f"--{side}-{name}"
            if flag in flags:
                out += [flag, str(value)]
    for flag in ("--decoder-input-dim", "--decoder-output-dim"):
        if lm and flag in flags:
            out += [flag, str(dim)]
    return out


def expand_width(overrides, dim):
    """Width templates in a spec's overrides: ``{d}``, ``{2d}``, ``{d/2}`` (k d / m, an integer)
    become numbers for the run's width, so one spec serves a size sweep (e.g.
    ``--sandwich-dim {2d}``)."""
    def value(match):
        k, m = int(match.group(1) or 1), int(match.group(2) or 1)
        if (k * dim) % m:
            raise ValueError(f"width template {match.group(0)} is not an integer for d={dim}")
        return str(k * dim // m)
    return [re.sub(r"\{(\d*)d(?:/(\d+))?\}", value, token) for token in overrides]


def parse_fairseq_args(argv):
    """fairseq-train's parsed arguments for the command line ``argv`` (without the program)."""
    from fairseq import options
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)
