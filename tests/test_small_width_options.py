"""``--tc-min-bond`` and ``--hsoftpos-min-token-dim``: settings that keep Anthe useful
at small widths, where the paper's ratios clamp a Tensor Chain to bond 2 and H-SoftPOS leaves a
token table only d/4 wide. Off by default, so the paper presets keep their parameter counts."""
import pytest

from helpers import assert_incremental_equals_full, build
from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding, hsoftpos_dims
from slim_fairseq.modules.tensor_chain import TensorChainLinear, solve_bond

SHAPE = ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
         "--decoder-ffn-embed-dim", "512", "--encoder-layers", "1", "--decoder-layers", "1",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0"]


def _anthe(*extra):
    _, task, model = build("anthe_base", SHAPE, False, extra=list(extra))
    return task, model.eval()


def _params(model):
    return sum(p.numel() for p in model.parameters())


def _bonds(model):
    return [m.bond for m in model.modules() if isinstance(m, TensorChainLinear)]


def test_solve_bond_floor():
    assert solve_bond(128, 341, 0.005) == 2
    assert solve_bond(128, 341, 0.005, min_bond=8) == 8
    assert solve_bond(512, 512, 0.07, min_bond=8) == 14  # a floor below the solved bond changes nothing


def test_defaults_keep_the_paper_model():
    _, plain = _anthe()
    _, explicit = _anthe("--tc-min-bond", "0", "--hsoftpos-min-token-dim", "0")
    assert _params(plain) == _params(explicit)
    assert min(_bonds(plain)) == 2  # the FFN at ratio .005 is clamped at width 128
    assert plain.encoder.embed_tokens.d_emb == 32  # d - 3 floor(d/4) at l = 2


def test_tc_min_bond_raises_every_small_bond():
    _, plain = _anthe()
    _, floored = _anthe("--tc-min-bond", "8")
    assert min(_bonds(floored)) == 8
    assert [max(b, 8) for b in _bonds(plain)] == _bonds(floored)
    assert _params(floored) > _params(plain)


def test_hsoftpos_min_token_dim_widens_the_table():
    assert hsoftpos_dims(128, 2) == (32, 32, 32)
    assert hsoftpos_dims(128, 2, 64) == (21, 21, 65)  # d_sp = floor((128 - 64) / 3)
    assert hsoftpos_dims(512, 2, 64) == (128, 128, 128)  # already wide enough: the paper's split
    task, model = _anthe("--hsoftpos-min-token-dim", "64")
    embed = model.encoder.embed_tokens
    assert isinstance(embed, HSoftPOSEmbedding) and embed.d_emb == 65
    assert model.encoder.embed_tokens.table.weight.shape[1] == 65
    assert_incremental_equals_full(task, model)  # with the narrower soft positions

@pytest.mark.parametrize("extra, needle", [
    (["--tc-min-bond", "4"], "--tc-min-bond"),
    (["--hsoftpos-min-token-dim", "16"], "--hsoftpos-min-token-dim"),
    (["--hsoftpos-levels", "2", "--hsoftpos-min-token-dim", "200"], "--hsoftpos-min-token-dim"),
    (["--tc-ff", "0.1", "--tc-min-bond", "-1"], "--tc-min-bond"),
])
def test_errors_name_the_flag(extra, needle):
    with pytest.raises(ValueError, match=needle):
        build("slim_transformer", SHAPE, False, extra=extra)
