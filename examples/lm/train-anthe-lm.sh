#!/usr/bin/env bash
# Train the Anthe language model (paper appendix C; arch anthe_lm_gpt2_small, and its
# baseline slim_lm_gpt2_small: GPT-2 small shape, 12 layers, width 768, 1024 positions).
#
# Optimiser as in the Anthe translation experiments: Adam (0.9, 0.98), eps 1e-9, constant
# learning rate 3.16e-5, early stopping with patience 10; 1024-token blocks, ~0.25M tokens per
# update. The paper's GPT-2 vocabulary needs GPT-2-BPE data (prepare-wikitext-103.sh --gpt2-bpe);
# on word-level WikiText-103 the vocabulary follows the dictionary.
#
# usage: train-anthe-lm.sh DATA_BIN [--arch anthe_lm_gpt2_small] [--gpus N] [--nodes M ...]
#            [--fp16|--bf16] [--cpu-smoke] [fairseq-train options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

ARCH=anthe_lm_gpt2_small
MAX_TOKENS=8192
TOKENS_PER_UPDATE=262144
TASK_ARGS=(--task language_modeling --tokens-per-sample 1024 --sample-break-mode none)
HPARAMS=(
    --optimizer adam --adam-betas "(0.9, 0.98)" --adam-eps 1e-9
    --lr-scheduler fixed --lr 3.16e-5 --patience 10 --max-epoch 1000
    --criterion cross_entropy --skip-invalid-size-inputs-valid-test
)
SMOKE_ARGS=(--tokens-per-sample 64)
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
train_main "$@"
