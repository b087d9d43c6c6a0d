"""
Train a Subformer / sandwich translation model (archs subformer_small, subformer_base,
subformer_mid, subformer_large, sandwich_base, sandwich_big, and subformer_enro_small /
subformer_enro_base for WMT16 en-ro; Reid, Marrese-Taylor and Matsuo 2021, "Subformer",
arXiv:2101.00234, docs/TECHNIQUES.md#subformer).

Paper vs recipe, per setting (the Subformer paper, App. B):
  init, optimiser  paper: BERT-style init N(0, 0.02), Adam (0.9, 0.999), eps 1e-6, weight
                   decay 0.01, label smoothing 0.1, lr 5e-4 inverse-sqrt after 10K warm-up
                   updates.                                      recipe: the same.
  batch            paper: 128K tokens per update (small/base: 8192 tokens x update-freq 2 on
                   each of 8 GPUs; large: 4096 x 2 on 16).  recipe: the same 128K tokens with
                   --max-tokens 4096 per GPU x an update frequency derived from --gpus.
  hardware         paper: 8 V100 GPUs (16 for the big/large models), mixed precision.
                   recipe: every visible GPU; --paper adds --fp16.
  updates          paper: at most 250K, early stopping.  recipe: --max-update 250000 and
                   --patience 10 (validations; the paper gives no patience).
  dropout          paper: the best of 0.1, 0.2, 0.3 on valid, per model.  recipe: the
                   presets' 0.1 (fairseq's transformer value), with or without --paper: one
                   run cannot sweep. Run --dropout 0.2 and --dropout 0.3 too and keep the best
                   valid loss.
  data             paper: WMT14 en-de as Google preprocessed it (fairseq's scaling_nmt
                   example): prepare-wmt14en2de.sh --paper subformer. WMT16 en-ro:
                   prepare-wmt16enro.sh.
  evaluation       paper: best checkpoint (no averaging), beam 5, length penalty tuned on
                   valid over 0.0-2.0: evaluate.sh --paper.
--paper adds mixed precision and prints what it does not reproduce (the dropout sweep); every
other default already is the paper's value.

usage: train-subformer.sh DATA_BIN [--arch subformer_base] [--paper] [--gpus N]
           [--nodes M ...] [--fp16] [--cpu-smoke] [fairseq-train options]
"""
import sys

from slim_fairseq_lab.recipes import training
from slim_fairseq_lab.recipes.training import TrainRecipe

RECIPE = TrainRecipe(
    prog="train-subformer.sh", doc=__doc__, arch="subformer_base", max_tokens=4096, tokens_per_update=128000,
    task_args=("--task", "translation"),
    hparams=("--bert-init",
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--adam-eps", "1e-6", "--weight-decay", "0.01",
             "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10000", "--warmup-init-lr", "1e-7",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-update", "250000", "--patience", "10", "--clip-norm", "0.0",
             "--skip-invalid-size-inputs-valid-test"),
    smoke_args=("--warmup-updates", "1"),
    paper_hardware="8 V100 GPUs (16 for the big/large models)", paper_precision="--fp16",
    paper_notes=("dropout: the paper took the best of 0.1, 0.2 and 0.3 on valid for each model; --paper "
                 "trains the preset's dropout only (no sweep): run --dropout 0.2 and --dropout 0.3 too and "
                 "keep the best valid loss",))


def main(argv=None):
    return training.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
