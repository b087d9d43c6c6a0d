"""Bytes written per training step, held at today's counts on the CPU: the bytes the aten ops of
one training step allocate (forward and loss under autocast to fp16, as ``fairseq-train --amp``
runs them, then backward; slim_fairseq_lab/benchmark/op_count.py ``count_bytes``) for Anthe and
fairseq's models of the same shape: 3 layers, width 128, 4 heads, FFN 512, a batch of 8 x 32
tokens. A change that writes 2 % more fails here, one that writes 5 % less fails until the table
is lowered to its new counts. docs/GPU.md gives the ratios."""
import pytest
import torch

from helpers import build
from slim_fairseq_lab.benchmark.op_count import compare_bytes, count_bytes

# bytes per training step (deterministic: the same tensors on every run)
BYTES = {
    "anthe_base": 76_628_631,            # 1.26x the transformer's
    "anthe_lm_gpt2_small": 50_813_398,   # 1.44x transformer_lm's (its attention dropout: the
                                         # CPU's decomposed attention writes its probabilities)
    "transformer": 60_886_645,
    "transformer_lm": 35_363_510,
}
HEADROOM, STALE = 1.02, 0.95


@pytest.fixture(scope="module")
def written():
    return compare_bytes(build, {"anthe_base": False, "anthe_lm_gpt2_small": True})


@pytest.mark.parametrize("arch", sorted(BYTES))
def test_bytes_written_per_training_step(written, arch):
    got, table = written[arch][0], BYTES[arch]
    assert got <= HEADROOM * table, f"{arch}: {got:,} bytes per step, {got / table - 1:+.1%}"
    assert got >= STALE * table, f"{arch}: {got:,} bytes per step: lower the table to it"


def test_the_count_is_of_the_tensors_written():
    """A product writes its result (and a cast its copy); a view writes nothing."""
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    assert count_bytes(lambda: x @ w) == 64 * 16 * 4
    assert count_bytes(lambda: x.t()) == 0
    assert count_bytes(lambda: x.half()) == 64 * 32 * 2
