#!/usr/bin/env python3
"""Side-by-side speed, memory and size benchmark of slim_fairseq architectures against fairseq's
transformer / transformer_lm of the same shape.

Every model is built through fairseq's own parser with the same shape flags (--dim, --layers,
--heads, --ffn), then measured in one process, interleaved: each repetition visits every model
in turn. Absolute numbers are medians over repetitions; ratios against the baseline are medians
of per-repetition ratios, so slow drifts of the machine hit both sides of each ratio alike.
Measured per model:

  * total and non-embedding parameters (shared tensors counted once; "embedding" = token
    tables, positions, H-SoftPOS / SAFE input and output paths, vocabulary projection);
  * training tokens/s of forward + backward + Adam step on real batches of the bundled data
    (the same batches for every model of a task);
  * peak training memory of one step (CPU: tensor storages tracked with torch's MemTracker;
    CUDA: torch.cuda.max_memory_allocated): parameters, gradients, Adam state, activations;
  * achieved training GFLOP/s (FLOPs counted with torch.utils.flop_counter) and its share of
    the device's matmul peak, measured with a large GEMM in the same dtype;
  * generation tokens/s with fairseq's SequenceGenerator at each batch size and beam, every
    hypothesis forced to exactly --gen-len new tokens; translation sources are the first valid
    sentences, language models start from the end-of-sentence token;
  * aten ops per training step and per decoding step, counted with torch.profiler on a batch of
    8 x 32 tokens (slim_fairseq_lab/benchmark/op_count.py): the CPU's view of kernel launches,
    which bound small models on a GPU.

Every model is warmed up (one training step, one generation at every batch size and beam)
before the timed repetitions; CUDA timings are synchronised.

--dense-export adds, for every model with Tensor-Chain linears, a generation-only variant whose
TC layers are exported with TensorChainLinear.to_dense(). --memory-breakdown and
--time-breakdown take one training step apart by module.

Output (--out, default results/<name>): results.json, table.md (ratios against the baseline of
the same task, absolute numbers) and ratios.png / throughput.png. --report-only rewrites them
from an earlier run's results.json; --no-training measures generation only; --memory-only the
peak training memory only.

Example (CPU, 2 threads):

    OMP_NUM_THREADS=2 python scripts/benchmark.py --name d512 --dim 512 --layers 6 --heads 8 \\
        --model anthe_base --model "glu=slim_transformer --ffn-glu" --model sandwich_base \\
        --dense-export

A --model spec is '[LABEL=]ARCH [fairseq overrides...]'; the shape flags come first, so a spec's
own overrides win. The library behind this command is slim_fairseq_lab.benchmark.
"""
import argparse
import os
import sys

from slim_fairseq_lab import command, specs
from slim_fairseq_lab.benchmark import DTYPE_NAMES
from slim_fairseq_lab.paths import output_dir


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], metavar="MODEL",
                   help="'[LABEL=]ARCH [overrides...]' (repeatable); the baseline is added automatically")
    p.add_argument("--name", default="benchmark", help="results/<name> when --out is not given")
    p.add_argument("--out", help="output directory")
    p.add_argument("--dim", type=int, default=512, help="model width d (default 512)")
    p.add_argument("--layers", type=int, default=6, help="layers, encoder and decoder each (default 6)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    p.add_argument("--ffn", type=int, help="FFN width (default 4 d)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when available, else cpu")
    p.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="fp32",
                   help="fp32, or bf16/fp16 (autocast in training, model cast for generation)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: $OMP_NUM_THREADS or 2)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per training batch")
    p.add_argument("--num-batches", type=int, default=3, help="distinct training batches, cycled")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per repetition")
    p.add_argument("--repeats", type=int,
                   help="interleaved repetitions (median; default 5 on CUDA, 3 on the CPU), each after "
                        "one untimed warm-up of every model and generation setting")
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
    p.add_argument("--no-generation", action="store_true", help="skip generation speed (training only)")
    p.add_argument("--report-only", action="store_true",
                   help="re-write table.md and the plots from <out>/results.json (no measuring)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    p.add_argument("--memory-breakdown", action="store_true",
                   help="also list the activations each module keeps for backward (table.md)")
    p.add_argument("--time-breakdown", action="store_true",
                   help="also time one training forward + backward by part (attention, feed-forward, "
                        "embeddings, output projection, rest), --repeats times (table.md)")
    p.add_argument("--no-op-counts", action="store_true",
                   help="skip the aten ops per training and decoding step (a batch of 8 x 32 tokens, "
                        "torch.profiler; a proxy for kernel launches)")
    p.add_argument("--tc-one-pass", action="store_true",
                   help="run every Tensor-Chain contraction over the whole batch at once, without "
                        "the CPU row blocks (to measure what the blocks bring)")
    p.add_argument("--memory-only", action="store_true",
                   help="peak training memory only: no FLOP count, timing, matmul peak or generation "
                        "(tensor storages on the CPU, so it is exact on a busy machine)")
    p.add_argument("--ende-data", help="en-de data-bin (default: binarize the bundled corpus)")
    p.add_argument("--lm-data", help="WikiText-2 data-bin (default: binarize the bundled corpus)")
    p.add_argument("--lm-vocab", type=int, default=8000, help="WikiText-2 vocabulary cap when binarizing")
    p.add_argument("--seed", type=int, default=1, help="seed of the models' weights and of the batches")
    return p


def check_args(args):
    """One-line errors for options that exclude each other; the columns the options leave."""
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


def main(argv=None):
    """Measure (or --report-only) as the command line ``argv`` says; returns the report's rows."""
    # before fairseq's parser edits sys.argv
    command_line = list(sys.argv) if argv is None else ["scripts/benchmark.py", *argv]
    args = get_parser().parse_args(argv)
    from slim_fairseq_lab.benchmark.report import report_only
    if args.report_only:
        return report_only(args)
    check_args(args)
    import torch
    from slim_fairseq_lab.benchmark.measure import DTYPES
    from slim_fairseq_lab.benchmark.run import run_benchmark, tensor_chain_one_pass
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.repeats is None:
        args.repeats = 5 if args.device == "cuda" else 3
    out_dir = output_dir(args.name, args.out)
    os.makedirs(out_dir, exist_ok=True)
    specs.load_plugin()
    with tensor_chain_one_pass(args.tc_one_pass):
        return run_benchmark(args, command_line, threads, torch.device(args.device), DTYPES[args.dtype],
                             out_dir)


if __name__ == "__main__":
    sys.exit(command.run(main))
