"""Score any plan with TorchRec's own estimators, and run TorchRec's planner for comparison.

TorchRec rates a plan as the max over ranks of the summed ``Perf.total`` of the shards on
that rank (``NoopPerfModel``), with ``EmbeddingPerfEstimator`` filling in each shard's perf.
A Neo plan is scored the same way: its options are enumerated with the sharding type, kernel
and column width pinned per table, and each shard gets the rank the Neo plan gave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from neo_core.sharding import PlanningContext, PlanResult, ShardingType, TableSpec


def meta_module(tables: Sequence[TableSpec]) -> Any:
    """An EmbeddingBagCollection on the meta device (no table memory)."""
    from neo_core.models import embedding_bag_collection

    return embedding_bag_collection(tables, device="meta")


def constraints(tables: Sequence[TableSpec], result: PlanResult | None = None) -> dict[str, Any]:
    """Pooling factors for every table; with ``result``, its type, kernel and column width pinned."""
    from torchrec.distributed.planner.types import ParameterConstraints

    pinned = {a.name: a for a in result.tables} if result else {}
    out = {}
    for t in tables:
        kwargs: dict[str, Any] = {"pooling_factors": [t.pooling_factor] * len(t.feature_names)}
        a = pinned.get(t.name)
        if a is not None:
            kwargs["sharding_types"] = [a.sharding_type]
            kwargs["compute_kernels"] = [a.compute_kernel]
            if a.sharding_type in (
                ShardingType.COLUMN_WISE.value,
                ShardingType.TABLE_COLUMN_WISE.value,
                ShardingType.GRID_SHARD.value,
            ):
                kwargs["min_partition"] = a.shard_shapes[0][1]
        out[t.name] = ParameterConstraints(**kwargs)
    return out


def rank_perf(options: Sequence[Any], world_size: int) -> list[float]:
    """Per-rank summed ``Perf.total`` (ms) of sharding options whose shards have ranks."""
    per_rank = [0.0] * world_size
    for so in options:
        for shard in so.shards:
            per_rank[shard.rank] += shard.perf.total
    return per_rank


def score_plan(tables: Sequence[TableSpec], result: PlanResult, context: PlanningContext) -> float:
    """TorchRec's max-rank perf (ms) of a Neo plan."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    from neo_plugins.sharding.sharders import make_sharders

    topo = context.topology.to_torchrec()
    cons = constraints(tables, result)
    enum = EmbeddingEnumerator(
        topo,
        context.batch_size_per_rank,
        cons,
        estimator=[EmbeddingPerfEstimator(topo, cons), EmbeddingStorageEstimator(topo, cons)],
    )
    options = enum.enumerate(meta_module(tables), make_sharders(context))
    by_name = {a.name: a for a in result.tables}
    chosen = []
    for so in options:
        a = by_name[so.name]
        ranks = a.ranks if len(so.shards) == len(a.ranks) else a.ranks[: len(so.shards)]
        if len(ranks) != len(so.shards):
            raise ValueError(f"{so.name}: {len(so.shards)} TorchRec shards vs ranks {a.ranks}")
        for shard, r in zip(so.shards, ranks):
            shard.rank = r
        chosen.append(so)
    return max(rank_perf(chosen, topo.world_size))


def torchrec_plan_and_score(
    tables: Sequence[TableSpec], context: PlanningContext, proposers: str = "default"
) -> tuple[float, float]:
    """Run TorchRec's EmbeddingShardingPlanner; returns (max-rank perf in ms, lower bound in ms).

    ``proposers="default"`` uses TorchRec's default proposers (grid search, greedy with and
    without depth, uniform); ``"greedy"`` only its ``GreedyProposer`` (one of those four),
    which finishes on table sets where the default set takes too long.

    The bound is TorchRec's own: the larger of (sum over tables of the cheapest option's
    summed shard perf) / world size and the largest single-shard perf any table must have.
    """
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    from neo_plugins.sharding.sharders import make_sharders

    topo = context.topology.to_torchrec()
    cons = constraints(tables)
    module = meta_module(tables)
    sharders = make_sharders(context)
    kwargs: dict[str, Any] = {}
    if proposers == "greedy":
        from torchrec.distributed.planner.proposers import GreedyProposer

        kwargs["proposer"] = GreedyProposer()
    elif proposers != "default":
        raise ValueError(f"proposers={proposers!r}: use 'default' or 'greedy'")
    planner = EmbeddingShardingPlanner(
        topology=topo, batch_size=context.batch_size_per_rank, constraints=cons, **kwargs
    )
    planner.plan(module, sharders)
    best = planner._best_plan or []
    score = max(rank_perf(best, topo.world_size))
    enum = EmbeddingEnumerator(
        topo,
        context.batch_size_per_rank,
        cons,
        estimator=[EmbeddingPerfEstimator(topo, cons), EmbeddingStorageEstimator(topo, cons)],
    )
    total: dict[str, float] = {}
    single: dict[str, float] = {}
    for so in enum.enumerate(module, sharders):
        tot = sum(s.perf.total for s in so.shards)
        big = max(s.perf.total for s in so.shards)
        total[so.name] = min(total.get(so.name, float("inf")), tot)
        single[so.name] = min(single.get(so.name, float("inf")), big)
    bound = max(sum(total.values()) / topo.world_size, max(single.values()))
    return score, bound
