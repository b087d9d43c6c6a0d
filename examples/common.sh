# shellcheck shell=bash
# Shared shell functions of the slim_fairseq recipes (examples/translation, examples/lm).
#
# Source it from a recipe:   . "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
#
# Downloads: `fetch URL FILE CHECKSUM` stores FILE under $ORIG_DIR, resumes partial downloads
# (curl -C -), uses a short connect timeout and a stall timeout so that an offline machine gets
# a clear error instead of a hang, and verifies CHECKSUM ("md5:HEX", "sha1:HEX", "sha256:HEX";
# empty = none published: the sha256 is recorded next to the file and checked on later runs).
# With RAW_DIR set (`--raw-dir DIR`), nothing touches the network: FILE must already be in DIR.

# ---------------------------------------------------------------------------------------------
# messages and tools

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# the recipe's name, for its error lines (also in the Python snippets it runs)
RECIPE_NAME="$(basename "$0")"
export RECIPE_NAME

# die MESSAGE: the one error line every recipe prints, "PROGRAM: error: MESSAGE", and exit 1
die() {
    printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2
    exit 1
}

need_cmd() {
    local cmd
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 || die "'$cmd' not found on PATH (activate the environment that has slim_fairseq's requirements)"
    done
}

PYTHON="${PYTHON:-python3}"
NUM_WORKERS="${NUM_WORKERS:-$(nproc 2>/dev/null || echo 4)}"
CONNECT_TIMEOUT="${CONNECT_TIMEOUT:-15}"
EXAMPLES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$EXAMPLES_DIR/.." && pwd)"

# lab_launcher ARGS...: `python -m slim_fairseq_lab.launcher ARGS...` of this checkout, where the
# fairseq command lines of the comparisons below and the malloc settings are defined, for the
# Python tools and the recipes alike (standard library only: any python3 runs it)
lab_launcher() {
    PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slim_fairseq_lab.launcher "$@"
}

# glibc's malloc: keep blocks up to 256 MiB in the heap instead of taking fresh pages from the
# kernel for every large tensor at every step (on CPU a third of the training time went to page
# faults; the results are the same). The values are slim_fairseq_lab.launcher's ALLOCATOR_ENV,
# which every tool the Python side starts gets too; exported values win.
# docs/TRAINING.md#cpu-memory-allocator
_allocator_env="$(lab_launcher allocator-env)" ||
    die "cannot read the malloc settings (PYTHON=$PYTHON -m slim_fairseq_lab.launcher allocator-env)"
while IFS='=' read -r _name _value; do
    export "$_name=${!_name:-$_value}"
done <<<"$_allocator_env"
unset _allocator_env _name _value

# The plugin directory for --user-dir: the installed package's console script when present,
# else the repository checkout this file lives in.
slim_user_dir() {
    if [[ -n "${SLIM_USER_DIR:-}" ]]; then
        printf '%s\n' "$SLIM_USER_DIR"
    elif command -v slim-fairseq-user-dir >/dev/null 2>&1; then
        slim-fairseq-user-dir
    else
        printf '%s\n' "$REPO_ROOT/slim_fairseq"
    fi
}

# print_header FILE: the comment block at the top of a script (after the #! line, up to the
# first line that is not a comment), without the leading "# "; every script's --help.
print_header() {
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"
}

# usage: the running script's header (the script was started as `bash SCRIPT` or ./SCRIPT)
usage() { print_header "$0"; }

# abs_dir FLAG DIR -> absolute path of DIR, or a one-line error naming FLAG
abs_dir() {
    [[ -d "$2" && -r "$2" && -x "$2" ]] || die "$1: '$2' is not a readable folder"
    (cd "$2" && pwd)
}

# abs_file FLAG FILE -> absolute path of FILE, or a one-line error naming FLAG
abs_file() {
    [[ -f "$2" && -r "$2" ]] || die "$1: '$2' is not a readable file"
    printf '%s/%s\n' "$(cd "$(dirname "$2")" && pwd)" "$(basename "$2")"
}

# make_work_dir DIR -> absolute path of DIR, created unless this is a dry run
make_work_dir() {
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        realpath -m "$1"
    else
        mkdir -p "$1" || die "cannot create the folder '$1'"
        (cd "$1" && pwd)
    fi
}

# ---------------------------------------------------------------------------------------------
# downloads

# Default state of the download options; recipes override them from their command line.
RAW_DIR="${RAW_DIR:-}"
NO_VERIFY="${NO_VERIFY:-0}"

# the options every prepare script shares (parse_options declarations; the script sets WORK_DIR
# and DEST_DIR first), then use_raw_dir after parsing
# shellcheck disable=SC2034  # read by the prepare scripts
PREPARE_OPTIONS=(
    "--raw-dir value RAW_DIR"
    "--work-dir value WORK_DIR"
    "--dest-dir value DEST_DIR"
    "--no-verify flag NO_VERIFY"
    "--dry-run flag DRY_RUN"
)

# the length filter of the training pairs (clean_corpus) in the translation prepare scripts
# shellcheck disable=SC2034  # read by the prepare scripts
FILTER_OPTIONS=(
    "--max-len value MAX_LEN count"
    "--ratio value RATIO positive"
)

# use_raw_dir: RAW_DIR (given with --raw-dir) as an absolute path, or a one-line error
use_raw_dir() {
    [[ -z "$RAW_DIR" ]] || RAW_DIR="$(abs_dir --raw-dir "$RAW_DIR")"
}

# file_checksum ALGO FILE -> hex digest
file_checksum() {
    local algo="$1" file="$2"
    case "$algo" in
        md5 | sha1 | sha256) "${algo}sum" "$file" | cut -d' ' -f1 ;;
        *) die "unknown checksum algorithm '$algo' (allowed: md5, sha1, sha256)" ;;
    esac
}

# verify_file FILE CHECKSUM
verify_file() {
    local file="$1" spec="$2" algo want got
    if [[ "$NO_VERIFY" == 1 ]]; then
        log "not verifying $(basename "$file") (--no-verify)"
        return 0
    fi
    if [[ -z "$spec" ]]; then
        # No published checksum: trust on first use, then keep the file unchanged.
        if [[ -f "$file.sha256" ]]; then
            spec="sha256:$(cat "$file.sha256")"
        else
            got="$(file_checksum sha256 "$file")"
            if [[ -w "$(dirname "$file")" ]]; then
                printf '%s\n' "$got" >"$file.sha256"
            fi
            log "$(basename "$file"): no published checksum; sha256 $got, size $(stat -c %s "$file") bytes"
            return 0
        fi
    fi
    algo="${spec%%:*}"
    want="${spec#*:}"
    got="$(file_checksum "$algo" "$file")"
    if [[ "$got" != "$want" ]]; then
        die "$file: $algo checksum $got does not match the expected $want (delete the file to download it again, or pass --no-verify if you trust it)"
    fi
    log "$(basename "$file"): $algo ok"
}

# fetch URL FILE [CHECKSUM]: make $ORIG_DIR/FILE exist (download, resume, verify).
# FILE is the local name; it differs from the last part of URL where several datasets publish
# files of the same name (WMT's dev.tgz and test.tgz: wmt16-dev.tgz, wmt17-dev.tgz, ...), so
# that one --raw-dir folder can hold the downloads of every recipe. With --raw-dir, a file
# under the download name is accepted too when its checksum is the expected one.
# With DRY_RUN=1 it only reports what it would do.
declare -A FETCHED=()
fetch() {
    local url="$1" name="$2" spec="${3:-}" dest host rc base
    base="$(basename "$url")"
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        dest="$(raw_path "$name" "$url")"
        printf 'download %s\n    -> %s (%s, %s)\n' "$url" "$dest" "${spec:-no published checksum}" \
            "$([[ -e "$dest" ]] && echo present || echo missing)"
        return 0
    fi
    if [[ -n "$RAW_DIR" ]]; then
        dest="$RAW_DIR/$name"
        if [[ ! -e "$dest" && "$base" != "$name" && -e "$RAW_DIR/$base" ]]; then
            dest="$RAW_DIR/$base"
            if [[ -n "$spec" && "$NO_VERIFY" != 1 ]] &&
                [[ "$(file_checksum "${spec%%:*}" "$dest")" != "${spec#*:}" ]]; then
                die "--raw-dir: $dest is not the file of $url (${spec%%:*} differs; another dataset's $base?): save that download as $RAW_DIR/$name"
            fi
        fi
        [[ -e "$dest" ]] || die "--raw-dir: $RAW_DIR/$name is missing (download $url and save it under that name)"
        verify_file "$dest" "$spec"
        FETCHED[$name]="$dest"
        return 0
    fi
    dest="$ORIG_DIR/$name"
    mkdir -p "$ORIG_DIR"
    if [[ -f "$dest" ]]; then
        verify_file "$dest" "$spec"
        FETCHED[$name]="$dest"
        return 0
    fi
    need_cmd curl
    host="$(printf '%s' "$url" | sed -E 's#^[a-z]+://([^/:]+).*#\1#')"
    log "downloading $url"
    rc=0
    curl --fail --location --continue-at - --connect-timeout "$CONNECT_TIMEOUT" \
        --speed-limit 1024 --speed-time 120 --retry 3 --retry-delay 5 \
        --output "$dest.part" "$url" || rc=$?
    case "$rc" in
        0) ;;
        5 | 6 | 7 | 28 | 35)
            die "cannot reach $host (curl exit $rc: offline, DNS or firewall?). Download $url by other means into a folder (as $name) and rerun with --raw-dir FOLDER" ;;
        22) die "$url answered with an HTTP error; the source may have moved (pass --raw-dir with a copy)" ;;
        *) die "download of $url failed (curl exit $rc); rerun to resume ($dest.part is kept)" ;;
    esac
    mv "$dest.part" "$dest"
    verify_file "$dest" "$spec"
    FETCHED[$name]="$dest"
}

# raw_path FILE [URL] -> where fetch put (or would put) FILE
raw_path() {
    local name="$1" url="${2:-}"
    if [[ -n "${FETCHED[$name]:-}" ]]; then
        printf '%s\n' "${FETCHED[$name]}"
    elif [[ -n "$RAW_DIR" ]]; then
        if [[ ! -e "$RAW_DIR/$name" && -n "$url" && -e "$RAW_DIR/$(basename "$url")" ]]; then
            printf '%s\n' "$RAW_DIR/$(basename "$url")"
        else
            printf '%s\n' "$RAW_DIR/$name"
        fi
    else
        printf '%s\n' "$ORIG_DIR/$name"
    fi
}

# dry_run_stop: after the downloads were listed, a dry run ends here
dry_run_stop() {
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        log "dry run: nothing was downloaded, extracted or written"
        exit 0
    fi
}

# extract ARCHIVE DEST_DIR (tar, tgz, tar.gz, zip, gz); a finished extraction is not redone.
extract() {
    local archive="$1" dest="$2" stamp
    stamp="$dest/.extracted.$(basename "$archive")"
    [[ -f "$stamp" ]] && return 0
    mkdir -p "$dest"
    log "extracting $(basename "$archive")"
    case "$archive" in
        *.tgz | *.tar.gz) tar -xzf "$archive" -C "$dest" ;;
        *.tar) tar -xf "$archive" -C "$dest" ;;
        *.zip) "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$dest" ;;
        *.gz) gzip -dc "$archive" >"$dest/$(basename "${archive%.gz}")" ;;
        *) die "do not know how to extract $archive" ;;
    esac
    touch "$stamp"
}

# find_one DIR NAME: the single file called NAME anywhere below DIR (archives differ in
# whether they keep a leading folder).
find_one() {
    local dir="$1" name="$2" hit
    hit="$(find "$dir" -type f -name "$name" | sort | head -n 1)"
    [[ -n "$hit" ]] || die "expected a file named $name inside $dir (is the archive complete?)"
    printf '%s\n' "$hit"
}

# ---------------------------------------------------------------------------------------------
# option parsing helpers

# parse_size 9G -> bytes (K, M, G, T suffixes, powers of 1024)
parse_size() {
    local value="$1" number unit
    number="${value%[KkMmGgTt]}"
    unit="${value#"$number"}"
    [[ "$number" =~ ^[0-9]+$ ]] || die "bad size '$value' (examples: 500M, 9G)"
    case "$unit" in
        "") printf '%s\n' "$number" ;;
        K | k) printf '%s\n' $((number * 1024)) ;;
        M | m) printf '%s\n' $((number * 1024 * 1024)) ;;
        G | g) printf '%s\n' $((number * 1024 * 1024 * 1024)) ;;
        T | t) printf '%s\n' $((number * 1024 * 1024 * 1024 * 1024)) ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# the command line: one parser for every recipe
#
# parse_options DECLARATION... -- ARGS...: reads ARGS with the DECLARATIONs, one string per
# option (a recipe keeps them in an array: parse_options "${OPTIONS[@]}" -- "$@"), and assigns
# the variables they name in the caller's scope (its locals included). The parser is
# slim_fairseq_lab/recipe_options.py, whose docstring gives the declarations:
#   "--name value VAR [TYPE]", "--name append VAR [TYPE]", "--name flag VAR",
#   "--name set VAR VALUE", "--name one VAR VALUE", "--name refuse WHY",
#   "@positional VAR...", "@unknown pass ARRAY", "@help FUNCTION";
# TYPE: count, whole, positive, fraction, size or choice:a|b|c. Errors are one line, exit 2.
parse_options() {
    local _po_code
    _po_code="$(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slim_fairseq_lab.recipe_options \
        "$(basename "$0")" "$@")" || exit $?
    eval "$_po_code"
}

# parse_options_later ...: as parse_options, but a bad command line sets what it could read and
# PARSE_ERROR (the one-line message) instead of exiting; refuse_parse_error exits with it. An
# evaluation script removes its earlier results in between, so that a refused run leaves none.
parse_options_later() {
    local _po_code
    PARSE_ERROR=""
    _po_code="$(PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slim_fairseq_lab.recipe_options \
        --later "$(basename "$0")" "$@")" || exit $?
    eval "$_po_code"
}

refuse_parse_error() {
    [[ -z "${PARSE_ERROR:-}" ]] || { printf '%s\n' "$PARSE_ERROR" >&2; exit 2; }
}

# whole_number FLAG VALUE: VALUE is a whole number, or a one-line error naming FLAG
whole_number() {
    [[ "$2" =~ ^[0-9]+$ ]] || die "$1: a whole number, got '$2'"
}

# ---------------------------------------------------------------------------------------------
# text processing (WMT formats, Moses tokenization, cleaning)

# sgm_to_text FILE.sgm > FILE.txt: the <seg> contents of a WMT SGML file, one per line
# (kept as written, like sacreBLEU's reading of the same files).
sgm_to_text() {
    "$PYTHON" - "$1" <<'PY'
import re, sys
seg = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        m = seg.search(line)
        if m:
            print(" ".join(m.group(1).split()))
PY
}

# moses_tokenize LANG < raw > tokenized: punctuation normalisation + Moses tokenizer (sacremoses,
# aggressive hyphen splitting, XML escaping as tokenizer.perl does by default); with several
# workers sacremoses shows a progress bar on stderr (minutes for a WMT training corpus).
moses_tokenize() {
    sacremoses -l "$1" -j "$NUM_WORKERS" normalize -c tokenize -a
}

# moses_detokenize LANG < tokenized > raw
moses_detokenize() {
    sacremoses -q -l "$1" -j "$NUM_WORKERS" detokenize -x
}

# romanian_normalise < text > text: Sennrich's WMT16 Romanian preprocessing, rewritten: cedilla
# s/t become comma-below, typographic quotes become ", then all Romanian diacritics are removed
# (ă â î ș ț -> a a i s t, same for capitals).
romanian_normalise() {
    "$PYTHON" -c '
import sys
table = str.maketrans({
    "\u015e": "S", "\u015f": "s", "\u0218": "S", "\u0219": "s",
    "\u0162": "T", "\u0163": "t", "\u021a": "T", "\u021b": "t",
    "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a",
    "\u00ce": "I", "\u00ee": "i",
    "\u201e": "\"", "\u201d": "\"", "\u201c": "\"", "\u00ab": "\"", "\u00bb": "\"",
})
for line in sys.stdin:
    sys.stdout.write(line.translate(table))
'
}

# append_parallel SRC_FILE TGT_FILE OUT_PREFIX S T: append a parallel corpus, dropping
# pairs where a side is empty; lines are stripped of carriage returns and surrounding blanks.
append_parallel() {
    "$PYTHON" - "$@" <<'PY'
import os, sys
src_file, tgt_file, prefix, s, t = sys.argv[1:6]
kept = dropped = 0
with open(src_file, encoding="utf-8", errors="replace", newline="\n") as fs, \
     open(tgt_file, encoding="utf-8", errors="replace", newline="\n") as ft, \
     open(f"{prefix}.{s}", "a", encoding="utf-8") as os_, \
     open(f"{prefix}.{t}", "a", encoding="utf-8") as ot:
    for a, b in zip(fs, ft):
        a, b = " ".join(a.split()), " ".join(b.split())
        if a and b:
            os_.write(a + "\n"); ot.write(b + "\n"); kept += 1
        else:
            dropped += 1
    if fs.readline() or ft.readline():
        sys.exit(f"{os.environ['RECIPE_NAME']}: error: {src_file} and {tgt_file} have different line counts")
print(f"{src_file}: kept {kept} pairs, dropped {dropped} with an empty side", file=sys.stderr)
PY
}

# append_separated FILE SEP OUT_PREFIX S T: append a corpus whose lines are "s SEP t"
# (tab-separated files, WMT wiki-titles " ||| ").
append_separated() {
    "$PYTHON" - "$@" <<'PY'
import sys
path, sep, prefix, s, t = sys.argv[1:6]
sep = "\t" if sep == "TAB" else sep
kept = 0
with open(path, encoding="utf-8", errors="replace") as f, \
     open(f"{prefix}.{s}", "a", encoding="utf-8") as os_, \
     open(f"{prefix}.{t}", "a", encoding="utf-8") as ot:
    for line in f:
        parts = line.rstrip("\n").split(sep)
        if len(parts) < 2:
            continue
        a, b = " ".join(parts[0].split()), " ".join(parts[1].split())
        if a and b:
            os_.write(a + "\n"); ot.write(b + "\n"); kept += 1
print(f"{path}: kept {kept} pairs", file=sys.stderr)
PY
}

# clean_corpus IN_PREFIX S T OUT_PREFIX MIN MAX RATIO: length filtering as Moses'
# clean-corpus-n.perl: keep pairs with MIN..MAX tokens on both sides and a length ratio <= RATIO.
clean_corpus() {
    "$PYTHON" - "$@" <<'PY'
import sys
inp, s, t, out, lo, hi, ratio = sys.argv[1:8]
lo, hi, ratio = int(lo), int(hi), float(ratio)
kept = total = 0
with open(f"{inp}.{s}", encoding="utf-8") as fs, open(f"{inp}.{t}", encoding="utf-8") as ft, \
     open(f"{out}.{s}", "w", encoding="utf-8") as os_, open(f"{out}.{t}", "w", encoding="utf-8") as ot:
    for a, b in zip(fs, ft):
        total += 1
        na, nb = len(a.split()), len(b.split())
        if not (lo <= na <= hi and lo <= nb <= hi):
            continue
        if na / nb > ratio or nb / na > ratio:
            continue
        os_.write(a); ot.write(b); kept += 1
print(f"length filter {lo}..{hi}, ratio {ratio}: kept {kept} of {total} pairs", file=sys.stderr)
PY
    [[ -s "$4.$2" ]] || die "--max-len $6 / --ratio $7: the length filter kept none of the training pairs; allowed: a larger --max-len or --ratio"
}

# cap_corpus_pairs PREFIX S T MAX_PAIRS: keep the first MAX_PAIRS pairs of a parallel corpus
# (the Anthe paper trained ru-en and zh-en on their first 7M pairs)
cap_corpus_pairs() {
    local prefix="$1" s="$2" t="$3" max="$4" side total
    total="$(wc -l <"$prefix.$s")"
    for side in "$s" "$t"; do
        head -n "$max" "$prefix.$side" >"$prefix.cap.$side"
        mv "$prefix.cap.$side" "$prefix.$side"
    done
    log "pair cap $max: kept $(wc -l <"$prefix.$s") of $total pairs"
}

# cap_corpus PREFIX S T MAX_BYTES: keep the first lines of a parallel corpus whose two sides
# together fit in MAX_BYTES
cap_corpus() {
    "$PYTHON" - "$@" <<'PY'
import os, sys
prefix, s, t, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
used = kept = 0
with open(f"{prefix}.{s}", "rb") as fs, open(f"{prefix}.{t}", "rb") as ft, \
     open(f"{prefix}.cap.{s}", "wb") as os_, open(f"{prefix}.cap.{t}", "wb") as ot:
    for a, b in zip(fs, ft):
        if used + len(a) + len(b) > cap:
            break
        used += len(a) + len(b); kept += 1
        os_.write(a); ot.write(b)
for side in (s, t):
    os.replace(f"{prefix}.cap.{side}", f"{prefix}.{side}")
print(f"corpus cap {cap} bytes: kept {kept} pairs ({used} bytes)", file=sys.stderr)
PY
}

# ---------------------------------------------------------------------------------------------
# training / evaluation helpers

# compound_split < tokenized > split: "a-b" -> "a ##AT##-##AT## b" (Moses' "@-@" becomes
# "@ ##AT##-##AT## @"), the rule of fairseq's scripts/compound_split_bleu.sh. It is the
# WMT14 English->German convention of tokenized BLEU, for German targets only.
compound_split() { sed -E 's/([^[:space:]])-([^[:space:]])/\1 ##AT##-##AT## \2/g'; }

# bleu_tokenize LANG < text > tokens: the tokenization of tokenized BLEU, as fairseq's
# compound_split_bleu.sh sees its inputs: the Moses tokenizer (-a, XML escaping as the
# training text had) without punctuation normalisation (fairseq's prepare-wmt14en2de.sh
# only tokenizes the test sets), then compound splitting when LANG is German.
bleu_tokenize() {
    need_cmd sacremoses
    sacremoses -q -l "$1" -j "$NUM_WORKERS" tokenize -a | bleu_split "$1"
}

# bleu_split LANG < tokens > tokens: compound splitting for German, unchanged otherwise
bleu_split() {
    if [[ "$1" == de ]]; then compound_split; else cat; fi
}

# bleu_tokenization_name LANG [REFS]: how tokenized BLEU tokenizes LANG (printed in the
# reports). REFS describes the tokens of references the data ships (Google's WMT14: Moses
# without -a), which the hypotheses then keep as generated; without it, both sides go through
# the Moses tokenizer with -a.
bleu_tokenization_name() {
    local how="${2:-Moses tokenizer -a}"
    if [[ "$1" == de ]]; then
        printf '%s + compound splitting (German target)\n' "$how"
    else
        printf '%s, no compound splitting (target %s)\n' "$how" "$1"
    fi
}

# Scoring per target language (examples/translation/README.md#evaluate). The Moses tokenizer
# does not segment Chinese or Japanese (a sentence stays one or a few "tokens", so tokenized
# BLEU is near 0 whatever the translation): for those targets the length penalty is chosen,
# and the translation scored, with sacreBLEU's own tokenizer for the language.
# sacrebleu_tokenizer LANG -> the sacreBLEU tokenizer of LANG (13a, sacreBLEU's default, for
# languages the Moses tokenizer segments)
sacrebleu_tokenizer() {
    case "$1" in
        zh) printf 'zh\n' ;;
        ja) printf 'ja-mecab\n' ;;
        *) printf '13a\n' ;;
    esac
}

# moses_segments LANG: true when the Moses tokenizer segments LANG (tokenized BLEU means
# something for it)
moses_segments() {
    [[ "$(sacrebleu_tokenizer "$1")" == 13a ]]
}

# check_sacrebleu_tokenizer LANG: a one-line error before anything runs when sacreBLEU cannot
# build LANG's tokenizer (ja-mecab needs mecab-python3 and ipadic: pip install "sacrebleu[ja]")
check_sacrebleu_tokenizer() {
    local tok
    tok="$(sacrebleu_tokenizer "$1")"
    [[ "$tok" == ja-mecab ]] || return 0
    "$PYTHON" -c 'from sacrebleu.tokenizers.tokenizer_ja_mecab import TokenizerJaMecab; TokenizerJaMecab()' \
        >/dev/null 2>&1 ||
        die "target ja: sacreBLEU's ja-mecab tokenizer does not load in $PYTHON (pip install \"sacrebleu[ja]\": mecab-python3 and ipadic)"
}

# show_progress PID FILE PATTERN TOTAL WHAT: while process PID runs, log every
# PROGRESS_INTERVAL seconds (default 30) "WHAT: N of TOTAL", N the lines of FILE that match
# PATTERN; with an empty PATTERN, how long it has been running
show_progress() {
    local pid="$1" file="$2" pattern="$3" total="$4" what="$5" ticks=0 done_lines
    local every=$((${PROGRESS_INTERVAL:-30} * 5))
    while kill -0 "$pid" 2>/dev/null; do
        sleep 0.2
        ticks=$((ticks + 1))
        ((ticks % every == 0)) || continue
        if [[ -n "$pattern" ]]; then
            done_lines="$(grep -c -- "$pattern" "$file" 2>/dev/null || true)"
            log "$what: ${done_lines:-0} of $total"
        else
            log "$what: running for $((ticks / 5)) s"
        fi
    done
}

# line_count FILE: its lines, a last line without a final newline included (wc -l skips it)
line_count() { awk 'END { print NR }' "$1"; }

# ceil_div A B
ceil_div() { printf '%s\n' $((($1 + $2 - 1) / $2)); }

# gpu_count: visible CUDA devices (0 without torch.cuda)
gpu_count() {
    "$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
}

# run_or_print CMD...: print the command (always) and run it unless DRY_RUN=1
run_or_print() {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    if [[ "${DRY_RUN:-0}" != 1 ]]; then
        "$@"
    fi
}

# checkpoint_name CKPT AVG OUT_DIR -> the file resolve_checkpoint will evaluate (before any check
# or averaging): where an evaluation's outputs and results are named from
checkpoint_name() {
    if [[ -d "$1" && "$2" != 1 ]]; then
        printf '%s\n' "$3/average_last$2.pt"
    elif [[ -d "$1" ]]; then
        printf '%s\n' "$1/checkpoint_best.pt"
    else
        printf '%s\n' "$1"
    fi
}

# resolve_checkpoint CKPT AVG OUT_DIR: set MODEL to the checkpoint to evaluate. CKPT is a file,
# or a folder: its checkpoint_best.pt, or with AVG > 1 the average of its last AVG update
# checkpoints (checkpoint_E_U.pt, by update number; epoch checkpoints checkpointE.pt, by epoch
# number, when there are not enough), written to OUT_DIR; AVERAGED (array) then holds the
# averaged files, oldest first. Everything is checked before OUT_DIR is created.
resolve_checkpoint() {
    local ckpt="$1" avg="$2" out_dir="$3" mode n_update n_epoch averaged
    AVERAGED=()
    [[ "$avg" =~ ^[1-9][0-9]*$ ]] || die "--avg: a whole number >= 1, got '$avg'"
    if [[ -f "$ckpt" ]]; then
        [[ "$avg" == 1 ]] || die "--avg $avg needs a checkpoint folder, got the file $ckpt"
        MODEL="$ckpt"
    elif [[ -d "$ckpt" && "$avg" == 1 ]]; then
        MODEL="$ckpt/checkpoint_best.pt"
        [[ -f "$MODEL" ]] || die "checkpoint $MODEL not found (pass a checkpoint file, or --avg N to average the last N)"
    elif [[ -d "$ckpt" ]]; then
        n_update="$(find "$ckpt" -maxdepth 1 -name 'checkpoint_*_*.pt' | wc -l)"
        n_epoch="$(find "$ckpt" -maxdepth 1 -regex '.*/checkpoint[0-9]+\.pt' | wc -l)"
        if [[ "$n_update" -ge "$avg" ]]; then
            mode=--num-update-checkpoints
        elif [[ "$n_epoch" -ge "$avg" ]]; then
            mode=--num-epoch-checkpoints
        else
            die "--avg $avg: $ckpt holds $n_update update checkpoints (checkpoint_E_U.pt) and $n_epoch epoch checkpoints (checkpointE.pt), fewer than $avg"
        fi
        mkdir -p "$out_dir"
        MODEL="$out_dir/average_last$avg.pt"
        averaged="$("$PYTHON" "$REPO_ROOT/scripts/average_checkpoints.py" --inputs "$ckpt" "$mode" "$avg" \
            --output "$MODEL" --quiet)" || die "averaging the last $avg checkpoints of $ckpt failed"
        mapfile -t AVERAGED <<<"$averaged"
        log "--avg $avg: $MODEL is the average of ${AVERAGED[*]##*/} (in $ckpt)"
    else
        die "checkpoint $ckpt not found"
    fi
}

# subset_tokens DATA_BIN SUBSET -> the tokens of the binarized SUBSET of a language-modelling
# DATA_BIN (end-of-line symbols included: what fairseq-eval-lm scores) and, on a second line,
# those of its longest line; fails when it has none.
# Read from the index file's list of item sizes (the layouts of fairseq's mmap and legacy
# indexed datasets, data/indexed_dataset.py), without loading fairseq.
subset_tokens() {
    "$PYTHON" - "${1%%:*}/$2.idx" <<'PY'
import struct, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    head = f.read(9)
    if head == b"MMIDIDX\x00\x00":  # version <Q, dtype code <B, count <Q, then int32 sizes
        f.read(9)
        (count,) = struct.unpack("<Q", f.read(8))
        sizes = np.fromfile(f, dtype=np.int32, count=count)
    elif head[:8] == b"TNTIDX\x00\x00":  # version <Q, code and element size <QQ, count and s
        f.seek(32)                        # <QQ, then two int64 offset tables, then s sizes
        count, s = struct.unpack("<QQ", f.read(16))
        f.seek(48 + 16 * (count + 1))
        sizes = np.fromfile(f, dtype=np.int64, count=s)
    else:
        sys.exit(f"{sys.argv[1]}: not a fairseq index file")
print(int(sizes.sum()))
print(int(sizes.max()) if len(sizes) else 0)
PY
}

# ---------------------------------------------------------------------------------------------
# the two preprocessing pipelines

# write_recipe_info DEST KEY=VALUE...: facts the evaluate scripts need (languages, scheme)
write_recipe_info() {
    local dest="$1"
    shift
    printf '%s\n' "$@" >"$dest/recipe.info"
}

# read_recipe_info DATA KEY -> value ("" when absent)
read_recipe_info() {
    local file="$1/recipe.info"
    [[ -f "$file" ]] || return 0
    sed -n "s/^$2=//p" "$file" | head -n 1
}

# binarize PREP S T DEST [fairseq-preprocess options]: one joined dictionary (unless the
# options say --no-joined, which drops it: one dictionary per side)
binarize() {
    local prep="$1" s="$2" t="$3" dest="$4" joined=(--joined-dictionary) extra=() arg
    shift 4
    for arg in "$@"; do
        if [[ "$arg" == --no-joined ]]; then joined=(); else extra+=("$arg"); fi
    done
    need_cmd fairseq-preprocess
    rm -rf "$dest"
    mkdir -p "$dest"
    fairseq-preprocess --source-lang "$s" --target-lang "$t" \
        --trainpref "$prep/train" --validpref "$prep/valid" --testpref "$prep/test" \
        --destdir "$dest" "${joined[@]}" --workers "$NUM_WORKERS" "${extra[@]}"
}

# moses_bpe_pipeline WORK S T MERGES MAX_LEN RATIO DEST
#   WORK/raw.{train,valid,test}.{S,T} (untokenized text) -> Moses tokenization, joint BPE with
#   subword-nmt (MERGES merge operations learned on the training text of both languages),
#   length filtering of the training pairs (1..MAX_LEN BPE tokens, ratio <= RATIO), and
#   fairseq-preprocess --joined-dictionary into DEST. Untokenized test text is kept next to
#   the binary data (test.raw.*) for detokenized sacreBLEU.
moses_bpe_pipeline() {
    local work="$1" s="$2" t="$3" merges="$4" max_len="$5" ratio="$6" dest="$7" split lang
    need_cmd sacremoses subword-nmt
    local prep="$work/prep"
    mkdir -p "$prep"
    for split in train valid test; do
        for lang in "$s" "$t"; do
            log "tokenizing $split.$lang"
            moses_tokenize "$lang" <"$work/raw.$split.$lang" >"$work/tok.$split.$lang"
        done
    done
    log "learning $merges joint BPE merges"
    cat "$work/tok.train.$s" "$work/tok.train.$t" | subword-nmt learn-bpe -s "$merges" >"$work/code"
    for split in train valid test; do
        for lang in "$s" "$t"; do
            subword-nmt apply-bpe -c "$work/code" --num-workers "$NUM_WORKERS" \
                <"$work/tok.$split.$lang" >"$work/bpe.$split.$lang"
        done
    done
    clean_corpus "$work/bpe.train" "$s" "$t" "$prep/train" 1 "$max_len" "$ratio"
    for split in valid test; do
        for lang in "$s" "$t"; do
            cp "$work/bpe.$split.$lang" "$prep/$split.$lang"
        done
    done
    binarize "$prep" "$s" "$t" "$dest"
    cp "$work/code" "$dest/bpecodes"
    for split in valid test; do
        for lang in "$s" "$t"; do
            cp "$work/raw.$split.$lang" "$dest/$split.raw.$lang"
        done
    done
    write_recipe_info "$dest" "SRC=$s" "TGT=$t" "SCHEME=moses-bpe"
    log "done: $dest ($(wc -l <"$dest/dict.$s.txt") dictionary entries)"
}

# The Anthe paper's tokenizer (arXiv:2305.10991, Sec. 3): one 32K BPE trained on WikiText-103,
# for every language; the recipes learn it on the raw release's training text.
WIKITEXT103_RAW="https://wikitext.smerity.com/wikitext-103-raw-v1.zip wikitext-103-raw-v1.zip sha1:86f2375181b9247049d9c9205fad2b71b274b568"

# wikitext103_train_text DIR -> path of wiki.train.raw, extracted into DIR from the download of
# WIKITEXT103_RAW (fetched by the recipe)
wikitext103_train_text() {
    local name
    read -r _ name _ <<<"$WIKITEXT103_RAW"
    extract "$(raw_path "$name")" "$1"
    find_one "$1" wiki.train.raw
}

# spm_train MODEL_PREFIX VOCAB COVERAGE SAMPLE FILE...: sentencepiece BPE model
spm_train() {
    local prefix="$1" vocab="$2" coverage="$3" sample="$4"
    shift 4
    "$PYTHON" - "$prefix" "$vocab" "$coverage" "$sample" "$@" <<'PY'
import sys
import sentencepiece as spm
prefix, vocab, coverage, sample, *files = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=",".join(files), model_prefix=prefix, vocab_size=int(vocab), model_type="bpe",
    character_coverage=float(coverage), input_sentence_size=int(sample),
    shuffle_input_sentence=True, num_threads=1, minloglevel=1,
)
PY
}

# spm_encode MODEL < text > pieces (space-separated); every million lines, a progress line on
# stderr
spm_encode() {
    "$PYTHON" -c '
import sys, time
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
start = time.time()
for n, line in enumerate(sys.stdin, 1):
    print(" ".join(sp.encode(line.rstrip("\n"), out_type=str)))
    if n % 1000000 == 0:
        print(f"  {n:,} lines in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
' "$1"
}

# spm_pipeline WORK S T DEST MODEL_S MODEL_T MAX_LEN RATIO
#   WORK/raw.{train,valid,test}.{S,T} -> sentencepiece pieces (MODEL_S for S, MODEL_T for T,
#   already trained), length filtering of the training pairs, fairseq-preprocess into DEST:
#   one joined dictionary when both sides use the same model, one dictionary per side else.
spm_pipeline() {
    local work="$1" s="$2" t="$3" dest="$4" model_s="$5" model_t="$6" max_len="$7" ratio="$8"
    local split lang model prep="$work/prep" joined=()
    mkdir -p "$prep"
    for split in train valid test; do
        for lang in "$s" "$t"; do
            model="$([[ "$lang" == "$s" ]] && echo "$model_s" || echo "$model_t")"
            log "sentencepiece-encoding $split.$lang"
            spm_encode "$model" <"$work/raw.$split.$lang" >"$work/spm.$split.$lang"
        done
    done
    clean_corpus "$work/spm.train" "$s" "$t" "$prep/train" 1 "$max_len" "$ratio"
    for split in valid test; do
        for lang in "$s" "$t"; do
            cp "$work/spm.$split.$lang" "$prep/$split.$lang"
        done
    done
    if [[ "$model_s" != "$model_t" ]]; then
        joined=(--no-joined)
    fi
    binarize "$prep" "$s" "$t" "$dest" "${joined[@]}"
    if [[ "$model_s" == "$model_t" ]]; then
        cp "$model_s" "$dest/spm.model"
    else
        cp "$model_s" "$dest/spm.$s.model"
        cp "$model_t" "$dest/spm.$t.model"
    fi
    for split in valid test; do
        for lang in "$s" "$t"; do
            cp "$work/raw.$split.$lang" "$dest/$split.raw.$lang"
        done
    done
    write_recipe_info "$dest" "SRC=$s" "TGT=$t" "SCHEME=sentencepiece"
    log "done: $dest ($(wc -l <"$dest/dict.$s.txt") / $(wc -l <"$dest/dict.$t.txt") dictionary entries)"
}

# ---------------------------------------------------------------------------------------------
# training launcher shared by the train-*.sh scripts
#
# A train script sets ARCH, TASK_ARGS (array), HPARAMS (array), MAX_TOKENS, TOKENS_PER_UPDATE
# (0 = no target: --update-freq 1), SMOKE_ARGS (array) and the --paper variables below, then
# calls `train_main "$@"`, which parses the options of TRAIN_OPTIONS, passes undeclared options
# to fairseq-train (after the recipe's own, so they win) and launches:
#   1 GPU / CPU      fairseq-train ... --distributed-world-size 1
#   N GPUs, 1 node   fairseq-train ... --distributed-world-size N   (fairseq spawns N workers)
#   several nodes    torchrun --nnodes M --node-rank R --nproc-per-node N ... (default), or
#                    fairseq-train ... --distributed-init-method tcp://HOST:PORT
#                        --distributed-world-size M*N --distributed-rank R*N   (--init-method)
# The world size is always passed: fairseq's own default is every visible GPU, which would
# multiply the batch that --update-freq was computed for. The options that decide the batch
# (--max-tokens, --batch-size, --update-freq) are read by the launcher, whichever way they are
# written, so that the batch it prints is the one fairseq gets.
#
# --paper variables:
#   PAPER_ARGS       (array) fairseq-train options of the paper's setting
#   PAPER_SENTENCES  the paper's batch in sentences per update (empty: the recipe's token batch)
#   PAPER_UNIT       what those are called in the printed batch (default: sentences)
#   PAPER_GPUS       the paper's GPU count, used when --gpus is not given (empty: every GPU)
#   PAPER_HARDWARE   what the paper trained on, in words (printed)
#   PAPER_PRECISION  --fp16 when the paper trained with mixed precision
#   PAPER_NOTES      (array) what --paper does not reproduce, printed with it
#   PAPER_NONE       why the script has no paper setting (--paper is then refused)

# check_save_dir SAVE_DIR DATA_BIN: fairseq-train resumes from SAVE_DIR/checkpoint_last.pt, and the
# default SAVE_DIR is per architecture, not per dataset. Refuse a folder that holds a run on other
# data (it would be resumed, or taken as finished, on DATA_BIN); else record DATA_BIN there.
check_save_dir() {
    local save_dir="$1" data trained_on
    data="$(cd "$2" 2>/dev/null && pwd -P || printf '%s' "$2")"
    if [[ -f "$save_dir/recipe.data" ]]; then
        trained_on="$(<"$save_dir/recipe.data")"
        [[ "$trained_on" == "$data" ]] ||
            die "--save-dir $save_dir holds a run on $trained_on that fairseq would resume on $data: give this dataset its own --save-dir (or delete $save_dir/recipe.data to continue that model on it)"
    fi
    [[ "${DRY_RUN:-0}" == 1 ]] && return
    mkdir -p "$save_dir"
    printf '%s\n' "$data" >"$save_dir/recipe.data"
}

TRAIN_USAGE='options of every train script (--name=VALUE is the same as --name VALUE):
  DATA_BIN                  binarized data (first argument)
  --arch ARCH               architecture preset (default: the script'"'"'s)
  --save-dir DIR            checkpoints (default: checkpoints/ARCH); refused if it holds a
                            run on another DATA_BIN (noted in DIR/recipe.data)
  --paper                   the paper'"'"'s training setting where it differs from the default
                            (see the header above)
  --gpus N                  GPUs per node (default: all visible; 0 = CPU; --cpu = --gpus 0)
  --nodes M --node-rank R   multi-node training (run the same command on every node)
  --master-addr HOST --master-port PORT   rendezvous of torchrun (default 127.0.0.1:29500)
  --init-method URL         use fairseq'"'"'s own spawning with this init method instead of torchrun
                            (--distributed-init-method is the same option)
  --fp16                    mixed precision on CUDA GPUs (--bf16 is refused: fairseq 0.12.3
                            trains bf16 on TPUs only; fairseq-train'"'"'s --amp passes on)
  --max-tokens N            tokens per GPU batch (the update frequency keeps the recipe'"'"'s batch)
  --batch-size N            sentences per GPU batch: an upper bound on top of --max-tokens; with
                            --paper it replaces the paper'"'"'s sentence batch (fairseq'"'"'s
                            --max-sentences is the same option)
  --update-freq N           fixed update frequency instead of the derived one
  --cpu-smoke               2 updates of a tiny copy of the architecture on CPU (tests)
  --dry-run                 print the command only
  other options             passed on to fairseq-train (they override the recipe'"'"'s); the
                            world size and the rank are the launcher'"'"'s (refused here)
Before training, the effective batch per update (max tokens or sentences x update frequency x
workers) is printed.'

# the options of every train script (see parse_options); the variables are train_main's
TRAIN_OPTIONS=(
    "@positional data:DATA_BIN"
    "@unknown pass extra"
    "@help train_help"
    "--arch value ARCH"
    "--save-dir value save_dir"
    "--gpus value gpus whole"
    "--cpu set gpus 0"
    "--nodes value nodes count"
    "--node-rank value node_rank whole"
    "--master-addr value master_addr"
    "--master-port value master_port count"
    "--init-method value init_method"
    "--distributed-init-method value init_method"
    "--max-tokens value max_tokens count"
    "--batch-size value batch_size count"
    "--max-sentences value batch_size count"
    "--update-freq value update_freq count"
    "--distributed-world-size refuse set by the recipe from --gpus and --nodes"
    "--distributed-rank refuse set by the recipe from --node-rank and --gpus"
    "--paper flag paper"
    "--fp16 one precision --fp16"
    "--bf16 refuse fairseq 0.12.3 trains bf16 on TPUs only (its --bf16 implies --tpu); on GPUs use --fp16, or fairseq-train's --amp (docs/GPU.md)"
    "--cpu-smoke flag cpu_smoke"
    "--dry-run flag DRY_RUN"
)

train_help() {
    usage
    printf '\n%s\n' "$TRAIN_USAGE"
}

# defaults of the --paper variables (a train script sets its own after sourcing this file)
PAPER_ARGS=()
PAPER_SENTENCES=""
PAPER_UNIT=sentences
PAPER_GPUS=""
PAPER_HARDWARE=""
PAPER_PRECISION=""
PAPER_NOTES=()
PAPER_NONE=""

# check_train_command ARGS...: ARGS (a fairseq-train command line without the program) read by
# fairseq-train's own parser with the plugin, and the data-bin it names checked, before anything
# runs: one error line instead of fairseq's usage or a traceback (slim_fairseq_lab/recipe_check.py).
# A dry run on a data-bin that does not exist yet checks the command line only.
check_train_command() {
    local only=()
    [[ "${DRY_RUN:-0}" == 1 && ! -d "$1" ]] && only=(--parse-only)
    PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slim_fairseq_lab.recipe_check \
        ${only[@]+"${only[@]}"} "$(basename "$0")" -- "$@" || exit $?
}

train_main() {
    local data="" gpus="" nodes=1 node_rank=0 master_addr=127.0.0.1 master_port=29500
    local init_method="" precision="" cpu_smoke=0 save_dir="" paper=0 update_freq="" extra=()
    local max_tokens="" batch_size="" arg note
    parse_options "${TRAIN_OPTIONS[@]}" -- "$@"
    [[ -n "$data" ]] || die "DATA_BIN is required (the output of a prepare script; see --help)"
    [[ -d "$data" || "${DRY_RUN:-0}" == 1 ]] || die "DATA_BIN: $data is not a folder"
    MAX_TOKENS="${max_tokens:-$MAX_TOKENS}"
    local sentences=0
    if [[ "$paper" == 1 ]]; then
        [[ -z "${PAPER_NONE:-}" ]] || die "--paper: $PAPER_NONE"
        sentences="${PAPER_SENTENCES:-0}"
        [[ "$sentences" == 0 || -z "$max_tokens" ]] ||
            die "--max-tokens: --paper batches by $PAPER_UNIT ($sentences per update, as the paper); drop --max-tokens, or --paper"
        HPARAMS+=(${PAPER_ARGS[@]+"${PAPER_ARGS[@]}"})
        [[ "${#PAPER_ARGS[@]}" == 0 ]] || log "--paper: ${PAPER_ARGS[*]}"
        for note in ${PAPER_NOTES[@]+"${PAPER_NOTES[@]}"}; do
            log "--paper: $note"
        done
    fi
    save_dir="${save_dir:-checkpoints/$ARCH}"
    check_save_dir "$save_dir" "$data"
    local user_dir
    user_dir="$(slim_user_dir)"
    need_cmd fairseq-train

    local cmd=(fairseq-train "$data" --user-dir "$user_dir" --arch "$ARCH" "${TASK_ARGS[@]}"
        "${HPARAMS[@]}" --save-dir "$save_dir")
    if [[ "$cpu_smoke" == 1 ]]; then
        # 2 updates of a tiny model of the same kind: the model class's own shrinking overrides
        # (contract_overrides) are appended in the same Python process that runs fairseq-train;
        # batch options given on the command line still win
        cmd+=(--cpu --max-update 2 --max-tokens 256 --update-freq 1 --num-workers 0
            --save-interval-updates 1 --keep-interval-updates 3 --log-format simple --log-interval 1
            "${SMOKE_ARGS[@]}")
        [[ "$sentences" -gt 0 ]] && cmd+=(--batch-size "$sentences")
        [[ -n "$max_tokens" ]] && cmd+=(--max-tokens "$max_tokens")
        [[ -n "$batch_size" ]] && cmd+=(--batch-size "$batch_size")
        [[ -n "$update_freq" ]] && cmd+=(--update-freq "$update_freq")
        cmd+=(${extra[@]+"${extra[@]}"})
        check_train_command "${cmd[@]:1}"
        printf '+ (tiny overrides of %s appended)' "$ARCH"
        printf ' %q' "${cmd[@]}"
        printf '\n'
        [[ "${DRY_RUN:-0}" == 1 ]] && return
        "$PYTHON" - "$user_dir" "$ARCH" "${cmd[@]:1}" <<'PY'
import argparse, sys
from fairseq import utils
user_dir, arch, args = sys.argv[1], sys.argv[2], sys.argv[3:]
utils.import_user_module(argparse.Namespace(user_dir=user_dir))
from fairseq.models import ARCH_MODEL_REGISTRY
shrink = getattr(ARCH_MODEL_REGISTRY[arch], "contract_overrides", lambda name: [])
sys.argv = ["fairseq-train", *args, *shrink(arch)]
from fairseq_cli.train import cli_main
cli_main()
PY
        return
    fi

    local visible=""
    if [[ -z "$gpus" ]]; then
        visible="$(gpu_count)"
        gpus="$visible"
        if [[ "$paper" == 1 && -n "$PAPER_GPUS" && "$gpus" -gt "$PAPER_GPUS" ]]; then
            gpus="$PAPER_GPUS"
            log "--paper: $gpus of the $visible visible GPUs, as the paper ($PAPER_HARDWARE); --gpus N to use more"
        fi
    fi
    local world=$((nodes * (gpus > 0 ? gpus : 1)))
    if [[ "$paper" == 1 && -n "$PAPER_HARDWARE" ]]; then
        log "--paper: the paper trained on $PAPER_HARDWARE; this run: $world worker(s) ($([[ "$gpus" == 0 ]] && echo CPU || echo "$gpus GPU(s) x $nodes node(s)"))"
    fi
    if [[ "$paper" == 1 && -n "$PAPER_PRECISION" ]]; then
        if [[ -z "$precision" ]]; then
            [[ "$gpus" != 0 ]] ||
                die "--paper: the paper trained with mixed precision ($PAPER_PRECISION), which needs GPUs: drop --paper, or --gpus 0"
            precision="$PAPER_PRECISION"
            log "--paper: $precision (the paper trained with mixed precision)"
        else
            log "--paper: mixed precision as the paper, in $precision"
        fi
    fi
    local batch_args=() per_update
    if [[ "$sentences" -gt 0 ]]; then
        # the paper's batch counts sentences: split it over the workers, unless --batch-size
        # gives the sentences per worker
        update_freq="${update_freq:-1}"
        local per_worker
        if [[ -n "$batch_size" ]]; then
            per_worker="$batch_size"
        else
            [[ $((sentences % world)) == 0 ]] ||
                die "--paper: $sentences $PAPER_UNIT per update do not split evenly over $world workers (--gpus/--nodes, or --batch-size N per worker)"
            per_worker=$((sentences / world))
        fi
        batch_args=(--batch-size "$per_worker" --update-freq "$update_freq")
        local total=$((per_worker * update_freq * world))
        per_update="$per_worker $PAPER_UNIT x update-freq $update_freq x $world workers = $total $PAPER_UNIT per update"
        [[ "$total" == "$sentences" ]] || per_update+=" (the paper: $sentences)"
    else
        if [[ -z "$update_freq" ]]; then
            update_freq=1
            if [[ "${TOKENS_PER_UPDATE:-0}" -gt 0 ]]; then
                update_freq="$(ceil_div "$TOKENS_PER_UPDATE" $((MAX_TOKENS * world)))"
            fi
        fi
        batch_args=(--max-tokens "$MAX_TOKENS" --update-freq "$update_freq")
        per_update="$MAX_TOKENS tokens x update-freq $update_freq x $world workers = $((MAX_TOKENS * update_freq * world)) tokens per update (at most)"
        [[ "${TOKENS_PER_UPDATE:-0}" -gt 0 ]] && per_update+="; recipe target $TOKENS_PER_UPDATE"
        if [[ -n "$batch_size" ]]; then
            batch_args+=(--batch-size "$batch_size")
            per_update+="; at most $batch_size sentences per worker batch (--batch-size)"
        fi
    fi
    cmd+=("${batch_args[@]}")
    if [[ "$gpus" == 0 ]]; then
        [[ "$nodes" == 1 ]] || die "--nodes > 1 needs GPUs (--gpus N)"
        cmd+=(--cpu)
    fi
    [[ -n "$precision" ]] && cmd+=("$precision")
    check_train_command "${cmd[@]:1}" ${extra[@]+"${extra[@]}"}
    log "effective batch: $per_update"

    if [[ "$nodes" -gt 1 && -z "$init_method" ]]; then
        need_cmd torchrun
        local train_bin
        train_bin="$(command -v fairseq-train)"
        cmd=(torchrun --nnodes "$nodes" --node-rank "$node_rank" --nproc-per-node "$gpus"
            --master-addr "$master_addr" --master-port "$master_port" "$train_bin" "${cmd[@]:1}"
            --distributed-world-size "$world")
    elif [[ -n "$init_method" ]]; then
        cmd+=(--distributed-init-method "$init_method" --distributed-world-size "$world"
            --distributed-rank $((node_rank * gpus)))
    else
        cmd+=(--distributed-world-size "$world")
    fi
    run_or_print "${cmd[@]}" ${extra[@]+"${extra[@]}"}
}

# ---------------------------------------------------------------------------------------------
# two models side by side on the bundled en-de corpus (translation/*_vs_transformer.sh)

# compare_on_bundled_ende NAME_A ARGS_A... -- NAME_B ARGS_B...
# Binarizes the bundled en-de corpus under $OUT/data (cached), trains both models with the same
# seed, optimizer, schedule and batches ($SHAPE plus each model's own fairseq-train arguments),
# translates the test set with each model's checkpoint_last.pt (beam 5, BPE removed, plus
# $GENERATE_ARGS), prints the table of examples/summarize_runs.py and, under it, what its test
# BLEU is (test_bleu_note). The calling script sets OUT, SHAPE and GENERATE_ARGS (arrays),
# SEED, MAX_UPDATE, MAX_TOKENS, WARMUP, LOG_INTERVAL, THREADS (per model), PARALLEL (1: both at
# once), DRY_RUN (1: print the two fairseq-train commands, run nothing), EVAL_ONLY (1: reuse the
# checkpoints of an earlier run) and RUN_NOTE (added to the wall-time line).
compare_on_bundled_ende() {
    local name_a="$1" args_a=() name_b args_b=() data start pid_a pid_b
    shift
    while [[ $# -gt 0 && "$1" != -- ]]; do args_a+=("$1"); shift; done
    [[ $# -gt 1 ]] || die "compare_on_bundled_ende: no '-- NAME_B' after the first model"
    name_b="$2"; shift 2; args_b=("$@")
    if [[ "$DRY_RUN" == 1 ]]; then
        data="$OUT/data/DATA-BIN"
    else
        need_cmd fairseq-train fairseq-generate
        mkdir -p "$OUT"
        data="$("$PYTHON" "$REPO_ROOT/scripts/binarize_bundled.py" "$OUT/data" --corpus ende | tail -n 1)"
        [[ -f "$data/dict.en.txt" ]] || die "binarization failed ($data)"
    fi
    start=$(date +%s)
    if [[ "$PARALLEL" == 1 && "$DRY_RUN" == 0 ]]; then
        _train_and_translate "$name_a" "${args_a[@]}" & pid_a=$!
        _train_and_translate "$name_b" "${args_b[@]}" & pid_b=$!
        local failed=()
        wait "$pid_a" || failed+=("$name_a")
        wait "$pid_b" || failed+=("$name_b")
        [[ ${#failed[@]} == 0 ]] || die "${failed[*]} failed: see the logs under $OUT/${failed[0]}"
    else
        _train_and_translate "$name_a" "${args_a[@]}"
        _train_and_translate "$name_b" "${args_b[@]}"
    fi
    [[ "$DRY_RUN" == 1 ]] && return 0
    echo "wall time: $(( $(date +%s) - start )) s (updates: $MAX_UPDATE, max tokens: $MAX_TOKENS," \
         "warmup: $WARMUP, seed: $SEED, threads per model: $THREADS${RUN_NOTE:+, $RUN_NOTE})"
    "$PYTHON" "$REPO_ROOT/examples/summarize_runs.py" "$OUT" "$name_a" "$name_b"
    test_bleu_note "$OUT" "$name_a" "$name_b"
}

# test_bleu_note OUT NAME...: what the "test BLEU" of compare_on_bundled_ende's table is, read
# from each run's generate.log (the scorer) and train.log (the checkpoint it translated with)
test_bleu_note() {
    local out="$1" name scorers=() saved
    shift
    for name in "$@"; do
        scorers+=("$(grep -oE 'BLEU4? = ' "$out/$name/generate.log" 2>/dev/null | head -n 1 || true)")
    done
    case "$(printf '%s\n' "${scorers[@]}" | sort -u)" in
        "BLEU4 = ")
            echo "test BLEU: fairseq-generate's BLEU4 (fairseq's own scorer on the BPE-removed output and" \
                 "references split at spaces: tokenized BLEU on Moses tokens (-a), no compound splitting;" \
                 "not sacreBLEU), beam 5, bundled en-de test set, translated with:" ;;
        "BLEU = ")
            echo "test BLEU: fairseq-generate --scoring sacrebleu on the tokenized, BPE-removed text (not" \
                 "detokenized: not comparable with published sacreBLEU), beam 5, translated with:" ;;
        *) echo "test BLEU: the generate logs hold no score of one kind ($out/NAME/generate.log); translated with:" ;;
    esac
    for name in "$@"; do
        # the last checkpoint fairseq saved is the state of checkpoint_last.pt
        saved="$(grep -oE 'Saved checkpoint [^ ]+ \(epoch [0-9]+ @ [0-9]+ updates' "$out/$name/train.log" 2>/dev/null |
            tail -n 1 | sed 's/.*(//' || true)"
        echo "  $name: $out/$name/checkpoint_last.pt (${saved:-its update is not in $out/$name/train.log})"
    done
}

# _train_and_translate NAME ARGS...: one model of compare_on_bundled_ende (its `data`); the
# fairseq-train and fairseq-generate command lines are slim_fairseq_lab.launcher's
_train_and_translate() {
    local name="$1" words train=() generate=()
    shift
    words="$(lab_launcher ende-comparison-train --data "$data" --seed "$SEED" --warmup "$WARMUP" \
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --log-interval "$LOG_INTERVAL" \
        --save-dir "$OUT/$name" -- ${SHAPE[@]+"${SHAPE[@]}"} "$@")" || die "$name: no fairseq-train command line"
    eval "train=($words)"
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "$name: fairseq-train ${train[*]}"
        return
    fi
    if [[ "$EVAL_ONLY" == 0 ]]; then
        rm -rf "${OUT:?}/$name"; mkdir -p "$OUT/$name"
        OMP_NUM_THREADS="$THREADS" fairseq-train "${train[@]}" > "$OUT/$name/train.log" 2>&1
    fi
    words="$(lab_launcher ende-comparison-generate --data "$data" --path "$OUT/$name/checkpoint_last.pt" \
        --user-dir "$(slim_user_dir)" -- ${GENERATE_ARGS[@]+"${GENERATE_ARGS[@]}"})" ||
        die "$name: no fairseq-generate command line"
    eval "generate=($words)"
    OMP_NUM_THREADS="$THREADS" fairseq-generate "${generate[@]}" > "$OUT/$name/generate.log" 2>&1
}

# ---------------------------------------------------------------------------------------------
# language models side by side on the bundled WikiText-2 (lm/skipless_vs_preln.sh,
# lm/stlm_tying_wikitext2.sh)

# compare_lms_on_wikitext2: binarizes the bundled WikiText-2 with a vocabulary of $NWORDS words
# under build/data (cached; its path is left in LM_DATA), then trains the runs named in $RUNS,
# $JOBS at a time, one thread each, with the same updates ($UPDATES), batches ($BATCH sequences of
# $TOKENS tokens), seed, Adam at $LR (inverse_sqrt, warmup a tenth of the updates) and gradient
# clipping 1.0; each run's logs go to $OUT/NAME.log and the table of examples/summarize_runs.py to
# $OUT/summary.txt. The calling script defines `lm_run_args NAME` (that run's --arch and shape,
# as words) and may set LM_TRAIN_ARGS (array, for every run). DRY_RUN=1 prints the commands.
compare_lms_on_wikitext2() {
    local name run_args words train=() running=0 failed=() pids=() bin="${FAIRSEQ_BIN:-$REPO_ROOT/.venv/bin}"
    for name in $RUNS; do
        lm_run_args "$name" >/dev/null || die "RUNS: unknown run '$name'"
    done
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        LM_DATA="$REPO_ROOT/build/data/DATA-BIN"
    else
        mkdir -p "$OUT"
        LM_DATA="$("$PYTHON" "$REPO_ROOT/scripts/binarize_bundled.py" "$REPO_ROOT/build/data" --corpus wikitext \
            --nwords "$NWORDS" | tail -n 1)"
        [[ -f "$LM_DATA/dict.txt" ]] || die "binarization failed ($LM_DATA)"
        echo "data: $LM_DATA  out: $OUT  updates: $UPDATES x $BATCH x $TOKENS tokens  seed: $SEED"
    fi
    for name in $RUNS; do
        read -ra run_args <<< "$(lm_run_args "$name")"
        words="$(lab_launcher lm-comparison-train --data "$LM_DATA" --user-dir "$(slim_user_dir)" \
            --tokens-per-sample "$TOKENS" --batch-size "$BATCH" --max-update "$UPDATES" --seed "$SEED" \
            --lr "$LR" -- "${run_args[@]}" ${LM_TRAIN_ARGS[@]+"${LM_TRAIN_ARGS[@]}"})" ||
            die "$name: no fairseq-train command line"
        eval "train=($words)"
        local cmd=("$bin/fairseq-train" "${train[@]}")
        if [[ "${DRY_RUN:-0}" == 1 ]]; then
            echo "$name: ${cmd[*]}"
            continue
        fi
        OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore "${cmd[@]}" > "$OUT/$name.log" 2>&1 &
        pids+=("$!:$name")
        running=$((running + 1))
        if [[ "$running" -ge "$JOBS" ]]; then wait -n || true; running=$((running - 1)); fi
    done
    [[ "${DRY_RUN:-0}" == 1 ]] && return 0
    local entry
    for entry in "${pids[@]}"; do
        wait "${entry%%:*}" || failed+=("${entry#*:}")
    done
    # shellcheck disable=SC2086  # RUNS is a list of names
    "$PYTHON" "$REPO_ROOT/examples/summarize_runs.py" "$OUT" $RUNS | tee "$OUT/summary.txt"
    for name in ${failed[@]+"${failed[@]}"}; do
        log "error: run $name failed, see $OUT/$name.log"
    done
    [[ ${#failed[@]} == 0 ]]
}
