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
# perplexity, 2^nll) after the last update, test BLEU (beam 5, BPE removed, fairseq's default
# tokenized BLEU on the Moses-tokenized references), and training tokens/s (fairseq's wps).
#
# usage: anthe_vs_transformer.sh [OUT_DIR] [--max-update N] [--max-tokens N] [--warmup N]
#            [--seed S] [--lr LR] [--anthe-lr LR] [--sequential] [--eval-only] [--dry-run]
#        --lr sets both models' Adam rate (default 1e-3), --anthe-lr Anthe's alone (default: --lr):
#        docs/TRAINING.md ("Learning rate") found Anthe gaining more from a higher rate than the
#        transformer does, so compare each at its own best rate, not at one shared low one.
#        --eval-only reuses the checkpoints of an earlier run (translate + report only).
#        --dry-run prints the two fairseq-train commands and runs nothing.
# env:   THREADS (per model, default 1); the two runs go in parallel unless --sequential.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="$REPO/build/anthe_vs_transformer"
MAX_UPDATE=600
MAX_TOKENS=4096
WARMUP=200
SEED=1
PARALLEL=1
EVAL_ONLY=0
DRY_RUN=0
LR=1e-3
ANTHE_LR=
THREADS="${THREADS:-1}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --max-update) MAX_UPDATE="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --warmup) WARMUP="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --lr) LR="$2"; shift 2 ;;
        --anthe-lr) ANTHE_LR="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --sequential) PARALLEL=0; shift ;;
        --eval-only) EVAL_ONLY=1; shift ;;
        -h | --help)
            # shellcheck source=SCRIPTDIR/../common.sh
            . "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
            usage
            exit 0 ;;
        -*) echo "error: unknown option $1" >&2; exit 1 ;;
        *) OUT="$1"; shift ;;
    esac
done
PYTHON="${PYTHON:-python}"
command -v fairseq-train >/dev/null || { echo "error: fairseq-train not on PATH" >&2; exit 1; }
mkdir -p "$OUT"

# 1. data: Moses tokenization + joint BPE (8000 merges) + fairseq-preprocess (cached)
if [[ "$DRY_RUN" == 1 ]]; then
    DATA="$OUT/data/DATA-BIN"
else
    DATA="$("$PYTHON" "$REPO/scripts/binarize_bundled.py" "$OUT/data" --corpus ende | tail -n 1)"
    [[ -f "$DATA/dict.en.txt" ]] || { echo "error: binarization failed ($DATA)" >&2; exit 1; }
fi

SHAPE=(--encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3
       --encoder-attention-heads 4 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024
       --decoder-layers 3 --decoder-attention-heads 4 --dropout 0.1)
COMMON=("$DATA" --task translation --source-lang en --target-lang de --cpu --seed "$SEED"
        --optimizer adam --adam-betas "(0.9, 0.98)" --lr-scheduler inverse_sqrt
        --warmup-updates "$WARMUP" --criterion label_smoothed_cross_entropy --label-smoothing 0.1
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --no-epoch-checkpoints
        --save-interval-updates "$MAX_UPDATE" --keep-interval-updates 1
        --log-format simple --log-interval 50 --num-workers 0 --skip-invalid-size-inputs-valid-test)

train() {  # name, extra fairseq-train arguments...
    local name="$1"; shift
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "$name: fairseq-train ${COMMON[*]} ${SHAPE[*]} $* --save-dir $OUT/$name"
        return
    fi
    if [[ "$EVAL_ONLY" == 0 ]]; then
        rm -rf "${OUT:?}/$name"; mkdir -p "$OUT/$name"
        OMP_NUM_THREADS="$THREADS" fairseq-train "${COMMON[@]}" "${SHAPE[@]}" "$@" \
            --save-dir "$OUT/$name" > "$OUT/$name/train.log" 2>&1
    fi
    # --user-dir also for fairseq's transformer: the plugin allow-lists what fairseq
    # checkpoints hold for torch's weights_only loading
    OMP_NUM_THREADS="$THREADS" fairseq-generate "$DATA" --user-dir "$REPO/slim_fairseq" \
        --task translation --source-lang en \
        --target-lang de --cpu --path "$OUT/$name/checkpoint_last.pt" --gen-subset test \
        --beam 5 --batch-size 64 --required-batch-size-multiple 1 --remove-bpe --quiet > "$OUT/$name/generate.log" 2>&1
}

ANTHE=(--user-dir "$REPO/slim_fairseq" --arch anthe_base --lr "${ANTHE_LR:-$LR}")
TRANSFORMER=(--arch transformer --share-all-embeddings --lr "$LR")
start=$(date +%s)
if [[ "$PARALLEL" == 1 && "$DRY_RUN" == 0 ]]; then
    train anthe "${ANTHE[@]}" & pid_a=$!
    train transformer "${TRANSFORMER[@]}" & pid_t=$!
    wait "$pid_a"; wait "$pid_t"
else
    train anthe "${ANTHE[@]}"
    train transformer "${TRANSFORMER[@]}"
fi
if [[ "$DRY_RUN" == 1 ]]; then exit 0; fi
echo "wall time: $(( $(date +%s) - start )) s (updates: $MAX_UPDATE, max tokens: $MAX_TOKENS," \
     "warmup: $WARMUP, lr: ${ANTHE_LR:-$LR} (anthe) / $LR (transformer), seed: $SEED," \
     "threads per model: $THREADS)"

# 2. report
"$PYTHON" "$REPO/examples/summarize_runs.py" "$OUT" anthe transformer
