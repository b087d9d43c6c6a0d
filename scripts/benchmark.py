#!/usr/bin/env python3
"""Side-by-side speed, memory and size benchmark of slim_fairseq architectures against fairseq's
``transformer`` / ``transformer_lm`` of the same shape (issue 8, item 1).

Every model is built through fairseq's own parser with the same shape flags (d, L, heads, f),
then measured in ONE process, interleaved: each repetition visits every model in turn
(round-robin). Absolute numbers are medians over repetitions; ratios against the baseline are
medians of per-repetition ratios (paired), so slow drifts of the machine (other jobs, thermal
state) hit both sides of each ratio alike. Measured per model:

* total and non-embedding parameters (shared tensors counted once; "embedding" = everything
  under ``embed_tokens``, ``embed_positions``, ``output_projection``, ``adaptive_softmax``:
  token tables, positions, H-SoftPOS / SAFE input and output paths, vocabulary projection);
* training tokens/s (target tokens, as fairseq's ``wps``) of forward + backward + Adam step on
  real batches of the bundled data (the same batches for every model of a task);
* peak training memory of one step (CPU: tensor storages tracked with torch's ``MemTracker``;
  CUDA: ``torch.cuda.max_memory_allocated``), parameters + gradients + Adam state + activations;
* achieved training GFLOP/s (FLOPs of each batch counted once with
  ``torch.utils.flop_counter.FlopCounterMode``, divided by the measured step time) and its
  share of the device's matmul peak, measured here with a large GEMM in the same dtype;
* generation tokens/s with fairseq's ``SequenceGenerator`` at each batch size and beam size,
  every hypothesis forced to exactly ``--gen-len`` new tokens (untrained models would stop at
  random lengths otherwise); translation sources are the first valid sentences, language
  models start from the end-of-sentence token.

``--dense-export`` adds, for every model with Tensor-Chain linears, a generation-only variant
whose TC layers are exported with ``TensorChainLinear.to_dense()``.

Output (``--out``, default ``results/<name>``): ``results.json``, ``table.md`` (ratios vs the
baseline of the same task, plus absolute numbers) and ``ratios.png`` / ``throughput.png``.
``--report-only`` re-writes them from an earlier run's ``results.json``; ``--no-training`` measures
generation only; ``--memory-only`` measures the peak training memory only.

Example (CPU, 2 threads)::

    OMP_NUM_THREADS=2 python scripts/benchmark.py --name d512 --dim 512 --layers 6 --heads 8 \\
        --model anthe_base --model "glu=slim_transformer --ffn-glu" --model sandwich_base \\
        --dense-export

A ``--model`` spec is ``[LABEL=]ARCH [fairseq overrides...]``; the shape flags come first, so
a spec's own overrides win.
"""
import argparse
import contextlib
import copy
import json
import os
import shlex
import statistics
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO_ROOT, "slim_fairseq")
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))

EMBEDDING_PARTS = ("embed_tokens", "embed_positions", "output_projection", "adaptive_softmax")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BASELINES = {False: "transformer", True: "transformer_lm"}


def log(message):
    print(f"[benchmark] {message}", flush=True)


# ----------------------------------------------------------------------------------------------
# set-up: plugin, data, models

def load_plugin():
    """Register the plugin exactly as ``--user-dir`` does."""
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=PLUGIN_DIR))


def parse_model_spec(spec):
    """``"[LABEL=]ARCH [overrides...]"`` -> (label, arch, overrides)."""
    tokens = shlex.split(spec)
    if not tokens:
        raise ValueError("--model: empty spec; expected '[LABEL=]ARCH [overrides...]'")
    head = tokens[0]
    label, arch = head.split("=", 1) if "=" in head else (None, head)
    overrides = tokens[1:]
    if label is None:
        label = " ".join([arch] + overrides)
    return label, arch, overrides


def model_class(arch):
    from fairseq.models import ARCH_MODEL_REGISTRY
    if arch not in ARCH_MODEL_REGISTRY:
        raise ValueError(f"--model: unknown architecture {arch!r}")
    return ARCH_MODEL_REGISTRY[arch]


def is_language_model(arch):
    from fairseq.models import FairseqLanguageModel
    return issubclass(model_class(arch), FairseqLanguageModel)


def accepted_flags(arch):
    """Option strings the model class of ``arch`` understands."""
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_class(arch).add_args(parser)
    return set(parser._option_string_actions)


def shape_overrides(arch, lm, dim, layers, heads, ffn):
    """Shape flags for ``arch`` (encoder and decoder for translation models)."""
    flags = accepted_flags(arch)
    out = []
    for side in (("decoder",) if lm else ("encoder", "decoder")):
        for name, value in (("embed-dim", dim), ("layers", layers), ("attention-heads", heads),
                            ("ffn-embed-dim", ffn)):
            flag = f"--{side}-{name}"
            if flag in flags:
                out += [flag, str(value)]
    for flag in ("--decoder-input-dim", "--decoder-output-dim"):
        if lm and flag in flags:
            out += [flag, str(dim)]
    return out


def task_argv(lm, args):
    if lm:
        return [args.lm_data, "--task", "language_modeling", "--tokens-per-sample",
                str(args.tokens_per_sample), "--sample-break-mode", "none",
                "--criterion", "cross_entropy"]
    return [args.ende_data, "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


def parse_fairseq_args(argv):
    from fairseq import options
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)


def count_parameters(model):
    """(total, non-embedding) parameter counts, each shared tensor counted once."""
    total = non_embedding = 0
    for name, param in model.named_parameters():  # named_parameters() de-duplicates
        total += param.numel()
        if not any(part in name.split(".") for part in EMBEDDING_PARTS):
            non_embedding += param.numel()
    return total, non_embedding


def tc_linears(model):
    return [m for m in model.modules()
            if type(m).__name__ == "TensorChainLinear" and hasattr(m, "to_dense")]


def export_dense(model):
    """A copy of ``model`` with every TensorChainLinear replaced by its ``to_dense()`` export."""
    exported = copy.deepcopy(model)
    replacements = []
    for parent in exported.modules():
        for name, child in parent.named_children():
            if type(child).__name__ == "TensorChainLinear" and hasattr(child, "to_dense"):
                replacements.append((parent, name, child))
    for parent, name, child in replacements:
        setattr(parent, name, child.to_dense())
    for module in exported.modules():  # deepcopy copied the incremental-state ids (docs/TECHNIQUES.md#shared-layers-and-incremental-state)
        if hasattr(module, "init_incremental_state"):
            module.init_incremental_state()
    return exported


class Entry:
    """One benchmarked model and everything measured on it."""

    def __init__(self, label, arch, overrides, lm, baseline=False, export_of=None):
        self.label, self.arch, self.overrides, self.lm = label, arch, overrides, lm
        self.baseline = baseline
        self.export_of = export_of  # label of the trained model this is a dense export of
        self.model = self.criterion = self.optimizer = None
        self.params = self.non_embedding = 0
        self.batch_flops = {}
        self.train_tps, self.train_gflops = [], []
        self.peak_bytes = None
        self.saved_by_module = None  # module -> bytes kept for backward (--memory-breakdown)
        self.time_by_part = []  # per repetition: part -> forward / backward seconds (--time-breakdown)
        self.gen = {}  # (batch, beam) -> [tokens/s per repetition]


# ----------------------------------------------------------------------------------------------
# measurements

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def autocast_context(device, dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def default_gemm_size(cuda):
    """GEMM size of the matmul-peak measurement when --gemm-size is not given."""
    return 8192 if cuda else 2048


def measure_matmul_peak(device, dtype, size, repeats=10):
    """Best GFLOP/s of an ``size x size`` GEMM (2 n^3 FLOPs) in ``dtype`` on ``device``."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)
    synchronize(device)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = max(best, 2.0 * size ** 3 / (time.perf_counter() - start) / 1e9)
    return best


def to_device(sample, device):
    from fairseq import utils
    return utils.apply_to_sample(lambda t: t.to(device), sample)


def loss_backward(entry, sample, device, dtype):
    with autocast_context(device, dtype):
        loss, _, _ = entry.criterion(entry.model, sample)
    loss.backward()


def count_batch_flops(entry, batches, device, dtype):
    """FLOPs of forward + backward of every batch (the optimizer step is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode
    entry.model.train()
    for index, sample in enumerate(batches):
        counter = FlopCounterMode(display=False)
        with counter:
            loss_backward(entry, sample, device, dtype)
        entry.model.zero_grad(set_to_none=True)
        entry.batch_flops[index] = counter.get_total_flops()


def new_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-5)


def warm_up(entry, sample, device, dtype):
    """One untimed training step; creates the entry's Adam optimizer and its state."""
    entry.model.train()
    entry.optimizer = new_optimizer(entry.model)
    loss_backward(entry, sample, device, dtype)
    entry.optimizer.step()
    entry.optimizer.zero_grad(set_to_none=True)


def measure_peak_memory(entry, sample, device, dtype):
    """Peak bytes of one training step with a fresh Adam optimizer (params, grads, Adam state,
    activations). The optimizer is kept for the timed steps (this step is their warm-up)."""
    model = entry.model
    model.train()
    optimizer = entry.optimizer = new_optimizer(model)
    if device.type == "cuda":
        synchronize(device)
        static = sum(p.numel() * p.element_size() for p in model.parameters())
        static += sum(b.numel() * b.element_size() for b in model.buffers())
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss_backward(entry, sample, device, dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated() - before + static
    else:
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError:  # torch without the distributed tools: process-wide peak RSS instead
            import resource
            loss_backward(entry, sample, device, dtype)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            loss_backward(entry, sample, device, dtype)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
    return int(peak)


def saved_activations_by_module(entry, sample, device, dtype):
    """Bytes of the distinct tensor storages autograd keeps for backward in one training
    forward (parameters excluded), by the module whose forward created them; layer numbers are
    folded (``decoder.layers.N.fc1``), ``<loss>`` is what the model's own modules did not keep
    (the criterion's log-probabilities). The tensors a module keeps are charged to the module
    that saved them first."""
    model = entry.model
    names = {m: name for name, m in model.named_modules()}
    stack = ["<loss>"]
    hooks = []
    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(lambda m, args: stack.append(names[m])))
        hooks.append(module.register_forward_hook(lambda m, args, out: (stack.pop(), None)[1]))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in kept:
            name = stack[-1] or "<model>"
            kept[storage.data_ptr()] = (".".join("N" if p.isdigit() else p for p in name.split(".")),
                                        storage.nbytes())
        return t

    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_backward(entry, sample, device, dtype)
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    by_module = {}
    for name, nbytes in kept.values():
        by_module[name] = by_module.get(name, 0) + nbytes
    return dict(sorted(by_module.items(), key=lambda kv: -kv[1]))


# module names (the last part of a module's path) whose forward and backward make up each part of
# a training step; the outermost match wins (a skipless `ffn` holds its own fc1 / fc2)
STEP_PARTS = {"self_attn": "attention", "encoder_attn": "attention", "fc1": "feed-forward",
              "fc2": "feed-forward", "ffn": "feed-forward", "embed_tokens": "embeddings",
              "embed_positions": "embeddings", "output_projection": "output projection"}


def step_part_modules(model):
    """{module: part} for the outermost modules named in :data:`STEP_PARTS`."""
    chosen, chosen_names = {}, set()
    for name, module in model.named_modules():
        parts = name.split(".")
        if parts[-1] in STEP_PARTS and not any(".".join(parts[:i]) in chosen_names
                                               for i in range(1, len(parts))):
            chosen[module] = STEP_PARTS[parts[-1]]
            chosen_names.add(name)
    return chosen


class _BackwardClock(torch.autograd.Function):
    """Identity whose backward calls ``tick()`` when the gradient passes through it."""

    @staticmethod
    def forward(ctx, tick, x):
        ctx.tick = tick
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.tick()
        return None, grad


def _clocked(value, tick):
    """``value`` (a tensor, or a tuple / list holding tensors) with :class:`_BackwardClock` on each
    tensor that needs a gradient."""
    if isinstance(value, torch.Tensor):
        return _BackwardClock.apply(tick, value) if value.requires_grad else value
    if isinstance(value, (tuple, list)):
        return type(value)(_clocked(v, tick) for v in value)
    return value


def time_by_part(entry, sample, device, dtype):
    """Wall time of one training forward + backward, taken apart by :data:`STEP_PARTS`: a module's
    forward from its forward pre-hook to its forward hook; its backward from the moment the
    gradient of its output arrives to the moment the gradients of all its inputs (positional or
    keyword) are ready, seen through identity functions put around them. A module whose inputs
    need no gradient (a token table) has no backward time of its own. ``rest`` is what the parts
    do not cover: norms, residual adds, dropout outside them, the loss and its gradient. Returns
    {part: {"forward": s, "backward": s}} with ``step`` the whole forward + backward."""
    model = entry.model
    parts = step_part_modules(model)
    forward_start, calls, hooks = {}, [], []

    def now():
        synchronize(device)
        return time.perf_counter()

    def before(module, args, kwargs):
        call = {"part": parts[module], "backward": [None, None]}  # [start, end] of its backward
        calls.append(call)
        forward_start.setdefault(module, []).append((now(), call))

        def end_of_backward():
            call["backward"][1] = now()
        return _clocked(args, end_of_backward), {k: _clocked(v, end_of_backward) for k, v in kwargs.items()}

    def after(module, args, kwargs, output):
        begun, call = forward_start[module].pop()
        call["forward"] = now() - begun

        def start_of_backward():
            if call["backward"][0] is None:
                call["backward"][0] = now()
        return _clocked(output, start_of_backward)

    for module in parts:
        hooks += [module.register_forward_pre_hook(before, with_kwargs=True),
                  module.register_forward_hook(after, with_kwargs=True)]
    model.train()
    try:
        start = now()
        with autocast_context(device, dtype):
            loss, _, _ = entry.criterion(model, sample)
        middle = now()
        loss.backward()
        end = now()
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    spent = {}
    for call in calls:
        slot = spent.setdefault(call["part"], {"forward": 0.0, "backward": 0.0})
        slot["forward"] += call["forward"]
        begun, done = call["backward"]
        if begun is not None and done is not None:
            slot["backward"] += done - begun
    step = {"forward": middle - start, "backward": end - middle}
    spent["rest"] = {d: step[d] - sum(v[d] for v in spent.values()) for d in step}
    spent["step"] = step
    return spent


def model_columns(intro, corner, rows):
    """The opening lines of a markdown table with one column per model, after ``intro``."""
    return ["", intro, "", f"| {corner} | " + " | ".join(r["label"] for r in rows) + " |",
            "|" + "---|" * (len(rows) + 1)]


def time_breakdown_table(rows):
    """Markdown: one training step's forward + backward time by part, per model (ms, median over
    repetitions), with each part's ratio to the baseline's same part."""
    rows = [r for r in rows if r.get("time_by_part")]
    if not rows:
        return []
    base = next((r for r in rows if r["baseline"]), rows[0])
    order = ["embeddings", "attention", "feed-forward", "output projection", "rest", "step"]
    names = [n for n in order if any(n in r["time_by_part"] for r in rows)]
    lines = model_columns(
        "Where the training time goes (`--time-breakdown`): one forward + backward of batch 0, ms "
        "(median over repetitions; forward / backward in brackets), × the baseline's same part. "
        "`rest` = norms, residuals, dropout outside the parts, the loss; the hooks themselves add a "
        "little to every part:", "part", rows)
    for name in names:
        cells = []
        for r in rows:
            part = r["time_by_part"].get(name)
            if part is None:
                cells.append("—")
                continue
            total = part["forward"] + part["backward"]
            base_part = base["time_by_part"].get(name)
            base_total = base_part and base_part["forward"] + base_part["backward"]
            cells.append(f"{1e3 * total:,.0f} ({1e3 * part['forward']:,.0f} / {1e3 * part['backward']:,.0f})"
                         + (f", {total / base_total:.2f}×" if base_total else ""))
        lines.append(f"| {'**step**' if name == 'step' else name} | " + " | ".join(cells) + " |")
    return lines


def breakdown_table(rows):
    """Markdown: the memory of one training step taken apart, one column per model (MiB)."""
    rows = [r for r in rows if r.get("saved_by_module")]
    if not rows:
        return []
    mib = lambda b: "—" if b is None else f"{b / 2 ** 20:,.1f}"  # noqa: E731
    modules = {}
    for r in rows:
        for name, nbytes in r["saved_by_module"].items():
            modules[name] = max(modules.get(name, 0), nbytes)
    lines = model_columns(
        "Where the training memory goes (MiB; `--memory-breakdown`): weights, their gradients and "
        "Adam's two moments (4 × fp32 parameters), then the activations autograd keeps for backward, "
        "by the module that kept them (layers folded to N; modules under 0.5 % of the largest total "
        "left out):", "", rows)
    lines.append("| peak of the step | " + " | ".join(mib(r["peak_memory_bytes"]) for r in rows) + " |")
    lines.append("| weights + grads + Adam | " + " | ".join(mib(16 * r["params"]) for r in rows) + " |")
    lines.append("| activations kept for backward | "
                 + " | ".join(mib(sum(r["saved_by_module"].values())) for r in rows) + " |")
    smallest = 0.005 * max(sum(r["saved_by_module"].values()) for r in rows)
    for name in sorted(modules, key=lambda n: -modules[n]):
        if modules[name] >= smallest:  # leave out modules below 0.5 % of the largest total
            lines.append(f"| `{name}` | " + " | ".join(mib(r["saved_by_module"].get(name)) for r in rows) + " |")
    return lines


def train_repetition(entry, batches, steps, device, dtype):
    """One timed repetition of ``steps`` training steps (forward, backward, Adam step, with the
    optimizer state already allocated by the warm-up). Returns (tokens/s, GFLOP/s)."""
    entry.model.train()
    optimizer = entry.optimizer
    synchronize(device)
    tokens = flops = 0
    start = time.perf_counter()
    for i in range(steps):
        index = i % len(batches)
        loss_backward(entry, batches[index], device, dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batches[index]["ntokens"]
        flops += entry.batch_flops.get(index, 0)
    synchronize(device)
    elapsed = time.perf_counter() - start
    return tokens / elapsed, flops / elapsed / 1e9


def generation_sample(task, lm, batch_size, device):
    """The first ``batch_size`` valid sentences (translation) as a fairseq sample; for a language
    model, ``batch_size`` empty prompts (generation starts from the end-of-sentence token:
    fairseq's beam search cannot finish forced prefixes with beam > 1, and per-step cost does not
    depend on the prompt)."""
    if lm:
        eos = task.source_dictionary.eos()
        sample = {"id": torch.arange(batch_size), "net_input": {
            "src_tokens": torch.full((batch_size, 1), eos, dtype=torch.long),
            "src_lengths": torch.ones(batch_size, dtype=torch.long)}}
    else:
        dataset = task.dataset("valid")
        if len(dataset) < batch_size:
            raise ValueError(f"--batch-sizes: only {len(dataset)} valid sentences")
        sample = dataset.collater([dataset[i] for i in range(batch_size)])
    return to_device(sample, device)


def make_generator(task, entry, beam, gen_len):
    from fairseq.sequence_generator import SequenceGenerator
    return SequenceGenerator([entry.gen_model], task.target_dictionary, beam_size=beam,
                             max_len_a=0, max_len_b=gen_len, min_len=gen_len)


def generation_repetition(task, entry, sample, beam, gen_len, device):
    """Generated tokens per second (``batch x gen_len`` new tokens, best hypothesis each)."""
    generator = make_generator(task, entry, beam, gen_len)
    batch = sample["net_input"]["src_tokens"].shape[0]
    synchronize(device)
    start = time.perf_counter()
    task.inference_step(generator, [entry.gen_model], sample)
    synchronize(device)
    return batch * gen_len / (time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------
# reporting

def median(values):
    return statistics.median(values) if values else None


def ratio(value, base):
    if value is None or base in (None, 0):
        return None
    return value / base


def fmt_ratio(value):
    return "—" if value is None else f"{value:.2f}×"


def fmt_num(value, digits=0):
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def paired_ratio(values, base_values):
    """Median over repetitions of ``value / baseline value`` of the same repetition. Runs are
    interleaved, so a slow moment of the machine hits both members of a pair; the median of
    the pairs is steadier than the ratio of two medians (used when the counts differ)."""
    if values and base_values and len(values) == len(base_values):
        return statistics.median(v / b for v, b in zip(values, base_values))
    return ratio(median(values), median(base_values))


def median_parts(repetitions):
    """{part: {direction: median seconds}} over the repetitions of :func:`time_by_part`, or None."""
    if not repetitions:
        return None
    return {part: {d: median([rep[part][d] for rep in repetitions if part in rep]) for d in ("forward", "backward")}
            for part in dict.fromkeys(p for rep in repetitions for p in rep)}


def summarise(entries, args, peaks):
    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    baselines = {e.lm: e for e in entries if e.baseline}
    rows = []
    for e in entries:
        base = baselines[e.lm]
        peak_flops = peaks.get("matmul_gflops")
        train = median(e.train_tps)
        gflops = median(e.train_gflops)
        row = {
            "label": e.label, "arch": e.arch, "overrides": e.overrides, "task": "lm" if e.lm else "translation",
            "baseline": e.baseline, "dense_export_of": e.export_of,
            "params": e.params, "non_embedding_params": e.non_embedding,
            "train_tokens_per_s": train, "train_tokens_per_s_all": e.train_tps,
            "train_gflops": gflops, "train_gflops_all": e.train_gflops,
            "train_peak_fraction": ratio(gflops, peak_flops),
            "peak_memory_bytes": e.peak_bytes,
            "saved_by_module": e.saved_by_module,
            "time_by_part": median_parts(e.time_by_part),
            "time_by_part_all": e.time_by_part,
            "generation_tokens_per_s": {f"b{b}_beam{k}": median(e.gen.get((b, k), [])) for b, k in gen_keys},
            "generation_tokens_per_s_all": {f"b{b}_beam{k}": e.gen.get((b, k), []) for b, k in gen_keys},
            "ratios": {
                "params": ratio(e.params, base.params),
                "non_embedding_params": ratio(e.non_embedding, base.non_embedding),
                "train_tokens_per_s": paired_ratio(e.train_tps, base.train_tps),
                "peak_memory": ratio(e.peak_bytes, base.peak_bytes),
                **{f"gen_b{b}_beam{k}": paired_ratio(e.gen.get((b, k), []), base.gen.get((b, k), []))
                   for b, k in gen_keys},
            },
        }
        rows.append(row)
    return rows


def markdown_table(rows, args, peaks, threads=None):
    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    threads = threads or torch.get_num_threads()
    measured = ("peak training memory of one step only (--memory-only)"
                if peaks.get("matmul_gflops") is None else
                f"matmul peak {peaks['matmul_gflops']:.1f} GFLOP/s ({args.gemm_size}² GEMM); "
                f"{args.repeats} interleaved repetitions, medians")
    lines = [f"Shape: d={args.dim}, L={args.layers}, heads={args.heads}, ffn={args.ffn}; device "
             f"{peaks['device']}, dtype {args.dtype}, threads {threads}; {measured}.", ""]
    lines.append("Ratios vs the fairseq baseline of the same task and shape (higher = faster / larger; "
                 "speed ratios are medians of per-repetition ratios):")
    lines.append("")
    head = ["model", "params", "non-emb params", "train tok/s", "peak mem"]
    head += [f"gen b{b} beam{k}" for b, k in gen_keys]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        q = r["ratios"]
        cells = [r["label"] + (" (baseline)" if r["baseline"] else ""), fmt_ratio(q["params"]),
                 fmt_ratio(q["non_embedding_params"]), fmt_ratio(q["train_tokens_per_s"]),
                 fmt_ratio(q["peak_memory"])]
        cells += [fmt_ratio(q[f"gen_b{b}_beam{k}"]) for b, k in gen_keys]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Absolute numbers:", ""]
    head = ["model", "arch", "params", "non-emb", "train tok/s", "GFLOP/s", "% of peak", "peak MiB"]
    head += [f"gen tok/s b{b} beam{k}" for b, k in gen_keys]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        frac = r["train_peak_fraction"]
        mem = r["peak_memory_bytes"]
        cells = [r["label"], r["arch"], fmt_num(r["params"]), fmt_num(r["non_embedding_params"]),
                 fmt_num(r["train_tokens_per_s"]), fmt_num(r["train_gflops"], 1),
                 "—" if frac is None else f"{100 * frac:.0f}%",
                 "—" if mem is None else fmt_num(mem / 2 ** 20)]
        cells += [fmt_num(r["generation_tokens_per_s"][f"b{b}_beam{k}"]) for b, k in gen_keys]
        lines.append("| " + " | ".join(cells) + " |")
    lines += breakdown_table(rows)
    lines += time_breakdown_table(rows)
    if args.pair:
        by_label = {r["label"]: r for r in rows}
        lines += ["", "Pairs (speed of A relative to B, same run):", ""]
        head = ["A vs B", "train tok/s"] + [f"gen b{b} beam{k}" for b, k in gen_keys]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for pair in args.pair:
            a, b = (by_label.get(x) for x in pair.split(":", 1))
            if a is None or b is None:
                raise ValueError(f"--pair {pair}: labels must be among {sorted(by_label)}")
            cells = [f"{a['label']} vs {b['label']}",
                     fmt_ratio(paired_ratio(a["train_tokens_per_s_all"], b["train_tokens_per_s_all"]))]
            cells += [fmt_ratio(paired_ratio(a["generation_tokens_per_s_all"][f"b{x}_beam{k}"],
                                             b["generation_tokens_per_s_all"][f"b{x}_beam{k}"]))
                      for x, k in gen_keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, args, out_dir):
    import logging
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gen_keys = [(b, k) for b in args.batch_sizes for k in args.beams]
    metrics = [("params", "params"), ("train_tokens_per_s", "train tok/s"), ("peak_memory", "peak mem")]
    metrics += [(f"gen_b{b}_beam{k}", f"gen b{b} beam{k}") for b, k in gen_keys]
    labels = [r["label"] for r in rows]
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.9 * len(labels) + 2.0)), 4.5))
    width = 0.8 / len(metrics)
    for j, (key, name) in enumerate(metrics):
        values = [r["ratios"][key] if r["ratios"][key] is not None else 0.0 for r in rows]
        ax.bar([i + (j - (len(metrics) - 1) / 2) * width for i in range(len(rows))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("ratio vs fairseq baseline")
    ax.set_title(f"d={args.dim} L={args.layers} h={args.heads} ({args.dtype})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ratios.png"), dpi=80)
    plt.close(fig)

    trained = [r for r in rows if r["train_tokens_per_s"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    for r in trained:
        ax.scatter(r["params"] / 1e6, r["train_tokens_per_s"], marker="s" if r["baseline"] else "o")
        ax.annotate(r["label"], (r["params"] / 1e6, r["train_tokens_per_s"]), fontsize=6)
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("training tokens/s")
    ax.set_title("training throughput vs size", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=80)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------

def int_list(text):
    return [int(x) for x in text.split(",") if x]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="MODEL",
                   help="'[LABEL=]ARCH [overrides...]' (repeatable); the baseline is added automatically")
    p.add_argument("--name", default="benchmark", help="results/<name> when --out is not given")
    p.add_argument("--out", help="output directory")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, help="FFN width (default 4 d)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                   help="fp32, or bf16/fp16 (autocast in training, model cast for generation)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: $OMP_NUM_THREADS or 2)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per training batch")
    p.add_argument("--num-batches", type=int, default=3, help="distinct training batches, cycled")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per repetition")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median)")
    p.add_argument("--batch-sizes", type=int_list, default=[1, 64], help="generation batch sizes")
    p.add_argument("--beams", type=int_list, default=[1, 5], help="generation beam sizes")
    p.add_argument("--gen-len", type=int, default=24, help="new tokens per generated sentence")
    p.add_argument("--tokens-per-sample", type=int, default=256, help="LM training block length")
    p.add_argument("--gemm-size", type=int, help="matmul peak GEMM size (default 2048 CPU, 8192 CUDA)")
    p.add_argument("--dense-export", action="store_true",
                   help="also generate with TC layers exported to dense (TensorChainLinear.to_dense)")
    p.add_argument("--pair", action="append", default=[], metavar="A:B",
                   help="also report model A's speed relative to model B (labels), e.g. a reduced "
                        "model vs its original")
    p.add_argument("--no-training", action="store_true",
                   help="skip training speed, FLOPs and memory (generation only)")
    p.add_argument("--no-generation", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="re-write table.md and the plots from <out>/results.json (no measuring)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    p.add_argument("--memory-breakdown", action="store_true",
                   help="also list the activations each module keeps for backward (table.md)")
    p.add_argument("--time-breakdown", action="store_true",
                   help="also time one training forward + backward by part (attention, feed-forward, "
                        "embeddings, output projection, rest), --repeats times (table.md)")
    p.add_argument("--tc-one-pass", action="store_true",
                   help="run every Tensor-Chain contraction over the whole batch at once, as before "
                        "the CPU row blocks (to measure what the blocks bring)")
    p.add_argument("--memory-only", action="store_true",
                   help="peak training memory only: no FLOP count, timing, matmul peak or generation "
                        "(tensor storages on the CPU, so it is exact on a busy machine)")
    p.add_argument("--ende-data", help="en-de data-bin (default: binarize the bundled corpus)")
    p.add_argument("--lm-data", help="WikiText-2 data-bin (default: binarize the bundled corpus)")
    p.add_argument("--lm-vocab", type=int, default=8000, help="WikiText-2 vocabulary cap when binarizing")
    p.add_argument("--seed", type=int, default=1)
    return p


def entries_from_results(rows):
    """Entry objects back from the rows of a results.json (for --report-only)."""
    entries = []
    for r in rows:
        e = Entry(r["label"], r["arch"], r["overrides"], r["task"] == "lm", baseline=r["baseline"],
                  export_of=r["dense_export_of"])
        e.params, e.non_embedding, e.peak_bytes = r["params"], r["non_embedding_params"], r["peak_memory_bytes"]
        e.saved_by_module = r.get("saved_by_module")
        e.time_by_part = r.get("time_by_part_all") or []
        e.train_tps = r["train_tokens_per_s_all"]
        e.train_gflops = r.get("train_gflops_all") or ([r["train_gflops"]] if r["train_gflops"] else [])
        for key, values in r["generation_tokens_per_s_all"].items():
            batch, beam = key[1:].split("_beam")
            if values:  # runs with --no-generation before it dropped the columns recorded []
                e.gen[(int(batch), int(beam))] = values
        entries.append(e)
    return entries


def report_only(args):
    """Re-write table.md and the plots of an earlier run from its results.json."""
    out_dir = args.out or os.path.join(REPO_ROOT, "results", args.name)
    with open(os.path.join(out_dir, "results.json")) as f:
        saved = json.load(f)
    meta = saved["meta"]
    run_args = copy.copy(args)  # --pair comes from this command line
    for key in ("dim", "layers", "heads", "ffn", "dtype"):
        setattr(run_args, key, meta[key])
    run_args.gemm_size = meta.get("gemm_size") or default_gemm_size(cuda=not meta["device"].startswith("cpu"))
    entries = entries_from_results(saved["rows"])
    run_args.batch_sizes = sorted({b for b, _ in entries[0].gen})
    run_args.beams = sorted({k for _, k in entries[0].gen})
    run_args.repeats = max(len(e.train_tps or next(iter(e.gen.values()), [])) for e in entries)
    peaks = {"device": meta["device"], "matmul_gflops": meta["matmul_gflops"]}
    rows = summarise(entries, run_args, peaks)
    return write_outputs(out_dir, meta, rows, run_args, peaks)


def write_outputs(out_dir, meta, rows, args, peaks):
    """results.json, table.md and the plots of one run; prints the table."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    table = markdown_table(rows, args, peaks, threads=meta["threads"])
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    plot(rows, args, out_dir)
    print(table)
    log(f"wrote {out_dir}/results.json, table.md, ratios.png, throughput.png")
    return rows


def main(argv=None):
    command_line = list(sys.argv) if argv is None else ["scripts/benchmark.py", *argv]  # fairseq's parser edits sys.argv
    args = get_parser().parse_args(argv)
    if args.report_only:
        return report_only(args)
    if not args.model:
        raise SystemExit("benchmark.py: give at least one --model")
    if args.no_training and args.no_generation:
        raise SystemExit("benchmark.py: --no-training and --no-generation leave nothing to measure")
    if args.memory_only:
        for flag in ("no_training", "no_memory", "dense_export"):
            if getattr(args, flag):
                raise SystemExit(f"benchmark.py: --memory-only cannot be combined with "
                                 f"--{flag.replace('_', '-')}")
        args.no_generation = True
    if args.no_generation:  # no generation columns in the tables and plots
        args.batch_sizes, args.beams = [], []
    if args.time_breakdown and (args.no_training or args.memory_only):
        raise SystemExit("benchmark.py: --time-breakdown times training steps (not with "
                         "--no-training or --memory-only)")
    if args.memory_breakdown and (args.no_memory or args.no_training):
        raise SystemExit("benchmark.py: --memory-breakdown needs the memory step (not with "
                         "--no-memory or --no-training)")
    args.ffn = args.ffn or 4 * args.dim
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    out_dir = args.out or os.path.join(REPO_ROOT, "results", args.name)
    os.makedirs(out_dir, exist_ok=True)
    load_plugin()
    import slim_fairseq.modules.tensor_chain as tensor_chain
    block_floats = tensor_chain.BLOCK_FLOATS
    if args.tc_one_pass:
        tensor_chain.BLOCK_FLOATS = float("inf")  # row_block() then never splits a batch
    try:
        return measure(args, command_line, threads, device, dtype, out_dir)
    finally:
        tensor_chain.BLOCK_FLOATS = block_floats


def measure(args, command_line, threads, device, dtype, out_dir):
    """Every measurement of :func:`main`, in order; writes and returns the rows."""
    specs = [parse_model_spec(s) for s in args.model]
    kinds = sorted({is_language_model(arch) for _, arch, _ in specs})
    if any(lm for lm in kinds) and not args.lm_data:
        from binarize_bundled import binarize_wikitext
        args.lm_data = binarize_wikitext(nwords=args.lm_vocab)
    if any(not lm for lm in kinds) and not args.ende_data:
        from binarize_bundled import binarize_ende
        args.ende_data = binarize_ende()

    entries = [Entry(f"{BASELINES[lm]}", BASELINES[lm], [], lm, baseline=True) for lm in kinds]
    entries += [Entry(label, arch, overrides, is_language_model(arch)) for label, arch, overrides in specs]

    # tasks and the fixed training batches (same for every model of a task)
    from fairseq import tasks
    task_of, batches_of = {}, {}
    for lm in kinds:
        base_args = parse_fairseq_args(task_argv(lm, args) + ["--arch", BASELINES[lm], "--cpu"])
        task = tasks.setup_task(base_args)
        task.load_dataset("train")
        task.load_dataset("valid")
        iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=args.max_tokens,
                                           max_positions=task.max_positions(), seed=args.seed,
                                           ignore_invalid_inputs=True)
        epoch = iterator.next_epoch_itr(shuffle=True)
        batches = [to_device(next(epoch), device) for _ in range(args.num_batches)]
        task_of[lm], batches_of[lm] = task, batches
        log(f"{'LM' if lm else 'translation'} batches: "
            f"{[b['ntokens'] for b in batches]} target tokens; dictionary {len(task.target_dictionary)}")

    # build every model
    for e in entries:
        argv = task_argv(e.lm, args) + ["--arch", e.arch, "--user-dir", PLUGIN_DIR]
        argv += ["--cpu"] if device.type == "cpu" else []
        argv += shape_overrides(e.arch, e.lm, args.dim, args.layers, args.heads, args.ffn) + e.overrides
        model_args = parse_fairseq_args(argv)
        torch.manual_seed(args.seed)
        e.model = task_of[e.lm].build_model(model_args).to(device)
        e.criterion = task_of[e.lm].build_criterion(model_args)
        e.params, e.non_embedding = count_parameters(e.model)
        log(f"built {e.label}: {e.params:,} params ({e.non_embedding:,} non-embedding), "
            f"{len(tc_linears(e.model))} TC linears")

    peaks = {"device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({threads} threads)"}
    gemm = args.gemm_size = args.gemm_size or default_gemm_size(cuda=device.type == "cuda")
    peaks["matmul_gflops"] = None if args.memory_only else measure_matmul_peak(device, dtype, gemm)
    if not args.memory_only:
        log(f"matmul peak ({gemm}x{gemm}, {args.dtype}): {peaks['matmul_gflops']:.1f} GFLOP/s")

    # one-off measurements: FLOPs per batch and peak memory (not timed)
    for e in entries if not args.no_training else []:
        if not args.memory_only:
            count_batch_flops(e, batches_of[e.lm], device, dtype)
        if args.no_memory:
            warm_up(e, batches_of[e.lm][0], device, dtype)
        else:
            e.peak_bytes = measure_peak_memory(e, batches_of[e.lm][0], device, dtype)
            if args.memory_breakdown:
                e.saved_by_module = saved_activations_by_module(e, batches_of[e.lm][0], device, dtype)
        parts = [] if args.memory_only else [f"{e.batch_flops[0] / 1e9:.1f} GFLOP per batch-0 step"]
        parts += [] if e.peak_bytes is None else [f"peak memory {e.peak_bytes / 2 ** 20:.0f} MiB"]
        log(f"{e.label}: " + ", ".join(parts))

    # training throughput, interleaved
    for rep in range(0 if args.no_training or args.memory_only else args.repeats):
        for e in entries:
            tps, gflops = train_repetition(e, batches_of[e.lm], args.steps, device, dtype)
            e.train_tps.append(tps)
            e.train_gflops.append(gflops)
            log(f"train rep {rep + 1}/{args.repeats} {e.label}: {tps:,.0f} tok/s, {gflops:.1f} GFLOP/s")

    # training time by part, interleaved (after the timed steps, whose numbers the hooks would slow)
    for rep in range(args.repeats if args.time_breakdown else 0):
        for e in entries:
            e.time_by_part.append(time_by_part(e, batches_of[e.lm][0], device, dtype))
        log(f"time breakdown rep {rep + 1}/{args.repeats}: " + "; ".join(
            f"{e.label} {1e3 * sum(e.time_by_part[-1]['step'].values()):,.0f} ms" for e in entries))

    # generation, interleaved
    if not args.no_generation:
        gen_entries = []
        for e in entries:
            e.optimizer = None
            e.model.zero_grad(set_to_none=True)
            e.gen_model = e.model.eval()
            if dtype != torch.float32:
                e.gen_model = e.gen_model.to(dtype)
            gen_entries.append(e)
            if args.dense_export and tc_linears(e.model):
                x = Entry(f"{e.label} +dense", e.arch, e.overrides, e.lm, export_of=e.label)
                x.gen_model = export_dense(e.gen_model).eval()
                x.params, x.non_embedding = count_parameters(x.gen_model)
                gen_entries.append(x)
        for x in gen_entries:
            if x not in entries:
                entries.insert(entries.index(next(e for e in entries if e.label == x.export_of)) + 1, x)
        samples = {(lm, b): generation_sample(task_of[lm], lm, b, device)
                   for lm in kinds for b in args.batch_sizes}
        with torch.no_grad():
            for e in gen_entries:  # warm-up (first-call allocations, lazy init)
                generation_repetition(task_of[e.lm], e, samples[(e.lm, args.batch_sizes[0])], args.beams[0],
                                      min(4, args.gen_len), device)
            for rep in range(args.repeats):
                for b in args.batch_sizes:
                    for k in args.beams:
                        for e in gen_entries:
                            tps = generation_repetition(task_of[e.lm], e, samples[(e.lm, b)], k,
                                                        args.gen_len, device)
                            e.gen.setdefault((b, k), []).append(tps)
                log(f"generation rep {rep + 1}/{args.repeats}: "
                    + "; ".join(f"{e.label} {median(e.gen[(args.batch_sizes[0], args.beams[0])]):,.0f}"
                                for e in gen_entries) + f" tok/s at b{args.batch_sizes[0]} beam{args.beams[0]}")

    # the peak again at the end, keeping the better one: a single early reading can catch the
    # machine in a slow moment and would inflate every "% of peak"
    if not args.memory_only:
        peaks["matmul_gflops"] = max(peaks["matmul_gflops"], measure_matmul_peak(device, dtype, gemm))
        log(f"matmul peak, best of both readings: {peaks['matmul_gflops']:.1f} GFLOP/s")
    rows = summarise(entries, args, peaks)
    meta = {"argv": command_line, "gemm_size": gemm, "dim": args.dim,
            "layers": args.layers, "heads": args.heads, "ffn": args.ffn, "dtype": args.dtype,
            "threads": threads, "torch": torch.__version__, **peaks}
    return write_outputs(out_dir, meta, rows, args, peaks)


if __name__ == "__main__":
    main()
