"""The two places where the plugin runs its own copy of a fairseq forward are pinned to
fairseq's output with every option off, so that a change of fairseq's code shows up here:
``SlimMultiheadAttention.forward`` (run on dense weights by forcing it past ``plain``) and
``SlimTransformerDecoder.extract_features_scriptable``."""
import argparse

import pytest
import torch

from helpers import load_plugin

load_plugin()

from fairseq.models.transformer import (  # noqa: E402
    TransformerConfig,
    TransformerDecoderBase,
    base_architecture,
)
from fairseq.modules import MultiheadAttention  # noqa: E402

from slim_fairseq.models.slim_options import set_slim_defaults  # noqa: E402
from slim_fairseq.models.slim_transformer import SlimTransformerDecoder  # noqa: E402
from slim_fairseq.modules.attention import SlimMultiheadAttention  # noqa: E402

TOL = dict(atol=1e-6, rtol=1e-5)


@pytest.fixture
def own_forward(monkeypatch):
    """Every SlimMultiheadAttention runs the plugin's forward, even with plain dense weights."""
    monkeypatch.setattr(SlimMultiheadAttention, "plain", property(lambda self: False))


def _both(module, *args, **kwargs):
    """(fairseq's forward, the plugin's forward) of ``module`` on the same inputs."""
    theirs = MultiheadAttention.forward(module, *args, **kwargs)
    ours = SlimMultiheadAttention.forward(module, *args, **kwargs)
    return theirs, ours


def _causal(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


@pytest.mark.parametrize("need_weights, need_head_weights", [(False, False), (True, False),
                                                              (True, True)])
def test_self_attention_matches_fairseq(own_forward, need_weights, need_head_weights):
    torch.manual_seed(0)
    mha = SlimMultiheadAttention(16, 4, self_attention=True).eval()
    x = torch.randn(6, 3, 16)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    (ref, ref_w), (out, out_w) = _both(mha, x, x, x, key_padding_mask=pad, attn_mask=_causal(6),
                                       need_weights=need_weights,
                                       need_head_weights=need_head_weights)
    torch.testing.assert_close(out, ref, **TOL)
    assert (ref_w is None) == (out_w is None)
    if ref_w is not None:
        if need_head_weights and ref_w.dim() == 3:
            # fairseq's forward hands this case to torch's multi_head_attention_forward, which
            # averages the heads; its own path (and the plugin's) returns them per head
            assert out_w.shape == (4,) + ref_w.shape
            out_w = out_w.mean(dim=0)
        torch.testing.assert_close(out_w, ref_w, **TOL)


def test_incremental_self_attention_matches_fairseq(own_forward):
    """Step by step with fairseq's cache: the same outputs, and a cache fairseq's own forward
    and reorder read (the layouts agree)."""
    torch.manual_seed(1)
    mha = SlimMultiheadAttention(16, 4, self_attention=True).eval()
    x = torch.randn(5, 2, 16)
    theirs_state, ours_state = {}, {}
    for t in range(5):
        step = x[t:t + 1]
        ref, _ = MultiheadAttention.forward(mha, step, step, step, incremental_state=theirs_state,
                                            need_weights=False)
        out, _ = SlimMultiheadAttention.forward(mha, step, step, step,
                                                incremental_state=ours_state, need_weights=False)
        torch.testing.assert_close(out, ref, **TOL)
        if t == 2:
            order = torch.tensor([1, 0])
            mha.reorder_incremental_state(theirs_state, order)
            mha.reorder_incremental_state(ours_state, order)
            x = x[:, order]
    ours, theirs = mha._get_input_buffer(ours_state), mha._get_input_buffer(theirs_state)
    for key in ("prev_key", "prev_value"):
        torch.testing.assert_close(ours[key], theirs[key], **TOL)


@pytest.mark.parametrize("beam", [1, 3])
def test_encoder_decoder_attention_matches_fairseq(own_forward, beam):
    """Cross-attention with static keys cached across steps, source padding, several beams per
    sentence (fairseq keeps one copy of the encoder output per sentence)."""
    torch.manual_seed(2)
    mha = SlimMultiheadAttention(16, 4, kdim=12, vdim=12, encoder_decoder_attention=True).eval()
    mha.set_beam_size(beam)
    sentences, src_len = 2, 7
    enc = torch.randn(src_len, sentences, 12).repeat_interleave(beam, dim=1)
    pad = torch.zeros(sentences, src_len, dtype=torch.bool)
    pad[0, :3] = True  # left padding, as fairseq batches sources
    pad = pad.repeat_interleave(beam, dim=0)
    queries = torch.randn(3, sentences * beam, 16)
    theirs_state, ours_state = {}, {}
    for t in range(3):
        q = queries[t:t + 1]
        ref, ref_w = MultiheadAttention.forward(mha, q, enc, enc, key_padding_mask=pad,
                                                incremental_state=theirs_state, static_kv=True,
                                                need_weights=True)
        out, out_w = SlimMultiheadAttention.forward(mha, q, enc, enc, key_padding_mask=pad,
                                                    incremental_state=ours_state, static_kv=True,
                                                    need_weights=True)
        torch.testing.assert_close(out, ref, **TOL)
        torch.testing.assert_close(out_w, ref_w, **TOL)


def _decoder_cfg():
    args = argparse.Namespace(decoder_embed_dim=16, decoder_ffn_embed_dim=24, decoder_layers=2,
                              decoder_attention_heads=4, encoder_embed_dim=16, dropout=0.0,
                              decoder_normalize_before=True)
    set_slim_defaults(args)
    base_architecture(args)
    return TransformerConfig.from_namespace(args)


def test_decoder_pass_matches_fairseq():
    """With every option off the plugin's decoder is fairseq's: the same parameters, and the
    same features in a full pass with padding and step by step."""
    from fairseq.data import Dictionary
    from fairseq.models.transformer import Embedding

    dictionary = Dictionary()
    for i in range(30):
        dictionary.add_symbol(f"w{i}")
    cfg = _decoder_cfg()
    torch.manual_seed(3)
    theirs = TransformerDecoderBase(cfg, dictionary, Embedding(len(dictionary), 16, dictionary.pad()))
    ours = SlimTransformerDecoder(cfg, dictionary, Embedding(len(dictionary), 16, dictionary.pad()))
    state = {k.replace("embed_tokens.table.", "embed_tokens."): v
             for k, v in ours.state_dict().items()}
    theirs.load_state_dict(state, strict=False)
    missing = set(theirs.state_dict()) - set(state)
    assert missing <= {"version"}, missing
    theirs.eval()
    ours.eval()
    enc = {"encoder_out": [torch.randn(5, 2, 16)],
           "encoder_padding_mask": [torch.tensor([[True, False, False, False, False],
                                                  [False] * 5])]}
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (2, 6))
    tokens[1, 4:] = dictionary.pad()
    with torch.no_grad():
        ref, ref_extra = theirs.extract_features(tokens, encoder_out=enc)
        out, out_extra = ours.extract_features(tokens, encoder_out=enc)
        torch.testing.assert_close(out, ref, **TOL)
        torch.testing.assert_close(out_extra["attn"][0], ref_extra["attn"][0], **TOL)
        theirs_state, ours_state = {}, {}
        for t in range(4):
            ref = theirs.extract_features(tokens[:1, :t + 1], encoder_out=_first(enc),
                                          incremental_state=theirs_state)[0]
            out = ours.extract_features(tokens[:1, :t + 1], encoder_out=_first(enc),
                                        incremental_state=ours_state)[0]
            torch.testing.assert_close(out, ref, **TOL)


def _first(enc):
    return {key: [value[0][:, :1] if key == "encoder_out" else value[0][:1]]
            for key, value in enc.items()}
