"""SAFE: self-attentive factorised embeddings of the Subformer (arXiv:2101.00234; docs/TECHNIQUES.md#safe-embeddings);
its maths is :mod:`slim_fairseq.modules.safe_function` (plain torch, the file an export copies),
this module fairseq's edge (positions, dropout, incremental state).

Input side (one module per side; the token table E(V, d_e) may be shared by both)::

    x   = E(S) * sqrt(d_e) + sinusoidal_positions(d_e); dropout
    x   = LN_{d_e}(x + drop(SelfAttn_{d_e}(x)))          # causal in the decoder
    out = LN_{d_m}(drop(fc2_{d_e->d_m}(relu(fc1_{d_e->d_e}(x)))))

Output side: ``logits = E(W_{d_m->d_e} h + b)`` tied with the token table (reference form,
``--safe-output linear``) or with a nonlinearity between the two (``--safe-output mlp``).

Bugs of the reference avoided here: the decoder is scaled by sqrt(d_e) (not sqrt(d_m)) and
gets positions; pre-norm works (``normalize_before`` moves the d_e LayerNorm in front of the
attention); the decoder attention keeps its own incremental state (step-by-step decoding
equals the full forward).
"""
import math
from typing import Dict, Optional

import torch
import torch.nn as nn
from torch import Tensor

from fairseq import utils
from fairseq.modules import LayerNorm, PositionalEmbedding
from fairseq.modules.fairseq_dropout import FairseqDropout

from slim_fairseq.modules.activations import activation_function
from slim_fairseq.modules.attention import SlimMultiheadAttention, heads_for
from slim_fairseq.modules.safe_function import safe_embedding, safe_logits


def safe_attention_heads(embed_dim: int) -> int:
    """Heads of the SAFE attention: width // 64 (the sandwich rule), lowered until it divides
    the width (e.g. d_e = 350 -> 5 heads of 70)."""
    return heads_for(embed_dim)


class SAFEInputEmbedding(nn.Module):
    """SAFE input embedding of one side (docs/TECHNIQUES.md#safe-embeddings); see the module docstring.

    ``forward(tokens, incremental_state=None) -> (B, T, d_m)``; with an incremental state
    ``tokens`` is the whole prefix and only the last position is computed (the attention
    keys/values of earlier positions come from this module's own attention cache).
    """

    def __init__(self, table, model_dim, causal, dropout=0.0, attention_dropout=0.0,
                 max_positions=1024, learned_pos=False, normalize_before=False,
                 scale=True, positions=True, attention_heads=0):
        super().__init__()
        assert isinstance(table, nn.Embedding), type(table).__name__  # (the options' rule)
        self.table = table
        self.padding_idx = table.padding_idx
        self.num_embeddings = table.num_embeddings
        self.safe_dim = token_dim = table.embedding_dim
        self.embedding_dim = model_dim
        self.causal = causal
        self.normalize_before = normalize_before
        self.embed_scale = math.sqrt(token_dim) if scale else 1.0
        self.embed_positions = (
            PositionalEmbedding(max_positions, token_dim, self.padding_idx, learned=learned_pos)
            if positions else None)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        heads = attention_heads or safe_attention_heads(token_dim)
        if token_dim % heads:
            raise ValueError(f"attention_heads={heads}: does not divide the table width "
                             f"{token_dim}; allowed: a divisor of {token_dim} (0 = width // 64)")
        # the plugin's attention with no technique on: fairseq's parameters and init, and one
        # softmax in the model's dtype in the full pass and in each step alike (fairseq's own
        # runs a step's softmax in float32, which a float64 check cannot tell from a bug)
        self.self_attn = SlimMultiheadAttention(token_dim, heads, dropout=attention_dropout,
                                                self_attention=True)
        self.self_attn_layer_norm = LayerNorm(token_dim)
        self.fc1 = nn.Linear(token_dim, token_dim)
        self.fc2 = nn.Linear(token_dim, model_dim)
        self.output_layer_norm = LayerNorm(model_dim)

    @classmethod
    def from_spec(cls, spec, table):
        """For the side :class:`~slim_fairseq.specs.EmbeddingSpec` describes."""
        return cls(table, spec.model_dim, causal=spec.causal, dropout=spec.dropout,
                   attention_dropout=spec.attention_dropout, max_positions=spec.max_positions,
                   learned_pos=spec.learned_pos, normalize_before=spec.normalize_before,
                   scale=spec.scale, positions=spec.positions)

    @property
    def weight(self):
        return self.table.weight

    def max_positions(self):
        return self.embed_positions.max_positions if self.embed_positions is not None else None

    def forward(self, tokens: Tensor,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            if not self.causal:
                raise ValueError("incremental_state: the encoder's SAFE embedding is not causal; "
                                 "allowed: incremental decoding with the decoder's")
            tokens = tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.table(tokens)
        if positions is not None:
            x = x + positions
        x = self.dropout_module(x)

        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        attn_mask = None
        key_padding_mask = None
        if incremental_state is None:
            pad = tokens.eq(self.padding_idx)
            if pad.any():
                key_padding_mask = pad
            if self.causal:
                seq_len = x.size(0)
                attn_mask = torch.triu(
                    utils.fill_with_neg_inf(x.new_zeros(seq_len, seq_len)), 1)

        def attend(y):
            return self.self_attn(query=y, key=y, value=y, key_padding_mask=key_padding_mask,
                                  incremental_state=incremental_state, need_weights=False,
                                  attn_mask=attn_mask)[0]

        x = safe_embedding(x, attend, self.self_attn_layer_norm, self.fc1, self.fc2,
                           self.output_layer_norm, self.normalize_before, self.dropout_module)
        return x.transpose(0, 1)


class SAFEOutputProjection(nn.Module):
    """Tied SAFE output path ``logits = E(W h + b)`` (docs/TECHNIQUES.md#safe-embeddings).

    ``mlp=False`` is the reference's two linears; ``mlp=True`` puts ``activation`` between
    them (the paper's "two-layer MLP"). The vocabulary projection is the token table itself
    (no bias), so only ``W`` (d_m x d_e) and ``b`` are new parameters.
    """

    def __init__(self, table, model_dim, mlp=False, activation="relu"):
        super().__init__()
        assert isinstance(table, nn.Embedding), type(table).__name__  # (the options' rule)
        self.table = table
        self.proj = nn.Linear(model_dim, table.embedding_dim)
        self.activation_fn = activation_function(activation) if mlp else None

    @classmethod
    def from_spec(cls, spec, table, model_dim, vocab_size):
        """With the :class:`~slim_fairseq.specs.SAFEOutputSpec` ``spec``, tied to the decoder's
        table of ``vocab_size`` types."""
        if table.num_embeddings != vocab_size:
            raise ValueError(f"table={table.num_embeddings} types: the tied output needs the "
                             f"decoder's own table of {vocab_size} types; allowed: the target "
                             "dictionary's table")
        return cls(table, model_dim, mlp=spec.mlp, activation=spec.activation)

    @property
    def weight(self):
        return self.table.weight

    def forward(self, features: Tensor) -> Tensor:
        return safe_logits(features, self.proj, self.table.weight, self.activation_fn)
