#!/usr/bin/env bash
# Skipless LM vs a pre-LN transformer LM of the same shape on the bundled WikiText-2.
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
#   DRY_RUN=1 prints the fairseq-train commands and trains nothing.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-${FAIRSEQ_BIN:-$HERE/../../.venv/bin}/python}
# shellcheck source=SCRIPTDIR/../common.sh
. "$HERE/../common.sh"
OUT=""
OPTIONS=("@positional OUT")
parse_options "${OPTIONS[@]}" -- "$@"
OUT=${OUT:-$REPO_ROOT/build/skipless_vs_preln}
UPDATES=${UPDATES:-400}
BATCH=${BATCH:-16}
TOKENS=${TOKENS:-64}
LR=${LR:-2e-3}
SEED=${SEED:-1}
JOBS=${JOBS:-2}
NWORDS=${NWORDS:-8000}
RUNS=${RUNS:-"skipless skipless_noqp preln"}

lm_run_args() {
  local shape="--decoder-embed-dim 128 --decoder-layers 4 --decoder-attention-heads 4 --decoder-ffn-embed-dim 512 --dropout 0.0"
  case "$1" in
    skipless) echo "--arch skipless_lm $shape" ;;
    skipless_noqp) echo "--arch skipless_lm --removed-weights q $shape" ;;
    preln) echo "--arch transformer_lm --decoder-normalize-before --decoder-input-dim 128 --decoder-output-dim 128 $shape" ;;
    *) return 1 ;;
  esac
}

compare_lms_on_wikitext2
