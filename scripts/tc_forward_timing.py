#!/usr/bin/env python3
"""Time TensorChainLinear's two forward strategies (materialise W then matmul, or contract the
input core by core), forward + backward, for the shapes Anthe uses (docs/TECHNIQUES.md#tensor-chain).

    OMP_NUM_THREADS=1 python scripts/tc_forward_timing.py [--repeats N]

Prints one line per (shape, bond, rows) as it is timed, with both timings, the faster mode and
what forward_mode="auto" picks; the last line counts how often "auto" picked the faster one.
"""
import argparse
import time
import sys

from slim_fairseq_lab import command


def time_mode(module, x, mode, repeats):
    """Best wall time of ``repeats`` forward + backward passes of ``module`` in ``mode``."""
    import torch
    module.forward_mode = mode
    grad = torch.randn(x.shape[0], module.out_features)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        module(x).backward(grad)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case, the best is kept (default 3)")
    args = parser.parse_args(argv)
    import torch
    from slim_fairseq.modules.tensor_chain import TensorChainLinear
    shapes = [(512, 512, 14), (512, 1365, 2), (1365, 512, 2), (512, 2048, 8), (512, 32000, 8),
              (256, 256, 8), (256, 682, 2)]
    agree = total = 0
    print(f"{'in x out':>12} {'bond':>4} {'rows':>6} {'materialise ms':>15} {'contract ms':>12} "
          f"{'faster':>12} {'auto':>12} {'cost ratio':>10}")
    for n_in, n_out, bond in shapes:
        module = TensorChainLinear(n_in, n_out, bond=bond)
        for rows in (1, 8, 64, 512, 4096):
            x = torch.randn(rows, n_in)
            module.forward_mode = "auto"
            auto = "contract" if module.use_contraction(rows) else "materialise"
            ratio = module.cost_ratio(rows)
            t_mat = time_mode(module, x, "materialise", args.repeats)
            t_con = time_mode(module, x, "contract", args.repeats)
            faster = "contract" if t_con < t_mat else "materialise"
            agree += faster == auto
            total += 1
            print(f"{n_in:>5}x{n_out:<6} {bond:>4} {rows:>6} {1e3 * t_mat:>15.3f} "
                  f"{1e3 * t_con:>12.3f} {faster:>12} {auto:>12} {ratio:>10.2f}", flush=True)
    print(f"auto picked the faster mode in {agree}/{total} cases")


if __name__ == "__main__":
    sys.exit(command.run(main))
