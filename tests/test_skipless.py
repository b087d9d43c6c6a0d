"""Skipless transformers and exact weight removal (docs/TECHNIQUES.md#skipless-transformers).

Tolerances (max |log-prob difference| / max |log-prob|, reduced vs original):
* float64 (conversion and both forwards in float64): <= 1e-9 (measured ~1e-13);
* float32 (original in float32, converted in float64 then cast to float32): <= FP32_REL_TOL
  (docs/TECHNIQUES.md#weight-removal expects 1e-6 .. 4e-4, drop-K worst).
"""
import argparse
import math
import os
import re
import types

import numpy as np
import pytest
import torch

from helpers import REPO, USER_DIR, run_cli, wikitext_data_bin

FP64_REL_TOL = 1e-9
FP32_REL_TOL = 5e-4
MISTRAL_7B = (7_241_465_856, 6_167_724_032)
PYTHIA_6_9B = (6_855_327_744, 5_781_585_920)


def _registry():
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    return ARCH_MODEL_REGISTRY, ARCH_CONFIG_REGISTRY


def make_model(options, vocab=50, arch="skipless_lm"):
    """Build a skipless model from option attributes (cfg names) through the arch preset."""
    from slim_fairseq_lab.params import make_dictionary

    models, configs = _registry()
    args = argparse.Namespace(arch=arch, **options)
    configs[arch](args)
    task = types.SimpleNamespace(target_dictionary=make_dictionary(vocab))
    return models[arch].build_model(args, task)


def randomize(model, seed):
    """Generic weights (the shaped init has W_Q = 0, which is not invertible)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * p.shape[-1] ** -0.5)
            elif name.rsplit(".", 1)[-1] in ("alpha", "beta", "gamma"):
                p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1)
    return model


def log_probs(model, tokens):
    return torch.log_softmax(model(tokens)[0], dim=-1)


def rel_diff(a, b):
    return ((a - b).abs().max() / a.abs().max()).item()


def tokens_for(vocab, seed, shape=(3, 11)):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(4, vocab, shape, generator=g)


# every exact (layout, attention type, dropped matrix); other options vary across the cases
EXACT_CASES = [
    ("serial", "mha", "q", dict(linear_bias=True, share_decoder_input_output_embed=True)),
    ("serial", "mha", "k", dict(ffn_glu=True, glu_hidden="full", linear_bias=True)),
    ("serial", "mha", "v", dict(rope_theta=0.0, linear_bias=True)),
    ("serial", "gqa", "q", dict(ffn_glu=True, glu_hidden="full", linear_bias=True, share_decoder_input_output_embed=True)),
    ("serial", "mqa", "q", dict(mlp_branch_scale=0.7)),
    ("parallel", "mha", "q", dict(linear_bias=True, mlp_branch_scale=0.5)),
    ("parallel", "mha", "k", dict(ffn_glu=True, glu_hidden="full", linear_bias=True, share_decoder_input_output_embed=True)),
    ("parallel", "mha", "v", dict(linear_bias=True, rope_theta=0.0)),
    ("parallel", "gqa", "q", dict(ffn_glu=True, glu_hidden="full", linear_bias=True)),
    ("parallel", "mqa", "q", dict(linear_bias=True, no_scale_embedding=True)),
]
KV_HEADS = {"mha": 0, "gqa": 2, "mqa": 1}


def case_options(layout, attn, extra):
    return dict(decoder_embed_dim=32, decoder_layers=3, decoder_attention_heads=4, decoder_ffn_embed_dim=40,
                kv_heads=KV_HEADS[attn], skipless_layout=layout, **extra)


@pytest.mark.parametrize("layout,attn,removed,extra", EXACT_CASES,
                         ids=[f"{c[0]}-{c[1]}-drop{c[2]}" for c in EXACT_CASES])
@torch.no_grad()
def test_reduced_model_equals_original(layout, attn, removed, extra):
    from slim_fairseq.weight_removal import reduce_model

    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        model = randomize(make_model(case_options(layout, attn, extra)).double(), seed).eval()
        reduced, report = reduce_model(model, removed)
        reduced.eval()
        tokens = tokens_for(50, seed)
        # float64
        reference = log_probs(model, tokens)
        assert rel_diff(reference, log_probs(reduced, tokens)) <= FP64_REL_TOL
        # the reduced model really lacks the matrices (serial: also P)
        attn_mod = reduced.decoder.layers[0].self_attn
        assert getattr(attn_mod, f"{removed}_proj") is None
        assert attn_mod.has_out_proj == (layout == "parallel")
        expected_drop = model.args.decoder_layers * 32 * 32 * (1 if layout == "parallel" else 2)
        n_orig = sum(p.numel() for p in model.parameters() if p.dim() > 1)  # weights, no biases
        n_red = sum(p.numel() for p in reduced.parameters() if p.dim() > 1)
        untied = 50 * 32 if extra.get("share_decoder_input_output_embed") else 0
        assert n_orig - n_red + untied == expected_drop
        # float32: original in float32 vs the float64 conversion cast to float32
        ref32 = log_probs(model.float(), tokens)
        assert rel_diff(ref32, log_probs(reduced.float(), tokens)) <= FP32_REL_TOL
        assert rel_diff(reference.float(), ref32) < 1e-4  # sanity: fp32 itself is close
        model.double()
        reduced.double()
        # incremental decoding of the reduced model equals its full forward
        full = log_probs(reduced, tokens)
        state = {}
        for t in range(tokens.size(1)):
            step = torch.log_softmax(reduced(tokens[:, : t + 1], incremental_state=state)[0], dim=-1)
            assert (step[:, 0] - full[:, t]).abs().max().item() <= 1e-10
        if layout == "parallel":
            assert any("remain" in line for line in report)


@torch.no_grad()
@pytest.mark.parametrize("scaled", [True, False])
def test_tokens_enter_the_first_block_with_rms_one(scaled):
    """The skipless init keeps the signal's second moment from the first block on, so a token
    enters with RMS 1 with or without the sqrt(d) scale (--no-scale-embedding: rows of norm
    sqrt(d); unit rows there start a serial GLU stack at RMS d^-1/2, which it squares per block
    until the outputs ignore the input)."""
    torch.manual_seed(0)
    options = dict(decoder_embed_dim=64, decoder_layers=2, no_scale_embedding=not scaled)
    model = make_model(options)
    table = model.decoder.embed_tokens.table
    rows = torch.cat([table.weight[:table.padding_idx], table.weight[table.padding_idx + 1:]])
    rms = (rows * model.decoder.embed_scale).pow(2).mean(dim=1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-5)
    assert table.weight[table.padding_idx].abs().max().item() == 0


def test_float32_tolerance_is_documented_range():
    """Drop-K in float32 with a deeper model stays inside the documented tolerance."""
    from slim_fairseq.weight_removal import reduce_model

    options = case_options("serial", "mha", dict())
    options["decoder_layers"] = 6
    model = randomize(make_model(options).double(), 7).eval()
    reduced, _ = reduce_model(model, "k")
    tokens = tokens_for(50, 7)
    diff = rel_diff(log_probs(model.float(), tokens), log_probs(reduced.float().eval(), tokens))
    assert 0 < diff <= FP32_REL_TOL


def test_trained_reduced_form_and_errors():
    from slim_fairseq.weight_removal import reduce_model

    # fresh shaped init: W_Q = 0 -> singular; the error names the condition number
    model = make_model(case_options("serial", "mha", {}))
    with pytest.raises(ValueError, match=r"singular or ill-conditioned \(condition number"):
        reduce_model(model, "q")
    # drop-K / drop-V need MHA
    gqa = randomize(make_model(case_options("serial", "gqa", {})), 0)
    # the rule that refuses building the reduced form refuses converting to it, in the same
    # words; a trained model's heads stay, so only another projection is proposed
    for removed in ("k", "v"):
        with pytest.raises(ValueError) as converting:
            reduce_model(gqa, removed)
        with pytest.raises(ValueError) as building:
            make_model(case_options("serial", "gqa", dict(removed_weights=removed)))
        problem = rf"--removed-weights={removed}: W_{removed.upper()} is not square here \(\d+ -> \d+: \d heads of \d+\)"
        assert re.fullmatch(problem + "; allowed: --removed-weights q", str(converting.value))
        assert re.fullmatch(problem + "; allowed: --removed-weights q, or --kv-heads 0", str(building.value))
        assert str(converting.value).split("; ")[0] == str(building.value).split("; ")[0]
    gated = randomize(make_model(case_options("serial", "mha", dict(self_attn_gate="qgv"))), 0)
    with pytest.raises(ValueError) as converting:
        reduce_model(gated, "q")
    assert str(converting.value) == ("--removed-weights=q: the reduced form drops a plain projection, which "
                                     "gates and --no-patt change; allowed: none (no projection of this model "
                                     "can go)")
    with pytest.raises(ValueError, match=r"^--removed-weights=p: .*; allowed: none\|q\|k\|v$"):
        make_model(case_options("serial", "mha", dict(removed_weights="p")))
    with pytest.raises(ValueError, match=r"^--skipless-layout=diagonal: .*; allowed: none\|serial\|parallel$"):
        make_model(case_options("diagonal", "mha", {}))
    with pytest.raises(ValueError, match="--layernorm-embedding"):
        reduce_model(randomize(make_model(case_options("serial", "mha", dict(layernorm_embedding=True))), 0), "q")
    # an ill-conditioned (rank-deficient) W_K is refused
    model = randomize(make_model(case_options("serial", "mha", {})), 1)
    with torch.no_grad():
        model.decoder.layers[1].self_attn.k_proj.weight[0] = model.decoder.layers[1].self_attn.k_proj.weight[1]
    with pytest.raises(ValueError, match="layer 1 W_K is singular or ill-conditioned"):
        reduce_model(model, "k")


@pytest.mark.slow
def test_meta_counts_of_mistral_and_pythia_presets():
    """Weight counts (docs/TECHNIQUES.md#skipless-weight-counts) via count_params --meta (weight matrices only: norm weights,
    biases and the shaped-attention gains alpha, beta, gamma -- 3 per head -- are excluded)."""
    from slim_fairseq_lab.params import count_params

    for arch, vocab, (full, reduced) in (("skipless_lm_mistral_7b", 32000, MISTRAL_7B),
                                          ("skipless_lm_pythia_6_9b", 50400, PYTHIA_6_9B)):
        for removed, expected in (("none", full), ("q", reduced)):
            info = count_params(arch, ["--removed-weights", removed], vocab=vocab, meta=True,
                                exclude_norms_biases=True)
            assert info["meta"]
            assert info["total"] == expected, (arch, removed, info["total"])
            assert info["excluded_norms_biases"] == 3 * 32 * 32  # alpha, beta, gamma per head


@pytest.mark.slow
def test_skipless_trains_below_unigram_on_wikitext2():
    """A small serial skipless model (shaped attention, no residuals, no norms) learns on the
    bundled WikiText-2 subset: after 120 Adam updates its valid loss is clearly (> 0.3 bit)
    below the cross-entropy of the add-one unigram model of the training tokens."""
    from fairseq import options, tasks
    from fairseq.data import data_utils

    torch.manual_seed(0)
    data = wikitext_data_bin()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data, "--task", "language_modeling", "--arch", "skipless_lm", "--user-dir", USER_DIR, "--cpu",
        "--tokens-per-sample", "64", "--sample-break-mode", "none", "--decoder-embed-dim", "64",
        "--decoder-layers", "2", "--decoder-attention-heads", "4", "--decoder-ffn-embed-dim", "128"])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    task.load_dataset("valid")
    model = task.build_model(args)
    criterion = task.build_criterion(args)

    raw_train = data_utils.load_indexed_dataset(os.path.join(data, "train"), task.dictionary)
    counts = np.bincount(np.concatenate([raw_train[i].numpy() for i in range(len(raw_train))]),
                         minlength=len(task.dictionary)).astype(np.float64) + 1.0
    unigram_log2 = np.log2(counts / counts.sum())

    train, valid = task.dataset("train"), task.dataset("valid")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(120):
        sample = train.collater([train[i] for i in torch.randint(len(train), (16,), generator=g).tolist()])
        loss, sample_size, _ = criterion(model, sample)
        optimizer.zero_grad()
        (loss / sample_size).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        sample = valid.collater([valid[i] for i in range(min(256, len(valid)))])
        loss, sample_size, _ = criterion(model, sample)
    valid_bits = loss.item() / sample_size / math.log(2)
    target = sample["target"][sample["target"].ne(task.dictionary.pad())].numpy()
    unigram_bits = float(-unigram_log2[target].mean())
    assert math.isfinite(valid_bits)
    assert valid_bits < unigram_bits - 0.3, (valid_bits, unigram_bits)


def _eval_lm_ppl(data, checkpoint):
    out = run_cli("fairseq-eval-lm", [data, "--path", checkpoint, "--user-dir", USER_DIR, "--cpu",
                                      "--tokens-per-sample", "64", "--max-tokens", "2048",
                                      "--sample-break-mode", "none", "--gen-subset", "valid"])
    line = [ln for ln in out.splitlines() if "Perplexity:" in ln][-1]
    return float(line.rsplit("Perplexity:", 1)[1].split()[0]), float(line.split("Loss (base 2):")[1].split(",")[0])


@pytest.mark.slow
def test_converter_cli_end_to_end(tmp_path, capsys):
    """fairseq-train 3 updates -> scripts/remove_weights.py -> fairseq-eval-lm on both: equal ppl."""
    data = wikitext_data_bin()
    save = tmp_path / "ckpt"
    run_cli("fairseq-train", [
        data, "--task", "language_modeling", "--arch", "skipless_lm", "--user-dir", USER_DIR, "--cpu",
        "--tokens-per-sample", "64", "--sample-break-mode", "none", "--decoder-embed-dim", "32",
        "--decoder-layers", "2", "--decoder-attention-heads", "4", "--decoder-ffn-embed-dim", "48",
        "--linear-bias", "--share-decoder-input-output-embed",
        "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "1024", "--max-update", "3",
        "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    original = str(save / "checkpoint_last.pt")
    reduced = str(tmp_path / "reduced_k.pt")
    out = _run_script([original, reduced, "--removed-weights", "k"])
    assert "removed W_K and P from 2 blocks: 4,096 weights" in out
    state = torch.load(reduced, map_location="cpu", weights_only=True)
    model_cfg = state["cfg"]["model"]
    assert model_cfg.removed_weights == "k" and not model_cfg.share_decoder_input_output_embed
    assert not any(".k_proj." in k or ".out_proj." in k for k in state["model"])
    ppl_orig, bits_orig = _eval_lm_ppl(data, original)
    ppl_red, bits_red = _eval_lm_ppl(data, reduced)
    assert bits_red == pytest.approx(bits_orig, rel=1e-4)
    assert ppl_red == pytest.approx(ppl_orig, rel=1e-3)
    # a bad option is refused with a one-line message (in-process: no second interpreter start)
    from helpers import load_script
    remove_weights = load_script("remove_weights")
    assert remove_weights.main([original, str(tmp_path / "bad.pt"), "--removed-weights", "x"]) == 2
    assert "--removed-weights=x: not a projection; allowed: q|k|v" in capsys.readouterr().err


def _run_script(argv, expect_rc=0):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "remove_weights.py"), *argv],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect_rc, out[-3000:]
    return out
