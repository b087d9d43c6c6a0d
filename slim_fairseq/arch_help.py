"""``slim-fairseq-help ARCH``: the options of an architecture and the values its preset sets.

fairseq's ``--help`` exits before model options are added, so ``fairseq-train --arch X --help``
never lists them; this prints them (with the preset's defaults) for any registered arch.
"""
import argparse
import sys


def describe(arch):
    """Help text of ``arch``: its model's options and the defaults the preset fills in."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        known = sorted(a for a, m in ARCH_MODEL_REGISTRY.items()
                       if m.__module__.startswith("slim_fairseq"))
        raise SystemExit(f"slim-fairseq-help: unknown --arch {arch!r}; plugin archs: {', '.join(known)}")
    model_cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(prog=f"fairseq-train --user-dir slim_fairseq --arch {arch}",
                                     add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    preset = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](preset)
    lines = [f"arch {arch}: preset of model {model_cls.__name__} "
             f"({model_cls.__module__.split('.')[-1]})", "", "preset values:"]
    lines += [f"  --{k.replace('_', '-')} {v}" for k, v in sorted(vars(preset).items())]
    return "\n".join(lines) + "\n\n" + parser.format_help()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        raise SystemExit("usage: slim-fairseq-help ARCH")
    from fairseq import utils
    import slim_fairseq
    utils.import_user_module(argparse.Namespace(user_dir=slim_fairseq.user_dir()))
    print(describe(argv[0]))


if __name__ == "__main__":
    main()
