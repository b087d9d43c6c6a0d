"""Tiny checkpoints for the export tests (tests/test_export_hf.py, tests/test_bad_inputs.py):
built through fairseq's parser on the tests' small data, every parameter moved off its initial
value (norms off 1, LoRA's B off 0) and saved as fairseq-train saves a legacy model; and one
export per checkpoint, cached for the session."""
import os

import torch

from helpers import REPO, TEST_DATA, build, ende_data_bin, wikitext_data_bin

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


__all__ = ["REPO", "TINY_LM", "TINY_MT", "codes", "data_of", "exported", "perturb_",
           "save_checkpoint", "tiny_checkpoint", "tokenizer_options"]
