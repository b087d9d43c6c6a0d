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
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) OUT="$1"; shift ;;
    esac
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
