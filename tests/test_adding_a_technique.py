"""The worked examples of docs/DESIGN.md, "Adding a technique": a feed-forward variant
(tests/fixtures/low_rank_ffn.py), a gate on the attention's output
(tests/fixtures/attention_output_gate.py) and a positional scheme of biases on the attention
scores (tests/fixtures/alibi.py), each written outside the plugin as a spec, a module and a
registration, become options of both models, checked by their own rules and the plugin's, built
inside fairseq's encoder and decoder, trained, decoded step by step and saved, with no file of
the plugin changed; then they leave the vocabulary again."""
import ast
import contextlib
import importlib.util
import os
import subprocess

import pytest
import torch

from helpers import BIN, REPO, TOOL_ENV, build, task_args, unregister
from slim_fairseq_lab import contract

FIXTURES = os.path.join(REPO, "tests", "fixtures")
EXAMPLE = os.path.join(FIXTURES, "low_rank_ffn.py")
TINY_LM = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
           "--decoder-attention-heads", "4", "--decoder-layers", "3"]
TINY_TRANSLATION = ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
                    "--encoder-attention-heads", "4", "--encoder-layers", "2",
                    "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
                    "--decoder-attention-heads", "4", "--decoder-layers", "2"]
# each example: its file, (spec class, module class, registration), the options that turn it on
EXAMPLES = {
    "low_rank_ffn": (("LowRankOptions", "LowRankFeedForward", "register_feed_forward"),
                     ["--ffn-rank", "8"]),
    "attention_output_gate": (("OutputGateOptions", "OutputGate", "register_attention_extension"),
                              ["--attn-output-gate"]),
    "alibi": (("ALiBiOptions", "ALiBi", "register_attention_extension"),
              ["--alibi", "--no-token-positional-embeddings"]),
}


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(FIXTURES, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def examples():
    """The examples' modules, registered for the test and removed after it."""
    loaded = {name: _load(name) for name in (*EXAMPLES, "scale_norm")}
    try:
        yield loaded
    finally:
        unregister("scalenorm")
        unregister(loaded["low_rank_ffn"].LowRankOptions)
        unregister(loaded["attention_output_gate"].OutputGateOptions)
        unregister(loaded["alibi"].ALiBiOptions)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_is_a_spec_a_module_and_a_registration(name):
    """The three parts every technique has (docs/DESIGN.md): one spec class, one module class,
    one registration call, and nothing else of the plugin."""
    tree = ast.parse(open(os.path.join(FIXTURES, name + ".py")).read())
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    calls = [ast.unparse(node.value.func) for node in tree.body
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    spec_cls, module_cls, registration = EXAMPLES[name][0]
    assert classes == [spec_cls, module_cls] and calls == [registration]


@contextlib.contextmanager
def _registered(register, spec_cls, *entry, **entries):
    """A technique written in a test, registered while the block runs (``register(spec_cls,
    *entry, **entries)``), then removed (``helpers.unregister``)."""
    register(spec_cls, *entry, **entries)
    try:
        yield
    finally:
        unregister(spec_cls)


def _checked(arch, model, task, args, lm, directory):
    """The contract's checks (gradients, step-by-step decoding equal to the full pass, no
    future leak, padding, a checkpoint's round trip), each of which must pass."""
    results = contract.run_checks(arch, model, task, args, lm, directory)
    assert {name: r["error"] for name, r in results.items() if not r["ok"]} == {}
    return results


@pytest.fixture()
def low_rank(examples):
    return examples["low_rank_ffn"]


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
    _checked("slim_lm", model, task, args, True, tmp_path)
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


# ---------------------------------------------------------------------------- attention extensions

BOTH = ["--attn-output-gate", "--alibi", "--no-token-positional-embeddings", "--dropout", "0"]


@pytest.mark.parametrize("arch, lm, shape", [("slim_lm", True, TINY_LM),
                                             ("slim_transformer", False, TINY_TRANSLATION)])
def test_attention_extensions_from_outside_build_train_and_decode(examples, arch, lm, shape,
                                                                  tmp_path):
    args, task, model = build(arch, shape, lm, BOTH)
    gate, alibi = examples["attention_output_gate"].OutputGate, examples["alibi"].ALiBi
    for layer in model.decoder.layers:  # the self-attentions hold both, the cross-attention none
        assert [type(m) for m in layer.self_attn.extensions.values()] == [gate, alibi]
        assert getattr(getattr(layer, "encoder_attn", None), "extensions", None) is None
    names = {n for n in model.state_dict() if ".extensions." in n}
    assert "decoder.layers.0.self_attn.extensions.attn_output_gate.proj.weight" in names
    assert not any("alibi" in n for n in names)  # the slopes are no weights
    _, _, plain = build(arch, shape, lm, ["--no-token-positional-embeddings", "--dropout", "0"])
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    self_attentions = 3 if lm else 4
    assert count(model) - count(plain) == self_attentions * (32 * 32 + 32)
    _checked(arch, model, task, args, lm, tmp_path)


def test_an_output_gate_joins_a_skipless_block(examples, tmp_path):
    args, task, model = build("skipless_lm", TINY_LM, True, ["--attn-output-gate"])
    assert "attn_output_gate" in model.decoder.layers[0].self_attn.extensions
    _checked("skipless_lm", model, task, args, True, tmp_path)


def _attention(spec_options, need_weights):
    """A decoder self-attention with the extensions of ``spec_options``, on 2 x 5 inputs:
    (output, the same attention's output without its extensions, the attention)."""
    from slim_fairseq.modules.attention import SlimMultiheadAttention, mark_causal
    from slim_fairseq.specs import AttentionSpec
    torch.manual_seed(0)
    attention = SlimMultiheadAttention(16, 4, self_attention=True,
                                       spec=AttentionSpec(extensions=tuple(spec_options))).eval()
    x = torch.randn(5, 2, 16)
    mask = mark_causal(torch.triu(torch.full((5, 5), float("-inf")), 1))
    out, _ = attention(x, x, x, attn_mask=mask, need_weights=need_weights)
    return out, attention, x, mask


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_alibi_adds_its_biases_to_the_scores(examples, need_weights):
    """The attention with ALiBi equals softmax(q k^T / sqrt(d_h) - m_h (i - j) + causal) v,
    in the fused path and in the one that returns the weights."""
    alibi = examples["alibi"].ALiBiOptions(alibi=True)
    out, attention, x, mask = _attention([alibi], need_weights)
    q = attention.q_proj(x).view(5, 2, 4, 4).permute(1, 2, 0, 3)
    k = attention.k_proj(x).view(5, 2, 4, 4).permute(1, 2, 0, 3)
    v = attention.v_proj(x).view(5, 2, 4, 4).permute(1, 2, 0, 3)
    slopes = torch.tensor([2.0 ** (-8.0 * h / 4) for h in range(1, 5)])
    i = torch.arange(5)
    bias = -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
    scores = q @ k.transpose(2, 3) / 2.0 + bias + mask
    expected = (torch.softmax(scores, -1) @ v).permute(2, 0, 1, 3).reshape(5, 2, 16)
    torch.testing.assert_close(out, attention.out_proj(expected), rtol=1e-5, atol=1e-6)


def test_the_output_gate_multiplies_the_heads_output(examples):
    """A gate whose weights are zero is sigmoid(0) = 1/2 on every channel: the output projection
    then reads half the ungated heads' output."""
    gate = examples["attention_output_gate"].OutputGateOptions(attn_output_gate=True)
    _, attention, x, mask = _attention([gate], False)
    proj = attention.extensions["attn_output_gate"].proj
    torch.nn.init.zeros_(proj.weight), torch.nn.init.zeros_(proj.bias)
    out_proj, attention.out_proj = attention.out_proj, None
    gated, _ = attention(x, x, x, attn_mask=mask)
    attention._output_hooks = []
    ungated, _ = attention(x, x, x, attn_mask=mask)
    torch.testing.assert_close(gated, ungated / 2)
    assert out_proj is not None


@pytest.mark.parametrize("given, line", [
    (["--alibi"], r"^--alibi: gives the attention its positions, and fairseq's token positional "
                  r"embeddings add a second kind; allowed: --no-token-positional-embeddings$"),
    (["--alibi", "--no-token-positional-embeddings", "--skipless-layout", "parallel"],
     r"^--alibi: adds to the attention scores, and --skipless-layout makes the decoder's "
     r"self-attention shaped attention, which has none; allowed: --skipless-layout none, or "
     r"drop --alibi$"),
])
def test_an_extension_from_outside_is_checked_in_one_line(examples, given, line):
    with pytest.raises(ValueError, match=line) as caught:
        build("slim_lm", TINY_LM, True, given)
    assert "\n" not in str(caught.value)


def test_the_extensions_leave_the_vocabulary():
    from slim_fairseq import options
    from slim_fairseq.modules.attention import EXTENSIONS
    flags = {flag for option in options.all_options() for flag in option.flags()}
    assert not {"--alibi", "--attn-output-gate"} & flags and EXTENSIONS == {}


def test_fairseq_train_saves_and_eval_lm_reloads_extensions_of_a_user_dir(tmp_path):
    """A user's own --user-dir that registers both extensions: fairseq-train trains and saves,
    fairseq-eval-lm loads the checkpoint with the same --user-dir and scores the valid split."""
    user_dir = tmp_path / "my_attention"
    user_dir.mkdir()
    (user_dir / "__init__.py").write_text(
        open(os.path.join(FIXTURES, "attention_output_gate.py")).read() + "\n"
        + open(os.path.join(FIXTURES, "alibi.py")).read())
    save = tmp_path / "save"
    train = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), *task_args(True), "--user-dir", str(user_dir),
         "--arch", "slim_lm", *TINY_LM, *BOTH, "--cpu", "--optimizer", "adam", "--lr", "1e-3",
         "--max-update", "2", "--batch-size", "2", "--save-dir", str(save), "--no-epoch-checkpoints",
         "--disable-validation", "--log-format", "simple"],
        capture_output=True, text=True, env=TOOL_ENV, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "(attn_output_gate): OutputGate" in train.stdout + train.stderr
    data = task_args(True)[0]
    evaluate = subprocess.run(
        [os.path.join(BIN, "fairseq-eval-lm"), data, "--user-dir", str(user_dir), "--path",
         str(save / "checkpoint_last.pt"), "--cpu", "--batch-size", "2", "--max-sentences", "2",
         "--tokens-per-sample", "64", "--max-valid-steps", "2"],
        capture_output=True, text=True, env=TOOL_ENV, timeout=600)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert "Perplexity" in evaluate.stdout + evaluate.stderr


def test_the_export_refuses_a_technique_it_does_not_know(examples, tmp_path):
    """The export is an allow-list: an option of a technique registered from outside is
    refused in one line, with the plugin's own options in the way, before anything is
    written."""
    from hf_export_fixtures import data_of, tiny_checkpoint
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    path = tiny_checkpoint(tmp_path, "slim_lm", ["--attn-output-gate", "--scale-attn"], True)
    with pytest.raises(OptionError) as caught:
        export(path, data_of(True), str(tmp_path / "hf"))
    assert str(caught.value) == (
        "--attn-output-gate, --scale-attn: 2 options are in the way: --attn-output-gate: a "
        "technique registered outside the plugin (attention_output_gate.OutputGateOptions), "
        "which no layout of the export declares it computes; --scale-attn: NormFormer's scales "
        "are in no class here; allowed: a model trained with all of no --attn-output-gate, and "
        "no --scale-attn")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------- a norm

@pytest.mark.parametrize("arch, lm, shape", [("slim_lm", True, TINY_LM),
                                             ("slim_transformer", False, TINY_TRANSLATION)])
def test_a_norm_from_outside_builds_trains_and_decodes(examples, arch, lm, shape, tmp_path):
    args, task, model = build(arch, shape, lm, ["--norm", "scalenorm", "--dropout", "0"])
    scale_norm = examples["scale_norm"].ScaleNorm
    norms = [m for m in model.modules() if isinstance(m, scale_norm)]
    # every block's norms, and the final norm of a pre-norm LM (a post-norm translation model
    # has none): 3 layers x 2 + 1, or 2 encoder layers x 2 + 2 decoder layers x 3
    assert len(norms) == (3 * 2 + 1 if lm else 2 * 2 + 2 * 3)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    _checked(arch, model, task, args, lm, tmp_path)


def test_a_norm_from_outside_is_a_choice_and_the_export_refuses_it(examples, tmp_path):
    from hf_export_fixtures import data_of, tiny_checkpoint
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    with pytest.raises(ValueError, match=r"^--norm=scale: not one of the choices; allowed: "
                                         r"layernorm\|rmsnorm\|none\|scalenorm$"):
        build("slim_lm", TINY_LM, True, ["--norm", "scale"])
    path = tiny_checkpoint(tmp_path, "slim_lm", ["--norm", "scalenorm"], True)
    with pytest.raises(OptionError) as caught:
        export(path, data_of(True), str(tmp_path / "hf"))
    assert str(caught.value).startswith("--norm=scalenorm: a norm registered outside the plugin "
                                        "(scale_norm.ScaleNorm), which no layout of the export "
                                        "computes; allowed: ")
    assert not (tmp_path / "hf").exists()


def test_the_norm_leaves_the_choices():
    from slim_fairseq.models.slim_options import NORMS
    assert list(NORMS) == ["layernorm", "rmsnorm", "none"]


def test_positions_of_queries_and_keys_from_outside_are_the_plugins_rope(tmp_path):
    """An extension whose ``queries_keys`` rotates the new queries and keys with the plugin's
    RotaryEmbedding computes what ``--rope-theta 10000`` does, in the full pass and step by
    step: the hook sees each step's position."""
    from dataclasses import dataclass

    from slim_fairseq.models.slim_layers import register_attention_extension
    from slim_fairseq.models.slim_options import AttentionExtension
    from slim_fairseq.modules.rope import RotaryEmbedding
    from slim_fairseq.options import option

    @dataclass(frozen=True)
    class RotaryOptions(AttentionExtension):
        rotary_from_outside: bool = option("--rotary-from-outside", False, "RoPE, from outside",
                                           "a test's technique", kind=bool)
        roles = ("encoder_self", "decoder_self")

        @property
        def on(self):
            return self.rotary_from_outside

    class Rotary(torch.nn.Module):
        def __init__(self, spec, attention):
            super().__init__()
            self.rope = RotaryEmbedding(attention.head_dim, 10000.0)

        def queries_keys(self, q, k, past):
            rows = self.rope.rows(q, past)
            return self.rope.rotate(q, *rows), self.rope.rotate(k, *rows)

    with _registered(register_attention_extension, RotaryOptions, Rotary):
        common = ["--no-token-positional-embeddings", "--dropout", "0"]
        args, task, outside = build("slim_lm", TINY_LM, True, ["--rotary-from-outside", *common])
        _, _, plugin = build("slim_lm", TINY_LM, True, ["--rope-theta", "10000", *common])
        plugin.load_state_dict(outside.state_dict())
        tokens = torch.randint(4, len(task.target_dictionary), (2, 7))
        outside.eval(), plugin.eval()
        torch.testing.assert_close(outside(tokens)[0], plugin(tokens)[0], rtol=0, atol=0)
        _checked("slim_lm", outside, task, args, True, tmp_path)


# ---------------------------------------------------------------------------- an input embedding

@pytest.fixture()
def channel_scaled():
    """An input embedding from outside: fairseq's path on a table half the model's width,
    projected in, then scaled per channel by learned factors."""
    from dataclasses import dataclass

    from slim_fairseq.models.slim_layers import register_input_embedding
    from slim_fairseq.models.slim_options import InputEmbeddingVariant
    from slim_fairseq.modules.input_embedding import StandardInputEmbedding
    from slim_fairseq.options import option

    @dataclass(frozen=True)
    class ChannelScaledOptions(InputEmbeddingVariant):
        channel_scaled_embedding: bool = option("--channel-scaled-embedding", False,
                                                "a narrow table, scaled per channel",
                                                "a test's technique", kind=bool)

        @property
        def on(self):
            return self.channel_scaled_embedding

    class ChannelScaled(StandardInputEmbedding):
        @staticmethod
        def table_dim(spec):
            return spec.model_dim // 2

        @classmethod
        def from_spec(cls, spec, table):
            module = super().from_spec(spec, table)
            module.channel_scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, spec.model_dim))
            return module

        def forward(self, tokens, incremental_state=None):
            return super().forward(tokens, incremental_state) * self.channel_scale

    with _registered(register_input_embedding, ChannelScaledOptions,
                     ChannelScaled):
        yield ChannelScaled


@pytest.mark.parametrize("arch, lm, shape", [("slim_lm", True, TINY_LM),
                                             ("slim_transformer", False, TINY_TRANSLATION)])
def test_an_input_embedding_from_outside_builds_trains_and_decodes(channel_scaled, arch, lm,
                                                                   shape, tmp_path):
    args, task, model = build(arch, shape, lm, ["--channel-scaled-embedding", "--dropout", "0"])
    sides = [model.decoder] if lm else [model.encoder, model.decoder]
    for side in sides:
        embedding = side.embed_tokens
        assert isinstance(embedding, channel_scaled) and embedding.table.embedding_dim == 16
        assert embedding.project_in_dim.in_features == 16
    _checked(arch, model, task, args, lm, tmp_path)


def test_an_input_embedding_from_outside_is_one_of_them(channel_scaled):
    with pytest.raises(ValueError, match=r"^--channel-scaled-embedding: an input embedding, and "
                                         r"--hsoftpos-levels selects another; allowed: "
                                         r"--hsoftpos-levels 0, or drop --channel-scaled-embedding$"):
        build("slim_lm", TINY_LM, True, ["--channel-scaled-embedding", "--hsoftpos-levels", "2"])


# ---------------------------------------------------------------------------- an output projection

@pytest.fixture()
def low_rank_output():
    """A vocabulary projection from outside: logits through rank 8, ``E (W x)`` with E the token
    table when tied."""
    from dataclasses import dataclass

    from slim_fairseq.models.slim_layers import register_output_projection
    from slim_fairseq.models.slim_options import OutputVariant
    from slim_fairseq.options import option

    @dataclass(frozen=True)
    class LowRankOutputOptions(OutputVariant):
        low_rank_output: int = option("--low-rank-output", 0, "rank of the vocabulary projection",
                                      "a test's technique", kind=int, check="nonneg")

        @property
        def on(self):
            return self.low_rank_output > 0

    class LowRankOutput(torch.nn.Module):
        def __init__(self, spec, table, dim, vocab, tied):
            super().__init__()
            self.down = torch.nn.Linear(dim, spec.low_rank_output, bias=False)
            self.up = torch.nn.Linear(spec.low_rank_output, vocab, bias=False)

        def forward(self, x):
            return self.up(self.down(x))

    with _registered(register_output_projection, LowRankOutputOptions, LowRankOutput):
        yield LowRankOutput


@pytest.mark.parametrize("arch, lm, shape", [("slim_lm", True, TINY_LM),
                                             ("slim_transformer", False, TINY_TRANSLATION)])
def test_an_output_projection_from_outside_builds_trains_and_decodes(low_rank_output, arch, lm,
                                                                     shape, tmp_path):
    args, task, model = build(arch, shape, lm, ["--low-rank-output", "8", "--dropout", "0"])
    assert isinstance(model.decoder.output_projection, low_rank_output)
    vocab = len(task.target_dictionary)
    names = {n for n in model.state_dict() if n.startswith("decoder.output_projection.")}
    assert names == {"decoder.output_projection.down.weight", "decoder.output_projection.up.weight"}
    assert model.decoder.output_projection.up.weight.shape == (vocab, 8)
    _checked(arch, model, task, args, lm, tmp_path)


def test_an_output_projection_from_outside_is_one_of_them(low_rank_output):
    with pytest.raises(ValueError, match=r"^--low-rank-output=8: a vocabulary projection, and "
                                         r"--tc-output acts on another; allowed: --tc-output 0, or "
                                         r"drop --low-rank-output$"):
        build("slim_lm", TINY_LM, True, ["--low-rank-output", "8", "--tc-output", "0.5"])


# ---------------------------------------------------------------------------- a block layout

@pytest.fixture()
def parallel_block():
    """A block layout from outside: the parallel block of GPT-J and PaLM, attention and
    feed-forward reading one norm of x, ``y = x + Attn(LN(x)) + FFN(LN(x))``, language models
    only (its rule)."""
    from dataclasses import dataclass

    from slim_fairseq.models.slim_layers import SlimDecoderLayer, register_block_layout
    from slim_fairseq.models.slim_options import BlockLayout
    from slim_fairseq.option_errors import option_error
    from slim_fairseq.options import option, rule

    @dataclass(frozen=True)
    class ParallelOptions(BlockLayout):
        parallel_block: bool = option("--parallel-block", False, "y = x + Attn(LN x) + FFN(LN x)",
                                      "a test's technique", kind=bool)

        @property
        def on(self):
            return self.parallel_block

        @rule
        def language_models_only(self, m):
            if self.on and m.model != "slim_lm":
                raise option_error("--parallel-block", None, "a decoder block without "
                                   "cross-attention", "a language model (--arch slim_lm)")

    class ParallelDecoderLayer(SlimDecoderLayer):
        def __init__(self, cfg, no_encoder_attn=True, spec=None):
            super().__init__(cfg, no_encoder_attn, spec=spec)
            self.final_layer_norm = None  # one norm, read by both branches

        def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                    prev_self_attn_state=None, prev_attn_layer_state=None, self_attn_mask=None,
                    self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
            h = self.self_attn_layer_norm(x)
            attn, _ = self.self_attn(query=h, key=h, value=h,
                                     key_padding_mask=self_attn_padding_mask,
                                     incremental_state=incremental_state, need_weights=False,
                                     attn_mask=self_attn_mask)
            return x + self.dropout_module(attn) + self.dropout_module(self.feed_forward(h)), \
                None, None

    with _registered(register_block_layout, ParallelOptions,
                     decoder_layer=ParallelDecoderLayer):
        yield ParallelDecoderLayer


def test_a_block_layout_from_outside_builds_trains_and_decodes(parallel_block, tmp_path):
    args, task, model = build("slim_lm", TINY_LM, True, ["--parallel-block", "--dropout", "0"])
    assert all(type(layer) is parallel_block for layer in model.decoder.layers)
    # a sandwich builds its layers through the same hook: its middle is the layout's too
    sandwich_args, _, sandwich = build("slim_lm", TINY_LM, True, ["--parallel-block", "--sandwich",
                                                                  "--dropout", "0"])
    assert all(type(layer) is parallel_block for layer in sandwich.decoder.layers)
    (tmp_path / "sandwich").mkdir()
    _checked("slim_lm", sandwich, task, sandwich_args, True, tmp_path / "sandwich")
    _, _, plugin = build("slim_lm", TINY_LM, True, ["--dropout", "0"])
    own = set(model.state_dict())  # the plugin's block's parts but its second norm
    assert own == {n for n in plugin.state_dict() if ".final_layer_norm." not in n}
    plugin.load_state_dict(model.state_dict(), strict=False)
    tokens = torch.randint(4, len(task.target_dictionary), (2, 7))
    model.eval(), plugin.eval()
    assert not torch.allclose(model(tokens)[0], plugin(tokens)[0])  # another computation
    _checked("slim_lm", model, task, args, True, tmp_path)


@pytest.mark.parametrize("arch, lm, given, line", [
    ("slim_lm", True, ["--parallel-block", "--skipless-layout", "serial"],
     r"^--parallel-block: a block layout, and --skipless-layout selects another; allowed: "
     r"--skipless-layout none, or drop --parallel-block$"),
    ("slim_transformer", False, ["--parallel-block"],
     r"^--parallel-block: a decoder block without cross-attention; allowed: a language model "
     r"\(--arch slim_lm\)$"),
])
def test_a_block_layout_from_outside_is_checked_in_one_line(parallel_block, arch, lm, given, line):
    with pytest.raises(ValueError, match=line):
        build(arch, TINY_LM if lm else TINY_TRANSLATION, lm, given)
