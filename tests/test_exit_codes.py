"""How every command of the project ends, through the command a user runs: a refusal is one
line and exit status 2 (argparse's), Ctrl-C is one line and 130 (128 + SIGINT); an output that
exists is replaced only with --force; what a refusal proposes is accepted when applied."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import BIN, REPO, TOOL_ENV, sigint_at_default, wikitext_data_bin

FIXTURES = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0")
PLUGIN = os.path.join(REPO, "slim_fairseq")
SCRIPTS = os.path.join(REPO, "scripts")
ENV = TOOL_ENV
TINY_LM = ["--task", "language_modeling", "--tokens-per-sample", "32", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--num-workers", "0", "--cpu",
           "--log-format", "simple", "--log-interval", "1"]


def run(argv, cwd=None, timeout=300):
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout)


def refusal(proc, prog):
    """The one line a refused command ended with (exit status 2, no traceback; fairseq's own
    tools may log INFO lines before it)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0], proc.stderr[-3000:]
    assert errors[0].startswith(f"{prog}: error: "), errors[0]
    return errors[0].split(": error: ", 1)[1]


def only_line(proc, prog):
    """The refusal of a command that says nothing else: one line on stderr, nothing on stdout."""
    line = refusal(proc, prog)
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    return line


def script(name, *argv, cwd=None):
    return run([sys.executable, os.path.join(SCRIPTS, name), *map(str, argv)], cwd=cwd)


# ------------------------------------------------------------------------------ refusals: 2

def test_a_refusal_is_a_value_error_in_python():
    """In Python a refusal is caught as a ValueError; it never ends the interpreter by itself."""
    from slim_fairseq.arch_help import preset_values
    from slim_fairseq.option_errors import OptionError
    assert not issubclass(OptionError, SystemExit)
    with pytest.raises(ValueError, match="^--decoder-attention-heads=3: does not divide"):
        preset_values("slim_lm", ["--decoder-attention-heads", "3"])


def test_fairseq_train_refused_by_the_plugin_exits_2(tmp_path):
    proc = run([os.path.join(BIN, "fairseq-train"), wikitext_data_bin(), "--user-dir", PLUGIN, "--arch",
                "slim_lm", *TINY_LM, "--decoder-attention-heads", "3", "--save-dir", str(tmp_path / "run")])
    assert only_line(proc, "fairseq-train") == (
        "--decoder-attention-heads=3: does not divide --decoder-embed-dim=16; allowed: "
        "--decoder-attention-heads 4|2|8")
    assert not (tmp_path / "run").exists()


def test_a_refusal_fairseq_wraps_in_its_own_exception_exits_2(tmp_path):
    """fairseq-train resuming another model's weights: fairseq's trainer turns the plugin's refusal
    into an Exception of its own ("please ensure that the architectures match"); the command
    still ends in the plugin's one line."""
    (tmp_path / "run").mkdir()
    shutil.copy(os.path.join(FIXTURES, "stlm_tied", "checkpoint.pt"), tmp_path / "run" / "checkpoint_last.pt")
    proc = run([os.path.join(BIN, "fairseq-train"), wikitext_data_bin(), "--user-dir", PLUGIN, "--arch",
                "slim_lm", *TINY_LM, "--save-dir", str(tmp_path / "run"), "--max-update", "1"])
    assert refusal(proc, "fairseq-train").startswith("--arch=slim_lm: the checkpoint's weights are another model's")
    assert os.listdir(tmp_path / "run") == ["checkpoint_last.pt"]


def test_fairseq_generate_and_interactive_refused_by_the_plugin_exit_2():
    folder = os.path.join(FIXTURES, "anthe_base")
    line = ("--source-lang=de: the model was trained to translate en -> de, and this run reads de -> en; "
            "allowed: --source-lang en --target-lang de")
    for tool in ("fairseq-generate", "fairseq-interactive"):
        proc = run([os.path.join(BIN, tool), folder, "--path", os.path.join(folder, "checkpoint.pt"), "--task",
                    "translation", "-s", "de", "-t", "en", "--cpu", "--user-dir", PLUGIN])
        assert refusal(proc, tool) == line


def test_fairseq_eval_lm_refused_by_the_plugin_exits_2():
    proc = run([os.path.join(BIN, "fairseq-eval-lm"), os.path.join(FIXTURES, "anthe_lm"), "--path",
                os.path.join(FIXTURES, "anthe_base", "checkpoint.pt"), "--cpu", "--user-dir", PLUGIN])
    assert refusal(proc, "fairseq-eval-lm").startswith(
        "--arch=anthe_base: an encoder-decoder (translation) model cannot be used with --task language_modeling")


def test_slim_fairseq_help_refusal_exits_2():
    proc = run([os.path.join(BIN, "slim-fairseq-help"), "anthe_base", "--vocab", "x"])
    assert only_line(proc, "slim-fairseq-help").startswith("--vocab=x: not a whole number")


@pytest.mark.parametrize("name, argv, prog, line", [
    ("average_checkpoints.py", ["--inputs", "{tmp}/missing.pt", "--output", "{tmp}/avg.pt"], "average_checkpoints",
     "--inputs: {tmp}/missing.pt is not a checkpoint file"),
    ("checkpoint_info.py", ["{tmp}/missing.pt", "positions"], "checkpoint_info",
     "{tmp}/missing.pt: checkpoint not found"),
    ("export_dense.py", ["{tmp}/missing.pt", "{tmp}/out.pt"], "export_dense",
     "CHECKPOINT={tmp}/missing.pt: does not exist; allowed: a checkpoint file"),
    ("compress_checkpoint.py", ["{tmp}/missing.pt", "{tmp}/out.pt", "--tc-ff", "0.2"], "compress_checkpoint",
     "CHECKPOINT={tmp}/missing.pt: does not exist; allowed: a checkpoint file"),
    ("count_params.py", ["stlm_tide"], "count_params", None),
    ("benchmark.py", ["--no-training", "--no-generation"], None, None),
])
def test_script_refusal_exits_2_in_one_line(name, argv, prog, line, tmp_path):
    proc = script(name, *[a.replace("{tmp}", str(tmp_path)) for a in argv], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    if prog:
        assert proc.stderr.startswith(f"{prog}: error: "), proc.stderr
    if line:
        assert proc.stderr.rstrip("\n").split(": error: ", 1)[1] == line.replace("{tmp}", str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == []


def test_recipe_refusal_exits_2(tmp_path):
    proc = run(["bash", os.path.join(REPO, "examples", "lm", "train-stlm.sh"), str(tmp_path / "none")], cwd=tmp_path)
    assert only_line(proc, "train-stlm.sh").startswith(f"DATA_BIN={tmp_path}/none: not a folder")


# ---------------------------------------------------------------------------- Ctrl-C: 130

def _interrupt(argv, ready, cwd):
    """Start ``argv``, send SIGINT once a line of its stdout contains ``ready``; the process."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd,
                            preexec_fn=sigint_at_default)
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        if ready in line or time.monotonic() > deadline:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc, err


def test_fairseq_train_with_the_plugin_interrupted_exits_130(tmp_path):
    proc, err = _interrupt([os.path.join(BIN, "fairseq-train"), wikitext_data_bin(), "--user-dir", PLUGIN,
                            "--arch", "slim_lm", *TINY_LM, "--max-update", "100000", "--no-save",
                            "--save-dir", str(tmp_path / "run")], "num_updates", tmp_path)
    assert (proc.returncode, err) == (130, "fairseq-train: interrupted\n")


def test_script_interrupted_exits_130(tmp_path):
    """A script of scripts/ stopped by Ctrl-C (here while it reads a checkpoint that never ends)."""
    code = ("import sys, time; import slim_fairseq_lab.checkpoints as c; "
            "c.load = lambda *a, **k: (print('ready', flush=True), time.sleep(600)); "
            "sys.argv = ['checkpoint_info.py', 'any.pt', 'positions']; import runpy; "
            "runpy.run_path('scripts/checkpoint_info.py', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=REPO, preexec_fn=sigint_at_default)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "checkpoint_info.py: interrupted\n"), err[-2000:]


# ------------------------------------------------------------------------------- --force

@pytest.fixture(scope="module")
def transformer_lm(tmp_path_factory):
    """fairseq's own pre-norm transformer_lm after one update (what compress_checkpoint.py reads)."""
    folder = tmp_path_factory.mktemp("transformer_lm")
    proc = run([os.path.join(BIN, "fairseq-train"), wikitext_data_bin(), "--arch", "transformer_lm",
                "--decoder-normalize-before", *TINY_LM, "--max-update", "1", "--save-dir", str(folder),
                "--no-epoch-checkpoints"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder / "checkpoint_last.pt"


def _keeps_then_replaces(name, argv, out, tmp_path):
    """``name ARGV`` onto an existing ``out``: refused in one line naming it and --force, ``out``
    as it was and nothing else written; with --force it is replaced."""
    out.write_bytes(b"an unrelated file")
    before = sorted(os.listdir(tmp_path))
    proc = script(name, *argv, cwd=tmp_path)
    prog = name[:-len(".py")]
    line = only_line(proc, prog)
    assert line.startswith(f"{'--output' if prog == 'average_checkpoints' else 'OUTPUT'}={out}: exists; "
                           "allowed: --force to replace it"), line
    assert out.read_bytes() == b"an unrelated file" and sorted(os.listdir(tmp_path)) == before
    proc = script(name, *argv, "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model" in torch.load(out, weights_only=False)


def test_export_dense_replaces_an_existing_output_only_with_force(tmp_path):
    folder = tmp_path / "stlm"
    shutil.copytree(os.path.join(FIXTURES, "stlm_tied"), folder)
    _keeps_then_replaces("export_dense.py", [folder / "checkpoint.pt", tmp_path / "B.pt", "--data", folder],
                         tmp_path / "B.pt", tmp_path)


def test_average_checkpoints_replaces_an_existing_output_only_with_force(tmp_path):
    fixture = os.path.join(FIXTURES, "stlm_tied", "checkpoint.pt")
    _keeps_then_replaces("average_checkpoints.py", ["--inputs", fixture, fixture, "--output", tmp_path / "avg.pt"],
                         tmp_path / "avg.pt", tmp_path)


def test_compress_checkpoint_replaces_an_existing_output_only_with_force(transformer_lm, tmp_path):
    _keeps_then_replaces("compress_checkpoint.py", [transformer_lm, tmp_path / "tc.pt", "--tc-ff", "0.5",
                                                    "--data", wikitext_data_bin()], tmp_path / "tc.pt", tmp_path)


# ------------------------------------------------------------- what a refusal proposes works

def _apply(argv, change):
    """``argv`` with a proposed change made: a flag set to its value, given (True), or dropped
    (None) with its value."""
    argv = list(argv)
    for flag, value in change.items():
        if flag in argv:
            at = argv.index(flag)
            has_value = at + 1 < len(argv) and not argv[at + 1].startswith("--")
            del argv[at:at + 1 + has_value]
        if value is True:
            argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return argv


@pytest.mark.parametrize("arch, argv, line", [
    # a head count that does not divide the width: the divisors proposed also fit the gate
    ("slim_transformer", ["--cross-attn-gate", "kgv", "--encoder-embed-dim", "32", "--decoder-embed-dim", "33",
                          "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"],
     "--decoder-attention-heads=2: does not divide --decoder-embed-dim=33; allowed: --decoder-attention-heads 3 "
     "--cross-attn-gate none, or --decoder-attention-heads 1 --cross-attn-gate none, or "
     "--decoder-attention-heads 11 --cross-attn-gate none"),
    # H-SoftPOS and SAFE together on a preset with an output bias, which SAFE refuses
    ("anthe_base", ["--safe-embed-dim", "64"],
     "--hsoftpos-levels=2: and --safe-embed-dim are alternative input embeddings; allowed: --safe-embed-dim 0"),
    ("anthe_base", ["--hsoftpos-levels", "0", "--safe-embed-dim", "64"],
     "--output-bias: acts on the vocabulary projection, which SAFE replaces with its own path tied to the token "
     "table; allowed: --safe-embed-dim 0, or --no-output-bias"),
])
def test_every_proposal_of_a_model_refusal_is_accepted(arch, argv, line):
    from slim_fairseq.arch_help import preset_values
    proc = run([os.path.join(BIN, "slim-fairseq-help"), arch, *argv])
    assert only_line(proc, "slim-fairseq-help") == line
    with pytest.raises(ValueError) as caught:
        preset_values(arch, argv)
    assert str(caught.value) == line and caught.value.alternatives
    for change in caught.value.alternatives:
        preset_values(arch, _apply(argv, change))  # accepted: no refusal


def test_a_recipe_proposes_no_arch_it_refuses(tmp_path):
    """train-stlm.sh into a save-dir holding a translation model: the refusal proposes a save-dir
    of its own (not the translation arch, which the recipe refuses), and that is accepted."""
    save = tmp_path / "mt"
    save.mkdir()
    shutil.copy(os.path.join(FIXTURES, "anthe_base", "checkpoint.pt"), save / "checkpoint_last.pt")
    recipe = os.path.join(REPO, "examples", "lm", "train-stlm.sh")
    proc = run(["bash", recipe, wikitext_data_bin(), "--save-dir", str(save), "--gpus", "0", "--dry-run"],
               cwd=tmp_path)
    assert only_line(proc, "train-stlm.sh") == (
        f"--save-dir={save}: its checkpoint_last.pt is a anthe_base model, which fairseq would resume as "
        "stlm_tied; allowed: a --save-dir of its own")
    proc = run(["bash", recipe, wikitext_data_bin(), "--save-dir", str(tmp_path / "own"), "--gpus", "0",
                "--dry-run"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
