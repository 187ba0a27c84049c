"""A rank's view of a data source as a sized ``IterableDataset`` for Lightning."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from neo_core.data import DataSource


class RankStream(IterableDataset):
    """``length`` batches of ``split`` for one rank, starting at global step ``start_step``.

    It reports its full length so Lightning's progress bar and resume logic know the epoch,
    and starts at ``start_step`` so a resumed run sees the batches the interrupted one would.
    """

    def __init__(
        self,
        data: DataSource,
        split: str,
        rank: int,
        world_size: int,
        batch_size: int,
        start_step: int,
        length: int,
    ) -> None:
        self.data = data
        self.split = split
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.start_step = start_step
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Batch]:
        stream = self.data.batches(self.split, self.rank, self.world_size, self.batch_size, self.start_step)
        return itertools.islice(stream, self.length)
