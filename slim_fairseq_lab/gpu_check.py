"""The device check behind ``make gpu-check`` and ``scripts/gpu_check.py`` (docs/GPU.md).

On one CUDA GPU, within a time budget it enforces itself (default 7.5 minutes), it runs:

1. the architecture contract (:mod:`slim_fairseq_lab.contract`) for one preset of every family
   and fairseq's own two controls, in fp32, fp16 and bf16 (an fp32 check that fails is run
   again on a float64 copy, and both numbers are reported: rounding or reduced precision passes
   in float64, a wrong cache, mask or position does not);
2. exact skipless weight removal (arXiv:2404.12362) on the device: max relative error in fp32;
3. every Tensor-Chain layer shape of the benchmark models alone, materialised and contracted,
   against what the policy (:mod:`slim_fairseq.modules.tensor_chain_policy`) picks;
4. short fairseq-train runs per family with ``--fp16``, ``--bf16``,
   ``--memory-efficient-fp16`` and ``--amp`` against fp32 (:mod:`~slim_fairseq_lab.gpu_check_train`);
5. the benchmark at d 512 and d 1024 against fairseq's transformer, with every Tensor-Chain mode
   forced both ways (:mod:`~slim_fairseq_lab.gpu_check_bench`).

It writes ``report.md`` and ``report.json`` after every stage, so an interrupted or
out-of-time run keeps what it measured. ``--cpu`` runs the same code at tiny size on the CPU
(what differs there is listed in the report).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch

from slim_fairseq_lab import contract, gpu_check_bench, gpu_check_report, gpu_check_train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARIZE = os.path.join(REPO, "scripts", "binarize_bundled.py")
DATA_DIR = os.path.join(REPO, "build", "test-data")
MAX_BUDGET_S = 480.0

# one preset per family; slim_transformer with every technique that combines with the others on
# (H-SoftPOS stands for the input embeddings: SAFE and --tc-emb are its alternatives)
EVERY_TECHNIQUE = ["--self-attn-gate", "qgv", "--cross-attn-gate", "kgv", "--ffn-glu",
                   "--hsoftpos-levels", "2", "--tc-ff", "0.05", "--tc-patt", "0.07", "--tc-output", "0.1",
                   "--sandwich", "--sandwich-dim", "48", "--sandwich-ffn-dim", "64", "--sandwich-heads", "4"]
FAMILIES = {"Anthe": ("anthe_base", []), "Subformer": ("subformer_base", []), "STLM": ("stlm_tied", []),
            "skipless": ("skipless_lm", []), "every technique": ("slim_transformer", EVERY_TECHNIQUE)}
# (preset, removed matrix): serial MHA drops Q, K or V; parallel MHA and serial GQA SwiGLU drop Q
REMOVALS = [("skipless_lm", "q"), ("skipless_lm", "k"), ("skipless_lm", "v"),
            ("skipless_lm_pythia_6_9b", "q"), ("skipless_lm_mistral_7b", "q")]
REMOVAL_TOLERANCE = 5e-4  # fp32, relative; docs/TECHNIQUES.md#weight-removal expects 1e-6 .. 4e-4
STAGES = ("contract", "removal", "tc_layers", "train", "benchmark")


@dataclass
class Profile:
    """Sizes and settings of one kind of run (:data:`PROFILES`)."""
    device: str
    width_factor: int  # contract-size widths times this for training and removal
    train_families: list
    train_updates: int
    train_lr: str
    train_flags: list
    lm_flags: list
    train_workers: int
    fp16_extra: list  # flags --fp16 needs on this device
    tc_shapes: list
    tc_rows: list
    tc_repeats: int
    bench_common: list
    bench_jobs: list
    stage_ends: dict  # share of the budget by the end of each stage (unused time passes on)
    differs: list = field(default_factory=list)


def _bench_jobs():
    """First every family at the batches users train with (8,192 and 32,768 tokens per step, d 512
    then d 1024, fp16; generation at batch 1 beam 1 and batch 64 beam 5), three repetitions each;
    then the chain models with their forced modes in fp16 at d 512, and alone in fp32 and bf16
    (for the policy of those dtypes). Jobs run in this order while they fit the stage's time."""
    modes = ["anthe_base", f"tc={gpu_check_bench.TC_MODEL}"] + gpu_check_bench.mode_models(
        gpu_check_bench.CHAIN_MODELS)
    chains = gpu_check_bench.chain_models(gpu_check_bench.CHAIN_MODELS)
    batches = gpu_check_bench.batch_jobs([512, 1024], [8, 16], "fp16",
                                         extra=["--repeats", "3", "--no-op-counts"])
    return batches + [
        {"name": "d512-fp16-modes", "dim": 512, "heads": 8, "dtype": "fp16", "models": modes, "flags": []},
        {"name": "d512-fp32-chains", "dim": 512, "heads": 8, "dtype": "fp32", "models": chains, "flags": []},
        {"name": "d512-bf16-chains", "dim": 512, "heads": 8, "dtype": "bf16", "models": chains, "flags": []}]


PROFILES = {
    "cuda": Profile(
        device="cuda", width_factor=8, train_families=list(FAMILIES), train_updates=30, train_lr="1e-3",
        train_flags=["--max-tokens", "2048"], lm_flags=["--tokens-per-sample", "128"],
        train_workers=len(FAMILIES), fp16_extra=[],
        tc_shapes=gpu_check_bench.chain_shapes([512, 1024]), tc_rows=[1, 5, 64, 320, 4096], tc_repeats=5,
        bench_common=["--device", "cuda", "--layers", "6", "--max-tokens", "4096", "--num-batches", "2",
                      "--steps", "2", "--repeats", "5", "--batch-sizes", "1,64", "--beams", "1,5",
                      "--gen-len", "12", "--tokens-per-sample", "256"],
        bench_jobs=_bench_jobs(),
        stage_ends={"contract": 0.12, "removal": 0.14, "tc_layers": 0.20, "train": 0.40, "benchmark": 0.97}),
    "cpu": Profile(
        device="cpu", width_factor=1, train_families=["every technique"], train_updates=6,
        train_lr="5e-3",
        train_flags=["--batch-size", "8", "--cpu"], lm_flags=["--tokens-per-sample", "32"],
        train_workers=1, fp16_extra=["--fp16-no-flatten-grads"],
        tc_shapes=gpu_check_bench.chain_shapes([32])[:2], tc_rows=[1, 300], tc_repeats=1,
        bench_common=["--device", "cpu", "--threads", "1", "--layers", "3", "--max-tokens", "128",
                      "--num-batches", "1", "--steps", "1", "--repeats", "1", "--batch-sizes", "1,64",
                      "--beams", "1,5", "--gen-len", "2", "--tokens-per-sample", "32", "--gemm-size", "64",
                      "--no-memory"],
        bench_jobs=gpu_check_bench.batch_jobs([64], [4], "fp32", tokens=(256,)) + [
            {"name": "d64-fp32", "dim": 64, "heads": 4, "dtype": "fp32",
             "models": gpu_check_bench.chain_models(["anthe_base"]), "flags": []}],
        stage_ends={"contract": 0.3, "removal": 0.35, "tc_layers": 0.4, "train": 0.65, "benchmark": 0.97},
        differs=[
            "tiny sizes: contract-size models (d 32) for training, removal and the contract; 6 "
            "training updates of the broadest family (`slim_transformer` with every technique); two "
            "benchmark jobs, fp32 at d 64 with 3 layers: every family at 256 tokens per step (the "
            "GPU's 8,192 and 32,768), and `anthe_base` with its forced modes;",
            "`--fp16` runs with `--fp16-no-flatten-grads`: fairseq's flat fp32 master copy asks "
            "`torch.cuda.current_device()`; fairseq's overflow handler also calls `.cuda()`, so an "
            "fp16 overflow would end the run on the CPU;",
            "`--amp`: fairseq autocasts with `torch.cuda.amp.autocast`, which is off on the CPU, so "
            "the run trains in fp32 with its grad scaler disabled (loss scale 1);",
            "speeds are the CPU's and the Tensor-Chain policy judged is the CPU's; the benchmark "
            "runs with `--no-memory` (on the CPU, torch's MemTracker takes most of its time; on a "
            "GPU the peak is `torch.cuda.max_memory_allocated`)."]),
}


class Budget:
    """Deadlines of the stages within ``total_s`` seconds from now (time.monotonic)."""

    def __init__(self, total_s, ends):
        self.total, self.ends = total_s, ends
        self.start = time.monotonic()

    def left(self):
        return self.start + self.total - time.monotonic()

    def stage_deadline(self, stage):
        return self.start + self.ends[stage] * self.total

    def elapsed(self):
        return time.monotonic() - self.start


def log(message):
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def scale_widths(overrides, factor):
    """``overrides`` with every ``--*-dim`` value times ``factor`` (heads and layers kept)."""
    out = list(overrides)
    for i, flag in enumerate(out[:-1]):
        if flag.startswith("--") and flag.endswith("-dim") and out[i + 1].isdigit():
            out[i + 1] = str(int(out[i + 1]) * factor)
    return out


def family_cases():
    """{family: (arch, lm, contract-size overrides)} for :data:`FAMILIES`."""
    archs = contract.plugin_archs()
    cases = {}
    for family, (arch, extra) in FAMILIES.items():
        cls = archs[arch]
        cases[family] = (arch, contract.is_lm(cls), contract.tiny_overrides(arch) + extra)
    return cases


def prepare_data():
    """(en-de data-bin, WikiText-2 data-bin): the small subsets the test suite uses too
    (build/test-data), binarized by scripts/binarize_bundled.py if missing."""
    out = subprocess.run([sys.executable, BINARIZE, DATA_DIR, "--corpus", "all", "--subset", "1500",
                          "--eval-subset", "100", "--bpe-merges", "1000", "--nwords", "2000"],
                         check=True, capture_output=True, text=True).stdout
    ende, wikitext = out.strip().splitlines()[-2:]
    return ende, wikitext


def task_argv(lm, data):
    ende, wikitext = data
    if lm:
        return [wikitext, "--task", "language_modeling", "--sample-break-mode", "none", "--tokens-per-sample", "64"]
    return [ende, "--task", "translation", "--source-lang", "en", "--target-lang", "de"]


# ---------------------------------------------------------------------------- stages


def stage_contract(profile, data, budget, out_dir):
    """Every check of the contract, per family preset and control, per dtype."""
    device = torch.device(profile.device)
    cases = {f: (arch, lm, o) for f, (arch, lm, o) in family_cases().items()}
    for control, (lm, overrides) in contract.CONTROLS.items():
        cases[f"control {control}"] = (control, lm, overrides)
    results, complete = [], True
    for family, (arch, lm, overrides) in cases.items():
        args, task, built = contract.build(arch, overrides, task_argv(lm, data))
        for dtype_name, dtype in contract.DTYPES.items():
            if time.monotonic() > budget.stage_deadline("contract"):
                complete = False
                break
            # a copy of the model as built for each dtype: casting one model back and forth would
            # leave fairseq's cached sinusoidal positions rounded to the earlier dtype
            model = contract.fresh_copy(built).to(device=device, dtype=dtype)
            with tempfile.TemporaryDirectory() as directory:
                checks = contract.run_checks(arch, model, task, args, lm, directory)
            if dtype == torch.float32:
                contract.recheck_in_float64(checks, arch, model, task, lm)
            results.append({"family": family, "arch": arch, "dtype": dtype_name, "checks": checks})
            log(f"contract {family} {dtype_name}: "
                + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in checks.items()))
            del model
    tolerances = {name: asdict(contract.tolerance(dtype)) for name, dtype in contract.DTYPES.items()}
    failed = [r for r in results if not all(c["ok"] for c in r["checks"].values())]
    return {"results": results, "tolerances": tolerances,
            "status": "failed" if failed else ("ok" if complete else "partial")}


def _random_weights_(model, seed):
    """Generic weights: the shaped init sets W_Q = 0, which cannot be removed exactly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * p.shape[-1] ** -0.5)
    return model


def stage_removal(profile, data, budget, out_dir):
    """Skipless weight removal: converted in float64, both models run in fp32 on the device."""
    from slim_fairseq.weight_removal import reduce_model
    device = torch.device(profile.device)
    results, complete = [], True
    archs = contract.plugin_archs()
    for arch, removed in REMOVALS:
        if time.monotonic() > budget.stage_deadline("removal"):
            complete = False
            break
        overrides = scale_widths(contract.tiny_overrides(arch), profile.width_factor)
        _args, task, model = contract.build(arch, overrides, task_argv(True, data))
        model = _random_weights_(model.double(), seed=len(results)).eval()
        reduced, _report = reduce_model(model, removed)
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(task.target_dictionary.nspecial, len(task.target_dictionary), (4, 24),
                               generator=g).to(device)
        with torch.no_grad():
            a = torch.log_softmax(model.float().to(device).eval()(tokens)[0].float(), dim=-1)
            b = torch.log_softmax(reduced.float().to(device).eval()(tokens)[0].float(), dim=-1)
        error = ((a - b).abs().max() / a.abs().max()).item()
        results.append({"arch": arch, "removed": removed, "overrides": overrides,
                        "max_relative_error": error, "ok": error <= REMOVAL_TOLERANCE})
        log(f"removal {arch} drop {removed}: max relative error {error:.2e}")
    status = "failed" if any(not r["ok"] for r in results) else ("ok" if complete else "partial")
    return {"results": results, "tolerance": REMOVAL_TOLERANCE, "status": status}


def stage_tc_layers(profile, data, budget, out_dir):
    """The Tensor-Chain layers alone, both ways, against the policy's pick."""
    from slim_fairseq.modules import tensor_chain_policy
    device = torch.device(profile.device)
    results, complete = gpu_check_bench.chain_layer_sweep(
        profile.tc_shapes, profile.tc_rows, contract.DTYPES, device, profile.tc_repeats,
        budget.stage_deadline("tc_layers"))
    policies = {name: asdict(tensor_chain_policy.policy_for(profile.device, dtype))
                for name, dtype in contract.DTYPES.items()}
    return {"results": results, "summary": gpu_check_bench.sweep_summary(results), "policies": policies,
            "status": "ok" if complete else "partial"}


def training_specs(profile, data, run_dir):
    """{family: [spec per precision]} of the fairseq-train runs."""
    specs = {}
    cases = family_cases()
    for family in profile.train_families:
        arch, lm, overrides = cases[family]
        base = task_argv(lm, data) + (profile.lm_flags if lm else []) + [
            "--arch", arch, "--user-dir", contract.USER_DIR,
            *scale_widths(overrides, profile.width_factor), "--dropout", "0", "--attention-dropout", "0",
            "--optimizer", "adam", "--lr", profile.train_lr, "--clip-norm", "1.0",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(max(1, profile.train_updates // 3)),
            "--max-update", str(profile.train_updates), "--seed", "1", "--num-workers", "0",
            "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "1",
            *profile.train_flags]
        specs[family] = []
        for precision, flags in gpu_check_train.PRECISIONS.items():
            name = f"{family}/{precision}".replace(" ", "_")
            extra = profile.fp16_extra if precision == "fp16" else []
            specs[family].append({
                "name": name, "family": family, "precision": precision,
                "argv": base + flags + extra + ["--save-dir", os.path.join(run_dir, name.replace("/", "-"))],
                "out": os.path.join(run_dir, name.replace("/", "-") + ".json")})
    return specs


def stage_train(profile, data, budget, out_dir):
    """fairseq-train runs, one worker per group of families in parallel, judged against fp32."""
    run_dir = os.path.join(out_dir, "train")
    os.makedirs(run_dir, exist_ok=True)
    specs = training_specs(profile, data, run_dir)
    families = list(specs)
    groups = [families[i::profile.train_workers] for i in range(profile.train_workers)]
    procs, worker_log = [], {}
    for i, group in enumerate(g for g in groups if g):
        spec_file = os.path.join(run_dir, f"worker{i}.json")
        with open(spec_file, "w") as f:
            json.dump([s for family in group for s in specs[family]], f)
        worker_log.update(dict.fromkeys(group, os.path.join(run_dir, f"worker{i}.log")))
        log_file = open(worker_log[group[0]], "w")
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        procs.append((subprocess.Popen([sys.executable, "-m", "slim_fairseq_lab.gpu_check_train", spec_file],
                                       stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=env), log_file))
    complete = True
    for proc, log_file in procs:
        try:
            proc.wait(timeout=max(1.0, budget.stage_deadline("train") - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            complete = False
        log_file.close()
    runs = []
    for family in families:
        done = {}
        for spec in specs[family]:
            if os.path.exists(spec["out"]):
                with open(spec["out"]) as f:
                    done[spec["precision"]] = json.load(f)
        for spec in specs[family]:
            run = done.get(spec["precision"])
            row = {"family": family, "precision": spec["precision"], "argv": spec["argv"]}
            if run is None and not complete:
                row.update(status="not run", problems=["out of time"])
            elif run is None:
                with open(worker_log[family]) as f:
                    last = f.read().strip().splitlines()[-1:] or ["no output"]
                row.update(status="failed", problems=[f"its worker ended early: {last[0][:300]}"])
            else:
                verdict = gpu_check_train.judge(run, done.get("fp32"), profile.train_updates)
                row.update(verdict, overflows=run["overflows"], seconds=run["seconds"],
                           losses=[u["loss"] for u in run["updates"]],
                           loss_scale=run["updates"][-1]["loss_scale"] if run["updates"] else None)
            runs.append(row)
            log(f"train {family} {spec['precision']}: {row['status']} {'; '.join(row['problems'])}")
    statuses = {r["status"] for r in runs}
    status = "failed" if "failed" in statuses else ("partial" if "not run" in statuses else "ok")
    return {"runs": runs, "updates": profile.train_updates, "status": status,
            "tolerance": gpu_check_train.LOSS_TOLERANCE, "max_overflows": gpu_check_train.MAX_OVERFLOWS}


def stage_benchmark(profile, data, budget, out_dir):
    """The benchmark jobs in order, each started only when it is expected to fit."""
    jobs, complete, last_per_model = [], True, None
    for job in profile.bench_jobs:
        left = budget.stage_deadline("benchmark") - time.monotonic()
        expected = None if last_per_model is None else last_per_model * (len(job["models"]) + 2)
        if left < 5 or (expected is not None and expected > left):
            jobs.append({**job, "status": "skipped", "error": f"{left:.0f} s left, expected {expected or 0:.0f} s"})
            complete = False
            continue
        log(f"benchmark {job['name']}: {len(job['models'])} models, {left:.0f} s left")
        result = gpu_check_bench.run_benchmark(
            job, profile.bench_common, os.path.join(out_dir, "benchmark", job["name"]), *data,
            timeout=left, log_path=os.path.join(out_dir, "benchmark", f"{job['name']}.log"))
        last_per_model = result["seconds"] / (len(job["models"]) + 2)
        if result["rows"]:
            result["verdicts"] = gpu_check_bench.mode_verdicts(result["rows"])
        jobs.append({**job, **result})
        log(f"benchmark {job['name']}: {result['status']} in {result['seconds']:.0f} s")
    statuses = {j["status"] for j in jobs}
    status = "failed" if statuses & {"failed", "timed out"} else ("ok" if complete else "partial")
    return {"jobs": jobs, "status": status}


STAGE_FUNCTIONS = {"contract": stage_contract, "removal": stage_removal, "tc_layers": stage_tc_layers,
                   "train": stage_train, "benchmark": stage_benchmark}


# ---------------------------------------------------------------------------- driver


def environment(profile, budget_s):
    import fairseq
    info = {"device": torch.cuda.get_device_name() if profile.device == "cuda" else
            f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
            "mode": profile.device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "fairseq": fairseq.__version__, "python": platform.python_version(),
            "budget_s": budget_s, "differs": profile.differs}
    return info


def run_check(out_dir, cpu=False, budget_s=450.0, stages=STAGES):
    """Run the check into ``out_dir``; returns the report state (also in report.json)."""
    profile = PROFILES["cpu" if cpu else "cuda"]
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check.py: no CUDA device (torch.cuda.is_available() is False); "
                         "--cpu runs the check at tiny size on the CPU")
    os.makedirs(out_dir, exist_ok=True)
    budget = Budget(budget_s, profile.stage_ends)
    state = {"environment": environment(profile, budget_s), "stages": {}}
    gpu_check_report.write(out_dir, state)
    log(f"{state['environment']['device']}: budget {budget_s:.0f} s, output {out_dir}")
    data = prepare_data()
    for stage in STAGES:
        if stage not in stages:
            continue
        start = time.monotonic()
        if budget.left() < 5:
            state["stages"][stage] = {"status": "skipped", "error": "out of time"}
        else:
            log(f"stage {stage} ({budget.left():.0f} s left)")
            try:
                state["stages"][stage] = STAGE_FUNCTIONS[stage](profile, data, budget, out_dir)
            except KeyboardInterrupt:
                state["stages"][stage] = {"status": "interrupted", "seconds": time.monotonic() - start}
                gpu_check_report.write(out_dir, state)
                raise
            except Exception as e:  # noqa: BLE001 -- one stage failing must not lose the others
                state["stages"][stage] = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
        state["stages"][stage]["seconds"] = time.monotonic() - start
        if profile.device == "cuda":
            torch.cuda.empty_cache()
        state["elapsed_s"] = budget.elapsed()
        gpu_check_report.write(out_dir, state)
    log(f"done in {budget.elapsed():.0f} s: {out_dir}/report.md")
    return state


def get_parser():
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Device check of slim_fairseq on one CUDA GPU (docs/GPU.md): the contract in "
                    "fp32/fp16/bf16, skipless weight removal, the Tensor-Chain layers both ways, "
                    "fairseq-train with --fp16/--bf16/--memory-efficient-fp16/--amp, and the "
                    "benchmark at d 512 and d 1024; writes report.md and report.json within a "
                    "time budget it enforces itself.")
    p.add_argument("--out", default=os.path.join(REPO, "results", "gpu-check"),
                   help="output directory (default results/gpu-check)")
    p.add_argument("--cpu", action="store_true",
                   help="run the same code paths at tiny size on the CPU (what differs is in the report)")
    p.add_argument("--budget", type=float, default=450.0, metavar="SECONDS",
                   help=f"time budget of the whole check, at most {MAX_BUDGET_S:.0f} (default 450)")
    p.add_argument("--stages", default=",".join(STAGES), metavar="LIST",
                   help="comma-separated stages to run, of " + ",".join(STAGES) + " (default: all)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    if not 0 < args.budget <= MAX_BUDGET_S:
        raise SystemExit(f"gpu_check.py: --budget={args.budget:g} is not allowed; allowed: 0 < "
                         f"SECONDS <= {MAX_BUDGET_S:.0f}")
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise SystemExit(f"gpu_check.py: --stages={args.stages!r} is not allowed; allowed: a "
                         "comma-separated list of " + "|".join(STAGES))
    state = run_check(args.out, cpu=args.cpu, budget_s=args.budget, stages=stages)
    failed = [name for name, s in state["stages"].items() if s["status"] == "failed"]
    return 1 if failed else 0
