"""The combination contract: any combination of the plugin's options, on any preset, either
builds, trains, and passes the architecture contract, or is refused in one line before anything
is built (docs/DESIGN.md, "Options").

A seeded random draw: each case takes a preset of the plugin (shrunk by its model's
``contract.tiny_overrides``) and 1-3 options with values from :data:`VALUES`, then

* refused: the error is one line in the plugin's format (``--flag=value: ...; allowed: ...``),
  raised while fairseq parses the command line (nothing built), and it names the rule that
  refused it (``error.rule``), whose condition, written again below from the technique's
  definition (:data:`JUSTIFIED`), holds for the case's options: a valid combination refused by
  mistake fails;
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


# ---------------------------------------------------------------------------- refusals

LM_ONLY = {"skipless_layout": "none", "mlp_branch_scale": 1.0, "removed_weights": "none",
           "keep_attn_out_proj": False}
TRANSLATION_ONLY = {"cross_attn_gate": "none", "sandwich_cross_norm": "layernorm"}
GLU_ACTIVATIONS = ("silu", "gelu", "relu")
TC_RATIOS = ("tc_ff", "tc_patt", "tc_layer", "tc_emb", "tc_output")


class Case:
    """The options of a case as the model would have them (the preset's values, the defaults,
    the drawn flags), and what the conditions below read from them."""

    def __init__(self, args, lm, given):
        self.a, self.lm, self.given = args, lm, given
        self.sides = ("decoder",) if lm else ("encoder", "decoder")

    def __getattr__(self, name):
        return getattr(self.a, name, None)

    def side(self, side, key):
        return getattr(self.a, f"{side}_{key}")

    @property
    def tied(self):
        return bool(self.share_decoder_input_output_embed or self.share_all_embeddings)

    def tie(self, name):
        value = str(getattr(self.a, name))
        return None if value == "none" else int(value)

    @property
    def skipless(self):
        return self.skipless_layout != "none"

    @property
    def custom(self):
        """Any option on that replaces fairseq's dense linears or attention."""
        return bool(self.ffn_glu or self.tc_ff or self.tc_patt or self.tc_layer or self.no_patt
                    or self.self_attn_gate != "none" or (self.cross_attn_gate or "none") != "none"
                    or self.skipless or self.kv_heads or self.head_dim or self.rope_theta
                    or not self.linear_bias)

    def middles(self):
        """(side, layers, width, middle width, middle heads) of each sandwich stack."""
        if not self.sandwich:
            return []
        out = []
        for side in self.sides:
            width = self.side(side, "embed_dim")
            middle = self.sandwich_dim or width
            heads = self.sandwich_heads or next(h for h in range(max(1, middle // 64), 0, -1)
                                                if middle % h == 0)
            out.append((side, self.side(side, "layers"), width, middle, heads))
        return out

    def attentions(self):
        """(gate, width, heads, key/value input width) of every gated attention."""
        out = []
        for side in self.sides:
            width, heads = self.side(side, "embed_dim"), self.side(side, "attention_heads")
            out.append((self.self_attn_gate, width, heads, width))
        out += [(self.self_attn_gate, middle, heads, middle) for _, _, _, middle, heads in self.middles()]
        if not self.lm:
            out.append((self.cross_attn_gate, self.decoder_embed_dim, self.decoder_attention_heads,
                        self.encoder_embed_dim))
        return [attention for attention in out if (attention[0] or "none") != "none"]

    def head_dim_of(self, width, heads):
        if self.head_dim:
            return self.head_dim
        return (width // heads) // 2 * 2 if self.rope_theta else width // heads


def _gate_mismatch(o):
    """AgB multiplies B by sigmoid(W_A A) (Anthe, arXiv:2305.10991, Sec. 2): W_A's output width
    is A's heads times the head width, B's input width the model's (q) or the keys' (k, v)."""
    for gate, width, heads, kv_input in o.attentions():
        head_dim = o.head_dim_of(width, heads)
        kv = o.kv_heads or heads
        out = {"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim}
        into = {"q": width, "k": kv_input, "v": kv_input}
        if out[gate[0]] != into[gate[2]]:
            return True
    return False


def _value_refused(o):
    from slim_fairseq.options import all_options
    for option in all_options():
        value = getattr(o.a, option.dest, option.default)
        if option.check == "choice" and value not in option.choices:
            return True
        if option.check in ("nonneg", "ratio", "length") and value is not None and (
                value < 0 or (option.check == "ratio" and value > 1)
                or (option.check == "length" and value < 2)):
            return True
        if option.check == "positive" and value is not None and value <= 0:
            return True
    return False


def _removed_width(o):
    width, heads = o.decoder_embed_dim, o.decoder_attention_heads
    count = heads if o.removed_weights == "q" else (o.kv_heads or heads)
    return count * o.head_dim_of(width, heads), width


# rule -> its condition on the case's options, written from the technique (not the plugin's code)
JUSTIFIED = {
    "value": _value_refused,
    "model": lambda o: any(getattr(o.a, dest) not in (None, default)
                           for dest, default in (TRANSLATION_ONLY if o.lm else LM_ONLY).items()),
    "FairseqShape.shapes_are_positive": lambda o: any(
        isinstance(value, int) and value < 1 for value in
        [o.side(side, key) for side in o.sides
         for key in ("layers", "embed_dim", "ffn_embed_dim", "attention_heads")]
        + [getattr(o.a, f"decoder_{key}", None) for key in ("input_dim", "output_dim")]),
    "FairseqShape.dropouts_are_probabilities": lambda o: any(
        isinstance(value, float) and not 0 <= value < 1 for value in
        [getattr(o.a, dest, None) for dest in ("dropout", "attention_dropout",
                                               "activation_dropout", "relu_dropout")]),
    "TyingOptions.offsets_are_layer_offsets": lambda o: False,  # the draw gives offsets only
    "TyingOptions.ranges_hold_two_layers": lambda o: any(
        k is not None and o.side(side, "layers") - 2 * k - 1 < 2
        for side in o.sides for k in (o.tie("tie_ffn"), o.tie("tie_attn_proj"))),
    "TyingOptions.rank_is_an_integer": lambda o: not isinstance(o.ffn_lora_rank, int),
    "TyingOptions.lora_adapts_a_tied_ffn": lambda o: o.ffn_lora_rank > 0 and o.tie("tie_ffn") is None,
    "TyingOptions.alpha_scales_lora": lambda o: o.ffn_lora_alpha is not None and o.ffn_lora_rank == 0,
    "TyingOptions.not_with_sandwich": lambda o: bool(o.sandwich) and (
        o.tie("tie_ffn") is not None or o.tie("tie_attn_proj") is not None),
    "TyingOptions.unsharded_backend": lambda o: o.ddp_backend == "fully_sharded",
    "TyingOptions.checkpointing_backend": lambda o: bool(o.checkpoint_activations),
    "TyingOptions.lora_adapts_dense_linears": lambda o: o.ffn_lora_rank > 0 and bool(o.tc_ff or o.tc_layer),
    "FeedForwardOptions.activation": lambda o: (o.activation_fn or "relu") not in (
        "relu", "gelu", "gelu_fast", "gelu_accurate", "tanh", "linear", "silu"),
    "FeedForwardOptions.one_variant": lambda o: False,  # one variant in the plugin
    # the rules of techniques registered from outside: the plugin registers none of those kinds
    # (tests/test_adding_a_technique.py registers them)
    "AttentionOptions.extensions_read_scores": lambda o: False,
    "EmbeddingOptions.one_output_path": lambda o: False,
    "SkiplessOptions.one_block_layout": lambda o: False,
    "GLUOptions.gate_activation": lambda o: bool(o.ffn_glu) and o.activation_fn not in GLU_ACTIVATIONS,
    "GLUOptions.hidden_needs_glu": lambda o: o.glu_hidden != "two-thirds" and not o.ffn_glu,
    "FairseqExtras.quant_noise": lambda o: bool(o.quant_noise_pq) and o.custom,
    "FairseqExtras.base_layers": lambda o: bool(o.base_layers),
    "FairseqExtras.xformers": lambda o: o.custom and any(
        o.side(side, "xformers_att_config") for side in ("encoder", "decoder")),
    "ChainOptions.shape_needs_a_chain": lambda o: not any(getattr(o.a, r) for r in TC_RATIOS) and (
        o.tc_backward not in ("auto", "recompute") or o.tc_forward != "auto" or o.tc_length != 2
        or o.tc_min_bond != 0),
    "ChainOptions.nothing_to_factorise_without_patt": lambda o: bool(o.no_patt) and bool(
        o.tc_patt or (o.tc_layer and not o.tc_ff)),
    "ChainOptions.layer_ratio_decides_something": lambda o: bool(
        o.tc_layer and o.tc_ff and (o.tc_patt or o.no_patt)),
    "ChainOptions.table_not_with_safe": lambda o: bool(o.tc_emb and o.safe_embed_dim),
    "ChainOptions.output_untied": lambda o: bool(o.tc_output) and o.tied,
    "EmbeddingOptions.narrow_table_is_not_the_output": lambda o: o.tied and not o.safe_embed_dim and bool(
        o.hsoftpos_levels or o.tc_emb),
    "EmbeddingOptions.tied_output_reads_a_dense_table": lambda o: o.tied and not o.safe_embed_dim and not
        o.adaptive_softmax_cutoff and bool(o.adaptive_input or (o.decoder_input_dim if o.lm else
                                                                o.decoder_embed_dim) != o.decoder_output_dim),
    "EmbeddingOptions.embed_path_fills_a_dense_table": lambda o: bool(
        o.encoder_embed_path or o.decoder_embed_path),
    "EmbeddingOptions.safe_output_is_tied": lambda o: bool(o.safe_embed_dim) and
        "--no-share-decoder-input-output-embed" in o.given,
    "EmbeddingOptions.min_token_dim_needs_hsoftpos": lambda o: bool(
        o.hsoftpos_min_token_dim and not o.hsoftpos_levels),
    "EmbeddingOptions.one_input_embedding": lambda o: bool(o.hsoftpos_levels and o.safe_embed_dim),
    "EmbeddingOptions.safe_output_needs_safe": lambda o: o.safe_output != "linear" and not o.safe_embed_dim,
    "EmbeddingOptions.hsoftpos_leaves_token_width": lambda o: bool(o.hsoftpos_levels) and any(
        o.side(side, "embed_dim") < 2 * o.hsoftpos_levels + o.hsoftpos_min_token_dim
        for side in o.sides),
    "EmbeddingOptions.safe_slims": lambda o: bool(o.safe_embed_dim) and any(
        o.safe_embed_dim >= o.side(side, "embed_dim") for side in o.sides),
    "EmbeddingOptions.learned_positions_exist": lambda o: bool(o.no_token_positional_embeddings) and any(
        o.side(side, "learned_pos") for side in o.sides),
    "EmbeddingOptions.safe_replaces_the_output": lambda o: bool(o.safe_embed_dim) and bool(
        o.tc_output or o.output_bias),
    "EmbeddingOptions.adaptive_softmax_replaces_the_output": lambda o: bool(
        o.adaptive_softmax_cutoff) and bool(o.tc_output or o.output_bias or o.safe_embed_dim),
    "EmbeddingOptions.adaptive_softmax_criterion": lambda o: bool(o.adaptive_softmax_cutoff),
    "EmbeddingOptions.adaptive_input_replaces_the_table": lambda o: bool(o.adaptive_input) and bool(
        o.hsoftpos_levels or o.safe_embed_dim or o.tc_emb),
    "SandwichOptions.shape_needs_a_sandwich": lambda o: not o.sandwich and bool(
        o.sandwich_dim or o.sandwich_ffn_dim or o.sandwich_heads
        or (o.sandwich_cross_norm or "layernorm") != "layernorm"),
    "SandwichOptions.first_middle_and_last_layers": lambda o: any(
        layers < 3 for _, layers, _, _, _ in o.middles()),
    "SandwichOptions.heads_divide_the_middle": lambda o: any(
        middle % heads for _, _, _, middle, heads in o.middles()),
    "SandwichOptions.no_layerdrop_at_a_width_change": lambda o: any(
        middle != width and o.side(side, "layerdrop") for side, _, width, middle, _ in o.middles()),
    "SandwichOptions.cross_norm_needs_a_wider_middle": lambda o: o.sandwich_cross_norm == "none" and any(
        side == "decoder" and middle == width for side, _, width, middle, _ in o.middles()),
    "SandwichOptions.no_cross_self_attention_at_a_width_change": lambda o: bool(o.cross_self_attention),
    "SandwichOptions.unsharded_backend": lambda o: o.ddp_backend == "fully_sharded",
    "SandwichOptions.checkpointing_backend": lambda o: bool(o.checkpoint_activations),
    "AttentionOptions.heads_divide_the_width": lambda o: any(
        o.side(side, "embed_dim") % o.side(side, "attention_heads") for side in o.sides),
    "AttentionOptions.kv_heads_divide_the_heads": lambda o: bool(o.kv_heads) and any(
        heads % o.kv_heads for heads in [o.side(side, "attention_heads") for side in o.sides]
        + [heads for _, _, _, _, heads in o.middles()]),
    "AttentionOptions.rope_rotates_pairs": lambda o: bool(o.rope_theta) and o.head_dim % 2 == 1,
    "AttentionOptions.identity_projections_span_the_width": lambda o: bool(o.no_patt) and any(
        (o.kv_heads and o.kv_heads != o.side(side, "attention_heads")) or (
            o.head_dim and o.head_dim * o.side(side, "attention_heads") != o.side(side, "embed_dim"))
        for side in o.sides),
    "AttentionOptions.one_name_per_gate": lambda o: bool(o.no_patt) and o.self_attn_gate in (
        "kgv", "kgq", "qgk"),
    "AttentionOptions.gate_widths_match": _gate_mismatch,
    "BlockOptions.eps_needs_rmsnorm": lambda o: o.rms_norm_eps != 1e-6 and o.norm != "rmsnorm",
    "BlockOptions.norms_placed_exist": lambda o: o.norm == "none" and (
        (not o.lm and bool(o.encoder_normalize_before or o.decoder_normalize_before))
        or (o.lm and o.decoder_normalize_before is False)),
    "BlockOptions.one_init": lambda o: bool(o.bert_init and o.init_std),
    "SkiplessOptions.shape_needs_skipless_blocks": lambda o: not o.skipless and (
        o.mlp_branch_scale != 1.0 or o.removed_weights != "none" or bool(o.keep_attn_out_proj)),
    "SkiplessOptions.no_norm": lambda o: o.skipless and o.norm != "none",
    "SkiplessOptions.shaped_attention_starts_at_zero": lambda o: o.skipless and bool(
        o.tc_patt or o.tc_layer),
    "SkiplessOptions.own_init": lambda o: o.skipless and bool(o.bert_init or o.init_std),
    "SkiplessOptions.keep_p_needs_the_reduced_form": lambda o: o.skipless and bool(
        o.keep_attn_out_proj) and o.removed_weights == "none",
    "SkiplessOptions.removed_p_is_not_tied": lambda o: o.skipless and o.removed_weights != "none"
        and o.tie("tie_attn_proj") is not None and not o.keep_attn_out_proj,
    "SkiplessOptions.removed_projection_is_plain": lambda o: o.skipless and o.removed_weights != "none"
        and (o.self_attn_gate != "none" or bool(o.no_patt)),
    "SkiplessOptions.removed_projection_is_square": lambda o: o.skipless and o.removed_weights != "none"
        and _removed_width(o)[0] != _removed_width(o)[1],
}


def case_options(arch, options):
    """The options the case's model would have, without the plugin's rules: the model's parser
    on the command line, then the architecture's preset (it fills, it does not check)."""
    import argparse
    from fairseq.models import ARCH_CONFIG_REGISTRY
    archs = plugin_archs()
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    archs[arch].add_args(parser)
    args, _ = parser.parse_known_args([*contract.tiny_overrides(arch), *argv_of(options)])
    ARCH_CONFIG_REGISTRY[arch].apply(args)
    return Case(args, contract.is_lm(archs[arch]), {flag for flag, _ in options})


def justified(arch, options, error):
    """Whether the refusal ``error`` of the case names a rule whose condition holds for it."""
    rule = getattr(error, "rule", None)
    if rule not in JUSTIFIED:
        return False, f"refused by {rule!r}, a rule JUSTIFIED does not know"
    if not JUSTIFIED[rule](case_options(arch, options)):
        return False, f"refused by {rule}, whose condition does not hold for these options"
    return True, rule


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
    shrunk = set(contract.tiny_overrides(arch))  # flags the tiny preset already sets
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
             *contract.tiny_overrides(arch), *argv_of(options)])


def _parse(arch, options, lm):
    """fairseq-train's parse of the case's command line (the plugin's checks run here)."""
    from fairseq import options as fairseq_options
    contract.load_plugin()
    archs = plugin_archs()
    parser = fairseq_options.get_training_parser()
    return fairseq_options.parse_args_and_arch(parser, input_args=[
        *task_args(lm), "--arch", arch, "--user-dir", USER_DIR, "--cpu",
        *contract.tiny_overrides(arch), *argv_of(options)])


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
        ok, why = justified(arch, options, error)
        assert ok, f"{where}\n{line}\n{why}"
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


def test_every_rule_has_its_condition():
    """JUSTIFIED writes the condition of every rule of the vocabulary (a new rule needs its
    condition here), and over the default draw every refusal is justified."""
    from slim_fairseq.options import rule_names
    assert set(rule_names()) <= set(JUSTIFIED), set(rule_names()) - set(JUSTIFIED)
    archs, _ = _archs()
    refused = 0
    for seed in range(FIRST_SEED, FIRST_SEED + 2 * DEFAULT_CASES):
        arch, options = draw(seed)
        try:
            _parse(arch, options, contract.is_lm(archs[arch]))
        except (ValueError, SystemExit) as error:
            refused += 1
            ok, why = justified(arch, options, error)
            assert ok, f"seed {seed}: {arch} {argv_of(options)}: {error}\n{why}"
    assert refused > DEFAULT_CASES / 2


def test_a_refusal_by_mistake_is_caught():
    """A rule that refused a valid combination would fail the check: a case is justified by the
    rule that refuses it, not by any other."""
    from slim_fairseq.option_errors import OptionError
    error = OptionError("--tc-forward=contract: shapes a Tensor Chain, which is off; allowed: ...")
    error.rule = "ChainOptions.shape_needs_a_chain"
    assert justified("slim_lm", [("--tc-ff", "0.3"), ("--tc-forward", "contract")], error)[0] is False
    assert justified("slim_lm", [("--tc-forward", "contract")], error)[0] is True
    error.rule = "AttentionOptions.gate_widths_match"
    # the tiny stlm_tied has 4 query heads of 8 and 2 key/value heads: W_V v is 16 wide, q 32
    assert justified("stlm_tied", [("--self-attn-gate", "vgq")], error)[0] is True
    assert justified("stlm_tied", [("--kv-heads", "4"), ("--self-attn-gate", "vgq")], error)[0] is False


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
