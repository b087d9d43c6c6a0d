#!/usr/bin/env bash
# Perplexity of a language model with fairseq-eval-lm: fairseq's masked per-token perplexity
# (2^loss, loss in bits per token, padding excluded). The Anthe reference code's perplexities
# averaged over padding positions too; they are not comparable with these.
#
# CKPT is a checkpoint file or a checkpoint folder (its checkpoint_best.pt, or with --avg N the
# average of its last N checkpoints). The subset is cut into blocks of --tokens-per-sample
# tokens; each block scores its last tokens with the --context-window tokens before them as
# context (fairseq's adaptive-input WikiText-103 evaluation: 3072 / 2560).
# Defaults follow the model: --tokens-per-sample is the longest sequence the checkpoint accepts
# (its max_target_positions, else its training tokens_per_sample), --context-window 5/6 of it
# (3072 -> 2560, as fairseq's setting), --max-tokens one block. Blocks hold complete lines
# (--sample-break-mode complete, fairseq's protocol); a line longer than the model's positions
# cannot be scored that way: --sample-break-mode none lets blocks cross line boundaries.
# If fairseq-eval-lm skips blocks (longer than the model's positions) or evaluates no token,
# the script fails instead of printing a perplexity of a part (or none) of the subset.
#
# usage: evaluate-lm.sh DATA_BIN CKPT [--avg N] [--subset test] [--tokens-per-sample N]
#            [--context-window N] [--max-tokens N] [--sample-break-mode complete|none]
#            [--cpu] [fairseq-eval-lm options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA=""
CKPT=""
AVG=1
SUBSET="test"
TOKENS_PER_SAMPLE=""
CONTEXT_WINDOW=""
MAX_TOKENS=""
BREAK_MODE=complete
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --avg) require_value "$@"; AVG="$2"; shift 2 ;;
        --subset) require_value "$@"; SUBSET="$2"; shift 2 ;;
        --tokens-per-sample) require_value "$@"; TOKENS_PER_SAMPLE="$2"; shift 2 ;;
        --context-window) require_value "$@"; CONTEXT_WINDOW="$2"; shift 2 ;;
        --max-tokens) require_value "$@"; MAX_TOKENS="$2"; shift 2 ;;
        --sample-break-mode) require_value "$@"; BREAK_MODE="$2"; shift 2 ;;
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
[[ -d "$DATA" ]] || die "DATA_BIN: $DATA is not a folder"
for value in "$TOKENS_PER_SAMPLE" "$CONTEXT_WINDOW" "$MAX_TOKENS"; do
    [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "--tokens-per-sample/--context-window/--max-tokens: whole numbers, got '$value'"
done
case "$BREAK_MODE" in
    complete | none | eos | complete_doc) ;;
    *) die "--sample-break-mode: allowed complete, none, eos, complete_doc; got '$BREAK_MODE'" ;;
esac
need_cmd fairseq-eval-lm
resolve_checkpoint "$CKPT" "$AVG" "$(if [[ -d "$CKPT" ]]; then echo "$CKPT"; else dirname "$CKPT"; fi)/eval"

POSITIONS="$("$PYTHON" "$REPO_ROOT/scripts/checkpoint_info.py" "$MODEL" positions)" ||
    die "cannot read the model's positions from $MODEL"
TOKENS_PER_SAMPLE="${TOKENS_PER_SAMPLE:-$POSITIONS}"
CONTEXT_WINDOW="${CONTEXT_WINDOW:-$((TOKENS_PER_SAMPLE - TOKENS_PER_SAMPLE / 6))}"
MAX_TOKENS="${MAX_TOKENS:-$TOKENS_PER_SAMPLE}"
[[ "$TOKENS_PER_SAMPLE" -le "$POSITIONS" ]] ||
    die "--tokens-per-sample $TOKENS_PER_SAMPLE: the model accepts at most $POSITIONS positions (use --tokens-per-sample $POSITIONS or less)"
[[ "$CONTEXT_WINDOW" -lt "$TOKENS_PER_SAMPLE" ]] ||
    die "--context-window $CONTEXT_WINDOW must be smaller than --tokens-per-sample $TOKENS_PER_SAMPLE"
[[ "$MAX_TOKENS" -ge "$TOKENS_PER_SAMPLE" ]] ||
    die "--max-tokens $MAX_TOKENS must hold one block of --tokens-per-sample $TOKENS_PER_SAMPLE tokens"
log "evaluating $MODEL on $SUBSET: blocks of $TOKENS_PER_SAMPLE tokens ($BREAK_MODE), context window $CONTEXT_WINDOW (model positions: $POSITIONS)"

# --softmax-batch: the adaptive softmax scores the vocabulary in chunks; batch multiple 1: with
# the default (8) this fairseq build silently drops the last blocks of the subset
LOG="$MODEL.eval-lm.log"
rc=0
fairseq-eval-lm "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" --task language_modeling \
    --gen-subset "$SUBSET" --sample-break-mode "$BREAK_MODE" --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --context-window "$CONTEXT_WINDOW" --max-tokens "$MAX_TOKENS" --softmax-batch 1024 \
    --required-batch-size-multiple 1 \
    "${EXTRA[@]}" >"$LOG" 2>&1 || rc=$?
cat "$LOG"
[[ "$rc" == 0 ]] || die "fairseq-eval-lm failed (exit $rc, see $LOG)"
skipped="$(grep -oE '[0-9,]+ samples have invalid sizes and will be skipped' "$LOG" | head -n 1 | cut -d' ' -f1 || true)"
[[ -z "$skipped" ]] ||
    die "fairseq-eval-lm skipped $skipped blocks longer than the model's positions ($POSITIONS): no perplexity of the whole $SUBSET set; lower --tokens-per-sample (now $TOKENS_PER_SAMPLE) and --context-window (now $CONTEXT_WINDOW), or pass --sample-break-mode none (now $BREAK_MODE) when single lines are longer"
evaluated="$(grep -oE 'Evaluated [0-9,]+ tokens' "$LOG" | tail -n 1 | tr -dc '0-9' || true)"
[[ -n "$evaluated" && "$evaluated" -gt 0 ]] ||
    die "fairseq-eval-lm evaluated no tokens of $SUBSET: check --tokens-per-sample (now $TOKENS_PER_SAMPLE), --context-window (now $CONTEXT_WINDOW) and --max-tokens (now $MAX_TOKENS) (see $LOG)"
result="$(grep -oE 'Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+' "$LOG" | tail -n 1 || true)"
[[ -n "$result" ]] || die "fairseq-eval-lm reported no perplexity (see $LOG)"
echo "$SUBSET: $result ($evaluated tokens; fairseq's masked per-token perplexity)" | tee "$MODEL.results.txt"
