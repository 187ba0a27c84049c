"""Cache policies: which embedding rows live in fast memory over a slower tier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neo_core.checks import is_number
from neo_core.errors import ConfigError


@dataclass(frozen=True)
class CachePolicy:
    """A software-managed cache in front of host-memory tables (GPU topologies).

    ``load_factor`` is the fraction of a table's rows held in device memory; ``None`` means
    no caching: every table lives entirely in device memory (the plan says so for a policy
    other than ``none``: ``CachePolicy("lru")`` caches nothing; the ``lru`` plugin's default
    share is 0.2).
    """

    name: str
    load_factor: float | None = None
    # FBGEMM CacheAlgorithm name, "lru" or "lfu"; None: the policy's name when it is one of
    # those (CachePolicy("lfu", 0.1) evicts by LFU), else "lru". Stored resolved, so a copy
    # under another algorithm's name says algorithm=None (dataclasses.replace)
    algorithm: str | None = None
    prefetch_pipeline: bool = False

    def __post_init__(self) -> None:
        named = self.name.lower() if isinstance(self.name, str) and self.name.lower() in ("lru", "lfu") else None
        if self.algorithm is None:
            object.__setattr__(self, "algorithm", named or "lru")
        lf = self.load_factor
        if lf is not None and (not is_number(lf) or not 0.0 < lf <= 1.0):
            raise ConfigError(
                f"cache.load_factor={lf!r} (cache {self.name!r}) must lie in (0, 1]: the share of a cached "
                "table's rows held in device memory (e.g. 0.2); use cache=none for no cache."
            )
        if lf is not None:
            object.__setattr__(self, "load_factor", float(lf))  # numpy or int in, a float kept
        if lf is not None and isinstance(self.name, str) and self.name.lower() == "none":
            raise ConfigError(
                f"cache 'none' with load_factor={lf!r}: the policy named none caches nothing; name an "
                f"eviction algorithm instead, e.g. CachePolicy('lru', {lf!r}) (cache=lru cache.load_factor={lf!r})."
            )
        if not isinstance(self.prefetch_pipeline, bool):
            raise ConfigError(
                f"cache.prefetch_pipeline must be true or false, got {self.prefetch_pipeline!r} (cache {self.name!r})."
            )
        if not isinstance(self.algorithm, str) or self.algorithm.lower() not in ("lru", "lfu"):
            raise ConfigError(
                f"cache algorithm {self.algorithm!r} (cache {self.name!r}) is not one FBGEMM's cache "
                "implements; choose lru or lfu."
            )
        if self.prefetch_pipeline and self.algorithm.lower() != "lru":
            raise ConfigError(
                f"cache {self.name!r}: prefetch_pipeline=true needs LRU eviction, as FBGEMM's cache prefetches only "
                f"under LRU (it evicts by {self.algorithm.upper()}); use cache=lru cache.prefetch_pipeline=true, or "
                "leave prefetch_pipeline false."
            )
        if named and self.algorithm.lower() != named:
            raise ConfigError(
                f"cache {self.name!r} with algorithm={self.algorithm!r}: the policy's name is an eviction "
                f"algorithm of its own; use CachePolicy({self.algorithm.lower()!r}, ...) or leave algorithm out "
                "(a copy under a new name: dataclasses.replace(policy, name=..., algorithm=None))."
            )

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
