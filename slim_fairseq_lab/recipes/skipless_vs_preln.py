"""
Skipless LM vs a pre-LN transformer LM of the same shape on the bundled WikiText-2.

Runs (same data, updates, batches, optimiser and seed; d 128, 4 layers, 4 heads, FFN 512,
untied embeddings):
  skipless      skipless_lm: no residuals, no norms, shaped attention, RoPE
  skipless_noqp skipless_lm --removed-weights q: the reduced form trained directly (no Q, no P)
  preln         fairseq's transformer_lm --decoder-normalize-before (residuals + LayerNorm,
                sinusoidal positions; input/output dims set to d, transformer_lm's default is 512)
Prints parameters and the valid perplexity of each (fairseq's masked per-token perplexity).

Usage: bash examples/lm/skipless_vs_preln.sh [OUT_DIR]
Environment: UPDATES (400), BATCH (16 sequences), TOKENS (64 per sequence), LR (2e-3),
  SEED (1), JOBS (parallel runs, 2), NWORDS (vocabulary cap, 8000), RUNS ("skipless skipless_noqp preln").
  DRY_RUN=1 prints the fairseq-train commands and trains nothing.
"""
import os
import sys

from slim_fairseq_lab.paths import REPO_ROOT
from slim_fairseq_lab.recipes import cli
from slim_fairseq_lab.recipes.comparisons import compare_lms_on_wikitext2, lm_settings

PROG = "skipless_vs_preln.sh"
SHAPE = ("--decoder-embed-dim 128 --decoder-layers 4 --decoder-attention-heads 4 --decoder-ffn-embed-dim 512 "
         "--dropout 0.0")
RUNS = {
    "skipless": f"--arch skipless_lm {SHAPE}",
    "skipless_noqp": f"--arch skipless_lm --removed-weights q {SHAPE}",
    "preln": f"--arch transformer_lm --decoder-normalize-before --decoder-input-dim 128 --decoder-output-dim 128 {SHAPE}",
}


def compare(argv):
    args, _ = cli.split(cli.Parser(PROG), argv, ("OUT",))
    settings = lm_settings(args.out or os.path.join(REPO_ROOT, "build", "skipless_vs_preln"), RUNS,
                           "skipless skipless_noqp preln", updates=400, batch=16, tokens=64, lr="2e-3", seed=1, jobs=2,
                           nwords=8000)
    compare_lms_on_wikitext2(settings)
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, compare, argv)


if __name__ == "__main__":
    sys.exit(main())
