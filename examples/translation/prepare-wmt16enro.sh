#!/usr/bin/env bash
# WMT16 English-Romanian (setup of Lee et al. 2018, used by the Subformer paper).
#
# train: Europarl v8 + SETIMES2 (~610K pairs)
# valid: newsdev2016           test: newstest2016
# The Romanian side gets Sennrich's WMT16 normalisation (cedilla -> comma-below, quotes) and
# loses its diacritics, then both sides are Moses-tokenized (sacremoses) and share a joint BPE
# (35K merges by default; --bpe-merges), training pairs are filtered to 1..250 tokens and
# ratio <= 1.5, and fairseq-preprocess --joined-dictionary binarizes them.
#
# Paper vs recipe: the Subformer paper takes this data as Lee et al. (2018) prepared it (35K
# joint BPE); the recipe rebuilds it from the public sources the same way. Its Moses
# tokenization (sacremoses) and length filter are the usual fairseq choices; the papers do not
# spell them out.
#
# usage: prepare-wmt16enro.sh [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR]
#            [--bpe-merges N] [--max-len N] [--ratio R] [--src en --tgt ro] [--no-verify]
#            [--dry-run]
#   --raw-dir DIR  the four downloads, already downloaded, under the names --dry-run lists
#                  (WMT16's dev.tgz / test.tgz as wmt16-dev.tgz / wmt16-test.tgz: several WMT
#                  years share one folder); no network
#   --dry-run      list the downloads (and whether --raw-dir has them), change nothing
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

WORK_DIR="wmt16_en_ro"
DEST_DIR=""
BPE_MERGES="${BPE_MERGES:-35000}"
MAX_LEN=250
RATIO=1.5
SRC=en
TGT=ro
OPTIONS=(
    "${PREPARE_OPTIONS[@]}"
    "${FILTER_OPTIONS[@]}"
    "--bpe-merges value BPE_MERGES count"
    "--src value SRC choice:en|ro"
    "--tgt value TGT choice:en|ro"
)
parse_options "${OPTIONS[@]}" -- "$@"
use_raw_dir
[[ "$SRC-$TGT" == en-ro || "$SRC-$TGT" == ro-en ]] || die "--src/--tgt: allowed en ro or ro en"
WORK_DIR="$(make_work_dir "$WORK_DIR")"
DEST_DIR="${DEST_DIR:-$WORK_DIR/data-bin}"
ORIG_DIR="$WORK_DIR/orig"
TMP="$WORK_DIR/tmp"
EXTRACTED="$WORK_DIR/extracted"

# URL, local file name, checksum (dev/test md5 as published with sacreBLEU; Europarl v8 is the
# archive WMT17 republished with its md5; OPUS publishes no checksum for SETIMES2: its sha256
# is recorded on first download)
SOURCES=(
    "https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz training-parallel-ep-v8.tgz md5:07b77f254d189a5bfb7b43b7fc489716"
    "https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip en-ro.txt.zip"
    "https://data.statmt.org/wmt16/translation-task/dev.tgz wmt16-dev.tgz md5:4a3dc2760bb077f4308cce96b06e6af6"
    "https://data.statmt.org/wmt16/translation-task/test.tgz wmt16-test.tgz md5:3d809cd0c2c86adb2c67034d15c4e446"
)
for entry in "${SOURCES[@]}"; do
    read -r url name checksum <<<"$entry"
    fetch "$url" "$name" "${checksum:-}"
done
dry_run_stop
for entry in "${SOURCES[@]}"; do
    read -r url name checksum <<<"$entry"
    extract "$(raw_path "$name")" "$EXTRACTED"
done

mkdir -p "$TMP"
rm -f "$TMP"/raw.*
append_parallel "$(find_one "$EXTRACTED" "europarl-v8.ro-en.$SRC")" "$(find_one "$EXTRACTED" "europarl-v8.ro-en.$TGT")" \
    "$TMP/raw.train" "$SRC" "$TGT"
append_parallel "$(find_one "$EXTRACTED" "SETIMES*.en-ro.$SRC")" "$(find_one "$EXTRACTED" "SETIMES*.en-ro.$TGT")" \
    "$TMP/raw.train" "$SRC" "$TGT"
sgm_to_text "$(find_one "$EXTRACTED" "newsdev2016-$SRC$TGT-src.$SRC.sgm")" >"$TMP/raw.valid.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newsdev2016-$SRC$TGT-ref.$TGT.sgm")" >"$TMP/raw.valid.$TGT"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2016-$SRC$TGT-src.$SRC.sgm")" >"$TMP/raw.test.$SRC"
sgm_to_text "$(find_one "$EXTRACTED" "newstest2016-$SRC$TGT-ref.$TGT.sgm")" >"$TMP/raw.test.$TGT"

# Romanian normalisation before tokenization and BPE, on every split (references included,
# as in the published en-ro results)
for split in train valid test; do
    romanian_normalise <"$TMP/raw.$split.ro" >"$TMP/raw.$split.ro.norm"
    mv "$TMP/raw.$split.ro.norm" "$TMP/raw.$split.ro"
done

moses_bpe_pipeline "$TMP" "$SRC" "$TGT" "$BPE_MERGES" "$MAX_LEN" "$RATIO" "$DEST_DIR"
# evaluate.sh prints this next to the scores of a Romanian target
[[ "$TGT" != ro ]] || printf 'REF_NOTE=%s\n' "Romanian without diacritics (a a i s t for ă â î ș ț, as in the published en-ro results; the WMT16 references themselves have them)" >>"$DEST_DIR/recipe.info"
