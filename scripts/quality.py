#!/usr/bin/env python3
"""Quality per parameter on the bundled corpora: equal-budget runs, learning-rate sweeps, sizes,
seeds, and each family's frontier against fairseq's transformer (issues 8 and 14).

Every run is one ``fairseq-train`` of a model spec at one width (``--dim``), one learning rate
(``--lr``) and one seed, under the same budget: the same ``--max-update`` and ``--max-tokens``
(so the same number of training tokens), optionally capped in wall time by ``--time-budget``
(fairseq's ``--stop-time-hours``). Then it is evaluated:

* en-de translation (``--corpus ende``): valid perplexity (fairseq's masked per-token
  perplexity of the label-smoothing-free NLL, base 2, padding excluded; see
  docs/TECHNIQUES.md#metrics-not-comparable-with-fairseq) and test BLEU
  (``fairseq-generate`` beam 5, detokenized with Moses + subword-nmt, ``--scoring sacrebleu``);
* WikiText-2 language modelling (``--corpus wikitext``): valid perplexity.

Every metric is that of the run's best checkpoint (``checkpoint_best.pt``, lowest valid loss, as
fairseq keeps it): the valid NLL/perplexity of that validation and the test BLEU decoded from it,
so a run that overfits late is reported at its best point (early stopping), with the update of
that checkpoint and the last validation's NLL beside it in the table.

``--dim 64,128,256`` and ``--lr 1e-3,3e-3,1e-2`` sweep widths and learning rates; for every
(model, width) the learning rate with the lowest valid loss is kept (compared on the seeds every
rate has, reported as the mean over all of its seeds: :func:`best_rows`), and each model's
best points form its *frontier* (valid loss against parameters). The report gives, per model,
the distance to the frontier of the baseline (``--frontier-baseline``, default fairseq's
``transformer`` / ``transformer_lm`` run of the plan; the lower convex hull of its best points
over log parameters, :func:`frontier_points`): the valid-loss difference at equal parameters and
the baseline's parameters at equal loss, with the seed spread.

``--lr-sweep-dim D`` sweeps the rates at width D only and trains the other widths at each
model's best rate there; ``--lr-extend N`` tries one more rate beyond the grid (up to N times)
for a model whose best rate is at the grid's edge; ``--lr-width-check`` also trains every
other width one grid step from the carried-over rate, lower at a wider width and higher at a
narrower one (Adam's best rate falls as width grows), further while that step keeps winning (up
to ``--lr-extend`` more), and keeps the best.

Runs are independent and **resumable**: each finished run leaves ``runs/<tag>/run.json`` and is
reused by a later call with the same settings, so a long study can be stopped and restarted,
or extended by more widths, rates or seeds; a run stopped half-way goes on from the
``checkpoint_last.pt`` of its last validation. ``--jobs N`` trains N runs at a time
(``--threads`` threads each); each model goes on to its next phase as soon as its own runs of
the previous one have finished, so a free core never waits for other models' runs.
``--dry-run`` trains nothing and lists what the same command would train next (finished,
resumable, still to run) with the wall time the finished runs suggest.

Output (``--out``, default ``results/<name>``): ``results.json`` (every run, every valid point),
``table.md`` (rewritten after every finished run: every run, each best point against the baseline
frontier, each model's position over its widths, when the ranking of the models settled, and a
per-width comparison with a seed-spread verdict), ``valid_loss_<corpus>.png`` (valid-loss curves
of every best point, mean over seeds) and ``params_vs_quality.png`` (valid loss, and BLEU for
en-de, against parameters on a log axis, one frontier line per model).

Example::

    python scripts/quality.py --name q256 --corpus both --dim 256 --layers 3 --heads 4 \\
        --seeds 1,2 --max-update 300 --model anthe_base --model sandwich_base \\
        --lm-model stlm_tied --lm-model skipless_lm

``--model`` specs (translation) and ``--lm-model`` specs (WikiText-2) are
``[LABEL=]ARCH [fairseq overrides...]``, as in scripts/benchmark.py.
"""
import argparse
import collections
import concurrent.futures
import heapq
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO_ROOT, "slim_fairseq")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))

from benchmark import (  # noqa: E402
    accepted_flags,
    load_plugin,
    parse_fairseq_args,
    parse_model_spec,
    shape_overrides,
)

BASELINES = {"ende": "transformer", "wikitext": "transformer_lm"}
_LOG_LOCK = threading.Lock()


def log(message):
    with _LOG_LOCK:
        print(f"[quality] {message}", flush=True)


# The last line each tool prints once all of its work is done (and, for training, saved).
COMPLETION_MARKERS = {"fairseq-train": r"done training in [\d.]+ seconds",
                      "fairseq-generate": r"^Generate \S+ with beam=\d+: "}


# glibc's malloc serves a block above its mmap threshold (32 MiB at most) with fresh pages from the
# kernel and hands them back when freed: the logits of a 2,048-token batch over 8,000 types (65 MB)
# then cost a page fault per page at every step, a third of a CPU run's time. Keeping such blocks
# in the heap gives the same results bit for bit, faster (docs/TRAINING.md#cpu-memory-allocator).
# examples/common.sh sets the same; the caller's environment wins.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def run_tool(tool, argv, log_path, threads, append=False, allocator_env=True):
    """Run a fairseq console script, stream its output to ``log_path`` (continued when
    ``append``); return the whole log. ``allocator_env=False`` runs it with glibc's default
    malloc settings (scripts/bench_allocator.py)."""
    env = dict(ALLOCATOR_ENV, **os.environ) if allocator_env else {
        k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    cmd = [os.path.join(BIN, tool), *argv]
    with open(log_path, "a" if append else "w") as f:  # streamed: progress can be followed
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env)
    with open(log_path) as f:
        output = f.read()
    if proc.returncode != 0:
        marker = COMPLETION_MARKERS.get(tool)
        done = marker and re.search(marker, output, re.MULTILINE)
        if proc.returncode < 0 and done:
            # The work finished and was saved; the process was killed by a signal while the
            # interpreter shut down (seen once in CI: "terminate called without an active
            # exception", SIGABRT, after fairseq-train had saved its checkpoint).
            note = (f"{tool} was killed by signal {-proc.returncode} after it printed "
                    f"{done.group(0).strip()!r}; its results are complete and kept")
            with open(log_path, "a") as f:
                f.write(f"[quality] {note}\n")
            log(f"{note} ({log_path})")
            return output
        raise RuntimeError(f"{tool} failed ({proc.returncode}), see {log_path}:\n{output[-3000:]}")
    return output


def _json_records(output, kind):
    for line in output.splitlines():
        match = re.search(r"\| " + kind + r" \| (\{.*\})\s*$", line)
        if match:
            yield json.loads(match.group(1))


def parse_valid_points(output):
    """Every ``valid`` record of a ``--log-format json`` training log: [(updates, loss, nll, ppl)]."""
    points = {}  # a resumed run validates again after its last checkpoint: the later record wins
    for record in _json_records(output, "valid"):
        loss = float(record["valid_loss"])
        nll = float(record.get("valid_nll_loss", loss))
        updates = int(float(record["valid_num_updates"]))
        points[updates] = (updates, loss, nll, float(record["valid_ppl"]))
    return [points[u] for u in sorted(points)]


def checkpoint_point(curve):
    """The validation whose model ``checkpoint_best.pt`` holds: the lowest valid loss (fairseq's
    default ``--best-checkpoint-metric loss``, the label-smoothed loss for translation), the later
    one of equal losses (fairseq saves on ``<=``; the log rounds losses to 3 decimals, so a tie
    here may hide a difference fairseq saw). ``curve`` is [(updates, loss, nll, ppl)]."""
    best = None
    for point in curve:
        if best is None or point[1] <= best[1] or math.isnan(best[1]):  # NaN: never better
            best = point
    return best


def with_checkpoint_metrics(run):
    """``run`` with its valid NLL and perplexity taken at its best checkpoint, the model its test
    BLEU is decoded from (early stopping on valid loss), and with the update of that checkpoint
    (``best_update``) and the last validation's NLL (``last_valid_nll``), which differ when a run
    overfits. Runs recorded before this rule reported the last validation; they are re-derived
    from their stored curve."""
    curve = run.get("valid_curve")
    if curve:
        updates, _loss, nll, ppl = checkpoint_point(curve)
        run.update(valid_nll=nll, valid_ppl=ppl, best_update=updates, last_valid_nll=curve[-1][2])
    return run


def checkpoint_curve(curve):
    """[(updates, nll)]: at each validation, the valid NLL of the best checkpoint up to then, what
    the run would report had it stopped there."""
    return [(point[0], checkpoint_point(curve[:i + 1])[2]) for i, point in enumerate(curve)]


def parse_train_wps(output):
    """Training tokens/s: total target tokens over total training wall time of the json log's
    ``train_inner`` records (fairseq's own ``wps`` meters), or None."""
    tokens = seconds = 0.0
    for record in _json_records(output, "train_inner"):
        wps, ups = float(record.get("wps", 0)), float(record.get("ups", 0))
        if wps > 0 and ups > 0:
            # each record covers --log-interval updates; wps / ups = tokens per update
            tokens += wps / ups
            seconds += 1.0 / ups
    return tokens / seconds if seconds else None


def parse_params(output):
    match = re.search(r"num\. shared model params: ([\d,]+)", output)
    return int(match.group(1).replace(",", "")) if match else None


def parse_bleu(output):
    match = re.search(r"BLEU\s*=\s*([\d.]+)", output.split("Generate test with beam")[-1])
    return float(match.group(1)) if match else None


#: one planned training run of the study: a model spec (corpus, label, arch, overrides, whether it
#: is the corpus's baseline) at one width, rate and seed, and the directory it trains in
Job = collections.namedtuple("Job", "corpus label arch overrides baseline dim lr seed save_dir")


def job_argv(job, data, args):
    """fairseq-train's arguments for ``job``; ``data`` maps each corpus to its data-bin."""
    return train_argv(job.corpus, data[job.corpus], job.arch, job.overrides, args, job.seed, job.save_dir,
                      job.dim, job.lr)


def train_argv(corpus, data, arch, overrides, args, seed, save_dir, dim=None, lr=None):
    lm = corpus == "wikitext"
    dim = dim or args.dims[0]
    lr = lr or args.lrs[0]
    argv = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, "--cpu", "--seed", str(seed),
            "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--max-update", str(args.max_update), "--max-tokens", str(args.max_tokens),
            "--validate-interval-updates", str(args.validate_interval),
            # checkpoint_last.pt at every validation: an interrupted run resumes from there
            "--save-interval-updates", str(args.validate_interval), "--keep-interval-updates", "1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(lr), "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", str(args.warmup or max(1, args.max_update // 10)),
            "--warmup-init-lr", "1e-07", "--clip-norm", "1.0", "--num-workers", "0",
            "--log-format", "json", "--log-interval", str(args.log_interval or args.validate_interval),
            "--skip-invalid-size-inputs-valid-test", "--required-batch-size-multiple", "1"]
    if args.time_budget:
        argv += ["--stop-time-hours", f"{args.time_budget / 3600.0:.6f}"]
    if args.max_valid_steps:
        argv += ["--max-valid-steps", str(args.max_valid_steps)]
    if lm:
        argv += ["--task", "language_modeling", "--tokens-per-sample", str(args.tokens_per_sample),
                 "--sample-break-mode", "none", "--criterion", "cross_entropy"]
    else:
        argv += ["--task", "translation", "--source-lang", "en", "--target-lang", "de",
                 "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    argv += shape_overrides(arch, lm, dim, args.layers, args.heads, args.ffn_mult * dim)
    if args.dropout is not None and "--dropout" in accepted_flags(arch):
        argv += ["--dropout", str(args.dropout)]
    return argv + expand_width(overrides, dim)


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


def generate_argv(data, save_dir, args, bpe_codes):
    argv = [data, "--user-dir", PLUGIN_DIR, "--path", os.path.join(save_dir, "checkpoint_best.pt"),
            "--cpu", "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--gen-subset", "test", "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10",
            "--max-tokens", "4096", "--scoring", "sacrebleu",
            # this fairseq build drops the last N mod 8 sentences otherwise (README, known host issue)
            "--required-batch-size-multiple", "1", "--quiet"]
    if bpe_codes:
        argv += ["--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", bpe_codes]
    else:
        argv += ["--remove-bpe"]
    return argv


def mean_std(values):
    """Mean and sample standard deviation; the deviation is None for a single value (one seed
    has no spread, and reporting 0 for it would read as a measured one)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(mean, std, digits=2, signed=False):
    """``mean ± std``; the mean alone where there is no spread (one seed)."""
    if mean is None:
        return "—"
    return f"{mean:{'+' if signed else ''}.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def fmt_delta(delta, std):
    """A valid-NLL difference with its spread, or with "one seed" where either side has one."""
    return fmt(delta, std, digits=3, signed=True) + (" (one seed)" if std is None else "")


def fmt_lr(lr):
    return f"{lr:g}"


# ----------------------------------------------------------------------------------------------
# summaries: mean over seeds, best learning rate, frontiers

METRICS = ("valid_ppl", "valid_nll", "best_update", "last_valid_nll", "test_bleu", "train_seconds",
           "updates", "train_wps")


def summarise(runs):
    """One row per (corpus, label, dim, lr): mean ± std over seeds of every metric."""
    groups = {}
    for run in runs:
        key = (run["corpus"], run["label"], run.get("dim"), run.get("lr"))
        groups.setdefault(key, []).append(run)
    rows = []
    for (corpus, label, dim, lr), group in groups.items():
        row = {"corpus": corpus, "label": label, "arch": group[0]["arch"], "dim": dim, "lr": lr,
               "seeds": [r["seed"] for r in group], "params": group[0]["params"],
               "baseline": group[0]["baseline"]}
        for key in METRICS:
            row[key] = mean_std([r.get(key) for r in group])
        row["seed_nll"] = {str(r["seed"]): r.get("valid_nll") for r in group}
        rows.append(row)
    return rows


def _loss(row):
    """Mean valid loss of a row for ranking; a diverged run (NaN or inf) ranks last."""
    value = row["valid_nll"][0]
    return value if value is not None and math.isfinite(value) else math.inf


def _loss_on(row, seeds):
    """Mean valid loss of a row over ``seeds`` only; a diverged run ranks last."""
    values = [row["seed_nll"][seed] for seed in seeds]
    if any(v is None or not math.isfinite(v) for v in values):
        return math.inf
    return statistics.mean(values)


def best_rate_row(group):
    """Of the rows of one model and width (one per rate), the one with the lowest valid loss,
    compared on the seeds every rate tried has (the sweep's); its own row then carries the mean
    over all its seeds. Comparing a two-seed mean with one seed would let a second seed of the
    chosen rate, when it lands worse, hand the choice to a rate that has one seed only (the best
    of several single draws looks better than it is)."""
    shared = sorted(set.intersection(*(set(r.get("seed_nll", {})) for r in group)))
    return min(group, key=(lambda r: _loss_on(r, shared)) if shared else _loss)


def best_rows(rows):
    """Per (corpus, label, dim): the row of the best learning rate (:func:`best_rate_row`)."""
    groups = {}
    for row in rows:
        if row["valid_nll"][0] is not None:
            groups.setdefault((row["corpus"], row["label"], row["dim"]), []).append(row)
    return sorted((best_rate_row(group) for group in groups.values()),
                  key=lambda r: (r["corpus"], r["label"], r["params"] or 0))


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
    if len(rows) < 2 or all(_loss(r) == math.inf for r in rows):
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


def interpolate(points, x):
    """Piecewise-linear value at ``x`` through ``points`` [(x, y)] sorted by x; outside the range
    the two nearest points extrapolate. Returns (y, extrapolated)."""
    if len(points) == 1:
        return points[0][1], x != points[0][0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0), False
    (x0, y0), (x1, y1) = (points[0], points[1]) if x < points[0][0] else (points[-2], points[-1])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0), True


def frontier_labels(baseline_label, corpus):
    """The labels whose points make up ``corpus``'s frontier (``--frontier-baseline A,B``)."""
    return baseline_label[corpus].split(",")


def frontier_name(baseline_label, corpus):
    return " + ".join(f"`{label}`" for label in frontier_labels(baseline_label, corpus))


def frontier_points(best, corpus, labels):
    """The frontier of ``labels``' best points: (log10 params, valid NLL, its std) by parameters.

    A point is kept when it beats every point with fewer parameters, and when it lies on or below
    the straight line (over log10 params) between its kept neighbours: the lower convex hull. A
    family's valid loss falls ever more slowly as it grows, so the line between two of its sizes
    is what sizes in between reach; a point above that line is a shape the baseline's other
    sizes beat (with several labels, e.g. the separate-embedding transformer at a size between
    two widths of the shared-embedding one). One model whose loss falls with width, ever more
    slowly, keeps every width."""
    points = sorted((math.log10(r["params"]), r["valid_nll"][0], r["valid_nll"][1])
                    for r in best if r["corpus"] == corpus and r["label"] in labels and r["params"])
    front = []
    for point in points:
        if front and point[1] >= front[-1][1]:
            continue
        while len(front) >= 2 and _above_line(front[-1], front[-2], point):
            front.pop()
        front.append(point)
    return front


def _above_line(middle, left, right):
    """Whether ``middle`` lies above the straight line from ``left`` to ``right`` ((x, y, ...))."""
    return ((middle[1] - left[1]) * (right[0] - left[0])
            > (right[1] - left[1]) * (middle[0] - left[0]))


def frontier_rows(best, baseline_label):
    """Each best point against the baseline's frontier (valid NLL over log10 params; the lower
    convex hull of the baseline labels' best points: :func:`frontier_points`).

    ``delta_nll``: the point's valid NLL minus the baseline frontier's at the same parameter count
    (negative = better), with the spread ``sqrt(std_point^2 + std_baseline^2)`` (baseline std taken
    from its nearest point; None when either has one seed only). ``params_ratio``: the point's parameters over those the baseline
    needs for the same valid NLL (< 1 = fewer parameters for equal quality), when that loss lies
    on or between the baseline's points.
    """
    out = []
    for corpus in sorted({r["corpus"] for r in best}):
        if corpus not in baseline_label:
            continue
        base = frontier_points(best, corpus, frontier_labels(baseline_label, corpus))
        if not base:
            continue
        curve = [(x, y) for x, y, _ in base]
        for r in best:
            if r["corpus"] != corpus or not r["params"]:
                continue
            x = math.log10(r["params"])
            y_base, extrapolated = interpolate(curve, x)
            std_base = min(base, key=lambda p: abs(p[0] - x))[2]
            ratio = None
            ys = [y for _, y in curve]
            if len(curve) > 1 and min(ys) <= r["valid_nll"][0] <= max(ys):
                # the baseline frontier is decreasing in params: invert it segment by segment
                for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
                    if min(y0, y1) <= r["valid_nll"][0] <= max(y0, y1) and y0 != y1:
                        x_equal = x0 + (x1 - x0) * (r["valid_nll"][0] - y0) / (y1 - y0)
                        ratio = 10 ** (x - x_equal)
                        break
            out.append({"corpus": corpus, "label": r["label"], "dim": r["dim"], "lr": r["lr"],
                        "params": r["params"], "valid_nll": r["valid_nll"],
                        "delta_nll": r["valid_nll"][0] - y_base,
                        "delta_std": (None if r["valid_nll"][1] is None or std_base is None
                                      else math.hypot(r["valid_nll"][1], std_base)),
                        "extrapolated": extrapolated, "params_ratio": ratio,
                        "test_bleu": r["test_bleu"]})
    return out


def verdict(values, baseline_values):
    """Plain words for a model's per-seed valid NLLs against the baseline's: a difference counts
    only when the two seed ranges do not overlap."""
    if len(values) < 2 or len(baseline_values) < 2:
        return "one seed only: spread unknown"
    if max(values) < min(baseline_values):
        return "better than the baseline on every seed"
    if min(values) > max(baseline_values):
        return "worse than the baseline on every seed"
    return "within the seed spread: no difference shown"


def compare_to_baseline(runs, baseline_label):
    """Each model at its best learning rate against the baseline at the same width (its best
    rate too): parameter and speed ratios, valid-NLL difference, per-seed ranges, verdict."""
    best = best_rows(summarise(runs))
    out = []
    for row in best:
        corpus = row["corpus"]
        first = frontier_labels(baseline_label, corpus)[0]  # the per-width comparison: the first label
        bases = [b for b in best if b["corpus"] == corpus and b["label"] == first]
        base = next((b for b in bases if b["dim"] == row["dim"]), bases[0] if len(bases) == 1 else None)
        if base is None or base is row:
            continue

        def seeds_of(r):
            return [x["valid_nll"] for x in runs if (x["corpus"], x["label"], x.get("dim"), x.get("lr"))
                    == (r["corpus"], r["label"], r["dim"], r["lr"])]
        values, base_values = seeds_of(row), seeds_of(base)
        wps, base_wps = row["train_wps"][0], base["train_wps"][0]
        out.append({"corpus": corpus, "label": row["label"], "baseline": base["label"], "dim": row["dim"],
                    "params": row["params"], "params_ratio": (row["params"] / base["params"]
                                                              if row["params"] and base["params"] else None),
                    "valid_ppl": row["valid_ppl"], "delta_nll": row["valid_nll"][0] - base["valid_nll"][0],
                    "range": (min(values), max(values)), "baseline_range": (min(base_values), max(base_values)),
                    "wps_ratio": wps / base_wps if wps and base_wps else None,
                    "verdict": verdict(values, base_values)})
    return out


def best_curves(runs, corpus, dim):
    """{label: {updates: mean valid NLL over seeds}} of each model's best learning rate at one
    width (the points :func:`best_rows` keeps); at each update, the NLL of the best checkpoint so
    far (:func:`checkpoint_curve`), the quantity the tables rank by."""
    chosen = {r["label"]: r["lr"] for r in best_rows(summarise(runs))
              if r["corpus"] == corpus and r["dim"] == dim}
    curves = {}
    for run in runs:
        if run["corpus"] == corpus and run.get("dim") == dim and chosen.get(run["label"]) == run.get("lr"):
            for updates, nll in checkpoint_curve(run["valid_curve"]):
                curves.setdefault(run["label"], {}).setdefault(updates, []).append(nll)
    return {label: {u: statistics.mean(v) for u, v in points.items()} for label, points in curves.items()}


def ranking_stability(runs, corpus, dim):
    """Whether the budget was long enough for the ranking of the models to settle (issue 14): the
    models at one width (each at its best rate, mean over seeds) ranked by valid NLL at every
    validation they all share. Returns None for fewer than two models, else a dict: ``updates``
    (the shared validations), ``final`` (labels, best first), ``settled_at`` (the first validation
    from which the ranking stayed the final one), and ``last_swap`` (the pair whose order changed
    last, with their valid-NLL gap at the end) or None when the ranking never changed."""
    curves = best_curves(runs, corpus, dim)
    if len(curves) < 2:
        return None
    shared = sorted(set.intersection(*(set(c) for c in curves.values())))
    if not shared:
        return None
    ranking = [sorted(curves, key=lambda label: (curves[label][u], label)) for u in shared]
    final = ranking[-1]
    settled = len(shared) - 1
    while settled > 0 and ranking[settled - 1] == final:
        settled -= 1
    last_swap = None
    if settled > 0:
        before, position = ranking[settled - 1], {label: i for i, label in enumerate(final)}
        swapped = [(a, b) for i, a in enumerate(before) for b in before[i + 1:] if position[a] > position[b]]
        a, b = min(swapped, key=lambda pair: abs(curves[pair[0]][shared[-1]] - curves[pair[1]][shared[-1]]))
        last_swap = {"pair": (b, a), "gap_at_end": abs(curves[a][shared[-1]] - curves[b][shared[-1]])}
    return {"updates": shared, "final": final, "settled_at": shared[settled], "last_swap": last_swap}


def ranking_markdown(runs):
    """One line per corpus and width: when the ranking of the models stopped changing."""
    lines = []
    for corpus, dim in sorted({(r["corpus"], r.get("dim")) for r in runs}, key=lambda k: (k[0], k[1] or 0)):
        stability = ranking_stability(runs, corpus, dim)
        if stability is None:
            continue
        updates = stability["updates"]
        text = (f"* {corpus}, d {dim}: final ranking {' < '.join(stability['final'])} (valid NLL, best "
                f"first); ")
        if stability["last_swap"] is None:
            text += f"unchanged at all {len(updates)} validations"
        else:
            first, second = stability["last_swap"]["pair"]
            text += (f"unchanged since update {stability['settled_at']} of {updates[-1]}; the last change "
                     f"put {first} ahead of {second}, {stability['last_swap']['gap_at_end']:.3f} bits apart "
                     "at the end")
        lines.append(text)
    if not lines:
        return ""
    return "\n".join(["**When the ranking settled** (each model at its best rate, mean over seeds, by the "
                      "valid NLL of its best checkpoint up to each validation all of them share)", "",
                      *lines, ""])


def family_summary(front):
    """Per model: where its best points sit against the baseline frontier, over every width.
    A point is ahead (behind) when its valid-NLL difference is below (above) zero by more than the
    combined seed spread; with one seed the spread is unknown and the sign alone is reported."""
    out = []
    for key in dict.fromkeys((f["corpus"], f["label"]) for f in front):
        points = sorted((f for f in front if (f["corpus"], f["label"]) == key), key=lambda f: f["params"])
        one_seed = any(f["delta_std"] is None for f in points)
        sides = []
        for f in points:
            margin = 0.0 if one_seed else f["delta_std"]
            sides.append("ahead" if f["delta_nll"] < -margin else "behind" if f["delta_nll"] > margin else "level")
        if len(set(sides)) == 1:
            where = {"ahead": "ahead of the frontier", "behind": "behind the frontier",
                     "level": "on the frontier (within the seed spread)"}[sides[0]]
            where += " at every width" if len(points) > 1 else " at its only width"
        else:
            where = "mixed: " + ", ".join(f"d {f['dim']} {side}" for f, side in zip(points, sides))
        ratios = [f["params_ratio"] for f in points if f["params_ratio"] is not None]
        out.append({"corpus": key[0], "label": key[1], "widths": [f["dim"] for f in points],
                    "deltas": [(f["delta_nll"], f["delta_std"]) for f in points],
                    "params": [f["params"] for f in points],
                    "test_bleu": [f.get("test_bleu", (None, None)) for f in points],
                    "params_ratios": ratios, "where": where + (" (one seed: spread unknown)" if one_seed else ""),
                    "extrapolated": any(f["extrapolated"] for f in points)})
    return out


def comparison_markdown(runs, baseline_label):
    lines = []
    titles = dict((("ende", "en-de (bundled)"), ("wikitext", "WikiText-2 (bundled)")))
    rows = compare_to_baseline(runs, baseline_label)
    for corpus in sorted({r["corpus"] for r in rows}):
        first = frontier_labels(baseline_label, corpus)[0]
        lines += [f"**{titles[corpus]}: each model against `{first}` (best learning rates)**", "",
                  "A difference is claimed only when the seed ranges of valid NLL do not overlap.", "",
                  "| model | params | × baseline | valid PPL | Δ valid NLL (bits) | seeds: model | seeds: "
                  "baseline | train tok/s × baseline | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["corpus"] == corpus):
            lines.append("| " + " | ".join([
                r["label"], "—" if r["params"] is None else f"{r['params']:,}",
                "—" if r["params_ratio"] is None else f"{r['params_ratio']:.2f}", fmt(*r["valid_ppl"]),
                f"{r['delta_nll']:+.3f}", "{:.3f}–{:.3f}".format(*r["range"]),
                "{:.3f}–{:.3f}".format(*r["baseline_range"]),
                "—" if r["wps_ratio"] is None else f"{r['wps_ratio']:.2f}", r["verdict"]]) + " |")
        lines.append("")
    return "\n".join(lines)


def _span(low, high):
    """``low–high``, or ``low`` alone when the two read the same."""
    return low if low == high else f"{low}–{high}"


def markdown(rows, args, baseline_label):
    dims = ",".join(map(str, args.dims))
    lines = [f"Equal budget: {args.max_update} updates of ≤{args.max_tokens} tokens"
             + (f", ≤{args.time_budget:.0f} s" if args.time_budget else "")
             + f"; shape d={dims}, L={args.layers}, heads={args.heads}, ffn={args.ffn_mult} d; "
             f"lr {','.join(map(fmt_lr, args.lrs))}"
             + (f" at d {args.lr_sweep_dim}" if args.lr_sweep_dim else "")
             + (f" (and up to {args.lr_extend} more beyond an edge)" if args.lr_extend else "")
             + ("; other widths also a step lower (wider) or higher (narrower)" if args.lr_width_check else "")
             + f"; seeds {','.join(map(str, args.seeds))}"
             + (f" (and {','.join(map(str, args.confirm_seeds))} at each best rate)" if args.confirm_seeds else "")
             + "; "
             "mean ± std over seeds. Valid NLL/PPL and test BLEU are those of each run's best checkpoint "
             "(lowest valid loss, as fairseq keeps checkpoint_best.pt); the last validation's NLL is "
             "beside them.", ""]
    titles = (("ende", "en-de (bundled)"), ("wikitext", "WikiText-2 (bundled)"))
    for corpus, title in titles:
        subset = [r for r in rows if r["corpus"] == corpus]
        if not subset:
            continue
        lines += [f"**{title}: every run**", ""]
        head = ["model", "d", "lr", "params", "seeds", "valid PPL", "valid NLL (bits)", "best at update",
                "last valid NLL"]
        head += (["test BLEU"] if corpus == "ende" else []) + ["train tok/s", "train s", "updates"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in sorted(subset, key=lambda r: (r["label"], r["dim"] or 0, r["lr"] or 0)):
            cells = [r["label"] + (" (baseline)" if r["baseline"] else ""), str(r["dim"]),
                     fmt_lr(r["lr"]) if r["lr"] else "—",
                     "—" if r["params"] is None else f"{r['params']:,}", str(len(r["seeds"])),
                     fmt(*r["valid_ppl"]), fmt(*r["valid_nll"], digits=3), fmt(*r["best_update"], digits=0),
                     fmt(*r["last_valid_nll"], digits=3)]
            if corpus == "ende":
                cells.append(fmt(*r["test_bleu"]))
            cells += [fmt(*r["train_wps"], digits=0), fmt(*r["train_seconds"], digits=0),
                      fmt(*r["updates"], digits=0)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    front = frontier_rows(best_rows(rows), baseline_label)
    for corpus, title in titles:
        subset = [f for f in front if f["corpus"] == corpus]
        if not subset:
            continue
        lines += [f"**{title}: best learning rate per model and width, against the "
                  f"{frontier_name(baseline_label, corpus)} frontier**", "",
                  "Δ NLL = valid NLL (bits/token) minus the baseline frontier's at the same parameter "
                  "count (the frontier: the lower convex hull of the baseline's best points over log "
                  "parameters; negative = better; ± combines both seed spreads; *extrap.* = outside the "
                  "baseline's sizes). params ratio = parameters over those the baseline needs for the "
                  "same valid NLL (< 1 = fewer).", ""]
        head = ["model", "d", "best lr", "params", "valid NLL", "Δ NLL vs frontier", "params ratio"]
        head += ["test BLEU"] if corpus == "ende" else []
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for f in sorted(subset, key=lambda f: (f["label"], f["params"])):
            cells = [f["label"], str(f["dim"]), fmt_lr(f["lr"]) if f["lr"] else "—", f"{f['params']:,}",
                     fmt(*f["valid_nll"], digits=3),
                     fmt_delta(f["delta_nll"], f["delta_std"]) + (" *extrap.*" if f["extrapolated"] else ""),
                     "—" if f["params_ratio"] is None else f"{f['params_ratio']:.2f}"]
            if corpus == "ende":
                cells.append(fmt(*f["test_bleu"]))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        # one baseline is its own frontier; of several, each is shown against the best of them
        labels = frontier_labels(baseline_label, corpus)
        families = [s for s in family_summary(subset) if len(labels) > 1 or s["label"] != labels[0]]
        if families:
            lines += [f"**{title}: each model against the {frontier_name(baseline_label, corpus)} frontier, "
                      "over its widths**", "",
                      "| model | widths | params | Δ NLL vs frontier (bits), smallest width first | params ratio at "
                      "equal NLL |" + (" test BLEU |" if corpus == "ende" else "") + " where it sits |",
                      "|---|---|---|---|---|" + ("---|" if corpus == "ende" else "") + "---|"]
            for fam in families:
                ratios = fam["params_ratios"]
                cells = [fam["label"], ", ".join(map(str, fam["widths"])), " / ".join(f"{p:,}" for p in fam["params"]),
                         ", ".join(fmt(d, s, digits=3, signed=True) for d, s in fam["deltas"])
                         + (" (some *extrap.*)" if fam["extrapolated"] else ""),
                         "—" if not ratios else _span(f"{min(ratios):.2f}", f"{max(ratios):.2f}")]
                if corpus == "ende":
                    cells.append(", ".join(fmt(*bleu) for bleu in fam["test_bleu"]))
                lines.append("| " + " | ".join(cells + [fam["where"]]) + " |")
            lines.append("")
    return "\n".join(lines)


def params_axis(ax):
    """A log parameter axis labelled 100K, 200K, 500K, 1M, ... (matplotlib's minor labels of a
    log axis spanning less than a decade overlap)."""
    from matplotlib import ticker
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(
        lambda x, _pos: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}K" if x >= 1e3 else f"{x:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def plot(runs, rows, out_dir, baseline_label=None):
    """valid_loss_<corpus>.png (the curves of each best point) and params_vs_quality.png (each
    model's best points against parameters; the frontier baseline of ``baseline_label`` drawn as a
    thick dashed black line, and with several baseline labels the frontier the tables use, the
    lower hull of their points (:func:`frontier_points`), as a wide grey band under them)."""
    import logging
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_rows(rows)
    chosen = {(r["corpus"], r["label"], r["dim"], r["lr"]) for r in best}
    # one colour per model in both figures; in the curves, one line style per width (widest solid)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"] + list(plt.cm.tab20.colors[1::2])
    colour = {label: cycle[i % len(cycle)] for i, label in enumerate(sorted({r["label"] for r in runs}))}

    def look(label, frontier):
        """The line of ``label``: its colour, or a thick dashed line for a frontier baseline (black
        for the first, grey for any other)."""
        labels = frontier.split(",") if frontier else []
        if label in labels:
            return dict(color="black" if label == labels[0] else "grey", linestyle="--", linewidth=2.2,
                        label=f"{label} ({'frontier' if len(labels) == 1 else 'baseline'})", zorder=3)
        return dict(color=colour[label], label=label)
    for corpus in sorted({r["corpus"] for r in runs}):
        frontier = (baseline_label or {}).get(corpus)
        keys = dict.fromkeys((r["label"], r.get("dim"), r.get("lr")) for r in runs if r["corpus"] == corpus)
        widths = sorted({k[1] for k in keys}, key=lambda d: d or 0)
        # one panel per width, so that the models' curves at one width can be told apart
        fig, axes = plt.subplots(1, len(widths), figsize=(4.6 * len(widths), 4.4), squeeze=False, sharey=True)
        for ax, width in zip(axes[0], widths):
            for label, dim, lr in keys:
                if dim != width or (corpus, label, dim, lr) not in chosen:
                    continue
                by_update, checkpoints = {}, []
                for run in runs:
                    if (run["corpus"], run["label"], run.get("dim"), run.get("lr")) == (corpus, label, dim, lr):
                        for updates, _loss, nll, _ppl in run["valid_curve"]:
                            by_update.setdefault(updates, []).append(nll)
                        checkpoints.append(checkpoint_point(run["valid_curve"]))
                xs = sorted(by_update)
                line, = ax.plot(xs, [statistics.mean(by_update[x]) for x in xs], marker="o", markersize=2,
                                **look(label, frontier))
                # each seed's best checkpoint (what the tables report): a hollow ring on the curve
                ax.scatter([p[0] for p in checkpoints], [p[2] for p in checkpoints], s=36,
                           facecolors="none", edgecolors=line.get_color(), linewidths=1.2, zorder=4)
            ax.set_xlabel("updates")
            ax.set_title(f"{corpus}" + ("" if width is None else f", d {width}")
                         + ": best lr, mean over seeds (rings: best checkpoints)", fontsize=9)
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("valid NLL (bits/token)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"valid_loss_{corpus}.png"), dpi=90)
        plt.close(fig)

    panels = [(c, "valid_nll") for c in sorted({r["corpus"] for r in best})]
    panels += [("ende", "test_bleu")] if any(r["corpus"] == "ende" and r["test_bleu"][0] is not None
                                             for r in best) else []
    fig, axes = plt.subplots(1, len(panels), figsize=(7.0 * len(panels), 4.8), squeeze=False)
    for ax, (corpus, metric) in zip(axes[0], panels):
        frontier = (baseline_label or {}).get(corpus)
        for label in dict.fromkeys(r["label"] for r in best if r["corpus"] == corpus):
            pts = [r for r in best if r["corpus"] == corpus and r["label"] == label
                   and r["params"] and r[metric][0] is not None]
            if not pts:
                continue
            ax.errorbar([r["params"] for r in pts], [r[metric][0] for r in pts],
                        yerr=[r[metric][1] or 0.0 for r in pts], marker="s" if pts[0]["baseline"] else "o",
                        markersize=4, capsize=2, **look(label, frontier))
        labels = frontier_labels(baseline_label, corpus) if frontier else []
        if metric == "valid_nll" and len(labels) > 1:
            # what the tables measure against: the lower hull of the baselines' points together
            hull = frontier_points(best, corpus, labels)
            ax.plot([10 ** x for x, _y, _std in hull], [y for _x, y, _std in hull], color="black",
                    linewidth=7, alpha=0.18, solid_capstyle="round", zorder=2,
                    label="frontier (lower hull of " + " + ".join(labels) + ")")
        params_axis(ax)
        ax.set_xlabel("parameters (log scale)")
        ax.set_ylabel("test BLEU" if metric == "test_bleu" else "valid NLL (bits/token)")
        ax.set_title(f"{corpus}: best lr per point (error bars: seed std where there are two or more seeds)",
                     fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "params_vs_quality.png"), dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# CLI

def _float_list(text):
    return [float(x) for x in text.split(",") if x]


def _int_list(text):
    return [int(x) for x in text.split(",") if x]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="MODEL", help="translation model spec")
    p.add_argument("--lm-model", action="append", default=[], metavar="MODEL", help="WikiText-2 LM spec")
    p.add_argument("--corpus", choices=["ende", "wikitext", "both"], default="both")
    p.add_argument("--no-baseline", action="store_true", help="do not add fairseq's transformer(_lm)")
    p.add_argument("--frontier-baseline", metavar="LABEL[,LABEL...]",
                   help="label whose frontier the others are measured against (default: fairseq's "
                        "transformer / transformer_lm of the plan); the frontier is the lower convex hull of "
                        "their best points over log parameters (with several, of all their points), "
                        "and the per-width comparison uses the first")
    p.add_argument("--name", default="quality")
    p.add_argument("--out")
    p.add_argument("--dim", dest="dims", type=_int_list, default=[256], metavar="D[,D...]",
                   help="model width(s); several make a size sweep")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, help="FFN width for a single --dim (default 4 d)")
    p.add_argument("--ffn-mult", type=int, default=4, help="FFN width as a multiple of d (default 4)")
    p.add_argument("--dropout", type=float, help="override every model's dropout")
    p.add_argument("--seeds", type=_int_list, default=[1, 2])
    p.add_argument("--confirm-seeds", type=_int_list, default=[], metavar="S[,S...]",
                   help="after the sweep over --seeds, train these seeds too, at the best learning "
                        "rate of each model and width only (cheaper than sweeping every seed)")
    p.add_argument("--max-update", type=int, default=300)
    p.add_argument("--time-budget", type=float, help="wall-clock cap per training run, seconds")
    p.add_argument("--max-tokens", type=int, default=2048)
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
    p.add_argument("--no-bleu", action="store_true")
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
    p.add_argument("--lm-vocab", type=int, default=8000)
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


def run_tag(corpus, label, dim, lr, seed, single_dim, single_lr):
    """Folder name of a run; one width / one rate keep the short names of earlier versions."""
    parts = [corpus, label] + ([] if single_dim else [f"d{dim}"]) + ([] if single_lr else [f"lr{fmt_lr(lr)}"])
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(parts) + f"_s{seed}")


# left out of a run's settings: paths that differ between machines or clones, and how often
# checkpoints are written (which does not change training; earlier versions wrote none)
_UNKEYED_WITH_VALUE = ("--save-dir", "--user-dir", "--save-interval-updates", "--keep-interval-updates")
_UNKEYED = ("--no-epoch-checkpoints", "--no-last-checkpoints")


def comparable_settings(tokens):
    """``tokens`` (training options) without the ones a run's identity does not depend on."""
    key, skip = [], False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token in _UNKEYED_WITH_VALUE:
            skip = True
            continue
        if token not in _UNKEYED:
            key.append(token)
    return key


def settings_key(argv):
    """A run's training settings, for resuming: the options after the data-bin (argv[0]),
    without paths and checkpoint-writing options (:func:`comparable_settings`)."""
    return comparable_settings(argv[1:])


def recorded_run(job, argv, args):
    """The finished run of ``job`` (its run.json) when it was trained with the same settings and
    has everything asked for; else None."""
    corpus, save_dir = job.corpus, job.save_dir
    done_path = os.path.join(save_dir, "run.json")
    if args.no_resume or not os.path.exists(done_path):
        return None
    with open(done_path) as f:
        run = json.load(f)
    have_checkpoint = not args.keep_checkpoints or os.path.exists(os.path.join(save_dir, "checkpoint_best.pt"))
    if (comparable_settings(run.get("settings") or []) == settings_key(argv) and have_checkpoint
            and (corpus != "ende" or args.no_bleu or "test_bleu" in run)):
        return run
    return None


def resumable(save_dir, argv, args):
    """Whether an interrupted attempt with the same settings left a checkpoint_last.pt that
    fairseq-train can go on from."""
    started_path = os.path.join(save_dir, "started.json")
    if args.no_resume or not os.path.exists(started_path):
        return False
    with open(started_path) as f:
        return json.load(f).get("settings") == settings_key(argv) and os.path.exists(
            os.path.join(save_dir, "checkpoint_last.pt"))


def execute_run(job, data, args):
    """Train (and for en-de translate) one run; reuse its run.json when it already finished."""
    corpus, label, arch, overrides, baseline, dim, lr, seed, save_dir = job
    argv = job_argv(job, data, args)
    run = recorded_run(job, argv, args)
    if run is not None:
        return run, True
    done_path = os.path.join(save_dir, "run.json")
    os.makedirs(save_dir, exist_ok=True)
    # an interrupted attempt with the same settings left checkpoint_last.pt: fairseq-train goes
    # on from it and the log is continued; anything else starts afresh
    started_path = os.path.join(save_dir, "started.json")
    resume = resumable(save_dir, argv, args)
    if not resume:
        remove_checkpoints(save_dir, keep_best=False)
        with open(started_path, "w") as f:
            json.dump({"settings": settings_key(argv)}, f)
    else:
        log(f"resuming {save_dir} from its checkpoint_last.pt")
    start = time.time()
    output = run_tool("fairseq-train", argv, os.path.join(save_dir, "train.log"), args.threads,
                      append=resume)
    seconds = time.time() - start
    curve = parse_valid_points(output)
    if not curve:
        raise RuntimeError(f"no validation record in {save_dir}/train.log")
    run = {"corpus": corpus, "label": label, "arch": arch, "overrides": overrides, "seed": seed,
           "dim": dim, "lr": lr, "baseline": baseline, "params": parse_params(output),
           "valid_curve": curve, "updates": curve[-1][0], "train_seconds": seconds,
           "train_wps": parse_train_wps(output),
           "settings": settings_key(argv)}  # without paths, so a moved or cloned study still resumes
    with_checkpoint_metrics(run)
    if resume:
        # this attempt trained from the checkpoint's update on: its time, scaled to the whole run
        # (what --dry-run estimates from); train_wps is this attempt's
        loaded = re.findall(r"\(epoch \d+ @ (\d+) updates\)", output)
        first = int(loaded[-1]) if loaded else 0
        if 0 < first < run["updates"]:
            run["train_seconds"] = seconds * run["updates"] / (run["updates"] - first)
        run["resumed"] = True
    if corpus == "ende" and not args.no_bleu:
        gen = run_tool("fairseq-generate", generate_argv(data[corpus], save_dir, args, args.bpe_codes),
                       os.path.join(save_dir, "generate.log"), args.threads)
        run["test_bleu"] = parse_bleu(gen)
    with open(done_path + ".tmp", "w") as f:
        json.dump(run, f, indent=1)
    os.replace(done_path + ".tmp", done_path)
    remove_checkpoints(save_dir, keep_best=args.keep_checkpoints)  # keep the results small
    if os.path.exists(started_path):
        os.remove(started_path)
    return run, False


def remove_checkpoints(save_dir, keep_best):
    """Delete the run's checkpoints (all but checkpoint_best.pt when ``keep_best``)."""
    for name in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        if name.startswith("checkpoint") and name.endswith(".pt") and not (
                keep_best and name == "checkpoint_best.pt"):
            os.remove(os.path.join(save_dir, name))


def corpus_data(corpus, args):
    """The data-bin of ``corpus``: --ende-data / --lm-data, else the bundled corpus binarized
    under build/data (cached), in which case an en-de without --bpe-codes gets its BPE codes."""
    if corpus == "ende":
        if args.ende_data:
            return args.ende_data
        from binarize_bundled import binarize_ende, ende_paths
        data = binarize_ende(eval_subset=args.eval_subset)
        args.bpe_codes = args.bpe_codes or ende_paths(
            os.path.join(REPO_ROOT, "build", "data"), eval_subset=args.eval_subset)["codes"]
        return data
    if args.lm_data:
        return args.lm_data
    from binarize_bundled import binarize_wikitext
    return binarize_wikitext(nwords=args.lm_vocab)


def check_specs(plan, args):
    """Parse every model spec at every width with fairseq's parser and the plugin's option checks
    before anything trains, so that a bad spec stops the study with one line at once rather
    than hours later, when its first run starts."""
    import contextlib
    import io
    for corpus, label, arch, overrides, _baseline in plan:
        for dim in args.dims:
            messages = io.StringIO()
            try:
                with contextlib.redirect_stderr(messages):
                    parse_fairseq_args(train_argv(corpus, "DATA", arch, overrides, args, 1, "UNUSED", dim,
                                                  args.lrs[0]))
            except (SystemExit, ValueError) as error:
                said = [line for line in messages.getvalue().splitlines() if "error:" in line]
                reason = said[-1].split("error:", 1)[1].strip() if said else str(error)
                raise SystemExit(f"quality.py: {'--model' if corpus == 'ende' else '--lm-model'} "
                                 f"{label} at --dim {dim}: {reason}")


def main(argv=None):
    command_line = list(sys.argv) if argv is None else ["scripts/quality.py", *argv]
    parser = get_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    out_dir = args.out or os.path.join(REPO_ROOT, "results", args.name)
    os.makedirs(out_dir, exist_ok=True)
    load_plugin()
    corpora = ["ende", "wikitext"] if args.corpus == "both" else [args.corpus]

    plan = []  # (corpus, label, arch, overrides, baseline)
    for corpus in corpora:
        specs = args.model if corpus == "ende" else args.lm_model
        if not args.no_baseline:
            plan.append((corpus, BASELINES[corpus], BASELINES[corpus], [], True))
        for spec in specs:
            label, arch, overrides = parse_model_spec(spec)
            plan.append((corpus, label, arch, overrides, False))
    if not plan:
        raise SystemExit("quality.py: nothing to run (give --model / --lm-model, or drop --no-baseline)")
    baseline_label = {c: args.frontier_baseline or BASELINES[c] for c in ("ende", "wikitext")}

    def check_frontier_labels(labels):
        unknown = [label for label in (args.frontier_baseline or "").split(",") if label and label not in labels]
        if unknown:
            parser.error(f"--frontier-baseline: {', '.join(unknown)} is not a model of the study "
                         f"(its models: {', '.join(dict.fromkeys(labels))})")

    if not args.report_only:
        check_frontier_labels([entry[1] for entry in plan])
        check_specs(plan, args)
    data = {}
    if args.report_only or args.dry_run:
        corpora = []
        data = {corpus: "DATA" for corpus in ("ende", "wikitext")}  # not read: no run trains
    for corpus in corpora:
        data[corpus] = corpus_data(corpus, args)

    runs = []
    if args.report_only:
        with open(os.path.join(out_dir, "results.json")) as f:
            saved = json.load(f)
        runs, plan = [with_checkpoint_metrics(run) for run in saved["runs"]], []
        # the report describes the study as it was run, not this command's defaults
        recorded = parser.parse_args(saved["argv"][1:])
        check_args(parser, recorded)
        for name in ("max_update", "max_tokens", "time_budget", "dims", "layers", "heads", "ffn_mult",
                     "lrs", "lr_sweep_dim", "lr_extend", "lr_width_check", "seeds", "confirm_seeds"):
            setattr(args, name, getattr(recorded, name))
        if not args.frontier_baseline and recorded.frontier_baseline:
            baseline_label = {c: recorded.frontier_baseline for c in ("ende", "wikitext")}
        check_frontier_labels([r["label"] for r in runs])
    sweep_dims = [args.lr_sweep_dim] if args.lr_sweep_dim else args.dims

    def job(corpus, label, arch, overrides, baseline, dim, lr, seed):
        tag = run_tag(corpus, label, dim, lr, seed, len(args.dims) == 1, len(args.lrs) == 1)
        return Job(corpus, label, arch, overrides, baseline, dim, lr, seed, os.path.join(out_dir, "runs", tag))

    def best_rate():
        return {(r["corpus"], r["label"], r["dim"]): r["lr"] for r in best_rows(summarise(runs))}

    def model_phases(entry):
        """One model's phases in order, each (what, [((seed, width, rate), job)]), planned from the
        finished runs when the model's previous phase has finished. The triple ranks the jobs of a
        phase across models: seed, then width (narrowest first unless said), then model, then rate."""
        corpus, label = entry[0], entry[1]
        seed_rank = {seed: i for i, seed in enumerate(args.seeds)}
        yield "the learning-rate sweep", [((seed_rank[seed], dim, i), job(*entry, dim, lr, seed))
                                          for seed in args.seeds for dim in sweep_dims
                                          for i, lr in enumerate(args.lrs)]
        for _ in range(args.lr_extend):
            # a best rate at the edge of the grid says the optimum may lie beyond it: one more step
            yield "extending the learning-rate grid where the best rate is at its edge", [
                ((seed_rank[seed], dim, 0), job(*entry, dim, lr, seed)) for seed in args.seeds for dim in sweep_dims
                for lr in [edge_rate(runs, corpus, label, dim, args.lrs)] if lr]
        if args.lr_sweep_dim:
            lr = best_rate()[(corpus, label, args.lr_sweep_dim)]
            yield f"the other widths at its best rate at width {args.lr_sweep_dim}", [
                ((seed_rank[seed], dim, 0), job(*entry, dim, lr, seed))
                for seed in args.seeds for dim in args.dims if dim != args.lr_sweep_dim]
        for _ in range(1 + args.lr_extend if args.lr_width_check and args.lr_sweep_dim else 0):
            # widest first: a carried-over rate too high for a wider model is the costlier error
            yield "one rate step at the other widths: lower when wider, higher when narrower", [
                ((seed_rank[seed], -dim, 0), job(*entry, dim, lr, seed)) for seed in args.seeds for dim in args.dims
                for lr in [rate_step_with_width(runs, corpus, label, dim, args.lr_sweep_dim, args.lrs)] if lr]
        if args.confirm_seeds:
            best = best_rate()
            yield f"confirming the best learning rates with seeds {','.join(map(str, args.confirm_seeds))}", [
                ((seed, dim, 0), job(*entry, dim, best[(corpus, label, dim)], seed))
                for seed in args.confirm_seeds for dim in args.dims]

    def save():
        with open(os.path.join(out_dir, "results.json.tmp"), "w") as f:
            json.dump({"argv": command_line, "runs": runs,
                       "rows": summarise(runs)}, f, indent=1)
        os.replace(os.path.join(out_dir, "results.json.tmp"), os.path.join(out_dir, "results.json"))

    # Each model goes through its phases on its own: a model's next phase is planned as soon as
    # its own runs of the previous one have finished, so no core waits at a phase barrier for the
    # other models' last runs. A free core takes the first ready run in this order: runs that
    # resume an interrupted attempt, then earlier phases, then the order of model_phases (so a
    # partial study has every model's sweep first, and with --jobs 1 the order is phase by phase).
    jobs = []  # every planned run, in the order it was taken
    rank = {}  # save_dir -> (phase, seed, width, model, rate): the order of results.json
    finished = {}
    pending = []  # --dry-run: the jobs a real call would train, in order
    queue = []  # heap of (not resuming, *rank, job)
    phases = {i: model_phases(entry) for i, entry in enumerate(plan)}
    phase_of = {i: -1 for i in phases}
    unfinished = {i: set() for i in phases}  # save_dirs of each model's current phase

    def plan_next_phase(i):
        """Plan model i's next phase that has runs not planned yet. Its runs that already finished
        (their run.json) are taken at once, without a core, which may plan the phase after it."""
        while True:
            try:
                what, keyed = next(phases[i])
            except StopIteration:
                return
            phase_of[i] += 1
            new = [(order, j) for order, j in keyed if j.save_dir not in rank]
            if new:
                break
        if phase_of[i] and not args.dry_run:
            log(f"{plan[i][1]}: {what}: {len(new)} more run{'s' if len(new) > 1 else ''}")
        done = []
        for (seed, dim, lr_rank), j in new:
            rank[j.save_dir] = (phase_of[i], seed, dim, i, lr_rank)
            unfinished[i].add(j.save_dir)
            argv = job_argv(j, data, args)
            run = recorded_run(j, argv, args)
            if run is not None:
                done.append((j, run))
            else:
                heapq.heappush(queue, (not resumable(j.save_dir, argv, args), *rank[j.save_dir], j))
        for j, run in done:
            jobs.append(j)
            record(j, run, reused=True)

    def record(j, run, reused):
        """Keep a finished run; plan its model's next phase when it was the phase's last one
        (returns whether it was)."""
        nonlocal runs
        finished[j.save_dir] = with_checkpoint_metrics(run)
        runs = [finished[d] for d in sorted(finished, key=rank.__getitem__)]
        if not args.dry_run:
            log(f"[{len(finished)}/{len(rank)}] {j.corpus} {j.label} d{j.dim} lr {fmt_lr(j.lr)} seed {j.seed}: "
                + ("reused, " if reused else "")
                + f"valid ppl {run['valid_ppl']:.2f} at update {run['best_update']} of {run['updates']}"
                + (f", BLEU {run['test_bleu']}" if run.get("test_bleu") is not None else "")
                + f" ({run['train_seconds']:.0f} s)")
        i = rank[j.save_dir][3]  # the model's index in the plan
        unfinished[i].discard(j.save_dir)
        if unfinished[i]:
            return False
        plan_next_phase(i)
        return True

    for i in phases:
        plan_next_phase(i)
    if args.dry_run:
        while queue:
            j = heapq.heappop(queue)[-1]
            jobs.append(j)
            pending.append(j)  # not finished: its model's later phases wait for it
    elif plan:
        if finished:  # runs reused from an earlier call
            save()
            write_report(runs, args, baseline_label, out_dir, plots=False)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            running = {}
            while queue or running:
                while queue and len(running) < args.jobs:
                    j = heapq.heappop(queue)[-1]
                    jobs.append(j)
                    running[pool.submit(execute_run, j, data, args)] = j
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    j = running.pop(future)
                    try:
                        run, reused = future.result()
                    except BaseException:
                        for other in running:
                            other.cancel()  # finished runs are saved; a re-run resumes from them
                        raise
                    phase_done = record(j, run, reused)
                    save()
                    # a stopped study keeps a table of every finished run; the plots are redrawn
                    # whenever a model finishes a phase
                    write_report(runs, args, baseline_label, out_dir, plots=phase_done)

    if args.dry_run:
        print(dry_run_report(jobs, pending, plan, runs, args, data))
        return pending
    rows, table = write_report(runs, args, baseline_label, out_dir)
    print(table)
    log(f"wrote {out_dir}/" + ("" if args.report_only else "results.json, ")
        + "table.md, valid_loss_*.png, params_vs_quality.png")
    return rows


def write_report(runs, args, baseline_label, out_dir, plots=True):
    """table.md (and the plots, unless ``plots`` is False) from the finished runs; returns
    (rows, table)."""
    rows = summarise(runs)
    table = "\n".join(part for part in (markdown(rows, args, baseline_label), ranking_markdown(runs),
                                         comparison_markdown(runs, baseline_label)) if part)
    with open(os.path.join(out_dir, "table.md.tmp"), "w") as f:
        f.write(table)
    os.replace(os.path.join(out_dir, "table.md.tmp"), os.path.join(out_dir, "table.md"))
    if runs and plots:
        plot(runs, rows, out_dir, baseline_label)
    return rows, table


def dry_run_report(jobs, pending, plan, runs, args, data):
    """What a real call would do next: each planned run's state and the wall time still needed,
    from the finished runs of the same model and width (of any model at that width when the
    model has none there yet)."""
    waiting = {(j.corpus, j.label) for j in pending}
    lines, seconds, unknown = [], 0.0, 0
    for j in jobs:
        corpus, label, _a, _o, _b, dim, lr, seed, save_dir = j
        name = f"{corpus} {label} d{dim} lr {fmt_lr(lr)} seed {seed}"
        if j not in pending:
            run = next(r for r in runs if (r["corpus"], r["label"], r["dim"], r["lr"], r["seed"])
                       == (corpus, label, dim, lr, seed))
            lines.append(f"  done       {name}: valid ppl {run['valid_ppl']:.2f}")
            continue
        argv = job_argv(j, data, args)
        done_updates = 0
        if resumable(save_dir, argv, args):
            with open(os.path.join(save_dir, "train.log")) as f:
                points = parse_valid_points(f.read())
            done_updates = points[-1][0] if points else 0
        # from the finished runs of the same model and width, else of any model at that width
        same = [r["train_seconds"] for r in runs if (r["corpus"], r["label"], r["dim"]) == (corpus, label, dim)]
        same = same or [r["train_seconds"] for r in runs if (r["corpus"], r["dim"]) == (corpus, dim)]
        if same:
            seconds += statistics.mean(same) * (1.0 - done_updates / args.max_update)
        else:
            unknown += 1
        lines.append(f"  {'resumes' if done_updates else 'to run':<10} {name}"
                     + (f" (from update {done_updates})" if done_updates else ""))
    summary = f"{len(jobs) - len(pending)} of {len(jobs)} planned runs are done; {len(pending)} to train"
    if unknown < len(pending):
        summary += f": about {seconds / 3600.0 / args.jobs:.1f} h of wall time at --jobs {args.jobs}"
    if unknown:
        summary += (f"{', plus' if unknown < len(pending) else ';'} {unknown} run(s) at a width with no "
                    "finished run to estimate the time from")
    lines.append(summary)
    later = [entry[1] for entry in plan if (entry[0], entry[1]) in waiting]
    if later and (args.lr_extend or args.lr_sweep_dim or args.confirm_seeds):
        lines.append("Later phases (grid extension, other widths, width check, --confirm-seeds) of "
                     + ", ".join(later) + " depend on these runs' results and are planned once they finish.")
    return "\n".join(["planned runs (in the order they would start: the ones that resume first, then phase "
                      "by phase):", *lines])


if __name__ == "__main__":
    main()
