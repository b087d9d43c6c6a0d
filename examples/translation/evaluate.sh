#!/usr/bin/env bash
# Evaluate a translation model trained with train-anthe.sh / train-subformer.sh on data made by
# a prepare script, or by scripts/binarize_bundled.py (the bundled en-de); it reads the languages
# and the segmentation from DATA_BIN/recipe.info.
#
# 1. checkpoint: CKPT is a file, or a checkpoint folder: its checkpoint_best.pt, or with
#    --avg N the average of its last N checkpoints (scripts/average_checkpoints.py; update
#    checkpoints when there are enough, else epoch checkpoints)
# 2. length penalty: beam search (--beam 5) on valid with every value of --lenpens; the best
#    tokenized BLEU wins
# 3. test with that length penalty, reporting
#    - tokenized BLEU: hypotheses and references in Moses tokens (references only tokenized,
#      not punctuation-normalised, as fairseq's scripts/compound_split_bleu.sh scores them),
#      with compound splitting ("a-b" -> "a ##AT##-##AT## b") only when the target is German
#      (the WMT14 en-de convention); the report names the tokenization used;
#    - detokenized sacreBLEU against the untokenized references (signature printed);
#    - fairseq's valid and test perplexity (fairseq-validate: 2^nll per target token, padding
#      excluded), the Anthe paper's metric. The paper's own perplexities averaged over padding
#      positions too, so they are not comparable with these.
#
# Paper protocols: the Subformer paper scores the best checkpoint (no averaging) with beam 5
# and a length penalty tuned on valid over 0.0-2.0 (--paper: --lenpens 0.0 0.2 ... 2.0, no
# --avg). The Anthe paper reports perplexity only. The defaults (5 length penalties 0.6-1.4)
# are the cheaper fairseq-style sweep.
#
# usage: evaluate.sh DATA_BIN CKPT [--avg N] [--lenpens "0.6 0.8 1.0 1.2 1.4"] [--beam 5]
#            [--batch-size N] [--out-dir DIR] [--paper] [--cpu] [fairseq-generate options]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA=""
CKPT=""
AVG=1
LENPENS="0.6 0.8 1.0 1.2 1.4"
BEAM=5
BATCH_SIZE=128
OUT_DIR=""
PAPER=0
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --avg) require_value "$@"; AVG="$2"; shift 2 ;;
        --lenpens) require_value "$@"; LENPENS="$2"; shift 2 ;;
        --beam) require_value "$@"; BEAM="$2"; shift 2 ;;
        --batch-size) require_value "$@"; BATCH_SIZE="$2"; shift 2 ;;
        --out-dir) require_value "$@"; OUT_DIR="$2"; shift 2 ;;
        --paper) PAPER=1; shift ;;
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
[[ -f "$DATA/recipe.info" ]] || die "$DATA/recipe.info missing: DATA_BIN must come from a prepare script or scripts/binarize_bundled.py"
if [[ "$PAPER" == 1 ]]; then
    [[ "$AVG" == 1 ]] || die "--paper scores the best checkpoint, as the Subformer paper: drop --avg $AVG"
    LENPENS="0.0 0.2 0.4 0.6 0.8 1.0 1.2 1.4 1.6 1.8 2.0"
fi
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
need_cmd fairseq-generate fairseq-validate sacrebleu sacremoses
OUT_DIR="${OUT_DIR:-$(if [[ -d "$CKPT" ]]; then echo "$CKPT"; else dirname "$CKPT"; fi)/eval}"

# --- 1. checkpoint (checked before anything is written)
resolve_checkpoint "$CKPT" "$AVG" "$OUT_DIR"
mkdir -p "$OUT_DIR"
TOKENIZATION="$(bleu_tokenization_name "$TGT")"
log "evaluating $MODEL ($SRC -> $TGT, $SCHEME; tokenized BLEU: $TOKENIZATION)"

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

# tokenized_bleu SUBSET OUT: tokenized BLEU of OUT.hyp (see bleu_tokenize in common.sh); the
# references are the subset's Moses tokens shipped with the data (SUBSET.tok.TGT) or else its
# untokenized text, tokenized here
tokenized_bleu() {
    local subset="$1" out="$2"
    if [[ "$SCHEME" == sentencepiece ]]; then
        bleu_tokenize "$TGT" <"$out.hyp" >"$out.hyp.tok"
    else
        bleu_split "$TGT" <"$out.hyp" >"$out.hyp.tok"
    fi
    if [[ -f "$DATA/$subset.tok.$TGT" ]]; then
        bleu_split "$TGT" <"$DATA/$subset.tok.$TGT" >"$out.ref.tok"
    else
        bleu_tokenize "$TGT" <"$DATA/$subset.raw.$TGT" >"$out.ref.tok"
    fi
    sacrebleu "$out.ref.tok" -i "$out.hyp.tok" -m bleu -tok none -b -w 2
}

# perplexities OUT: fairseq-validate on valid and test; prints "SUBSET PPL" lines
perplexities() {
    local out="$1" cpu=() arg
    for arg in "${EXTRA[@]}"; do [[ "$arg" == --cpu ]] && cpu=(--cpu); done
    fairseq-validate "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --valid-subset valid,test \
        --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 --log-format simple \
        "${cpu[@]}" >"$out.log" 2>&1 || die "fairseq-validate failed (see $out.log)"
    sed -nE "s/.*valid on '([a-z]+)' subset.*\| ppl ([0-9.]+).*/\1 \2/p" "$out.log"
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
PPL="$(perplexities "$OUT_DIR/validate")"
VALID_PPL="$(sed -n 's/^valid //p' <<<"$PPL")"
TEST_PPL="$(sed -n 's/^test //p' <<<"$PPL")"
[[ -n "$VALID_PPL" && -n "$TEST_PPL" ]] || die "fairseq-validate reported no perplexity (see $OUT_DIR/validate.log)"
{
    echo "model: $MODEL"
    echo "test ($SRC -> $TGT), beam $BEAM, lenpen $best_lenpen"
    echo "tokenization of tokenized BLEU: $TOKENIZATION"
    echo "BLEU (tokenized) = $TOK_BLEU"
    echo "sacreBLEU (detokenized): $SACRE"
    echo "perplexity (fairseq, per target token, padding excluded): valid $VALID_PPL, test $TEST_PPL"
} | tee "$OUT_DIR/results.txt"
