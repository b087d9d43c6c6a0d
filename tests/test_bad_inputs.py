"""Mistakes a user makes, each with the one line it must end in (exit status non-zero, no
traceback, no usage): fairseq's command line with the plugin loaded, and the recipes'. A refusal
that proposes changes of the command line is tried with each: every one must be accepted.

Grow the tables: a new mistake found is a new row. Mistakes that only fairseq itself sees
(a --user-dir that does not exist, a misspelt --arch given to fairseq-train, fairseq-generate
on language-model data without --task) are answered in docs/INSTALL.md#troubleshooting,
which tests/test_docs.py keeps.
"""
import os
import re
import subprocess

import pytest

from helpers import BIN, REPO, ende_data_bin, parse_train_args, task_args, wikitext_data_bin

EXAMPLES = os.path.join(REPO, "examples")

# (command line after the data and task flags, language model?, the line, exactly); every
# refusal proposes changes of the command line (OptionError.alternatives), and the test tries each
CLI = [
    (["--arch", "stlm_tied", "--encoder-embed-dim", "128", "--decoder-embed-dim", "128"], True,
     "--encoder-embed-dim: an option of the encoder-decoder (translation) models, and stlm_tied "
     "is a language model (a decoder only, shaped by the --decoder-* options); allowed: drop "
     "--encoder-embed-dim"),
    (["--arch", "stlm_tied", "--self-attn-gate", "qgv"], True,
     "--self-attn-gate=qgv: sigmoid(W_Q q) is 512 wide but v is 528 wide (16 query heads of 32, "
     "4 key/value heads); allowed: --self-attn-gate none, or --decoder-attention-heads 12"),
    (["--arch", "anthe_base", "--kv-heads", "1", "--cross-attn-gate", "vgk"], False,
     "--cross-attn-gate=vgk: sigmoid(W_V v) is 64 wide but k is 512 wide (8 query heads of 64, "
     "1 key/value head); allowed: --cross-attn-gate none, or --kv-heads 0, or "
     "--decoder-attention-heads 1"),
    (["--arch", "anthe_base", "--kv-heads", "1", "--self-attn-gate", "kgv"], False,
     "--self-attn-gate=kgv: sigmoid(W_K k) is 64 wide but v is 512 wide (8 query heads of 64, "
     "1 key/value head); allowed: --kv-heads 0"),
    (["--arch", "slim_transformer", "--head-dim", "32", "--self-attn-gate", "qgv"], False,
     "--self-attn-gate=qgv: sigmoid(W_Q q) is 256 wide but v is 512 wide (8 query heads of 32, "
     "8 key/value heads); allowed: --self-attn-gate none, or --head-dim 0"),
    (["--arch", "subformer_lm_wiki103_83m", "--decoder-embed-dim", "64", "--decoder-layers", "3",
      "--adaptive-input-cutoff", "100,400", "--adaptive-softmax-cutoff", "100,400"], True,
     "--criterion=cross_entropy: fairseq trains an adaptive softmax (--adaptive-softmax-cutoff) "
     "with adaptive_loss only; the others fail in backward; allowed: --criterion adaptive_loss"),
    # the reduced form replaces W_Q by the identity: a head width other than width/heads
    # makes it non-square
    (["--arch", "skipless_lm", "--decoder-embed-dim", "64", "--decoder-attention-heads", "4",
      "--decoder-layers", "2", "--head-dim", "8", "--removed-weights", "q"], True,
     "--removed-weights=q: W_Q is not square here (64 -> 32: 4 heads of 8); allowed: "
     "--head-dim 0"),
    (["--arch", "slim_lm", "--kv-heads", "2", "--quant-noise-pq", "0.1"], True,
     "--quant-noise-pq=0.1: acts on fairseq's dense linears, which --kv-heads replaces or "
     "bypasses; allowed: --quant-noise-pq 0"),
    # the translation models check the target dictionary against the cutoffs too
    (["--arch", "slim_transformer", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
      "--encoder-layers", "1", "--decoder-layers", "1", "--adaptive-softmax-cutoff", "5000,9000",
      "--criterion", "adaptive_loss"], False,
     "--adaptive-softmax-cutoff=5000,9000: cutoffs must increase and stay within the "
     "dictionary's 1,128 types; allowed: --adaptive-softmax-cutoff 84,253"),
    # SAFE's output path is its token table: an untied projection would be ignored
    (["--arch", "stlm_tied", "--decoder-embed-dim", "64", "--decoder-layers", "2",
      "--safe-embed-dim", "16", "--no-share-decoder-input-output-embed"], True,
     "--no-share-decoder-input-output-embed: SAFE's output path (--safe-embed-dim) is tied to its "
     "token table, so there is no separate projection to untie; allowed: drop "
     "--no-share-decoder-input-output-embed"),
    # WikiText-103's cutoffs on a dictionary of 2,000 types: found when the model is built
    (["--arch", "subformer_lm_wiki103_83m", "--decoder-embed-dim", "64", "--decoder-layers", "3",
      "--criterion", "adaptive_loss"], True,
     "--adaptive-input-cutoff=20000,60000: cutoffs must increase and stay within the "
     "dictionary's 2,000 types; allowed: --adaptive-input-cutoff 149,448 "
     "--adaptive-softmax-cutoff 149,448"),
]


def _build(args):
    from fairseq import tasks
    return tasks.setup_task(args).build_model(args)


def _refusal(argv):
    """(the refusal's line after ``PROG: error: ``, the changes it proposes)."""
    with pytest.raises(SystemExit) as caught:
        _build(parse_train_args(argv))
    code = caught.value.code
    assert isinstance(code, str) and "\n" not in code, code
    message = code.split(": error: ", 1)[1]
    return message, getattr(caught.value, "alternatives", [])


def _with(argv, change):
    """``argv`` with one proposed change made: each flag set to its value, or dropped (None)
    with its value."""
    argv = list(argv)
    for flag, value in change.items():
        if flag not in argv:
            assert value is not None, f"{flag}: proposed to be dropped, but not given"
            argv += [flag, str(value)]
            continue
        at = argv.index(flag)
        has_value = at + 1 < len(argv) and not argv[at + 1].startswith("--")
        if value is None:
            del argv[at:at + 1 + has_value]
        else:
            assert has_value, f"{flag}: takes no value, proposed {value}"
            argv[at + 1] = str(value)
    return argv


def test_proposed_changes_are_made_on_the_command_line():
    argv = ["--a", "1", "--b", "--c", "x"]
    assert _with(argv, {"--a": 2, "--d": "y"}) == ["--a", "2", "--b", "--c", "x", "--d", "y"]
    assert _with(argv, {"--a": None, "--b": None}) == ["--c", "x"]
    with pytest.raises(AssertionError, match="not given"):
        _with(argv, {"--d": None})


@pytest.mark.parametrize("argv, lm, line", CLI, ids=[" ".join(c[0]) for c in CLI])
def test_cli_mistake_ends_in_one_line(argv, lm, line):
    """The exact line; the refusal proposes at least one change of the command line, its
    ``allowed`` says exactly those changes, and each is accepted."""
    from slim_fairseq.option_errors import render_alternatives

    full = task_args(lm) + ["--user-dir", os.path.join(REPO, "slim_fairseq"), "--cpu"] + argv
    message, alternatives = _refusal(full)
    assert message == line
    assert alternatives, f"proposes no change a test can try: {message}"
    assert message.rsplit("; allowed: ", 1)[1] == render_alternatives(alternatives)
    for change in alternatives:
        _build(parse_train_args(_with(full, change)))


# slim-fairseq-help's arguments, the line they must end in (exactly), what it proposes and the
# arguments that follow the proposal (run, they must be answered)
HELP = [
    (["anthe_base", "--frob", "3"],
     "--frob 3: not options of SlimTransformerModel; allowed: see slim-fairseq-help anthe_base",
     "slim-fairseq-help anthe_base", ["anthe_base"]),
    (["anthe_base", "--encoder-layers", "x"],
     "--encoder-layers: invalid int value: 'x'; allowed: see slim-fairseq-help anthe_base",
     "slim-fairseq-help anthe_base", ["anthe_base"]),
    (["anthe_base", "--vocab", "x"],
     "--vocab=x: not a whole number; allowed: a dictionary size of 4 or more (fairseq's 4 "
     "special symbols included)", "4 or more", ["anthe_base", "--vocab", "4"]),
    (["anthe_bse"],
     "--arch=anthe_bse: not an architecture; allowed: the closest: anthe_base, anthe_base_nopatt, "
     "bart_base; slim-fairseq-help --archs lists every architecture", "the closest: anthe_base",
     ["anthe_base"]),
    (["subformer_lm_wiki103_83m", "--vocab", "2000"],
     "--adaptive-input-cutoff=20000,60000: cutoffs must increase and stay within the dictionary's "
     "2,000 types; allowed: --adaptive-input-cutoff 149,448 --adaptive-softmax-cutoff 149,448",
     "--adaptive-input-cutoff 149,448 --adaptive-softmax-cutoff 149,448",
     ["subformer_lm_wiki103_83m", "--vocab", "2000", "--adaptive-input-cutoff", "149,448",
      "--adaptive-softmax-cutoff", "149,448"]),
]


@pytest.mark.parametrize("argv, line, proposed, fixed", HELP, ids=[" ".join(c[0]) for c in HELP])
def test_help_mistake_ends_in_one_line(argv, line, proposed, fixed, capsys):
    proc = subprocess.run([os.path.join(BIN, "slim-fairseq-help"), *argv], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, \
        proc.stderr[-3000:]
    assert proc.stderr.rstrip("\n").split(": error: ", 1)[1] == line
    assert proposed in line.rsplit("; allowed: ", 1)[1]
    from slim_fairseq.arch_help import main
    assert main(fixed) == 0 and capsys.readouterr().out  # what it proposes is answered


def test_help_counts_an_adaptive_preset_at_wikitext103s_vocabulary():
    from slim_fairseq.arch_help import WIKITEXT103_VOCAB, describe
    assert f"parameters at a vocabulary of {WIKITEXT103_VOCAB:,} types" in \
        describe("subformer_lm_wiki103_83m")


def _recipe(script, *argv, env=None):
    full_env = dict(os.environ, PYTHON=os.path.join(BIN, "python"), PYTHONWARNINGS="ignore",
                    PATH=BIN + os.pathsep + os.environ["PATH"], **(env or {}))
    return subprocess.run(["bash", os.path.join(EXAMPLES, script), *argv], capture_output=True,
                          text=True, env=full_env, timeout=300, cwd=REPO)


# (recipe, its arguments, the line's pattern); {ende} / {lm} are the small data-bins of the tests
RECIPES = [
    ("translation/train-subformer.sh", ["--dropout", "0.2", "{ende}", "--dry-run"],
     r"^train-subformer\.sh: error: --dropout: an option for the fairseq tool, written before "
     r"DATA_BIN; allowed: DATA_BIN first"),
    ("translation/evaluate.sh", ["--max-len-b", "5", "{ende}", "ckpt"],
     r"^evaluate\.sh: error: --max-len-b: an option for the fairseq tool, written before "
     r"DATA_BIN and CKPT"),
    ("translation/train-anthe.sh", ["{ende}", "--arch", "anthe_bse", "--dry-run", "--gpus", "0"],
     r"^train-anthe\.sh: error: --arch=anthe_bse: not an architecture; allowed: the closest: "
     r"anthe_base"),
    ("translation/train-anthe.sh", ["{ende}", "--frobnicate", "3", "--dry-run", "--gpus", "0"],
     r"^train-anthe\.sh: error: --frobnicate 3: not options of fairseq-train with --arch anthe_base"),
    ("translation/train-anthe.sh", ["{lm}", "--dry-run", "--gpus", "0"],
     r"^train-anthe\.sh: error: DATA_BIN=.*: language-model data .*; allowed: a translation data-bin"),
    ("lm/train-stlm.sh", ["{ende}", "--dry-run", "--gpus", "0"],
     r"^train-stlm\.sh: error: DATA_BIN=.*: translation data .*; allowed: a language-model data-bin"),
    ("translation/train-anthe.sh", ["{novalid}", "--dry-run", "--gpus", "0"],
     r"^train-anthe\.sh: error: DATA_BIN=.*: no valid split \(valid\*\.idx; --valid-subset "
     r"valid\); allowed: a data-bin binarized with --validpref, or --disable-validation$"),
    ("translation/train-anthe.sh", ["{ende}", "--max-tokens", "4k", "--dry-run"],
     r"^train-anthe\.sh: error: --max-tokens=4k: not a whole number >= 1"),
    ("translation/prepare-wmt16enro.sh", ["--max-len", "abc", "--dry-run"],
     r"^prepare-wmt16enro\.sh: error: --max-len=abc: not a whole number >= 1"),
    ("translation/prepare-wmt16enro.sh", ["--max-len=0", "--dry-run"],
     r"^prepare-wmt16enro\.sh: error: --max-len=0: not a whole number >= 1"),
    ("translation/prepare-wmt16enro.sh", ["--ratio", "abc", "--dry-run"],
     r"^prepare-wmt16enro\.sh: error: --ratio=abc: not a number > 0"),
    ("translation/prepare-wmt16enro.sh", ["--bpe-merges", "abc", "--dry-run"],
     r"^prepare-wmt16enro\.sh: error: --bpe-merges=abc: not a whole number >= 1"),
    ("translation/prepare-wmt14en2de.sh", ["--vocab-size", "abc", "--dry-run"],
     r"^prepare-wmt14en2de\.sh: error: --vocab-size=abc: not a whole number >= 1"),
    ("translation/prepare-wmt14en2de.sh", ["--paper", "antthe", "--dry-run"],
     r"^prepare-wmt14en2de\.sh: error: --paper=antthe: not one of the choices; allowed: "
     r"anthe\|subformer"),
    ("translation/prepare-wmt17.sh", ["de-en", "--spm-sample", "abc", "--dry-run"],
     r"^prepare-wmt17\.sh: error: --spm-sample=abc: not a whole number >= 1"),
    ("translation/prepare-wmt17.sh", ["de-en", "--skip", "europarll", "--dry-run"],
     r"^prepare-wmt17\.sh: error: --skip=europarll: not one of the choices; allowed: europarl\|"),
    ("translation/prepare-wmt17.sh", ["de-en", "--skip", "leta", "--dry-run"],
     r"^prepare-wmt17\.sh: error: --skip=leta: not a training corpus of de-en; allowed: "
     r"europarl\|commoncrawl\|news-commentary\|rapid$"),
    ("translation/prepare-wmt17.sh", ["de-en", "--max-size", "9X", "--dry-run"],
     r"^prepare-wmt17\.sh: error: --max-size=9X: not a size"),
    ("lm/evaluate-lm.sh", ["{lm}", "ckpt", "--tokens-per-sample", "x"],
     r"^evaluate-lm\.sh: error: --tokens-per-sample=x: not a whole number >= 1"),
    ("lm/evaluate-lm.sh", ["{lm}:{lm}", "ckpt"],
     r"^evaluate-lm\.sh: error: DATA_BIN=.*: shards of a data-bin .*; allowed: one data-bin"),
    ("translation/evaluate.sh", ["{ende}", "ckpt", "--beam", "0x"],
     r"^evaluate\.sh: error: --beam=0x: not a whole number >= 1"),
]


@pytest.mark.parametrize("script, argv, pattern", RECIPES,
                         ids=[f"{c[0]} {' '.join(c[1])}" for c in RECIPES])
def test_recipe_mistake_ends_in_one_line(script, argv, pattern, tmp_path):
    data = {"{ende}": ende_data_bin(), "{lm}": wikitext_data_bin(), "{novalid}": tmp_path / "novalid"}
    data["{novalid}"].mkdir()
    for name in os.listdir(data["{ende}"]):  # the en-de data-bin without its valid split
        if not name.startswith("valid."):
            os.symlink(os.path.join(data["{ende}"], name), data["{novalid}"] / name)
    for placeholder, path in data.items():
        argv = [a.replace(placeholder, str(path)) for a in argv]
    proc = _recipe(script, *argv, "--work-dir", str(tmp_path / "work")) \
        if script.split("/")[1].startswith("prepare") else _recipe(script, *argv)
    assert proc.returncode != 0, proc.stdout[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "usage:" not in proc.stderr, \
        proc.stderr[-3000:]
    assert re.search(pattern, errors[0]), errors[0]


def test_max_sentences_is_the_batch_size_the_recipe_prints():
    """fairseq's --max-sentences is its --batch-size: the recipe prints and passes that value."""
    proc = _recipe("translation/train-subformer.sh", ende_data_bin(), "--max-sentences=64",
                   "--dry-run", "--gpus", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "at most 64 sentences per worker batch (--batch-size)" in out, out[-2000:]
    command = next(line for line in out.splitlines() if line.startswith("+ fairseq-train"))
    assert " --batch-size 64 " in command + " " and "--max-sentences" not in command, command


def test_generate_on_a_language_model_ends_in_one_line_and_its_advice_works(tmp_path):
    """fairseq-generate --task language_modeling reads blocks of 1,024 tokens by default: with
    a model of fewer positions it would stop with a traceback on the first sample."""
    fixture = os.path.join(REPO, "tests", "fixtures", "checkpoints_0_2_0", "stlm_tied")
    (tmp_path / "lm.test").write_text("the cat is in the house .\nthe house of a man .\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore", PATH=BIN + os.pathsep + os.environ["PATH"])
    subprocess.run([os.path.join(BIN, "fairseq-preprocess"), "--only-source", "--srcdict",
                    os.path.join(fixture, "dict.txt"), "--testpref", str(tmp_path / "lm.test"),
                    "--destdir", str(tmp_path / "bin"), "--workers", "1"],
                   check=True, capture_output=True, env=env, timeout=300)
    generate = [os.path.join(BIN, "fairseq-generate"), str(tmp_path / "bin"), "--task",
                "language_modeling", "--user-dir", os.path.join(REPO, "slim_fairseq"), "--path",
                os.path.join(fixture, "checkpoint.pt"), "--cpu", "--beam", "1", "--max-len-b", "3",
                "--required-batch-size-multiple", "1"]
    proc = subprocess.run(generate, capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert proc.returncode != 0 and len(errors) == 1 and "Traceback" not in proc.stderr, \
        proc.stderr[-3000:]
    assert re.search(r"--tokens-per-sample=1024: longer than the 16 positions the model has: .*"
                     r"allowed: --tokens-per-sample 16 or less with --sample-break-mode eos",
                     errors[0]), errors[0]
    proc = subprocess.run(generate + ["--tokens-per-sample", "16", "--sample-break-mode", "eos"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and len(re.findall(r"^H-\d", proc.stdout, re.M)) == 2, \
        proc.stderr[-3000:]


# ------------------------------------------------------------------ the plugin's one error format

# a message: SUBJECT[=VALUE]: what is wrong; allowed: what works (a program's "PROG: error: "
# before it); f-string fields read as "{}"
ONE_LINE = re.compile(r"^(\S+: error: )?[^:;\s][^:;]*?(=[^:;]+)?: [^\n]+; allowed: [^\n]+$")
# helpers that build such a message from (flag, value, problem, allowed)
BUILDERS = {"option_error": 3, "_off": 3, "unknown_arch": None, "error.with_alternatives": None}


def _template(node):
    import ast
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{}") + (right if right is not None else "{}")
    return None


def _raises(root):
    """(file:line, the raised call's source, what is wrong with its message or None)."""
    import ast
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
                    continue  # a bare re-raise, or an error object made elsewhere
                call, where = node.exc, f"{os.path.relpath(path, REPO)}:{node.lineno}"
                func = ast.unparse(call.func)
                if func in BUILDERS:
                    given = len(call.args) > (BUILDERS[func] or 0) or any(
                        k.arg in ("allowed", "alternatives") for k in call.keywords)
                    yield where, func, None if BUILDERS[func] is None or given else "no allowed"
                    continue
                if call.args and isinstance(call.args[0], ast.Call) and \
                        ast.unparse(call.args[0].func) == "str":
                    yield where, func, None  # an error already in the format, passed on
                    continue
                text = _template(call.args[0]) if call.args else None
                yield where, func, None if text and ONE_LINE.match(text) else repr(text)


def test_every_error_of_the_plugin_is_one_line_naming_what_is_allowed():
    """Every raise in slim_fairseq/ states SUBJECT=VALUE: problem; allowed: what works."""
    found = list(_raises(os.path.join(REPO, "slim_fairseq")))
    assert len(found) > 100  # the scan sees the plugin's raises
    bad = [f"{where} {func}: {problem}" for where, func, problem in found if problem]
    assert not bad, "\n".join(bad)


# ------------------------------------------------------- slim-fairseq-export-hf (transformers)

# (arch, language model?, options after the tiny widths, export options, the line's pattern,
# (arch, options) of what the line allows, which must export)
# (arch, language model?, its options after the tiny widths, export options, the line, exactly,
# the model that the line's "allowed" describes: it must export)
EXPORT_HF = [
    ("slim_lm", True, ["--self-attn-gate", "qgv"], {},
     "--self-attn-gate=qgv: Anthe's gated attention (sigmoid(W x) * W' y) is in no transformers "
     "class; allowed: --self-attn-gate none", ("slim_lm", [])),
    ("slim_lm", True, ["--hsoftpos-levels", "2"], {},
     "--hsoftpos-levels=2: H-SoftPOS embeddings (convolutions over neighbouring tokens) are in no "
     "transformers class; allowed: --hsoftpos-levels 0", ("slim_lm", [])),
    ("slim_lm", True, ["--safe-embed-dim", "16"], {},
     "--safe-embed-dim=16: SAFE's factorised embeddings (an attention inside the embedding) are "
     "in no transformers class; allowed: --safe-embed-dim 0", ("slim_lm", [])),
    ("slim_lm", True, ["--output-bias"], {},
     "--output-bias: no class here has a bias on the vocabulary projection; allowed: no "
     "--output-bias", ("slim_lm", [])),
    ("slim_lm", True, ["--adaptive-input", "--adaptive-input-cutoff", "100,400",
                       "--adaptive-input-factor", "2"], {},
     "--adaptive-input: an adaptive input (one table per frequency band) is in no class here; "
     "allowed: one token table (no --adaptive-input)", ("slim_lm", [])),
    ("skipless_lm", True, [], {},
     "--skipless-layout=serial: blocks without skips or norms, with shaped attention, are in no "
     "transformers class; allowed: --skipless-layout none", ("slim_lm", [])),
    ("slim_lm", True, ["--sandwich", "--decoder-layers", "3", "--sandwich-dim", "64"], {},
     "--sandwich-dim=64: a sandwich middle of another shape than the decoder's layers (64 where "
     "they have 32) fits no class, whose layers are all alike; allowed: --sandwich-dim 0 "
     "--sandwich-ffn-dim 0 --sandwich-heads 4 (the middle at the model's shape, its layers "
     "copied)", ("slim_lm", ["--sandwich", "--decoder-layers", "3", "--sandwich-heads", "4"])),
    # the advice names every part of the block that is missing, not only the first
    ("slim_lm", True, ["--norm", "rmsnorm"], {},
     "--ffn-glu: Llama's layout, the one class with RMSNorm, RoPE or a GLU, needs all of --norm "
     "rmsnorm --decoder-normalize-before --ffn-glu --rope-theta 10000 "
     "--no-token-positional-embeddings (the STLM block); allowed: --ffn-glu --rope-theta 10000 "
     "--no-token-positional-embeddings",
     ("slim_lm", ["--norm", "rmsnorm", "--ffn-glu", "--rope-theta", "10000",
                  "--no-token-positional-embeddings"])),
    ("slim_lm", True, ["--kv-heads", "2"], {},
     "--kv-heads=2: a LayerNorm language model (XGLM, OPT) has as many key/value heads as query "
     "heads; allowed: --kv-heads 0", ("slim_lm", [])),
    ("slim_lm", True, [], {"bpe": "subword_nmt", "tokenizer_name": "moses", "bpe_codes": "{codes}"},
     "--bpe=subword_nmt: FSMT's tokenizer (Moses, subword-nmt) ends a text with </s> where a "
     "language model starts with it; allowed: --bpe gpt2|sentencepiece, or none (whitespace "
     "words)", ("slim_lm", [])),
    ("slim_transformer", False, ["--encoder-normalize-before", "--decoder-normalize-before"], {},
     "--share-all-embeddings: missing: M2M100, the pre-norm class, has one table for encoder, "
     "decoder and output; allowed: --share-all-embeddings (a joined dictionary), or post-norm "
     "(FSMT)",
     ("slim_transformer", ["--encoder-normalize-before", "--decoder-normalize-before",
                           "--share-all-embeddings"])),
    ("slim_transformer", False, ["--ffn-glu"], {},
     "--ffn-glu: no sequence-to-sequence class here (FSMT, M2M100) has RMSNorm, RoPE or a GLU "
     "feed-forward; allowed: no --ffn-glu", ("slim_transformer", [])),
]


@pytest.mark.parametrize("arch, lm, argv, options, line, fix", EXPORT_HF,
                         ids=[f"{c[0]} {' '.join(c[2])} {c[3]}" for c in EXPORT_HF])
def test_export_hf_refusal_is_one_line_and_its_advice_exports(arch, lm, argv, options, line,
                                                              fix, tmp_path_factory):
    from hf_export_fixtures import codes, data_of, exported, tiny_checkpoint, tokenizer_options
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    folder = tmp_path_factory.getbasetemp() / "export_hf_refusals"
    folder.mkdir(exist_ok=True)
    path = tiny_checkpoint(folder, arch, argv, lm)
    options = {k: codes() if v == "{codes}" else v for k, v in options.items()}
    out = folder / (os.path.basename(path) + "-hf")
    with pytest.raises(OptionError) as caught:
        export(path, data_of(lm), str(out), **dict(tokenizer_options(lm), **options))
    message = str(caught.value)
    assert message == line
    assert not out.exists()
    _, result = exported(folder, fix[0], fix[1], lm)
    assert result.gap <= 1e-5
