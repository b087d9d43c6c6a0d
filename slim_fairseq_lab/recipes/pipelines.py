"""The two segmentations of the translation prepare recipes, and the data-bin they write.

A data-bin is built in a folder of its own next to DEST and replaces DEST only when it is
complete (the binaries, the BPE codes or sentencepiece model, the untokenized valid/test
references and ``recipe.info``, which the evaluation recipes read): a failed preparation leaves
an earlier data-bin as it was.
"""
import contextlib
import os
import shutil
import sys
import time

from slim_fairseq_lab.recipes import text, tools
from slim_fairseq_lab.recipes.cli import log
from slim_fairseq_lab.recipes.outputs import Staged


@contextlib.contextmanager
def data_bin(prog, dest):
    """A staged folder for the data-bin DEST, which replaces DEST when the block succeeds."""
    with Staged(prog, near=os.path.dirname(os.path.abspath(dest)), keep_on_failure=False) as stage:
        os.makedirs(stage.path("data-bin"))
        yield stage.path("data-bin")
        stage.install("data-bin", dest)


def write_recipe_info(dest, *entries):
    """Facts the evaluation recipes need (languages, segmentation), ``KEY=VALUE`` per line."""
    text.write_lines(os.path.join(dest, "recipe.info"), list(entries))


def binarize(prep, s, t, dest, joined=True, extra=()):
    """fairseq-preprocess of PREP/{train,valid,test}.{S,T}: one joined dictionary, or one per side."""
    tools.run(["fairseq-preprocess", "--source-lang", s, "--target-lang", t, "--trainpref", f"{prep}/train",
               "--validpref", f"{prep}/valid", "--testpref", f"{prep}/test", "--destdir", dest,
               *(["--joined-dictionary"] if joined else []), "--workers", text.workers(), *extra])


def copy_references(work, s, t, dest):
    """The untokenized valid/test text next to the binaries (the references of sacreBLEU)."""
    for split in ("valid", "test"):
        for lang in (s, t):
            shutil.copyfile(f"{work}/raw.{split}.{lang}", f"{dest}/{split}.raw.{lang}")


def dictionary_entries(path):
    return text.line_count(path)


def moses_bpe_pipeline(prog, work, s, t, merges, max_len, ratio, dest, info=()):
    """WORK/raw.{train,valid,test}.{S,T} (untokenized text) -> Moses tokenization, joint BPE with
    subword-nmt (MERGES merge operations learned on the training text of both languages), length
    filtering of the training pairs (1..MAX_LEN BPE tokens, ratio <= RATIO) and fairseq-preprocess
    --joined-dictionary into DEST, with the untokenized valid/test text for detokenized sacreBLEU
    (and INFO, more lines of recipe.info)."""
    prep = f"{work}/prep"
    os.makedirs(prep, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in (s, t):
            log(f"tokenizing {split}.{lang}")
            text.moses_tokenize(lang, f"{work}/raw.{split}.{lang}", f"{work}/tok.{split}.{lang}")
    log(f"learning {merges} joint BPE merges")
    tools.run(["subword-nmt", "learn-bpe", "-s", merges], stdin=[f"{work}/tok.train.{s}", f"{work}/tok.train.{t}"],
              stdout=f"{work}/code")
    for split in ("train", "valid", "test"):
        for lang in (s, t):
            tools.run(["subword-nmt", "apply-bpe", "-c", f"{work}/code", "--num-workers", text.workers()],
                      stdin=f"{work}/tok.{split}.{lang}", stdout=f"{work}/bpe.{split}.{lang}")
    text.clean_corpus(f"{work}/bpe.train", s, t, f"{prep}/train", 1, int(max_len), float(ratio))
    for split in ("valid", "test"):
        for lang in (s, t):
            shutil.copyfile(f"{work}/bpe.{split}.{lang}", f"{prep}/{split}.{lang}")
    with data_bin(prog, dest) as out:
        binarize(prep, s, t, out)
        shutil.copyfile(f"{work}/code", f"{out}/bpecodes")
        copy_references(work, s, t, out)
        write_recipe_info(out, f"SRC={s}", f"TGT={t}", "SCHEME=moses-bpe", *info)
    log(f"done: {dest} ({dictionary_entries(f'{dest}/dict.{s}.txt')} dictionary entries)")


def spm_train(prefix, vocab, coverage, sample, files):
    """A sentencepiece BPE model PREFIX.model of VOCAB pieces learned on FILES."""
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(
        input=",".join(files), model_prefix=prefix, vocab_size=int(vocab), model_type="bpe",
        character_coverage=float(coverage), input_sentence_size=int(sample),
        shuffle_input_sentence=True, num_threads=1, minloglevel=1,
    )


def spm_encode(model, src, out):
    """Sentencepiece pieces of every line of SRC (space-separated); every million lines, a
    progress line."""
    import sentencepiece as spm
    processor = spm.SentencePieceProcessor(model_file=model)
    start = time.time()
    with open(src, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as o:
        for number, line in enumerate(f, 1):
            o.write(" ".join(processor.encode(line.rstrip("\n"), out_type=str)) + "\n")
            if number % 1000000 == 0:
                print(f"  {number:,} lines in {time.time() - start:.0f} s", file=sys.stderr, flush=True)


def spm_pipeline(prog, work, s, t, dest, model_s, model_t, max_len, ratio):
    """WORK/raw.{train,valid,test}.{S,T} -> sentencepiece pieces (MODEL_S for S, MODEL_T for T,
    already trained), length filtering of the training pairs, fairseq-preprocess into DEST: one
    joined dictionary when both sides use the same model, one dictionary per side else."""
    prep = f"{work}/prep"
    os.makedirs(prep, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in (s, t):
            log(f"sentencepiece-encoding {split}.{lang}")
            spm_encode(model_s if lang == s else model_t, f"{work}/raw.{split}.{lang}", f"{work}/spm.{split}.{lang}")
    text.clean_corpus(f"{work}/spm.train", s, t, f"{prep}/train", 1, int(max_len), float(ratio))
    for split in ("valid", "test"):
        for lang in (s, t):
            shutil.copyfile(f"{work}/spm.{split}.{lang}", f"{prep}/{split}.{lang}")
    joined = model_s == model_t
    with data_bin(prog, dest) as out:
        binarize(prep, s, t, out, joined=joined)
        if joined:
            shutil.copyfile(model_s, f"{out}/spm.model")
        else:
            shutil.copyfile(model_s, f"{out}/spm.{s}.model")
            shutil.copyfile(model_t, f"{out}/spm.{t}.model")
        copy_references(work, s, t, out)
        write_recipe_info(out, f"SRC={s}", f"TGT={t}", "SCHEME=sentencepiece")
    log(f"done: {dest} ({dictionary_entries(f'{dest}/dict.{s}.txt')} / {dictionary_entries(f'{dest}/dict.{t}.txt')} "
        "dictionary entries)")
