"""Post-training Tensor-Chain compression of fairseq transformers and dense export of TC
checkpoints: scripts/compress_checkpoint.py, scripts/export_dense.py,
slim_fairseq/compression.py."""
import argparse
import math
import os
import shlex
import subprocess
import sys

import pytest
import torch

from helpers import REPO, USER_DIR, ende_data_bin, load_script, run_cli, wikitext_data_bin

COMPRESS = os.path.join(REPO, "scripts", "compress_checkpoint.py")
EXPORT = os.path.join(REPO, "scripts", "export_dense.py")
TINY = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim",
        "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TINY_LM = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
           "--decoder-attention-heads", "2", "--decoder-input-dim", "32", "--decoder-output-dim", "32"]


def translation_args():
    return [ende_data_bin(), "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--user-dir", USER_DIR, "--cpu"]


def lm_args():
    return [wikitext_data_bin(), "--task", "language_modeling", "--tokens-per-sample", "32",
            "--sample-break-mode", "none", "--user-dir", USER_DIR, "--cpu"]


def train(save_dir, task_args, model_args, updates=3):
    """A few fairseq-train updates; returns checkpoint_last.pt."""
    run_cli("fairseq-train", task_args + model_args + [
        "--optimizer", "adam", "--lr", "3e-3", "--batch-size", "16", "--save-dir", str(save_dir),
        "--no-epoch-checkpoints", "--max-update", str(updates), "--num-workers", "0",
        "--disable-validation", "--seed", "3"])
    return os.path.join(str(save_dir), "checkpoint_last.pt")


def run_script(script, argv):
    return subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))


def load(path):
    from fairseq import checkpoint_utils
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    return models[0].eval(), cfg, task


def translation_logits(model, vocab, seed=0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 9), generator=generator)
    prev = torch.randint(4, vocab, (3, 6), generator=generator)
    prev[:, 0] = 2  # eos starts the target, as fairseq's prev_output_tokens
    with torch.no_grad():
        return model(src, torch.full((3,), 9), prev)[0]


def lm_logits(model, vocab, seed=0):
    tokens = torch.randint(4, vocab, (3, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(tokens)[0]


def chains(model):
    from slim_fairseq.compression import is_tensor_chain
    return [name for name, module in model.named_modules() if is_tensor_chain(module)]


# ------------------------------------------------------------------------------ TT-SVD itself

def _full_bond(module):
    pairs = [a * c for a, c in zip(module.in_factors, module.out_factors)]
    return max(min(math.prod(pairs[:i]), math.prod(pairs[i:])) for i in range(1, len(pairs)))


@pytest.mark.parametrize("length", [2, 3])
def test_tt_svd_at_full_bond_reproduces_the_dense_weight(length):
    from slim_fairseq.compression import fill_from_dense
    from slim_fairseq.modules.tensor_chain import TensorChainEmbedding, TensorChainLinear
    torch.manual_seed(0)
    weight = torch.randn(40, 24)  # nn.Linear layout [out, in]
    probe = TensorChainLinear(24, 40, bond=2, length=length)
    linear = TensorChainLinear(24, 40, bond=_full_bond(probe), length=length)
    assert fill_from_dense(linear, weight) < 1e-6
    assert (linear.weight - weight).abs().max() < 1e-5
    x = torch.randn(5, 24)
    assert (linear(x) - (x @ weight.t() + linear.bias)).abs().max() < 1e-5

    table = torch.randn(30, 16)
    table[1] = 0  # fairseq's padding row
    probe = TensorChainEmbedding(30, 16, padding_idx=1, bond=2, length=length)
    embedding = TensorChainEmbedding(30, 16, padding_idx=1, bond=_full_bond(probe), length=length)
    assert fill_from_dense(embedding, table) < 1e-6
    tokens = torch.tensor([[0, 1, 5, 29], [7, 3, 1, 12]])
    assert (embedding(tokens) - table[tokens]).abs().max() < 1e-5


def test_error_falls_with_the_ratio_and_is_the_best_rank_error():
    """A larger --tc-* ratio gives a larger bond and a smaller error. For two cores the TT-SVD is
    one truncated SVD of the pair-grouped unfolding, so the error is exactly the Eckart-Young
    error of that unfolding at the bond."""
    from slim_fairseq.compression import fill_from_dense
    from slim_fairseq.modules.tensor_chain import TensorChainLinear
    torch.manual_seed(0)
    weight = torch.randn(128, 64) @ torch.diag(torch.linspace(1.0, 0.05, 64))  # decaying spectrum
    bonds, errors = [], []
    for ratio in (0.05, 0.1, 0.2, 0.4, 0.8, 1.0):
        module = TensorChainLinear(64, 128, ratio=ratio)
        error = fill_from_dense(module, weight)
        unfolding = weight.t().double().reshape(*module.in_factors, *module.out_factors)
        unfolding = unfolding.permute(0, 2, 1, 3).reshape(
            module.in_factors[0] * module.out_factors[0], -1)
        singular = torch.linalg.svdvals(unfolding)
        best = singular[module.bond:].norm() / singular.norm()
        assert abs(error - best.item()) < 1e-6, (ratio, error, best)
        assert abs((module.weight - weight).norm() / weight.norm() - error) < 1e-4
        bonds.append(module.bond)
        errors.append(error)
    assert bonds == sorted(bonds) and len(set(bonds)) == len(bonds), bonds
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    # three cores: still never worse with a larger ratio
    errors3 = [fill_from_dense(TensorChainLinear(64, 128, ratio=r, length=3), weight)
               for r in (0.05, 0.2, 0.8)]
    assert errors3[0] >= errors3[1] >= errors3[2], errors3


# ---------------------------------------------------------------------- compressing checkpoints

@pytest.fixture(scope="module")
def dense_untied(tmp_path_factory):
    """fairseq's own transformer, a few updates on the bundled en-de, separate embeddings."""
    return train(tmp_path_factory.mktemp("dense_untied"), translation_args(),
                 ["--arch", "transformer", *TINY])


@pytest.fixture(scope="module")
def dense_tied(tmp_path_factory):
    """fairseq's transformer with --share-all-embeddings (one table for encoder, decoder, output)."""
    return train(tmp_path_factory.mktemp("dense_tied"), translation_args(),
                 ["--arch", "transformer", "--share-all-embeddings", *TINY])


def _fit_weights_to_bonds(path, out, ratios):
    """Rewrite the trained checkpoint so that every weight the compression will replace already
    has TT-ranks within the bond of its ratio (its own TT-SVD at that bond): then compression
    must reproduce the model exactly. (A ratio <= 1 never reaches the full bond of a generic
    matrix: b (a1 c1 + a2 c2) <= a1 c1 a2 c2 forces b < min(a1 c1, a2 c2).)"""
    from slim_fairseq.compression import fill_from_dense
    from slim_fairseq.modules.tensor_chain import (TensorChainEmbedding, TensorChainLinear,
                                                   materialise)
    state = torch.load(path, weights_only=True)
    model = state["model"]
    for key, weight in list(model.items()):
        parts = key.split(".")
        if parts[-1] != "weight":
            continue
        if parts[-2] in ("fc1", "fc2"):
            ratio = ratios["tc_ff"]
        elif parts[-2] in ("q_proj", "k_proj", "v_proj"):
            ratio = ratios["tc_patt"]
        elif parts[-2] == "output_projection":
            ratio = ratios["tc_output"]
        elif parts[-2] == "embed_tokens":
            ratio = ratios["tc_emb"]
        else:
            continue
        if parts[-2] == "embed_tokens":
            module = TensorChainEmbedding(*weight.shape, padding_idx=1, ratio=ratio)
        else:
            module = TensorChainLinear(weight.shape[1], weight.shape[0], ratio=ratio)
        fill_from_dense(module, weight)
        # unmasked product of the cores (a dense table's padding row is looked up unmasked;
        # the test inputs hold no padding)
        model[key] = materialise(list(module.cores)).t().contiguous() if parts[-2] != "embed_tokens" \
            else materialise(list(module.cores))
    torch.save(state, out)


def test_compressed_model_reproduces_the_original_when_the_bond_suffices(dense_untied, tmp_path):
    from slim_fairseq.compression import compress_checkpoint
    ratios = dict(tc_ff=0.3, tc_patt=0.4, tc_emb=0.2, tc_output=0.25)
    original = tmp_path / "fitted.pt"
    _fit_weights_to_bonds(dense_untied, original, ratios)
    records, flags = compress_checkpoint(str(original), str(tmp_path / "tc.pt"), **ratios)
    # 2 encoder + 1 decoder layer: ff 2 each, patt 3 per attention (+ cross), 2 tables, output
    assert len(records) == 3 * 2 + 4 * 3 + 2 + 1
    assert max(r["rel_error"] for r in records) < 1e-5
    dense, _, task = load(original)
    tc, cfg, _ = load(tmp_path / "tc.pt")
    assert type(tc).__name__ == "SlimTransformerModel" and cfg.model.arch == "slim_transformer"
    assert len(chains(tc)) == len(records)
    assert sum(p.numel() for p in tc.parameters()) < 0.6 * sum(p.numel() for p in dense.parameters())
    vocab = len(task.source_dictionary)
    reference = translation_logits(dense, vocab)
    assert (translation_logits(tc, vocab) - reference).abs().max() < 1e-4 * reference.abs().max()
    assert flags[:2] == ["--arch", "slim_transformer"] and "--tc-emb" in flags


def test_compression_without_fitting_loses_accuracy_with_a_smaller_ratio(dense_untied, tmp_path):
    """On the trained weights themselves: the outputs move away from the original as the ratio
    shrinks (the ratio is the only knob, as for a freshly built TC layer)."""
    from slim_fairseq.compression import compress_checkpoint
    dense, _, task = load(dense_untied)
    vocab = len(task.source_dictionary)
    reference = translation_logits(dense, vocab)
    gaps = []
    for ratio in (0.9, 0.3, 0.1):
        out = tmp_path / f"tc{ratio}.pt"
        compress_checkpoint(dense_untied, str(out), tc_ff=ratio, tc_patt=ratio)
        gaps.append((translation_logits(load(out)[0], vocab) - reference).norm().item())
    assert gaps[0] < gaps[1] < gaps[2], gaps


def test_compress_then_export_gives_back_fairseqs_transformer(dense_untied, tmp_path):
    """compress -> export_dense --plain-fairseq: fairseq's own TransformerModel holding the
    materialised chains, with the compressed model's outputs."""
    from fairseq.models.transformer import TransformerModel
    from slim_fairseq.compression import compress_checkpoint, export_dense_checkpoint
    compressed = tmp_path / "tc.pt"
    compress_checkpoint(dense_untied, str(compressed), tc_layer=0.3, tc_output=0.2)
    plain_path = tmp_path / "plain.pt"
    export_dense_checkpoint(str(compressed), str(plain_path), plain_fairseq=True)
    tc, _, task = load(compressed)
    plain, cfg, _ = load(plain_path)
    assert type(plain) is TransformerModel and cfg.model.arch == "transformer"
    assert not hasattr(cfg.model, "tc_ff")
    vocab = len(task.source_dictionary)
    reference = translation_logits(tc, vocab)
    assert (translation_logits(plain, vocab) - reference).abs().max() <= 1e-5 * reference.abs().max()
    original = load(dense_untied)[0]
    assert sorted(plain.state_dict()) == sorted(original.state_dict())


def test_plain_fairseq_export_ignores_every_tensor_chain_option():
    """--plain-fairseq refuses models that use another technique of the plugin; the options that
    only shape a chain (--tc-length, --tc-min-bond, --tc-backward) are not one: the export removes
    the chains. --tc-min-bond used to count as another technique and blocked the export."""
    import argparse

    from slim_fairseq.compression import other_techniques
    chains_only = argparse.Namespace(tc_ff=0.3, tc_patt=0.2, tc_length=3, tc_min_bond=8, tc_backward="store")
    assert other_techniques(chains_only) == []
    assert other_techniques(argparse.Namespace(**vars(chains_only), ffn_glu=True)) == ["--ffn-glu"]


@pytest.mark.slow
def test_compress_language_model_and_back(tmp_path):
    """fairseq's transformer_lm (pre-norm, as slim_lm always is) -> slim_lm with chains in every
    place -> export --plain-fairseq: fairseq's TransformerLanguageModel with the compressed
    model's outputs. A post-norm transformer_lm is refused with one line."""
    from fairseq.models.transformer_lm import TransformerLanguageModel
    from slim_fairseq.compression import compress_checkpoint, export_dense_checkpoint
    from slim_fairseq.option_errors import OptionError
    dense_path = train(tmp_path / "lm", lm_args(), ["--arch", "transformer_lm", *TINY_LM,
                                                     "--decoder-normalize-before"], updates=2)
    compressed, plain_path = tmp_path / "tc.pt", tmp_path / "plain.pt"
    records, flags = compress_checkpoint(dense_path, str(compressed), tc_layer=0.3, tc_emb=0.2,
                                         tc_output=0.25)
    assert len(records) == 2 * (3 + 2) + 1 + 1 and flags[:2] == ["--arch", "slim_lm"]
    export_dense_checkpoint(str(compressed), str(plain_path), plain_fairseq=True)
    tc, _, task = load(compressed)
    plain, cfg, _ = load(plain_path)
    assert type(tc).__name__ == "SlimLanguageModel" and type(plain) is TransformerLanguageModel
    vocab = len(task.source_dictionary)
    reference = lm_logits(tc, vocab)
    assert (lm_logits(plain, vocab) - reference).abs().max() <= 1e-5 * reference.abs().max()

    state = torch.load(dense_path, weights_only=True)
    state["cfg"]["model"]["decoder_normalize_before"] = False
    torch.save(state, tmp_path / "post_norm.pt")
    with pytest.raises(OptionError, match="post-norm"):
        compress_checkpoint(str(tmp_path / "post_norm.pt"), str(tmp_path / "x.pt"), tc_ff=0.3)


@pytest.mark.slow
def test_cli_compressed_checkpoint_generates_and_fine_tunes(dense_tied, tmp_path):
    out = tmp_path / "tc.pt"
    proc = run_script(COMPRESS, [dense_tied, str(out), "--tc-ff", "0.3", "--tc-patt", "0.5"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "relative error" in proc.stderr and "Tensor Chains" in proc.stderr
    flags = shlex.split(next(line for line in proc.stdout.splitlines()
                             if line.startswith("model flags: "))[len("model flags: "):])
    assert "--share-all-embeddings" in flags and flags[-4:] == ["--tc-ff", "0.3", "--tc-patt", "0.5"]
    state = torch.load(out, weights_only=True)  # fairseq's layout, safe loading
    assert state["cfg"]["model"].arch == "slim_transformer" and state["cfg"]["model"].tc_ff == 0.3
    model = state["model"]
    assert "encoder.layers.0.fc1.cores.0" in model and "encoder.layers.0.fc1.weight" not in model
    assert torch.equal(model["encoder.embed_tokens.table.weight"],
                       model["decoder.output_projection.weight"])

    out_gen = run_cli("fairseq-generate", translation_args() + [
        "--path", str(out), "--gen-subset", "test", "--beam", "2", "--max-len-a", "0",
        "--max-len-b", "5", "--batch-size", "50", "--required-batch-size-multiple", "1",
        "--remove-bpe"])
    assert "Translated 100 sentences" in out_gen and "BLEU" in out_gen

    save = tmp_path / "finetune"
    out_train = run_cli("fairseq-train", translation_args() + flags + [
        "--restore-file", str(out), "--reset-optimizer", "--optimizer", "adam", "--lr", "1e-3",
        "--batch-size", "16", "--save-dir", str(save), "--max-update", "2", "--num-workers", "0",
        "--max-valid-steps", "1"])
    assert "Loaded checkpoint" in out_train and "@ 0 updates" in out_train
    assert "num_updates 2" in out_train
    tuned = torch.load(save / "checkpoint_last.pt", weights_only=True)["model"]
    assert tuned["encoder.layers.0.fc1.cores.0"].shape == model["encoder.layers.0.fc1.cores.0"].shape
    assert not torch.equal(tuned["encoder.layers.0.fc1.cores.0"], model["encoder.layers.0.fc1.cores.0"])


def _one_line_error(capsys, script, argv, *words):
    """Run a script's main() in this process: exit status 2 and one ``error:`` line on stderr
    that contains ``words``."""
    module = load_script(script)
    capsys.readouterr()
    assert module.main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(lines) == 1, captured.err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.slow
def test_wrong_input_gives_a_one_line_error(dense_tied, tc_translation, tmp_path, capsys):
    out = str(tmp_path / "x.pt")
    _one_line_error(capsys, "compress_checkpoint", [tc_translation, out, "--tc-ff", "0.3"],
                    "arch 'slim_transformer'", "transformer")
    _one_line_error(capsys, "export_dense", [dense_tied, out], "arch 'transformer'", "slim_transformer")
    _one_line_error(capsys, "compress_checkpoint", [dense_tied, out, "--tc-ff", "1.5"], "--tc-ff", "[0, 1]")
    _one_line_error(capsys, "compress_checkpoint", [dense_tied, out], "--tc-ff")
    _one_line_error(capsys, "compress_checkpoint", [dense_tied, out, "--tc-output", "0.2"],
                    "--tc-output", "tied")
    _one_line_error(capsys, "compress_checkpoint", [str(tmp_path / "missing.pt"), out, "--tc-ff", "0.2"],
                    "does not exist")
    _one_line_error(capsys, "export_dense", [tc_translation, out, "--plain-fairseq"],
                    "--plain-fairseq", "--ffn-glu", "--self-attn-gate", "--output-bias")
    assert not os.path.exists(out)


# ------------------------------------------------------------------------------- dense export

@pytest.fixture(scope="module")
def tc_translation(tmp_path_factory):
    """slim_transformer with Tensor Chains in every place (and a GLU FFN and a gate around them)."""
    return train(tmp_path_factory.mktemp("tc_translation"), translation_args(), [
        "--arch", "slim_transformer", *TINY, "--tc-ff", "0.3", "--tc-patt", "0.4",
        "--tc-emb", "0.2", "--tc-output", "0.25", "--ffn-glu", "--self-attn-gate", "qgv",
        "--output-bias", "--tc-min-bond", "2"], updates=2)


@pytest.fixture(scope="module")
def tc_lm(tmp_path_factory):
    return train(tmp_path_factory.mktemp("tc_lm"), lm_args(), [
        "--arch", "slim_lm", *TINY_LM, "--tc-layer", "0.3", "--tc-emb", "0.2",
        "--tc-output", "0.3", "--tc-length", "3"], updates=2)


def _check_export(path, tmp_path, logits):
    out = tmp_path / "dense.pt"
    proc = run_script(EXPORT, [path, str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, cfg, task = load(path)
    dense, dense_cfg, _ = load(out)
    assert chains(model) and not chains(dense)
    for place in ("tc_ff", "tc_patt", "tc_layer", "tc_emb", "tc_output"):
        assert getattr(dense_cfg.model, place) == 0.0
    # options that only shape a chain go back to their defaults: with no chain left, the option
    # checks refuse them (a --tc-min-bond or --tc-length model could not be exported)
    assert (dense_cfg.model.tc_length, dense_cfg.model.tc_min_bond) == (2, 0)
    assert dense_cfg.model.arch == cfg.model.arch
    linears = [m for m in dense.modules() if type(m) is torch.nn.Linear]
    assert len(linears) > len([m for m in model.modules() if type(m) is torch.nn.Linear])
    vocab = len(task.target_dictionary)
    reference = logits(model, vocab)
    assert (logits(dense, vocab) - reference).abs().max() <= 1e-5 * reference.abs().max() + 1e-5
    return out


@pytest.mark.slow
def test_export_dense_encoder_decoder(tc_translation, tmp_path):
    out = _check_export(tc_translation, tmp_path, translation_logits)
    state = torch.load(out, weights_only=True)["model"]
    assert "encoder.embed_tokens.table.weight" in state
    assert "decoder.output_projection.bias" in state
    assert not [key for key in state if ".cores." in key]
    gen = run_cli("fairseq-generate", translation_args() + [
        "--path", str(out), "--gen-subset", "test", "--beam", "2", "--max-len-a", "0",
        "--max-len-b", "3", "--batch-size", "50", "--required-batch-size-multiple", "1"])
    assert "Translated 100 sentences" in gen


@pytest.mark.slow
def test_export_dense_language_model(tc_lm, tmp_path):
    _check_export(tc_lm, tmp_path, lm_logits)


# ------------------------------------------------------------------------- the demonstration

def test_compress_demo_parsers(dense_tied):
    compress_demo = load_script("compress_demo")
    output = ("2026-01-01 | INFO | valid | valid on 'valid' subset | loss 8.49 | nll_loss 7.73 | "
              "ppl 211.7 | wps 2669 | wpb 986 | bsz 74")
    assert compress_demo.parse_validate("noise\n" + output) == 211.7
    with pytest.raises(RuntimeError):
        compress_demo.parse_validate("no record")
    total, body = compress_demo.checkpoint_params(dense_tied)
    model = load(dense_tied)[0]
    assert total == sum(p.numel() for p in model.parameters())  # the shared table once
    assert body == sum(p.numel() for name, p in model.named_parameters()
                       if "embed_tokens" not in name and "output_projection" not in name)


@pytest.mark.slow
def test_compress_demo_tiny(tmp_path):
    compress_demo = load_script("compress_demo")
    data = ende_data_bin()
    rows = compress_demo.main([
        "--out", str(tmp_path / "demo"), "--dim", "32", "--layers", "1", "--heads", "2",
        "--max-update", "2", "--finetune-updates", "2", "--max-tokens", "512", "--ratios", "0.5",
        "--scratch-ratios", "0.5", "--beam", "1", "--threads", "1", "--ende-data", data,
        "--bpe-codes", os.path.join(os.path.dirname(data), "bpe", "codes")])
    assert list(rows) == ["transformer", "transformer +ft", "TC 0.5", "TC 0.5 +ft", "TC 0.5 scratch"]
    for row in rows.values():
        assert row["valid_ppl"] > 1 and row["test_bleu"] is not None
    assert rows["TC 0.5"]["body_params"] < rows["transformer"]["body_params"]
    assert rows["TC 0.5"]["params"] == rows["TC 0.5 scratch"]["params"]
    assert 0 < rows["TC 0.5"]["mean_rel_error"] < 1
    train_log = (tmp_path / "demo" / "runs" / "tc0.5_ft" / "train.log").read_text()
    assert "Loaded checkpoint" in train_log and "(epoch 1 @ 0 updates)" in train_log
    assert "TC 0.5 scratch" in (tmp_path / "demo" / "table.md").read_text()


@pytest.mark.parametrize("arch, lm, overrides", [
    ("stlm_tied", True, ["--decoder-embed-dim", "64", "--decoder-layers", "2"]),
    ("anthe_lm_gpt2_small", True, ["--decoder-embed-dim", "64", "--decoder-layers", "2"]),
    ("subformer_base", False, ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64"])])
def test_model_flags_rebuild_the_model_of_a_preset(arch, lm, overrides):
    """The flags model_flags gives, with --arch the preset's model, build a config equal in every
    model option; a preset whose options are refused one at a time (a GLU's --glu-hidden without
    --ffn-glu) is no exception."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from helpers import parse_train_args, task_args
    from slim_fairseq import compression
    args = parse_train_args(task_args(lm) + ["--arch", arch, "--cpu"] + overrides)
    flags = compression.model_flags(args, compression._model_name(arch))
    again = parse_train_args(task_args(lm) + ["--cpu"] + flags)
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS, add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    # a language model's positions are the task's (--tokens-per-sample), not a model option
    options = [a.dest for a in parser._actions if a.option_strings
               and not (lm and a.dest.startswith("max_"))]
    assert options and flags[:2] == ["--arch", compression._model_name(arch)]
    assert {k: getattr(again, k, None) for k in options} == {k: getattr(args, k, None) for k in options}
