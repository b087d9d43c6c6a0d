#!/usr/bin/env bash
# Shrunk Subformer vs a transformer of the same d_m / L on the bundled en-de corpus (CPU).
#
# Both models: d_m 256, f_m 1024, 4 heads, 4+4 layers, joined dictionary with
# --share-all-embeddings, same seed, optimizer, batch size and number of updates.
#   - subformer:   slim_transformer arch subformer_small shrunk to that shape: SAFE d_e 128,
#                  sandwich middle d_s 384 / f_s 1024 / 6 heads (d_s = 1.5 d_m as in
#                  subformer_small), fairseq's default init. The paper's BERT-style init
#                  (--bert-init, N(0, 0.02)) stalled a width-128 Subformer on this corpus at
#                  9.9 bits (docs/TRAINING.md, "Depth, post-LN and the Subformer"): opt in
#                  with --bert-init. Pre-LN, which trained the Subformer best there (same
#                  section); --post-ln for the paper's post-LN;
#   - transformer: fairseq's own `transformer` at that shape (post-LN; --pre-ln for pre-LN).
# Reported per model: parameters, valid loss / nll / PPL (fairseq's masked per-token
# perplexity, 2^nll) after the last update, training tokens/s (fairseq's wps), generation
# tokens/s (fairseq-generate) and test BLEU: fairseq-generate's BLEU4 of the model's
# checkpoint_last.pt (beam 5, BPE removed), fairseq's own scorer on Moses tokens (-a), no
# compound splitting: a tokenized BLEU, not sacreBLEU. A note under the table says so and names
# each checkpoint with its update.
# The Subformer paper reports training 10-30% faster and inference 10-20% faster when
# d_s = d_m, slower when d_s >> d_m: add --same-width to run the subformer with d_s = d_m.
#
# usage: subformer_vs_transformer.sh [OUT_DIR] [--max-update N] [--max-tokens N] [--seed S]
#            [--log-interval N] [--lr LR] [--subformer-lr LR] [--same-width] [--bert-init]
#            [--pre-ln | --post-ln] [--sequential] [--eval-only] [--dry-run]
#        default: the Subformer pre-LN, the transformer post-LN (each as it trains best / as
#        fairseq ships it); --pre-ln: both pre-LN; --post-ln: both post-LN (the paper's Subformer).
#        --dry-run: print the two fairseq-train commands, run nothing. --eval-only: reuse the
#        checkpoints of an earlier run (translate + report only). --lr sets both models' Adam
#        rate (default 1e-3, the best rate measured nearest this shape for both models:
#        docs/TRAINING.md, "Learning rate"), --subformer-lr the Subformer's alone (default:
#        --lr); on WikiText-2 the Subformer's best rate differed from the transformer's.
# env:   THREADS (per model, default 1); the two runs go in parallel unless --sequential.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

OUT="$REPO_ROOT/build/subformer_vs_transformer"
MAX_UPDATE=400
MAX_TOKENS=4096
SEED=1
LOG_INTERVAL=50
PARALLEL=1
EVAL_ONLY=0
INIT=()
DRY_RUN=0
NORM_FLAG=
LR=1e-3
SUBFORMER_LR=
MIDDLE=(--sandwich-dim 384 --sandwich-ffn-dim 1024 --sandwich-heads 6)
THREADS="${THREADS:-1}"
SAME_WIDTH=0
BERT_INIT=0
OPTIONS=(
    "@positional OUT"
    "--max-update value MAX_UPDATE"
    "--max-tokens value MAX_TOKENS"
    "--seed value SEED"
    "--log-interval value LOG_INTERVAL"
    "--lr value LR"
    "--subformer-lr value SUBFORMER_LR"
    "--same-width flag SAME_WIDTH"
    "--bert-init flag BERT_INIT"
    "--pre-ln one NORM_FLAG --pre-ln"
    "--post-ln one NORM_FLAG --post-ln"
    "--sequential set PARALLEL 0"
    "--eval-only flag EVAL_ONLY"
    "--dry-run flag DRY_RUN"
)
parse_options "${OPTIONS[@]}" -- "$@"
for option in max-update max-tokens seed log-interval; do
    variable="$(tr a-z- A-Z_ <<<"$option")"
    whole_number "--$option" "${!variable}"
done
[[ "$SAME_WIDTH" == 1 ]] && MIDDLE=(--sandwich-dim 256 --sandwich-ffn-dim 1024 --sandwich-heads 4)
[[ "$BERT_INIT" == 1 ]] && INIT=(--bert-init)

PRE_LN=(--encoder-normalize-before --decoder-normalize-before)
case "$NORM_FLAG" in
    --pre-ln) SUBFORMER_NORM=("${PRE_LN[@]}"); TRANSFORMER_NORM=("${PRE_LN[@]}") ;;
    --post-ln) SUBFORMER_NORM=(); TRANSFORMER_NORM=() ;;
    *) SUBFORMER_NORM=("${PRE_LN[@]}"); TRANSFORMER_NORM=() ;;
esac
WARMUP=$(( MAX_UPDATE < 400 ? MAX_UPDATE / 2 : 200 ))
SHAPE=(--encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 4
       --encoder-attention-heads 4 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024
       --decoder-layers 4 --decoder-attention-heads 4 --dropout 0.1 --share-all-embeddings)
# a stalled model repeats itself: cap the hypotheses' length
GENERATE_ARGS=(--max-len-a 1.2 --max-len-b 10)
RUN_NOTE="lr: ${SUBFORMER_LR:-$LR} (subformer) / $LR (transformer)"
compare_on_bundled_ende \
    subformer --user-dir "$(slim_user_dir)" --arch subformer_small --safe-embed-dim 128 \
        "${MIDDLE[@]}" ${INIT[@]+"${INIT[@]}"} ${SUBFORMER_NORM[@]+"${SUBFORMER_NORM[@]}"} \
        --lr "${SUBFORMER_LR:-$LR}" -- \
    transformer --arch transformer ${TRANSFORMER_NORM[@]+"${TRANSFORMER_NORM[@]}"} --lr "$LR"
