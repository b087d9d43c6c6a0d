#!/usr/bin/env bash
# Anthe-shaped vs fairseq-transformer-shaped translation on the bundled en-de corpus (CPU).
#
# Both models have the same shape shrunk for a CPU (d 256, f 1024, 4 heads, 3+3 layers),
# train for the same number of updates with the same seed, optimizer and batch size, and are
# evaluated the same way:
#   - anthe:       slim_transformer arch anthe_base (separate embeddings + output bias, GLU,
#                  qgv / cross kgv, H-SoftPOS l=2, TC ff .005 + patt .07) at that shape;
#   - transformer: fairseq's own `transformer` at that shape with --share-all-embeddings.
# Reported per model: parameters, valid loss / nll / PPL (fairseq's masked per-token
# perplexity, 2^nll) after the last update, training tokens/s (fairseq's wps), and test BLEU:
# fairseq-generate's BLEU4 of the model's checkpoint_last.pt (beam 5, BPE removed), fairseq's
# own scorer on Moses tokens (-a), no compound splitting: a tokenized BLEU, not sacreBLEU. A
# note under the table says so and names each checkpoint with its update.
#
# usage: anthe_vs_transformer.sh [OUT_DIR] [--max-update N] [--max-tokens N] [--warmup N]
#            [--seed S] [--lr LR] [--anthe-lr LR] [--sequential] [--eval-only] [--dry-run]
#        Each model trains at the better of the rates measured at this shape (docs/TRAINING.md,
#        "Learning rate"): the transformer at 1e-3 (it broke down at 3e-3), Anthe at 3e-3 (far
#        better than at 1e-3). --lr sets both models' Adam rate, --anthe-lr Anthe's alone (it
#        wins over --lr).
#        --eval-only reuses the checkpoints of an earlier run (translate + report only).
#        --dry-run prints the two fairseq-train commands and runs nothing.
# env:   THREADS (per model, default 1); the two runs go in parallel unless --sequential.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

OUT="$REPO_ROOT/build/anthe_vs_transformer"
MAX_UPDATE=600
MAX_TOKENS=4096
WARMUP=200
LOG_INTERVAL=50
SEED=1
PARALLEL=1
EVAL_ONLY=0
DRY_RUN=0
LR=
ANTHE_LR=
THREADS="${THREADS:-1}"
OPTIONS=(
    "@positional OUT"
    "--max-update value MAX_UPDATE"
    "--max-tokens value MAX_TOKENS"
    "--warmup value WARMUP"
    "--seed value SEED"
    "--lr value LR"
    "--anthe-lr value ANTHE_LR"
    "--dry-run flag DRY_RUN"
    "--sequential set PARALLEL 0"
    "--eval-only flag EVAL_ONLY"
)
parse_options "${OPTIONS[@]}" -- "$@"
for option in max-update max-tokens warmup seed; do
    variable="$(tr a-z- A-Z_ <<<"$option")"
    whole_number "--$option" "${!variable}"
done

# --lr alone sets both rates; without it each model gets its own measured default
[[ -n "$LR" ]] && ANTHE_LR="${ANTHE_LR:-$LR}"
LR="${LR:-1e-3}"
ANTHE_LR="${ANTHE_LR:-3e-3}"
SHAPE=(--encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3
       --encoder-attention-heads 4 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024
       --decoder-layers 3 --decoder-attention-heads 4 --dropout 0.1)
GENERATE_ARGS=()
RUN_NOTE="lr: $ANTHE_LR (anthe) / $LR (transformer)"
compare_on_bundled_ende \
    anthe --user-dir "$(slim_user_dir)" --arch anthe_base --lr "$ANTHE_LR" -- \
    transformer --arch transformer --share-all-embeddings --lr "$LR"
