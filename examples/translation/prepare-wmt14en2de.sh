#!/usr/bin/env bash
# WMT14 English-German (the Anthe and Subformer papers' main benchmark).
#
# train: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs)
# valid: newstest2013          test: newstest2014 (full release, 3003 sentences)
# Moses tokenization (sacremoses), joint BPE with subword-nmt (32K merges as in the Subformer
# paper; --bpe-merges), training pairs filtered to 1..250 tokens and length ratio <= 1.5, and
# fairseq-preprocess --joined-dictionary.
#
# usage: prepare-wmt14en2de.sh [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR]
#            [--bpe-merges N] [--max-len N] [--ratio R] [--src en --tgt de] [--no-verify]
#   --raw-dir DIR  the five archives below, already downloaded (same file names); no network
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

WORK_DIR="wmt14_en_de"
DEST_DIR=""
BPE_MERGES="${BPE_MERGES:-32000}"
MAX_LEN=250
RATIO=1.5
SRC=en
TGT=de
while [[ $# -gt 0 ]]; do
    case "$1" in
        --raw-dir) require_value "$@"; RAW_DIR="$(cd "$2" && pwd)"; shift 2 ;;
        --work-dir) require_value "$@"; WORK_DIR="$2"; shift 2 ;;
        --dest-dir) require_value "$@"; DEST_DIR="$2"; shift 2 ;;
        --bpe-merges) require_value "$@"; BPE_MERGES="$2"; shift 2 ;;
        --max-len) require_value "$@"; MAX_LEN="$2"; shift 2 ;;
        --ratio) require_value "$@"; RATIO="$2"; shift 2 ;;
        --src) require_value "$@"; SRC="$2"; shift 2 ;;
        --tgt) require_value "$@"; TGT="$2"; shift 2 ;;
        --no-verify) NO_VERIFY=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ "$SRC-$TGT" == en-de || "$SRC-$TGT" == de-en ]] || die "--src/--tgt: allowed en de or de en"
mkdir -p "$WORK_DIR"
WORK_DIR="$(cd "$WORK_DIR" && pwd)"
DEST_DIR="${DEST_DIR:-$WORK_DIR/data-bin}"
ORIG_DIR="$WORK_DIR/orig"
TMP="$WORK_DIR/tmp"
EXTRACTED="$WORK_DIR/extracted"
mkdir -p "$TMP"

# URL, file name, checksum (md5s as published with sacreBLEU and Sockeye's WMT data lists)
SOURCES=(
    "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz training-parallel-europarl-v7.tgz md5:c52404583294a1b609e56d45b2ed06f5"
    "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz training-parallel-commoncrawl.tgz md5:7e0acbe86b0d7816300e14650f5b2bd4"
    "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz training-parallel-nc-v9.tgz md5:92e42b68f9d3c2ae9722e6d1c2623e21"
    "https://www.statmt.org/wmt14/dev.tgz dev.tgz md5:88ba3fc60b2278d59277122e1c7dd6e7"
    "https://www.statmt.org/wmt14/test-full.tgz test-full.tgz md5:a8cd784e006feb32ac6f3d9ec7eb389a"
)
for entry in "${SOURCES[@]}"; do
    read -r url name checksum <<<"$entry"
    fetch "$url" "$name" "$checksum"
    extract "$(raw_path "$name")" "$EXTRACTED"
done

rm -f "$TMP"/raw.*
for corpus in europarl-v7.de-en commoncrawl.de-en news-commentary-v9.de-en; do
    append_parallel "$(find_one "$EXTRACTED" "$corpus.$SRC")" "$(find_one "$EXTRACTED" "$corpus.$TGT")" \
        "$TMP/raw.train" "$SRC" "$TGT"
done
sgm_to_text "$(find_one "$EXTRACTED" "newstest2013-src.$SRC.sgm")" >"$TMP/raw.valid.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2013-ref.$TGT.sgm")" >"$TMP/raw.valid.$TGT"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2014-deen-src.$SRC.sgm")" >"$TMP/raw.test.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2014-deen-ref.$TGT.sgm")" >"$TMP/raw.test.$TGT"

moses_bpe_pipeline "$TMP" "$SRC" "$TGT" "$BPE_MERGES" "$MAX_LEN" "$RATIO" "$DEST_DIR"
