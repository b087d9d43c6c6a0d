#!/usr/bin/env python3
"""Equal-budget quality comparison on the bundled corpora (issue 8, item 2).

Every model (plus fairseq's ``transformer`` / ``transformer_lm`` baseline of the same shape) is
trained with ``fairseq-train`` under the same budget -- the same ``--max-update`` and
``--max-tokens`` (so the same number of training tokens), optionally capped in wall time by
``--time-budget`` (fairseq's ``--stop-time-hours``) -- for every seed, then evaluated:

* en-de translation (``--corpus ende``): valid perplexity (fairseq's masked per-token
  perplexity of the label-smoothing-free NLL, base 2, padding excluded -- docs/TECHNIQUES.md#metrics-not-comparable-with-fairseq) and test
  BLEU (``fairseq-generate`` beam 5, detokenized with Moses + subword-nmt, ``--scoring
  sacrebleu``);
* WikiText-2 language modelling (``--corpus wikitext``): valid perplexity.

Output (``--out``, default ``results/<name>``): ``results.json`` (every run, every valid point),
``table.md`` (mean ± std over seeds), ``valid_loss_<corpus>.png`` (valid-loss curves, mean over
seeds) and ``params_vs_quality.png``.

Example::

    python scripts/quality.py --name q256 --corpus both --dim 256 --layers 3 --heads 4 \\
        --seeds 1,2 --max-update 300 --model anthe_base --model sandwich_base \\
        --lm-model stlm_tied --lm-model skipless_lm

``--model`` specs (translation) and ``--lm-model`` specs (WikiText-2) are
``[LABEL=]ARCH [fairseq overrides...]``, as in scripts/benchmark.py.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO_ROOT, "slim_fairseq")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))

from benchmark import accepted_flags, load_plugin, parse_model_spec, shape_overrides  # noqa: E402

BASELINES = {"ende": "transformer", "wikitext": "transformer_lm"}


def log(message):
    print(f"[quality] {message}", flush=True)


def run_tool(tool, argv, log_path, threads):
    """Run a fairseq console script, tee its output to ``log_path``; return the output."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONWARNINGS="ignore")
    cmd = [os.path.join(BIN, tool), *argv]
    with open(log_path, "w") as f:  # streamed, so progress can be followed in the log
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env)
    with open(log_path) as f:
        output = f.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed ({proc.returncode}), see {log_path}:\n{output[-3000:]}")
    return output


def parse_valid_points(output):
    """Every ``valid`` record of a ``--log-format json`` training log: [(updates, loss, nll, ppl)]."""
    points = []
    for line in output.splitlines():
        match = re.search(r"\| valid \| (\{.*\})\s*$", line)
        if not match:
            continue
        record = json.loads(match.group(1))
        loss = float(record["valid_loss"])
        nll = float(record.get("valid_nll_loss", loss))
        points.append((int(float(record["valid_num_updates"])), loss, nll, float(record["valid_ppl"])))
    return points


def parse_params(output):
    match = re.search(r"num\. shared model params: ([\d,]+)", output)
    return int(match.group(1).replace(",", "")) if match else None


def parse_bleu(output):
    match = re.search(r"BLEU\s*=\s*([\d.]+)", output.split("Generate test with beam")[-1])
    return float(match.group(1)) if match else None


def train_argv(corpus, data, arch, overrides, args, seed, save_dir):
    lm = corpus == "wikitext"
    argv = [data, "--user-dir", PLUGIN_DIR, "--arch", arch, "--cpu", "--seed", str(seed),
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-last-checkpoints",
            "--max-update", str(args.max_update), "--max-tokens", str(args.max_tokens),
            "--validate-interval-updates", str(args.validate_interval),
            "--save-interval-updates", "0", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", str(args.warmup or max(1, args.max_update // 10)),
            "--warmup-init-lr", "1e-07", "--clip-norm", "1.0", "--num-workers", "0",
            "--log-format", "json", "--log-interval", str(args.validate_interval),
            "--skip-invalid-size-inputs-valid-test"]
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
    argv += shape_overrides(arch, lm, args.dim, args.layers, args.heads, args.ffn)
    if args.dropout is not None and "--dropout" in accepted_flags(arch):
        argv += ["--dropout", str(args.dropout)]
    return argv + overrides


def generate_argv(data, save_dir, args, bpe_codes):
    argv = [data, "--user-dir", PLUGIN_DIR, "--path", os.path.join(save_dir, "checkpoint_best.pt"),
            "--cpu", "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--gen-subset", "test", "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10",
            "--max-tokens", "4096", "--scoring", "sacrebleu",
            "--quiet"]
    if bpe_codes:
        argv += ["--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", bpe_codes]
    else:
        argv += ["--remove-bpe"]
    return argv


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(mean, std, digits=2):
    return "—" if mean is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def summarise(runs):
    groups = {}
    for run in runs:
        groups.setdefault((run["corpus"], run["label"]), []).append(run)
    rows = []
    for (corpus, label), group in groups.items():
        row = {"corpus": corpus, "label": label, "arch": group[0]["arch"], "seeds": [r["seed"] for r in group],
               "params": group[0]["params"], "baseline": group[0]["baseline"]}
        for key in ("valid_ppl", "valid_nll", "test_bleu", "train_seconds", "updates"):
            row[key] = mean_std([r.get(key) for r in group])
        rows.append(row)
    return rows


def markdown(rows, args):
    lines = [f"Equal budget: {args.max_update} updates of ≤{args.max_tokens} tokens"
             + (f", ≤{args.time_budget:.0f} s" if args.time_budget else "")
             + f"; shape d={args.dim}, L={args.layers}, heads={args.heads}, ffn={args.ffn}; seeds "
             f"{','.join(map(str, args.seeds))}; mean ± std over seeds.", ""]
    for corpus, title in (("ende", "en-de (bundled)"), ("wikitext", "WikiText-2 (bundled)")):
        subset = [r for r in rows if r["corpus"] == corpus]
        if not subset:
            continue
        lines += [f"**{title}**", ""]
        head = ["model", "params", "seeds", "valid PPL"] + (["test BLEU"] if corpus == "ende" else [])
        head += ["train s", "updates"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in subset:
            cells = [r["label"] + (" (baseline)" if r["baseline"] else ""),
                     "—" if r["params"] is None else f"{r['params']:,}", str(len(r["seeds"])),
                     fmt(*r["valid_ppl"])]
            if corpus == "ende":
                cells.append(fmt(*r["test_bleu"]))
            cells += [fmt(*r["train_seconds"], digits=0), fmt(*r["updates"], digits=0)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(runs, rows, out_dir):
    import logging
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for corpus in sorted({r["corpus"] for r in runs}):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for label in dict.fromkeys(r["label"] for r in runs if r["corpus"] == corpus):
            curves = [r["valid_curve"] for r in runs if r["corpus"] == corpus and r["label"] == label]
            by_update = {}
            for curve in curves:
                for updates, _loss, nll, _ppl in curve:
                    by_update.setdefault(updates, []).append(nll)
            xs = sorted(by_update)
            ax.plot(xs, [statistics.mean(by_update[x]) for x in xs], marker="o", markersize=3, label=label)
        ax.set_xlabel("updates")
        ax.set_ylabel("valid NLL (bits/token)")
        ax.set_title(f"{corpus}: valid loss (mean over seeds)", fontsize=9)
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"valid_loss_{corpus}.png"), dpi=80)
        plt.close(fig)

    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.0 * len(corpora), 3.8), squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        metric = "test_bleu" if corpus == "ende" else "valid_ppl"
        for r in rows:
            if r["corpus"] != corpus or r["params"] is None or r[metric][0] is None:
                continue
            ax.errorbar(r["params"] / 1e6, r[metric][0], yerr=r[metric][1], fmt="s" if r["baseline"] else "o")
            ax.annotate(r["label"], (r["params"] / 1e6, r[metric][0]), fontsize=6)
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel("test BLEU" if corpus == "ende" else "valid PPL")
        ax.set_title(corpus, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "params_vs_quality.png"), dpi=80)
    plt.close(fig)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="MODEL", help="translation model spec")
    p.add_argument("--lm-model", action="append", default=[], metavar="MODEL", help="WikiText-2 LM spec")
    p.add_argument("--corpus", choices=["ende", "wikitext", "both"], default="both")
    p.add_argument("--no-baseline", action="store_true", help="do not add fairseq's transformer(_lm)")
    p.add_argument("--name", default="quality")
    p.add_argument("--out")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, help="FFN width (default 4 d)")
    p.add_argument("--dropout", type=float, help="override every model's dropout")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 2])
    p.add_argument("--max-update", type=int, default=300)
    p.add_argument("--time-budget", type=float, help="wall-clock cap per training run, seconds")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--validate-interval", type=int, default=50, help="validate every N updates")
    p.add_argument("--max-valid-steps", type=int, help="cap validation batches (fairseq --max-valid-steps)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, help="warm-up updates (default max-update / 10)")
    p.add_argument("--tokens-per-sample", type=int, default=128, help="LM block length")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--no-bleu", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="only re-write table.md and the plots from the runs in <out>/results.json "
                        "(e.g. after stopping a long comparison early)")
    p.add_argument("--ende-data", help="en-de data-bin (default: bundled corpus, --eval-subset sentences)")
    p.add_argument("--bpe-codes", help="BPE codes of --ende-data (for detokenized BLEU)")
    p.add_argument("--eval-subset", type=int, default=300, help="en-de valid/test sentences when binarizing")
    p.add_argument("--lm-data", help="WikiText-2 data-bin (default: bundled corpus, --lm-vocab)")
    p.add_argument("--lm-vocab", type=int, default=8000)
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    args.ffn = args.ffn or 4 * args.dim
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

    data = {}
    if args.report_only:
        corpora = []
    if "ende" in corpora:
        if args.ende_data:
            data["ende"] = args.ende_data
        else:
            from binarize_bundled import binarize_ende, ende_paths
            data["ende"] = binarize_ende(eval_subset=args.eval_subset)
            args.bpe_codes = args.bpe_codes or ende_paths(
                os.path.join(REPO_ROOT, "build", "data"), eval_subset=args.eval_subset)["codes"]
    if "wikitext" in corpora:
        if args.lm_data:
            data["wikitext"] = args.lm_data
        else:
            from binarize_bundled import binarize_wikitext
            data["wikitext"] = binarize_wikitext(nwords=args.lm_vocab)

    runs = []
    if args.report_only:
        with open(os.path.join(out_dir, "results.json")) as f:
            runs = json.load(f)["runs"]
        plan, args.seeds = [], sorted({r["seed"] for r in runs})
    total = len(plan) * len(args.seeds)
    for seed in ([] if args.report_only else args.seeds):  # seed-major order: a partial result already covers every model
        for corpus, label, arch, overrides, baseline in plan:
            tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{corpus}_{label}_s{seed}")
            save_dir = os.path.join(out_dir, "runs", tag)
            os.makedirs(save_dir, exist_ok=True)
            log(f"[{len(runs) + 1}/{total}] train {corpus} {label} seed {seed}")
            start = time.time()
            output = run_tool("fairseq-train", train_argv(corpus, data[corpus], arch, overrides, args, seed, save_dir),
                              os.path.join(save_dir, "train.log"), args.threads)
            seconds = time.time() - start
            curve = parse_valid_points(output)
            if not curve:
                raise RuntimeError(f"no validation record in {save_dir}/train.log")
            run = {"corpus": corpus, "label": label, "arch": arch, "overrides": overrides, "seed": seed,
                   "baseline": baseline, "params": parse_params(output), "valid_curve": curve,
                   "updates": curve[-1][0], "valid_nll": curve[-1][2], "valid_ppl": curve[-1][3],
                   "train_seconds": seconds}
            if corpus == "ende" and not args.no_bleu:
                gen = run_tool("fairseq-generate", generate_argv(data[corpus], save_dir, args, args.bpe_codes),
                               os.path.join(save_dir, "generate.log"), args.threads)
                run["test_bleu"] = parse_bleu(gen)
            ckpt = os.path.join(save_dir, "checkpoint_best.pt")
            if os.path.exists(ckpt):
                os.remove(ckpt)  # keep the results directory small
            log(f"  {label} seed {seed}: valid ppl {run['valid_ppl']:.2f} after {run['updates']} updates"
                + (f", BLEU {run['test_bleu']}" if run.get("test_bleu") is not None else "")
                + f" ({seconds:.0f} s)")
            runs.append(run)
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump({"argv": sys.argv if argv is None else ["scripts/quality.py", *argv], "runs": runs,
                           "rows": summarise(runs)}, f, indent=1)

    rows = summarise(runs)
    table = markdown(rows, args)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    plot(runs, rows, out_dir)
    print(table)
    log(f"wrote {out_dir}/results.json, table.md, valid_loss_*.png, params_vs_quality.png")
    return rows


if __name__ == "__main__":
    main()
