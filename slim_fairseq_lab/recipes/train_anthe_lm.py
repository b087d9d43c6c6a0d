"""
Train the Anthe language model (the Anthe paper, arXiv:2305.10991, App. C; arch
anthe_lm_gpt2_small, and its baseline slim_lm_gpt2_small: GPT-2 small shape, 12 layers,
width 768, 1024 positions).

Paper vs recipe, per setting (the Anthe paper's later version, "A slim architecture, optimal
for language tasks", App. C):
  model       paper: GPT-2 small shape with the Anthe changes.  recipe: the same archs.
  data        paper: Penn Treebank and WikiText-2.  recipe: the WikiText-103 data of
              prepare-wikitext-103.sh (any language-modelling data-bin works).
  vocabulary  paper: GPT-2's.  recipe: the same on prepare-wikitext-103.sh --gpt2-bpe data;
              on the word-level data the vocabulary follows that dictionary.
  training    paper: 100 epochs, batch size 8, one GPU; it names no optimiser for the LMs.
              --paper: --max-epoch 100 without early stopping (--patience -1), 8 blocks of
              1024 tokens per update (--batch-size 8; the block length is our assumption:
              the model's 1024 positions), one GPU.
              recipe default: 1024-token blocks, ~0.25M tokens per update on every visible
              GPU (a GPT-2-small-sized batch), early stopping with patience 10.
  optimiser   the translation experiments' one (our assumption, for both settings): Adam
              (0.9, 0.98), eps 1e-9, constant lr 3.16e-5.
  metric      fairseq's masked per-token perplexity (evaluate-lm.sh); the paper's code
              averaged over padding positions too.

usage: train-anthe-lm.sh DATA_BIN [--arch anthe_lm_gpt2_small] [--paper] [--gpus N]
           [--nodes M ...] [--fp16] [--cpu-smoke] [fairseq-train options]
"""
import sys

from slim_fairseq_lab.recipes import training
from slim_fairseq_lab.recipes.training import TrainRecipe

RECIPE = TrainRecipe(
    prog="train-anthe-lm.sh", doc=__doc__, arch="anthe_lm_gpt2_small", max_tokens=8192, tokens_per_update=262144,
    task_args=("--task", "language_modeling", "--tokens-per-sample", "1024", "--sample-break-mode", "none"),
    hparams=("--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
             "--lr-scheduler", "fixed", "--lr", "3.16e-5", "--patience", "10", "--max-epoch", "1000",
             "--criterion", "cross_entropy", "--skip-invalid-size-inputs-valid-test"),
    smoke_args=("--tokens-per-sample", "64"),
    paper_args=("--max-epoch", "100", "--patience", "-1"), paper_sentences=8, paper_unit="blocks", paper_gpus=1,
    paper_hardware="a single GPU",
    paper_notes=("data: the paper's LM results are on Penn Treebank and WikiText-2, not on this DATA_BIN's "
                 "corpus",))


def main(argv=None):
    return training.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
