"""Sharded training on 2 gloo ranks matches the single-process model, for every sharding type.

One spawn trains one EBC holding a table per sharding type (process start-up dominates the
cost), then a table-wise model with fp16 communication; each type is checked separately.
"""

from __future__ import annotations

from typing import Any

import pytest

from neo_core.compression import Compressor
from neo_core.sharding import PlanResult, ShardingType, TableAssignment
from tests.distributed.equivalence import (
    assert_matches_reference,
    make_batches,
    train_reference,
    train_sharded,
)
from tests.distributed.multi_process import MultiProcessRunner
from tests.test_torchrec_plan import cpu_context

WORLD_SIZE = 2
BATCH_PER_RANK = 8
STEPS = 5
LEARNING_RATE = 0.1
FP16 = Compressor(name="fp16", forward_precision="fp16", backward_precision="fp16")

# name -> (rows, dim, sharding type, kernel, ranks); one node of two ranks.
TABLES: dict[str, tuple[int, int, ShardingType, str, list[int]]] = {
    "tw": (64, 16, ShardingType.TABLE_WISE, "fused", [1]),
    "rw": (150, 16, ShardingType.ROW_WISE, "fused", [0, 1]),
    "cw": (100, 32, ShardingType.COLUMN_WISE, "fused", [1, 0]),
    "dp": (80, 16, ShardingType.DATA_PARALLEL, "dense", [0, 1]),
    "twrw": (200, 16, ShardingType.TABLE_ROW_WISE, "fused", [0, 1]),
    "twcw": (120, 32, ShardingType.TABLE_COLUMN_WISE, "fused", [0, 1]),
    "grid": (90, 32, ShardingType.GRID_SHARD, "fused", [0, 1, 0, 1]),
}
# fp16 pooled rows and gradients: TW's all-to-all, RW's reduce-scatter and TWRW's both
FP16_TABLES = {
    "tw16": (64, 16, ShardingType.TABLE_WISE, "fused", [0]),
    "rw16": (150, 16, ShardingType.ROW_WISE, "fused", [0, 1]),
    "twrw16": (200, 16, ShardingType.TABLE_ROW_WISE, "fused", [0, 1]),
}
SCENARIOS: dict[str, tuple[dict[str, Any], Compressor | None]] = {
    "fp32": (TABLES, None),
    "fp16": (FP16_TABLES, FP16),
}


FP16_ATOL = 1e-3


def batches(tables: dict[str, Any]) -> list[Any]:
    return make_batches({n: (t[0], 3) for n, t in tables.items()}, BATCH_PER_RANK * WORLD_SIZE, STEPS, seed=7)


def train_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """Rank entry: per scenario, the local outputs per step and the local shards at the end."""
    results: dict[str, Any] = {}
    for scenario, (tables, compressor) in SCENARIOS.items():
        context = cpu_context(1, world_size, compressor, learning_rate=LEARNING_RATE)
        assignments = [TableAssignment(n, t[2].value, t[3], list(t[4])) for n, t in tables.items()]
        result = PlanResult("test", assignments, [], BATCH_PER_RANK, context.topology.to_dict())
        results[scenario] = train_sharded(
            rank, tables, result, context, batches(tables), BATCH_PER_RANK, LEARNING_RATE
        )
    return results


@pytest.fixture(scope="module")
def sharded_runs() -> list[dict[str, Any]]:
    return MultiProcessRunner().run(train_scenarios, WORLD_SIZE)


def _check(runs: list[dict[str, Any]], scenario: str, table: str, atol: float) -> None:
    tables = SCENARIOS[scenario][0]
    reference = train_reference(tables, batches(tables), LEARNING_RATE)
    assert_matches_reference([r[scenario] for r in runs], tables, table, reference, BATCH_PER_RANK, atol)


@pytest.mark.slow
@pytest.mark.parametrize("table", list(TABLES), ids=[TABLES[t][2].short for t in TABLES])
def test_sharded_matches_unsharded(sharded_runs: list[dict[str, Any]], table: str) -> None:
    _check(sharded_runs, "fp32", table, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("table", list(FP16_TABLES), ids=[FP16_TABLES[t][2].short for t in FP16_TABLES])
def test_fp16_comms_close_to_unsharded(sharded_runs: list[dict[str, Any]], table: str) -> None:
    # fp16 rounds values of 0.1-0.2 by about 1e-4; the tolerance must still tell a wrong
    # gradient scale from rounding: a reference trained at 0.8x the rate is outside it
    _check(sharded_runs, "fp16", table, atol=FP16_ATOL)
    tables = SCENARIOS["fp16"][0]
    off = train_reference(tables, batches(tables), 0.8 * LEARNING_RATE)
    with pytest.raises(AssertionError):
        assert_matches_reference([r["fp16"] for r in sharded_runs], tables, table, off, BATCH_PER_RANK, FP16_ATOL)
