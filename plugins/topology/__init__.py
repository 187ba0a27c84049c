"""Built-in topology backends: ``local`` (this machine), ``zionex`` (the Neo paper's cluster) and
``cluster`` (a GPU cluster of your own, every figure given)."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.registry import Registry
from neo_plugins.topology.cluster import cluster_topology
from neo_plugins.topology.local import local_topology
from neo_plugins.topology.zionex import zionex_topology


@hookimpl
def neo_register_topologies(registry: Registry) -> None:
    registry.register("local", local_topology)
    registry.register("zionex", zionex_topology)
    registry.register("cluster", cluster_topology)
