"""The study's numbers from its finished runs: each run's best checkpoint, the mean and spread
over seeds, the best learning rate per model and width, the baseline's frontier (the lower
convex hull of its best points over log parameters), each model's distance to it, and when the
ranking of the models settled.

A run is a dict as ``runs/<tag>/run.json`` holds it (:func:`slim_fairseq_lab.study.runs.execute_run`);
a row is the mean over the seeds of one (corpus, model, width, rate) (:func:`summarise`).
"""
import math
import statistics


def mean_std(values):
    """Mean and sample standard deviation; the deviation is None for a single value (one seed
    has no spread, and reporting 0 for it would read as a measured one)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


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
    overfits. Always derived from the stored curve, whatever the run.json says beside it."""
    curve = run.get("valid_curve")
    if curve:
        updates, _loss, nll, ppl = checkpoint_point(curve)
        run.update(valid_nll=nll, valid_ppl=ppl, best_update=updates, last_valid_nll=curve[-1][2])
    return run


def checkpoint_curve(curve):
    """[(updates, nll)]: at each validation, the valid NLL of the best checkpoint up to then, what
    the run would report had it stopped there."""
    return [(point[0], checkpoint_point(curve[:i + 1])[2]) for i, point in enumerate(curve)]


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


def ranking_loss(row):
    """Mean valid loss of a row for ranking; a diverged run (NaN or inf) ranks last."""
    value = row["valid_nll"][0]
    return value if value is not None and math.isfinite(value) else math.inf


def ranking_loss_on(row, seeds):
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
    return min(group, key=(lambda r: ranking_loss_on(r, shared)) if shared else ranking_loss)


def best_rows(rows):
    """Per (corpus, label, dim): the row of the best learning rate (:func:`best_rate_row`)."""
    groups = {}
    for row in rows:
        if row["valid_nll"][0] is not None:
            groups.setdefault((row["corpus"], row["label"], row["dim"]), []).append(row)
    return sorted((best_rate_row(group) for group in groups.values()),
                  key=lambda r: (r["corpus"], r["label"], r["params"] or 0))


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
    from its nearest point; None when either has one seed only). ``params_ratio``: the point's
    parameters over those the baseline needs for the same valid NLL (< 1 = fewer parameters for
    equal quality), when that loss lies on or between the baseline's points.
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
    """Whether the budget was long enough for the ranking of the models to settle: the
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
