"""README.md's quick start, run as written on a small corpus this test makes up: Moses
tokenization, BPE and fairseq-preprocess with a joined dictionary, the small anthe_base and
Subformer trainings, fairseq-generate with sacreBLEU, the language models (fairseq-preprocess,
stlm_tied, fairseq-eval-lm, the other families) and the Python hub snippet on the checkpoints
just trained. Only the number of
updates, the output length and --cpu are added; the paper-size recipes print their command
(--dry-run, --gpus 0) and the test builds their models at full size."""
import json
import os
import random
import re
import shlex
import subprocess

import pytest

from doc_commands import code_blocks, logical_lines, section, tool
from helpers import BIN, REPO, parse_train_args

README = "README.md"
TRANSLATION = "## Quick start: translation on your own parallel text"
LANGUAGE_MODEL = "## Quick start: a language model on your own text"
PYTHON = "## Python: translate and score with the checkpoints you trained"

# what the test adds to a command, by program: a short run on the CPU
EXTRA = {
    "fairseq-train": "--cpu --max-update 2 --num-workers 0 --seed 1",
    "fairseq-generate": "--cpu --max-len-a 0 --max-len-b 6",
    "fairseq-eval-lm": "--cpu",
}

NOUNS = [("the house", "das Haus"), ("the car", "das Auto"), ("the cat", "die Katze"),
         ("the city", "die Stadt"), ("the book", "das Buch"), ("the garden", "der Garten"),
         ("the dog", "der Hund"), ("the window", "das Fenster"), ("my friend", "mein Freund")]
ADJECTIVES = [("small", "klein"), ("big", "groß"), ("old", "alt"), ("new", "neu"),
              ("red", "rot"), ("quiet", "ruhig"), ("cold", "kalt")]
ADVERBS = [("very ", "sehr "), ("not ", "nicht "), ("", "")]


def make_corpus(root):
    """``root/mydata``, the files the quick start names: aligned en-de sentences (train 300,
    valid and test 21 each, not a multiple of 8: see --required-batch-size-multiple) and their
    English side as word-level LM text."""
    rng = random.Random(1)
    os.makedirs(os.path.join(root, "mydata"))
    for split, n in [("train", 300), ("valid", 21), ("test", 21)]:
        pairs = []
        for _ in range(n):
            (en_n, de_n), (en_a, de_a), (en_d, de_d) = (rng.choice(NOUNS), rng.choice(ADJECTIVES),
                                                        rng.choice(ADVERBS))
            pairs.append((f"{en_n.capitalize()} is {en_d}{en_a}.",
                          f"{de_n[0].upper() + de_n[1:]} ist {de_d}{de_a}."))
        for name, lines in [(f"{split}.en", [en for en, _ in pairs]),
                            (f"{split}.de", [de for _, de in pairs]),
                            (f"lm.{split}", [en.lower().replace(".", " .") for en, _ in pairs])]:
            with open(os.path.join(root, "mydata", name), "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))


def in_root(text, root):
    """The quick start's relative paths (``mydata/``, ``data-bin/``, ``checkpoints/``) moved
    under ``root``; everything else runs from the repository root, as the README says."""
    return re.sub(r"(?<![\w/.-])(mydata|data-bin|checkpoints)/", str(root) + r"/\1/", text)


def script_line(line, root, paper_out):
    """One README command as the test runs it."""
    program = tool(line)
    if program.startswith("examples/") and program.endswith(".sh"):  # a paper-size recipe
        n = len(paper_out)
        paper_out.append(os.path.join(root, f"paper_{n}.txt"))
        return f"{in_root(line, root)} --gpus 0 --dry-run > {paper_out[-1]} 2>&1"
    return in_root(line, root) + (" " + EXTRA[program] if program in EXTRA else "")


def quickstart_lines():
    return [line for heading in (TRANSLATION, LANGUAGE_MODEL)
            for block in code_blocks(section(README, heading)) for line in logical_lines(block)]


def test_quickstart_steps():
    """The quick start keeps every step a newcomer needs, in this order."""
    programs = [tool(line) for line in quickstart_lines()]
    steps = [p for p in programs if p.startswith(("fairseq-", "subword-nmt", "sacremoses", "examples/"))]
    assert steps == [
        "sacremoses", "subword-nmt", "subword-nmt", "fairseq-preprocess", "fairseq-train",
        "fairseq-train", "fairseq-generate", "examples/translation/train-anthe.sh",
        "examples/translation/train-subformer.sh", "fairseq-preprocess", "fairseq-train",
        "fairseq-eval-lm", "fairseq-train", "fairseq-train", "fairseq-train",
        "examples/lm/train-stlm.sh"]
    text = "\n".join(quickstart_lines())
    assert "--joined-dictionary" in text  # subformer_base shares all embeddings
    archs = re.findall(r"--arch (\S+)", text)
    assert {"anthe_base", "subformer_base", "stlm_tied", "anthe_lm_gpt2_small", "skipless_lm",
            "slim_lm"} <= set(archs)
    assert len(code_blocks(section(README, PYTHON), "python")) == 1
    # what the quick starts write stays out of git, as the README says
    written = {m for m in re.findall(r"(?<![\w/.-])(mydata|data-bin|checkpoints)/", text)}
    proc = subprocess.run(["git", "check-ignore", "--no-index", *(f"{w}/x" for w in sorted(written))],
                          cwd=REPO, capture_output=True, text=True)
    assert written == {"mydata", "data-bin", "checkpoints"} and \
        len(proc.stdout.split()) == len(written), proc.stdout


@pytest.mark.slow
def test_quickstart_runs_on_a_small_corpus(tmp_path):
    make_corpus(tmp_path)
    paper_out = []
    lines = [script_line(line, tmp_path, paper_out) for line in quickstart_lines()]
    script = "set -euxo pipefail\n" + "\n".join(lines) + "\n"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PATH=BIN + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    # the joined dictionary, both translation models scored, the LM evaluated
    data_bin = tmp_path / "data-bin" / "mydata"
    assert (data_bin / "dict.en.txt").read_text() == (data_bin / "dict.de.txt").read_text()
    assert len(re.findall(r"^Generate test with beam=5: BLEU = \d", proc.stdout, re.M)) == 2, \
        out[-4000:]
    for model in ("anthe", "subformer"):  # the D- lines: detokenized text, as the README says
        written = (tmp_path / "checkpoints" / model / "test.out").read_text(encoding="utf-8")
        hypotheses = re.findall(r"^D-\d+\t\S+\t(.*)$", written, re.M)
        assert len(hypotheses) == 21 and not any("@@" in h or " ." in h for h in hypotheses), \
            hypotheses
    assert re.search(r"Loss \(base 2\): [\d.]+, Perplexity: [\d.]+", out)
    for model in ("anthe", "subformer", "stlm", "anthe_lm", "skipless", "subformer_lm"):
        assert (tmp_path / "checkpoints" / model / "checkpoint_best.pt").is_file()

    # the paper-size recipes: the fairseq-train command each prints builds the paper's model
    expected = {"anthe_base": 512, "subformer_base": 512, "stlm_tied": 528}
    assert len(paper_out) == len(expected)
    for path in paper_out:
        with open(path, encoding="utf-8") as f:
            printed = [line for line in f.read().splitlines()
                       if line.startswith("+ fairseq-train ")]
        assert len(printed) == 1, path
        args = parse_train_args(shlex.split(printed[0])[2:])
        assert args.decoder_embed_dim == expected.pop(args.arch)
        from fairseq import tasks
        model = tasks.setup_task(args).build_model(args)
        assert sum(p.numel() for p in model.parameters()) > 1_000_000
    assert not expected

    # the Python snippet, on the checkpoints the commands above wrote
    (snippet,) = code_blocks(section(README, PYTHON), "python")
    check = ("\nimport json\ntranslation = mt.translate('The cat is small.', beam=2, max_len_b=6)\n"
             "print('RESULT', json.dumps([mt.cfg.model.arch, lm.cfg.model.arch, translation]))\n")
    code = in_root(snippet, tmp_path).replace("beam=5)", "beam=5, max_len_a=0, max_len_b=6)")
    proc = subprocess.run([os.path.join(BIN, "python"), "-c", code + check], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result[:2] == ["anthe_base", "stlm_tied"] and isinstance(result[2], str)
