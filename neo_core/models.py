"""Models: a model plugin builds the network around the embedding tables."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from torch import nn

from neo_core.sharding import TableSpec


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
