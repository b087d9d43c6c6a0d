#!/usr/bin/env bash
# End-to-end demo on the bundled real en-de corpus (data/ende, Ding dictionary examples):
#   1. tokenize + joint BPE + fairseq-preprocess --joined-dictionary (scripts/binarize_bundled.py)
#   2. fairseq-train --user-dir slim_fairseq: anthe_base shrunk by CLI overrides, and fairseq's
#      transformer of the same shape as the baseline (CPU, a few minutes each)
#   3. fairseq-generate --beam 5 on the 1,000-pair test set, detokenized sacreBLEU against the
#      raw references; both scores and parameter counts are printed side by side.
# Resumable: a finished stage leaves a marker and is skipped on the next run; an interrupted
# training resumes from its last checkpoint.
#
# Settings (environment variables):
#   DEMO_DIR           build directory                     (default: build/demo)
#   DEMO_TRAIN_MINUTES wall-clock training budget per model (default: 3)
#   DEMO_MAX_UPDATE    update cap per model                 (default: 3000)
#   DEMO_MODELS        models to train, space-separated     (default: "anthe transformer";
#                      "transformer" alone if the anthe_base arch is not available)
#   DEMO_BPE_MERGES    joint BPE merges                     (default: 4000)
#   DEMO_DIM, DEMO_FFN, DEMO_LAYERS, DEMO_HEADS  model shape   (default: 128, 512, 3, 4)
#   PYTHON             interpreter with fairseq installed   (default: .venv/bin/python)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
BIN="$(dirname "$PYTHON")"
DEMO_DIR="${DEMO_DIR:-$REPO/build/demo}"
TRAIN_MINUTES="${DEMO_TRAIN_MINUTES:-3}"
MAX_UPDATE="${DEMO_MAX_UPDATE:-3000}"
BPE_MERGES="${DEMO_BPE_MERGES:-4000}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
USER_DIR="$REPO/slim_fairseq"
START=$(date +%s)

log() { printf '[demo %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }

if [ -z "${DEMO_MODELS:-}" ]; then
  if [ -f "$USER_DIR/models/archs_anthe.py" ] && grep -q '"anthe_base"' "$USER_DIR/models/archs_anthe.py"; then
    DEMO_MODELS="anthe transformer"
  else
    DEMO_MODELS="transformer"
  fi
fi

# Same shape for both models (H-SoftPOS needs the width divisible by 2 * levels = 4). Small on
# purpose: on 2 CPU cores a 128-wide model sees ~3 epochs in 3 minutes, a 256-wide one < 1.
DIM="${DEMO_DIM:-128}"; FFN="${DEMO_FFN:-512}"; LAYERS="${DEMO_LAYERS:-3}"; HEADS="${DEMO_HEADS:-4}"
SHAPE=(--encoder-embed-dim "$DIM" --encoder-ffn-embed-dim "$FFN" --encoder-layers "$LAYERS" --encoder-attention-heads "$HEADS"
       --decoder-embed-dim "$DIM" --decoder-ffn-embed-dim "$FFN" --decoder-layers "$LAYERS" --decoder-attention-heads "$HEADS")
model_args() {
  case "$1" in
    anthe) echo "--arch anthe_base ${SHAPE[*]}" ;;
    transformer) echo "--arch transformer ${SHAPE[*]} --share-all-embeddings" ;;
    *) echo "unknown model '$1' in DEMO_MODELS (allowed: anthe transformer)" >&2; exit 2 ;;
  esac
}

mkdir -p "$DEMO_DIR"
log "python: $PYTHON; threads: $OMP_NUM_THREADS; models: $DEMO_MODELS; shape d=$DIM ffn=$FFN layers=$LAYERS+$LAYERS heads=$HEADS; budget ${TRAIN_MINUTES} min / ${MAX_UPDATE} updates each"

# ---- 1. data -------------------------------------------------------------------------------
log "stage 1: binarize bundled en-de (Moses tokenization, ${BPE_MERGES} joint BPE merges)"
DATA_BIN="$("$PYTHON" - "$DEMO_DIR/data" "$BPE_MERGES" <<'EOF'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
from binarize_bundled import binarize_ende
print(binarize_ende(sys.argv[1], bpe_merges=int(sys.argv[2])))
EOF
)"
BPE_CODES="$(dirname "$DATA_BIN")/bpe/codes"
log "data-bin: $DATA_BIN"

# ---- 2./3. train, translate, score -------------------------------------------------------------
STOP_HOURS="$("$PYTHON" -c "print(${TRAIN_MINUTES} / 60)")"
declare -A BLEU PARAMS UPDATES
for model in $DEMO_MODELS; do
  read -r -a ARGS <<< "$(model_args "$model")"
  SAVE="$DEMO_DIR/${model}_d${DIM}_f${FFN}_l${LAYERS}_h${HEADS}_bpe${BPE_MERGES}"
  mkdir -p "$SAVE"
  if [ -f "$SAVE/train.done" ]; then
    log "stage 2 [$model]: already trained, skipping"
  else
    log "stage 2 [$model]: fairseq-train ${ARGS[*]} (at most ${TRAIN_MINUTES} min)"
    "$BIN/fairseq-train" "$DATA_BIN" --user-dir "$USER_DIR" --cpu --seed 1 \
      --task translation --source-lang en --target-lang de "${ARGS[@]}" \
      --dropout 0.1 --attention-dropout 0.1 --weight-decay 0.0001 \
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
      --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.001 --lr-scheduler inverse_sqrt \
      --warmup-updates 150 --warmup-init-lr 1e-07 --max-tokens 2048 \
      --max-update "$MAX_UPDATE" --stop-time-hours "$STOP_HOURS" \
      --save-dir "$SAVE" --no-epoch-checkpoints --num-workers 0 \
      --log-format simple --log-interval 50 2>&1 \
      | tee "$SAVE/train.log" | grep --line-buffered -E "\| epoch [0-9]+ \| loss|valid on|model params|done training|Stopping training|Error|error" \
      | sed -u "s/^/    /" || true
    [ -f "$SAVE/checkpoint_best.pt" ] || { echo "training $model produced no checkpoint (see $SAVE/train.log)" >&2; exit 1; }
    touch "$SAVE/train.done"
  fi
  PARAMS[$model]="$(grep -o "model params: [0-9,]*" "$SAVE/train.log" | head -n 1 | grep -o "[0-9,]*$" || echo "?")"
  UPDATES[$model]="$(grep -o "num_updates [0-9]*" "$SAVE/train.log" | tail -n 1 | grep -o "[0-9]*$" || echo "?")"

  if [ -f "$SAVE/bleu.txt" ]; then
    log "stage 3 [$model]: already translated, skipping"
  else
    log "stage 3 [$model]: fairseq-generate --beam 5 on the test set"
    "$BIN/fairseq-generate" "$DATA_BIN" --user-dir "$USER_DIR" --cpu --path "$SAVE/checkpoint_best.pt" \
      --task translation --source-lang en --target-lang de --gen-subset test --num-workers 0 \
      --beam 5 --lenpen 1.0 --max-len-a 1.2 --max-len-b 10 --batch-size 128 --required-batch-size-multiple 1 --tokenizer moses --bpe subword_nmt --bpe-codes "$BPE_CODES" \
      > "$SAVE/generate.log" 2> "$SAVE/generate.err" \
      || { tail -n 20 "$SAVE/generate.err" >&2; exit 1; }
    grep '^D-' "$SAVE/generate.log" | sed 's/^D-//' | sort -n -k1,1 | cut -f3 > "$SAVE/hyp.detok.de"
    "$BIN/sacrebleu" "$REPO/data/ende/test.de" -i "$SAVE/hyp.detok.de" -b -w 2 > "$SAVE/bleu.txt"
  fi
  BLEU[$model]="$(cat "$SAVE/bleu.txt")"
  log "[$model] sacreBLEU (detokenized, test, 1000 sentences) = ${BLEU[$model]}"
done

# ---- summary ---------------------------------------------------------------------------------
echo
echo "== bundled en-de (Ding dictionary examples) test set: 1,000 sentences, beam 5, sacreBLEU on detokenized output =="
printf '%-12s %-14s %-10s %s\n' model params updates BLEU
for model in $DEMO_MODELS; do
  printf '%-12s %-14s %-10s %s\n' "$model" "${PARAMS[$model]}" "${UPDATES[$model]}" "${BLEU[$model]}"
done
log "finished in $(( $(date +%s) - START )) s; outputs under $DEMO_DIR"
