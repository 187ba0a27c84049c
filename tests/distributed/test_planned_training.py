"""Plans made by NeoPlanner for mixed tables train on 2 and 4 gloo ranks like one process.

The planner chooses the ranks, column splits and row splits; per-table restrictions
(``table_sharding_types``) make the plans cover every sharding type: DP, TW, CW and RW on
1 node x 2 ranks, all seven on 2 nodes x 2 ranks (TWRW, TWCW and GRID stay inside a node).
One spawn per world size trains a single EBC holding every table (process start-up
dominates); outputs per step and the final shards are compared with the unsharded model.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from neo_core.sharding import PlanResult, ShardingType, TableSpec
from neo_plugins.sharding.planner import NeoPlanner
from tests.distributed.equivalence import (
    assert_matches_reference,
    make_batches,
    train_reference,
    train_sharded,
)
from tests.distributed.multi_process import MultiProcessRunner
from tests.test_torchrec_plan import cpu_context

BATCH_PER_RANK = 4
STEPS = 3
LEARNING_RATE = 0.1
ATOL = 1e-5

# name -> (rows, dim, max ids per sample, sharding type on 4 ranks (2 nodes x 2))
TABLES: dict[str, tuple[int, int, int, ShardingType]] = {
    "dp": (40, 8, 2, ShardingType.DATA_PARALLEL),
    "tw": (300, 16, 1, ShardingType.TABLE_WISE),
    "cw": (120, 32, 3, ShardingType.COLUMN_WISE),
    "rw": (501, 16, 6, ShardingType.ROW_WISE),
    "twrw": (257, 24, 4, ShardingType.TABLE_ROW_WISE),
    "twcw": (90, 32, 2, ShardingType.TABLE_COLUMN_WISE),
    "grid": (203, 32, 5, ShardingType.GRID_SHARD),
}
# On one node of 2 ranks only DP, TW, CW and RW exist; the other tables are left to the planner.
TWO_RANK_TYPES = {"dp": ["DP"], "tw": ["TW"], "cw": ["CW"], "rw": ["RW"]}
FOUR_RANK_TYPES = {name: [t[3].value] for name, t in TABLES.items()}
# world size -> (nodes, ranks per node, per-table restrictions)
LAYOUTS: dict[int, tuple[int, int, dict[str, list[str]]]] = {
    2: (1, 2, TWO_RANK_TYPES),
    4: (2, 2, FOUR_RANK_TYPES),
}
MODEL_TABLES = {n: (t[0], t[1]) for n, t in TABLES.items()}


def make_plan(world_size: int) -> PlanResult:
    """NeoPlanner's plan for the tables on this world size."""
    nodes, per_node, restrict = LAYOUTS[world_size]
    context = cpu_context(nodes, per_node, learning_rate=LEARNING_RATE)
    context = type(context)(
        topology=context.topology,
        batch_size_per_rank=BATCH_PER_RANK,
        kernel=context.kernel,
        compressor=context.compressor,
        cache=context.cache,
    )
    specs = [TableSpec(n, t[0], t[1], pooling_factor=t[2] / 2) for n, t in TABLES.items()]
    return NeoPlanner(table_sharding_types=restrict).plan(specs, context)


def global_batches(world_size: int) -> list[Any]:
    """The global batches for ``world_size`` ranks (pooling varies by table)."""
    max_ids = {name: (rows, most) for name, (rows, _, most, _) in TABLES.items()}
    return make_batches(max_ids, BATCH_PER_RANK * world_size, STEPS, seed=11)


def train_planned(rank: int, world_size: int, result: PlanResult) -> dict[str, Any]:
    """Rank entry: shard with the plan, train, return local outputs per step and final shards."""
    nodes, per_node, _ = LAYOUTS[world_size]
    os.environ.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node))
    context = cpu_context(nodes, per_node, learning_rate=LEARNING_RATE)
    return train_sharded(
        rank, MODEL_TABLES, result, context, global_batches(world_size), BATCH_PER_RANK, LEARNING_RATE
    )


@pytest.fixture(scope="module", params=sorted(LAYOUTS), ids=lambda w: f"{w}ranks")
def planned_run(request: pytest.FixtureRequest) -> tuple[int, PlanResult, list[dict[str, Any]]]:
    world_size = request.param
    result = make_plan(world_size)
    return world_size, result, MultiProcessRunner().run(train_planned, world_size, result)


@pytest.mark.slow
def test_planned_training_matches_single_process(
    planned_run: tuple[int, PlanResult, list[dict[str, Any]]],
) -> None:
    world_size, _, runs = planned_run
    reference = train_reference(MODEL_TABLES, global_batches(world_size), LEARNING_RATE)
    for table in TABLES:
        assert_matches_reference(runs, MODEL_TABLES, table, reference, BATCH_PER_RANK, ATOL)


@pytest.mark.slow
def test_plans_cover_every_sharding_type(
    planned_run: tuple[int, PlanResult, list[dict[str, Any]]],
) -> None:
    world_size, result, _ = planned_run
    got = {a.name: ShardingType(a.sharding_type) for a in result.tables}
    _, _, restrict = LAYOUTS[world_size]
    for name, types in restrict.items():
        assert got[name] in {ShardingType.parse(s) for s in types}, (name, got[name])
    if world_size == 4:
        assert set(got.values()) == set(ShardingType), sorted(s.short for s in got.values())
        multi_node = {a.name: {r // 2 for r in a.ranks} for a in result.tables}
        for name in ("twrw", "twcw"):
            assert len(multi_node[name]) == 1, f"{name} should stay inside one node: {result.tables}"
        assert len(multi_node["grid"]) == 2, "grid should span both nodes"
    else:
        assert {ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                ShardingType.ROW_WISE} <= set(got.values())
