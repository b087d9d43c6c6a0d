"""The study's plots: ``valid_loss_<corpus>.png`` (the valid-loss curves of every best point, one
panel per width) and ``params_vs_quality.png`` (each model's best points against parameters)."""
import os
import statistics

from slim_fairseq_lab.plotting import pyplot
from slim_fairseq_lab.study.summary import best_rows, checkpoint_point, frontier_labels, frontier_points


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
    plt = pyplot()
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
