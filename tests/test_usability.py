"""The paths users take: the option table of docs/DESIGN.md, one meaning per option, one-line
option errors, the Python hub route per family, TensorBoard logging, the bundled-data commands
of docs/GUIDE.md."""
import argparse
import glob
import os
import re
import subprocess

import pytest
import torch

import doc_commands
from helpers import BIN, REPO, USER_DIR, build, ende_data_bin, plugin_archs, run_cli, task_args
from slim_fairseq_lab.contract import tiny_overrides

# ---------------------------------------------------------------------------- option table


def _flags(model_cls):
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    return {opt for action in parser._actions for opt in action.option_strings}


def _registered_plugin_options():
    """{flag: {model name}} for every flag a plugin model adds beyond fairseq's transformers."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    stock = _flags(MODEL_REGISTRY["transformer"]) | _flags(MODEL_REGISTRY["transformer_lm"])
    out = {}
    for arch, cls in plugin_archs().items():
        for flag in _flags(cls) - stock:
            out.setdefault(flag, set()).add(ARCH_MODEL_NAME_REGISTRY[arch])
    return out


def test_design_table_is_the_option_vocabulary():
    """docs/DESIGN.md holds the option table of slim_options.OPTIONS word for word, and that
    table lists every flag the plugin's models add to fairseq's, each in every model's parser."""
    from slim_fairseq.arch_help import options_table
    from slim_fairseq.models.slim_options import FAIRSEQ_READINGS, OPTIONS

    with open(os.path.join(REPO, "docs", "DESIGN.md"), encoding="utf-8") as f:
        design = f.read()
    assert options_table() in design, "docs/DESIGN.md: paste `slim-fairseq-help --options` in"
    registered = _registered_plugin_options()
    listed = {flag for option in OPTIONS for flag in option.flags()}
    listed |= {flag for flag, _, _ in FAIRSEQ_READINGS if flag.startswith("--no-")}
    assert set(registered) == listed
    assert all(models == {"slim_transformer", "slim_lm"} for models in registered.values())
    assert {"--kv-heads", "--tie-ffn", "--ffn-lora-rank", "--tie-attn-proj", "--removed-weights",
            "--skipless-layout", "--self-attn-gate", "--norm", "--rope-theta"} <= listed


def test_every_flag_has_one_default_in_every_model():
    """A model built without any option has every option at the table's default."""
    from slim_fairseq.models.slim_options import OPTIONS

    for arch, lm in (("slim_transformer", False), ("slim_lm", True)):
        args, _, _ = build(arch, ["--encoder-layers", "1", "--decoder-layers", "1"] if not lm
                           else ["--decoder-layers", "1"], lm)
        for option in OPTIONS:
            value = getattr(args, option.dest)
            if option.dest == "norm":
                assert value == "layernorm"
            else:
                assert value == option.default, (arch, option.flag, value)


# ---------------------------------------------------------------------------- --kv-heads


STLM_TINY = ["--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "48",
             "--decoder-attention-heads", "4", "--decoder-layers", "2"]


@pytest.mark.parametrize("arch", ["stlm_tied", "skipless_lm"])
@pytest.mark.parametrize("kv, expected", [("0", 4), ("4", 4), ("2", 2), ("1", 1)])
def test_kv_heads_means_the_same_in_both_models(arch, kv, expected):
    """0 = MHA (one kv head per query head), 1 = MQA, a divisor = GQA, in the STLM and skipless presets."""
    _, _, model = build(arch, STLM_TINY + ["--kv-heads", kv], lm=True)
    attn = model.decoder.layers[0].self_attn
    assert attn.q_proj.weight.shape[0] == 4 * 8  # 4 query heads of width 8
    assert attn.k_proj.weight.shape[0] == attn.v_proj.weight.shape[0] == expected * 8


@pytest.mark.parametrize("arch", ["stlm_tied", "skipless_lm"])
@pytest.mark.parametrize("kv", ["-1", "3"])
def test_kv_heads_errors_read_the_same(arch, kv):
    with pytest.raises(ValueError, match=rf"^--kv-heads={kv}: (negative|does not divide the 4 "
                                         r"query heads); allowed: .*0"):
        build(arch, STLM_TINY + ["--kv-heads", kv], lm=True)


# ---------------------------------------------------------------------------- silent no-ops


TRANSLATION_TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                    "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
                    "--encoder-layers", "1", "--decoder-layers", "1",
                    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]


@pytest.mark.parametrize("arch, lm, options, pattern", [
    ("subformer_base", False, ["--safe-embed-dim", "32"],
     r"^--safe-embed-dim=32: .*; allowed: 0 \(off\) or an integer below the model width 32$"),
    ("slim_transformer", False, ["--safe-embed-dim", "64"], r"^--safe-embed-dim=64: .* width 32"),
    ("slim_lm", True, ["--safe-embed-dim", "40"], r"^--safe-embed-dim=40: .* width 32"),
    ("slim_transformer", False, ["--no-patt", "--tc-patt", "0.1"],
     r"^--tc-patt=0.1: cannot be combined with --no-patt"),
    ("skipless_lm_parallel_noqp", True, ["--no-decoder-normalize-before"],
     r"^--no-decoder-normalize-before: places a norm after each block, and --norm none"),
    ("anthe_base_nopatt", False, ["--tc-layer", "0.2"],
     r"^--tc-layer=0.2: covers the feed-forward and W_Q, W_K, W_V, which --tc-ff and --no-patt"),
    ("slim_transformer", False, ["--tc-ff", "0.3", "--tc-patt", "0.3", "--tc-layer", "0.2"],
     r"^--tc-layer=0.2: .* which --tc-ff and --tc-patt already decide; allowed: 0, or drop"),
    ("skipless_lm_parallel_noqp", True, ["--decoder-layers", "3", "--tie-attn-proj", "0"],
     r"^--tie-attn-proj=0: shares the attention output projection P, which --removed-weights q "
     r"removes; allowed: none, or --keep-attn-out-proj$"),
    ("anthe_base_nopatt", False, ["--self-attn-gate", "kgv"],
     r"^--self-attn-gate=kgv: with --no-patt q, k and v are all the input, so kgv is qgv; "
     r"allowed: none\|qgv\|vgq\|vgk with --no-patt"),
    ("slim_lm", True, ["--no-patt", "--self-attn-gate", "qgk"], r"^--self-attn-gate=qgk: .* so qgk is vgk"),
    ("slim_lm", True, ["--norm", "none", "--no-decoder-normalize-before"],
     r"^--no-decoder-normalize-before: .*; allowed: --norm layernorm\|rmsnorm"),
    ("anthe_base", False, ["--no-patt"], r"^--tc-patt=0.07: cannot be combined with --no-patt"),
])
def test_options_that_would_do_nothing_are_errors(arch, lm, options, pattern):
    tiny = TRANSLATION_TINY if not lm else ["--decoder-embed-dim", "32", "--decoder-layers", "1",
                                            "--decoder-attention-heads", "4"]
    with pytest.raises(ValueError, match=pattern):
        build(arch, tiny + options, lm=lm)


@pytest.mark.parametrize("arch, lm, options, pattern", [
    # options that were accepted and then did nothing
    ("anthe_base", False, ["--quant-noise-pq", "0.1"],
     r"^--quant-noise-pq=0.1: acts on fairseq's dense linears, which --ffn-glu replaces"),
    ("slim_transformer", False, ["--tc-ff", "0.1", "--quant-noise-pq", "0.1"],
     r"^--quant-noise-pq=0.1: .* which --tc-ff/--tc-patt/--tc-layer replaces"),
    ("stlm_tied", True, ["--tie-ffn", "-1"], r"^--tie-ffn=-1: not a layer offset; allowed: none"),
    ("stlm_tied", True, ["--rope-theta", "-5"], r"^--rope-theta=-5.0: negative; allowed: a number >= 0"),
    ("stlm_tied", True, ["--ffn-lora-alpha", "8"],
     r"^--ffn-lora-alpha=8.0: scales a LoRA adapter, and --ffn-lora-rank is 0"),
    ("slim_lm", True, ["--ffn-lora-alpha", "8", "--tie-ffn", "0"],
     r"^--ffn-lora-alpha=8.0: scales a LoRA adapter, and --ffn-lora-rank is 0"),
    # tracebacks before
    ("anthe_base", False, ["--encoder-attention-heads", "5"],
     r"^--encoder-attention-heads=5: does not divide --encoder-embed-dim=32"),
    ("slim_transformer", False, ["--decoder-attention-heads", "3"],
     r"^--decoder-attention-heads=3: does not divide --decoder-embed-dim=32"),
    ("slim_lm", True, ["--decoder-attention-heads", "5"],
     r"^--decoder-attention-heads=5: does not divide --decoder-embed-dim=32"),
])
def test_silent_options_and_tracebacks_are_one_line_errors(arch, lm, options, pattern):
    tiny = TRANSLATION_TINY if not lm else ["--decoder-embed-dim", "32", "--decoder-layers", "3",
                                            "--decoder-attention-heads", "4"]
    with pytest.raises(ValueError, match=pattern) as error:
        build(arch, tiny + options, lm=lm)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("ffn_glu", [False, True])
def test_activation_fn_is_the_feed_forwards_activation_with_and_without_glu(ffn_glu):
    """--activation-fn means the feed-forward's activation in every model: under --ffn-glu the
    gate's (it used to be ignored there), silu by default."""
    glu = ["--ffn-glu"] if ffn_glu else []
    for activation, expected in (("gelu", "gelu"), ("silu", "silu"), (None, "silu" if ffn_glu else "relu")):
        given = ["--activation-fn", activation] if activation else []
        for arch, lm, sides in (("slim_transformer", False, ("encoder", "decoder")),
                                ("slim_lm", True, ("decoder",))):
            tiny = TRANSLATION_TINY if not lm else ["--decoder-embed-dim", "32", "--decoder-layers", "1",
                                                    "--decoder-attention-heads", "4"]
            args, task, model = build(arch, tiny + glu + given, lm=lm)
            assert args.activation_fn == expected
            layer = getattr(model, sides[0]).layers[0] if not lm else model.decoder.layers[0]
            x = torch.linspace(-3, 3, 32).view(1, 1, 32)
            if ffn_glu:
                assert layer.fc1.activation == expected
            else:
                reference = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
                             "relu": torch.relu}[expected]
                assert torch.allclose(layer.activation_fn(x), reference(x), atol=1e-6)


def test_hub_load_with_a_wrong_data_path_is_one_line():
    """A language model loaded through the hub from a folder without its dictionary."""
    from fairseq.models.transformer_lm import TransformerLanguageModel

    folder = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_1_0", "stlm_tied")
    with pytest.raises(ValueError) as error:
        TransformerLanguageModel.from_pretrained(folder, "checkpoint.pt",
                                                 data_name_or_path="/nonexistent/data-bin")
    message = str(error.value)
    assert message.startswith("--task=language_modeling: found no dictionary") and "\n" not in message
    assert "data_name_or_path=DATA" in message


def test_no_patt_preset_does_not_set_tc_patt():
    _, _, model = build("anthe_base_nopatt", TRANSLATION_TINY, lm=False)
    assert model.encoder.layers[0].self_attn.no_patt


@pytest.mark.parametrize("arch, lm", [("anthe_base", False), ("subformer_base", False),
                                      ("stlm_tied", True), ("skipless_lm", True),
                                      ("anthe_lm_gpt2_small", True)])
def test_architecture_on_the_wrong_task_is_refused(arch, lm):
    """An encoder-decoder arch on language_modeling, an LM on translation: one clear line
    (fairseq said "no attribute supported_targets", or built an LM of the source side)."""
    wrong = task_args(not lm)
    from helpers import parse_train_args
    with pytest.raises(ValueError) as error:
        parse_train_args(wrong + ["--arch", arch, "--user-dir", USER_DIR, "--cpu"])
    message = str(error.value)
    assert message.startswith(f"--arch={arch}: ") and "\n" not in message
    assert ("cannot be used with --task language_modeling" in message) != lm
    assert ("cannot be used with --task translation" in message) == lm


# ---------------------------------------------------------------------------- one-line errors


def _fail_cli(tool, argv, cwd=None):
    proc = subprocess.run([os.path.join(BIN, tool), *argv], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=cwd)
    assert proc.returncode != 0
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("options, flag", [
    (["--arch", "anthe_base", "--tc-ff", "2"], "--tc-ff=2.0"),
    (["--arch", "anthe_base", "--self-attn-gate", "xyz"],
     "--self-attn-gate=xyz: not one of the choices; allowed: none|qgv|kgv|vgq|vgk|qgk|kgq"),
    (["--arch", "skipless_lm", "--skipless-layout", "diagonal"],
     "--skipless-layout=diagonal: not one of the choices; allowed: none|serial|parallel"),
    (["--arch", "subformer_base", "--safe-embed-dim", "512"], "--safe-embed-dim=512"),
    (["--arch", "stlm_tied", "--task", "translation", "--kv-heads", "3"], "--kv-heads=3"),
    (["--arch", "stlm_tied", "--tie-ffn", "9", "--task", "translation"], "--tie-ffn=9"),
    (["--arch", "anthe_lm_gpt2_small", "--task", "language_modeling", "--cross-attn-gate", "kgv"],
     "--cross-attn-gate=kgv: not available in slim_lm"),
])
def test_option_errors_are_one_line_before_anything_is_loaded(options, flag, tmp_path):
    """The preset check runs when fairseq parses the command line: no traceback, no data or
    model loaded, the last line is ``fairseq-train: error: <flag> ...``."""
    proc = _fail_cli("fairseq-train", [ende_data_bin(), "--user-dir", USER_DIR, "--cpu",
                                       "--save-dir", str(tmp_path), "--max-tokens", "500",
                                       *options])
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fairseq-train: error: {flag}"), proc.stderr[-2000:]
    assert "dictionary:" not in proc.stderr and "| INFO | fairseq_cli.train" not in proc.stderr
    assert not os.listdir(tmp_path)


# ---------------------------------------------------------------------------- trained checkpoints


FAMILIES = {  # name: (arch, is LM)
    "anthe": ("anthe_base", False),
    "subformer": ("subformer_base", False),
    "slim_lm": ("anthe_lm_gpt2_small", True),
    "stlm": ("stlm_tied", True),
    "skipless": ("skipless_lm", True),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny trained checkpoint per family (2 updates, through fairseq-train); the anthe run
    also logs to TensorBoard."""
    archs = plugin_archs()
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family, (arch, lm) in FAMILIES.items():
        save = root / family
        extra = []
        if family == "anthe":
            extra = ["--tensorboard-logdir", str(root / "tb")]
        log = run_cli("fairseq-train", task_args(lm) + [
            "--arch", arch, "--user-dir", USER_DIR, "--cpu", *tiny_overrides(arch),
            "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", "2",
            "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation",
            "--num-workers", "0", "--seed", "1", *extra])
        out[family] = (str(save), log)
    out["tensorboard"] = str(root / "tb")
    return out


def _scalar_tags(path):
    """Tags of the scalars in a TensorBoard event file (TFRecord framing: u64 length, u32 crc,
    an ``Event`` protobuf, u32 crc)."""
    import struct

    from tensorboardX.proto import event_pb2

    tags = set()
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[pos + 12:pos + 12 + length])
        tags.update(value.tag for value in event.summary.value)
        pos += 12 + length + 4
    return tags


@pytest.mark.slow
def test_tensorboard_logdir_writes_event_files(checkpoints):
    """tensorboardX is a pinned requirement: fairseq logs the training scalars there and no
    longer prints "Please install tensorboardX"."""
    _, log = checkpoints["anthe"]
    assert "Please install tensorboardX" not in log
    events = glob.glob(os.path.join(checkpoints["tensorboard"], "train", "events.out.tfevents.*"))
    assert len(events) == 1
    assert {"loss", "lr", "gnorm"} <= _scalar_tags(events[0])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["anthe", "subformer"])
def test_hub_route_translation(family, checkpoints):
    """docs/GUIDE.md "Bundled data": from_pretrained(..., user_dir=...) with Moses + BPE, then
    translate/sample."""
    from fairseq.models import BaseFairseqModel

    data_bin = ende_data_bin()
    codes = os.path.join(os.path.dirname(data_bin), "bpe", "codes")
    hub = BaseFairseqModel.from_pretrained(
        checkpoints[family][0], checkpoint_file="checkpoint_last.pt", data_name_or_path=data_bin,
        user_dir=USER_DIR, source_lang="en", target_lang="de", tokenizer="moses",
        bpe="subword_nmt", bpe_codes=codes)
    assert type(hub.models[0]).__module__.startswith("slim_fairseq")
    assert hub.cfg.model.arch == FAMILIES[family][0]
    hub.eval()
    out = hub.translate("The house is small.", beam=2, max_len_a=0, max_len_b=6)
    assert isinstance(out, str) and "@@" not in out
    assert hub.sample(["The house is small.", "Good morning!"], beam=2, max_len_a=0,
                      max_len_b=6)[0] == out
    # the same as generating from the binarized tokens
    tokens = hub.encode("The house is small.")
    assert tokens[-1].item() == hub.task.source_dictionary.eos()
    assert hub.decode(hub.generate(tokens, beam=2, max_len_a=0, max_len_b=6)[0]["tokens"]) == out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["slim_lm", "stlm", "skipless"])
def test_hub_route_language_model(family, checkpoints):
    """README.md "Python": from_pretrained(..., user_dir=...) on an LM, then sample/score."""
    from fairseq.models import BaseFairseqModel

    from helpers import wikitext_data_bin
    hub = BaseFairseqModel.from_pretrained(
        checkpoints[family][0], checkpoint_file="checkpoint_last.pt",
        data_name_or_path=wikitext_data_bin(), user_dir=USER_DIR)
    assert hub.cfg.model.arch == FAMILIES[family][0]
    hub.eval()
    torch.manual_seed(0)
    text = hub.sample("the game is", beam=1, sampling=True, sampling_topk=5, max_len_b=4)
    assert text.startswith("the game is") and len(text.split()) > 3
    scored = hub.score("the game is over")
    scores = scored["positional_scores"]
    assert scores.shape == scored["tokens"].shape == (4,)  # one score per word
    assert torch.isfinite(scores).all() and (scores < 0).all()
    # the hub's score is the model's own log-probability of each next word
    tokens = scored["tokens"]
    prev = torch.cat([tokens.new_tensor([hub.task.source_dictionary.eos()]), tokens[:-1]])
    with torch.no_grad():
        lprobs = hub.models[0].get_normalized_probs(hub.models[0](prev[None]), log_probs=True)[0]
    expected = lprobs.gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(scores, expected, atol=1e-4)


@pytest.mark.slow
def test_eval_lm_on_translation_and_generate_on_lm_are_one_line_errors(checkpoints):
    from helpers import wikitext_data_bin
    ckpt = os.path.join(checkpoints["anthe"][0], "checkpoint_last.pt")
    proc = _fail_cli("fairseq-eval-lm", [wikitext_data_bin(), "--path", ckpt, "--user-dir",
                                         USER_DIR, "--cpu", "--tokens-per-sample", "64",
                                         "--batch-size", "8", "--gen-subset", "valid"])
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-eval-lm: error: --arch=anthe_base: an encoder-decoder (translation) model "
        "cannot be used with --task language_modeling")
    ckpt = os.path.join(checkpoints["stlm"][0], "checkpoint_last.pt")
    proc = _fail_cli("fairseq-generate", [ende_data_bin(), "--path", ckpt, "--user-dir", USER_DIR,
                                          "--cpu", "--source-lang", "en", "--target-lang", "de",
                                          "--batch-size", "8", "--gen-subset", "valid"])
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-generate: error: --arch=stlm_tied: a language model cannot be used with "
        "--task translation")


# ---------------------------------------------------------------------------- bundled data


def _guide_commands():
    """The commands of the ``bash`` blocks of docs/GUIDE.md's "Bundled data" section."""
    return doc_commands.commands(os.path.join("docs", "GUIDE.md"), "## Bundled data")


def test_guide_binarize_defaults_are_the_paths_the_guide_names(monkeypatch):
    """``binarize_bundled.py build/data`` with no other option builds the directories the
    README's later commands use: 8000 BPE merges, a 5000-word WikiText-2 vocabulary."""
    from helpers import load_script
    binarize_bundled = load_script("binarize_bundled")

    calls = []
    monkeypatch.setattr(binarize_bundled, "binarize_ende", lambda *a: calls.append(("ende", a)) or "x")
    monkeypatch.setattr(binarize_bundled, "binarize_wikitext", lambda *a: calls.append(("wiki", a)) or "x")
    binarize_bundled.main(["build/data"])
    (_, ende), (_, wiki) = calls
    assert binarize_bundled.ende_paths(*ende[:4])["data_bin"].endswith("build/data/ende_bpe8000/data-bin")
    assert binarize_bundled.ende_paths(*ende[:4])["codes"].endswith("build/data/ende_bpe8000/bpe/codes")
    assert binarize_bundled.wikitext_paths(*wiki[:3])["data_bin"].endswith(
        "build/data/wikitext2_vocab5000/data-bin")
    for command in _guide_commands():
        for path in re.findall(r"build/data/\S+", command):
            assert path.split("/")[2] in ("ende_bpe8000", "wikitext2_vocab5000"), command


@pytest.mark.slow
def test_guide_bundled_data_commands_run(tmp_path):
    """Runs the "Bundled data" commands of docs/GUIDE.md in order, as written, on the test
    subsets (binarize options appended, paths replaced) with a tiny model and 2 updates."""
    ende_root = os.path.dirname(ende_data_bin())
    from helpers import TEST_DATA, wikitext_data_bin
    wiki_root = os.path.dirname(wikitext_data_bin())
    guide = _guide_commands()
    assert [doc_commands.tool(c) for c in guide] == [
        "scripts/binarize_bundled.py", "scripts/binarize_bundled.py", "fairseq-train",
        "fairseq-generate", "fairseq-interactive", "examples/translation/evaluate.sh", "fairseq-train",
        "fairseq-eval-lm"]
    lm_tiny = "--decoder-embed-dim 32 --decoder-ffn-embed-dim 48 --decoder-layers 2 --kv-heads 2"
    extra = {
        "scripts/binarize_bundled.py": "",
        "fairseq-train": "--cpu --max-update 2 --num-workers 0",
        "fairseq-generate": "--cpu --max-len-a 0 --max-len-b 5",
        "fairseq-interactive": "--cpu --max-len-a 0 --max-len-b 5",
        "fairseq-eval-lm": "--cpu",
        "examples/translation/evaluate.sh": "--max-len-a 0 --max-len-b 5",
    }
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PATH=BIN + os.pathsep + os.environ["PATH"])
    for command in guide:
        program = doc_commands.tool(command)
        more = extra[program]
        if program == "scripts/binarize_bundled.py":
            more = ("--subset 1500 --eval-subset 100 --bpe-merges 1000" if "ende" in command
                    else "--subset 1500 --nwords 2000")
        elif program == "fairseq-train":
            more += " " + (lm_tiny if "language_modeling" in command
                           else " ".join(TRANSLATION_TINY))
        run = (command.replace("build/data/ende_bpe8000", ende_root)
               .replace("build/data/wikitext2_vocab5000", wiki_root)
               .replace("build/data", TEST_DATA)
               .replace("checkpoints/", str(tmp_path / "checkpoints") + "/")) + " " + more
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", run], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{run}\n{out[-3000:]}"
        if program == "scripts/binarize_bundled.py":
            assert proc.stdout.split()[-1] in (ende_data_bin(), wikitext_data_bin())
        if program == "fairseq-generate":
            assert "BLEU" in out and re.search(r"^D-\d+\t", proc.stdout, re.M)
            assert "@@" not in "".join(re.findall(r"^D-.*$", proc.stdout, re.M))
        if program == "fairseq-interactive":
            assert re.search(r"^D-0\t", proc.stdout, re.M)
        if program == "fairseq-eval-lm":
            assert "Perplexity" in out
        if program == "examples/translation/evaluate.sh":
            # the bundled data-bin carries what evaluate.sh needs (recipe.info, test.raw.de)
            assert re.search(r"sacreBLEU \(detokenized\): BLEU\|nrefs:1\|.*= \d+\.\d+", out), out[-3000:]
            assert re.search(r"perplexity \(fairseq.*\): valid \d+\.\d+, test \d+\.\d+", out)
            with open(tmp_path / "checkpoints" / "anthe" / "eval" / "checkpoint_best" / "test.lenpen1.0.detok",
                      encoding="utf-8") as f:
                assert len(f.read().splitlines()) == 100
