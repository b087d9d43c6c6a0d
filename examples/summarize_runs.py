#!/usr/bin/env python3
"""Summary table of the shell comparisons' fairseq runs (examples/*/..._vs_*.sh), one row per
run, read from the runs' logs.

    python examples/summarize_runs.py OUT_DIR NAME [NAME ...]

Each run's logs are OUT_DIR/NAME/train.log and OUT_DIR/NAME/generate.log (translation), or
OUT_DIR/NAME.log (language models, no generation). Columns: parameters, last validation loss /
nll / perplexity, mean training tokens/s (epoch records, else the inner logging records), test
BLEU and generation tokens/s; "?" where a log does not have the value. The library behind it is
slim_fairseq_lab.run_summary.
"""
import argparse

from slim_fairseq_lab.run_summary import summarize


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="the comparison's output folder")
    parser.add_argument("names", nargs="+", help="the runs to list, in order")
    args = parser.parse_args(argv)
    print("\n".join(summarize(args.out_dir, args.names)))


if __name__ == "__main__":
    main()
