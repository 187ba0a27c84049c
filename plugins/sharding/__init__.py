"""Built-in sharding planners: ``neo`` (Neo's 4D planner) and ``torchrec`` (the baseline)."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.registry import Registry


@hookimpl
def neo_register_sharders(registry: Registry) -> None:
    from neo_plugins.sharding.planner import NeoPlanner
    from neo_plugins.sharding.torchrec_planner import TorchRecPlanner

    registry.register(
        "neo", NeoPlanner, description="Neo's topology-aware planner over TW, RW, CW, DP, TWRW, TWCW, GRID."
    )
    registry.register(
        "torchrec", TorchRecPlanner, description="TorchRec's EmbeddingShardingPlanner, unchanged (the baseline)."
    )
