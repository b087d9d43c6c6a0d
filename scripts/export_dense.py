#!/usr/bin/env python3
"""Export a Tensor-Chain checkpoint as dense: every chain materialised, ``--tc-*`` set to 0.

Reads a ``slim_transformer`` / ``slim_lm`` checkpoint (any arch of them, any ``--tc-ff``,
``--tc-patt``, ``--tc-layer``, ``--tc-emb``, ``--tc-output``) and writes a checkpoint of the
same arch whose options rebuild plain ``nn.Linear`` layers and a plain token table; the
outputs equal the original's up to float rounding. fairseq's tools load it with
``--user-dir slim_fairseq`` (the other techniques of the arch stay as they are); with
``--plain-fairseq`` a model without other techniques (e.g. one written by
compress_checkpoint.py) becomes fairseq's own ``transformer`` / ``transformer_lm`` again.

Usage::

    python scripts/export_dense.py checkpoints/checkpoint_best.pt dense.pt
    python scripts/export_dense.py tc.pt transformer.pt --plain-fairseq
"""
import argparse
import os
import sys

from slim_fairseq_lab import command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint of a slim_transformer / slim_lm arch")
    parser.add_argument("output", help="where to write the dense checkpoint")
    parser.add_argument("--data", help="directory with the dictionaries (default: the checkpoint's "
                                       "data directory)")
    parser.add_argument("--plain-fairseq", action="store_true",
                        help="write fairseq's own transformer / transformer_lm (loads without "
                             "--user-dir); refused when the model uses another technique of the plugin")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing OUTPUT (refused without it)")
    parser.add_argument("--user-dir", default=os.path.join(REPO, "slim_fairseq"),
                        help="path of the slim_fairseq plugin")
    args = parser.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING)
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(args.user_dir)))
    from slim_fairseq.compression import export_dense_checkpoint
    from slim_fairseq.option_errors import OptionError

    def log(message):
        print(f"[export_dense] {message}", file=sys.stderr, flush=True)

    try:
        export_dense_checkpoint(args.checkpoint, args.output, data=args.data,
                                plain_fairseq=args.plain_fairseq, log=log, force=args.force)
    except OptionError as err:
        print(f"export_dense: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
