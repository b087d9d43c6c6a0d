"""report.json and report.md of the device check (:mod:`slim_fairseq_lab.gpu_check`)."""
import json
import os

STAGE_TITLES = {"contract": "Architecture contract", "removal": "Skipless weight removal",
                "tc_layers": "Tensor-Chain layers: materialise or contract",
                "train": "fairseq-train precision flags", "benchmark": "Benchmark against fairseq's transformer"}


def write(out_dir, state):
    """Write both files (each replaced whole, so a reader never sees half of one)."""
    for name, text in (("report.json", json.dumps(state, indent=1, default=str)), ("report.md", markdown(state))):
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, name))


def _num(value, fmt="{:.3g}"):
    return "—" if value is None else fmt.format(value)


def _ratio(value):
    return "—" if value is None else f"{value:.2f}×"


def _table(head, rows):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def markdown(state):
    env = state["environment"]
    lines = ["# Device check", "",
             f"Device: **{env['device']}**; torch {env['torch']} (CUDA {env['cuda']}), fairseq "
             f"{env['fairseq']}, Python {env['python']}. Budget {env['budget_s']:.0f} s, "
             f"used {state.get('elapsed_s', 0):.0f} s.", ""]
    if env["differs"]:
        lines += ["This is the CPU run (`--cpu`): the same code as on a GPU, with these differences:", ""]
        lines += [f"* {d}" for d in env["differs"]] + [""]
    stages = state["stages"]
    lines += _table(["stage", "status", "seconds"],
                    [[STAGE_TITLES[k], v["status"], _num(v.get("seconds"), "{:.0f}")] for k, v in stages.items()])
    for key, render in (("contract", _contract), ("removal", _removal), ("tc_layers", _tc_layers),
                        ("train", _train), ("benchmark", _benchmark)):
        stage = stages.get(key)
        if stage is None:
            continue
        lines += ["", f"## {STAGE_TITLES[key]}", ""]
        if stage.get("error"):
            lines += [f"**{stage['status']}**: {stage['error']}", ""]
        if stage["status"] != "skipped" and not stage.get("error"):
            lines += render(stage)
    return "\n".join(lines) + "\n"


def _contract(stage):
    tol = stage["tolerances"]
    lines = ["Worst |Δ log-probability| (nats) of each check; tolerances per dtype: "
             + "; ".join(f"{d}: match {t['match']:g}, leak {t['leak']:g}" for d, t in tol.items())
             + ". `gradients` shows the loss; `checkpoint` needs bit-identical outputs. A check that "
             "fails in fp32 is run again on a float64 copy of the model: passing there means fp32 "
             "rounding or a reduced-precision kernel, failing there too means a wrong result.", ""]
    checks = list(stage["results"][0]["checks"]) if stage["results"] else []
    rows = []
    for r in stage["results"]:
        cells = [f"{r['family']} (`{r['arch']}`)", r["dtype"]]
        for name in checks:
            c = r["checks"][name]
            cell = _num(c["value"]) if c["ok"] else f"**FAILED**: {c['error']}"
            if "float64" in c:
                cell += ("; float64: " + _num(c["float64"]) if c["float64"] is not None
                         else f"; float64 fails too: {c.get('float64_error')}")
            cells.append(cell)
        rows.append(cells)
    return lines + _table(["model", "dtype", *checks], rows)


def _removal(stage):
    lines = [f"Converted in float64, both models in fp32 on the device: max |Δ log-prob| / max |log-prob| "
             f"(tolerance {stage['tolerance']:g}).", ""]
    return lines + _table(["preset", "removed", "max relative error", "ok"],
                          [[f"`{r['arch']}`", r["removed"], f"{r['max_relative_error']:.2e}", "yes" if r["ok"] else "**no**"]
                           for r in stage["results"]])


def _tc_layers(stage):
    lines = ["Each chain alone (cores and input in the dtype), best of the repetitions, ms. Training = "
             "forward + backward; inference = forward without grad in eval mode (a materialised W is "
             "built once). `auto` = what the policy picks for training / inference.", ""]
    rows = []
    for r in stage["results"]:
        rows.append([r["dtype"], f"{r['shape']} b{r['bond']}", r["rows"], f"{r['cost_ratio']:.2f}",
                     f"{1e3 * r['train_materialise']:.3f}", f"{1e3 * r['train_contract']:.3f}",
                     f"{1e3 * r['train_contract_store']:.3f}", f"{1e3 * r['infer_materialise']:.3f}",
                     f"{1e3 * r['infer_contract']:.3f}",
                     r["auto"] + ("" if r.get("auto_infer", r["auto"]) == r["auto"]
                                  else f" / {r['auto_infer']}")])
    lines += _table(["dtype", "chain", "rows", "cost ratio", "train mat", "train con", "train con+store",
                     "infer mat", "infer con", "auto"], rows)
    lines += ["", "Against the policy (`slim_fairseq/modules/tensor_chain_policy.py`): how often its "
              "pick was the faster mode; the threshold on the cost ratio that would have picked best "
              "(contract above it; ∞ = never), for generation-sized batches (inference, ≤ 256 rows) and "
              "training batches (more rows), with the cases it gets wrong, next to the policy's own:", ""]
    rows = []

    def suggested(entry):
        if entry["threshold"] is None:
            return "—"
        return f"{entry['threshold']:.2f} ({entry['wrong']} of {entry['cases']} wrong)"

    summary = stage.get("summary") or {}
    if not summary and stage.get("results"):
        from slim_fairseq_lab.gpu_check_bench import sweep_summary
        summary = sweep_summary(stage["results"])
    if not summary:
        return lines[:-3] + ["", "No chain was timed before the stage's deadline."]
    for dtype, s in summary.items():
        p = stage["policies"][dtype]
        rows.append([dtype, f"{s['train_agree']}/{s['cases']}", f"{s['infer_agree']}/{s['cases']}",
                     f"{s['store_faster']}/{s['cases']}", suggested(s["suggested_small"]),
                     f"{p['contract_small']:g}", suggested(s["suggested_large"]), f"{p['contract_large']:g}",
                     f"{p['min_saved_macs']:g}"])
    lines += _table(["dtype", "auto was faster (training)", "auto was faster (inference)", "store was faster",
                     "best threshold, small", "policy, small", "best threshold, large", "policy, large",
                     "policy's least saving (multiply-adds)"], rows)
    reasons = sorted({p["why"] for p in stage["policies"].values()})
    return lines + [""] + [f"Policy: {why}." for why in reasons]


def _train(stage):
    lines = [f"{stage['updates']} updates per run; loss (bits) = mean of the last updates; "
             f"tolerance vs fp32 ±{100 * stage['tolerance']:.0f} %; at most {stage['max_overflows']} "
             "loss-scale overflows.", ""]
    rows = []
    for r in stage["runs"]:
        rows.append([r["family"], f"`{r['precision']}`", r["status"] if r["status"] == "ok" else f"**{r['status']}**",
                     _num(r.get("final_loss"), "{:.3f}"),
                     "—" if r.get("vs_fp32") is None else f"{100 * r['vs_fp32']:+.2f} %",
                     r.get("overflows", "—"), _num(r.get("loss_scale"), "{:g}"),
                     _num(r.get("seconds"), "{:.1f}"), "; ".join(r["problems"])])
    return lines + _table(["family", "flag", "status", "loss", "vs fp32", "overflows", "loss scale",
                           "seconds", "problems"], rows)


def _benchmark(stage):
    lines = []
    for job in stage["jobs"]:
        lines += [f"### {job['name']} ({job['status']})", ""]
        if job["status"] != "ok":
            lines += [job.get("error") or "", ""]
            continue
        lines += ["```", "scripts/benchmark.py " + " ".join(job["command"][1:]), "```", "", job["table"].strip(), ""]
        for v in job.get("verdicts", []):
            lines += [f"Which Tensor-Chain mode wins for `{v['model']}` (paired speed ratios; ties within "
                      "±5 %):", ""]
            rows = [[column, _ratio(f["materialise_over_contract"]), f["winner"],
                     _ratio(v["auto_vs_best"].get(column))] for column, f in v["forward"].items()]
            lines += _table(["", "materialise ÷ contract", "faster", "auto ÷ the faster"], rows) + [""]
            b = v["backward"]
            if b:
                lines += [f"Backward: store ÷ recompute trains at {_ratio(b['store_over_recompute'])} "
                          f"({b['winner']}) with {_ratio(b['memory_store_over_recompute'])} the peak memory.", ""]
    return lines
