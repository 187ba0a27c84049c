"""The plugin contract: one registration hook per kind of plugin.

Every hook receives that kind's :class:`~neo_core.registry.Registry` and calls
``registry.register(name, factory)`` once per plugin it provides. Hooks return nothing; all
implementations are called. Implement them in a module or class marked with
``neo_core.hookimpl`` and expose it through the ``neo`` entry-point group.
"""

from __future__ import annotations

import pluggy

from neo_core.registry import Registry

PROJECT_NAME = "neo"
ENTRY_POINT_GROUP = "neo"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def neo_register_topologies(registry: Registry) -> None:
    """Register topology backends.

    A factory takes keyword parameters from the ``topology`` config group and returns a
    :class:`neo_core.topology.Topology`.
    """


@hookspec
def neo_register_sharders(registry: Registry) -> None:
    """Register sharding planners.

    A factory takes keyword parameters from the ``sharding`` config group and returns a
    :class:`neo_core.sharding.Planner`.
    """


@hookspec
def neo_register_kernels(registry: Registry) -> None:
    """Register embedding kernels.

    A factory takes keyword parameters from the ``kernel`` config group and returns a
    :class:`neo_core.kernels.EmbeddingKernel`.
    """


@hookspec
def neo_register_cache_policies(registry: Registry) -> None:
    """Register embedding cache policies.

    A factory takes keyword parameters from the ``cache`` config group and returns a
    :class:`neo_core.cache.CachePolicy`.
    """


@hookspec
def neo_register_compressors(registry: Registry) -> None:
    """Register communication / embedding compressors.

    A factory takes keyword parameters from the ``compression`` config group and returns a
    :class:`neo_core.compression.Compressor`.
    """


@hookspec
def neo_register_models(registry: Registry) -> None:
    """Register models.

    A factory takes keyword parameters from the ``model`` config group and returns a
    :class:`neo_core.models.ModelBuilder`.
    """


@hookspec
def neo_register_datasets(registry: Registry) -> None:
    """Register datasets.

    A factory takes keyword parameters from the ``data`` config group and returns a
    :class:`neo_core.data.DataSource`.
    """
