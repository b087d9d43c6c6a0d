"""
WMT14 English-German (the Anthe and Subformer papers' main benchmark).

train: Europarl v7 + Common Crawl + News Commentary v9 (4.5M pairs)
valid: newstest2013          test: newstest2014 (full release, 3003 sentences)
Default segmentation: Moses tokenization (sacremoses), one joint BPE with subword-nmt (32K
merges; --bpe-merges), training pairs filtered to 1..250 tokens and length ratio <= 1.5,
fairseq-preprocess --joined-dictionary.

Paper settings (--paper PAPER):
  anthe      the Anthe paper (arXiv:2305.10991, Sec. 3) uses "the same tokenizer for all the
             languages, which is a byte-pair encoding with 32K sub-words, trained on the
             WikiText-103 dataset": one sentencepiece BPE model (--vocab-size 32000) learned
             on WikiText-103's raw training text (one more download; the paper does not name
             its BPE implementation), applied to the untokenized text of both sides, one
             joined dictionary. --spm-model FILE reuses a model, e.g. the spm.model of
             prepare-wmt17.sh PAIR --paper, so that every dataset shares one tokenizer as in
             the paper.
  subformer  the Subformer paper uses the WMT14 data as Google preprocessed it (fairseq's
             scaling_nmt example: wmt16_en_de.tar.gz, Moses tokens, 32K joint BPE), binarized
             as that example does (--joined-dictionary, 32768 types per side). The archive
             sits on Google Drive, which wants a browser confirmation: download it by hand
             and pass --raw-dir. Its tokenized newstest2013/2014 become the references of
             tokenized BLEU (evaluate.sh).
The default is the common fairseq-style setup (one joint BPE on our own Moses
tokenization): it serves both model families from one dataset.

usage: prepare-wmt14en2de.sh [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR]
           [--paper anthe|subformer] [--bpe-merges N] [--vocab-size N] [--spm-model FILE]
           [--max-len N] [--ratio R] [--src en --tgt de] [--no-verify] [--dry-run]
  --spm-model FILE  with --paper anthe: this sentencepiece model instead of learning one
  --bpe-merges is the default setting's, --vocab-size and --spm-model are --paper anthe's,
                 --max-len and --ratio not --paper subformer's: given to another setting (which
                 would ignore them) they are refused
  --raw-dir DIR  the downloads, already downloaded, under the names --dry-run lists (WMT14's
                 dev.tgz as wmt14-dev.tgz: several WMT years share one folder); no network
  --dry-run      list the downloads (and whether --raw-dir has them), change nothing
"""
import os
import shutil
import sys

from slim_fairseq_lab.recipes import cli, downloads, pipelines, text
from slim_fairseq_lab.recipes.cli import log, refuse
from slim_fairseq_lab.recipes.downloads import extract, find_one

PROG = "prepare-wmt14en2de.sh"
# Google's preprocessed WMT14 (the archive of fairseq's examples/scaling_nmt)
GOOGLE_URL = "https://drive.google.com/uc?export=download&id=0B_bZck-ksdkpM25jRUN2X2UxMm8"
# URL, local file name, checksum (md5s as published with sacreBLEU and Sockeye's WMT data lists)
SOURCES = (
    ("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", "training-parallel-europarl-v7.tgz",
     "md5:c52404583294a1b609e56d45b2ed06f5"),
    ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "training-parallel-commoncrawl.tgz",
     "md5:7e0acbe86b0d7816300e14650f5b2bd4"),
    ("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", "training-parallel-nc-v9.tgz",
     "md5:92e42b68f9d3c2ae9722e6d1c2623e21"),
    ("https://www.statmt.org/wmt14/dev.tgz", "wmt14-dev.tgz", "md5:88ba3fc60b2278d59277122e1c7dd6e7"),
    ("https://www.statmt.org/wmt14/test-full.tgz", "test-full.tgz", "md5:a8cd784e006feb32ac6f3d9ec7eb389a"),
)
# The Anthe paper's tokenizer (arXiv:2305.10991, Sec. 3): one 32K BPE trained on WikiText-103,
# for every language; the recipes learn it on the raw release's training text.
WIKITEXT103_RAW = ("https://wikitext.smerity.com/wikitext-103-raw-v1.zip", "wikitext-103-raw-v1.zip",
                   "sha1:86f2375181b9247049d9c9205fad2b71b274b568")


def wikitext103_train_text(fetched, folder):
    """The path of wiki.train.raw, extracted into FOLDER from the download of WIKITEXT103_RAW."""
    extract(fetched.raw_path(WIKITEXT103_RAW[1]), folder)
    return find_one(folder, "wiki.train.raw")


def parser():
    p = cli.Parser(PROG)
    downloads.add_options(p, work_dir="wmt14_en_de")
    p.value("--max-len", kind="count")
    p.value("--ratio", kind="positive")
    p.value("--paper", kind="choice:anthe|subformer")
    p.value("--bpe-merges", kind="count")
    p.value("--vocab-size", kind="count")
    p.value("--spm-model")
    p.value("--src", kind="choice:en|de", default="en")
    p.value("--tgt", kind="choice:en|de", default="de")
    return p


def prepare(argv):
    args, _ = cli.split(parser(), argv)
    raw_dir = downloads.readable_folder("--raw-dir", args.raw_dir) if args.raw_dir else None
    spm_model = downloads.readable_file("--spm-model", args.spm_model) if args.spm_model else None
    src, tgt = args.src, args.tgt
    if f"{src}-{tgt}" not in ("en-de", "de-en"):
        raise refuse(f"--src={src} --tgt={tgt}", "not a direction of WMT14 en-de",
                     "--src en --tgt de, or --src de --tgt en")
    if spm_model and args.paper != "anthe":
        raise refuse(f"--spm-model={args.spm_model}", "a sentencepiece model, and this setting learns "
                     "BPE codes", "--paper anthe, or no --spm-model")
    if args.vocab_size and args.paper != "anthe":
        raise refuse(f"--vocab-size={args.vocab_size}", "the sentencepiece vocabulary of --paper anthe, and this "
                     "setting learns BPE merges instead", f"--bpe-merges {args.vocab_size}, or --paper anthe")
    if args.bpe_merges and args.paper:
        raise refuse(f"--bpe-merges={args.bpe_merges}", f"the merges of the default segmentation, and --paper "
                     f"{args.paper} segments otherwise", "--vocab-size N with --paper anthe" if args.paper == "anthe"
                     else "drop --bpe-merges (Google's data has its own 32K BPE)")
    if args.paper == "subformer":
        for flag, value in (("--max-len", args.max_len), ("--ratio", args.ratio)):
            if value:
                raise refuse(f"{flag}={value}", "filters the pairs of our own segmentation, and --paper subformer "
                             "binarizes Google's data as it is", f"drop {flag}")
    if args.paper == "subformer" and not raw_dir and not args.dry_run:
        raise refuse("--paper=subformer", f"Google's wmt16_en_de.tar.gz is behind a confirmation page of "
                     f"Google Drive ({GOOGLE_URL})", "--raw-dir FOLDER, a folder you downloaded it into")
    merges = args.bpe_merges or os.environ.get("BPE_MERGES") or "32000"
    vocab_size, max_len, ratio = args.vocab_size or "32000", args.max_len or "250", args.ratio or "1.5"
    folders = downloads.Folders(args, args.work_dir, raw_dir, [spm_model])
    dest, tmp, extracted, fetched = folders.dest, folders.tmp, folders.extracted, folders.fetched

    if args.paper == "subformer":
        fetched.fetch(GOOGLE_URL, "wmt16_en_de.tar.gz", "")
        if fetched.stop_if_dry():
            return 0
        os.makedirs(os.path.join(tmp, "prep"), exist_ok=True)
        google = os.path.join(extracted, "google")
        extract(fetched.raw_path("wmt16_en_de.tar.gz"), google)
        for lang in (src, tgt):
            for split, name in (("train", "train.tok.clean.bpe.32000"), ("valid", "newstest2013.tok.bpe.32000"),
                                ("test", "newstest2014.tok.bpe.32000")):
                shutil.copyfile(find_one(google, f"{name}.{lang}"), os.path.join(tmp, "prep", f"{split}.{lang}"))
        with pipelines.data_bin(PROG, dest) as out:
            pipelines.binarize(os.path.join(tmp, "prep"), src, tgt, out, extra=("--nwordssrc", "32768",
                                                                              "--nwordstgt", "32768"))
            shutil.copyfile(find_one(google, "bpe.32000"), os.path.join(out, "bpecodes"))
            for lang in (src, tgt):
                for split, name in (("valid", "newstest2013"), ("test", "newstest2014")):
                    shutil.copyfile(find_one(google, f"{name}.{lang}"), os.path.join(out, f"{split}.raw.{lang}"))
                    shutil.copyfile(find_one(google, f"{name}.tok.{lang}"), os.path.join(out, f"{split}.tok.{lang}"))
            pipelines.write_recipe_info(out, f"SRC={src}", f"TGT={tgt}", "SCHEME=moses-bpe",
                                        "SOURCE=google-wmt16_en_de", "REF_TOKENS=Moses tokenizer without -a "
                                        f"(Google's preprocessing: the data's own test.tok.{tgt})")
        log(f"done: {dest} ({text.line_count(os.path.join(dest, f'dict.{src}.txt'))} dictionary entries)")
        return 0

    sources = list(SOURCES) + ([WIKITEXT103_RAW] if args.paper == "anthe" and not spm_model else [])
    for url, name, spec in sources:
        fetched.fetch(url, name, spec)
    if fetched.stop_if_dry():
        return 0
    for url, name, spec in sources:
        if name != WIKITEXT103_RAW[1]:
            extract(fetched.raw_path(name), extracted)
    folders.fresh_text()
    for corpus in ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"):
        text.append_parallel(find_one(extracted, f"{corpus}.{src}"), find_one(extracted, f"{corpus}.{tgt}"),
                             os.path.join(tmp, "raw.train"), src, tgt, PROG)
    text.sgm_to_text(find_one(extracted, f"newstest2013-src.{src}.sgm"), os.path.join(tmp, f"raw.valid.{src}"))
    text.sgm_to_text(find_one(extracted, f"newstest2013-ref.{tgt}.sgm"), os.path.join(tmp, f"raw.valid.{tgt}"))
    text.sgm_to_text(find_one(extracted, f"newstest2014-deen-src.{src}.sgm"), os.path.join(tmp, f"raw.test.{src}"))
    text.sgm_to_text(find_one(extracted, f"newstest2014-deen-ref.{tgt}.sgm"), os.path.join(tmp, f"raw.test.{tgt}"))
    if args.paper == "anthe":
        if not spm_model:
            train_text = wikitext103_train_text(fetched, os.path.join(extracted, "wikitext-103-raw"))
            log(f"training a sentencepiece BPE model, vocabulary {vocab_size}, on: {train_text}")
            pipelines.spm_train(os.path.join(tmp, "spm"), vocab_size, 1.0, 10000000, [train_text])
            spm_model = os.path.join(tmp, "spm.model")
        pipelines.spm_pipeline(PROG, tmp, src, tgt, dest, spm_model, spm_model, max_len, ratio)
    else:
        pipelines.moses_bpe_pipeline(PROG, tmp, src, tgt, merges, max_len, ratio, dest)
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, prepare, argv)


if __name__ == "__main__":
    sys.exit(main())
