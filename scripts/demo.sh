#!/usr/bin/env bash
# `make demo`: what the plugin is for, in about ten minutes on 2 CPU cores.
#
#   1. binarize the bundled corpora: WikiText-2 (word level, vocabulary capped at 5,000) and
#      en-de (Moses + joint BPE), with scripts/binarize_bundled.py;
#   2. language modelling on WikiText-2: fairseq's transformer_lm and slim models side by side,
#      each trained for the same number of updates of the same batches, with two seeds each
#      (scripts/quality.py, two runs at a time, one thread each). Printed: parameters, valid
#      perplexity, training tokens/s and, per model, whether its difference from the baseline is
#      larger than the spread between seeds. Plots: params_vs_quality.png, valid_loss_wikitext.png;
#   3. the translation pipeline: train a small anthe_base on en-de, score the test set with
#      fairseq-generate (--scoring sacrebleu on its Moses-detokenized output and references),
#      then translate a few test sentences with fairseq-interactive (Moses + BPE applied and
#      removed by fairseq itself).
# Resumable: finished runs are reused by the next call (delete DEMO_DIR to start over). Each
# stage logs what it starts; the training runs write their progress to DEMO_DIR/lm.log and
# DEMO_DIR/mt.log.
#
# usage: bash scripts/demo.sh [--help]     (or: make demo)
#
# Settings (environment variables):
#   DEMO_DIR        build directory                                (default: build/demo)
#   DEMO_LM_UPDATES updates per language model                     (default: 200)
#   DEMO_MT_UPDATES updates of the translation model               (default: 200)
#   DEMO_SEEDS      seeds of every language model                  (default: 1,2)
#   DEMO_JOBS       training runs at a time                        (default: 2)
#   PYTHON          interpreter with fairseq installed             (default: .venv/bin/python)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
# the header above is the help; the settings are environment variables, not options
case "${1:-}" in
    "") ;;
    -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) printf 'demo.sh: error: %s: not an option of this recipe; allowed: the options of --help\n' "${1%%=*}" >&2
       exit 2 ;;
esac
BIN="$(dirname "$PYTHON")"
DEMO_DIR="${DEMO_DIR:-$REPO/build/demo}"
LM_UPDATES="${DEMO_LM_UPDATES:-200}"
MT_UPDATES="${DEMO_MT_UPDATES:-200}"
SEEDS="${DEMO_SEEDS:-1,2}"
JOBS="${DEMO_JOBS:-2}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
USER_DIR="$REPO/slim_fairseq"
START=$(date +%s)

log() { printf '[demo %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
# section FILE TITLE: the **bold** heading of quality.py's table.md that contains TITLE, up to the next one
section() { awk -v title="$2" '/^\*\*/ { keep = index($0, title) > 0 } keep' "$1"; }
for value in "$LM_UPDATES" "$MT_UPDATES" "$JOBS"; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || { echo "demo: DEMO_LM_UPDATES, DEMO_MT_UPDATES and DEMO_JOBS must be positive integers (got '$value')" >&2; exit 2; }
done
[[ "$SEEDS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "demo: DEMO_SEEDS must be a comma-separated list of integers (got '$SEEDS')" >&2; exit 2; }
mkdir -p "$DEMO_DIR"

# ---- 1. data -------------------------------------------------------------------------------
log "stage 1: binarize the bundled WikiText-2 (5,000 words) and en-de (Moses + 8,000 joint BPE merges)"
read -r LM_BIN MT_BIN BPE_CODES < <("$PYTHON" - "$DEMO_DIR/data" <<'EOF'
import sys
from slim_fairseq_lab.data import binarize_ende, binarize_wikitext, ende_paths
out = sys.argv[1]
lm = binarize_wikitext(out, nwords=5000)
mt = binarize_ende(out, eval_subset=300)
print(lm, mt, ende_paths(out, eval_subset=300)["codes"])
EOF
)
[ -d "$LM_BIN" ] && [ -d "$MT_BIN" ] && [ -f "$BPE_CODES" ] || { echo "demo: binarizing the bundled data failed" >&2; exit 1; }

# ---- 2. language models ----------------------------------------------------------------------
# Same width (128), depth (4), batches, updates and learning rate for all; dropout off (well
# under one epoch: nothing to regularise). The baseline is fairseq's transformer_lm with tied
# input/output embeddings and pre-norm, its strongest setting at this size (post-norm learns
# much more slowly in the first few hundred updates); transformer_lm_d96 is the same at width
# 96, with fewer parameters than either slim model.
LM_MODELS=(
  --lm-model "transformer_lm=transformer_lm --share-decoder-input-output-embed --decoder-normalize-before"
  --lm-model "transformer_lm_d96=transformer_lm --share-decoder-input-output-embed --decoder-normalize-before --decoder-embed-dim 96 --decoder-input-dim 96 --decoder-output-dim 96 --decoder-ffn-embed-dim 384"
  --lm-model "anthe_lm=anthe_lm_gpt2_small --tc-min-bond 8 --hsoftpos-min-token-dim 64"
  --lm-model "sandwich_gated_glu=slim_lm --decoder-normalize-before --share-decoder-input-output-embed --sandwich --self-attn-gate qgv --ffn-glu"
)
log "stage 2: WikiText-2 language models, $LM_UPDATES updates each, seeds $SEEDS, $JOBS at a time"
"$PYTHON" scripts/quality.py --out "$DEMO_DIR/lm" --corpus wikitext --lm-data "$LM_BIN" \
  --dim 128 --layers 4 --heads 4 --lr 3e-3 --seeds "$SEEDS" --max-update "$LM_UPDATES" \
  --validate-interval 100 --max-valid-steps 30 --max-tokens 2048 --tokens-per-sample 128 --dropout 0 \
  --no-baseline --frontier-baseline transformer_lm --jobs "$JOBS" --threads 1 "${LM_MODELS[@]}" \
  > "$DEMO_DIR/lm.log" 2>&1 || { tail -n 30 "$DEMO_DIR/lm.log" >&2; exit 1; }
grep '^\[quality\] \[' "$DEMO_DIR/lm.log" | sed 's/^/    /'

# ---- 3. translation ---------------------------------------------------------------------------
log "stage 3: en-de translation pipeline: anthe_base (d 128, 3+3 layers), $MT_UPDATES updates"
"$PYTHON" scripts/quality.py --out "$DEMO_DIR/mt" --corpus ende --ende-data "$MT_BIN" --bpe-codes "$BPE_CODES" \
  --dim 128 --layers 3 --heads 4 --lr 3e-3 --seeds 1 --max-update "$MT_UPDATES" --validate-interval 50 \
  --max-tokens 2048 --no-baseline --keep-checkpoints --threads "$JOBS" --model "anthe_base=anthe_base" \
  > "$DEMO_DIR/mt.log" 2>&1 || { tail -n 30 "$DEMO_DIR/mt.log" >&2; exit 1; }
grep '^\[quality\] \[' "$DEMO_DIR/mt.log" | sed 's/^/    /'
CKPT="$DEMO_DIR/mt/runs/ende_anthe_base_s1/checkpoint_best.pt"
head -n 3 "$REPO/data/ende/test.en" > "$DEMO_DIR/sample.en"
head -n 3 "$REPO/data/ende/test.de" > "$DEMO_DIR/sample.de"
"$BIN/fairseq-interactive" "$MT_BIN" --user-dir "$USER_DIR" --path "$CKPT" --cpu \
  --source-lang en --target-lang de --tokenizer moses --bpe subword_nmt --bpe-codes "$BPE_CODES" \
  --beam 5 --max-len-a 1.2 --max-len-b 10 --input "$DEMO_DIR/sample.en" 2> "$DEMO_DIR/interactive.err" \
  | grep '^D-' | cut -f3 > "$DEMO_DIR/sample.hyp.de" || { tail -n 20 "$DEMO_DIR/interactive.err" >&2; exit 1; }

# ---- summary ---------------------------------------------------------------------------------
echo
echo "== WikiText-2 language models (valid: first 30 batches of 2,048 tokens; $LM_UPDATES updates each) =="
section "$DEMO_DIR/lm/table.md" 'every run'
section "$DEMO_DIR/lm/table.md" 'each model against'
echo
cat <<EOF
What this shows: at width 128, depth 4 and the same $LM_UPDATES updates of the same batches, how far
each model's valid perplexity is from fairseq's transformer_lm, with how many parameters, and
whether the gap is larger than the spread between seeds; transformer_lm_d96 shows what a plain
transformer with fewer parameters than the slim models does. Both slim models use a GLU feed-forward
and gated attention; this run does not separate which technique the gain comes from. What it
does not show: quality after convergence, at paper sizes, or on a GPU; tokens/s were measured
with $JOBS runs sharing the machine, so read them as rough ratios. Plots:
$DEMO_DIR/lm/params_vs_quality.png, $DEMO_DIR/lm/valid_loss_wikitext.png
EOF
echo
echo "== en-de translation pipeline (anthe_base, d 128, $MT_UPDATES updates: far from trained) =="
section "$DEMO_DIR/mt/table.md" 'every run'
echo "A few test sentences (fairseq-interactive, beam 5):"
paste -d'\n' "$DEMO_DIR/sample.en" "$DEMO_DIR/sample.hyp.de" "$DEMO_DIR/sample.de" \
  | awk '{ tag = (NR % 3 == 1) ? "source   " : (NR % 3 == 2) ? "anthe    " : "reference"; print "  " tag " " $0; if (NR % 3 == 0) print "" }'
log "finished in $(( $(date +%s) - START )) s; outputs under $DEMO_DIR"
