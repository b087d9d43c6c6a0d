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

die() {
    printf 'error: %s\n' "$*" >&2
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

# ---------------------------------------------------------------------------------------------
# downloads

# Default state of the download options; recipes override them from their command line.
RAW_DIR="${RAW_DIR:-}"
NO_VERIFY="${NO_VERIFY:-0}"

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
fetch() {
    local url="$1" name="$2" spec="${3:-}" dest host rc
    if [[ -n "$RAW_DIR" ]]; then
        dest="$RAW_DIR/$name"
        [[ -e "$dest" ]] || die "--raw-dir: $dest is missing (download it from $url)"
        verify_file "$dest" "$spec"
        return 0
    fi
    dest="$ORIG_DIR/$name"
    mkdir -p "$ORIG_DIR"
    if [[ -f "$dest" ]]; then
        verify_file "$dest" "$spec"
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
            die "cannot reach $host (curl exit $rc: offline, DNS or firewall?). Download $url by other means into a folder and rerun with --raw-dir FOLDER" ;;
        22) die "$url answered with an HTTP error; the source may have moved (pass --raw-dir with a copy)" ;;
        *) die "download of $url failed (curl exit $rc); rerun to resume ($dest.part is kept)" ;;
    esac
    mv "$dest.part" "$dest"
    verify_file "$dest" "$spec"
}

# raw_path FILE -> where fetch put FILE
raw_path() {
    if [[ -n "$RAW_DIR" ]]; then
        printf '%s\n' "$RAW_DIR/$1"
    else
        printf '%s\n' "$ORIG_DIR/$1"
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

# require_value FLAG VALUE: a flag that needs an argument got one
require_value() {
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
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
# aggressive hyphen splitting, XML escaping as tokenizer.perl does by default).
moses_tokenize() {
    sacremoses -q -l "$1" -j "$NUM_WORKERS" normalize -c tokenize -a
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
import sys
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
        sys.exit(f"error: {src_file} and {tgt_file} have different line counts")
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
}

# cap_corpus PREFIX S T MAX_BYTES: keep the first lines of a parallel corpus whose two sides
# together fit in MAX_BYTES (the Anthe paper capped ru-en and zh-en at 9 GB).
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

# compound_split < tokenized > split: "a-b" -> "a ##AT##-##AT## b" (the compound splitting of
# tokenized BLEU for German in the Transformer / Subformer / Anthe papers; Moses' "@-@" becomes
# "@ ##AT##-##AT## @"), applied to hypotheses and references alike.
compound_split() { sed -E 's/([^[:space:]])-([^[:space:]])/\1 ##AT##-##AT## \2/g'; }

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

# binarize PREP S T DEST: fairseq-preprocess with one joined dictionary
binarize() {
    local prep="$1" s="$2" t="$3" dest="$4"
    need_cmd fairseq-preprocess
    rm -rf "$dest"
    mkdir -p "$dest"
    fairseq-preprocess --source-lang "$s" --target-lang "$t" \
        --trainpref "$prep/train" --validpref "$prep/valid" --testpref "$prep/test" \
        --destdir "$dest" --joined-dictionary --workers "$NUM_WORKERS"
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
    cp "$work/raw.test.$s" "$dest/test.raw.$s"
    cp "$work/raw.test.$t" "$dest/test.raw.$t"
    cp "$work/raw.valid.$s" "$dest/valid.raw.$s"
    cp "$work/raw.valid.$t" "$dest/valid.raw.$t"
    write_recipe_info "$dest" "SRC=$s" "TGT=$t" "SCHEME=moses-bpe"
    log "done: $dest ($(wc -l <"$dest/dict.$s.txt") dictionary entries)"
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

# spm_encode MODEL < text > pieces (space-separated)
spm_encode() {
    "$PYTHON" -c '
import sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
for line in sys.stdin:
    print(" ".join(sp.encode(line.rstrip("\n"), out_type=str)))
' "$1"
}

# spm_pipeline WORK S T DEST MODEL MAX_LEN RATIO
#   WORK/raw.{train,valid,test}.{S,T} -> sentencepiece pieces with MODEL (already trained),
#   length filtering of the training pairs, fairseq-preprocess --joined-dictionary into DEST.
spm_pipeline() {
    local work="$1" s="$2" t="$3" dest="$4" model="$5" max_len="$6" ratio="$7" split lang
    local prep="$work/prep"
    mkdir -p "$prep"
    for split in train valid test; do
        for lang in "$s" "$t"; do
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
    binarize "$prep" "$s" "$t" "$dest"
    cp "$model" "$dest/spm.model"
    cp "$work/raw.test.$s" "$dest/test.raw.$s"
    cp "$work/raw.test.$t" "$dest/test.raw.$t"
    cp "$work/raw.valid.$s" "$dest/valid.raw.$s"
    cp "$work/raw.valid.$t" "$dest/valid.raw.$t"
    write_recipe_info "$dest" "SRC=$s" "TGT=$t" "SCHEME=sentencepiece"
    log "done: $dest ($(wc -l <"$dest/dict.$s.txt") dictionary entries)"
}

# ---------------------------------------------------------------------------------------------
# training launcher shared by the train-*.sh scripts
#
# A train script sets ARCH, TASK_ARGS (array), HPARAMS (array), MAX_TOKENS, TOKENS_PER_UPDATE
# (0 = no target: --update-freq 1) and SMOKE_ARGS (array), then calls
# `train_main "$@"`, which parses the options below, passes unknown options to fairseq-train
# (after the recipe's own, so they win) and launches one of:
#   1 GPU / CPU      fairseq-train ...
#   N GPUs, 1 node   fairseq-train ... --distributed-world-size N   (fairseq spawns N workers)
#   several nodes    torchrun --nnodes M --node-rank R --nproc-per-node N ... (default), or
#                    fairseq-train ... --distributed-init-method tcp://HOST:PORT
#                        --distributed-world-size M*N --distributed-rank R*N   (--init-method)

TRAIN_USAGE='options of every train script:
  DATA_BIN                  binarized data (first argument)
  --arch ARCH               architecture preset (default: the script'"'"'s)
  --save-dir DIR            checkpoints (default: checkpoints/ARCH)
  --gpus N                  GPUs per node (default: all visible; 0 = CPU)
  --nodes M --node-rank R   multi-node training (run the same command on every node)
  --master-addr HOST --master-port PORT   rendezvous of torchrun (default 127.0.0.1:29500)
  --init-method URL         use fairseq'"'"'s own spawning with this init method instead of torchrun
  --fp16 | --bf16           mixed precision (fp16 on CUDA GPUs, bf16 on Ampere or newer)
  --max-tokens N            tokens per GPU batch (the update frequency keeps the paper'"'"'s batch)
  --cpu-smoke               2 updates of a tiny copy of the architecture on CPU (tests)
  --dry-run                 print the command only
  other options             passed on to fairseq-train (they override the recipe'"'"'s)'

train_main() {
    local data="" gpus="" nodes=1 node_rank=0 master_addr=127.0.0.1 master_port=29500
    local init_method="" precision="" cpu_smoke=0 save_dir="" extra=() arg
    while [[ $# -gt 0 ]]; do
        arg="$1"
        case "$arg" in
            --arch) require_value "$@"; ARCH="$2"; shift 2 ;;
            --save-dir) require_value "$@"; save_dir="$2"; shift 2 ;;
            --gpus) require_value "$@"; gpus="$2"; shift 2 ;;
            --nodes) require_value "$@"; nodes="$2"; shift 2 ;;
            --node-rank) require_value "$@"; node_rank="$2"; shift 2 ;;
            --master-addr) require_value "$@"; master_addr="$2"; shift 2 ;;
            --master-port) require_value "$@"; master_port="$2"; shift 2 ;;
            --init-method) require_value "$@"; init_method="$2"; shift 2 ;;
            --max-tokens) require_value "$@"; MAX_TOKENS="$2"; shift 2 ;;
            --fp16 | --bf16) precision="$arg"; shift ;;
            --cpu-smoke) cpu_smoke=1; shift ;;
            --dry-run) DRY_RUN=1; shift ;;
            -h | --help) printf '%s\n' "$TRAIN_USAGE"; exit 0 ;;
            -*) extra+=("$arg"); shift ;;
            *)
                if [[ -z "$data" ]]; then data="$arg"; else extra+=("$arg"); fi
                shift ;;
        esac
    done
    [[ -n "$data" ]] || die "DATA_BIN is required (the output of a prepare script; see --help)"
    [[ -d "$data" || "${DRY_RUN:-0}" == 1 ]] || die "DATA_BIN: $data is not a folder"
    for arg in "$nodes" "$node_rank"; do
        [[ "$arg" =~ ^[0-9]+$ ]] || die "--nodes/--node-rank: whole numbers, got '$arg'"
    done
    save_dir="${save_dir:-checkpoints/$ARCH}"
    local user_dir
    user_dir="$(slim_user_dir)"
    need_cmd fairseq-train

    local cmd=(fairseq-train "$data" --user-dir "$user_dir" --arch "$ARCH" "${TASK_ARGS[@]}"
        "${HPARAMS[@]}" --save-dir "$save_dir")
    if [[ "$cpu_smoke" == 1 ]]; then
        # 2 updates of a tiny model of the same kind: the model class's own shrinking overrides
        # (contract_overrides) are appended in the same Python process that runs fairseq-train
        cmd+=(--cpu --max-update 2 --max-tokens 256 --update-freq 1 --num-workers 0
            --save-interval-updates 1 --keep-interval-updates 3 --log-format simple --log-interval 1
            "${SMOKE_ARGS[@]}" "${extra[@]}")
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
if arch not in ARCH_MODEL_REGISTRY:
    sys.exit(f"error: --arch: unknown architecture {arch!r}")
shrink = getattr(ARCH_MODEL_REGISTRY[arch], "contract_overrides", lambda name: [])
sys.argv = ["fairseq-train", *args, *shrink(arch)]
from fairseq_cli.train import cli_main
cli_main()
PY
        return
    fi

    if [[ -z "$gpus" ]]; then
        gpus="$(gpu_count)"
    fi
    [[ "$gpus" =~ ^[0-9]+$ ]] || die "--gpus: a whole number, got '$gpus'"
    local world=$((nodes * (gpus > 0 ? gpus : 1)))
    local update_freq=1
    if [[ "${TOKENS_PER_UPDATE:-0}" -gt 0 ]]; then
        update_freq="$(ceil_div "$TOKENS_PER_UPDATE" $((MAX_TOKENS * world)))"
    fi
    cmd+=(--max-tokens "$MAX_TOKENS" --update-freq "$update_freq")
    if [[ "$gpus" == 0 ]]; then
        [[ "$nodes" == 1 ]] || die "--nodes > 1 needs GPUs (--gpus N)"
        cmd+=(--cpu)
    fi
    [[ -n "$precision" ]] && cmd+=("$precision")
    log "batch: $MAX_TOKENS tokens x $world workers x update-freq $update_freq"

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
    elif [[ "$gpus" -gt 1 ]]; then
        cmd+=(--distributed-world-size "$gpus")
    fi
    run_or_print "${cmd[@]}" "${extra[@]}"
}
