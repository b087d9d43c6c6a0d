#!/usr/bin/env python3
"""Batch-1 greedy decoding speed of a language model in fairseq, in transformers (its export by
slim-fairseq-export-hf) and in CTranslate2 (that export converted), on the same prompt; checks
the three give the same tokens (slim_fairseq_lab/benchmark/export_decoding.py). Prints JSON.

Time on an idle machine; e.g.::

    slim-fairseq-export-hf checkpoints/stlm/checkpoint_best.pt data-bin/mylm hf/stlm
    OMP_NUM_THREADS=1 python scripts/bench_export_decoding.py checkpoints/stlm/checkpoint_best.pt \\
        data-bin/mylm hf/stlm --ct2-dir hf/stlm-ct2 --tokens 64 --repeats 5
"""
import argparse
import json
import sys

from slim_fairseq_lab import command


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="the fairseq checkpoint")
    parser.add_argument("data", help="its data-bin (dictionary)")
    parser.add_argument("hf_dir", help="its export (slim-fairseq-export-hf)")
    parser.add_argument("--ct2-dir", help="CTranslate2's conversion of the export (made if missing)")
    parser.add_argument("--prompt", default="the house", help="the prompt (default: the house)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args(argv)
    from slim_fairseq.export_hf.cli import interruptible
    return interruptible(parser.prog, lambda: _run(parser, args), "nothing measured")


def _run(parser, args):
    from slim_fairseq_lab.benchmark.export_decoding import ct2_refusal, measure, tokens_refusal
    refusal = ct2_refusal(args.hf_dir) if args.ct2_dir else None
    if not refusal:
        refusal = tokens_refusal(args.hf_dir, args.prompt, args.tokens)
        refusal = refusal and f"--tokens={args.tokens}: {refusal}"
    else:
        refusal = f"--ct2-dir={args.ct2_dir}: {refusal}"
    if refusal:  # one line, before anything loads
        print(f"{parser.prog}: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)
    import slim_fairseq  # noqa: F401  (registers the plugin's models with fairseq)
    result = measure(args.checkpoint, args.data, args.hf_dir, args.prompt, tokens=args.tokens,
                     repeats=args.repeats, ct2_dir=args.ct2_dir)
    print(json.dumps(result, indent=1))
    return 0 if result["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(command.run(main))
