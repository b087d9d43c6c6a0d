"""The benchmark's report: one row per model (medians over the interleaved repetitions, ratios
against the baseline of the same task as medians of per-repetition ratios), ``table.md``,
``results.json``, and the same again from a results.json (``--report-only``)."""
import copy
import json
import os
import statistics

from slim_fairseq_lab.benchmark import plot as bench_plot
from slim_fairseq_lab.benchmark.measure import Entry, default_gemm_size
from slim_fairseq_lab.paths import output_dir


def log(message):
    print(f"[benchmark] {message}", flush=True)


def median(values):
    return statistics.median(values) if values else None


def ratio(value, base):
    if value is None or base in (None, 0):
        return None
    return value / base


def fmt_ratio(value):
    return "—" if value is None else f"{value:.2f}×"


def fmt_num(value, digits=0):
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def paired_ratio(values, base_values):
    """Median over repetitions of ``value / baseline value`` of the same repetition. Runs are
    interleaved, so a slow moment of the machine hits both members of a pair; the median of
    the pairs is steadier than the ratio of two medians (used when the counts differ)."""
    if values and base_values and len(values) == len(base_values):
        return statistics.median(v / b for v, b in zip(values, base_values))
    return ratio(median(values), median(base_values))


def median_parts(repetitions):
    """{part: {direction: median seconds}} over the repetitions of :func:`time_by_part`, or None."""
    if not repetitions:
        return None
    return {part: {d: median([rep[part][d] for rep in repetitions if part in rep]) for d in ("forward", "backward")}
            for part in dict.fromkeys(p for rep in repetitions for p in rep)}


def ops_ratio(entry, base, step):
    """Aten ops (top-level) of one step of ``entry`` over the baseline's, or None."""
    if not entry.ops or not base.ops:
        return None
    return ratio(entry.ops[step]["top"], base.ops[step]["top"])


def summarise(entries, args, peaks):
    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    baselines = {e.lm: e for e in entries if e.baseline}
    rows = []
    for e in entries:
        base = baselines[e.lm]
        peak_flops = peaks.get("matmul_gflops")
        train = median(e.train_tps)
        gflops = median(e.train_gflops)
        row = {
            "label": e.label, "arch": e.arch, "overrides": e.overrides, "task": "lm" if e.lm else "translation",
            "baseline": e.baseline, "dense_export_of": e.export_of,
            "params": e.params, "non_embedding_params": e.non_embedding,
            "train_tokens_per_s": train, "train_tokens_per_s_all": e.train_tps,
            "train_gflops": gflops, "train_gflops_all": e.train_gflops,
            "train_peak_fraction": ratio(gflops, peak_flops),
            "peak_memory_bytes": e.peak_bytes,
            "saved_by_module": e.saved_by_module,
            "time_by_part": median_parts(e.time_by_part),
            "time_by_part_all": e.time_by_part,
            "ops": e.ops,
            "generation_tokens_per_s": {f"b{b}_beam{k}": median(e.gen.get((b, k), [])) for b, k in gen_keys},
            "generation_tokens_per_s_all": {f"b{b}_beam{k}": e.gen.get((b, k), []) for b, k in gen_keys},
            "ratios": {
                "params": ratio(e.params, base.params),
                "non_embedding_params": ratio(e.non_embedding, base.non_embedding),
                "train_tokens_per_s": paired_ratio(e.train_tps, base.train_tps),
                "peak_memory": ratio(e.peak_bytes, base.peak_bytes),
                "ops_train": ops_ratio(e, base, "train"),
                "ops_decode": ops_ratio(e, base, "decode"),
                **{f"gen_b{b}_beam{k}": paired_ratio(e.gen.get((b, k), []), base.gen.get((b, k), []))
                   for b, k in gen_keys},
            },
        }
        rows.append(row)
    return rows


def model_columns(intro, corner, rows):
    """The opening lines of a markdown table with one column per model, after ``intro``."""
    return ["", intro, "", f"| {corner} | " + " | ".join(r["label"] for r in rows) + " |",
            "|" + "---|" * (len(rows) + 1)]


def time_breakdown_table(rows):
    """Markdown: one training step's forward + backward time by part, per model (ms, median over
    repetitions), with each part's ratio to the baseline's same part."""
    rows = [r for r in rows if r.get("time_by_part")]
    if not rows:
        return []
    base = next((r for r in rows if r["baseline"]), rows[0])
    order = ["embeddings", "attention", "feed-forward", "output projection", "rest", "step"]
    names = [n for n in order if any(n in r["time_by_part"] for r in rows)]
    lines = model_columns(
        "Where the training time goes (`--time-breakdown`): one forward + backward of batch 0, ms "
        "(median over repetitions; forward / backward in brackets), × the baseline's same part. "
        "`rest` = norms, residuals, dropout outside the parts, the loss; the hooks themselves add a "
        "little to every part:", "part", rows)
    for name in names:
        cells = []
        for r in rows:
            part = r["time_by_part"].get(name)
            if part is None:
                cells.append("—")
                continue
            total = part["forward"] + part["backward"]
            base_part = base["time_by_part"].get(name)
            base_total = base_part and base_part["forward"] + base_part["backward"]
            cells.append(f"{1e3 * total:,.0f} ({1e3 * part['forward']:,.0f} / {1e3 * part['backward']:,.0f})"
                         + (f", {total / base_total:.2f}×" if base_total else ""))
        lines.append(f"| {'**step**' if name == 'step' else name} | " + " | ".join(cells) + " |")
    return lines


def breakdown_table(rows):
    """Markdown: the memory of one training step taken apart, one column per model (MiB)."""
    rows = [r for r in rows if r.get("saved_by_module")]
    if not rows:
        return []
    mib = lambda b: "—" if b is None else f"{b / 2 ** 20:,.1f}"  # noqa: E731
    modules = {}
    for r in rows:
        for name, nbytes in r["saved_by_module"].items():
            modules[name] = max(modules.get(name, 0), nbytes)
    lines = model_columns(
        "Where the training memory goes (MiB; `--memory-breakdown`): weights, their gradients and "
        "Adam's two moments (4 × fp32 parameters), then the activations autograd keeps for backward, "
        "by the module that kept them (layers folded to N; modules under 0.5 % of the largest total "
        "left out):", "", rows)
    lines.append("| peak of the step | " + " | ".join(mib(r["peak_memory_bytes"]) for r in rows) + " |")
    lines.append("| weights + grads + Adam | " + " | ".join(mib(16 * r["params"]) for r in rows) + " |")
    lines.append("| activations kept for backward | "
                 + " | ".join(mib(sum(r["saved_by_module"].values())) for r in rows) + " |")
    smallest = 0.005 * max(sum(r["saved_by_module"].values()) for r in rows)
    for name in sorted(modules, key=lambda n: -modules[n]):
        if modules[name] >= smallest:  # leave out modules below 0.5 % of the largest total
            lines.append(f"| `{name}` | " + " | ".join(mib(r["saved_by_module"].get(name)) for r in rows) + " |")
    return lines


def markdown_table(rows, args, peaks, threads):
    """table.md: the ratios against the baseline, the absolute numbers, the breakdowns asked for
    and the --pair ratios."""
    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    measured = ("peak training memory of one step only (--memory-only)"
                if peaks.get("matmul_gflops") is None else
                f"matmul peak {peaks['matmul_gflops']:.1f} GFLOP/s ({args.gemm_size}² GEMM); "
                f"{args.repeats} interleaved repetitions, medians")
    lines = [f"Shape: d={args.dim}, L={args.layers}, heads={args.heads}, ffn={args.ffn}; device "
             f"{peaks['device']}, dtype {args.dtype}, threads {threads}; {measured}.", ""]
    lines.append("Ratios vs the fairseq baseline of the same task and shape (higher = faster / larger; "
                 "speed ratios are medians of per-repetition ratios):")
    lines.append("")
    ops = any(r.get("ops") for r in rows)
    head = ["model", "params", "non-emb params", "train tok/s", "peak mem"]
    head += [f"gen b{b} beam{k}" for b, k in gen_keys]
    head += ["ops/train step", "ops/decode step"] if ops else []
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        q = r["ratios"]
        cells = [r["label"] + (" (baseline)" if r["baseline"] else ""), fmt_ratio(q["params"]),
                 fmt_ratio(q["non_embedding_params"]), fmt_ratio(q["train_tokens_per_s"]),
                 fmt_ratio(q["peak_memory"])]
        cells += [fmt_ratio(q[f"gen_b{b}_beam{k}"]) for b, k in gen_keys]
        cells += [fmt_ratio(q.get("ops_train")), fmt_ratio(q.get("ops_decode"))] if ops else []
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Absolute numbers:", ""]
    head = ["model", "arch", "params", "non-emb", "train tok/s", "GFLOP/s", "% of peak", "peak MiB"]
    head += [f"gen tok/s b{b} beam{k}" for b, k in gen_keys]
    head += ["ops/train step", "ops/decode step"] if ops else []
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        frac = r["train_peak_fraction"]
        mem = r["peak_memory_bytes"]
        cells = [r["label"], r["arch"], fmt_num(r["params"]), fmt_num(r["non_embedding_params"]),
                 fmt_num(r["train_tokens_per_s"]), fmt_num(r["train_gflops"], 1),
                 "—" if frac is None else f"{100 * frac:.0f}%",
                 "—" if mem is None else fmt_num(mem / 2 ** 20)]
        cells += [fmt_num(r["generation_tokens_per_s"][f"b{b}_beam{k}"]) for b, k in gen_keys]
        if ops:
            step_ops = r.get("ops") or {}
            cells += [fmt_num(step_ops.get(step, {}).get("top"), 1 if step == "decode" else 0)
                      for step in ("train", "decode")]
        lines.append("| " + " | ".join(cells) + " |")
    if ops:
        lines += ["", "ops: aten ops of one training step (forward, loss, backward) and one decoding "
                  "step on a batch of 8 x 32 tokens, counted with torch.profiler on "
                  f"{peaks['device']} (each op called from Python or autograd once; "
                  "slim_fairseq_lab/benchmark/op_count.py): a proxy for kernel launches."]
    lines += breakdown_table(rows)
    lines += time_breakdown_table(rows)
    if args.pair:
        by_label = {r["label"]: r for r in rows}
        lines += ["", "Pairs (speed of A relative to B, same run):", ""]
        head = ["A vs B", "train tok/s"] + [f"gen b{b} beam{k}" for b, k in gen_keys]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for pair in args.pair:
            a, b = (by_label.get(x) for x in pair.split(":", 1))
            if a is None or b is None:
                raise ValueError(f"--pair {pair}: labels must be among {sorted(by_label)}")
            cells = [f"{a['label']} vs {b['label']}",
                     fmt_ratio(paired_ratio(a["train_tokens_per_s_all"], b["train_tokens_per_s_all"]))]
            cells += [fmt_ratio(paired_ratio(a["generation_tokens_per_s_all"][f"b{x}_beam{k}"],
                                             b["generation_tokens_per_s_all"][f"b{x}_beam{k}"]))
                      for x, k in gen_keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def entries_from_results(rows):
    """Entry objects back from the rows of a results.json (for --report-only)."""
    entries = []
    for r in rows:
        e = Entry(r["label"], r["arch"], r["overrides"], r["task"] == "lm", baseline=r["baseline"],
                  export_of=r["dense_export_of"])
        e.params, e.non_embedding, e.peak_bytes = r["params"], r["non_embedding_params"], r["peak_memory_bytes"]
        e.saved_by_module = r.get("saved_by_module")
        e.ops = r.get("ops")
        e.time_by_part = r.get("time_by_part_all") or []
        e.train_tps = r["train_tokens_per_s_all"]
        e.train_gflops = r.get("train_gflops_all") or ([r["train_gflops"]] if r["train_gflops"] else [])
        for key, values in r["generation_tokens_per_s_all"].items():
            batch, beam = key[1:].split("_beam")
            if values:  # a run without generation may record empty lists
                e.gen[(int(batch), int(beam))] = values
        entries.append(e)
    return entries


def report_only(args):
    """Re-write table.md and the plots of an earlier run from its results.json."""
    out_dir = output_dir(args.name, args.out)
    with open(os.path.join(out_dir, "results.json")) as f:
        saved = json.load(f)
    meta = saved["meta"]
    run_args = copy.copy(args)  # --pair comes from this command line
    for key in ("dim", "layers", "heads", "ffn", "dtype"):
        setattr(run_args, key, meta[key])
    run_args.gemm_size = meta.get("gemm_size") or default_gemm_size(cuda=not meta["device"].startswith("cpu"))
    entries = entries_from_results(saved["rows"])
    run_args.batch_sizes = sorted({b for b, _ in entries[0].gen})
    run_args.beams = sorted({k for _, k in entries[0].gen})
    run_args.repeats = max(len(e.train_tps or next(iter(e.gen.values()), [])) for e in entries)
    peaks = {"device": meta["device"], "matmul_gflops": meta["matmul_gflops"]}
    rows = summarise(entries, run_args, peaks)
    return write_outputs(out_dir, meta, rows, run_args, peaks)


def write_outputs(out_dir, meta, rows, args, peaks):
    """results.json, table.md and the plots of one run; prints the table."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    table = markdown_table(rows, args, peaks, threads=meta["threads"])
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    bench_plot.plot(rows, args, out_dir)
    print(table)
    log(f"wrote {out_dir}/results.json, table.md, ratios.png, throughput.png")
    return rows
