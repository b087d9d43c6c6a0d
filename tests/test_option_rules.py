"""Each rule on the plugin's options is checked in one place, with one wording: the table below
names every rule that was once checked twice (by the options and again by a module), the
function that is its home, a command line that breaks it, and a fragment of its message.

A rule's home raises it (the innermost frame of the error is that function), its wording is
written once in the plugin's source, and the modules never check options: they take specs
(slim_fairseq/specs.py) and read no fairseq config (docs/DESIGN.md, "From a flag to the code").
"""
import argparse
import ast
import glob
import os

import pytest

from helpers import REPO, load_plugin

load_plugin()

from fairseq.models import ARCH_CONFIG_REGISTRY  # noqa: E402

from slim_fairseq.models.slim_options import validate_slim_args  # noqa: E402
from slim_fairseq.option_errors import OptionError  # noqa: E402

PLUGIN = os.path.join(REPO, "slim_fairseq")
OPTIONS = "slim_fairseq/models/slim_options.py"

# (rule, arch, options that break it, home: (file, function), the wording written once)
RULES = [
    ("a gate's source output is as wide as its target input", "stlm_tied",
     dict(self_attn_gate="qgv"), (OPTIONS, "_check_gate"), "wide but "),
    ("key/value heads divide the query heads", "slim_lm",
     dict(kv_heads=3), (OPTIONS, "_check_attention"), "(as many as the heads), 1 (MQA)"),
    ("identity projections keep every width the model's", "slim_lm",
     dict(no_patt=True, kv_heads=2), (OPTIONS, "_check_attention"), "so heads span"),
    ("the removed projection is square", "skipless_lm",
     dict(kv_heads=2, removed_weights="k"), (OPTIONS, "_check_skipless"), "is not square here"),
    ("cross-attention gates stay on one sequence", "anthe_base",
     dict(cross_attn_gate="qgv"), ("slim_fairseq/modules/gated_attention.py", None),
     "leaks future target tokens"),
    ("a GLU gate has a gated activation", "slim_lm",
     dict(ffn_glu=True, activation_fn="tanh"), (OPTIONS, "_check_feed_forward"),
     "not a GLU gate activation"),
    ("RoPE rotates whole channel pairs", "slim_lm",
     dict(rope_theta=10000.0, head_dim=7), (OPTIONS, "_check_attention"),
     "RoPE rotates channel pairs"),
    ("a chain has two cores or more", "slim_lm",
     dict(tc_ff=0.5, tc_length=1), (OPTIONS, "check_value"), "too short for a chain"),
    ("a tied range holds two layers", "stlm_tied",
     dict(tie_ffn="3"), (OPTIONS, "validate_tying"), "must hold at least 2 layers"),
    ("LoRA adapts a tied feed-forward", "slim_lm",
     dict(ffn_lora_rank=4), (OPTIONS, "validate_tying"), "LoRA adapts shared FFN weights"),
    ("a sandwich has a first, a middle and a last layer", "subformer_base",
     dict(encoder_layers=2), (OPTIONS, "_check_sandwich_side"), "too few for --sandwich"),
    ("the sandwich's heads divide its middle", "subformer_base",
     dict(sandwich_dim=96, sandwich_heads=5), (OPTIONS, "_check_sandwich_side"),
     "does not divide --sandwich-dim"),
    ("fairseq's quant noise needs fairseq's linears", "slim_lm",
     dict(kv_heads=2, quant_noise_pq=0.1), (OPTIONS, "_check_fairseq_extras"),
     "acts on fairseq's dense linears"),
    ("H-SoftPOS leaves the tokens some width", "slim_lm",
     dict(hsoftpos_levels=300), ("slim_fairseq/modules/hsoftpos.py", "hsoftpos_dims"),
     "too many for model width"),
]


def _args(arch, given):
    args = argparse.Namespace(arch=arch, **given)
    ARCH_CONFIG_REGISTRY[arch](args)
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
    # a refusal with alternatives is raised again with those that pass: its first raise counts
    origin = caught.value.__context__ if isinstance(caught.value.__context__, OptionError) \
        else caught.value
    frame = origin.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    code = frame.tb_frame.f_code
    path, function = home
    if function is None:  # a constant of that module, raised by the options' check
        path, function = OPTIONS, "check_value"
    assert os.path.relpath(code.co_filename, REPO) == path and code.co_name == function, \
        f"{rule}: raised by {code.co_filename}:{code.co_name}"
    places = [(name, text) for name, texts in _source_strings().items() for text in texts
              if wording in text]
    assert len(places) == 1, f"{rule}: the wording {wording!r} is written {len(places)} times: {places}"
    if home[1] is None:
        assert places[0][0] == home[0]


def test_modules_read_no_config():
    """No module of slim_fairseq/modules/ reads fairseq's config or args: they take specs."""
    readers = []
    for path in glob.glob(os.path.join(PLUGIN, "modules", "*.py")):
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


def test_design_maps_every_option_to_its_spec():
    """docs/DESIGN.md, "From a flag to the code", names every option of the plugin."""
    from slim_fairseq.models.slim_options import OPTIONS
    with open(os.path.join(REPO, "docs", "DESIGN.md"), encoding="utf-8") as f:
        design = f.read()
    section = design.split("## From a flag to the code", 1)[1].split("\n## ", 1)[0]
    missing = [option.flag for option in OPTIONS if f"`{option.flag}`" not in section]
    assert not missing, f"docs/DESIGN.md, From a flag to the code: add {missing}"
