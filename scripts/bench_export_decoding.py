#!/usr/bin/env python3
"""Decoding speed of a model in fairseq and in transformers (its export by
slim-fairseq-export-hf), with the tokens of the two compared
(slim_fairseq_lab/benchmark/export_decoding.py). Prints JSON.

A language model: batch-1 greedy decoding of one prompt, also in CTranslate2 with --ct2-dir.
A translation model: the valid split's first sentences at each --batch-sizes and --beams, every
hypothesis held to --tokens tokens. Time on an idle machine; e.g.::

    slim-fairseq-export-hf checkpoints/stlm/checkpoint_best.pt data-bin/mylm hf/stlm
    OMP_NUM_THREADS=1 python scripts/bench_export_decoding.py checkpoints/stlm/checkpoint_best.pt \\
        data-bin/mylm hf/stlm --ct2-dir hf/stlm-ct2 --tokens 64 --repeats 5
    OMP_NUM_THREADS=1 python scripts/bench_export_decoding.py checkpoints/anthe/checkpoint_best.pt \\
        data-bin/mydata hf/anthe --batch-sizes 1,64 --beams 1,5 --tokens 20
"""
import argparse
import json
import sys

from slim_fairseq_lab import command
from slim_fairseq_lab.paths import plugin_module

SIZES = "whole numbers >= 1, comma-separated (e.g. 1,64)"


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
    parser.add_argument("--batch-sizes", default="1",
                        help="a translation model's batch sizes, comma-separated (default 1)")
    parser.add_argument("--beams", default="1",
                        help="a translation model's beam sizes, comma-separated (default 1)")
    args = parser.parse_args(argv)
    from slim_fairseq.export_hf.cli import interruptible
    return interruptible(parser.prog, lambda: _run(parser, args), "nothing measured")


def _sizes(flag, value):
    """The whole numbers >= 1 of a comma-separated flag, or its refusal's text."""
    errors = plugin_module("option_errors")
    try:
        return [int(errors.check_kind(flag, word, "count", allowed=SIZES))
                for word in value.split(",")], None
    except errors.OptionError as error:
        return None, str(error)


def _run(parser, args):
    from slim_fairseq_lab.benchmark.export_decoding import (ct2_refusal, is_translation, measure,
                                                            measure_translation, tokens_refusal)
    if is_translation(args.hf_dir):
        batches, refusal = _sizes("--batch-sizes", args.batch_sizes)
        beams, beam_refusal = _sizes("--beams", args.beams)
        refusal = (refusal or beam_refusal or (args.ct2_dir and f"--ct2-dir={args.ct2_dir}: a "
                   f"translation model; allowed: --ct2-dir with a language model's export"))
        if refusal:
            print(f"{parser.prog}: error: {refusal}", file=sys.stderr)
            raise SystemExit(2)
        import slim_fairseq  # noqa: F401  (registers the plugin's models with fairseq)
        rows = measure_translation(args.checkpoint, args.data, args.hf_dir, batches, beams,
                                   tokens=args.tokens, repeats=args.repeats)
        print(json.dumps(rows, indent=1))
        return 0 if all(row["same_tokens"] == 1 for row in rows if row["beam"] == 1) else 1
    refusal = next((f"{flag}={value}: a language model decodes one prompt; allowed: 1"
                    for flag, value in (("--batch-sizes", args.batch_sizes),
                                        ("--beams", args.beams)) if value != "1"), None)
    if refusal:
        print(f"{parser.prog}: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)
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
