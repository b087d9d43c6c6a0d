"""The text steps of the recipes: WMT's SGML test sets, the Romanian normalisation, parallel
corpora (appended, filtered, capped), the Moses tokenizer (sacremoses, run as a tool), the
tokenization of tokenized BLEU, and the sizes of fairseq's binarized splits.
"""
import os
import re
import struct
import sys

from slim_fairseq_lab.recipes import tools
from slim_fairseq_lab.recipes.cli import OptionError, log, step_failed


def workers():
    """``NUM_WORKERS`` (default: every core) for the tools that run in parallel."""
    return os.environ.get("NUM_WORKERS") or str(os.cpu_count() or 4)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def line_count(path):
    """The lines of ``path``, a last line without a final newline included."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def check_utf8(path, name=None):
    """A one-line refusal when ``path`` is not UTF-8 text (naming its first bad line)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise OptionError(f"{name or path}: line {number} is not UTF-8 text (byte "
                                  f"0x{line[error.start]:02x} at {error.start + 1}); allowed: the "
                                  "text as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)") from None


# ---------------------------------------------------------------------------------------------
# WMT formats and corpora

SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


def sgm_to_text(sgm, out):
    """The <seg> contents of a WMT SGML file, one per line (kept as written, as sacreBLEU reads
    the same files)."""
    with open(sgm, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as o:
        for line in f:
            match = SEG.search(line)
            if match:
                o.write(" ".join(match.group(1).split()) + "\n")


ROMANIAN = str.maketrans({
    "\u015e": "S", "\u015f": "s", "\u0218": "S", "\u0219": "s",
    "\u0162": "T", "\u0163": "t", "\u021a": "T", "\u021b": "t",
    "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a",
    "\u00ce": "I", "\u00ee": "i",
    "\u201e": "\"", "\u201d": "\"", "\u201c": "\"", "\u00ab": "\"", "\u00bb": "\"",
})


def romanian_normalise(path):
    """Sennrich's WMT16 Romanian preprocessing, rewritten, in place: cedilla s/t become
    comma-below, typographic quotes become ", then all Romanian diacritics are removed
    (ă â î ș ț -> a a i s t, same for capitals)."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    with open(path + ".norm", "w", encoding="utf-8", newline="") as f:
        f.write(text.translate(ROMANIAN))
    os.replace(path + ".norm", path)


def append_parallel(src_file, tgt_file, prefix, s, t, prog):
    """Append a parallel corpus to PREFIX.s / PREFIX.t, dropping pairs with an empty side; lines
    are stripped of carriage returns and surrounding blanks. Files of different lengths are
    refused."""
    kept = dropped = 0
    with open(src_file, encoding="utf-8", errors="replace", newline="\n") as fs, \
            open(tgt_file, encoding="utf-8", errors="replace", newline="\n") as ft, \
            open(f"{prefix}.{s}", "a", encoding="utf-8") as os_, open(f"{prefix}.{t}", "a", encoding="utf-8") as ot:
        for a, b in zip(fs, ft):
            a, b = " ".join(a.split()), " ".join(b.split())
            if a and b:
                os_.write(a + "\n")
                ot.write(b + "\n")
                kept += 1
            else:
                dropped += 1
        if fs.readline() or ft.readline():
            raise step_failed(f"{src_file} and {tgt_file} have different line counts")
    print(f"{src_file}: kept {kept} pairs, dropped {dropped} with an empty side", file=sys.stderr)


def append_separated(path, sep, prefix, s, t):
    """Append a corpus whose lines are "s SEP t" (WMT wiki-titles: " ||| ")."""
    kept = 0
    with open(path, encoding="utf-8", errors="replace") as f, \
            open(f"{prefix}.{s}", "a", encoding="utf-8") as os_, open(f"{prefix}.{t}", "a", encoding="utf-8") as ot:
        for line in f:
            parts = line.rstrip("\n").split(sep)
            if len(parts) < 2:
                continue
            a, b = " ".join(parts[0].split()), " ".join(parts[1].split())
            if a and b:
                os_.write(a + "\n")
                ot.write(b + "\n")
                kept += 1
    print(f"{path}: kept {kept} pairs", file=sys.stderr)


def clean_corpus(inp, s, t, out, lo, hi, ratio, max_len_flag="--max-len", ratio_flag="--ratio"):
    """Length filtering as Moses' clean-corpus-n.perl: keep the pairs with LO..HI tokens on both
    sides and a length ratio <= RATIO."""
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
            os_.write(a)
            ot.write(b)
            kept += 1
    print(f"length filter {lo}..{hi}, ratio {ratio}: kept {kept} of {total} pairs", file=sys.stderr)
    if kept == 0:
        raise step_failed(f"{max_len_flag} {hi} / {ratio_flag} {ratio}: the length filter kept none of the "
                          f"training pairs; allowed: a larger {max_len_flag} or {ratio_flag}")


def cap_pairs(prefix, s, t, most):
    """Keep the first MOST pairs of a parallel corpus (the Anthe paper trained ru-en and zh-en
    on their first 7M pairs)."""
    total = line_count(f"{prefix}.{s}")
    for side in (s, t):
        with open(f"{prefix}.{side}", encoding="utf-8") as f, \
                open(f"{prefix}.cap.{side}", "w", encoding="utf-8") as out:
            for number, line in enumerate(f):
                if number >= most:
                    break
                out.write(line)
        os.replace(f"{prefix}.cap.{side}", f"{prefix}.{side}")
    log(f"pair cap {most}: kept {line_count(f'{prefix}.{s}')} of {total} pairs")


def cap_bytes(prefix, s, t, cap):
    """Keep the first lines of a parallel corpus whose two sides together fit in CAP bytes."""
    used = kept = 0
    with open(f"{prefix}.{s}", "rb") as fs, open(f"{prefix}.{t}", "rb") as ft, \
            open(f"{prefix}.cap.{s}", "wb") as os_, open(f"{prefix}.cap.{t}", "wb") as ot:
        for a, b in zip(fs, ft):
            if used + len(a) + len(b) > cap:
                break
            used += len(a) + len(b)
            kept += 1
            os_.write(a)
            ot.write(b)
    for side in (s, t):
        os.replace(f"{prefix}.cap.{side}", f"{prefix}.{side}")
    print(f"corpus cap {cap} bytes: kept {kept} pairs ({used} bytes)", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Moses tokenization and tokenized BLEU

def moses_tokenize(lang, src, out):
    """Punctuation normalisation + Moses tokenizer (sacremoses, aggressive hyphen splitting, XML
    escaping as tokenizer.perl does by default)."""
    tools.run(["sacremoses", "-l", lang, "-j", workers(), "normalize", "-c", "tokenize", "-a"],
              stdin=src, stdout=out)


def moses_detokenize(lang, src, out):
    tools.run(["sacremoses", "-q", "-l", lang, "-j", workers(), "detokenize", "-x"], stdin=src, stdout=out)


COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line):
    """"a-b" -> "a ##AT##-##AT## b" (Moses' "@-@" becomes "@ ##AT##-##AT## @"), the rule of
    fairseq's scripts/compound_split_bleu.sh: the WMT14 English->German convention of tokenized
    BLEU, for German targets only. Like its sed, one pass: overlapping matches stay."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def bleu_split(lang, src, out):
    """Compound splitting for German, the text unchanged otherwise."""
    with open(src, encoding="utf-8", newline="") as f:
        text = f.read()
    if lang == "de":
        text = "".join(compound_split(line) for line in text.splitlines(keepends=True))
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def bleu_tokenize(lang, src, out):
    """The tokenization of tokenized BLEU, as fairseq's compound_split_bleu.sh sees its inputs:
    the Moses tokenizer (-a, XML escaping as the training text had) without punctuation
    normalisation (fairseq's prepare-wmt14en2de.sh only tokenizes the test sets), then compound
    splitting when LANG is German."""
    tools.run(["sacremoses", "-q", "-l", lang, "-j", workers(), "tokenize", "-a"], stdin=src, stdout=out + ".moses")
    bleu_split(lang, out + ".moses", out)
    os.remove(out + ".moses")


def bleu_tokenization_name(lang, refs=None):
    """How tokenized BLEU tokenizes LANG (printed in the reports). REFS describes the tokens of
    references the data ships (Google's WMT14: Moses without -a); without it, both sides go
    through the Moses tokenizer with -a."""
    how = refs or "Moses tokenizer -a"
    if lang == "de":
        return f"{how} + compound splitting (German target)"
    return f"{how}, no compound splitting (target {lang})"


def sacrebleu_tokenizer(lang):
    """sacreBLEU's tokenizer of LANG: the Moses tokenizer does not segment Chinese or Japanese,
    so those targets are scored with sacreBLEU's own (examples/translation/README.md#evaluate);
    13a, sacreBLEU's default, otherwise."""
    return {"zh": "zh", "ja": "ja-mecab"}.get(lang, "13a")


def moses_segments(lang):
    """Whether the Moses tokenizer segments LANG (tokenized BLEU means something for it)."""
    return sacrebleu_tokenizer(lang) == "13a"


def check_sacrebleu_tokenizer(lang):
    """A one-line refusal before anything runs when sacreBLEU cannot build LANG's tokenizer
    (ja-mecab needs mecab-python3 and ipadic)."""
    if sacrebleu_tokenizer(lang) != "ja-mecab":
        return
    try:
        from sacrebleu.tokenizers.tokenizer_ja_mecab import TokenizerJaMecab
        TokenizerJaMecab()
    except Exception:  # noqa: BLE001 - missing packages or dictionaries
        raise OptionError(f"target ja: sacreBLEU's ja-mecab tokenizer does not load in {sys.executable}; "
                          "allowed: pip install \"sacrebleu[ja]\" (mecab-python3 and ipadic)") from None


# ---------------------------------------------------------------------------------------------
# fairseq's binarized splits

def index_sizes(path):
    """The item sizes of a fairseq index file (its mmap and its legacy layouts:
    fairseq/data/indexed_dataset.py), read without fairseq."""
    import numpy as np
    with open(path, "rb") as f:
        head = f.read(9)
        if head == b"MMIDIDX\x00\x00":
            from slim_fairseq.run_checks import read_mmap_index
            return read_mmap_index(path)[2]
        if head[:8] == b"TNTIDX\x00\x00":  # version <Q, code and element size <QQ, count and s
            f.seek(32)                      # <QQ, then two int64 offset tables, then s sizes
            count, sizes = struct.unpack("<QQ", f.read(16))
            f.seek(48 + 16 * (count + 1))
            return np.fromfile(f, dtype=np.int64, count=sizes)
    raise OptionError(f"{path}: not a fairseq index file; allowed: a data-bin written by fairseq-preprocess")


def subset_tokens(data, subset):
    """(tokens, longest line) of the binarized SUBSET of a language-modelling DATA_BIN
    (end-of-line symbols included: what fairseq-eval-lm scores); None without one."""
    path = os.path.join(data.split(":")[0], f"{subset}.idx")
    if not os.path.isfile(path):
        return None
    sizes = index_sizes(path)
    return int(sizes.sum()), int(sizes.max()) if len(sizes) else 0


def pair_index(data, subset, src, tgt):
    """The index of the source side of a binarized translation split (either direction of the
    pair, as fairseq's translation task finds it); None without one."""
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        path = os.path.join(data, f"{subset}.{pair}.{src}.idx")
        if os.path.isfile(path):
            return path
    return None


def dictionary_symbols(path):
    """The symbols of a fairseq ``dict.txt`` by id: fairseq's four specials, then its lines."""
    symbols = ["<s>", "<pad>", "</s>", "<unk>"]
    with open(path, encoding="utf-8") as f:
        for line in f:
            word, _, field = line.rstrip("\n").rpartition(" ")
            if field == "#fairseq:overwrite":
                word = word.rpartition(" ")[0]
            symbols.append(word)
    return symbols


def binarized_lines(index, dictionary):
    """The lines of a binarized split (``index``: its ``.idx``) as words of ``dictionary``,
    without the end-of-sentence symbol: the ``T-`` lines of fairseq-generate, before its
    post-processing."""
    import numpy as np
    from slim_fairseq.run_checks import read_mmap_index
    read = read_mmap_index(index)
    if read is None:
        raise OptionError(f"{index}: not an mmap index of fairseq-preprocess; allowed: a data-bin written by "
                          "fairseq-preprocess (its default --dataset-impl mmap)")
    dtype, _, sizes, _ = read
    ids = np.fromfile(index[:-len(".idx")] + ".bin", dtype=dtype)
    symbols = dictionary_symbols(dictionary)
    lines, start = [], 0
    for size in sizes:
        words = [symbols[i] if i < len(symbols) else "<unk>" for i in ids[start:start + size]]
        start += int(size)
        if words and words[-1] == "</s>":
            words.pop()
        lines.append(words)
    return lines


def post_processed(words, scheme):
    """fairseq-generate's post-processing of a ``T-`` line: BPE removed (``--remove-bpe``) or
    sentencepiece decoded."""
    if scheme == "sentencepiece":
        return "".join(words).replace("\u2581", " ").strip()
    return (" ".join(words) + " ").replace("@@ ", "").rstrip()


WORD = re.compile(r"\w+")


def same_sentence(target, reference):
    """Whether a target line as fairseq reads it (tokenized, ``<unk>`` for unknown pieces) and a
    reference line are one sentence: at least half of the target's letters and digits are in
    words (or, next to an ``<unk>``, pieces of words) of the reference, whatever the tokenization
    and punctuation normalisation made of the rest."""
    ours = set(WORD.findall(target.replace("<unk>", " ").lower()))
    if not ours:
        return True
    theirs = " ".join(WORD.findall(reference.lower()))
    found = sum(len(word) for word in ours if word in theirs)
    return found >= 0.5 * sum(len(word) for word in ours)
