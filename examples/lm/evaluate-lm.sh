#!/usr/bin/env bash
# Perplexity of a language model with fairseq-eval-lm (fairseq's masked per-token perplexity;
# see docs/TECHNIQUES.md#metrics-not-comparable-with-fairseq on why the Anthe reference code's padded numbers are not comparable).
#
# CKPT is a checkpoint file or a checkpoint folder (its checkpoint_best.pt, or with --avg N the
# average of its last N checkpoints). Defaults follow fairseq's adaptive-input WikiText-103
# evaluation: blocks of --tokens-per-sample tokens scored with --context-window tokens of
# context (3072 / 2560 for the Subformer LMs; use 512 / 256 for the 512-context STLM models).
#
# usage: evaluate-lm.sh DATA_BIN CKPT [--avg N] [--subset test] [--tokens-per-sample 3072]
#            [--context-window 2560] [--max-tokens 3072] [--cpu] [fairseq-eval-lm options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

DATA=""
CKPT=""
AVG=1
SUBSET="test"
TOKENS_PER_SAMPLE=3072
CONTEXT_WINDOW=2560
MAX_TOKENS=3072
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --avg) require_value "$@"; AVG="$2"; shift 2 ;;
        --subset) require_value "$@"; SUBSET="$2"; shift 2 ;;
        --tokens-per-sample) require_value "$@"; TOKENS_PER_SAMPLE="$2"; shift 2 ;;
        --context-window) require_value "$@"; CONTEXT_WINDOW="$2"; shift 2 ;;
        --max-tokens) require_value "$@"; MAX_TOKENS="$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        -*) EXTRA+=("$1"); shift ;;
        *)
            if [[ -z "$DATA" ]]; then DATA="$1"
            elif [[ -z "$CKPT" ]]; then CKPT="$1"
            else EXTRA+=("$1"); fi
            shift ;;
    esac
done
[[ -n "$DATA" && -n "$CKPT" ]] || { usage; die "DATA_BIN and CKPT are required"; }
need_cmd fairseq-eval-lm
if [[ -d "$CKPT" ]]; then
    if [[ "$AVG" -gt 1 ]]; then
        mode=--num-update-checkpoints
        n_update="$(find "$CKPT" -maxdepth 1 -name 'checkpoint_*_*.pt' | wc -l)"
        [[ "$n_update" -ge "$AVG" ]] || mode=--num-epoch-checkpoints
        mkdir -p "$CKPT/eval"
        "$PYTHON" "$REPO_ROOT/scripts/average_checkpoints.py" --inputs "$CKPT" "$mode" "$AVG" \
            --output "$CKPT/eval/average_last$AVG.pt"
        MODEL="$CKPT/eval/average_last$AVG.pt"
    else
        MODEL="$CKPT/checkpoint_best.pt"
    fi
else
    MODEL="$CKPT"
fi
[[ -f "$MODEL" ]] || die "checkpoint $MODEL not found"

# --softmax-batch: the adaptive softmax scores the vocabulary in chunks; batch multiple 1: with
# the default (8) this fairseq build silently drops the last blocks of the subset
fairseq-eval-lm "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" --task language_modeling \
    --gen-subset "$SUBSET" --sample-break-mode complete --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --context-window "$CONTEXT_WINDOW" --max-tokens "$MAX_TOKENS" --softmax-batch 1024 \
    --required-batch-size-multiple 1 \
    "${EXTRA[@]}" 2>&1 | tee "$MODEL.eval-lm.log"
result="$(grep -oE 'Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+' "$MODEL.eval-lm.log" | tail -n 1)"
[[ -n "$result" ]] || die "fairseq-eval-lm reported no perplexity (see $MODEL.eval-lm.log)"
echo "$SUBSET: $result" | tee "$MODEL.results.txt"
