"""Speed of the device check (docs/GPU.md): the benchmark against fairseq's transformer, run
through ``scripts/benchmark.py`` (its CLI and ``results.json`` are the interface), which
Tensor-Chain mode wins there, and the Tensor-Chain layers alone, timed both ways at the shapes
and row counts training and generation use, against what the policy
(:mod:`slim_fairseq.modules.tensor_chain_policy`) picks.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(REPO, "scripts", "benchmark.py")

TC_MODEL = "slim_transformer --tc-ff 0.005 --tc-patt 0.07"  # `tc` of docs/RESULTS.md
MAIN_MODELS = ["anthe_base", f"tc={TC_MODEL}", "sandwich_base", "stlm_tied"]
# one model of every family (the benchmark adds fairseq's transformer and transformer_lm)
FAMILY_MODELS = MAIN_MODELS + ["skipless_lm"]
# the batches users train and generate with: training tokens per step, and generation at batch 1,
# beam 1 and batch 64, beam 5 (the benchmark times every pair of --batch-sizes and --beams)
TRAINING_TOKENS = (8192, 32768)
GENERATION = ["--batch-sizes", "1,64", "--beams", "1,5"]


def batch_jobs(dims, heads, dtype, tokens=TRAINING_TOKENS, models=FAMILY_MODELS, extra=()):
    """Benchmark jobs of every family at the batches of :data:`TRAINING_TOKENS`: per width, one
    job per tokens per step, the first of them with generation (:data:`GENERATION`), the others
    training only; ``extra``: flags of every such job (after the common ones, so they win)."""
    jobs = []
    for dim, head_count in zip(dims, heads):
        for i, count in enumerate(tokens):
            flags = ["--max-tokens", str(count), *extra]
            flags += GENERATION if i == 0 else ["--no-generation"]
            jobs.append({"name": f"d{dim}-{dtype}-tokens{count}", "dim": dim, "heads": head_count,
                         "dtype": dtype, "models": list(models), "flags": flags})
    return jobs
# each chain model with its forward forced both ways, and the contraction's backward both ways
FORCED = {"materialise": "--tc-forward materialise",
          "contract": "--tc-forward contract --tc-backward recompute",
          "contract+store": "--tc-forward contract --tc-backward store"}
CHAIN_MODELS = {"anthe_base": "anthe_base", "tc": TC_MODEL}
# two speeds within this share of each other are a tie (the benchmark's repetitions vary so much)
TIE = 0.05


def mode_models(names):
    """``--model`` specs of the chain models ``names`` (of :data:`CHAIN_MODELS`) with each mode
    of :data:`FORCED`."""
    return [f"{name}@{mode}={CHAIN_MODELS[name]} {flags}" for name in names for mode, flags in FORCED.items()]


def chain_models(names):
    """``--model`` specs of the chain models ``names`` as they are (auto) and with every mode."""
    return [CHAIN_MODELS[name] if CHAIN_MODELS[name] == name else f"{name}={CHAIN_MODELS[name]}"
            for name in names] + mode_models(names)


def benchmark_command(job, common, out_dir, ende_data, lm_data):
    """The ``scripts/benchmark.py`` command line of one job."""
    argv = [sys.executable, BENCHMARK, "--out", out_dir, "--dim", str(job["dim"]), "--heads", str(job["heads"]),
            "--dtype", job["dtype"], "--ende-data", ende_data, "--lm-data", lm_data, *common,
            *job.get("flags", [])]
    for spec in job["models"]:
        argv += ["--model", spec]
    return argv


def run_benchmark(job, common, out_dir, ende_data, lm_data, timeout, log_path):
    """Run one benchmark job as a subprocess (killed at ``timeout`` seconds); returns
    {"status": ok|failed|timed out, "seconds", "rows" (from results.json), "table" (table.md),
    "error", "command"}."""
    os.makedirs(out_dir, exist_ok=True)
    argv = benchmark_command(job, common, out_dir, ende_data, lm_data)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            code = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    result = {"seconds": time.perf_counter() - start, "command": argv[1:], "rows": None, "table": None,
              "error": None}
    results_json = os.path.join(out_dir, "results.json")
    if code == 0 and os.path.exists(results_json):
        with open(results_json) as f:
            result["rows"] = json.load(f)["rows"]
        with open(os.path.join(out_dir, "table.md")) as f:
            result["table"] = f.read()
        result["status"] = "ok"
    else:
        result["status"] = "timed out" if code is None else "failed"
        with open(log_path) as f:
            tail = f.read()[-2000:]
        result["error"] = f"exit {code}: " + " | ".join(tail.strip().splitlines()[-5:])
    return result


def _paired(a, b):
    """Median over repetitions of a / b (the benchmark interleaves them), or None."""
    pairs = [x / y for x, y in zip(a or [], b or []) if x and y]
    return statistics.median(pairs) if pairs else None


def _winner(ratio, first, second):
    if ratio is None:
        return "—"
    if abs(ratio - 1.0) <= TIE:
        return "tie"
    return first if ratio > 1.0 else second


def mode_verdicts(rows):
    """Which Tensor-Chain mode wins in one benchmark run: for every chain model present, the
    speed of materialise over contract (training and each generation setting), of storing over
    recomputing in backward (training speed and peak memory), and of auto over the better
    forced forward mode."""
    by_label = {r["label"]: r for r in rows}
    verdicts = []
    for name in CHAIN_MODELS:
        modes = {mode: by_label.get(f"{name}@{mode}") for mode in FORCED}
        auto = by_label.get(name)
        if modes["materialise"] is None or modes["contract"] is None:
            continue
        columns = {"train": ("train_tokens_per_s_all", None)}
        for key in modes["contract"]["generation_tokens_per_s_all"]:
            columns[f"gen {key}"] = ("generation_tokens_per_s_all", key)

        def speeds(row, field, key):
            if row is None:
                return None
            return row[field] if key is None else row[field].get(key)

        forward, auto_vs_best = {}, {}
        for column, (field, key) in columns.items():
            mat, con = speeds(modes["materialise"], field, key), speeds(modes["contract"], field, key)
            ratio = _paired(mat, con)
            forward[column] = {"materialise_over_contract": ratio,
                               "winner": _winner(ratio, "materialise", "contract")}
            if auto is not None and ratio is not None:
                best = mat if ratio >= 1.0 else con
                auto_vs_best[column] = _paired(speeds(auto, field, key), best)
        store = modes.get("contract+store")
        backward = None
        if store is not None:
            ratio = _paired(store["train_tokens_per_s_all"], modes["contract"]["train_tokens_per_s_all"])
            mem = (store["peak_memory_bytes"] / modes["contract"]["peak_memory_bytes"]
                   if store["peak_memory_bytes"] and modes["contract"]["peak_memory_bytes"] else None)
            backward = {"store_over_recompute": ratio, "winner": _winner(ratio, "store", "recompute"),
                        "memory_store_over_recompute": mem}
        verdicts.append({"model": name, "forward": forward, "backward": backward, "auto_vs_best": auto_vs_best})
    return verdicts


# ---------------------------------------------------------------------------- layers alone


def chain_shapes(dims, ff_ratio=0.005, patt_ratio=0.07):
    """(in, out, bond) of the Tensor-Chain linears of the benchmark's chain models at each width d
    (ffn 4d): Anthe's GLU feed-forward (hidden floor(2 * 4d / 3)), the `tc` model's feed-forward,
    and the attention projections."""
    from slim_fairseq.modules.tensor_chain import solve_bond
    shapes = []
    for d in dims:
        glu = 2 * 4 * d // 3
        for n_in, n_out, ratio in ((d, glu, ff_ratio), (glu, d, ff_ratio), (d, 4 * d, ff_ratio),
                                   (4 * d, d, ff_ratio), (d, d, patt_ratio)):
            shapes.append((n_in, n_out, solve_bond(n_in, n_out, ratio)))
    return shapes


def _timed(fn, device, repeats):
    """Best wall time of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def time_chain_layer(n_in, n_out, bond, rows, device, dtype, repeats):
    """Seconds of one :class:`TensorChainLinear` (cores and input in ``dtype``): training
    (forward + backward) materialised, contracted with recompute and with store, and inference
    (eval mode, no grad: the materialised W built once) both ways; plus what "auto" picks for
    training and for inference."""
    from slim_fairseq.modules.tensor_chain import TensorChainLinear
    torch.manual_seed(0)
    layer = TensorChainLinear(n_in, n_out, bond=bond).to(device=device, dtype=dtype)
    x = torch.randn(rows, n_in, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(rows, n_out, device=device, dtype=dtype)

    def train(forward, backward):
        def step():
            layer.train()
            layer.forward_mode, layer.backward_mode = forward, backward
            layer(x).backward(grad)
            x.grad = None
            layer.zero_grad(set_to_none=True)
        return _timed(step, device, repeats)

    def infer(forward):
        def step():  # as in generation: eval mode, so a materialised W is built once and kept
            layer.eval()
            layer.forward_mode = forward
            with torch.no_grad():
                layer(x)
        return _timed(step, device, repeats)

    out = {"shape": f"{n_in}x{n_out}", "bond": bond, "rows": rows,
           "cost_ratio": layer.cost_ratio(rows),
           "train_materialise": train("materialise", "auto"),
           "train_contract": train("contract", "recompute"),
           "train_contract_store": train("contract", "store"),
           "infer_materialise": infer("materialise"),
           "infer_contract": infer("contract")}
    layer.forward_mode, layer.backward_mode = "auto", "auto"
    layer.train()
    out["auto"] = "contract" if layer.use_contraction(rows) else "materialise"
    out["auto_infer"] = "contract" if layer.use_contraction(rows, weight_built=True) else "materialise"
    return out


def chain_layer_sweep(shapes, rows_list, dtypes, device, repeats, deadline):
    """:func:`time_chain_layer` for every shape, row count and dtype until ``deadline``
    (time.monotonic); returns (rows, complete)."""
    results = []
    for dtype_name, dtype in dtypes.items():
        for n_in, n_out, bond in shapes:
            for rows in rows_list:
                if time.monotonic() > deadline:
                    return results, False
                r = time_chain_layer(n_in, n_out, bond, rows, device, dtype, repeats)
                r["dtype"] = dtype_name
                for kind in ("train", "infer"):
                    mat, con = r[f"{kind}_materialise"], r[f"{kind}_contract"]
                    r[f"{kind}_faster"] = "contract" if con < mat else "materialise"
                r["store_faster"] = r["train_contract_store"] < r["train_contract"]
                results.append(r)
    return results, True


def best_threshold(cases):
    """The cost ratio t for which "contract when the cost ratio exceeds t" is right in the most
    of ``cases`` ((cost ratio, contract was faster) pairs); the smallest such t: (t, wrong).
    t = inf: never contract."""
    candidates = sorted({0.0, float("inf"), *(ratio for ratio, _ in cases)})
    scored = [(sum((ratio > t) != won for ratio, won in cases), t) for t in candidates]
    wrong, t = min(scored)
    return t, wrong


def sweep_summary(results, small_batch_rows=256):
    """Per dtype: how often the policy's pick ("auto") was the faster mode (training: forward
    + backward; inference: forward), how often storing beat recomputing, and the contraction
    threshold the measurements suggest, for generation-sized batches (inference, at most
    ``small_batch_rows`` rows) and for training batches (more rows)."""
    summary = {}
    for r in results:
        s = summary.setdefault(r["dtype"], {"cases": 0, "train_agree": 0, "infer_agree": 0,
                                            "store_faster": 0, "small": [], "large": []})
        s["cases"] += 1
        s["train_agree"] += r["auto"] == r["train_faster"]
        s["infer_agree"] += r.get("auto_infer", r["auto"]) == r["infer_faster"]
        s["store_faster"] += r["store_faster"]
        if r["rows"] <= small_batch_rows:
            s["small"].append((r["cost_ratio"], r["infer_faster"] == "contract"))
        else:
            s["large"].append((r["cost_ratio"], r["train_faster"] == "contract"))
    for s in summary.values():
        for size in ("small", "large"):
            cases = s.pop(size)
            threshold, wrong = best_threshold(cases) if cases else (None, None)
            s[f"suggested_{size}"] = {"threshold": threshold, "wrong": wrong, "cases": len(cases)}
    return summary
