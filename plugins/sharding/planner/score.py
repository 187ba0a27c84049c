"""Neo's cost model applied to a given plan: predicted per-rank time and memory of fixed assignments.

Used to compare predictions with measurements (``bench/fidelity.py``) for plans the planner
would not choose itself (e.g. every table on one rank). The assignments follow the
``TableAssignment`` semantics of ``docs/planner.md``; the result is the same report
``NeoPlanner.plan`` builds, so ``predicted_step_time`` means the same thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from neo_core.errors import PlanningError
from neo_core.sharding import (
    PlanningContext,
    PlanResult,
    ShardingType,
    TableAssignment,
    TableSpec,
    refuse_unbuildable,
)
from neo_plugins.sharding.planner.cost import CACHED, DEVICE, CostModel, CostParams, TableArrays
from neo_plugins.sharding.planner.planner import build_result
from neo_plugins.sharding.planner.search import Search, build_options


def _col_shards(a: TableAssignment, local_size: int) -> int:
    st = ShardingType(a.sharding_type)
    if st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        return len(a.ranks)
    if st is ShardingType.GRID_SHARD:
        return max(1, len(a.ranks) // local_size)
    return 1


def score_assignments(
    tables: Sequence[TableSpec],
    assignments: Sequence[TableAssignment],
    context: PlanningContext,
    params: CostParams | None = None,
    planner: str = "fixed",
) -> PlanResult:
    """The ``PlanResult`` (report included) of ``assignments``, costed by Neo's cost model.

    Memory capacity is not enforced: a plan that would not fit is still scored.
    """
    # checked as check_plan checks a plan (a table placed twice was scored at its last place, a
    # kernel or rank layout the ranks refuse was scored as Neo's), on copies: short type names
    # are normalised there, not in the caller's assignments
    assignments = [dataclasses.replace(a, ranks=list(a.ranks)) for a in assignments]
    refuse_unbuildable(assignments, tables, context.topology.world_size, context.topology.devices_per_node,
                       f"The assignments of planner {planner!r} cannot be scored", subject="the plan")
    model = CostModel(context, params)
    arrays = TableArrays.from_specs(tables)
    by_name = {a.name: a for a in assignments}
    L = context.topology.devices_per_node
    ks = sorted({_col_shards(by_name[t.name], L) for t in tables} | {2})
    options = build_options(model, arrays, set(ShardingType), tuple(k for k in ks if k > 1), 1)
    search = Search(model, arrays, options)
    for i, spec in enumerate(tables):
        a = by_name[spec.name]
        st, k = ShardingType(a.sharding_type), _col_shards(a, L)
        if a.compute_kernel == "fused_uvm":
            raise PlanningError(
                f"Table {spec.name!r} is in host memory with no cache (fused_uvm): Neo's cost model has "
                "no such option, so the plan cannot be scored by it."
            )
        place = CACHED if a.compute_kernel == "fused_uvm_caching" else DEVICE
        match = [
            o
            for o, opt in enumerate(options)
            if opt.sharding_type is st and opt.placement == place and (opt.k == k or opt.k == 1 == k)
        ]
        if not match and place == CACHED and context.topology.compute_device != "cuda":
            raise PlanningError(
                f"Table {spec.name!r} is in host memory behind a cache ({a.compute_kernel}), which "
                f"{context.topology.compute_device} ranks do not use: their tables stay in their memory."
            )
        if not match and place == CACHED and not any(opt.placement == CACHED for opt in options):
            raise PlanningError(
                f"Table {spec.name!r} is in host memory behind a cache ({a.compute_kernel}), which this "
                "context does not have: score it with the cache the plan assumed (e.g. cache=lru "
                "cache.load_factor=0.2, TorchRec's default share of rows)."
            )
        if not match:
            raise PlanningError(
                f"Table {spec.name!r}: {st.short} with {k} column shard(s) on kernel {a.compute_kernel} is not an "
                "option on this topology."
            )
        ranks = np.arange(search.W) if st in (ShardingType.DATA_PARALLEL, ShardingType.ROW_WISE) else None
        ranks = ranks if ranks is not None else np.array(a.ranks, dtype=np.int64)
        search._apply(i, match[0], ranks, +1.0, distinct=False)  # TorchRec may stack column shards
    result = build_result(planner, search, tables, context)
    result.notes.append("scored fixed assignments (not searched)")
    result.times_from = "Neo's cost model"
    for scored in result.tables:  # the planner's own reason, where it gave one, before Neo's figures
        given = by_name[scored.name].why
        # not where it is Neo's own line (a Neo plan scored again): it would pile up
        if given and not given.startswith(scored.why.split(";")[0]) and "Neo's cost model: " not in given:
            scored.why = f"{given} (the planner's reason); Neo's cost model: {scored.why}"
    return result
