#!/usr/bin/env python3
"""Tokenize, BPE and binarize the bundled corpora for fairseq; prints each data-bin directory
(en-de BPE codes: <data-bin>/../bpe/codes). Cached: a data-bin built with the same settings is
reused.

en-de (data/ende): Moses tokenization, joint subword-nmt BPE (--bpe-merges), fairseq-preprocess
--joined-dictionary, plus the untokenized valid/test text and recipe.info that
examples/translation/evaluate.sh reads. WikiText-2 (data/wikitext-2): word level, the --nwords
most frequent words (the rest map to <unk>).

    python scripts/binarize_bundled.py [OUT_DIR] [--corpus ende|wikitext|all] [--bpe-merges N]
        [--subset N] [--eval-subset N] [--nwords N] [--workers N] [--force]

The library behind it is slim_fairseq_lab.data (binarize_ende, binarize_wikitext).
"""
import argparse
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.data import (DEFAULT_BUILD_DIR, DEFAULT_NWORDS, STAMP, binarize_ende,  # noqa: F401
                                   binarize_wikitext, ende_paths, wikitext_paths)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", nargs="?", default=DEFAULT_BUILD_DIR,
                        help="build directory (created if missing; default: build/data in the repo)")
    parser.add_argument("--corpus", choices=["ende", "wikitext", "all"], default="all",
                        help="which corpus to binarize (default: all)")
    parser.add_argument("--bpe-merges", type=int, default=8000, help="joint BPE merge operations (en-de)")
    parser.add_argument("--subset", type=int, help="use only the first N training lines")
    parser.add_argument("--eval-subset", type=int, help="en-de: use only the first N valid/test lines")
    parser.add_argument("--nwords", type=int, default=DEFAULT_NWORDS,
                        help=f"wikitext: keep the N most frequent words (--nwordssrc; default "
                             f"{DEFAULT_NWORDS}); 0 = the whole 76.6k vocabulary")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers (default 1)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    if args.corpus in ("ende", "all"):
        print(binarize_ende(args.out_dir, args.subset, args.eval_subset, args.bpe_merges, args.workers, args.force))
    if args.corpus in ("wikitext", "all"):
        print(binarize_wikitext(args.out_dir, args.subset, args.nwords, args.workers, args.force))


if __name__ == "__main__":
    sys.exit(command.run(main))
