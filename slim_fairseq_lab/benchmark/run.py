"""One benchmark, step by step: the bundled data's fixed training batches, every model built
through fairseq's parser with the same shape flags, then the measurements of
:mod:`slim_fairseq_lab.benchmark.measure`, interleaved (each repetition visits every model in
turn, so slow drifts of the machine hit every model alike), then the report."""
import contextlib

import torch

from slim_fairseq_lab import launcher, specs
from slim_fairseq_lab.benchmark import measure
from slim_fairseq_lab.benchmark.measure import Entry
from slim_fairseq_lab.benchmark.report import log, median, summarise, write_outputs
from slim_fairseq_lab.paths import PLUGIN_DIR

#: the baseline added for each task: fairseq's own model of the same shape (key: language model)
BASELINES = {False: "transformer", True: "transformer_lm"}


def task_argv(lm, args):
    """The data-bin, task and criterion arguments of the language-model or translation task."""
    corpus = "wikitext" if lm else "ende"
    return [args.lm_data if lm else args.ende_data, *launcher.task_options(corpus, args.tokens_per_sample),
            *launcher.criterion_options(corpus)]


@contextlib.contextmanager
def tensor_chain_one_pass(enabled):
    """With ``enabled``, every Tensor-Chain contraction runs over the whole batch at once (no CPU
    row blocks) inside the block; the setting is restored after it."""
    import slim_fairseq.modules.tensor_chain_policy as tensor_chain_policy
    block_floats = tensor_chain_policy.BLOCK_FLOATS
    if enabled:
        tensor_chain_policy.BLOCK_FLOATS = float("inf")  # row_block() then never splits a batch
    try:
        yield
    finally:
        tensor_chain_policy.BLOCK_FLOATS = block_floats


def load_tasks(kinds, args, device):
    """{lm: task} and {lm: the fixed training batches} for the tasks of the models (``kinds``:
    whether each is a language model); the bundled corpora are binarized when no data is given.
    Every model of a task trains on the same batches."""
    from fairseq import tasks
    from slim_fairseq_lab import data
    if any(lm for lm in kinds) and not args.lm_data:
        args.lm_data = data.binarize_wikitext(nwords=args.lm_vocab)
    if any(not lm for lm in kinds) and not args.ende_data:
        args.ende_data = data.binarize_ende()
    task_of, batches_of = {}, {}
    for lm in kinds:
        base_args = specs.parse_fairseq_args(task_argv(lm, args) + ["--arch", BASELINES[lm], "--cpu"])
        task = tasks.setup_task(base_args)
        task.load_dataset("train")
        task.load_dataset("valid")
        iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=args.max_tokens,
                                           max_positions=task.max_positions(), seed=args.seed,
                                           ignore_invalid_inputs=True)
        epoch = iterator.next_epoch_itr(shuffle=True)
        batches = [measure.to_device(next(epoch), device) for _ in range(args.num_batches)]
        task_of[lm], batches_of[lm] = task, batches
        log(f"{'LM' if lm else 'translation'} batches: "
            f"{[b['ntokens'] for b in batches]} target tokens; dictionary {len(task.target_dictionary)}")
    return task_of, batches_of


def build_entries(model_specs, kinds, task_of, args, device):
    """The baseline of each task, then every model of ``model_specs`` [(label, arch, overrides)],
    built with the same seed and shape flags (a spec's own overrides come last and win)."""
    entries = [Entry(f"{BASELINES[lm]}", BASELINES[lm], [], lm, baseline=True) for lm in kinds]
    entries += [Entry(label, arch, overrides, specs.is_language_model(arch)) for label, arch, overrides in model_specs]
    for e in entries:
        argv = task_argv(e.lm, args) + ["--arch", e.arch, "--user-dir", PLUGIN_DIR]
        argv += ["--cpu"] if device.type == "cpu" else []
        argv += specs.shape_overrides(e.arch, e.lm, args.dim, args.layers, args.heads, args.ffn) + e.overrides
        model_args = specs.parse_fairseq_args(argv)
        torch.manual_seed(args.seed)
        e.model = task_of[e.lm].build_model(model_args).to(device)
        e.criterion = task_of[e.lm].build_criterion(model_args)
        e.params, e.non_embedding = measure.count_parameters(e.model)
        log(f"built {e.label}: {e.params:,} params ({e.non_embedding:,} non-embedding), "
            f"{len(measure.tc_linears(e.model))} TC linears")
    return entries


def count_ops(entries, task_of, args, device):
    """Aten ops per training step and per decoding step of every model (before anything else
    changes its weights or dtype)."""
    for e in entries:
        measure.count_step_ops(e, task_of[e.lm], device)
        log(f"{e.label}: {e.ops['train']['top']:,.0f} ops per training step, "
            f"{e.ops['decode']['top']:,.1f} per decoding step")


def measure_step_costs(entries, batches_of, args, device, dtype):
    """The one-off measurements of a training step (not timed): FLOPs per batch and peak memory
    (with --memory-breakdown, the activations each module keeps)."""
    for e in entries:
        if not args.memory_only:
            measure.count_batch_flops(e, batches_of[e.lm], device, dtype)
        if args.no_memory:
            measure.warm_up(e, batches_of[e.lm][0], device, dtype)
        else:
            e.peak_bytes = measure.measure_peak_memory(e, batches_of[e.lm][0], device, dtype)
            if args.memory_breakdown:
                e.saved_by_module = measure.saved_activations_by_module(e, batches_of[e.lm][0], device, dtype)
        parts = [] if args.memory_only else [f"{e.batch_flops[0] / 1e9:.1f} GFLOP per batch-0 step"]
        parts += [] if e.peak_bytes is None else [f"peak memory {e.peak_bytes / 2 ** 20:.0f} MiB"]
        log(f"{e.label}: " + ", ".join(parts))


def time_training(entries, batches_of, args, device, dtype):
    """Training throughput, --repeats interleaved repetitions of --steps steps per model."""
    for rep in range(args.repeats):
        for e in entries:
            tps, gflops = measure.train_repetition(e, batches_of[e.lm], args.steps, device, dtype)
            e.train_tps.append(tps)
            e.train_gflops.append(gflops)
            log(f"train rep {rep + 1}/{args.repeats} {e.label}: {tps:,.0f} tok/s, {gflops:.1f} GFLOP/s")


def time_training_by_part(entries, batches_of, args, device, dtype):
    """One training step's time by part, interleaved, --repeats times (after the timed steps,
    whose numbers the hooks would slow)."""
    for rep in range(args.repeats):
        for e in entries:
            e.time_by_part.append(measure.time_by_part(e, batches_of[e.lm][0], device, dtype))
        log(f"time breakdown rep {rep + 1}/{args.repeats}: " + "; ".join(
            f"{e.label} {1e3 * sum(e.time_by_part[-1]['step'].values()):,.0f} ms" for e in entries))


def time_generation(entries, kinds, task_of, args, device, dtype):
    """Generation throughput at every batch size and beam, interleaved; with --dense-export, each
    model with Tensor-Chain linears also as its dense export (inserted after it in ``entries``)."""
    gen_entries = []
    for e in entries:
        e.optimizer = None
        e.model.zero_grad(set_to_none=True)
        e.gen_model = e.model.eval()
        if dtype != torch.float32:
            e.gen_model = e.gen_model.to(dtype)
        gen_entries.append(e)
        if args.dense_export and measure.tc_linears(e.model):
            x = Entry(f"{e.label} +dense", e.arch, e.overrides, e.lm, export_of=e.label)
            x.gen_model = measure.export_dense(e.gen_model).eval()
            x.params, x.non_embedding = measure.count_parameters(x.gen_model)
            gen_entries.append(x)
    for x in gen_entries:
        if x not in entries:
            entries.insert(entries.index(next(e for e in entries if e.label == x.export_of)) + 1, x)
    samples = {(lm, b): measure.generation_sample(task_of[lm], lm, b, device)
               for lm in kinds for b in args.batch_sizes}
    first = (args.batch_sizes[0], args.beams[0])
    with torch.no_grad():
        # warm-up of every model at every batch size and beam before the timed repetitions:
        # first calls of a shape (allocations, kernel choice, weights built once) are not timed
        for e in gen_entries:
            for b in args.batch_sizes:
                for k in args.beams:
                    measure.generation_repetition(task_of[e.lm], e, samples[(e.lm, b)], k,
                                                  min(4, args.gen_len), device)
        for rep in range(args.repeats):
            for b in args.batch_sizes:
                for k in args.beams:
                    for e in gen_entries:
                        tps = measure.generation_repetition(task_of[e.lm], e, samples[(e.lm, b)], k,
                                                            args.gen_len, device)
                        e.gen.setdefault((b, k), []).append(tps)
            log(f"generation rep {rep + 1}/{args.repeats}: "
                + "; ".join(f"{e.label} {median(e.gen[first]):,.0f}" for e in gen_entries)
                + f" tok/s at b{first[0]} beam{first[1]}")


def run_benchmark(args, command_line, threads, device, dtype, out_dir):
    """Every measurement the options ask for, in order; writes the outputs and returns the rows."""
    model_specs = [specs.parse_model_spec(s) for s in args.model]
    kinds = sorted({specs.is_language_model(arch) for _, arch, _ in model_specs})
    task_of, batches_of = load_tasks(kinds, args, device)
    entries = build_entries(model_specs, kinds, task_of, args, device)
    if not args.no_op_counts:
        count_ops(entries, task_of, args, device)

    peaks = {"device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({threads} threads)"}
    gemm = args.gemm_size = args.gemm_size or measure.default_gemm_size(cuda=device.type == "cuda")
    peaks["matmul_gflops"] = None if args.memory_only else measure.measure_matmul_peak(device, dtype, gemm)
    if not args.memory_only:
        log(f"matmul peak ({gemm}x{gemm}, {args.dtype}): {peaks['matmul_gflops']:.1f} GFLOP/s")
    if not args.no_training:
        measure_step_costs(entries, batches_of, args, device, dtype)
        if not args.memory_only:
            time_training(entries, batches_of, args, device, dtype)
    if args.time_breakdown:
        time_training_by_part(entries, batches_of, args, device, dtype)
    if not args.no_generation:
        time_generation(entries, kinds, task_of, args, device, dtype)
    # the peak again at the end, keeping the better one: a single early reading can catch the
    # machine in a slow moment and would inflate every "% of peak"
    if not args.memory_only:
        peaks["matmul_gflops"] = max(peaks["matmul_gflops"], measure.measure_matmul_peak(device, dtype, gemm))
        log(f"matmul peak, best of both readings: {peaks['matmul_gflops']:.1f} GFLOP/s")
    rows = summarise(entries, args, peaks)
    meta = {"argv": command_line, "gemm_size": gemm, "dim": args.dim,
            "layers": args.layers, "heads": args.heads, "ffn": args.ffn, "dtype": args.dtype,
            "threads": threads, "torch": torch.__version__, **peaks}
    return write_outputs(out_dir, meta, rows, args, peaks)
