"""
STLM weight tying on the bundled WikiText-2 (docs/TECHNIQUES.md#tying-schemes), shrunk for CPU.

Three runs at a matched parameter budget (~2.06M with the 8000-word vocabulary), same
updates, batches and seed:
  tied    tied in/out baseline            D 6, H 128, F 344
  ffn     FFN tying over all interior     D 6, H 160, F 414   (--tie-ffn 0, wider)
  lora    FFN tying + per-layer LoRA r=8  D 6, H 160, F 352   (--tie-ffn 0 --ffn-lora-rank 8)
8 query / 2 KV heads everywhere. Prints parameters, valid perplexity and training tokens/s.

Usage: bash examples/lm/stlm_tying_wikitext2.sh [OUT_DIR]
Environment: UPDATES (300), BATCH (8 sequences), TOKENS (128 per sequence), LR (2e-3),
  SEED (1), JOBS (parallel runs, 2), NWORDS (vocabulary cap, 8000), RUNS ("tied ffn lora").
  DRY_RUN=1 prints the fairseq-train commands and trains nothing.
"""
import argparse
import dataclasses
import os
import sys
import time

from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.recipes import cli, tools
from slim_fairseq_lab.recipes.comparisons import compare_lms_on_wikitext2, lm_settings

PROG = "stlm_tying_wikitext2.sh"
MODEL = "--arch stlm_tied --decoder-layers 6 --decoder-attention-heads 8 --kv-heads 2"
RUNS = {
    "tied": f"{MODEL} --decoder-embed-dim 128 --decoder-ffn-embed-dim 344",
    "ffn": f"{MODEL} --decoder-embed-dim 160 --decoder-ffn-embed-dim 414 --tie-ffn 0",
    "lora": f"{MODEL} --decoder-embed-dim 160 --decoder-ffn-embed-dim 352 --tie-ffn 0 --ffn-lora-rank 8 "
            "--ffn-lora-alpha 16",
}


def tokens_per_cpu_second(data, tokens, batch, model_args):
    """Training throughput per CPU-second (process time, one thread): less sensitive than the
    wall-clock tokens/s of the table to other processes sharing the machine."""
    import torch
    from fairseq import options, tasks, utils
    torch.set_num_threads(1)
    utils.import_user_module(argparse.Namespace(user_dir=tools.user_dir()))
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        data, "--task", "language_modeling", "--tokens-per-sample", str(tokens), "--cpu", *model_args])
    task = tasks.setup_task(args)
    torch.manual_seed(1)
    model = task.build_model(args).train()
    sample = torch.randint(task.dictionary.nspecial, len(task.dictionary), (batch, tokens))

    def step():
        logits = model(sample)[0]
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), sample.reshape(-1)).backward()

    for _ in range(2):
        step()
    start = time.process_time()
    for _ in range(8):
        step()
    return 8 * sample.numel() / (time.process_time() - start)


def compare(argv):
    args, _ = cli.split(cli.Parser(PROG), argv, ("OUT",))
    settings = lm_settings(args.out or os.path.join(REPO_ROOT, "build", "stlm_tying_wikitext2"), RUNS,
                           "tied ffn lora", updates=300, batch=8, tokens=128, lr="2e-3", seed=1, jobs=2, nwords=8000)
    settings = dataclasses.replace(settings, train_args=("--weight-decay", "0.01"))
    data = compare_lms_on_wikitext2(settings)
    if settings.dry_run:
        return 0
    with open(os.path.join(settings.out, "summary.txt"), "a", encoding="utf-8") as summary:
        for name in settings.chosen:
            rate = tokens_per_cpu_second(data, settings.tokens, settings.batch, RUNS[name].split())
            line = f"{name:6s} train tokens per CPU-second: {rate:,.0f}"
            print(line, flush=True)
            summary.write(line + "\n")
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, compare, argv)


if __name__ == "__main__":
    sys.exit(main())
