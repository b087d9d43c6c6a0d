"""Export to Hugging Face transformers (slim_fairseq/export_hf/): for a tiny model of each row
of README's table (one trained by fairseq-train, the others built and moved off their initial
values), transformers' Auto classes load OUT_DIR offline and give fairseq's log-probabilities
within 1e-5 on an unpadded and a right-padded batch, fairseq's greedy and beam-5 output for 10
tokens, and fairseq's ids for the same text; every STLM preset's tying, LoRA and shared projections leave
with equal log-probabilities; OUT_DIR is never left half written."""
import argparse
import json
import os
import random

import pytest
import torch

from helpers import BIN, REPO, load_script, run_cli, wikitext_data_bin
from hf_export_fixtures import codes, data_of, exported, tiny_checkpoint

os.environ["HF_HUB_OFFLINE"] = "1"

# row -> (arch, options after the tiny widths, language model?, the class it must become)
ROWS = {
    "xglm": ("transformer_lm", ["--decoder-normalize-before", "--decoder-input-dim", "32",
                                "--decoder-output-dim", "32"], True, "XGLMForCausalLM"),
    "opt": ("transformer_lm", ["--decoder-learned-pos", "--decoder-input-dim", "16",
                               "--decoder-output-dim", "16"], True, "OPTForCausalLM"),
    "tensor_chain": ("slim_lm", ["--tc-ff", "0.5", "--tc-patt", "0.5", "--tc-min-bond", "2",
                                 "--no-linear-bias"], True, "XGLMForCausalLM"),
    "fsmt": ("transformer", [], False, "FSMTForConditionalGeneration"),
    "m2m100": ("slim_transformer", ["--encoder-normalize-before", "--decoder-normalize-before",
                                    "--share-all-embeddings", "--sandwich", "--sandwich-heads",
                                    "4", "--encoder-layers", "3", "--decoder-layers", "3"],
               False, "M2M100ForConditionalGeneration"),
}
# the one row trained by fairseq-train: the STLM block with GQA, a head width of its own, FFN
# tying with LoRA and shared attention projections
TRAINED = ["--arch", "stlm_tied", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
           "--decoder-layers", "5", "--decoder-attention-heads", "4", "--kv-heads", "2",
           "--head-dim", "16", "--tie-ffn", "1", "--ffn-lora-rank", "2", "--tie-attn-proj", "0"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_hf")


@pytest.fixture(scope="module")
def trained(folder):
    """``(checkpoint, ExportResult)`` of a model trained 4 updates by fairseq-train."""
    from slim_fairseq.export_hf import export
    save = folder / "trained"
    run_cli("fairseq-train", [
        wikitext_data_bin(), "--task", "language_modeling", "--tokens-per-sample", "64",
        "--sample-break-mode", "none", "--user-dir", os.path.join(REPO, "slim_fairseq"), *TRAINED,
        "--optimizer", "adam", "--lr", "0.01", "--max-update", "4", "--max-tokens", "512",
        "--cpu", "--seed", "3", "--save-dir", str(save), "--disable-validation",
        "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "none"])
    path = str(save / "checkpoint_last.pt")
    return path, export(path, wikitext_data_bin(), str(folder / "trained-hf"), sentences=4)


def _row(name, folder, trained):
    if name == "llama":
        path, result = trained
        return path, result, True
    arch, argv, lm, _ = ROWS[name]
    path, result = exported(folder, arch, argv, lm)
    return path, result, lm


def _fairseq(path, lm):
    from fairseq import checkpoint_utils
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data_of(lm)})
    return task, models[0].float().eval()


def _hf(result, lm):
    import transformers
    auto = transformers.AutoModelForCausalLM if lm else transformers.AutoModelForSeq2SeqLM
    return auto.from_pretrained(result.out_dir, local_files_only=True).eval()


def _pad_right(rows, pad):
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def _samples(task, lm, lengths):
    """Token lists of the valid split cut to ``lengths`` (a LM's starting with </s>)."""
    task.load_dataset("valid")
    dataset, eos = task.dataset("valid"), task.target_dictionary.eos()
    if lm:  # words of the first block: no </s> inside a prompt (fairseq would stop there)
        words = [t for t in dataset[0]["source"].tolist() if t >= task.target_dictionary.nspecial]
        return [[eos] + words[3 * i:3 * i + n - 1] for i, n in enumerate(lengths)]
    pairs = [dataset[i] for i in range(40)]
    pairs = [p for p in pairs if len(p["source"]) >= max(lengths) and len(p["target"]) >= max(lengths)]
    return [(p["source"][:n].tolist() + [eos], [eos] + p["target"][:n].tolist())
            for p, n in zip(pairs, lengths)]


@torch.no_grad()
def _largest_gap(task, model, hf_model, lm, lengths):
    pad = task.target_dictionary.pad()
    samples = _samples(task, lm, lengths)
    if lm:
        tokens = _pad_right(samples, pad)
        a = model.get_normalized_probs(model(tokens), log_probs=True)
        b = hf_model(input_ids=tokens, attention_mask=tokens.ne(pad).long()).logits.log_softmax(-1)
    else:
        source = _pad_right([s for s, _ in samples], pad)
        prev = _pad_right([t for _, t in samples], pad)
        lengths_ = source.ne(pad).sum(1)
        a = model.get_normalized_probs(model(source, lengths_, prev), log_probs=True)
        b = hf_model(input_ids=source, attention_mask=source.ne(pad).long(),
                     decoder_input_ids=prev, decoder_attention_mask=prev.ne(pad).long(),
                     use_cache=False).logits.log_softmax(-1)
        tokens = prev
    keep = tokens.ne(pad)
    assert keep.sum() > 10
    return (a - b).abs()[keep].max().item()


@pytest.mark.parametrize("name", ["llama", *ROWS])
def test_export_scores_and_decodes_as_fairseq(name, folder, trained):
    path, result, lm = _row(name, folder, trained)
    expected = ROWS[name][3] if name in ROWS else "LlamaForCausalLM"
    assert result.hf_class == expected and result.gap <= TOLERANCE
    task, model = _fairseq(path, lm)
    hf_model = _hf(result, lm)
    assert type(hf_model).__name__ == expected
    assert _largest_gap(task, model, hf_model, lm, [12, 12]) <= TOLERANCE  # unpadded
    assert _largest_gap(task, model, hf_model, lm, [12, 5]) <= TOLERANCE   # right-padded
    # greedy decoding of 10 tokens
    from fairseq.sequence_generator import SequenceGenerator
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_a=0,
                                  max_len_b=30)
    for sample in _samples(task, lm, [6, 9]):
        prompt = torch.tensor([sample if lm else sample[0]])
        net_input = {"src_tokens": prompt, "src_lengths": torch.tensor([prompt.size(1)])}
        if lm:
            hypo = task.inference_step(generator, [model], {"net_input": net_input})[0][0]
            fairseq_new = hypo["tokens"].tolist()[prompt.size(1) - 1:]
        else:
            fairseq_new = generator.generate([model], {"net_input": net_input})[0][0]["tokens"].tolist()
        out = hf_model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=10, num_beams=1, early_stopping=False)[0].tolist()
        hf_new = out[prompt.size(1):] if lm else out[1:]
        assert len(hf_new) == 10 or hf_new[-1] == task.target_dictionary.eos()
        assert hf_new == fairseq_new[:len(hf_new)], (hf_new, fairseq_new)
    fairseq_beam, hf_beam = _beam_search(task, model, hf_model, lm)
    assert len(hf_beam) >= 10 or hf_beam[-1] == task.target_dictionary.eos()
    assert hf_beam[:10] == fairseq_beam[:10], (hf_beam, fairseq_beam)


# beam search compared on its first 10 tokens of at most this many: at its length limit fairseq
# scores the ``</s>`` it forces, transformers does not, so only the ending may differ
BEAM_LENGTH = 30


@torch.no_grad()
def _beam_search(task, model, hf_model, lm):
    """``(fairseq's, transformers')`` beam-5 output: a language model from ``</s>`` alone (fairseq
    forces a prompt on every beam, which then repeat one another:
    https://github.com/facebookresearch/fairseq/issues/712), a translation model of a valid
    sentence."""
    from fairseq.sequence_generator import SequenceGenerator
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=5, max_len_a=0,
                                  max_len_b=BEAM_LENGTH)
    prompt = (torch.tensor([[task.target_dictionary.eos()]]) if lm
              else torch.tensor([_samples(task, lm, [9])[0][0]]))
    net_input = {"src_tokens": prompt, "src_lengths": torch.tensor([prompt.size(1)])}
    if lm:
        fairseq_out = task.inference_step(generator, [model], {"net_input": net_input})[0][0]
    else:
        fairseq_out = generator.generate([model], {"net_input": net_input})[0][0]
    out = hf_model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), num_beams=5,
                            max_new_tokens=BEAM_LENGTH, early_stopping=True, length_penalty=1.0)
    return fairseq_out["tokens"].tolist(), out[0, 1:].tolist()


@pytest.mark.parametrize("name", ["llama", "xglm", "fsmt", "m2m100"])
def test_autotokenizer_gives_fairseq_ids(name, folder, trained):
    from argparse import Namespace

    from fairseq.data import encoders
    from transformers import AutoTokenizer
    path, result, lm = _row(name, folder, trained)
    task, _ = _fairseq(path, lm)
    tokenizer = AutoTokenizer.from_pretrained(result.out_dir, local_files_only=True)
    texts = ["the house of the city is in the north .", "a zzyzxnotaword and the city",
             "The house is small, and the garden isn't."]
    for text in texts:
        if lm:
            words = task.target_dictionary.encode_line(text, add_if_not_exist=False,
                                                       append_eos=False).tolist()
            ids = [task.target_dictionary.eos()] + words
        else:
            moses = encoders.build_tokenizer(Namespace(
                tokenizer="moses", moses_source_lang="en", moses_target_lang="de",
                moses_no_dash_splits=False, moses_no_escape=False))
            bpe = encoders.build_bpe(Namespace(bpe="subword_nmt", bpe_codes=codes(),
                                               bpe_separator="@@"))
            ids = task.source_dictionary.encode_line(bpe.encode(moses.encode(text)),
                                                     add_if_not_exist=False).tolist()
        assert tokenizer(text)["input_ids"] == ids, text
        if lm:  # the words back, as fairseq's dictionary.string gives them (<unk> a word), each
            # with the space before it
            assert tokenizer.decode(ids, skip_special_tokens=True) == \
                " " + task.target_dictionary.string(torch.tensor(ids[1:]))


def test_every_stlm_preset_leaves_with_equal_log_probs(folder):
    """Each preset's tying scheme, LoRA and shared projections, at a tiny width."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from slim_fairseq.export_hf import export
    from slim_fairseq_lab.contract import tiny_overrides
    presets = sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith("stlm_"))
    assert len(presets) >= 11
    for arch in presets:
        overrides = tiny_overrides(arch)
        path = tiny_checkpoint(folder, arch, overrides, True)  # its own layers, ranks, heads
        result = export(path, data_of(True), str(folder / f"{arch}-hf"), sentences=2)
        assert result.hf_class == "LlamaForCausalLM" and result.gap <= TOLERANCE, arch
        assert result.counts["export"] >= result.counts["fairseq"], arch


def test_card_states_the_gap_and_both_parameter_counts(folder, trained):
    path, result = trained
    from fairseq import checkpoint_utils
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": wikitext_data_bin()})
    fairseq_params = sum(p.numel() for p in models[0].parameters())
    hf_params = sum(p.numel() for p in _hf(result, True).parameters())
    # tied feed-forwards and projections are written once per layer
    assert result.counts == {"fairseq": fairseq_params, "dense": None, "export": hf_params,
                             "file": hf_params} and hf_params > fairseq_params
    card = open(os.path.join(result.out_dir, "README.md"), encoding="utf-8").read()
    assert f"{fairseq_params:,}" in card and f"{hf_params:,}" in card
    assert f"{result.gap:.2e} nats" in card and "- updates: 4" in card
    assert card.splitlines()[8] == "# trained-hf"
    config = json.load(open(os.path.join(result.out_dir, "config.json"), encoding="utf-8"))
    assert config["dtype"] == "float32" and config["bos_token_id"] == 2 == config["eos_token_id"]
    assert config["pad_token_id"] == 1 and config["head_dim"] == 16
    assert config["num_key_value_heads"] == 2
    files = set(os.listdir(result.out_dir))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md"} <= files


def test_opt_row_is_fairseqs_post_norm_lm(folder):
    """fairseq 0.12.3's transformer_lm, as its command line builds it, is post-norm."""
    _, result = exported(folder, *ROWS["opt"][:3])
    config = json.load(open(os.path.join(result.out_dir, "config.json"), encoding="utf-8"))
    assert config["do_layer_norm_before"] is False and config["word_embed_proj_dim"] == 16


def test_llama_export_decodes_alike_in_ctranslate2(folder):
    """CTranslate2's converter reads the exported Llama layout (grouped key/value heads; heads of
    width / heads channels: CTranslate2 4.8.5 converts a model of another --head-dim but fails
    to decode it); its greedy decoding (the padding symbol suppressed, as fairseq does) equals
    transformers', which equals fairseq's above."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoTokenizer
    _, result = exported(folder, "stlm_tied", ["--kv-heads", "2"], True)
    converted = TransformersConverter(result.out_dir).convert(str(folder / "stlm-ct2"))
    generator = ctranslate2.Generator(converted, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(result.out_dir, local_files_only=True)
    hf_model = _hf(result, True)
    for text in ["the house of the city", "in the north"]:
        ids = tokenizer(text)["input_ids"]
        expected = hf_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=10)[0].tolist()
        out = generator.generate_batch([tokenizer.convert_ids_to_tokens(ids)], max_length=10,
                                       sampling_topk=1, include_prompt_in_result=False,
                                       suppress_sequences=[["<pad>"]])
        assert out[0].sequences_ids[0] == expected[len(ids):], text


def test_decoding_benchmark_runs_the_three_alike(folder, capsys):
    """scripts/bench_export_decoding.py (timings are for an idle machine; here only that it
    runs and that fairseq, transformers and CTranslate2 give the same tokens)."""
    path, result = exported(folder, "stlm_tied", ["--kv-heads", "2"], True)
    code = load_script("bench_export_decoding").main(
        [path, data_of(True), result.out_dir, "--ct2-dir", str(folder / "bench-ct2"),
         "--tokens", "5", "--repeats", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["same_tokens"] and len(report["outputs"]["ctranslate2"]) == 5


def test_decoding_benchmark_times_a_translation_at_batch_and_beam_sizes(folder, capsys):
    """A translation model's export (custom code) against fairseq's generator at each batch and
    beam size, on the same sentences: the greedy output agrees for every sentence."""
    path, result = exported(folder, "anthe_base", [], False)
    code = load_script("bench_export_decoding").main(
        [path, data_of(False), result.out_dir, "--batch-sizes", "1,3", "--beams", "1,2",
         "--tokens", "4", "--repeats", "1"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [(r["batch"], r["beam"]) for r in rows] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    assert all(r["same_tokens"] == 1 and r["transformers_vs_fairseq"] > 0 for r in rows
               if r["beam"] == 1)


@pytest.mark.parametrize("lm, flags, line", [
    (True, ["--beams", "1,5"], "--beams=1,5: a language model decodes one prompt; allowed: 1"),
    (True, ["--batch-sizes", "0"],
     "--batch-sizes=0: a language model decodes one prompt; allowed: 1"),
    (False, ["--beams", "1,x"],
     "--beams=x: not a whole number >= 1; allowed: whole numbers >= 1, comma-separated (e.g. 1,64)"),
    (False, ["--ct2-dir", "ct2"],
     "--ct2-dir=ct2: a translation model; allowed: --ct2-dir with a language model's export")])
def test_decoding_benchmark_refuses_what_the_model_cannot_take(folder, capsys, lm, flags, line):
    """In one line, before anything loads."""
    _, result = (exported(folder, "stlm_tied", ["--kv-heads", "2"], True) if lm
                 else exported(folder, "anthe_base", [], False))
    with pytest.raises(SystemExit) as stop:
        load_script("bench_export_decoding").main(["none.pt", "none", result.out_dir, *flags])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].split(": error: ")[1] == line


def test_decoding_benchmark_refuses_heads_ctranslate2_cannot_decode(tmp_path, capsys):
    """A --head-dim other than width / heads (stlm_tied's 16 heads of 32 in 528): refused in one
    line before anything loads, not a ValueError of CTranslate2 after the other timings."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 528, "num_attention_heads": 16, "head_dim": 32}))
    with pytest.raises(SystemExit) as stop:
        load_script("bench_export_decoding").main(
            [str(tmp_path / "none.pt"), str(tmp_path), str(tmp_path), "--ct2-dir", "ct2"])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1].split(": error: ")[1] == (
        "--ct2-dir=ct2: CTranslate2 cannot decode 16 heads of 32 "
        "channels in a width of 528 (it converts them, then fails); allowed: no --ct2-dir, or a "
        "model whose --head-dim is 528 / 16")


# --------------------------------------------------------------- GPT-2 BPE and SentencePiece

def _corpus(folder):
    path = folder / "corpus.txt"
    if not path.exists():
        import gzip
        with gzip.open(os.path.join(REPO, "data", "wikitext-2", "wiki.valid.raw.gz"), "rt",
                       encoding="utf-8") as f:
            lines = [line.strip() for line in f if len(line.split()) > 5][:400]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _dictionary(symbols):
    """A fairseq dictionary of ``symbols`` in a shuffled order (as a frequency order would be)."""
    from fairseq.data import Dictionary
    symbols = list(symbols)
    random.Random(0).shuffle(symbols)
    dictionary = Dictionary()
    for symbol in symbols:
        dictionary.add_symbol(symbol)
    dictionary.add_symbol("madeupword0000")
    return dictionary


TEXTS = ["The house is small, and the garden isn't.", "  Two  spaces; unicode: café — 42%",
         "the city of Valkyria Chronicles III"]


def _write_and_load(folder, name, dictionary, options):
    from transformers import AutoTokenizer
    from slim_fairseq.export_hf import tokenizer
    source = argparse.Namespace(lm=True, dictionary=dictionary)
    out = folder / name
    tokenizer.write(str(out), source, options, 128)
    return AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def test_gpt2_bpe_ids_equal_fairseqs(folder):
    from fairseq.data import encoders
    from tokenizers import ByteLevelBPETokenizer
    trainer = ByteLevelBPETokenizer()
    trainer.train([str(_corpus(folder))], vocab_size=400, min_frequency=2, show_progress=False)
    files = trainer.save_model(str(folder), "tiny-gpt2")
    encoder_json, vocab_bpe = sorted(files, key=lambda f: not f.endswith(".json"))
    encoder = json.load(open(encoder_json, encoding="utf-8"))
    dictionary = _dictionary(str(i) for i in encoder.values())
    options = dict(bpe="gpt2", gpt2_encoder_json=encoder_json, gpt2_vocab_bpe=vocab_bpe)
    hf = _write_and_load(folder, "gpt2-tok", dictionary, options)
    fairseq_bpe = encoders.build_bpe(argparse.Namespace(bpe="gpt2", gpt2_encoder_json=encoder_json,
                                                        gpt2_vocab_bpe=vocab_bpe))
    for text in TEXTS:
        ids = dictionary.encode_line(fairseq_bpe.encode(text), add_if_not_exist=False,
                                     append_eos=False).tolist()
        assert 3 not in ids and hf(text)["input_ids"] == [dictionary.eos()] + ids, text
    # a piece the dictionary lacks would be <unk> in fairseq: refused
    from slim_fairseq.export_hf import tokenizer
    from slim_fairseq.option_errors import OptionError
    partial = _dictionary(list(str(i) for i in encoder.values())[:-1])
    with pytest.raises(OptionError, match=r"^--gpt2-encoder-json=.*: 1 of its pieces are not in "
                                          r"the dictionary .*; allowed: the dictionary of every"):
        tokenizer.check(argparse.Namespace(lm=True, dictionary=partial), options)


def test_sentencepiece_ids_equal_fairseqs(folder):
    import sentencepiece
    from fairseq.data import encoders
    prefix = str(folder / "tiny-spm")
    sentencepiece.SentencePieceTrainer.train(input=str(_corpus(folder)), model_prefix=prefix,
                                             vocab_size=300, model_type="unigram",
                                             minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=prefix + ".model")
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    dictionary = _dictionary(pieces)
    options = dict(bpe="sentencepiece", sentencepiece_model=prefix + ".model")
    hf = _write_and_load(folder, "spm-tok", dictionary, options)
    fairseq_bpe = encoders.build_bpe(argparse.Namespace(bpe="sentencepiece",
                                                        sentencepiece_model=prefix + ".model",
                                                        sentencepiece_enable_sampling=False,
                                                        sentencepiece_alpha=None))
    for text in TEXTS:
        ids = dictionary.encode_line(fairseq_bpe.encode(text), add_if_not_exist=False,
                                     append_eos=False).tolist()
        assert hf(text)["input_ids"] == [dictionary.eos()] + ids, text


# ------------------------------------------------------------------------------ OUT_DIR

def test_failed_check_leaves_no_out_dir(folder, monkeypatch):
    from slim_fairseq.export_hf import check, export
    from slim_fairseq.option_errors import OptionError
    path = tiny_checkpoint(folder, *ROWS["xglm"][:3])
    out = folder / "failed-hf"
    monkeypatch.setattr(check, "GAP_LIMIT", -1.0)
    with pytest.raises(OptionError, match=r"^CHECKPOINT=.*: the export's log-probabilities "
                                          r"differ from fairseq's by .* nothing written"):
        export(path, data_of(True), str(out), sentences=2)
    assert not out.exists() and not [n for n in os.listdir(folder) if "partial" in n]


def test_out_dir_is_kept_unless_forced_and_never_an_input(folder):
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    path, result = exported(folder, *ROWS["xglm"][:3])
    before = sorted(os.listdir(result.out_dir))
    with pytest.raises(OptionError, match=r"^OUT_DIR=.*: exists and is not empty; allowed: a "
                                          r"new or empty directory, or --force"):
        export(path, data_of(True), result.out_dir)
    assert sorted(os.listdir(result.out_dir)) == before
    with pytest.raises(OptionError, match=r"^OUT_DIR=.*: holds or lies inside the input"):
        export(path, data_of(True), os.path.join(data_of(True), "hf"), force=True)
    os.chmod(result.out_dir, 0o751)  # replaced with --force: its mode kept
    again = export(path, data_of(True), result.out_dir, force=True, sentences=2)
    assert sorted(os.listdir(again.out_dir)) == before
    assert os.stat(again.out_dir).st_mode & 0o7777 == 0o751


def test_console_script_refuses_in_one_line(folder, capsys):
    from importlib.metadata import entry_points
    from slim_fairseq.export_hf import cli
    script = [e for e in entry_points(group="console_scripts") if e.name == "slim-fairseq-export-hf"]
    assert script and script[0].value == "slim_fairseq.export_hf.cli:main"
    assert load_script("export_hf").main is cli.main
    assert os.path.exists(os.path.join(BIN, "slim-fairseq-export-hf"))
    path = tiny_checkpoint(folder, "slim_lm", ["--scale-attn"], True)
    out = folder / "refused-hf"
    assert cli.main([path, data_of(True), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("slim-fairseq-export-hf: error: --scale-attn: ")
    assert "Traceback" not in "\n".join(err) and not out.exists()
    path = tiny_checkpoint(folder, "slim_lm", [], True)
    assert cli.main([path, data_of(True), str(out), "--check-sentences", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(os.listdir(out))


def test_only_the_export_imports_transformers():
    import ast
    found = []
    for root, _, files in os.walk(os.path.join(REPO, "slim_fairseq")):
        if os.path.join("slim_fairseq", "export_hf") in root:
            continue
        for name in files:
            if name.endswith(".py"):
                tree = ast.parse(open(os.path.join(root, name), encoding="utf-8").read())
                for node in ast.walk(tree):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    found += [f"{name}: {n}" for n in names if n.split(".")[0] == "transformers"]
    assert not found, found
