#!/usr/bin/env python3
"""Compress a trained fairseq transformer on the bundled en-de and fine-tune it (issue 16).

1. train fairseq's ``transformer`` with ``fairseq-train`` (the setup of scripts/quality.py);
2. for every ratio R: ``--tc-ff R --tc-patt R`` by TT-SVD (slim_fairseq/compression.py), then
   a short fine-tune (``fairseq-train --restore-file <compressed> --reset-optimizer ...``);
3. as controls, the original trained for the same extra updates with the same schedule, and
   (``--scratch-ratios``) the Tensor-Chain model trained from scratch for all the updates;
4. every checkpoint: valid perplexity (``fairseq-validate``, the training criterion's per-token
   NLL, base 2) and test BLEU (``fairseq-generate`` beam 5, detokenized sacreBLEU) -- the
   evaluation of scripts/quality.py.

Output (``--out``, default ``results/<name>``): ``results.json`` and ``table.md``; finished
steps are reused on a rerun. Example (the run in docs/RESULTS.md)::

    OMP_NUM_THREADS=1 python scripts/compress_demo.py --name compress_d128 --dim 128 --layers 3 \\
        --heads 4 --max-update 600 --finetune-updates 150 --ratios 0.5,0.25,0.1 --scratch-ratios 0.25
"""
import argparse
import copy
import json
import os
import re
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))

import quality  # noqa: E402
from benchmark import EMBEDDING_PARTS, load_plugin  # noqa: E402


def log(message):
    print(f"[compress_demo] {message}", flush=True)


def checkpoint_params(path):
    """(all parameters, non-embedding parameters) of a checkpoint; tied tensors counted once."""
    import torch
    state = torch.load(path, weights_only=True)["model"]
    seen, total, body = set(), 0, 0
    for key, tensor in state.items():
        if not tensor.is_floating_point() or key.endswith(("_float_tensor", ".version")):
            continue
        ident = (tensor.data_ptr(), tuple(tensor.shape))
        if ident in seen:
            continue
        seen.add(ident)
        total += tensor.numel()
        if not any(part in key for part in EMBEDDING_PARTS):
            body += tensor.numel()
    return total, body


def parse_validate(output):
    """Valid perplexity of a fairseq-validate log (the last ``valid on`` record)."""
    records = re.findall(r"valid on 'valid' subset \| .*?\| ppl ([\d.]+)", output)
    if not records:
        raise RuntimeError("no valid perplexity in the fairseq-validate output")
    return float(records[-1])


def evaluate(directory, data, qargs, bpe_codes, threads, beam=5):
    """Valid PPL and test BLEU of ``directory``/checkpoint_best.pt."""
    path = os.path.join(directory, "checkpoint_best.pt")
    validate = quality.run_tool("fairseq-validate", [
        data, "--user-dir", quality.PLUGIN_DIR, "--path", path, "--cpu", "--task", "translation",
        "--source-lang", "en", "--target-lang", "de", "--valid-subset", "valid",
        "--max-tokens", "4096", "--required-batch-size-multiple", "1"],
        os.path.join(directory, "validate.log"), threads)
    generate = quality.run_tool(
        "fairseq-generate",
        quality.generate_argv(data, directory, qargs, bpe_codes) + ["--beam", str(beam)],
        os.path.join(directory, "generate.log"), threads)
    total, body = checkpoint_params(path)
    return {"valid_ppl": parse_validate(validate), "test_bleu": quality.parse_bleu(generate),
            "params": total, "body_params": body}


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="compress_demo")
    p.add_argument("--out")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-update", type=int, default=600, help="updates of the original transformer")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",") if x],
                   default=[0.5, 0.25, 0.1], help="--tc-ff = --tc-patt ratios, comma-separated")
    p.add_argument("--scratch-ratios", type=lambda s: [float(x) for x in s.split(",") if x],
                   default=[], help="also train slim_transformer --tc-ff R --tc-patt R from scratch "
                                    "for max-update + finetune-updates updates (comma-separated)")
    p.add_argument("--finetune-updates", type=int, default=150)
    p.add_argument("--finetune-lr", type=float, default=5e-4)
    p.add_argument("--eval-subset", type=int, default=300, help="valid/test sentences when binarizing")
    p.add_argument("--ende-data", help="en-de data-bin (default: bundled corpus, --eval-subset sentences)")
    p.add_argument("--bpe-codes", help="BPE codes of --ende-data (for detokenized BLEU)")
    p.add_argument("--beam", type=int, default=5, help="beam of the test-set translation")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    if not args.ratios or not all(0.0 < r <= 1.0 for r in args.ratios):
        raise SystemExit(f"compress_demo.py: error: --ratios={args.ratios} is not allowed; "
                         "allowed: comma-separated ratios in (0, 1]")
    out_dir = args.out or os.path.join(REPO_ROOT, "results", args.name)
    os.makedirs(out_dir, exist_ok=True)
    load_plugin()
    from binarize_bundled import binarize_ende, ende_paths
    from slim_fairseq.compression import compress_checkpoint

    if args.ende_data:
        data, codes = args.ende_data, args.bpe_codes
    else:
        data = binarize_ende(eval_subset=args.eval_subset)
        codes = ende_paths(os.path.join(REPO_ROOT, "build", "data"),
                           eval_subset=args.eval_subset)["codes"]
    # scripts/quality.py's options: same training command line, same evaluation
    qargs = quality.get_parser().parse_args([
        "--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads),
        "--max-update", str(args.max_update), "--max-tokens", str(args.max_tokens),
        "--lr", str(args.lr), "--validate-interval", str(max(1, args.max_update // 4)),
        "--threads", str(args.threads)])
    qargs.ffn = 4 * args.dim
    finetune = copy.copy(qargs)
    finetune.max_update, finetune.lr = args.finetune_updates, args.finetune_lr
    finetune.validate_interval = max(1, args.finetune_updates // 3)
    finetune.warmup = max(1, args.finetune_updates // 10)
    restart = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader", "--reset-meters"]

    results_path = os.path.join(out_dir, "results.json")
    rows = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            rows = {row["label"]: row for row in json.load(f)["rows"]}

    def step(label, directory, make, **info):
        """Run ``make`` unless its checkpoint exists, evaluate once, record the row."""
        os.makedirs(directory, exist_ok=True)
        if not os.path.exists(os.path.join(directory, "checkpoint_best.pt")):
            log(f"{label}: building")
            make(directory)
        if label not in rows:
            log(f"{label}: evaluating")
            rows[label] = dict(label=label, **info, **evaluate(directory, data, qargs, codes,
                                                                args.threads, args.beam))
            with open(results_path, "w") as f:
                json.dump({"argv": sys.argv if argv is None else ["scripts/compress_demo.py", *argv],
                           "rows": list(rows.values())}, f, indent=1)
        row = rows[label]
        log(f"{label}: valid ppl {row['valid_ppl']:.2f}, BLEU {row['test_bleu']}, "
            f"{row['params']:,} parameters ({row['body_params']:,} outside the embeddings)")
        return os.path.join(directory, "checkpoint_best.pt")

    def train(arch, overrides, settings):
        return lambda directory: quality.run_tool(
            "fairseq-train",
            quality.train_argv("ende", data, arch, overrides, settings, args.seed, directory),
            os.path.join(directory, "train.log"), args.threads)

    runs = os.path.join(out_dir, "runs")
    original = step("transformer", os.path.join(runs, "transformer"),
                    train("transformer", [], qargs), updates=args.max_update, ratio=None,
                    stage="original")
    step("transformer +ft", os.path.join(runs, "transformer_ft"),
         train("transformer", ["--restore-file", original] + restart, finetune),
         updates=args.max_update + args.finetune_updates, ratio=None, stage="original, trained on")
    for ratio in args.ratios:
        def compress(directory, ratio=ratio):
            records, model_flags = compress_checkpoint(
                original, os.path.join(directory, "checkpoint_best.pt"), tc_ff=ratio, tc_patt=ratio,
                data=data, log=log)
            with open(os.path.join(directory, "compress.json"), "w") as f:
                json.dump({"records": records, "flags": model_flags}, f, indent=1)

        tag = f"tc{ratio:g}"
        compressed = step(f"TC {ratio:g}", os.path.join(runs, tag), compress,
                          updates=args.max_update, ratio=ratio, stage="compressed")
        with open(os.path.join(runs, tag, "compress.json")) as f:
            saved = json.load(f)
        rows[f"TC {ratio:g}"]["mean_rel_error"] = (
            sum(r["rel_error"] for r in saved["records"]) / len(saved["records"]))
        step(f"TC {ratio:g} +ft", os.path.join(runs, tag + "_ft"),
             train("slim_transformer", saved["flags"][2:] + ["--restore-file", compressed] + restart,
                   finetune),
             updates=args.max_update + args.finetune_updates, ratio=ratio, stage="compressed, fine-tuned")
    scratch = copy.copy(qargs)
    scratch.max_update = args.max_update + args.finetune_updates
    scratch.validate_interval = max(1, scratch.max_update // 4)
    for ratio in args.scratch_ratios:
        step(f"TC {ratio:g} scratch", os.path.join(runs, f"tc{ratio:g}_scratch"),
             train("slim_transformer", ["--tc-ff", str(ratio), "--tc-patt", str(ratio)], scratch),
             updates=scratch.max_update, ratio=ratio, stage="trained from scratch")
    table = markdown(list(rows.values()), args)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    with open(results_path, "w") as f:
        json.dump({"argv": sys.argv if argv is None else ["scripts/compress_demo.py", *argv],
                   "rows": list(rows.values())}, f, indent=1)
    print(table)
    return rows


def markdown(rows, args):
    head = ["model", "stage", "updates", "params", "outside embeddings", "mean rel. error",
            "valid PPL", "test BLEU"]
    lines = [f"d={args.dim}, {args.layers}+{args.layers} layers, {args.heads} heads, ffn={4 * args.dim}; "
             f"{args.max_update} updates of ≤{args.max_tokens} tokens, then {args.finetune_updates} "
             f"(lr {args.finetune_lr}); seed {args.seed}; TC ratio R = --tc-ff R --tc-patt R.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        error = r.get("mean_rel_error")
        lines.append("| " + " | ".join([
            r["label"], r["stage"], str(r["updates"]), f"{r['params']:,}", f"{r['body_params']:,}",
            "—" if error is None else f"{error:.3f}", f"{r['valid_ppl']:.2f}",
            "—" if r["test_bleu"] is None else f"{r['test_bleu']:.2f}"]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
