"""The plugin's attention in fewer launches with fairseq's results: a sandwich stack's attentions
with no technique on are the plugin's (fairseq's parameters, outputs and incremental state),
ungated dense projections that read one input multiply by their stacked weights in training
under autocast, and a decoding step's single position changes layout in one op."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from helpers import build
from slim_fairseq.models import slim_transformer
from slim_fairseq.modules.attention import SlimMultiheadAttention, build_attention
from slim_fairseq.specs import PLAIN_ATTENTION

SMALL = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-layers", "3",
         "--decoder-layers", "3", "--dropout", "0", "--attention-dropout", "0"]


def _batch(task, seed=1):
    torch.manual_seed(seed)
    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(task.source_dictionary), (2, 7))
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    return src, torch.tensor([7, 7]), prev


def _attentions(model):
    return [m for name, m in model.named_modules()
            if isinstance(m, (MultiheadAttention, SlimMultiheadAttention))
            and ".layers." in f".{name}"]


def test_a_sandwich_stack_runs_the_plugins_attention_with_fairseqs_outputs(monkeypatch):
    _, task, lean = build("subformer_base", SMALL, False)
    assert _attentions(lean) and all(type(a) is SlimMultiheadAttention for a in _attentions(lean))
    monkeypatch.setattr(slim_transformer, "_plugin_attention", lambda spec: spec)
    _, _, fairseq_attention = build("subformer_base", SMALL, False)
    assert all(type(a) is MultiheadAttention for a in _attentions(fairseq_attention))
    assert lean.state_dict().keys() == fairseq_attention.state_dict().keys()
    for name, value in lean.state_dict().items():  # the same init: fairseq's, in its order
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, fairseq_attention.state_dict()[name], msg=name)
    lean.eval(), fairseq_attention.eval()
    src, lengths, prev = _batch(task)
    with torch.no_grad():
        torch.testing.assert_close(lean(src, lengths, prev)[0],
                                   fairseq_attention(src, lengths, prev)[0], atol=1e-5, rtol=1e-5)


def test_fairseqs_own_arguments_keep_fairseqs_attention():
    built = build_attention(PLAIN_ATTENTION, 16, 2, role="decoder_self", dropout=0.0,
                            plugin=True, add_bias_kv=True)
    assert type(built) is MultiheadAttention
    assert type(build_attention(PLAIN_ATTENTION, 16, 2, role="decoder_self", dropout=0.0,
                                plugin=True)) is SlimMultiheadAttention


def _loss_and_grads(model, task):
    model.train()
    model.zero_grad(set_to_none=True)
    src, lengths, prev = _batch(task)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = model(src, lengths, prev)
        loss = out.float().square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("arch, extra", [("subformer_base", []),
                                         ("slim_transformer", ["--kv-heads", "2"])])
def test_stacked_projections_give_the_losses_and_gradients_of_three(monkeypatch, arch, extra):
    _, task, model = build(arch, SMALL + extra, False)
    calls = []
    real = SlimMultiheadAttention._stacked_projections
    monkeypatch.setattr(SlimMultiheadAttention, "_stacked_projections",
                        lambda self, q, k: calls.append(self) or real(self, q, k))
    stacked = _loss_and_grads(model, task)
    assert {a.self_attention for a in calls} == {True, False}  # self- and cross-attentions
    monkeypatch.setattr(SlimMultiheadAttention, "_stacks_weights", lambda self, q, k: False)
    calls.clear()
    alone = _loss_and_grads(model, task)
    assert calls == []
    torch.testing.assert_close(stacked[0], alone[0])
    assert stacked[1].keys() == alone[1].keys()
    for name, grad in stacked[1].items():
        torch.testing.assert_close(grad, alone[1][name], atol=2e-3, rtol=2e-2, msg=name)


def test_a_single_position_changes_layout_in_one_op():
    from slim_fairseq.modules.attention import _heads, _merge_heads
    from slim_fairseq_lab.benchmark.op_count import count_ops
    x = torch.randn(1, 3, 4 * 8)
    heads = _heads(x, 4, 8)
    torch.testing.assert_close(heads, x.view(1, 3, 4, 8).permute(1, 2, 0, 3), rtol=0, atol=0)
    torch.testing.assert_close(_merge_heads(heads), x, rtol=0, atol=0)
    assert count_ops(lambda: _heads(x, 4, 8)).top == 1
    assert count_ops(lambda: _merge_heads(heads)).top == 1
    longer = torch.randn(2, 3, 32)  # more positions: a view and a permute each way
    torch.testing.assert_close(_merge_heads(_heads(longer, 4, 8)), longer, rtol=0, atol=0)
