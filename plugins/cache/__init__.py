"""Built-in cache policies.

``none`` keeps every table wholly in device memory. ``lru`` and ``lfu`` let the planner put
tables in host memory behind a device cache of ``load_factor`` of their rows, evicting by
FBGEMM's LRU or LFU algorithm (TorchRec's ``fused_uvm_caching`` kernel; GPU topologies only:
CPU ranks have no separate device memory, so there the planner keeps every table in place).
``prefetch_pipeline`` (``lru`` only: FBGEMM prefetches only under LRU) builds FBGEMM's cache for a prefetching train pipeline (a lock counter
per slot, which the planner counts in device memory); Neo's training loop runs no such
pipeline, so the cache fetches its missed rows inside each forward, as without it.
"""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.cache import CachePolicy
from neo_core.registry import Registry


def no_cache() -> CachePolicy:
    """No software-managed cache: all rows live in device memory."""
    return CachePolicy(name="none")


def _cached(algorithm: str, load_factor: float, prefetch_pipeline: bool) -> CachePolicy:
    # CachePolicy checks the share (0, 1] and the algorithm
    return CachePolicy(name=algorithm, load_factor=load_factor, algorithm=algorithm, prefetch_pipeline=prefetch_pipeline)


def lru_cache(load_factor: float = 0.2, prefetch_pipeline: bool = False) -> CachePolicy:
    """Host-memory tables behind a device cache of ``load_factor`` of their rows, LRU eviction."""
    return _cached("lru", load_factor, prefetch_pipeline)


def lfu_cache(load_factor: float = 0.2, prefetch_pipeline: bool = False) -> CachePolicy:
    """Host-memory tables behind a device cache of ``load_factor`` of their rows, LFU eviction."""
    return _cached("lfu", load_factor, prefetch_pipeline)  # prefetch_pipeline=true is refused: LRU only


@hookimpl
def neo_register_cache_policies(registry: Registry) -> None:
    registry.register("none", no_cache)
    registry.register("lru", lru_cache)
    registry.register("lfu", lfu_cache)
