"""
Train a skipless language model (docs/TECHNIQUES.md#skipless-transformers; archs skipless_lm, skipless_lm_parallel_noqp,
and the Mistral-7B / Pythia-6.9B shaped presets skipless_lm_mistral_7b / _pythia_6_9b):
no residuals, no normalisation, He & Hofmann's shaped attention.

The papers give no single recipe for these small models; this one uses Adam (0.9, 0.95),
eps 1e-8, weight decay 0.1, peak lr 1e-3 with 2K warm-up and cosine decay, clip-norm 1.0,
512-token blocks, ~0.25M tokens per update, 50K updates.

Paper vs recipe: every setting above is this recipe's own choice (--paper is refused).

usage: train-skipless.sh DATA_BIN [--arch skipless_lm] [--gpus N] [--nodes M ...]
           [--fp16] [--cpu-smoke] [fairseq-train options]
"""
import sys

from slim_fairseq_lab.recipes import training
from slim_fairseq_lab.recipes.training import TrainRecipe

RECIPE = TrainRecipe(
    prog="train-skipless.sh", doc=__doc__, arch="skipless_lm", max_tokens=8192, tokens_per_update=262144,
    task_args=("--task", "language_modeling", "--tokens-per-sample", "512", "--sample-break-mode", "none"),
    hparams=("--optimizer", "adam", "--adam-betas", "(0.9, 0.95)", "--adam-eps", "1e-8", "--weight-decay", "0.1",
             "--lr", "1e-3", "--lr-scheduler", "cosine", "--warmup-updates", "2000", "--warmup-init-lr", "1e-07",
             "--min-lr", "1e-5", "--max-update", "50000", "--clip-norm", "1.0",
             "--criterion", "cross_entropy", "--skip-invalid-size-inputs-valid-test"),
    smoke_args=("--tokens-per-sample", "64", "--warmup-updates", "1"),
    paper_none="the skipless papers give no training recipe for these models")


def main(argv=None):
    return training.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
