"""Mistakes a user makes, each with the one line it must end in (exit status non-zero, no
traceback, no usage): fairseq's command line with the plugin loaded, and the recipes'. A refusal
that proposes changes of the command line is tried with each: every one must be accepted.

Grow the tables: a new mistake found is a new row. Mistakes that only fairseq itself sees
(a --user-dir that does not exist, a misspelt --arch given to fairseq-train, fairseq-generate
on language-model data without --task) are answered in docs/INSTALL.md#troubleshooting,
which tests/test_docs.py keeps.
"""
import os
import re
import subprocess
import sys
import zipfile

import pytest

from helpers import BIN, REPO, ende_data_bin, parse_train_args, task_args, wikitext_data_bin
from slim_fairseq_lab.recipes.text import subset_tokens

EXAMPLES = os.path.join(REPO, "examples")

# (command line after the data and task flags, language model?, the line, exactly); every
# refusal proposes changes of the command line (OptionError.alternatives), and the test tries each
CLI = [
    (["--arch", "stlm_tied", "--encoder-embed-dim", "128", "--decoder-embed-dim", "128"], True,
     "--encoder-embed-dim: an option of the encoder-decoder (translation) models, and stlm_tied "
     "is a language model (a decoder only, shaped by the --decoder-* options); allowed: drop "
     "--encoder-embed-dim"),
    (["--arch", "stlm_tied", "--self-attn-gate", "qgv"], True,
     "--self-attn-gate=qgv: sigmoid(W_Q q) is 512 wide but v is 528 wide (16 query heads of 32, "
     "4 key/value heads); allowed: --self-attn-gate none, or --decoder-attention-heads 12"),
    (["--arch", "anthe_base", "--kv-heads", "1", "--cross-attn-gate", "vgk"], False,
     "--cross-attn-gate=vgk: sigmoid(W_V v) is 64 wide but k is 512 wide (8 query heads of 64, "
     "1 key/value head); allowed: --cross-attn-gate none, or --kv-heads 0, or "
     "--decoder-attention-heads 1"),
    (["--arch", "anthe_base", "--kv-heads", "1", "--self-attn-gate", "kgv"], False,
     "--self-attn-gate=kgv: sigmoid(W_K k) is 64 wide but v is 512 wide (8 query heads of 64, "
     "1 key/value head); allowed: --kv-heads 0"),
    (["--arch", "slim_transformer", "--head-dim", "32", "--self-attn-gate", "qgv"], False,
     "--self-attn-gate=qgv: sigmoid(W_Q q) is 256 wide but v is 512 wide (8 query heads of 32, "
     "8 key/value heads); allowed: --self-attn-gate none, or --head-dim 0"),
    (["--arch", "subformer_lm_wiki103_83m", "--decoder-embed-dim", "64", "--decoder-layers", "3",
      "--adaptive-input-cutoff", "100,400", "--adaptive-softmax-cutoff", "100,400"], True,
     "--criterion=cross_entropy: fairseq trains an adaptive softmax (--adaptive-softmax-cutoff) "
     "with adaptive_loss only; the others fail in backward; allowed: --criterion adaptive_loss"),
    # the reduced form replaces W_Q by the identity: a head width other than width/heads
    # makes it non-square
    (["--arch", "skipless_lm", "--decoder-embed-dim", "64", "--decoder-attention-heads", "4",
      "--decoder-layers", "2", "--head-dim", "8", "--removed-weights", "q"], True,
     "--removed-weights=q: W_Q is not square here (64 -> 32: 4 heads of 8); allowed: "
     "--head-dim 0"),
    (["--arch", "slim_lm", "--kv-heads", "2", "--quant-noise-pq", "0.1"], True,
     "--quant-noise-pq=0.1: acts on fairseq's dense linears, which --kv-heads replaces or "
     "bypasses; allowed: --quant-noise-pq 0"),
    # the translation models check the target dictionary against the cutoffs too
    (["--arch", "slim_transformer", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
      "--encoder-layers", "1", "--decoder-layers", "1", "--adaptive-softmax-cutoff", "5000,9000",
      "--criterion", "adaptive_loss"], False,
     "--adaptive-softmax-cutoff=5000,9000: cutoffs must increase and stay within the "
     "dictionary's 1,128 types; allowed: --adaptive-softmax-cutoff 84,253"),
    # SAFE's output path is its token table: an untied projection would be ignored
    (["--arch", "stlm_tied", "--decoder-embed-dim", "64", "--decoder-layers", "2",
      "--safe-embed-dim", "16", "--no-share-decoder-input-output-embed"], True,
     "--no-share-decoder-input-output-embed: SAFE's output path (--safe-embed-dim) is tied to its "
     "token table, so there is no separate projection to untie; allowed: drop "
     "--no-share-decoder-input-output-embed"),
    # WikiText-103's cutoffs on a dictionary of 2,000 types: found when the model is built
    (["--arch", "subformer_lm_wiki103_83m", "--decoder-embed-dim", "64", "--decoder-layers", "3",
      "--criterion", "adaptive_loss"], True,
     "--adaptive-input-cutoff=20000,60000: cutoffs must increase and stay within the "
     "dictionary's 2,000 types; allowed: --adaptive-input-cutoff 149,448 "
     "--adaptive-softmax-cutoff 149,448"),
    # fairseq's own shape and dropout options: a division by zero, a tensor of negative size,
    # or a crash.pt after training started, without these
    (["--arch", "stlm_tied", "--decoder-layers", "0"], True,
     "--decoder-layers=0: a model needs at least one layer; allowed: --decoder-layers 1"),
    (["--arch", "slim_lm", "--decoder-embed-dim", "-64"], True,
     "--decoder-embed-dim=-64: a width must be positive; allowed: --decoder-embed-dim 64 "
     "--decoder-input-dim 64 --decoder-output-dim 64"),
    (["--arch", "anthe_base", "--encoder-ffn-embed-dim", "-8"], False,
     "--encoder-ffn-embed-dim=-8: a width must be positive; allowed: --encoder-ffn-embed-dim 8"),
    (["--arch", "stlm_tied", "--dropout", "1.5"], True,
     "--dropout=1.5: a dropout is a probability in [0, 1); allowed: --dropout 0.1"),
]


def _build(args):
    from fairseq import tasks
    return tasks.setup_task(args).build_model(args)


def _refusal(argv):
    """(the refusal's line after ``PROG: error: ``, the changes it proposes)."""
    with pytest.raises(ValueError) as caught:
        _build(parse_train_args(argv))
    message = str(caught.value)
    assert "\n" not in message, message
    return message, getattr(caught.value, "alternatives", [])


def _with(argv, change):
    """``argv`` with one proposed change made: each flag set to its value, or dropped (None)
    with its value."""
    argv = list(argv)
    for flag, value in change.items():
        if flag not in argv:
            assert value is not None, f"{flag}: proposed to be dropped, but not given"
            argv += [flag, str(value)]
            continue
        at = argv.index(flag)
        has_value = at + 1 < len(argv) and not argv[at + 1].startswith("--")
        if value is None:
            del argv[at:at + 1 + has_value]
        else:
            assert has_value, f"{flag}: takes no value, proposed {value}"
            argv[at + 1] = str(value)
    return argv


def test_proposed_changes_are_made_on_the_command_line():
    argv = ["--a", "1", "--b", "--c", "x"]
    assert _with(argv, {"--a": 2, "--d": "y"}) == ["--a", "2", "--b", "--c", "x", "--d", "y"]
    assert _with(argv, {"--a": None, "--b": None}) == ["--c", "x"]
    with pytest.raises(AssertionError, match="not given"):
        _with(argv, {"--d": None})


@pytest.mark.parametrize("argv, lm, line", CLI, ids=[" ".join(c[0]) for c in CLI])
def test_cli_mistake_ends_in_one_line(argv, lm, line):
    """The exact line; the refusal proposes at least one change of the command line, its
    ``allowed`` says exactly those changes, and each is accepted."""
    from slim_fairseq.option_errors import render_alternatives

    full = task_args(lm) + ["--user-dir", os.path.join(REPO, "slim_fairseq"), "--cpu"] + argv
    message, alternatives = _refusal(full)
    assert message == line
    assert alternatives, f"proposes no change a test can try: {message}"
    assert message.rsplit("; allowed: ", 1)[1] == render_alternatives(alternatives)
    for change in alternatives:
        _build(parse_train_args(_with(full, change)))


# slim-fairseq-help's arguments, the line they must end in (exactly), what it proposes and the
# arguments that follow the proposal (run, they must be answered)
HELP = [
    (["anthe_base", "--frob", "3"],
     "--frob 3: not options of SlimTransformerModel; allowed: see slim-fairseq-help anthe_base",
     "slim-fairseq-help anthe_base", ["anthe_base"]),
    (["anthe_base", "--encoder-layers", "x"],
     "--encoder-layers: invalid int value: 'x'; allowed: see slim-fairseq-help anthe_base",
     "slim-fairseq-help anthe_base", ["anthe_base"]),
    (["anthe_base", "--vocab", "x"],
     "--vocab=x: not a whole number; allowed: a dictionary size of 4 or more (fairseq's 4 "
     "special symbols included)", "4 or more", ["anthe_base", "--vocab", "4"]),
    (["anthe_bse"],
     "--arch=anthe_bse: not an architecture; allowed: the closest: anthe_base, anthe_base_nopatt, "
     "bart_base; slim-fairseq-help --archs lists every architecture", "the closest: anthe_base",
     ["anthe_base"]),
    (["subformer_lm_wiki103_83m", "--vocab", "2000"],
     "--adaptive-input-cutoff=20000,60000: cutoffs must increase and stay within the dictionary's "
     "2,000 types; allowed: --adaptive-input-cutoff 149,448 --adaptive-softmax-cutoff 149,448",
     "--adaptive-input-cutoff 149,448 --adaptive-softmax-cutoff 149,448",
     ["subformer_lm_wiki103_83m", "--vocab", "2000", "--adaptive-input-cutoff", "149,448",
      "--adaptive-softmax-cutoff", "149,448"]),
]


@pytest.mark.parametrize("argv, line, proposed, fixed", HELP, ids=[" ".join(c[0]) for c in HELP])
def test_help_mistake_ends_in_one_line(argv, line, proposed, fixed, capsys):
    proc = subprocess.run([os.path.join(BIN, "slim-fairseq-help"), *argv], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, \
        proc.stderr[-3000:]
    assert proc.stderr.rstrip("\n").split(": error: ", 1)[1] == line
    assert proposed in line.rsplit("; allowed: ", 1)[1]
    from slim_fairseq.arch_help import main
    assert main(fixed) == 0 and capsys.readouterr().out  # what it proposes is answered


def test_help_counts_an_adaptive_preset_at_wikitext103s_vocabulary():
    from slim_fairseq.arch_help import WIKITEXT103_VOCAB, describe
    assert f"parameters at a vocabulary of {WIKITEXT103_VOCAB:,} types" in \
        describe("subformer_lm_wiki103_83m")


def _recipe(script, *argv, env=None, cwd=None):
    """The recipe of examples/SCRIPT, run in this process as ``bash examples/SCRIPT ARGV`` would,
    on a machine without GPUs (recipes_fixtures.run_recipe)."""
    from recipes_fixtures import run_recipe
    return run_recipe(script, *argv, cwd=cwd or REPO, env=env, gpus=0)


# (recipe, its arguments, the line it must end in, exactly, and the fixes it proposes: (what the
# line's "allowed" says, the recipe and arguments that do it), each tried and accepted);
# {ende} / {lm} are the small data-bins of the tests, {tmp} the test's folder, the other
# placeholders what _placeholders makes of them
EVAL = ["{ende}", "{mtckpt}", "--lenpens", "1.0"]  # an evaluation, on one length penalty
RECIPES = [
    ("translation/train-subformer.sh", ["--dropout", "0.2", "{ende}", "--dry-run"],
     "train-subformer.sh: error: --dropout: an option for the fairseq tool, written before DATA_BIN; allowed: "
     "DATA_BIN first, then the options (--dropout V after them)",
     [("DATA_BIN first", "translation/train-subformer.sh", ["{ende}", "--dropout", "0.2", "--dry-run"])]),
    ("translation/evaluate.sh", ["--max-len-b", "5", "{ende}", "{mtckpt}", "--lenpens", "1.0"],
     "evaluate.sh: error: --max-len-b: an option for the fairseq tool, written before DATA_BIN and CKPT; allowed: "
     "DATA_BIN CKPT first, then the options (--max-len-b V after them)",
     [("DATA_BIN CKPT first", "translation/evaluate.sh", ["{ende}", "{mtckpt}", "--max-len-b", "5", "--lenpens",
                                                          "1.0"])]),
    ("translation/train-anthe.sh", ["{ende}", "--arch", "anthe_bse", "--dry-run", "--gpus", "0"],
     "train-anthe.sh: error: --arch=anthe_bse: not an architecture; allowed: the closest: anthe_base, "
     "anthe_base_nopatt, bart_base; slim-fairseq-help --archs lists every architecture",
     [("anthe_base", "translation/train-anthe.sh", ["{ende}", "--arch", "anthe_base", "--dry-run", "--gpus", "0"])]),
    ("translation/train-anthe.sh", ["{ende}", "--frobnicate", "3", "--dry-run", "--gpus", "0"],
     "train-anthe.sh: error: --frobnicate 3: not options of fairseq-train with --arch anthe_base --task "
     "translation; allowed: drop --frobnicate 3, or the options of fairseq-train --help and slim-fairseq-help "
     "anthe_base",
     [("drop --frobnicate 3", "translation/train-anthe.sh", ["{ende}", "--dry-run", "--gpus", "0"])]),
    # fairseq-train's own parser: its argparse message in the one-line format
    ("translation/train-anthe.sh", ["{ende}", "--optimizer", "adamw", "--dry-run", "--gpus", "0"],
     "train-anthe.sh: error: --optimizer=adamw: not one of the choices; allowed: adadelta|adafactor|adagrad|adam|"
     "adamax|composite|cpu_adam|lamb|nag|sgd",
     [("adam", "translation/train-anthe.sh", ["{ende}", "--optimizer", "adam", "--dry-run", "--gpus", "0"])]),
    ("translation/train-anthe.sh", ["{lm}", "--dry-run", "--gpus", "0"],
     "train-anthe.sh: error: DATA_BIN={lm}: language-model data (dict.txt, no language pair), and this recipe "
     "trains a translation model; allowed: a translation data-bin (examples/translation/prepare-*.sh), or a "
     "language-model recipe (examples/lm/train-*.sh)",
     [("a translation data-bin", "translation/train-anthe.sh", ["{ende}", "--dry-run", "--gpus", "0"]),
      ("a language-model recipe", "lm/train-stlm.sh", ["{lm}", "--dry-run", "--gpus", "0"])]),
    ("lm/train-stlm.sh", ["{ende}", "--dry-run", "--gpus", "0"],
     "train-stlm.sh: error: DATA_BIN={ende}: translation data (dict.de.txt, dict.en.txt), and this recipe trains a "
     "language model; allowed: a language-model data-bin (fairseq-preprocess --only-source, "
     "examples/lm/prepare-wikitext-103.sh), or a translation recipe (examples/translation/train-*.sh)",
     [("a language-model data-bin", "lm/train-stlm.sh", ["{lm}", "--dry-run", "--gpus", "0"]),
      ("a translation recipe", "translation/train-anthe.sh", ["{ende}", "--dry-run", "--gpus", "0"])]),
    ("translation/train-anthe.sh", ["{novalid}", "--dry-run", "--gpus", "0"],
     "train-anthe.sh: error: DATA_BIN={novalid}: no valid split (valid*.idx; --valid-subset valid); allowed: a "
     "data-bin binarized with --validpref, or --disable-validation",
     [("--disable-validation", "translation/train-anthe.sh", ["{novalid}", "--disable-validation", "--dry-run",
                                                              "--gpus", "0"]),
      ("a data-bin binarized with --validpref", "translation/train-anthe.sh", ["{ende}", "--dry-run", "--gpus", "0"])]),
    ("translation/train-anthe.sh", ["{ende}", "--max-tokens", "4k", "--dry-run"],
     "train-anthe.sh: error: --max-tokens=4k: not a whole number >= 1; allowed: a whole number >= 1, or drop "
     "--max-tokens (its default)",
     [("drop --max-tokens", "translation/train-anthe.sh", ["{ende}", "--dry-run"]),
      ("a whole number >= 1", "translation/train-anthe.sh", ["{ende}", "--max-tokens", "4096", "--dry-run"])]),
    ("translation/prepare-wmt16enro.sh", ["--max-len", "abc", "--dry-run"],
     "prepare-wmt16enro.sh: error: --max-len=abc: not a whole number >= 1; allowed: a whole number >= 1, or drop "
     "--max-len (default 250)",
     [("drop --max-len", "translation/prepare-wmt16enro.sh", ["--dry-run"])]),
    ("translation/prepare-wmt16enro.sh", ["--max-len=0", "--dry-run"],
     "prepare-wmt16enro.sh: error: --max-len=0: not a whole number >= 1; allowed: a whole number >= 1, or drop "
     "--max-len (default 250)",
     [("drop --max-len", "translation/prepare-wmt16enro.sh", ["--dry-run"]),
      ("a whole number >= 1", "translation/prepare-wmt16enro.sh", ["--max-len=1", "--dry-run"])]),
    ("translation/prepare-wmt16enro.sh", ["--ratio", "abc", "--dry-run"],
     "prepare-wmt16enro.sh: error: --ratio=abc: not a number > 0; allowed: a number > 0, or drop --ratio (default "
     "1.5)",
     [("drop --ratio", "translation/prepare-wmt16enro.sh", ["--dry-run"])]),
    ("translation/prepare-wmt16enro.sh", ["--bpe-merges", "abc", "--dry-run"],
     "prepare-wmt16enro.sh: error: --bpe-merges=abc: not a whole number >= 1; allowed: a whole number >= 1, or "
     "drop --bpe-merges (its default)",
     [("drop --bpe-merges", "translation/prepare-wmt16enro.sh", ["--dry-run"])]),
    ("translation/prepare-wmt14en2de.sh", ["--vocab-size", "abc", "--dry-run"],
     "prepare-wmt14en2de.sh: error: --vocab-size=abc: not a whole number >= 1; allowed: a whole number >= 1, or "
     "drop --vocab-size (its default)",
     [("drop --vocab-size", "translation/prepare-wmt14en2de.sh", ["--dry-run"])]),
    ("translation/prepare-wmt14en2de.sh", ["--paper", "antthe", "--dry-run"],
     "prepare-wmt14en2de.sh: error: --paper=antthe: not one of the choices; allowed: anthe|subformer",
     [("anthe", "translation/prepare-wmt14en2de.sh", ["--paper", "anthe", "--dry-run"]),
      ("subformer", "translation/prepare-wmt14en2de.sh", ["--paper", "subformer", "--dry-run"])]),
    ("translation/prepare-wmt17.sh", ["de-en", "--spm-sample", "abc", "--dry-run"],
     "prepare-wmt17.sh: error: --spm-sample=abc: not a whole number >= 1; allowed: a whole number >= 1, or drop "
     "--spm-sample (its default)",
     [("drop --spm-sample", "translation/prepare-wmt17.sh", ["de-en", "--dry-run"])]),
    ("translation/prepare-wmt17.sh", ["de-en", "--skip", "europarll", "--dry-run"],
     "prepare-wmt17.sh: error: --skip=europarll: not one of the choices; allowed: europarl|commoncrawl|"
     "news-commentary|rapid|wiki-titles|leta|dcep|books|setimes|un",
     [("europarl", "translation/prepare-wmt17.sh", ["de-en", "--skip", "europarl", "--dry-run"])]),
    ("translation/prepare-wmt17.sh", ["de-en", "--skip", "leta", "--dry-run"],
     "prepare-wmt17.sh: error: --skip=leta: not a training corpus of de-en; allowed: "
     "europarl|commoncrawl|news-commentary|rapid",
     [("rapid", "translation/prepare-wmt17.sh", ["de-en", "--skip", "rapid", "--dry-run"])]),
    ("translation/prepare-wmt17.sh", ["de-en", "--max-size", "9X", "--dry-run"],
     "prepare-wmt17.sh: error: --max-size=9X: not a size; allowed: a number of bytes with an optional K, M, G or "
     "T (e.g. 500M, 9G), or drop --max-size (its default)",
     [("9G", "translation/prepare-wmt17.sh", ["de-en", "--max-size", "9G", "--dry-run"]),
      ("drop --max-size", "translation/prepare-wmt17.sh", ["de-en", "--dry-run"])]),
    ("lm/evaluate-lm.sh", ["{lm}", "{lmckpt}", "--tokens-per-sample", "x"],
     "evaluate-lm.sh: error: --tokens-per-sample=x: not a whole number >= 1; allowed: a whole number >= 1, or "
     "drop --tokens-per-sample (its default)",
     [("drop --tokens-per-sample", "lm/evaluate-lm.sh", ["{lm}", "{lmckpt}"])]),
    ("lm/evaluate-lm.sh", ["{lm}:{lm}", "{lmckpt}"],
     "evaluate-lm.sh: error: DATA_BIN={lm}:{lm}: shards of a data-bin (fairseq's DIR1:DIR2); allowed: one "
     "data-bin, e.g. {lm} (evaluate-lm.sh scores a whole subset; run fairseq-eval-lm itself on each shard)",
     [("one data-bin, e.g. {lm}", "lm/evaluate-lm.sh", ["{lm}", "{lmckpt}"])]),
    ("translation/evaluate.sh", EVAL + ["--beam", "0x"],
     "evaluate.sh: error: --beam=0x: not a whole number >= 1; allowed: a whole number >= 1, or drop --beam "
     "(default 5)",
     [("drop --beam", "translation/evaluate.sh", EVAL)]),
    # a recipe's own options on an arch of the other kind, or of fairseq: named as the recipe's
    ("translation/train-subformer.sh", ["{ende}", "--arch", "stlm_tied", "--dry-run"],
     "train-subformer.sh: error: --arch=stlm_tied: a language model, and train-subformer.sh trains translation "
     "models; allowed: --arch subformer_base, or a language-model recipe (examples/lm/train-*.sh)",
     [("--arch subformer_base", "translation/train-subformer.sh", ["{ende}", "--arch", "subformer_base",
                                                                   "--dry-run"]),
      ("a language-model recipe", "lm/train-stlm.sh", ["{lm}", "--arch", "stlm_tied", "--dry-run"])]),
    ("translation/train-subformer.sh", ["{ende}", "--arch", "transformer", "--dry-run"],
     "train-subformer.sh: error: --arch=transformer: train-subformer.sh sets --bert-init for its archs, which "
     "transformer refuses (--bert-init: not options of fairseq-train with --arch transformer --task translation); "
     "allowed: --arch subformer_base",
     [("--arch subformer_base", "translation/train-subformer.sh", ["{ende}", "--arch", "subformer_base",
                                                                   "--dry-run"])]),
    # a dry run checks the data-bin it prints a command for
    ("translation/train-anthe.sh", ["nowhere/data-bin", "--dry-run"],
     "train-anthe.sh: error: DATA_BIN=nowhere/data-bin: not a folder; allowed: the data-bin a prepare script (or "
     "fairseq-preprocess) wrote",
     [("the data-bin a prepare script", "translation/train-anthe.sh", ["{ende}", "--dry-run"])]),
    ("lm/train-stlm.sh", ["{emptytrain}", "--dry-run"],
     "train-stlm.sh: error: DATA_BIN={emptytrain}: its train split is empty (train.bin holds no tokens: an empty "
     "text file was binarized); allowed: a data-bin binarized from a --trainpref text that has lines",
     [("a data-bin binarized from a --trainpref text that has lines", "lm/train-stlm.sh", ["{lm}", "--dry-run"])]),
    # the GPUs a run asks for (this machine shows none): the fix trains (a stand-in fairseq-train)
    ("translation/train-anthe.sh", ["{ende}", "--gpus", "2", "--save-dir", "{tmp}/ckpt", "--max-update", "3"],
     "train-anthe.sh: error: --gpus=2: this machine shows 0 CUDA GPU(s); allowed: --gpus 0",
     [("--gpus 0", "translation/train-anthe.sh", ["{ende}", "--gpus", "0", "--save-dir", "{tmp}/ckpt", "--max-update",
                                                  "3"])]),
    ("lm/train-stlm.sh", ["{lm}", "--fp16", "--dry-run"],
     "train-stlm.sh: error: --fp16: mixed precision needs CUDA GPUs, and this run trains on the CPU; allowed: drop "
     "--fp16, or --gpus N on a machine with GPUs",
     [("drop --fp16", "lm/train-stlm.sh", ["{lm}", "--dry-run"])]),
    ("translation/train-anthe.sh", ["{ende}", "--nodes", "2", "--gpus", "0", "--dry-run"],
     "train-anthe.sh: error: --nodes=2: several nodes need GPUs; allowed: --gpus N",
     [("--gpus N", "translation/train-anthe.sh", ["{ende}", "--nodes", "2", "--gpus", "8", "--dry-run"])]),
    ("translation/evaluate.sh", EVAL + ["--avg", "2"],
     "evaluate.sh: error: --avg=2: needs a checkpoint folder, got the file {mtckpt}; allowed: --avg 1, or the "
     "folder of mt.pt",
     [("--avg 1", "translation/evaluate.sh", EVAL + ["--avg", "1"])]),
    # a save-dir whose checkpoint fairseq would resume from is not a complete checkpoint
    ("lm/train-stlm.sh", ["{lm}", "--save-dir", "{truncdir}", "--dry-run"],
     "train-stlm.sh: error: --save-dir={truncdir}: fairseq would resume from {truncated}: not a complete "
     "checkpoint ([Errno 22] Invalid argument): a copy or a save that did not finish; allowed: a --save-dir of its "
     "own, or --restore-file {truncdir}/checkpoint1.pt (an earlier checkpoint of that run)",
     [("a --save-dir of its own", "lm/train-stlm.sh", ["{lm}", "--save-dir", "{tmp}/own", "--dry-run"]),
      ("--restore-file {truncdir}/checkpoint1.pt", "lm/train-stlm.sh",
       ["{lm}", "--save-dir", "{truncdir}", "--restore-file", "{truncdir}/checkpoint1.pt", "--dry-run"])]),
    # a save-dir whose checkpoint_last.pt is another architecture's
    ("lm/train-skipless.sh", ["{lm}", "--save-dir", "{otherarch}", "--dry-run"],
     "train-skipless.sh: error: --save-dir={otherarch}: its checkpoint_last.pt is a stlm_tied model, which fairseq "
     "would resume as skipless_lm; allowed: --arch stlm_tied (to go on training it), or a --save-dir of its own",
     [("--arch stlm_tied", "lm/train-skipless.sh", ["{lm}", "--arch", "stlm_tied", "--save-dir", "{otherarch}",
                                                    "--dry-run"]),
      ("a --save-dir of its own", "lm/train-skipless.sh", ["{lm}", "--save-dir", "{tmp}/own", "--dry-run"])]),
    # the options the WMT14 default segmentation does not read
    ("translation/prepare-wmt14en2de.sh", ["--vocab-size", "8000", "--dry-run"],
     "prepare-wmt14en2de.sh: error: --vocab-size=8000: the sentencepiece vocabulary of --paper anthe, and this "
     "setting learns BPE merges instead; allowed: --bpe-merges 8000, or --paper anthe",
     [("--bpe-merges 8000", "translation/prepare-wmt14en2de.sh", ["--bpe-merges", "8000", "--dry-run"]),
      ("--paper anthe", "translation/prepare-wmt14en2de.sh", ["--vocab-size", "8000", "--paper", "anthe",
                                                              "--dry-run"])]),
    # an archive of the user's own that is not the archive
    ("lm/prepare-wikitext-103.sh", ["--archive", "/etc/hostname", "--dry-run"],
     "prepare-wikitext-103.sh: error: --archive=/etc/hostname: not a zip archive; allowed: the wikitext-103-v1.zip "
     "archive (downloaded from https://wikitext.smerity.com/wikitext-103-v1.zip)",
     [("the wikitext-103-v1.zip archive", "lm/prepare-wikitext-103.sh", ["--archive", "{wtzip}", "--dry-run"])]),
    # evaluations: the model kind, the data kind, the checkpoint file, the references
    ("translation/evaluate.sh", ["{ende}", "{lmckpt}", "--lenpens", "1.0"],
     "evaluate.sh: error: CKPT={lmckpt}: a language model (stlm_tied, task language_modeling), and evaluate.sh "
     "scores translation models; allowed: examples/lm/evaluate-lm.sh DATA_BIN CKPT",
     [("examples/lm/evaluate-lm.sh DATA_BIN CKPT", "lm/evaluate-lm.sh", ["{lm}", "{lmckpt}"])]),
    ("translation/evaluate.sh", ["{ende}", "{deenckpt}", "--lenpens", "1.0"],
     "evaluate.sh: error: CKPT={deenckpt}: the model translates de -> en, and {ende}/recipe.info says en -> de; "
     "allowed: a data-bin of de -> en (a prepare script's --src de --tgt en)",
     [("a data-bin of de -> en", "translation/evaluate.sh", ["{deen}", "{deenckpt}", "--lenpens", "1.0"])]),
    ("lm/evaluate-lm.sh", ["{lm}", "{mtckpt}"],
     "evaluate-lm.sh: error: CKPT={mtckpt}: a translation model (anthe_base, task translation), and evaluate-lm.sh "
     "scores language models; allowed: examples/translation/evaluate.sh DATA_BIN CKPT",
     [("examples/translation/evaluate.sh DATA_BIN CKPT", "translation/evaluate.sh", EVAL)]),
    ("lm/evaluate-lm.sh", ["{ende}", "{mtckpt}"],
     "evaluate-lm.sh: error: DATA_BIN={ende}: translation data (dict.de.txt, dict.en.txt), and evaluate-lm.sh "
     "scores language models; allowed: examples/translation/evaluate.sh DATA_BIN CKPT",
     [("examples/translation/evaluate.sh DATA_BIN CKPT", "translation/evaluate.sh", EVAL)]),
    # a truncated checkpoint: the complete one beside it
    ("lm/evaluate-lm.sh", ["{lm}", "{truncated}"],
     "evaluate-lm.sh: error: CKPT={truncated}: not a complete checkpoint ([Errno 22] Invalid argument): a copy or a "
     "save that did not finish; allowed: CKPT={truncdir}/checkpoint1.pt (a complete checkpoint in the same folder)",
     [("CKPT={truncdir}/checkpoint1.pt", "lm/evaluate-lm.sh", ["{lm}", "{truncdir}/checkpoint1.pt"])]),
    ("lm/evaluate-lm.sh", ["{lm}", "{lmckpt}", "--sample-break-mode", "complete"],
     "evaluate-lm.sh: error: --sample-break-mode complete: the longest line of test holds {longest} tokens, more "
     "than a block of --tokens-per-sample 64; allowed: --sample-break-mode none (blocks cross lines)",
     [("--sample-break-mode none", "lm/evaluate-lm.sh", ["{lm}", "{lmckpt}", "--sample-break-mode", "none"])]),
    ("translation/evaluate.sh", ["{shifted}", "{mtckpt}", "--lenpens", "1.0"],
     "evaluate.sh: error: {shifted}/test.raw.de: 99 lines, and the binarized test split holds 100 sentences: its "
     "hypotheses would be scored against other sentences' references; allowed: the test.raw.de written with the "
     "data-bin (one line per sentence)",
     [("the test.raw.de written with the data-bin", "translation/evaluate.sh", EVAL)]),
    ("translation/evaluate.sh", ["{latin1}", "{mtckpt}", "--lenpens", "1.0"],
     "evaluate.sh: error: {latin1}/test.raw.de: line 1 is not UTF-8 text (byte 0xfc at 8); allowed: the text as "
     "UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)",
     [("iconv -f LATIN1 -t UTF-8", "translation/evaluate.sh", ["{utf8}", "{mtckpt}", "--lenpens", "1.0"])]),
    # an option fairseq-generate does not know: refused before anything is translated
    ("translation/evaluate.sh", EVAL + ["--frobnicate", "3"],
     "evaluate.sh: error: --frobnicate 3: not options of fairseq-generate with --task translation; allowed: drop "
     "--frobnicate 3, or the options of fairseq-generate --help",
     [("drop --frobnicate 3", "translation/evaluate.sh", EVAL)]),
]

# every fix a refusal above proposes, once: (recipe, its arguments)
ACCEPTED = list(dict.fromkeys((script, tuple(argv)) for *_, fixes in RECIPES for _, script, argv in fixes))


def _placeholders(tmp_path):
    """{ende}, {lm} and damaged copies of them: without a valid split ({novalid}), with an empty
    training split ({emptytrain}), with line 50 of test.raw.de deleted ({shifted}), with the
    reference in Latin-1 ({latin1}) and that reference converted to UTF-8 as iconv -f LATIN1 -t UTF-8
    does ({utf8}), in the other direction ({deen}); checkpoints of a language model, of en -> de
    and of de -> en translation (their configuration only), a truncated one ({truncated}) in a
    save-dir ({truncdir}) that holds a complete earlier one (checkpoint1.pt), and a save-dir
    holding an stlm_tied checkpoint; a zip archive ({wtzip}). {longest}: the tokens of the
    longest line of {lm}'s test split."""
    import shutil
    from recipes_fixtures import stand_in_checkpoint
    ende, lm = ende_data_bin(), wikitext_data_bin()
    found = {"{ende}": ende, "{lm}": lm, "{tmp}": str(tmp_path)}
    for name, source, skip in (("novalid", ende, "valid."), ("shifted", ende, "test.raw.de"),
                               ("latin1", ende, "test.raw.de"), ("utf8", ende, "test.raw.de"),
                               ("emptytrain", lm, "train."), ("deen", ende, "recipe.info")):
        folder = tmp_path / name
        folder.mkdir()
        for entry in os.listdir(source):
            if not entry.startswith(skip):
                os.symlink(os.path.join(source, entry), folder / entry)
        found["{" + name + "}"] = str(folder)
    with open(os.path.join(ende, "test.raw.de"), encoding="utf-8") as f:
        refs = f.read().splitlines(keepends=True)
    (tmp_path / "shifted" / "test.raw.de").write_text("".join(refs[:49] + refs[50:]), encoding="utf-8")
    # what a Latin-1 file can hold of the references ("?" for those it has not, e.g. U+2026)
    (tmp_path / "latin1" / "test.raw.de").write_bytes("".join(refs).encode("latin-1", errors="replace"))
    (tmp_path / "utf8" / "test.raw.de").write_bytes(
        (tmp_path / "latin1" / "test.raw.de").read_bytes().decode("latin-1").encode("utf-8"))
    (tmp_path / "deen" / "recipe.info").write_text("SRC=de\nTGT=en\nSCHEME=moses-bpe\n")
    (tmp_path / "emptytrain" / "train.bin").write_bytes(b"")
    shutil.copy(os.path.join(lm, "train.idx"), tmp_path / "emptytrain" / "train.idx")
    found["{lmckpt}"] = str(stand_in_checkpoint(tmp_path / "lm.pt", "stlm_tied", "language_modeling",
                                                max_target_positions=64, tokens_per_sample=64))
    found["{mtckpt}"] = str(stand_in_checkpoint(tmp_path / "mt.pt", "anthe_base", "translation",
                                                source_lang="en", target_lang="de"))
    found["{deenckpt}"] = str(stand_in_checkpoint(tmp_path / "deen.pt", "anthe_base", "translation",
                                                  source_lang="de", target_lang="en"))
    whole = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied", "checkpoint.pt")
    (tmp_path / "truncdir").mkdir()
    with open(whole, "rb") as f:
        (tmp_path / "truncdir" / "checkpoint_last.pt").write_bytes(f.read()[:5000])
    os.symlink(whole, tmp_path / "truncdir" / "checkpoint1.pt")
    found["{truncdir}"] = str(tmp_path / "truncdir")
    (tmp_path / "otherarch").mkdir()
    os.symlink(whole, tmp_path / "otherarch" / "checkpoint_last.pt")
    found["{otherarch}"] = str(tmp_path / "otherarch")
    found["{truncated}"] = str(tmp_path / "truncdir" / "checkpoint_last.pt")
    with zipfile.ZipFile(tmp_path / "wikitext-103-v1.zip", "w") as archive:
        archive.writestr("wikitext-103/wiki.train.tokens", " = Valkyria Chronicles = \n")
    found["{wtzip}"] = str(tmp_path / "wikitext-103-v1.zip")
    found["{longest}"] = str(subset_tokens(lm, "test")[1])
    return found


def _filled(argv, found):
    for placeholder, path in found.items():
        argv = [a.replace(placeholder, path) for a in argv]
    return argv


def _run_recipe(script, argv, tmp_path, env=None):
    """The recipe run in TMP_PATH (a preparation with its --work-dir there)."""
    if script.split("/")[1].startswith("prepare"):
        argv = [*argv, "--work-dir", str(tmp_path / "work")]
    return _recipe(script, *argv, env=env, cwd=tmp_path)


@pytest.mark.parametrize("script, argv, line, fixes", RECIPES, ids=[f"{c[0]} {' '.join(c[1])}" for c in RECIPES])
def test_recipe_mistake_ends_in_one_line(script, argv, line, fixes, tmp_path):
    """The exact line, nothing written; it proposes at least one fix, each named in its
    ``allowed`` (and run by test_recipe_fix_that_a_refusal_proposes_is_accepted)."""
    found = _placeholders(tmp_path)
    before = sorted(os.listdir(tmp_path))
    proc = _run_recipe(script, _filled(argv, found), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "usage:" not in proc.stderr, \
        proc.stderr[-3000:]
    assert errors[0] == _filled([line], found)[0]
    assert sorted(os.listdir(tmp_path)) == before  # refused: nothing was written
    assert "; allowed: " in line and fixes, f"proposes no fix a test can try: {line}"
    allowed = line.rsplit("; allowed: ", 1)[1]
    for proposed, fixed_script, fixed in fixes:
        assert proposed in allowed and (fixed_script, fixed) != (script, argv), proposed


@pytest.mark.parametrize("script, argv", ACCEPTED, ids=[f"{c[0]} {' '.join(c[1])}" for c in ACCEPTED])
def test_recipe_fix_that_a_refusal_proposes_is_accepted(script, argv, tmp_path):
    """What the refusals above propose runs (the evaluations and training with stand-ins of
    fairseq's tools)."""
    from recipes_fixtures import install_fake_tools
    fake = install_fake_tools(tmp_path / "fake" / "bin", sys.executable)
    found = _placeholders(tmp_path)
    with open(os.path.join(found["{ende}"], "test.raw.de"), encoding="utf-8") as f:
        (tmp_path / "fake" / "test.hyp").write_text(f.read(), encoding="utf-8")
    tokens, longest = subset_tokens(found["{lm}"], "test")
    (tmp_path / "fake" / "eval-lm.out").write_text(f"Evaluated {tokens} tokens in 1.0s\nLoss (base 2): 6.0000, "
                                                   "Perplexity: 64.00\n")
    env = {"PATH": f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path / "fake")}
    proc = _run_recipe(script, _filled(argv, found), tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert longest > 64  # the lines that complete blocks of 64 tokens could not hold


def test_truncated_checkpoint_refusal_names_a_complete_one_beside_it(tmp_path):
    """The newest other checkpoint of the folder that loads, never the truncated file itself nor
    another truncated one; a folder without one says so."""
    import time
    from slim_fairseq_lab.recipes import evaluation
    from slim_fairseq_lab.recipes.cli import OptionError
    whole = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied", "checkpoint.pt")
    with open(whole, "rb") as f:
        head = f.read(5000)
    (tmp_path / "checkpoint1.pt").symlink_to(whole)
    for name in ("checkpoint2.pt", "checkpoint_last.pt"):  # newer than checkpoint1.pt, and truncated
        (tmp_path / name).write_bytes(head)
        os.utime(tmp_path / name, (time.time() + 10, time.time() + 10))
    with pytest.raises(OptionError) as caught:
        evaluation.read(str(tmp_path / "checkpoint_last.pt"))
    assert str(caught.value) == (f"CKPT={tmp_path}/checkpoint_last.pt: not a complete checkpoint ([Errno 22] Invalid "
                                 "argument): a copy or a save that did not finish; allowed: "
                                 f"CKPT={tmp_path}/checkpoint1.pt (a complete checkpoint in the same folder)")
    assert evaluation.read(str(tmp_path / "checkpoint1.pt"))["cfg"]["model"].arch == "stlm_tied"
    (tmp_path / "checkpoint1.pt").unlink()
    with pytest.raises(OptionError) as caught:
        evaluation.read(str(tmp_path / "checkpoint_last.pt"))
    assert str(caught.value).endswith(f"; allowed: a checkpoint fairseq saved completely (none other in {tmp_path} "
                                      "loads)")


def test_refused_or_failed_train_leaves_what_it_found(tmp_path):
    """A train recipe writes its save-dir (recipe.data) only when every check passed: a run
    refused for the wrong data, an option the plugin refuses or a missing split, or one whose
    fairseq-train fails before it saves a checkpoint, leaves no save-dir behind, and the
    corrected run, even a dry run, is not refused for a save-dir of another data-bin."""
    from recipes_fixtures import install_fake_tools
    found = _placeholders(tmp_path)
    save = tmp_path / "checkpoints" / "stlm_tied"
    def stated(argv):  # the line RECIPES states for train-stlm.sh ARGV
        return next(row[2] for row in RECIPES if row[:2] == ("lm/train-stlm.sh", argv))

    refused = {("{ende}",): stated(["{ende}", "--dry-run", "--gpus", "0"]),
               ("{lm}", "--tc-ff", "2.0"): "train-stlm.sh: error: --tc-ff=2.0: not a parameter ratio; allowed: a "
                                           "ratio in [0, 1] (0 = dense)",
               ("{emptytrain}",): stated(["{emptytrain}", "--dry-run"])}
    for argv, line in refused.items():
        proc = _recipe("lm/train-stlm.sh", *_filled(argv, found), "--gpus", "0", cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr == _filled([line], found)[0] + "\n", proc.stderr
        assert not (tmp_path / "checkpoints").exists()
    fake = install_fake_tools(tmp_path / "fake" / "bin", sys.executable)
    (fake / "fairseq-train").write_text(
        f"#!{sys.executable}\nimport os, sys\nsave = sys.argv[sys.argv.index('--save-dir') + 1]\n"
        "os.makedirs(save, exist_ok=True)\nopen(os.path.join(save, 'crash.pt'), 'wb').close()\n"
        "sys.exit('RuntimeError: the run crashed')\n")
    env = {"PATH": f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = _recipe("lm/train-stlm.sh", found["{lm}"], "--gpus", "0", "--max-update", "5", env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == ("train-stlm.sh: error: fairseq-train failed (exit 1): RuntimeError: the "
                                            "run crashed (its output is above)")
    assert not save.exists()
    proc = _recipe("lm/train-stlm.sh", found["{lm}"], "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("+ fairseq-train ")


def test_killed_evaluation_stops_the_fairseq_tool_it_runs(tmp_path):
    """SIGTERM to evaluate.sh reaches fairseq-generate's process group: no tool is left running
    when the recipe has stopped, and nothing is written."""
    import signal
    import time
    from recipes_fixtures import install_fake_tools
    fake = install_fake_tools(tmp_path / "fake" / "bin", sys.executable)
    found = _placeholders(tmp_path)
    with open(os.path.join(found["{ende}"], "test.raw.de"), encoding="utf-8") as f:
        (tmp_path / "fake" / "test.hyp").write_text(f.read(), encoding="utf-8")
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
               FAKE_DIR=str(tmp_path / "fake"), FAKE_GENERATE_DELAY="1", PYTHON=os.path.join(BIN, "python"),
               PYTHONWARNINGS="ignore")
    recipe = subprocess.Popen(["bash", os.path.join(EXAMPLES, "translation", "evaluate.sh"), found["{ende}"],
                               found["{mtckpt}"], "--lenpens", "1.0"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "fake" / "generate.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() and recipe.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), recipe.communicate()
    time.sleep(0.5)
    tool = int(pid_file.read_text())
    recipe.send_signal(signal.SIGTERM)
    _, err = recipe.communicate(timeout=60)
    assert recipe.returncode == 128 + signal.SIGTERM
    assert err.splitlines()[-1] == ("evaluate.sh: error: stopped by SIGTERM; the tools it ran were stopped "
                                    "too")
    with pytest.raises(ProcessLookupError):
        os.kill(tool, 0)
    assert not os.path.exists(os.path.join(os.path.dirname(found["{mtckpt}"]), "eval"))


# fairseq-train's own command line (no recipe): what the plugin checks when fairseq parses it,
# before it reads any data or starts a worker; (arguments after the data-bin, the data-bin's
# placeholder as in RECIPES, the line, exactly, the fix it proposes: (what its "allowed" says,
# the arguments, the data-bin))
LM_TASK = ["--task", "language_modeling", "--arch", "stlm_tied"]
RESUME = ["--task", "language_modeling", "--tokens-per-sample", "16", "--arch", "slim_lm", "--decoder-layers", "2",
          "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48", "--cpu", "--optimizer", "adam",
          "--max-tokens", "256", "--max-update", "1", "--num-workers", "0"]
FAIRSEQ_TRAIN = [
    (LM_TASK, "{ende}",
     "fairseq-train: error: DATA={ende}: translation data (dict.de.txt, dict.en.txt), and --task language_modeling "
     "reads dict.txt; allowed: a language-model data-bin (fairseq-preprocess --only-source), or --task translation "
     "with an encoder-decoder arch",
     ("a language-model data-bin", LM_TASK, "{lm}")),
    (LM_TASK, "{emptytrain}",
     "fairseq-train: error: DATA={emptytrain}: its train split is empty (train.bin holds no tokens: an empty text "
     "file was binarized); allowed: a data-bin binarized from a --trainpref text that has lines",
     ("a data-bin binarized from a --trainpref text that has lines", LM_TASK, "{lm}")),
    (LM_TASK + ["--fp16"], "{lm}",
     "fairseq-train: error: --fp16: mixed precision runs on CUDA GPUs, and torch sees none here; allowed: drop "
     "--fp16 (float32 on the CPU)",
     ("drop --fp16", LM_TASK, "{lm}")),
    (LM_TASK + ["--distributed-world-size", "2"], "{lm}",
     "fairseq-train: error: --distributed-world-size=2: one worker per CUDA GPU, and torch sees none here; "
     "allowed: --distributed-world-size 1",
     ("--distributed-world-size 1", LM_TASK + ["--distributed-world-size", "1"], "{lm}")),
    # resuming a save-dir that holds another architecture's checkpoint: the fix trains
    (RESUME + ["--save-dir", "{tmp}/resume"], "{lm}",
     "fairseq-train: error: --arch=slim_lm: the checkpoint's weights are another model's (19 missing, 13 "
     "unexpected, 6 of another shape, e.g. decoder.layer_norm.bias); allowed: the arch and options the checkpoint "
     "was trained with, or a --save-dir of its own when training",
     ("a --save-dir of its own", RESUME + ["--save-dir", "{tmp}/own"], "{lm}")),
]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="these are mistakes on a machine without CUDA")
@pytest.mark.parametrize("argv, data, line, fix", FAIRSEQ_TRAIN, ids=[" ".join(c[0][2:5]) + " " + c[1]
                                                                      for c in FAIRSEQ_TRAIN])
def test_fairseq_train_mistake_ends_in_one_line(argv, data, line, fix, tmp_path):
    """Tracebacks fairseq-train would stop with, each one line from the plugin instead; the fix
    it proposes passes the same checks (slim_fairseq/run_checks.py), or trains."""
    import shutil
    from slim_fairseq import run_checks
    found = _placeholders(tmp_path)
    (tmp_path / "resume").mkdir()
    shutil.copy(os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied", "checkpoint.pt"),
                tmp_path / "resume" / "checkpoint_last.pt")
    plugin = ["--user-dir", os.path.join(REPO, "slim_fairseq")]
    argv = _filled([found[data], *plugin, *argv], found)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run([os.path.join(BIN, "fairseq-train"), *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert proc.returncode != 0 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0] == _filled([line], found)[0]
    proposed, fixed, fixed_data = fix
    assert proposed in line.rsplit("; allowed: ", 1)[1]
    fixed = _filled([found[fixed_data], *plugin, *fixed], found)
    if "--save-dir" in fixed:  # it trains
        proc = subprocess.run([os.path.join(BIN, "fairseq-train"), *fixed], capture_output=True, text=True, env=env,
                              timeout=300, cwd=tmp_path)
        assert proc.returncode == 0 and (tmp_path / "own" / "checkpoint_last.pt").is_file(), proc.stderr[-3000:]
        return
    args = parse_train_args(fixed)
    run_checks.check_devices(args)
    run_checks.check_data_bin(args.data, args.task, args.train_subset, run_checks._valid_subsets(args))


def test_generate_with_swapped_languages_ends_in_one_line(tmp_path):
    """fairseq-generate -s de -t en with a model trained en -> de would translate from the wrong
    side (BLEU near 0, no word said): the plugin refuses it when it builds the model, and the
    languages it proposes load."""
    from fairseq import checkpoint_utils, options, tasks
    folder = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "anthe_base")
    path = os.path.join(folder, "checkpoint.pt")

    def load(source, target):
        args = options.parse_args_and_arch(options.get_generation_parser(), [
            folder, "--path", path, "--task", "translation", "-s", source, "-t", target, "--cpu",
            "--user-dir", os.path.join(REPO, "slim_fairseq")])
        return checkpoint_utils.load_model_ensemble([path], task=tasks.setup_task(args))

    with pytest.raises(ValueError) as caught:
        load("de", "en")
    assert str(caught.value) == (
        "--source-lang=de: the model was trained to translate en -> de, and this run reads de -> en; "
        "allowed: --source-lang en --target-lang de")
    (change,) = caught.value.alternatives
    models, _ = load(change["--source-lang"], change["--target-lang"])
    assert len(models) == 1


def test_scripts_refuse_what_would_lose_their_inputs(tmp_path, capsys):
    """count_params.py with a misspelt arch, average_checkpoints.py over runs of other options
    or onto one of its inputs, export_dense.py onto its input: one line each, the input kept;
    what each proposes works."""
    import shutil
    import torch
    from helpers import load_script
    assert load_script("count_params").main(["stlm_tide"]) == 2
    assert capsys.readouterr().err == ("count_params: error: --arch=stlm_tide: not an architecture; allowed: the "
                                       "closest: stlm_tied, stlm_untied, stlm_ffn_k2_wide; slim-fairseq-help --archs "
                                       "lists every architecture\n")
    assert load_script("count_params").main(["stlm_tied", "--vocab", "100", "--meta"]) == 0
    average = load_script("average_checkpoints")
    fixture = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied", "checkpoint.pt")
    state = torch.load(fixture, weights_only=True)
    torch.save(state, tmp_path / "a.pt")
    state["cfg"]["model"].dropout = 0.3
    torch.save(state, tmp_path / "b.pt")
    kept = (tmp_path / "a.pt").read_bytes()
    assert average.main(["--inputs", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--output",
                         str(tmp_path / "avg.pt"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"average_checkpoints: error: --inputs: {tmp_path}/b.pt was trained with other model options than {tmp_path}/a.pt (--dropout 0.0 "
        "vs 0.3); allowed: checkpoints of one run (the same --arch and model options)\n")
    assert average.main(["--inputs", str(tmp_path / "a.pt"), str(tmp_path / "a.pt"), "--output",
                         str(tmp_path / "a.pt")]) == 2
    assert capsys.readouterr().err == (f"average_checkpoints: error: --output={tmp_path}/a.pt: is the input "
                                       f"{tmp_path}/a.pt, which averaging would overwrite; allowed: another file\n")
    assert (tmp_path / "a.pt").read_bytes() == kept
    assert average.main(["--inputs", str(tmp_path / "a.pt"), str(tmp_path / "a.pt"), "--output",
                         str(tmp_path / "avg.pt")]) == 0 and not (tmp_path / "avg.pt").stat().st_size == 0
    capsys.readouterr()  # what it averaged
    export = load_script("export_dense")
    folder = tmp_path / "export"
    shutil.copytree(os.path.dirname(fixture), folder)
    kept = (folder / "checkpoint.pt").read_bytes()
    assert export.main([str(folder / "checkpoint.pt"), str(folder / "checkpoint.pt"), "--data", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"export_dense: error: OUTPUT={folder}/checkpoint.pt: is the checkpoint it reads ({folder}/checkpoint.pt), "
        "which writing would overwrite; allowed: another file\n")
    assert (folder / "checkpoint.pt").read_bytes() == kept
    assert export.main([str(folder / "checkpoint.pt"), str(folder / "dense.pt"), "--data", str(folder)]) == 0
    assert (folder / "dense.pt").is_file() and (folder / "checkpoint.pt").read_bytes() == kept


def test_max_sentences_is_the_batch_size_the_recipe_prints():
    """fairseq's --max-sentences is its --batch-size: the recipe prints and passes that value."""
    from recipes_fixtures import run_recipe
    proc = run_recipe("translation/train-subformer.sh", ende_data_bin(), "--max-sentences=64", "--dry-run",
                      "--gpus", "1", cwd=REPO, gpus=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "at most 64 sentences per worker batch (--batch-size)" in out, out[-2000:]
    command = next(line for line in out.splitlines() if line.startswith("+ fairseq-train"))
    assert " --batch-size 64 " in command + " " and "--max-sentences" not in command, command


def test_generate_on_a_language_model_ends_in_one_line_and_its_advice_works(tmp_path):
    """fairseq-generate --task language_modeling reads blocks of 1,024 tokens by default: with
    a model of fewer positions it would stop with a traceback on the first sample."""
    fixture = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied")
    long_line = " ".join(["the house of a man"] * 6) + " .\n"  # longer than the model's positions
    (tmp_path / "lm.test").write_text("the cat is in the house .\n" + long_line + "the house of a man .\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore", PATH=BIN + os.pathsep + os.environ["PATH"])
    subprocess.run([os.path.join(BIN, "fairseq-preprocess"), "--only-source", "--srcdict",
                    os.path.join(fixture, "dict.txt"), "--testpref", str(tmp_path / "lm.test"),
                    "--destdir", str(tmp_path / "bin"), "--workers", "1"],
                   check=True, capture_output=True, env=env, timeout=300)
    generate = [os.path.join(BIN, "fairseq-generate"), str(tmp_path / "bin"), "--task",
                "language_modeling", "--user-dir", os.path.join(REPO, "slim_fairseq"), "--path",
                os.path.join(fixture, "checkpoint.pt"), "--cpu", "--beam", "1", "--max-len-b", "3",
                "--required-batch-size-multiple", "1"]
    proc = subprocess.run(generate, capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert proc.returncode != 0 and len(errors) == 1 and "Traceback" not in proc.stderr, \
        proc.stderr[-3000:]
    assert errors[0] == (
        "fairseq-generate: error: --tokens-per-sample=1024: longer than the 16 positions the model has: "
        "fairseq-generate refuses every longer sample; allowed: --tokens-per-sample 16 or less with "
        "--sample-break-mode eos --skip-invalid-size-inputs-valid-test (one line per sample; longer lines are "
        "skipped), or fairseq-interactive --task language_modeling (or the hub's sample()) to continue your own "
        "prompts")
    proc = subprocess.run(generate + ["--tokens-per-sample", "16", "--sample-break-mode", "eos",
                                      "--skip-invalid-size-inputs-valid-test"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and len(re.findall(r"^H-\d", proc.stdout, re.M)) == 2, \
        proc.stderr[-3000:]


# ------------------------------------------------------------------ the plugin's one error format

# a message: SUBJECT[=VALUE]: what is wrong; allowed: what works (a program's "PROG: error: "
# before it); f-string fields read as "{}"
ONE_LINE = re.compile(r"^(\S+: error: )?[^:;\s][^:;]*?(=[^:;]+)?: [^\n]+; allowed: [^\n]+$")
# helpers that build such a message from (flag, value, problem, allowed); a method (".name")
# re-renders an error already in the format, whatever the object is called
# functions that build a refusal in the format (their number of arguments before ``allowed``, or
# None: the format is theirs): combined joins refusals that are in it; SaveDirInUse is no
# refusal but the lock's signal, which every caller turns into in_use_error's
BUILDERS = {"option_error": 3, "_off": 3, "unknown_arch": None, ".with_alternatives": None,
            "in_use_error": None, "combined": None, "SaveDirInUse": None}


def _template(node):
    import ast
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{}") + (right if right is not None else "{}")
    return None


def _nodes(root):
    """(file:line, node) for every node of every Python file under ``root``."""
    import ast
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    yield f"{os.path.relpath(path, REPO)}:{getattr(node, 'lineno', 0)}", node


def _raises(root):
    """(file:line, the raised call's source, what is wrong with its message or None)."""
    import ast
    for where, node in _nodes(root):
        if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
            continue  # a bare re-raise, or an error object made elsewhere
        call = node.exc
        func = ast.unparse(call.func)
        if isinstance(call.func, ast.Attribute) and "." + call.func.attr in BUILDERS:
            func = "." + call.func.attr
        if func in BUILDERS:
            given = len(call.args) > (BUILDERS[func] or 0) or any(
                k.arg in ("allowed", "alternatives") for k in call.keywords)
            yield where, func, None if BUILDERS[func] is None or given else "no allowed"
            continue
        if call.args and isinstance(call.args[0], ast.Call) and \
                ast.unparse(call.args[0].func) == "str":
            yield where, func, None  # an error already in the format, passed on
            continue
        text = _template(call.args[0]) if call.args else None
        yield where, func, None if text and ONE_LINE.match(text) else repr(text)


def test_every_error_of_the_plugin_is_one_line_naming_what_is_allowed():
    """Every raise in slim_fairseq/ states SUBJECT=VALUE: problem; allowed: what works."""
    found = list(_raises(os.path.join(REPO, "slim_fairseq")))
    assert len(found) > 100  # the scan sees the plugin's raises
    bad = [f"{where} {func}: {problem}" for where, func, problem in found if problem]
    assert not bad, "\n".join(bad)


def _recipe_refusals(root):
    """(file:line, the call, what is wrong or None) for each refusal the recipes build: an
    OptionError without a status (``step_failed`` makes failures), ``refuse(subject, problem,
    allowed)`` and ``Parser.refused(flag, why, allowed)``. A message made elsewhere and passed on (a name, a
    call: the plugin's own, scanned above, or argparse's, rewritten by cli.argparse_refusal) is
    not read here."""
    import ast
    for where, node in _nodes(root):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func in ("refuse", "cli.refuse") or func.endswith(".refused"):
            # three arguments, or fewer with a starred tuple (``*languages``) among them
            three = len(node.args) == 3 or (len(node.args) < 3 and any(
                isinstance(a, ast.Starred) for a in node.args))
            yield where, func, None if three else "not (subject, problem, allowed)"
        elif func.split(".")[-1] == "OptionError":
            if len(node.args) > 1 or any(k.arg == "status" for k in node.keywords):
                continue  # a step that failed, not a refusal
            text = _template(node.args[0])
            if text is None and not isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                yield where, func, None  # passed on
                continue
            yield where, func, None if text and ONE_LINE.match(text) else repr(text)


def test_every_refusal_of_the_recipes_is_one_line_naming_what_is_allowed():
    """The recipes refuse in the plugin's format: SUBJECT=VALUE: problem; allowed: what works."""
    found = list(_recipe_refusals(os.path.join(REPO, "slim_fairseq_lab", "recipes")))
    assert len(found) > 60  # the scan sees the recipes' refusals
    bad = [f"{where} {func}: {problem}" for where, func, problem in found if problem]
    assert not bad, "\n".join(bad)


# ------------------------------------------------------- slim-fairseq-export-hf (transformers)

# (arch, language model?, its options after the tiny widths, export options, the line, exactly,
# the model that the line's "allowed" describes: it must export)
EXPORT_HF = [
    # Anthe's gates and H-SoftPOS leave a language model as custom code, which has no more
    ("slim_lm", True, ["--self-attn-gate", "qgv", "--scale-attn"], {},
     "--scale-attn: the exported language model (custom code) has no NormFormer scales; allowed: "
     "no --scale-attn", ("slim_lm", ["--self-attn-gate", "qgv", "--decoder-learned-pos"])),
    ("slim_lm", True, ["--hsoftpos-levels", "2", "--no-decoder-final-norm"], {},
     "--no-decoder-final-norm: the exported language model (custom code) normalises the last "
     "layer's output; allowed: the final norm (no --no-decoder-final-norm)",
     ("slim_lm", ["--hsoftpos-levels", "2", "--no-decoder-normalize-before"])),
    ("slim_lm", True, ["--safe-embed-dim", "16", "--scale-fc"], {},
     "--scale-fc: the exported language model (custom code) has no NormFormer scales; allowed: no "
     "--scale-fc", ("slim_lm", ["--safe-embed-dim", "16", "--decoder-learned-pos"])),
    # a model no stock class holds goes the shorter way, to the custom code
    ("slim_lm", True, ["--output-bias", "--scale-attn"], {},
     "--scale-attn: the exported language model (custom code) has no NormFormer scales; allowed: "
     "no --scale-attn", ("slim_lm", ["--output-bias"])),
    ("slim_lm", True, ["--adaptive-input", "--adaptive-input-cutoff", "100,400",
                       "--adaptive-input-factor", "2", "--scale-resids"], {},
     "--scale-resids: the exported language model (custom code) has no NormFormer scales; allowed: "
     "no --scale-resids", ("slim_lm", ["--adaptive-input", "--adaptive-input-cutoff",
                                       "100,400", "--adaptive-input-factor", "2",
                                       "--no-decoder-normalize-before"])),
    # every option in the way, at once
    ("skipless_lm", True, ["--hsoftpos-levels", "2", "--activation-fn", "tanh"], {},
     "--hsoftpos-levels=2, --activation-fn=tanh: 2 options are in the way: --hsoftpos-levels=2: "
     "H-SoftPOS embeddings (convolutions over neighbouring tokens) are in no transformers class; "
     "--activation-fn=tanh: the exported skipless block (custom code) takes relu|gelu|silu; "
     "allowed: a model trained with all of --hsoftpos-levels 0, and --activation-fn "
     "relu|gelu|silu", ("skipless_lm", [])),
    ("slim_lm", True, ["--sandwich", "--decoder-layers", "3", "--sandwich-dim", "64",
                       "--activation-fn", "tanh"], {},
     "--activation-fn=tanh: the exported language model (custom code) takes relu|gelu|silu; "
     "allowed: --activation-fn relu|gelu|silu",
     ("slim_lm", ["--sandwich", "--decoder-layers", "3", "--sandwich-dim", "64"])),
    ("slim_lm", True, ["--kv-heads", "2", "--scale-fc"], {},
     "--scale-fc: the exported language model (custom code) has no NormFormer scales; allowed: no "
     "--scale-fc", ("slim_lm", ["--kv-heads", "2"])),
    ("slim_lm", True, [], {"bpe": "subword_nmt", "tokenizer_name": "moses", "bpe_codes": "{codes}"},
     "--bpe=subword_nmt: FSMT's tokenizer (Moses, subword-nmt) ends a text with </s> where a "
     "language model starts with it; allowed: --bpe gpt2|sentencepiece, or none (whitespace "
     "words)", ("slim_lm", [])),
    ("slim_transformer", False, ["--encoder-normalize-before", "--decoder-normalize-before",
                                 "--cross-self-attention"], {},
     "--cross-self-attention: no class here attends to source and target in one attention; "
     "allowed: no --cross-self-attention",
     ("slim_transformer", ["--encoder-normalize-before", "--decoder-normalize-before"])),
    ("slim_transformer", False, ["--norm", "rmsnorm", "--activation-fn", "tanh"], {},
     "--activation-fn=tanh: the exported translation model (custom code) takes relu|gelu|silu; "
     "allowed: --activation-fn relu|gelu|silu", ("slim_transformer", ["--norm", "rmsnorm"])),
]


@pytest.mark.parametrize("arch, lm, argv, options, line, fix", EXPORT_HF,
                         ids=[f"{c[0]} {' '.join(c[2])} {c[3]}" for c in EXPORT_HF])
def test_export_hf_refusal_is_one_line_and_its_advice_exports(arch, lm, argv, options, line,
                                                              fix, tmp_path_factory):
    from hf_export_fixtures import codes, data_of, exported, tiny_checkpoint, tokenizer_options
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    folder = tmp_path_factory.getbasetemp() / "export_hf_refusals"
    folder.mkdir(exist_ok=True)
    path = tiny_checkpoint(folder, arch, argv, lm)
    options = {k: codes() if v == "{codes}" else v for k, v in options.items()}
    out = folder / (os.path.basename(path) + "-hf")
    with pytest.raises(OptionError) as caught:
        export(path, data_of(lm), str(out), **dict(tokenizer_options(lm), **options))
    message = str(caught.value)
    assert message == line
    assert not out.exists()
    _, result = exported(folder, fix[0], fix[1], lm)
    assert result.gap <= 1e-5
