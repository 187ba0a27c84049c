"""The baseline: TorchRec's own ``EmbeddingShardingPlanner``, reported in Neo's terms."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import PlannerError

from neo_core.checks import counted, is_number
from neo_core.errors import ConfigError, PlanningError
from neo_core.sharding import (
    Planner,
    PlanningContext,
    PlanResult,
    RankReport,
    ShardingType,
    TableAssignment,
    TableSpec,
    settings_note,
)

_MS = 1e-3  # TorchRec's perf estimates are in milliseconds
# TorchRec's planner warns, for every plan, of its dry-run dense-size estimate and of each
# data-parallel table (no sharding spec, as such tables have none): noise next to the plan
_NOISE = ("Sharding spec not found for ", "There is a known issue with TorchRec's dense tensor size")
_NOISY_LOGGERS = ("", "torchrec.distributed.planner.storage_reservations")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_NOISE)


@contextlib.contextmanager
def _quiet_planner() -> Iterator[None]:
    drop = _DropNoise()
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


# off a terminal (a log file, CI, ``| tee``), where a line redrawn in place cannot show, a plain
# line says how long the planner has taken, this often (seconds)
OFF_TERMINAL_EVERY_S = 30.0


def _on_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


@contextlib.contextmanager
def elapsed_bar(desc: str, file: Any = None, tick_s: float = 1.0, delay_s: float = 2.0,
                disable: bool | None = None, every_s: float | None = None) -> Iterator[None]:
    """A line that counts the seconds of work that reports no progress of its own (TorchRec's
    planner: minutes on hundreds of tables), shown on a terminal after ``delay_s``, from rank 0
    only, and cleared when the work ends. Off a terminal (``disable`` None) a plain line,
    ``<desc>: still planning, 60 s so far``, is printed every ``every_s`` seconds instead
    (:data:`OFF_TERMINAL_EVERY_S`): nothing showed there until the plan was done."""
    from tqdm import tqdm

    stream = file or sys.stderr
    if disable is None and os.environ.get("RANK", "0") != "0":
        disable = True
    plain = disable is None and not _on_terminal(stream)
    every = OFF_TERMINAL_EVERY_S if every_s is None else every_s
    bar = None if plain else tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed} so far", leave=False,
                                  file=stream, disable=disable, delay=delay_s)
    stop = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not stop.wait(every if bar is None else tick_s):
            if bar is None:
                print(f"{desc}: still planning, {time.monotonic() - start:.0f} s so far", file=stream, flush=True)
            else:
                bar.update(0)  # keeps to the delay, and lets close() clear what was shown

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        if bar is not None:
            bar.close()


class TorchRecPlanner(Planner):
    """TorchRec's default planner (proposers, partitioner, estimators unchanged) as the baseline.

    It uses TorchRec's default sharder, which on CPU offers only DP, TW, CW and TWCW.
    """

    name = "torchrec"

    def __init__(self, timeout_s: float | None = None, time_budget_s: float | None = None) -> None:
        # TorchRec's own timeout_seconds: past it, it stops proposing and keeps its best plan
        # so far (None: no limit; hundreds of tables can then take many minutes).
        # ``time_budget_s`` is the same, under Neo's planner's name for its time limit, so one
        # sweep over sharding=neo,torchrec can limit both
        if timeout_s is not None and time_budget_s is not None:
            raise ConfigError(
                f"sharding.timeout_s={timeout_s!r} and sharding.time_budget_s={time_budget_s!r}: give one, both "
                "are TorchRec's planning time limit (time_budget_s is the name neo's planner shares)."
            )
        key = "timeout_s" if time_budget_s is None else "time_budget_s"
        timeout_s = timeout_s if time_budget_s is None else time_budget_s
        if timeout_s is not None and (not is_number(timeout_s) or not 0 < timeout_s < math.inf):
            raise ConfigError(f"sharding.{key} must be a positive number of seconds or null, got {timeout_s!r}.")
        self.timeout_s = timeout_s

    def sharders(self, context: PlanningContext) -> list[Any]:
        """TorchRec's default EBC sharder with the kernel's fused params and the compressor's codecs."""
        return [
            EmbeddingBagCollectionSharder(
                fused_params=context.kernel.fused_params(),
                qcomm_codecs_registry=context.compressor.qcomm_codecs_registry(),
            )
        ]

    def plan(self, tables: Sequence[TableSpec], context: PlanningContext) -> PlanResult:
        """Plan ``tables`` on a meta-device ``EmbeddingBagCollection`` built from their specs."""
        from neo_plugins.sharding.planner.planner import check_plan_input

        check_plan_input(tables, context)
        return self._solve(_meta_model(tables, context), tables, context)[0]

    def plan_module(
        self, module: nn.Module, tables: Sequence[TableSpec], context: PlanningContext
    ) -> PlanResult:
        """Plan directly on ``module``; ``torchrec_plan`` is TorchRec's own ``ShardingPlan``."""
        result, torchrec_plan = self._solve(module, tables, context)
        result.torchrec_plan = torchrec_plan
        return result

    def _solve(
        self, module: nn.Module, tables: Sequence[TableSpec], context: PlanningContext
    ) -> tuple[PlanResult, Any]:
        topology = context.topology
        constraints = {t.name: table_constraints(t, context) for t in tables}
        if self.timeout_s is None and len(tables) > 200:
            print(
                f"note: TorchRec's planner on {len(tables)} tables can take many minutes; "
                "sharding.timeout_s=<seconds> stops it with its best plan so far",
                file=sys.stderr,
            )
        elif len(tables) > 200:  # it prints nothing meanwhile
            print(
                f"note: TorchRec's planner on {len(tables)} tables: it enumerates and costs every option "
                f"first (minutes on hundreds of tables, not capped), then searches for at most "
                f"sharding.timeout_s={self.timeout_s:g} s",
                file=sys.stderr,
            )
        with warnings.catch_warnings():  # its default storage reservation warns of itself: the
            # baseline is TorchRec's planner as it comes, defaults included
            warnings.filterwarnings("ignore", message="HeuristicalStorageReservation", category=FutureWarning)
            planner = EmbeddingShardingPlanner(
                topology=topology.to_torchrec(),
                batch_size=context.batch_size_per_rank,
                constraints=constraints,
                timeout_seconds=self.timeout_s,
            )
        try:
            with _quiet_planner(), elapsed_bar(f"TorchRec's planner on {len(tables)} tables"):
                torchrec_plan = planner.plan(module, self.sharders(context))
        except PlannerError as exc:
            cache_hint = (
                ", or let tables sit in host memory behind a cache (cache=lru cache.load_factor=0.05)"
                if topology.compute_device == "cuda" and context.cache.load_factor is None
                else ""
            )
            bounds = ""
            try:  # Neo's memory bounds hold any plan: where they fail, they say by how much and what to change
                from neo_plugins.sharding.planner import NeoPlanner

                NeoPlanner().check_fits(tables, context)
            except PlanningError as neo:
                bounds = f" Neo's memory bounds say why: {neo}"
            raise PlanningError(
                f"TorchRec's planner found no plan that fits the tables into {counted(topology.world_size, 'rank')} "
                f"of {topology.name!r}; {topology.memory_fix or 'add ranks or memory'}, or shrink the tables{cache_hint} "
                f"({exc.error_type.name}).{bounds}"
            ) from None
        options = planner._best_plan or []
        # On GPUs TorchRec's hbm is device memory and its ddr the host memory behind a cache; a
        # CPU rank keeps everything in ddr, its device memory
        on_gpu = topology.compute_device == "cuda"
        reports = {
            r: RankReport(
                rank=r,
                memory={"hbm": 0.0} if on_gpu else {"ddr": 0.0},
                memory_capacity=float(topology.device_memory),
                time=dict.fromkeys(("compute_fwd", "compute_bwd", "comm_fwd", "comm_bwd", "prefetch"), 0.0),
                host_memory={"ddr": 0.0} if on_gpu else {},
                host_memory_capacity=float(topology.host_memory) if on_gpu else 0.0,
            )
            for r in range(topology.world_size)
        }
        assignments = []
        order = {t.name: n for n, t in enumerate(tables)}  # the model's order, as sharding=neo lists them
        for option in sorted(options, key=lambda o: (order.get(o.name, len(order)), o.name)):
            for shard in option.shards:
                report = reports[int(shard.rank)]
                if shard.storage is not None and on_gpu:
                    report.memory["hbm"] += float(shard.storage.hbm)
                    report.host_memory["ddr"] += float(shard.storage.ddr)
                elif shard.storage is not None:
                    report.memory["ddr"] += float(shard.storage.ddr + shard.storage.hbm)
                if shard.perf is not None:
                    perf = shard.perf
                    report.time["compute_fwd"] += perf.fwd_compute * _MS
                    report.time["compute_bwd"] += perf.bwd_compute * _MS
                    report.time["comm_fwd"] += perf.fwd_comms * _MS
                    report.time["comm_bwd"] += perf.bwd_comms * _MS
                    report.time["prefetch"] += perf.prefetch_compute * _MS
            assignments.append(
                TableAssignment(
                    name=option.name,
                    sharding_type=ShardingType(option.sharding_type).value,
                    compute_kernel=option.compute_kernel,
                    ranks=[int(s.rank) for s in option.shards],
                    shard_shapes=[(int(s.size[0]), int(s.size[1])) for s in option.shards],
                    why="TorchRec planner: lowest predicted step time among its proposals",
                )
            )
        result = PlanResult(
            planner=self.name,
            tables=assignments,
            ranks=[reports[r] for r in sorted(reports)],
            batch_size_per_rank=context.batch_size_per_rank,
            topology=topology.to_dict(),
            times_from="TorchRec's estimator",
        )
        result.notes += [
            settings_note(context) + "; device memory reserved as TorchRec's planner does by default",
            result.types_note(),
            "times and memory are TorchRec's own estimates (EmbeddingPerfEstimator, its storage estimator), not "
            "Neo's cost model: its predicted step is not on the scale of sharding=neo's. To compare the two "
            "planners under one model, plan with sharding=neo sharding.estimator=torchrec, or run bench/planner.py",
        ]
        return result, torchrec_plan


def table_constraints(table: TableSpec, context: PlanningContext) -> ParameterConstraints:
    """Pooling factors per feature, and on GPU topologies the cache policy: with a share of rows
    to cache, TorchRec may put a table in host memory behind that cache (its algorithm and
    share, not TorchRec's default 20%); without one, every table stays in device memory, as
    ``cache=none`` says (TorchRec would otherwise still cache, or leave tables in host memory).
    A data-parallel-only kernel restricts the table to DP."""
    kwargs: dict[str, Any] = {"pooling_factors": [table.pooling_factor] * len(table.feature_names)}
    if context.topology.compute_device == "cuda":
        kernels = [EmbeddingComputeKernel.DENSE.value, EmbeddingComputeKernel.FUSED.value]
        if context.cache.load_factor is not None:
            kwargs["cache_params"] = context.cache.cache_params()
            kernels.append(EmbeddingComputeKernel.FUSED_UVM_CACHING.value)
        kwargs["compute_kernels"] = kernels
    if context.kernel.data_parallel_only:
        kwargs["sharding_types"] = [ShardingType.DATA_PARALLEL.value]
        kwargs["compute_kernels"] = [context.kernel.compute_kernel]
    return ParameterConstraints(**kwargs)


class _TablesOnly(nn.Module):
    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc


def _meta_model(tables: Sequence[TableSpec], context: PlanningContext) -> nn.Module:
    """A module holding one meta-device EBC with ``tables``, its weights at the precision the
    context's kernel stores (``meta_module``): enough for the planner."""
    from neo_plugins.sharding.planner.torchrec_score import meta_module

    return _TablesOnly(meta_module(tables, context))
