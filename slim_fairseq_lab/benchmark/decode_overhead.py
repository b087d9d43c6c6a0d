"""Time of one incremental decoding step of plugin models against fairseq's model of the same
shape, on the CPU at a width and batch where a step is bound by Python and op dispatch rather
than arithmetic (width 64, batch 1): the CPU's proxy for a small model's generation on a GPU,
where the same overhead sits between kernel launches (docs/GPU.md, "Python per decoding step").

Every model decodes ``steps`` tokens from an empty incremental state (encoder output computed
beforehand, output projection included), ``rounds`` times; the rounds interleave the models
(each round times every model once, in a rotated order), so that a machine's load falls on all
of them alike; each model's figure is the median of its per-step times over all rounds, and its
ratio is that median over the median of fairseq's model of its task. Each step is timed in CPU
time of the thread (``time.thread_time``), not wall time: on a loaded machine the time spent
waiting for a core is left out (what it does to caches is not).
"""
import statistics
import time

import torch

from slim_fairseq.modules import tensor_chain_policy
from slim_fairseq_lab.benchmark.op_count import BASELINES, OpShape, op_batch, shape_argv

#: the shape of the measurement: width 64, 3 layers (the fewest a sandwich takes), 4 heads, FFN 256, batch 1
SHAPE = OpShape(dim=64, layers=3, heads=4, ffn=256, batch=1, length=32, decode_steps=32)


def _decoder_step(model, lm, sample):
    """A function that decodes ``len`` steps from scratch and returns the time of each."""
    net_input = sample["net_input"]
    tokens = net_input["src_tokens"] if lm else net_input["prev_output_tokens"]
    extra = {}
    if not lm:
        extra["encoder_out"] = model.encoder(net_input["src_tokens"],
                                             src_lengths=net_input["src_lengths"])

    def run(steps):
        times, state = [], {}
        clock = time.thread_time  # CPU time of this thread: waiting for a core is not counted
        for t in range(steps):
            start = clock()
            model.decoder(tokens[:, :t + 1], incremental_state=state, **extra)
            times.append(clock() - start)
        return times
    return run


def step_times(build, models, shape=SHAPE, rounds=20, target=("cuda", torch.float16)):
    """{arch: {"median_s": seconds per step, "ratio": against its baseline, "against": the
    baseline, "steps": steps timed}} for ``models`` ({arch: is a language model}) and fairseq's
    baselines, each built at ``shape`` by ``build(arch, overrides, lm) -> (args, task, model)``,
    timed on the CPU in eval mode without gradients, interleaved over ``rounds`` rounds; Tensor
    Chains choose as on ``target`` (as :func:`~.op_count.step_op_counts`: W built once and
    multiplied by, as on CUDA; None: as on the CPU)."""
    if target is None:
        return _step_times(build, models, shape, rounds)
    with tensor_chain_policy.assume_target(*target):
        return _step_times(build, models, shape, rounds)


def _step_times(build, models, shape, rounds):
    wanted = dict(models)
    for lm in set(models.values()):
        wanted.setdefault(BASELINES[lm][0], lm)
    runners = {}
    for arch, lm in wanted.items():
        extra = BASELINES[lm][1] if arch == BASELINES[lm][0] else []
        _, task, model = build(arch, shape_argv(lm, shape) + extra, lm)
        model.eval()
        with torch.no_grad():
            runners[arch] = _decoder_step(model, lm, op_batch(task, lm, shape))
            runners[arch](shape.decode_steps)  # warm-up: first calls build caches
    times = {arch: [] for arch in wanted}
    order = list(wanted)
    with torch.no_grad():
        for r in range(rounds):
            for arch in order[r % len(order):] + order[:r % len(order)]:
                times[arch] += runners[arch](shape.decode_steps)
    result = {}
    for arch, lm in wanted.items():
        result[arch] = {"median_s": statistics.median(times[arch]), "steps": len(times[arch]),
                        "against": BASELINES[lm][0]}
    for arch in wanted:
        result[arch]["ratio"] = result[arch]["median_s"] / result[result[arch]["against"]]["median_s"]
    return result


def markdown(result):
    """A markdown table of :func:`step_times`: per model, µs per step and the ratio."""
    lines = ["| model | against | µs per step (median) | × baseline | steps timed |",
             "|---|---|---|---|---|"]
    baselines = sorted({r["against"] for r in result.values()})
    for arch in baselines + [a for a in result if a not in baselines]:
        r = result[arch]
        lines.append(f"| {arch} | {r['against']} | {r['median_s'] * 1e6:,.0f} | {r['ratio']:.2f} | "
                     f"{r['steps']} |")
    return "\n".join(lines)
