"""The worked example of docs/DESIGN.md, "Adding a technique": a feed-forward variant written
outside the plugin (tests/fixtures/low_rank_ffn.py: its spec, its module, its registration)
becomes an option of both models, checked by its own rules and the plugin's, built inside
fairseq's encoder and decoder, trained, decoded step by step and saved, with no file of the
plugin changed; then it leaves the vocabulary again."""
import ast
import importlib.util
import os
import subprocess

import pytest

from helpers import BIN, REPO, build, task_args
from slim_fairseq_lab import contract

EXAMPLE = os.path.join(REPO, "tests", "fixtures", "low_rank_ffn.py")
TINY_LM = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
           "--decoder-attention-heads", "4", "--decoder-layers", "3"]


@pytest.fixture()
def low_rank():
    """The example's module, registered for the test and removed after it."""
    from slim_fairseq.models.slim_layers import unregister_feed_forward
    spec = importlib.util.spec_from_file_location("low_rank_ffn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        unregister_feed_forward(module.LowRankOptions)


def test_the_example_is_a_spec_a_module_and_a_registration():
    """The three parts a variant has (docs/DESIGN.md): one spec class, one module class, one
    registration call, and nothing else of the plugin."""
    tree = ast.parse(open(EXAMPLE).read())
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    calls = [ast.unparse(node.value.func) for node in tree.body
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    assert classes == ["LowRankOptions", "LowRankFeedForward"] and calls == ["register_feed_forward"]


def test_a_variant_from_outside_builds_trains_and_decodes(low_rank, tmp_path):
    from slim_fairseq.models.slim_options import OPTIONS
    args, task, model = build("slim_lm", TINY_LM, True, ["--ffn-rank", "8", "--dropout", "0"])
    layer = model.decoder.layers[1]
    assert isinstance(layer.feed_forward, low_rank.LowRankFeedForward)
    assert layer.feed_forward.fc1 is layer.fc1  # one module, its parts the layer's fc1 and fc2
    names = {name for name in model.state_dict() if name.startswith("decoder.layers.1.fc")}
    assert names == {"decoder.layers.1.fc1.0.weight", "decoder.layers.1.fc1.1.weight",
                     "decoder.layers.1.fc1.1.bias", "decoder.layers.1.fc2.weight",
                     "decoder.layers.1.fc2.bias"}
    _, _, dense = build("slim_lm", TINY_LM, True, ["--dropout", "0"])
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(dense) - count(model) == 3 * (32 * 48 - (32 * 8 + 8 * 48))
    contract.run_checks("slim_lm", model, task, args, True, tmp_path)
    # the plugin's techniques combine with it: tying shares the factorised weights, LoRA adapts them
    _, _, tied = build("slim_lm", TINY_LM, True, ["--ffn-rank", "8", "--tie-ffn", "0",
                                                 "--ffn-lora-rank", "2"])
    layers = tied.decoder.layers
    assert layers[2].fc1[0].weight is layers[1].fc1[0].weight and hasattr(layers[2].fc1[0], "lora_A")
    assert "--ffn-rank" not in {flag for option in OPTIONS for flag in option.flags()}


@pytest.mark.parametrize("given, line", [
    (["--ffn-rank", "32"], r"^--ffn-rank=32: at or above the model width 32, the factorisation "
                           r"slims nothing; allowed: 0 \(off\) or an integer below 32$"),
    (["--ffn-rank", "8", "--ffn-glu"], r"^--ffn-rank: a feed-forward variant, and --ffn-glu "
                                       r"selects another; allowed: one of --ffn-glu and --ffn-rank$"),
    (["--ffn-rank", "8", "--tc-ff", "0.3"], r"^--ffn-rank=8: factorises dense linears"),
    (["--ffn-rank", "-1"], r"^--ffn-rank=-1: negative; allowed: an integer >= 0$"),
])
def test_a_variant_from_outside_is_checked_in_one_line(low_rank, given, line):
    with pytest.raises(ValueError, match=line) as caught:
        build("slim_lm", TINY_LM, True, given)
    assert "\n" not in str(caught.value)


def test_the_variant_leaves_the_vocabulary():
    from slim_fairseq import options
    assert "--ffn-rank" not in {flag for option in options.all_options() for flag in option.flags()}
    with pytest.raises(SystemExit):
        build("slim_lm", TINY_LM, True, ["--ffn-rank", "8"])


def test_fairseq_train_loads_the_variant_with_its_user_dir(tmp_path):
    """A user's own --user-dir that imports the plugin and registers the variant."""
    user_dir = tmp_path / "my_ffn"
    user_dir.mkdir()
    (user_dir / "__init__.py").write_text(open(EXAMPLE).read())
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), *task_args(True), "--user-dir", str(user_dir),
         "--arch", "slim_lm", *TINY_LM, "--ffn-rank", "8", "--cpu", "--optimizer", "adam",
         "--lr", "1e-3", "--max-update", "1", "--batch-size", "2", "--no-save",
         "--disable-validation", "--log-format", "simple"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(fc1): Sequential" in proc.stdout + proc.stderr
