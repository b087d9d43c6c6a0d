"""scripts/count_params.py: exact counts for fairseq's own models (docs/TECHNIQUES.md: Anthe, Subformer
and skipless counts)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, load_plugin
from slim_fairseq_lab.params import count_params, make_dictionary


def test_dummy_dictionary_has_exact_size():
    for size in (5, 8, 32768):
        assert len(make_dictionary(size)) == size
    with pytest.raises(ValueError, match="vocabulary size"):
        make_dictionary(4)


def test_transformer_base_share_all_joined_32768():
    """Subformer App. B (arXiv:2101.00234): transformer base, joined 32,768-type dictionary, share-all-embeddings."""
    info = count_params("transformer", ["--share-all-embeddings"], vocab=32768, joined=True)
    assert info["total"] == 60_915_712
    # the shared embedding is counted once in the total but three times per use
    assert info["total_counting_each_use"] == info["total"] + 2 * 32768 * 512
    assert len(info["shared"]) == 1 and len(info["shared"][0]["names"]) == 3
    assert info["by_category"]["embeddings"] == 32768 * 512
    assert info["layer_groups"]["encoder.layers"]["layers"] == 6
    assert info["layer_groups"]["decoder.layers"]["layers"] == 6
    assert sum(c["params"] for c in info["components"].values()) == info["total"]


def test_transformer_no_sharing_32000_meta_matches_real_build():
    """Anthe Table 1 (arXiv:2305.10991): no sharing at V=32000 each side = 93,290,496 (fairseq's bias-free output)."""
    meta = count_params("transformer", [], src_vocab=32000, tgt_vocab=32000, meta=True)
    assert meta["total"] == 93_290_496
    assert meta["shared"] == []
    assert meta["by_category"]["output"] == 32000 * 512
    real = count_params("transformer", ["--encoder-layers", "2", "--decoder-layers", "1"],
                        src_vocab=1000, tgt_vocab=1200)
    small_meta = count_params("transformer", ["--encoder-layers", "2", "--decoder-layers", "1"],
                              src_vocab=1000, tgt_vocab=1200, meta=True)
    assert real["components"] == small_meta["components"]
    assert real["total"] == small_meta["total"]
    assert real["components"]["encoder.embed_tokens"]["params"] == 1000 * 512
    assert real["components"]["decoder.output_projection"]["params"] == 1200 * 512


def test_meta_build_allocates_nothing():
    from slim_fairseq_lab.params import build_model

    model, _ = build_model("transformer_lm", ["--decoder-layers", "2"], vocab=1000, meta=True)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_transformer_lm_counts_and_exclude_norms_biases():
    overrides = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "256",
                 "--decoder-attention-heads", "4", "--decoder-input-dim", "64", "--decoder-output-dim", "64"]
    V, d, f, L = 1000, 64, 256, 2
    info = count_params("transformer_lm", overrides, vocab=V)
    no_nb = count_params("transformer_lm", overrides, vocab=V, exclude_norms_biases=True)
    weights = 2 * V * d + L * (4 * d * d + 2 * d * f)  # untied input + output embeddings, no pos params
    biases = L * (4 * d + f + d)
    norms = L * 2 * 2 * d  # two LayerNorms (weight + bias) per layer
    assert no_nb["total"] == weights
    assert no_nb["excluded_norms_biases"] == biases + norms
    assert info["total"] == weights + biases + norms
    assert info["task"] == "language_modeling"


def test_pythia_shape_weight_count_on_meta():
    """Pythia-6.9B weight count (docs/TECHNIQUES.md#skipless-weight-counts) (norms and biases excluded) without allocating 27 GB."""
    d = 4096
    overrides = ["--decoder-layers", "32", "--decoder-embed-dim", d, "--decoder-ffn-embed-dim", 4 * d,
                 "--decoder-attention-heads", "32", "--decoder-input-dim", d, "--decoder-output-dim", d]
    info = count_params("transformer_lm", overrides, vocab=50400, meta=True, exclude_norms_biases=True)
    assert info["total"] == 6_855_327_744


def test_bad_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="--arch"):
        count_params("no_such_arch", [], vocab=100)


@pytest.mark.slow
def test_every_plugin_arch_builds_on_meta():
    """count_params works for every architecture the plugin registers (registry-driven)."""
    load_plugin()
    from fairseq.models import ARCH_MODEL_REGISTRY

    archs = sorted(a for a, cls in ARCH_MODEL_REGISTRY.items() if cls.__module__.startswith("slim_fairseq"))
    failures = {}
    for arch in archs:
        try:
            try:
                info = count_params(arch, [], vocab=1000, joined=True, meta=True)
            except ValueError as err:  # adaptive input/softmax cutoffs need a WikiText-103-sized vocab
                if "--adaptive-input-cutoff" not in str(err):
                    raise
                info = count_params(arch, [], vocab=267_744, joined=True, meta=True)
            assert info["total"] > 0
        except Exception as err:  # collect all failures, report them together
            failures[arch] = f"{type(err).__name__}: {err}"
    assert not failures, failures


@pytest.mark.slow
def test_cli_json_and_overrides():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(REPO, "scripts", "count_params.py"), "transformer", "--vocab", "500",
           "--joined", "--json", "--meta", "--share-all-embeddings", "--", "--encoder-layers", "1",
           "--decoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
           "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    info = json.loads(out)
    expected = count_params("transformer", cmd[cmd.index("--share-all-embeddings"):cmd.index("--")]
                            + cmd[cmd.index("--") + 1:], vocab=500, joined=True)
    assert info["total"] == expected["total"]
    assert info["layer_groups"]["encoder.layers"]["layers"] == 1
    assert info["components"]["encoder.embed_tokens"]["params"] == 500 * 32


@pytest.mark.parametrize("arch,vocab,expected", [
    ("skipless_lm_pythia_6_9b", 50400, 6_855_327_744),
    ("skipless_lm_mistral_7b", 32000, 7_241_465_856),
])
def test_skipless_presets_weight_counts_on_meta(arch, vocab, expected):
    """Weight counts (docs/TECHNIQUES.md#skipless-weight-counts; norm weights, biases and per-head scalars excluded) of the
    skipless 7B-class presets, counted on the meta device."""
    load_plugin()
    from fairseq.models import ARCH_MODEL_REGISTRY

    assert arch in ARCH_MODEL_REGISTRY, f"{arch} is not registered"
    info = count_params(arch, [], vocab=vocab, meta=True, exclude_norms_biases=True)
    assert info["total"] == expected
    assert info["by_category"]["embeddings"] == vocab * 4096
