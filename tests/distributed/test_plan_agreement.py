"""Ranks agree on one plan: a planner that plans differently per rank is overruled by rank 0."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed.multi_process import MultiProcessRunner


def _agree(rank: int, world_size: int, rank_dependent: bool) -> dict[str, Any]:
    from neo_core.sharding import PlanResult, RankReport, TableAssignment
    from neo_core.training.module import agree_on_plan, plan_digest

    owner = rank if rank_dependent else 0  # the rank-dependent planner puts the table on itself
    plan = PlanResult("mine", [TableAssignment("t", "table_wise", "fused", [owner], [(10, 4)])],
                      [RankReport(rank=r) for r in range(world_size)], 8, {})
    agreed, differ = agree_on_plan(plan)
    return {"ranks": agreed.tables[0].ranks, "differ": differ, "digest": plan_digest(agreed)}


@pytest.mark.slow  # spawns 3 gloo ranks
@pytest.mark.parametrize("rank_dependent", [False, True])
def test_every_rank_runs_rank_zeros_plan(rank_dependent: bool) -> None:
    out = MultiProcessRunner().run(_agree, 3, rank_dependent)
    assert [o["ranks"] for o in out] == [[0], [0], [0]]  # rank 0's plan everywhere
    assert len({o["digest"] for o in out}) == 1
    assert all(o["differ"] == ([1, 2] if rank_dependent else []) for o in out)
