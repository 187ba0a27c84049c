"""Built-in cache policies.

``none`` keeps every table wholly in device memory. ``lru`` and ``lfu`` let the planner put
tables in host memory behind a device cache of ``load_factor`` of their rows, evicting by
FBGEMM's LRU or LFU algorithm (TorchRec's ``fused_uvm_caching`` kernel; GPU topologies only:
CPU ranks have no separate device memory, so there the planner keeps every table in place).
"""

from __future__ import annotations

import math

from neo_core import hookimpl
from neo_core.cache import CachePolicy
from neo_core.errors import ConfigError
from neo_core.registry import Registry


def no_cache() -> CachePolicy:
    """No software-managed cache: all rows live in device memory."""
    return CachePolicy(name="none")


def _cached(algorithm: str, load_factor: float, prefetch_pipeline: bool) -> CachePolicy:
    if isinstance(load_factor, bool) or not isinstance(load_factor, (int, float)) or math.isnan(load_factor) \
            or not 0.0 < load_factor <= 1.0:
        raise ConfigError(
            f"cache.load_factor={load_factor!r} must lie in (0, 1]: the share of a cached table's rows "
            "held in device memory (e.g. 0.2)."
        )
    return CachePolicy(
        name=algorithm, load_factor=float(load_factor), algorithm=algorithm, prefetch_pipeline=bool(prefetch_pipeline)
    )


def lru_cache(load_factor: float = 0.2, prefetch_pipeline: bool = False) -> CachePolicy:
    """Host-memory tables behind a device cache of ``load_factor`` of their rows, LRU eviction."""
    return _cached("lru", load_factor, prefetch_pipeline)


def lfu_cache(load_factor: float = 0.2, prefetch_pipeline: bool = False) -> CachePolicy:
    """Host-memory tables behind a device cache of ``load_factor`` of their rows, LFU eviction."""
    return _cached("lfu", load_factor, prefetch_pipeline)


@hookimpl
def neo_register_cache_policies(registry: Registry) -> None:
    registry.register("none", no_cache)
    registry.register("lru", lru_cache)
    registry.register("lfu", lfu_cache)
