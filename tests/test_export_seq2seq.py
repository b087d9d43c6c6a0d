"""Translation models as transformers custom code (``SlimForConditionalGeneration``,
slim_fairseq/export_hf/seq2seq.py, docs/EXPORT.md): a tiny ``anthe_base`` (gates in self- and
cross-attention, H-SoftPOS, GLU, output bias, Tensor Chains materialised) and a
``subformer_base`` (SAFE, a wider sandwich middle) trained by fairseq-train, and built and moved
off their initial values a pre-norm ``anthe_base_nopatt``, a combination of both families and
``anthe_base`` models with RMSNorm, learned positions and ``--layernorm-embedding`` are
exported, then loaded by ``AutoModelForSeq2SeqLM`` with ``trust_remote_code=True`` in a process
in which ``fairseq`` and ``slim_fairseq`` cannot be imported (offline): fairseq's
log-probabilities within 1e-5 on an unpadded and two padded batches (sources left-padded as
fairseq collates them or right-padded as transformers' tokenizers pad, targets right-padded),
the cache equal to the full pass, and greedy and beam-5 search equal to fairseq's
SequenceGenerator for 10 tokens, with and without the cache."""
import json
import os

import pytest
import torch

from helpers import ende_data_bin
from hf_export_fixtures import WITHOUT_FAIRSEQ, codes, run_without_fairseq, tiny_checkpoint, trained
from test_export_hf import _fairseq, _pad_right, _samples

os.environ["HF_HUB_OFFLINE"] = "1"
TOLERANCE = 1e-5
CLASS = "SlimForConditionalGeneration"
# trained by fairseq-train: Anthe, and a Subformer (SAFE on both sides and out, a wider middle
# of another FFN width and heads)
TRAINED = {"anthe_base": ("anthe_base", []),
           "subformer": ("subformer_base", ["--encoder-layers", "3", "--decoder-layers", "4"])}
# built and moved off their initial values: identity projections, pre-norm, another gate; and a
# combination: a pre-norm Subformer with SAFE's MLP output, a middle of its own width without
# the cross-attention's closing norm, Anthe's gates, a GELU GLU and RoPE
BUILT = {"anthe_nopatt_prenorm": ("anthe_base_nopatt", [
    "--encoder-normalize-before", "--decoder-normalize-before", "--self-attn-gate", "vgk",
    "--cross-attn-gate", "vgk"]),
    "subformer_gated_rope": ("subformer_base", [
        "--encoder-layers", "3", "--decoder-layers", "3", "--encoder-normalize-before",
        "--decoder-normalize-before", "--safe-output", "mlp", "--sandwich-cross-norm", "none",
        "--sandwich-dim", "48", "--sandwich-heads", "2", "--self-attn-gate", "qgk",
        "--cross-attn-gate", "vgk", "--ffn-glu", "--activation-fn", "gelu", "--rope-theta",
        "10000", "--no-token-positional-embeddings"]),
    # RMSNorm, a pre-norm encoder and a post-norm decoder; learned positions on both sides
    "anthe_rmsnorm_mixed": ("anthe_base", ["--norm", "rmsnorm", "--encoder-normalize-before"]),
    "anthe_learned_pos": ("anthe_base", ["--encoder-learned-pos", "--decoder-learned-pos",
                                         "--decoder-normalize-before"]),
    # a LayerNorm on each side's embedding output
    "anthe_layernorm_embedding": ("anthe_base", ["--layernorm-embedding"])}
NAMES = [*TRAINED, *BUILT]
# sources padded as fairseq collates them (left) and as transformers' tokenizers do (right)
LENGTHS = {"unpadded": [9, 9], "padded": [9, 5], "padded_right": [5, 9]}
PROMPTS = [9, 12]
MAX_LEN_B = 10  # fairseq-generate's --max-len-b of the decoding compared

TRANSFORMERS_SIDE = WITHOUT_FAIRSEQ + r'''
import torch
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessor,
                          LogitsProcessorList)


class FairseqLengthLimit(LogitsProcessor):
    """fairseq's generator at its length limit: only </s>, with its own probability."""

    def __init__(self, max_length, eos):
        self.max_length, self.eos = max_length, eos

    def __call__(self, input_ids, scores):
        if input_ids.size(1) >= self.max_length - 1:
            eos = scores[:, self.eos].clone()
            scores[:] = float("-inf")
            scores[:, self.eos] = eos
        return scores


job = torch.load(sys.argv[1])
results = {}
for name, case in job.items():
    model = AutoModelForSeq2SeqLM.from_pretrained(case["out_dir"], local_files_only=True,
                                                  trust_remote_code=True).eval()
    AutoTokenizer.from_pretrained(case["out_dir"], local_files_only=True, trust_remote_code=True)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    found = {"class": type(model).__name__, "module": type(model).__module__, "log_probs": {}}
    with torch.no_grad():
        for kind, (source, prev) in case["batches"].items():
            logits = model(input_ids=source, attention_mask=source.ne(pad).long(),
                           decoder_input_ids=prev, decoder_attention_mask=prev.ne(pad).long(),
                           use_cache=False).logits
            found["log_probs"][kind] = logits.log_softmax(-1)
        # the cache against the full pass: a prefix, one token at a time, then three at once
        source, prev = case["batches"]["unpadded"]
        full = model(input_ids=source, decoder_input_ids=prev, use_cache=False).logits
        first = model(input_ids=source, decoder_input_ids=prev[:, :4], use_cache=True)
        cache = getattr(first, "cache", None) or first.past_key_values
        encoder_outputs = (first.encoder_last_hidden_state,)
        steps = [first.logits]
        for t in range(4, 7):
            steps.append(model(encoder_outputs=encoder_outputs, decoder_input_ids=prev[:, t:t + 1],
                               cache=cache, use_cache=True).logits)
        steps.append(model(encoder_outputs=encoder_outputs, decoder_input_ids=prev[:, 7:10],
                           cache=cache, use_cache=True).logits)
        found["cache_gap"] = (torch.cat(steps, dim=1) - full).abs().max().item()
        limit = case["max_len_b"] + 2  # the decoder start token, the tokens, </s>
        for key in ("greedy", "greedy_no_cache", "beam", "beam_no_cache"):
            found[key] = []
        for prompt in case["prompts"]:
            for key, use_cache, beams in (("greedy", True, 1), ("greedy_no_cache", False, 1),
                                          ("beam", True, 5), ("beam_no_cache", False, 5)):
                out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                     max_length=limit, use_cache=use_cache, num_beams=beams,
                                     logits_processor=LogitsProcessorList(
                                         [FairseqLengthLimit(limit, eos)]))
                found[key].append(out[0, 1:].tolist())
    results[name] = found
torch.save(results, sys.argv[2])
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_seq2seq")


@pytest.fixture(scope="module")
def exports(folder):
    """``{name: (checkpoint, ExportResult)}``: :data:`TRAINED`, each trained 4 updates by
    fairseq-train, and :data:`BUILT`."""
    from slim_fairseq.export_hf import export
    paths = {name: trained(folder, name, arch, False, argv)
             for name, (arch, argv) in TRAINED.items()}
    for name, (arch, argv) in BUILT.items():
        paths[name] = tiny_checkpoint(folder, arch, argv, False)
    return {name: (path, export(path, ende_data_bin(), str(folder / f"{name}-hf"), sentences=4,
                                bpe="subword_nmt", tokenizer_name="moses", bpe_codes=codes()))
            for name, path in paths.items()}


def _pad_left(rows, pad):
    width = max(len(r) for r in rows)
    return torch.tensor([[pad] * (width - len(r)) + r for r in rows])


@torch.no_grad()
def _fairseq_side(path):
    """fairseq's log-probabilities of the batches, its greedy and beam-5 translations."""
    from fairseq.sequence_generator import SequenceGenerator
    task, model = _fairseq(path, False)
    pad = task.target_dictionary.pad()
    batches, log_probs = {}, {}
    for kind, lengths in LENGTHS.items():
        samples = _samples(task, False, lengths)
        source = (_pad_right if kind == "padded_right" else _pad_left)([s for s, _ in samples],
                                                                         pad)
        prev = _pad_right([t for _, t in samples], pad)
        batches[kind] = (source, prev)
        out = model(source, source.ne(pad).sum(1), prev)
        log_probs[kind] = model.get_normalized_probs(out, log_probs=True)
    prompts, decoded = [], {"greedy": [], "beam": []}
    for source, _ in _samples(task, False, PROMPTS):
        prompt = torch.tensor([source])
        prompts.append(prompt)
        net_input = {"src_tokens": prompt, "src_lengths": torch.tensor([prompt.size(1)])}
        for key, beams in (("greedy", 1), ("beam", 5)):
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=beams,
                                          max_len_a=0, max_len_b=MAX_LEN_B)
            hypo = task.inference_step(generator, [model], {"net_input": net_input})[0][0]
            decoded[key].append(hypo["tokens"].tolist())
    return dict(batches=batches, log_probs=log_probs, prompts=prompts, pad=pad, **decoded)


@pytest.fixture(scope="module")
def sides(folder, exports):
    """``{name: (fairseq's side, transformers' side)}``, transformers' computed in a process
    that cannot import fairseq or slim_fairseq."""
    fairseq = {name: _fairseq_side(path) for name, (path, _) in exports.items()}
    job = {name: dict(out_dir=result.out_dir, batches=fairseq[name]["batches"],
                      prompts=fairseq[name]["prompts"], max_len_b=MAX_LEN_B)
           for name, (_, result) in exports.items()}
    found = run_without_fairseq(folder, TRANSFORMERS_SIDE, job)
    return {name: (fairseq[name], found[name]) for name in exports}


@pytest.mark.parametrize("name", NAMES)
def test_translation_scores_and_decodes_as_fairseq_without_fairseq(name, exports, sides):
    _, result = exports[name]
    assert result.hf_class == CLASS and result.gap <= 1e-4
    fairseq, found = sides[name]
    assert found["class"] == CLASS
    assert found["module"].startswith("transformers_modules.")  # the folder's own code
    for kind, (source, prev) in fairseq["batches"].items():
        keep = prev.ne(fairseq["pad"])
        assert (kind == "unpadded") == bool(keep.all() and source.ne(fairseq["pad"]).all())
        gap = (fairseq["log_probs"][kind] - found["log_probs"][kind]).abs()[keep].max().item()
        assert gap <= TOLERANCE, (kind, gap)
    for key in ("greedy", "beam"):
        for expected, hf_tokens in zip(fairseq[key], found[key]):
            assert len(expected) >= 2 and hf_tokens == expected, (key, hf_tokens, expected)


@pytest.mark.parametrize("name", NAMES)
def test_cache_gives_the_full_pass(name, sides):
    """The cache (the decoder's keys and values with H-SoftPOS's convolution inputs, the
    encoder output's keys and values) against the full pass; search alike with and without
    it (beam search reorders it)."""
    _, found = sides[name]
    assert found["cache_gap"] <= TOLERANCE
    assert found["greedy"] == found["greedy_no_cache"]
    assert found["beam"] == found["beam_no_cache"]


def test_anthe_base_leaves_with_its_gates_hsoftpos_glu_and_output_bias(exports):
    with open(os.path.join(exports["anthe_base"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["attention_gate"] == "qgv" and config["cross_attention_gate"] == "kgv"
    assert config["hsoftpos_levels"] == 2 and config["glu"] and config["output_bias"]
    assert config["block"] == "post-norm" and config["is_encoder_decoder"]
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == f"modeling_slim.{CLASS}"
    with open(os.path.join(exports["anthe_base"][1].out_dir, "generation_config.json")) as f:
        generation = json.load(f)
    assert generation["num_beams"] == 5 and generation["early_stopping"] is True
    with open(os.path.join(exports["anthe_nopatt_prenorm"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["removed_projection"] == "qkv" and config["block"] == "pre-norm"
    assert config["attention_gate"] == config["cross_attention_gate"] == "vgk"


def test_subformer_leaves_with_safe_and_its_middle(exports):
    with open(os.path.join(exports["subformer"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["safe"]["hidden_size"] == 20 and config["safe_output"] == "linear"
    assert config["sandwich"]["hidden_size"] == 64 and config["sandwich"]["projected"]
    assert config["sandwich"]["intermediate_size"] == 192 and config["num_hidden_layers"] == 4
    with open(os.path.join(exports["subformer_gated_rope"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["safe_output"] == "mlp" and not config["sandwich"]["cross_norm"]
    assert config["sandwich"]["num_attention_heads"] == 2 and config["rope_theta"] == 10000


def test_rmsnorm_learned_positions_and_an_embedding_norm_leave_as_such(exports):
    with open(os.path.join(exports["anthe_rmsnorm_mixed"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["norm"] == "rmsnorm" and config["rms_norm_eps"] == 1e-6
    assert config["block"] == "post-norm" and config["encoder"]["block"] == "pre-norm"
    assert "rmsnorm.py" in os.listdir(exports["anthe_rmsnorm_mixed"][1].out_dir)
    with open(os.path.join(exports["anthe_learned_pos"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["positions"] == "learned" and "positions" not in config["encoder"]
    assert config["norm"] == "layernorm" and config["block"] == "pre-norm"
    with open(os.path.join(exports["anthe_layernorm_embedding"][1].out_dir, "config.json")) as f:
        config = json.load(f)
    assert config["layernorm_embedding"] and "layernorm_embedding" not in config["encoder"]


def test_a_sandwich_at_the_models_shape_stays_a_stock_class(tmp_path):
    """Where FSMT or M2M100 computes the model, the export keeps them."""
    from slim_fairseq.export_hf import seq2seq, source, support
    path = tiny_checkpoint(tmp_path, "slim_transformer", [
        "--sandwich", "--sandwich-heads", "4", "--encoder-layers", "3", "--decoder-layers", "3"],
        False)
    src = source.load(path, ende_data_bin())
    assert not seq2seq.applies(src) and support.choose(src).CLASS == "FSMTForConditionalGeneration"


@torch.no_grad()
def test_anthe_language_model_with_identity_projections_leaves_too(tmp_path):
    """``--no-patt`` in a language model: the same custom code without W_Q, W_K, W_V, scoring
    as fairseq on a right-padded batch."""
    from transformers import AutoModelForCausalLM
    from slim_fairseq.export_hf import export
    from hf_export_fixtures import data_of
    path = tiny_checkpoint(tmp_path, "slim_lm", ["--no-patt", "--self-attn-gate", "vgq",
                                                 "--hsoftpos-levels", "2"], True)
    result = export(path, data_of(True), str(tmp_path / "nopatt-hf"), sentences=4)
    assert result.hf_class == "SlimForCausalLM" and result.gap <= TOLERANCE
    with open(os.path.join(result.out_dir, "config.json")) as f:
        assert json.load(f)["removed_projection"] == "qkv"
    task, model = _fairseq(path, True)
    pad = task.target_dictionary.pad()
    tokens = _pad_right(_samples(task, True, [12, 5]), pad)
    hf = AutoModelForCausalLM.from_pretrained(result.out_dir, local_files_only=True,
                                              trust_remote_code=True).eval()
    expected = model.get_normalized_probs(model(tokens), log_probs=True)
    found = hf(input_ids=tokens, attention_mask=tokens.ne(pad).long()).logits.log_softmax(-1)
    assert (expected - found).abs()[tokens.ne(pad)].max().item() <= TOLERANCE


@pytest.mark.parametrize("gate", ["kgv", "kgq"])
def test_the_other_gates_score_as_fairseq(gate, tmp_path):
    """The gates the models above lack (they have qgv, vgk, qgk and none in translation, vgq
    in a language model), in self- and cross-attention: the export's own check, within
    1e-5."""
    from slim_fairseq.export_hf import export
    path = tiny_checkpoint(tmp_path, "slim_transformer", ["--self-attn-gate", gate,
                                                          "--cross-attn-gate", "kgv"], False)
    result = export(path, ende_data_bin(), str(tmp_path / "hf"), sentences=4,
                    bpe="subword_nmt", tokenizer_name="moses", bpe_codes=codes())
    assert result.hf_class == CLASS and result.gap <= TOLERANCE
