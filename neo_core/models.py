"""Models: a model plugin builds the network around the embedding tables."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from neo_core.sharding import TableSpec


def embedding_bag_collection(tables: Sequence[TableSpec], device: str = "meta") -> EmbeddingBagCollection:
    """One TorchRec EmbeddingBagCollection holding every table (no memory on "meta")."""
    configs = [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


class ModelBuilder(abc.ABC):
    """Builds a model whose ``forward(dense, sparse)`` returns one logit per sample.

    ``dense`` is a float tensor ``[batch, num_dense]``; ``sparse`` a TorchRec
    ``KeyedJaggedTensor`` whose keys are the tables' feature names. The embedding tables
    must live in TorchRec ``EmbeddingBagCollection`` modules so they can be sharded.
    """

    name: str = "model"

    @abc.abstractmethod
    def build(self, tables: Sequence[TableSpec], num_dense: int, device: str = "meta") -> nn.Module:
        """The model with its embedding tables on ``device`` ("meta": allocate nothing)."""

    def check(self, tables: Sequence[TableSpec], num_dense: int) -> None:
        """Raise :class:`neo_core.errors.ConfigError` if the tables do not suit this model."""
        return None
