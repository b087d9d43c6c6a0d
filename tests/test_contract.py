"""The architecture contract (issue 2, item 6): every architecture the plugin registers, built
tiny by its model's ``contract_overrides``, plus fairseq's own ``transformer`` and
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
from fairseq.data import data_utils

from helpers import BIN, USER_DIR, build, is_lm, plugin_archs, run_cli, task_args

TOL = 1e-5

CONTROLS = {
    "transformer": (False, ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
                            "--encoder-layers", "2", "--encoder-attention-heads", "4",
                            "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
                            "--decoder-layers", "2", "--decoder-attention-heads", "4"]),
    "transformer_lm": (True, ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
                              "--decoder-layers", "2", "--decoder-attention-heads", "4"]),
}


def _cases():
    cases = dict(CONTROLS)
    for arch, cls in plugin_archs().items():
        assert hasattr(cls, "contract_overrides"), f"{cls.__name__} lacks contract_overrides(arch)"
        cases[arch] = (is_lm(cls), list(cls.contract_overrides(arch)))
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


# ---------------------------------------------------------------------------- batches


def _batch(task, lm, tgt_lens=(7, 7), src_lens=(9, 6), seed=0):
    """Random in-vocabulary tokens; sources left-padded, targets right-padded as fairseq does."""
    d = task.target_dictionary
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(d.nspecial, len(d), (n,), generator=g) for n in tgt_lens]
    prev = data_utils.collate_tokens([torch.cat([torch.tensor([d.eos()]), r[:-1]]) for r in rows],
                                     d.pad(), left_pad=False)
    target = data_utils.collate_tokens(rows, d.pad(), left_pad=False)
    if lm:
        lengths = torch.tensor(tgt_lens)
        return {"src_tokens": prev, "src_lengths": lengths}, target
    s = task.source_dictionary
    srcs = [torch.cat([torch.randint(s.nspecial, len(s), (n - 1,), generator=g),
                       torch.tensor([s.eos()])]) for n in src_lens]
    src = data_utils.collate_tokens(srcs, s.pad(), left_pad=True)
    return {"src_tokens": src, "src_lengths": torch.tensor(src_lens),
            "prev_output_tokens": prev}, target


def _select(net_input, rows):
    return {k: v[rows] for k, v in net_input.items()}


def _prefix(net_input, lm):
    return net_input["src_tokens"] if lm else net_input["prev_output_tokens"]


def _log_probs(model, net_input):
    return model.get_normalized_probs(model(**net_input), log_probs=True)


def _incremental_log_probs(model, net_input, lm, reorder_at=None, new_order=None):
    """Decode one token at a time with fairseq's incremental state; optionally reorder the
    state (as beam search does) before step ``reorder_at``."""
    tokens = _prefix(net_input, lm)
    enc = None if lm else model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    state = {}
    steps = []
    for t in range(tokens.size(1)):
        if t == reorder_at:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            tokens = tokens[new_order]
            if enc is not None:
                enc = model.encoder.reorder_encoder_out(enc, new_order)
        kwargs = {} if lm else {"encoder_out": enc}
        out = model.decoder(tokens[:, : t + 1], incremental_state=state, **kwargs)
        steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1])
    return steps


# ---------------------------------------------------------------------------- a-f


def test_a_builds_through_fairseq_parser(built):
    arch, lm, args, task, model = built
    assert args.arch == arch
    n = sum(p.numel() for p in model.parameters())
    assert n > 0 and all(torch.isfinite(p).all() for p in model.parameters())


def _training_sample(task, lm):
    """A training sample whose targets sweep the vocabulary geometrically, so that every band of
    an adaptive input/softmax is used."""
    net_input, target = _batch(task, lm, tgt_lens=(12, 9))
    d = task.target_dictionary
    sweep, k = [], d.nspecial
    while k < len(d) and len(sweep) < 11:
        sweep.append(k)
        k *= 2
    sweep.append(len(d) - 1)
    sweep = torch.tensor(sweep)
    _prefix(net_input, lm)[0, 1: len(sweep) + 1] = sweep
    target[0, : len(sweep)] = sweep
    pad = task.target_dictionary.pad()
    return {"id": torch.arange(target.size(0)), "nsentences": target.size(0),
            "ntokens": int(target.ne(pad).sum()), "net_input": net_input, "target": target}


def test_b_every_parameter_gets_a_gradient(built):
    arch, lm, args, task, model = built
    sample = _training_sample(task, lm)
    criterion = task.build_criterion(args)  # the criterion fairseq-train would use
    model.train()
    model.zero_grad()
    loss, sample_size, _ = criterion(model, sample)
    assert torch.isfinite(loss) and sample_size > 0
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{arch}: parameters without gradient (DDP would need " \
                        f"--find-unused-parameters): {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@torch.no_grad()
def test_c_incremental_equals_full_forward(built):
    arch, lm, args, task, model = built
    model.eval()
    net_input, _ = _batch(task, lm, tgt_lens=(7, 7), seed=1)
    full = _log_probs(model, net_input)
    new_order = torch.tensor([1, 0, 1])
    reordered_full = _log_probs(model, _select(net_input, new_order))
    steps = _incremental_log_probs(model, net_input, lm, reorder_at=3, new_order=new_order)
    for t, step in enumerate(steps):
        ref = full[:, t] if t < 3 else reordered_full[:, t]
        diff = (step - ref).abs().max().item()
        assert diff <= TOL, f"{arch}: step {t} differs from the full forward by {diff:.3g}"


@torch.no_grad()
def test_d_no_future_leak(built):
    arch, lm, args, task, model = built
    model.eval()
    net_input, _ = _batch(task, lm, tgt_lens=(8, 8), seed=2)
    base = _log_probs(model, net_input)
    d = task.target_dictionary
    for t in (2, 5):
        changed = {k: v.clone() for k, v in net_input.items()}
        tokens = _prefix(changed, lm)
        tokens[:, t] = d.nspecial + (tokens[:, t] - d.nspecial + 7) % (len(d) - d.nspecial)
        out = _log_probs(model, changed)
        leak = (out[:, :t] - base[:, :t]).abs().max().item()
        assert leak == 0.0 or leak < 1e-6, f"{arch}: changing token {t} changed earlier outputs by {leak}"
        assert (out[:, t:] - base[:, t:]).abs().max().item() > 0, "the model ignores its input"


@torch.no_grad()
def test_e_padding_invariance(built):
    arch, lm, args, task, model = built
    model.eval()
    net_input, _ = _batch(task, lm, tgt_lens=(8, 4), src_lens=(10, 5), seed=3)
    batched = _log_probs(model, net_input)
    for row, length in ((0, 8), (1, 4)):
        alone_input = _select(net_input, torch.tensor([row]))
        if lm:
            alone_input["src_tokens"] = alone_input["src_tokens"][:, :length]
        else:
            src = alone_input["src_tokens"]
            alone_input["src_tokens"] = src[:, src.ne(task.source_dictionary.pad())[0]]
            alone_input["prev_output_tokens"] = alone_input["prev_output_tokens"][:, :length]
        alone = _log_probs(model, alone_input)
        diff = (alone[0, :length] - batched[row, :length]).abs().max().item()
        assert diff <= TOL, f"{arch}: row {row} differs alone vs padded batch by {diff:.3g}"


@torch.no_grad()
def test_f_checkpoint_round_trip_weights_only(built, tmp_path):
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    arch, lm, args, task, model = built
    model.eval()
    cfg = convert_namespace_to_omegaconf(args)
    state = {
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "args": None,
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 0},
        "last_optimizer_state": None,
    }
    path = str(tmp_path / "checkpoint.pt")
    checkpoint_utils.torch_persistent_save(state, path)
    torch.load(path, weights_only=True)  # the file itself loads with safety on
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    loaded = models[0].eval()
    net_input, _ = _batch(task, lm, seed=4)
    assert torch.equal(_log_probs(model, net_input), _log_probs(loaded, net_input))


def test_i_training_time_breakdown(built):
    """scripts/benchmark.py --time-breakdown on every arch: its hooks around module inputs and
    outputs leave the model trainable, the attention and the feed-forward are found with a
    backward of their own, and no part is counted twice."""
    from slim_fairseq_lab.benchmark import measure as benchmark
    arch, lm, args, task, model = built
    entry = benchmark.Entry(arch, arch, [], lm)
    entry.model, entry.criterion = model, task.build_criterion(args)
    parts = benchmark.time_by_part(entry, _training_sample(task, lm), torch.device("cpu"), torch.float32)
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
