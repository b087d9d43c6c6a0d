"""Bytes written per training step, held at today's counts on the CPU: the bytes the aten ops of
one training step allocate (forward and loss under autocast to fp16, as ``fairseq-train --amp``
runs them, then backward; slim_fairseq_lab/benchmark/op_count.py ``count_bytes``, fused attention
and RMSNorm counted as their CUDA kernels write) for Anthe and
fairseq's models of the same shape: 3 layers, width 128, 4 heads, FFN 512, a batch of 8 x 32
tokens. A change that writes 2 % more fails here, one that writes 5 % less fails until the table
is lowered to its new counts. docs/GPU.md gives the ratios."""
import pytest
import torch

from helpers import build
from slim_fairseq_lab.benchmark.op_count import compare_bytes, count_bytes

# bytes per training step (deterministic: the same tensors on every run)
BYTES = {
    "anthe_base": 66_354_831,            # 1.10x the transformer's
    "anthe_lm_gpt2_small": 38_321_062,   # 1.09x transformer_lm's
    "transformer": 60_371_317,
    "transformer_lm": 35_105_334,
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


def test_a_fused_op_counts_what_its_cuda_kernel_writes():
    """Attention and RMSNorm count their CUDA kernels' outputs (attention: its output and a
    float32 log-sum-exp per query row; backward: the gradients of q, k, v), not the
    temporaries of the CPU's decomposition, which keeps the probabilities under dropout."""
    import torch.nn.functional as F
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    kernel = 2 * 4 * 16 * 8 * 4 + 2 * 4 * 16 * 4
    assert count_bytes(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)) == kernel

    def step(p):
        return lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(q, k, v, dropout_p=p).sum(), (q, k, v))
    assert count_bytes(step(0.5)) == count_bytes(step(0.0))
    x, w = torch.randn(6, 10, 32), torch.ones(32)
    assert count_bytes(lambda: F.rms_norm(x, (32,), w)) == x.numel() * 4 + 60 * 4


def test_the_script_prints_the_bytes_against_the_baseline(capsys):
    from helpers import load_script
    load_script("op_counts").main(["--bytes", "--autocast", "fp16", "--model",
                                   "anthe_lm_gpt2_small", "--dim", "32", "--ffn", "64",
                                   "--batch", "2", "--length", "4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0] == "| model | against | MB per training step | × baseline |"
    assert rows[1].startswith("| transformer_lm | transformer_lm | ") and rows[1].endswith(" 1.00 |")
    assert rows[2].startswith("| anthe_lm_gpt2_small | transformer_lm | ")
