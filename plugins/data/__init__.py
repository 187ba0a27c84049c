"""Built-in datasets: ``synthetic``, a Criteo-shaped stream with a learnable hidden signal."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.registry import Registry
from neo_plugins.data.synthetic import synthetic


@hookimpl
def neo_register_datasets(registry: Registry) -> None:
    registry.register("synthetic", synthetic)
