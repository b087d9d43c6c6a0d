"""The combination contract: any combination of the plugin's options, on any preset, either
builds, trains, and passes the architecture contract, or is refused in one line before anything
is built (docs/DESIGN.md, "Options").

A seeded random draw: each case takes a preset of the plugin (shrunk by its model's
``contract_overrides``) and 1-3 options with values from :data:`VALUES`, then

* refused: the error is one line in the plugin's format (``--flag=value: ...; allowed: ...``),
  raised while fairseq parses the command line (nothing built);
* built: two Adam updates, then incremental == full forward (with a beam reorder), no future
  leak, padding invariance (in fp32, or in float64 where fp32 rounding alone misses:
  ``contract.exact_up_to_fp32_rounding``) and a checkpoint round trip
  (slim_fairseq_lab.contract); and every
  drawn option changes the model: without it the parameters or the outputs differ (an option
  that builds but changes nothing is a silent no-op).

A traceback, or an option that changes nothing, fails with the seed and the command line.
``SLIM_COMBINATIONS=N`` draws N cases per model (default :data:`DEFAULT_CASES`);
``SLIM_COMBINATION_SEED=S`` starts the draw elsewhere.
"""
import os
import random

import pytest
import torch

from helpers import USER_DIR, plugin_archs, task_args
from slim_fairseq_lab import contract

DEFAULT_CASES = 100  # per model: 200 cases cover every flag of VALUES at least twice
CASES = int(os.environ.get("SLIM_COMBINATIONS", DEFAULT_CASES))
FIRST_SEED = int(os.environ.get("SLIM_COMBINATION_SEED", 0))

# option -> the values a case draws (a flag without a value is drawn as itself); values that
# are refused in some combinations are drawn too: the refusal is part of what is tested
VALUES = {
    "--self-attn-gate": ["qgv", "kgv", "vgq", "vgk", "qgk", "kgq"],
    "--cross-attn-gate": ["kgv", "vgk", "qgv"],
    "--no-patt": [None],
    "--ffn-glu": [None],
    "--no-ffn-glu": [None],
    "--glu-hidden": ["full"],
    "--activation-fn": ["gelu", "silu", "tanh"],
    "--hsoftpos-levels": ["1", "2"],
    "--hsoftpos-min-token-dim": ["12"],
    "--tc-ff": ["0.3"],
    "--tc-patt": ["0.3"],
    "--tc-layer": ["0.2"],
    "--tc-emb": ["0.3"],
    "--tc-output": ["0.3"],
    "--tc-length": ["3"],
    "--tc-min-bond": ["6"],
    "--tc-backward": ["store", "recompute"],
    "--tc-forward": ["contract", "materialise"],
    "--output-bias": [None],
    "--safe-embed-dim": ["16"],
    "--safe-output": ["mlp"],
    "--sandwich": [None],
    "--sandwich-dim": ["48"],
    "--sandwich-ffn-dim": ["64"],
    "--sandwich-heads": ["2"],
    "--sandwich-cross-norm": ["none"],
    "--bert-init": [None],
    "--tie-ffn": ["0"],
    "--ffn-lora-rank": ["2"],
    "--ffn-lora-alpha": ["4"],
    "--tie-attn-proj": ["0"],
    "--kv-heads": ["1", "2"],
    "--head-dim": ["6", "4"],
    "--rope-theta": ["10000"],
    "--norm": ["rmsnorm", "none", "layernorm"],
    "--rms-norm-eps": ["1e-5"],
    "--no-linear-bias": [None],
    "--linear-bias": [None],
    "--init-std": ["0.05"],
    "--skipless-layout": ["serial", "parallel"],
    "--mlp-branch-scale": ["0.5"],
    "--removed-weights": ["q", "k"],
    "--keep-attn-out-proj": [None],
    "--layernorm-embedding": [None],
    "--no-scale-embedding": [None],
    "--no-token-positional-embeddings": [None],
    "--share-decoder-input-output-embed": [None],
    "--no-share-decoder-input-output-embed": [None],
    "--decoder-learned-pos": [None],
    "--no-decoder-normalize-before": [None],
    "--decoder-normalize-before": [None],
    "--quant-noise-pq": ["0.1"],
}
# options that may leave the model as it is, and why that is not a silent no-op (what each
# does is tested on its own)
MAY_CHANGE_NOTHING = {
    "--tc-backward": "keeps other tensors for backward, same values (test_training_memory)",
    "--tc-forward": "multiplies the same chain another way, same values (test_gpu_check)",
    "--tc-min-bond": "a floor: it changes a chain only where the ratio gives a lower bond",
    "--hsoftpos-min-token-dim": "a floor: it changes the split only where the paper's token "
                                "table is narrower",
}


def _archs():
    archs = plugin_archs()
    by_model = {}
    for arch, cls in archs.items():
        by_model.setdefault(cls.__name__, []).append(arch)
    return archs, by_model


def _accepted(model_cls):
    """The flags ``model_cls``'s parser takes (a draw uses only those: argparse refuses the
    others before the plugin sees them)."""
    import argparse
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    return set(parser._option_string_actions)


def draw(seed):
    """(arch, [(flag, value), ...]) of case ``seed``."""
    archs, by_model = _archs()
    rng = random.Random(seed)
    model = sorted(by_model)[seed % len(by_model)]
    arch = rng.choice(sorted(by_model[model]))
    shrunk = set(archs[arch].contract_overrides(arch))  # flags the tiny preset already sets
    pool = sorted(set(VALUES) & _accepted(archs[arch]) - shrunk)
    # the first option goes round every flag of VALUES, so any 2 x len(VALUES) cases draw each
    first = sorted(VALUES)[(seed // 2) % len(VALUES)]
    rest = rng.sample([flag for flag in pool if flag != first], rng.randint(0, 2))
    flags = ([first] if first in pool else []) + rest
    if not flags:
        flags = rng.sample(pool, 1)
    return arch, [(flag, rng.choice(VALUES[flag])) for flag in flags]


def argv_of(options):
    out = []
    for flag, value in options:
        out += [flag] if value is None else [flag, value]
    return out


def _command(arch, options, lm):
    archs = plugin_archs()
    return (["fairseq-train", *task_args(lm), "--arch", arch, "--user-dir", USER_DIR, "--cpu",
             *archs[arch].contract_overrides(arch), *argv_of(options)])


def _parse(arch, options, lm):
    """fairseq-train's parse of the case's command line (the plugin's checks run here)."""
    from fairseq import options as fairseq_options
    contract.load_plugin()
    archs = plugin_archs()
    parser = fairseq_options.get_training_parser()
    return fairseq_options.parse_args_and_arch(parser, input_args=[
        *task_args(lm), "--arch", arch, "--user-dir", USER_DIR, "--cpu",
        *archs[arch].contract_overrides(arch), *argv_of(options)])


def _options(args):
    """The parsed options, without the parser's notes of which flags were written."""
    from slim_fairseq.models.slim_options import FLAG_NOTES
    return {k: v for k, v in vars(args).items() if k not in FLAG_NOTES}


def _build(args):
    from fairseq import tasks
    task = tasks.setup_task(args)
    torch.manual_seed(1)
    return task, task.build_model(args)


def _train(model, task, args, lm, steps=2, seed=0):
    """Two Adam updates on the contract's training sample (dropout off: the comparison of a
    model with and without an option stays deterministic)."""
    torch.manual_seed(seed)
    criterion = task.build_criterion(args)
    sample = contract.training_sample(task, lm)
    # lr 1e-3: two updates move every weight (LoRA's B, W_Q of shaped attention start at 0) while
    # a skipless GLU stack, which squares its scale per block, keeps log-probs of order log V
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
    model.eval()
    return loss.item()


def _fingerprint(model, task, lm):
    """What an option may change: parameter names and shapes, and the outputs on a batch."""
    shapes = sorted((name, tuple(p.shape)) for name, p in model.named_parameters())
    net_input, _ = contract.make_batch(task, lm, seed=5)
    with torch.no_grad():
        out = contract.log_probs(model, net_input)
    return shapes, out


def _same(a, b):
    return a[0] == b[0] and torch.equal(a[1], b[1])


def _refusal_line(error):
    text = str(getattr(error, "code", None) or error)
    return text.split(": error: ", 1)[-1]


def run_case(seed, tmp_path):
    """Run case ``seed``; returns "refused" or "built" (raises AssertionError with the command
    line on a contract failure)."""
    archs, _ = _archs()
    arch, options = draw(seed)
    lm = contract.is_lm(archs[arch])
    where = f"seed {seed}: {' '.join(_command(arch, options, lm))}"
    try:
        args = _parse(arch, options, lm)
    except (ValueError, SystemExit) as error:
        line = _refusal_line(error)
        assert "\n" not in line and line.startswith("--") and "; allowed: " in line, \
            f"{where}\nnot a one-line option error: {error!r}"
        return "refused"
    except Exception as error:  # noqa: BLE001 -- anything else is a traceback for the user
        raise AssertionError(f"{where}\n{type(error).__name__}: {error}") from error
    parsed = _options(args)  # before the build adds its own fields
    try:
        task, model = _build(args)
    except Exception as error:  # noqa: BLE001 -- accepted at parse time, it must build
        raise AssertionError(f"{where}\naccepted when parsed, then failed to build: "
                             f"{type(error).__name__}: {error}") from error
    try:
        contract.check_gradients(arch, model, task, args, lm)
        _train(model, task, args, lm)
        for check in (contract.check_incremental, contract.check_no_future_leak,
                      contract.check_padding_invariance):
            contract.exact_up_to_fp32_rounding(check, arch, model, task, lm)
        contract.check_checkpoint_round_trip(arch, model, task, args, lm, tmp_path)
        mine = _fingerprint(model, task, lm)
        for i, (flag, value) in enumerate(options):
            try:
                other_args = _parse(arch, options[:i] + options[i + 1:], lm)
            except (ValueError, SystemExit):
                continue  # the option is what made the rest valid: it does something
            if _options(other_args) == parsed or flag in MAY_CHANGE_NOTHING:
                continue  # it restates what the model has without it
            if flag == "--share-decoder-input-output-embed" and (
                    getattr(args, "share_all_embeddings", False) or args.safe_embed_dim):
                continue  # tied anyway: by --share-all-embeddings, or SAFE's own output path
            other_task, other = _build(other_args)
            _train(other, other_task, other_args, lm)
            assert not _same(mine, _fingerprint(other, other_task, lm)), \
                f"{flag} {value or ''} builds but changes nothing (same parameters and outputs " \
                "without it)"
    except AssertionError as error:
        raise AssertionError(f"{where}\n{error}") from error
    return "built"


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_random_option_combinations(chunk, tmp_path):
    """A quarter of the draw per test (they run in parallel); each model gets every fourth seed
    pair."""
    outcomes = {}
    seeds = [s for s in range(FIRST_SEED, FIRST_SEED + 2 * CASES) if s % 4 == chunk]
    for seed in seeds:
        outcomes[seed] = run_case(seed, tmp_path)
    assert "built" in outcomes.values(), outcomes


def test_the_draw_covers_every_model_and_option():
    """Over the default draw, both models and every option of VALUES appear, and the option
    vocabulary has no flag the draw leaves out (a new option needs its values here)."""
    from slim_fairseq.models.slim_options import OPTIONS

    archs, by_model = _archs()
    seen_models, seen_flags = set(), set()
    for seed in range(FIRST_SEED, FIRST_SEED + 2 * DEFAULT_CASES):
        arch, options = draw(seed)
        seen_models.add(archs[arch].__name__)
        seen_flags |= {flag for flag, _ in options}
    assert seen_models == set(by_model)
    assert seen_flags == set(VALUES)
    plugin_flags = {flag for option in OPTIONS for flag in option.flags()}
    assert plugin_flags <= set(VALUES) | {"--no-output-bias", "--no-sandwich", "--no-bert-init",
                                          "--no-keep-attn-out-proj"}


def test_fp32_rounding_is_told_from_a_wrong_result():
    """A skipless SwiGLU stack (no norm, scale squared per block) at the Pythia shape, with its
    feed-forward branch doubled, reaches log-probs of tens of nats after two updates, and fp32
    rounding alone moves its incremental step past the fp32 tolerance: the float64 re-check
    passes it, naming the fp32 path it excused, and still fails a check that is wrong in every
    dtype."""
    arch = "skipless_lm_pythia_6_9b"
    args = _parse(arch, [("--ffn-glu", None), ("--mlp-branch-scale", "2")], True)
    task, model = _build(args)
    _train(model, task, args, True)
    with pytest.raises(AssertionError, match="differs from the full forward"):
        contract.check_incremental(arch, model, task, True)
    with pytest.warns(contract.Fp32Excused, match=r"^check_incremental excused the fp32 path of "
                      rf"{arch} as rounding \({arch}: step \d+ differs from the full forward by "):
        worst = contract.exact_up_to_fp32_rounding(contract.check_incremental, arch, model, task,
                                                   True)
    assert worst <= 1e-9

    def wrong_in_every_dtype(arch, model, task, lm):
        raise AssertionError(f"{arch}: wrong in {next(model.parameters()).dtype}")

    with pytest.raises(AssertionError, match="wrong in torch.float64"):
        contract.exact_up_to_fp32_rounding(wrong_in_every_dtype, arch, model, task, True)


def test_output_checks_build_no_autograd_graph():
    """The output checks compare forwards only: every forward they run is under no_grad."""
    args = _parse("slim_lm", [], True)
    task, model = _build(args)
    grad_enabled = []
    model.decoder.register_forward_hook(lambda *_: grad_enabled.append(torch.is_grad_enabled()))
    for check in (contract.check_incremental, contract.check_no_future_leak,
                  contract.check_padding_invariance):
        grad_enabled.clear()
        check("slim_lm", model, task, True)
        assert grad_enabled and not any(grad_enabled), check.__name__
