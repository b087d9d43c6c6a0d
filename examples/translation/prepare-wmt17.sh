#!/usr/bin/env bash
# WMT17 news translation, one of the seven pairs with English used by the Anthe paper:
# cs, de, fi, lv, ru, tr, zh (either direction: PAIR = xx-en or en-xx).
#
# train: the public WMT17 parallel data of the pair (table below; corpora that need a
#        registration -- CzEng, Yandex, CWMT -- can be added with --extra-corpus PREFIX)
# valid: newstest2016 (newsdev2017 for lv and zh)     test: newstest2017
# Sentencepiece BPE (32K by default) on untokenized text, trained on both sides of the pair
# (--tokenizer-lang joint, default), on its English side (en), or on WikiText-103's raw
# training text (wikitext-103); --spm-model reuses a trained model. Optional caps: the first
# --max-pairs N pairs, or the first pairs within --max-size SIZE (9G = 9 GiB). Then
# fairseq-preprocess --joined-dictionary.
#
# Paper vs recipe (the Anthe paper, arXiv:2305.10991, Sec. 3 and 3.2; --paper sets the paper's
# choices, explicit options still win):
#   tokenizer  paper: "the same tokenizer for all the languages", a 32K BPE trained on
#              WikiText-103.  --paper: --tokenizer-lang wikitext-103 --vocab-size 32000, a
#              sentencepiece BPE model learned on WikiText-103's raw training text (the paper
#              does not name its BPE implementation); train it once, then pass its spm.model
#              to the other pairs (and to prepare-wmt14en2de.sh --paper anthe) with --spm-model.
#              default: a per-pair joint model, which covers the other language's script
#              (an English-only tokenizer splits Cyrillic and Chinese text into characters
#              or unknown pieces).
#   ru, zh     paper: both pairs "exceed 9G in size, so we limit them to 9G".  --paper:
#              --max-size 9G for ru and zh (the first pairs whose two untokenized sides fit
#              in 9 GiB; the paper does not say how it measured the size).  default: all pairs.
#   corpora    paper: the WMT17 data of each pair; the recipe uses its public part.
#
# usage: prepare-wmt17.sh PAIR [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR] [--paper]
#            [--vocab-size N] [--tokenizer-lang joint|en|wikitext-103] [--spm-model FILE]
#            [--spm-sample N] [--max-pairs N] [--max-size SIZE] [--max-len N] [--ratio R]
#            [--extra-corpus PREFIX]... [--skip CORPUS]... [--no-verify] [--dry-run]
#   --raw-dir DIR  the downloads of the pair, already downloaded, under the names --dry-run
#                  lists (WMT17's dev.tgz / test.tgz as wmt17-dev.tgz / wmt17-test.tgz: several
#                  WMT years share one folder); no network
#   --dry-run      list the downloads (and whether --raw-dir has them), change nothing
#   CORPUS names for --skip: europarl commoncrawl news-commentary rapid wiki-titles leta dcep
#                            books setimes un
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

PAIR=""
WORK_DIR=""
DEST_DIR=""
VOCAB_SIZE=""
TOKENIZER_LANG=""
PAPER=0
MAX_PAIRS=""
SPM_MODEL=""
SPM_SAMPLE=10000000
MAX_SIZE=""
MAX_LEN=250
RATIO=""
EXTRA_CORPORA=()
SKIPPED=()
OPTIONS=(
    "${PREPARE_OPTIONS[@]}"
    "${FILTER_OPTIONS[@]}"
    "@positional PAIR"
    "--vocab-size value VOCAB_SIZE count"
    "--tokenizer-lang value TOKENIZER_LANG choice:joint|en|wikitext-103"
    "--spm-model value SPM_MODEL"
    "--spm-sample value SPM_SAMPLE count"
    "--max-size value MAX_SIZE size"
    "--max-pairs value MAX_PAIRS count"
    "--paper flag PAPER"
    "--extra-corpus append EXTRA_CORPORA"
    "--skip append SKIPPED choice:europarl|commoncrawl|news-commentary|rapid|wiki-titles|leta|dcep|books|setimes|un"
)
parse_options "${OPTIONS[@]}" -- "$@"
[[ -n "$PAIR" ]] || die "PAIR is required (e.g. de-en; see --help)"
use_raw_dir
[[ -z "$SPM_MODEL" ]] || SPM_MODEL="$(abs_file --spm-model "$SPM_MODEL")"
SKIP=" ${SKIPPED[*]} "

case "$PAIR" in
    cs-en | de-en | fi-en | lv-en | ru-en | tr-en | zh-en) SRC="${PAIR%-en}"; TGT=en; XX="$SRC" ;;
    en-cs | en-de | en-fi | en-lv | en-ru | en-tr | en-zh) SRC=en; TGT="${PAIR#en-}"; XX="$TGT" ;;
    *) die "PAIR: allowed cs-en de-en fi-en lv-en ru-en tr-en zh-en and the reverse directions, got '$PAIR'" ;;
esac
if [[ "$PAPER" == 1 ]]; then
    TOKENIZER_LANG="${TOKENIZER_LANG:-wikitext-103}"
    [[ "$XX" == ru || "$XX" == zh ]] && MAX_SIZE="${MAX_SIZE:-9G}"
fi
MAX_SIZE_BYTES="$([[ -z "$MAX_SIZE" ]] || parse_size "$MAX_SIZE")"
TOKENIZER_LANG="${TOKENIZER_LANG:-joint}"
VOCAB_SIZE="${VOCAB_SIZE:-32000}"
# Chinese pieces are much shorter than English words: a loose ratio filter
RATIO="${RATIO:-$([[ "$XX" == zh ]] && echo 9 || echo 1.5)}"
COVERAGE="$([[ "$XX" == zh ]] && echo 0.9995 || echo 1.0)"

WORK_DIR="${WORK_DIR:-wmt17_${SRC}_${TGT}}"
WORK_DIR="$(make_work_dir "$WORK_DIR")"
DEST_DIR="${DEST_DIR:-$WORK_DIR/data-bin}"
ORIG_DIR="$WORK_DIR/orig"
TMP="$WORK_DIR/tmp"
EXTRACTED="$WORK_DIR/extracted"

WMT17="https://data.statmt.org/wmt17/translation-task"
EP7="https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz training-parallel-europarl-v7.tgz md5:c52404583294a1b609e56d45b2ed06f5"
EP8="$WMT17/training-parallel-ep-v8.tgz training-parallel-ep-v8.tgz md5:07b77f254d189a5bfb7b43b7fc489716"
CC="https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz training-parallel-commoncrawl.tgz md5:7e0acbe86b0d7816300e14650f5b2bd4"
NC12="$WMT17/training-parallel-nc-v12.tgz training-parallel-nc-v12.tgz md5:fc6b83b809347e64f511d291e4bc8731"
RAPID="$WMT17/rapid2016.tgz rapid2016.tgz md5:17a3a1846433ad26acb95da02f93af93"
WIKI="https://www.statmt.org/wmt15/wiki-titles.tgz wiki-titles.tgz md5:f74eef43032766d55884a5073ed8ce27"
LETA="$WMT17/leta.v1.tgz leta.v1.tgz md5:3f367e86924f910cb1e969de57caf63c"
DCEP="$WMT17/dcep.lv-en.v1.tgz dcep.lv-en.v1.tgz md5:0f949102e8501dfb3c99d3e3f545b4f9"
BOOKS="$WMT17/books.lv-en.v1.tgz books.lv-en.v1.tgz md5:7073092421b1259158446870990a9ca5"
SETIMES="https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-$XX.txt.zip en-$XX.txt.zip -"
UN="https://storage.googleapis.com/tfdataset-data/downloadataset/uncorpus/UNv1.0.en-$XX.tar.gz UNv1.0.en-$XX.tar.gz -"
RAPID_NAME="rapid2016.$(printf '%s\n' "$XX" en | sort | paste -sd-)"

# corpus name | download (URL FILE CHECKSUM) | member: parallel files NAME.{lang} or a " ||| " file
CORPORA=()
case "$XX" in
    cs | de) CORPORA+=("europarl|$EP7|par:europarl-v7.$XX-en") ;;
    fi | lv) CORPORA+=("europarl|$EP8|par:europarl-v8.$XX-en") ;;
esac
case "$XX" in cs | de | ru) CORPORA+=("commoncrawl|$CC|par:commoncrawl.$XX-en") ;; esac
case "$XX" in cs | de | ru | zh) CORPORA+=("news-commentary|$NC12|par:news-commentary-v12.$XX-en") ;; esac
case "$XX" in de | fi | lv) CORPORA+=("rapid|$RAPID|par:$RAPID_NAME") ;; esac
case "$XX" in
    fi) CORPORA+=("wiki-titles|$WIKI|sep:titles.fi-en") ;;
    ru) CORPORA+=("wiki-titles|$WIKI|sep:wiki.ru-en") ;;
esac
if [[ "$XX" == lv ]]; then
    CORPORA+=("leta|$LETA|par:leta" "dcep|$DCEP|par:dcep" "books|$BOOKS|par:farewell")
fi
case "$XX" in tr) CORPORA+=("setimes|$SETIMES|par:SETIMES*.en-$XX") ;; esac
case "$XX" in ru | zh) CORPORA+=("un|$UN|par:UNv1.0.en-$XX") ;; esac

PAIR_CORPORA=()
for entry in "${CORPORA[@]}"; do PAIR_CORPORA+=("${entry%%|*}"); done
for corpus in ${SKIPPED[@]+"${SKIPPED[@]}"}; do
    [[ " ${PAIR_CORPORA[*]} " == *" $corpus "* ]] ||
        die "--skip=$corpus: not a training corpus of $PAIR; allowed: $(IFS='|'; echo "${PAIR_CORPORA[*]}")"
done

DEV="$WMT17/dev.tgz wmt17-dev.tgz md5:9b1aa63c1cf49dccdd20b962fe313989"
TEST="$WMT17/test.tgz wmt17-test.tgz md5:86a1724c276004aa25455ae2a04cef26"

log "$PAIR: tokenizer ${SPM_MODEL:-$TOKENIZER_LANG, vocabulary $VOCAB_SIZE}; pair cap: ${MAX_PAIRS:-none}; size cap: ${MAX_SIZE:+$MAX_SIZE = $MAX_SIZE_BYTES bytes}${MAX_SIZE:-none}"

# 1. downloads (all of them first: a dry run lists them and stops)
DOWNLOADS=()
for entry in "${CORPORA[@]}"; do
    IFS='|' read -r corpus download member <<<"$entry"
    [[ "$SKIP" == *" $corpus "* ]] || DOWNLOADS+=("$download")
done
DOWNLOADS+=("$DEV" "$TEST")
[[ "$TOKENIZER_LANG" == wikitext-103 && -z "$SPM_MODEL" ]] && DOWNLOADS+=("$WIKITEXT103_RAW")
for download in "${DOWNLOADS[@]}"; do
    read -r url name checksum <<<"$download"
    [[ "$checksum" == - ]] && checksum=""
    fetch "$url" "$name" "$checksum"
done
dry_run_stop

# 2. training text
mkdir -p "$TMP"
rm -f "$TMP"/raw.*
for entry in "${CORPORA[@]}"; do
    IFS='|' read -r corpus download member <<<"$entry"
    if [[ "$SKIP" == *" $corpus "* ]]; then
        log "skipping $corpus (--skip)"
        continue
    fi
    read -r url name checksum <<<"$download"
    extract "$(raw_path "$name")" "$EXTRACTED/$corpus"
    case "$member" in
        par:*)
            append_parallel "$(find_one "$EXTRACTED/$corpus" "${member#par:}.$SRC")" \
                "$(find_one "$EXTRACTED/$corpus" "${member#par:}.$TGT")" "$TMP/raw.train" "$SRC" "$TGT" ;;
        sep:*)
            # lines are "xx ||| en"
            if [[ "$SRC" == en ]]; then
                append_separated "$(find_one "$EXTRACTED/$corpus" "${member#sep:}")" " ||| " "$TMP/raw.train" "$TGT" "$SRC"
            else
                append_separated "$(find_one "$EXTRACTED/$corpus" "${member#sep:}")" " ||| " "$TMP/raw.train" "$SRC" "$TGT"
            fi ;;
    esac
done
for prefix in "${EXTRA_CORPORA[@]}"; do
    append_parallel "$prefix.$SRC" "$prefix.$TGT" "$TMP/raw.train" "$SRC" "$TGT"
done
[[ -s "$TMP/raw.train.$SRC" ]] || die "no training data collected for $PAIR"
if [[ -n "$MAX_PAIRS" ]]; then
    cap_corpus_pairs "$TMP/raw.train" "$SRC" "$TGT" "$MAX_PAIRS"
fi
if [[ -n "$MAX_SIZE" ]]; then
    cap_corpus "$TMP/raw.train" "$SRC" "$TGT" "$MAX_SIZE_BYTES"
fi

# 3. valid and test
read -r _ name _ <<<"$DEV"
extract "$(raw_path "$name")" "$EXTRACTED/dev"
read -r _ name _ <<<"$TEST"
extract "$(raw_path "$name")" "$EXTRACTED/test"
DEV_SET="$([[ "$XX" == lv || "$XX" == zh ]] && echo newsdev2017 || echo newstest2016)"
sgm_to_text "$(find_one "$EXTRACTED/dev" "$DEV_SET-$SRC$TGT-src.$SRC.sgm")" >"$TMP/raw.valid.$SRC"
sgm_to_text "$(find_one "$EXTRACTED/dev" "$DEV_SET-$SRC$TGT-ref.$TGT.sgm")" >"$TMP/raw.valid.$TGT"
sgm_to_text "$(find_one "$EXTRACTED/test" "newstest2017-$SRC$TGT-src.$SRC.sgm")" >"$TMP/raw.test.$SRC"
sgm_to_text "$(find_one "$EXTRACTED/test" "newstest2017-$SRC$TGT-ref.$TGT.sgm")" >"$TMP/raw.test.$TGT"

# 4. tokenizer and binarization
if [[ -z "$SPM_MODEL" ]]; then
    case "$TOKENIZER_LANG" in
        en) spm_inputs=("$TMP/raw.train.en") ;;
        joint) spm_inputs=("$TMP/raw.train.$SRC" "$TMP/raw.train.$TGT") ;;
        wikitext-103) spm_inputs=("$(wikitext103_train_text "$EXTRACTED/wikitext-103-raw")") ;;
    esac
    log "training a sentencepiece BPE model, vocabulary $VOCAB_SIZE, on: ${spm_inputs[*]}"
    spm_train "$TMP/spm" "$VOCAB_SIZE" "$COVERAGE" "$SPM_SAMPLE" "${spm_inputs[@]}"
    SPM_MODEL="$TMP/spm.model"
fi
spm_pipeline "$TMP" "$SRC" "$TGT" "$DEST_DIR" "$SPM_MODEL" "$SPM_MODEL" "$MAX_LEN" "$RATIO"
