"""Every option of the plugin reaches the module that uses it: a tiny model built with the
option at a non-default value differs from the same model without it, where the option should
matter (docs/DESIGN.md, "From a flag to the code").

The cases are derived from the option table (``table_options()``): each option needs a row in
:data:`REACH` (a model, the options that switch on what it shapes, its non-default value), so
an option registered later fails here until its row is written. An option is proven to reach
its module when the two built models differ in

* their parameters (names, shapes or initial values: a structure or an init option), or
* their log-probabilities with the same weights loaded into both (every weight moved off its
  initial value, LoRA's zero B included), or
* for the options that change how a module computes but not what (:data:`SAME_VALUES`), the
  setting each such module stores.

An option parsed and validated but never handed to its module leaves the model as the
default's, and fails here.
"""
import pytest
import torch

from helpers import build, unregister
from hf_export_fixtures import TINY_LM, TINY_MT, perturb_
from slim_fairseq.models.slim_options import table_options
from slim_fairseq_lab.contract import make_batch

LM, MT = "lm", "mt"
DEEP = ["--decoder-layers", "4"]
CHAIN = ["--tc-ff", "0.3"]
SANDWICH = DEEP + ["--sandwich"]
SKIPLESS = ["--skipless-layout", "serial", "--no-linear-bias"]
TIED_FFN = DEEP + ["--tie-ffn", "0"]

# dest -> (model, the options the case needs on both sides, the option at a non-default value)
REACH = {
    "ffn_glu": (LM, [], ["--ffn-glu"]),
    "glu_hidden": (LM, ["--ffn-glu"], ["--glu-hidden", "full"]),
    "tc_ff": (LM, [], ["--tc-ff", "0.3"]),
    "tc_patt": (LM, [], ["--tc-patt", "0.3"]),
    "tc_layer": (LM, [], ["--tc-layer", "0.2"]),
    "tc_emb": (LM, [], ["--tc-emb", "0.3"]),
    "tc_output": (LM, [], ["--tc-output", "0.3"]),
    "tc_length": (LM, CHAIN, ["--tc-length", "3"]),
    "tc_min_bond": (LM, CHAIN, ["--tc-min-bond", "12"]),
    "tc_backward": (LM, CHAIN, ["--tc-backward", "store"]),
    "tc_forward": (LM, CHAIN, ["--tc-forward", "contract"]),
    "hsoftpos_levels": (LM, [], ["--hsoftpos-levels", "1"]),
    "hsoftpos_min_token_dim": (LM, ["--hsoftpos-levels", "2"], ["--hsoftpos-min-token-dim", "24"]),
    "output_bias": (LM, [], ["--output-bias"]),
    "self_attn_gate": (LM, [], ["--self-attn-gate", "qgv"]),
    "cross_attn_gate": (MT, [], ["--cross-attn-gate", "kgv"]),
    "no_patt": (LM, [], ["--no-patt"]),
    "safe_embed_dim": (LM, [], ["--safe-embed-dim", "16"]),
    "safe_output": (LM, ["--safe-embed-dim", "16"], ["--safe-output", "mlp"]),
    "sandwich": (LM, DEEP, ["--sandwich"]),
    "sandwich_dim": (LM, SANDWICH, ["--sandwich-dim", "48"]),
    "sandwich_ffn_dim": (LM, SANDWICH, ["--sandwich-ffn-dim", "64"]),
    "sandwich_heads": (LM, SANDWICH, ["--sandwich-heads", "2"]),
    "sandwich_cross_norm": (MT, ["--encoder-layers", "4", "--sandwich", "--sandwich-dim", "48"]
                            + DEEP, ["--sandwich-cross-norm", "none"]),
    "bert_init": (LM, [], ["--bert-init"]),
    "tie_ffn": (LM, DEEP, ["--tie-ffn", "0"]),
    "ffn_lora_rank": (LM, TIED_FFN, ["--ffn-lora-rank", "2"]),
    "ffn_lora_alpha": (LM, TIED_FFN + ["--ffn-lora-rank", "2"], ["--ffn-lora-alpha", "8"]),
    "tie_attn_proj": (LM, DEEP, ["--tie-attn-proj", "0"]),
    "kv_heads": (LM, [], ["--kv-heads", "2"]),
    "head_dim": (LM, [], ["--head-dim", "4"]),
    "rope_theta": (LM, [], ["--rope-theta", "10000"]),
    "norm": (LM, [], ["--norm", "rmsnorm"]),
    "rms_norm_eps": (LM, ["--norm", "rmsnorm"], ["--rms-norm-eps", "0.5"]),
    "linear_bias": (LM, [], ["--no-linear-bias"]),
    "init_std": (LM, [], ["--init-std", "0.5"]),
    "skipless_layout": (LM, ["--no-linear-bias"], ["--skipless-layout", "serial"]),
    "mlp_branch_scale": (LM, SKIPLESS, ["--mlp-branch-scale", "0.5"]),
    "removed_weights": (LM, SKIPLESS, ["--removed-weights", "q"]),
    "keep_attn_out_proj": (LM, ["--skipless-layout", "parallel", "--no-linear-bias",
                                "--removed-weights", "q"], ["--keep-attn-out-proj"]),
}

# options that change how a module computes, not what: the attribute each chain module stores
SAME_VALUES = {"tc_backward": "backward_mode", "tc_forward": "forward_mode"}


def _built(model_kind, argv):
    lm = model_kind == LM
    args, task, model = build("slim_lm" if lm else "slim_transformer",
                              (TINY_LM if lm else TINY_MT) + list(argv), lm)
    return task, model.eval(), lm


def _log_probs(task, model, lm):
    net_input, _ = make_batch(task, lm)
    with torch.no_grad():
        out = model(**net_input) if not lm else model(net_input["src_tokens"])
        return model.get_normalized_probs(out, log_probs=True)


def _settings(model, attribute):
    return [getattr(m, attribute) for m in model.modules() if hasattr(m, attribute)]


def tensors(state):
    """The weights of a state dict, without the model's extra state (its data record)."""
    return {k: v for k, v in state.items() if torch.is_tensor(v)}


def differences(model_kind, context, given, same_values_attribute=None):
    """What differs between the model of ``context`` and that of ``context + given`` (empty:
    the option changed nothing)."""
    task, base, lm = _built(model_kind, context)
    _, changed, _ = _built(model_kind, list(context) + list(given))
    if same_values_attribute:
        a, b = _settings(base, same_values_attribute), _settings(changed, same_values_attribute)
        return [f"{same_values_attribute}: {a[:1]} -> {b[:1]}"] if a != b else []
    base_sd, changed_sd = tensors(base.state_dict()), tensors(changed.state_dict())
    shapes = {k: tuple(v.shape) for k, v in base_sd.items()}
    if shapes != {k: tuple(v.shape) for k, v in changed_sd.items()}:
        return ["parameters (names or shapes)"]
    if any(not torch.equal(base_sd[k], changed_sd[k]) for k in base_sd):
        return ["initial values"]
    perturb_(changed, seed=3, scale=0.2)
    base.load_state_dict(changed.state_dict())
    gap = (_log_probs(task, base, lm) - _log_probs(task, changed, lm)).abs().max().item()
    return [f"log-probabilities (by {gap:.2e})"] if gap > 1e-5 else []


OPTIONS = [described for described in table_options()]


def reach_case(described):
    """``described``'s row of REACH, or the failure that says what to add."""
    if described.dest not in REACH:
        pytest.fail(f"{described.flag}: no non-default value to test it with; add a row "
                    f"'{described.dest}': (model, options it needs, [{described.flag!r}, VALUE]) "
                    "to REACH in tests/test_option_reach.py")
    return REACH[described.dest]


@pytest.mark.parametrize("described", OPTIONS, ids=[o.dest for o in OPTIONS])
def test_every_option_reaches_its_module(described):
    """The option at a non-default value builds another model than without it."""
    model_kind, context, given = reach_case(described)
    assert given[0] in described.flags(), (described.flag, given)
    found = differences(model_kind, context, given, SAME_VALUES.get(described.dest))
    assert found, (f"{' '.join(given)} (with {' '.join(context) or 'the defaults'}) builds the "
                   "same model as without it: the value does not reach its module")


def test_reach_rows_name_registered_options():
    """No row of REACH or SAME_VALUES is left for an option that is gone."""
    dests = {o.dest for o in OPTIONS}
    assert set(REACH) <= dests, sorted(set(REACH) - dests)
    assert set(SAME_VALUES) <= set(REACH)


def test_a_new_option_without_a_row_fails_and_says_what_to_add():
    """An option registered after this file was written is a case of its own, which fails
    until its row is written."""
    from dataclasses import dataclass

    from slim_fairseq import options as vocabulary

    @dataclass(frozen=True)
    class NewOptions(vocabulary.OptionSpec):
        new_width: int = vocabulary.option("--new-width", 0, "a width", "new", kind=int)

    vocabulary.register(NewOptions)
    try:
        new = [o for o in table_options() if o.dest not in {d.dest for d in OPTIONS}]
        assert [o.flag for o in new] == ["--new-width"]
        with pytest.raises(pytest.fail.Exception, match="--new-width: no non-default value.*"
                           "add a row 'new_width'"):
            reach_case(new[0])
    finally:
        unregister(NewOptions)


def test_an_option_that_stops_short_of_its_module_is_caught(monkeypatch):
    """The check itself: a tying spec that drops ``--ffn-lora-alpha`` (parsed, validated,
    stored, never handed to LoRA) builds the default's model, and is reported as such."""
    from slim_fairseq.models import slim_options
    from slim_fairseq.specs import TyingSpec

    def spec_without_alpha(self):
        rank = int(self.ffn_lora_rank or 0)
        return TyingSpec(ffn=self.ffn, attn_proj=self.attn_proj, lora_rank=rank,
                         lora_alpha=float(rank))

    model_kind, context, given = REACH["ffn_lora_alpha"]
    assert differences(model_kind, context, given)
    monkeypatch.setattr(slim_options.TyingOptions, "spec", spec_without_alpha)
    assert differences(model_kind, context, given) == []
