#!/usr/bin/env bash
# Train a Subformer / sandwich translation model (arXiv:2101.00234, docs/TECHNIQUES.md#subformer; archs subformer_small,
# subformer_base, subformer_mid, subformer_large, sandwich_base, sandwich_big, and
# subformer_enro_small / subformer_enro_base for WMT16 en-ro).
#
# Training setup of the Subformer paper (docs/TECHNIQUES.md#subformer-training-setup): BERT-style initialisation N(0, 0.02),
# Adam (0.9, 0.999), eps 1e-6, weight decay 0.01, label smoothing 0.1, learning rate 5e-4 with
# inverse-square-root decay after 10K warm-up updates, 128K tokens per update. The number of
# updates is not given there: 100K by default (--max-update N to change).
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
    --max-update 100000 --clip-norm 0.0
    --skip-invalid-size-inputs-valid-test
)
SMOKE_ARGS=(--warmup-updates 1)
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
train_main "$@"
