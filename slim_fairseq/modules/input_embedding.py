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

from slim_fairseq.modules.hsoftpos import HSoftPOSEmbedding, hsoftpos_dims
from slim_fairseq.modules.safe import SAFEInputEmbedding
from slim_fairseq.modules.tensor_chain import TensorChainEmbedding
from slim_fairseq.specs import ChainSpec, EmbeddingSpec


# the module of each input embedding registered from outside, by its spec's class
# (slim_fairseq.models.slim_layers.register_input_embedding fills it)
INPUT_EMBEDDINGS = {}


def token_table_dim(spec: EmbeddingSpec):
    """Width of the token table the input embedding of ``spec`` needs (a registered one's
    ``table_dim(spec)``, else the model width)."""
    if spec.variant is not None:
        module_cls = INPUT_EMBEDDINGS[type(spec.variant)]
        return module_cls.table_dim(spec) if hasattr(module_cls, "table_dim") else spec.model_dim
    if spec.hsoftpos_levels:
        return hsoftpos_dims(spec.model_dim, spec.hsoftpos_levels, spec.hsoftpos_min_token_dim)[2]
    if spec.safe_dim:
        return spec.safe_dim
    return spec.model_dim


def build_token_table(chain: ChainSpec, dictionary, dim):
    """The token table: fairseq's Embedding, or a Tensor-Chain embedding (``--tc-emb``; Anthe,
    arXiv:2305.10991; docs/TECHNIQUES.md#tensor-chain)."""
    if chain.ratio:
        return TensorChainEmbedding(len(dictionary), dim, dictionary.pad(), ratio=chain.ratio,
                                    length=chain.length, min_bond=chain.min_bond)
    return FairseqEmbedding(len(dictionary), dim, dictionary.pad())


def build_input_embedding(spec: EmbeddingSpec, table):
    """Wrap ``table`` into the input embedding ``spec`` selects (standard, H-SoftPOS, SAFE, or
    one registered from outside)."""
    if spec.variant is not None:
        return INPUT_EMBEDDINGS[type(spec.variant)].from_spec(spec, table)
    if spec.hsoftpos_levels:
        return HSoftPOSEmbedding.from_spec(spec, table)
    if spec.safe_dim:
        return SAFEInputEmbedding.from_spec(spec, table)
    return StandardInputEmbedding.from_spec(spec, table)


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
    def from_spec(cls, spec: EmbeddingSpec, table):
        # fairseq scales by sqrt(model width) (the encoder's table always has the model width)
        return cls(table, spec.model_dim, table.padding_idx, spec.max_positions,
                   learned_pos=spec.learned_pos, scale=spec.scale, positions=spec.positions)

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
