"""Whole-model initialisations the options select (docs/TECHNIQUES.md#subformer-training-setup,
#stlm-block): ``--bert-init`` and ``--init-std``. Tensor-Chain cores, norms and the
technique-specific parameters (gates' projections aside) keep their own init."""
import math

import torch
import torch.nn as nn


def bert_init_(model: nn.Module):
    """BERT-style initialisation (the Subformer training setup): every Linear and Embedding
    weight ~ N(0, 0.02), Linear biases zero, embedding padding rows zero."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
    return model


def _residual_outputs(layer):
    """The linears of a layer whose output is added to the residual stream."""
    for name in ("self_attn", "encoder_attn"):
        attn = getattr(layer, name, None)
        out = getattr(attn, "out_proj", None)
        if isinstance(out, nn.Linear):
            yield out
        inner = getattr(attn, "attention", None)  # a sandwich's projected cross-attention
        if isinstance(getattr(inner, "out_proj", None), nn.Linear):
            yield inner.out_proj
    if isinstance(getattr(layer, "fc2", None), nn.Linear):
        yield layer.fc2


def gpt2_init_(model: nn.Module, std: float, stacks):
    """GPT-2 initialisation (``--init-std S``; the STLM block's): every Linear and Embedding
    weight ~ N(0, S), Linear biases zero, embedding padding rows zero, and the linears that add
    to the residual stream ~ N(0, S / sqrt(2 L)) for a stack of L layers (``stacks``: the layer
    lists)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
    for layers in stacks:
        residual_std = std / math.sqrt(2 * len(layers))
        for layer in layers:
            for linear in _residual_outputs(layer):
                nn.init.normal_(linear.weight, mean=0.0, std=residual_std)
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    return model
