"""Offline tests of the recipes of examples/ (slim_fairseq_lab/recipes, one module per script).

Each recipe runs in the test's process, as a function (recipes_fixtures.run_recipe): only the
programs it starts (fairseq's tools, sacremoses, subword-nmt, sacrebleu) are processes.
Miniature copies of every raw download (tests/recipes_fixtures.py) go through each prepare
recipe in --raw-dir mode (no network), the train recipes run in --cpu-smoke mode (2 updates of a
tiny copy of the arch) and the evaluation recipes score the result. The recipes' own logic
(option parsing, batch arithmetic, scoring protocol, result checks) is tested with fake fairseq
tools and a fake GPU count, in seconds; tests/fixtures/recipe_commands.json holds what the
docs' commands print and run, which the recipes must still print and run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipes_fixtures as fixtures  # noqa: E402
from helpers import ende_data_bin, wikitext_data_bin  # noqa: E402

from slim_fairseq_lab.recipes import cli, comparisons, downloads, evaluation, text, tools  # noqa: E402

pytestmark = pytest.mark.slow

REPO = fixtures.REPO
EXAMPLES = REPO / "examples"
VENV_BIN = Path(sys.executable).parent
EVAL_COUNT = 60  # sentences in the miniature valid / test sets
SCRIPTS = sorted(fixtures.RECIPE_MODULES)


def run(script: str, *args: str, cwd: Path, expect_ok: bool = True, env: dict | None = None, gpus: int | None = None):
    """Run the recipe of examples/SCRIPT in this process (recipes_fixtures.run_recipe)."""
    proc = fixtures.run_recipe(script, *args, cwd=cwd, env=env, gpus=gpus)
    if expect_ok:
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def dictionary(path: Path) -> dict[str, int]:
    return {word: int(count) for word, count in (line.rsplit(" ", 1) for line in lines(path))}


# ---------------------------------------------------------------------------------------------
# prepared data (module scope: each prepare recipe runs once)

@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("recipes")


@pytest.fixture(scope="module")
def raw_wmt(work) -> Path:
    """One raw folder for every WMT recipe, as a user would keep it: the WMT14, WMT16 and
    WMT17 dev/test archives (all published as dev.tgz / test.tgz) sit side by side under
    their recipe names, and shared archives (Europarl v8) hold the members of each recipe."""
    raw = work / "raw-wmt"
    fixtures.build_wmt14_en_de(raw, per_corpus=700, eval_count=EVAL_COUNT)
    fixtures.build_wmt16_en_ro(raw, per_corpus=500, eval_count=EVAL_COUNT)
    fixtures.build_wmt17(raw, "fi", per_corpus=500, eval_count=EVAL_COUNT)
    fixtures.build_wmt14_google(raw, count=600, eval_count=EVAL_COUNT)
    fixtures.build_wikitext103_raw_gpt2(raw, max_train=600, max_eval=20)
    return raw


@pytest.fixture(scope="module")
def wmt14(work, raw_wmt) -> Path:
    run("translation/prepare-wmt14en2de.sh", "--raw-dir", raw_wmt, "--work-dir", "wmt14", "--bpe-merges", "300",
        "--no-verify", cwd=work)
    return work / "wmt14"


@pytest.fixture(scope="module")
def wmt16(work, raw_wmt) -> Path:
    run("translation/prepare-wmt16enro.sh", "--raw-dir", raw_wmt, "--work-dir", "wmt16", "--bpe-merges", "300",
        "--no-verify", cwd=work)
    return work / "wmt16"


CAP_BYTES = 120_000


@pytest.fixture(scope="module")
def wmt17(work, raw_wmt):
    """fi-en with the Anthe paper's tokenizer: sentencepiece BPE learned on WikiText-103 raw."""
    proc = run("translation/prepare-wmt17.sh", "fi-en", "--raw-dir", raw_wmt, "--work-dir", "wmt17", "--vocab-size",
               "300", "--tokenizer-lang", "wikitext-103", "--max-size", f"{CAP_BYTES // 1000}K", "--no-verify", cwd=work)
    return work / "wmt17", proc


@pytest.fixture(scope="module")
def wikitext(work) -> Path:
    raw = fixtures.build_wikitext103(work / "raw-wikitext", max_train=1200, max_eval=120)
    run("lm/prepare-wikitext-103.sh", "--raw-dir", raw, "--work-dir", "wikitext", "--no-verify", cwd=work)
    return work / "wikitext"


# ---------------------------------------------------------------------------------------------
# the scripts users call, and what they print

def test_every_script_is_one_exec_of_its_recipe_module():
    """examples/*/*.sh: each a one-line exec of its module of slim_fairseq_lab/recipes (whose
    main() is the command line); no shared shell code and no eval left under examples/."""
    assert len(SCRIPTS) == 16 and not (EXAMPLES / "common.sh").exists()
    for script in SCRIPTS:
        path = EXAMPLES / script
        code = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        module = fixtures.RECIPE_MODULES[script]
        assert code == [f'PYTHONPATH="$(cd "$(dirname "$0")/../.." && pwd)${{PYTHONPATH:+:$PYTHONPATH}}" exec '
                        f'"${{PYTHON:-python3}}" -m slim_fairseq_lab.recipes.{module} "$@"'], script
        assert os.access(path, os.X_OK) and callable(fixtures.recipe_module(script).main)
    for path in EXAMPLES.rglob("*"):
        if path.is_file() and path.suffix in (".sh", ".py"):
            assert not re.search(r"(?<![\w.-])eval(?![\w-])", path.read_text()), path
    proc = subprocess.run([str(VENV_BIN / "shellcheck"), *(str(EXAMPLES / s) for s in SCRIPTS)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_script_runs_its_recipe(tmp_path):
    """The shell line runs the module with the interpreter of PYTHON from any folder: its --help,
    and a refusal in one line with the recipe's name."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(EXAMPLES / "translation/evaluate.sh"), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == fixtures.recipe_module("translation/evaluate.sh").__doc__.lstrip("\n")
    proc = subprocess.run(["bash", str(EXAMPLES / "lm/evaluate-lm.sh"), "nowhere", "ckpt"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == ("evaluate-lm.sh: error: DATA_BIN=nowhere: not a folder; allowed: the "
                                                    "data-bin of a prepare script (or fairseq-preprocess --only-source)\n")


GOLDEN = json.loads((REPO / "tests" / "fixtures" / "recipe_commands.json").read_text(encoding="utf-8"))
# what the recipes print differently from the recording, and why
CHANGED_STDERR = {
    # the shell recipe printed the size cap twice ("9G = 9663676416 bytes9G")
    " bytes9G\n": " bytes\n",
}
# the help texts that say more than the recording: the results of a refused or failed run,
# and what the evaluations refuse before they start
CHANGED_HELP = {"lm/evaluate-lm.sh", "translation/evaluate.sh", "translation/prepare-wmt14en2de.sh"}


def _normalized(text_: str, root: Path) -> str:
    text_ = text_.replace(str(root), "{ROOT}").replace(str(REPO), "{REPO}")
    return re.sub(r"^\[\d\d:\d\d:\d\d\] ", "[..] ", text_, flags=re.M)


@pytest.fixture(scope="module")
def doc_examples(tmp_path_factory):
    root = tmp_path_factory.mktemp("doc-examples")
    return root, fixtures.doc_examples(root, sys.executable)


@pytest.mark.parametrize("number", range(len(GOLDEN["runs"])),
                         ids=[f"{r['script'].split('/')[-1]} {' '.join(r['argv'])}" for r in GOLDEN["runs"]])
def test_docs_commands_print_and_run_what_they_did(number, doc_examples):
    """The recipe commands of README.md and the docs print the same fairseq commands and lines,
    and run the fairseq tools with the same arguments, as tests/fixtures/recipe_commands.json
    recorded (a printed command compares as the words a shell reads from it)."""
    golden = GOLDEN["runs"][number]
    root, env = doc_examples
    calls = root / "fake" / "calls.log"
    if calls.exists():
        calls.unlink()
    proc = fixtures.run_recipe(golden["script"].split("/", 1)[1], *golden["argv"], cwd=root, env={**env, **golden["env"]},
                               gpus=golden["gpus"])
    assert proc.returncode == golden["rc"], proc.stderr[-3000:]
    printed, recorded = _normalized(proc.stdout, root).splitlines(), golden["stdout"].splitlines()
    assert len(printed) == len(recorded), (printed, recorded)
    for new, old in zip(printed, recorded):
        assert new == old or (old.startswith("+ ") and shlex.split(new) == shlex.split(old)), (new, old)
    expected = golden["stderr"]
    for old, new in CHANGED_STDERR.items():
        expected = expected.replace(old, new)
    assert _normalized(proc.stderr, root) == expected
    ran = [_normalized(line, root).split("\t") for line in calls.read_text().splitlines()] if calls.exists() else []
    assert ran == golden["calls"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_is_the_recorded_one(script, tmp_path):
    """--help prints the recipe's description (its module's docstring; a train recipe adds the
    options every train recipe shares), as recorded; starts nothing and writes nothing."""
    proc = run(script, "--help", cwd=tmp_path)
    recorded = GOLDEN["help"][f"examples/{script}"]
    assert proc.stderr == "" and list(tmp_path.iterdir()) == []
    assert any(line.lower().startswith("usage:") for line in proc.stdout.splitlines())
    if script in CHANGED_HELP:  # every recorded paragraph is still there, or said more fully
        kept = [line for line in recorded.splitlines() if line in proc.stdout.splitlines()]
        assert len(kept) >= len(recorded.splitlines()) - 4, (kept, recorded)
    else:
        assert proc.stdout == recorded


# ---------------------------------------------------------------------------------------------
# the shared parts: tools, text steps, downloads

def test_tools_keep_large_blocks_in_the_heap_as_quality_py_does(monkeypatch):
    """Every tool a recipe starts gets slim_fairseq_lab.launcher's ALLOCATOR_ENV (one set of
    values for every launcher), and a value the caller exported wins."""
    from slim_fairseq_lab.launcher import ALLOCATOR_ENV
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    assert {k: tools.environment()[k] for k in ALLOCATOR_ENV} == ALLOCATOR_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    assert tools.environment()["MALLOC_TRIM_THRESHOLD_"] == "4096"


def test_a_failed_tool_ends_in_one_line_with_its_reason_and_log(tmp_path):
    """The reason of a failure is on the screen, not only in the log: the tool's error line, or
    the last line of its traceback."""
    log = tmp_path / "tool.log"
    with pytest.raises(cli.OptionError) as caught:
        tools.run([sys.executable, "-c", "import sys; print('working'); sys.exit('tool: error: --frob: not an option')"],
                  log=log)
    name = os.path.basename(sys.executable)
    assert str(caught.value) == f"{name} failed (exit 1): --frob: not an option; see {log}"
    assert caught.value.status == 1
    with pytest.raises(cli.OptionError) as caught:
        tools.run([sys.executable, "-c", "raise KeyError('dict.txt')"], log=log)
    assert str(caught.value) == f"{name} failed (exit 1): KeyError: 'dict.txt'; see {log}"
    with pytest.raises(cli.OptionError) as caught:
        tools.run(["no-such-tool-anywhere"])
    assert str(caught.value) == (f"no-such-tool-anywhere: not found on PATH nor next to {sys.executable}; allowed: "
                                 "the environment `make setup` built (source .venv/bin/activate)")


def test_romanian_normalisation_removes_diacritics(tmp_path):
    path = tmp_path / "ro"
    path.write_text("Ţara şi înţelegerea „bună” cu ŞTIRI, ăsta\n", encoding="utf-8")
    text.romanian_normalise(str(path))
    assert path.read_text(encoding="utf-8") == 'Tara si intelegerea "buna" cu STIRI, asta\n'


def test_compound_split():
    assert text.compound_split("state @-@ of @-@ the-art - x\n") == \
        "state @ ##AT##-##AT## @ of @ ##AT##-##AT## @ the ##AT##-##AT## art - x\n"


def test_sgm_reader_and_size_parser(tmp_path):
    sgm = tmp_path / "t.sgm"
    sgm.write_bytes(fixtures.fake_sgml(["A  b & c", "d"], "newstest", "en", "ref"))
    text.sgm_to_text(str(sgm), str(tmp_path / "t.txt"))
    assert (tmp_path / "t.txt").read_text() == "A b & c\nd\n"
    assert [cli.parse_size(v) for v in ("9G", "12K", "7")] == [9 * 1024**3, 12 * 1024, 7]


def test_download_is_offline_safe_and_verified(work):
    """No hang without network, --raw-dir never downloads, checksums are enforced."""
    raw = fixtures.build_wikitext103(work / "raw-wikitext-checksum", max_train=20, max_eval=5)
    # an address nobody listens on: a clear error at once, not a hang
    proc = run("lm/prepare-wikitext-103.sh", "--url", "http://127.0.0.1:9/wikitext-103-v1.zip", "--work-dir",
               "wt-offline", cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "cannot reach 127.0.0.1" in proc.stderr and "--raw-dir" in proc.stderr
    # --raw-dir: a missing file is named with its download address
    proc = run("translation/prepare-wmt16enro.sh", "--raw-dir", raw, "--work-dir", "wt-missing", cwd=work,
               expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == (
        f"prepare-wmt16enro.sh: error: --raw-dir={raw}: no training-parallel-ep-v8.tgz; allowed: a folder holding "
        "training-parallel-ep-v8.tgz (download https://data.statmt.org/wmt16/translation-task/"
        "training-parallel-ep-v8.tgz and save it under that name)\n")
    # the miniature zip is not the published archive: the SHA-1 check refuses it
    proc = run("lm/prepare-wikitext-103.sh", "--raw-dir", raw, "--work-dir", "wt-sum", cwd=work, expect_ok=False)
    assert proc.returncode == 2 and re.fullmatch(
        r"prepare-wikitext-103\.sh: error: \S+/wikitext-103-v1\.zip: sha1 checksum [0-9a-f]{40}, not the expected "
        r"[0-9a-f]{40}; allowed: delete the file to download it again, or --no-verify if you trust it\n", proc.stderr)
    # an archive of one's own that is not the published one: refused before anything is written,
    # and what the refusal proposes (--no-verify) prepares it
    import hashlib
    archive = raw / "wikitext-103-v1.zip"
    sha1 = hashlib.sha1(archive.read_bytes()).hexdigest()
    proc = run("lm/prepare-wikitext-103.sh", "--archive", archive, "--work-dir", "wt-archive", cwd=work,
               expect_ok=False)
    assert proc.stderr == (f"prepare-wikitext-103.sh: error: --archive={archive}: not the published archive (sha1 "
                           f"{sha1}, expected 0aec09a7537b58d4bb65362fee27650eeaba625a); allowed: --no-verify if you "
                           "trust it, or the archive of https://wikitext.smerity.com/wikitext-103-v1.zip\n")
    assert not (work / "wt-archive").exists()
    run("lm/prepare-wikitext-103.sh", "--archive", archive, "--work-dir", "wt-archive", "--no-verify", cwd=work)
    assert (work / "wt-archive" / "data-bin" / "train.bin").stat().st_size > 0


def test_raw_dir_download_name_is_accepted_only_with_its_checksum(tmp_path, capsys):
    """One raw folder for several WMT years: a file kept under the published name (dev.tgz) is
    used only when its checksum is the one this recipe expects."""
    import hashlib
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "dev.tgz").write_bytes(b"newsdev of some year\n")
    md5 = hashlib.md5(b"newsdev of some year\n").hexdigest()
    url = "https://data.statmt.org/wmt16/translation-task/dev.tgz"
    fetched = downloads.Downloads(str(raw), str(tmp_path / "orig"))
    fetched.fetch(url, "wmt16-dev.tgz", f"md5:{md5}")
    assert fetched.raw_path("wmt16-dev.tgz") == f"{raw}/dev.tgz"
    with pytest.raises(cli.OptionError) as caught:
        downloads.Downloads(str(raw), str(tmp_path / "orig")).fetch(url, "wmt16-dev.tgz", "md5:" + "0" * 32)
    assert str(caught.value) == (f"--raw-dir={raw}: dev.tgz is not the file of {url} (md5 differs; another "
                                 f"dataset's dev.tgz?); allowed: that download saved as {raw}/wmt16-dev.tgz")
    assert not (tmp_path / "orig").exists()


# ---------------------------------------------------------------------------------------------
# prepare recipes

def _check_joined_translation_data(work_dir: Path, src: str, tgt: str, marker: str) -> None:
    data = work_dir / "data-bin"
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            assert (data / f"{split}.{src}-{tgt}.{lang}.bin").stat().st_size > 0
    src_dict, tgt_dict = dictionary(data / f"dict.{src}.txt"), dictionary(data / f"dict.{tgt}.txt")
    assert src_dict == tgt_dict, "--joined-dictionary: both sides share one dictionary"
    # every piece of the segmented training text is in the dictionary
    prep = work_dir / "tmp" / "prep"
    train_tokens = {tok for lang in (src, tgt) for line in lines(prep / f"train.{lang}") for tok in line.split()}
    assert train_tokens <= set(src_dict)
    assert any(marker in tok for tok in train_tokens), f"segmentation marker {marker!r} missing"
    assert len(lines(prep / f"test.{tgt}")) == EVAL_COUNT == len(lines(data / f"test.raw.{tgt}"))
    assert len(lines(prep / f"valid.{src}")) == EVAL_COUNT
    # the data-bin was built beside its place and moved there whole: no staging folder is left
    assert [p.name for p in work_dir.iterdir() if p.name.startswith(".")] == []


def test_prepare_wmt14_en_de(wmt14):
    _check_joined_translation_data(wmt14, "en", "de", "@@")
    assert lines(wmt14 / "data-bin" / "recipe.info") == ["SRC=en", "TGT=de", "SCHEME=moses-bpe"]
    # 300 merges of joint BPE (+ the header line) were learned and used
    assert len(lines(wmt14 / "data-bin" / "bpecodes")) == 301
    # the three corpora were concatenated; length filtering only drops pairs
    raw_train = lines(wmt14 / "tmp" / "raw.train.en")
    kept = lines(wmt14 / "tmp" / "prep" / "train.en")
    assert len(raw_train) == 3 * 700 and 0 < len(kept) <= len(raw_train)
    for en, de in zip(kept, lines(wmt14 / "tmp" / "prep" / "train.de")):
        n_en, n_de = len(en.split()), len(de.split())
        assert 1 <= n_en <= 250 and 1 <= n_de <= 250 and max(n_en / n_de, n_de / n_en) <= 1.5
    # Moses tokenization splits punctuation; the untokenized reference keeps it attached
    assert lines(wmt14 / "data-bin" / "test.raw.de")[0] == fixtures.bundled_lines("test", "de", 0, 1)[0]


def test_prepare_wmt16_en_ro(wmt16):
    _check_joined_translation_data(wmt16, "en", "ro", "@@")
    assert len(lines(wmt16 / "tmp" / "raw.train.ro")) == 2 * 500  # Europarl v8 + SETIMES2
    for path in [wmt16 / "tmp" / "prep" / "train.ro", wmt16 / "data-bin" / "test.raw.ro"]:
        content = path.read_text(encoding="utf-8")
        assert not set("ăâîșțşţĂÂÎȘȚŞŢ") & set(content), f"diacritics left in {path}"
    raw_fixture = fixtures.stand_in("ro", "test", 0, EVAL_COUNT)
    assert any(set("ăşț") & set(line) for line in raw_fixture)  # there was something to remove
    assert lines(wmt16 / "data-bin" / "recipe.info")[-1].startswith("REF_NOTE=Romanian without diacritics")


def test_prepare_wmt17_sentencepiece(wmt17):
    work_dir, proc = wmt17
    _check_joined_translation_data(work_dir, "fi", "en", "\u2581")
    info = lines(work_dir / "data-bin" / "recipe.info")
    assert info == ["SRC=fi", "TGT=en", "SCHEME=sentencepiece"]
    assert (work_dir / "data-bin" / "spm.model").stat().st_size > 0
    assert re.search(r"vocabulary 300, on: \S*/wiki\.train\.raw\n", proc.stderr)  # WikiText-103 tokenizer
    # the corpus cap kept a prefix of the concatenated corpora within the byte budget
    fi, en = work_dir / "tmp" / "raw.train.fi", work_dir / "tmp" / "raw.train.en"
    assert fi.stat().st_size + en.stat().st_size <= CAP_BYTES // 1000 * 1024
    assert 0 < len(lines(fi)) == len(lines(en)) < 3 * 500
    # europarl, wiki titles (" ||| " format) and rapid all contributed before the cap
    assert "kept 500 pairs" in proc.stderr and "titles.fi-en: kept 500 pairs" in proc.stderr


def test_prepare_wmt14_anthe_paper_segmentation(raw_wmt, work):
    """--paper anthe: the Anthe paper's one tokenizer for every language (arXiv:2305.10991,
    Sec. 3): a BPE learned on WikiText-103 (raw), applied to both sides, one joined dictionary;
    --spm-model reuses a model (so WMT14 and WMT17 can share one), and only with --paper anthe."""
    proc = run("translation/prepare-wmt14en2de.sh", "--raw-dir", raw_wmt, "--work-dir", "wmt14-anthe", "--paper=anthe",
               "--vocab-size", "300", "--no-verify", cwd=work)
    assert re.search(r"vocabulary 300, on: \S*/wiki\.train\.raw\n", proc.stderr)
    data = work / "wmt14-anthe" / "data-bin"
    assert lines(data / "recipe.info") == ["SRC=en", "TGT=de", "SCHEME=sentencepiece"]
    assert not (data / "spm.en.model").exists() and not (data / "spm.de.model").exists()
    import sentencepiece as spm
    model = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    vocabulary = {model.id_to_piece(i) for i in range(model.get_piece_size())}
    assert model.get_piece_size() == 300
    assert dictionary(data / "dict.en.txt") == dictionary(data / "dict.de.txt")  # joined
    prep = work / "wmt14-anthe" / "tmp" / "prep"
    pieces = {tok for lang in ("en", "de") for line in lines(prep / f"train.{lang}") for tok in line.split()}
    assert pieces <= set(dictionary(data / "dict.de.txt"))
    # the model's pieces, or characters its English training text did not have (written as
    # themselves, read as unknown: the paper's English-trained tokenizer on German text)
    unknown = pieces - vocabulary
    assert pieces & vocabulary and all(model.piece_to_id(p) == model.unk_id() for p in unknown), unknown
    assert len(lines(data / "test.raw.de")) == EVAL_COUNT
    # the same model again, given with --spm-model: nothing is learned
    again = run("translation/prepare-wmt14en2de.sh", "--raw-dir", raw_wmt, "--work-dir", "wmt14-anthe-reuse",
                "--paper", "anthe", "--spm-model", data / "spm.model", "--no-verify", cwd=work)
    assert "training a sentencepiece" not in again.stderr
    assert (work / "wmt14-anthe-reuse" / "data-bin" / "spm.model").read_bytes() == (data / "spm.model").read_bytes()
    refused = run("translation/prepare-wmt14en2de.sh", "--spm-model", data / "spm.model", "--dry-run", cwd=work,
                  expect_ok=False)
    assert refused.returncode == 2
    assert refused.stderr == (f"prepare-wmt14en2de.sh: error: --spm-model={data / 'spm.model'}: a sentencepiece "
                              "model, and this setting learns BPE codes; allowed: --paper anthe, or no --spm-model\n")


@pytest.fixture(scope="module")
def wmt14_google(raw_wmt, work) -> Path:
    run("translation/prepare-wmt14en2de.sh", "--raw-dir", raw_wmt, "--work-dir", "wmt14-google", "--paper", "subformer",
        "--no-verify", cwd=work)
    return work / "wmt14-google" / "data-bin"


def test_prepare_wmt14_subformer_paper_data(wmt14_google, raw_wmt, work):
    """--paper subformer: Google's preprocessed WMT14 (fairseq's scaling_nmt), binarized as is."""
    data = wmt14_google
    assert lines(data / "recipe.info") == [
        "SRC=en", "TGT=de", "SCHEME=moses-bpe", "SOURCE=google-wmt16_en_de",
        "REF_TOKENS=Moses tokenizer without -a (Google's preprocessing: the data's own test.tok.de)"]
    assert dictionary(data / "dict.en.txt") == dictionary(data / "dict.de.txt")
    google = work / "wmt14-google" / "extracted" / "google"
    # the training text went in unchanged: every BPE token of it is in the dictionary
    tokens = {tok for lang in ("en", "de") for line in lines(google / f"train.tok.clean.bpe.32000.{lang}")
              for tok in line.split()}
    assert tokens <= set(dictionary(data / "dict.en.txt")) and any(t.endswith("@@") for t in tokens)
    for split, name in (("valid", "newstest2013"), ("test", "newstest2014")):
        assert lines(data / f"{split}.raw.de") == lines(google / f"{name}.de")
        assert lines(data / f"{split}.tok.de") == lines(google / f"{name}.tok.de")
    # without --raw-dir: a clear error naming the manual download (Google Drive)
    proc = run("translation/prepare-wmt14en2de.sh", "--paper", "subformer", "--work-dir", "g2", cwd=work,
               expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == (
        "prepare-wmt14en2de.sh: error: --paper=subformer: Google's wmt16_en_de.tar.gz is behind a confirmation page "
        "of Google Drive (https://drive.google.com/uc?export=download&id=0B_bZck-ksdkpM25jRUN2X2UxMm8); allowed: "
        "--raw-dir FOLDER, a folder you downloaded it into\n")
    assert not (work / "g2").exists()


def test_prepare_wikitext103(wikitext):
    data = wikitext / "data-bin"
    for split in ("train", "valid", "test"):
        assert (data / f"{split}.bin").stat().st_size > 0
    words = {w for w in dictionary(data / "dict.txt") if not w.startswith("madeupword")}
    train_file = next((wikitext / "extracted").rglob("wiki.train.tokens"))
    assert words == {tok for line in lines(train_file) for tok in line.split()}


def test_prepare_wikitext103_gpt2_bpe(work):
    raw = fixtures.build_wikitext103_raw_gpt2(work / "raw-wikitext-gpt2")
    # word-level data prepared earlier with the default folder must survive the GPT-2 preparation
    word_level = work / "wikitext-103" / "data-bin"
    word_level.mkdir(parents=True)
    (word_level / "dict.txt").write_text("the 5\n")
    run("lm/prepare-wikitext-103.sh", "--gpt2-bpe", "--raw-dir", raw, "--no-verify", cwd=work)
    assert lines(word_level / "dict.txt") == ["the 5"]
    out = work / "wikitext-103-gpt2"
    assert lines(out / "data-bin" / "recipe.info") == ["SCHEME=gpt2-bpe"]
    # the binarized dictionary is GPT-2's dict.txt, unchanged
    assert lines(out / "data-bin" / "dict.txt") == lines(raw / "dict.txt")
    for split in ("train", "valid", "test"):
        assert (out / "data-bin" / f"{split}.bin").stat().st_size > 0
    # the encoded text decodes back to the raw text, and the merges were used
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    bpe = get_encoder(str(raw / "encoder.json"), str(raw / "vocab.bpe"))
    encoded = lines(out / "gpt2" / "wiki.train.bpe")
    source = lines(next((out / "extracted").rglob("wiki.train.raw")))
    assert len(encoded) == len(source)
    for ids, line in zip(encoded, source):
        assert bpe.decode([int(i) for i in ids.split()]) == line.strip()
    the_id = str(256 + fixtures.MINI_GPT2_MERGES.index(("Ġt", "he")))
    assert any(the_id in line.split() for line in encoded)


PREPARE_SCRIPTS = [("translation/prepare-wmt14en2de.sh",), ("translation/prepare-wmt16enro.sh",),
                   ("translation/prepare-wmt17.sh", "de-en"), ("lm/prepare-wikitext-103.sh",)]


@pytest.mark.parametrize("script", PREPARE_SCRIPTS, ids=[s[0] for s in PREPARE_SCRIPTS])
def test_unreadable_raw_dir_is_a_one_line_error(script, tmp_path):
    proc = run(script[0], *script[1:], "--raw-dir", tmp_path / "nowhere", cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0
    assert proc.stderr == (f"{Path(script[0]).name}: error: --raw-dir={tmp_path / 'nowhere'}: not a readable folder; "
                           "allowed: --raw-dir FOLDER, a folder that exists\n")


def test_prepare_dry_run_lists_downloads_and_changes_nothing(raw_wmt, tmp_path):
    expected = {
        "translation/prepare-wmt14en2de.sh": ["wmt14-dev.tgz (md5:88ba3fc6", "test-full.tgz"],
        "translation/prepare-wmt16enro.sh": ["wmt16-dev.tgz", "wmt16-test.tgz",
                                             "training-parallel-ep-v8.tgz (md5:07b77f254d189a5bfb7b43b7fc489716"],
        "translation/prepare-wmt17.sh": ["wmt17-dev.tgz", "wmt17-test.tgz", "training-parallel-nc-v12.tgz"],
    }
    for script, names in expected.items():
        args = ["zh-en", "--paper"] if script.endswith("wmt17.sh") else []
        proc = run(script, *args, "--raw-dir", raw_wmt, "--work-dir", "dry", "--dry-run", cwd=tmp_path)
        for name in names:
            assert f"{raw_wmt}/{name}" in proc.stdout, (script, proc.stdout)
        assert "download https://" in proc.stdout
        assert not (tmp_path / "dry").exists(), script
    # the WMT17 paper setting (the Anthe paper, Sec. 3 and 3.2): WikiText-103's tokenizer, and
    # zh limited to 9G
    assert "wikitext-103-raw-v1.zip (sha1:86f2375181b9247049d9c9205fad2b71b274b568, present)" in proc.stdout
    assert "UNv1.0.en-zh.tar.gz (no published checksum, missing)" in proc.stdout
    assert f"pair cap: none; size cap: 9G = {9 * 1024**3} bytes\n" in proc.stderr
    proc = run("lm/prepare-wikitext-103.sh", "--work-dir", "dry", "--dry-run", cwd=tmp_path)
    assert "download https://wikitext.smerity.com/wikitext-103-v1.zip" in proc.stdout
    assert not (tmp_path / "dry").exists()


def test_wmt16_checks_the_europarl_v8_md5(raw_wmt, tmp_path):
    proc = run("translation/prepare-wmt16enro.sh", "--raw-dir", raw_wmt, "--work-dir", "w", cwd=tmp_path,
               expect_ok=False)
    assert proc.returncode != 0
    assert "training-parallel-ep-v8.tgz: md5 checksum" in proc.stderr and "07b77f254d189a5bfb7b43b7fc489716" in proc.stderr


def test_prepare_replaces_a_data_bin_only_when_the_new_one_is_complete(tmp_path, monkeypatch):
    """A preparation that fails while binarizing leaves the data-bin of an earlier run as it
    was; a --dest-dir holding the run's own inputs is refused before anything is written."""
    raw = fixtures.build_wikitext103(tmp_path / "raw", max_train=30, max_eval=5)
    dest = tmp_path / "wt" / "data-bin"
    dest.mkdir(parents=True)
    (dest / "dict.txt").write_text("earlier 1\n")
    fake = fixtures.install_fake_tools(tmp_path / "fake" / "bin", sys.executable)
    (fake / "fairseq-preprocess").write_text(f"#!{sys.executable}\nimport sys\nsys.exit('preprocess: error: broken')\n")
    (fake / "fairseq-preprocess").chmod(0o755)
    proc = run("lm/prepare-wikitext-103.sh", "--raw-dir", raw, "--work-dir", "wt", "--no-verify", cwd=tmp_path,
               env={"PATH": f"{fake}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}, expect_ok=False)
    assert proc.returncode == 1 and "fairseq-preprocess failed (exit 1): broken" in proc.stderr
    assert lines(dest / "dict.txt") == ["earlier 1"] and [p.name for p in dest.parent.iterdir()
                                                           if p.name.startswith(".")] == []
    for argv, given, input_ in ((["--dest-dir", tmp_path], tmp_path, raw), (["--dest-dir", raw], raw, raw),
                                (["--work-dir", "wt", "--dest-dir", "wt"], tmp_path / "wt", tmp_path / "wt")):
        proc = run("lm/prepare-wikitext-103.sh", "--raw-dir", raw, *argv, "--no-verify", cwd=tmp_path, expect_ok=False)
        assert proc.returncode == 2 and proc.stderr == (
            f"prepare-wikitext-103.sh: error: --dest-dir={given}: would overwrite the input {input_}; allowed: another "
            "folder, not an input of this run\n")
    assert lines(dest / "dict.txt") == ["earlier 1"] and (raw / "wikitext-103-v1.zip").is_file()


# ---------------------------------------------------------------------------------------------
# training (CPU smoke mode) and evaluation

def _smoke_train(script: str, data: Path, save_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = run(script, data, "--cpu-smoke", "--save-dir", save_dir, *extra, cwd=save_dir.parent)
    assert (save_dir / "checkpoint_last.pt").is_file() and (save_dir / "checkpoint_1_2.pt").is_file()
    assert re.search(r"num_updates[ =]2\b", proc.stdout + proc.stderr)
    return proc


@pytest.fixture(scope="module")
def anthe_checkpoints(wmt14, work) -> Path:
    save_dir = work / "ckpt-anthe"
    _smoke_train("translation/train-anthe.sh", wmt14 / "data-bin", save_dir)
    return save_dir


def test_train_refuses_a_save_dir_of_another_dataset(anthe_checkpoints, wmt14, work):
    """The default --save-dir is per architecture: a second dataset must not resume (or take as
    finished) the first one's checkpoint_last.pt. The same dataset still resumes."""
    script = "translation/train-anthe.sh"
    trained = (anthe_checkpoints / "checkpoint_last.pt").stat().st_mtime_ns
    assert lines(anthe_checkpoints / "recipe.data") == [str((wmt14 / "data-bin").resolve())]
    again = run(script, wmt14 / "data-bin", "--dry-run", "--save-dir", anthe_checkpoints, cwd=work)
    assert "fairseq-train" in again.stdout
    other = work / "other-pair" / "data-bin"
    other.parent.mkdir(exist_ok=True)
    if not other.exists():
        os.symlink(ende_data_bin(), other)
    for argv in (["--dry-run"], ["--cpu-smoke"]):
        proc = run(script, other, *argv, "--save-dir", anthe_checkpoints, cwd=work, expect_ok=False)
        assert proc.returncode == 2 and proc.stderr == (
            f"train-anthe.sh: error: --save-dir={anthe_checkpoints}: holds a run on {(wmt14 / 'data-bin').resolve()} "
            f"that fairseq would resume on {other.resolve()}; allowed: a --save-dir of its own for this data-bin (or "
            f"delete {anthe_checkpoints}/recipe.data to continue that model on it)\n")
    assert (anthe_checkpoints / "checkpoint_last.pt").stat().st_mtime_ns == trained
    assert lines(anthe_checkpoints / "recipe.data") == [str((wmt14 / "data-bin").resolve())]
    # a save-dir whose checkpoint_last.pt is another arch's: refused, and both fixes work
    proc = run(script, wmt14 / "data-bin", "--arch", "anthe_base_nopatt", "--dry-run", "--save-dir", anthe_checkpoints,
               cwd=work, expect_ok=False)
    assert proc.stderr == (f"train-anthe.sh: error: --save-dir={anthe_checkpoints}: its checkpoint_last.pt is a "
                           "anthe_base model, which fairseq would resume as anthe_base_nopatt; allowed: --arch "
                           "anthe_base (to go on training it), or a --save-dir of its own\n")
    run(script, wmt14 / "data-bin", "--arch", "anthe_base", "--dry-run", "--save-dir", anthe_checkpoints, cwd=work)
    run(script, wmt14 / "data-bin", "--arch", "anthe_base_nopatt", "--dry-run", "--save-dir", work / "own", cwd=work)
    assert not (work / "own").exists()


def _report(out: str) -> dict[str, str]:
    """The 'key: value' / 'key = value' lines of evaluate.sh's results block."""
    found = {}
    for line in out.splitlines():
        match = re.match(r"(tokenization of tokenized BLEU|BLEU \(tokenized\)|perplexity \(fairseq[^)]*\))"
                         r"(?:: | = )(.*)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _sacremoses_tokenize(lang: str, text_lines: list[str]) -> list[str]:
    from sacremoses import MosesTokenizer
    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in text_lines]


def test_train_and_evaluate_anthe_translation(anthe_checkpoints, wmt14, work):
    proc = run("translation/evaluate.sh", wmt14 / "data-bin", anthe_checkpoints, "--avg", "2", "--lenpens", "0.8 1.2",
               "--batch-size", "64", "--cpu", "--max-len-a", "0", "--max-len-b", "8", cwd=work)
    out = proc.stdout
    assert "got no hypothesis" not in proc.stderr  # 60 sentences: not a multiple of 8
    assert re.search(r"valid lenpen 0\.8: tokenized BLEU \d+\.\d+", out)
    assert re.search(r"valid lenpen 1\.2: tokenized BLEU \d+\.\d+", out)
    report = _report(out)
    assert re.fullmatch(r"\d+\.\d+", report["BLEU (tokenized)"])
    assert report["tokenization of tokenized BLEU"] == "Moses tokenizer -a + compound splitting (German target)"
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|nrefs:1\|.*tok:13a.*= \d+\.\d+", out)
    # the averaged files are named, oldest first; the average is kept next to the results
    eval_dir = anthe_checkpoints / "eval" / "average_last2"
    assert f"average of: {anthe_checkpoints}/checkpoint_1_1.pt {anthe_checkpoints}/checkpoint_1_2.pt" in out
    assert "is the average of checkpoint_1_1.pt checkpoint_1_2.pt" in proc.stderr
    assert (anthe_checkpoints / "eval" / "average_last2.pt").is_file()
    # fairseq's masked per-token perplexity of valid and test, beside BLEU (the Anthe metric)
    ppl = re.fullmatch(r"valid ([0-9.]+), test ([0-9.]+)",
                       report["perplexity (fairseq, per target token, padding excluded)"])
    assert ppl and all(1.0 < float(x) < 1e6 for x in ppl.groups())
    assert (eval_dir / "results.txt").read_text(encoding="utf-8").strip() == out[out.index("model: "):].strip()
    lenpen = re.search(r"best length penalty on valid: (\S+)", out).group(1)
    assert lenpen in ("0.8", "1.2")
    assert len(lines(eval_dir / f"test.lenpen{lenpen}.detok")) == EVAL_COUNT
    # both sides were compound-split Moses tokens (hyphens split as "@ ##AT##-##AT## @")
    for side in ("hyp", "ref"):
        content = (eval_dir / f"test.lenpen{lenpen}.{side}.tok").read_text(encoding="utf-8")
        assert len(content.splitlines()) == EVAL_COUNT and "@-@" not in content
    # references: Moses-tokenized only, as fairseq's compound_split_bleu.sh sees them (no
    # punctuation normalisation: German quotes and dashes stay as written)
    raw = lines(wmt14 / "data-bin" / "test.raw.de")
    expected = [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line) for line in _sacremoses_tokenize("de", raw)]
    assert lines(eval_dir / f"test.lenpen{lenpen}.ref.tok") == expected
    assert any("\u2026" in line for line in expected)  # normalisation would have made "..." of these


def test_average_checkpoints_is_the_mean(anthe_checkpoints, tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import average_checkpoints as averager
    inputs = [anthe_checkpoints / "checkpoint_1_1.pt", anthe_checkpoints / "checkpoint_1_2.pt"]
    out = tmp_path / "avg.pt"
    assert averager.main(["--inputs", *map(str, inputs), "--output", str(out)]) == 0
    states = [averager.load_checkpoint(str(p))["model"] for p in inputs]
    averaged = averager.load_checkpoint(str(out))
    assert "last_optimizer_state" not in averaged
    changed = 0
    for key, value in averaged["model"].items():
        if torch.is_tensor(value) and torch.is_floating_point(value):
            torch.testing.assert_close(value, (states[0][key] + states[1][key]) / 2)
            changed += int(not torch.equal(states[0][key], states[1][key]))
    assert changed > 0, "two updates should have changed some weights"


def test_train_and_evaluate_subformer_on_sentencepiece_data(wmt17, work):
    data = wmt17[0] / "data-bin"
    save_dir = work / "ckpt-subformer"
    _smoke_train("translation/train-subformer.sh", data, save_dir, "--arch", "subformer_small")
    proc = run("translation/evaluate.sh", data, save_dir / "checkpoint_last.pt", "--lenpens", "1.0", "--batch-size",
               "64", "--cpu", "--max-len-a", "0", "--max-len-b", "8", cwd=work)
    report = _report(proc.stdout)
    assert re.fullmatch(r"\d+\.\d+", report["BLEU (tokenized)"])
    # an English target: no compound splitting, and the report says so
    assert report["tokenization of tokenized BLEU"] == "Moses tokenizer -a, no compound splitting (target en)"
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|.*= \d+\.\d+", proc.stdout)
    eval_dir = save_dir / "eval" / "checkpoint_last"
    # one length penalty: used as it is, valid is not translated
    assert "lenpen 1.0 (the only value of --lenpens: valid not translated)" in proc.stdout
    assert not list(eval_dir.glob("valid.*"))
    hyp = lines(eval_dir / "test.lenpen1.0.detok")
    assert len(hyp) == EVAL_COUNT and not any("\u2581" in h for h in hyp)  # pieces were decoded
    refs = lines(eval_dir / "test.lenpen1.0.ref.tok")
    assert refs == _sacremoses_tokenize("en", lines(data / "test.raw.en"))
    assert any("@-@" in line for line in refs)  # hyphens the German rule would have split


def test_compound_splitting_only_for_german(tmp_path):
    """Romanian hyphenated clitics (s-a, într-o) must stay whole for ro, en, ...; only a German
    target gets the WMT14 en-de compound splitting."""
    (tmp_path / "ro").write_text("Ea s-a dus într-o zi la piață.\n", encoding="utf-8")
    (tmp_path / "de").write_text("Das Know-how der Berlin-Reise\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NUM_WORKERS", "1")
        for lang in ("ro", "de"):
            text.bleu_tokenize(lang, str(tmp_path / lang), str(tmp_path / f"{lang}.tok"))
    ro, de = (tmp_path / "ro.tok").read_text(), (tmp_path / "de.tok").read_text()
    assert "##AT##" not in ro and "s @-@ a" in ro
    assert "Know @ ##AT##-##AT## @ how" in de
    assert [text.bleu_tokenization_name(lang) for lang in ("ro", "de")] == [
        "Moses tokenizer -a, no compound splitting (target ro)", "Moses tokenizer -a + compound splitting (German target)"]


LM_RECIPES = [
    ("lm/train-subformer-lm.sh", "subformer_lm_wiki103_83m"),
    ("lm/train-stlm.sh", "stlm_tied"),
    ("lm/train-skipless.sh", "skipless_lm"),
    ("lm/train-anthe-lm.sh", "anthe_lm_gpt2_small"),
]


@pytest.mark.parametrize("script,arch", LM_RECIPES, ids=[a for _, a in LM_RECIPES])
def test_train_language_model_smoke(script, arch, wikitext, work):
    assert fixtures.recipe_module(script).RECIPE.arch == arch  # the recipe's default arch
    save_dir = work / f"ckpt-{arch}"
    _smoke_train(script, wikitext / "data-bin", save_dir)
    if arch.startswith("subformer"):
        _evaluate_lm_checks(wikitext / "data-bin", save_dir, work)


def _evaluate_lm_checks(data: Path, save_dir: Path, work: Path) -> None:
    """evaluate-lm.sh: defaults from the checkpoint, and no perplexity of a skipped subset."""
    # blocks longer than the model: a clear error naming the option, not a perplexity of 1.00
    proc = run("lm/evaluate-lm.sh", data, save_dir / "checkpoint_last.pt", "--cpu", "--tokens-per-sample", "3072",
               "--context-window", "2560", cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "Perplexity" not in proc.stdout
    assert proc.stderr == ("evaluate-lm.sh: error: --tokens-per-sample=3072: the model accepts at most 64 positions; "
                           "allowed: --tokens-per-sample 64 or less\n")
    # complete-line blocks cannot hold WikiText lines longer than 64 tokens: refused before
    # fairseq-eval-lm runs (it would score each such line as a block of its own, or skip it);
    # a longer block is no suggestion where the model has no room for it
    proc = run("lm/evaluate-lm.sh", data, save_dir / "checkpoint_last.pt", "--cpu", "--sample-break-mode", "complete",
               cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "test: Loss" not in proc.stdout
    assert re.fullmatch(r"evaluate-lm\.sh: error: --sample-break-mode complete: the longest line of test holds \d+ "
                        r"tokens, more than a block of --tokens-per-sample 64; allowed: --sample-break-mode none "
                        r"\(blocks cross lines\)\n", proc.stderr), proc.stderr
    # by default the blocks cross line boundaries when a line does not fit in one (what the
    # refusal proposes); the defaults are read from the checkpoint (64 positions)
    proc = run("lm/evaluate-lm.sh", data, save_dir, "--avg", "2", "--cpu", cwd=work)
    assert "blocks cross line boundaries (--sample-break-mode none)" in proc.stderr
    assert ("blocks of 64 tokens (the training block: tokens_per_sample of the checkpoint's task; none), "
            "context window 54 (model positions: 64, training block: 64)") in proc.stderr
    match = re.search(r"test: Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+) \((\d+) tokens", proc.stdout)
    assert match, proc.stdout[-2000:]
    loss, ppl = float(match.group(1)), float(match.group(2))
    assert ppl == pytest.approx(2 ** loss, rel=1e-3) and ppl > 1.0
    test_tokens = sum(len(line.split()) + 1 for line in lines(next((work / "wikitext" / "extracted").rglob("wiki.test.tokens"))))
    assert int(match.group(3)) == test_tokens  # every token of the test set, eos included
    assert (save_dir / "eval" / "average_last2.pt").is_file()
    assert lines(save_dir / "eval" / "average_last2.test.results.txt") == proc.stdout.splitlines()
    assert "Perplexity" in (save_dir / "eval" / "average_last2.test.eval-lm.log").read_text()
    assert proc.stdout.splitlines() == [match.group(0) + proc.stdout.split(match.group(0))[1].strip()]


# ---------------------------------------------------------------------------------------------
# evaluate.sh with fake fairseq tools: the scoring protocol per target language

@pytest.fixture
def fakes(tmp_path):
    """(env, fake_dir): fake fairseq tools first on PATH (recipes_fixtures.install_fake_tools)."""
    fake_dir = tmp_path / "fake"
    fixtures.install_fake_tools(fake_dir / "bin", sys.executable)
    env = {"PATH": f"{fake_dir / 'bin'}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FAKE_DIR": str(fake_dir)}
    return env, fake_dir


def _translation_data(folder: Path, tgt: str, valid: list[str], test: list[str], scheme: str = "sentencepiece",
                      **info: str) -> Path:
    """A data-bin as far as evaluate.sh reads it: recipe.info, the untokenized references and the
    binarized valid and test sets (as many sentences as references)."""
    folder.mkdir(parents=True)
    (folder / "recipe.info").write_text("".join(f"{k}={v}\n" for k, v in
                                                {"SRC": "en", "TGT": tgt, "SCHEME": scheme, **info}.items()))
    for split, refs in (("valid", valid), ("test", test)):
        (folder / f"{split}.raw.{tgt}").write_text("".join(line + "\n" for line in refs), encoding="utf-8")
        fixtures.write_indexed(folder / f"{split}.en-{tgt}.en", [[4, 2]] * len(refs))
    return folder


def _model(path: Path, tgt: str = "de", **fields) -> Path:
    """A checkpoint file of a translation model from en to TGT (only its configuration is read)."""
    return fixtures.stand_in_checkpoint(path, "anthe_base", "translation", source_lang="en", target_lang=tgt, **fields)


def _damage(sentences: list[str], every: int) -> list[str]:
    """Every EVERY-th character of each sentence replaced (a translation of known quality)."""
    return ["".join("的" if i % every == every - 1 else c for i, c in enumerate(s)) for s in sentences]


def test_scoring_protocol_per_target_language():
    """The table of examples/translation/README.md: sacreBLEU's own tokenizer, and no tokenized
    BLEU, for the targets the Moses tokenizer does not segment."""
    assert [(lang, text.sacrebleu_tokenizer(lang), text.moses_segments(lang)) for lang in ("de", "en", "ro", "zh", "ja")] \
        == [("de", "13a", True), ("en", "13a", True), ("ro", "13a", True), ("zh", "zh", False), ("ja", "ja-mecab", False)]
    readme = (EXAMPLES / "translation" / "README.md").read_text()
    for row in ("| zh | not computed", "| `zh` | sacreBLEU `-tok zh` on valid |", "| `ja-mecab`",
                "| de | Moses `-a` on both sides"):
        assert row in readme, row


def test_evaluate_chinese_target_uses_sacrebleu_zh(fakes, tmp_path):
    """The Moses tokenizer does not segment Chinese (tokenized BLEU is 0.00 for any imperfect
    translation): the length penalty is chosen on sacreBLEU with its zh tokenizer, and the
    report scores with it. Here lenpen 0.6 translates much better than 1.0, listed first."""
    env, fake_dir = fakes
    valid, test = fixtures.chinese_sentences(40, seed=1), fixtures.chinese_sentences(40, seed=2)
    data = _translation_data(tmp_path / "data", "zh", valid, test)
    (fake_dir / "valid.lenpen1.0.hyp").write_text("\n".join(_damage(valid, 2)) + "\n", encoding="utf-8")
    (fake_dir / "valid.lenpen0.6.hyp").write_text("\n".join(_damage(valid, 9)) + "\n", encoding="utf-8")
    (fake_dir / "test.hyp").write_text("\n".join(_damage(test, 9)) + "\n", encoding="utf-8")
    proc = run("translation/evaluate.sh", data, _model(tmp_path / "model.pt", "zh"), "--lenpens", "1.0 0.6",
               cwd=tmp_path, env=env)
    import sacrebleu
    scores = {lp: sacrebleu.corpus_bleu(lines(fake_dir / f"valid.lenpen{lp}.hyp"), [valid], tokenize="zh").score
              for lp in ("1.0", "0.6")}
    assert scores["0.6"] > scores["1.0"] + 20
    assert f"valid lenpen 0.6: sacreBLEU (-tok zh) {scores['0.6']:.2f}" in proc.stdout
    assert "best length penalty on valid: 0.6" in proc.stdout
    assert fixtures.option_value(fixtures.fake_calls(fake_dir, "fairseq-generate")[-1], "--lenpen") == "0.6"
    test_score = sacrebleu.corpus_bleu(_damage(test, 9), [test], tokenize="zh").score
    assert re.search(rf"sacreBLEU \(detokenized\): BLEU\|.*tok:zh\|.* = {test_score:.2f} ", proc.stdout)
    assert "BLEU (tokenized): not computed" in proc.stdout and "BLEU (tokenized) =" not in proc.stdout


def test_evaluate_single_length_penalty_translates_no_valid_and_shows_progress(fakes, tmp_path):
    """--lenpens 1.0 is used as it is (valid is not decoded); the translation logs how far it
    got while it runs; --lenpens=VALUE and --cpu reach the tools."""
    env, fake_dir = fakes
    refs = fixtures.bundled_lines("test", "de", 0, 30)
    data = _translation_data(tmp_path / "data", "de", refs, refs)
    (fake_dir / "test.hyp").write_text("\n".join(refs) + "\n", encoding="utf-8")
    proc = run("translation/evaluate.sh", data, _model(tmp_path / "model.pt"), "--lenpens=1.0", "--cpu", cwd=tmp_path,
               env={**env, "FAKE_GENERATE_DELAY": "0.1", "PROGRESS_INTERVAL": "1"})
    calls = fixtures.fake_calls(fake_dir, "fairseq-generate")
    assert [fixtures.option_value(c, "--gen-subset") for c in calls] == ["test"]
    assert "--cpu" in calls[0] and "--cpu" in fixtures.fake_calls(fake_dir, "fairseq-validate")[0]
    progress = re.findall(r"test, length penalty 1.0: sentences translated: (\d+) of 30", proc.stderr)
    assert progress and 0 < int(progress[0]) < 30, proc.stderr
    assert _report(proc.stdout)["BLEU (tokenized)"] == "100.00"


def test_evaluate_refuses_options_it_sets_itself(tmp_path):
    data = _translation_data(tmp_path / "data", "de", ["a"], ["a"])
    for argv, message in ((["--lenpen", "0.6"], "--lenpen: the length penalty is chosen on valid among --lenpens; "
                                                "allowed: --lenpens with one value (e.g. --lenpens 1.0), which is "
                                                "used as it is"),
                          (["--gen-subset=valid"], "--gen-subset: evaluate.sh chooses the length penalty on valid and "
                                                   "scores test; allowed: no --gen-subset (fairseq-generate itself "
                                                   "scores another subset)"),
                          (["--source-lang", "de"], "--source-lang: the languages are read from DATA_BIN/recipe.info; "
                                                    "allowed: no language option (the data-bin prepared for the "
                                                    "direction to score)"),
                          (["--paper", "--lenpens", "1.0"], "--lenpens=1.0: --paper tunes over 0.0 0.2 ... 2.0, as the "
                                                            "Subformer paper; allowed: no --lenpens, or no --paper"),
                          (["--lenpens", " "], "--lenpens: no value; allowed: numbers >= 0 separated by spaces, e.g. "
                                               "--lenpens '1.0 1.2'"),
                          (["--lenpens", "0.6 x"], "--lenpens=0.6 x: 'x' is not a number >= 0; allowed: numbers >= 0 "
                                                   "separated by spaces, e.g. --lenpens '1.0 1.2'")):
        proc = run("translation/evaluate.sh", data, tmp_path, *argv, cwd=tmp_path, expect_ok=False)
        assert proc.returncode == 2 and proc.stderr == f"evaluate.sh: error: {message}\n", (argv, proc.stderr)
    assert not (tmp_path / "eval").exists()


def test_evaluate_names_the_shipped_reference_tokens(wmt14_google, fakes, tmp_path):
    """Google's WMT14 ships its tokenized references (Moses without -a): tokenized BLEU scores
    against them (as fairseq's compound_split_bleu.sh does on the binarized references),
    compound-split, and the report says that is the tokenization, not Moses -a."""
    env, fake_dir = fakes
    shipped = lines(wmt14_google / "test.tok.de")
    for subset in ("valid", "test"):
        (fake_dir / f"{subset}.hyp").write_text("\n".join(lines(wmt14_google / f"{subset}.tok.de")) + "\n",
                                                encoding="utf-8")
    proc = run("translation/evaluate.sh", wmt14_google, _model(tmp_path / "model.pt"), "--lenpens", "1.0", cwd=tmp_path,
               env=env)
    report = _report(proc.stdout)
    assert report["BLEU (tokenized)"] == "100.00"
    assert report["tokenization of tokenized BLEU"] == (
        "Moses tokenizer without -a (Google's preprocessing: the data's own test.tok.de) "
        "+ compound splitting (German target)")
    refs = lines(tmp_path / "eval" / "model" / "test.lenpen1.0.ref.tok")
    assert refs == [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line) for line in shipped]
    assert refs != _sacremoses_tokenize("de", lines(wmt14_google / "test.raw.de"))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_evaluate_failed_or_refused_run_leaves_the_earlier_results(fakes, tmp_path):
    """results.txt is per model (eval/NAME/) and written only when every step succeeded; a run
    that fails (its reason and log on one line) or is refused leaves the outputs of the earlier
    run as they were; a missing test reference is found before anything is translated."""
    env, fake_dir = fakes
    refs = fixtures.bundled_lines("test", "de", 0, 10)
    data = _translation_data(tmp_path / "data", "de", refs, refs)
    for subset in ("valid", "test"):
        (fake_dir / f"{subset}.hyp").write_text("\n".join(refs) + "\n", encoding="utf-8")
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        run("translation/evaluate.sh", data, _model(tmp_path / name), "--lenpens", "1.0", cwd=tmp_path, env=env)
    results = {name: tmp_path / "eval" / name / "results.txt" for name in ("checkpoint_best", "checkpoint_last")}
    assert all(f"model: {tmp_path}/{name}.pt" in path.read_text() for name, path in results.items())
    before = _tree(tmp_path / "eval")
    model = str(tmp_path / "checkpoint_best.pt")
    (fake_dir / "test.hyp").unlink()  # fairseq-generate fails
    proc = run("translation/evaluate.sh", data, model, "--lenpens", "1.0", cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 1 and proc.stdout.startswith("length penalty: 1.0")
    error = proc.stderr.splitlines()[-1]
    assert re.fullmatch(r"evaluate\.sh: error: fairseq-generate failed \(exit 1\): FileNotFoundError: .*test\.hyp'; "
                        r"see (\S+)/test\.lenpen1\.0\.err", error), error
    assert os.path.isfile(error.split("; see ")[1]) and _tree(tmp_path / "eval") == before
    (fake_dir / "test.hyp").write_text("\n".join(refs) + "\n", encoding="utf-8")
    proc = run("translation/evaluate.sh", data, model, "--beam", "0x", cwd=tmp_path, env=env, expect_ok=False)
    assert proc.stderr == ("evaluate.sh: error: --beam=0x: not a whole number >= 1; allowed: a whole number >= 1, or "
                           "drop --beam (default 5)\n")
    calls = len(fixtures.fake_calls(fake_dir, "fairseq-generate"))
    (data / "test.raw.de").unlink()
    proc = run("translation/evaluate.sh", data, model, cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == (
        f"evaluate.sh: error: {data}/test.raw.de: missing or empty: the untokenized test references; allowed: a "
        "data-bin of a prepare script or scripts/binarize_bundled.py, which write them next to it\n")
    assert len(fixtures.fake_calls(fake_dir, "fairseq-generate")) == calls and _tree(tmp_path / "eval") == before


def test_evaluate_reads_a_reference_without_a_final_newline(fakes, tmp_path):
    """The last line of a reference file without a final newline is a sentence like the
    others: one hypothesis per reference line, the same score as with the newline; the note
    of a Romanian target written by prepare-wmt16enro.sh is in the report."""
    env, fake_dir = fakes
    refs = fixtures.bundled_lines("test", "de", 0, 12)
    data = _translation_data(tmp_path / "data", "de", refs, refs, REF_NOTE="without diacritics")
    (data / "test.raw.de").write_text("\n".join(refs), encoding="utf-8")  # no final newline
    (fake_dir / "test.hyp").write_text("\n".join(refs) + "\n", encoding="utf-8")
    proc = run("translation/evaluate.sh", data, _model(tmp_path / "model.pt"), "--lenpens", "1.0", cwd=tmp_path, env=env)
    report = _report(proc.stdout)
    assert report["BLEU (tokenized)"] == "100.00" and "warning" not in proc.stderr
    assert "references: without diacritics" in proc.stdout
    assert len(lines(tmp_path / "eval" / "model" / "test.lenpen1.0.hyp")) == 12


def test_evaluate_checks_the_checkpoint_before_writing(tmp_path):
    data = tmp_path / "data"
    _translation_data(data, "ro", ["o propozitie"], ["o propozitie"], scheme="moses-bpe")
    fixtures.write_indexed(data / "test", [[5, 6, 7, 8, 2], [9, 10, 2]])  # evaluate-lm.sh checks the subset first
    (data / "dict.txt").write_text("a 1\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    proc = run("translation/evaluate.sh", data, ckpt, cwd=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == (f"evaluate.sh: error: CKPT={ckpt}: a folder without "
                                                    "checkpoint_best.pt; allowed: a checkpoint file, or --avg N to "
                                                    "average the folder's last N\n")
    assert not (ckpt / "eval").exists()
    # --avg N on a folder without checkpoints: one line naming the option, no traceback
    for script in ("translation/evaluate.sh", "lm/evaluate-lm.sh"):
        proc = run(script, data, ckpt, "--avg", "3", cwd=tmp_path, expect_ok=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert proc.stderr.splitlines() == [
            f"{Path(script).name}: error: --avg=3: {ckpt} holds 0 update checkpoints (checkpoint_E_U.pt) and 0 epoch "
            "checkpoints (checkpointE.pt), fewer than 3; allowed: a checkpoint file"], script
        assert not (ckpt / "eval").exists()
    proc = subprocess.run([sys.executable, str(REPO / "scripts/average_checkpoints.py"), "--inputs", str(ckpt),
                           "--num-update-checkpoints", "3", "--output", str(tmp_path / "avg.pt")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"average_checkpoints: error: --inputs: {ckpt} holds 0 matching checkpoints, 3 requested"


def test_avg_picks_checkpoints_by_number_and_names_them(tmp_path, capsys):
    """--avg N averages the N highest-numbered checkpoints, compared as numbers (checkpoint10
    after checkpoint9), and says which files it averaged."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for epoch in range(1, 11):
        torch.save({"model": {"w": torch.tensor([float(epoch)])}, "cfg": {}}, ckpt / f"checkpoint{epoch}.pt")
    model = evaluation.resolve(str(ckpt), "2", str(tmp_path / "eval"))
    assert model.averaged == [f"{ckpt}/checkpoint9.pt", f"{ckpt}/checkpoint10.pt"]
    assert model.path == f"{tmp_path}/eval/average_last2.pt" and not (tmp_path / "eval").exists()
    model.write_average(str(tmp_path / "avg.pt"))
    assert f"--avg 2: {model.path} is the average of checkpoint9.pt checkpoint10.pt (in {ckpt})" in capsys.readouterr().err
    from slim_fairseq_lab import checkpoints
    assert checkpoints.load(str(tmp_path / "avg.pt"))["model"]["w"].item() == 9.5


# ---------------------------------------------------------------------------------------------
# evaluate-lm.sh with a fake fairseq-eval-lm

LM_LINES = [[5, 6, 7, 8, 2], [9, 10, 2], [5, 2]]  # token ids of a 3-line subset, eos (2) included


@pytest.fixture
def lm_eval(fakes, tmp_path):
    """(env, fake_dir, data, ckpt): a binarized 3-line test and valid set, and a checkpoint of a
    model with 256 positions trained on 32-token blocks (only its configuration is read)."""
    env, fake_dir = fakes
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.txt").write_text("a 1\n")
    for subset in ("valid", "test"):
        fixtures.write_indexed(data / subset, LM_LINES)
    ckpt = tmp_path / "ckpt" / "checkpoint_best.pt"
    ckpt.parent.mkdir()
    torch.save({"cfg": {"model": {"max_target_positions": 256}, "task": {"tokens_per_sample": 32}},
                "model": {}}, ckpt)
    return env, fake_dir, data, ckpt


SUBSET_TOKENS = sum(len(ids) for ids in LM_LINES)


def test_subset_tokens_reads_both_index_layouts(tmp_path):
    """subset_tokens (the count evaluate-lm.sh checks fairseq-eval-lm's against, and the longest
    line, which decides the blocks) reads fairseq's mmap index (fairseq-preprocess' default) and
    its legacy one, without loading fairseq."""
    from fairseq.data import indexed_dataset
    fixtures.write_indexed(tmp_path / "test", LM_LINES)
    builder = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "valid.bin"))
    for ids in LM_LINES + [[7, 7, 2]]:
        builder.add_item(torch.tensor(ids, dtype=torch.int64))
    builder.finalize(str(tmp_path / "valid.idx"))
    assert indexed_dataset.infer_dataset_impl(str(tmp_path / "valid")) == "cached"
    longest = max(len(ids) for ids in LM_LINES)
    assert text.subset_tokens(str(tmp_path), "test") == (SUBSET_TOKENS, longest)
    assert text.subset_tokens(f"{tmp_path}:/elsewhere", "valid") == (SUBSET_TOKENS + 3, longest)


def _eval_lm_log(fake_dir: Path, tokens: int, ppl: float = 71.37, rc: int = 0) -> None:
    """What fairseq-eval-lm prints (to stdout) for a run that scored TOKENS tokens."""
    import math
    (fake_dir / "eval-lm.out").write_text(
        "INFO | fairseq_cli.eval_lm | loading model(s)\n"
        f"INFO | fairseq_cli.eval_lm | Evaluated {tokens:,} tokens in 1.0s (100.00 tokens/s)\n"
        f"INFO | fairseq_cli.eval_lm | Loss (base 2): {math.log2(ppl):.4f}, Perplexity: {ppl:.2f}\n")
    (fake_dir / "eval-lm.rc").write_text(str(rc))


def test_evaluate_lm_prints_only_a_verified_perplexity(lm_eval, tmp_path):
    """fairseq's log (which holds a perplexity even when the run fails or scored part of the
    subset) never reaches stdout; a failed or refused run leaves the results of an earlier run
    as they were; the results are one file per model and subset."""
    env, fake_dir, data, ckpt = lm_eval
    script = "lm/evaluate-lm.sh"
    _eval_lm_log(fake_dir, SUBSET_TOKENS, ppl=45.5)
    for subset in ("valid", "test"):
        proc = run(script, data, ckpt, "--subset", subset, cwd=tmp_path, env=env)
        assert proc.stdout.startswith(f"{subset}: Loss (base 2): 5.5078, Perplexity: 45.50 ({SUBSET_TOKENS} tokens;")
        assert len(proc.stdout.splitlines()) == 1 and "INFO" not in proc.stdout
    results = {subset: ckpt.parent / f"checkpoint_best.{subset}.results.txt" for subset in ("valid", "test")}
    assert all(path.read_text().startswith(f"{subset}: Loss") for subset, path in results.items())
    assert (ckpt.parent / "checkpoint_best.test.eval-lm.log").read_text().startswith("INFO")
    before = _tree(ckpt.parent)
    # the run fails after fairseq logged a perplexity: nothing on stdout, the reason on stderr
    _eval_lm_log(fake_dir, 17_500, rc=1)
    proc = run(script, data, ckpt, cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert re.search(r"fairseq-eval-lm failed \(exit 1\): INFO \| fairseq_cli.eval_lm \| Loss .*; see \S+/eval-lm.log$",
                     proc.stderr), proc.stderr
    # a run that scored part of the subset: an error naming both counts, no perplexity
    _eval_lm_log(fake_dir, SUBSET_TOKENS - 3)
    proc = run(script, data, ckpt, "--subset=valid", cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert f"evaluated {SUBSET_TOKENS - 3} tokens, but valid holds {SUBSET_TOKENS}" in proc.stderr
    # shards of the subset are refused before fairseq-eval-lm runs, in either spelling
    calls = len(fixtures.fake_calls(fake_dir, "fairseq-eval-lm"))
    shard_id = ("--shard-id: evaluate-lm.sh scores the whole subset; allowed: no --shard-id (fairseq-eval-lm itself "
                "scores a shard)")
    for argv, line in ((["--num-shards", "2", "--shard-id", "0"], shard_id),
                       (["--num-shards=2"], "--num-shards=2: evaluate-lm.sh scores the whole subset, not a shard of "
                                            "it; allowed: no --num-shards (fairseq-eval-lm itself scores a shard)"),
                       (["--shard-id=1"], shard_id)):
        proc = run(script, data, ckpt, *argv, cwd=tmp_path, env=env, expect_ok=False)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == f"evaluate-lm.sh: error: {line}\n", argv
    assert len(fixtures.fake_calls(fake_dir, "fairseq-eval-lm")) == calls
    for refused, line in ((["--tokens-per-sample", "2000"], "--tokens-per-sample=2000: the model accepts at most 256 "
                                                            "positions; allowed: --tokens-per-sample 256 or less"),
                          (["--avg", "x"], "--avg=x: not a whole number >= 1; allowed: a whole number >= 1, or drop "
                                           "--avg (default 1)")):
        proc = run(script, data, ckpt, *refused, cwd=tmp_path, env=env, expect_ok=False)
        assert proc.returncode == 2 and proc.stderr == f"evaluate-lm.sh: error: {line}\n", proc.stderr
    proc = run(script, f"{data}:{data}", ckpt, cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == (
        f"evaluate-lm.sh: error: DATA_BIN={data}:{data}: shards of a data-bin (fairseq's DIR1:DIR2); allowed: one "
        f"data-bin, e.g. {data} (evaluate-lm.sh scores a whole subset; run fairseq-eval-lm itself on each shard)\n")
    assert _tree(ckpt.parent) == before


def test_evaluate_lm_block_defaults_to_the_training_block(lm_eval, tmp_path):
    """A model trained on 32-token blocks with 256 positions is scored on 32-token blocks by
    default (its task's tokens_per_sample), and the log says where the length came from; one
    process (world size 1), whatever fairseq's default."""
    env, fake_dir, data, ckpt = lm_eval
    _eval_lm_log(fake_dir, SUBSET_TOKENS)
    proc = run("lm/evaluate-lm.sh", data, ckpt, cwd=tmp_path, env=env)
    argv = fixtures.fake_calls(fake_dir, "fairseq-eval-lm")[-1]
    assert [fixtures.option_value(argv, o) for o in ("--tokens-per-sample", "--context-window", "--max-tokens",
                                                     "--distributed-world-size")] == ["32", "27", "32", "1"]
    assert "blocks of 32 tokens (the training block: tokens_per_sample of the checkpoint's task" in proc.stderr
    assert "(model positions: 256, training block: 32)" in proc.stderr
    assert "blocks of 32, context 27" in proc.stdout
    run("lm/evaluate-lm.sh", data, ckpt, "--tokens-per-sample=128", cwd=tmp_path, env=env)
    argv = fixtures.fake_calls(fake_dir, "fairseq-eval-lm")[-1]
    assert fixtures.option_value(argv, "--tokens-per-sample") == "128" and argv.count("--tokens-per-sample") == 1


# (the options, the line, the options its "allowed" proposes: they run)
@pytest.mark.parametrize("argv,error,fixed", [
    (["--tokens-per-sample=512"], "evaluate-lm.sh: error: --tokens-per-sample=512: the model accepts at most 256 "
                                  "positions; allowed: --tokens-per-sample 256 or less", ["--tokens-per-sample=256"]),
    (["--tokens-per-sample=64", "--context-window=64"],
     "evaluate-lm.sh: error: --context-window=64: not smaller than --tokens-per-sample 64; allowed: --context-window "
     "63 or less", ["--tokens-per-sample=64", "--context-window=63"]),
    (["--context-window=32"], "evaluate-lm.sh: error: --context-window=32: not smaller than --tokens-per-sample 32; "
                              "allowed: --context-window 31 or less", ["--context-window=31"]),
    (["--max-tokens=16"], "evaluate-lm.sh: error: --max-tokens=16: less than one block of --tokens-per-sample 32 "
                          "tokens; allowed: --max-tokens 32 or more", ["--max-tokens=32"]),
    (["--tokens-per-sample=x"], "evaluate-lm.sh: error: --tokens-per-sample=x: not a whole number >= 1; allowed: a "
                                "whole number >= 1, or drop --tokens-per-sample (its default)", []),
    (["--distributed-world-size=2"], "evaluate-lm.sh: error: --distributed-world-size: evaluate-lm.sh runs one process "
                                     "(several would each score a shard); allowed: no --distributed-world-size", []),
    (["--subset", "test2"], "evaluate-lm.sh: error: --subset=test2: no binarized test2 set in {data} (no readable "
                            "test2.idx); allowed: test|valid", ["--subset", "test"]),
])
def test_evaluate_lm_checks_equals_spelled_options(argv, error, fixed, lm_eval, tmp_path):
    """--name=VALUE gets the same checks as --name VALUE, before fairseq-eval-lm runs; what the
    refusal proposes runs."""
    env, fake_dir, data, ckpt = lm_eval
    proc = run("lm/evaluate-lm.sh", data, ckpt, *argv, cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == error.format(data=data) + "\n", proc.stderr
    assert fixtures.fake_calls(fake_dir, "fairseq-eval-lm") == []
    _eval_lm_log(fake_dir, SUBSET_TOKENS)
    proc = run("lm/evaluate-lm.sh", data, ckpt, *fixed, cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 0 and "Perplexity: 71.37" in proc.stdout, proc.stderr


def test_evaluate_lm_complete_blocks_refusal_proposes_what_it_accepts(lm_eval, tmp_path):
    """Complete-line blocks shorter than the longest line are refused; each change proposed is
    accepted (a block that fits the line, and whose default context window fits the block)."""
    env, fake_dir, data, ckpt = lm_eval
    _eval_lm_log(fake_dir, SUBSET_TOKENS)
    proc = run("lm/evaluate-lm.sh", data, ckpt, "--tokens-per-sample", "4", "--context-window", "2",
               "--sample-break-mode", "complete", cwd=tmp_path, env=env, expect_ok=False)
    assert proc.stderr == ("evaluate-lm.sh: error: --sample-break-mode complete: the longest line of test holds 5 tokens, "
                           "more than a block of --tokens-per-sample 4; allowed: --sample-break-mode none (blocks cross "
                           "lines), or --tokens-per-sample 5 or more (the model has 256 positions)\n")
    for change in (["--tokens-per-sample", "4", "--sample-break-mode", "none"],
                   ["--tokens-per-sample", "5", "--sample-break-mode", "complete"]):
        run("lm/evaluate-lm.sh", data, ckpt, *change, "--context-window", "2", cwd=tmp_path, env=env)
    assert fixtures.option_value(fixtures.fake_calls(fake_dir, "fairseq-eval-lm")[-1], "--sample-break-mode") == "complete"


# ---------------------------------------------------------------------------------------------
# launch modes and --paper (printed, not run: no GPUs here; the GPU count is the test's)

def _data_for(script: str) -> str:
    return wikitext_data_bin() if script.startswith("lm/") else ende_data_bin()


def _dry(script: str, *args: str, tmp_path: Path, gpus: int = 0, with_log: bool = False, expect_ok: bool = True):
    """A --dry-run of SCRIPT on the tests' data-bin of its kind, on a machine that shows GPUS
    GPUs: its command, (command, log), or the process."""
    proc = run(script, _data_for(script), "--dry-run", *args, cwd=tmp_path, gpus=gpus, expect_ok=expect_ok)
    if not expect_ok:
        return proc
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == 1, proc.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
    return (commands[0], proc.stderr) if with_log else commands[0]


def test_launch_modes(tmp_path):
    one_node = _dry("translation/train-subformer.sh", "--gpus", "8", "--fp16", tmp_path=tmp_path)
    # 128K tokens per update = 4096 tokens x 8 GPUs x update-freq 4
    assert "--distributed-world-size 8" in one_node and "--update-freq 4" in one_node
    assert "--fp16" in one_node and "torchrun" not in one_node
    assert "--bert-init" in one_node and "--lr-scheduler inverse_sqrt" in one_node
    # the Subformer paper's update budget with early stopping
    assert "--max-update 250000" in one_node and "--patience 10" in one_node
    multi = _dry("translation/train-anthe.sh", "--gpus", "8", "--nodes", "2", "--node-rank", "1",
                 "--master-addr", "10.0.0.1", "--fp16", tmp_path=tmp_path)
    assert multi.startswith("+ torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1")
    assert "--distributed-world-size 16" in multi and "--fp16" in multi
    assert "--adam-eps 1e-9" in multi and "--patience 10" in multi and "--lr 3.16e-5" in multi
    tcp = _dry("lm/train-subformer-lm.sh", "--gpus", "4", "--nodes", "2", "--node-rank", "1",
               "--init-method", "tcp://10.0.0.1:9999", tmp_path=tmp_path)
    assert "--distributed-init-method tcp://10.0.0.1:9999" in tcp
    assert "--distributed-world-size 8 --distributed-rank 4" in tcp
    assert "--update-freq 3" in tcp  # 73,728 tokens = 3072 x 8 workers x 3, as the original recipe
    user_override = _dry("translation/train-anthe.sh", "--gpus", "1", "--lr", "1e-4", tmp_path=tmp_path)
    assert user_override.index("--lr 1e-4") > user_override.index("--lr 3.16e-5")  # later wins


def test_one_gpu_passes_the_world_size_and_prints_the_batch(tmp_path):
    """--gpus 1 on a machine with several GPUs: fairseq's default world size is every visible
    GPU, which would multiply the batch the update frequency was computed for."""
    command, log = _dry("translation/train-anthe.sh", "--gpus", "1", tmp_path=tmp_path, gpus=4, with_log=True)
    assert re.search(r"--update-freq 7 --distributed-world-size 1( |$)", command)  # 25K / 4096 -> 7
    assert "effective batch: 4096 tokens x update-freq 7 x 1 workers = 28672 tokens per update" in log
    command, log = _dry("translation/train-subformer.sh", "--gpus", "0", tmp_path=tmp_path, with_log=True)
    assert "--cpu" in command and "--distributed-world-size 1" in command
    assert "= 131072 tokens per update" in log
    command, log = _dry("lm/train-stlm.sh", "--gpus", "2", "--update-freq", "3", tmp_path=tmp_path, with_log=True)
    assert "--update-freq 3 --distributed-world-size 2" in command
    assert "8192 tokens x update-freq 3 x 2 workers = 49152 tokens per update" in log


def test_paper_settings(tmp_path):
    # Anthe: 32 sentences per update on one GPU, at most 48 hours
    command, log = _dry("translation/train-anthe.sh", "--paper", "--gpus", "1", tmp_path=tmp_path, with_log=True)
    assert "--batch-size 32 --update-freq 1 --distributed-world-size 1" in command
    assert "--stop-time-hours 48" in command and "--max-tokens" not in command
    assert "32 sentences x update-freq 1 x 1 workers = 32 sentences per update" in log
    command = _dry("translation/train-anthe.sh", "--paper", "--gpus", "2", tmp_path=tmp_path)
    assert "--batch-size 16 --update-freq 1 --distributed-world-size 2" in command
    proc = _dry("translation/train-anthe.sh", "--paper", "--gpus", "3", tmp_path=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == ("train-anthe.sh: error: --paper: 32 sentences per update do not "
                                                    "split evenly over 3 workers; allowed: --gpus and --nodes giving a "
                                                    "number of workers that divides 32, or --batch-size N per worker\n")
    command = _dry("translation/train-anthe.sh", "--paper", "--gpus", "3", "--batch-size", "10", tmp_path=tmp_path)
    assert "--batch-size 10 --update-freq 1 --distributed-world-size 3" in command
    # Subformer: the defaults are the paper's, --paper adds its mixed precision
    command, log = _dry("translation/train-subformer.sh", "--paper", "--gpus", "1", tmp_path=tmp_path, with_log=True)
    assert "--fp16" in command and "--paper: --fp16 (the paper trained with mixed precision)" in log
    # no paper recipe to reproduce: refused, not ignored
    proc = _dry("lm/train-stlm.sh", "--paper", tmp_path=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == ("train-stlm.sh: error: --paper: the STLM report lists no optimiser "
                                                    "settings; allowed: no --paper (the settings of this script, in "
                                                    "--help)\n")
    # evaluation: the Subformer paper scores the best checkpoint, never an average
    data = tmp_path / "data"
    data.mkdir()
    (data / "recipe.info").write_text("SRC=en\nTGT=de\nSCHEME=moses-bpe\n")
    proc = run("translation/evaluate.sh", data, tmp_path, "--paper", "--avg", "5", cwd=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == ("evaluate.sh: error: --avg=5: --paper scores the best checkpoint, "
                                                    "as the Subformer paper; allowed: no --avg, or no --paper\n")


def test_paper_batch_is_what_fairseq_gets(tmp_path):
    """With --paper the printed batch is the one on fairseq's command line: --batch-size replaces
    the paper's sentences (said so), --max-tokens is refused, each option appears once."""
    command, log = _dry("translation/train-anthe.sh", "--paper", "--batch-size", "64", gpus=8, tmp_path=tmp_path,
                        with_log=True)
    argv = command.split()
    assert argv.count("--batch-size") == 1 and fixtures.option_value(argv, "--batch-size") == "64"
    assert fixtures.option_value(argv, "--distributed-world-size") == "1" and "--max-tokens" not in argv
    assert "64 sentences x update-freq 1 x 1 workers = 64 sentences per update (the paper: 32)" in log
    assert "--paper: 1 of the 8 visible GPUs, as the paper (one V100 GPU)" in log
    for spelling in (["--max-tokens", "4096"], ["--max-tokens=4096"]):
        proc = _dry("translation/train-anthe.sh", "--paper", *spelling, gpus=8, tmp_path=tmp_path, expect_ok=False)
        assert proc.returncode == 2
        assert proc.stderr == ("train-anthe.sh: error: --max-tokens=4096: --paper batches by sentences (32 per update, "
                               "as the paper); allowed: no --max-tokens, or no --paper\n")
    # without --paper, --batch-size is an upper bound next to the token batch, and said so
    command, log = _dry("translation/train-anthe.sh", "--batch-size=100", gpus=1, tmp_path=tmp_path, with_log=True)
    assert command.split().count("--batch-size") == 1 and "--max-tokens 4096 --update-freq 7 --batch-size 100" in command
    assert "; at most 100 sentences per worker batch (--batch-size)" in log


def test_paper_gpus_and_precision_as_each_paper(tmp_path):
    """Anthe (one V100) and its LM appendix (a single GPU) keep one GPU of the 8 visible; the
    Subformer paper trained on 8 V100s with mixed precision: all 8 workers, --fp16, the
    dropout it does not sweep said so; a CPU run of it is refused (no fp16 on CPU)."""
    command, log = _dry("translation/train-subformer.sh", "--paper", gpus=8, tmp_path=tmp_path, with_log=True)
    argv = command.split()
    assert fixtures.option_value(argv, "--distributed-world-size") == "8" and "--fp16" in argv
    assert "one GPU" not in log and "the paper trained on 8 V100 GPUs (16 for the big/large models)" in log
    assert "no sweep" in log and "--dropout 0.2 and --dropout 0.3" in log
    # fairseq 0.12.3's --bf16 implies --tpu: refused before anything runs, --fp16 named
    proc = _dry("translation/train-subformer.sh", "--paper", "--bf16", gpus=8, tmp_path=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == ("train-subformer.sh: error: --bf16: fairseq 0.12.3 trains bf16 on "
                                                    "TPUs only (its --bf16 implies --tpu); allowed: --fp16, or "
                                                    "fairseq-train's --amp (docs/GPU.md)\n")
    proc = _dry("translation/train-subformer.sh", "--paper", "--gpus=0", gpus=8, tmp_path=tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr == ("train-subformer.sh: error: --paper: the paper trained with mixed "
                                                    "precision (--fp16), which needs GPUs, and this run trains on the "
                                                    "CPU; allowed: drop --paper, or --gpus N on a machine with GPUs\n")
    command, log = _dry("lm/train-subformer-lm.sh", "--paper", gpus=8, tmp_path=tmp_path, with_log=True)
    assert "--fp16" in command.split() and "--update-freq 3 --fp16 --distributed-world-size 8" in command
    assert "the paper trained on 8 GPUs" in log
    # the Anthe paper's App. C: 100 epochs, batch size 8, a single GPU
    command, log = _dry("lm/train-anthe-lm.sh", "--paper", gpus=8, tmp_path=tmp_path, with_log=True)
    argv = command.split()
    assert [fixtures.option_value(argv, o) for o in ("--max-epoch", "--patience", "--batch-size",
                                                     "--distributed-world-size")] == ["100", "-1", "8", "1"]
    assert "--stop-time-hours" not in argv and "--max-tokens" not in argv
    assert "8 blocks x update-freq 1 x 1 workers = 8 blocks per update" in log
    assert "Penn Treebank and WikiText-2" in log


@pytest.mark.parametrize("spelling", ["space", "equals"])
def test_train_options_read_by_the_launcher_in_both_spellings(spelling, tmp_path):
    """--update-freq / --max-tokens / --batch-size / --gpus in the --name=VALUE form are read by
    the launcher (the printed batch is fairseq's), and --distributed-world-size is refused."""
    def opts(**values):
        out = []
        for name, value in values.items():
            name = "--" + name.replace("_", "-")
            out += [f"{name}={value}"] if spelling == "equals" else [name, value]
        return out

    command, log = _dry("translation/train-subformer.sh", *opts(update_freq="8", max_tokens="8192", gpus="2"), gpus=1,
                        tmp_path=tmp_path, with_log=True)
    argv = command.split()
    assert [argv.count(o) for o in ("--update-freq", "--max-tokens", "--distributed-world-size")] == [1, 1, 1]
    assert "--max-tokens 8192 --update-freq 8" in command and "--distributed-world-size 2" in command
    assert "8192 tokens x update-freq 8 x 2 workers = 131072 tokens per update" in log
    proc = _dry("translation/train-subformer.sh", *opts(distributed_world_size="4"), gpus=8, tmp_path=tmp_path,
                expect_ok=False)
    assert proc.returncode != 0
    assert proc.stderr == ("train-subformer.sh: error: --distributed-world-size: set by the recipe from --gpus and "
                           "--nodes; allowed: --gpus N (per node) and --nodes N\n")


def test_real_runs_need_the_gpus_they_ask_for(tmp_path):
    """A run (not a dry run: that prints the command for another machine) refuses GPUs this
    machine does not show, and mixed precision on the CPU, before anything is written; what
    each refusal proposes runs (fairseq-train here is a stand-in)."""
    fake = fixtures.install_fake_tools(tmp_path / "fake" / "bin", sys.executable)
    env = {"PATH": f"{fake}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path / "fake")}
    data, save = ende_data_bin(), tmp_path / "ckpt"
    proc = run("translation/train-anthe.sh", data, "--gpus", "2", "--save-dir", save, cwd=tmp_path, env=env, gpus=0,
               expect_ok=False)
    assert proc.stderr == "train-anthe.sh: error: --gpus=2: this machine shows 0 CUDA GPU(s); allowed: --gpus 0\n"
    proc = run("translation/train-anthe.sh", data, "--fp16", "--save-dir", save, cwd=tmp_path, env=env, gpus=0,
               expect_ok=False)
    assert proc.stderr == ("train-anthe.sh: error: --fp16: mixed precision needs CUDA GPUs, and this run trains on the "
                           "CPU; allowed: drop --fp16, or --gpus N on a machine with GPUs\n")
    assert not save.exists() and fixtures.fake_calls(tmp_path / "fake", "fairseq-train") == []
    for number, argv in enumerate((["--gpus", "0"], [])):
        run("translation/train-anthe.sh", data, *argv, "--save-dir", f"{save}{number}", "--max-update", "3",
            cwd=tmp_path, env=env, gpus=0)
        assert lines(tmp_path / f"ckpt{number}" / "recipe.data") == [os.path.realpath(data)]
    calls = fixtures.fake_calls(tmp_path / "fake", "fairseq-train")
    assert len(calls) == 2 and all("--cpu" in call for call in calls)


# ---------------------------------------------------------------------------------------------
# the command line of every recipe (slim_fairseq_lab/recipes/cli.py: argparse)

def _parser(script: str):
    """(the recipe's argparse parser, the names of its positional arguments)."""
    module = fixtures.recipe_module(script)
    if hasattr(module, "RECIPE"):
        from slim_fairseq_lab.recipes import training
        return training.parser(module.RECIPE), ("DATA_BIN",)
    positional = {"translation/evaluate.sh": ("DATA_BIN", "CKPT"), "lm/evaluate-lm.sh": ("DATA_BIN", "CKPT"),
                  "translation/prepare-wmt17.sh": ("PAIR",)}.get(script, () if "prepare" in script else ("OUT",))
    return (module.parser() if hasattr(module, "parser") else cli.Parser(module.PROG)), positional


def _two_values(action):
    """Two distinct values an option of ``action``'s kind accepts."""
    kind = getattr(action, "kind", None) or ""
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split("|")
        return choices[0], choices[-1]
    return {"count": ("3", "4"), "whole": ("0", "4"), "positive": ("0.5", "2"), "fraction": ("0.5", "1"),
            "size": ("500M", "9G")}.get(kind, ("v 1", "v 2"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_reads_the_same_in_both_spellings(script):
    """For every option of a recipe: --name=V and --name V read the same; a flag refuses a value;
    an option the recipe sets itself is refused in both spellings; a value of the wrong kind is
    refused in one line; an option it does not know goes to the fairseq tool when it runs one."""
    parser, slots = _parser(script)
    positional = [f"P{i}" for i in range(len(slots))]
    pass_through = "prepare" not in script and slots != ("OUT",)
    for action in parser._actions:
        for name in action.option_strings:
            if isinstance(action, cli.Refused):
                for argv in ([name, "1"], [f"{name}=1"]):
                    with pytest.raises(cli.OptionError, match=rf"^{name}: "):
                        cli.split(parser, positional + argv, slots, pass_through)
            elif isinstance(action, cli.Value):
                first, second = _two_values(action)
                spaced = cli.split(parser, positional[:1] + [name, first] + positional[1:] + [name, second], slots,
                                   pass_through)
                joined = cli.split(parser, positional[:1] + [f"{name}={first}"] + positional[1:] + [f"{name}={second}"],
                                   slots, pass_through)
                assert spaced == joined and getattr(spaced[0], action.dest) == ([first, second] if action.append
                                                                                else second), (script, name)
                with pytest.raises(cli.OptionError, match=rf"^{name}: needs a value"):
                    cli.split(parser, [name], slots, pass_through)
                if action.kind:
                    with pytest.raises(cli.OptionError, match=rf"^{name}=1x: not .*; allowed: ") as caught:
                        cli.split(parser, positional + [f"{name}=1x"], slots, pass_through)
                    if not action.kind.startswith("choice:"):  # it proposes the default: the option dropped
                        default = action.default if action.default not in (None, []) else None
                        assert str(caught.value).endswith(f", or drop {name} (" + (
                            f"default {default})" if default is not None else "its default)")), str(caught.value)
                        assert getattr(cli.split(parser, positional, slots, pass_through)[0], action.dest) == \
                            action.default
            else:
                cli.split(parser, positional + [name], slots, pass_through)
                with pytest.raises(cli.OptionError, match=rf"^{name}=1: {name} takes no value; allowed: {name}$"):
                    cli.split(parser, positional + [f"{name}=1"], slots, pass_through)
    with pytest.raises(cli.Help):
        cli.split(parser, ["--help"], slots, pass_through)
    if pass_through:
        args, passed = cli.split(parser, positional + ["--lr=1e-4", "--max-len-a", "0", "--cpu-offload"], slots, True)
        assert passed == ["--lr=1e-4", "--max-len-a", "0", "--cpu-offload"]
        with pytest.raises(cli.OptionError, match=r"^--lr: an option for the fairseq tool, written before "):
            cli.split(parser, ["--lr", "1e-4"] + positional, slots, True)
    else:
        with pytest.raises(cli.OptionError, match=r"^--nope: not an option of this recipe; allowed: the options of "):
            cli.split(parser, positional + ["--nope=1"], slots, False)


def test_option_kinds():
    """The kinds of values the recipes check when they read them, in both spellings."""
    parser = cli.Parser("test")
    parser.value("--max-len", kind="count")
    parser.value("--ratio", kind="positive")
    parser.value("--mode", kind="choice:a|b")
    parser.value("--size", kind="size")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fp16", action="store_const", const="--fp16", dest="precision")
    group.add_argument("--bf16", action="store_const", const="--bf16", dest="precision")
    whole = "not a whole number >= 1; allowed: a whole number >= 1, or drop --max-len (its default)"
    for argv, message in ((["--max-len", "0"], f"--max-len=0: {whole}"),
                          (["--max-len=abc"], f"--max-len=abc: {whole}"),
                          (["--ratio", "-1"], "--ratio=-1: not a number > 0; allowed: a number > 0, or drop --ratio (its "
                                              "default)"),
                          (["--mode", "c"], "--mode=c: not one of the choices; allowed: a|b"),
                          (["--size", "9X"], "--size=9X: not a size; allowed: a number of bytes with an optional K, M, G "
                                             "or T (e.g. 500M, 9G), or drop --size (its default)"),
                          (["--max-len", "--ratio", "2"], "--max-len: needs a value; allowed: --max-len VALUE"),
                          (["--fp16", "--bf16"], "--fp16 and --bf16: exclude each other; allowed: one of them"),
                          (["data", "more"], "more: not an argument or option of this recipe; allowed: the "
                                             "arguments and options of --help")):
        with pytest.raises(cli.OptionError) as caught:
            cli.split(parser, ["data", *argv] if argv[0] != "data" else argv, ("DATA",))
        assert str(caught.value) == message and caught.value.status == 2, (argv, str(caught.value))
    args, _ = cli.split(parser, ["data", "--max-len", "5", "--ratio=1.5", "--mode", "b", "--size", "9G", "--fp16"],
                        ("DATA",))
    assert (args.data, args.max_len, args.ratio, args.mode, args.size, args.precision) == \
        ("data", "5", "1.5", "b", "9G", "--fp16")


def test_average_checkpoints_answers_help():
    """scripts/average_checkpoints.py --help lists fairseq's options of the averaging it runs."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "average_checkpoints.py"), "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "--num-epoch-checkpoints" in proc.stdout


# ---------------------------------------------------------------------------------------------
# the bundled-corpus comparisons

@pytest.fixture
def bundled(fakes, tmp_path, monkeypatch):
    """Fake fairseq tools, and the bundled corpus "binarized" at once (the tests' small en-de)."""
    env, fake_dir = fakes
    data = ende_data_bin()
    monkeypatch.setattr(comparisons.bundled, "binarize_ende", lambda out: data)
    return env, fake_dir


def test_comparison_says_what_its_bleu_is(bundled, tmp_path):
    """anthe_vs_transformer.sh prints, under its table, that "test BLEU" is fairseq-generate's
    tokenized BLEU4, not sacreBLEU, and which checkpoint (and update) each model was translated
    with."""
    env, fake_dir = bundled
    (fake_dir / "test.hyp").write_text("ein Test\n")
    out = tmp_path / "out"
    proc = run("translation/anthe_vs_transformer.sh", out, "--max-update=30", "--sequential", cwd=tmp_path, env=env)
    table = proc.stdout.splitlines()
    assert table[1].split()[0] == "model" and "test BLEU" in table[1]
    assert [row.split()[6] for row in table[2:4]] == ["12.34", "12.34"], table
    note = table[4:]
    assert note[0].startswith("test BLEU: fairseq-generate's BLEU4") and "not sacreBLEU" in note[0]
    assert "tokenized BLEU on Moses tokens (-a), no compound splitting" in note[0]
    assert note[1:] == [f"  anthe: {out}/anthe/checkpoint_last.pt (epoch 1 @ 30 updates)",
                        f"  transformer: {out}/transformer/checkpoint_last.pt (epoch 1 @ 30 updates)"]
    paths = [fixtures.option_value(c, "--path") for c in fixtures.fake_calls(fake_dir, "fairseq-generate")]
    assert paths == [f"{out}/anthe/checkpoint_last.pt", f"{out}/transformer/checkpoint_last.pt"]
    assert all(fixtures.option_value(c, "--max-update") == "30" for c in fixtures.fake_calls(fake_dir, "fairseq-train"))


def test_comparison_waits_for_both_runs_and_names_the_one_that_failed(bundled, tmp_path):
    """The two models train in parallel: when one fails, the recipe still waits for the other
    (no run is left going on its own), then exits non-zero naming the failed one."""
    env, fake_dir = bundled
    (fake_dir / "test.hyp").write_text("ein Test\n")
    proc = run("translation/subformer_vs_transformer.sh", tmp_path, "--max-update", "2", "--max-tokens", "512",
               "--subformer-lr", "not-a-rate", cwd=tmp_path, env=env, expect_ok=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == ("subformer_vs_transformer.sh: error: subformer failed: see the logs under "
                                            f"{tmp_path}/subformer")
    assert "invalid float value: 'not-a-rate'" in (tmp_path / "subformer" / "train.log").read_text()
    assert (tmp_path / "transformer" / "generate.log").stat().st_size > 0  # the other one finished


def test_subformer_comparison_uses_default_init_unless_asked(tmp_path):
    """subformer_vs_transformer.sh: the paper's --bert-init stalled a small Subformer on this
    corpus (docs/RESULTS.md), so it is opt-in. The Subformer trains pre-LN by default (it trained
    best so, docs/TRAINING.md) next to fairseq's post-LN transformer; --pre-ln makes both pre-LN,
    --post-ln both post-LN, and asking for both is refused."""
    script = "translation/subformer_vs_transformer.sh"
    pre_ln = "--encoder-normalize-before --decoder-normalize-before"
    default = run(script, tmp_path, "--dry-run", cwd=tmp_path).stdout.splitlines()
    assert [line.split(":")[0] for line in default] == ["subformer", "transformer"]
    assert "--bert-init" not in default[0]
    assert pre_ln in default[0] and "normalize-before" not in default[1]
    asked = run(script, tmp_path, "--dry-run", "--bert-init", "--pre-ln", cwd=tmp_path).stdout.splitlines()
    assert "--bert-init" in asked[0] and "--bert-init" not in asked[1]
    for line in asked:
        assert line.count(pre_ln) == 1
    post = run(script, tmp_path, "--dry-run", "--post-ln", cwd=tmp_path).stdout.splitlines()
    assert len(post) == 2 and not any("normalize-before" in line for line in post)
    both = run(script, tmp_path, "--dry-run", "--pre-ln", "--post-ln", cwd=tmp_path, expect_ok=False)
    assert both.returncode == 2 and both.stderr == ("subformer_vs_transformer.sh: error: --pre-ln and --post-ln: "
                                                    "exclude each other; allowed: one of them\n")
    assert not (tmp_path / "subformer").exists()  # nothing ran


@pytest.mark.parametrize("name,slim,flag,defaults", [
    # Anthe's default is the better of the rates measured at the script's shape (docs/TRAINING.md)
    ("anthe_vs_transformer.sh", "anthe", "--anthe-lr", ["3e-3", "1e-3"]),
    ("subformer_vs_transformer.sh", "subformer", "--subformer-lr", ["1e-3", "1e-3"])])
def test_comparison_scripts_take_a_rate_per_model(name, slim, flag, defaults, tmp_path):
    """The bundled-corpus comparisons train each model at a rate of its own (docs/TRAINING.md:
    the slim models' best rates differ from the transformer's): each has its default, --lr sets
    both, the model's own flag the slim one alone; --dry-run trains nothing."""
    def rates(*argv):
        printed = run(f"translation/{name}", tmp_path, "--dry-run", *argv, cwd=tmp_path).stdout.splitlines()
        assert [line.split(":")[0] for line in printed] == [slim, "transformer"]
        return [line.split(" --lr ")[1].split()[0] for line in printed if line.count(" --lr ") == 1]

    assert rates() == defaults
    assert rates("--lr", "3e-3") == ["3e-3", "3e-3"]
    assert rates(flag, "1e-2") == ["1e-2", defaults[1]]
    assert rates("--lr", "3e-3", flag, "1e-2") == ["1e-2", "3e-3"]
    assert not (tmp_path / slim).exists()


@pytest.mark.parametrize("name,runs,own", [
    ("stlm_tying_wikitext2.sh", ["tied", "ffn", "lora"], {"lora": "--ffn-lora-rank 8", "tied": "--decoder-embed-dim 128 "}),
    ("skipless_vs_preln.sh", ["skipless", "skipless_noqp", "preln"],
     {"skipless_noqp": "--removed-weights q", "preln": "--decoder-normalize-before"})])
def test_wikitext2_comparisons_train_every_run_alike(name, runs, own, tmp_path):
    """The WikiText-2 comparisons give every run the same data, batches, schedule and seed and
    only its own model options; an unknown name in RUNS is refused before anything trains.
    DRY_RUN=1 prints the commands."""
    env = {"DRY_RUN": "1", "UPDATES": "20", "SEED": "7"}
    printed = run(f"lm/{name}", tmp_path / "out", cwd=tmp_path, env=env).stdout.splitlines()
    assert [line.split(":")[0] for line in printed] == runs
    shared = [set(line.split(" --arch ")[0].split(": ", 1)[1].split()) for line in printed]
    assert all(s == shared[0] for s in shared)
    for line in printed:
        assert "--max-update 20 --seed 7" in line and "--warmup-updates 2 " in line
        run_name = line.split(":")[0]
        for other, flag in own.items():
            assert (flag in line) == (other == run_name)
    refused = run(f"lm/{name}", tmp_path / "out", cwd=tmp_path, expect_ok=False, env={**env, "RUNS": f"{runs[0]} nope"})
    assert refused.returncode == 2 and refused.stderr == (f"{name}: error: RUNS=nope: not a run of this comparison; "
                                                          f"allowed: names among {' '.join(runs)}\n")
    assert not (tmp_path / "out").exists()
