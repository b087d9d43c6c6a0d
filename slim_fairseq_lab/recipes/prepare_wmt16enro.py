"""
WMT16 English-Romanian (setup of Lee et al. 2018, used by the Subformer paper).

train: Europarl v8 + SETIMES2 (~610K pairs)
valid: newsdev2016           test: newstest2016
The Romanian side gets Sennrich's WMT16 normalisation (cedilla -> comma-below, quotes) and
loses its diacritics, then both sides are Moses-tokenized (sacremoses) and share a joint BPE
(35K merges by default; --bpe-merges), training pairs are filtered to 1..250 tokens and
ratio <= 1.5, and fairseq-preprocess --joined-dictionary binarizes them.

Paper vs recipe: the Subformer paper takes this data as Lee et al. (2018) prepared it (35K
joint BPE); the recipe rebuilds it from the public sources the same way. Its Moses
tokenization (sacremoses) and length filter are the usual fairseq choices; the papers do not
spell them out.

usage: prepare-wmt16enro.sh [--raw-dir DIR] [--work-dir DIR] [--dest-dir DIR]
           [--bpe-merges N] [--max-len N] [--ratio R] [--src en --tgt ro] [--no-verify]
           [--dry-run]
  --raw-dir DIR  the four downloads, already downloaded, under the names --dry-run lists
                 (WMT16's dev.tgz / test.tgz as wmt16-dev.tgz / wmt16-test.tgz: several WMT
                 years share one folder); no network
  --dry-run      list the downloads (and whether --raw-dir has them), change nothing
"""
import os
import sys

from slim_fairseq_lab.recipes import cli, downloads, pipelines, text
from slim_fairseq_lab.recipes.cli import refuse
from slim_fairseq_lab.recipes.downloads import extract, find_one

PROG = "prepare-wmt16enro.sh"
# URL, local file name, checksum (dev/test md5 as published with sacreBLEU; Europarl v8 is the
# archive WMT17 republished with its md5; OPUS publishes no checksum for SETIMES2: its sha256
# is recorded on first download)
SOURCES = (
    ("https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz", "training-parallel-ep-v8.tgz",
     "md5:07b77f254d189a5bfb7b43b7fc489716"),
    ("https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip", "en-ro.txt.zip", ""),
    ("https://data.statmt.org/wmt16/translation-task/dev.tgz", "wmt16-dev.tgz", "md5:4a3dc2760bb077f4308cce96b06e6af6"),
    ("https://data.statmt.org/wmt16/translation-task/test.tgz", "wmt16-test.tgz",
     "md5:3d809cd0c2c86adb2c67034d15c4e446"),
)
# evaluate.sh prints this next to the scores of a Romanian target
REF_NOTE = ("Romanian without diacritics (a a i s t for ă â î ș ț, as in the published en-ro results; the WMT16 "
            "references themselves have them)")


def parser():
    p = cli.Parser(PROG)
    downloads.add_options(p, work_dir="wmt16_en_ro")
    downloads.add_filter_options(p)
    p.value("--bpe-merges", kind="count")
    p.value("--src", kind="choice:en|ro", default="en")
    p.value("--tgt", kind="choice:en|ro", default="ro")
    return p


def prepare(argv):
    args, _ = cli.split(parser(), argv)
    raw_dir = downloads.readable_folder("--raw-dir", args.raw_dir) if args.raw_dir else None
    src, tgt = args.src, args.tgt
    if f"{src}-{tgt}" not in ("en-ro", "ro-en"):
        raise refuse(f"--src={src} --tgt={tgt}", "not a direction of WMT16 en-ro",
                     "--src en --tgt ro, or --src ro --tgt en")
    merges = args.bpe_merges or os.environ.get("BPE_MERGES") or "35000"
    folders = downloads.Folders(args, args.work_dir, raw_dir)
    dest, tmp, extracted, fetched = folders.dest, folders.tmp, folders.extracted, folders.fetched
    for url, name, spec in SOURCES:
        fetched.fetch(url, name, spec)
    if fetched.stop_if_dry():
        return 0
    for url, name, spec in SOURCES:
        extract(fetched.raw_path(name), extracted)
    folders.fresh_text()
    train = os.path.join(tmp, "raw.train")
    text.append_parallel(find_one(extracted, f"europarl-v8.ro-en.{src}"), find_one(extracted, f"europarl-v8.ro-en.{tgt}"),
                         train, src, tgt, PROG)
    text.append_parallel(find_one(extracted, f"SETIMES*.en-ro.{src}"), find_one(extracted, f"SETIMES*.en-ro.{tgt}"),
                         train, src, tgt, PROG)
    for split, name in (("valid", "newsdev2016"), ("test", "newstest2016")):
        text.sgm_to_text(find_one(extracted, f"{name}-{src}{tgt}-src.{src}.sgm"), os.path.join(tmp, f"raw.{split}.{src}"))
        text.sgm_to_text(find_one(extracted, f"{name}-{src}{tgt}-ref.{tgt}.sgm"), os.path.join(tmp, f"raw.{split}.{tgt}"))
    # Romanian normalisation before tokenization and BPE, on every split (references included,
    # as in the published en-ro results)
    for split in ("train", "valid", "test"):
        text.romanian_normalise(os.path.join(tmp, f"raw.{split}.ro"))
    pipelines.moses_bpe_pipeline(PROG, tmp, src, tgt, merges, args.max_len, args.ratio, dest,
                                 info=[f"REF_NOTE={REF_NOTE}"] if tgt == "ro" else [])
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, prepare, argv)


if __name__ == "__main__":
    sys.exit(main())
