"""A checkpoint knows its data (slim_fairseq/data_record.py): every command that reads a
checkpoint with a data-bin refuses another dictionary (a shuffled dict.txt of the same size, or
one of another size) in one line, before anything is written; the same data-bin still works;
averaging refuses checkpoints of different runs unless asked to on purpose. Each case goes
through the command a user runs."""
import json
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from helpers import BIN, REPO, TOOL_ENV, USER_DIR, ende_data_bin, wikitext_data_bin

pytestmark = pytest.mark.slow  # fairseq-train and the tools, each in its own process

ENV = TOOL_ENV
TINY_LM = ["--task", "language_modeling", "--tokens-per-sample", "16", "--arch", "slim_lm",
           "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
           "--decoder-attention-heads", "2"]
TINY_MT = ["--task", "translation", "--source-lang", "en", "--target-lang", "de", "--arch",
           "slim_transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim",
           "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim",
           "16", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TRAIN = ["--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--num-workers", "0",
         "--log-format", "none", "--no-epoch-checkpoints"]


def tool(name, *argv, cwd=None):
    return subprocess.run([os.path.join(BIN, name), *map(str, argv)], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=600)


def recipe(script, *argv, cwd):
    return subprocess.run(["bash", os.path.join(REPO, "examples", script), *map(str, argv)],
                          capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)


def trained(proc):
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc


def refused(proc):
    """The last line of a command that must have refused (exit status 2, a refusal's)."""
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def entries(path):
    """The words of a dict file in order, after fairseq's 4 special symbols."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip().rsplit(" ", 1)[0] for line in f]


def data_bin_copy(source, folder, dict_name, change):
    """A copy of data-bin ``source`` (its files linked) whose ``dict_name`` has ``change``
    applied to its lines."""
    os.makedirs(folder)
    for name in os.listdir(source):
        if name != dict_name:
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
    with open(os.path.join(source, dict_name), encoding="utf-8") as f:
        lines = f.read().splitlines()
    with open(os.path.join(folder, dict_name), "w", encoding="utf-8") as f:
        f.write("\n".join(change(lines)) + "\n")
    return str(folder)


def shuffled(lines):
    lines = list(lines)
    random.Random(0).shuffle(lines)
    return lines


def first_difference(data, other, dict_name):
    ours, theirs = entries(os.path.join(other, dict_name)), entries(os.path.join(data, dict_name))
    index = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    return index + 4, ours[index], theirs[index]


def mismatch_line(prog, data, other, dict_name, checkpoint, otherwise="a checkpoint trained on this data-bin",
                  hint=None):
    """The one line ``prog`` must print for ``checkpoint`` (trained on ``data``, whose path it
    recorded as ``hint``) read with data-bin ``other``."""
    ours, theirs = entries(os.path.join(other, dict_name)), entries(os.path.join(data, dict_name))
    if len(ours) != len(theirs):
        what = f"{len(ours) + 4} entries here, {len(theirs) + 4} in the checkpoint's"
    else:
        index, here, there = first_difference(data, other, dict_name)
        what = f"the same size, {len(ours) + 4}; entry {index} is {here!r} here, {there!r} in the checkpoint's"
    return (f"{prog}: error: {os.path.join(other, dict_name)}: another dictionary than the one {checkpoint} was "
            f"trained with ({what}); allowed: the data-bin {checkpoint} was trained with "
            f"({hint or os.path.abspath(data)}), or {otherwise}")


def run_of(path):
    from slim_fairseq_lab import checkpoints
    return checkpoints.run_of(path, checkpoints.load(path))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny slim_lm trained twice (two runs, A with a checkpoint per update) and copies of its
    data-bin with dict.txt shuffled and one entry shorter."""
    tmp = tmp_path_factory.mktemp("fingerprint-lm")
    data = wikitext_data_bin()
    trained(tool("fairseq-train", data, "--user-dir", USER_DIR, *TINY_LM, *TRAIN, "--max-update", "2",
                 "--save-interval-updates", "1", "--save-dir", tmp / "a"))
    trained(tool("fairseq-train", data, "--user-dir", USER_DIR, *TINY_LM, *TRAIN, "--max-update", "1",
                 "--save-interval-updates", "1", "--save-dir", tmp / "b"))
    return {"tmp": tmp, "data": data, "a": str(tmp / "a"), "b": str(tmp / "b"),
            "shuffled": data_bin_copy(data, tmp / "shuffled", "dict.txt", shuffled),
            "shorter": data_bin_copy(data, tmp / "shorter", "dict.txt", lambda lines: lines[:-1])}


def test_lm_tools_refuse_another_dictionary(lm):
    """fairseq-eval-lm with a shuffled dict.txt of the same size (today: a perplexity of the
    wrong words) and with a shorter one; fairseq-train --restore-file; evaluate-lm.sh; the
    export and the hub: one line each, naming the data-bin's dict.txt, the checkpoint and the
    first difference; nothing written. The same data-bin still evaluates."""
    data, ckpt = lm["data"], os.path.join(lm["a"], "checkpoint_last.pt")
    for other in (lm["shuffled"], lm["shorter"]):
        proc = tool("fairseq-eval-lm", other, "--user-dir", USER_DIR, "--path", ckpt, "--cpu",
                    "--tokens-per-sample", "16")
        assert refused(proc) == mismatch_line("fairseq-eval-lm", data, other, "dict.txt", ckpt)
    ok = trained(tool("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", ckpt, "--cpu",
                      "--tokens-per-sample", "16"))
    assert re.search(r"Perplexity: [0-9.]+", ok.stdout + ok.stderr)

    save_dir = lm["tmp"] / "restored"
    proc = tool("fairseq-train", lm["shuffled"], "--user-dir", USER_DIR, *TINY_LM, *TRAIN, "--max-update", "3",
                "--save-dir", save_dir, "--restore-file", ckpt)
    assert refused(proc) == mismatch_line("fairseq-train", data, lm["shuffled"], "dict.txt", ckpt)
    assert not save_dir.exists() or not list(save_dir.glob("*.pt"))

    proc = recipe("lm/evaluate-lm.sh", lm["shuffled"], ckpt, "--cpu", cwd=lm["tmp"])
    assert refused(proc) == mismatch_line("evaluate-lm.sh", data, lm["shuffled"], "dict.txt", ckpt)
    assert not os.path.exists(os.path.join(lm["a"], "eval"))

    out = lm["tmp"] / "hf"
    proc = tool("slim-fairseq-export-hf", ckpt, lm["shuffled"], out)
    assert refused(proc) == mismatch_line("slim-fairseq-export-hf", data, lm["shuffled"], "dict.txt", ckpt)
    assert not out.exists() and not list(lm["tmp"].glob(".hf*"))

    hub = ("import sys; from slim_fairseq.models.slim_lm import SlimLanguageModel; "
           "SlimLanguageModel.from_pretrained(sys.argv[1], 'checkpoint_last.pt', data_name_or_path=sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", hub, lm["a"], lm["shuffled"]], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert refused(proc) == mismatch_line("-c", data, lm["shuffled"], "dict.txt", ckpt)


def test_a_resumed_training_keeps_its_run(lm):
    """The run id is made when a training starts and kept when it resumes from its own
    checkpoint; another training is another run."""
    resumed = lm["tmp"] / "resumed"
    shutil.copytree(lm["a"], resumed)
    before = run_of(os.path.join(lm["a"], "checkpoint_last.pt"))
    trained(tool("fairseq-train", lm["data"], "--user-dir", USER_DIR, *TINY_LM, *TRAIN, "--max-update", "3",
                 "--save-dir", resumed))
    assert run_of(str(resumed / "checkpoint_last.pt")) == before
    assert run_of(os.path.join(lm["a"], "checkpoint_1_1.pt")) == before
    assert run_of(os.path.join(lm["b"], "checkpoint_last.pt")) not in (None, before)


def test_averaging_refuses_checkpoints_of_two_runs(lm):
    """average_checkpoints.py: two runs refused in one line (the message always said "allowed:
    checkpoints of one run"); one run's checkpoints accepted; --allow-several-runs averages two
    runs on purpose. evaluate-lm.sh --avg over a folder holding two runs is refused too."""
    script = os.path.join(REPO, "scripts", "average_checkpoints.py")
    a1, a2 = os.path.join(lm["a"], "checkpoint_1_1.pt"), os.path.join(lm["a"], "checkpoint_1_2.pt")
    b1 = os.path.join(lm["b"], "checkpoint_1_1.pt")
    out = lm["tmp"] / "avg.pt"

    def average(*argv):
        return subprocess.run([sys.executable, script, *map(str, argv), "--quiet"], capture_output=True,
                              text=True, env=ENV, timeout=600)

    proc = average("--inputs", a2, b1, "--output", out)
    assert refused(proc) == (
        f"average_checkpoints: error: --inputs: {b1} is a checkpoint of another run than {a2} (run {run_of(b1)[:8]}, and "
        f"{run_of(a2)[:8]}): independently trained models do not average to a model; allowed: checkpoints of one "
        "run, or --allow-several-runs to average them on purpose")
    assert not out.exists()
    trained(average("--inputs", a1, a2, "--output", out))
    assert run_of(str(out)) == run_of(a1)
    out.unlink()
    trained(average("--inputs", a2, b1, "--output", out, "--allow-several-runs"))
    assert out.is_file()
    assert "--allow-several-runs" in subprocess.run([sys.executable, script, "--help"], capture_output=True,
                                                    text=True, env=ENV).stdout

    mixed = lm["tmp"] / "mixed"
    mixed.mkdir()
    shutil.copy(a1, mixed / "checkpoint_1_1.pt")
    shutil.copy(b1, mixed / "checkpoint_1_2.pt")
    proc = recipe("lm/evaluate-lm.sh", lm["data"], mixed, "--avg", "2", "--cpu", cwd=lm["tmp"])
    assert refused(proc) == (
        f"evaluate-lm.sh: error: --avg=2: {mixed}/checkpoint_1_1.pt is a checkpoint of another run than "
        f"{mixed}/checkpoint_1_2.pt (run {run_of(a1)[:8]}, and {run_of(b1)[:8]}): independently trained models "
        "do not average to a model; allowed: --avg 1 (one checkpoint), or a folder of one run's checkpoints")
    assert sorted(os.listdir(mixed)) == ["checkpoint_1_1.pt", "checkpoint_1_2.pt"]


def test_translation_tools_refuse_another_dictionary(tmp_path):
    """fairseq-generate and evaluate.sh with a shuffled target dictionary, fairseq-generate with
    a shorter source dictionary: one line each, nothing written; the same data-bin translates."""
    data = ende_data_bin()
    trained(tool("fairseq-train", data, "--user-dir", USER_DIR, *TINY_MT, *TRAIN, "--max-tokens", "2048", "--max-update", "1",
                 "--save-dir", tmp_path / "mt"))
    ckpt = str(tmp_path / "mt" / "checkpoint_last.pt")
    other = data_bin_copy(data, tmp_path / "shuffled", "dict.de.txt", shuffled)
    shorter = data_bin_copy(data, tmp_path / "shorter", "dict.en.txt", lambda lines: lines[:-1])
    generate = ["--user-dir", USER_DIR, "--path", ckpt, "--cpu", "--source-lang", "en", "--target-lang", "de",
                "--beam", "1", "--max-len-b", "2", "--gen-subset", "valid", "--max-sentences", "4"]
    assert refused(tool("fairseq-generate", other, *generate)) == mismatch_line(
        "fairseq-generate", data, other, "dict.de.txt", ckpt)
    assert refused(tool("fairseq-generate", shorter, *generate)) == mismatch_line(
        "fairseq-generate", data, shorter, "dict.en.txt", ckpt)
    assert "H-0\t" in trained(tool("fairseq-generate", data, *generate)).stdout
    proc = recipe("translation/evaluate.sh", other, ckpt, "--cpu", cwd=tmp_path)
    assert refused(proc) == mismatch_line("evaluate.sh", data, other, "dict.de.txt", ckpt)
    assert not (tmp_path / "mt" / "eval").exists()


def test_fairseq_models_of_a_recipe_are_checked_through_its_save_dir(tmp_path):
    """fairseq's own transformer_lm carries no record in its checkpoints: the train recipe
    writes the record beside them (data_record.json); evaluate-lm.sh compares it, and so does the
    train recipe resuming the save-dir after the data-bin's dict.txt was rewritten in place."""
    data = data_bin_copy(wikitext_data_bin(), tmp_path / "data", "dict.txt", lambda lines: lines)
    save_dir = tmp_path / "flm"
    tiny = ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
            "--decoder-attention-heads", "2"]
    trained(recipe("lm/train-stlm.sh", data, "--arch", "transformer_lm", "--cpu-smoke", "--save-dir", save_dir,
                   *tiny, cwd=tmp_path))
    with open(save_dir / "data_record.json", encoding="utf-8") as f:
        assert json.load(f)["dictionaries"]["dictionary"]["size"] == len(entries(os.path.join(data, "dict.txt"))) + 4
    other = data_bin_copy(data, tmp_path / "shuffled", "dict.txt", shuffled)
    ckpt = str(save_dir / "checkpoint_best.pt")
    proc = recipe("lm/evaluate-lm.sh", other, save_dir, "--cpu", cwd=tmp_path)
    assert refused(proc) == mismatch_line("evaluate-lm.sh", data, other, "dict.txt", ckpt,
                                          hint=os.path.realpath(data))
    assert not (save_dir / "eval").exists()

    kept = {name: os.path.getmtime(save_dir / name) for name in os.listdir(save_dir)}
    original = tmp_path / "original"
    data_bin_copy(data, original, "dict.txt", lambda lines: lines)
    os.replace(os.path.join(other, "dict.txt"), os.path.join(data, "dict.txt"))
    proc = recipe("lm/train-stlm.sh", data, "--arch", "transformer_lm", "--cpu-smoke", "--save-dir", save_dir,
                  *tiny, cwd=tmp_path)
    assert refused(proc) == mismatch_line("train-stlm.sh", original, data, "dict.txt", f"the run in {save_dir}",
                                          "a --save-dir of its own for this data-bin", os.path.realpath(data))
    assert {name: os.path.getmtime(save_dir / name) for name in os.listdir(save_dir)} == kept
