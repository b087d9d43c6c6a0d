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
