"""Shared test helpers: load the plugin the only safe way, build models through fairseq's own
parser, make small batches, run fairseq's CLI tools, load a script of scripts/ as a module."""
import argparse
import importlib.util
import os
import signal
import subprocess
import sys

import torch

from slim_fairseq_lab import contract
from slim_fairseq_lab.contract import is_lm, load_plugin, plugin_archs  # noqa: F401 (re-exported)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "slim_fairseq")
BIN = os.path.dirname(sys.executable)
TEST_DATA = os.path.join(REPO, "build", "test-data")
# what a recipe or tool run as a subprocess sees: this venv's python and tools (CI activates no
# venv, and a recipe runs ${PYTHON:-python3}), one thread, no Python warnings
TOOL_ENV = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHON=sys.executable,
                OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def ende_data_bin():
    """Small binarized subset of the bundled en-de corpus (cached under build/test-data)."""
    from slim_fairseq_lab.data import binarize_ende
    return binarize_ende(TEST_DATA, subset=1500, eval_subset=100, bpe_merges=1000)


def wikitext_data_bin():
    """Small word-level binarized subset of the bundled WikiText-2 (cached under build/test-data)."""
    from slim_fairseq_lab.data import binarize_wikitext
    return binarize_wikitext(TEST_DATA, subset=1500, nwords=2000)


def load_script(name):
    """The command-line script ``scripts/<name>.py`` as a module (its ``main`` and parser); each
    call loads a fresh copy. Scripts are not a package: their libraries are in slim_fairseq_lab."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", os.path.join(REPO, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_args(lm):
    """Task arguments for the bundled data (translation en->de or word-level language modeling)."""
    if lm:
        return [wikitext_data_bin(), "--task", "language_modeling", "--tokens-per-sample", "64",
                "--sample-break-mode", "none"]
    return [ende_data_bin(), "--task", "translation", "--source-lang", "en", "--target-lang", "de"]


def parse_train_args(argv):
    """Parse a fairseq-train command line (without the program name) with fairseq's parser."""
    load_plugin()
    from fairseq import options
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)


def build(arch, overrides, lm, extra=()):
    """(args, task, model) for ``arch`` built through fairseq's parser from CLI-style args."""
    return contract.build(arch, overrides, task_args(lm), extra)


def run_cli(tool, argv, timeout=600, env=None):
    """Run a fairseq console script of this venv; return its combined output (fails loudly)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    full_env.update(env or {})
    proc = subprocess.run([os.path.join(BIN, tool), *argv], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{tool} failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def assert_incremental_equals_full(task, model, src_len=6, tgt_len=5, seed=1):
    """An encoder-decoder's step-by-step decoding (incremental state) equals its full pass."""
    d = task.target_dictionary
    torch.manual_seed(seed)
    src = torch.randint(d.nspecial, len(task.source_dictionary), (2, src_len))
    lengths = torch.tensor([src_len, src_len])
    prev = torch.randint(d.nspecial, len(d), (2, tgt_len))
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        enc = model.encoder(src, lengths)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(tgt_len)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)


def sigint_at_default():
    """``preexec_fn`` of a command a test interrupts: SIGINT back at its default in the child.
    pytest-xdist's workers ignore SIGINT, a child inherits that, and a Python started with SIGINT
    ignored never sees Ctrl-C (as a job started with ``nohup`` or ``&`` does not)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def unregister(technique):
    """Undo the registration of ``technique`` (a spec class, or a ``--norm`` name), which a test
    loads for a while; the plugin registers a technique once per process and has no way back."""
    from slim_fairseq import options
    from slim_fairseq.models import slim_layers
    if isinstance(technique, str):
        if slim_layers.NORM_MODULES.pop(technique, None) is not None:
            slim_layers.NORMS._values.remove(technique)
        return
    for registry in (slim_layers.FEED_FORWARDS, slim_layers.ATTENTION_EXTENSIONS,
                     slim_layers.INPUT_EMBEDDINGS, slim_layers.OUTPUT_PROJECTIONS,
                     slim_layers.BLOCK_LAYOUTS):
        registry.pop(technique, None)
    if technique in options._SPECS:
        options._SPECS.remove(technique)
