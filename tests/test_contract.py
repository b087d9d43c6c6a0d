"""The architecture contract: every architecture the plugin registers, built
tiny by ``contract.tiny_overrides``, plus fairseq's own ``transformer`` and
``transformer_lm`` as controls that show the suite can pass.

a. builds through fairseq's own parser;  b. finite loss, every parameter gets a gradient;
c. incremental decoding == full forward, also after a beam reorder;  d. no future leak;
e. padding invariance;  f. checkpoint round trip with ``weights_only=True``;
i. the training-time breakdown of scripts/benchmark.py works on it;
g. fairseq-train + fairseq-generate / fairseq-eval-lm on the bundled data (slow);
h. 2 CPU ranks end with bit-identical parameters (slow).
g and h run once per model class and arch family (name prefix) to keep the suite fast.
"""
import os
import socket
import subprocess
import sys

import pytest
import torch

from helpers import USER_DIR, build, is_lm, plugin_archs, run_cli, task_args
from slim_fairseq_lab import contract
from slim_fairseq_lab.contract import CONTROLS


def _cases():
    cases = dict(CONTROLS)
    for arch, cls in plugin_archs().items():
        cases[arch] = (is_lm(cls), contract.tiny_overrides(arch))
    return cases


CASES = _cases()


def _cli_archs():
    """Controls plus one arch per (model class, name prefix): the CLI checks are slow. Within a
    family the ``<prefix>_base`` preset (else the shortest name) stands for the others."""
    families = {}
    for arch, cls in plugin_archs().items():
        families.setdefault((cls.__name__, arch.split("_")[0]), []).append(arch)
    chosen = list(CONTROLS)
    for (_, prefix), archs in sorted(families.items()):
        base = f"{prefix}_base"
        chosen.append(base if base in archs else min(archs, key=lambda a: (len(a), a)))
    return chosen


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request):
    arch = request.param
    lm, overrides = CASES[arch]
    args, task, model = build(arch, overrides, lm)
    return arch, lm, args, task, model


# ---------------------------------------------------------------------------- a-f
# (the checks live in slim_fairseq_lab/contract.py; on the CPU in fp32 here)


def test_a_builds_through_fairseq_parser(built):
    arch, lm, args, task, model = built
    assert args.arch == arch
    n = sum(p.numel() for p in model.parameters())
    assert n > 0 and all(torch.isfinite(p).all() for p in model.parameters())


def test_b_every_parameter_gets_a_gradient(built):
    arch, lm, args, task, model = built
    contract.check_gradients(arch, model, task, args, lm)


def test_c_incremental_equals_full_forward(built):
    arch, lm, args, task, model = built
    contract.check_incremental(arch, model, task, lm)


def test_d_no_future_leak(built):
    arch, lm, args, task, model = built
    contract.check_no_future_leak(arch, model, task, lm)


def test_e_padding_invariance(built):
    arch, lm, args, task, model = built
    contract.check_padding_invariance(arch, model, task, lm)


def test_f_checkpoint_round_trip_weights_only(built, tmp_path):
    arch, lm, args, task, model = built
    contract.check_checkpoint_round_trip(arch, model, task, args, lm, tmp_path)


def test_i_training_time_breakdown(built):
    """scripts/benchmark.py --time-breakdown on every arch: its hooks around module inputs and
    outputs leave the model trainable, the attention and the feed-forward are found with a
    backward of their own, and no part is counted twice."""
    from slim_fairseq_lab.benchmark import measure as benchmark
    arch, lm, args, task, model = built
    entry = benchmark.Entry(arch, arch, [], lm)
    entry.model, entry.criterion = model, task.build_criterion(args)
    parts = benchmark.time_by_part(entry, contract.training_sample(task, lm), torch.device("cpu"), torch.float32)
    for name in ("attention", "feed-forward"):
        assert parts[name]["backward"] > 0, f"{arch}: no backward time for {name}"
    covered = sum(v["forward"] for k, v in parts.items() if k not in ("rest", "step"))
    assert covered <= parts["step"]["forward"], f"{arch}: a part was counted twice"


# ---------------------------------------------------------------------------- g-h (CLI)


def _train_args(arch, save_dir, extra=()):
    lm, overrides = CASES[arch]
    return task_args(lm) + [
        "--arch", arch, "--user-dir", USER_DIR, "--cpu", *overrides,
        "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", "2",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation",
        "--log-format", "simple", "--log-interval", "1", "--seed", "3", "--num-workers", "0",
        *extra]


@pytest.mark.slow
@pytest.mark.parametrize("arch", _cli_archs())
def test_g_train_then_generate_or_eval(arch, tmp_path):
    lm = CASES[arch][0]
    save = str(tmp_path / "ckpt")
    out = run_cli("fairseq-train", _train_args(arch, save))
    assert "done training" in out
    ckpt = os.path.join(save, "checkpoint_last.pt")
    assert os.path.exists(ckpt)
    data = task_args(lm)[0]
    if lm:
        out = run_cli("fairseq-eval-lm", [data, "--path", ckpt, "--user-dir", USER_DIR, "--cpu",
                                          "--tokens-per-sample", "64", "--batch-size", "16",
                                          "--gen-subset", "valid"])
        assert "Perplexity" in out
    else:
        out = run_cli("fairseq-generate", [data, "--path", ckpt, "--user-dir", USER_DIR, "--cpu",
                                           "--source-lang", "en", "--target-lang", "de",
                                           "--beam", "5", "--batch-size", "32", "--max-len-a", "0",
                                           "--max-len-b", "8", "--gen-subset", "valid",
                                           "--remove-bpe"])
        assert "BLEU" in out and "H-" in out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("arch", _cli_archs())
def test_h_two_cpu_ranks_stay_identical(arch, tmp_path):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", SLIM_DUMP_DIR=str(tmp_path))
    procs = []
    for rank in range(2):
        argv = _train_args(arch, str(tmp_path / f"ckpt{rank}"), extra=[
            "--max-update", "3", "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
            "--distributed-world-size", "2", "--distributed-rank", str(rank),
            "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
            "--device-id", str(rank)])
        procs.append(subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                                    "dist_worker.py"), *argv],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=env))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["num_updates"] == r1["num_updates"] == 3
    assert r0["params"].keys() == r1["params"].keys()
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), f"{arch}: rank params differ at {k}"
