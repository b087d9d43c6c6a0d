"""Language models as transformers custom code (slim_fairseq/export_hf/custom.py,
docs/EXPORT.md): a tiny skipless language model, ``anthe_lm_gpt2_small`` and
``subformer_lm_wiki103_83m`` (adaptive input and softmax, a wider middle) trained by
fairseq-train, the reduced parallel skipless form, an Anthe LM of another gate, a ``slim_lm``
with SAFE and a middle of another shape, and Anthe LMs with RMSNorm (pre- and post-norm),
learned positions and ``--layernorm-embedding`` are exported, then loaded by
``AutoModelForCausalLM`` with ``trust_remote_code=True`` in a separate process in which ``fairseq`` and ``slim_fairseq``
cannot be imported (offline): fairseq's log-probabilities within 1e-5 on an unpadded and a
right-padded batch, fairseq's greedy output for 10 tokens and its beam-5 output from ``</s>``,
the cache equal to the full pass and greedy search alike with and without it. The technique
maths in OUT_DIR is the plugin's own files, byte for byte, and the modeling file computes none
of it; the adaptive softmax's file is held to fairseq's ``AdaptiveSoftmax.get_log_prob``."""
import ast
import json
import os
import subprocess

import pytest
import torch

from helpers import BIN, build, wikitext_data_bin
from hf_export_fixtures import (TINY_LM, WITHOUT_FAIRSEQ, data_of, run_without_fairseq,
                                tiny_checkpoint, trained)
from test_export_hf import _fairseq, _pad_right, _samples

os.environ["HF_HUB_OFFLINE"] = "1"
TOLERANCE = 1e-5
PROG = "slim-fairseq-export-hf"
# the dictionary of the tests' data-bin has 2,000 types: the Subformer presets' proportions of it
CUTOFFS = ["--adaptive-input-cutoff", "149,448", "--adaptive-softmax-cutoff", "149,448",
           "--criterion", "adaptive_loss"]
# one of each family, trained by fairseq-train
TRAINED = {"skipless": ("skipless_lm", []), "anthe": ("anthe_lm_gpt2_small", []),
           # the Subformer: adaptive input (written as the one table it computes), a tied
           # adaptive softmax and a middle twice as wide
           "subformer_lm": ("subformer_lm_wiki103_83m", ["--decoder-layers", "3", *CUTOFFS,
                                                         "--ddp-backend", "legacy_ddp"])}
# built and moved off their initial values: the reduced parallel skipless form (no W_Q, no P)
# with grouped key/value heads, the branch scale 0.5 and a GLU; another gate with three
# H-SoftPOS levels, RoPE and grouped key/value heads
BUILT = {"skipless_reduced": ("skipless_lm_parallel_noqp",
                              ["--kv-heads", "2", "--ffn-glu", "--activation-fn", "gelu"]),
         "anthe_qgk": ("slim_lm", ["--self-attn-gate", "qgk", "--hsoftpos-levels", "3",
                                   "--rope-theta", "10000", "--no-token-positional-embeddings",
                                   "--kv-heads", "2"]),
         # SAFE and a middle of another width, FFN width and heads
         "safe_sandwich": ("slim_lm", ["--safe-embed-dim", "16", "--sandwich", "--decoder-layers",
                                       "3", "--sandwich-dim", "48", "--sandwich-ffn-dim", "80",
                                       "--sandwich-heads", "2"]),
         # RMSNorm in pre-norm blocks; and post-norm RMSNorm blocks with learned positions
         "anthe_rmsnorm": ("slim_lm", ["--self-attn-gate", "qgv", "--norm", "rmsnorm"]),
         "anthe_postnorm_learned": ("slim_lm", ["--hsoftpos-levels", "2", "--norm", "rmsnorm",
                                                "--no-decoder-normalize-before",
                                                "--decoder-learned-pos"]),
         # a LayerNorm on the embedding's output
         "anthe_layernorm_embedding": ("slim_lm", ["--self-attn-gate", "kgv",
                                                   "--layernorm-embedding"])}
NAMES = [*TRAINED, *BUILT]
LENGTHS = {"unpadded": [12, 12], "padded": [12, 5]}
PROMPTS = [6, 9]
# beam search from ``</s>`` alone, compared on its first 10 tokens: fairseq forces a prompt on
# every beam (its beams then repeat one another:
# https://github.com/facebookresearch/fairseq/issues/712), and at its length limit it
# scores the forced ``</s>`` that transformers does not, so only the ending may differ
BEAM_LENGTH = 30

TRANSFORMERS_SIDE = WITHOUT_FAIRSEQ + r'''
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.manual_seed(0)
BEAM_LENGTH = int(sys.argv[3])
job = torch.load(sys.argv[1])
results = {}
for name, case in job.items():
    model = AutoModelForCausalLM.from_pretrained(case["out_dir"], local_files_only=True,
                                                 trust_remote_code=True).eval()
    AutoTokenizer.from_pretrained(case["out_dir"], local_files_only=True, trust_remote_code=True)
    pad = model.config.pad_token_id
    found = {"class": type(model).__name__, "module": type(model).__module__, "log_probs": {}}
    with torch.no_grad():
        for kind, tokens in case["batches"].items():
            logits = model(input_ids=tokens, attention_mask=tokens.ne(pad).long()).logits
            found["log_probs"][kind] = logits.log_softmax(-1)
        # the cache against the full pass: a prefix, one token at a time, then three at once
        tokens = case["batches"]["unpadded"]
        full = model(input_ids=tokens, use_cache=False).logits
        first = model(input_ids=tokens[:, :5], use_cache=True)
        cache = getattr(first, "cache", None) or first.past_key_values
        steps = [first.logits]
        for t in range(5, 9):
            steps.append(model(input_ids=tokens[:, t:t + 1], cache=cache, use_cache=True).logits)
        steps.append(model(input_ids=tokens[:, 9:12], cache=cache, use_cache=True).logits)
        found["cache_gap"] = (torch.cat(steps, dim=1) - full).abs().max().item()
        for key in ("greedy", "greedy_no_cache", "beam", "beam_no_cache"):
            found[key] = []
        for prompt in case["prompts"]:
            for key, use_cache, beams in (("greedy", True, 1), ("greedy_no_cache", False, 1),
                                          ("beam", True, 5), ("beam_no_cache", False, 5)):
                out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                     max_new_tokens=10, use_cache=use_cache, num_beams=beams)
                found[key].append(out[0, prompt.size(1):].tolist())
        start = torch.tensor([[model.config.eos_token_id]])
        out = model.generate(input_ids=start, attention_mask=torch.ones_like(start), num_beams=5,
                             max_new_tokens=BEAM_LENGTH, early_stopping=True, length_penalty=1.0)
        found["beam_from_start"] = out[0, 1:].tolist()
    results[name] = found
torch.save(results, sys.argv[2])
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_custom")


@pytest.fixture(scope="module")
def exports(folder):
    """``{name: (checkpoint, ExportResult)}``: :data:`TRAINED`, each trained 4 updates by
    fairseq-train, and :data:`BUILT`."""
    from slim_fairseq.export_hf import export
    paths = {name: trained(folder, name, arch, True, argv)
             for name, (arch, argv) in TRAINED.items()}
    for name, (arch, argv) in BUILT.items():
        paths[name] = tiny_checkpoint(folder, arch, argv, True)
    return {name: (path, export(path, wikitext_data_bin(), str(folder / f"{name}-hf"),
                                sentences=4))
            for name, path in paths.items()}


@torch.no_grad()
def _fairseq_side(path):
    """fairseq's log-probabilities of the batches and its greedy continuations of the prompts."""
    from fairseq.sequence_generator import SequenceGenerator
    task, model = _fairseq(path, True)
    pad = task.target_dictionary.pad()
    batches = {kind: _pad_right(_samples(task, True, lengths), pad)
               for kind, lengths in LENGTHS.items()}
    log_probs = {kind: model.get_normalized_probs(model(tokens), log_probs=True)
                 for kind, tokens in batches.items()}
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_a=0,
                                  max_len_b=30)
    eos = task.target_dictionary.eos()
    start = {"src_tokens": torch.tensor([[eos]]), "src_lengths": torch.tensor([1])}
    beam = SequenceGenerator([model], task.target_dictionary, beam_size=5, max_len_a=0,
                             max_len_b=BEAM_LENGTH)
    beam = task.inference_step(beam, [model], {"net_input": start})[0][0]["tokens"].tolist()
    prompts, greedy = [], []
    for sample in _samples(task, True, PROMPTS):
        prompt = torch.tensor([sample])
        net_input = {"src_tokens": prompt, "src_lengths": torch.tensor([prompt.size(1)])}
        hypo = task.inference_step(generator, [model], {"net_input": net_input})[0][0]
        prompts.append(prompt)
        greedy.append(hypo["tokens"].tolist()[prompt.size(1) - 1:])
    return dict(batches=batches, log_probs=log_probs, prompts=prompts, greedy=greedy, pad=pad,
                beam=beam)


@pytest.fixture(scope="module")
def sides(folder, exports):
    """``{name: (fairseq's side, transformers' side)}``, transformers' computed in a process
    that cannot import fairseq or slim_fairseq."""
    fairseq = {name: _fairseq_side(path) for name, (path, _) in exports.items()}
    job = {name: dict(out_dir=result.out_dir, batches=fairseq[name]["batches"],
                      prompts=fairseq[name]["prompts"])
           for name, (_, result) in exports.items()}
    found = run_without_fairseq(folder, TRANSFORMERS_SIDE, job, BEAM_LENGTH)
    return {name: (fairseq[name], found[name]) for name in exports}


@pytest.mark.parametrize("name", NAMES)
def test_custom_code_scores_and_decodes_as_fairseq_without_fairseq(name, exports, sides):
    _, result = exports[name]
    assert result.hf_class == "SlimForCausalLM" and result.gap <= 1e-4
    fairseq, found = sides[name]
    assert found["class"] == "SlimForCausalLM"
    assert found["module"].startswith("transformers_modules.")  # the folder's own code
    for kind, tokens in fairseq["batches"].items():
        keep = tokens.ne(fairseq["pad"])
        assert keep.sum() > 10 and (kind == "unpadded") == bool(keep.all())
        gap = (fairseq["log_probs"][kind] - found["log_probs"][kind]).abs()[keep].max().item()
        assert gap <= TOLERANCE, (kind, gap)
    for expected, hf_new in zip(fairseq["greedy"], found["greedy"]):
        assert len(hf_new) == 10 and hf_new == expected[:10], (hf_new, expected)
    assert len(fairseq["beam"]) > 10 and found["beam_from_start"][:10] == fairseq["beam"][:10]


@pytest.mark.parametrize("name", NAMES)
def test_cache_gives_the_full_pass(name, sides):
    """The cache (H-SoftPOS's convolution inputs with the keys and values) against the full
    pass, and greedy and beam search alike with and without it (beam search reorders it)."""
    _, found = sides[name]
    assert found["cache_gap"] <= TOLERANCE
    assert found["greedy"] == found["greedy_no_cache"]
    assert found["beam"] == found["beam_no_cache"]


def test_the_reduced_form_leaves_without_its_removed_weights(exports):
    with open(os.path.join(exports["skipless_reduced"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["skipless_layout"] == "parallel" and config["removed_projection"] == "q"
    assert not config["attention_out_proj"] and config["num_key_value_heads"] == 2
    assert config["mlp_branch_scale"] == 0.5 and config["hidden_act"] == "gelu" and config["glu"]


# ----------------------------------------------------------------- the maths lives once

def _imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return tree, found


# what the composition calls: layers, shapes, the cache and the plugin's functions; any other
# call (a softmax, a rotation, a mean) would be maths written a second time
COMPOSITION_CALLS = {
    "super", "__init__", "setattr", "getattr", "range", "isinstance", "dict", "bool", "float",
    "type", "fields", "Linear", "Embedding", "ModuleList", "Parameter", "ones", "full", "triu",
    "view", "transpose", "reshape", "size", "get_seq_length", "update", "rows", "rotate", "eq",
    "all", "flatten", "cross_entropy", "post_init", "DynamicCache", "CausalLMOutputWithPast",
    "RotaryEmbedding", "shaped_mixing", "skipless_output", "glu", "w1", "w3", "SlimAttention", "SlimMLP",
    "SlimBlock", "SlimModel", "proj", "act", "_split", "fc1", "fc2", "o_proj", "self_attn",
    "mlp", "layer", "model", "embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj",
    "ACTIVATIONS", "gated_inputs", "gated", "hsoftpos_levels", "LayerNorm", "Conv1d",
    "ParameterList", "zeros", "scaled_dot_product_attention", "arange", "where", "cat",
    "unsqueeze", "index_select", "repeat_interleave", "to", "items", "change", "_each_history",
    "reorder_cache", "batch_repeat_interleave", "batch_select_indices", "_project",
    "_project_gated", "self_attn_layer_norm", "final_layer_norm", "norm", "positions", "table",
    "SlimEmbedding", "SlimCache", "hasattr", "enumerate", "str", "ne", "level_dilations",
    # the translation model: encoder, decoder, cross-attention, transformers' cache and outputs
    "SideConfig", "SlimEncoder", "SlimDecoder", "SlimEncoderDecoder", "EncoderDecoderCache",
    "BaseModelOutput", "Seq2SeqLMOutput", "build_stack", "run_stack", "encoder", "decoder",
    "padding_mask", "_attend_memory", "_output", "_residual", "branch", "get", "cumsum",
    "new_full", "masked_fill",
    # the Subformer: SAFE's file, a sandwich's width changes (a linear layer and a norm)
    "safe_embedding", "safe_logits", "SlimProjection", "SlimProjectedAttention", "linear",
    "build_output", "output_logits",
    "layer_norm", "to_model", "to_middle", "to_middle_norm", "attention", "up", "down", "len",
    "AttributeError",
    # an adaptive softmax's head and clusters, and its file
    "Sequential", "adaptive_log_probs",
    # the blocks' norm: LayerNorm, or the plugin's RMSNorm
    "block_norm", "RMSNorm", "layernorm_embedding"}


def test_anthe_leaves_with_its_gate_hsoftpos_glu_and_output_bias(exports):
    with open(os.path.join(exports["anthe"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["attention_gate"] == "qgv" and config["hsoftpos_levels"] == 2
    assert config["glu"] and config["output_bias"] and config["positions"] == "sinusoidal"
    assert "Tensor Chains were materialised" in open(
        os.path.join(exports["anthe"][1].out_dir, "README.md")).read()
    with open(os.path.join(exports["anthe_qgk"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["attention_gate"] == "qgk" and config["hsoftpos_levels"] == 3
    assert config["rope_theta"] == 10000 and config["positions"] == "none"
    with open(os.path.join(exports["anthe_rmsnorm"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["norm"] == "rmsnorm" and config["block"] == "pre-norm"
    with open(os.path.join(exports["anthe_postnorm_learned"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["norm"] == "rmsnorm" and config["block"] == "post-norm"
    assert config["positions"] == "learned" and config["hsoftpos_levels"] == 2
    with open(os.path.join(exports["anthe_layernorm_embedding"][1].out_dir, "config.json")) as f:
        assert json.load(f)["layernorm_embedding"]


@pytest.mark.parametrize("name", ["skipless", "anthe"])
def test_exported_maths_is_the_plugins_own_files(name, exports):
    from slim_fairseq.export_hf import custom
    out_dir = exports[name][1].out_dir
    plugin = {os.path.basename(p): p for p in custom.module_files()}
    assert set(plugin) == {"rope.py", "shaped_attention.py", "skipless_block.py",
                           "glu_function.py", "gate_function.py", "hsoftpos_function.py",
                           "safe_function.py", "adaptive_softmax_function.py", "rmsnorm.py"}
    written = {n for n in os.listdir(out_dir) if n.endswith(".py")}
    assert written == set(plugin) | {"modeling_slim.py", "configuration_slim.py"}
    for name, path in plugin.items():  # byte for byte the files the fairseq model runs
        with open(path, "rb") as a, open(os.path.join(out_dir, name), "rb") as b:
            assert a.read() == b.read(), name
        _, imported = _imports(path)
        assert {m.split(".")[0] for level, m in imported} <= {"torch", "math", "typing"}, name
    # the fairseq model runs these very files
    from slim_fairseq.models import slim_layers
    from slim_fairseq.modules import attention
    from slim_fairseq.modules import gated_attention, glu, hsoftpos, safe
    assert slim_layers.skipless_output.__module__ == "slim_fairseq.modules.skipless_block"
    assert glu.glu.__module__ == "slim_fairseq.modules.glu_function"
    assert attention.gated_inputs.__module__ == "slim_fairseq.modules.gate_function"
    assert gated_attention.gated.__module__ == "slim_fairseq.modules.gate_function"
    assert hsoftpos.hsoftpos_levels.__module__ == "slim_fairseq.modules.hsoftpos_function"
    assert attention.shaped_mixing.__module__ == "slim_fairseq.modules.shaped_attention"
    assert attention.RotaryEmbedding.__module__ == "slim_fairseq.modules.rope"
    assert safe.safe_embedding.__module__ == safe.safe_logits.__module__ == \
        "slim_fairseq.modules.safe_function"
    # the modeling file: composition only, each technique imported from its file
    tree, imported = _imports(os.path.join(out_dir, "modeling_slim.py"))
    assert {m for level, m in imported if level} == {"configuration_slim"} | {
        name[:-3] for name in plugin}
    assert {m.split(".")[0] for level, m in imported if not level} <= {"torch", "transformers",
                                                                       "dataclasses"}
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else func.id)
    assert called <= COMPOSITION_CALLS, sorted(called - COMPOSITION_CALLS)
    # no arithmetic of a technique either (a dilation schedule, a scale): the one power is
    # attention's 1/sqrt(head width)
    powers = [node for node in ast.walk(tree)
              if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)]
    assert [getattr(node.left, "attr", None) for node in powers] == ["head_dim"]
    defined = {node.name for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for path in plugin.values():  # no function or class of a technique file defined again
        own = {node.name for node in ast.walk(ast.parse(open(path).read()))
               if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.col_offset == 0}
        assert not own & defined, own & defined


def test_card_says_custom_code_needs_trust_remote_code(exports):
    with open(os.path.join(exports["anthe"][1].out_dir, "README.md")) as f:
        card = f.read()
    assert "## Custom code" in card and "CTranslate2" in card
    assert 'AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)' in card
    assert 'AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)' in card


# ----------------------------------------------------------------- refusals

def test_what_the_custom_code_does_not_compute_is_refused_in_one_line(folder):
    """The command a user runs: a skipless model with an activation the custom code lacks and
    Anthe's gates, both named in one line, exit 2, nothing written."""
    path = tiny_checkpoint(folder, "skipless_lm", ["--activation-fn", "gelu_accurate",
                                                   "--self-attn-gate", "qgv"], True)
    out = folder / "refused-hf"
    proc = subprocess.run([os.path.join(BIN, PROG), path, data_of(True), str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"{PROG}: error: --self-attn-gate=qgv, --activation-fn=gelu_accurate: 2 options are in "
        "the way: --self-attn-gate=qgv: Anthe's gated attention (sigmoid(W x) * W' y) is in no "
        "transformers class; --activation-fn=gelu_accurate: the exported skipless block (custom "
        "code) takes relu|gelu|silu; allowed: a model trained with all of --self-attn-gate "
        "none, and --activation-fn relu|gelu|silu")
    assert not out.exists() and not [n for n in os.listdir(folder) if ".partial-" in n]


def test_subformer_lm_leaves_with_its_middle_safe_and_adaptive_softmax(exports):
    configs = {}
    for name, (_, result) in exports.items():
        with open(os.path.join(result.out_dir, "config.json")) as f:
            configs[name] = json.load(f)
    subformer, safe = configs["subformer_lm"], configs["safe_sandwich"]
    assert subformer["adaptive_softmax"]["head_words"] == 149
    assert [size for _, size in subformer["adaptive_softmax"]["tails"]] == [299, 2000 - 448]
    assert subformer["sandwich"]["projected"] and subformer["sandwich"]["hidden_size"] == 64
    assert subformer["safe"] is None and subformer["hidden_size"] == 32
    assert safe["safe"]["hidden_size"] == 16 and safe["safe_output"] == "linear"
    assert safe["adaptive_softmax"] is None
    assert (safe["sandwich"]["hidden_size"], safe["sandwich"]["intermediate_size"],
            safe["sandwich"]["num_attention_heads"]) == (48, 80, 2)
    assert "adaptive_softmax_function.py" in os.listdir(exports["subformer_lm"][1].out_dir)
    with open(os.path.join(exports["subformer_lm"][1].out_dir, "README.md")) as f:
        assert "adaptive input (a table and a projection per frequency band) was written" in f.read()


@torch.no_grad()
def test_adaptive_softmax_function_is_fairseqs():
    """The file the export copies gives what fairseq's own module gives (the preset's tied
    adaptive softmax, at its factor and at another)."""
    from slim_fairseq.modules.adaptive_softmax_function import adaptive_log_probs
    for argv in ([*CUTOFFS], [*CUTOFFS, "--adaptive-input-factor", "2",
                              "--adaptive-softmax-factor", "2"]):
        _, _, model = build("subformer_lm_wiki103_83m", TINY_LM + ["--decoder-layers", "3"]
                            + argv, True)
        module = model.decoder.adaptive_softmax.eval()
        torch.manual_seed(0)
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
        features = torch.randn(2, 5, module.input_dim)
        expected = module.get_log_prob(features, None)
        found = adaptive_log_probs(features, module.head, module.tail, module.cutoff[0])
        assert found.shape == expected.shape == (2, 5, 2000)
        assert (found - expected).abs().max().item() <= 1e-6
        assert abs(found.exp().sum(-1) - 1).max().item() <= 1e-5
