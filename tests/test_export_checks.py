"""The export's checks and refusals through the command a user runs
(``slim-fairseq-export-hf``, ``scripts/bench_export_decoding.py``): the tokenizer checked against
the data-bin, a BPE dictionary without ``--bpe`` and a codes file that is not one refused, a
truncated checkpoint, another data-bin, an interrupt, OUT_DIR's mode; and a check of the checks:
the self-check and the tokenizer check run on exports corrupted on purpose must refuse each."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from helpers import BIN, REPO, sigint_at_default, wikitext_data_bin
from hf_export_fixtures import data_of, exported, tiny_checkpoint

os.environ["HF_HUB_OFFLINE"] = "1"
PROG = "slim-fairseq-export-hf"
# a language model with a learned position table (OPTForCausalLM)
OPT = ("transformer_lm", ["--decoder-learned-pos", "--decoder-input-dim", "16",
                          "--decoder-output-dim", "16"], True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_checks")


@pytest.fixture(scope="module")
def lm_checkpoint(folder):
    return tiny_checkpoint(folder, "slim_lm", [], True)


@pytest.fixture(scope="module")
def mt_checkpoint(folder):
    return tiny_checkpoint(folder, "transformer", [], False)


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")


def _export(argv, umask=None):
    """``(exit code, stderr lines)`` of ``slim-fairseq-export-hf ARGV``."""
    proc = subprocess.run([os.path.join(BIN, PROG), *map(str, argv)], capture_output=True,
                          text=True, timeout=600, env=_env(),
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    return proc.returncode, proc.stderr.strip().splitlines()


def _refused(argv, line, out):
    code, err = _export(argv)
    assert code != 0 and err[-1] == f"{PROG}: error: {line}", err[-5:]
    assert "Traceback" not in "\n".join(err)
    assert not os.path.exists(out) and not _partial(os.path.dirname(str(out)))


def _partial(parent):
    return [n for n in os.listdir(parent) if ".partial-" in n or ".replaced-" in n]


# ------------------------------------------------------------------------ tokenizer refusals

def test_bpe_dictionary_without_bpe_is_refused(folder, mt_checkpoint):
    from fairseq.data import Dictionary
    pieces = [s for s in Dictionary.load(os.path.join(data_of(False), "dict.de.txt")).symbols
              if s.endswith("@@")]
    out = folder / "no-bpe-hf"
    _refused([mt_checkpoint, data_of(False), out],
             f"--bpe=none: the dictionary holds BPE pieces ({len(pieces)} entries ending in @@, "
             f"e.g. {pieces[0]!r}): split into whitespace words, a word the BPE splits becomes "
             "<unk>; allowed: --tokenizer moses --bpe subword_nmt --bpe-codes CODES (the codes "
             "the data was encoded with)",
             out)


def test_codes_file_that_is_a_dictionary_is_refused(folder, mt_checkpoint):
    dictionary = os.path.join(data_of(False), "dict.en.txt")
    out = folder / "dict-codes-hf"
    _refused([mt_checkpoint, data_of(False), out, "--tokenizer", "moses", "--bpe", "subword_nmt",
              "--bpe-codes", dictionary],
             f"--bpe-codes={dictionary}: not subword-nmt's codes (lines of a piece and a count, "
             "as a dictionary has); allowed: the codes file of subword-nmt learn-bpe the data "
             "was encoded with", out)


def test_text_that_gives_other_ids_is_refused(folder, lm_checkpoint):
    """The valid split's text with its second line's first word replaced: the tokenizer check
    names the line and the token."""
    from fairseq.data import Dictionary
    lines = open(os.path.join(os.path.dirname(wikitext_data_bin()), "text", "valid.txt"),
                 encoding="utf-8").read().split("\n")[:-1]
    number = next(i for i, line in enumerate(lines, 1) if line.strip())
    words = lines[number - 1].split()
    replacement = "the" if words[0] != "the" else "of"
    lines[number - 1] = " ".join([replacement] + words[1:])
    text = folder / "valid-changed.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dictionary = Dictionary.load(os.path.join(wikitext_data_bin(), "dict.txt"))
    expected = dictionary[dictionary.index(words[0])]
    out = folder / "changed-text-hf"
    _refused([lm_checkpoint, wikitext_data_bin(), out, "--valid-text", text],
             f"--bpe=none: the exported tokenizer does not give the data-bin's ids for line "
             f"{number} of {text} (token 2: {replacement!r} where the data-bin has "
             f"{expected!r}), nothing written; allowed: the tokenizer options the data was "
             "encoded with (--bpe, its files, --tokenizer), and the data-bin the model was "
             "trained on", out)


# ---------------------------------------------------------------------- inputs and options

def test_truncated_checkpoint_is_refused(folder, lm_checkpoint):
    truncated = folder / "truncated.pt"
    truncated.write_bytes(open(lm_checkpoint, "rb").read()[:20000])
    out = folder / "truncated-hf"
    _refused([truncated, wikitext_data_bin(), out],
             f"CHECKPOINT={truncated}: cannot be read: truncated, partly copied or not a "
             "checkpoint; allowed: a complete checkpoint file written by fairseq-train", out)


def test_translation_checkpoint_with_a_language_models_data_is_refused(folder, mt_checkpoint):
    out = folder / "other-data-hf"
    _refused([mt_checkpoint, wikitext_data_bin(), out],
             f"DATA_DIR={wikitext_data_bin()}: has no dict.en.txt, which this translation model "
             "(en-de) needs: not its data-bin; allowed: the data-bin the model was trained on "
             "(dict.en.txt, dict.de.txt)", out)


def test_smaller_dictionary_is_named(folder, lm_checkpoint):
    data = folder / "smaller-data"
    data.mkdir()
    lines = open(os.path.join(wikitext_data_bin(), "dict.txt"), encoding="utf-8").readlines()
    (data / "dict.txt").write_text("".join(lines[:1000]), encoding="utf-8")
    rows = torch.load(lm_checkpoint, weights_only=False)["model"][
        "decoder.embed_tokens.table.weight"].size(0)
    out = folder / "smaller-hf"
    _refused([lm_checkpoint, data, out],
             f"DATA_DIR={data}: its dict.txt gives 1,004 symbols where the checkpoint's decoder "
             f"embedding has {rows:,} rows: not the dictionary the model was trained with; "
             "allowed: the data-bin the model was trained on (the dict.txt it was binarized "
             "with)", out)


def test_check_sentences_zero_is_not_allowed(folder, lm_checkpoint):
    out = folder / "zero-hf"
    _refused([lm_checkpoint, wikitext_data_bin(), out, "--check-sentences", "0"],
             "--check-sentences=0: not allowed (the self-check needs samples to score); "
             "allowed: an integer >= 1", out)


def test_non_empty_out_dir_is_kept_without_force(folder, lm_checkpoint):
    out = folder / "kept-hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    code, err = _export([lm_checkpoint, wikitext_data_bin(), out])
    assert code != 0 and err[-1] == f"{PROG}: error: OUT_DIR={out}: exists and is not empty; " \
        "allowed: a new or empty directory, or --force to replace it"
    assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine\n"


# ------------------------------------------------------------------ OUT_DIR and interrupts

def test_existing_out_dir_keeps_its_mode_and_files_follow_the_umask(folder, lm_checkpoint):
    out = folder / "mode-hf"
    out.mkdir()
    os.chmod(out, 0o751)
    code, err = _export([lm_checkpoint, wikitext_data_bin(), out, "--check-sentences", "2"],
                        umask=0o027)
    assert code == 0, err[-3:]
    assert os.stat(out).st_mode & 0o7777 == 0o751
    modes = {name: os.stat(out / name).st_mode & 0o7777 for name in os.listdir(out)}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes
    assert not _partial(folder)


def test_interrupt_says_one_line_and_leaves_out_dir_as_found(folder, lm_checkpoint):
    out = folder / "interrupted-hf"
    out.mkdir()
    os.chmod(out, 0o751)
    proc = subprocess.Popen([os.path.join(BIN, PROG), lm_checkpoint, wikitext_data_bin(),
                             str(out), "--check-sentences", "2"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=_env(), preexec_fn=sigint_at_default)
    seen = []
    for line in proc.stderr:  # the export under way: its model chosen, nothing kept yet
        seen.append(line)
        if "tokenizer:" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    code = proc.wait(timeout=300)
    err = ("".join(seen) + rest).strip().splitlines()
    assert code == 130 and err[-1] == f"{PROG}: interrupted; {out} left as it was found", err[-5:]
    assert "Traceback" not in "\n".join(err)
    assert os.listdir(out) == [] and os.stat(out).st_mode & 0o7777 == 0o751
    assert not _partial(folder)


def test_interrupt_as_the_work_folder_is_made_leaves_none(folder, lm_checkpoint, monkeypatch):
    """A Ctrl-C that comes the moment the export has made its work folder: the folder is
    removed, not left beside OUT_DIR (the export names it before making it)."""
    from slim_fairseq.export_hf import export
    made, mkdir = [], os.mkdir

    def mkdir_then_interrupt(path, *args, **kwargs):
        mkdir(path, *args, **kwargs)
        if ".partial-" in os.path.basename(path):
            made.append(path)
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", mkdir_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        export(lm_checkpoint, wikitext_data_bin(), str(folder / "held-hf"), sentences=2)
    assert made and not os.path.exists(made[0]) and not _partial(folder)


def test_bench_refuses_tokens_past_the_models_positions(folder):
    from transformers import AutoTokenizer
    path, result = exported(folder, *OPT)
    positions = json.load(open(os.path.join(result.out_dir, "config.json")))[
        "max_position_embeddings"]
    prompt = len(AutoTokenizer.from_pretrained(result.out_dir)("the house")["input_ids"])
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts",
                                                        "bench_export_decoding.py"),
                           path, data_of(True), result.out_dir, "--tokens", str(positions)],
                          capture_output=True, text=True, timeout=300, env=_env())
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and err == [
        f"bench_export_decoding.py: error: --tokens={positions}: with the prompt's {prompt} "
        f"tokens goes past the model's {positions} positions; allowed: 1 to "
        f"{positions - prompt}"], err[-5:]


def test_bench_interrupt_says_one_line(folder):
    """SIGINT once the benchmark is under way (transformers' tokenizer loaded): one line, 130."""
    import time
    path, result = exported(folder, *OPT)
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts",
                                                          "bench_export_decoding.py"),
                             path, data_of(True), result.out_dir, "--tokens", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=sigint_at_default)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        with open(f"/proc/{proc.pid}/maps") as maps:
            if "tokenizers.abi3.so" in maps.read():
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and lines[-1] == \
        "bench_export_decoding.py: interrupted; nothing measured", lines[-5:]
    assert "Traceback" not in err and out == ""


def test_language_model_generates_at_most_its_positions(opt_export):
    """generation_config's max_length: the model's positions, prompt and continuation; the card
    says so."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    src, _, result = opt_export
    positions = json.load(open(os.path.join(result.out_dir, "config.json")))[
        "max_position_embeddings"]
    generation = GenerationConfig.from_pretrained(result.out_dir)
    assert generation.max_length == positions == src.model.decoder.max_positions()
    model = AutoModelForCausalLM.from_pretrained(result.out_dir)
    batch = AutoTokenizer.from_pretrained(result.out_dir)("the house", return_tensors="pt")
    d = src.dictionary
    out = model.generate(**batch, suppress_tokens=[d.pad(), d.eos()])  # never ends early
    assert out.size(1) == positions
    card = open(os.path.join(result.out_dir, "README.md"), encoding="utf-8").read()
    assert f"stops at the model's {positions} positions" in card


# ------------------------------------------------------------------- a check of the checks

@pytest.fixture(scope="module")
def opt_export(folder):
    """``(Source, layout, ExportResult)`` of the learned-positions language model."""
    from slim_fairseq.export_hf import source, support
    path, result = exported(folder, *OPT)
    src = source.load(path, data_of(True))
    return src, support.choose(src), result


def _corrupted(folder, result, name, change):
    """A copy of the export with ``change(weights)`` applied to its model.safetensors."""
    from safetensors.torch import load_file, save_file
    copy = folder / name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(result.out_dir, copy)
    weights = load_file(str(copy / "model.safetensors"))
    change(weights)
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return str(copy)


def _frequent_tokens(src, count=2):
    from slim_fairseq.export_hf import check
    tokens = check.valid_batch(src, 2)[0]["src_tokens"]
    ids = tokens[tokens >= src.dictionary.nspecial]
    return torch.bincount(ids).topk(count).indices.tolist()


def test_exported_files_and_folder_follow_the_umask(opt_export):
    _, _, result = opt_export
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(result.out_dir).st_mode & 0o777 == 0o777 & ~mask
    for name in os.listdir(result.out_dir):
        assert os.stat(os.path.join(result.out_dir, name)).st_mode & 0o777 == 0o666 & ~mask, name


def test_self_check_refuses_each_corrupted_export(folder, opt_export):
    from slim_fairseq.export_hf import check
    from slim_fairseq.option_errors import OptionError
    src, layout, result = opt_export
    assert check.verify(src, layout, result.out_dir, 2).gap <= check.GAP_LIMIT
    first, second = _frequent_tokens(src)

    def one_weight(weights):
        name = next(k for k in weights if k.endswith("layers.1.fc2.weight"))
        weights[name][0, 0] += 0.05

    def positions_shifted(weights):
        name = next(k for k in weights if k.endswith("embed_positions.weight"))
        weights[name] = weights[name].roll(1, dims=0).contiguous()

    def tokens_swapped(weights):
        name = next(k for k in weights if k.endswith("embed_tokens.weight"))
        weights[name][[first, second]] = weights[name][[second, first]].clone()

    for change in (one_weight, positions_shifted, tokens_swapped):
        corrupted = _corrupted(folder, result, f"corrupt-{change.__name__}", change)
        with pytest.raises(OptionError, match=r"^CHECKPOINT=.*: the export's log-probabilities "
                                              r"differ from fairseq's by .* nothing written"):
            check.verify(src, layout, corrupted, 2)


def test_tokenizer_check_refuses_each_corrupted_tokenizer(folder, opt_export):
    from slim_fairseq.export_hf import tokenizer_check
    from slim_fairseq.option_errors import OptionError
    src, _, result = opt_export
    data = data_of(True)
    sides = tokenizer_check.text_sides(src, data, "words")
    assert tokenizer_check.run(src, data, result.out_dir, "words", sides).compared == \
        tokenizer_check.LINES
    first, second = (src.dictionary[i] for i in _frequent_tokens(src))

    def mapping_swapped(spec):
        vocab = spec["model"]["vocab"]
        vocab[first], vocab[second] = vocab[second], vocab[first]

    def word_dropped(spec):
        del spec["model"]["vocab"][first]

    def start_shifted(spec):  # the leading </s> of a language model's ids dropped
        spec["post_processor"]["single"] = spec["post_processor"]["single"][1:]

    for change in (mapping_swapped, word_dropped, start_shifted):
        copy = folder / f"tok-{change.__name__}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(result.out_dir, copy)
        spec = json.load(open(copy / "tokenizer.json", encoding="utf-8"))
        change(spec)
        json.dump(spec, open(copy / "tokenizer.json", "w", encoding="utf-8"))
        with pytest.raises(OptionError, match=r"^--bpe=none: the exported tokenizer does not "
                                              r"give the data-bin's ids for line \d+ of "):
            tokenizer_check.run(src, data, str(copy), "words", sides)
    # a text that is not the split's (a line missing) is refused before any comparison
    text = folder / "short-valid.txt"
    text.write_text("\n".join(open(sides[0].path, encoding="utf-8").read().split("\n")[1:]))
    with pytest.raises(OptionError, match=r"^--valid-text=.*short-valid.txt: has \d+ lines "
                                          r"where the data-bin's valid split has \d+ samples"):
        tokenizer_check.run(src, data, result.out_dir, "words",
                            tokenizer_check.text_sides(src, data, "words", str(text)))


def test_translation_tokenizer_check_compares_both_sides(folder):
    """FSMT's tokenizer on the recipe's raw text: both sides compared, the lines its punctuation
    normalisation changes counted and stated in the card."""
    _, result = exported(folder, "transformer", [], False)
    words = result.tokenizer_check
    assert [os.path.basename(p) for p in words.files] == ["valid.raw.en", "valid.raw.de"]
    assert words.compared + words.skipped == 2 * words.lines == 200  # 100 lines a side
    assert words.compared > words.skipped
    card = open(os.path.join(result.out_dir, "README.md"), encoding="utf-8").read()
    assert f"on {words.compared:,} lines" in card and f"{words.skipped:,} lines were not" in card


# ------------------------------------------------------------------ decoding as fairseq does

def test_translation_decodes_with_fairseq_generates_beam_and_length_limit(folder):
    """generation_config: fairseq-generate's beam 5, finished when 5 hypotheses end, and its
    length limit (--max-len-b 200 tokens, then </s>): a tiny model that never ends gives as
    many tokens in transformers as in fairseq."""
    import transformers
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator
    path, result = exported(folder, "transformer", [], False)
    config = json.load(open(os.path.join(result.out_dir, "generation_config.json")))
    assert config["num_beams"] == 5 and config["early_stopping"] is True
    assert config["length_penalty"] == 1.0 and config["max_length"] == 202
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data_of(False)})
    model = models[0].float().eval()
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(result.out_dir).eval()
    task.load_dataset("valid")
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=5, max_len_a=0,
                                  max_len_b=200)
    lengths = []
    for index in range(3):
        source = task.dataset("valid")[index]["source"][None]
        with torch.no_grad():
            fairseq_out = generator.generate([model], {"net_input": {
                "src_tokens": source, "src_lengths": torch.tensor([source.size(1)])}})[0][0]
            hf_out = hf_model.generate(input_ids=source, attention_mask=torch.ones_like(source))
        assert hf_out[0, 0] == 2 and hf_out.size(1) - 1 == len(fairseq_out["tokens"]), index
        lengths.append(len(fairseq_out["tokens"]))
    assert 201 in lengths, lengths  # one never ends: 200 tokens, then </s>, in both


def test_word_level_tokenizer_decodes_as_text(folder, opt_export):
    """The pipeline's continuation joins its prompt with a space; <unk> is a word of the text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    _, _, result = opt_export
    tokenizer = AutoTokenizer.from_pretrained(result.out_dir)
    model = AutoModelForCausalLM.from_pretrained(result.out_dir)
    text = pipeline("text-generation", model=model, tokenizer=tokenizer)(
        "the house", max_new_tokens=3, do_sample=False)[0]["generated_text"]
    assert text.startswith("the house ") and len(text.split()) == 5, text
    ids = tokenizer("the zzyzxnotaword house")["input_ids"]
    assert ids[2] == 3 and tokenizer.decode(ids, skip_special_tokens=True) == \
        " the <unk> house"


def test_valid_text_names_both_sides_of_a_translation(folder):
    """--valid-text FILE.SRC: FILE.TGT beside it is the target side; a missing file is refused."""
    from slim_fairseq.export_hf import source, tokenizer_check
    from slim_fairseq.option_errors import OptionError
    path, _ = exported(folder, "transformer", [], False)
    src = source.load(path, data_of(False))
    for lang in ("en", "de"):
        shutil.copy(os.path.join(data_of(False), f"valid.raw.{lang}"), folder / f"given.{lang}")
    sides = tokenizer_check.text_sides(src, data_of(False), "moses+subword_nmt",
                                       str(folder / "given.en"))
    assert [(s.path, s.lang, s.side) for s in sides] == [
        (str(folder / "given.en"), "en", "source"), (str(folder / "given.de"), "de", "target")]
    missing = str(folder / "none.en")
    with pytest.raises(OptionError) as caught:
        tokenizer_check.text_sides(src, data_of(False), "moses+subword_nmt", missing)
    assert str(caught.value) == f"--valid-text={missing}: does not exist; allowed: the raw " \
        "text of the valid split, one sample a line"
