"""Input embeddings of the slim encoder/decoder (docs/DESIGN.md, "Input embedding").

Every input embedding takes the token table the model built and returns the scaled token
embedding plus positions at the model width, ``forward(tokens, incremental_state=None)``.
With an incremental state ``tokens`` is the whole prefix and only the last position is
returned. Dropout is applied by the caller.
"""
import math
from typing import NamedTuple

import torch.nn as nn
from fairseq.modules import PositionalEmbedding
from fairseq.models.transformer import Embedding as FairseqEmbedding

from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding
from slim_fairseq.modules.safe import SAFEInputEmbedding
from slim_fairseq.modules.tensor_chain import TensorChainEmbedding


class Side(NamedTuple):
    """What an input embedding needs to know of the encoder or decoder it feeds."""

    model_dim: int
    max_positions: int
    learned_pos: bool
    normalize_before: bool
    causal: bool


def side_config(cfg, side):
    """:class:`Side` of ``side`` ("encoder" or "decoder") of a TransformerConfig."""
    if side == "encoder":
        sub, max_positions = cfg.encoder, cfg.max_source_positions
    elif side == "decoder":
        sub, max_positions = cfg.decoder, cfg.max_target_positions
    else:
        raise ValueError(f"side={side!r}: not a side of the model; allowed: encoder|decoder")
    return Side(sub.embed_dim, max_positions, bool(sub.learned_pos), bool(sub.normalize_before),
                side == "decoder")


def token_table_dim(cfg, model_dim):
    """Width of the token table a technique needs for a model of width ``model_dim``."""
    if getattr(cfg, "hsoftpos_levels", 0):
        return HSoftPOSEmbedding.token_dim(cfg, model_dim)
    if getattr(cfg, "safe_embed_dim", 0):
        return SAFEInputEmbedding.token_dim(cfg, model_dim)
    return model_dim


def build_token_table(cfg, dictionary, dim):
    """The token table: fairseq's Embedding, or a Tensor-Chain embedding with ``--tc-emb`` (Anthe, arXiv:2305.10991;
    docs/TECHNIQUES.md#tensor-chain)."""
    if getattr(cfg, "tc_emb", 0.0):
        return TensorChainEmbedding(len(dictionary), dim, dictionary.pad(),
                                    ratio=cfg.tc_emb, length=cfg.tc_length,
                                    min_bond=getattr(cfg, "tc_min_bond", 0))
    return FairseqEmbedding(len(dictionary), dim, dictionary.pad())


def build_input_embedding(cfg, table, side):
    """Wrap ``table`` into the input embedding selected by the options (standard, H-SoftPOS,
    SAFE) for ``side`` ("encoder" or "decoder")."""
    settings = side_config(cfg, side)
    if getattr(cfg, "hsoftpos_levels", 0):
        return HSoftPOSEmbedding.from_cfg(cfg, table, settings)
    if getattr(cfg, "safe_embed_dim", 0):
        return SAFEInputEmbedding.from_cfg(cfg, table, settings)
    return StandardInputEmbedding.from_cfg(cfg, table, settings)


class StandardInputEmbedding(nn.Module):
    """fairseq's own input path: ``sqrt(d) * E(x)`` (projected to d if the table is narrower,
    e.g. adaptive input) plus sinusoidal or learned positions -- numerically the same as
    TransformerEncoderBase / TransformerDecoderBase."""

    def __init__(self, table, model_dim, padding_idx, max_positions, learned_pos=False,
                 scale=True, positions=True):
        super().__init__()
        self.table = table
        self.embedding_dim = model_dim
        self.padding_idx = padding_idx
        self.num_embeddings = getattr(table, "num_embeddings", None)
        self.embed_scale = math.sqrt(model_dim) if scale else 1.0
        table_dim = table.embedding_dim
        self.project_in_dim = (nn.Linear(table_dim, model_dim, bias=False)
                               if table_dim != model_dim else None)
        self.embed_positions = (PositionalEmbedding(max_positions, model_dim, padding_idx,
                                                    learned=learned_pos)
                                if positions else None)

    @classmethod
    def from_cfg(cls, cfg, table, side):
        """For ``side`` (:class:`Side`) of the model."""
        # fairseq scales by sqrt(model width) (the encoder's table always has the model width)
        return cls(table, side.model_dim, table.padding_idx, side.max_positions,
                   learned_pos=side.learned_pos,
                   scale=not cfg.no_scale_embedding,
                   positions=not cfg.no_token_positional_embeddings)

    @property
    def weight(self):
        return self.table.weight

    def max_positions(self):
        return self.embed_positions.max_positions if self.embed_positions is not None else None

    def forward(self, tokens, incremental_state=None):
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            tokens = tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.table(tokens)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        return x
