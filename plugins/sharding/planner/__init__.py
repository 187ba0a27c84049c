"""Neo's sharding planner: topology-aware cost model and fast search over 4D sharding."""

from neo_plugins.sharding.planner.cost import CostModel, CostParams
from neo_plugins.sharding.planner.planner import NeoPlanner, validate_tables
from neo_plugins.sharding.planner.score import score_assignments

__all__ = ["CostModel", "CostParams", "NeoPlanner", "score_assignments", "validate_tables"]
