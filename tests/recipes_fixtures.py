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
import os
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


# ---------------------------------------------------------------------------------------------
# stand-ins for the fairseq tools (the recipes' own logic, tested without a model): each fake
# records its command line in $FAKE_DIR/calls.log (one line per call, arguments separated by
# tabs) and answers from files the test writes into $FAKE_DIR.

_FAKE_GENERATE = r'''
"""fairseq-generate: hypotheses from FAKE_DIR/SUBSET.lenpenL.hyp (else SUBSET.hyp), one per line
of the subset, in fairseq's output layout (S-, T-, H-, D- lines), FAKE_GENERATE_DELAY seconds
between lines; a BLEU4 line at the end as fairseq's default scorer prints it. Its process id
goes to FAKE_DIR/generate.pid."""
import os, sys, time
fake = os.environ["FAKE_DIR"]
args = sys.argv[1:]
with open(os.path.join(fake, "calls.log"), "a", encoding="utf-8") as f:
    f.write("fairseq-generate\t" + "\t".join(args) + "\n")
with open(os.path.join(fake, "generate.pid"), "w") as f:
    f.write(str(os.getpid()))
opt = lambda name, default=None: args[args.index(name) + 1] if name in args else default
subset, lenpen = opt("--gen-subset", "test"), opt("--lenpen", "1")
path = os.path.join(fake, f"{subset}.lenpen{lenpen}.hyp")
if not os.path.exists(path):
    path = os.path.join(fake, f"{subset}.hyp")
with open(path, encoding="utf-8") as f:
    hyps = f.read().splitlines()
delay = float(os.environ.get("FAKE_GENERATE_DELAY", "0"))
print("INFO | fairseq_cli.generate | loading the model", file=sys.stderr)
for i, hyp in enumerate(hyps):
    print(f"S-{i}\tsource {i}\nH-{i}\t-0.5\t{hyp}\nD-{i}\t-0.5\t{hyp}", flush=True)
    time.sleep(delay)
print(f"Generate {subset} with beam=5: BLEU4 = 12.34, 40.0/20.0/10.0/5.0 (BP=1.000)")
'''

_FAKE_VALIDATE = r'''
"""fairseq-validate: fixed perplexities of valid and test."""
import os, sys
with open(os.path.join(os.environ["FAKE_DIR"], "calls.log"), "a", encoding="utf-8") as f:
    f.write("fairseq-validate\t" + "\t".join(sys.argv[1:]) + "\n")
print("valid on 'valid' subset | loss 4.1 | nll_loss 3.0 | ppl 8.00 | wps 100")
print("valid on 'test' subset | loss 4.2 | nll_loss 3.1 | ppl 8.57 | wps 100")
'''

_FAKE_EVAL_LM = r'''
"""fairseq-eval-lm: prints FAKE_DIR/eval-lm.out (fairseq's log of a run) to stdout and stderr
as fairseq does (its logger writes to stdout), exits with the code in FAKE_DIR/eval-lm.rc."""
import os, sys
fake = os.environ["FAKE_DIR"]
with open(os.path.join(fake, "calls.log"), "a", encoding="utf-8") as f:
    f.write("fairseq-eval-lm\t" + "\t".join(sys.argv[1:]) + "\n")
with open(os.path.join(fake, "eval-lm.out"), encoding="utf-8") as f:
    sys.stdout.write(f.read())
rc = os.path.join(fake, "eval-lm.rc")
sys.exit(int(open(rc).read()) if os.path.exists(rc) else 0)
'''

_FAKE_TRAIN = r'''
"""fairseq-train: a train.log-style output naming the checkpoints it "saved", and an empty
checkpoint_last.pt in --save-dir; a --lr that is not a number fails as fairseq's parser does."""
import os, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["FAKE_DIR"], "calls.log"), "a", encoding="utf-8") as f:
    f.write("fairseq-train\t" + "\t".join(args) + "\n")
for i, arg in enumerate(args[:-1]):
    if arg == "--lr":
        try:
            float(args[i + 1])
        except ValueError:
            sys.exit(f"fairseq-train: error: argument --lr: invalid float value: {args[i + 1]!r}")
save_dir = args[args.index("--save-dir") + 1]
updates = int(args[len(args) - 1 - args[::-1].index("--max-update") + 1])
os.makedirs(save_dir, exist_ok=True)
open(os.path.join(save_dir, "checkpoint_last.pt"), "wb").close()
print("INFO | fairseq_cli.train | num. shared model params: 1,000 (num. trained: 1,000)")
print(f"INFO | fairseq.checkpoint_utils | Saved checkpoint {save_dir}/checkpoint_1_{updates}.pt "
      f"(epoch 1 @ {updates} updates, score 5.0) (writing took 0.1 seconds)")
'''


def install_fake_tools(bin_dir: Path, python: str) -> Path:
    """Write fake fairseq-generate, fairseq-validate, fairseq-eval-lm and fairseq-train into
    BIN_DIR, run with the interpreter PYTHON."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, code in (("fairseq-generate", _FAKE_GENERATE), ("fairseq-validate", _FAKE_VALIDATE),
                       ("fairseq-eval-lm", _FAKE_EVAL_LM), ("fairseq-train", _FAKE_TRAIN)):
        path = bin_dir / name
        path.write_text(f"#!{python}\n{code.lstrip()}", encoding="utf-8")
        path.chmod(0o755)
    return bin_dir


def fake_calls(fake_dir: Path, tool: str) -> list[list[str]]:
    """The command lines a fake tool was called with, in order."""
    log = fake_dir / "calls.log"
    if not log.exists():
        return []
    calls = [line.split("\t") for line in log.read_text(encoding="utf-8").splitlines()]
    return [call[1:] for call in calls if call[0] == tool]


def option_value(argv: list[str], name: str) -> str | None:
    """The value of the last NAME in ARGV (fairseq's argparse keeps the last one)."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]
    return values[-1] if values else None


def chinese_sentences(count: int, seed: int = 0) -> list[str]:
    """COUNT sentences of 12-20 common Chinese characters, no spaces and no punctuation (the
    Moses tokenizer leaves each one a single token)."""
    import random
    chars = "我们你他她是的了在有和人这中大为上个国不以会要到说时生也就出年可那得于着下自之过家学对"
    rng = random.Random(seed)
    return ["".join(rng.choice(chars) for _ in range(rng.randint(12, 20))) for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# the paths the docs' recipe commands name, as small stand-ins (tests/fixtures/recipe_commands.json)

DOC_SENTENCES = 12  # sentences of every split of the stand-in data-bins


def write_indexed(prefix: Path, items: list[list[int]]) -> None:
    """PREFIX.bin / PREFIX.idx as fairseq-preprocess writes them (mmap dataset)."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset
    builder = indexed_dataset.MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for ids in items:
        builder.add_item(torch.tensor(ids, dtype=torch.int64))
    builder.finalize(f"{prefix}.idx")


def _dictionary(words: list[str]) -> str:
    return "".join(f"{word} {100 - i}\n" for i, word in enumerate(words))


def translation_stand_in(folder: Path, src: str, tgt: str, count: int = DOC_SENTENCES) -> Path:
    """A translation data-bin of COUNT sentences per split, as the prepare scripts leave it:
    dictionaries, binarized splits, recipe.info and the untokenized valid/test references."""
    folder.mkdir(parents=True)
    words = sorted({w for lang in (src, tgt) for split in ("valid", "test")
                    for line in stand_in(lang, split, 0, count) for w in line.split()})
    ids = {word: 4 + i for i, word in enumerate(words)}
    for lang in (src, tgt):
        (folder / f"dict.{lang}.txt").write_text(_dictionary(words), encoding="utf-8")
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            lines = stand_in(lang, "test" if split == "train" else split, 0, count)
            write_indexed(folder / f"{split}.{src}-{tgt}.{lang}", [[ids[w] for w in line.split()] + [2] for line in lines])
            if split != "train":
                (folder / f"{split}.raw.{lang}").write_text(_text(lines).decode("utf-8"), encoding="utf-8")
    (folder / "recipe.info").write_text(f"SRC={src}\nTGT={tgt}\nSCHEME=moses-bpe\n", encoding="utf-8")
    return folder


def lm_stand_in(folder: Path, count: int = DOC_SENTENCES) -> Path:
    """A language-model data-bin: dict.txt and COUNT binarized lines per split."""
    folder.mkdir(parents=True)
    (folder / "dict.txt").write_text(_dictionary([f"w{i}" for i in range(40)]), encoding="utf-8")
    for split in ("train", "valid", "test"):
        write_indexed(folder / split, [[4 + (i * 7 + j) % 40 for j in range(3 + i % 5)] + [2]
                                       for i in range(count)])
    return folder


def stand_in_checkpoint(path: Path, arch: str, task: str, **fields) -> Path:
    """A checkpoint file holding only the configuration the evaluation recipes read."""
    import torch
    path.parent.mkdir(parents=True, exist_ok=True)
    model = {"_name": arch, "arch": arch}
    task_cfg = {"_name": task}
    for key, value in fields.items():
        (task_cfg if key in ("source_lang", "target_lang", "tokens_per_sample") else model)[key] = value
    if task == "translation":
        model.update(source_lang=fields.get("source_lang"), target_lang=fields.get("target_lang"))
    torch.save({"cfg": {"model": model, "task": task_cfg}, "model": {}}, path)
    return path


def doc_examples(root: Path, python: str) -> dict[str, str]:
    """Under ROOT, the data-bins, checkpoints and folders the docs' recipe commands name (the
    translation ones en-de unless named otherwise), fake fairseq tools answering from ROOT/fake,
    and the environment to run them in (fake tools first on PATH)."""
    for name in ("data-bin/mydata", "wmt14_anthe/data-bin", "wmt14_google/data-bin", "build/data/ende_bpe8000/data-bin"):
        translation_stand_in(root / name, "en", "de")
    translation_stand_in(root / "wmt16_en_ro/data-bin", "en", "ro")
    translation_stand_in(root / "wmt17_de_en/data-bin", "de", "en")
    for name in ("data-bin/mylm", "wikitext-103/data-bin", "wikitext-103-gpt2/data-bin"):
        lm_stand_in(root / name)
    (root / "raw").mkdir()
    (root / "wmt14_anthe/data-bin/spm.model").write_bytes(b"a sentencepiece model\n")
    for folder in ("anthe", "anthe_base"):
        stand_in_checkpoint(root / "checkpoints" / folder / "checkpoint_best.pt", "anthe_base", "translation",
                            source_lang="en", target_lang="de")
    stand_in_checkpoint(root / "checkpoints/subformer_lm_wiki103_83m/checkpoint_best.pt",
                        "subformer_lm_wiki103_83m", "language_modeling", max_target_positions=64,
                        tokens_per_sample=64)
    fake = root / "fake"
    install_fake_tools(fake / "bin", python)
    refs = {split: (root / f"wmt14_anthe/data-bin/{split}.raw.de").read_text(encoding="utf-8")
            for split in ("valid", "test")}
    for split, text in refs.items():
        (fake / f"{split}.hyp").write_text(text, encoding="utf-8")
    from fairseq.data import indexed_dataset
    dataset = indexed_dataset.MMapIndexedDataset(str(root / "wikitext-103/data-bin/test"))
    tokens = int(dataset.sizes.sum())  # read while the dataset (its memory map) is alive
    del dataset
    (fake / "eval-lm.out").write_text(
        "INFO | fairseq_cli.eval_lm | loading model(s)\n"
        f"INFO | fairseq_cli.eval_lm | Evaluated {tokens:,} tokens in 1.0s (100.00 tokens/s)\n"
        "INFO | fairseq_cli.eval_lm | Loss (base 2): 6.1571, Perplexity: 71.37\n", encoding="utf-8")
    return {"PATH": f"{fake / 'bin'}{os.pathsep}{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_DIR": str(fake), "NUM_WORKERS": "1"}


# ---------------------------------------------------------------------------------------------
# the recipes, run in the test's process (examples/*/*.sh each exec one of these modules)

RECIPE_MODULES = {f"{p.parent.name}/{p.name}": p.stem.replace("-", "_")
                  for p in sorted((REPO / "examples").glob("*/*.sh"))}


def recipe_module(script: str):
    """The module examples/SCRIPT runs (``translation/train-anthe.sh`` -> ``...recipes.train_anthe``)."""
    import importlib
    return importlib.import_module(f"slim_fairseq_lab.recipes.{RECIPE_MODULES[script]}")


def recipe_env(**extra: str) -> dict:
    """What a recipe's environment adds in the tests: the venv's tools first on PATH (CI activates
    no venv), one worker, no Python warnings, a short connect timeout; ``extra`` wins."""
    import sys
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "NUM_WORKERS": "1",
           "PYTHONWARNINGS": "ignore", "CONNECT_TIMEOUT": "3"}
    env.update(extra)
    return env


def run_recipe(script: str, *argv: str, cwd=None, env: dict | None = None, gpus: int | None = None):
    """Run the recipe of examples/SCRIPT in this process, as ``bash examples/SCRIPT ARGV`` would
    (cwd, environment, its stdout and stderr, the tools' output relayed into them); ``gpus``: the
    CUDA devices it sees. Returns a CompletedProcess."""
    import contextlib
    import io
    import subprocess
    import tempfile
    import warnings
    from slim_fairseq_lab.recipes import training
    module = recipe_module(script)
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_gpus, saved_tmp = dict(os.environ), training.gpu_count, tempfile.tempdir
    os.environ.update(recipe_env(**(env or {})))
    tempfile.tempdir = str(cwd or os.getcwd())  # a failed run's logs stay in the test's folder
    if gpus is not None:
        training.gpu_count = lambda: gpus
    try:
        with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status = module.main([str(a) for a in argv])
    finally:
        training.gpu_count, tempfile.tempdir = saved_gpus, saved_tmp
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["bash", f"examples/{script}", *argv], status, out.getvalue(), err.getvalue())
