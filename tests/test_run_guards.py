"""What a training must not start with, and whose save-dir it is, through the commands a user
runs: ``fairseq-train --user-dir slim_fairseq``, the train recipes and ``evaluate.sh``.

* Values that cannot train (slim_fairseq/run_checks.py), refused in one line before anything is
  written: learning rates <= 0, negative limits, empty samples, batches smaller than a sample, a
  truncated ``.bin``, two dictionaries with ``--share-all-embeddings``, a save-dir that is a
  file, lies under one or cannot be written.
* One run per save-dir (slim_fairseq/save_dir_lock.py): a second training into a save-dir in use
  is refused naming the first; the lock of a killed run is taken over with a note.
* evaluate.sh scores references only when they are the test set's sentences.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import BIN, REPO, TOOL_ENV, ende_data_bin, parse_train_args, wikitext_data_bin  # noqa: E402

ENV = TOOL_ENV
PLUGIN = ["--user-dir", os.path.join(REPO, "slim_fairseq")]
# a language model of a few thousand weights: parsing and the checks are what the cases time
LM = ["--task", "language_modeling", "--arch", "slim_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
      "--decoder-ffn-embed-dim", "48", "--cpu", "--optimizer", "adam", "--num-workers", "0",
      "--tokens-per-sample", "16", "--max-tokens", "256", "--max-update", "1"]
MT = ["--task", "translation", "--arch", "anthe_base", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
      "--encoder-layers", "1", "--encoder-attention-heads", "4", "--decoder-embed-dim", "32",
      "--decoder-ffn-embed-dim", "48", "--decoder-layers", "1", "--decoder-attention-heads", "4", "--cpu",
      "--optimizer", "adam", "--lr", "1e-3", "--num-workers", "0", "--max-tokens", "256", "--max-update", "1"]

SUBFORMER = ["--task", "translation", "--arch", "subformer_base", "--encoder-embed-dim", "32",
             "--encoder-ffn-embed-dim", "48", "--encoder-layers", "3", "--encoder-attention-heads", "4",
             "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48", "--decoder-layers", "3",
             "--decoder-attention-heads", "4", "--safe-embed-dim", "16", "--sandwich-dim", "48",
             "--sandwich-ffn-dim", "64", "--sandwich-heads", "4", "--cpu", "--optimizer", "adam", "--lr", "1e-3",
             "--num-workers", "0", "--max-tokens", "256", "--max-update", "1"]


def _data_bins(tmp_path):
    """{lm}, {ende}, and copies of them (links to their files) with valid.bin truncated
    ({truncated}) and with a target dictionary of its own ({twodicts}); {tmp}: the test's folder."""
    lm, ende = wikitext_data_bin(), ende_data_bin()
    found = {"{lm}": lm, "{ende}": ende, "{tmp}": str(tmp_path)}
    for name, source, own in (("truncated", lm, "valid.bin"), ("twodicts", ende, "dict.de.txt")):
        folder = tmp_path / name
        folder.mkdir()
        for entry in os.listdir(source):
            if entry != own:
                os.symlink(os.path.join(source, entry), folder / entry)
        found["{" + name + "}"] = str(folder)
    with open(os.path.join(lm, "valid.bin"), "rb") as f:
        (tmp_path / "truncated" / "valid.bin").write_bytes(f.read()[:1000])
    with open(os.path.join(ende, "dict.de.txt"), encoding="utf-8") as f:
        entries = f.read().splitlines(keepends=True)
    (tmp_path / "twodicts" / "dict.de.txt").write_text("".join(entries[:-1]), encoding="utf-8")
    (tmp_path / "afile").write_text("not a folder\n")
    return found


def _filled(words, found):
    for placeholder, path in found.items():
        words = [w.replace(placeholder, path) for w in words]
    return words


def _train(argv, cwd, **kwargs):
    return subprocess.run([os.path.join(BIN, "fairseq-train"), *argv], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=300, **kwargs)


# (the data-bin, the options after the plugin's, the line fairseq-train must end in, exactly)
REFUSED = [
    ("{lm}", LM + ["--lr=-1e-3"],
     "fairseq-train: error: --lr=-0.001: a learning rate must be > 0 (the updates would not move, or move away "
     "from the minimum); allowed: --lr N, N > 0 (e.g. 0.0005)"),
    ("{lm}", LM + ["--lr", "0"],
     "fairseq-train: error: --lr=0: a learning rate must be > 0 (the updates would not move, or move away from "
     "the minimum); allowed: --lr N, N > 0 (e.g. 0.0005)"),
    # fairseq reads --max-update 0 and --max-epoch 0 as "no limit" (fairseq_cli/train.py:
    # `max_update or math.inf`): only negative limits are refused (0 is accepted below)
    ("{lm}", LM + ["--max-update", "-5"],
     "fairseq-train: error: --max-update=-5: a limit below 0, with which fairseq stops after the first update; "
     "allowed: --max-update N, N >= 1, or --max-update 0 (no limit)"),
    ("{lm}", LM + ["--max-epoch", "-1"],
     "fairseq-train: error: --max-epoch=-1: a limit below 0, with which fairseq trains no epoch; allowed: "
     "--max-epoch N, N >= 1, or --max-epoch 0 (no limit)"),
    ("{lm}", LM + ["--tokens-per-sample", "0"],
     "fairseq-train: error: --tokens-per-sample=0: a sample holds at least one token; allowed: "
     "--tokens-per-sample N, N >= 1"),
    ("{lm}", LM + ["--update-freq", "0"],
     "fairseq-train: error: --update-freq=0: not a whole number >= 1; allowed: --update-freq 1"),
    # blocks of 64 tokens, batches of 32: fairseq skips every training sample, then stops with
    # an IndexError
    ("{lm}", LM + ["--tokens-per-sample", "64", "--max-tokens", "32"],
     "fairseq-train: error: --max-tokens=32: every training sample is longer (the shortest holds 64 tokens), "
     "and fairseq skips those; allowed: --max-tokens N, N >= 64"),
    # the longest validation sentence holds 45 tokens; --skip-invalid-size-inputs-valid-test drops
    # only samples longer than the model's positions, and fairseq's batching asserts on it
    ("{ende}", MT + ["--max-tokens", "44", "--skip-invalid-size-inputs-valid-test"],
     "fairseq-train: error: --max-tokens=44: the validation data holds a sample of 45 tokens, which no "
     "validation batch could hold; allowed: --max-tokens N, N >= 45, or --max-tokens-valid 45"),
    ("{truncated}", LM,
     "fairseq-train: error: DATA={truncated}: valid.bin holds 1000 bytes, and valid.idx describes 155894 (a "
     "truncated file); allowed: the data-bin binarized again (fairseq-preprocess)"),
    # subformer_base shares all embeddings; fairseq would stop with a traceback after creating the
    # save-dir
    ("{twodicts}", SUBFORMER,
     "fairseq-train: error: --share-all-embeddings: one embedding table for both languages needs one dictionary, "
     "and DATA={twodicts} has two (dict.en.txt and dict.de.txt: 1124 and 1123 entries); allowed: a data-bin of "
     "fairseq-preprocess --joined-dictionary, or an arch and options without --share-all-embeddings"),
    ("{lm}", LM + ["--save-dir", "{tmp}/afile"],
     "fairseq-train: error: --save-dir={tmp}/afile: a file, and the checkpoints need a folder; allowed: a "
     "--save-dir that is a folder or does not exist yet"),
    ("{lm}", LM + ["--save-dir", "{tmp}/afile/run"],
     "fairseq-train: error: --save-dir={tmp}/afile/run: lies under {tmp}/afile, which is a file; allowed: a "
     "--save-dir that is a folder or does not exist yet"),
    # /proc takes no files, even from root (for whom a read-only mode is no obstacle)
    ("{lm}", LM + ["--save-dir", "/proc/slim-fairseq-run/checkpoints"],
     "fairseq-train: error: --save-dir=/proc/slim-fairseq-run/checkpoints: cannot be written (/proc cannot be "
     "written); allowed: a --save-dir in a folder you can write"),
]


# fairseq-train's entry point run once per command line, each in a process forked from one that
# imported fairseq and the plugin already (the imports are most of a refusal's time): the child
# ends as the interpreter would (an uncaught SystemExit's status, or the excepthook the plugin sets
# for any other error: one line and status 2 for a refusal, a traceback otherwise)
FORKED_TRAIN = r"""
import json, os, sys
import fairseq_cli.train
from fairseq import utils
import argparse
utils.import_user_module(argparse.Namespace(user_dir=sys.argv[1]))
results = []
for argv, err in json.loads(sys.stdin.read()):
    pid = os.fork()
    if pid == 0:
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        sys.argv = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), *argv]
        code = 0
        try:
            fairseq_cli.train.cli_main()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            try:  # what Python does with an uncaught error: the hook the plugin set
                sys.excepthook(*sys.exc_info())
                code = 1
            except SystemExit as stop:
                code = stop.code
        sys.stderr.flush()
        os._exit(code or 0)
    results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(results))
"""


def _train_each(commands, folder):
    """(exit status, stderr) of fairseq-train for each command line of ``commands``."""
    import json
    errs = [str(folder / f"stderr{i}.txt") for i in range(len(commands))]
    proc = subprocess.run([sys.executable, "-c", FORKED_TRAIN, PLUGIN[1]], input=json.dumps(list(zip(commands, errs))),
                          capture_output=True, text=True, env=ENV, cwd=folder, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = json.loads(proc.stdout.splitlines()[-1])
    outputs = []
    for err in errs:
        with open(err, encoding="utf-8") as f:
            outputs.append(f.read())
        os.remove(err)
    return list(zip(statuses, outputs))


def test_fairseq_train_refuses_what_cannot_train(tmp_path):
    """Each command line of REFUSED ends in its one line, without a traceback, and leaves no
    save-dir behind."""
    found = _data_bins(tmp_path)
    before = sorted(os.listdir(tmp_path))
    commands = []
    for data, argv, _ in REFUSED:
        argv = _filled([data, *PLUGIN, *argv], found)
        if "--save-dir" not in argv:
            argv += ["--save-dir", str(tmp_path / "checkpoints")]
        commands.append(argv)
    for (status, err), (_, argv, line) in zip(_train_each(commands, tmp_path), REFUSED):
        errors = [row for row in err.splitlines() if ": error: " in row]
        assert status != 0 and "Traceback" not in err and errors == _filled([line], found), (argv, err[-3000:])
    assert sorted(os.listdir(tmp_path)) == before  # nothing written: no save-dir


@pytest.mark.parametrize("data, argv, line", [REFUSED[0], REFUSED[-3]], ids=["lr", "save-dir a file"])
def test_fairseq_train_script_refuses_what_cannot_train(data, argv, line, tmp_path):
    """Two of REFUSED through the fairseq-train script itself."""
    found = _data_bins(tmp_path)
    before = sorted(os.listdir(tmp_path))
    argv = _filled([data, *PLUGIN, *argv], found)
    if "--save-dir" not in argv:
        argv += ["--save-dir", str(tmp_path / "checkpoints")]
    proc = _train(argv, tmp_path)
    errors = [row for row in proc.stderr.splitlines() if ": error: " in row]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == _filled([line], found)
    assert sorted(os.listdir(tmp_path)) == before


def test_limits_that_mean_no_limit_and_batches_that_hold_every_sample_pass(tmp_path):
    """--max-update 0 and --max-epoch 0 are fairseq's "no limit"; --max-tokens equal to the
    longest validation sample holds it."""
    from slim_fairseq import run_checks
    args = parse_train_args([ende_data_bin(), *PLUGIN, *MT, "--max-update", "0", "--max-epoch", "0", "--max-tokens",
                             "45", "--save-dir", str(tmp_path / "run")])
    run_checks.check_values(args)
    run_checks.check_data_files(args)
    run_checks.check_save_dir(args.save_dir)
    assert not os.path.exists(tmp_path / "run")


def _recipe(script, *argv, cwd):
    return subprocess.run(["bash", os.path.join(REPO, "examples", script), *argv], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=300)


@pytest.mark.parametrize("argv, line", [
    # a negative number is the option's value, not "needs a value"
    (["--lr", "-1e-3"],
     "train-anthe.sh: error: --lr=-0.001: a learning rate must be > 0 (the updates would not move, or move away "
     "from the minimum); allowed: --lr N, N > 0 (e.g. 0.0005)"),
    (["--max-update", "-5"],
     "train-anthe.sh: error: --max-update=-5: a limit below 0, with which fairseq stops after the first update; "
     "allowed: --max-update N, N >= 1, or --max-update 0 (no limit)"),
    (["--save-dir", "{tmp}/afile/run"],
     "train-anthe.sh: error: --save-dir={tmp}/afile/run: lies under {tmp}/afile, which is a file; allowed: a "
     "--save-dir that is a folder or does not exist yet"),
], ids=["lr negative", "max-update negative", "save-dir under a file"])
def test_train_recipe_dry_run_refuses_what_cannot_train(argv, line, tmp_path):
    found = _data_bins(tmp_path)
    before = sorted(os.listdir(tmp_path))
    proc = _recipe("translation/train-anthe.sh", found["{ende}"], "--cpu-smoke", "--dry-run",
                   *_filled(argv, found), cwd=tmp_path)
    assert proc.returncode != 0 and proc.stderr.splitlines() == _filled([line], found), proc.stderr[-3000:]
    assert "+ fairseq-train" not in proc.stdout
    assert sorted(os.listdir(tmp_path)) == before


def _owner(save_dir):
    with open(os.path.join(save_dir, "run.lock"), encoding="utf-8") as f:
        return f.read().strip()


def test_one_run_per_save_dir_and_a_killed_runs_lock_is_taken_over(tmp_path):
    """A training holds its save-dir: a second fairseq-train and a train recipe into it are
    refused naming its pid; once it is killed (SIGKILL: no chance to clean up), the next run
    takes the save-dir over with a note, trains and leaves no lock file."""
    save_dir = tmp_path / "run"
    argv = [wikitext_data_bin(), *PLUGIN, *LM, "--save-dir", str(save_dir)]
    # no checkpoint while the test runs (else the recipe would refuse the save-dir for the model
    # it holds, when the first run reaches an epoch's end before the recipe's checks)
    first = subprocess.Popen([os.path.join(BIN, "fairseq-train"), *argv, "--max-update", "1000000",
                              "--save-interval", "1000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (save_dir / "run.lock").is_file() or not _owner(save_dir):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.2)
        owner = _owner(save_dir)
        pid, host, started = re.fullmatch(r"pid=(\d+) host=(\S+) started=(\S+)", owner).groups()
        assert int(pid) == first.pid and host == socket.gethostname()
        held = f"pid {pid} on {host}, started {started}"
        second = _train(argv, tmp_path)
        assert second.returncode != 0 and [row for row in second.stderr.splitlines() if ": error: " in row] == [
            f"fairseq-train: error: --save-dir={save_dir}: in use by another training ({held}), whose checkpoints "
            "this run would overwrite; allowed: a --save-dir of its own, or the same one after that training ends"]
        recipe = _recipe("lm/train-stlm.sh", wikitext_data_bin(), "--cpu-smoke", "--save-dir", str(save_dir),
                         cwd=tmp_path)
        assert recipe.returncode != 0 and recipe.stderr.splitlines()[-1] == (
            f"train-stlm.sh: error: --save-dir={save_dir}: in use by another training ({held}), whose checkpoints "
            "this run would overwrite; allowed: a --save-dir of its own, or the same one after that training ends")
        assert _owner(save_dir) == owner and not (save_dir / "recipe.data").exists()
        assert first.poll() is None  # the first run went on
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert _owner(save_dir) == owner  # left behind by the killed run
    third = _train([*argv, "--max-update", "1", "--reset-dataloader", "--reset-optimizer", "--reset-meters",
                    "--reset-lr-scheduler"], tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    notes = [row for row in third.stderr.splitlines() if ": note: " in row]
    assert notes == [f"fairseq-train: note: --save-dir={save_dir}: taken over from a training that ended without "
                     f"releasing it ({held})"]
    assert (save_dir / "checkpoint_last.pt").is_file() and not (save_dir / "run.lock").exists()


def _short(line):
    return line if len(line) <= 60 else line[:57] + "..."


def test_evaluation_refuses_references_that_are_not_the_test_sets(tmp_path):
    """A reference line deleted and another appended keep the count: the first line that is not
    the binarized target sentence is named, before anything is translated or written."""
    from recipes_fixtures import stand_in_checkpoint
    ende = ende_data_bin()
    data = tmp_path / "data"
    data.mkdir()
    for entry in os.listdir(ende):
        if entry != "test.raw.de":
            os.symlink(os.path.join(ende, entry), data / entry)
    with open(os.path.join(ende, "test.raw.de"), encoding="utf-8") as f:
        refs = f.read().splitlines(keepends=True)
    (data / "test.raw.de").write_text("".join(refs[:4] + refs[5:] + ["Ein Satz, der nicht dazu gehört.\n"]),
                                      encoding="utf-8")
    ckpt = stand_in_checkpoint(tmp_path / "ckpt" / "checkpoint_best.pt", "anthe_base", "translation",
                               source_lang="en", target_lang="de")
    proc = _recipe("translation/evaluate.sh", str(data), str(ckpt), "--lenpens", "1.0", cwd=tmp_path)
    assert proc.returncode != 0 and proc.stderr.splitlines() == [
        f"evaluate.sh: error: {data}/test.raw.de: line 5 is not the target sentence 5 of the binarized test split "
        f"('{_short(refs[5].strip())}', and the data-bin holds 'Ich habe mich anders entschlossen .'): the "
        "references are not the test set's; allowed: the test.raw.de written with the data-bin (one line per "
        "sentence, in its order)"], proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint_best.pt"]
