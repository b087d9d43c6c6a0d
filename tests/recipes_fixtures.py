"""Miniature copies of the raw downloads the recipes read (examples/*/prepare-*.sh).

Each builder writes, into a folder, files with the same names and internal layout as the
public downloads (tgz archives with their folder prefixes, zip archives, WMT "fake SGML" test
sets, " ||| "-separated wiki titles, the WikiText zip), filled with the bundled real sentences
of data/ende and data/wikitext-2. Languages other than English and German have no bundled text:
their side is played by the German sentences (and Romanian gets a few diacritics so that the
normalisation step has something to remove). Only the layout is real, not the language.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENDE = REPO / "data" / "ende"
WIKITEXT2 = REPO / "data" / "wikitext-2"


def bundled_lines(split: str, lang: str, start: int = 0, count: int | None = None) -> list[str]:
    """Lines start..start+count of data/ende/<split>.<lang> (lang 'en' or 'de')."""
    lines = (ENDE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
    end = None if count is None else start + count
    return lines[start:end]


def stand_in(lang: str, split: str, start: int, count: int) -> list[str]:
    """Sentences for any language: English is real, every other language uses German text."""
    lines = bundled_lines(split, "en" if lang == "en" else "de", start, count)
    if lang == "ro":
        # give the Romanian stand-in the letters the WMT16 normalisation removes
        lines = [line.replace("a", "ă", 1).replace("s", "ş", 1).replace("t", "ț", 1) for line in lines]
    return lines


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_tgz(path: Path, members: dict[str, bytes]) -> Path:
    """Write a tgz archive; an existing one keeps its other members (several datasets read
    different members of one download, e.g. the language pairs of Europarl v8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        with tarfile.open(path, "r:gz") as tar:
            old = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        members = old | members
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def fake_sgml(lines: list[str], setid: str, lang: str, kind: str) -> bytes:
    """A WMT test set in the pre-2021 'fake SGML' layout (text is not XML-escaped)."""
    head = {
        "src": f'<srcset setid="{setid}" srclang="any">',
        "ref": f'<refset setid="{setid}" srclang="any" trglang="{lang}">',
    }[kind]
    out = [head, f'<doc sysid="{kind}" docid="doc-1" genre="news" origlang="en">', "<p>"]
    out += [f'<seg id="{i}">{line}</seg>' for i, line in enumerate(lines, 1)]
    out += ["</p>", "</doc>", f"</{kind}set>"]
    return _text(out)


def parallel(prefix: str, s: str, t: str, start: int, count: int) -> dict[str, bytes]:
    """Members PREFIX.s / PREFIX.t with aligned training sentences."""
    return {
        f"{prefix}.{s}": _text(stand_in(s, "train", start, count)),
        f"{prefix}.{t}": _text(stand_in(t, "train", start, count)),
    }


def sgml_sets(folder: str, name: str, s: str, t: str, split: str, count: int,
              fixed_pair: str | None = None) -> dict[str, bytes]:
    """src and ref SGML files for both directions of a pair, named as WMT ships them
    (NAME-sten-src.s.sgm per direction; WMT14 uses one FIXED_PAIR name for both)."""
    members = {}
    for a, b in ((s, t), (t, s)):
        setname = f"{name}-{fixed_pair or a + b}"
        members[f"{folder}/{setname}-src.{a}.sgm"] = fake_sgml(stand_in(a, split, 0, count), name, a, "src")
        members[f"{folder}/{setname}-ref.{b}.sgm"] = fake_sgml(stand_in(b, split, 0, count), name, b, "ref")
    return members


def build_wmt14_en_de(raw: Path, per_corpus: int = 1200, eval_count: int = 200) -> Path:
    """training-parallel-{europarl-v7,commoncrawl,nc-v9}.tgz, wmt14-dev.tgz, test-full.tgz"""
    write_tgz(raw / "training-parallel-europarl-v7.tgz", parallel("training/europarl-v7.de-en", "de", "en", 0, per_corpus))
    write_tgz(raw / "training-parallel-commoncrawl.tgz", parallel("commoncrawl.de-en", "de", "en", per_corpus, per_corpus))
    write_tgz(raw / "training-parallel-nc-v9.tgz",
              parallel("training/news-commentary-v9.de-en", "de", "en", 2 * per_corpus, per_corpus))
    dev = {
        "dev/newstest2013-src.en.sgm": fake_sgml(stand_in("en", "valid", 0, eval_count), "newstest2013", "en", "src"),
        "dev/newstest2013-src.de.sgm": fake_sgml(stand_in("de", "valid", 0, eval_count), "newstest2013", "de", "src"),
        "dev/newstest2013-ref.en.sgm": fake_sgml(stand_in("en", "valid", 0, eval_count), "newstest2013", "en", "ref"),
        "dev/newstest2013-ref.de.sgm": fake_sgml(stand_in("de", "valid", 0, eval_count), "newstest2013", "de", "ref"),
    }
    write_tgz(raw / "wmt14-dev.tgz", dev)
    write_tgz(raw / "test-full.tgz", sgml_sets("test-full", "newstest2014", "de", "en", "test", eval_count, "deen"))
    return raw


def build_wmt16_en_ro(raw: Path, per_corpus: int = 1200, eval_count: int = 200) -> Path:
    """training-parallel-ep-v8.tgz, en-ro.txt.zip (OPUS SETIMES2, Moses format), wmt16-dev.tgz,
    wmt16-test.tgz"""
    write_tgz(raw / "training-parallel-ep-v8.tgz",
              parallel("training-parallel-ep-v8/europarl-v8.ro-en", "ro", "en", 0, per_corpus))
    write_zip(raw / "en-ro.txt.zip", parallel("SETIMES.en-ro", "en", "ro", per_corpus, per_corpus)
              | {"README": b"SETIMES2 stand-in\n", "LICENSE": b"CC-BY-SA\n"})
    write_tgz(raw / "wmt16-dev.tgz", sgml_sets("dev", "newsdev2016", "en", "ro", "valid", eval_count))
    write_tgz(raw / "wmt16-test.tgz", sgml_sets("test", "newstest2016", "en", "ro", "test", eval_count))
    return raw


def build_wmt17(raw: Path, lang: str, per_corpus: int = 800, eval_count: int = 150) -> Path:
    """The WMT17 downloads prepare-wmt17.sh reads for LANG-en (cs, de, fi, lv, ru, tr, zh)."""
    s, start = lang, 0

    def corpus(prefix: str, a: str = lang, b: str = "en") -> dict[str, bytes]:
        nonlocal start
        members = parallel(prefix, a, b, start, per_corpus)
        start += per_corpus
        return members

    if lang in ("cs", "de"):
        write_tgz(raw / "training-parallel-europarl-v7.tgz", corpus(f"training/europarl-v7.{s}-en"))
    if lang in ("fi", "lv"):
        write_tgz(raw / "training-parallel-ep-v8.tgz", corpus(f"training/europarl-v8.{s}-en"))
    if lang in ("cs", "de", "ru"):
        write_tgz(raw / "training-parallel-commoncrawl.tgz", corpus(f"commoncrawl.{s}-en"))
    if lang in ("cs", "de", "ru", "zh"):
        write_tgz(raw / "training-parallel-nc-v12.tgz", corpus(f"training/news-commentary-v12.{s}-en"))
    if lang in ("de", "fi", "lv"):
        a, b = sorted((s, "en"))
        write_tgz(raw / "rapid2016.tgz", corpus(f"rapid2016.{a}-{b}"))
    if lang in ("fi", "ru"):
        name = "titles.fi-en" if lang == "fi" else "wiki.ru-en"
        src = stand_in(s, "train", start, per_corpus)
        tgt = stand_in("en", "train", start, per_corpus)
        start += per_corpus
        write_tgz(raw / "wiki-titles.tgz",
                  {f"wiki/{s}-en/{name}": _text([f"{x} ||| {y}" for x, y in zip(src, tgt)])})
    if lang == "lv":
        write_tgz(raw / "leta.v1.tgz", corpus("LETA-lv-en/leta"))
        write_tgz(raw / "dcep.lv-en.v1.tgz", corpus("dcep.en-lv/dcep"))
        write_tgz(raw / "books.lv-en.v1.tgz", corpus("farewell/farewell"))
    if lang == "tr":
        write_zip(raw / "en-tr.txt.zip", corpus("SETIMES.en-tr", "en", "tr"))
    if lang in ("ru", "zh"):
        write_tgz(raw / f"UNv1.0.en-{s}.tar.gz", corpus(f"en-{s}/UNv1.0.en-{s}"))
    dev_name = "newsdev2017" if lang in ("lv", "zh") else "newstest2016"
    write_tgz(raw / "wmt17-dev.tgz", sgml_sets("dev", dev_name, s, "en", "valid", eval_count))
    write_tgz(raw / "wmt17-test.tgz", sgml_sets("test", "newstest2017", s, "en", "test", eval_count))
    return raw


def _fake_bpe(line: str) -> str:
    """Tokens of LINE with words longer than 6 characters split once, subword-nmt style."""
    return " ".join(f"{w[:4]}@@ {w[4:]}" if len(w) > 6 else w for w in line.split())


def build_wmt14_google(raw: Path, count: int = 1200, eval_count: int = 200) -> Path:
    """wmt16_en_de.tar.gz in the layout of Google's preprocessed WMT14 en-de (fairseq's
    scaling_nmt example): train.tok.clean.bpe.32000.{en,de}, newstest201{3,4}.{en,de} (raw),
    newstest201{3,4}.tok.{en,de} (tokenized), newstest201{3,4}.tok.bpe.32000.{en,de}, bpe.32000.
    The "tokenization" here splits punctuation off with spaces only; the BPE splits long words."""
    import re

    def tok(line: str) -> str:
        return " ".join(re.sub(r"([.,;:!?()\"])", r" \1 ", line).split())

    members = {"bpe.32000": b"#version: 0.2\nt h\n"}
    for lang in ("en", "de"):
        train = [tok(line) for line in stand_in(lang, "train", 0, count)]
        members[f"train.tok.clean.bpe.32000.{lang}"] = _text([_fake_bpe(line) for line in train])
        for name, split in (("newstest2013", "valid"), ("newstest2014", "test")):
            text = stand_in(lang, split, 0, eval_count)
            members[f"{name}.{lang}"] = _text(text)
            members[f"{name}.tok.{lang}"] = _text([tok(line) for line in text])
            members[f"{name}.tok.bpe.32000.{lang}"] = _text([_fake_bpe(tok(line)) for line in text])
    write_tgz(raw / "wmt16_en_de.tar.gz", members)
    return raw


def build_wikitext103(raw: Path, max_train: int = 3000, max_eval: int = 400) -> Path:
    """wikitext-103-v1.zip with wikitext-103/wiki.{train,valid,test}.tokens (WikiText-2 lines)."""
    members = {}
    for split, limit in (("train", max_train), ("valid", max_eval), ("test", max_eval)):
        with gzip.open(WIKITEXT2 / f"wiki.{split}.raw.gz", "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()[:limit]
        members[f"wikitext-103/wiki.{split}.tokens"] = _text(lines)
    write_zip(raw / "wikitext-103-v1.zip", members)
    return raw


def byte_unicode_table() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the scheme encoder.json uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


MINI_GPT2_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]


def build_wikitext103_raw_gpt2(raw: Path, max_train: int = 600, max_eval: int = 60) -> Path:
    """wikitext-103-raw-v1.zip (WikiText-2 raw lines) plus a miniature GPT-2 byte-level BPE:
    encoder.json (the 256 byte symbols and the merged symbols of MINI_GPT2_MERGES), vocab.bpe
    and fairseq's dict.txt layout (one "ID COUNT" line per encoder id)."""
    import json

    members = {}
    for split, limit in (("train", max_train), ("valid", max_eval), ("test", max_eval)):
        with gzip.open(WIKITEXT2 / f"wiki.{split}.raw.gz", "rt", encoding="utf-8") as f:
            members[f"wikitext-103-raw/wiki.{split}.raw"] = _text(f.read().splitlines()[:limit])
    write_zip(raw / "wikitext-103-raw-v1.zip", members)
    symbols = list(byte_unicode_table().values()) + ["".join(pair) for pair in MINI_GPT2_MERGES]
    encoder = {symbol: i for i, symbol in enumerate(symbols)}
    (raw / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (raw / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MINI_GPT2_MERGES),
                                   encoding="utf-8")
    (raw / "dict.txt").write_text("".join(f"{i} {10000 - i}\n" for i in range(len(symbols))), encoding="utf-8")
    return raw
