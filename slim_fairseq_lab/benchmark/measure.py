"""What the benchmark measures on one model (an :class:`Entry`): parameter counts, the FLOPs of a
training step (``torch.utils.flop_counter``), its peak memory (CPU: tensor storages tracked with
torch's ``MemTracker``; CUDA: ``torch.cuda.max_memory_allocated``), the activations each module
keeps for backward, the time of a step by part, training and generation throughput, and the
device's matmul peak. The Tensor-Chain dense export (``TensorChainLinear.to_dense``) is here too.
"""
import contextlib
import copy
import time

import torch

from slim_fairseq_lab.benchmark import DTYPE_NAMES, EMBEDDING_PARTS
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))


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
        self.ops = None  # {"train": {"all", "top"}, "decode": {...}}: aten ops per step


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
    # deepcopy copied the incremental-state ids (docs/TECHNIQUES.md#shared-layers-and-incremental-state)
    for module in exported.modules():
        if hasattr(module, "init_incremental_state"):
            module.init_incremental_state()
    return exported


def count_step_ops(entry, task, device):
    """Aten ops of one training step and one decoding step of the entry's model
    (:mod:`slim_fairseq_lab.benchmark.op_count`: a batch of 8 x 32 tokens, Tensor Chains as on
    CUDA in fp16), on the benchmark's device; the model's weights are left as they were."""
    from dataclasses import asdict
    from slim_fairseq_lab.benchmark import op_count
    shape = op_count.OpShape()
    sample = to_device(op_count.op_batch(task, entry.lm, shape), device)
    counts = op_count.step_op_counts(entry.model, entry.criterion, sample, entry.lm, shape)
    entry.model.zero_grad(set_to_none=True)
    entry.ops = {step: asdict(count) for step, count in counts.items()}


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


def attention_flop_formulas():
    """FLOP formulas for torch's fused attention kernels that accept grouped key/value heads.

    A kernel run with ``enable_gqa`` attends every query head, so its FLOPs are those of key and
    value tensors widened to the query's heads. torch 2.11's own formula refuses such shapes
    (an AssertionError that ended the benchmark on CUDA), and no torch release counts the CPU's
    fused kernel, so a CPU count left attention out. Shapes are (batch, heads, length, width).
    """
    from torch.utils import flop_counter

    def widen(query_shape, shape):
        return (shape[0], query_shape[1], *shape[2:])

    def forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(
            query_shape, widen(query_shape, key_shape), widen(query_shape, value_shape))

    def backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_backward_flop_count(
            grad_out_shape, query_shape, widen(query_shape, key_shape), widen(query_shape, value_shape))

    aten = torch.ops.aten
    kernels = ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"]
    formulas = {}
    for name in kernels:
        for op, formula in ((name, forward), (f"{name}_backward", backward)):
            if hasattr(aten, op):
                formulas[getattr(aten, op)] = formula
    return formulas


def count_batch_flops(entry, batches, device, dtype):
    """FLOPs of forward + backward of every batch (the optimizer step is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode
    entry.model.train()
    formulas = attention_flop_formulas()
    for index, sample in enumerate(batches):
        counter = FlopCounterMode(display=False, custom_mapping=formulas)
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
