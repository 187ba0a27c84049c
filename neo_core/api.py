"""Public Python API: plan embedding tables onto a cluster without building a model.

>>> from neo_core.api import plan_tables
>>> from neo_core.sharding import TableSpec
>>> result = plan_tables([TableSpec("t0", 10_000_000, 128, 20.0)], "zionex", 512)
>>> print(result.format_text())

Plugins may be given as objects or by registry name (``"zionex"``, ``"fp16"``); names are
resolved through the plugin manager, so third-party plugins work the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from neo_core.cache import CachePolicy
from neo_core.checks import as_whole
from neo_core.compression import Compressor
from neo_core.errors import ConfigError
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import (
    Planner,
    PlanningContext,
    PlanResult,
    TableSpec,
    check_plan,
    check_table_names,
    check_table_specs,
)
from neo_core.topology import Topology

__all__ = ["make_context", "plan_tables", "resolve"]

_TYPES: dict[str, type] = {
    "topology": Topology,
    "kernel": EmbeddingKernel,
    "cache": CachePolicy,
    "compression": Compressor,
    "sharding": Planner,
}


def _default(group: str) -> Any:
    """Built-in defaults that need no plugin: fused row-wise Adagrad, no compression, no cache."""
    if group == "kernel":
        return EmbeddingKernel("fused", "fused", SparseOptimizer.ROWWISE_ADAGRAD)
    if group == "compression":
        return Compressor("none")
    if group == "cache":
        return CachePolicy("none")
    raise ConfigError(f"{group} has no default; name a {group} plugin.")


def resolve(group: str, value: Any, params: Mapping[str, Any] | None = None) -> Any:
    """A plugin object for ``group``: ``value`` itself, the registry entry it names, or the default.

    ``value`` may be an instance, a registry name, a mapping with ``name`` and parameters, or
    None (the group's default).
    """
    kind = _TYPES.get(group) if isinstance(group, str) else None
    if kind is None:
        raise ConfigError(f"Unknown plugin group {group!r}; choose one of {', '.join(_TYPES)}.")
    if isinstance(value, kind):
        if group == "topology":  # one made in Python, not by a plugin: the same doubts
            from neo_core.registry import doubt_bandwidths

            doubt_bandwidths(value, f"topology {value.name!r}")
        return value
    if value is None and group not in ("topology", "sharding"):
        return _default(group)
    if isinstance(value, Mapping):
        node = dict(value)
        name = node.pop("name", None)
        if name is None:
            example = "{'name': <plugin>, " + ", ".join(f"{k!r}: ..." for k in node) + "}" if node else "{'name': <plugin>}"
            raise ConfigError(
                f"{group} given as a mapping without 'name': name the {group} plugin, e.g. {example} "
                f"(`neo plugins` lists them)."
            )
        params = {**node, **(params or {})}
        value = name
    if not isinstance(value, str) or not value:
        inner = getattr(value, group, None)  # a PlanningContext holds one of each group
        hint = (f"; it holds one: pass its .{group}" if isinstance(inner, kind) else "")
        shown = repr(value) if len(repr(value)) <= 80 else f"a {type(value).__name__}"
        raise ConfigError(f"{group} must be a {kind.__name__} or a plugin name, got {shown}{hint}.")
    from neo_core.plugins import get_plugins

    return get_plugins().create(group, value, dict(params or {}))  # unknown: names the choices


def checked_batch(batch_size_per_rank: Any) -> int:
    """``batch_size_per_rank`` as a whole number of at least 1, or a :class:`ConfigError`."""
    whole = as_whole(batch_size_per_rank)
    if whole is None or whole < 1:
        raise ConfigError(f"batch_size_per_rank must be a positive integer, got {batch_size_per_rank!r}.")
    return whole


def make_context(
    topology: Topology | str | Mapping[str, Any],
    batch_size_per_rank: int,
    kernel: EmbeddingKernel | str | Mapping[str, Any] | None = None,
    compressor: Compressor | str | Mapping[str, Any] | None = None,
    cache: CachePolicy | str | Mapping[str, Any] | None = None,
) -> PlanningContext:
    """The :class:`PlanningContext` for a topology, batch size and optional plugins."""
    return PlanningContext(
        topology=resolve("topology", topology),
        batch_size_per_rank=checked_batch(batch_size_per_rank),
        kernel=resolve("kernel", kernel),
        compressor=resolve("compression", compressor),
        cache=resolve("cache", cache),
    )


# keywords meant for plan_tables' own parameters: plugin groups by the parameter that takes them
_MEANT = {"compression": "compressor", "sharding": "planner", "batch_size": "batch_size_per_rank"}


def _check_planner_params(params: Mapping[str, Any], planner: Any) -> None:
    """A keyword that names a plugin group, or is a typo of plan_tables' own parameter, is not
    the planner's key it would otherwise be taken for (unless the planner takes it)."""
    own = ("topology", "batch_size_per_rank", "kernel", "compressor", "cache", "planner")
    takes: Collection[str] = ()
    if isinstance(planner, str):
        from neo_core.plugins import get_plugins

        try:
            takes = get_plugins().registry("sharding").get(planner).parameters()
        except Exception:  # noqa: BLE001 - an unknown planner is named by resolve below
            takes = ()
    for key in (k for k in params if k not in takes):
        meant = _MEANT.get(key) or next(iter(difflib.get_close_matches(key, own, n=1, cutoff=0.8)), None)
        if meant:
            raise ConfigError(
                f"plan_tables() has no parameter {key!r}; did you mean {meant}=? (other keyword arguments go "
                "to the planner, e.g. reserve_fraction=0.2)"
            )


def plan_tables(
    tables: Sequence[TableSpec],
    topology: Topology | str | Mapping[str, Any],
    batch_size_per_rank: int | None = None,
    kernel: EmbeddingKernel | str | Mapping[str, Any] | None = None,
    compressor: Compressor | str | Mapping[str, Any] | None = None,
    cache: CachePolicy | str | Mapping[str, Any] | None = None,
    planner: Planner | str = "neo",
    **params: Any,
) -> PlanResult:
    """Plan ``tables`` on ``topology`` for ``batch_size_per_rank`` samples per rank.

    No table memory is allocated. ``params`` go to the planner's factory (e.g.
    ``reserve_fraction=0.2``). Raises :class:`~neo_core.errors.NeoError` subclasses with a
    one-sentence message for bad input or a model that cannot fit.
    """
    if batch_size_per_rank is None:  # required; a default of None lets batch_size= be named as a slip
        _check_planner_params(params, planner)
        raise ConfigError("plan_tables() needs batch_size_per_rank: the samples each rank trains on per step.")
    if isinstance(tables, TableSpec):
        raise ConfigError(f"tables must be a list of TableSpec objects; wrap the single table {tables.name!r} in a list.")
    if isinstance(tables, (str, bytes, Mapping)) or not isinstance(tables, Sequence | Iterable):
        raise ConfigError(f"tables must be a list of TableSpec objects, got {type(tables).__name__}.")
    tables = list(tables)
    if not tables:
        raise ConfigError("The table list is empty; give at least one embedding table to plan.")
    check_table_specs(tables)
    check_table_names(tables)
    _check_planner_params(params, planner)
    context = make_context(topology, batch_size_per_rank, kernel, compressor, cache)
    chosen = resolve("sharding", planner, params if not isinstance(planner, Planner) else None)
    if isinstance(planner, Planner) and params:
        raise ConfigError("Planner parameters apply only when the planner is given by name.")
    name = planner if isinstance(planner, str) else chosen.name
    return check_plan(chosen.plan(tables, context), tables, context.topology.world_size, name, context)
