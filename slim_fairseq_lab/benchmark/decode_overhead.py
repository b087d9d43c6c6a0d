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

With ``split``, a step is also split into the time inside torch's functions and the Python
around them: each step's calls of torch functions (the outermost ones, as ``__torch_function__``
sees them: ``F.linear``, ``Tensor.view``, ``torch.cat``, a tensor's ``dtype``...) are recorded
once with their arguments and replayed, timed, in every round; the rest of the step is Python.
"""
import contextlib
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode

from slim_fairseq.modules import tensor_chain_policy
from slim_fairseq_lab.benchmark.op_count import (BASELINES, OpShape, build_at, decoder_steps,
                                                  op_batch, with_baselines)

#: the shape of the measurement: width 64, 3 layers (the fewest a sandwich takes), 4 heads, FFN 256, batch 1
SHAPE = OpShape(dim=64, layers=3, heads=4, ffn=256, batch=1, length=32, decode_steps=32)


#: the parts of a decoding step :func:`part_times` reports, in the order of a step
PARTS = ("embedding", "self-attention", "cross-attention", "feed-forward", "norms", "layer rest",
         "output", "rest")
_EMBEDDING = ("embed_tokens", "embed_positions", "layernorm_embedding", "project_in_dim")
_OUTPUT = ("output_projection", "project_out_dim", "adaptive_softmax")


def _layer_part(name):
    """The part of a module a layer holds under the attribute ``name`` (None: its own code)."""
    if "norm" in name:
        return "norms"
    if name == "self_attn":
        return "self-attention"
    if name == "encoder_attn":
        return "cross-attention"
    if name in ("fc1", "fc2"):
        return "feed-forward"
    return None


def _timed_modules(decoder):
    """[(module, part, whether a layer holds it)] to time in ``decoder``: the embedding's and the
    output's modules, the final norm, each layer ("layers", for its own code) and, inside it, the
    outermost modules of each part (a sandwich's wrapped layer is looked into)."""
    timed = [(getattr(decoder, name, None), "embedding", False) for name in _EMBEDDING]
    timed += [(getattr(decoder, name, None), "output", False) for name in _OUTPUT]
    timed.append((getattr(decoder, "layer_norm", None), "norms", False))
    for layer in decoder.layers:
        timed.append((layer, "layers", False))
        stack = list(layer.named_children())
        while stack:
            name, child = stack.pop()
            part = _layer_part(name)
            if part is not None:
                timed.append((child, part, True))
            elif hasattr(child, "self_attn"):  # a layer inside a wrapper (a sandwich)
                stack += child.named_children()
    return [entry for entry in timed if isinstance(entry[0], torch.nn.Module)]


def part_times(build, models, shape=SHAPE, rounds=5, target=("cuda", torch.float16)):
    """{arch: {part: µs per step, "total": µs per step}} of :data:`PARTS` for ``models``
    ({arch: is a language model}) and fairseq's baselines, built and run as :func:`step_times`
    runs them (but one model after the other): each part is the CPU time of the thread inside
    its modules' calls, summed over a step and averaged over ``rounds`` decodings of
    ``shape.decode_steps`` steps; "layer rest" is the layers' own code (residuals, dropout,
    activations and projections between modules), "rest" the decoder's code outside every
    part. Each timed call adds the timer's own cost (about a microsecond) to its part."""
    with _choosing_as_on(target):
        return _part_times(build, models, shape, rounds)


def _eval_models(build, models, shape):
    """(arch, whether a language model, task, model in eval mode) for ``models`` and their
    baselines, each built at ``shape``."""
    for arch, lm in with_baselines(models).items():
        _, task, model = build_at(build, arch, lm, shape)
        yield arch, lm, task, model.eval()


def _part_times(build, models, shape, rounds):
    result = {}
    for arch, lm, task, model in _eval_models(build, models, shape):
        spent = dict.fromkeys(PARTS, 0.0)
        layers = [0.0, 0.0]  # (the layers' calls, the parts' calls inside them)
        timed = _timed_modules(model.decoder)

        def timer(forward, part, in_layer):
            def run(*args, **kwargs):
                start = time.thread_time()
                try:
                    return forward(*args, **kwargs)
                finally:
                    took = time.thread_time() - start
                    if part == "layers":
                        layers[0] += took
                    else:
                        spent[part] += took
                        layers[1] += took if in_layer else 0.0
            return run
        with torch.no_grad():
            decode = decoder_steps(model, lm, op_batch(task, lm, shape))
            decode(shape.decode_steps)  # warm-up: first calls build caches
            for module, part, in_layer in timed:
                module.forward = timer(module.forward, part, in_layer)
            try:
                total = sum(sum(decode(shape.decode_steps, clock=time.thread_time))
                            for _ in range(rounds))
            finally:
                for module, _, _ in timed:
                    del module.forward
        spent["layer rest"] = layers[0] - layers[1]
        spent["rest"] = total - sum(spent[p] for p in PARTS if p != "rest")
        steps = rounds * shape.decode_steps
        result[arch] = {part: spent[part] / steps * 1e6 for part in PARTS}
        result[arch]["total"] = total / steps * 1e6
    return result


def parts_markdown(result):
    """A markdown table of :func:`part_times`: a row per model, µs per step per part."""
    lines = ["| model | " + " | ".join(PARTS) + " | total |",
             "|---|" + "---|" * (len(PARTS) + 1)]
    for arch, parts in result.items():
        lines.append(f"| {arch} | " + " | ".join(f"{parts[p]:,.0f}" for p in PARTS + ("total",))
                     + " |")
    return "\n".join(lines)


class TorchCalls(TorchFunctionMode):
    """Inside, records each call of a torch function with its arguments in :attr:`calls`
    (the outermost calls only: what a recorded function calls itself is not recorded)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def replay(calls):
    """Runs recorded ``calls`` (:class:`TorchCalls`) again; returns their results."""
    return [func(*args, **kwargs) for func, args, kwargs in calls]


def _recorded_steps(run, steps):
    """The torch calls of each of ``steps`` steps of ``run`` (:func:`~.op_count.decoder_steps`),
    decoded from an empty incremental state of their own."""
    recorded, state = [], {}
    for t in range(steps):
        with TorchCalls() as calls:
            run.step(t, state)
        recorded.append(calls.calls)
    return recorded


def _replay_times(recorded):
    """CPU time of the thread in :func:`replay` of each step's recorded calls. In-place calls
    act on the recorded tensors again (a scaling, repeated, would reach subnormal floats, which
    x86 runs slowly: flushed to zero here)."""
    times, clock = [], time.thread_time
    flushed = torch.set_flush_denormal(True)
    try:
        for calls in recorded:
            start = clock()
            replay(calls)
            times.append(clock() - start)
    finally:
        if flushed:
            torch.set_flush_denormal(False)
    return times


def step_times(build, models, shape=SHAPE, rounds=20, target=("cuda", torch.float16),
               split=False):
    """{arch: {"median_s": seconds per step, "ratio": against its baseline, "against": the
    baseline, "steps": steps timed}} for ``models`` ({arch: is a language model}) and fairseq's
    baselines, each built at ``shape`` by ``build(arch, overrides, lm) -> (args, task, model)``,
    timed on the CPU in eval mode without gradients, interleaved over ``rounds`` rounds; Tensor
    Chains choose as on ``target`` (as :func:`~.op_count.step_op_counts`: W built once and
    multiplied by, as on CUDA; None: as on the CPU). With ``split``, also "torch_s" (the median
    replay of a step's recorded torch calls, timed in the same rounds), "python_s" (the median,
    over steps, of a step's time less its replay's) and their ratios "torch_ratio" and
    "python_ratio"."""
    with _choosing_as_on(target):
        return _step_times(build, models, shape, rounds, split)


def _choosing_as_on(target):
    """Tensor Chains choose as on ``target`` (device type, dtype) inside; None: as where
    they run."""
    return contextlib.nullcontext() if target is None else tensor_chain_policy.assume_target(*target)


def _step_times(build, models, shape, rounds, split=False):
    wanted = with_baselines(models)
    runners, recorded = {}, {}
    for arch, lm, task, model in _eval_models(build, models, shape):
        with torch.no_grad():
            run = decoder_steps(model, lm, op_batch(task, lm, shape))
            run(shape.decode_steps)  # warm-up: first calls build caches
            runners[arch] = run
            if split:
                recorded[arch] = _recorded_steps(run, shape.decode_steps)
    times = {arch: [] for arch in wanted}
    replays = {arch: [] for arch in recorded}
    order = list(wanted)
    with torch.no_grad():
        for r in range(rounds):
            for arch in order[r % len(order):] + order[:r % len(order)]:
                times[arch] += runners[arch](shape.decode_steps, clock=time.thread_time)
                if split:
                    replays[arch] += _replay_times(recorded[arch])
    result = {}
    for arch, lm in wanted.items():
        result[arch] = {"median_s": statistics.median(times[arch]), "steps": len(times[arch]),
                        "against": BASELINES[lm][0]}
        if split:
            result[arch]["torch_s"] = statistics.median(replays[arch])
            result[arch]["python_s"] = statistics.median(
                step - calls for step, calls in zip(times[arch], replays[arch]))
    for arch in wanted:
        base = result[result[arch]["against"]]
        for key, ratio in (("median_s", "ratio"), ("torch_s", "torch_ratio"),
                           ("python_s", "python_ratio")):
            if key in base:
                result[arch][ratio] = result[arch][key] / base[key]
    return result


def markdown(result):
    """A markdown table of :func:`step_times`: per model, µs per step and the ratio."""
    split = all("python_s" in r for r in result.values())
    head = "| model | against | µs per step (median) | × baseline |"
    if split:
        head += " in torch's calls (µs) | × baseline | Python (µs) | × baseline |"
    lines = [head + " steps timed |", "|---" * head.count("|") + "|"]
    baselines = sorted({r["against"] for r in result.values()})
    for arch in baselines + [a for a in result if a not in baselines]:
        r = result[arch]
        line = f"| {arch} | {r['against']} | {r['median_s'] * 1e6:,.0f} | {r['ratio']:.2f} |"
        if split:
            line += (f" {r['torch_s'] * 1e6:,.0f} | {r['torch_ratio']:.2f} |"
                     f" {r['python_s'] * 1e6:,.0f} | {r['python_ratio']:.2f} |")
        lines.append(line + f" {r['steps']} |")
    return "\n".join(lines)
