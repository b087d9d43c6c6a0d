"""The Subformer as a language model leaves as transformers custom code (docs/EXPORT.md): a tiny
``subformer_lm_wiki103_83m`` (adaptive input written as the one table it computes, a tied
adaptive softmax, a sandwich middle twice as wide) and a tiny ``slim_lm`` with SAFE and a
sandwich middle of another width, FFN width and heads, exported and loaded by
``AutoModelForCausalLM`` with ``trust_remote_code=True`` in a process in which ``fairseq`` and
``slim_fairseq`` cannot be imported: fairseq's log-probabilities within 1e-5 on an unpadded
and a right-padded batch, its greedy output for 10 tokens and its beam-5 output from ``</s>``,
the cache (SAFE's attention too) equal to the full pass. The adaptive softmax's maths in
OUT_DIR is held to fairseq's ``AdaptiveSoftmax.get_log_prob``."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import build
from hf_export_fixtures import TINY_LM, data_of, tiny_checkpoint
from test_export_custom import BEAM_LENGTH, TOLERANCE, TRANSFORMERS_SIDE, _fairseq_side

os.environ["HF_HUB_OFFLINE"] = "1"
# the dictionary of the tests' data-bin has 2,000 types: the presets' proportions of it
CUTOFFS = ["--adaptive-input-cutoff", "149,448", "--adaptive-softmax-cutoff", "149,448",
           "--criterion", "adaptive_loss"]
MODELS = {
    "subformer_lm": ("subformer_lm_wiki103_83m", ["--decoder-layers", "3", *CUTOFFS]),
    "safe_sandwich": ("slim_lm", ["--safe-embed-dim", "16", "--sandwich", "--decoder-layers", "3",
                                  "--sandwich-dim", "48", "--sandwich-ffn-dim", "80",
                                  "--sandwich-heads", "2"]),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_subformer_lm")


@pytest.fixture(scope="module")
def exports(folder):
    from slim_fairseq.export_hf import export
    paths = {name: tiny_checkpoint(folder, arch, argv, True)
             for name, (arch, argv) in MODELS.items()}
    return {name: (path, export(path, data_of(True), str(folder / f"{name}-hf"), sentences=4))
            for name, path in paths.items()}


@pytest.fixture(scope="module")
def sides(folder, exports):
    """``{name: (fairseq's side, transformers' side)}``, transformers' computed in a process
    that cannot import fairseq or slim_fairseq."""
    fairseq = {name: _fairseq_side(path) for name, (path, _) in exports.items()}
    job = {name: dict(out_dir=result.out_dir, batches=fairseq[name]["batches"],
                      prompts=fairseq[name]["prompts"])
           for name, (_, result) in exports.items()}
    torch.save(job, folder / "job.pt")
    script = folder / "transformers_side.py"
    script.write_text(TRANSFORMERS_SIDE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               HF_MODULES_CACHE=str(folder / "hf_modules"))
    proc = subprocess.run([sys.executable, "-I", str(script), str(folder / "job.pt"),
                           str(folder / "found.pt"), str(BEAM_LENGTH)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = torch.load(folder / "found.pt")
    return {name: (fairseq[name], found[name]) for name in exports}


@pytest.mark.parametrize("name", MODELS)
def test_subformer_lm_scores_and_decodes_as_fairseq_without_fairseq(name, exports, sides):
    _, result = exports[name]
    assert result.hf_class == "SlimForCausalLM" and result.gap <= 1e-4
    fairseq, found = sides[name]
    assert found["class"] == "SlimForCausalLM"
    assert found["module"].startswith("transformers_modules.")  # the folder's own code
    for kind, tokens in fairseq["batches"].items():
        keep = tokens.ne(fairseq["pad"])
        assert keep.sum() > 10 and (kind == "unpadded") == bool(keep.all())
        gap = (fairseq["log_probs"][kind] - found["log_probs"][kind]).abs()[keep].max().item()
        assert gap <= TOLERANCE, (kind, gap)
    for expected, hf_new in zip(fairseq["greedy"], found["greedy"]):
        assert len(hf_new) == 10 and hf_new == expected[:10], (hf_new, expected)
    assert len(fairseq["beam"]) > 10 and found["beam_from_start"][:10] == fairseq["beam"][:10]


@pytest.mark.parametrize("name", MODELS)
def test_subformer_lm_cache_gives_the_full_pass(name, sides):
    _, found = sides[name]
    assert found["cache_gap"] <= TOLERANCE
    assert found["greedy"] == found["greedy_no_cache"]
    assert found["beam"] == found["beam_no_cache"]


def test_subformer_lm_leaves_with_its_middle_safe_and_adaptive_softmax(exports):
    configs = {}
    for name, (_, result) in exports.items():
        with open(os.path.join(result.out_dir, "config.json")) as f:
            configs[name] = json.load(f)
    subformer, safe = configs["subformer_lm"], configs["safe_sandwich"]
    assert subformer["adaptive_softmax"]["head_words"] == 149
    assert [size for _, size in subformer["adaptive_softmax"]["tails"]] == [299, 2000 - 448]
    assert subformer["sandwich"]["projected"] and subformer["sandwich"]["hidden_size"] == 64
    assert subformer["safe"] is None and subformer["hidden_size"] == 32
    assert safe["safe"]["hidden_size"] == 16 and safe["safe_output"] == "linear"
    assert safe["adaptive_softmax"] is None
    assert (safe["sandwich"]["hidden_size"], safe["sandwich"]["intermediate_size"],
            safe["sandwich"]["num_attention_heads"]) == (48, 80, 2)
    assert "adaptive_softmax_function.py" in os.listdir(exports["subformer_lm"][1].out_dir)
    with open(os.path.join(exports["subformer_lm"][1].out_dir, "README.md")) as f:
        assert "adaptive input (a table and a projection per frequency band) was written" in f.read()


@torch.no_grad()
def test_adaptive_softmax_function_is_fairseqs():
    """The file the export copies gives what fairseq's own module gives (the preset's tied
    adaptive softmax, at its factor and at another)."""
    from slim_fairseq.modules.adaptive_softmax_function import adaptive_log_probs
    for argv in ([*CUTOFFS], [*CUTOFFS, "--adaptive-input-factor", "2",
                              "--adaptive-softmax-factor", "2"]):
        _, _, model = build("subformer_lm_wiki103_83m", TINY_LM + ["--decoder-layers", "3"]
                            + argv, True)
        module = model.decoder.adaptive_softmax.eval()
        torch.manual_seed(0)
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
        features = torch.randn(2, 5, module.input_dim)
        expected = module.get_log_prob(features, None)
        found = adaptive_log_probs(features, module.head, module.tail, module.cutoff[0])
        assert found.shape == expected.shape == (2, 5, 2000)
        assert (found - expected).abs().max().item() <= 1e-6
        assert abs(found.exp().sum(-1) - 1).max().item() <= 1e-5
