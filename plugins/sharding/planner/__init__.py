"""Neo's sharding planner: topology-aware cost model and fast search over 4D sharding."""

from neo_plugins.sharding.planner.cost import CostModel, CostParams
from neo_plugins.sharding.planner.planner import NeoPlanner, validate_tables

__all__ = ["CostModel", "CostParams", "NeoPlanner", "validate_tables"]
