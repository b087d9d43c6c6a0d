#!/usr/bin/env python3
"""CPU training time with glibc's default malloc settings and with large blocks kept in the heap
(the settings every tool the lab and the recipes start gets, slim_fairseq_lab.launcher.ALLOCATOR_ENV),
side by side, for fairseq's transformer and the given model
specs (docs/TRAINING.md#cpu-memory-allocator).

Each model trains the same --max-update updates twice per --repeats (alternating the two
settings, so a drift of the machine hits both alike) with scripts/quality.py's training settings
and shape options (--dim, --layers, --max-tokens, --lr, ...; the first width, rate and seed).
Printed per model: fairseq's own training time ("done training in"), the share of the CPU time
spent in the kernel, the speed-up, and whether both settings reached the same valid loss (they
should: only where memory comes from changes). Run it on an otherwise idle machine:

    OMP_NUM_THREADS=1 python scripts/bench_allocator.py --corpus ende --dim 64 --layers 4 --heads 4 \\
        --lr 3e-3 --max-update 100 --validate-interval 100 --max-tokens 2048 --dropout 0.1 --repeats 2 \\
        --model "transformer_shared=transformer --share-all-embeddings" \\
        --model "anthe=anthe_base --tc-min-bond 8 --hsoftpos-min-token-dim {d/2}"
"""
import os
import resource
import statistics
import sys
import tempfile

from slim_fairseq_lab import command, fairseq_logs, launcher, specs
from slim_fairseq_lab.study import options, planner
from slim_fairseq_lab.study.runs import corpus_data


def timed_training(argv, log_path, threads, allocator_env):
    """(fairseq's training seconds, user CPU s, kernel CPU s, last valid NLL) of one fairseq-train."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = launcher.run_tool("fairseq-train", argv, log_path, threads, allocator_env=allocator_env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = fairseq_logs.training_seconds(output)
    points = fairseq_logs.valid_points(output)
    return (seconds, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
            points[-1][2] if points else None)


def table(results, models, args):
    """The printed report: per model, both settings' mean training time (min–max), kernel share,
    the speed-up and whether the valid losses agree."""
    lines = [f"\n{args.max_update} updates of {args.max_tokens} tokens, d {args.dims[0]}, {args.threads} "
             f"thread(s); mean of {args.repeats} run(s) (min–max)\n",
             "| model | default malloc: train s | kernel share | large blocks in heap: train s | kernel share "
             "| speed-up | same valid loss |",
             "|---|---|---|---|---|---|---|"]
    for label, _arch, _o in models:
        cells = []
        for allocator_env in (False, True):
            runs = results[(label, allocator_env)]
            seconds = [r[0] for r in runs]
            kernel = sum(r[2] for r in runs) / sum(r[1] + r[2] for r in runs)
            cells += [f"{statistics.mean(seconds):.1f} ({min(seconds):.1f}–{max(seconds):.1f})", f"{kernel:.0%}"]
        speedup = (statistics.mean(r[0] for r in results[(label, False)])
                   / statistics.mean(r[0] for r in results[(label, True)]))
        same = {r[3] for r in results[(label, False)] + results[(label, True)]}
        agree = "yes" if len(same) == 1 else f"no: {sorted(same)}"
        lines.append(f"| {label} | {' | '.join(cells)} | {speedup:.2f}× | {agree} |")
    return "\n".join(lines)


def main(argv=None):
    parser = options.get_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=2, help="runs per model and setting (default 2)")
    args = parser.parse_args(argv)
    if args.corpus == "both":
        parser.error("--corpus: give ende or wikitext")
    options.check_args(parser, args)
    specs.load_plugin()
    model_specs = args.model if args.corpus == "ende" else args.lm_model
    baseline = planner.BASELINES[args.corpus]
    models = [] if args.no_baseline else [(baseline, baseline, [])]
    models += [specs.parse_model_spec(spec) for spec in model_specs]
    data = corpus_data(args.corpus, args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for label, arch, overrides in models:
                for allocator_env in (False, True):
                    save_dir = os.path.join(tmp, f"{label}_{allocator_env}_{repeat}")
                    train = launcher.study_train_argv(args.corpus, data, arch, overrides, args, args.seeds[0],
                                                      save_dir)
                    result = timed_training(train + ["--no-save"], save_dir + ".log", args.threads, allocator_env)
                    results.setdefault((label, allocator_env), []).append(result)
                    print(f"[allocator] {label} {'heap' if allocator_env else 'default'} run {repeat + 1}: "
                          f"{result[0]:.1f} s, kernel {result[2]:.1f} s of {result[1] + result[2]:.1f} s CPU",
                          flush=True)
    print(table(results, models, args))


if __name__ == "__main__":
    sys.exit(command.run(main))
