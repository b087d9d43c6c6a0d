"""Input embeddings of the slim encoder/decoder (docs/DESIGN.md, "Input embedding").

Every input embedding takes the token table the model built and returns the scaled token
embedding plus positions at the model width, ``forward(tokens, incremental_state=None)``.
With an incremental state ``tokens`` is the whole prefix and only the last position is
returned. Dropout is applied by the caller.
"""
import math

import torch.nn as nn
from fairseq.modules import PositionalEmbedding
from fairseq.models.transformer import Embedding as FairseqEmbedding


def side_config(cfg, side):
    """(model width, max positions, learned positions) of one side of a TransformerConfig."""
    if side == "encoder":
        return cfg.encoder.embed_dim, cfg.max_source_positions, cfg.encoder.learned_pos
    if side == "decoder":
        return cfg.decoder.embed_dim, cfg.max_target_positions, cfg.decoder.learned_pos
    raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")


def token_table_dim(cfg, model_dim):
    """Width of the token table a technique needs for a model of width ``model_dim``."""
    if getattr(cfg, "hsoftpos_levels", 0):
        from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding
        return HSoftPOSEmbedding.token_dim(cfg, model_dim)
    if getattr(cfg, "safe_embed_dim", 0):
        from slim_fairseq.modules.safe import SAFEInputEmbedding
        return SAFEInputEmbedding.token_dim(cfg, model_dim)
    return model_dim


def build_token_table(cfg, dictionary, dim):
    """The token table: fairseq's Embedding, or a Tensor-Chain embedding with ``--tc-emb`` (Anthe, arXiv:2305.10991;
    docs/TECHNIQUES.md#tensor-chain)."""
    if getattr(cfg, "tc_emb", 0.0):
        from slim_fairseq.modules.tensor_chain import TensorChainEmbedding
        return TensorChainEmbedding(len(dictionary), dim, dictionary.pad(),
                                    ratio=cfg.tc_emb, length=cfg.tc_length,
                                    min_bond=getattr(cfg, "tc_min_bond", 0))
    return FairseqEmbedding(len(dictionary), dim, dictionary.pad())


def build_input_embedding(cfg, table, side):
    """Wrap ``table`` into the input embedding selected by the options (standard, H-SoftPOS, SAFE)."""
    if getattr(cfg, "hsoftpos_levels", 0):
        from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding
        return HSoftPOSEmbedding.from_cfg(cfg, table, side)
    if getattr(cfg, "safe_embed_dim", 0):
        from slim_fairseq.modules.safe import SAFEInputEmbedding
        return SAFEInputEmbedding.from_cfg(cfg, table, side)
    return StandardInputEmbedding.from_cfg(cfg, table, side)


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
        model_dim, max_positions, learned = side_config(cfg, side)
        # fairseq scales by sqrt(model width) (the encoder's table always has the model width)
        return cls(table, model_dim, table.padding_idx, max_positions, learned_pos=learned,
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
