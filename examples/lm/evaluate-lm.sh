#!/usr/bin/env bash
# Perplexity of a language model with fairseq-eval-lm: fairseq's masked per-token perplexity
# (2^loss, loss in bits per token, padding excluded). The Anthe reference code's perplexities
# averaged over padding positions too; they are not comparable with these.
#
# CKPT is a checkpoint file or a checkpoint folder (its checkpoint_best.pt, or with --avg N the
# average of its last N checkpoints, named in the log). The subset is cut into blocks of
# --tokens-per-sample tokens; each block scores its last tokens with the --context-window
# tokens before them as context (fairseq's adaptive-input WikiText-103 evaluation: 3072 / 2560).
# Defaults follow the checkpoint: --tokens-per-sample is the block the model was trained on (its
# task's tokens_per_sample; the model's positions when the checkpoint records none; the log
# says which), --context-window 5/6 of it (3072 -> 2560, as fairseq's setting), --max-tokens
# one block. Blocks hold complete lines (--sample-break-mode complete, fairseq's protocol); a
# line longer than the model's positions cannot be scored that way: --sample-break-mode none
# lets blocks cross line boundaries.
#
# Only a verified result reaches stdout: "SUBSET: Loss (base 2): L, Perplexity: P (N tokens ...)"
# when fairseq-eval-lm scored every token of the subset. fairseq's own log goes to
# CKPT_NAME.SUBSET.eval-lm.log next to the checkpoint (progress on stderr); the result also to
# CKPT_NAME.SUBSET.results.txt (one file per model and subset, removed when a run fails or is
# refused). The
# script fails, printing no perplexity, when fairseq-eval-lm fails, skips blocks longer than the
# model's positions, or evaluates fewer (or more) tokens than the subset holds; blocks longer
# than the model's positions and shards of the subset (--num-shards) are refused before it runs.
#
# usage: evaluate-lm.sh DATA_BIN CKPT [--avg N] [--subset test] [--tokens-per-sample N]
#            [--context-window N] [--max-tokens N] [--sample-break-mode complete|none|eos]
#            [--cpu] [fairseq-eval-lm options]
#        (--name=VALUE is the same as --name VALUE; --gen-subset is --subset)
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
BREAK_MODE=""
NUM_SHARDS=1
EXTRA=()
OPTIONS=(
    "@positional DATA:DATA_BIN CKPT"
    "@unknown pass EXTRA"
    "--avg value AVG count"
    "--subset value SUBSET"
    "--gen-subset value SUBSET"
    "--tokens-per-sample value TOKENS_PER_SAMPLE count"
    "--context-window value CONTEXT_WINDOW whole"
    "--max-tokens value MAX_TOKENS count"
    "--sample-break-mode value BREAK_MODE choice:complete|none|eos|complete_doc"
    "--num-shards value NUM_SHARDS count"
    "--shard-id refuse evaluate-lm.sh scores the whole subset (run fairseq-eval-lm itself for a shard)"
    "--path refuse the checkpoint is CKPT, the second argument"
    "--max-valid-steps refuse evaluate-lm.sh scores the whole subset"
    "--distributed-world-size refuse evaluate-lm.sh runs one process (several would each score a shard)"
)
parse_options_later "${OPTIONS[@]}" -- "$@"
[[ -n "$DATA" && -n "$CKPT" ]] || { refuse_parse_error; die "DATA_BIN and CKPT are required (see --help)"; }
# the results of an earlier run on this model and subset go first: a refused run leaves none
EVAL_DIR="$(if [[ -d "$CKPT" ]]; then echo "$CKPT"; else dirname "$CKPT"; fi)/eval"
STEM="$(checkpoint_name "$CKPT" "$AVG" "$EVAL_DIR")"
STEM="${STEM%.pt}.$SUBSET"
LOG="$STEM.eval-lm.log"
RESULTS="$STEM.results.txt"
rm -f "$RESULTS"
refuse_parse_error
[[ "$DATA" != *:* ]] ||
    die "DATA_BIN=$DATA: shards of a data-bin (fairseq's DIR1:DIR2); allowed: one data-bin (evaluate-lm.sh scores a whole subset; run fairseq-eval-lm itself on each shard)"
[[ -d "$DATA" ]] || die "DATA_BIN: $DATA is not a folder"
[[ "$NUM_SHARDS" == 1 ]] ||
    die "--num-shards $NUM_SHARDS: evaluate-lm.sh scores the whole subset, not a shard of it (run fairseq-eval-lm itself for a shard)"
need_cmd fairseq-eval-lm
SUBSET_SIZES="$(subset_tokens "$DATA" "$SUBSET" 2>/dev/null)" ||
    die "--subset $SUBSET: no binarized $SUBSET set in $DATA (no readable $SUBSET.idx)"
{ read -r SUBSET_TOKENS; read -r LONGEST_LINE; } <<<"$SUBSET_SIZES"
resolve_checkpoint "$CKPT" "$AVG" "$EVAL_DIR"

# the model's positions and the block it was trained on (one load of the checkpoint; a second
# one when it records no training block)
if INFO="$("$PYTHON" "$REPO_ROOT/scripts/checkpoint_info.py" "$MODEL" positions block 2>/dev/null)"; then
    { read -r POSITIONS; read -r TRAINING_BLOCK; } <<<"$INFO"
else
    POSITIONS="$("$PYTHON" "$REPO_ROOT/scripts/checkpoint_info.py" "$MODEL" positions)" ||
        die "cannot read the model's positions from $MODEL"
    TRAINING_BLOCK=""
fi
if [[ -n "$TOKENS_PER_SAMPLE" ]]; then
    BLOCK_SOURCE="--tokens-per-sample"
elif [[ -n "$TRAINING_BLOCK" && "$TRAINING_BLOCK" -le "$POSITIONS" ]]; then
    TOKENS_PER_SAMPLE="$TRAINING_BLOCK"
    BLOCK_SOURCE="the training block: tokens_per_sample of the checkpoint's task"
else
    TOKENS_PER_SAMPLE="$POSITIONS"
    BLOCK_SOURCE="the model's positions: the checkpoint records no usable training block"
fi
CONTEXT_WINDOW="${CONTEXT_WINDOW:-$((TOKENS_PER_SAMPLE - TOKENS_PER_SAMPLE / 6))}"
MAX_TOKENS="${MAX_TOKENS:-$TOKENS_PER_SAMPLE}"
[[ "$TOKENS_PER_SAMPLE" -le "$POSITIONS" ]] ||
    die "--tokens-per-sample $TOKENS_PER_SAMPLE: the model accepts at most $POSITIONS positions (use --tokens-per-sample $POSITIONS or less)"
[[ "$CONTEXT_WINDOW" -lt "$TOKENS_PER_SAMPLE" ]] ||
    die "--context-window $CONTEXT_WINDOW must be smaller than --tokens-per-sample $TOKENS_PER_SAMPLE"
[[ "$MAX_TOKENS" -ge "$TOKENS_PER_SAMPLE" ]] ||
    die "--max-tokens $MAX_TOKENS must hold one block of --tokens-per-sample $TOKENS_PER_SAMPLE tokens"
if [[ -z "$BREAK_MODE" && "$LONGEST_LINE" -le "$TOKENS_PER_SAMPLE" ]]; then
    BREAK_MODE=complete
elif [[ -z "$BREAK_MODE" ]]; then
    BREAK_MODE=none
    log "the longest line of $SUBSET holds $LONGEST_LINE tokens, more than a block of $TOKENS_PER_SAMPLE: blocks cross line boundaries (--sample-break-mode none)"
elif [[ "$BREAK_MODE" == complete && "$LONGEST_LINE" -gt "$TOKENS_PER_SAMPLE" ]]; then
    die "--sample-break-mode complete: the longest line of $SUBSET holds $LONGEST_LINE tokens, more than a block of --tokens-per-sample $TOKENS_PER_SAMPLE; allowed: --sample-break-mode none (blocks cross lines), or --tokens-per-sample $LONGEST_LINE or more (the model has $POSITIONS positions)"
fi

log "evaluating $MODEL on $SUBSET ($SUBSET_TOKENS tokens): blocks of $TOKENS_PER_SAMPLE tokens ($BLOCK_SOURCE; $BREAK_MODE), context window $CONTEXT_WINDOW (model positions: $POSITIONS${TRAINING_BLOCK:+, training block: $TRAINING_BLOCK}); fairseq's log: $LOG"

# --softmax-batch: the adaptive softmax scores the vocabulary in chunks; batch multiple 1: with
# the default (8) this fairseq build silently drops the last blocks of the subset; world size 1:
# fairseq's default (every visible GPU) would score one shard of the subset per GPU
fairseq-eval-lm "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" --task language_modeling \
    --gen-subset "$SUBSET" --sample-break-mode "$BREAK_MODE" --tokens-per-sample "$TOKENS_PER_SAMPLE" \
    --context-window "$CONTEXT_WINDOW" --max-tokens "$MAX_TOKENS" --softmax-batch 1024 \
    --required-batch-size-multiple 1 --distributed-world-size 1 \
    ${EXTRA[@]+"${EXTRA[@]}"} >"$LOG" 2>&1 &
pid=$!
show_progress "$pid" "$LOG" "" "" "fairseq-eval-lm on $SUBSET"
rc=0
wait "$pid" || rc=$?
[[ "$rc" == 0 ]] || die "fairseq-eval-lm failed (exit $rc, see $LOG)"
skipped="$(grep -oE '[0-9,]+ samples have invalid sizes and will be skipped' "$LOG" | head -n 1 | cut -d' ' -f1 || true)"
[[ -z "$skipped" ]] ||
    die "fairseq-eval-lm skipped $skipped blocks longer than the model's positions ($POSITIONS): no perplexity of the whole $SUBSET set; lower --tokens-per-sample (now $TOKENS_PER_SAMPLE) and --context-window (now $CONTEXT_WINDOW), or pass --sample-break-mode none (now $BREAK_MODE) when single lines are longer"
evaluated="$(grep -oE 'Evaluated [0-9,]+ tokens' "$LOG" | tail -n 1 | tr -dc '0-9' || true)"
[[ -n "$evaluated" && "$evaluated" -gt 0 ]] ||
    die "fairseq-eval-lm evaluated no tokens of $SUBSET: check --tokens-per-sample (now $TOKENS_PER_SAMPLE), --context-window (now $CONTEXT_WINDOW) and --max-tokens (now $MAX_TOKENS) (see $LOG)"
[[ "$evaluated" == "$SUBSET_TOKENS" ]] ||
    die "fairseq-eval-lm evaluated $evaluated tokens, but $SUBSET holds $SUBSET_TOKENS: no perplexity of the whole $SUBSET set (options passed to fairseq-eval-lm: ${EXTRA[*]:-none}; see $LOG)"
result="$(grep -oE 'Loss \(base 2\): [0-9.]+, Perplexity: [0-9.]+' "$LOG" | tail -n 1 || true)"
[[ -n "$result" ]] || die "fairseq-eval-lm reported no perplexity (see $LOG)"
echo "$SUBSET: $result ($evaluated tokens; fairseq's masked per-token perplexity; blocks of $TOKENS_PER_SAMPLE, context $CONTEXT_WINDOW)" >"$RESULTS.part"
mv "$RESULTS.part" "$RESULTS"
cat "$RESULTS"
