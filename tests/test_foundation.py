"""Foundation: plugin loading, console script, safe checkpoints, fairseq CLI round trip."""
import argparse
import os
import pickle
import subprocess
import sys

import pytest
import torch

from helpers import BIN, REPO, USER_DIR, ende_data_bin, run_cli


class _Payload:
    """An object whose unpickling would run code (writes a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_is_refused_and_payload_never_runs(tmp_path):
    from fairseq import checkpoint_utils

    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {},
                "extra": _Payload(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()
    # the same file is harmless without the payload: safety is on, the allow-list is narrow
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {"w": torch.ones(2)}},
               tmp_path / "ok.pt")
    state = torch.load(tmp_path / "ok.pt", weights_only=True)
    assert state["args"].arch == "transformer"


def test_allow_list_is_narrow():
    from slim_fairseq_user_dir import user_dir  # noqa: F401  (importable without fairseq)
    import slim_fairseq.checkpoint_safety as cs

    allowed = cs.allowed_globals()
    names = {f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', o)}" for o in allowed}
    assert "argparse.Namespace" in names
    for dangerous in ("posix.system", "builtins.eval", "builtins.exec", "subprocess.Popen",
                      "builtins.getattr", "builtins.__import__", "torch.load"):
        assert dangerous not in names
    assert len(allowed) < 40


def test_namespace_checkpoint_needs_the_allow_list(tmp_path):
    """Without the plugin, torch refuses fairseq's legacy checkpoints; with it they load."""
    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(arch="transformer")}, path)
    code = ("import torch,sys; torch.load(sys.argv[1], weights_only=True)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "Namespace" in proc.stderr
    assert torch.load(path, weights_only=True)["args"].arch == "transformer"


def test_reading_a_checkpoint_keeps_the_process_allow_list(tmp_path):
    """scripts/average_checkpoints.load_checkpoint (also behind checkpoint_info.py) in a process
    that imported the plugin: it used torch's safe_globals context, whose exit removed
    argparse.Namespace that the plugin had registered, and every later weights_only load of a
    fairseq checkpoint in that process failed."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import average_checkpoints

    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {"w": torch.ones(1)}}, path)
    before = set(torch.serialization.get_safe_globals())
    assert argparse.Namespace in before
    assert average_checkpoints.load_checkpoint(str(path))["args"].arch == "transformer"
    assert set(torch.serialization.get_safe_globals()) == before
    assert torch.load(path, weights_only=True)["args"].arch == "transformer"
    # without the plugin: the script reads it without importing fairseq, and leaves nothing behind
    code = ("import argparse, sys, torch; sys.path.insert(0, sys.argv[2]); import average_checkpoints as a; "
            "assert a.load_checkpoint(sys.argv[1])['args'].arch == 'transformer'; "
            "assert argparse.Namespace not in torch.serialization.get_safe_globals(), 'left allow-listed'; "
            "assert 'fairseq' not in sys.modules, 'imported fairseq'")
    proc = subprocess.run([sys.executable, "-c", code, str(path), os.path.join(REPO, "scripts")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_plugin_import_is_silent_and_changes_nothing_global():
    """Loading the plugin prints nothing and changes no global state but the warning filters
    that hide what fairseq 0.12.3 itself triggers on every run."""
    code = r"""
import argparse, io, logging, sys, warnings, contextlib
import torch, fairseq.models, fairseq.tasks
before = (torch.get_default_dtype(), torch.get_num_threads(), logging.getLogger().level,
          len(warnings.filters), torch.is_grad_enabled())
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    from fairseq import utils
    utils.import_user_module(argparse.Namespace(user_dir=sys.argv[1]))
import slim_fairseq
added = len(slim_fairseq.HARMLESS_FAIRSEQ_WARNINGS)  # the only global change: these are hidden
new_filters = warnings.filters[:added]
assert [(f[0], f[1].pattern, f[2]) for f in new_filters] == [
    ("ignore", message, category) for category, message in reversed(slim_fairseq.HARMLESS_FAIRSEQ_WARNINGS)
], new_filters
after = (torch.get_default_dtype(), torch.get_num_threads(), logging.getLogger().level,
         len(warnings.filters) - added, torch.is_grad_enabled())
assert out.getvalue() == "" and err.getvalue() == "", (out.getvalue(), err.getvalue())
assert before == after, (before, after)
from fairseq.models import ARCH_MODEL_REGISTRY
assert "slim_transformer" in ARCH_MODEL_REGISTRY and "slim_lm" in ARCH_MODEL_REGISTRY
print("OK")
"""
    proc = subprocess.run([sys.executable, "-c", code, USER_DIR], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_console_script_prints_user_dir():
    out = subprocess.run([os.path.join(BIN, "slim-fairseq-user-dir")], capture_output=True,
                         text=True, check=True)
    assert os.path.samefile(out.stdout.strip(), USER_DIR)
    assert out.stderr == ""


def test_setup_installs_pinned_torch_from_the_index_asked_for():
    """`make setup TORCH_INDEX=URL` installs torch==2.13.0 from that index only (PyPI's Linux
    wheel is the CUDA build); without it, from pip's own configuration. `make -n -B` prints the
    commands without running them."""
    def torch_install(*extra):
        out = subprocess.run(["make", "-n", "-B", "setup", *extra], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
        lines = [line for line in out.splitlines() if "install" in line and "torch==2.13.0" in line]
        assert len(lines) == 1, out
        return lines[0]
    cpu = "https://download.pytorch.org/whl/cpu"
    assert f"--index-url {cpu} torch==2.13.0" in torch_install(f"TORCH_INDEX={cpu}")
    assert "--index-url" not in torch_install()
    with open(os.path.join(REPO, "docs", "INSTALL.md"), encoding="utf-8") as f:
        assert f"make setup TORCH_INDEX={cpu}" in f.read()


def test_bad_option_fails_before_training_with_one_line_error(tmp_path):
    proc = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), ende_data_bin(), "--task", "translation",
         "--arch", "slim_transformer", "--user-dir", USER_DIR, "--cpu",
         "--cross-attn-gate", "qgv", "--save-dir", str(tmp_path), "--max-update", "1",
         "--batch-size", "8"],
        capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "kgv" in lines[0] and "leak" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_train_eval_bleu_resume_generate_interactive(tmp_path):
    """fairseq's own tools with weights_only loading: --eval-bleu checkpoints (numpy state),
    resume, fairseq-generate and fairseq-interactive, all with --user-dir."""
    data = ende_data_bin()
    save = str(tmp_path / "ckpt")
    common = [data, "--task", "translation", "--source-lang", "en", "--target-lang", "de",
              "--user-dir", USER_DIR, "--cpu"]
    train = common + [
        "--arch", "slim_transformer", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3",
        "--batch-size", "16", "--save-dir", save, "--no-epoch-checkpoints",
        "--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 5}',
        "--eval-bleu-remove-bpe", "--best-checkpoint-metric", "bleu",
        "--maximize-best-checkpoint-metric", "--validate-interval-updates", "2",
        "--max-valid-steps", "1", "--num-workers", "0"]
    out = run_cli("fairseq-train", train + ["--max-update", "2"])
    assert "done training" in out
    out = run_cli("fairseq-train", train + ["--max-update", "4"])
    assert "Loaded checkpoint" in out and "@ 2 updates" in out and "num_updates 4" in out
    ckpt = os.path.join(save, "checkpoint_last.pt")
    out = run_cli("fairseq-generate", common + ["--path", ckpt, "--beam", "5", "--max-len-b", "5",
                                                "--max-len-a", "0", "--gen-subset", "test",
                                                "--batch-size", "50", "--remove-bpe"])
    assert "BLEU" in out
    proc = subprocess.run([os.path.join(BIN, "fairseq-interactive"), *common, "--path", ckpt,
                           "--beam", "2", "--max-len-b", "5", "--max-len-a", "0"],
                          input="the house is small .\n", capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "H-0" in proc.stdout


def test_arch_help_lists_model_options_and_preset_values():
    out = subprocess.run([os.path.join(BIN, "slim-fairseq-help"), "slim_transformer"],
                         capture_output=True, text=True, check=True).stdout
    assert "--self-attn-gate" in out and "--sandwich-dim" in out and "--tc-ff" in out
    assert "preset values:" in out and "--encoder-embed-dim 512" in out
    bad = subprocess.run([os.path.join(BIN, "slim-fairseq-help"), "no_such_arch"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--arch=no_such_arch: not an architecture" in bad.stderr
    assert "INFO" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    usage = subprocess.run([os.path.join(BIN, "slim-fairseq-help"), "--help"],
                           capture_output=True, text=True)
    assert usage.returncode == 0 and "--options" in usage.stdout


def test_a_training_run_prints_no_warning_of_fairseq_itself(tmp_path):
    """The warnings fairseq 0.12.3 triggers on every run (Hydra, autocast, pinned memory on a
    CPU) are hidden once the plugin is loaded: a one-update run prints no warning at all. The run
    is a user's: fairseq imports the real scikit-learn and SciPy, not tests/stand_ins (the one
    fairseq process of the suite that does)."""
    from conftest import STAND_INS
    from helpers import wikitext_data_bin
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and p != STAND_INS)
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # the modules imported, on stderr
    proc = subprocess.run([os.path.join(BIN, "fairseq-train"), wikitext_data_bin(), "--user-dir",
                           USER_DIR, "--task", "language_modeling", "--arch", "stlm_tied",
                           "--decoder-embed-dim", "32", "--decoder-layers", "2", "--cpu",
                           "--max-update", "1", "--optimizer", "adam", "--lr", "1e-3",
                           "--tokens-per-sample", "16", "--max-tokens", "256", "--no-save",
                           "--save-dir", str(tmp_path), "--max-valid-steps", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    # the stand-ins have no submodules: these are the real libraries'
    assert "scipy.stats" in imported and "sklearn.utils" in imported
    assert any(name.startswith("sklearn.metrics.") for name in imported)
    warnings_printed = [line for line in proc.stderr.splitlines()
                        if "Warning" in line and not line.startswith("import time:")]
    assert not warnings_printed, warnings_printed


def test_stand_ins_replace_unused_libraries_and_raise_if_called():
    """The tests' fairseq gets tests/stand_ins for scikit-learn and scipy.stats (tests and the
    processes they start), and a call into one fails instead of passing on a fake."""
    import sklearn.metrics
    from scipy.optimize import linear_sum_assignment
    from scipy.stats import pearsonr

    stand_ins = os.path.join(REPO, "tests", "stand_ins")
    assert sklearn.metrics.__file__.startswith(stand_ins)
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == stand_ins
    for call in (sklearn.metrics.f1_score, pearsonr, linear_sum_assignment):
        with pytest.raises(RuntimeError, match="a stand-in of the test suite"):
            call([1], [1])
