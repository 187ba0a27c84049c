"""Datasets: a data plugin describes the tables' inputs and yields batches per rank."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence

from torchrec.datasets.utils import Batch

from neo_core.sharding import TableSpec


class DataSource(abc.ABC):
    """A source of batches: ``torchrec.datasets.utils.Batch`` (dense, sparse KJT, labels)."""

    name: str = "data"

    @property
    @abc.abstractmethod
    def num_dense(self) -> int:
        """Number of dense (continuous) features per sample."""

    @abc.abstractmethod
    def tables(self, embedding_dim: int) -> Sequence[TableSpec]:
        """The embedding tables this data's sparse features look up."""

    @abc.abstractmethod
    def batches(
        self, split: str, rank: int, world_size: int, batch_size: int, start_step: int = 0
    ) -> Iterator[Batch]:
        """Yield this rank's part of each global batch of ``split`` ("train" or "val").

        ``batch_size`` is per rank; rank ``r`` gets rows ``[r*B, (r+1)*B)`` of every global
        batch of ``B * world_size`` samples, so the same global batch size (2 ranks of 64, 1 of
        128) sees the same global batches on any world size. ``start_step`` resumes.
        """
