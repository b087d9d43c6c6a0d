"""Tiny checkpoints for the export tests (tests/test_export_hf.py, tests/test_bad_inputs.py):
built through fairseq's parser on the tests' small data, every parameter moved off its initial
value (norms off 1, LoRA's B off 0) and saved as fairseq-train saves a legacy model; and one
export per checkpoint, cached for the session."""
import os
import subprocess
import sys

import torch

from helpers import REPO, TEST_DATA, build, ende_data_bin, run_cli, wikitext_data_bin

WIDTHS = ("--{side}-embed-dim", "32", "--{side}-ffn-embed-dim", "48", "--{side}-layers", "2",
          "--{side}-attention-heads", "4")
TINY_LM = [a.format(side="decoder") for a in WIDTHS]
TINY_MT = [a.format(side=side) for side in ("encoder", "decoder") for a in WIDTHS]


def codes():
    """The subword-nmt codes of the tests' en-de data-bin."""
    from slim_fairseq_lab.data import ende_paths
    return ende_paths(TEST_DATA, subset=1500, eval_subset=100, bpe_merges=1000)["codes"]


def data_of(lm):
    return wikitext_data_bin() if lm else ende_data_bin()


def tokenizer_options(lm):
    return {} if lm else dict(bpe="subword_nmt", tokenizer_name="moses", bpe_codes=codes())


@torch.no_grad()
def perturb_(model, seed=0, scale=0.05):
    """Move every parameter (shared ones once) off its initial value."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        param.add_(scale * torch.randn(param.shape, generator=generator))
    return model


def save_checkpoint(path, args, model, updates=0):
    torch.save({"args": args, "model": model.state_dict(), "extra_state": {},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                       "optimizer_name": "FairseqAdam", "lr_scheduler_state": {},
                                       "num_updates": updates}]}, path)
    return path


def tiny_checkpoint(folder, arch, argv, lm, seed=0):
    """A checkpoint of ``arch`` with ``argv`` (after the tiny widths) in ``folder``."""
    args, _, model = build(arch, (TINY_LM if lm else TINY_MT) + list(argv), lm)
    perturb_(model, seed)
    name = "_".join([arch] + [a.strip("-").replace("-", "")[:12] for a in argv])[:120]
    return save_checkpoint(os.path.join(str(folder), f"{name}.pt"), args, model)


_EXPORTS = {}

# the start of a script run with -I in a fresh interpreter: fairseq and slim_fairseq cannot be
# imported there, so what it finds is computed by the exported folder's own code alone
WITHOUT_FAIRSEQ = r'''
import importlib.abc, json, sys


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fairseq", "fairseq_cli", "slim_fairseq", "slim_fairseq_lab"):
            raise ImportError(f"{name} is blocked in this process")
        return None


sys.meta_path.insert(0, Blocked())
for name in ("fairseq", "slim_fairseq"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} could be imported")
'''


def run_without_fairseq(folder, script, job, *args):
    """What ``script`` (it starts with :data:`WITHOUT_FAIRSEQ`) saves to ``sys.argv[2]``, run
    offline in a fresh interpreter on ``job`` (saved to ``sys.argv[1]``), ``args`` after them."""
    torch.save(job, folder / "job.pt")
    path = folder / "transformers_side.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               HF_MODULES_CACHE=str(folder / "hf_modules"))
    proc = subprocess.run([sys.executable, "-I", str(path), str(folder / "job.pt"),
                           str(folder / "found.pt"), *map(str, args)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(folder / "found.pt")


def trained(folder, name, arch, lm, argv=()):
    """The last checkpoint of a tiny ``arch`` trained 4 updates by fairseq-train."""
    save = folder / name
    task = (["--task", "language_modeling", "--tokens-per-sample", "64", "--sample-break-mode",
             "none"] if lm else ["--task", "translation", "--source-lang", "en",
                                 "--target-lang", "de"])
    run_cli("fairseq-train", [
        data_of(lm), *task, "--user-dir", os.path.join(REPO, "slim_fairseq"), "--arch", arch,
        *(TINY_LM if lm else TINY_MT), *argv, "--optimizer", "adam", "--lr", "0.003",
        "--max-update", "4", "--max-tokens", "512", "--cpu", "--seed", "3", "--save-dir",
        str(save), "--disable-validation", "--no-epoch-checkpoints", "--num-workers", "0",
        "--log-format", "none"])
    return str(save / "checkpoint_last.pt")


def exported(folder, arch, argv, lm, **options):
    """``(checkpoint, ExportResult)`` of a tiny model, exported once per session."""
    from slim_fairseq.export_hf import export
    key = (arch, tuple(argv), lm, tuple(sorted(options.items())))
    if key not in _EXPORTS:
        path = tiny_checkpoint(folder, arch, argv, lm)
        out = os.path.join(str(folder), os.path.basename(path)[:-3] + "-hf")
        merged = dict(tokenizer_options(lm), **options)
        _EXPORTS[key] = (path, export(path, data_of(lm), out, sentences=4, **merged))
    return _EXPORTS[key]


__all__ = ["REPO", "TINY_LM", "TINY_MT", "WITHOUT_FAIRSEQ", "codes", "data_of", "exported",
           "perturb_", "run_without_fairseq", "save_checkpoint", "tiny_checkpoint",
           "tokenizer_options", "trained"]
