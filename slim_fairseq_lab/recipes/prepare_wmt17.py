"""
WMT17 news translation, one of the seven pairs with English used by the Anthe paper:
cs, de, fi, lv, ru, tr, zh (either direction: PAIR = xx-en or en-xx).

train: the public WMT17 parallel data of the pair (table below; corpora that need a
       registration -- CzEng, Yandex, CWMT -- can be added with --extra-corpus PREFIX)
valid: newstest2016 (newsdev2017 for lv and zh)     test: newstest2017
Sentencepiece BPE (32K by default) on untokenized text, trained on both sides of the pair
(--tokenizer-lang joint, default), on its English side (en), or on WikiText-103's raw
training text (wikitext-103); --spm-model reuses a trained model. Optional caps: the first
--max-pairs N pairs, or the first pairs within --max-size SIZE (9G = 9 GiB). Then
fairseq-preprocess --joined-dictionary.

Paper vs recipe (the Anthe paper, arXiv:2305.10991, Sec. 3 and 3.2; --paper sets the paper's
choices, explicit options still win):
  tokenizer  paper: "the same tokenizer for all the languages", a 32K BPE trained on
             WikiText-103.  --paper: --tokenizer-lang wikitext-103 --vocab-size 32000, a
             sentencepiece BPE model learned on WikiText-103's raw training text (the paper
             does not name its BPE implementation); train it once, then pass its spm.model
             to the other pairs (and to prepare-wmt14en2de.sh --paper anthe) with --spm-model.
             default: a per-pair joint model, which covers the other language's script
             (an English-only tokenizer splits Cyrillic and Chinese text into characters
             or unknown pieces).
  ru, zh     paper: both pairs "exceed 9G in size, so we limit them to 9G".  --paper:
             --max-size 9G for ru and zh (the first pairs whose two untokenized sides fit
             in 9 GiB; the paper does not say how it measured the size).  default: all pairs.
  corpora    paper: the WMT17 data of each pair; the recipe uses its public part.

usage: prepare-wmt17.sh PAIR [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR] [--paper]
           [--vocab-size N] [--tokenizer-lang joint|en|wikitext-103] [--spm-model FILE]
           [--spm-sample N] [--max-pairs N] [--max-size SIZE] [--max-len N] [--ratio R]
           [--extra-corpus PREFIX]... [--skip CORPUS]... [--no-verify] [--dry-run]
  --raw-dir DIR  the downloads of the pair, already downloaded, under the names --dry-run
                 lists (WMT17's dev.tgz / test.tgz as wmt17-dev.tgz / wmt17-test.tgz: several
                 WMT years share one folder); no network
  --dry-run      list the downloads (and whether --raw-dir has them), change nothing
  CORPUS names for --skip: europarl commoncrawl news-commentary rapid wiki-titles leta dcep
                           books setimes un
"""
import os
import sys

from slim_fairseq_lab.recipes import cli, downloads, pipelines, text
from slim_fairseq_lab.recipes.cli import log, refuse, step_failed
from slim_fairseq_lab.recipes.downloads import extract, find_one
from slim_fairseq_lab.recipes.prepare_wmt14en2de import WIKITEXT103_RAW, wikitext103_train_text

PROG = "prepare-wmt17.sh"
LANGS = ("cs", "de", "fi", "lv", "ru", "tr", "zh")
CORPUS_NAMES = ("europarl", "commoncrawl", "news-commentary", "rapid", "wiki-titles", "leta", "dcep", "books",
                "setimes", "un")
WMT17 = "https://data.statmt.org/wmt17/translation-task"
EP7 = ("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", "training-parallel-europarl-v7.tgz",
       "md5:c52404583294a1b609e56d45b2ed06f5")
EP8 = (f"{WMT17}/training-parallel-ep-v8.tgz", "training-parallel-ep-v8.tgz", "md5:07b77f254d189a5bfb7b43b7fc489716")
CC = ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "training-parallel-commoncrawl.tgz",
      "md5:7e0acbe86b0d7816300e14650f5b2bd4")
NC12 = (f"{WMT17}/training-parallel-nc-v12.tgz", "training-parallel-nc-v12.tgz", "md5:fc6b83b809347e64f511d291e4bc8731")
RAPID = (f"{WMT17}/rapid2016.tgz", "rapid2016.tgz", "md5:17a3a1846433ad26acb95da02f93af93")
WIKI = ("https://www.statmt.org/wmt15/wiki-titles.tgz", "wiki-titles.tgz", "md5:f74eef43032766d55884a5073ed8ce27")
LETA = (f"{WMT17}/leta.v1.tgz", "leta.v1.tgz", "md5:3f367e86924f910cb1e969de57caf63c")
DCEP = (f"{WMT17}/dcep.lv-en.v1.tgz", "dcep.lv-en.v1.tgz", "md5:0f949102e8501dfb3c99d3e3f545b4f9")
BOOKS = (f"{WMT17}/books.lv-en.v1.tgz", "books.lv-en.v1.tgz", "md5:7073092421b1259158446870990a9ca5")
DEV = (f"{WMT17}/dev.tgz", "wmt17-dev.tgz", "md5:9b1aa63c1cf49dccdd20b962fe313989")
TEST = (f"{WMT17}/test.tgz", "wmt17-test.tgz", "md5:86a1724c276004aa25455ae2a04cef26")


def corpora(xx):
    """(corpus name, download (URL, FILE, CHECKSUM), member) of the public WMT17 training data of
    xx-en; member: "par:NAME" (parallel files NAME.{lang}) or "sep:FILE" (" ||| " lines)."""
    found = []
    if xx in ("cs", "de"):
        found.append(("europarl", EP7, f"par:europarl-v7.{xx}-en"))
    if xx in ("fi", "lv"):
        found.append(("europarl", EP8, f"par:europarl-v8.{xx}-en"))
    if xx in ("cs", "de", "ru"):
        found.append(("commoncrawl", CC, f"par:commoncrawl.{xx}-en"))
    if xx in ("cs", "de", "ru", "zh"):
        found.append(("news-commentary", NC12, f"par:news-commentary-v12.{xx}-en"))
    if xx in ("de", "fi", "lv"):
        found.append(("rapid", RAPID, f"par:rapid2016.{'-'.join(sorted((xx, 'en')))}"))
    if xx == "fi":
        found.append(("wiki-titles", WIKI, "sep:titles.fi-en"))
    if xx == "ru":
        found.append(("wiki-titles", WIKI, "sep:wiki.ru-en"))
    if xx == "lv":
        found += [("leta", LETA, "par:leta"), ("dcep", DCEP, "par:dcep"), ("books", BOOKS, "par:farewell")]
    if xx == "tr":
        found.append(("setimes", (f"https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-{xx}.txt.zip",
                                  f"en-{xx}.txt.zip", ""), f"par:SETIMES*.en-{xx}"))
    if xx in ("ru", "zh"):
        found.append(("un", (f"https://storage.googleapis.com/tfdataset-data/downloadataset/uncorpus/UNv1.0.en-{xx}.tar.gz",
                             f"UNv1.0.en-{xx}.tar.gz", ""), f"par:UNv1.0.en-{xx}"))
    return found


def parser():
    p = cli.Parser(PROG)
    downloads.add_options(p)
    p.value("--max-len", kind="count", default="250")
    p.value("--ratio", kind="positive")
    p.value("--vocab-size", kind="count")
    p.value("--tokenizer-lang", kind="choice:joint|en|wikitext-103")
    p.value("--spm-model")
    p.value("--spm-sample", kind="count")
    p.value("--max-size", kind="size")
    p.value("--max-pairs", kind="count")
    p.flag("--paper", default=False)
    p.value("--extra-corpus", append=True, dest="extra_corpus", default=[])
    p.value("--skip", kind="choice:" + "|".join(CORPUS_NAMES), append=True, dest="skip", default=[])
    return p


def prepare(argv):
    args, _ = cli.split(parser(), argv, ("PAIR",))
    pair = args.pair
    if not pair:
        raise refuse("PAIR", "required", "prepare-wmt17.sh PAIR, e.g. de-en (see --help)")
    raw_dir = downloads.readable_folder("--raw-dir", args.raw_dir) if args.raw_dir else None
    spm_model = downloads.readable_file("--spm-model", args.spm_model) if args.spm_model else None
    if pair in (f"{xx}-en" for xx in LANGS):
        src, tgt = pair.split("-")
        xx = src
    elif pair in (f"en-{xx}" for xx in LANGS):
        src, tgt = pair.split("-")
        xx = tgt
    else:
        raise refuse(f"PAIR={pair}", "not a pair of WMT17's news task",
                     "cs-en de-en fi-en lv-en ru-en tr-en zh-en and the reverse directions")
    if spm_model:
        for flag, value in (("--vocab-size", args.vocab_size), ("--tokenizer-lang", args.tokenizer_lang),
                            ("--spm-sample", args.spm_sample)):
            if value:
                raise refuse(f"{flag}={value}", "shapes the tokenizer the recipe learns, and --spm-model gives one",
                             f"drop {flag}, or drop --spm-model")
    for prefix in args.extra_corpus:
        for lang in (src, tgt):
            if not os.path.isfile(f"{prefix}.{lang}"):
                raise refuse(f"--extra-corpus={prefix}", f"no {prefix}.{lang}",
                             f"a prefix of two aligned files, PREFIX.{src} and PREFIX.{tgt}")
    tokenizer_lang, max_size = args.tokenizer_lang, args.max_size
    if args.paper:
        tokenizer_lang = tokenizer_lang or "wikitext-103"
        if xx in ("ru", "zh"):
            max_size = max_size or "9G"
    max_size_bytes = cli.parse_size(max_size) if max_size else None
    tokenizer_lang = tokenizer_lang or "joint"
    vocab_size = args.vocab_size or "32000"
    spm_sample = args.spm_sample or "10000000"
    # Chinese pieces are much shorter than English words: a loose ratio filter
    ratio = args.ratio or ("9" if xx == "zh" else "1.5")
    coverage = "0.9995" if xx == "zh" else "1.0"
    folders = downloads.Folders(args, args.work_dir or f"wmt17_{src}_{tgt}", raw_dir,
                                [spm_model, *args.extra_corpus])
    dest, tmp, extracted, fetched = folders.dest, folders.tmp, folders.extracted, folders.fetched
    pair_corpora = corpora(xx)
    names = [name for name, _, _ in pair_corpora]
    for corpus in args.skip:
        if corpus not in names:
            raise refuse(f"--skip={corpus}", f"not a training corpus of {pair}", "|".join(names))
    size_cap = f"{max_size} = {max_size_bytes} bytes" if max_size else "none"
    log(f"{pair}: tokenizer {spm_model or f'{tokenizer_lang}, vocabulary {vocab_size}'}; pair cap: "
        f"{args.max_pairs or 'none'}; size cap: {size_cap}")

    # 1. downloads (all of them first: a dry run lists them and stops)
    wanted = [download for name, download, _ in pair_corpora if name not in args.skip] + [DEV, TEST]
    if tokenizer_lang == "wikitext-103" and not spm_model:
        wanted.append(WIKITEXT103_RAW)
    for url, name, spec in wanted:
        fetched.fetch(url, name, spec)
    if fetched.stop_if_dry():
        return 0

    # 2. training text
    folders.fresh_text()
    train = os.path.join(tmp, "raw.train")
    for corpus, (url, name, spec), member in pair_corpora:
        if corpus in args.skip:
            log(f"skipping {corpus} (--skip)")
            continue
        folder = os.path.join(extracted, corpus)
        extract(fetched.raw_path(name), folder)
        kind, member = member.split(":", 1)
        if kind == "par":
            text.append_parallel(find_one(folder, f"{member}.{src}"), find_one(folder, f"{member}.{tgt}"), train,
                                 src, tgt, PROG)
        elif src == "en":  # lines are "xx ||| en"
            text.append_separated(find_one(folder, member), " ||| ", train, tgt, src)
        else:
            text.append_separated(find_one(folder, member), " ||| ", train, src, tgt)
    for prefix in args.extra_corpus:
        text.append_parallel(f"{prefix}.{src}", f"{prefix}.{tgt}", train, src, tgt, PROG)
    if not (os.path.isfile(f"{train}.{src}") and os.path.getsize(f"{train}.{src}") > 0):
        raise step_failed(f"no training data collected for {pair}")
    if args.max_pairs:
        text.cap_pairs(train, src, tgt, int(args.max_pairs))
    if max_size_bytes:
        text.cap_bytes(train, src, tgt, max_size_bytes)

    # 3. valid and test
    extract(fetched.raw_path(DEV[1]), os.path.join(extracted, "dev"))
    extract(fetched.raw_path(TEST[1]), os.path.join(extracted, "test"))
    dev_set = "newsdev2017" if xx in ("lv", "zh") else "newstest2016"
    for split, folder, name in (("valid", "dev", dev_set), ("test", "test", "newstest2017")):
        text.sgm_to_text(find_one(os.path.join(extracted, folder), f"{name}-{src}{tgt}-src.{src}.sgm"),
                         os.path.join(tmp, f"raw.{split}.{src}"))
        text.sgm_to_text(find_one(os.path.join(extracted, folder), f"{name}-{src}{tgt}-ref.{tgt}.sgm"),
                         os.path.join(tmp, f"raw.{split}.{tgt}"))

    # 4. tokenizer and binarization
    if not spm_model:
        if tokenizer_lang == "en":
            inputs = [os.path.join(tmp, "raw.train.en")]
        elif tokenizer_lang == "joint":
            inputs = [f"{train}.{src}", f"{train}.{tgt}"]
        else:
            inputs = [wikitext103_train_text(fetched, os.path.join(extracted, "wikitext-103-raw"))]
        log(f"training a sentencepiece BPE model, vocabulary {vocab_size}, on: {' '.join(inputs)}")
        pipelines.spm_train(os.path.join(tmp, "spm"), vocab_size, coverage, spm_sample, inputs)
        spm_model = os.path.join(tmp, "spm.model")
    pipelines.spm_pipeline(PROG, tmp, src, tgt, dest, spm_model, spm_model, args.max_len, ratio)
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, prepare, argv)


if __name__ == "__main__":
    sys.exit(main())
