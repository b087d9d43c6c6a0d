"""An export that cannot be done names every option in the way in one line, and the model to
train instead: all the changes at once, so that one retraining exports."""
import os
import subprocess

import pytest

from helpers import BIN
from hf_export_fixtures import data_of, tiny_checkpoint, tokenizer_options

PROG = "slim-fairseq-export-hf"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("export_refusals_all")


def test_anthe_translation_model_names_what_its_custom_code_lacks_at_once(folder):
    """The command a user runs: an ``anthe_base`` leaves as custom code, and what that code
    does not compute is named in one line (with what no class holds), exit 2, nothing
    written."""
    path = tiny_checkpoint(folder, "anthe_base", ["--cross-self-attention",
                                                  "--decoder-output-dim", "16"], False)
    out = folder / "anthe-hf"
    argv = [path, data_of(False), out, "--tokenizer", "moses", "--bpe", "subword_nmt",
            "--bpe-codes", tokenizer_options(False)["bpe_codes"]]
    proc = subprocess.run([os.path.join(BIN, PROG), *map(str, argv)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                           HF_HUB_OFFLINE="1"))
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    custom = "the exported translation model (custom code)"
    assert err[-1] == (
        f"{PROG}: error: --cross-self-attention, --decoder-input-dim/--decoder-output-dim: 2 "
        "options are in the way: --cross-self-attention: no class here attends to source and "
        "target in one attention; --decoder-input-dim/--decoder-output-dim: "
        f"{custom} has no projections between the embedding and the layers; allowed: a model "
        "trained with all of no --cross-self-attention, and both equal to --decoder-embed-dim")
    assert not out.exists()
    assert not [n for n in os.listdir(folder) if ".partial-" in n]


def test_language_model_takes_the_shorter_way_to_an_export(folder):
    """A model that no stock class holds: the stock classes would need three options changed,
    the custom code one, so the refusal names that one; its advice applied, the model leaves
    as custom code."""
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    argv = ["--layernorm-embedding", "--output-bias",
            "--decoder-learned-pos", "--decoder-input-dim", "16"]
    path = tiny_checkpoint(folder, "slim_lm", argv, True)
    out = folder / "lm-hf"
    with pytest.raises(OptionError) as caught:
        export(path, data_of(True), str(out))
    assert str(caught.value) == (
        "--decoder-input-dim/--decoder-output-dim: the exported language model (custom code) has "
        "no projections between the embedding and the layers; allowed: both equal to "
        "--decoder-embed-dim")
    assert not out.exists()
    fixed = tiny_checkpoint(folder, "slim_lm", argv[:3], True)
    result = export(fixed, data_of(True), str(out), sentences=2)
    assert result.hf_class == "SlimForCausalLM" and result.gap <= 1e-5


def test_anthe_language_model_names_what_its_custom_code_lacks_at_once(folder):
    """Anthe's gates leave a language model as custom code; what that code does not compute is
    named in one line, and its advice, all of it applied, exports."""
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    argv = ["--self-attn-gate", "qgv", "--output-bias", "--decoder-input-dim", "16",
            "--scale-attn"]
    path = tiny_checkpoint(folder, "slim_lm", argv, True)
    out = folder / "anthe-lm-hf"
    with pytest.raises(OptionError) as caught:
        export(path, data_of(True), str(out))
    assert str(caught.value) == (
        "--decoder-input-dim/--decoder-output-dim, --scale-attn: 2 options are in the way: "
        "--decoder-input-dim/--decoder-output-dim: the exported language model (custom code) has "
        "no projections between the embedding and the layers; --scale-attn: the exported language "
        "model (custom code) has no NormFormer scales; allowed: a model trained with all of "
        "both equal to --decoder-embed-dim, and no --scale-attn")
    assert not out.exists()
    fixed = tiny_checkpoint(folder, "slim_lm", ["--self-attn-gate", "qgv", "--output-bias"], True)
    result = export(fixed, data_of(True), str(out), sentences=2)
    assert result.hf_class == "SlimForCausalLM" and result.gap <= 1e-5


def test_one_option_in_the_way_keeps_its_own_line(folder):
    from slim_fairseq.export_hf import export
    from slim_fairseq.option_errors import OptionError
    path = tiny_checkpoint(folder, "slim_lm", ["--scale-attn"], True)
    with pytest.raises(OptionError) as caught:
        export(path, data_of(True), str(folder / "scales-hf"))
    assert str(caught.value) == ("--scale-attn: NormFormer's scales are in no class here; "
                                 "allowed: no --scale-attn")
