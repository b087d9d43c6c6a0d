"""The export's tokenizer check: ``AutoTokenizer.from_pretrained(OUT_DIR)`` given the raw text of
the valid split gives, line by line, the ids binarized in the data-bin (before OUT_DIR is kept).

The text is ``--valid-text FILE`` when given (a translation model's source side; the target side
``FILE``'s sibling named with the target language, if there is one), else what the data-bin
names: ``valid.raw.SRC``/``valid.raw.TGT`` beside a translation data-bin (the recipes write
them), or, for a tokenizer of whitespace words, the ``--validpref`` text that
``fairseq-preprocess`` recorded in ``preprocess.log``. A text whose line count is not the split's
is refused: it is not that split's text.

FSMT's tokenizer normalises punctuation before Moses (``’`` becomes ``'``) where fairseq's
``--tokenizer moses`` does not; a line that normalisation changes is not compared and is
counted in the model card. Every other line must give the data-bin's ids exactly.
"""
import ast
import dataclasses
import os
import re

from slim_fairseq.option_errors import option_error

# lines compared per side (the first non-empty ones); tokenizing is cheap
LINES = 100


@dataclasses.dataclass
class TextSide:
    path: str
    lang: str           # the language suffix of the split's files ("" for a language model)
    side: str           # "source" or "target"


@dataclasses.dataclass
class TokenizerCheckResult:
    files: list         # the text files read
    compared: int       # lines whose ids were compared (all equal)
    skipped: int        # lines FSMT's punctuation normalisation changes (not compared)
    lines: int = LINES  # the first non-empty lines read of each file


def _split(src):
    return (getattr(src.cfg.dataset, "valid_subset", None) or "valid").split(",")[0]


def _validpref(data):
    """The first ``--validpref`` that ``fairseq-preprocess`` logged in ``DATA_DIR``, or None."""
    log = os.path.join(data, "preprocess.log")
    if not os.path.isfile(log):
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        head = f.read(20000)
    found = re.search(r"validpref=('[^']*'|\"[^\"]*\")", head)
    if not found:
        return None
    value = ast.literal_eval(found.group(1))
    return value.split(",")[0] if value else None


def text_sides(src, data, kind, valid_text=None):
    """The text files of the valid split to check against, or a one-line refusal."""
    split = _split(src)
    if src.lm:
        langs = [("", "source")]
    else:
        langs = [(src.task.cfg.source_lang, "source"), (src.task.cfg.target_lang, "target")]
    if valid_text:
        if not os.path.isfile(valid_text):
            raise option_error("--valid-text", valid_text, "does not exist", "the raw text of "
                               f"the {split} split, one sample a line")
        sides = [TextSide(valid_text, langs[0][0], "source")]
        if not src.lm:
            stem, ext = os.path.splitext(valid_text)
            target = f"{stem}.{langs[1][0]}" if ext == f".{langs[0][0]}" else None
            if target and os.path.isfile(target):
                sides.append(TextSide(target, langs[1][0], "target"))
        return sides
    if not src.lm:
        sides = [TextSide(os.path.join(data, f"{split}.raw.{lang}"), lang, side)
                 for lang, side in langs]
        sides = [s for s in sides if os.path.isfile(s.path)]
        if sides and sides[0].side == "source":
            return sides
    prefix = _validpref(data) if kind == "words" else None
    if prefix:
        paths = [(prefix + (f".{lang}" if lang else ""), lang, side) for lang, side in langs]
        sides = [TextSide(*p) for p in paths if os.path.isfile(p[0])]
        if sides and sides[0].side == "source":
            return sides
    raise option_error("DATA_DIR", data, f"names no raw text of its {split} split to check the "
                       "exported tokenizer against", f"--valid-text FILE (the {split} split's "
                       "text before tokenization, one sample a line"
                       + ("; for a translation model its source side" if not src.lm else "")
                       + ")")


def _binarized(src, data, side):
    from fairseq.data import data_utils
    split = _split(src)
    if src.lm:
        prefix, dictionary = os.path.join(data, split), src.dictionary
    else:
        cfg = src.task.cfg
        prefix = os.path.join(data, f"{split}.{cfg.source_lang}-{cfg.target_lang}.{side.lang}")
        dictionary = src.source_dictionary if side.side == "source" else src.dictionary
    dataset = data_utils.load_indexed_dataset(prefix, dictionary)
    if dataset is None:
        raise option_error("DATA_DIR", data, f"has no readable {split} split ({prefix})",
                           "the data-bin the model was trained on, binarized with --validpref")
    return dataset


def remote_code(out_dir):
    """``{"trust_remote_code": True}`` for a folder of custom code (``auto_map`` in its
    config.json), which transformers' AutoTokenizer reads too; else ``{}``."""
    import json
    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        return {"trust_remote_code": True} if "auto_map" in json.load(f) else {}


def _tokenizers(src, out_dir, kind):
    """``{side: tokenizer}`` as a user loads them from ``out_dir`` (FSMT's target side: the same
    files with the languages swapped)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(out_dir, local_files_only=True,
                                              **remote_code(out_dir))
    found = {"source": tokenizer}
    if kind == "moses+subword_nmt":
        from transformers import FSMTTokenizer
        cfg = src.task.cfg
        found["target"] = FSMTTokenizer(
            langs=[cfg.target_lang, cfg.source_lang],
            src_vocab_file=os.path.join(out_dir, "vocab-tgt.json"),
            tgt_vocab_file=os.path.join(out_dir, "vocab-src.json"),
            merges_file=os.path.join(out_dir, "merges.txt"))
    else:
        found["target"] = tokenizer  # one dictionary for both sides (tokenizer.check)
    return found


def run(src, data, out_dir, kind, sides, lines=LINES):
    """Compare the tokenizer in ``out_dir`` with the data-bin on ``sides``; a one-line refusal
    names the first line that differs."""
    tokenizers = _tokenizers(src, out_dir, kind)
    eos, compared, skipped = src.dictionary.eos(), 0, 0
    for side in sides:
        tokenizer = tokenizers[side.side]
        dataset = _binarized(src, data, side)
        with open(side.path, encoding="utf-8", errors="replace") as f:
            texts = f.read().split("\n")
        if texts and texts[-1] == "":
            texts.pop()
        if len(texts) != len(dataset):
            raise option_error("--valid-text", side.path, f"has {len(texts)} lines where the "
                               f"data-bin's {_split(src)} split has {len(dataset)} samples, so it "
                               "is not that split's text", "the text the split was binarized "
                               "from, one sample a line")
        seen = 0
        for number, text in enumerate(texts, 1):
            if not text.strip():
                continue
            if seen == lines:
                break
            seen += 1
            if kind == "moses+subword_nmt" and \
                    tokenizer.moses_pipeline(text, tokenizer.src_lang) != text:
                skipped += 1
                continue
            line = dataset[number - 1].tolist()
            expected = [eos] + line[:-1] if src.lm else line
            ids = tokenizer(text)["input_ids"]
            if ids != expected:
                first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b),
                             min(len(ids), len(expected)))
                got = tokenizer.convert_ids_to_tokens(ids[first:first + 1]) or ["(end)"]
                want = [src.dictionary[i] for i in expected[first:first + 1]] or ["(end)"]
                raise option_error(
                    "--bpe", _bpe_shown(kind), f"the exported tokenizer does not give the "
                    f"data-bin's ids for line {number} of {side.path} (token {first + 1}: "
                    f"{got[0]!r} where the data-bin has {want[0]!r}), nothing written",
                    "the tokenizer options the data was encoded with (--bpe, its files, "
                    "--tokenizer), and the data-bin the model was trained on")
            compared += 1
    if compared == 0:
        raise option_error("--valid-text", sides[0].path, "has no line the tokenizer check can "
                           "compare", "the raw text of the valid split, one sample a line")
    return TokenizerCheckResult(files=[s.path for s in sides], compared=compared,
                                skipped=skipped, lines=lines)


def _bpe_shown(kind):
    return {"words": "none", "moses+subword_nmt": "subword_nmt"}.get(kind, kind)
