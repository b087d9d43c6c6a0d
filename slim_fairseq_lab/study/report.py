"""The study's report: ``table.md`` (every run, each best point against the baseline frontier, each
model over its widths, when the ranking settled, a per-width comparison with a seed-spread
verdict), ``results.json``, and the plan that ``--dry-run`` prints."""
import json
import os
import statistics

from slim_fairseq_lab import fairseq_logs
from slim_fairseq_lab.study import plot as study_plot
from slim_fairseq_lab.study.runs import fmt_lr, job_argv, resumable
from slim_fairseq_lab.study.summary import (best_rows, compare_to_baseline, family_summary, frontier_labels,
                                            frontier_rows, ranking_stability, summarise)


def fmt(mean, std, digits=2, signed=False):
    """``mean ± std``; the mean alone where there is no spread (one seed)."""
    if mean is None:
        return "—"
    return f"{mean:{'+' if signed else ''}.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def fmt_delta(delta, std):
    """A valid-NLL difference with its spread, or with "one seed" where either side has one."""
    return fmt(delta, std, digits=3, signed=True) + (" (one seed)" if std is None else "")


def frontier_name(baseline_label, corpus):
    return " + ".join(f"`{label}`" for label in frontier_labels(baseline_label, corpus))


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
        study_plot.plot(runs, rows, out_dir, baseline_label)
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
                points = fairseq_logs.valid_points(f.read())
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


def save_results(out_dir, command_line, runs):
    """results.json: the command line of the study, every finished run and the summary rows."""
    with open(os.path.join(out_dir, "results.json.tmp"), "w") as f:
        json.dump({"argv": command_line, "runs": runs, "rows": summarise(runs)}, f, indent=1)
    os.replace(os.path.join(out_dir, "results.json.tmp"), os.path.join(out_dir, "results.json"))
