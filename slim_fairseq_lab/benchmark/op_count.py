"""Aten ops per training step and per decoding step: the CPU's view of how many kernels a model
launches on a GPU, where small models are bound by launches and Python rather than arithmetic
(docs/GPU.md). Counted with ``torch.profiler`` on the CPU, so CI can hold the count down
without a GPU (tests/test_op_counts.py) and the benchmark reports it next to its timings.

Two counts of the same run:

* ``all``: every ``aten::`` event the profiler records, ops called inside other ops included
  (``aten::linear`` and the ``aten::addmm`` it calls count twice);
* ``top``: the ops called from Python or from autograd's backward, each once, without the ops
  they call inside, plus the casts autocast makes in front of an op. An op in :data:`FUSED_ON_CUDA` counts once forward and once backward: torch
  runs it as one CUDA kernel each way (``_fused_rms_norm``, ``_fused_rms_norm_backward``; flash
  or memory-efficient attention with dropout), while its CPU build has no kernel for it and
  runs, and differentiates, its decomposition (a dozen ops each way for ``F.rms_norm``; the
  math attention of ``scaled_dot_product_attention`` with a dropout probability).

Training is forward + loss + backward of one batch (no optimizer step); decoding is the mean
over steps of one incremental step of the decoder (the encoder output computed beforehand),
output projection included. Tensor-Chain layers choose their path as on CUDA in fp16
(``tensor_chain_policy.assume_target``): the CPU's own choice (contraction over blocks of rows)
runs other ops than a GPU does.

``autocast`` (a dtype) counts the training step as ``fairseq-train --amp`` runs it: forward and
loss under autocast (here the CPU's), backward outside it. The branches that run only under
autocast are then counted (a GLU's two input linears as one product of stacked weights, shaped
attention's per-head factors cast to the values' dtype), and so are the casts autocast puts in
front of an op (``top`` counts each, as a kernel of its own on CUDA). What the CPU cannot show:
the CPU's autocast follows its own op lists, which are not CUDA's in every op, and the kernels
torch picks inside an op (a fused attention kernel, cuBLAS) are not aten ops at all. Decoding
runs without autocast, as fairseq-generate does (``--fp16`` halves the model instead, which
runs the same top-level ops as fp32 in these blocks).
"""
import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OpShape:
    """The shape of a count: model width, layers (each side), heads, FFN width; a batch of
    ``batch`` sequences of ``length`` tokens (sources and targets); ``decode_steps``
    incremental steps averaged."""
    dim: int = 128
    layers: int = 3
    heads: int = 4
    ffn: int = 512
    batch: int = 8
    length: int = 32
    decode_steps: int = 8


@dataclass(frozen=True)
class OpCount:
    all: float
    top: float

    def __truediv__(self, other):
        return OpCount(self.all / other.all, self.top / other.top)


#: ops that are one CUDA kernel forward and one backward, but a decomposition on the CPU:
#: F.rms_norm; torch's fused attention, which the CPU decomposes when it drops attention
#: probabilities out (CUDA's flash and memory-efficient kernels drop out inside the kernel)
FUSED_ON_CUDA = ("aten::rms_norm", "aten::scaled_dot_product_attention")
_BACKWARD = "autograd::engine::evaluate_function"


def _aten_ancestor(event):
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("aten::"):
        parent = parent.cpu_parent
    return parent


def _backward_node(event):
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(_BACKWARD):
        parent = parent.cpu_parent
    return parent


def _descendants(event):
    stack = list(event.cpu_children)
    while stack:
        child = stack.pop()
        yield child
        stack.extend(child.cpu_children)


def _autocast_casts(event):
    """Casts autocast made in front of ``event``: its ``aten::to`` children that copy, when it
    also calls itself (autocast's wrapper casts the inputs, then runs the op again)."""
    children = event.cpu_children
    if not any(child.name == event.name for child in children):
        return 0
    return sum(1 for child in children if child.name == "aten::to"
               and any(e.name == "aten::_to_copy" for e in child.cpu_children))


def _top_events(prof):
    """(every aten event in time order, those called from Python or autograd's backward)."""
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    aten = [e for e in events if e.name.startswith("aten::")]
    return aten, [e for e in aten if _aten_ancestor(e) is None]


def _fused_nodes(top):
    """{autograd sequence number: the op of :data:`FUSED_ON_CUDA` that made the node}: the
    numbers from the op's own to the next op's."""
    fused_nodes = {}
    for i, event in enumerate(top):
        if event.name not in FUSED_ON_CUDA:
            continue
        numbers = [e.sequence_nr for e in (event, *_descendants(event)) if e.sequence_nr >= 0]
        after = next((e.sequence_nr for e in top[i + 1:] if e.sequence_nr >= 0
                      and e.time_range.start >= event.time_range.end), max(numbers, default=-1) + 1)
        for number in range(min(numbers, default=0), after):
            fused_nodes[number] = event
    return fused_nodes


def count_ops(fn, repeats=1):
    """:class:`OpCount` of ``fn()`` (divided by ``repeats``, the calls ``fn`` makes)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    aten, top = _top_events(prof)
    fused_nodes = _fused_nodes(top)
    count, fused_backward = 0, set()
    for event in top:
        node = _backward_node(event)
        if node is not None and node.sequence_nr in fused_nodes:
            fused_backward.add(id(fused_nodes[node.sequence_nr]))
        else:
            count += 1 + _autocast_casts(event)
    return OpCount(len(aten) / repeats, (count + len(fused_backward)) / repeats)


_ITEMSIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8}


def _numel(shape):
    n = 1
    for size in shape:
        n *= size
    return n


def _fused_kernel(event):
    """The innermost call of ``event`` (autocast's wrapper calls the op again on cast inputs)."""
    inner = [e for e in _descendants(event) if e.name == event.name]
    return max(inner, key=lambda e: e.time_range.start) if inner else event


def _fused_bytes(kernel):
    """(forward, backward) bytes the one CUDA kernel of :data:`FUSED_ON_CUDA` writes each way,
    from the shapes and dtypes of its inputs: attention writes its output and the softmax's
    log-sum-exp (float32, per query row), and the gradients of q, k, v; RMSNorm its output and
    the reciprocal RMS (float32, per row), and the gradients of x and the weight."""
    shapes, dtypes = kernel.input_shapes, kernel.input_dtypes
    size = [_ITEMSIZE.get(d, 4) for d in dtypes]
    if kernel.name == "aten::scaled_dot_product_attention":
        (q, k, v), rows = shapes[:3], _numel(shapes[0][:-1])
        forward = rows * v[-1] * size[0] + rows * 4
        backward = sum(_numel(s) * b for s, b in zip((q, k, v), size))
    else:  # aten::rms_norm(x, normalized_shape, weight, eps)
        x, weight = shapes[0], shapes[2]
        rows = _numel(x) // max(_numel(weight), 1)
        forward = _numel(x) * size[0] + rows * 4
        backward = _numel(x) * size[0] + _numel(weight) * size[2]
    return forward, backward


def count_bytes(fn):
    """Bytes the aten ops of ``fn()`` allocate: every tensor an op creates (results, and the
    temporaries of its decomposition) is memory it writes, so this is the CPU's count of the
    bytes a step writes, views and in-place updates left out (they allocate nothing), from the
    profiler's memory records. An op of :data:`FUSED_ON_CUDA` counts as its CUDA kernel writes
    (:func:`_fused_bytes`) rather than its CPU decomposition's temporaries (the attention
    probabilities, under dropout), as :func:`count_ops` counts it as one op; autocast's casts
    in front of it count as they are."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True) as prof:
        fn()
    aten, top = _top_events(prof)
    fused_nodes = _fused_nodes(top)
    replaced, total, backward_of = set(), 0, {}
    for event in top:
        if event.name in FUSED_ON_CUDA:
            kernel = _fused_kernel(event)
            forward, backward_of[id(event)] = _fused_bytes(kernel)
            total += forward
            replaced.update(id(e) for e in (kernel, *_descendants(kernel)))
            continue
        node = _backward_node(event)
        if node is not None and node.sequence_nr in fused_nodes:
            replaced.update(id(e) for e in (event, *_descendants(event)))
            fused = fused_nodes[node.sequence_nr]
            total += backward_of.pop(id(fused), 0)  # (once, at its first backward op)
    return total + sum(max(e.self_cpu_memory_usage, 0) for e in aten if id(e) not in replaced)


def training_bytes(model, criterion, sample, target=("cuda", torch.float16),
                   autocast=torch.float16):
    """:func:`count_bytes` of one training step of ``model`` on ``sample`` (forward and loss
    under the CPU's autocast to ``autocast``, backward outside it, as :func:`step_op_counts`;
    gradients set to None before it, as fairseq's optimizers leave them), after one untimed
    step; Tensor Chains choose as on ``target``."""
    from slim_fairseq.modules import tensor_chain_policy
    model.train()

    def train():
        model.zero_grad(set_to_none=True)
        with _autocast(autocast):
            loss, _, _ = criterion(model, sample)
        loss.backward()

    with tensor_chain_policy.assume_target(*target):
        train()
        return count_bytes(train)


def compare_bytes(build, models, shape=OpShape(), autocast=torch.float16):
    """{arch: (bytes per training step, ratio against fairseq's model of the same task)} for
    ``models`` ({arch: is a language model}) and the baselines, built as :func:`compare`
    builds them."""
    wanted = with_baselines(models)
    written = {}
    for arch, lm in wanted.items():
        args, task, model = build_at(build, arch, lm, shape)
        written[arch] = training_bytes(model, task.build_criterion(args),
                                       op_batch(task, lm, shape), autocast=autocast)
    return {arch: (written[arch], written[arch] / written[BASELINES[lm][0]])
            for arch, lm in wanted.items()}


def shape_argv(lm, shape):
    """fairseq flags of ``shape`` for a language model or an encoder-decoder."""
    argv = []
    for side in ("decoder",) if lm else ("encoder", "decoder"):
        argv += [f"--{side}-embed-dim", str(shape.dim), f"--{side}-layers", str(shape.layers),
                 f"--{side}-attention-heads", str(shape.heads),
                 f"--{side}-ffn-embed-dim", str(shape.ffn)]
    if lm:
        argv += ["--decoder-input-dim", str(shape.dim), "--decoder-output-dim", str(shape.dim)]
    return argv


def op_batch(task, lm, shape, seed=0):
    """A training sample of ``shape.batch`` random sequences of ``shape.length`` tokens, no
    padding."""
    dictionary = task.target_dictionary
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (shape.batch, shape.length),
                           generator=generator)
    net_input = {"src_tokens": tokens, "src_lengths": torch.full((shape.batch,), shape.length)}
    if not lm:
        net_input["src_tokens"] = torch.randint(task.source_dictionary.nspecial,
                                                len(task.source_dictionary),
                                                (shape.batch, shape.length), generator=generator)
        net_input["prev_output_tokens"] = tokens
    return {"id": torch.arange(shape.batch), "nsentences": shape.batch,
            "ntokens": shape.batch * shape.length, "net_input": net_input, "target": tokens}


def step_op_counts(model, criterion, sample, lm, shape, target=("cuda", torch.float16),
                   autocast=None):
    """{"train": OpCount, "decode": OpCount} of ``model`` on ``sample`` (:func:`op_batch`), each
    counted after one untimed run of the same step (first calls build caches); Tensor Chains
    choose as on ``target`` (device type, dtype; None: as on the CPU); ``autocast``: the dtype
    of the CPU's autocast around the training step's forward and loss (None: off)."""
    from slim_fairseq.modules import tensor_chain_policy
    if target is None:
        return _step_op_counts(model, criterion, sample, lm, shape, autocast)
    with tensor_chain_policy.assume_target(*target):
        return _step_op_counts(model, criterion, sample, lm, shape, autocast)


def _autocast(dtype):
    """The CPU's autocast to ``dtype``, or nothing (None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=dtype)


def _step_op_counts(model, criterion, sample, lm, shape, autocast=None):
    model.train()

    def train():
        with _autocast(autocast):  # as fairseq's train_step: backward outside autocast
            loss, _, _ = criterion(model, sample)
        loss.backward()

    train()
    counts = {"train": count_ops(train)}
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        decode = decoder_steps(model, lm, sample)
        decode(shape.decode_steps)
        counts["decode"] = count_ops(lambda: decode(shape.decode_steps), repeats=shape.decode_steps)
    return counts


def decoder_steps(model, lm, sample):
    """``run(steps, clock=None)``: ``model``'s decoder decodes the first ``steps`` tokens of
    ``sample`` (:func:`op_batch`) one incremental step at a time from an empty incremental
    state, the encoder output (a translation model's) computed here, once; ``run`` returns
    each step's time by ``clock`` (e.g. ``time.thread_time``; None: nothing timed, []).
    ``run.step(t, state)`` runs step ``t`` alone on an incremental state ``state``."""
    net_input = sample["net_input"]
    tokens = net_input["src_tokens"] if lm else net_input["prev_output_tokens"]
    extra = {}
    if not lm:
        extra["encoder_out"] = model.encoder(net_input["src_tokens"],
                                             src_lengths=net_input["src_lengths"])

    def step(t, state):
        return model.decoder(tokens[:, :t + 1], incremental_state=state, **extra)

    def run(steps, clock=None):
        times, state = [], {}
        for t in range(steps):
            if clock is None:
                step(t, state)
                continue
            start = clock()
            step(t, state)
            times.append(clock() - start)
        return times
    run.step = step  # (t, incremental state) -> the decoder's output: one step, untimed
    return run


#: one model of every family of the plugin, {arch: is a language model}: what
#: tests/test_op_counts.py holds and scripts/op_counts.py counts by default
FAMILIES = {"stlm_tied": True, "skipless_lm": True, "slim_lm": True, "anthe_lm_gpt2_small": True,
            "anthe_base": False, "subformer_base": False, "slim_transformer": False}

#: fairseq's model each plugin model is counted against (pre-norm, as slim_lm is), and the flags
#: that make it so
BASELINES = {True: ("transformer_lm", ["--decoder-normalize-before"]), False: ("transformer", [])}


def with_baselines(models):
    """``models`` ({arch: is a language model}) and fairseq's model of each task among them."""
    wanted = dict(models)
    for lm in set(models.values()):
        wanted.setdefault(BASELINES[lm][0], lm)
    return wanted


def build_at(build, arch, lm, shape):
    """``build(arch, argv, lm) -> (args, task, model)`` at ``shape``, with the flags that make a
    baseline pre-norm where it is one."""
    extra = BASELINES[lm][1] if arch == BASELINES[lm][0] else []
    return build(arch, shape_argv(lm, shape) + extra, lm)


def compare(build, models, shape=OpShape(), autocast=None):
    """{arch: {"train": OpCount, "decode": OpCount, "ratio_train": OpCount, "ratio_decode":
    OpCount}} for ``models`` ({arch: is a language model}) and fairseq's baselines, each model
    built at ``shape`` by ``build(arch, overrides, lm) -> (args, task, model)``; ratios are
    against the baseline of the same task; ``autocast``: as :func:`step_op_counts`."""
    counts = {}
    wanted = with_baselines(models)
    for arch, lm in wanted.items():
        args, task, model = build_at(build, arch, lm, shape)
        counts[arch] = step_op_counts(model, task.build_criterion(args), op_batch(task, lm, shape),
                                      lm, shape, autocast=autocast)
    for arch, lm in wanted.items():
        base = counts[BASELINES[lm][0]]
        counts[arch]["ratio_train"] = counts[arch]["train"] / base["train"]
        counts[arch]["ratio_decode"] = counts[arch]["decode"] / base["decode"]
    return counts


def _table_rows(models):
    """(model, its baseline) in a table's order: the baselines of the tasks among ``models``
    ({arch: is a language model}) first, then ``models``."""
    wanted = with_baselines(models)
    baselines = [BASELINES[lm][0] for lm in sorted(set(models.values()))]
    for arch in baselines + [a for a in models if a not in baselines]:
        yield arch, BASELINES[wanted[arch]][0]


def bytes_markdown(written, models):
    """A markdown table of :func:`compare_bytes`: per model, MB written per training step and
    the ratio against its baseline."""
    lines = ["| model | against | MB per training step | × baseline |", "|---|---|---|---|"]
    for arch, base in _table_rows(models):
        got, ratio = written[arch]
        lines.append(f"| {arch} | {base} | {got / 1e6:,.1f} | {ratio:.2f} |")
    return "\n".join(lines)


def markdown(counts, models):
    """A markdown table of :func:`compare`'s counts: per model, ops per training and decoding
    step (top-level and all) and the ratios against its baseline."""
    lines = ["| model | against | train: top | train: all | decode: top | decode: all | "
             "train × | decode × | train × (all) | decode × (all) |", "|" + "---|" * 10]
    for arch, base in _table_rows(models):
        c = counts[arch]
        lines.append(f"| {arch} | {base} | {c['train'].top:,.0f} | {c['train'].all:,.0f} | "
                     f"{c['decode'].top:,.1f} | {c['decode'].all:,.1f} | {c['ratio_train'].top:.2f} | "
                     f"{c['ratio_decode'].top:.2f} | {c['ratio_train'].all:.2f} | "
                     f"{c['ratio_decode'].all:.2f} |")
    return "\n".join(lines)
