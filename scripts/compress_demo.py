#!/usr/bin/env python3
"""Compress a trained fairseq transformer on the bundled en-de into Tensor Chains, fine-tune it,
and compare it with its controls.

  1. train fairseq's transformer with fairseq-train (the training settings of scripts/quality.py);
  2. for every ratio R of --ratios: --tc-ff R --tc-patt R by TT-SVD (slim_fairseq/compression.py),
     then a short fine-tune (fairseq-train --restore-file <compressed> --reset-optimizer ...);
  3. as controls, the original trained for the same extra updates with the same schedule, and
     (--scratch-ratios) the Tensor-Chain model trained from scratch for all the updates;
  4. every checkpoint: valid perplexity (fairseq-validate: the training criterion's per-token
     NLL, base 2) and test BLEU (fairseq-generate beam --beam, detokenized sacreBLEU), the
     evaluation of scripts/quality.py.

Output (--out, default results/<name>): results.json and table.md; finished steps are reused on
a rerun. Example (the run in docs/RESULTS.md):

    OMP_NUM_THREADS=1 python scripts/compress_demo.py --name compress_d128 --dim 128 --layers 3 \\
        --heads 4 --max-update 600 --finetune-updates 150 --ratios 0.5,0.25,0.1 --scratch-ratios 0.25
"""
import argparse
import copy
import json
import os
import sys

from slim_fairseq_lab import command, fairseq_logs, launcher, specs
from slim_fairseq_lab.benchmark import EMBEDDING_PARTS
from slim_fairseq_lab.paths import REPO_ROOT, output_dir
from slim_fairseq_lab.study import options

RESTART = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader", "--reset-meters"]


def log(message):
    print(f"[compress_demo] {message}", flush=True)


def checkpoint_params(path):
    """(all parameters, non-embedding parameters) of a checkpoint; tied tensors counted once."""
    import torch
    state = torch.load(path, weights_only=True)["model"]
    seen, total, body = set(), 0, 0
    for key, tensor in state.items():
        if not torch.is_tensor(tensor) or not tensor.is_floating_point() or key.endswith(
                ("_float_tensor", ".version")):  # (the record of the data is no tensor)
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
    """Valid perplexity of a fairseq-validate log (its last ``valid`` record)."""
    ppl = fairseq_logs.last_valid_ppl(output)
    if ppl is None:
        raise RuntimeError("no valid perplexity in the fairseq-validate output")
    return ppl


def evaluate(directory, data, bpe_codes, threads, beam=5):
    """Valid PPL and test BLEU of ``directory``/checkpoint_best.pt."""
    path = os.path.join(directory, "checkpoint_best.pt")
    validate = launcher.run_tool("fairseq-validate", [
        data, "--user-dir", launcher.PLUGIN_DIR, "--path", path, "--cpu", *launcher.task_options("ende"),
        "--valid-subset", "valid", "--max-tokens", "4096", "--required-batch-size-multiple", "1"],
        os.path.join(directory, "validate.log"), threads)
    generate = launcher.run_tool(
        "fairseq-generate", launcher.study_generate_argv(data, directory, bpe_codes) + ["--beam", str(beam)],
        os.path.join(directory, "generate.log"), threads)
    total, body = checkpoint_params(path)
    return {"valid_ppl": parse_validate(validate), "test_bleu": fairseq_logs.bleu(generate), "params": total, "body_params": body}


def _ratios(text):
    return [float(x) for x in text.split(",") if x]


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="compress_demo", help="output folder results/<name> when --out is not given")
    p.add_argument("--out", help="output folder (results.json, table.md, runs/)")
    p.add_argument("--dim", type=int, default=128, help="transformer width d (default 128; FFN 4 d)")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each (default 3)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--seed", type=int, default=1, help="training seed of every model (default 1)")
    p.add_argument("--max-update", type=int, default=600, help="updates of the original transformer (default 600)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch (default 2048)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the original transformer (default 1e-3)")
    p.add_argument("--ratios", type=_ratios, default=[0.5, 0.25, 0.1], metavar="R[,R...]",
                   help="--tc-ff = --tc-patt ratios to compress to, in (0, 1] (default 0.5,0.25,0.1)")
    p.add_argument("--scratch-ratios", type=_ratios, default=[], metavar="R[,R...]",
                   help="also train slim_transformer --tc-ff R --tc-patt R from scratch for max-update + "
                        "finetune-updates updates")
    p.add_argument("--finetune-updates", type=int, default=150,
                   help="updates of each fine-tune and of the original's control (default 150)")
    p.add_argument("--finetune-lr", type=float, default=5e-4, help="learning rate of the fine-tunes (default 5e-4)")
    p.add_argument("--eval-subset", type=int, default=300, help="valid/test sentences when binarizing (default 300)")
    p.add_argument("--ende-data", help="en-de data-bin (default: bundled corpus, --eval-subset sentences)")
    p.add_argument("--bpe-codes", help="BPE codes of --ende-data (for detokenized BLEU)")
    p.add_argument("--beam", type=int, default=5, help="beam of the test-set translation (default 5)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                   help="threads of every fairseq tool (default: $OMP_NUM_THREADS or 1)")
    return p


def training_settings(args):
    """scripts/quality.py's settings of the original's training, of the fine-tunes (and the
    original's control), and of the from-scratch runs: the same command lines and evaluation."""
    original = options.get_parser().parse_args([
        "--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads),
        "--max-update", str(args.max_update), "--max-tokens", str(args.max_tokens),
        "--lr", str(args.lr), "--validate-interval", str(max(1, args.max_update // 4)),
        "--threads", str(args.threads)])
    original.ffn = 4 * args.dim
    finetune = copy.copy(original)
    finetune.max_update, finetune.lrs = args.finetune_updates, [args.finetune_lr]
    finetune.validate_interval = max(1, args.finetune_updates // 3)
    finetune.warmup = max(1, args.finetune_updates // 10)
    scratch = copy.copy(original)
    scratch.max_update = args.max_update + args.finetune_updates
    scratch.validate_interval = max(1, scratch.max_update // 4)
    return original, finetune, scratch


def main(argv=None):
    args = get_parser().parse_args(argv)
    if not args.ratios or not all(0.0 < r <= 1.0 for r in args.ratios):
        raise SystemExit(f"compress_demo.py: error: --ratios={args.ratios} is not allowed; "
                         "allowed: comma-separated ratios in (0, 1]")
    command_line = sys.argv if argv is None else ["scripts/compress_demo.py", *argv]
    out_dir = output_dir(args.name, args.out)
    os.makedirs(out_dir, exist_ok=True)
    specs.load_plugin()
    from slim_fairseq.compression import compress_checkpoint
    from slim_fairseq_lab.data import binarize_ende, ende_paths

    if args.ende_data:
        data, codes = args.ende_data, args.bpe_codes
    else:
        data = binarize_ende(eval_subset=args.eval_subset)
        codes = ende_paths(os.path.join(REPO_ROOT, "build", "data"), eval_subset=args.eval_subset)["codes"]
    original_settings, finetune, scratch = training_settings(args)
    results_path = os.path.join(out_dir, "results.json")
    rows = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            rows = {row["label"]: row for row in json.load(f)["rows"]}

    def save():
        with open(results_path, "w") as f:
            json.dump({"argv": command_line, "rows": list(rows.values())}, f, indent=1)

    def step(label, directory, make, **info):
        """Run ``make`` unless its checkpoint exists, evaluate once, record the row."""
        os.makedirs(directory, exist_ok=True)
        if not os.path.exists(os.path.join(directory, "checkpoint_best.pt")):
            log(f"{label}: building")
            make(directory)
        if label not in rows:
            log(f"{label}: evaluating")
            rows[label] = dict(label=label, **info, **evaluate(directory, data, codes, args.threads, args.beam))
            save()
        row = rows[label]
        log(f"{label}: valid ppl {row['valid_ppl']:.2f}, BLEU {row['test_bleu']}, "
            f"{row['params']:,} parameters ({row['body_params']:,} outside the embeddings)")
        return os.path.join(directory, "checkpoint_best.pt")

    def train(arch, overrides, settings):
        return lambda directory: launcher.run_tool(
            "fairseq-train", launcher.study_train_argv("ende", data, arch, overrides, settings, args.seed, directory),
            os.path.join(directory, "train.log"), args.threads)

    runs = os.path.join(out_dir, "runs")
    original = step("transformer", os.path.join(runs, "transformer"),
                    train("transformer", [], original_settings), updates=args.max_update, ratio=None,
                    stage="original")
    step("transformer +ft", os.path.join(runs, "transformer_ft"),
         train("transformer", ["--restore-file", original] + RESTART, finetune),
         updates=args.max_update + args.finetune_updates, ratio=None, stage="original, trained on")
    for ratio in args.ratios:
        def compress(directory, ratio=ratio):
            records, model_flags = compress_checkpoint(
                original, os.path.join(directory, "checkpoint_best.pt"), tc_ff=ratio, tc_patt=ratio,
                data=data, log=log, force=True)  # the demo's own run folder
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
             train("slim_transformer", saved["flags"][2:] + ["--restore-file", compressed] + RESTART, finetune),
             updates=args.max_update + args.finetune_updates, ratio=ratio, stage="compressed, fine-tuned")
    for ratio in args.scratch_ratios:
        step(f"TC {ratio:g} scratch", os.path.join(runs, f"tc{ratio:g}_scratch"),
             train("slim_transformer", ["--tc-ff", str(ratio), "--tc-patt", str(ratio)], scratch),
             updates=scratch.max_update, ratio=ratio, stage="trained from scratch")
    table = markdown(list(rows.values()), args)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table)
    save()
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
    sys.exit(command.run(main))
