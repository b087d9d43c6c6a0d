"""The plugin's own forwards are pinned to fairseq's output with every option off, so that a
change of fairseq's code shows up here: ``SlimMultiheadAttention`` (a sibling of fairseq's
``MultiheadAttention``, run on the same dense weights) and
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
from slim_fairseq.modules.attention import SlimMultiheadAttention, mark_causal  # noqa: E402

TOL = dict(atol=1e-6, rtol=1e-5)


def _pair(*args, **kwargs):
    """(fairseq's attention, the plugin's) with the same weights, in eval mode."""
    theirs = MultiheadAttention(*args, **kwargs).eval()
    ours = SlimMultiheadAttention(*args, **kwargs).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _causal(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


@pytest.mark.parametrize("need_weights, need_head_weights", [(False, False), (True, False),
                                                              (True, True)])
@pytest.mark.parametrize("marked", [False, True])
def test_self_attention_matches_fairseq(need_weights, need_head_weights, marked):
    """Padding and the future mask, fused or explicit; a marked future mask (the decoder's)
    runs the fused causal kernel and gives the same outputs."""
    torch.manual_seed(0)
    theirs, ours = _pair(16, 4, self_attention=True)
    x = torch.randn(6, 3, 16)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    mask = mark_causal(_causal(6)) if marked else _causal(6)
    kwargs = dict(key_padding_mask=pad, attn_mask=mask, need_weights=need_weights,
                  need_head_weights=need_head_weights)
    ref, ref_w = theirs(x, x, x, **kwargs)
    out, out_w = ours(x, x, x, **kwargs)
    torch.testing.assert_close(out, ref, **TOL)
    assert (ref_w is None) == (out_w is None)
    if ref_w is not None:
        if need_head_weights and ref_w.dim() == 3:
            # fairseq's forward hands this case to torch's multi_head_attention_forward, which
            # averages the heads; its own path (and the plugin's) returns them per head
            assert out_w.shape == (4,) + ref_w.shape
            out_w = out_w.mean(dim=0)
        torch.testing.assert_close(out_w, ref_w, **TOL)
    if marked:  # without padding the fused causal kernel runs
        torch.testing.assert_close(ours(x, x, x, attn_mask=mask, need_weights=False)[0],
                                   theirs(x, x, x, attn_mask=_causal(6), need_weights=False)[0], **TOL)


def test_before_softmax_matches_fairseq():
    torch.manual_seed(4)
    theirs, ours = _pair(16, 4, self_attention=True)
    x = torch.randn(5, 2, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 3:] = True
    # an incremental state keeps fairseq off torch's fused path, which ignores before_softmax
    ref = theirs(x, x, x, key_padding_mask=pad, attn_mask=_causal(5), before_softmax=True,
                 incremental_state={})
    out = ours(x, x, x, key_padding_mask=pad, attn_mask=_causal(5), before_softmax=True,
               incremental_state={})
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, **TOL)


def test_incremental_self_attention_matches_fairseq():
    """Step by step with fairseq's cache: the same outputs, and a cache fairseq's own forward
    and reorder read (the layouts agree)."""
    torch.manual_seed(1)
    theirs, ours = _pair(16, 4, self_attention=True)
    x = torch.randn(5, 2, 16)
    theirs_state, ours_state = {}, {}
    for t in range(5):
        step = x[t:t + 1]
        ref, _ = theirs(step, step, step, incremental_state=theirs_state, need_weights=False)
        out, _ = ours(step, step, step, incremental_state=ours_state, need_weights=False)
        torch.testing.assert_close(out, ref, **TOL)
        if t == 2:
            order = torch.tensor([1, 0])
            theirs.reorder_incremental_state(theirs_state, order)
            ours.reorder_incremental_state(ours_state, order)
            x = x[:, order]
    mine, fairseqs = ours._get_input_buffer(ours_state), theirs._get_input_buffer(theirs_state)
    for key in ("prev_key", "prev_value"):
        torch.testing.assert_close(mine[key], fairseqs[key], **TOL)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("need_weights", [True, False])
def test_encoder_decoder_attention_matches_fairseq(beam, need_weights):
    """Cross-attention with static keys cached across steps, source padding, several beams per
    sentence (fairseq keeps one copy of the encoder output per sentence), with and without
    attention weights."""
    torch.manual_seed(2)
    theirs, ours = _pair(16, 4, kdim=12, vdim=12, encoder_decoder_attention=True)
    theirs.set_beam_size(beam)
    ours.set_beam_size(beam)
    sentences, src_len = 2, 7
    enc = torch.randn(src_len, sentences, 12).repeat_interleave(beam, dim=1)
    pad = torch.zeros(sentences, src_len, dtype=torch.bool)
    pad[0, :3] = True  # left padding, as fairseq batches sources
    pad = pad.repeat_interleave(beam, dim=0)
    queries = torch.randn(3, sentences * beam, 16)
    theirs_state, ours_state = {}, {}
    for t in range(3):
        q = queries[t:t + 1]
        ref, ref_w = theirs(q, enc, enc, key_padding_mask=pad, incremental_state=theirs_state,
                            static_kv=True, need_weights=need_weights)
        out, out_w = ours(q, enc, enc, key_padding_mask=pad, incremental_state=ours_state,
                          static_kv=True, need_weights=need_weights)
        torch.testing.assert_close(out, ref, **TOL)
        if need_weights:
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
