"""Kernel launches per step, held down on the CPU: aten ops of one training step (forward,
loss, backward) and of one incremental decoding step, counted with torch.profiler
(slim_fairseq_lab/benchmark/op_count.py), against fairseq's model of the same shape: 3 layers,
width 128, 4 heads, FFN 512, a batch of 8 x 32 tokens. The limits are the ones docs/GPU.md
states; a change that launches more kernels per block fails here before it reaches a GPU."""
import pytest

from helpers import build
from slim_fairseq_lab.benchmark.op_count import compare

# model: (limit per training step, limit per decoding step), top-level ops against the baseline
LIMITS = {
    "stlm_tied": (1.10, 1.20),
    "skipless_lm": (1.10, 1.10),
    "slim_lm": (1.06, 1.06),
    "anthe_base": (1.90, 1.40),
    "slim_transformer": (1.06, 1.06),
}
LM = {"stlm_tied": True, "skipless_lm": True, "slim_lm": True, "anthe_base": False,
      "slim_transformer": False}


@pytest.fixture(scope="module")
def counts():
    return compare(build, LM)


@pytest.mark.parametrize("arch", sorted(LIMITS))
def test_ops_per_step_against_fairseq(counts, arch):
    train, decode = LIMITS[arch]
    got = counts[arch]
    assert got["ratio_train"].top <= train, (arch, got)
    assert got["ratio_decode"].top <= decode, (arch, got)


def test_counts_see_what_the_blocks_run(counts):
    """The counts move with the blocks: the decoding step of stlm_tied runs no more ops than
    fairseq's pre-norm transformer_lm although it adds RoPE and grouped key/value heads, and an
    Anthe training step runs its Tensor-Chain weights' ops on top of fairseq's transformer's."""
    assert counts["stlm_tied"]["decode"].top <= counts["transformer_lm"]["decode"].top
    assert counts["anthe_base"]["train"].top > 1.2 * counts["transformer"]["train"].top
    assert all(c["train"].all > c["train"].top for c in counts.values())
