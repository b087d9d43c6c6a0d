#!/usr/bin/env python3
"""Time of one incremental decoding step of every family against fairseq's model of the same
shape, on the CPU at width 64 and batch 1 (a step bound by Python and op dispatch: the proxy for
a small model's generation on a GPU), the models interleaved and each step's median reported.

    OMP_NUM_THREADS=1 python scripts/decode_step_overhead.py [--rounds 20] [--model ARCH ...]
    OMP_NUM_THREADS=1 python scripts/decode_step_overhead.py --split [--rounds 20]
    OMP_NUM_THREADS=1 python scripts/decode_step_overhead.py --by-part [--rounds 10]

prints a markdown table (µs per step, ratio against transformer_lm or transformer); with
--split, also the time inside torch's functions and the Python around them, each with its
ratio; with --by-part, where a step's time goes (embedding, attentions, feed-forward, norms,
the layers' own code, output projection, the rest), each model after the other. The library is
slim_fairseq_lab.benchmark.decode_overhead; docs/GPU.md holds a run's tables.
"""
import argparse

from slim_fairseq_lab.benchmark import decode_overhead, op_count


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="ARCH",
                   help="a plugin architecture (repeatable); default: one of every family")
    p.add_argument("--rounds", type=int, default=20,
                   help="interleaved rounds; each decodes --steps tokens per model (default 20)")
    p.add_argument("--by-part", action="store_true",
                   help="time each part of a step (the modules' calls) instead of whole steps")
    p.add_argument("--split", action="store_true",
                   help="also split each step into the time inside torch's functions (its "
                        "recorded calls, replayed) and the Python around them")
    shape = decode_overhead.SHAPE
    for name in ("dim", "layers", "heads", "ffn"):
        p.add_argument("--" + name, type=int, default=getattr(shape, name),
                       help=f"default {getattr(shape, name)}")
    p.add_argument("--steps", type=int, default=shape.decode_steps,
                   help=f"tokens decoded per model per round (default {shape.decode_steps})")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    from slim_fairseq_lab import contract, specs
    from slim_fairseq_lab.gpu_check import prepare_data, task_argv
    if args.rounds < 1 or args.steps < 1:
        raise SystemExit(f"decode_step_overhead.py: --rounds={args.rounds}, --steps={args.steps}: "
                         "nothing to time; allowed: both >= 1")
    if args.split and args.by_part:
        raise SystemExit("decode_step_overhead.py: --split with --by-part: --split splits whole "
                         "steps, --by-part times parts; allowed: one of them")
    archs = args.model or list(op_count.FAMILIES)
    known = contract.plugin_archs()
    unknown = [a for a in archs if a not in known]
    if unknown:
        raise SystemExit(f"decode_step_overhead.py: --model={unknown[0]}: not a plugin "
                         "architecture; allowed: " + ", ".join(sorted(known)))
    models = {arch: specs.is_language_model(arch) for arch in archs}
    shape = op_count.OpShape(args.dim, args.layers, args.heads, args.ffn, 1, args.steps, args.steps)
    data = prepare_data()

    def build(arch, overrides, lm):
        return contract.build(arch, overrides, task_argv(lm, data))

    if args.by_part:
        result = decode_overhead.part_times(build, models, shape, rounds=args.rounds)
        print(decode_overhead.parts_markdown(result))
        return result
    result = decode_overhead.step_times(build, models, shape, rounds=args.rounds, split=args.split)
    print(decode_overhead.markdown(result))
    return result


if __name__ == "__main__":
    main()
