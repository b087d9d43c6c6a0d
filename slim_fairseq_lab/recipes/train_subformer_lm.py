"""
Train a Subformer language model on WikiText-103 (docs/TECHNIQUES.md#subformer-presets-and-parameter-counts; archs subformer_lm_wiki103_83m,
subformer_lm_wiki103_96m, subformer_lm_wiki103_122m: adaptive input and tied adaptive softmax
with sandwich sharing).

Hyperparameters: fairseq's adaptive-input WikiText-103 recipe (Baevski & Auli), which the
Subformer paper follows: NAG, lr 1.0 with cosine cycles (period 270K updates, shrink 0.75,
t-mult 2) after 16K warm-up updates from 1e-7, min lr 1e-4, clip-norm 0.1, 286K updates,
3072-token blocks, 3072 tokens x update-freq 3 on each of 8 GPUs (73,728 tokens per update:
the update frequency is adapted to the number of GPUs), adaptive_loss, legacy_ddp.

Paper vs recipe: the Subformer paper (App. B) trains its LMs with this fairseq recipe on 8
GPUs (3072 tokens x update-freq 3 each) with mixed precision: the defaults are its setting
and --paper adds --fp16. Evaluate with evaluate-lm.sh's defaults
(the training block of 3072 tokens, 2560 tokens of context, as fairseq's adaptive-input
evaluation).

usage: train-subformer-lm.sh DATA_BIN [--arch subformer_lm_wiki103_83m] [--paper] [--gpus N]
           [--nodes M ...] [--fp16] [--cpu-smoke] [fairseq-train options]
"""
import sys

from slim_fairseq_lab.recipes import training
from slim_fairseq_lab.recipes.training import TrainRecipe

RECIPE = TrainRecipe(
    prog="train-subformer-lm.sh", doc=__doc__, arch="subformer_lm_wiki103_83m", max_tokens=3072,
    tokens_per_update=73728,
    task_args=("--task", "language_modeling", "--tokens-per-sample", "3072", "--sample-break-mode", "none"),
    hparams=("--optimizer", "nag", "--lr", "1.0", "--lr-scheduler", "cosine", "--t-mult", "2",
             "--lr-period-updates", "270000", "--lr-shrink", "0.75", "--warmup-updates", "16000",
             "--warmup-init-lr", "1e-07", "--stop-min-lr", "1e-09", "--min-lr", "0.0001", "--clip-norm", "0.1",
             "--max-update", "286000", "--criterion", "adaptive_loss", "--seed", "1", "--ddp-backend", "legacy_ddp",
             "--skip-invalid-size-inputs-valid-test"),
    smoke_args=("--tokens-per-sample", "64", "--warmup-updates", "1", "--lr-period-updates", "10"),
    paper_hardware="8 GPUs", paper_precision="--fp16")


def main(argv=None):
    return training.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
