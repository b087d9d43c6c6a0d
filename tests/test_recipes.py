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


def run(script: Path | str, *args: str, cwd: Path, expect_ok: bool = True, env: dict | None = None,
        timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a recipe script with the venv's tools first on PATH, single-threaded."""
    full_env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    PYTHON=sys.executable, NUM_WORKERS="1", OMP_NUM_THREADS="1",
                    PYTHONWARNINGS="ignore", CONNECT_TIMEOUT="3")
    full_env.update(env or {})
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
def wmt14(work) -> Path:
    raw = fixtures.build_wmt14_en_de(work / "raw-wmt14", per_corpus=700, eval_count=EVAL_COUNT)
    run(EXAMPLES / "translation/prepare-wmt14en2de.sh", "--raw-dir", str(raw), "--work-dir", "wmt14",
        "--bpe-merges", "300", "--no-verify", cwd=work)
    return work / "wmt14"


@pytest.fixture(scope="module")
def wmt16(work) -> Path:
    raw = fixtures.build_wmt16_en_ro(work / "raw-wmt16", per_corpus=500, eval_count=EVAL_COUNT)
    run(EXAMPLES / "translation/prepare-wmt16enro.sh", "--raw-dir", str(raw), "--work-dir", "wmt16",
        "--bpe-merges", "300", "--no-verify", cwd=work)
    return work / "wmt16"


CAP_BYTES = 120_000


@pytest.fixture(scope="module")
def wmt17(work) -> tuple[Path, subprocess.CompletedProcess]:
    raw = fixtures.build_wmt17(work / "raw-wmt17-fi", "fi", per_corpus=500, eval_count=EVAL_COUNT)
    proc = run(EXAMPLES / "translation/prepare-wmt17.sh", "fi-en", "--raw-dir", str(raw),
               "--work-dir", "wmt17", "--vocab-size", "300", "--tokenizer-lang", "en",
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
                          capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


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
    assert re.search(r"vocabulary 300, on: \S*raw\.train\.en\n", proc.stderr)  # English-only tokenizer
    # the corpus cap kept a prefix of the concatenated corpora within the byte budget
    fi, en = work_dir / "tmp" / "raw.train.fi", work_dir / "tmp" / "raw.train.en"
    assert fi.stat().st_size + en.stat().st_size <= CAP_BYTES // 1000 * 1024
    assert 0 < len(lines(fi)) == len(lines(en)) < 3 * 500
    # europarl, wiki titles (" ||| " format) and rapid all contributed before the cap
    assert "kept 500 pairs" in proc.stderr and "titles.fi-en: kept 500 pairs" in proc.stderr


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


def test_train_and_evaluate_anthe_translation(anthe_checkpoints, wmt14, work):
    proc = run(EXAMPLES / "translation/evaluate.sh", str(wmt14 / "data-bin"), str(anthe_checkpoints),
               "--avg", "2", "--lenpens", "0.8 1.2", "--batch-size", "64", "--cpu",
               "--max-len-a", "0", "--max-len-b", "8", cwd=work)
    out = proc.stdout
    assert "got no hypothesis" not in proc.stderr  # 60 sentences: not a multiple of 8
    assert re.search(r"valid lenpen 0\.8: tokenized BLEU \d+\.\d+", out)
    assert re.search(r"valid lenpen 1\.2: tokenized BLEU \d+\.\d+", out)
    assert re.search(r"BLEU \(tokenized, compound-split\) = \d+\.\d+", out)
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|nrefs:1\|.*= \d+\.\d+", out)
    eval_dir = anthe_checkpoints / "eval"
    lenpen = re.search(r"best length penalty on valid: (\S+)", out).group(1)
    assert lenpen in ("0.8", "1.2")
    assert len(lines(eval_dir / f"test.lenpen{lenpen}.detok")) == EVAL_COUNT
    # both sides were compound-split Moses tokens (hyphens split as "@ ##AT##-##AT## @")
    for side in ("hyp", "ref"):
        text = (eval_dir / f"test.lenpen{lenpen}.{side}.cs").read_text(encoding="utf-8")
        assert len(text.splitlines()) == EVAL_COUNT and "@-@" not in text


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
    assert re.search(r"BLEU \(tokenized, compound-split\) = \d+\.\d+", proc.stdout)
    assert re.search(r"sacreBLEU \(detokenized\): BLEU\|.*= \d+\.\d+", proc.stdout)
    hyp = lines(save_dir / "eval" / "test.lenpen1.0.detok")
    assert len(hyp) == EVAL_COUNT and not any("\u2581" in h for h in hyp)  # pieces were decoded


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
        proc = run(EXAMPLES / "lm/evaluate-lm.sh", str(wikitext / "data-bin"), str(save_dir), "--avg", "2",
                   "--tokens-per-sample", "64", "--context-window", "32", "--max-tokens", "512", "--cpu",
                   cwd=work)
        match = re.search(r"test: Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", proc.stdout)
        assert match, proc.stdout[-2000:]
        loss, ppl = float(match.group(1)), float(match.group(2))
        assert ppl == pytest.approx(2 ** loss, rel=1e-3)
        assert (save_dir / "eval" / "average_last2.pt").is_file()


# ---------------------------------------------------------------------------------------------
# launch modes (printed, not run: no GPUs here)

def _dry(script: str, *args: str, tmp_path: Path) -> str:
    proc = run(EXAMPLES / script, "data-bin", "--dry-run", *args, cwd=tmp_path)
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == 1, proc.stdout
    return commands[0]


def test_launch_modes(tmp_path):
    one_node = _dry("translation/train-subformer.sh", "--gpus", "8", "--fp16", tmp_path=tmp_path)
    # 128K tokens per update = 4096 tokens x 8 GPUs x update-freq 4
    assert "--distributed-world-size 8" in one_node and "--update-freq 4" in one_node
    assert "--fp16" in one_node and "torchrun" not in one_node
    assert "--bert-init" in one_node and "--lr-scheduler inverse_sqrt" in one_node

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


def test_prepare_wikitext103_gpt2_bpe(work):
    raw = fixtures.build_wikitext103_raw_gpt2(work / "raw-wikitext-gpt2")
    run(EXAMPLES / "lm/prepare-wikitext-103.sh", "--gpt2-bpe", "--raw-dir", str(raw), "--work-dir",
        "wikitext-gpt2", "--no-verify", cwd=work)
    out = work / "wikitext-gpt2"
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
