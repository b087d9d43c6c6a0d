"""Smoke tests of scripts/benchmark.py, scripts/quality.py and scripts/bench_allocator.py and of the
lab package behind them (slim_fairseq_lab): tiny shapes, one or two steps; the tables, JSON and
PNG plots must be produced and consistent with the built models."""
import argparse
import json
import math
import os
import threading
import time
import types

import pytest
import torch

from helpers import build, ende_data_bin, load_script, wikitext_data_bin
from slim_fairseq_lab import fairseq_logs, launcher, specs
from slim_fairseq_lab.benchmark import measure
from slim_fairseq_lab.study import options, planner, report, summary
from slim_fairseq_lab.study import plot as study_plot
from slim_fairseq_lab.study import runs as study_runs

benchmark = load_script("benchmark")
quality = load_script("quality")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_SHAPE = ["--dim", "32", "--layers", "3", "--heads", "4", "--ffn", "64"]


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_parse_model_spec():
    assert specs.parse_model_spec("glu=slim_transformer --ffn-glu --activation-fn gelu") == (
        "glu", "slim_transformer", ["--ffn-glu", "--activation-fn", "gelu"])
    assert specs.parse_model_spec("anthe_base") == ("anthe_base", "anthe_base", [])
    with pytest.raises(ValueError, match="--model"):
        specs.parse_model_spec("   ")


def test_dense_export_matches_tensor_chain_model():
    """--dense-export replaces every TensorChainLinear by nn.Linear without changing outputs."""
    _, task, model = build("anthe_base", ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                                          "--encoder-layers", "1", "--decoder-layers", "1",
                                          "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                                          "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"],
                           lm=False)
    model.eval()
    assert measure.tc_linears(model)
    dense = measure.export_dense(model).eval()
    assert not measure.tc_linears(dense)
    assert measure.tc_linears(model), "export must not modify the original model"
    src = torch.randint(4, len(task.source_dictionary), (2, 7))
    prev = torch.randint(4, len(task.target_dictionary), (2, 5))
    lengths = torch.full((2,), 7)
    with torch.no_grad():
        expected = model(src, lengths, prev)[0]
        got = dense(src, lengths, prev)[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_dense_export_of_tc_attention_holds_dense_projections():
    """After the export, an ungated attention with TC q/k/v holds three nn.Linear, with
    unchanged outputs."""
    from slim_fairseq.modules.attention import SlimMultiheadAttention
    _, task, model = build("slim_transformer", ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                                                "--encoder-layers", "1", "--decoder-layers", "1",
                                                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                                                "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                                                "--tc-patt", "0.5"], lm=False)
    model.eval()
    attentions = [m for m in model.modules() if isinstance(m, SlimMultiheadAttention)]
    assert attentions and not any(type(m.q_proj) is torch.nn.Linear for m in attentions)
    dense = measure.export_dense(model).eval()
    exported = [m for m in dense.modules() if isinstance(m, SlimMultiheadAttention)]
    assert exported and all(type(getattr(m, f"{name}_proj")) is torch.nn.Linear
                            for m in exported for name in ("q", "k", "v", "out"))
    src = torch.randint(4, len(task.source_dictionary), (2, 6))
    prev = torch.randint(4, len(task.target_dictionary), (2, 4))
    with torch.no_grad():
        torch.testing.assert_close(dense(src, torch.full((2,), 6), prev)[0],
                                   model(src, torch.full((2,), 6), prev)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_benchmark_script_tiny(tmp_path):
    out = tmp_path / "bench"
    rows = benchmark.main([
        "--out", str(out), *TINY_SHAPE, "--threads", "1", "--max-tokens", "128", "--num-batches", "1",
        "--steps", "1", "--repeats", "1", "--batch-sizes", "1,2", "--beams", "1,2", "--gen-len", "2",
        "--tokens-per-sample", "16", "--gemm-size", "128", "--dense-export",
        "--ende-data", ende_data_bin(), "--lm-data", wikitext_data_bin(),
        "--model", "anthe_base", "--model", "skipless_lm"])
    by_label = {r["label"]: r for r in rows}
    assert set(by_label) == {"transformer", "transformer_lm", "anthe_base", "anthe_base +dense", "skipless_lm"}

    # parameter counts agree with the same models built through fairseq's parser
    shape = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-layers", "3",
             "--decoder-layers", "3", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
             "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]
    _, _, anthe = build("anthe_base", shape, lm=False)
    _, _, transformer = build("transformer", shape, lm=False)
    assert by_label["anthe_base"]["params"] == sum(p.numel() for p in anthe.parameters())
    assert by_label["transformer"]["params"] == sum(p.numel() for p in transformer.parameters())
    assert by_label["anthe_base"]["ratios"]["params"] == pytest.approx(
        by_label["anthe_base"]["params"] / by_label["transformer"]["params"])
    assert 0 < by_label["anthe_base"]["non_embedding_params"] < by_label["anthe_base"]["params"]
    # the dense export holds more parameters than the chain it replaces
    assert by_label["anthe_base +dense"]["params"] > by_label["anthe_base"]["params"]

    for label in ("transformer", "transformer_lm", "anthe_base", "skipless_lm"):
        row = by_label[label]
        assert row["train_tokens_per_s"] > 0 and row["train_gflops"] > 0
        assert row["peak_memory_bytes"] > 4 * row["params"]  # at least the fp32 weights
    for row in rows:
        assert set(row["generation_tokens_per_s"]) == {"b1_beam1", "b1_beam2", "b2_beam1", "b2_beam2"}
        assert all(v > 0 for v in row["generation_tokens_per_s"].values())
    assert by_label["transformer"]["ratios"]["train_tokens_per_s"] == 1.0
    # aten ops per step, against the baseline of the same task
    for row in rows:
        if row["dense_export_of"] is None:
            assert row["ops"]["train"]["top"] > 100 and row["ops"]["decode"]["top"] > 10
            assert row["ops"]["train"]["all"] > row["ops"]["train"]["top"]
    assert by_label["transformer"]["ratios"]["ops_train"] == 1.0
    assert by_label["anthe_base"]["ratios"]["ops_train"] == pytest.approx(
        by_label["anthe_base"]["ops"]["train"]["top"] / by_label["transformer"]["ops"]["train"]["top"])

    table = (out / "table.md").read_text()
    assert "ops/train step" in table and "ops/decode step" in table
    for label in by_label:
        assert f"| {label}" in table
    assert json.loads((out / "results.json").read_text())["rows"][0]["label"] == "transformer"
    for png in ("ratios.png", "throughput.png"):
        assert _is_png(out / png)

    # --report-only re-writes the same table from results.json without measuring
    (out / "table.md").unlink()
    again = benchmark.main(["--report-only", "--out", str(out)])
    assert [r["ratios"] for r in again] == [r["ratios"] for r in rows]
    assert (out / "table.md").read_text() == table


def test_benchmark_generation_only(tmp_path):
    rows = benchmark.main([
        "--out", str(tmp_path / "gen"), *TINY_SHAPE, "--threads", "1", "--no-training",
        "--batch-sizes", "1", "--beams", "1", "--gen-len", "2", "--tokens-per-sample", "16",
        "--gemm-size", "128", "--lm-data", wikitext_data_bin(), "--model", "skipless_lm",
        "--no-op-counts"])
    assert [r["label"] for r in rows] == ["transformer_lm", "skipless_lm"]
    # three repetitions on the CPU unless --repeats says otherwise (five on CUDA)
    assert all(len(v) == 3 for r in rows for v in r["generation_tokens_per_s_all"].values())
    assert all(r["ops"] is None for r in rows)
    assert "ops/" not in (tmp_path / "gen" / "table.md").read_text()
    for row in rows:
        assert row["train_tokens_per_s"] is None and row["peak_memory_bytes"] is None
        assert row["generation_tokens_per_s"]["b1_beam1"] > 0
    with pytest.raises(SystemExit, match="nothing to measure"):
        benchmark.main(["--no-training", "--no-generation", "--model", "skipless_lm"])


def test_benchmark_memory_only(tmp_path):
    """--memory-only: peak training memory of every model, nothing timed, no generation."""
    out = tmp_path / "mem"
    rows = benchmark.main([
        "--out", str(out), *TINY_SHAPE, "--threads", "1", "--memory-only", "--max-tokens", "128",
        "--num-batches", "1", "--memory-breakdown", "--ende-data", ende_data_bin(),
        "--model", "anthe_base"])
    assert [r["label"] for r in rows] == ["transformer", "anthe_base"]
    for row in rows:
        assert row["peak_memory_bytes"] > 4 * row["params"]
        assert row["train_tokens_per_s"] is None and row["train_gflops"] is None
        assert row["generation_tokens_per_s"] == {}
        # the breakdown: per-module activations, layers folded, the loss's own tensors apart
        saved = row["saved_by_module"]
        assert "decoder.layers.N.fc1" in saved and "<loss>" in saved
        assert all(v > 0 for v in saved.values())
        assert not any(part.isdigit() for name in saved for part in name.split("."))
        assert sum(saved.values()) < row["peak_memory_bytes"]
    assert rows[1]["ratios"]["peak_memory"] == pytest.approx(
        rows[1]["peak_memory_bytes"] / rows[0]["peak_memory_bytes"])
    table = (out / "table.md").read_text()
    assert "peak training memory of one step only (--memory-only)" in table
    assert "gen b" not in table
    assert "| `decoder.layers.N.fc1` |" in table
    for flag in ("--no-memory", "--no-training", "--dense-export"):
        with pytest.raises(SystemExit, match=f"--memory-only cannot be combined with {flag}"):
            benchmark.main(["--memory-only", flag, "--model", "anthe_base"])
    with pytest.raises(SystemExit, match="--memory-breakdown needs the memory step"):
        benchmark.main(["--memory-breakdown", "--no-memory", "--model", "anthe_base"])


def test_benchmark_time_breakdown(tmp_path, monkeypatch):
    """--time-breakdown: one training step's time by part, for translation and LM models. The
    attention's backward is seen although fairseq passes its inputs as keyword arguments (module
    full-backward hooks see positional ones only, and timed it as 0), and no part is counted
    twice (a skipless `ffn` holds fc1 and fc2)."""
    out = tmp_path / "parts"
    rows = benchmark.main([
        "--out", str(out), *TINY_SHAPE, "--threads", "1", "--max-tokens", "128", "--num-batches", "1",
        "--steps", "1", "--repeats", "2", "--no-generation", "--no-memory", "--time-breakdown",
        "--tokens-per-sample", "16", "--gemm-size", "128", "--ende-data", ende_data_bin(),
        "--lm-data", wikitext_data_bin(), "--model", "anthe_base", "--model", "skipless_lm",
        "--model", "stlm_tied"])
    for row in rows:
        parts = row["time_by_part"]
        assert len(row["time_by_part_all"]) == 2
        for name in ("attention", "feed-forward"):
            assert parts[name]["forward"] > 0 and parts[name]["backward"] > 0, (row["label"], name)
        covered = sum(v["forward"] for k, v in parts.items() if k not in ("rest", "step"))
        assert covered <= parts["step"]["forward"], row["label"]  # nothing counted twice
        assert "output projection" in parts  # a tied projection (stlm_tied) is timed as well
    table = (out / "table.md").read_text()
    assert "Where the training time goes" in table
    # --no-generation: no generation columns (they printed as "—"), in the report-only table too
    assert "gen b" not in table and all(row["generation_tokens_per_s"] == {} for row in rows)
    benchmark.main(["--out", str(out), "--report-only"])
    assert "gen b" not in (out / "table.md").read_text()
    # --tc-one-pass: the whole batch in one contraction for this run only
    from slim_fairseq.modules import tensor_chain_policy
    seen = []
    real_time_by_part = measure.time_by_part
    monkeypatch.setattr(measure, "time_by_part", lambda *a: (seen.append(tensor_chain_policy.BLOCK_FLOATS),
                                                             real_time_by_part(*a))[1])
    block_floats = tensor_chain_policy.BLOCK_FLOATS
    benchmark.main(["--out", str(tmp_path / "one_pass"), *TINY_SHAPE, "--threads", "1", "--max-tokens", "128",
                    "--num-batches", "1", "--steps", "1", "--repeats", "1", "--no-generation", "--no-memory",
                    "--time-breakdown", "--gemm-size", "128", "--ende-data", ende_data_bin(),
                    "--model", "anthe_base", "--tc-one-pass"])
    assert seen and all(v == float("inf") for v in seen) and tensor_chain_policy.BLOCK_FLOATS == block_floats
    with pytest.raises(SystemExit, match="--time-breakdown times training steps"):
        benchmark.main(["--time-breakdown", "--no-training", "--model", "anthe_base"])


@pytest.mark.slow
def test_benchmark_bf16_autocast_training_and_cast_generation(tmp_path):
    """--dtype bf16: autocast training and a bf16-cast model (and its dense export) in generation."""
    rows = benchmark.main([
        "--out", str(tmp_path / "bf16"), *TINY_SHAPE, "--threads", "1", "--dtype", "bf16", "--max-tokens", "128",
        "--num-batches", "1", "--steps", "1", "--repeats", "1", "--batch-sizes", "1", "--beams", "1,2",
        "--gen-len", "2", "--gemm-size", "128", "--dense-export", "--no-memory",
        "--ende-data", ende_data_bin(), "--model", "tc=slim_transformer --tc-ff 0.5"])
    by_label = {r["label"]: r for r in rows}
    assert set(by_label) == {"transformer", "tc", "tc +dense"}
    for label in ("transformer", "tc"):
        assert by_label[label]["train_tokens_per_s"] > 0
    for row in rows:
        assert all(v > 0 for v in row["generation_tokens_per_s"].values())
    assert "dtype bf16" in (tmp_path / "bf16" / "table.md").read_text()


def test_quality_log_parsers():
    line = ('2026-01-01 00:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "9.5", "valid_nll_loss": '
            '"9.1", "valid_ppl": "548.75", "valid_num_updates": "40"}')
    assert fairseq_logs.valid_points("noise\n" + line) == [(40, 9.5, 9.1, 548.75)]
    assert fairseq_logs.parameter_count("| num. shared model params: 1,234,567 (num. trained: 1,234,567)") == 1234567
    assert fairseq_logs.bleu("Generate test with beam=5: BLEU = 12.34 45.6/20.1/9.8/4.5 (BP = 1.000)") == 12.34
    assert summary.mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5))


@pytest.mark.slow
def test_quality_script_tiny(tmp_path):
    out = tmp_path / "quality"
    data = ende_data_bin()
    rows = quality.main([
        "--out", str(out), *TINY_SHAPE, "--threads", "1", "--seeds", "1", "--max-update", "2",
        "--validate-interval", "1", "--max-tokens", "256", "--tokens-per-sample", "16", "--no-baseline",
        "--ende-data", data, "--bpe-codes", os.path.join(os.path.dirname(data), "bpe", "codes"),
        "--lm-data", wikitext_data_bin(), "--model", "anthe_base", "--lm-model", "stlm_tied", "--keep-checkpoints"])
    assert {(r["corpus"], r["label"]) for r in rows} == {("ende", "anthe_base"), ("wikitext", "stlm_tied")}
    for row in rows:
        assert row["valid_ppl"][0] > 1 and row["updates"][0] == 2
        assert row["params"] > 0
    ende = next(r for r in rows if r["corpus"] == "ende")
    assert ende["test_bleu"][0] is not None and ende["test_bleu"][0] >= 0
    # BLEU over the whole test subset (100 sentences): fairseq's default batch multiple of 8 drops 4
    generate_log = (out / "runs" / "ende_anthe_base_s1" / "generate.log").read_text()
    assert "Translated 100 sentences" in generate_log
    table = (out / "table.md").read_text()
    assert "anthe_base" in table and "stlm_tied" in table and "test BLEU" in table
    # the reported valid NLL is that of the checkpoint the BLEU is decoded from
    from fairseq import checkpoint_utils
    state = checkpoint_utils.load_checkpoint_to_cpu(str(out / "runs" / "ende_anthe_base_s1" / "checkpoint_best.pt"))
    run = json.loads((out / "runs" / "ende_anthe_base_s1" / "run.json").read_text())
    assert state["optimizer_history"][-1]["num_updates"] == run["best_update"]
    assert run["valid_nll"] == summary.checkpoint_point(run["valid_curve"])[2]
    for png in ("valid_loss_ende.png", "valid_loss_wikitext.png", "params_vs_quality.png"):
        assert _is_png(out / png)


def _fake_tool(bin_dir, name, body):
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


def test_run_tool_keeps_work_finished_before_a_crash_at_exit(tmp_path, monkeypatch):
    """A tool killed by a signal after its last line (CI once saw fairseq-train abort at interpreter
    exit, after saving) keeps its results; any other failure is still an error."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(launcher, "BIN", str(bin_dir))
    done = "2026-01-01 | INFO | fairseq_cli.train | done training in 0.1 seconds"
    _fake_tool(bin_dir, "fairseq-train", f"echo '{done}'; echo 'terminate called'; kill -ABRT $$")
    output = launcher.run_tool("fairseq-train", [], str(tmp_path / "train.log"), 1)
    assert done in output
    assert "killed by signal 6" in (tmp_path / "train.log").read_text()
    _fake_tool(bin_dir, "fairseq-generate", "echo 'Generate test with beam=5: BLEU4 = 1.00'; kill -ABRT $$")
    assert "BLEU4" in launcher.run_tool("fairseq-generate", [], str(tmp_path / "gen.log"), 1)
    # a crash before the work is done, or an ordinary error exit, still fails
    _fake_tool(bin_dir, "fairseq-train", "echo 'epoch 1'; kill -ABRT $$")
    with pytest.raises(RuntimeError, match=r"fairseq-train failed \(-6\)"):
        launcher.run_tool("fairseq-train", [], str(tmp_path / "train2.log"), 1)
    _fake_tool(bin_dir, "fairseq-train", f"echo '{done}'; exit 1")
    with pytest.raises(RuntimeError, match=r"failed \(1\)"):
        launcher.run_tool("fairseq-train", [], str(tmp_path / "train3.log"), 1)


def test_run_tool_keeps_large_blocks_in_the_heap_unless_the_caller_says_otherwise(tmp_path, monkeypatch):
    """fairseq tools started by quality.py get glibc's malloc settings that keep large blocks in
    the heap (docs/TRAINING.md#cpu-memory-allocator); a value the caller exported wins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(launcher, "BIN", str(bin_dir))
    _fake_tool(bin_dir, "fairseq-train", 'echo "mmap=$MALLOC_MMAP_THRESHOLD_ trim=$MALLOC_TRIM_THRESHOLD_"')
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    output = launcher.run_tool("fairseq-train", [], str(tmp_path / "a.log"), 1)
    assert f"mmap={256 * 2 ** 20} trim={2 ** 30}" in output
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert f"mmap=131072 trim={2 ** 30}" in launcher.run_tool("fairseq-train", [], str(tmp_path / "b.log"), 1)


def test_bench_allocator_times_both_settings_side_by_side(tmp_path, monkeypatch, capsys):
    """scripts/bench_allocator.py trains every model with glibc's default settings (no MALLOC_*
    variables, even when the caller exported one) and with launcher.ALLOCATOR_ENV (the caller's
    value winning), and reports the ratio of fairseq's training times and whether the valid
    losses agree."""
    bench_allocator = load_script("bench_allocator")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(launcher, "BIN", str(bin_dir))
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    valid = 'x | valid | {"valid_loss": "7.0", "valid_nll_loss": "7.0", "valid_ppl": "128", "valid_num_updates": "2"}'
    _fake_tool(bin_dir, "fairseq-train", f"echo '{valid}'\n"
               # 3 s with no MALLOC_* variable, 2 s with the heap settings and the caller's threshold
               'case "${MALLOC_MMAP_THRESHOLD_:-unset}/${MALLOC_TRIM_THRESHOLD_:-unset}" in\n'
               '  unset/unset) s=3.0 ;; 131072/1073741824) s=2.0 ;; *) s=9.0 ;;\n'
               'esac\necho "done training in $s seconds"')
    bench_allocator.main(["--corpus", "wikitext", "--lm-data", str(tmp_path), "--dim", "32", "--max-update", "2",
                          "--repeats", "1", "--lm-model", "tied=transformer_lm --share-decoder-input-output-embed"])
    table = capsys.readouterr().out
    assert "| transformer_lm | 3.0 (3.0–3.0) |" in table and "| 2.0 (2.0–2.0) |" in table
    assert table.count("| 1.50× | yes |") == 2
    with pytest.raises(SystemExit):
        bench_allocator.main(["--corpus", "both"])


def fake_study_run(loss_of, calls=None):
    """An ``execute_run`` stand-in: the record of a one-validation run of ``job`` whose valid NLL is
    ``loss_of(label, dim, lr, seed)`` (it may raise to stop the study there); each job is also
    appended to ``calls`` when given, in the order the study ran them."""
    def run(job, data, args):
        if calls is not None:
            calls.append(job)
        corpus, label, arch, overrides, baseline, dim, lr, seed, save_dir = job
        loss = loss_of(label, dim, lr, seed)
        return {"corpus": corpus, "label": label, "arch": arch, "overrides": overrides, "seed": seed,
                "dim": dim, "lr": lr, "baseline": baseline, "params": dim * 1000,
                "valid_curve": [[1, loss, loss, 2 ** loss]], "updates": 1, "valid_nll": loss,
                "valid_ppl": 2 ** loss, "train_seconds": 0.0, "train_wps": 1.0, "settings": []}, False
    return run


def test_quality_lr_sweep_at_one_width_extends_edges_and_transfers(tmp_path, monkeypatch):
    """--lr-sweep-dim sweeps the rates at one width only and trains the other widths at each
    model's best rate there; --lr-extend adds a rate beyond the grid when the best is at its edge
    (and a diverged run counts as worst)."""
    optimum = {"a": 3e-2, "b": 1e-3}  # model "a" wants a rate above the grid's top, "b" is inside

    def loss(label, dim, lr, seed):
        return math.nan if lr > 5e-2 else abs(math.log10(lr / optimum[label])) + 100.0 / dim + 0.01 * seed

    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(loss))
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
            "--dim", "32,64,128", "--lr-sweep-dim", "64", "--lr", "1e-4,3e-4,1e-3,3e-3", "--lr-extend", "3",
            "--seeds", "1", "--confirm-seeds", "2", "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm",
            "--frontier-baseline", "b"]
    quality.main(argv)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    swept = {(r["label"], round(r["lr"], 6)) for r in runs if r["dim"] == 64 and r["seed"] == 1}
    # a: the grid, then 9e-3 and 2.7e-2 (each best, at the edge), then 8.1e-2 diverges: best inside
    extended = {("a", 0.009), ("a", 0.027), ("a", 0.081)}
    assert swept == {(m, lr) for m in "ab" for lr in (1e-4, 3e-4, 1e-3, 3e-3)} | extended
    best = {("a", 0.027), ("b", 0.001)}
    for dim in (32, 128):  # trained at the rate chosen at width 64 only, both seeds
        assert {(r["label"], round(r["lr"], 6), r["seed"]) for r in runs if r["dim"] == dim} == {
            (m, lr, seed) for m, lr in best for seed in (1, 2)}
    assert {(r["label"], round(r["lr"], 6)) for r in runs if r["dim"] == 64 and r["seed"] == 2} == best
    assert planner.edge_rate(runs, "wikitext", "a", 64, [1e-4, 3e-4, 1e-3, 3e-3]) is None
    # --report-only re-renders the same report from results.json: the settings come from the
    # recorded command line, not from this one's defaults
    table = (tmp_path / "table.md").read_text()
    assert "lr 0.0001,0.0003,0.001,0.003 at d 64 (and up to 3 more beyond an edge); seeds 1 (and 2 at each" in table
    (tmp_path / "table.md").unlink()
    quality.main(["--out", str(tmp_path), "--report-only"])
    assert (tmp_path / "table.md").read_text() == table
    for bad, message in ((["--lr-sweep-dim", "48"], "expected one of the --dim widths"),
                         (["--lr", "1e-3", "--lr-extend", "1"], "at least two --lr values")):
        with pytest.raises(SystemExit):
            quality.main(argv + bad)


def test_quality_lr_width_check_steps_the_rate_with_width(tmp_path, monkeypatch):
    """--lr-width-check: every model also trains the other widths one grid step from the rate
    carried over from the sweep, lower at width 128 and higher at width 32, and one step further
    (--lr-extend 1) where that step won. Model "a" wants a rate inversely proportional to width,
    so it keeps the stepped rates at both widths and trains its second seed there; "b" (the same
    optimum at every width) keeps the carried-over rate. Running the study again adds nothing."""
    def loss(label, dim, lr, seed):
        optimum = 1e-2 * (64 / dim if label == "a" else 1)
        return 3 * abs(math.log10(lr / optimum)) + 50.0 / dim + 0.001 * seed

    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(loss))
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
            "--dim", "32,64,128", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3,1e-2", "--lr-extend", "1",
            "--lr-width-check", "--seeds", "1", "--confirm-seeds", "2", "--lm-model", "a=transformer_lm",
            "--lm-model", "b=transformer_lm", "--frontier-baseline", "b"]
    quality.main(argv)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    other = {(r["label"], r["dim"], round(r["lr"], 6), r["seed"]) for r in runs if r["dim"] != 64}
    assert other == {
        ("a", 32, 0.01, 1), ("a", 32, 0.033333, 1), ("a", 32, 0.111111, 1), ("a", 32, 0.033333, 2),
        ("b", 32, 0.01, 1), ("b", 32, 0.033333, 1), ("b", 32, 0.01, 2),
        ("a", 128, 0.01, 1), ("a", 128, 0.003333, 1), ("a", 128, 0.001111, 1), ("a", 128, 0.003333, 2),
        ("b", 128, 0.01, 1), ("b", 128, 0.003333, 1), ("b", 128, 0.01, 2)}
    assert "other widths also a step lower (wider) or higher (narrower)" in (tmp_path / "table.md").read_text()
    # the step is computed as lr * grid[0] / grid[1], the float the committed studies' runs record
    assert 0.01 * 1e-3 / 3e-3 in {r["lr"] for r in runs if r["dim"] == 128}
    quality.main(argv)
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == len(runs)
    with pytest.raises(SystemExit):
        quality.main(["--out", str(tmp_path), "--lr", "1e-3,1e-2", "--lr-width-check", "--lm-model", "a=transformer_lm"])


def test_quality_second_seed_goes_width_by_width_narrowest_first(tmp_path, monkeypatch):
    """--confirm-seeds trains every model at the narrowest width before any model at the next
    one, so a study stopped in that phase has a seed spread for whole widths (and the cheap runs
    come first)."""
    calls = []
    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(lambda label, dim, lr, seed: 5.0 + lr + 1.0 / dim, calls))
    quality.main(["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
                  "--dim", "32,64,128", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3", "--seeds", "1",
                  "--confirm-seeds", "2", "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm"])
    assert [(job[1], job[5]) for job in calls if job[7] == 2] == [
        ("a", 32), ("b", 32), ("a", 64), ("b", 64), ("a", 128), ("b", 128)]


def test_quality_free_core_starts_a_model_s_next_phase_without_waiting_for_the_others(tmp_path, monkeypatch):
    """--jobs 2: while model b's last sweep run trains, the other core starts model a's width-32
    run (a's sweep is finished), instead of idling at a phase barrier until b's run ends. The
    slow run waits for that start (up to 20 s) and reports whether it came."""
    started_a32 = threading.Event()
    overlapped = []

    def loss(label, dim, lr, seed):
        if (label, dim) == ("a", 32):
            started_a32.set()
        if (label, dim, lr) == ("b", 64, 3e-3):
            overlapped.append(started_a32.wait(timeout=20))
        return 5.0 + lr + 1.0 / dim

    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(loss))
    quality.main(["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
                  "--dim", "32,64", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3", "--seeds", "1", "--jobs", "2",
                  "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm"])
    assert overlapped == [True]
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    # results.json keeps the phase order whatever the order the runs finished in
    assert [(r["label"], r["dim"], r["lr"]) for r in runs] == [
        ("a", 64, 1e-3), ("a", 64, 3e-3), ("b", 64, 1e-3), ("b", 64, 3e-3), ("a", 32, 1e-3), ("b", 32, 1e-3)]


def test_quality_restarted_study_takes_finished_runs_without_a_core(tmp_path, monkeypatch):
    """A restarted study takes the runs that already finished (their run.json) at once, without
    waiting for a free core behind the runs that train, so the next phase of a model whose runs
    are all finished is planned right away. Here a's finished sweep runs never reach execute_run;
    b's stopped run resumes first, and a's width-32 run waits only for b's sweep (an earlier
    phase), not for a core to read a's run.json files."""
    calls = []
    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(lambda label, dim, lr, seed: 5.0 + lr + 1.0 / dim, calls))
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
            "--dim", "32,64", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3", "--seeds", "1",
            "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm"]
    args = options.get_parser().parse_args(argv)
    options.check_args(options.get_parser(), args)
    specs.load_plugin()
    data = {"wikitext": str(tmp_path)}

    def sweep_job(label, lr):
        return study_runs.Job("wikitext", label, "transformer_lm", [], False, 64, lr, 1,
                              str(tmp_path / "runs" / study_runs.run_tag("wikitext", label, 64, lr, 1, False, False)))
    for lr in (1e-3, 3e-3):  # a's sweep finished in an earlier call
        job = sweep_job("a", lr)
        os.makedirs(job.save_dir)
        run = _curve_run("a", 64, lr, 1, [(1, 5.0 + lr + 1.0 / 64)])
        run["settings"] = study_runs.settings_key(study_runs.job_argv(job, data, args))
        (tmp_path / "runs" / os.path.basename(job.save_dir) / "run.json").write_text(json.dumps(run))
    b1 = sweep_job("b", 1e-3)  # b's first sweep run was stopped half-way
    os.makedirs(b1.save_dir)
    (tmp_path / "runs" / os.path.basename(b1.save_dir) / "started.json").write_text(
        json.dumps({"settings": study_runs.settings_key(study_runs.job_argv(b1, data, args))}))
    (tmp_path / "runs" / os.path.basename(b1.save_dir) / "checkpoint_last.pt").write_bytes(b"")
    quality.main(argv)
    assert [(job.label, job.dim, job.lr) for job in calls] == [
        ("b", 64, 1e-3), ("b", 64, 3e-3), ("a", 32, 1e-3), ("b", 32, 1e-3)]
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == 6


def test_quality_run_stopped_half_way_goes_first(tmp_path, monkeypatch):
    """A restarted study trains the runs that left a checkpoint before the others of the phase,
    instead of leaving a half-done run waiting behind new ones."""
    calls = []
    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(lambda label, dim, lr, seed: 5.0, calls))
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path), "--no-baseline",
            "--dim", "32", "--lr", "1e-3", "--seeds", "1",
            *[a for m in "abcd" for a in ("--lm-model", f"{m}=transformer_lm")]]
    args = options.get_parser().parse_args(argv)
    options.check_args(options.get_parser(), args)
    save_dir = tmp_path / "runs" / "wikitext_c_s1"
    save_dir.mkdir(parents=True)
    c = study_runs.Job("wikitext", "c", "transformer_lm", [], False, 32, 1e-3, 1, str(save_dir))
    settings = study_runs.settings_key(study_runs.job_argv(c, {"wikitext": str(tmp_path)}, args))
    (save_dir / "started.json").write_text(json.dumps({"settings": settings}))
    (save_dir / "checkpoint_last.pt").write_bytes(b"")
    quality.main(argv)
    assert [job.label for job in calls] == ["c", "a", "b", "d"]


def test_quality_table_lists_every_finished_run_when_a_phase_is_stopped(tmp_path, monkeypatch):
    """table.md is rewritten after every finished run, not only at the end of a phase: a study
    stopped in its second phase reports the runs of that phase that finished."""
    def loss(label, dim, lr, seed):
        if (label, dim) == ("b", 32):
            raise KeyboardInterrupt
        return 5.0 + lr + 1.0 / dim

    monkeypatch.setattr(study_runs, "execute_run", fake_study_run(loss))
    with pytest.raises(KeyboardInterrupt):
        quality.main(["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", str(tmp_path),
                      "--no-baseline", "--dim", "32,64", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3",
                      "--seeds", "1", "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm"])
    table = (tmp_path / "table.md").read_text()
    assert "| a | 32 | 0.001 |" in table  # finished in the widths phase, before b stopped it
    assert "| b | 64 | 0.003 |" in table and "| b | 32 |" not in table


def test_quality_run_interrupted_after_a_checkpoint_resumes_from_it(tmp_path, monkeypatch):
    """A study killed mid-run loses nothing: the run goes on from its checkpoint_last.pt, its
    log is continued, and the finished run keeps only what was asked for."""
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--dim", "32", "--layers", "1", "--heads", "4",
            "--lr", "1e-3", "--seeds", "1", "--max-update", "4", "--validate-interval", "2",
            "--max-tokens", "256", "--tokens-per-sample", "16", "--max-valid-steps", "1",
            "--lm-data", wikitext_data_bin(), "--threads", "1", "--no-baseline", "--lm-model", "t=transformer_lm"]
    real_run_tool = launcher.run_tool

    def killed_after_two_updates(tool, tool_argv, log_path, threads, append=False):
        real_run_tool(tool, [*tool_argv, "--max-update", "2"], log_path, threads, append)
        raise KeyboardInterrupt  # as if the study had been stopped right after update 2

    monkeypatch.setattr(launcher, "run_tool", killed_after_two_updates)
    with pytest.raises(KeyboardInterrupt):
        quality.main(argv)
    run_dir = tmp_path / "runs" / "wikitext_t_s1"
    assert (run_dir / "checkpoint_last.pt").exists() and not (run_dir / "run.json").exists()
    monkeypatch.setattr(launcher, "run_tool", real_run_tool)
    clock = iter([100.0, 130.0])  # the resumed attempt takes 30 s for updates 3-4
    monkeypatch.setattr(study_runs, "time", types.SimpleNamespace(time=lambda: next(clock)))
    quality.main(argv)
    monkeypatch.setattr(study_runs, "time", time)
    log = (run_dir / "train.log").read_text()
    assert "Loaded checkpoint" in log and "(epoch 1 @ 2 updates)" in log
    run = json.loads((run_dir / "run.json").read_text())
    assert run["resumed"] and [p[0] for p in run["valid_curve"]] == [2, 4]
    assert run["train_seconds"] == pytest.approx(60.0)  # scaled to the whole run's 4 updates
    assert not list(run_dir.glob("*.pt")) and not (run_dir / "started.json").exists()
    # a changed setting never continues an old checkpoint
    monkeypatch.setattr(launcher, "run_tool", killed_after_two_updates)
    with pytest.raises(KeyboardInterrupt):
        quality.main(argv + ["--dropout", "0"])
    monkeypatch.setattr(launcher, "run_tool", real_run_tool)
    quality.main(argv + ["--dropout", "0.05"])
    run = json.loads((run_dir / "run.json").read_text())
    assert "resumed" not in run and "Loaded checkpoint" not in (run_dir / "train.log").read_text()


def test_quality_reuses_runs_recorded_without_checkpoint_options():
    """Runs recorded with other checkpoint-writing options (--no-last-checkpoints,
    --save-interval-updates 0) still match: checkpoint writing is not part of a run's identity."""
    old = ["--arch", "transformer_lm", "--no-epoch-checkpoints", "--no-last-checkpoints", "--max-update", "3000",
           "--save-interval-updates", "0", "--optimizer", "adam"]
    new = ["DATA", "--arch", "transformer_lm", "--save-dir", "/x", "--no-epoch-checkpoints", "--max-update", "3000",
           "--save-interval-updates", "250", "--keep-interval-updates", "1", "--optimizer", "adam"]
    assert study_runs.comparable_settings(old) == study_runs.settings_key(new)
    assert study_runs.settings_key(new) == ["--arch", "transformer_lm", "--max-update", "3000", "--optimizer", "adam"]


def test_quality_frontier_and_verdict_helpers():
    assert summary.interpolate([(1.0, 5.0), (2.0, 3.0)], 1.5) == (4.0, False)
    assert summary.interpolate([(1.0, 5.0), (2.0, 3.0)], 3.0) == (1.0, True)  # extrapolated
    assert specs.expand_width(["--sandwich-dim", "{2d}", "--safe-embed-dim", "{d/2}", "{d}"], 96) == [
        "--sandwich-dim", "192", "--safe-embed-dim", "48", "96"]
    with pytest.raises(ValueError, match="not an integer"):
        specs.expand_width(["{d/3}"], 64)
    assert study_runs.settings_key(["data", "--save-dir", "/a", "--user-dir", "/b", "--lr", "1"]) == ["--lr", "1"]
    assert summary.verdict([1.0, 1.1], [1.2, 1.3]) == "better than the baseline on every seed"
    assert summary.verdict([1.4, 1.5], [1.2, 1.3]) == "worse than the baseline on every seed"
    assert summary.verdict([1.0, 1.25], [1.2, 1.3]).startswith("within the seed spread")
    assert summary.verdict([1.0], [1.2, 1.3]).startswith("one seed")

    def run(label, dim, lr, seed, nll, params, baseline=False):
        return {"corpus": "wikitext", "label": label, "arch": label, "dim": dim, "lr": lr, "seed": seed,
                "baseline": baseline, "params": params, "valid_nll": nll, "valid_ppl": 2 ** nll,
                "train_wps": 100.0, "updates": 10, "train_seconds": 1.0}
    runs = [run("base", d, lr, s, nll + off + 0.01 * s, p, True)
            for d, p, nll in ((32, 1000, 8.0), (64, 4000, 7.0)) for lr, off in ((1e-3, 0.5), (3e-3, 0.0))
            for s in (1, 2)]
    runs += [run("slim", 64, 3e-3, s, 7.5 + 0.01 * s, 2000) for s in (1, 2)]
    best = summary.best_rows(summary.summarise(runs))
    assert {(r["label"], r["dim"], r["lr"]) for r in best} == {("base", 32, 3e-3), ("base", 64, 3e-3),
                                                               ("slim", 64, 3e-3)}
    front = {f["label"]: f for f in summary.frontier_rows(best, {"wikitext": "base"}) if f["label"] == "slim"}
    # the baseline frontier at 2000 params (half-way in log10 between 1000 and 4000) is 7.515
    assert front["slim"]["delta_nll"] == pytest.approx(0.0, abs=1e-9)
    assert front["slim"]["params_ratio"] == pytest.approx(1.0)
    (cmp,) = summary.compare_to_baseline(runs, {"wikitext": "base"})
    assert cmp["label"] == "slim" and cmp["params_ratio"] == 0.5
    assert cmp["delta_nll"] == pytest.approx(0.5) and cmp["verdict"].startswith("worse")


def test_quality_frontier_drops_a_baseline_point_above_the_line_of_its_neighbours():
    """The frontier is the lower convex hull over log params: a baseline point that beats every
    smaller one but lies above the line from the point before it to a larger one (here b at 200
    parameters, 4.9 against the line's 4.5) drops out, so a model of that size is measured
    against the line, not against a shape the baseline's other sizes beat."""
    runs = [_curve_run(label, dim, 1e-3, 1, [(10, nll)], params=params)
            for label, dim, params, nll in (("a", 32, 100, 5.0), ("b", 32, 200, 4.9), ("a", 64, 400, 4.0),
                                            ("slim", 32, 200, 4.6))]
    best = summary.best_rows(summary.summarise(runs))
    front = summary.frontier_points(best, "wikitext", ["a", "b"])
    assert [(round(10 ** x), y) for x, y, _ in front] == [(100, 5.0), (400, 4.0)]
    rows = {f["label"]: f for f in summary.frontier_rows(best, {"wikitext": "a,b"})}
    assert rows["slim"]["delta_nll"] == pytest.approx(4.6 - 4.5)
    assert rows["b"]["delta_nll"] == pytest.approx(4.9 - 4.5)


def test_quality_frontier_of_several_baselines_is_the_best_of_them_at_each_size(tmp_path, capsys):
    """--frontier-baseline A,B: the frontier is made of the points of A and B that beat every point
    with fewer parameters (a larger point that loses drops out), the report names both, and the
    per-width comparison uses A. An unknown label is a one-line error naming the study's models."""
    runs = [_curve_run(label, dim, 1e-3, seed, [(10, nll + 0.01 * seed)], params=params)
            for label, dim, params, nll in (("a", 32, 100, 5.0), ("a", 64, 400, 4.0), ("b", 32, 200, 4.2),
                                            ("b", 64, 800, 4.1), ("slim", 64, 800, 3.8))
            for seed in (1, 2)]
    best = summary.best_rows(summary.summarise(runs))
    front = summary.frontier_points(best, "wikitext", ["a", "b"])
    assert [(round(10 ** x), round(y, 3)) for x, y, _ in front] == [(100, 5.015), (200, 4.215), (400, 4.015)]
    assert summary.frontier_points(best, "wikitext", ["b"]) == [
        (math.log10(200), pytest.approx(4.215), pytest.approx(0.00707, abs=1e-5)),
        (math.log10(800), pytest.approx(4.115), pytest.approx(0.00707, abs=1e-5))]
    rows = {f["label"] + str(f["dim"]): f for f in summary.frontier_rows(best, {"wikitext": "a,b"})}
    # at 800 parameters the frontier extrapolates the segment 200 -> 400 (4.215 -> 4.015) to 3.815
    assert rows["slim64"]["delta_nll"] == pytest.approx(3.815 - 3.815, abs=1e-9) and rows["slim64"]["extrapolated"]
    assert rows["b64"]["delta_nll"] == pytest.approx(4.115 - 3.815)
    assert {c["baseline"] for c in summary.compare_to_baseline(runs, {"wikitext": "a,b"})} == {"a"}
    (tmp_path / "results.json").write_text(json.dumps({"argv": [
        "quality.py", "--corpus", "wikitext", "--lm-model", "b=transformer_lm", "--lm-model", "slim=transformer_lm",
        "--no-baseline", "--dim", "32,64"], "runs": runs}))
    quality.main(["--out", str(tmp_path), "--report-only", "--frontier-baseline", "a,b"])
    table = (tmp_path / "table.md").read_text()
    assert "against the `a` + `b` frontier, over its widths" in table
    assert "| b | 32, 64 | 200 / 800 | +0.000 ± 0.010, +0.300 ± 0.010 (some *extrap.*) |" in table
    # a ratio that is the same at every width is given once, not as a range from it to itself
    assert "| a | 32, 64 | 100 / 400 | +0.000 ± 0.010, +0.000 ± 0.010 | 1.00 |" in table
    assert "each model against `a` (best learning rates)" in table
    with pytest.raises(SystemExit):
        quality.main(["--out", str(tmp_path), "--report-only", "--frontier-baseline", "a,typo"])
    assert ("--frontier-baseline: typo is not a model of the study (its models: a, b, slim)"
            in capsys.readouterr().err)


def test_quality_plot_draws_the_frontier_of_several_baselines(tmp_path, monkeypatch):
    """With --frontier-baseline A,B the plot draws, besides A's and B's own lines, the frontier the
    tables measure against (their lower hull), so a reader can see where a model sits against it."""
    from matplotlib.figure import Figure
    runs = [_curve_run(label, dim, 1e-3, 1, [(10, nll)], params=params)
            for label, dim, params, nll in (("a", 32, 100, 5.0), ("b", 32, 200, 4.9), ("a", 64, 400, 4.0),
                                            ("slim", 32, 200, 4.6))]
    saved = {}
    real_savefig = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        saved[os.path.basename(path)] = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()))
                                         for ax in fig.axes for line in ax.get_lines()]
        saved["legend"] = {label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]}
        return real_savefig(fig, path, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", keep)
    study_plot.plot(runs, summary.summarise(runs), str(tmp_path), {"wikitext": "a,b"})
    hull = [line for line in saved["params_vs_quality.png"] if line[0].startswith("frontier")]
    assert [(label, xs, ys) for label, xs, ys in hull] == [
        ("frontier (lower hull of a + b)", pytest.approx([100.0, 400.0]), [5.0, 4.0])]
    assert saved["legend"] >= {"a (baseline)", "b (baseline)", "frontier (lower hull of a + b)"}
    study_plot.plot(runs, summary.summarise(runs), str(tmp_path), {"wikitext": "a"})
    assert not [line for line in saved["params_vs_quality.png"] if line[0].startswith("frontier")]
    assert "a (frontier)" in saved["legend"]


def test_quality_family_table_gives_bleu_at_each_width_for_translation(tmp_path):
    """The per-model table over widths gives, for en-de, the test BLEU at each width beside the
    valid-loss distance (what a translation study reports)."""
    runs = [dict(_curve_run(label, dim, 1e-3, seed, [(10, nll + 0.01 * seed)], params=params),
                 corpus="ende", test_bleu=bleu + seed)
            for label, dim, params, nll, bleu in (("base", 32, 100, 5.0, 1.0), ("base", 64, 400, 4.0, 3.0),
                                                  ("slim", 32, 100, 4.5, 2.0), ("slim", 64, 400, 3.9, 5.0))
            for seed in (1, 2)]
    (tmp_path / "results.json").write_text(json.dumps({"argv": [
        "quality.py", "--corpus", "ende", "--model", "base=transformer", "--model", "slim=transformer",
        "--no-baseline", "--dim", "32,64"], "runs": runs}))
    quality.main(["--out", str(tmp_path), "--report-only", "--frontier-baseline", "base"])
    table = (tmp_path / "table.md").read_text()
    assert ("| slim | 32, 64 | 100 / 400 | -0.500 ± 0.010, -0.100 ± 0.010 | 0.50 | 3.50 ± 0.71, 6.50 ± 0.71 "
            "| ahead of the frontier at every width |") in table


def test_quality_best_rate_is_chosen_on_the_seeds_every_rate_has():
    """A second seed of the chosen rate that lands worse must not hand the choice to a rate tried
    with one seed only: rates are compared on their shared seeds (on the en-de study, the
    transformer's width-128 best would otherwise be 3e-3, one seed, instead of 1e-3, two seeds)."""
    runs = [_curve_run("m", 128, 1e-3, 1, [(10, 5.0)]), _curve_run("m", 128, 1e-3, 2, [(10, 5.3)]),
            _curve_run("m", 128, 3e-3, 1, [(10, 5.1)]), _curve_run("m", 128, 1e-2, 1, [(10, 7.0)])]
    (best,) = summary.best_rows(summary.summarise(runs))
    assert best["lr"] == 1e-3 and best["seeds"] == [1, 2] and best["valid_nll"][0] == pytest.approx(5.15)
    # the planning of further rates makes the same choice: 1e-3 is the grid's lower edge, so the
    # next rate is one step below it, not one above 3e-3
    assert planner.edge_rate(runs[:3], "wikitext", "m", 128, [1e-3, 3e-3]) == pytest.approx(1e-3 / 3)
    assert planner.rate_step_with_width(runs[:3], "wikitext", "m", 128, 64, [1e-3, 3e-3]) == pytest.approx(1e-3 / 3)
    # a diverged shared seed ranks that rate last; rows without per-seed values use the mean
    runs.append(_curve_run("m", 128, 3e-4, 1, [(10, float("nan"))]))
    assert summary.best_rows(summary.summarise(runs))[0]["lr"] == 1e-3
    rows = [dict(r) for r in summary.summarise(runs[:3])]
    for r in rows:
        del r["seed_nll"]
    assert summary.best_rows(rows)[0]["lr"] == 3e-3


def _curve_run(label, dim, lr, seed, curve, params=1000, baseline=False):
    """A finished study run with the valid NLL ``curve`` [(updates, nll)]."""
    points = [[u, nll, nll, 2 ** nll] for u, nll in curve]
    return {"corpus": "wikitext", "label": label, "arch": "transformer_lm", "overrides": [], "dim": dim,
            "lr": lr, "seed": seed, "baseline": baseline, "params": params, "valid_curve": points,
            "updates": curve[-1][0], "valid_nll": curve[-1][1], "valid_ppl": 2 ** curve[-1][1],
            "train_seconds": 600.0, "train_wps": 100.0, "settings": []}


def test_quality_ranking_stability_finds_the_last_change():
    """The report says from which validation on the ranking of the models stayed the final one,
    and which pair changed order last (a budget is long enough once the ranking has stopped
    changing)."""
    runs = [_curve_run("a", 64, 1e-3, 1, [(100, 5.0), (200, 4.0), (300, 3.0)]),
            _curve_run("b", 64, 1e-3, 1, [(100, 4.5), (200, 4.2), (300, 3.1)]),
            _curve_run("c", 64, 1e-3, 1, [(100, 6.0), (200, 5.0), (300, 4.0)]),
            # a worse rate of "c" is not its best point, so it takes no part in the ranking
            _curve_run("c", 64, 3e-3, 1, [(100, 7.0), (200, 9.0), (300, 9.0)])]
    stability = summary.ranking_stability(runs, "wikitext", 64)
    assert stability["final"] == ["a", "b", "c"] and stability["settled_at"] == 200
    assert stability["last_swap"]["pair"] == ("a", "b")
    assert stability["last_swap"]["gap_at_end"] == pytest.approx(0.1)
    text = report.ranking_markdown(runs)
    assert "unchanged since update 200 of 300" in text and "put a ahead of b, 0.100 bits apart" in text
    steady = [_curve_run("a", 32, 1e-3, 1, [(100, 4.0), (200, 3.0)]),
              _curve_run("b", 32, 1e-3, 1, [(100, 5.0), (200, 4.0)])]
    assert summary.ranking_stability(steady, "wikitext", 32)["last_swap"] is None
    assert "unchanged at all 2 validations" in report.ranking_markdown(steady)
    assert summary.ranking_stability(steady[:1], "wikitext", 32) is None  # one model: nothing to rank


def test_quality_reports_the_best_checkpoint_not_the_last_validation(tmp_path):
    """A run that overfits is reported at the checkpoint its test BLEU is decoded from
    (checkpoint_best.pt: lowest valid loss, the later of equal ones, as fairseq keeps it), not at
    its last validation; that point also picks the best rate and ranks the models. Runs recorded
    with the last validation as their valid NLL are re-derived from their curves."""
    # (updates, label-smoothed loss, nll, ppl): the loss decides, not the NLL
    curve = [[100, 6.0, 5.5, 45.0], [200, 5.0, 4.6, 24.0], [300, 5.0, 4.5, 22.6], [400, 5.6, 5.2, 36.8]]
    assert summary.checkpoint_point(curve) == [300, 5.0, 4.5, 22.6]
    assert summary.checkpoint_point([[1, math.nan, 9.0, 512.0], [2, 7.0, 6.0, 64.0]])[0] == 2
    assert summary.checkpoint_curve(curve) == [(100, 5.5), (200, 4.6), (300, 4.5), (400, 4.5)]
    # rate 1e-2 overfits after a better best checkpoint than 1e-3 reaches at its last validation
    overfit = _curve_run("a", 64, 1e-2, 1, [(100, 4.0), (200, 3.0), (300, 3.9)])
    steady = _curve_run("a", 64, 1e-3, 1, [(100, 4.0), (200, 3.5), (300, 3.3)])
    other = _curve_run("b", 64, 1e-3, 1, [(100, 4.1), (200, 3.2), (300, 3.2)])
    assert overfit["valid_nll"] == 3.9  # a run.json whose valid_nll is the last validation's
    (tmp_path / "results.json").write_text(json.dumps({"argv": [
        "quality.py", "--corpus", "wikitext", "--lm-model", "a=transformer_lm", "--lm-model", "b=transformer_lm",
        "--no-baseline", "--dim", "64", "--lr", "1e-3,1e-2"], "runs": [overfit, steady, other]}))
    quality.main(["--out", str(tmp_path), "--report-only", "--frontier-baseline", "b"])
    table = (tmp_path / "table.md").read_text()
    assert "| a | 64 | 0.01 | 1,000 | 1 | 8.00 | 3.000 | 200 | 3.900 |" in table
    assert "| a | 64 | 0.001 | 1,000 | 1 | 9.85 | 3.300 | 300 | 3.300 |" in table
    best = {r["label"]: r for r in summary.best_rows(summary.summarise([summary.with_checkpoint_metrics(r)
                                                                        for r in (overfit, steady, other)]))}
    assert best["a"]["lr"] == 1e-2 and best["a"]["valid_nll"][0] == 3.0
    stability = summary.ranking_stability([overfit, steady, other], "wikitext", 64)
    assert stability["final"] == ["a", "b"] and stability["last_swap"] is None


def test_quality_report_gives_no_spread_for_one_seed():
    """One seed has no spread: the report prints the value alone, not "± 0.000", and a frontier
    difference where the model or the baseline has one seed is marked as such, even when the
    other side has two (a study stopped in its second-seed phase)."""
    args = options.get_parser().parse_args(["--corpus", "wikitext", "--lm-data", "unused", "--dim", "32,64"])
    runs = [_curve_run("base", 32, 1e-3, 1, [(100, 6.0)], params=1000, baseline=True),
            _curve_run("base", 32, 1e-3, 2, [(100, 6.2)], params=1000, baseline=True),
            _curve_run("base", 64, 1e-3, 1, [(100, 5.0)], params=4000, baseline=True),
            _curve_run("slim", 32, 1e-3, 1, [(100, 5.8)], params=1000),
            _curve_run("slim", 32, 1e-3, 2, [(100, 5.9)], params=1000),
            _curve_run("slim", 64, 1e-3, 1, [(100, 4.9)], params=4000)]
    assert summary.mean_std([5.0]) == (5.0, None)
    front = {f["dim"]: f for f in summary.frontier_rows(summary.best_rows(summary.summarise(runs)),
                                                        {"wikitext": "base"}) if f["label"] == "slim"}
    assert front[32]["delta_std"] == pytest.approx(math.hypot(summary.mean_std([5.8, 5.9])[1],
                                                              summary.mean_std([6.0, 6.2])[1]))
    assert front[64]["delta_std"] is None
    table = report.markdown(summary.summarise(runs), args, {"wikitext": "base"})
    assert "| slim | 64 | 0.001 | 4,000 | 1 | 29.86 | 4.900 |" in table
    assert "| 5.850 ± 0.071 | -0.250 ± 0.158 |" in table
    assert "| 4.900 | -0.100 (one seed) |" in table
    assert "± 0.000" not in table
    (fam,) = [f for f in summary.family_summary(list(front.values()))]
    assert fam["where"].endswith("(one seed: spread unknown)")


def test_quality_family_summary_says_where_each_model_sits():
    def point(label, dim, delta, std, ratio=None):
        return {"corpus": "wikitext", "label": label, "dim": dim, "params": dim * 100, "delta_nll": delta,
                "delta_std": std, "params_ratio": ratio, "extrapolated": False}
    front = [point("ahead", 32, -0.2, 0.05, 0.5), point("ahead", 64, -0.1, 0.05, 0.7),
             point("mixed", 32, -0.2, 0.05), point("mixed", 64, 0.01, 0.05),
             point("single", 64, 0.3, None)]
    where = {f["label"]: f for f in summary.family_summary(front)}
    assert where["ahead"]["where"] == "ahead of the frontier at every width"
    assert where["ahead"]["params_ratios"] == [0.5, 0.7]
    assert where["mixed"]["where"] == "mixed: d 32 ahead, d 64 level"
    assert where["single"]["where"] == "behind the frontier at its only width (one seed: spread unknown)"


def test_quality_dry_run_lists_the_next_runs_and_trains_nothing(tmp_path, monkeypatch, capsys):
    """--dry-run reads what is recorded (finished, resumable) and plans a model's later phases as
    soon as its own earlier runs are finished, as a real call would; it never trains."""
    def no_training(*args, **kwargs):
        raise AssertionError("--dry-run must not train")
    monkeypatch.setattr(study_runs, "execute_run", no_training)
    monkeypatch.setattr(launcher, "run_tool", no_training)
    argv = ["--out", str(tmp_path), "--corpus", "wikitext", "--lm-data", "unused", "--no-baseline",
            "--dim", "32,64", "--lr-sweep-dim", "64", "--lr", "1e-3,3e-3", "--lr-extend", "1",
            "--seeds", "1", "--max-update", "300", "--lm-model", "a=transformer_lm",
            "--lm-model", "b=transformer_lm --decoder-normalize-before", "--dry-run"]
    pending = quality.main(argv)
    assert [(j[1], j[5], j[6]) for j in pending] == [(m, 64, lr) for m in "ab" for lr in (1e-3, 3e-3)]
    assert ("0 of 4 planned runs are done; 4 to train; 4 run(s) at a width with no finished run to "
            "estimate the time from") in capsys.readouterr().out

    args = options.get_parser().parse_args(argv)
    options.check_args(options.get_parser(), args)
    specs.load_plugin()

    def record(job, nll):  # what a finished run leaves behind
        corpus, label, arch, overrides, _b, dim, lr, seed, save_dir = job
        run = _curve_run(label, dim, lr, seed, [(300, nll)])
        run["settings"] = study_runs.settings_key(
            launcher.study_train_argv(corpus, "DATA", arch, overrides, args, seed, save_dir, dim, lr))
        os.makedirs(save_dir, exist_ok=True)
        with open(os.path.join(save_dir, "run.json"), "w") as f:
            json.dump(run, f)
        return run
    a1, a3, b1, b3 = pending
    record(a1, 6.0)
    record(a3, 5.0)  # a's best rate is the grid's largest: its extension to 9e-3 is planned
    record(b1, 5.5)
    # b at 3e-3 was stopped after update 100: it resumes from its checkpoint
    corpus, label, arch, overrides, _b, dim, lr, seed, save_dir = b3
    os.makedirs(save_dir)
    with open(os.path.join(save_dir, "started.json"), "w") as f:
        json.dump({"settings": study_runs.settings_key(
            launcher.study_train_argv(corpus, "DATA", arch, overrides, args, seed, save_dir, dim, lr))}, f)
    open(os.path.join(save_dir, "checkpoint_last.pt"), "w").close()
    with open(os.path.join(save_dir, "train.log"), "w") as f:
        f.write('x | valid | {"valid_loss": "7.0", "valid_nll_loss": "7.0", "valid_ppl": "128", '
                '"valid_num_updates": "100"}\n')
    capsys.readouterr()
    pending = quality.main(argv)
    assert [(j[1], j[5], round(j[6], 6)) for j in pending] == [("b", 64, 3e-3), ("a", 64, 9e-3)]
    output = capsys.readouterr().out
    assert "done       wikitext a d64 lr 0.003 seed 1: valid ppl 32.00" in output
    assert "resumes    wikitext b d64 lr 0.003 seed 1 (from update 100)" in output
    # b's remaining 2/3 of a 600 s run, and a's extension: 600 s, at --jobs 1
    assert "3 of 5 planned runs are done; 2 to train: about 0.3 h" in output
    # the width-32 runs wait for both: b's sweep and a's extension are not finished
    assert "Later phases (grid extension, other widths, width check, --confirm-seeds) of a, b depend" in output
    assert not (tmp_path / "table.md").exists()
    # a model with no finished run at a width is estimated from the other models' runs there
    c64, c32 = (study_runs.Job("wikitext", "c", "transformer_lm", [], False, dim, 1e-3, 1, str(tmp_path / f"c{dim}"))
                for dim in (64, 32))
    finished = [record(a1, 6.0), record(a3, 5.0)]  # 600 s each
    assert ("0 of 2 planned runs are done; 2 to train: about 0.2 h of wall time at --jobs 1, plus 1 run(s) "
            "at a width with no finished run") in report.dry_run_report([c64, c32], [c64, c32], [], finished,
                                                                        args, {"wikitext": "DATA"})
    with pytest.raises(SystemExit):
        quality.main(argv + ["--report-only"])
    # every spec is checked at every width before anything trains: one line naming the model
    for spec, message in (("bad=slim_lm --sandwich --tie-ffn 0", "bad at --dim 32: --tie-ffn"),
                          ("typo=slim_lm --no-such-flag", "typo at --dim 32: unrecognized arguments"),
                          ("odd=slim_lm --safe-embed-dim {d/3}", "odd at --dim 32: width template"),
                          ("gone=no_such_arch", "gone at --dim 32: .*unknown architecture")):
        with pytest.raises(SystemExit, match=message):
            quality.main([a for a in argv if a != "--dry-run"] + ["--lm-model", spec])


def test_quality_resumes_only_a_matching_attempt_first(tmp_path):
    """Only an interrupted attempt with the same settings counts as one to go on from (and is
    trained first); a checkpoint_last.pt left by other settings (it will be deleted, the run
    starts afresh) does not jump the queue, and --no-resume resumes nothing."""
    args = options.get_parser().parse_args(["--corpus", "wikitext", "--lm-data", "unused", "--dim", "32",
                                            "--lr", "1e-3,3e-3,1e-2", "--max-update", "300"])
    options.check_args(options.get_parser(), args)
    specs.load_plugin()
    data = {"wikitext": "DATA"}
    fresh, stale, matching = (study_runs.Job("wikitext", "a", "transformer_lm", [], False, 32, lr, 1,
                                             str(tmp_path / name))
                              for lr, name in ((1e-3, "fresh"), (3e-3, "stale"), (1e-2, "matching")))
    for job, settings_of in ((stale, fresh), (matching, matching)):
        os.makedirs(job.save_dir)
        with open(os.path.join(job.save_dir, "started.json"), "w") as f:
            json.dump({"settings": study_runs.settings_key(study_runs.job_argv(settings_of, data, args))}, f)
        open(os.path.join(job.save_dir, "checkpoint_last.pt"), "w").close()
    resumes = [study_runs.resumable(job.save_dir, study_runs.job_argv(job, data, args), args)
               for job in (fresh, stale, matching)]
    assert resumes == [False, False, True]
    assert not study_runs.resumable(matching.save_dir, study_runs.job_argv(matching, data, args),
                                    argparse.Namespace(**{**vars(args), "no_resume": True}))


@pytest.mark.slow
def test_quality_sweep_resumes(tmp_path):
    out = tmp_path / "sweep"
    argv = ["--out", str(out), "--corpus", "wikitext", "--dim", "32,48", "--layers", "1", "--heads", "4",
            "--lr", "1e-3,3e-3", "--seeds", "1", "--confirm-seeds", "2", "--max-update", "1",
            "--validate-interval", "1", "--max-tokens", "256", "--tokens-per-sample", "16",
            "--max-valid-steps", "1", "--lm-data", wikitext_data_bin(), "--threads", "1", "--jobs", "2",
            "--no-baseline", "--frontier-baseline", "tied",
            "--lm-model", "tied=transformer_lm --share-decoder-input-output-embed --decoder-ffn-embed-dim {2d}"]
    rows = quality.main(argv)
    # 2 widths x 2 rates (seed 1) + the best rate of each width (seed 2)
    assert len(rows) == 4
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 6
    assert {r["seed"] for r in results["runs"]} == {1, 2}
    tied = [r for r in results["runs"] if r["label"] == "tied" and r["dim"] == 48]
    assert "96" in tied[0]["settings"]  # the {2d} template was filled in
    table = (out / "table.md").read_text()
    assert "against the `tied` frontier" in table
    logs = {p: p.stat().st_mtime for p in out.glob("runs/*/train.log")}
    assert len(logs) == 6
    quality.main(argv)  # everything finished: reused, nothing retrained
    assert {p: p.stat().st_mtime for p in out.glob("runs/*/train.log")} == logs
    with pytest.raises(SystemExit):
        quality.main(argv[:2] + ["--dim", "0"])


def test_attention_flops_count_every_query_head_of_grouped_attention():
    """Fused attention with fewer key/value heads than query heads (GQA) counts the FLOPs of the
    same attention with key and value repeated per query head: torch's own formula refused such
    shapes on CUDA, and no formula counted the CPU's kernel."""
    from torch.utils.flop_counter import FlopCounterMode
    q = torch.randn(2, 8, 16, 32)
    k, v = torch.randn(2, 2, 16, 32), torch.randn(2, 2, 16, 32)

    def forward_flops(fn, mapping=None):
        counter = FlopCounterMode(display=False, custom_mapping=mapping or {})
        with counter:
            fn()
        return counter.get_total_flops()

    fused = forward_flops(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), measure.attention_flop_formulas())
    k4, v4 = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    explicit = forward_flops(lambda: torch.softmax(q @ k4.transpose(-1, -2), -1) @ v4)
    assert fused == explicit == 2 * (2 * 8 * 16 * 16 * 32 * 2)
