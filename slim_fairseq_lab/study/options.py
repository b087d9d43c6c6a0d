"""The study's command-line options (scripts/quality.py; scripts/bench_allocator.py and
scripts/compress_demo.py reuse its training settings) and their checks: one-line errors naming
the flag before anything trains."""
import argparse
import os


def _float_list(text):
    return [float(x) for x in text.split(",") if x]


def _int_list(text):
    return [int(x) for x in text.split(",") if x]


def get_parser(description=None):
    """The study's options (``description``: the --help text above them)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="MODEL",
                   help="en-de translation model spec '[LABEL=]ARCH [fairseq overrides...]' (repeatable); "
                        "{d}, {2d}, {d/2} in the overrides become numbers for each width")
    p.add_argument("--lm-model", action="append", default=[], metavar="MODEL",
                   help="WikiText-2 language model spec, as --model (repeatable)")
    p.add_argument("--corpus", choices=["ende", "wikitext", "both"], default="both",
                   help="which half of the study runs: the --model specs on en-de, the --lm-model specs "
                        "on WikiText-2, or both (default)")
    p.add_argument("--no-baseline", action="store_true", help="do not add fairseq's transformer(_lm)")
    p.add_argument("--frontier-baseline", metavar="LABEL[,LABEL...]",
                   help="label whose frontier the others are measured against (default: fairseq's "
                        "transformer / transformer_lm of the plan); the frontier is the lower convex hull of "
                        "their best points over log parameters (with several, of all their points), "
                        "and the per-width comparison uses the first")
    p.add_argument("--name", default="quality", help="output folder results/<name> when --out is not given")
    p.add_argument("--out", help="output folder (results.json, table.md, plots, runs/)")
    p.add_argument("--dim", dest="dims", type=_int_list, default=[256], metavar="D[,D...]",
                   help="model width(s); several make a size sweep")
    p.add_argument("--layers", type=int, default=3, help="layers (encoder and decoder each; default 3)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--ffn", type=int, help="FFN width for a single --dim (default 4 d)")
    p.add_argument("--ffn-mult", type=int, default=4, help="FFN width as a multiple of d (default 4)")
    p.add_argument("--dropout", type=float, help="override every model's dropout")
    p.add_argument("--seeds", type=_int_list, default=[1, 2], metavar="S[,S...]",
                   help="training seeds of every run (default 1,2)")
    p.add_argument("--confirm-seeds", type=_int_list, default=[], metavar="S[,S...]",
                   help="after the sweep over --seeds, train these seeds too, at the best learning "
                        "rate of each model and width only (cheaper than sweeping every seed)")
    p.add_argument("--max-update", type=int, default=300, help="updates per training run (default 300)")
    p.add_argument("--time-budget", type=float, help="wall-clock cap per training run, seconds")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch (default 2048)")
    p.add_argument("--validate-interval", type=int, default=50, help="validate every N updates")
    p.add_argument("--log-interval", type=int, help="training log interval (default: --validate-interval)")
    p.add_argument("--max-valid-steps", type=int, help="cap validation batches (fairseq --max-valid-steps)")
    p.add_argument("--lr", dest="lrs", type=_float_list, default=[1e-3], metavar="LR[,LR...]",
                   help="learning rate(s); several make a sweep, the best by valid loss is kept")
    p.add_argument("--lr-sweep-dim", type=int, metavar="D",
                   help="sweep the learning rates at this width only; the other --dim widths train at "
                        "each model's best rate there (a third of the runs of a full sweep)")
    p.add_argument("--lr-extend", type=int, default=0, metavar="N",
                   help="up to N times, add one rate beyond the grid (by the grid's step) for every "
                        "model whose best rate is the grid's largest or smallest (default 0)")
    p.add_argument("--lr-width-check", action="store_true",
                   help="with --lr-sweep-dim: also train every other width one grid step from the "
                        "rate carried over from the sweep width, lower when wider and higher when "
                        "narrower, and further (up to --lr-extend more) while that keeps winning; "
                        "the best is kept")
    p.add_argument("--warmup", type=int, help="warm-up updates (default max-update / 10)")
    p.add_argument("--tokens-per-sample", type=int, default=128, help="LM block length")
    p.add_argument("--jobs", type=int, default=1, help="training runs at a time (default 1)")
    p.add_argument("--threads", type=int, help="threads per run (default: OMP_NUM_THREADS / jobs)")
    p.add_argument("--no-resume", action="store_true", help="re-run runs that already finished")
    p.add_argument("--no-bleu", action="store_true", help="en-de: skip the test-set translation and its BLEU")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each run's checkpoint_best.pt (default: removed once evaluated)")
    p.add_argument("--dry-run", action="store_true",
                   help="train nothing: list every run the command would train next (finished, "
                        "resumable from a checkpoint, or still to run) and the wall time the "
                        "finished runs suggest it needs")
    p.add_argument("--report-only", action="store_true",
                   help="only re-write table.md and the plots from the runs in <out>/results.json "
                        "(e.g. after stopping a long comparison early)")
    p.add_argument("--ende-data", help="en-de data-bin (default: bundled corpus, --eval-subset sentences)")
    p.add_argument("--bpe-codes", help="BPE codes of --ende-data (for detokenized BLEU)")
    p.add_argument("--eval-subset", type=int, default=300, help="en-de valid/test sentences when binarizing")
    p.add_argument("--lm-data", help="WikiText-2 data-bin (default: bundled corpus, --lm-vocab)")
    p.add_argument("--lm-vocab", type=int, default=8000,
                   help="WikiText-2 vocabulary when binarizing the bundled corpus (default 8000)")
    return p


def check_args(p, args):
    """One-line errors before any training starts."""
    if not args.dims or any(d <= 0 for d in args.dims):
        p.error("--dim: expected positive integers, e.g. 64,128,256")
    if not args.lrs or any(lr <= 0 for lr in args.lrs):
        p.error("--lr: expected positive numbers, e.g. 1e-3,3e-3")
    if not args.seeds:
        p.error("--seeds: expected integers, e.g. 1,2")
    if args.ffn and len(args.dims) > 1:
        p.error("--ffn fixes one FFN width; with several --dim values use --ffn-mult")
    if args.ffn:
        if args.ffn % args.dims[0]:
            p.error(f"--ffn {args.ffn} is not a multiple of --dim {args.dims[0]}; use --ffn-mult")
        args.ffn_mult = args.ffn // args.dims[0]
    if args.lr_sweep_dim is not None and args.lr_sweep_dim not in args.dims:
        p.error(f"--lr-sweep-dim {args.lr_sweep_dim}: expected one of the --dim widths "
                f"({','.join(map(str, args.dims))})")
    if args.lr_extend < 0:
        p.error("--lr-extend: expected an integer >= 0")
    if args.lr_extend and len(args.lrs) < 2:
        p.error("--lr-extend needs a grid of at least two --lr values")
    if args.lr_width_check and (not args.lr_sweep_dim or len(args.lrs) < 2):
        p.error("--lr-width-check needs --lr-sweep-dim and a grid of at least two --lr values")
    if args.jobs < 1:
        p.error("--jobs: expected an integer >= 1")
    if args.dry_run and args.report_only:
        p.error("--dry-run and --report-only: give one of them")
    if args.threads is None:
        args.threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "2")) // args.jobs)


def check_frontier_labels(parser, args, labels):
    """--frontier-baseline must name models of the study (``labels``)."""
    unknown = [label for label in (args.frontier_baseline or "").split(",") if label and label not in labels]
    if unknown:
        parser.error(f"--frontier-baseline: {', '.join(unknown)} is not a model of the study "
                     f"(its models: {', '.join(dict.fromkeys(labels))})")


#: the settings a report describes, taken from the command line the study was run with
REPORTED_SETTINGS = ("max_update", "max_tokens", "time_budget", "dims", "layers", "heads", "ffn_mult", "lrs",
                     "lr_sweep_dim", "lr_extend", "lr_width_check", "seeds", "confirm_seeds")


def use_recorded_settings(parser, args, recorded_argv):
    """For --report-only: the settings the report describes are those of the recorded command
    line (results.json's ``argv``), not this command's defaults; so is its --frontier-baseline,
    unless this command gives one."""
    recorded = parser.parse_args(recorded_argv[1:])
    check_args(parser, recorded)
    for name in REPORTED_SETTINGS:
        setattr(args, name, getattr(recorded, name))
    if not args.frontier_baseline:
        args.frontier_baseline = recorded.frontier_baseline
