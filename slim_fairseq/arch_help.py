"""``slim-fairseq-help``: the options of an architecture, the values its preset sets, and what a
change of width (or any other option) yields; or the plugin's whole option table.

fairseq's ``--help`` exits before model options are added, so ``fairseq-train --arch X --help``
never lists them; this prints them for any registered arch.
"""
import argparse
import re
import sys

USAGE = """usage: slim-fairseq-help ARCH [--vocab V] [MODEL OPTIONS ...]
       slim-fairseq-help --options

ARCH            an architecture of the plugin (e.g. anthe_base, subformer_base, stlm_tied):
                prints the values its preset sets, with the model options given after it
                applied as fairseq-train would (e.g. --encoder-embed-dim 128 shows the widths
                a smaller subformer_base derives), the parameter count at a vocabulary of V
                types (--vocab, default 32000; a joined dictionary for translation models),
                then every option of its model.
--options       the plugin's option table (docs/DESIGN.md): flag, models, default, meaning.
-h, --help      this text."""


def _model_and_preset(arch):
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        known = sorted(a for a, m in ARCH_MODEL_REGISTRY.items()
                       if m.__module__.startswith("slim_fairseq"))
        raise SystemExit(f"slim-fairseq-help: error: --arch={arch}: not an architecture; allowed: "
                         + ", ".join(known))
    return ARCH_MODEL_REGISTRY[arch], ARCH_CONFIG_REGISTRY[arch]


def preset_values(arch, options=()):
    """The options of ``arch`` after its preset ran on the command-line ``options`` (a
    Namespace: what fairseq-train would build)."""
    model_cls, preset = _model_and_preset(arch)
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    try:
        args = parser.parse_args(list(options))
    except SystemExit:
        raise SystemExit(f"slim-fairseq-help: error: {' '.join(options)}: not options of "
                         f"{model_cls.__name__}; see slim-fairseq-help {arch}") from None
    args.arch = arch
    preset(args)
    return args


def parameter_count(arch, args, vocab):
    """Parameters of ``arch`` built from ``args`` on the meta device (nothing allocated) with a
    dictionary of ``vocab`` types."""
    import copy

    import torch
    from fairseq.data import Dictionary
    from fairseq.models import FairseqLanguageModel

    model_cls, _ = _model_and_preset(arch)
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    args = copy.deepcopy(args)
    if issubclass(model_cls, FairseqLanguageModel):
        args.tokens_per_sample = getattr(args, "max_target_positions", None) or 1024
    with torch.device("meta"):
        model = model_cls.build_model(args, task)
    return sum(p.numel() for p in model.parameters())


def describe(arch, options=(), vocab=32000):
    """Help text of ``arch``: the preset's values with ``options`` applied, the parameter count,
    and its model's options."""
    model_cls, _ = _model_and_preset(arch)
    args = preset_values(arch, options)
    given = f" with {' '.join(options)}" if options else ""
    lines = [f"arch {arch}: preset of model {model_cls.__name__} "
             f"({model_cls.__module__.split('.')[-1]})", "",
             f"preset values{given}:"]
    lines += [f"  --{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items())
              if k != "arch"]
    lines += ["", f"parameters at a vocabulary of {vocab:,} types: "
                  f"{parameter_count(arch, args, vocab):,}", ""]
    parser = argparse.ArgumentParser(prog=f"fairseq-train --user-dir slim_fairseq --arch {arch}",
                                     add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    return "\n".join(lines) + "\n" + parser.format_help()


def options_table():
    from slim_fairseq.models.slim_options import options_markdown
    return re.sub(r"docs/(TECHNIQUES\.md#[a-z0-9-]+)", r"[\1](\1)", options_markdown())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    # this module is part of the plugin: importing it registered the models already
    if argv == ["--options"]:
        print(options_table(), end="")
        return 0
    if argv[0].startswith("-"):
        raise SystemExit(f"slim-fairseq-help: error: {argv[0]}: not an architecture or --options; "
                         "see slim-fairseq-help --help")
    arch, rest, vocab = argv[0], argv[1:], 32000
    if "--vocab" in rest:
        i = rest.index("--vocab")
        vocab, rest = int(rest[i + 1]), rest[:i] + rest[i + 2:]
    print(describe(arch, rest, vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
