"""Each rule on the plugin's options is checked in one place, with one wording: the table below
names every rule that was once checked twice (by the options and again by a module), the rule
that is its home (a method of an option spec, or the value rule of every option), a command
line that breaks it, and a fragment of its message.

A rule's home raises it (the refusal names it, ``error.rule``), its wording is written once in
the plugin's source, and the modules never check options: they take specs
(slim_fairseq/specs.py), read no fairseq config, name no flag, and meet a value the options'
rules refuse only as a programming error (an assertion; docs/DESIGN.md, "From a flag to the
code"). A build checks the options once (docs/DESIGN.md, "Presets").
"""
import argparse
import ast
import glob
import os

import pytest
import torch
from torch import nn

from helpers import REPO, load_plugin, task_args

load_plugin()

from fairseq.models import ARCH_CONFIG_REGISTRY  # noqa: E402

from slim_fairseq import options as vocabulary  # noqa: E402
from slim_fairseq.models.slim_options import validate_slim_args  # noqa: E402
from slim_fairseq.option_errors import OptionError  # noqa: E402

PLUGIN = os.path.join(REPO, "slim_fairseq")
OPTIONS = "slim_fairseq/models/slim_options.py"
VALUES = "slim_fairseq/option_errors.py"  # the value rules of every kind (check_kind)

# (rule, arch, options that break it, home: (file that raises, rule name), the wording written once)
RULES = [
    ("a gate's source output is as wide as its target input", "stlm_tied",
     dict(self_attn_gate="qgv"), (OPTIONS, "AttentionOptions.gate_widths_match"), "wide but "),
    ("key/value heads divide the query heads", "slim_lm",
     dict(kv_heads=3), (OPTIONS, "AttentionOptions.kv_heads_divide_the_heads"),
     "(as many as the heads), 1 (MQA)"),
    ("identity projections keep every width the model's", "slim_lm",
     dict(no_patt=True, kv_heads=2), (OPTIONS, "AttentionOptions.identity_projections_span_the_width"),
     "so heads span"),
    ("the removed projection is square", "skipless_lm",
     dict(kv_heads=2, removed_weights="k"), (OPTIONS, "SkiplessOptions.removed_projection_is_square"),
     "is not square here"),
    ("cross-attention gates stay on one sequence", "anthe_base",
     dict(cross_attn_gate="qgv"), ("slim_fairseq/modules/gated_attention.py", vocabulary.VALUE_RULE),
     "leaks future target tokens"),
    ("a GLU gate has a gated activation", "slim_lm",
     dict(ffn_glu=True, activation_fn="tanh"), (OPTIONS, "GLUOptions.gate_activation"),
     "not a GLU gate activation"),
    ("the GLU's hidden width has a rule of that name", "slim_lm",
     dict(ffn_glu=True, glu_hidden="half"), (VALUES, vocabulary.VALUE_RULE),
     "not one of the choices"),
    ("RoPE rotates whole channel pairs", "slim_lm",
     dict(rope_theta=10000.0, head_dim=7), (OPTIONS, "AttentionOptions.rope_rotates_pairs"),
     "RoPE rotates channel pairs"),
    ("a chain has two cores or more", "slim_lm",
     dict(tc_ff=0.5, tc_length=1), (VALUES, vocabulary.VALUE_RULE), "too short for a chain"),
    ("a LoRA rank is not negative", "stlm_tied",
     dict(tie_ffn="0", ffn_lora_rank=-1), (VALUES, vocabulary.VALUE_RULE), "negative"),
    ("a tie offset is a layer offset", "stlm_tied",
     dict(tie_ffn="-1"), (OPTIONS, "TyingOptions.offsets_are_layer_offsets"), "not a layer offset"),
    ("a tied range holds two layers", "stlm_tied",
     dict(tie_ffn="3"), (OPTIONS, "TyingOptions.ranges_hold_two_layers"),
     "must hold at least 2 layers"),
    ("LoRA adapts a tied feed-forward", "slim_lm",
     dict(ffn_lora_rank=4), (OPTIONS, "TyingOptions.lora_adapts_a_tied_ffn"),
     "LoRA adapts shared FFN weights"),
    ("LoRA adapts dense linears", "stlm_tied",
     dict(tie_ffn="0", ffn_lora_rank=4, tc_ff=0.3), (OPTIONS, "TyingOptions.lora_adapts_dense_linears"),
     "LoRA adapts dense linears"),
    ("a sandwich has a first, a middle and a last layer", "subformer_base",
     dict(encoder_layers=2), (OPTIONS, "SandwichOptions.first_middle_and_last_layers"),
     "too few for --sandwich"),
    ("the sandwich's heads divide its middle", "subformer_base",
     dict(sandwich_dim=96, sandwich_heads=5), (OPTIONS, "SandwichOptions.heads_divide_the_middle"),
     "does not divide --sandwich-dim"),
    ("fairseq's quant noise needs fairseq's linears", "slim_lm",
     dict(kv_heads=2, quant_noise_pq=0.1), (OPTIONS, "FairseqExtras.quant_noise"),
     "acts on fairseq's dense linears"),
    ("H-SoftPOS leaves the tokens some width", "slim_lm",
     dict(hsoftpos_levels=300), (OPTIONS, "EmbeddingOptions.hsoftpos_leaves_token_width"),
     "too many for model width"),
    ("a tied output reads a dense table of its width", "slim_lm",
     dict(adaptive_input=True, adaptive_input_cutoff="20,60", share_decoder_input_output_embed=True),
     (OPTIONS, "EmbeddingOptions.tied_output_reads_a_dense_table"), "a tied output needs"),
    ("Tensor Chains multiply in a mode of that name", "slim_lm",
     dict(tc_ff=0.3, tc_forward="fast"), (VALUES, vocabulary.VALUE_RULE), "not one of the choices"),
]


def _args(arch, given):
    args = argparse.Namespace(arch=arch, **given)
    ARCH_CONFIG_REGISTRY[arch].apply(args)
    return args


def _source_strings():
    """{file: [every string constant and f-string piece]} of the plugin's source."""
    out = {}
    for path in glob.glob(os.path.join(PLUGIN, "**", "*.py"), recursive=True):
        tree = ast.parse(open(path).read())
        out[os.path.relpath(path, REPO)] = [node.value for node in ast.walk(tree)
                                            if isinstance(node, ast.Constant)
                                            and isinstance(node.value, str)]
    return out


@pytest.mark.parametrize("rule, arch, given, home, wording", RULES, ids=[r[0] for r in RULES])
def test_each_rule_is_checked_in_its_one_home(rule, arch, given, home, wording):
    model = "slim_transformer" if arch in ("anthe_base", "subformer_base") else "slim_lm"
    with pytest.raises(OptionError) as caught:
        validate_slim_args(_args(arch, given), model)
    message = str(caught.value)
    assert wording in message and "\n" not in message, message
    path, name = home
    assert caught.value.rule == name, f"{rule}: refused by {caught.value.rule}"
    # a refusal with alternatives is raised again with those that pass: its first raise counts
    origin = caught.value.__context__ if isinstance(caught.value.__context__, OptionError) \
        else caught.value
    frame = origin.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    raised_in = os.path.relpath(frame.tb_frame.f_code.co_filename, REPO)
    if name != vocabulary.VALUE_RULE:
        assert raised_in == path and frame.tb_frame.f_code.co_qualname.split(".")[0] == \
            name.split(".")[0], f"{rule}: raised by {raised_in}:{frame.tb_frame.f_code.co_qualname}"
    places = [(where, text) for where, texts in _source_strings().items() for text in texts
              if wording in text]
    assert len(places) == 1, f"{rule}: the wording {wording!r} is written {len(places)} times: {places}"
    assert places[0][0] == path


def test_every_rule_has_one_name():
    names = vocabulary.rule_names()
    assert len(names) == len(set(names)) and len(names) > 40


def _module_files():
    return sorted(glob.glob(os.path.join(PLUGIN, "modules", "*.py")))


def test_modules_read_no_config():
    """No module of slim_fairseq/modules/ reads fairseq's config or args: they take specs."""
    readers = []
    for path in _module_files():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            names = [arg.arg for arg in node.args.args] if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            if {"cfg", "args"} & set(names):
                readers.append(f"{os.path.basename(path)}:{node.lineno} {node.name}")
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in ("cfg", "args")):
                readers.append(f"{os.path.basename(path)}:{node.lineno} getattr")
    assert not readers, readers


def _text(node):
    """The string constants of an expression (an f-string's literal parts)."""
    return " ".join(sub.value for sub in ast.walk(node)
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str))


def test_no_module_checks_an_option():
    """The modules neither import the option errors nor raise anything that names a flag: a
    rule on options has its one home in the option specs."""
    found = []
    for path in _module_files():
        tree = ast.parse(open(path).read())
        where = os.path.relpath(path, REPO)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if module and ("option_errors" in module or module.endswith(".options")
                               or "slim_options" in module):
                    found.append(f"{where}:{node.lineno} imports {module}")
            if isinstance(node, ast.Raise) and node.exc is not None and "--" in _text(node.exc):
                found.append(f"{where}:{node.lineno} raises {_text(node.exc)[:60]!r}")
    assert not found, found


# a module given a value that an option's rule refuses: an assertion (a programming error), not
# a second refusal of the option
MODULE_GUARDS = {
    "RoPE's head width": lambda: __import__("slim_fairseq.modules.rope", fromlist=["x"])
    .RotaryEmbedding(7),
    "LoRA's rank": lambda: __import__("slim_fairseq.modules.lora", fromlist=["x"])
    .LoRALinear(nn.Linear(4, 4), 0, 1.0),
    "a chain's length": lambda: __import__("slim_fairseq.modules.tensor_chain", fromlist=["x"])
    .TensorChainLinear(8, 8, ratio=0.5, length=1),
    "a chain's forward": lambda: __import__("slim_fairseq.modules.tensor_chain", fromlist=["x"])
    .TensorChainLinear(8, 8, ratio=0.5, forward_mode="fast"),
    "the chains' modes": lambda: __import__("slim_fairseq.modules.tensor_chain_policy",
                                            fromlist=["x"]).force_modes_(nn.Linear(2, 2), "fast"),
    "the GLU's activation": lambda: __import__("slim_fairseq.modules.glu", fromlist=["x"])
    .GLUProjection(4, 6, activation="tanh"),
    "the GLU's hidden width": lambda: __import__("slim_fairseq.modules.glu", fromlist=["x"])
    .glu_hidden_dim(6, "half"),
    "H-SoftPOS's widths": lambda: __import__("slim_fairseq.modules.hsoftpos", fromlist=["x"])
    .hsoftpos_dims(4, 3),
}


@pytest.mark.parametrize("guard", sorted(MODULE_GUARDS))
def test_a_module_asserts_what_an_option_rule_refuses(guard):
    with pytest.raises(AssertionError):
        MODULE_GUARDS[guard]()


def test_design_maps_every_option_to_its_spec():
    """docs/DESIGN.md, "From a flag to the code", names every option of the plugin."""
    from slim_fairseq.models.slim_options import OPTIONS as PLUGIN_OPTIONS
    with open(os.path.join(REPO, "docs", "DESIGN.md"), encoding="utf-8") as f:
        design = f.read()
    section = design.split("## From a flag to the code", 1)[1].split("\n## ", 1)[0]
    missing = [option.flag for option in PLUGIN_OPTIONS if f"`{option.flag}`" not in section]
    assert not missing, f"docs/DESIGN.md, From a flag to the code: add {missing}"


def test_a_build_fills_and_checks_the_options_once(monkeypatch):
    """fairseq-train's route (parse, the config of the run, the task, the model): the preset
    fills the options once, their defaults are set once and their rules run once."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from slim_fairseq.models import presets, slim_options

    counts = {"preset": 0, "defaults": 0, "rules": 0}

    def counting(name, function):
        def counted(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return counted

    for model in ("slim_transformer", "slim_lm"):
        presets._keys_filled_by(model)  # (once per process: the keys a model's defaults set)
    slim_options._validated.cache_clear()
    monkeypatch.setattr(presets.Preset, "fill", counting("preset", presets.Preset.fill))
    monkeypatch.setattr(vocabulary, "fill_defaults", counting("defaults", vocabulary.fill_defaults))
    monkeypatch.setattr(slim_options.ModelOptions, "check",
                        counting("rules", slim_options.ModelOptions.check))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=task_args(True) + [
        "--arch", "stlm_tied", "--user-dir", PLUGIN, "--cpu", "--decoder-embed-dim", "64",
        "--decoder-layers", "3", "--tie-ffn", "0"])
    assert counts == {"preset": 1, "defaults": 1, "rules": 1}
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    assert counts == {"preset": 1, "defaults": 1, "rules": 1}
    assert model.decoder.layers[2].fc1.w1.weight is model.decoder.layers[1].fc1.w1.weight
    assert not torch.equal(model.decoder.layers[0].fc2.weight, model.decoder.layers[1].fc2.weight)
