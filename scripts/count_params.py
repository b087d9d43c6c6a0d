#!/usr/bin/env python3
"""Count the parameters of any registered fairseq architecture, the plugin's included, built
through fairseq's own parser with dummy dictionaries of the given sizes.

Reported: the total with every shared parameter counted once, the total counting each use of a
shared parameter, the groups of names that share one tensor, and a per-component breakdown
(embeddings, every encoder/decoder layer, output projection, the rest).

Examples:

    python scripts/count_params.py transformer --vocab 32768 --joined --share-all-embeddings
    python scripts/count_params.py transformer --src-vocab 32000 --tgt-vocab 32000 --json
    python scripts/count_params.py transformer_lm --vocab 50257 --meta -- --decoder-layers 24
    python scripts/count_params.py ARCH --vocab 32000 --exclude-norms-biases -- --some-flag 3

Options this command does not know (and everything after --) are passed on to fairseq as
model/task overrides. --meta builds on the meta device (no memory is allocated), so a
7B-parameter configuration counts in seconds. The library behind it is slim_fairseq_lab.params.
"""
import argparse
import json
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.params import count_params, format_report


def main(argv=None):
    import logging

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # keep the report free of import chatter
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arch", help="a registered architecture (fairseq's or the plugin's)")
    parser.add_argument("--vocab", type=int, help="dictionary size (both sides, or the LM's)")
    parser.add_argument("--src-vocab", type=int, help="source dictionary size (translation)")
    parser.add_argument("--tgt-vocab", type=int, help="target dictionary size (translation)")
    parser.add_argument("--joined", action="store_true", help="one dictionary for source and target")
    parser.add_argument("--task", choices=["translation", "language_modeling"],
                        help="default: translation for encoder-decoder models, else language_modeling")
    parser.add_argument("--meta", action="store_true", help="build on the meta device (no allocation)")
    parser.add_argument("--exclude-norms-biases", action="store_true",
                        help="count weight matrices only: leave out normalisation weights, biases and other "
                             "1-D gains/scalars (the skipless paper's counting, arXiv:2404.12362)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args, unknown = parser.parse_known_args(argv)
    try:
        info = count_params(args.arch, unknown + passthrough, args.vocab, args.src_vocab, args.tgt_vocab,
                            args.joined, args.task, args.meta, args.exclude_norms_biases)
    except ValueError as error:  # the plugin's one-line option errors among them
        if "\n" in str(error):
            raise
        print(f"count_params: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
