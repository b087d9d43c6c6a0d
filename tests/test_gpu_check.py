"""The device check (scripts/gpu_check.py, docs/GPU.md) and the device-aware Tensor-Chain policy.

The check itself runs once here with ``--cpu`` (every stage, the same code as on a GPU, at tiny
size); the policy is asked about CUDA devices and half dtypes without running on one."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, build
from slim_fairseq.modules import tensor_chain_policy as policy
from slim_fairseq.modules.glu import GLUProjection
from slim_fairseq.modules.tensor_chain import TensorChainLinear
from slim_fairseq.specs import ChainSpec
from slim_fairseq_lab import contract, gpu_check, gpu_check_bench, gpu_check_train

# ---------------------------------------------------------------------------- the CPU run


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_check.py"), "--cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "report.json") as f:
        state = json.load(f)
    with open(out / "report.md") as f:
        return state, f.read()


@pytest.mark.slow
def test_cpu_run_passes_every_stage_and_writes_the_report(cpu_report):
    state, markdown = cpu_report
    assert list(state["stages"]) == list(gpu_check.STAGES)
    assert {name: s["status"] for name, s in state["stages"].items()} == dict.fromkeys(gpu_check.STAGES, "ok")
    for title in ("Architecture contract", "Skipless weight removal", "materialise or contract",
                  "fairseq-train precision flags", "Benchmark against fairseq's transformer"):
        assert f"## {title}" in markdown or title in markdown
    assert "This is the CPU run" in markdown and "--fp16-no-flatten-grads" in markdown


@pytest.mark.slow
def test_cpu_run_contract_covers_every_family_and_dtype(cpu_report):
    results = cpu_report[0]["stages"]["contract"]["results"]
    seen = {(r["family"], r["dtype"]) for r in results}
    families = list(gpu_check.FAMILIES) + [f"control {c}" for c in contract.CONTROLS]
    assert seen == {(f, d) for f in families for d in contract.DTYPES}
    for r in results:
        assert set(r["checks"]) == set(contract.CHECKS)
        tol = contract.TOLERANCES[contract.DTYPES[r["dtype"]]]
        assert all(c["ok"] for c in r["checks"].values()), r
        assert r["checks"]["incremental"]["value"] <= tol.match and r["checks"]["no_future_leak"]["value"] <= tol.leak


@pytest.mark.slow
def test_cpu_run_removal_layers_training_and_benchmark(cpu_report):
    stages = cpu_report[0]["stages"]
    assert [(r["arch"], r["removed"]) for r in stages["removal"]["results"]] == gpu_check.REMOVALS
    assert all(r["max_relative_error"] <= gpu_check.REMOVAL_TOLERANCE for r in stages["removal"]["results"])
    profile = gpu_check.PROFILES["cpu"]
    assert len(stages["tc_layers"]["results"]) == len(profile.tc_shapes) * len(profile.tc_rows) * len(contract.DTYPES)
    assert set(stages["tc_layers"]["policies"]) == set(stages["tc_layers"]["summary"]) == set(contract.DTYPES)
    for summary in stages["tc_layers"]["summary"].values():
        assert summary["suggested_small"]["cases"] + summary["suggested_large"]["cases"] == summary["cases"]
    runs = {r["precision"]: r for r in stages["train"]["runs"]}
    assert set(runs) == set(gpu_check_train.PRECISIONS)
    assert runs["bf16"]["status"] == "unsupported"  # fairseq 0.12.3: --bf16 implies --tpu
    for name in ("fp32", "fp16", "memory-efficient-fp16", "amp"):
        assert runs[name]["status"] == "ok" and len(runs[name]["losses"]) == profile.train_updates, runs[name]
    assert runs["fp16"]["loss_scale"] > 1 and runs["amp"]["loss_scale"] == 1  # the CPU's amp is fp32
    batches, job = stages["benchmark"]["jobs"]
    assert batches["status"] == "ok" and batches["name"] == "d64-fp32-tokens256"
    assert batches["command"][batches["command"].index("--max-tokens", 20) + 1] == "256"
    assert {r["label"] for r in batches["rows"]} == {
        "transformer", "transformer_lm", "anthe_base", "tc", "sandwich_base", "stlm_tied", "skipless_lm"}
    assert job["status"] == "ok" and {r["label"] for r in job["rows"]} >= {"transformer", "anthe_base@contract"}
    verdict, = job["verdicts"]
    assert verdict["model"] == "anthe_base" and set(verdict["forward"]) == {
        "train", "gen b1_beam1", "gen b1_beam5", "gen b64_beam1", "gen b64_beam5"}
    assert verdict["backward"]["winner"] in ("store", "recompute", "tie")


def test_cpu_run_takes_the_gpu_run_s_paths():
    """The CPU profile differs from the CUDA one in sizes only: the same stages, the same
    precision flags, the same contract dtypes, benchmark jobs of the same form."""
    cuda, cpu = gpu_check.PROFILES["cuda"], gpu_check.PROFILES["cpu"]
    assert set(cuda.stage_ends) == set(cpu.stage_ends) == set(gpu_check.STAGES)
    assert set(cpu.train_families) <= set(cuda.train_families) == set(gpu_check.FAMILIES)
    assert {tuple(sorted(j)) for j in cpu.bench_jobs} == {tuple(sorted(j)) for j in cuda.bench_jobs}
    dims = {j["dim"] for j in cuda.bench_jobs}
    assert dims == {512, 1024}
    every = {m for j in cuda.bench_jobs for m in j["models"]}
    for model in ("anthe_base", f"tc={gpu_check_bench.TC_MODEL}", "sandwich_base", "stlm_tied"):
        assert model in every
    for name in gpu_check_bench.CHAIN_MODELS:
        for mode, flags in gpu_check_bench.FORCED.items():
            assert f"{name}@{mode}={gpu_check_bench.CHAIN_MODELS[name]} {flags}" in every


def test_the_gpu_run_measures_every_family_at_realistic_batches():
    """Training at 8,192 and 32,768 tokens per step at d 512 and d 1024 in fp16, every family
    (fairseq's models are added by the benchmark), generation at batch 1 beam 1 and batch 64
    beam 5 once per width; these jobs come first."""
    jobs = gpu_check.PROFILES["cuda"].bench_jobs
    batches = [j for j in jobs if "--max-tokens" in j["flags"]]
    assert jobs[:len(batches)] == batches
    seen = {(j["dim"], j["flags"][j["flags"].index("--max-tokens") + 1]) for j in batches}
    assert seen == {(d, t) for d in (512, 1024) for t in ("8192", "32768")}
    for j in batches:
        assert j["dtype"] == "fp16" and set(j["models"]) == set(gpu_check_bench.FAMILY_MODELS)
        argv = gpu_check_bench.benchmark_command(j, ["--max-tokens", "4096"], "OUT", "E", "L")
        tokens = argv[len(argv) - argv[::-1].index("--max-tokens")]  # the last one wins
        assert tokens == j["flags"][j["flags"].index("--max-tokens") + 1]
        if tokens == "8192":
            assert argv[argv.index("--batch-sizes") + 1] == "1,64" and argv[argv.index("--beams") + 1] == "1,5"
        else:
            assert "--no-generation" in argv


def test_training_specs_every_family_and_precision(tmp_path):
    data = ("ENDE", "WIKI")
    specs = gpu_check.training_specs(gpu_check.PROFILES["cuda"], data, str(tmp_path))
    assert set(specs) == set(gpu_check.FAMILIES)
    for family, runs in specs.items():
        assert [r["precision"] for r in runs] == list(gpu_check_train.PRECISIONS)
        for run in runs:
            argv = run["argv"]
            assert argv[0] == ("WIKI" if family in ("STLM", "skipless") else "ENDE")
            assert argv[argv.index("--max-update") + 1] == "30" and "--cpu" not in argv
            assert "--fp16-no-flatten-grads" not in argv
            for flag in gpu_check_train.PRECISIONS[run["precision"]]:
                assert flag in argv
        assert "--decoder-embed-dim" in argv and argv[argv.index("--decoder-embed-dim") + 1] == "256"
    cpu = gpu_check.training_specs(gpu_check.PROFILES["cpu"], data, str(tmp_path))
    fp16 = next(r for r in cpu["every technique"] if r["precision"] == "fp16")
    assert "--fp16-no-flatten-grads" in fp16["argv"] and "--cpu" in fp16["argv"]


def test_scale_widths_scales_dims_only():
    assert gpu_check.scale_widths(["--decoder-embed-dim", "32", "--decoder-layers", "3", "--sandwich-ffn-dim", "64",
                                   "--kv-heads", "2", "--tc-ff", "0.05"], 8) == [
        "--decoder-embed-dim", "256", "--decoder-layers", "3", "--sandwich-ffn-dim", "512", "--kv-heads", "2",
        "--tc-ff", "0.05"]


# ---------------------------------------------------------------------------- verdicts


def _run(losses, overflows=0, error=None, argv=("--fp16",)):
    return {"updates": [{"num_updates": i + 1, "loss": v, "loss_scale": 8.0} for i, v in enumerate(losses)],
            "overflows": overflows, "error": error, "argv": list(argv)}


@pytest.mark.parametrize("run,status,problem", [
    (_run([10.0, 9.5, 9.0, 8.6, 8.5, 8.4]), "ok", None),
    (_run([10.0, 9.5, float("nan"), 8.6, 8.5, 8.4]), "failed", "NaN"),
    (_run([10.0, 9.5, 9.0, 8.6, 8.5, 8.4], overflows=9), "failed", "overflows"),
    (_run([10.0, 10.1, 10.0, 9.95, 10.0, 9.9]), "failed", "did not fall"),
    (_run([10.0, 9.5, 9.0, 9.0, 9.0, 9.0]), "failed", "vs fp32"),
    (_run([10.0, 9.5, 9.0]), "failed", "stopped after 3 of 6"),
    (_run([], error="AttributeError: 'NoneType' object has no attribute 'xla_device'", argv=("--bf16",)),
     "unsupported", "TPU"),
    (_run([], error="RuntimeError: CUDA error"), "failed", "CUDA error"),
])
def test_judge_training_run(run, status, problem):
    fp32 = _run([10.0, 9.5, 9.0, 8.6, 8.5, 8.4], argv=())
    verdict = gpu_check_train.judge(run, fp32, updates=6)
    assert verdict["status"] == status, verdict
    if problem:
        assert any(problem in p for p in verdict["problems"]), verdict


def _row(label, train, gen, memory=None):
    return {"label": label, "train_tokens_per_s_all": train, "peak_memory_bytes": memory,
            "generation_tokens_per_s_all": {"b1_beam1": gen}}


def test_mode_verdicts_pick_the_faster_mode():
    rows = [_row("transformer", [100, 100], [10, 10]),
            _row("anthe_base", [90, 95], [20, 22]),
            _row("anthe_base@materialise", [100, 100], [10, 10], memory=300),
            _row("anthe_base@contract", [80, 80], [20, 22], memory=200),
            _row("anthe_base@contract+store", [82, 81], [20, 22], memory=300)]
    verdict, = gpu_check_bench.mode_verdicts(rows)
    assert verdict["forward"]["train"]["winner"] == "materialise"
    assert verdict["forward"]["train"]["materialise_over_contract"] == pytest.approx(1.25)
    assert verdict["forward"]["gen b1_beam1"]["winner"] == "contract"
    assert verdict["auto_vs_best"]["train"] == pytest.approx(0.925)
    assert verdict["backward"]["winner"] == "tie" and verdict["backward"]["memory_store_over_recompute"] == 1.5


def test_benchmark_stage_skips_a_job_that_would_not_fit(monkeypatch, tmp_path):
    """The stage's own time budget: a job starts only when the time per model of the job before
    says it fits before the stage's deadline, and runs with that deadline as its timeout."""
    clock = [0.0]
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: clock[0])
    started = []

    def fake_run(job, *args, **kwargs):
        started.append((job["name"], kwargs["timeout"]))
        seconds = 20.0 * (len(job["models"]) + 2)  # 20 s per model, baselines included
        clock[0] += seconds
        return {"status": "ok", "seconds": seconds, "rows": None}

    monkeypatch.setattr(gpu_check_bench, "run_benchmark", fake_run)
    profile = gpu_check.PROFILES["cuda"]
    budget = gpu_check.Budget(450.0, {**profile.stage_ends, "benchmark": 1.0})
    stage = gpu_check.stage_benchmark(profile, ("E", "L"), budget, str(tmp_path))
    # each batch job: 7 models, 140 s; the fourth would need 140 of the 30 left, and each job
    # after it (10 models) 200
    assert [j["status"] for j in stage["jobs"]] == ["ok"] * 3 + ["skipped"] * 4
    assert started == [("d512-fp16-tokens8192", 450.0), ("d512-fp16-tokens32768", 310.0),
                       ("d1024-fp16-tokens8192", 170.0)]
    assert stage["status"] == "partial"


def test_cli_refuses_bad_values_and_a_machine_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="--budget=900 is not allowed"):
        gpu_check.main(["--budget", "900", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--stages='train,nope' is not allowed"):
        gpu_check.main(["--stages", "train,nope", "--out", str(tmp_path)])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            gpu_check.main(["--out", str(tmp_path)])


# ---------------------------------------------------------------------------- the policy


def test_policy_chooses_by_device_and_dtype():
    """The Anthe feed-forward chain (512 -> 1365, bond 2): on the CPU a contraction at every
    row count (measured on the CPU); on CUDA materialised at every row count and dtype
    (measured on an H100: docs/gpu/h100-2026-11-27/)."""
    layer = TensorChainLinear(512, 1365, bond=2)

    def contracts(rows, device, dtype):
        macs = layer.in_features * layer.out_features * (layer.bond + rows)
        return policy.contract_pays(layer.cost_ratio(rows), macs, rows, device, dtype)

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert contracts(1, "cpu", dtype) and contracts(4096, "cpu", dtype)
        assert not any(contracts(rows, "cuda", dtype) for rows in (1, 64, 4096))
    assert policy.policy_for("cpu", torch.float64) is policy.CPU_POLICY


def test_assumed_target_answers_for_every_tensor():
    """Op counts of a model as on CUDA (slim_fairseq_lab/benchmark/op_count.py): inside
    ``assume_target`` every chain chooses as there, and the CPU's choice comes back after."""
    layer = TensorChainLinear(512, 1365, bond=2)
    assert layer.use_contraction(64)
    with policy.assume_target("cuda", torch.float16):
        assert policy.target(torch.zeros(1)) == ("cuda", torch.float16)
        assert not layer.use_contraction(64)
    assert layer.use_contraction(64)


def test_layers_ask_the_policy_of_their_device(monkeypatch):
    """TensorChainLinear's auto mode and its row blocks follow the device and dtype the policy
    is asked about (a CUDA fp16 target here, without a GPU)."""
    layer = TensorChainLinear(512, 1365, bond=2)
    first, last = layer.cores
    from slim_fairseq.modules.tensor_chain import row_block
    x = torch.randn(4096, 512)
    with torch.no_grad():
        assert layer.use_contraction(1) and row_block(x, first, last) is not None
        monkeypatch.setattr(policy, "target", lambda like: ("cuda", torch.float16))
        assert not layer.use_contraction(1) and not layer.use_contraction(4096)
        assert row_block(x, first, last) is None
    layer.forward_mode = "contract"
    assert layer.use_contraction(1)


def test_row_blocks_hold_the_same_bytes_in_every_dtype():
    fp32 = policy.block_rows(4096, 1248, False, "cpu", torch.float32)
    assert fp32 == (1 << 18) // 1248
    assert policy.block_rows(4096, 1248, False, "cpu", torch.bfloat16) == 2 * fp32
    assert policy.block_rows(4096, 1248, True, "cpu", torch.float32) is None  # recorded by autograd
    assert policy.block_rows(100, 1248, False, "cpu", torch.float32) is None  # fits one block
    assert policy.block_rows(4096, 1248, False, "cpu", torch.float32, block_floats=float("inf")) is None
    assert policy.block_rows(4096, 1248, False, "cuda", torch.float32) is None


def test_backward_mode_auto_asks_the_policy(monkeypatch):
    layer = TensorChainLinear(64, 96, bond=2)
    dense_glu, chain_glu = GLUProjection(64, 96), GLUProjection(64, 96, chain=ChainSpec(0.1))
    assert layer.backward_mode == "auto" and layer.recompute_in_backward
    monkeypatch.setitem(policy.POLICIES, ("cuda", torch.float16),
                        policy.ChainPolicy(256, 16.0, 16.0, 1e9, False, False, "test"))
    monkeypatch.setattr(policy, "target", lambda like: ("cuda", torch.float16))
    assert not layer.recompute_in_backward and not chain_glu.recompute_in_backward
    assert dense_glu.recompute_in_backward  # dense layers keep their memory savings
    layer.backward_mode = "recompute"
    assert layer.recompute_in_backward
    layer.recompute_in_backward = False  # the setter of --tc-backward store
    assert layer.backward_mode == "store"


TINY_ANTHE = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
              "--decoder-ffn-embed-dim", "48", "--encoder-layers", "1", "--decoder-layers", "1",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]


@pytest.mark.parametrize("forward,backward", [("contract", "store"), ("materialise", "recompute")])
def test_tc_forward_and_backward_options_force_every_chain(forward, backward):
    _args, _task, model = build("anthe_base", TINY_ANTHE + ["--tc-forward", forward, "--tc-backward", backward],
                                lm=False)
    chains = [m for m in model.modules() if isinstance(m, TensorChainLinear)]
    assert chains and all(m.forward_mode == forward and m.backward_mode == backward for m in chains)
    glus = [m for m in model.modules() if isinstance(m, GLUProjection)]
    assert glus and all(m.backward_mode == backward for m in glus)
    _args, _task, auto = build("anthe_base", TINY_ANTHE, lm=False)
    assert all(m.forward_mode == "auto" and m.backward_mode == "auto"
               for m in auto.modules() if isinstance(m, TensorChainLinear))


@pytest.mark.parametrize("arch,argv,message", [
    ("anthe_base", ["--tc-forward", "fast"], "--tc-forward=fast: not one of the choices; allowed: auto|materialise|contract"),
    ("slim_transformer", ["--tc-forward", "contract"], "--tc-forward=contract: shapes a Tensor Chain, which is off"),
])
def test_tc_forward_option_errors(arch, argv, message):
    from slim_fairseq.option_errors import OptionError
    with pytest.raises(OptionError) as err:
        build(arch, TINY_ANTHE + argv, lm=False)
    assert message in str(err.value)


def test_saved_options_of_chainless_models_still_build():
    """``tc_backward="recompute"`` is what the saved options of models without a chain may say."""
    _args, _task, model = build("slim_transformer", TINY_ANTHE + ["--tc-backward", "recompute"], lm=False)
    assert not any(isinstance(m, TensorChainLinear) for m in model.modules())


def test_best_threshold_separates_wins_from_losses():
    assert gpu_check_bench.best_threshold([(1.0, False), (2.0, False), (5.0, True), (9.0, True)]) == (2.0, 0)
    assert gpu_check_bench.best_threshold([(1.0, False), (3.0, True), (4.0, False), (9.0, True)]) == (1.0, 1)
    assert gpu_check_bench.best_threshold([(3.0, False), (9.0, False)]) == (9.0, 0)  # never contract
    assert gpu_check_bench.best_threshold([(3.0, True)]) == (0.0, 0)


def test_training_stage_stops_its_workers_at_the_deadline(tmp_path):
    """Out of time, the workers are stopped, their runs are reported as not run, and the stage
    as partial (no run is judged on half a log)."""
    profile = gpu_check.PROFILES["cpu"]
    budget = gpu_check.Budget(1.0, {**profile.stage_ends, "train": 1.0})
    stage = gpu_check.stage_train(profile, ("ENDE", "WIKI"), budget, str(tmp_path))
    assert stage["status"] == "partial"
    assert {r["status"] for r in stage["runs"]} == {"not run"}
    assert len(stage["runs"]) == len(profile.train_families) * len(gpu_check_train.PRECISIONS)


def test_contract_rechecks_a_failing_fp32_model_in_float64(monkeypatch):
    """A check that misses in fp32 runs again on a float64 copy, and the report gives both
    numbers: passing in float64 (rounding, a TF32 kernel) is told from failing in every dtype."""
    from slim_fairseq_lab import contract, gpu_check_report
    model = torch.nn.Linear(2, 2)

    def fp32_only(arch, model, task, lm):
        if next(model.parameters()).dtype == torch.float32:
            raise AssertionError(f"{arch}: step 0 differs from the full forward by 0.000364")
        return 0.0

    def always(arch, model, task, lm):
        raise AssertionError(f"{arch}: wrong in {next(model.parameters()).dtype}")

    monkeypatch.setitem(contract.CHECKS, "incremental", fp32_only)
    monkeypatch.setitem(contract.CHECKS, "padding", always)
    results = {"gradients": {"ok": True, "value": 1.0, "error": None},
               "incremental": {"ok": False, "value": None, "error": "AssertionError: step 0"},
               "padding": {"ok": False, "value": None, "error": "AssertionError: wrong"}}
    contract.recheck_in_float64(results, "anthe_base", model, None, False)
    assert results["incremental"]["float64"] == 0.0 and not results["incremental"]["ok"]
    assert results["padding"]["float64"] is None
    assert "wrong in torch.float64" in results["padding"]["float64_error"]
    assert "float64" not in results["gradients"]
    stage = {"tolerances": {"fp32": {"match": 1e-5, "leak": 1e-6}}, "status": "failed",
             "results": [{"family": "Anthe", "arch": "anthe_base", "dtype": "fp32", "checks": results}]}
    text = "\n".join(gpu_check_report._contract(stage))
    assert "**FAILED**: AssertionError: step 0; float64: 0" in text
    assert "float64 fails too: AssertionError: anthe_base: wrong in torch.float64" in text


def test_policy_table_is_made_from_the_timings():
    """The report's table against the policy comes from the chain timings whenever there are
    some, also from a state without its summary; without timings it says so."""
    from slim_fairseq_lab import gpu_check_report
    row = {"dtype": "fp16", "shape": "512x1365", "bond": 2, "rows": 64, "cost_ratio": 8.6,
           "train_materialise": 1e-3, "train_contract": 2e-3, "train_contract_store": 1.5e-3,
           "infer_materialise": 1e-4, "infer_contract": 2e-4, "auto": "materialise",
           "auto_infer": "materialise", "train_faster": "materialise", "infer_faster": "materialise",
           "store_faster": True}
    policies = {"fp16": {"contract_small": float("inf"), "contract_large": float("inf"),
                         "min_saved_macs": 0.0, "why": "measured"}}
    text = "\n".join(gpu_check_report._tc_layers({"results": [row], "policies": policies}))
    assert "| fp16 | 1/1 | 1/1 | 1/1 |" in text
    empty = "\n".join(gpu_check_report._tc_layers({"results": [], "policies": policies}))
    assert "No chain was timed" in empty and "| fp16 |" not in empty
