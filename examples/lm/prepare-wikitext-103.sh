#!/usr/bin/env bash
# WikiText-103 (word level, the "tokens" release: 103M training tokens, 267K word types), as
# used by the adaptive-input and Subformer language models, binarized with
# fairseq-preprocess --only-source.
#
# The original address (https://s3.amazonaws.com/research.metamind.io/wikitext/...) now
# answers 403. By default the archive is fetched from the mirror below; pass another address
# with --url, an archive you already have with --archive FILE, or a folder holding
# wikitext-103-v1.zip (or its extracted wikitext-103/wiki.*.tokens) with --raw-dir.
# The archive is checked against the SHA-1 published with GluonNLP.
#
# --gpt2-bpe: instead, the raw release (wikitext-103-raw-v1.zip) encoded with GPT-2's byte-level
# BPE (fairseq's encoder.json / vocab.bpe) and binarized with fairseq's GPT-2 dict.txt: the
# 50K vocabulary of the STLM and Anthe language models. --raw-dir then holds
# wikitext-103-raw-v1.zip, encoder.json, vocab.bpe and dict.txt.
#
# Paper vs recipe: the Subformer LMs are trained and evaluated on this word-level data as in
# fairseq's adaptive-input example (the paper's setting); the STLM and Anthe LMs assume GPT-2's
# vocabulary, which --gpt2-bpe builds the way fairseq's RoBERTa example encodes WikiText-103.
#
# usage: prepare-wikitext-103.sh [--raw-dir DIR | --archive FILE | --url URL] [--gpt2-bpe]
#            [--work-dir DIR] [--dest-dir DIR] [--no-verify] [--dry-run]
#   --work-dir default: wikitext-103, or wikitext-103-gpt2 with --gpt2-bpe (the two preparations
#              never share a folder: each deletes its own data-bin before writing it)
#   --dry-run  list the downloads (and whether --raw-dir has them), change nothing
set -euo pipefail
# shellcheck source=SCRIPTDIR/../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

URL="https://wikitext.smerity.com/wikitext-103-v1.zip"
ARCHIVE_NAME="wikitext-103-v1.zip"
CHECKSUM="sha1:0aec09a7537b58d4bb65362fee27650eeaba625a"
WORK_DIR=""
DEST_DIR=""
ARCHIVE=""
GPT2_BPE=0
OPTIONS=(
    "${PREPARE_OPTIONS[@]}"
    "--archive value ARCHIVE"
    "--url value URL"
    "--gpt2-bpe flag GPT2_BPE"
)
parse_options "${OPTIONS[@]}" -- "$@"
use_raw_dir
[[ -z "$ARCHIVE" ]] || ARCHIVE="$(abs_file --archive "$ARCHIVE")"
if [[ "$GPT2_BPE" == 1 ]]; then
    # the raw (untokenized) release; same mirror, SHA-1 as published with GluonNLP
    [[ "$URL" == */wikitext-103-v1.zip ]] && URL="${URL%/*}/wikitext-103-raw-v1.zip"
    ARCHIVE_NAME="wikitext-103-raw-v1.zip"
    CHECKSUM="sha1:86f2375181b9247049d9c9205fad2b71b274b568"
fi
[[ -n "$WORK_DIR" ]] || WORK_DIR="wikitext-103$([[ "$GPT2_BPE" == 1 ]] && echo -gpt2)"
WORK_DIR="$(make_work_dir "$WORK_DIR")"
DEST_DIR="${DEST_DIR:-$WORK_DIR/data-bin}"
ORIG_DIR="$WORK_DIR/orig"
EXTRACTED="$WORK_DIR/extracted"

GPT2="https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe"
SUFFIX="$([[ "$GPT2_BPE" == 1 ]] && echo raw || echo tokens)"
TEXT=""
if [[ -n "$RAW_DIR" && -f "$RAW_DIR/${ARCHIVE_NAME%-v1.zip}/wiki.train.$SUFFIX" ]]; then
    TEXT="$RAW_DIR/${ARCHIVE_NAME%-v1.zip}"
    log "using the extracted text in $TEXT"
elif [[ -n "$ARCHIVE" ]]; then
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        printf 'archive %s (given with --archive)\n' "$ARCHIVE"
    fi
else
    fetch "$URL" "$ARCHIVE_NAME" "$CHECKSUM"
fi
if [[ "$GPT2_BPE" == 1 ]]; then
    for name in encoder.json vocab.bpe dict.txt; do
        fetch "$GPT2/$name" "$name"
    done
fi
dry_run_stop
if [[ -z "$TEXT" ]]; then
    if [[ -n "$ARCHIVE" ]]; then
        verify_file "$ARCHIVE" "$CHECKSUM"
    else
        ARCHIVE="$(raw_path "$ARCHIVE_NAME")"
    fi
    extract "$ARCHIVE" "$EXTRACTED"
    TEXT="$(dirname "$(find_one "$EXTRACTED" "wiki.train.$SUFFIX")")"
fi

need_cmd fairseq-preprocess
rm -rf "$DEST_DIR"
mkdir -p "$DEST_DIR"
if [[ "$GPT2_BPE" == 1 ]]; then
    mkdir -p "$WORK_DIR/gpt2"
    for split in train valid test; do
        log "GPT-2 BPE encoding wiki.$split.raw"
        # one line of BPE ids per line of text (empty lines kept, as fairseq's RoBERTa recipe)
        "$PYTHON" - "$(raw_path encoder.json)" "$(raw_path vocab.bpe)" "$TEXT/wiki.$split.raw" \
            "$WORK_DIR/gpt2/wiki.$split.bpe" <<'PY'
import sys
from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
bpe = get_encoder(sys.argv[1], sys.argv[2])
with open(sys.argv[3], encoding="utf-8") as src, open(sys.argv[4], "w", encoding="utf-8") as out:
    for line in src:
        out.write(" ".join(map(str, bpe.encode(line.strip()))) + "\n")
PY
    done
    fairseq-preprocess --only-source --srcdict "$(raw_path dict.txt)" \
        --trainpref "$WORK_DIR/gpt2/wiki.train.bpe" --validpref "$WORK_DIR/gpt2/wiki.valid.bpe" \
        --testpref "$WORK_DIR/gpt2/wiki.test.bpe" --destdir "$DEST_DIR" --workers "$NUM_WORKERS"
    write_recipe_info "$DEST_DIR" "SCHEME=gpt2-bpe"
else
    fairseq-preprocess --only-source \
        --trainpref "$TEXT/wiki.train.tokens" --validpref "$TEXT/wiki.valid.tokens" \
        --testpref "$TEXT/wiki.test.tokens" --destdir "$DEST_DIR" --workers "$NUM_WORKERS"
    write_recipe_info "$DEST_DIR" "SCHEME=words"
fi
log "done: $DEST_DIR ($(wc -l <"$DEST_DIR/dict.txt") dictionary entries)"
