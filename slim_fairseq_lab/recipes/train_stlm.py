"""
Train an STLM weight-tying language model (arXiv:2405.14159, docs/TECHNIQUES.md#stlm-weight-tying; archs stlm_tied, stlm_untied,
stlm_ffn_*, stlm_ffn_lora_*, stlm_attn_proj_long) with a context of 512 tokens.

The report does not list its optimiser settings; this recipe uses a GPT-2-small style setup:
Adam (0.9, 0.95), eps 1e-8, weight decay 0.1, peak lr 6e-4 with 2K linear warm-up and cosine
decay to 6e-5 over 100K updates, clip-norm 1.0, ~0.5M tokens per update. The archs assume
the GPT-2 vocabulary (50257): for their parameter counts, use prepare-wikitext-103.sh --gpt2-bpe;
with the word-level WikiText-103 data the vocabulary (and the counts) follow the dictionary.

Paper vs recipe: the archs follow the report; the optimiser and batch are this recipe's own
(--paper is refused: there is nothing to reproduce).

usage: train-stlm.sh DATA_BIN [--arch stlm_tied] [--gpus N] [--nodes M ...] [--fp16]
           [--cpu-smoke] [fairseq-train options]
"""
import sys

from slim_fairseq_lab.recipes import training
from slim_fairseq_lab.recipes.training import TrainRecipe

RECIPE = TrainRecipe(
    prog="train-stlm.sh", doc=__doc__, arch="stlm_tied", max_tokens=8192, tokens_per_update=524288,
    task_args=("--task", "language_modeling", "--tokens-per-sample", "512", "--sample-break-mode", "none"),
    hparams=("--optimizer", "adam", "--adam-betas", "(0.9, 0.95)", "--adam-eps", "1e-8", "--weight-decay", "0.1",
             "--lr", "6e-4", "--lr-scheduler", "cosine", "--warmup-updates", "2000", "--warmup-init-lr", "1e-07",
             "--min-lr", "6e-5", "--max-update", "100000", "--clip-norm", "1.0",
             "--criterion", "cross_entropy", "--skip-invalid-size-inputs-valid-test"),
    smoke_args=("--tokens-per-sample", "64", "--warmup-updates", "1"),
    paper_none="the STLM report lists no optimiser settings")


def main(argv=None):
    return training.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
