"""Score any plan with TorchRec's own estimators, and run TorchRec's planner for comparison.

TorchRec rates a plan as the max over ranks of the summed ``Perf.total`` of the shards on
that rank (``NoopPerfModel``), with ``EmbeddingPerfEstimator`` filling in each shard's perf.
A Neo plan is scored the same way: its options are enumerated with the sharding type, kernel
and column width pinned per table, and each shard gets the rank the Neo plan gave it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from neo_core.sharding import PlanningContext, PlanResult, ShardingType, TableSpec

_QUICK_LOCK = threading.RLock()


@contextlib.contextmanager
def quick_estimates() -> Iterator[None]:
    """Make many calls of TorchRec's enumerator and estimator cheaper, every figure unchanged.

    - TorchRec's estimator finds its hardware hooks by scanning ``dir(config)`` for annotated
      methods, several times per shard (most of its time). The answer depends on the config
      object alone, so within this block it is kept per (config, hook, sharding type).
    - ``EmbeddingBag`` weights on the meta device are not initialised: they have no values.
    - The enumerator keeps a deep copy of every option list for reuse with the same module;
      a new module is built for every call here, so the copy is never read and is skipped.

    Each change applies only where this TorchRec version has the function it replaces, and only
    inside the block; the changes are process-wide, so one thread at a time runs such a block
    (TorchRec's planner in another thread would see them too: run it apart, as the benchmark
    does). ``tests/planner/test_torchrec_estimator.py`` checks that figures with and without it
    are equal. TorchRec's own planner (``torchrec_plan_and_score``) runs without it.
    """
    import torch
    from torchrec.distributed.planner import enumerators
    from torchrec.distributed.planner.types import ShardingOption

    try:
        from torchrec.distributed.planner.estimator import annotations
    except ImportError:  # an older TorchRec without the annotation scan
        annotations = None

    saved: list[tuple[Any, str, Any]] = []

    def swap(owner: Any, name: str, new: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def per_config(scan: Any) -> Any:
        found: dict[tuple[Any, ...], tuple[Any, Any]] = {}

        def lookup(config: Any, *args: Any, **kwargs: Any) -> Any:
            key = (id(config), args, tuple(sorted(kwargs.items())))
            hit = found.get(key)
            if hit is None:  # the config is held, so its id is not reused inside the block
                hit = found[key] = (config, scan(config, *args, **kwargs))
            return hit[1]

        return lookup

    reset = torch.nn.EmbeddingBag.reset_parameters

    def reset_unless_meta(self: Any) -> None:
        if self.weight.device.type != "meta":
            reset(self)

    def deepcopy(x: Any, memo: Any = None) -> Any:
        if isinstance(x, list) and x and isinstance(x[0], ShardingOption):
            return x  # the stored search space: never read again (new module per call)
        return copy.deepcopy(x, memo)

    with _QUICK_LOCK:
        try:
            for name in ("_get_annotated_method", "_get_coefficient_method"):
                if annotations is not None and callable(getattr(annotations, name, None)):
                    swap(annotations, name, per_config(getattr(annotations, name)))
            swap(torch.nn.EmbeddingBag, "reset_parameters", reset_unless_meta)
            if getattr(enumerators, "copy", None) is copy:
                shim = types.ModuleType("copy")
                shim.__dict__.update(vars(copy))
                shim.deepcopy = deepcopy  # type: ignore[attr-defined]
                swap(enumerators, "copy", shim)
            yield
        finally:
            for owner, name, old in reversed(saved):
                setattr(owner, name, old)


def meta_module(tables: Sequence[TableSpec], context: PlanningContext | None = None) -> Any:
    """An EmbeddingBagCollection on the meta device (no table memory), its weights stored at
    the context's kernel's bytes per element where TorchRec can: FP16 for 2. For 1 (int8) the
    configs say INT8, but TorchRec's training EBC stores every type but FP32 as float16, and
    its planner counts the tensor's bytes: 2 per weight, where Neo's memory model counts 1."""
    from neo_core.models import embedding_bag_collection

    ebc = embedding_bag_collection(tables, device="meta")
    if context is None or context.kernel.weight_bytes == 4:
        return ebc
    from torchrec.modules.embedding_configs import DataType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = ebc.embedding_bag_configs()
    for config in configs:
        config.data_type = {2: DataType.FP16, 1: DataType.INT8}[context.kernel.weight_bytes]
    return EmbeddingBagCollection(tables=configs, device=ebc.device)


def constraints(
    tables: Sequence[TableSpec], result: PlanResult | None = None, context: PlanningContext | None = None,
    kernels: str = "default",
) -> dict[str, Any]:
    """Pooling factors for every table; with a ``context`` whose cache has a load factor, that
    cache for cached kernels (TorchRec would otherwise size caches at its default 20% of rows);
    with ``kernels="neo"``, the kernels the training plugin ``sharding=torchrec`` allows (on GPU
    topologies, host memory only behind the context's cache); with ``result``, its type, kernel
    and column width pinned."""
    from torchrec.distributed.planner.types import ParameterConstraints

    from neo_plugins.sharding.torchrec_planner import table_constraints

    if kernels not in ("default", "neo"):
        raise ValueError(f"kernels={kernels!r}: use 'default' (TorchRec's own choice) or 'neo' (those Neo's settings allow)")
    pinned = {a.name: a for a in result.tables} if result else {}
    cache = context.cache.cache_params() if context is not None else None
    out = {}
    for t in tables:
        if kernels == "neo" and context is not None:
            given = table_constraints(t, context)
        else:
            given = ParameterConstraints(pooling_factors=[t.pooling_factor] * len(t.feature_names))
            if cache is not None:
                given.cache_params = cache
        a = pinned.get(t.name)
        if a is not None:
            given.sharding_types = [a.sharding_type]
            given.compute_kernels = [a.compute_kernel]
            if a.sharding_type in (
                ShardingType.COLUMN_WISE.value,
                ShardingType.TABLE_COLUMN_WISE.value,
                ShardingType.GRID_SHARD.value,
            ):
                given.min_partition = a.shard_shapes[0][1]
        out[t.name] = given
    return out


def rank_perf(options: Sequence[Any], world_size: int) -> list[float]:
    """Per-rank summed ``Perf.total`` (ms) of sharding options whose shards have ranks."""
    per_rank = [0.0] * world_size
    for so in options:
        for shard in so.shards:
            per_rank[shard.rank] += shard.perf.total
    return per_rank


def score_plan(
    tables: Sequence[TableSpec], result: PlanResult, context: PlanningContext, quick: bool = True
) -> float:
    """TorchRec's max-rank perf (ms) of a Neo plan (``quick``: inside ``quick_estimates``)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    from neo_plugins.sharding.sharders import make_sharders

    topo = context.topology.to_torchrec()
    cons = constraints(tables, result, context)
    enum = EmbeddingEnumerator(
        topo,
        context.batch_size_per_rank,
        cons,
        estimator=[EmbeddingPerfEstimator(topo, cons), EmbeddingStorageEstimator(topo, cons)],
    )
    with quick_estimates() if quick else contextlib.nullcontext():
        options = enum.enumerate(meta_module(tables, context), make_sharders(context))
    by_name = {a.name: a for a in result.tables}
    chosen = []
    for so in options:
        a = by_name[so.name]
        if len(so.shards) != len(a.ranks):  # same type and column width: the counts must agree
            raise ValueError(
                f"Table {so.name!r}: TorchRec enumerates {len(so.shards)} shards for "
                f"{a.sharding_type} but the plan places {len(a.ranks)} (ranks {list(a.ranks)}); "
                "the plan does not match this TorchRec version's sharding, so it cannot be scored."
            )
        for shard, r in zip(so.shards, a.ranks):
            shard.rank = r
        chosen.append(so)
    return max(rank_perf(chosen, topo.world_size))


def torchrec_plan_and_score(
    tables: Sequence[TableSpec],
    context: PlanningContext,
    proposers: str = "default",
    timeout_s: float | None = None,
    kernels: str = "default",
) -> dict[str, Any]:
    """Run TorchRec's EmbeddingShardingPlanner and score its plan with TorchRec's estimator.

    ``kernels="default"`` lets TorchRec choose its kernels as it would by default (the planner
    benchmark's runs, as the planning times it compares were measured), host memory included
    where a table does not fit device memory, even with no cache set; the tables it puts there
    are listed in ``host_tables``. ``kernels="neo"`` gives it the kernels Neo's settings allow
    (``sharding=torchrec``'s constraints: host memory only behind the context's cache).

    ``proposers="default"`` uses TorchRec's default proposers (grid search, greedy with and
    without depth, uniform); ``"greedy"`` only its ``GreedyProposer`` (one of those four).
    ``timeout_s`` is TorchRec's own ``timeout_seconds``: its proposers stop after that long
    and the best plan found so far is kept.

    Returns ``score_ms`` (max-rank perf), ``bound_ms`` (TorchRec's own lower bound: the
    larger of (sum over tables of the cheapest option's summed shard perf) / world size and
    the largest single-shard perf any table must have), ``timed_out`` (the proposers hit
    ``timeout_s``), ``proposals``, ``search_s`` (the proposers' time, as TorchRec logs it) and
    ``plan_s`` (the whole ``EmbeddingShardingPlanner.plan`` call, wall clock: the planning time
    to compare; building the meta-device module before it and scoring after it are not in it).
    """
    import torchrec.distributed.planner.planners as tr_planners
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    from neo_plugins.sharding.sharders import make_sharders

    topo = context.topology.to_torchrec()
    cons = constraints(tables, context=context, kernels=kernels)
    module = meta_module(tables, context)
    sharders = make_sharders(context)
    kwargs: dict[str, Any] = {}
    if proposers == "greedy":
        from torchrec.distributed.planner.proposers import GreedyProposer

        kwargs["proposer"] = GreedyProposer()
    elif proposers != "default":
        raise ValueError(f"proposers={proposers!r}: use 'default' or 'greedy'")
    if timeout_s is not None:
        kwargs["timeout_seconds"] = max(1, int(round(timeout_s)))
    planner = EmbeddingShardingPlanner(
        topology=topo, batch_size=context.batch_size_per_rank, constraints=cons, **kwargs
    )
    logged: dict[str, Any] = {}
    original = tr_planners.log_planning_result  # its metadata says whether proposers timed out

    def capture(*args: Any, **meta: Any) -> None:
        logged.update(meta)
        original(*args, **meta)

    tr_planners.log_planning_result = capture
    start = time.perf_counter()
    try:
        planner.plan(module, sharders)
    finally:
        plan_s = time.perf_counter() - start
        tr_planners.log_planning_result = original
    best = planner._best_plan or []
    out: dict[str, Any] = {"score_ms": max(rank_perf(best, topo.world_size)), "plan_s": plan_s}
    assignments = assignments_of(best)
    # host memory Neo's settings do not allow, said, not hidden: any table with no cache
    # (fused_uvm), and behind a cache where the context has none
    host_kernels = {"fused_uvm"} | ({"fused_uvm_caching"} if context.cache.load_factor is None else set())
    out["host_tables"] = [a.name for a in assignments if a.compute_kernel in host_kernels]
    # the plan itself, so that it can be scored again under a changed cost model (bench --rescore)
    out["plan"] = plan_to_json(assignments)
    out.update(neo_model_score(tables, assignments, context))
    per_proposer = json.loads(logged.get("proposals_per_proposer", "{}"))
    out["timed_out"] = any(bool(v.get("timed_out")) for v in per_proposer.values())
    out["proposals"] = int(logged.get("num_proposals", 0))
    out["search_s"] = float(logged.get("planner_time_seconds", "nan"))
    space = planner._enumerator.last_stored_search_space  # the options TorchRec searched
    if space is None:
        space = EmbeddingEnumerator(
            topo,
            context.batch_size_per_rank,
            cons,
            estimator=[EmbeddingPerfEstimator(topo, cons), EmbeddingStorageEstimator(topo, cons)],
        ).enumerate(module, sharders)
    total: dict[str, float] = {}
    single: dict[str, float] = {}
    for so in space:
        tot = sum(s.perf.total for s in so.shards)
        big = max(s.perf.total for s in so.shards)
        total[so.name] = min(total.get(so.name, float("inf")), tot)
        single[so.name] = min(single.get(so.name, float("inf")), big)
    out["bound_ms"] = max(sum(total.values()) / topo.world_size, max(single.values()))
    return out


def plan_to_json(assignments: Sequence[Any]) -> list[dict[str, Any]]:
    """A plan's table assignments as JSON values (``plan_from_json`` reads them back)."""
    return [
        {"name": a.name, "sharding_type": a.sharding_type, "compute_kernel": a.compute_kernel,
         "ranks": list(a.ranks), "shard_shapes": [list(s) for s in a.shard_shapes]}
        for a in assignments
    ]


def plan_from_json(plan: Sequence[Mapping[str, Any]], why: str = "TorchRec planner") -> list[Any]:
    """``TableAssignment``s of a plan written by ``plan_to_json``."""
    from neo_core.sharding import TableAssignment

    return [TableAssignment(**{**a, "shard_shapes": [tuple(x) for x in a["shard_shapes"]]}, why=why) for a in plan]


def neo_model_score(tables: Sequence[TableSpec], assignments: Sequence[Any], context: PlanningContext) -> dict[str, Any]:
    """TorchRec's plan under Neo's cost model: ``neo_model_step_ms``, or ``neo_model_error``
    for a shard shape Neo does not offer (reported, not fatal)."""
    from neo_plugins.sharding.planner.score import score_assignments

    try:
        scored = score_assignments(tables, list(assignments), context, planner="torchrec")
    except Exception as exc:  # noqa: BLE001 - any failure is reported in the result, as it was
        return {"neo_model_error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return {"neo_model_step_ms": scored.predicted_step_time * 1e3}


def assignments_of(options: Sequence[Any]) -> list[Any]:
    """Neo ``TableAssignment``s of TorchRec sharding options whose shards have ranks."""
    from neo_core.sharding import TableAssignment

    return [
        TableAssignment(
            name=so.name,
            sharding_type=ShardingType(so.sharding_type).value,
            compute_kernel=so.compute_kernel,
            ranks=[int(sh.rank) for sh in so.shards],
            shard_shapes=[(int(sh.size[0]), int(sh.size[1])) for sh in so.shards],
            why="TorchRec planner",
        )
        for so in options
    ]


def torchrec_option_costs(
    options: Sequence[Any], tables: Sequence[TableSpec], context: PlanningContext, quick: bool = True,
    status: Callable[[str], None] | None = None,
) -> None:
    """Replace the time of every Neo option with TorchRec's ``EmbeddingPerfEstimator`` figures.

    For each option (sharding type, column shards, placement) the tables it is valid for are
    enumerated by TorchRec with that type, kernel and shard width pinned; each shard's
    ``Perf`` (ms) becomes seconds by kind: ``fwd_compute`` -> compute_fwd, ``bwd_compute`` ->
    compute_bwd, ``fwd_comms`` -> comm_fwd, ``bwd_comms`` -> comm_bwd (TorchRec's data-parallel
    all-reduce is part of it), ``prefetch_compute`` -> comm_input. A shard's time is the largest
    of the option's shards (row-wise splits leave the last shard short). Where TorchRec offers
    no option of that shape (or another shard count), the option becomes invalid for the table.
    Memory stays Neo's. ``quick``: TorchRec runs inside ``quick_estimates`` (same figures).
    """
    import numpy as np
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ParameterConstraints

    from neo_plugins.sharding.planner.cost import CACHED, CB, CF, CIN, CMB, CMF
    from neo_plugins.sharding.sharders import make_sharders

    topo = context.topology.to_torchrec()
    sharders = make_sharders(context)
    multi = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)
    # seconds per option on hundreds of tables: the planner's status line says which
    for k, opt in enumerate(options):
        if status is not None:
            status(f"TorchRec's estimates, option {k + 1} of {len(options)} ({opt.label})")
        idx = [i for i in range(len(tables)) if opt.valid[i]]
        if opt.placement == CACHED:
            kernel = "fused_uvm_caching"
        elif opt.sharding_type is ShardingType.DATA_PARALLEL:
            kernel = "dense"
        else:
            kernel = context.kernel.compute_kernel
        cons = {}
        for i in idx:
            t = tables[i]
            kwargs: dict[str, Any] = {
                "pooling_factors": [t.pooling_factor] * len(t.feature_names),
                "sharding_types": [opt.sharding_type.value],
                "compute_kernels": [kernel],
            }
            if opt.sharding_type in multi:
                kwargs["min_partition"] = t.embedding_dim // opt.k
            if opt.placement == CACHED and context.cache.load_factor:
                kwargs["cache_params"] = context.cache.cache_params()
            cons[t.name] = ParameterConstraints(**kwargs)
        time = np.zeros_like(opt.cost.time)
        found = np.zeros(len(tables), dtype=bool)
        if idx:
            enum = EmbeddingEnumerator(
                topo, context.batch_size_per_rank, cons, estimator=[EmbeddingPerfEstimator(topo, cons)]
            )
            position = {tables[i].name: i for i in idx}
            with quick_estimates() if quick else contextlib.nullcontext():
                enumerated = enum.enumerate(meta_module([tables[i] for i in idx], context), sharders)
            for so in enumerated:
                i = position[so.name]
                if len(so.shards) != opt.num_shards or found[i]:
                    continue
                worst = max(so.shards, key=lambda s: s.perf.total).perf
                time[i, CF], time[i, CB] = worst.fwd_compute, worst.bwd_compute
                time[i, CMF], time[i, CMB] = worst.fwd_comms, worst.bwd_comms
                time[i, CIN] = worst.prefetch_compute
                found[i] = True
        opt.cost.time = time * 1e-3
        opt.valid = opt.valid & found
        opt.shard_time = opt.cost.time.sum(axis=1)
