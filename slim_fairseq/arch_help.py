"""``slim-fairseq-help``: the options of an architecture, the values its preset sets, and what a
change of width (or any other option) yields; or the plugin's whole option table.

fairseq's ``--help`` exits before model options are added, so ``fairseq-train --arch X --help``
never lists them; this prints them for any registered arch.
"""
import argparse
import re
import sys

from slim_fairseq.option_errors import INTERRUPTED, REFUSED, OptionError, unknown_arch

USAGE = """usage: slim-fairseq-help ARCH [--vocab V] [MODEL OPTIONS ...]
       slim-fairseq-help --options
       slim-fairseq-help --archs

ARCH            an architecture of the plugin (e.g. anthe_base, subformer_base, stlm_tied):
                prints the values its preset sets, with the model options given after it
                applied as fairseq-train would (e.g. --encoder-embed-dim 128 shows the widths
                a smaller subformer_base derives), the parameter count at a vocabulary of V
                types (--vocab, default 32000, or WikiText-103's 267744 with adaptive input or
                softmax; a joined dictionary for translation models), then every option of
                its model.
--options       the plugin's option table (docs/DESIGN.md): flag, models, default, meaning.
--archs         every architecture, by model (the plugin's first, then fairseq's own).
-h, --help      this text."""


def _model_and_preset(arch):
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        raise unknown_arch(arch)
    return ARCH_MODEL_REGISTRY[arch], ARCH_CONFIG_REGISTRY[arch]


def architectures():
    """Every architecture fairseq knows with the plugin loaded, by model: the plugin's first."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    by_model = {}
    for arch, model in sorted(ARCH_MODEL_REGISTRY.items()):
        by_model.setdefault((not model.__module__.startswith("slim_fairseq"), model.__name__), []).append(arch)
    return "\n".join(f"{name}: {', '.join(archs)}" for (_, name), archs in sorted(by_model.items()))


def preset_values(arch, options=()):
    """The options of ``arch`` after its preset ran on the command-line ``options`` (a
    Namespace: what fairseq-train would build)."""
    model_cls, preset = _model_and_preset(arch)
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS,
                                     exit_on_error=False)
    model_cls.add_args(parser)
    try:
        args, unknown = parser.parse_known_args(list(options))
    except argparse.ArgumentError as error:
        raise OptionError(f"{error.argument_name}: {error.message}; "
                          f"allowed: see slim-fairseq-help {arch}") from None
    if unknown:
        raise OptionError(f"{' '.join(unknown)}: not options of "
                          f"{model_cls.__name__}; allowed: see slim-fairseq-help {arch}")
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


# the vocabulary a parameter count assumes: 32,000 types, or WikiText-103's 267,744 for a model
# with adaptive input or softmax (its presets' cutoffs are 20000,60000)
DEFAULT_VOCAB, WIKITEXT103_VOCAB = 32000, 267744


def describe(arch, options=(), vocab=None):
    """Help text of ``arch``: the preset's values with ``options`` applied, the parameter count
    at ``vocab`` types (default: :data:`DEFAULT_VOCAB`, or WikiText-103's with adaptive
    cutoffs), and its model's options."""
    model_cls, _ = _model_and_preset(arch)
    args = preset_values(arch, options)
    if vocab is None:
        adaptive = getattr(args, "adaptive_softmax_cutoff", None) or getattr(args, "adaptive_input", False)
        vocab = WIKITEXT103_VOCAB if adaptive else DEFAULT_VOCAB
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
    """The command: a refusal is one line and exit status 2, Ctrl-C one line and 130."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except OptionError as error:
        print(f"slim-fairseq-help: error: {error}", file=sys.stderr, flush=True)
        return REFUSED
    except KeyboardInterrupt:
        print("slim-fairseq-help: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED


def _main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    # this module is part of the plugin: importing it registered the models already
    if argv == ["--options"]:
        print(options_table(), end="")
        return 0
    if argv == ["--archs"]:
        print(architectures())
        return 0
    if argv[0].startswith("-"):
        raise OptionError(f"{argv[0]}: not an architecture, --options or "
                          "--archs; allowed: see slim-fairseq-help --help")
    arch, rest, vocab = argv[0], argv[1:], None
    if "--vocab" in rest:
        i = rest.index("--vocab")
        given = rest[i + 1] if i + 1 < len(rest) else ""
        if not given.isdigit() or int(given) < 4:
            raise OptionError(f"--vocab={given}: not a whole number; "
                              "allowed: a dictionary size of 4 or more (fairseq's 4 special "
                              "symbols included)")
        vocab, rest = int(given), rest[:i] + rest[i + 2:]
    print(describe(arch, rest, vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
