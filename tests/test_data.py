"""Bundled real data and the binarize helper (scripts/binarize_bundled.py)."""
import gzip
import os
import re
import sys

import pytest

from helpers import REPO, ende_data_bin, wikitext_data_bin

sys.path.insert(0, os.path.join(REPO, "scripts"))
import binarize_bundled  # noqa: E402
import prepare_bundled_data  # noqa: E402

ENDE = os.path.join(REPO, "data", "ende")
WIKI = os.path.join(REPO, "data", "wikitext-2")
SPLITS = ("train", "valid", "test")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def ende():
    return {(split, lang): read(os.path.join(ENDE, f"{split}.{lang}")) for split in SPLITS for lang in ("en", "de")}


def test_ende_sizes_and_alignment(ende):
    for split in SPLITS:
        assert len(ende[split, "en"]) == len(ende[split, "de"]), split
    assert len(ende["valid", "en"]) == 1000
    assert len(ende["test", "en"]) == 1000
    assert 17000 <= len(ende["train", "en"]) <= 18000
    total = sum(len(ende[s, "en"]) for s in SPLITS)
    assert 19000 <= total <= 19762  # ~19.7k unique pairs before deduplicating both sides


def test_ende_sentences_are_clean(ende):
    for (split, lang), lines in ende.items():
        for line in lines:
            assert line == " ".join(line.split()) and line, f"{split}.{lang}: whitespace: {line!r}"
            assert not re.search(r"[{}\[\]]", line), f"{split}.{lang}: tag left: {line!r}"
            assert line.endswith((".", "!", "?")), f"{split}.{lang}: not a sentence: {line!r}"
            assert len(line.split()) >= 3, f"{split}.{lang}: too short: {line!r}"
            assert " :: " not in line and " | " not in line, f"{split}.{lang}: dictionary markup: {line!r}"


def test_ende_no_repeated_sentences_and_no_test_in_train(ende):
    key = prepare_bundled_data.sentence_key
    for lang in ("en", "de"):
        every = [key(s) for split in SPLITS for s in ende[split, lang]]
        assert len(every) == len(set(every)), f"a {lang} sentence occurs twice"
        train = {key(s) for s in ende["train", lang]}
        assert not train & {key(s) for s in ende["test", lang]}
        assert not train & {key(s) for s in ende["valid", lang]}


def test_extraction_rules_on_dictionary_lines():
    lines = [
        "# comment :: ignored",
        "Er kam zu spät. {v} | Sie geht nach Hause.; Sie geht heim. :: He came late. [coll.] | She goes home.; She walks home.",
        "Ein Wort {n} :: A word",  # not a sentence
        "Zwei | Teile. Hier sind drei. :: only one part here.",  # unaligned sub-entries
        "Das ist gut! :: That is good!",
    ]
    pairs = list(prepare_bundled_data.extract_ding_pairs(lines))
    assert pairs == [("Er kam zu spät.", "He came late."), ("Sie geht nach Hause.", "She goes home."),
                     ("Das ist gut!", "That is good!")]
    deduped = prepare_bundled_data.dedup_both_sides(
        [("A b c.", "X y z."), ("A b c.", "Other one here."), ("New one here.", "x  Y z.")])
    assert deduped == [("A b c.", "X y z.")]


def test_wikitext_files():
    expected = prepare_bundled_data.WIKITEXT_LINES
    for split in SPLITS:
        with gzip.open(os.path.join(WIKI, f"wiki.{split}.raw.gz"), "rt", encoding="utf-8") as f:
            text = f.read()
        assert text.count("\n") == expected[split]
        assert " = " in text and "@-@" in text  # raw WikiText: headings and split hyphens
    with gzip.open(os.path.join(WIKI, "wiki.train.raw.gz"), "rt", encoding="utf-8") as f:
        assert "= Valkyria Chronicles III =" in f.read(500)


def test_licences_and_size():
    for corpus, needle in (("ende", "GNU GENERAL PUBLIC LICENSE"), ("wikitext-2", "CC BY-SA")):
        with open(os.path.join(REPO, "data", corpus, "LICENSE"), encoding="utf-8") as f:
            assert needle in f.read()
        assert os.path.exists(os.path.join(REPO, "data", corpus, "README.md"))
    total = sum(os.path.getsize(os.path.join(root, name))
                for root, _, names in os.walk(os.path.join(REPO, "data")) for name in names)
    assert total < 10 * 1024 * 1024


def _load(data_bin, name, dictionary):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(os.path.join(data_bin, name), dictionary)


def test_binarize_ende_subset():
    from fairseq.data import Dictionary

    data_bin = ende_data_bin()  # subset=1500, eval_subset=100 (shared cache with other tests)
    src_dict = Dictionary.load(os.path.join(data_bin, "dict.en.txt"))
    tgt_dict = Dictionary.load(os.path.join(data_bin, "dict.de.txt"))
    assert src_dict.symbols == tgt_dict.symbols  # --joined-dictionary
    train_src = _load(data_bin, "train.en-de.en", src_dict)
    assert len(train_src) == 1500
    assert len(_load(data_bin, "valid.en-de.de", tgt_dict)) == 100
    assert len(_load(data_bin, "test.en-de.en", src_dict)) == 100
    # the first training sentence decodes back to its Moses-tokenized text
    paths = binarize_bundled.ende_paths(os.path.dirname(os.path.dirname(data_bin)), 1500, 100, 1000)
    assert paths["data_bin"] == data_bin
    decoded = src_dict.string(train_src[0], bpe_symbol="@@ ")
    tokenized = read(os.path.join(paths["tok"], "train.en"))[0]
    assert decoded == tokenized
    assert len(read(os.path.join(paths["tok"], "train.de"))) == len(read(os.path.join(ENDE, "train.de")))
    assert os.path.exists(paths["codes"])
    # what evaluate.sh reads: the languages, and the untokenized valid/test text of the subset
    # (sacreBLEU against the references themselves; Moses does not round-trip every line)
    assert read(os.path.join(data_bin, "recipe.info")) == ["SRC=en", "TGT=de", "SCHEME=moses-bpe"]
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            assert read(os.path.join(data_bin, f"{split}.raw.{lang}")) == read(os.path.join(ENDE, f"{split}.{lang}"))[:100]
    # idempotent: a second call reuses the finished directory
    stamp = os.path.join(data_bin, binarize_bundled.STAMP)
    before = os.path.getmtime(stamp)
    assert ende_data_bin() == data_bin
    assert os.path.getmtime(stamp) == before


def test_binarize_wikitext_subset():
    from fairseq.data import Dictionary

    data_bin = wikitext_data_bin()  # first 1500 lines of each split, 2000-word vocabulary
    dictionary = Dictionary.load(os.path.join(data_bin, "dict.txt"))
    assert len(dictionary) <= 2000 + 4 + 8  # --nwordssrc plus specials, padded to a multiple of 8
    train = _load(data_bin, "train", dictionary)
    assert len(train) == 1500
    with gzip.open(os.path.join(WIKI, "wiki.train.raw.gz"), "rt", encoding="utf-8") as f:
        raw = f.read().splitlines()[:1500]
    n_unk = 0
    for i in (1, 3, 4):  # non-empty lines: words outside the capped vocabulary become <unk>
        expected = [w if dictionary.index(w) != dictionary.unk() else dictionary.unk_word for w in raw[i].split()]
        assert dictionary.string(train[i]).split() == expected
        n_unk += expected.count(dictionary.unk_word)
    assert n_unk > 0  # the 2000-word cap is in effect
