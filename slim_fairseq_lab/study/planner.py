"""What the study trains: its models (:func:`study_plan`), checked at every width before anything
trains (:func:`check_specs`), and each model's phases (:func:`model_phases`): the learning-rate
sweep, its extension beyond the grid's edge, the other widths at the carried-over rate, the rate
step with width, and the confirming seeds. A phase is planned from the finished runs once the
model's previous phase has finished.
"""
import contextlib
import io
import math
import os

from slim_fairseq_lab import launcher, specs
from slim_fairseq_lab.study.runs import Job, run_tag
from slim_fairseq_lab.study.summary import best_rate_row, best_rows, ranking_loss, summarise

#: the baseline the study adds to each corpus (unless --no-baseline): fairseq's own transformer
BASELINES = {"ende": "transformer", "wikitext": "transformer_lm"}


def study_plan(args):
    """The study's models: [(corpus, label, arch, overrides, baseline)], each corpus's baseline
    first."""
    corpora = ["ende", "wikitext"] if args.corpus == "both" else [args.corpus]
    plan = []
    for corpus in corpora:
        if not args.no_baseline:
            plan.append((corpus, BASELINES[corpus], BASELINES[corpus], [], True))
        for spec in args.model if corpus == "ende" else args.lm_model:
            label, arch, overrides = specs.parse_model_spec(spec)
            plan.append((corpus, label, arch, overrides, False))
    return plan


def baseline_labels(args):
    """{corpus: the --frontier-baseline labels, else the corpus's baseline}."""
    return {c: args.frontier_baseline or BASELINES[c] for c in ("ende", "wikitext")}


def check_specs(plan, args):
    """Parse every model spec at every width with fairseq's parser and the plugin's option checks
    before anything trains, so that a bad spec stops the study with one line at once rather
    than hours later, when its first run starts."""
    for corpus, label, arch, overrides, _baseline in plan:
        for dim in args.dims:
            messages = io.StringIO()
            try:
                with contextlib.redirect_stderr(messages):
                    specs.parse_fairseq_args(launcher.study_train_argv(
                        corpus, "DATA", arch, overrides, args, 1, "UNUSED", dim, args.lrs[0]))
            except (SystemExit, ValueError) as error:
                said = [line for line in messages.getvalue().splitlines() if "error:" in line]
                reason = said[-1].split("error:", 1)[1].strip() if said else str(error)
                raise SystemExit(f"quality.py: {'--model' if corpus == 'ende' else '--lm-model'} "
                                 f"{label} at --dim {dim}: {reason}")


def _finished_rows(runs, corpus, label, dim):
    """The summary rows (one per rate) of one model and width that have a valid loss."""
    return [r for r in summarise(runs) if (r["corpus"], r["label"], r["dim"]) == (corpus, label, dim)
            and r["valid_nll"][0] is not None]


def _grid_step(lr, grid, down):
    """One step of the sorted ``grid`` below or above ``lr``: the ratio of the two grid values
    nearest that end of the grid."""
    return lr * grid[0] / grid[1] if down else lr * grid[-1] / grid[-2]


def edge_rate(runs, corpus, label, dim, grid):
    """The next rate to try for one model and width when its best rate so far is the largest or
    smallest tried (one grid step further); None when the best rate is inside the tried range or
    nothing has finished."""
    rows = _finished_rows(runs, corpus, label, dim)
    if len(rows) < 2 or all(ranking_loss(r) == math.inf for r in rows):
        return None
    tried = sorted(r["lr"] for r in rows)
    best = best_rate_row(rows)["lr"]
    if best in (tried[0], tried[-1]):
        return _grid_step(best, sorted(grid), down=best == tried[0])
    return None


def rate_step_with_width(runs, corpus, label, dim, sweep_dim, grid):
    """The next rate to try for one model at a width other than ``sweep_dim``, where it trained at
    the rate carried over from the sweep: Adam's best rate falls as width grows, so one grid step
    lower at a wider width and one step higher at a narrower one; then one step further only
    while the furthest rate tried that way is the best. None when nothing has finished at
    ``dim``, or when the best rate is not the furthest one tried in that direction."""
    rows = _finished_rows(runs, corpus, label, dim)
    if dim == sweep_dim or not rows:
        return None
    down = dim > sweep_dim
    furthest = (min if down else max)(r["lr"] for r in rows)
    return _grid_step(furthest, sorted(grid), down) if best_rate_row(rows)["lr"] == furthest else None


def best_rates(runs):
    """{(corpus, label, width): the best learning rate so far}."""
    return {(r["corpus"], r["label"], r["dim"]): r["lr"] for r in best_rows(summarise(runs))}


def make_job(entry, dim, lr, seed, args, out_dir):
    """The :class:`Job` of model ``entry`` of the plan at one width, rate and seed."""
    tag = run_tag(entry[0], entry[1], dim, lr, seed, len(args.dims) == 1, len(args.lrs) == 1)
    return Job(*entry, dim, lr, seed, os.path.join(out_dir, "runs", tag))


def model_phases(entry, args, out_dir, finished_runs):
    """One model's phases in order, each (what, [((seed, width, rate), job)]), planned from
    ``finished_runs()`` (the study's finished runs at that moment) when the model's previous
    phase has finished. The triple ranks the jobs of a phase across models: seed, then width
    (narrowest first unless said), then model, then rate."""
    corpus, label = entry[0], entry[1]
    sweep_dims = [args.lr_sweep_dim] if args.lr_sweep_dim else args.dims
    seed_rank = {seed: i for i, seed in enumerate(args.seeds)}

    def job(dim, lr, seed):
        return make_job(entry, dim, lr, seed, args, out_dir)
    yield "the learning-rate sweep", [((seed_rank[seed], dim, i), job(dim, lr, seed))
                                      for seed in args.seeds for dim in sweep_dims
                                      for i, lr in enumerate(args.lrs)]
    for _ in range(args.lr_extend):
        # a best rate at the edge of the grid says the optimum may lie beyond it: one more step
        yield "extending the learning-rate grid where the best rate is at its edge", [
            ((seed_rank[seed], dim, 0), job(dim, lr, seed)) for seed in args.seeds for dim in sweep_dims
            for lr in [edge_rate(finished_runs(), corpus, label, dim, args.lrs)] if lr]
    if args.lr_sweep_dim:
        lr = best_rates(finished_runs())[(corpus, label, args.lr_sweep_dim)]
        yield f"the other widths at its best rate at width {args.lr_sweep_dim}", [
            ((seed_rank[seed], dim, 0), job(dim, lr, seed))
            for seed in args.seeds for dim in args.dims if dim != args.lr_sweep_dim]
    for _ in range(1 + args.lr_extend if args.lr_width_check and args.lr_sweep_dim else 0):
        # widest first: a carried-over rate too high for a wider model is the costlier error
        yield "one rate step at the other widths: lower when wider, higher when narrower", [
            ((seed_rank[seed], -dim, 0), job(dim, lr, seed)) for seed in args.seeds for dim in args.dims
            for lr in [rate_step_with_width(finished_runs(), corpus, label, dim, args.lr_sweep_dim, args.lrs)]
            if lr]
    if args.confirm_seeds:
        best = best_rates(finished_runs())
        yield f"confirming the best learning rates with seeds {','.join(map(str, args.confirm_seeds))}", [
            ((seed, dim, 0), job(dim, best[(corpus, label, dim)], seed))
            for seed in args.confirm_seeds for dim in args.dims]
