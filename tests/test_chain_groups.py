"""Tensor-Chain weights of one shape built together: in a training forward every two-core chain
weight of one shape, across all layers of the model, comes from one batched product
(tensor_chain.ChainWeights), and the model's loss and gradients are those of building each
weight alone."""
import contextlib

import pytest
import torch

from helpers import build
from slim_fairseq.modules import attention, glu, tensor_chain
from slim_fairseq.models import slim_transformer
from slim_fairseq.modules.tensor_chain import TensorChainLinear, built_together


def _tiny_anthe():
    torch.manual_seed(0)
    args, task, model = build("anthe_base", ["--encoder-layers", "2", "--decoder-layers", "2"], False)
    return task, model


def _loss_and_grads(model, task):
    torch.manual_seed(1)
    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(task.source_dictionary), (2, 6))
    prev = torch.randint(d.nspecial, len(d), (2, 5))
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng():
        torch.manual_seed(2)
        out, _ = model(src, torch.tensor([6, 6]), prev)
    loss = out.float().square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_training_forward_builds_each_shape_of_chain_weights_once(monkeypatch):
    task, model = _tiny_anthe()
    for m in model.modules():
        if isinstance(m, TensorChainLinear):
            m.forward_mode = "materialise"
    shapes = {tuple(c.shape for c in m.cores) for m in model.modules()
              if isinstance(m, TensorChainLinear)}
    chains = [m for m in model.modules() if isinstance(m, TensorChainLinear)]
    calls = []
    real = tensor_chain.ChainWeights.apply
    monkeypatch.setattr(tensor_chain.ChainWeights, "apply",
                        lambda count, *cores: calls.append(count) or real(count, *cores))
    together = _loss_and_grads(model, task)
    assert len(calls) == len(shapes) and sum(calls) == len(chains)
    null = lambda *a, **k: contextlib.nullcontext()  # noqa: E731
    for module in (slim_transformer, attention, glu):
        monkeypatch.setattr(module, "built_together", null)
    calls.clear()
    alone = _loss_and_grads(model, task)
    assert calls == []
    torch.testing.assert_close(together[0], alone[0])
    assert together[1].keys() == alone[1].keys()
    for name, grad in together[1].items():
        torch.testing.assert_close(grad, alone[1][name], atol=1e-6, rtol=1e-5, msg=name)


def test_weights_built_together_take_gradients_of_gradients():
    torch.manual_seed(0)
    layers = [TensorChainLinear(12, 20, bond=3, forward_mode="materialise") for _ in range(3)]
    x = torch.randn(5, 12, requires_grad=True)

    def second_order(group):
        context = built_together(layers) if group else contextlib.nullcontext()
        with context:
            y = sum(layer(x) for layer in layers[:2])  # the third one's weight goes unused
        (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [c for layer in layers for c in layer.cores],
                                   allow_unused=True)

    for a, b in zip(second_order(True), second_order(False)):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b)
