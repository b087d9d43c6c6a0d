"""scripts/decode_step_overhead.py and slim_fairseq_lab.benchmark.decode_overhead: per-step time of
incremental decoding against fairseq's model of the same shape, at tiny sizes."""
import os
import subprocess
import sys

from helpers import build
from slim_fairseq_lab.benchmark import decode_overhead
from slim_fairseq_lab.benchmark.op_count import OpShape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_model_is_timed_against_its_baseline_interleaved():
    shape = OpShape(dim=32, layers=3, heads=4, ffn=64, batch=1, length=3, decode_steps=3)
    result = decode_overhead.step_times(build, {"anthe_base": False, "stlm_tied": True}, shape,
                                        rounds=2)
    assert set(result) == {"anthe_base", "stlm_tied", "transformer", "transformer_lm"}
    assert result["anthe_base"]["against"] == "transformer"
    assert result["stlm_tied"]["against"] == "transformer_lm"
    for arch, r in result.items():
        assert r["steps"] == 2 * 3 and r["median_s"] > 0
        base = result[r["against"]]["median_s"]
        assert abs(r["ratio"] - r["median_s"] / base) < 1e-12
    assert result["transformer"]["ratio"] == 1.0
    table = decode_overhead.markdown(result)
    assert table.count("\n") == 2 + 3 and "| anthe_base | transformer |" in table


def test_the_script_refuses_an_unknown_model_in_one_line():
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "decode_step_overhead.py"),
                           "--model", "nope", "--rounds", "1"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("decode_step_overhead.py: --model=nope: not a plugin architecture; "
                                "allowed: ")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_step_is_split_into_parts_that_sum_to_it():
    shape = OpShape(dim=32, layers=3, heads=4, ffn=64, batch=1, length=3, decode_steps=3)
    built = []

    def recording_build(arch, argv, lm):
        args, task, model = build(arch, argv, lm)
        built.append(model)
        return args, task, model
    result = decode_overhead.part_times(recording_build, {"anthe_base": False,
                                                          "subformer_base": False},
                                        shape, rounds=2)
    assert set(result) == {"anthe_base", "subformer_base", "transformer"}
    for arch, parts in result.items():
        assert abs(sum(parts[p] for p in decode_overhead.PARTS) - parts["total"]) < 1e-6
        for part in ("embedding", "self-attention", "cross-attention", "feed-forward", "norms",
                     "output"):
            assert parts[part] > 0, (arch, part)
    # the sandwich's middle layers are looked into: their attentions are timed as attentions
    assert result["subformer_base"]["self-attention"] > 0
    table = decode_overhead.parts_markdown(result)
    assert table.count("\n") == 1 + 3 and table.splitlines()[0].count("|") == len(
        decode_overhead.PARTS) + 3
    # the models are left as they were: no timer stays on a module
    assert len(built) == 3
    assert all("forward" not in vars(m) for model in built for m in model.modules())


def test_replaying_a_steps_recorded_torch_calls_recomputes_its_output():
    """The split's torch time replays what a step called: the recorded calls of a decoding step,
    run again, compute the step's output again."""
    import torch
    from slim_fairseq_lab.benchmark.op_count import decoder_steps, op_batch, shape_argv
    shape = OpShape(dim=32, layers=3, heads=4, ffn=64, batch=1, length=3, decode_steps=3)
    for arch, lm in (("anthe_base", False), ("stlm_tied", True)):
        _, task, model = build(arch, shape_argv(lm, shape), lm)
        model.eval()
        with torch.no_grad():
            run = decoder_steps(model, lm, op_batch(task, lm, shape))
            state = {}
            run.step(0, state)
            run.step(1, state)
            with decode_overhead.TorchCalls() as calls:
                logits = run.step(2, state)[0]
            results = decode_overhead.replay(calls.calls)
        assert len(calls.calls) > 20, arch
        again = [r for r in results if isinstance(r, torch.Tensor) and r.shape == logits.shape]
        assert again and torch.equal(again[-1], logits), arch
        assert not any(r is logits for r in again), arch  # computed anew, not the recorded tensor


def test_a_split_step_is_timed_as_torch_calls_and_python():
    shape = OpShape(dim=32, layers=3, heads=4, ffn=64, batch=1, length=3, decode_steps=3)
    result = decode_overhead.step_times(build, {"anthe_base": False}, shape, rounds=2, split=True)
    assert set(result) == {"anthe_base", "transformer"}
    for arch, r in result.items():
        assert r["torch_s"] > 0 and r["python_s"] > 0 and r["steps"] == 2 * 3
        base = result[r["against"]]
        assert abs(r["python_ratio"] - r["python_s"] / base["python_s"]) < 1e-12
        assert abs(r["torch_ratio"] - r["torch_s"] / base["torch_s"]) < 1e-12
    table = decode_overhead.markdown(result).splitlines()
    assert "in torch's calls (µs)" in table[0] and "Python (µs)" in table[0]
    assert table[1].count("---") == table[0].count("|") - 1 == 9
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_split_with_by_part_is_refused_in_one_line():
    import pytest
    from helpers import load_script
    with pytest.raises(SystemExit) as refused:
        load_script("decode_step_overhead").main(["--split", "--by-part", "--rounds", "1"])
    assert str(refused.value) == ("decode_step_overhead.py: --split with --by-part: --split "
                                  "splits whole steps, --by-part times parts; allowed: one of them")
