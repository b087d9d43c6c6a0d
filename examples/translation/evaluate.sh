#!/usr/bin/env bash
# Evaluate a translation model trained with train-anthe.sh / train-subformer.sh on data made by
# a prepare script, or by scripts/binarize_bundled.py (the bundled en-de); it reads the languages
# and the segmentation from DATA_BIN/recipe.info.
#
# 1. checkpoint: CKPT is a file, or a checkpoint folder: its checkpoint_best.pt, or with
#    --avg N the average of its last N checkpoints (scripts/average_checkpoints.py; update
#    checkpoints when there are enough, else epoch checkpoints, picked by number; the averaged
#    files are named in the log and in the results)
# 2. length penalty: beam search (--beam 5) on valid with every value of --lenpens; the best
#    score on valid wins: tokenized BLEU, or for a Chinese or Japanese target (which the Moses
#    tokenizer does not segment) sacreBLEU with the language's tokenizer (zh, ja-mecab).
#    A single value (--lenpens 1.0) is used as it is: valid is not translated at all.
# 3. test with that length penalty, reporting
#    - tokenized BLEU: hypotheses and references in Moses tokens (references only tokenized,
#      not punctuation-normalised, as fairseq's scripts/compound_split_bleu.sh scores them;
#      data that ships tokenized references, like Google's WMT14, is scored against those),
#      with compound splitting ("a-b" -> "a ##AT##-##AT## b") only when the target is German
#      (the WMT14 en-de convention); the report names the tokenization used. Not computed for
#      Chinese and Japanese targets;
#    - detokenized sacreBLEU against the untokenized references (signature printed; tokenizer
#      zh / ja-mecab for those targets, else 13a);
#    - fairseq's valid and test perplexity (fairseq-validate: 2^nll per target token, padding
#      excluded), the Anthe paper's metric. The paper's own perplexities averaged over padding
#      positions too, so they are not comparable with these.
#    The table per target language is in examples/translation/README.md ("Evaluate").
# Outputs go to OUT_DIR/NAME/ (NAME: the checkpoint's file name without .pt; OUT_DIR: --out-dir,
# default the checkpoint folder's eval/), the report to OUT_DIR/NAME/results.txt, written only
# when every step succeeded (a failed run leaves none). Translation logs its progress.
#
# Paper protocols: the Subformer paper scores the best checkpoint (no averaging) with beam 5
# and a length penalty tuned on valid over 0.0-2.0 (--paper: --lenpens 0.0 0.2 ... 2.0, no
# --avg). The Anthe paper reports perplexity only. The defaults (5 length penalties 0.6-1.4)
# are the cheaper fairseq-style sweep.
#
# usage: evaluate.sh DATA_BIN CKPT [--avg N] [--lenpens "0.6 0.8 1.0 1.2 1.4"] [--beam 5]
#            [--batch-size N] [--out-dir DIR] [--paper] [--cpu] [fairseq-generate options]
#        (--name=VALUE is the same as --name VALUE; --lenpen, --gen-subset, --path,
#        --source-lang and --target-lang are the script's own and refused)
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA=""
CKPT=""
AVG=1
LENPENS=""
BEAM=5
BATCH_SIZE=128
OUT_DIR=""
PAPER=0
CPU=0
EXTRA=()
OPTIONS=(
    "@positional DATA:DATA_BIN CKPT"
    "@unknown pass EXTRA"
    "--avg value AVG count"
    "--lenpens value LENPENS"
    "--beam value BEAM count"
    "--batch-size value BATCH_SIZE count"
    "--out-dir value OUT_DIR"
    "--paper flag PAPER"
    "--cpu flag CPU"
    "--lenpen refuse the length penalty is chosen on valid among --lenpens (a single value, e.g. --lenpens 1.0, is used as it is)"
    "--gen-subset refuse evaluate.sh chooses the length penalty on valid and scores test"
    "--path refuse the checkpoint is CKPT, the second argument"
    "--source-lang refuse the languages are read from DATA_BIN/recipe.info"
    "--target-lang refuse the languages are read from DATA_BIN/recipe.info"
)
parse_options_later "${OPTIONS[@]}" -- "$@"
[[ -n "$DATA" && -n "$CKPT" ]] || { refuse_parse_error; die "DATA_BIN and CKPT are required (see --help)"; }
# the results of an earlier run of this checkpoint go first: a refused or failed run leaves none
OUT_DIR="${OUT_DIR:-$(if [[ -d "$CKPT" ]]; then echo "$CKPT"; else dirname "$CKPT"; fi)/eval}"
WORK="$OUT_DIR/$(basename "$(checkpoint_name "$CKPT" "$AVG" "$OUT_DIR")" .pt)"
rm -f "$WORK/results.txt"
refuse_parse_error
[[ -f "$DATA/recipe.info" ]] || die "$DATA/recipe.info missing: DATA_BIN must come from a prepare script or scripts/binarize_bundled.py"
if [[ "$PAPER" == 1 ]]; then
    [[ "$AVG" == 1 ]] || die "--paper scores the best checkpoint, as the Subformer paper: drop --avg $AVG"
    [[ -z "$LENPENS" ]] || die "--lenpens: --paper tunes over 0.0 0.2 ... 2.0, as the Subformer paper: drop --lenpens, or --paper"
    LENPENS="0.0 0.2 0.4 0.6 0.8 1.0 1.2 1.4 1.6 1.8 2.0"
fi
LENPENS="${LENPENS:-0.6 0.8 1.0 1.2 1.4}"
read -ra LENPEN_VALUES <<<"$LENPENS"
[[ ${#LENPEN_VALUES[@]} -gt 0 ]] || die "--lenpens: at least one value"
for lenpen in "${LENPEN_VALUES[@]}"; do
    [[ "$lenpen" =~ ^[0-9]*\.?[0-9]+$ ]] || die "--lenpens: numbers >= 0 separated by spaces, got '$lenpen'"
done
SRC="$(read_recipe_info "$DATA" SRC)"
TGT="$(read_recipe_info "$DATA" TGT)"
SCHEME="$(read_recipe_info "$DATA" SCHEME)"
case "$SCHEME" in
    moses-bpe) POSTPROCESS=(--remove-bpe) ;;
    sentencepiece) POSTPROCESS=(--post-process sentencepiece) ;;
    *) die "$DATA/recipe.info: unknown SCHEME '$SCHEME' (allowed: moses-bpe, sentencepiece)" ;;
esac
SACRE_TOK="$(sacrebleu_tokenizer "$TGT")"
check_sacrebleu_tokenizer "$TGT"
if moses_segments "$TGT"; then
    CRITERION="tokenized BLEU"
    if [[ -f "$DATA/test.tok.$TGT" ]]; then
        REF_TOKENS="$(read_recipe_info "$DATA" REF_TOKENS)"
        [[ -n "$REF_TOKENS" ]] || REF_TOKENS="the tokens of the data's test.tok.$TGT"
        TOKENIZATION="$(bleu_tokenization_name "$TGT" "$REF_TOKENS")"
    else
        TOKENIZATION="$(bleu_tokenization_name "$TGT")"
    fi
else
    CRITERION="sacreBLEU (-tok $SACRE_TOK)"
    TOKENIZATION=""
fi
CPU_ARGS=()
[[ "$CPU" == 1 ]] && CPU_ARGS=(--cpu)
need_cmd fairseq-generate fairseq-validate sacrebleu sacremoses
# the untokenized references sacreBLEU reads (valid only to choose among several penalties)
SUBSETS=(test)
[[ ${#LENPEN_VALUES[@]} == 1 ]] || SUBSETS=(valid test)
for subset in "${SUBSETS[@]}"; do
    [[ -s "$DATA/$subset.raw.$TGT" ]] ||
        die "$DATA/$subset.raw.$TGT missing: the untokenized $subset references, which the prepare scripts and scripts/binarize_bundled.py write next to the data-bin"
done
REF_NOTE="$(read_recipe_info "$DATA" REF_NOTE)"

# --- 1. checkpoint (checked before anything is written)
resolve_checkpoint "$CKPT" "$AVG" "$OUT_DIR"
mkdir -p "$WORK"
log "evaluating $MODEL ($SRC -> $TGT, $SCHEME; length penalty chosen by $CRITERION; tokenized BLEU: ${TOKENIZATION:-not computed for $TGT}); outputs in $WORK"

# generate SUBSET LENPEN OUT: beam search; OUT.hyp holds one hypothesis per line of the
# subset, in corpus order (a sentence fairseq-generate skipped counts as an empty translation).
# --required-batch-size-multiple 1: with the default 8, this fairseq build's batch_by_size
# silently drops the last (size mod 8) sentences of the subset.
generate() {
    local subset="$1" lenpen="$2" out="$3" count pid
    count="$(line_count "$DATA/$subset.raw.$TGT")"
    log "translating $subset ($count sentences), length penalty $lenpen"
    PYTHONUNBUFFERED=1 fairseq-generate "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" \
        --task translation --source-lang "$SRC" --target-lang "$TGT" --gen-subset "$subset" \
        --beam "$BEAM" --lenpen "$lenpen" --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 \
        "${POSTPROCESS[@]}" ${CPU_ARGS[@]+"${CPU_ARGS[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} \
        >"$out.log" 2>"$out.err" &
    pid=$!
    show_progress "$pid" "$out.log" '^H-' "$count" "$subset, length penalty $lenpen: sentences translated"
    wait "$pid" || die "fairseq-generate failed (see $out.err)"
    "$PYTHON" - "$out.log" "$count" "$out.hyp" <<'PY'
import os, sys
log, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hyps = {}
with open(log, encoding="utf-8") as f:
    for line in f:
        if line.startswith("H-"):
            head, _score, *text = line.rstrip("\n").split("\t")
            hyps[int(head[2:])] = text[0] if text else ""
if not hyps:
    sys.exit(f"{os.environ['RECIPE_NAME']}: error: fairseq-generate produced no hypotheses (see {log})")
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

# detokenize OUT: OUT.hyp -> OUT.detok (the text sacreBLEU scores)
detokenize() {
    if [[ "$SCHEME" == sentencepiece ]]; then
        cp "$1.hyp" "$1.detok"
    else
        moses_detokenize "$TGT" <"$1.hyp" >"$1.detok"
    fi
}

# sacre_bleu SUBSET OUT [sacrebleu options]: detokenized sacreBLEU of OUT.hyp
sacre_bleu() {
    local subset="$1" out="$2"
    shift 2
    detokenize "$out"
    sacrebleu "$DATA/$subset.raw.$TGT" -i "$out.detok" -m bleu -w 2 -tok "$SACRE_TOK" "$@"
}

# perplexities OUT: fairseq-validate on valid and test; prints "SUBSET PPL" lines
perplexities() {
    local out="$1" pid
    log "fairseq-validate: perplexity of valid and test"
    fairseq-validate "$DATA" --user-dir "$(slim_user_dir)" --path "$MODEL" --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --valid-subset valid,test \
        --batch-size "$BATCH_SIZE" --required-batch-size-multiple 1 --log-format simple \
        ${CPU_ARGS[@]+"${CPU_ARGS[@]}"} >"$out.log" 2>&1 &
    pid=$!
    show_progress "$pid" "$out.log" "" "" "fairseq-validate"
    wait "$pid" || die "fairseq-validate failed (see $out.log)"
    sed -nE "s/.*valid on '([a-z]+)' subset.*\| ppl ([0-9.]+).*/\1 \2/p" "$out.log"
}

# --- 2. length penalty on valid
if [[ ${#LENPEN_VALUES[@]} == 1 ]]; then
    best_lenpen="${LENPEN_VALUES[0]}"
    CHOICE="the only value of --lenpens: valid not translated"
    echo "length penalty: $best_lenpen ($CHOICE)"
else
    best_lenpen=""
    best_score=-1
    for lenpen in "${LENPEN_VALUES[@]}"; do
        out="$WORK/valid.lenpen$lenpen"
        generate valid "$lenpen" "$out"
        if moses_segments "$TGT"; then
            score="$(tokenized_bleu valid "$out")"
        else
            score="$(sacre_bleu valid "$out" -b)"
        fi
        echo "valid lenpen $lenpen: $CRITERION $score"
        if "$PYTHON" -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$score" "$best_score"; then
            best_score="$score"
            best_lenpen="$lenpen"
        fi
    done
    CHOICE="best valid $CRITERION ($best_score) of $LENPENS"
    echo "best length penalty on valid: $best_lenpen ($CRITERION $best_score)"
fi

# --- 3. test
TEST="$WORK/test.lenpen$best_lenpen"
generate test "$best_lenpen" "$TEST"
if moses_segments "$TGT"; then
    TOK_BLEU_LINE="BLEU (tokenized) = $(tokenized_bleu test "$TEST")"
else
    TOK_BLEU_LINE="BLEU (tokenized): not computed: the Moses tokenizer does not segment $TGT; see sacreBLEU (tok $SACRE_TOK)"
fi
SACRE="$(sacre_bleu test "$TEST" -f text)"
PPL="$(perplexities "$WORK/validate")"
VALID_PPL="$(sed -n 's/^valid //p' <<<"$PPL")"
TEST_PPL="$(sed -n 's/^test //p' <<<"$PPL")"
[[ -n "$VALID_PPL" && -n "$TEST_PPL" ]] || die "fairseq-validate reported no perplexity (see $WORK/validate.log)"
{
    echo "model: $MODEL"
    [[ ${#AVERAGED[@]} == 0 ]] || echo "average of: ${AVERAGED[*]}"
    echo "test ($SRC -> $TGT), beam $BEAM, lenpen $best_lenpen ($CHOICE)"
    [[ -z "$TOKENIZATION" ]] || echo "tokenization of tokenized BLEU: $TOKENIZATION"
    echo "$TOK_BLEU_LINE"
    echo "sacreBLEU (detokenized): $SACRE"
    [[ -z "$REF_NOTE" ]] || echo "references: $REF_NOTE"
    echo "perplexity (fairseq, per target token, padding excluded): valid $VALID_PPL, test $TEST_PPL"
} >"$WORK/results.txt.part"
mv "$WORK/results.txt.part" "$WORK/results.txt"
cat "$WORK/results.txt"
