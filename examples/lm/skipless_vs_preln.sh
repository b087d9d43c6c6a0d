#!/usr/bin/env bash
# Skipless LM vs a pre-LN transformer LM of the same shape on the bundled WikiText-2 (issue 6).
#
# Runs (same data, updates, batches, optimiser and seed; d 128, 4 layers, 4 heads, FFN 512,
# untied embeddings):
#   skipless      skipless_lm: no residuals, no norms, shaped attention, RoPE
#   skipless_noqp skipless_lm --removed-weights q: the reduced form trained directly (no Q, no P)
#   preln         fairseq's transformer_lm --decoder-normalize-before (residuals + LayerNorm,
#                 sinusoidal positions; input/output dims set to d, transformer_lm's default is 512)
# Prints parameters and the valid perplexity of each (fairseq's masked per-token perplexity).
#
# Usage: bash examples/lm/skipless_vs_preln.sh [OUT_DIR]
# Environment: UPDATES (400), BATCH (16 sequences), TOKENS (64 per sequence), LR (2e-3),
#   SEED (1), JOBS (parallel runs, 2), NWORDS (vocabulary cap, 8000), RUNS ("skipless skipless_noqp preln").
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  # shellcheck source=SCRIPTDIR/../common.sh
  . "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
  usage
  exit 0
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$REPO/build/skipless_vs_preln}
BIN=${FAIRSEQ_BIN:-$REPO/.venv/bin}
PYTHON=${PYTHON:-$BIN/python}
UPDATES=${UPDATES:-400}
BATCH=${BATCH:-16}
TOKENS=${TOKENS:-64}
LR=${LR:-2e-3}
SEED=${SEED:-1}
JOBS=${JOBS:-2}
NWORDS=${NWORDS:-8000}
RUNS=${RUNS:-"skipless skipless_noqp preln"}
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore

mkdir -p "$OUT"
DATA=$("$PYTHON" -c "import sys; sys.path.insert(0, '$REPO/scripts'); \
from binarize_bundled import binarize_wikitext; \
print(binarize_wikitext('$REPO/build/data', nwords=$NWORDS))")

SHAPE="--decoder-embed-dim 128 --decoder-layers 4 --decoder-attention-heads 4 --decoder-ffn-embed-dim 512"

arch_of() {
  case "$1" in
    skipless) echo "--arch skipless_lm" ;;
    skipless_noqp) echo "--arch skipless_lm --removed-weights q" ;;
    preln) echo "--arch transformer_lm --decoder-normalize-before --decoder-input-dim 128 --decoder-output-dim 128" ;;
    *) echo "unknown run $1" >&2; exit 1 ;;
  esac
}

train_one() {
  local name=$1
  # shellcheck disable=SC2046,SC2086
  "$BIN/fairseq-train" "$DATA" --user-dir "$REPO/slim_fairseq" --cpu --num-workers 0 \
    --task language_modeling --tokens-per-sample "$TOKENS" --sample-break-mode none \
    $(arch_of "$name") $SHAPE --dropout 0.0 \
    --batch-size "$BATCH" --max-update "$UPDATES" --seed "$SEED" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates $(( UPDATES >= 10 ? UPDATES / 10 : 1 )) \
    --no-save --log-format simple --log-interval 50 \
    > "$OUT/$name.log" 2>&1
}

echo "data: $DATA  out: $OUT  updates: $UPDATES x $BATCH x $TOKENS tokens  seed: $SEED"
running=0
for name in $RUNS; do
  train_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait

# shellcheck disable=SC2086  # RUNS is a list of names
"$PYTHON" "$REPO/examples/summarize_runs.py" "$OUT" $RUNS | tee "$OUT/summary.txt"
