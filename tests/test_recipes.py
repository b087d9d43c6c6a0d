"""Offline tests of the recipes in examples/ (issue 7).

Miniature copies of every raw download (tests/recipes_fixtures.py) go through each prepare
script in --raw-dir mode (no network), the train scripts run in --cpu-smoke mode (2 updates of
a tiny copy of the arch) and the evaluate scripts score the result. Tiny BPE / sentencepiece
vocabularies keep the whole file within a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipes_fixtures as fixtures  # noqa: E402

pytestmark = pytest.mark.slow

REPO = fixtures.REPO
EXAMPLES = REPO / "examples"
VENV_BIN = Path(sys.executable).parent
EVAL_COUNT = 60  # sentences in the miniature valid / test sets

RECIPE_SCRIPTS = sorted(
    [EXAMPLES / "common.sh"]
    + [p for pattern in ("prepare-*.sh", "train-*.sh", "evaluate*.sh", "*_vs_*.sh", "stlm_tying_*.sh")
       for folder in ("translation", "lm") for p in (EXAMPLES / folder).glob(pattern)]
)


def script_env(**extra: str) -> dict:
    """Environment of a recipe shell: the venv's tools first on PATH (CI activates no venv),
    single-threaded."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHON=sys.executable, NUM_WORKERS="1", OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore", CONNECT_TIMEOUT="3")
    env.update(extra)  # the caller's values win, as before
    return env


def run(script: Path | str, *args: str, cwd: Path, expect_ok: bool = True, env: dict | None = None,
        timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a recipe script with :func:`script_env`."""
    full_env = script_env(**(env or {}))
    proc = subprocess.run(["bash", str(script), *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if expect_ok:
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def dictionary(path: Path) -> dict[str, int]:
    return {word: int(count) for word, count in (line.rsplit(" ", 1) for line in lines(path))}


# ---------------------------------------------------------------------------------------------
# prepared data (module scope: each prepare script runs once)

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
    run(EXAMPLES / "translation/prepare-wmt14en2de.sh", "--raw-dir", str(raw_wmt), "--work-dir", "wmt14",
        "--bpe-merges", "300", "--no-verify", cwd=work)
    return work / "wmt14"


@pytest.fixture(scope="module")
def wmt16(work, raw_wmt) -> Path:
    run(EXAMPLES / "translation/prepare-wmt16enro.sh", "--raw-dir", str(raw_wmt), "--work-dir", "wmt16",
        "--bpe-merges", "300", "--no-verify", cwd=work)
    return work / "wmt16"


CAP_BYTES = 120_000


@pytest.fixture(scope="module")
def wmt17(work, raw_wmt) -> tuple[Path, subprocess.CompletedProcess]:
    """fi-en with the Anthe paper's tokenizer: sentencepiece BPE learned on WikiText-103 raw."""
    proc = run(EXAMPLES / "translation/prepare-wmt17.sh", "fi-en", "--raw-dir", str(raw_wmt),
               "--work-dir", "wmt17", "--vocab-size", "300", "--tokenizer-lang", "wikitext-103",
               "--max-size", f"{CAP_BYTES // 1000}K", "--no-verify", cwd=work)
    return work / "wmt17", proc


@pytest.fixture(scope="module")
def wikitext(work) -> Path:
    raw = fixtures.build_wikitext103(work / "raw-wikitext", max_train=1200, max_eval=120)
    run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--raw-dir", str(raw), "--work-dir", "wikitext",
        "--no-verify", cwd=work)
    return work / "wikitext"


# ---------------------------------------------------------------------------------------------
# static checks and shell helpers

def test_recipe_scripts_are_shellcheck_clean():
    assert len(RECIPE_SCRIPTS) >= 12, RECIPE_SCRIPTS
    proc = subprocess.run([str(VENV_BIN / "shellcheck"), "-x", *map(str, RECIPE_SCRIPTS)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _bash_with_common(code: str, stdin: str, tmp_path: Path) -> str:
    proc = subprocess.run(["bash", "-c", f'. "{EXAMPLES}/common.sh"; {code}'], input=stdin,
                          capture_output=True, text=True, cwd=tmp_path, env=script_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_recipes_keep_large_blocks_in_the_heap_as_quality_py_does(tmp_path, monkeypatch):
    """examples/common.sh exports the malloc settings of slim_fairseq_lab.launcher's ALLOCATOR_ENV
    (one set of values for every launcher), and a value the caller exported wins."""
    from slim_fairseq_lab.launcher import ALLOCATOR_ENV
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    code = 'for v in ' + " ".join(ALLOCATOR_ENV) + '; do printf "%s=%s\\n" "$v" "$(printenv "$v")"; done'
    out = _bash_with_common(code, "", tmp_path)
    assert out.splitlines() == [f"{k}={v}" for k, v in ALLOCATOR_ENV.items()]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    assert "MALLOC_TRIM_THRESHOLD_=4096" in _bash_with_common(code, "", tmp_path).splitlines()


def test_romanian_normalisation_removes_diacritics(tmp_path):
    text = "Ţara şi înţelegerea „bună” cu ŞTIRI, ăsta\n"
    out = _bash_with_common("romanian_normalise", text, tmp_path)
    assert out == 'Tara si intelegerea "buna" cu STIRI, asta\n'


def test_compound_split(tmp_path):
    out = _bash_with_common("compound_split", "state @-@ of @-@ the-art - x\n", tmp_path)
    assert out == "state @ ##AT##-##AT## @ of @ ##AT##-##AT## @ the ##AT##-##AT## art - x\n"


def test_sgm_reader_and_size_parser(tmp_path):
    sgm = tmp_path / "t.sgm"
    sgm.write_bytes(fixtures.fake_sgml(["A  b & c", "d"], "newstest", "en", "ref"))
    assert _bash_with_common(f'sgm_to_text "{sgm}"', "", tmp_path) == "A b & c\nd\n"
    assert _bash_with_common("parse_size 9G; parse_size 12K; parse_size 7", "", tmp_path).split() == [
        str(9 * 1024**3), str(12 * 1024), "7"]


def test_download_is_offline_safe_and_verified(work):
    """No hang without network, --raw-dir never downloads, checksums are enforced."""
    raw = fixtures.build_wikitext103(work / "raw-wikitext-checksum", max_train=20, max_eval=5)
    # an address nobody listens on: a clear error at once, not a hang
    proc = run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--url", "http://127.0.0.1:9/wikitext-103-v1.zip",
               "--work-dir", "wt-offline", cwd=work, expect_ok=False, timeout=120)
    assert proc.returncode != 0 and "cannot reach 127.0.0.1" in proc.stderr and "--raw-dir" in proc.stderr
    # --raw-dir: a missing file is named with its download address
    proc = run(EXAMPLES / "translation/prepare-wmt16enro.sh", "--raw-dir", str(raw), "--work-dir",
               "wt-missing", cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "training-parallel-ep-v8.tgz is missing" in proc.stderr
    assert "https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz" in proc.stderr
    # the miniature zip is not the published archive: the SHA-1 check refuses it
    proc = run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--raw-dir", str(raw), "--work-dir", "wt-sum",
               cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "sha1 checksum" in proc.stderr and "does not match" in proc.stderr


# ---------------------------------------------------------------------------------------------
# prepare scripts

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
        text = path.read_text(encoding="utf-8")
        assert not set("ăâîșțşţĂÂÎȘȚŞŢ") & set(text), f"diacritics left in {path}"
    raw_fixture = fixtures.stand_in("ro", "test", 0, EVAL_COUNT)
    assert any(set("ăşț") & set(line) for line in raw_fixture)  # there was something to remove


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
    """--paper anthe: one sentencepiece model per language, separate dictionaries."""
    run(EXAMPLES / "translation/prepare-wmt14en2de.sh", "--raw-dir", str(raw_wmt), "--work-dir", "wmt14-anthe",
        "--paper", "anthe", "--vocab-size", "300", "--no-verify", cwd=work)
    data = work / "wmt14-anthe" / "data-bin"
    assert lines(data / "recipe.info") == ["SRC=en", "TGT=de", "SCHEME=sentencepiece"]
    import sentencepiece as spm
    models = {lang: spm.SentencePieceProcessor(model_file=str(data / f"spm.{lang}.model")) for lang in ("en", "de")}
    assert all(m.get_piece_size() == 300 for m in models.values())
    assert {models["en"].id_to_piece(i) for i in range(300)} != {models["de"].id_to_piece(i) for i in range(300)}
    dicts = {lang: dictionary(data / f"dict.{lang}.txt") for lang in ("en", "de")}
    assert dicts["en"] != dicts["de"]  # not joined
    prep = work / "wmt14-anthe" / "tmp" / "prep"
    for lang in ("en", "de"):
        pieces = {tok for line in lines(prep / f"train.{lang}") for tok in line.split()}
        assert pieces <= {models[lang].id_to_piece(i) for i in range(300)} and pieces <= set(dicts[lang])
    assert len(lines(data / "test.raw.de")) == EVAL_COUNT


@pytest.fixture(scope="module")
def wmt14_google(raw_wmt, work) -> Path:
    run(EXAMPLES / "translation/prepare-wmt14en2de.sh", "--raw-dir", str(raw_wmt), "--work-dir", "wmt14-google",
        "--paper", "subformer", "--no-verify", cwd=work)
    return work / "wmt14-google" / "data-bin"


def test_prepare_wmt14_subformer_paper_data(wmt14_google, raw_wmt, work):
    """--paper subformer: Google's preprocessed WMT14 (fairseq's scaling_nmt), binarized as is."""
    data = wmt14_google
    assert lines(data / "recipe.info") == ["SRC=en", "TGT=de", "SCHEME=moses-bpe", "SOURCE=google-wmt16_en_de"]
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
    proc = run(EXAMPLES / "translation/prepare-wmt14en2de.sh", "--paper", "subformer", "--work-dir", "g2",
               cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "drive.google.com" in proc.stderr and "--raw-dir" in proc.stderr
    assert not (work / "g2").exists()


def test_prepare_wikitext103(wikitext):
    data = wikitext / "data-bin"
    for split in ("train", "valid", "test"):
        assert (data / f"{split}.bin").stat().st_size > 0
    words = {w for w in dictionary(data / "dict.txt") if not w.startswith("madeupword")}
    train_file = next((wikitext / "extracted").rglob("wiki.train.tokens"))
    assert words == {tok for line in lines(train_file) for tok in line.split()}


# ---------------------------------------------------------------------------------------------
# training (CPU smoke mode) and evaluation

def _smoke_train(script: str, data: Path, save_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = run(EXAMPLES / script, str(data), "--cpu-smoke", "--save-dir", str(save_dir), *extra,
               cwd=save_dir.parent)
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
    script = EXAMPLES / "translation/train-anthe.sh"
    trained = (anthe_checkpoints / "checkpoint_last.pt").stat().st_mtime_ns
    assert lines(anthe_checkpoints / "recipe.data") == [str((wmt14 / "data-bin").resolve())]
    again = run(script, str(wmt14 / "data-bin"), "--dry-run", "--save-dir", str(anthe_checkpoints), cwd=work)
    assert "fairseq-train" in again.stdout
    other = work / "other-pair" / "data-bin"
    other.mkdir(parents=True, exist_ok=True)
    for argv in (["--dry-run"], ["--cpu-smoke"]):
        proc = run(script, str(other), *argv, "--save-dir", str(anthe_checkpoints), cwd=work, expect_ok=False)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "--save-dir" in proc.stderr and str(other.resolve()) in proc.stderr
    assert (anthe_checkpoints / "checkpoint_last.pt").stat().st_mtime_ns == trained
    assert lines(anthe_checkpoints / "recipe.data") == [str((wmt14 / "data-bin").resolve())]


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
    proc = run(EXAMPLES / "translation/evaluate.sh", str(wmt14 / "data-bin"), str(anthe_checkpoints),
               "--avg", "2", "--lenpens", "0.8 1.2", "--batch-size", "64", "--cpu",
               "--max-len-a", "0", "--max-len-b", "8", cwd=work)
    out = proc.stdout
    assert "got no hypothesis" not in proc.stderr  # 60 sentences: not a multiple of 8
    assert re.search(r"valid lenpen 0\.8: tokenized BLEU \d+\.\d+", out)
    assert re.search(r"valid lenpen 1\.2: tokenized BLEU \d+\.\d+", out)
    report = _report(out)
    assert re.fullmatch(r"\d+\.\d+", report["BLEU (tokenized)"])
    assert report["tokenization of tokenized BLEU"] == "Moses tokenizer -a + compound splitting (German target)"
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|nrefs:1\|.*= \d+\.\d+", out)
    # fairseq's masked per-token perplexity of valid and test, beside BLEU (the Anthe metric)
    ppl = re.fullmatch(r"valid ([0-9.]+), test ([0-9.]+)",
                       report["perplexity (fairseq, per target token, padding excluded)"])
    assert ppl and all(1.0 < float(x) < 1e6 for x in ppl.groups())
    eval_dir = anthe_checkpoints / "eval"
    lenpen = re.search(r"best length penalty on valid: (\S+)", out).group(1)
    assert lenpen in ("0.8", "1.2")
    assert len(lines(eval_dir / f"test.lenpen{lenpen}.detok")) == EVAL_COUNT
    # both sides were compound-split Moses tokens (hyphens split as "@ ##AT##-##AT## @")
    for side in ("hyp", "ref"):
        text = (eval_dir / f"test.lenpen{lenpen}.{side}.tok").read_text(encoding="utf-8")
        assert len(text.splitlines()) == EVAL_COUNT and "@-@" not in text
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
        if torch.is_floating_point(value):
            torch.testing.assert_close(value, (states[0][key] + states[1][key]) / 2)
            changed += int(not torch.equal(states[0][key], states[1][key]))
    assert changed > 0, "two updates should have changed some weights"


def test_train_and_evaluate_subformer_on_sentencepiece_data(wmt17, work):
    data = wmt17[0] / "data-bin"
    save_dir = work / "ckpt-subformer"
    _smoke_train("translation/train-subformer.sh", data, save_dir, "--arch", "subformer_small")
    proc = run(EXAMPLES / "translation/evaluate.sh", str(data), str(save_dir / "checkpoint_last.pt"),
               "--lenpens", "1.0", "--batch-size", "64", "--cpu", "--max-len-a", "0", "--max-len-b", "8",
               cwd=work)
    report = _report(proc.stdout)
    assert re.fullmatch(r"\d+\.\d+", report["BLEU (tokenized)"])
    # an English target: no compound splitting, and the report says so
    assert report["tokenization of tokenized BLEU"] == "Moses tokenizer -a, no compound splitting (target en)"
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|.*= \d+\.\d+", proc.stdout)
    hyp = lines(save_dir / "eval" / "test.lenpen1.0.detok")
    assert len(hyp) == EVAL_COUNT and not any("\u2581" in h for h in hyp)  # pieces were decoded
    refs = lines(save_dir / "eval" / "test.lenpen1.0.ref.tok")
    assert refs == _sacremoses_tokenize("en", lines(data / "test.raw.en"))
    assert any("@-@" in line for line in refs)  # hyphens the German rule would have split


def test_compound_splitting_only_for_german(tmp_path):
    """The Romanian example of issue 13: hyphenated clitics must stay whole for ro, en, ...;
    only a German target gets the WMT14 en-de compound splitting."""
    text = "Ea s-a dus într-o zi la piață.\n"
    ro = _bash_with_common("bleu_tokenize ro", text, tmp_path)
    de = _bash_with_common("bleu_tokenize de", "Das Know-how der Berlin-Reise\n", tmp_path)
    assert "##AT##" not in ro and "s @-@ a" in ro
    assert "Know @ ##AT##-##AT## @ how" in de
    names = _bash_with_common("bleu_tokenization_name ro; bleu_tokenization_name de", "", tmp_path)
    assert names.splitlines() == ["Moses tokenizer -a, no compound splitting (target ro)",
                                  "Moses tokenizer -a + compound splitting (German target)"]


def test_evaluate_uses_the_shipped_reference_tokens(wmt14_google, work):
    """Google's data ships its tokenized references: tokenized BLEU scores against them (as
    fairseq's compound_split_bleu.sh does on the binarized references), compound-split."""
    save_dir = work / "ckpt-subformer-google"
    _smoke_train("translation/train-subformer.sh", wmt14_google, save_dir, "--arch", "subformer_small")
    proc = run(EXAMPLES / "translation/evaluate.sh", str(wmt14_google), str(save_dir / "checkpoint_last.pt"),
               "--lenpens", "1.0", "--batch-size", "64", "--cpu", "--max-len-a", "0", "--max-len-b", "8",
               cwd=work)
    assert re.fullmatch(r"\d+\.\d+", _report(proc.stdout)["BLEU (tokenized)"])
    refs = lines(save_dir / "eval" / "test.lenpen1.0.ref.tok")
    shipped = lines(wmt14_google / "test.tok.de")
    assert refs == [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line) for line in shipped]
    assert refs != _sacremoses_tokenize("de", lines(wmt14_google / "test.raw.de"))


LM_RECIPES = [
    ("lm/train-subformer-lm.sh", "subformer_lm_wiki103_83m"),
    ("lm/train-stlm.sh", "stlm_tied"),
    ("lm/train-skipless.sh", "skipless_lm"),
    ("lm/train-anthe-lm.sh", "anthe_lm_gpt2_small"),
]


@pytest.mark.parametrize("script,arch", LM_RECIPES, ids=[a for _, a in LM_RECIPES])
def test_train_language_model_smoke(script, arch, wikitext, work):
    assert f"ARCH={arch}" in (EXAMPLES / script).read_text()  # the script's default arch
    save_dir = work / f"ckpt-{arch}"
    _smoke_train(script, wikitext / "data-bin", save_dir)
    if arch.startswith("subformer"):
        _evaluate_lm_checks(wikitext / "data-bin", save_dir, work)


def _evaluate_lm_checks(data: Path, save_dir: Path, work: Path) -> None:
    """evaluate-lm.sh: defaults from the checkpoint, and no perplexity of a skipped subset."""
    # blocks longer than the model: a clear error naming the option, not a perplexity of 1.00
    proc = run(EXAMPLES / "lm/evaluate-lm.sh", str(data), str(save_dir / "checkpoint_last.pt"), "--cpu",
               "--tokens-per-sample", "3072", "--context-window", "2560", cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "Perplexity" not in proc.stdout
    assert "--tokens-per-sample 3072" in proc.stderr and "at most 64 positions" in proc.stderr
    # complete-line blocks: WikiText lines longer than 64 tokens get skipped by fairseq-eval-lm;
    # the perplexity of the rest is not the test set's
    proc = run(EXAMPLES / "lm/evaluate-lm.sh", str(data), str(save_dir / "checkpoint_last.pt"), "--cpu",
               cwd=work, expect_ok=False)
    assert proc.returncode != 0 and "test: Loss" not in proc.stdout
    assert re.search(r"skipped \d+ blocks .*--tokens-per-sample .*--sample-break-mode none", proc.stderr)
    # defaults read from the checkpoint (the smoke model has 64 positions)
    proc = run(EXAMPLES / "lm/evaluate-lm.sh", str(data), str(save_dir), "--avg", "2", "--cpu",
               "--sample-break-mode", "none", cwd=work)
    assert "blocks of 64 tokens (none), context window 54 (model positions: 64)" in proc.stderr
    match = re.search(r"test: Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+) \((\d+) tokens", proc.stdout)
    assert match, proc.stdout[-2000:]
    loss, ppl = float(match.group(1)), float(match.group(2))
    assert ppl == pytest.approx(2 ** loss, rel=1e-3) and ppl > 1.0
    test_tokens = sum(len(line.split()) + 1 for line in lines(next((work / "wikitext" / "extracted").rglob("wiki.test.tokens"))))
    assert int(match.group(3)) == test_tokens  # every token of the test set, eos included
    assert (save_dir / "eval" / "average_last2.pt").is_file()


# ---------------------------------------------------------------------------------------------
# launch modes (printed, not run: no GPUs here)

def _dry(script: str, *args: str, tmp_path: Path, with_log: bool = False):
    proc = run(EXAMPLES / script, "data-bin", "--dry-run", *args, cwd=tmp_path)
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == 1, proc.stdout
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
                 "--master-addr", "10.0.0.1", "--bf16", tmp_path=tmp_path)
    assert multi.startswith("+ torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1")
    assert "--distributed-world-size 16" in multi and "--bf16" in multi
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
    command, log = _dry("translation/train-anthe.sh", "--gpus", "1", tmp_path=tmp_path, with_log=True)
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
    proc = run(EXAMPLES / "translation/train-anthe.sh", "data-bin", "--dry-run", "--paper", "--gpus", "3",
               cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0 and "do not split evenly over 3 workers" in proc.stderr
    # Subformer: the defaults are the paper's
    _, log = _dry("translation/train-subformer.sh", "--paper", "--gpus", "1", tmp_path=tmp_path, with_log=True)
    assert "defaults already are the paper's setting" in log
    # no paper recipe to reproduce: refused, not ignored
    proc = run(EXAMPLES / "lm/train-stlm.sh", "data-bin", "--dry-run", "--paper", cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0 and proc.stderr.startswith("error: --paper: the STLM report")
    # evaluation: the Subformer paper scores the best checkpoint, never an average
    data = tmp_path / "data"
    data.mkdir()
    (data / "recipe.info").write_text("SRC=en\nTGT=de\nSCHEME=moses-bpe\n")
    proc = run(EXAMPLES / "translation/evaluate.sh", str(data), str(tmp_path), "--paper", "--avg", "5",
               cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0 and "--paper scores the best checkpoint" in proc.stderr


# ---------------------------------------------------------------------------------------------
# command-line behaviour of every script

HELP_SCRIPTS = [p for p in RECIPE_SCRIPTS if p.name != "common.sh"]


def _header(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        if not line.startswith("#"):
            break
        out.append(re.sub(r"^# ?", "", line))
    return out


@pytest.mark.parametrize("script", HELP_SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in HELP_SCRIPTS])
def test_help_prints_the_header_only(script, tmp_path):
    proc = run(script, "--help", cwd=tmp_path)
    printed = proc.stdout.splitlines()
    header = _header(script)
    assert any(line.lower().startswith("usage:") for line in header), header
    if script.name.startswith("train-"):  # the header, then the launcher's shared options
        assert printed[:len(header)] == header and printed[len(header) + 1] == "options of every train script:"
    else:
        assert printed == header
    assert not any(word in proc.stdout for word in ("set -euo", "shellcheck", "$(", "; then"))


PREPARE_SCRIPTS = [("translation/prepare-wmt14en2de.sh",), ("translation/prepare-wmt16enro.sh",),
                   ("translation/prepare-wmt17.sh", "de-en"), ("lm/prepare-wikitext-103.sh",)]


@pytest.mark.parametrize("script", PREPARE_SCRIPTS, ids=[s[0] for s in PREPARE_SCRIPTS])
def test_unreadable_raw_dir_is_a_one_line_error(script, tmp_path):
    proc = run(EXAMPLES / script[0], *script[1:], "--raw-dir", str(tmp_path / "nowhere"), cwd=tmp_path,
               expect_ok=False)
    assert proc.returncode != 0
    assert proc.stderr == f"error: --raw-dir: '{tmp_path / 'nowhere'}' is not a readable folder\n"


def test_prepare_dry_run_lists_downloads_and_changes_nothing(raw_wmt, tmp_path):
    expected = {
        "translation/prepare-wmt14en2de.sh": ["wmt14-dev.tgz (md5:88ba3fc6", "test-full.tgz"],
        "translation/prepare-wmt16enro.sh": ["wmt16-dev.tgz", "wmt16-test.tgz",
                                             "training-parallel-ep-v8.tgz (md5:07b77f254d189a5bfb7b43b7fc489716"],
        "translation/prepare-wmt17.sh": ["wmt17-dev.tgz", "wmt17-test.tgz", "training-parallel-nc-v12.tgz"],
    }
    for script, names in expected.items():
        args = ["zh-en", "--paper"] if script.endswith("wmt17.sh") else []
        proc = run(EXAMPLES / script, *args, "--raw-dir", str(raw_wmt), "--work-dir", "dry", "--dry-run",
                   cwd=tmp_path)
        for name in names:
            assert f"{raw_wmt}/{name}" in proc.stdout, (script, proc.stdout)
        assert "download https://" in proc.stdout
        assert not (tmp_path / "dry").exists(), script
    # the WMT17 paper setting: WikiText-103's tokenizer and the first 7M pairs for zh
    assert "wikitext-103-raw-v1.zip (sha1:86f2375181b9247049d9c9205fad2b71b274b568, present)" in proc.stdout
    assert "UNv1.0.en-zh.tar.gz (no published checksum, missing)" in proc.stdout
    assert "pair cap: 7000000" in proc.stderr
    proc = run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--work-dir", "dry", "--dry-run", cwd=tmp_path)
    assert "download https://wikitext.smerity.com/wikitext-103-v1.zip" in proc.stdout
    assert not (tmp_path / "dry").exists()


def test_wmt16_checks_the_europarl_v8_md5(raw_wmt, tmp_path):
    proc = run(EXAMPLES / "translation/prepare-wmt16enro.sh", "--raw-dir", str(raw_wmt), "--work-dir", "w",
               cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0
    assert "training-parallel-ep-v8.tgz: md5 checksum" in proc.stderr and "07b77f254d189a5bfb7b43b7fc489716" in proc.stderr


def test_raw_dir_download_name_is_accepted_only_with_its_checksum(tmp_path):
    """One raw folder for several WMT years: a file kept under the published name (dev.tgz) is
    used only when its checksum is the one this recipe expects."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "dev.tgz").write_bytes(b"newsdev of some year\n")
    import hashlib
    md5 = hashlib.md5(b"newsdev of some year\n").hexdigest()
    url = "https://data.statmt.org/wmt16/translation-task/dev.tgz"
    code = f'RAW_DIR="{raw}"; fetch {url} wmt16-dev.tgz md5:{md5}; raw_path wmt16-dev.tgz'
    assert _bash_with_common(code, "", tmp_path).strip() == f"{raw}/dev.tgz"
    proc = subprocess.run(["bash", "-c", f'. "{EXAMPLES}/common.sh"; RAW_DIR="{raw}"; '
                           f'fetch {url} wmt16-dev.tgz md5:{"0" * 32}'], capture_output=True, text=True,
                          env=script_env())
    assert proc.returncode != 0
    assert f"save that download as {raw}/wmt16-dev.tgz" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_evaluate_checks_the_checkpoint_before_writing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "recipe.info").write_text("SRC=en\nTGT=ro\nSCHEME=moses-bpe\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    proc = run(EXAMPLES / "translation/evaluate.sh", str(data), str(ckpt), cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0 and "checkpoint_best.pt not found" in proc.stderr
    assert not (ckpt / "eval").exists()
    # --avg N on a folder without checkpoints: one line naming the option, no traceback
    for script in ("translation/evaluate.sh", "lm/evaluate-lm.sh"):
        proc = run(EXAMPLES / script, str(data), str(ckpt), "--avg", "3", cwd=tmp_path, expect_ok=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert proc.stderr.splitlines() == [
            f"error: --avg 3: {ckpt} holds 0 update checkpoints (checkpoint_E_U.pt) and 0 epoch "
            "checkpoints (checkpointE.pt), fewer than 3"], script
        assert not (ckpt / "eval").exists()
    proc = subprocess.run([sys.executable, str(REPO / "scripts/average_checkpoints.py"), "--inputs", str(ckpt),
                           "--num-update-checkpoints", "3", "--output", str(tmp_path / "avg.pt")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: --inputs: {ckpt} holds 0 matching checkpoints, 3 requested"


def test_prepare_wikitext103_gpt2_bpe(work):
    raw = fixtures.build_wikitext103_raw_gpt2(work / "raw-wikitext-gpt2")
    # word-level data prepared earlier with the default folder must survive the GPT-2 preparation
    word_level = work / "wikitext-103" / "data-bin"
    word_level.mkdir(parents=True)
    (word_level / "dict.txt").write_text("the 5\n")
    run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--gpt2-bpe", "--raw-dir", str(raw), "--no-verify", cwd=work)
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
    for ids, text in zip(encoded, source):
        assert bpe.decode([int(i) for i in ids.split()]) == text.strip()
    the_id = str(256 + fixtures.MINI_GPT2_MERGES.index(("Ġt", "he")))
    assert any(the_id in line.split() for line in encoded)


def test_subformer_comparison_uses_default_init_unless_asked(tmp_path):
    """subformer_vs_transformer.sh: the paper's --bert-init stalled a small Subformer on this
    corpus (docs/RESULTS.md), so it is opt-in. The Subformer trains pre-LN by default (it trained
    best so, docs/TRAINING.md) next to fairseq's post-LN transformer; --pre-ln makes both pre-LN,
    --post-ln both post-LN, and asking for both is refused."""
    script = EXAMPLES / "translation" / "subformer_vs_transformer.sh"
    pre_ln = "--encoder-normalize-before --decoder-normalize-before"
    default = run(script, str(tmp_path), "--dry-run", cwd=tmp_path).stdout.splitlines()
    assert [line.split(":")[0] for line in default] == ["subformer", "transformer"]
    assert "--bert-init" not in default[0]
    assert pre_ln in default[0] and "normalize-before" not in default[1]
    asked = run(script, str(tmp_path), "--dry-run", "--bert-init", "--pre-ln", cwd=tmp_path).stdout.splitlines()
    assert "--bert-init" in asked[0] and "--bert-init" not in asked[1]
    for line in asked:
        assert line.count(pre_ln) == 1
    post = run(script, str(tmp_path), "--dry-run", "--post-ln", cwd=tmp_path).stdout.splitlines()
    assert len(post) == 2 and not any("normalize-before" in line for line in post)
    both = run(script, str(tmp_path), "--dry-run", "--pre-ln", "--post-ln", cwd=tmp_path, expect_ok=False)
    assert both.returncode != 0 and "--pre-ln and --post-ln exclude each other" in both.stderr
    assert not (tmp_path / "subformer").exists()  # nothing ran


@pytest.mark.parametrize("name,slim,flag,defaults", [
    # Anthe's default is the better of the rates measured at the script's shape (docs/TRAINING.md)
    ("anthe_vs_transformer.sh", "anthe", "--anthe-lr", ["3e-3", "1e-3"]),
    ("subformer_vs_transformer.sh", "subformer", "--subformer-lr", ["1e-3", "1e-3"])])
def test_comparison_scripts_take_a_rate_per_model(name, slim, flag, defaults, tmp_path):
    """The bundled-corpus comparisons train each model at a rate of its own (docs/TRAINING.md:
    the slim models' best rates differ from the transformer's): each has its default, --lr sets
    both, the model's own flag the slim one alone; --dry-run trains nothing."""
    script = EXAMPLES / "translation" / name

    def rates(*argv):
        lines = run(script, str(tmp_path), "--dry-run", *argv, cwd=tmp_path).stdout.splitlines()
        assert [line.split(":")[0] for line in lines] == [slim, "transformer"]
        return [line.split(" --lr ")[1].split()[0] for line in lines if line.count(" --lr ") == 1]

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
    """The WikiText-2 comparisons (examples/common.sh: compare_lms_on_wikitext2) give every run the
    same data, batches, schedule and seed and only its own model options; an unknown name in RUNS
    is refused before anything trains. DRY_RUN=1 prints the commands."""
    script = EXAMPLES / "lm" / name
    env = {"DRY_RUN": "1", "UPDATES": "20", "SEED": "7"}
    printed = run(script, str(tmp_path / "out"), cwd=tmp_path, env=env).stdout.splitlines()
    assert [line.split(":")[0] for line in printed] == runs
    shared = [set(line.split(" --arch ")[0].split(": ", 1)[1].split()) for line in printed]
    assert all(s == shared[0] for s in shared)
    for line in printed:
        assert "--max-update 20 --seed 7" in line and "--warmup-updates 2 " in line
        run_name = line.split(":")[0]
        for other, flag in own.items():
            assert (flag in line) == (other == run_name)
    refused = run(script, str(tmp_path / "out"), cwd=tmp_path, expect_ok=False,
                  env={**env, "RUNS": f"{runs[0]} nope"})
    assert refused.returncode != 0 and "RUNS: unknown run 'nope'" in refused.stderr
    assert not (tmp_path / "out").exists()


def test_comparison_waits_for_both_runs_and_names_the_one_that_failed(tmp_path):
    """compare_on_bundled_ende (examples/common.sh) runs the two models in parallel: when one
    fails, the script still waits for the other, then exits non-zero naming the failed one
    (before, the first failure ended the script and left the second run going on its own)."""
    script = EXAMPLES / "translation" / "subformer_vs_transformer.sh"
    proc = run(script, str(tmp_path), "--max-update", "2", "--max-tokens", "512",
               "--subformer-lr", "not-a-rate", cwd=tmp_path, expect_ok=False)
    assert proc.returncode != 0
    assert f"subformer failed: see the logs under {tmp_path}/subformer" in proc.stderr
    assert (tmp_path / "transformer" / "generate.log").stat().st_size > 0  # the other one finished
