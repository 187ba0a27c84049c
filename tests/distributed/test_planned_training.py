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
import torch

from neo_core.sharding import PlanResult, ShardingType, TableSpec
from neo_plugins.sharding.planner import NeoPlanner
from tests.distributed.multi_process import MultiProcessRunner
from tests.distributed.test_sharding_equivalence import (
    SumOfSquares,
    _load,
    _local_shards,
    features,
    initial_weights,
    loss_of,
)
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


def global_batches(world_size: int) -> list[dict[str, tuple[torch.Tensor, list[torch.Tensor]]]]:
    """Per step and feature: lengths (global batch) and each sample's ids (pooling varies by table)."""
    generator = torch.Generator().manual_seed(11)
    batch = BATCH_PER_RANK * world_size
    steps = []
    for _ in range(STEPS):
        step = {}
        for name, (rows, _, max_ids, _) in TABLES.items():
            lengths = torch.randint(0, max_ids + 1, (batch,), generator=generator)
            ids = [torch.randint(0, rows, (int(n),), generator=generator) for n in lengths]
            step[f"f_{name}"] = (lengths, ids)
        steps.append(step)
    return steps


def train_planned(rank: int, world_size: int, result: PlanResult) -> dict[str, Any]:
    """Rank entry: shard with the plan, train, return local outputs per step and final shards."""
    _, per_node, _ = LAYOUTS[world_size]
    os.environ.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node))
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neo_core.torchrec_plan import build_sharding_plan
    from neo_plugins.sharding.sharders import make_sharders

    nodes, per_node, _ = LAYOUTS[world_size]
    context = cpu_context(nodes, per_node, learning_rate=LEARNING_RATE)
    model = SumOfSquares(MODEL_TABLES, torch.device("meta"))
    sharders = make_sharders(context)
    plan = build_sharding_plan(model, result, context, sharders)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
    )
    _load(dmp, initial_weights(MODEL_TABLES))
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dense_opt = (
        KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=LEARNING_RATE)) if dense else None
    )
    outputs = []
    start, stop = rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK
    for step in global_batches(world_size):
        pooled = dmp(features(step, start, stop)).to_dict()
        outputs.append({k: v.detach().clone() for k, v in pooled.items()})
        loss_of(pooled).backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()
    return {"outputs": outputs, "shards": _local_shards(dmp)}


def train_reference(world_size: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The unsharded model on the same global batches: outputs per step, final weights."""
    model = SumOfSquares(MODEL_TABLES, torch.device("cpu"))
    init = initial_weights(MODEL_TABLES)
    with torch.no_grad():
        for name, bag in model.ebc.embedding_bags.items():
            bag.weight.copy_(init[name])
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    outputs = []
    for step in global_batches(world_size):
        pooled = model(features(step, 0, BATCH_PER_RANK * world_size)).to_dict()
        outputs.append({k: v.detach().clone() for k, v in pooled.items()})
        optimizer.zero_grad()
        loss_of(pooled).backward()
        optimizer.step()
    return outputs, {n: b.weight.detach().clone() for n, b in model.ebc.embedding_bags.items()}


@pytest.fixture(scope="module", params=sorted(LAYOUTS), ids=lambda w: f"{w}ranks")
def planned_run(request: pytest.FixtureRequest) -> tuple[int, PlanResult, list[dict[str, Any]]]:
    world_size = request.param
    result = make_plan(world_size)
    return world_size, result, MultiProcessRunner().run(train_planned, world_size, result)


@pytest.mark.slow
def test_planned_training_matches_single_process(
    planned_run: tuple[int, PlanResult, list[dict[str, Any]]],
) -> None:
    world_size, result, runs = planned_run
    ref_outputs, ref_weights = train_reference(world_size)
    init = initial_weights(MODEL_TABLES)
    for table in TABLES:
        feature = f"f_{table}"
        for step, ref in enumerate(ref_outputs):
            for rank, run in enumerate(runs):
                got = run["outputs"][step][feature]
                want = ref[feature][rank * BATCH_PER_RANK : (rank + 1) * BATCH_PER_RANK]
                torch.testing.assert_close(
                    got, want, atol=ATOL, rtol=0,
                    msg=lambda m, w=f"{table} step {step} rank {rank}": f"{w}: {m}",
                )
        trained = ref_weights[table]
        covered = torch.zeros_like(trained, dtype=torch.bool)
        for run in runs:
            for (r, c), shard in run["shards"][table]:
                h, w = shard.shape
                torch.testing.assert_close(
                    shard, trained[r : r + h, c : c + w], atol=ATOL, rtol=0,
                    msg=lambda m, t=table: f"{t} weights: {m}",
                )
                covered[r : r + h, c : c + w] = True
        assert covered.all(), f"the shards of {table} do not cover the table"
        assert not torch.allclose(trained, init[table]), f"training did not change {table}"


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
