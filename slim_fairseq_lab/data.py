"""The bundled corpora as fairseq data-bins (cached, idempotent): tokenize, BPE and binarize.

en-de (``data/ende``): Moses tokenization (sacremoses, the same settings as fairseq's
``--tokenizer moses`` defaults, so ``fairseq-generate --tokenizer moses --bpe subword_nmt
--bpe-codes <codes>`` detokenizes correctly), joint subword-nmt BPE learned on the training
text of both languages, then ``fairseq-preprocess --joined-dictionary``. The data-bin also holds
the untokenized valid/test text and ``recipe.info``, so that examples/translation/evaluate.sh
scores it as the WMT recipes' data (sacreBLEU against the untokenized references).

WikiText-2 (``data/wikitext-2``): word level, the raw text is already space-tokenized;
``fairseq-preprocess --only-source --nwordssrc 5000`` by default: the 5000 most frequent words,
the rest map to ``<unk>``. The uncapped vocabulary (76.6k types) makes the output layer of a
tiny LM dominate and trains about 20x slower; ``nwords=None`` keeps it anyway.

Usage::

    from slim_fairseq_lab.data import binarize_ende, binarize_wikitext
    data_bin = binarize_ende()            # full corpus, 8000 merges: build/data/ende_bpe8000/data-bin
    data_bin = binarize_ende("build/data", subset=500, eval_subset=50, bpe_merges=500)
    lm_bin = binarize_wikitext()          # 5000 words: build/data/wikitext2_vocab5000/data-bin
    lm_bin = binarize_wikitext("build/data", subset=2000, nwords=None)  # uncapped vocabulary

Each call returns the ``data-bin`` directory; a finished directory carries a ``.done`` stamp
holding its settings and is reused on the next call. scripts/binarize_bundled.py is the command
line.
"""

import contextlib
import fcntl
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

from slim_fairseq_lab.paths import REPO_ROOT

BUNDLED_DATA = os.path.join(REPO_ROOT, "data")
DEFAULT_BUILD_DIR = os.path.join(REPO_ROOT, "build", "data")
SPLITS = ("train", "valid", "test")
DEFAULT_NWORDS = 5000  # WikiText-2 vocabulary cap
ENDE_LANGS = ("en", "de")
STAMP = ".done"


def _log(message):
    print(f"[binarize] {message}", file=sys.stderr, flush=True)


def _read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def _write_lines(path, lines):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def _is_done(directory, settings):
    stamp = os.path.join(directory, STAMP)
    if not os.path.exists(stamp):
        return False
    with open(stamp, encoding="utf-8") as f:
        return json.load(f) == settings


def _mark_done(directory, settings):
    with open(os.path.join(directory, STAMP), "w", encoding="utf-8") as f:
        json.dump(settings, f, sort_keys=True)


@contextlib.contextmanager
def _build_lock(out_dir):
    """Serialise builds in one output directory (parallel tests may ask for the same data)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ".build.lock"), "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _run_preprocess(args):
    """Run fairseq-preprocess (fairseq_cli.preprocess) in a subprocess."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess"] + [str(a) for a in args]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout)
        raise RuntimeError(f"fairseq-preprocess failed (exit {result.returncode}): {' '.join(cmd)}")


def _tokenize_ende(source_dir, tok_dir):
    """Moses-tokenize every split of both languages once (shared by all subsets/BPE sizes)."""
    settings = {"step": "moses", "aggressive_dash_splits": True, "escape": True, "source": source_dir}
    if _is_done(tok_dir, settings):
        return
    from sacremoses import MosesTokenizer

    os.makedirs(tok_dir, exist_ok=True)
    for lang in ENDE_LANGS:
        tokenizer = MosesTokenizer(lang=lang)
        for split in SPLITS:
            start = time.time()
            lines = _read_lines(os.path.join(source_dir, f"{split}.{lang}"))
            tokenized = [
                tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
                for line in lines
            ]
            _write_lines(os.path.join(tok_dir, f"{split}.{lang}"), tokenized)
            _log(f"moses {split}.{lang}: {len(lines)} lines in {time.time() - start:.1f}s")
    _mark_done(tok_dir, settings)


def _learn_joint_bpe(train_files, codes_path, merges):
    from subword_nmt import learn_bpe as learn_bpe_module

    joint_lines = []
    for path in train_files:
        joint_lines.extend(_read_lines(path))
    tmp = codes_path + ".tmp"
    progress_bar = getattr(learn_bpe_module, "tqdm", None)
    learn_bpe_module.tqdm = lambda iterable, *args, **kwargs: iterable  # no per-merge progress bar
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            learn_bpe_module.learn_bpe(joint_lines, out, merges, min_frequency=2)
    finally:
        if progress_bar is not None:
            learn_bpe_module.tqdm = progress_bar
    os.replace(tmp, codes_path)


def _apply_bpe(codes_path, in_path, out_path, limit=None):
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as codes:
        bpe = BPE(codes)
    lines = _read_lines(in_path)
    if limit is not None:
        lines = lines[:limit]
    _write_lines(out_path, [bpe.process_line(line) for line in lines])


def _write_evaluation_files(data_bin, source_dir, eval_subset, src, tgt):
    """What examples/translation/evaluate.sh reads next to the binarized data, as the WMT prepare
    scripts write it: ``recipe.info`` (languages, segmentation) and the untokenized valid and
    test text (``{split}.raw.{lang}``), so that sacreBLEU scores against the references as they
    are, not as they come back from Moses and BPE (38 of the 1,000 test references change, e.g.
    "flitzte/sauste" -> "flitzte / sauste"). Rewritten on every call (cheap), so a cached
    data-bin always has them."""
    for split in ("valid", "test"):
        for lang in (src, tgt):
            lines = _read_lines(os.path.join(source_dir, f"{split}.{lang}"))
            _write_lines(os.path.join(data_bin, f"{split}.raw.{lang}"),
                         lines if eval_subset is None else lines[:eval_subset])
    _write_lines(os.path.join(data_bin, "recipe.info"), [f"SRC={src}", f"TGT={tgt}", "SCHEME=moses-bpe"])


def ende_paths(out_dir, subset=None, eval_subset=None, bpe_merges=8000, src="en", tgt="de"):
    """Where :func:`binarize_ende` puts things: dict with ``tok``, ``bpe``, ``codes``, ``data_bin``."""
    name = f"ende_bpe{bpe_merges}" if (src, tgt) == ("en", "de") else f"ende_{src}2{tgt}_bpe{bpe_merges}"
    if subset is not None:
        name += f"_train{subset}"
    if eval_subset is not None:
        name += f"_eval{eval_subset}"
    root = os.path.join(os.path.abspath(out_dir), name)
    return {
        "tok": os.path.join(os.path.abspath(out_dir), "ende_tok"),
        "root": root,
        "bpe": os.path.join(root, "bpe"),
        "codes": os.path.join(root, "bpe", "codes"),
        "data_bin": os.path.join(root, "data-bin"),
    }


def binarize_ende(out_dir=DEFAULT_BUILD_DIR, subset=None, eval_subset=None, bpe_merges=8000, workers=1,
                  force=False, source_dir=None, src="en", tgt="de"):
    """Build (or reuse) a fairseq data-bin of the bundled en-de corpus; return its path.

    ``subset``: use only the first N training pairs (BPE is learned on them too);
    ``eval_subset``: use only the first N valid and test pairs. The data-bin holds
    ``{split}.{src}-{tgt}.{lang}.{bin,idx}`` and one joined ``dict.en.txt`` == ``dict.de.txt``;
    fairseq's translation task reads it in either direction. BPE codes are at
    ``<root>/bpe/codes`` (see :func:`ende_paths`).
    """
    source_dir = os.path.abspath(source_dir or os.path.join(BUNDLED_DATA, "ende"))
    with _build_lock(out_dir):
        return _binarize_ende_locked(out_dir, subset, eval_subset, bpe_merges, workers, force, source_dir, src, tgt)


def _binarize_ende_locked(out_dir, subset, eval_subset, bpe_merges, workers, force, source_dir, src, tgt):
    paths = ende_paths(out_dir, subset, eval_subset, bpe_merges, src, tgt)
    settings = {"corpus": "ende", "source": source_dir, "subset": subset, "eval_subset": eval_subset,
                "bpe_merges": bpe_merges, "src": src, "tgt": tgt}
    if not force and _is_done(paths["data_bin"], settings):
        _write_evaluation_files(paths["data_bin"], source_dir, eval_subset, src, tgt)
        _log(f"en-de up to date: {paths['data_bin']}")
        return paths["data_bin"]
    start = time.time()
    _tokenize_ende(source_dir, paths["tok"])

    os.makedirs(paths["bpe"], exist_ok=True)
    train_limit = subset
    if subset is not None:
        for lang in ENDE_LANGS:
            _write_lines(os.path.join(paths["bpe"], f"train.tok.{lang}"),
                         _read_lines(os.path.join(paths["tok"], f"train.{lang}"))[:subset])
        train_files = [os.path.join(paths["bpe"], f"train.tok.{lang}") for lang in ENDE_LANGS]
    else:
        train_files = [os.path.join(paths["tok"], f"train.{lang}") for lang in ENDE_LANGS]
    t0 = time.time()
    _learn_joint_bpe(train_files, paths["codes"], bpe_merges)
    _log(f"learned {bpe_merges} joint BPE merges in {time.time() - t0:.1f}s")
    for split in SPLITS:
        limit = train_limit if split == "train" else eval_subset
        for lang in ENDE_LANGS:
            _apply_bpe(paths["codes"], os.path.join(paths["tok"], f"{split}.{lang}"),
                       os.path.join(paths["bpe"], f"{split}.{lang}"), limit)
    _log("applied BPE")

    if os.path.isdir(paths["data_bin"]):
        shutil.rmtree(paths["data_bin"])
    prefix = os.path.join(paths["bpe"], "")
    _run_preprocess([
        "--source-lang", src, "--target-lang", tgt,
        "--trainpref", prefix + "train", "--validpref", prefix + "valid", "--testpref", prefix + "test",
        "--destdir", paths["data_bin"], "--joined-dictionary", "--workers", workers,
    ])
    _write_evaluation_files(paths["data_bin"], source_dir, eval_subset, src, tgt)
    _mark_done(paths["data_bin"], settings)
    _log(f"en-de data-bin ready in {time.time() - start:.1f}s: {paths['data_bin']}")
    return paths["data_bin"]


def wikitext_paths(out_dir, subset=None, nwords=None):
    name = "wikitext2"
    if subset is not None:
        name += f"_lines{subset}"
    if nwords is not None:
        name += f"_vocab{nwords}"
    root = os.path.join(os.path.abspath(out_dir), name)
    return {"root": root, "text": os.path.join(root, "text"), "data_bin": os.path.join(root, "data-bin")}


def binarize_wikitext(out_dir=DEFAULT_BUILD_DIR, subset=None, nwords=DEFAULT_NWORDS, workers=1,
                      force=False, source_dir=None):
    """Build (or reuse) a word-level fairseq LM data-bin of the bundled WikiText-2; return its path.

    ``subset``: first N lines of *each* split (keeps eval fast in tests);
    ``nwords``: keep only the N most frequent words (``--nwordssrc``), the rest map to ``<unk>``;
    None (or 0) keeps every word.
    """
    nwords = nwords or None
    source_dir = os.path.abspath(source_dir or os.path.join(BUNDLED_DATA, "wikitext-2"))
    with _build_lock(out_dir):
        return _binarize_wikitext_locked(out_dir, subset, nwords, workers, force, source_dir)


def _binarize_wikitext_locked(out_dir, subset, nwords, workers, force, source_dir):
    paths = wikitext_paths(out_dir, subset, nwords)
    settings = {"corpus": "wikitext-2", "source": source_dir, "subset": subset, "nwords": nwords}
    if not force and _is_done(paths["data_bin"], settings):
        _log(f"wikitext-2 up to date: {paths['data_bin']}")
        return paths["data_bin"]
    start = time.time()
    os.makedirs(paths["text"], exist_ok=True)
    for split in SPLITS:
        with gzip.open(os.path.join(source_dir, f"wiki.{split}.raw.gz"), "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        if subset is not None:
            lines = lines[:subset]
        _write_lines(os.path.join(paths["text"], f"{split}.txt"), lines)
    if os.path.isdir(paths["data_bin"]):
        shutil.rmtree(paths["data_bin"])
    prefix = os.path.join(paths["text"], "")
    args = ["--only-source", "--trainpref", prefix + "train.txt", "--validpref", prefix + "valid.txt",
            "--testpref", prefix + "test.txt", "--destdir", paths["data_bin"], "--workers", workers]
    if nwords is not None:
        args += ["--nwordssrc", nwords]
    _run_preprocess(args)
    _mark_done(paths["data_bin"], settings)
    _log(f"wikitext-2 data-bin ready in {time.time() - start:.1f}s: {paths['data_bin']}")
    return paths["data_bin"]
