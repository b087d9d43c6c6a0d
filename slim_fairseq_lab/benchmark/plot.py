"""The benchmark's plots: ``ratios.png`` (every ratio against the baseline, per model) and
``throughput.png`` (training tokens/s against parameters)."""
import os

from slim_fairseq_lab.plotting import pyplot


def plot(rows, args, out_dir):
    """ratios.png and throughput.png of the benchmark's rows."""
    plt = pyplot()
    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    metrics = [("params", "params"), ("train_tokens_per_s", "train tok/s"), ("peak_memory", "peak mem")]
    metrics += [(f"gen_b{b}_beam{k}", f"gen b{b} beam{k}") for b, k in gen_keys]
    labels = [r["label"] for r in rows]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.9 * len(labels) + 2.0)), 4.5))
    width = 0.8 / len(metrics)
    for j, (key, name) in enumerate(metrics):
        values = [r["ratios"][key] if r["ratios"][key] is not None else 0.0 for r in rows]
        ax.bar([i + (j - (len(metrics) - 1) / 2) * width for i in range(len(rows))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("ratio vs fairseq baseline")
    ax.set_title(f"d={args.dim} L={args.layers} h={args.heads} ({args.dtype})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ratios.png"), dpi=80)
    plt.close(fig)

    trained = [r for r in rows if r["train_tokens_per_s"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    for r in trained:
        ax.scatter(r["params"] / 1e6, r["train_tokens_per_s"], marker="s" if r["baseline"] else "o")
        ax.annotate(r["label"], (r["params"] / 1e6, r["train_tokens_per_s"]), fontsize=6)
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("training tokens/s")
    ax.set_title("training throughput vs size", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=80)
    plt.close(fig)
