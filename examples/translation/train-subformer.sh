#!/usr/bin/env bash
# Train a Subformer / sandwich translation model (archs subformer_small, subformer_base,
# subformer_mid, subformer_large, sandwich_base, sandwich_big, and subformer_enro_small /
# subformer_enro_base for WMT16 en-ro; Reid, Marrese-Taylor and Matsuo 2021, "Subformer",
# arXiv:2101.00234, docs/TECHNIQUES.md#subformer).
#
# Paper vs recipe, per setting:
#   init, optimiser  paper: BERT-style init N(0, 0.02), Adam (0.9, 0.999), eps 1e-6, weight
#                    decay 0.01, label smoothing 0.1, lr 5e-4 inverse-sqrt after 10K warm-up
#                    updates.                                      recipe: the same.
#   batch            paper: 128K tokens per update.  recipe: the same (--max-tokens 4096 per
#                    GPU x update frequency x GPUs, derived from --gpus).
#   updates          paper: at most 250K, early stopping.  recipe: --max-update 250000 and
#                    --patience 10 (validations; the paper gives no patience).
#   dropout          paper: chosen per model among 0.1, 0.2, 0.3 on valid.  recipe: the
#                    presets' 0.1 (fairseq's transformer value); sweep with --dropout 0.2 / 0.3
#                    and keep the best valid loss: one run cannot choose for you.
#   data             paper: WMT14 en-de as Google preprocessed it (fairseq's scaling_nmt
#                    example): prepare-wmt14en2de.sh --paper subformer. WMT16 en-ro:
#                    prepare-wmt16enro.sh.
#   evaluation       paper: best checkpoint (no averaging), beam 5, length penalty tuned on
#                    valid over 0.0-2.0: evaluate.sh --paper.
# The defaults are the paper's wherever it gives a value, so --paper changes nothing here.
#
# usage: train-subformer.sh DATA_BIN [--arch subformer_base] [--gpus N] [--nodes M ...]
#            [--fp16|--bf16] [--cpu-smoke] [fairseq-train options]   (--help for all)
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

ARCH=subformer_base
MAX_TOKENS=4096
TOKENS_PER_UPDATE=128000
TASK_ARGS=(--task translation)
HPARAMS=(
    --bert-init
    --optimizer adam --adam-betas "(0.9, 0.999)" --adam-eps 1e-6 --weight-decay 0.01
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 10000 --warmup-init-lr 1e-7
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-update 250000 --patience 10 --clip-norm 0.0
    --skip-invalid-size-inputs-valid-test
)
SMOKE_ARGS=(--warmup-updates 1)
PAPER_ARGS=()
train_main "$@"
