#!/usr/bin/env bash
# Evaluate a translation model trained with train-anthe.sh / train-subformer.sh on data made by
# a prepare script (it reads the languages and the segmentation from DATA_BIN/recipe.info).
#
# 1. checkpoint: CKPT is a file, or a checkpoint folder: its checkpoint_best.pt, or with
#    --avg N the average of its last N checkpoints (scripts/average_checkpoints.py; update
#    checkpoints when there are enough, else epoch checkpoints)
# 2. length penalty: beam search (--beam 5) on valid with every value of --lenpens; the best
#    tokenized BLEU wins
# 3. test with that length penalty, reporting
#    - tokenized BLEU with compound splitting (Moses-tokenized hypotheses and references,
#      "a-b" -> "a ##AT##-##AT## b"), the number both papers report;
#    - detokenized sacreBLEU against the untokenized references (signature printed).
#
# usage: evaluate.sh DATA_BIN CKPT [--avg N] [--lenpens "0.6 0.8 1.0 1.2 1.4"] [--beam 5]
#            [--batch-size N] [--out-dir DIR] [--cpu] [fairseq-generate options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

DATA=""
CKPT=""
AVG=1
LENPENS="0.6 0.8 1.0 1.2 1.4"
BEAM=5
BATCH_SIZE=128
OUT_DIR=""
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --avg) require_value "$@"; AVG="$2"; shift 2 ;;
        --lenpens) require_value "$@"; LENPENS="$2"; shift 2 ;;
        --beam) require_value "$@"; BEAM="$2"; shift 2 ;;
        --batch-size) require_value "$@"; BATCH_SIZE="$2"; shift 2 ;;
        --out-dir) require_value "$@"; OUT_DIR="$2"; shift 2 ;;
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
[[ -f "$DATA/recipe.info" ]] || die "$DATA/recipe.info missing: DATA_BIN must come from a prepare script"
SRC="$(read_recipe_info "$DATA" SRC)"
TGT="$(read_recipe_info "$DATA" TGT)"
SCHEME="$(read_recipe_info "$DATA" SCHEME)"
case "$SCHEME" in
    moses-bpe) POSTPROCESS=(--remove-bpe) ;;
    sentencepiece) POSTPROCESS=(--post-process sentencepiece) ;;
    *) die "$DATA/recipe.info: unknown SCHEME '$SCHEME' (allowed: moses-bpe, sentencepiece)" ;;
esac
SACRE_TOK=()
[[ "$TGT" == zh ]] && SACRE_TOK=(-tok zh)
need_cmd fairseq-generate sacrebleu sacremoses
OUT_DIR="${OUT_DIR:-$(if [[ -d "$CKPT" ]]; then echo "$CKPT"; else dirname "$CKPT"; fi)/eval}"
mkdir -p "$OUT_DIR"

# --- 1. checkpoint
if [[ -d "$CKPT" ]]; then
    if [[ "$AVG" -gt 1 ]]; then
        mode=--num-update-checkpoints
        n_update="$(find "$CKPT" -maxdepth 1 -name 'checkpoint_*_*.pt' | wc -l)"
        [[ "$n_update" -ge "$AVG" ]] || mode=--num-epoch-checkpoints
        "$PYTHON" "$REPO_ROOT/scripts/average_checkpoints.py" --inputs "$CKPT" "$mode" "$AVG" \
            --output "$OUT_DIR/average_last$AVG.pt"
        MODEL="$OUT_DIR/average_last$AVG.pt"
    else
        MODEL="$CKPT/checkpoint_best.pt"
    fi
else
    MODEL="$CKPT"
fi
[[ -f "$MODEL" ]] || die "checkpoint $MODEL not found"
log "evaluating $MODEL ($SRC -> $TGT, $SCHEME)"

# generate SUBSET LENPEN OUT: beam search; OUT.hyp holds one hypothesis per line of the
# subset, in corpus order (a sentence fairseq-generate skipped counts as an empty translation).
# --required-batch-size-multiple 1: with the default 8, this fairseq build's batch_by_size
# silently drops the last (size mod 8) sentences of the subset.
generate() {
    local subset="$1" lenpen="$2" out="$3"
    fairseq-generate "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" \
        --task translation --source-lang "$SRC" --target-lang "$TGT" --gen-subset "$subset" \
        --beam "$BEAM" --lenpen "$lenpen" --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 \
        "${POSTPROCESS[@]}" \
        "${EXTRA[@]}" >"$out.log" 2>"$out.err" || die "fairseq-generate failed (see $out.err)"
    "$PYTHON" - "$out.log" "$(wc -l <"$DATA/$subset.raw.$TGT")" "$out.hyp" <<'PY'
import sys
log, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hyps = {}
with open(log, encoding="utf-8") as f:
    for line in f:
        if line.startswith("H-"):
            head, _score, *text = line.rstrip("\n").split("\t")
            hyps[int(head[2:])] = text[0] if text else ""
if not hyps:
    sys.exit(f"error: fairseq-generate produced no hypotheses (see {log})")
missing = [i for i in range(count) if i not in hyps]
if missing:
    print(f"warning: {len(missing)} of {count} sentences got no hypothesis (scored as empty), "
          f"ids {missing[:10]}", file=sys.stderr)
with open(out, "w", encoding="utf-8") as f:
    f.writelines(hyps.get(i, "") + "\n" for i in range(count))
PY
}

# tokenized_bleu SUBSET OUT: BLEU of OUT.hyp on Moses tokens with compound splitting; the
# references are the subset's untokenized text, Moses-tokenized as the prepare script did
tokenized_bleu() {
    local subset="$1" out="$2"
    if [[ "$SCHEME" == sentencepiece ]]; then
        moses_tokenize "$TGT" <"$out.hyp" | compound_split >"$out.hyp.cs"
    else
        compound_split <"$out.hyp" >"$out.hyp.cs"
    fi
    moses_tokenize "$TGT" <"$DATA/$subset.raw.$TGT" | compound_split >"$out.ref.cs"
    sacrebleu "$out.ref.cs" -i "$out.hyp.cs" -m bleu -tok none -b -w 2
}

# --- 2. length penalty on valid
best_lenpen=""
best_bleu=-1
for lenpen in $LENPENS; do
    generate valid "$lenpen" "$OUT_DIR/valid.lenpen$lenpen"
    bleu="$(tokenized_bleu valid "$OUT_DIR/valid.lenpen$lenpen")"
    echo "valid lenpen $lenpen: tokenized BLEU $bleu"
    if "$PYTHON" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$bleu" "$best_bleu"; then
        best_bleu="$bleu"
        best_lenpen="$lenpen"
    fi
done
echo "best length penalty on valid: $best_lenpen (tokenized BLEU $best_bleu)"

# --- 3. test
TEST="$OUT_DIR/test.lenpen$best_lenpen"
generate test "$best_lenpen" "$TEST"
TOK_BLEU="$(tokenized_bleu test "$TEST")"
if [[ "$SCHEME" == sentencepiece ]]; then
    cp "$TEST.hyp" "$TEST.detok"
else
    moses_detokenize "$TGT" <"$TEST.hyp" >"$TEST.detok"
fi
SACRE="$(sacrebleu "$DATA/test.raw.$TGT" -i "$TEST.detok" -m bleu -w 2 -f text "${SACRE_TOK[@]}")"
{
    echo "model: $MODEL"
    echo "test ($SRC -> $TGT), beam $BEAM, lenpen $best_lenpen"
    echo "BLEU (tokenized, compound-split) = $TOK_BLEU"
    echo "sacreBLEU (detokenized): $SACRE"
} | tee "$OUT_DIR/results.txt"
