#!/usr/bin/env bash
# WMT14 English-German (the Anthe and Subformer papers' main benchmark).
#
# train: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs)
# valid: newstest2013          test: newstest2014 (full release, 3003 sentences)
# Default segmentation: Moses tokenization (sacremoses), one joint BPE with subword-nmt (32K
# merges; --bpe-merges), training pairs filtered to 1..250 tokens and length ratio <= 1.5,
# fairseq-preprocess --joined-dictionary.
#
# Paper settings (--paper PAPER):
#   anthe      the Anthe paper (arXiv:2305.10991, Sec. 3) uses "the same tokenizer for all the
#              languages, which is a byte-pair encoding with 32K sub-words, trained on the
#              WikiText-103 dataset": one sentencepiece BPE model (--vocab-size 32000) learned
#              on WikiText-103's raw training text (one more download; the paper does not name
#              its BPE implementation), applied to the untokenized text of both sides, one
#              joined dictionary. --spm-model FILE reuses a model, e.g. the spm.model of
#              prepare-wmt17.sh PAIR --paper, so that every dataset shares one tokenizer as in
#              the paper.
#   subformer  the Subformer paper uses the WMT14 data as Google preprocessed it (fairseq's
#              scaling_nmt example: wmt16_en_de.tar.gz, Moses tokens, 32K joint BPE), binarized
#              as that example does (--joined-dictionary, 32768 types per side). The archive
#              sits on Google Drive, which wants a browser confirmation: download it by hand
#              and pass --raw-dir. Its tokenized newstest2013/2014 become the references of
#              tokenized BLEU (evaluate.sh).
# The default is the common fairseq-style setup (one joint BPE on our own Moses
# tokenization): it serves both model families from one dataset.
#
# usage: prepare-wmt14en2de.sh [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR]
#            [--paper anthe|subformer] [--bpe-merges N] [--vocab-size N] [--spm-model FILE]
#            [--max-len N] [--ratio R] [--src en --tgt de] [--no-verify] [--dry-run]
#   --spm-model FILE  with --paper anthe: this sentencepiece model instead of learning one
#   --raw-dir DIR  the downloads, already downloaded, under the names --dry-run lists (WMT14's
#                  dev.tgz as wmt14-dev.tgz: several WMT years share one folder); no network
#   --dry-run      list the downloads (and whether --raw-dir has them), change nothing
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

WORK_DIR="wmt14_en_de"
DEST_DIR=""
PAPER=""
BPE_MERGES="${BPE_MERGES:-32000}"
VOCAB_SIZE=32000
SPM_MODEL=""
MAX_LEN=250
RATIO=1.5
SRC=en
TGT=de
OPTIONS=(
    "${PREPARE_OPTIONS[@]}"
    "${FILTER_OPTIONS[@]}"
    "--paper value PAPER choice:anthe|subformer"
    "--bpe-merges value BPE_MERGES count"
    "--vocab-size value VOCAB_SIZE count"
    "--spm-model value SPM_MODEL"
    "--src value SRC choice:en|de"
    "--tgt value TGT choice:en|de"
)
parse_options "${OPTIONS[@]}" -- "$@"
use_raw_dir
[[ -z "$SPM_MODEL" ]] || SPM_MODEL="$(abs_file --spm-model "$SPM_MODEL")"
[[ "$SRC-$TGT" == en-de || "$SRC-$TGT" == de-en ]] || die "--src/--tgt: allowed en de or de en"
[[ -z "$SPM_MODEL" || "$PAPER" == anthe ]] || die "--spm-model: only with --paper anthe (the other settings use BPE codes)"
# Google's preprocessed WMT14 (the archive of fairseq's examples/scaling_nmt)
GOOGLE_URL="https://drive.google.com/uc?export=download&id=0B_bZck-ksdkpM25jRUN2X2UxMm8"
if [[ "$PAPER" == subformer && -z "$RAW_DIR" && "${DRY_RUN:-0}" != 1 ]]; then
    die "--paper subformer: download wmt16_en_de.tar.gz from $GOOGLE_URL (Google Drive asks for a confirmation) into a folder and pass --raw-dir FOLDER"
fi
WORK_DIR="$(make_work_dir "$WORK_DIR")"
DEST_DIR="${DEST_DIR:-$WORK_DIR/data-bin}"
ORIG_DIR="$WORK_DIR/orig"
TMP="$WORK_DIR/tmp"
EXTRACTED="$WORK_DIR/extracted"

if [[ "$PAPER" == subformer ]]; then
    fetch "$GOOGLE_URL" wmt16_en_de.tar.gz ""
    dry_run_stop
    mkdir -p "$TMP/prep"
    extract "$(raw_path wmt16_en_de.tar.gz)" "$EXTRACTED/google"
    for lang in "$SRC" "$TGT"; do
        cp "$(find_one "$EXTRACTED/google" "train.tok.clean.bpe.32000.$lang")" "$TMP/prep/train.$lang"
        cp "$(find_one "$EXTRACTED/google" "newstest2013.tok.bpe.32000.$lang")" "$TMP/prep/valid.$lang"
        cp "$(find_one "$EXTRACTED/google" "newstest2014.tok.bpe.32000.$lang")" "$TMP/prep/test.$lang"
    done
    binarize "$TMP/prep" "$SRC" "$TGT" "$DEST_DIR" --nwordssrc 32768 --nwordstgt 32768
    cp "$(find_one "$EXTRACTED/google" bpe.32000)" "$DEST_DIR/bpecodes"
    for lang in "$SRC" "$TGT"; do
        cp "$(find_one "$EXTRACTED/google" "newstest2013.$lang")" "$DEST_DIR/valid.raw.$lang"
        cp "$(find_one "$EXTRACTED/google" "newstest2014.$lang")" "$DEST_DIR/test.raw.$lang"
        cp "$(find_one "$EXTRACTED/google" "newstest2013.tok.$lang")" "$DEST_DIR/valid.tok.$lang"
        cp "$(find_one "$EXTRACTED/google" "newstest2014.tok.$lang")" "$DEST_DIR/test.tok.$lang"
    done
    write_recipe_info "$DEST_DIR" "SRC=$SRC" "TGT=$TGT" "SCHEME=moses-bpe" "SOURCE=google-wmt16_en_de" \
        "REF_TOKENS=Moses tokenizer without -a (Google's preprocessing: the data's own test.tok.$TGT)"
    log "done: $DEST_DIR ($(wc -l <"$DEST_DIR/dict.$SRC.txt") dictionary entries)"
    exit 0
fi

# URL, local file name, checksum (md5s as published with sacreBLEU and Sockeye's WMT data lists)
SOURCES=(
    "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz training-parallel-europarl-v7.tgz md5:c52404583294a1b609e56d45b2ed06f5"
    "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz training-parallel-commoncrawl.tgz md5:7e0acbe86b0d7816300e14650f5b2bd4"
    "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz training-parallel-nc-v9.tgz md5:92e42b68f9d3c2ae9722e6d1c2623e21"
    "https://www.statmt.org/wmt14/dev.tgz wmt14-dev.tgz md5:88ba3fc60b2278d59277122e1c7dd6e7"
    "https://www.statmt.org/wmt14/test-full.tgz test-full.tgz md5:a8cd784e006feb32ac6f3d9ec7eb389a"
)
[[ "$PAPER" == anthe && -z "$SPM_MODEL" ]] && SOURCES+=("$WIKITEXT103_RAW")
for entry in "${SOURCES[@]}"; do
    read -r url name checksum <<<"$entry"
    fetch "$url" "$name" "$checksum"
done
dry_run_stop
for entry in "${SOURCES[@]}"; do
    read -r url name checksum <<<"$entry"
    [[ "$name" == "$(basename "${WIKITEXT103_RAW%% *}")" ]] || extract "$(raw_path "$name")" "$EXTRACTED"
done

mkdir -p "$TMP"
rm -f "$TMP"/raw.*
for corpus in europarl-v7.de-en commoncrawl.de-en news-commentary-v9.de-en; do
    append_parallel "$(find_one "$EXTRACTED" "$corpus.$SRC")" "$(find_one "$EXTRACTED" "$corpus.$TGT")" \
        "$TMP/raw.train" "$SRC" "$TGT"
done
sgm_to_text "$(find_one "$EXTRACTED" "newstest2013-src.$SRC.sgm")" >"$TMP/raw.valid.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2013-ref.$TGT.sgm")" >"$TMP/raw.valid.$TGT"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2014-deen-src.$SRC.sgm")" >"$TMP/raw.test.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2014-deen-ref.$TGT.sgm")" >"$TMP/raw.test.$TGT"

if [[ "$PAPER" == anthe ]]; then
    if [[ -z "$SPM_MODEL" ]]; then
        text="$(wikitext103_train_text "$EXTRACTED/wikitext-103-raw")"
        log "training a sentencepiece BPE model, vocabulary $VOCAB_SIZE, on: $text"
        spm_train "$TMP/spm" "$VOCAB_SIZE" 1.0 10000000 "$text"
        SPM_MODEL="$TMP/spm.model"
    fi
    spm_pipeline "$TMP" "$SRC" "$TGT" "$DEST_DIR" "$SPM_MODEL" "$SPM_MODEL" "$MAX_LEN" "$RATIO"
else
    moses_bpe_pipeline "$TMP" "$SRC" "$TGT" "$BPE_MERGES" "$MAX_LEN" "$RATIO" "$DEST_DIR"
fi
