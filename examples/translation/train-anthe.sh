#!/usr/bin/env bash
# Train an Anthe translation model (arXiv:2305.10991, docs/TECHNIQUES.md#anthe; archs anthe_base, anthe_base_nopatt and the
# ablation ladder anthe_ablation_*) on a prepared WMT dataset.
#
# Hyperparameters of the Anthe paper: Adam (0.9, 0.98), eps 1e-9, a constant learning rate of
# 3.16e-5, label smoothing 0.1 (dropout 0.1 is in the arch), early stopping once the validation
# loss has not improved for 10 validations (--patience 10). The paper gives no batch size; this
# recipe uses ~25K target tokens per update (fairseq's transformer-base setting).
#
# usage: train-anthe.sh DATA_BIN [--arch anthe_base] [--gpus N] [--nodes M --node-rank R ...]
#            [--fp16|--bf16] [--cpu-smoke] [fairseq-train options]   (--help for all)
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

ARCH=anthe_base
MAX_TOKENS=4096
TOKENS_PER_UPDATE=25000
TASK_ARGS=(--task translation)
HPARAMS=(
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9
    --lr-scheduler fixed --lr 3.16e-5
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --patience 10 --max-epoch 1000
    --skip-invalid-size-inputs-valid-test
)
SMOKE_ARGS=()
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
train_main "$@"
