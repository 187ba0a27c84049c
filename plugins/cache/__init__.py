"""Built-in cache policies: ``none`` keeps every table wholly in device memory."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.cache import CachePolicy
from neo_core.registry import Registry


def no_cache() -> CachePolicy:
    """No software-managed cache: all rows live in device memory."""
    return CachePolicy(name="none")


@hookimpl
def neo_register_cache_policies(registry: Registry) -> None:
    registry.register("none", no_cache)
