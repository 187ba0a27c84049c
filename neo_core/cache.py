"""Cache policies: which embedding rows live in fast memory over a slower tier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CachePolicy:
    """A software-managed cache in front of host-memory tables (GPU topologies).

    ``load_factor`` is the fraction of a table's rows held in device memory; ``None`` means
    no caching: every table lives entirely in device memory.
    """

    name: str
    load_factor: float | None = None
    algorithm: str = "lru"  # FBGEMM CacheAlgorithm name: "lru" or "lfu"
    prefetch_pipeline: bool = False

    def cache_params(self) -> Any:
        """TorchRec ``CacheParams`` for tables placed behind the cache, or None."""
        if self.load_factor is None:
            return None
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
        from torchrec.distributed.types import CacheParams

        return CacheParams(
            algorithm=CacheAlgorithm[self.algorithm.upper()],
            load_factor=self.load_factor,
            prefetch_pipeline=self.prefetch_pipeline,
        )
