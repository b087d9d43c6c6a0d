"""
WikiText-103 (word level, the "tokens" release: 103M training tokens, 267K word types), as
used by the adaptive-input and Subformer language models, binarized with
fairseq-preprocess --only-source.

The original address (https://s3.amazonaws.com/research.metamind.io/wikitext/...) now
answers 403. By default the archive is fetched from the mirror below; pass another address
with --url, an archive you already have with --archive FILE, or a folder holding
wikitext-103-v1.zip (or its extracted wikitext-103/wiki.*.tokens) with --raw-dir.
The archive is checked against the SHA-1 published with GluonNLP.

--gpt2-bpe: instead, the raw release (wikitext-103-raw-v1.zip) encoded with GPT-2's byte-level
BPE (fairseq's encoder.json / vocab.bpe) and binarized with fairseq's GPT-2 dict.txt: the
50K vocabulary of the STLM and Anthe language models. --raw-dir then holds
wikitext-103-raw-v1.zip, encoder.json, vocab.bpe and dict.txt.

Paper vs recipe: the Subformer LMs are trained and evaluated on this word-level data as in
fairseq's adaptive-input example (the paper's setting); the STLM and Anthe LMs assume GPT-2's
vocabulary, which --gpt2-bpe builds the way fairseq's RoBERTa example encodes WikiText-103.

usage: prepare-wikitext-103.sh [--raw-dir DIR | --archive FILE | --url URL] [--gpt2-bpe]
           [--work-dir DIR] [--dest-dir DIR] [--no-verify] [--dry-run]
  --work-dir default: wikitext-103, or wikitext-103-gpt2 with --gpt2-bpe (the two preparations
             never share a folder: each deletes its own data-bin before writing it)
  --dry-run  list the downloads (and whether --raw-dir has them), change nothing
"""
import os
import sys
import zipfile

from slim_fairseq_lab.recipes import cli, downloads, pipelines, text, tools
from slim_fairseq_lab.recipes.cli import log, refuse
from slim_fairseq_lab.recipes.downloads import extract, find_one

PROG = "prepare-wikitext-103.sh"
URL = "https://wikitext.smerity.com/wikitext-103-v1.zip"
ARCHIVES = {  # the word-level and the raw release (SHA-1 as published with GluonNLP)
    False: ("wikitext-103-v1.zip", "sha1:0aec09a7537b58d4bb65362fee27650eeaba625a"),
    True: ("wikitext-103-raw-v1.zip", "sha1:86f2375181b9247049d9c9205fad2b71b274b568"),
}
GPT2 = "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe"


def parser():
    p = cli.Parser(PROG)
    downloads.add_options(p)
    p.value("--archive")
    p.value("--url", default=URL)
    p.flag("--gpt2-bpe", default=False)
    return p


def gpt2_encode(encoder, vocab, src, out):
    """One line of GPT-2 BPE ids per line of text (empty lines kept, as fairseq's RoBERTa recipe)."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    bpe = get_encoder(encoder, vocab)
    with open(src, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as o:
        for line in f:
            o.write(" ".join(map(str, bpe.encode(line.strip()))) + "\n")


def prepare(argv):
    args, _ = cli.split(parser(), argv)
    raw_dir = downloads.readable_folder("--raw-dir", args.raw_dir) if args.raw_dir else None
    archive = downloads.readable_file("--archive", args.archive) if args.archive else None
    name, spec = ARCHIVES[args.gpt2_bpe]
    url = args.url
    if args.gpt2_bpe and url.endswith("/wikitext-103-v1.zip"):  # the raw release, same mirror
        url = url.rsplit("/", 1)[0] + "/wikitext-103-raw-v1.zip"
    if archive and not zipfile.is_zipfile(archive):
        raise refuse(f"--archive={args.archive}", "not a zip archive",
                     f"the {name} archive (downloaded from {url})")
    folders = downloads.Folders(args, args.work_dir or ("wikitext-103-gpt2" if args.gpt2_bpe else "wikitext-103"),
                                raw_dir, [archive])
    work, dest, fetched = folders.work, folders.dest, folders.fetched
    if archive and not args.dry_run:
        fetched.verify(archive, spec, given_by="--archive", url=url)
    extracted = folders.extracted
    suffix = "raw" if args.gpt2_bpe else "tokens"
    folder = name[:-len("-v1.zip")]
    source = None
    if raw_dir and os.path.isfile(os.path.join(raw_dir, folder, f"wiki.train.{suffix}")):
        source = os.path.join(raw_dir, folder)
        log(f"using the extracted text in {source}")
    elif archive:
        if args.dry_run:
            print(f"archive {archive} (given with --archive)", flush=True)
    else:
        fetched.fetch(url, name, spec)
    if args.gpt2_bpe:
        for part in ("encoder.json", "vocab.bpe", "dict.txt"):
            fetched.fetch(f"{GPT2}/{part}", part)
    if fetched.stop_if_dry():
        return 0
    if source is None:
        extract(archive or fetched.raw_path(name), extracted)
        source = os.path.dirname(find_one(extracted, f"wiki.train.{suffix}"))
    tools.find("fairseq-preprocess")
    splits = ("train", "valid", "test")
    if args.gpt2_bpe:
        os.makedirs(os.path.join(work, "gpt2"), exist_ok=True)
        for split in splits:
            log(f"GPT-2 BPE encoding wiki.{split}.raw")
            gpt2_encode(fetched.raw_path("encoder.json"), fetched.raw_path("vocab.bpe"),
                        os.path.join(source, f"wiki.{split}.raw"), os.path.join(work, "gpt2", f"wiki.{split}.bpe"))
        prefixes = [os.path.join(work, "gpt2", f"wiki.{split}.bpe") for split in splits]
        extra, scheme = ["--srcdict", fetched.raw_path("dict.txt")], "gpt2-bpe"
    else:
        prefixes = [os.path.join(source, f"wiki.{split}.tokens") for split in splits]
        extra, scheme = [], "words"
    with pipelines.data_bin(PROG, dest) as out:
        tools.run(["fairseq-preprocess", "--only-source", *extra, "--trainpref", prefixes[0], "--validpref",
                   prefixes[1], "--testpref", prefixes[2], "--destdir", out, "--workers", text.workers()])
        pipelines.write_recipe_info(out, f"SCHEME={scheme}")
    log(f"done: {dest} ({text.line_count(os.path.join(dest, 'dict.txt'))} dictionary entries)")
    return 0


def main(argv=None):
    return cli.run(PROG, __doc__, prepare, argv)


if __name__ == "__main__":
    sys.exit(main())
