"""The Neo planner: cost model + search, and the explainable report of the plan it finds."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from neo_core.checks import as_whole, counted, is_number
from neo_core.errors import ConfigError, NeoError, PlanningError
from neo_core.sharding import (
    Planner,
    PlanningContext,
    PlanResult,
    RankReport,
    ShardingType,
    TableAssignment,
    TableSpec,
    check_table_names,
    check_table_specs,
    context_notes,
    settings_note,
)
from neo_plugins.sharding.planner.cost import (
    CACHED,
    TIME_KINDS,
    CostModel,
    CostParams,
    TableArrays,
    cache_hit_rate,
    codec_note,
)
from neo_plugins.sharding.planner.search import (
    ALL,
    NamedSettings,
    Option,
    Search,
    Setting,
    batch_keys,
    build_options,
    human_bytes,
    setting_groups,
    splits_into,
    why_no_option,
)

ESTIMATORS = ("neo", "torchrec")
# targets of the packing restarts (Search.fit_restarts) with estimator=torchrec, two runs each
PACKING_TARGETS = 12
MULTI_COL = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)
COL_SHARD_COUNTS = (2, 4, 8)  # sharding.col_shard_counts by default
MIN_COL_WIDTH = 16  # sharding.min_col_width by default
# the plan note where cache.prefetch_pipeline=true and some table is cached (docs/cost_model.md)
PREFETCH_NOTE = (
    "cache.prefetch_pipeline=true: its memory is counted, the overlap of prefetch with the step is not (the "
    "recipes' training loop does not run a prefetching pipeline: missed rows are fetched inside the forward), "
    "so the predicted step is an upper bound for a pipeline that overlaps them"
)


@dataclasses.dataclass
class UnusedCounts:
    """The sharding.col_shard_counts that give no table column shards (:func:`unused_col_counts`)."""

    counts: tuple[int, ...]  # all of them, as given
    over: list[int]  # more shards than the most any allowed column type has here (noted where given)
    narrow: list[int]  # within that, but splitting no table's dim as the fused kernel needs
    most: int  # the most column shards here (0: no column type applies on this cluster)
    most_of: str  # what they are, e.g. "the 2 ranks"
    types: list[str]  # the column types that apply on this cluster, by short name
    min_col_width: int
    # given (not the default): a default count above a small cluster's ranks is no news
    given: bool = True

    @property
    def all_unused(self) -> bool:
        return self.most >= 2 and len(self.over) + len(self.narrow) == len(self.counts)

    def reasons(self) -> list[str]:
        said = []
        if self.narrow:
            said.append(f"sharding.col_shard_counts {', '.join(map(str, self.narrow))} split"
                        f"{'s' if len(self.narrow) == 1 else ''} no table: shards must be whole multiples of 4 "
                        f"columns, at least sharding.min_col_width={self.min_col_width}")
        if self.over and (self.given or self.all_unused):
            said.append(f"sharding.col_shard_counts {', '.join(map(str, self.over))} "
                        f"{'is' if len(self.over) == 1 else 'are'} more shards than {self.most_of}")
        return said

    @property
    def note(self) -> str:
        """The plan's note, "" where every count gives some table column shards."""
        if not self.reasons():
            return ""
        left = (f", so {', '.join(self.types)} {'was' if len(self.types) == 1 else 'were'} not considered"
                if self.all_unused else "")
        return "; ".join(self.reasons()) + left

    def refusal(self, asked: set[ShardingType], dims: Any) -> str:
        """The error where sharding.sharding_types asks for column types no count gives any table:
        why, and the counts (else the narrower sharding.min_col_width) that would give some."""
        named = ", ".join(sorted(t.short for t in asked))
        shown = sorted({int(d) for d in dims})
        fits = [k for k in range(2, self.most + 1) if splits_into(np.asarray(shown), k, self.min_col_width).any()]
        widths = [d // k for d in shown for k in self.narrow if d % k == 0 and (d // k) % 4 == 0]
        fix = (f"sharding.col_shard_counts={fits[:3]}, or " if fits
               else f"sharding.min_col_width={max(widths)}, or " if widths else "")
        dims_said = (f" (table dims: {', '.join(map(str, shown[:5]))}{' ...' if len(shown) > 5 else ''})"
                     if self.narrow else "")
        return (f"sharding.sharding_types asks for {named}, but no table can be split into columns here: "
                f"{'; '.join(self.reasons())}{dims_said}; give {fix}leave {named} out of sharding.sharding_types.")


def unused_col_counts(
    counts: Sequence[int], dims: Any, column_types: set[ShardingType], topology: Any, min_col_width: int,
    given: bool = True,
) -> UnusedCounts:
    """The ``counts`` no type of ``column_types`` gives any table of ``dims`` on ``topology``, as
    :func:`build_options` decides: above the most shards a type has there (CW: the ranks, TWCW:
    a node's ranks, on 2 or more nodes, GRID: the nodes, of 2 or more ranks), or, within it,
    splitting no dim into whole shards of a multiple of 4 columns, at least ``min_col_width``;
    ``given``: the counts are the user's, not the default."""
    W, L, N = topology.world_size, topology.devices_per_node, topology.num_nodes
    limits = {
        ShardingType.COLUMN_WISE: (W, f"the {W} ranks"),
        ShardingType.TABLE_COLUMN_WISE: (L if N > 1 else 0, f"the {L} ranks of a node"),
        ShardingType.GRID_SHARD: (N if N > 1 and L > 1 else 0, f"the {N} nodes"),
    }
    applies = {t: limits[t] for t in column_types if limits[t][0] >= 2}
    most, most_of = max(applies.values(), default=(0, ""))
    if most < 2:  # no column type applies here, whatever the counts (said where the types are)
        return UnusedCounts(tuple(counts), [], [], most, most_of, [], min_col_width, given)
    over = [k for k in counts if k > most]
    narrow = [k for k in counts if k <= most and not splits_into(dims, k, min_col_width).any()]
    return UnusedCounts(tuple(counts), over, narrow, most, most_of, sorted(t.short for t in applies), min_col_width,
                        given)


LOWER_CACHE = "lower the cache load_factor"  # a refusal's advice where a cache is on


def rw_sizes(rows: int, n: int) -> list[int]:
    """Row counts of ``n`` row-wise shards, as TorchRec splits them (equal blocks, last short)."""
    block = -(-rows // n)
    return [max(0, min(block, rows - i * block)) for i in range(n)]


def check_plan_input(tables: Any, context: Any) -> None:
    """What a planner's ``plan`` is given, called directly rather than through ``plan_tables``
    (which builds both): a list of table specs and a context with a topology object."""
    from neo_core.topology import Topology

    if not isinstance(tables, Sequence) or isinstance(tables, (str, bytes)):
        raise ConfigError(f"tables must be a list of TableSpec objects, got {type(tables).__name__}; pass list(...) "
                          "of it (neo_core.api.plan_tables takes any iterable).")
    check_table_specs(tables)
    if not isinstance(context, PlanningContext):
        raise ConfigError(f"context must be a PlanningContext, got {type(context).__name__}; build one with "
                          "neo_core.api.make_context(topology, batch_size_per_rank).")
    if not isinstance(context.topology, Topology):
        shown = repr(context.topology) if len(repr(context.topology)) <= 80 else type(context.topology).__name__
        raise ConfigError(f"context.topology must be a Topology object, got {shown}; neo_core.api.make_context("
                          "topology, batch_size_per_rank) resolves a plugin name or mapping to one.")


def validate_tables(tables: Sequence[TableSpec], context: PlanningContext) -> None:
    """Reject input no plan can be made for, with one clear sentence."""
    if len(tables) == 0:
        raise ConfigError("The table list is empty; give at least one embedding table to plan.")
    check_table_names(tables)
    if context.batch_size_per_rank < 1:
        raise ConfigError(
            f"batch_size_per_rank is {context.batch_size_per_rank}; it must be a positive integer."
        )


def _listlike(value: Any) -> bool:
    """A list, tuple, set or array: not a string, not a mapping."""
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__iter__") and hasattr(value, "__len__")


def _type_list(key: str, value: Any) -> None:
    if not _listlike(value) or not len(value):
        raise ConfigError(f"{key} must be a non-empty list of sharding types, e.g. [TW, RW]; got {value!r}.")


def _check_planner_args(
    sharding_types: Any, reserve_fraction: Any, host_reserve_fraction: Any, col_shard_counts: Any,
    min_col_width: Any, time_budget_s: Any, collective_latency_s: Any, index_bytes: Any,
    table_sharding_types: Any, packing_targets: Any = None, check_settings_s: Any = 0.0,
) -> None:
    """Kinds and ranges of NeoPlanner's arguments, each error naming its ``sharding.`` key."""
    if sharding_types is not None:
        _type_list("sharding.sharding_types", sharding_types)
    for key, value in (("reserve_fraction", reserve_fraction), ("host_reserve_fraction", host_reserve_fraction)):
        if not is_number(value):
            raise ConfigError(f"sharding.{key} must be a number in [0, 1), got {value!r}.")
    if not is_number(time_budget_s) or time_budget_s == math.inf:
        raise ConfigError(f"sharding.time_budget_s must be a positive finite number of seconds, got {time_budget_s!r}.")
    if not (is_number(check_settings_s) and 0 <= check_settings_s < math.inf):
        raise ConfigError(
            f"sharding.check_settings_s must be a finite number of seconds, 0 or more (0: name the "
            f"memory bounds unchecked), got {check_settings_s!r}."
        )
    if not _listlike(col_shard_counts) or not all((as_whole(k) or 0) >= 2 for k in col_shard_counts):
        raise ConfigError(
            f"sharding.col_shard_counts must be a list of column-shard counts of 2 or more, e.g. [2, 4, 8]; "
            f"got {col_shard_counts!r}."
        )
    if (as_whole(min_col_width) or 0) < 4 or min_col_width % 4:
        raise ConfigError(
            f"sharding.min_col_width must be a whole multiple of 4 (the fused kernel's column unit), "
            f"got {min_col_width!r}."
        )
    if collective_latency_s is not None and not (is_number(collective_latency_s) and 0 <= collective_latency_s < math.inf):
        raise ConfigError(
            f"sharding.collective_latency_s must be a finite number of seconds, 0 or more (or null: the "
            f"topology's figure), got {collective_latency_s!r}."
        )
    if packing_targets is not None and not (as_whole(packing_targets) is not None and packing_targets >= 0):
        raise ConfigError(
            f"sharding.packing_targets must be a whole number, 0 or more (or null: {PACKING_TARGETS} with "
            f"estimator=torchrec, 0 with neo), got {packing_targets!r}."
        )
    if as_whole(index_bytes) not in (4, 8):
        raise ConfigError(f"sharding.index_bytes must be 4 (int32 ids) or 8 (int64 ids), got {index_bytes!r}.")
    if table_sharding_types is not None:
        if not isinstance(table_sharding_types, Mapping):
            raise ConfigError(
                "sharding.table_sharding_types must map table names to lists of types, e.g. "
                f"{{cat_1: [RW, TWRW]}}; got {table_sharding_types!r}."
            )
        for name, types in table_sharding_types.items():
            _type_list(f"sharding.table_sharding_types.{name}", types)


# a plan's status line shows once it has taken this long (most plans take less)
STATUS_DELAY_S = 1.0


def _quiet(status: str) -> None:
    """No status line (``NeoPlanner.progress`` off, or outside a plan)."""


@contextlib.contextmanager
def _status_line(what: str, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A status line on stderr while planning takes more than a second: the time so far and
    the search's last news (the best slowest rank's load, its bound, the phase). tqdm's,
    shown only where stderr is a terminal, and only on the first rank of a distributed run
    (each rank plans the same); it is cleared when the plan is done."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    if not enabled or rank != "0":
        yield _quiet
        return
    from tqdm import tqdm

    # news comes a few times a second at most (a run, 200 refinement moves, an option costed):
    # each is drawn once the delay has passed, so a long phase's first news is not held back
    bar = tqdm(desc=what, total=None, delay=STATUS_DELAY_S, leave=False, disable=None, file=sys.stderr,
               bar_format="{desc} [{elapsed}]{postfix}", mininterval=0, miniters=1)

    def status(news: str) -> None:
        bar.set_postfix_str(news, refresh=False)
        bar.update(1)

    try:
        yield status
    finally:
        bar.close()


# the share of each rank's device memory kept free by default (sharding.reserve_fraction)
RESERVE_FRACTION = 0.15


class NeoPlanner(Planner):
    """Topology-aware 4D sharding planner (TW, RW, CW, DP, TWRW, TWCW, GRID)."""

    name = "neo"

    def __init__(
        self,
        sharding_types: Sequence[str] | None = None,
        reserve_fraction: float = RESERVE_FRACTION,
        host_reserve_fraction: float = 0.0,
        col_shard_counts: Sequence[int] = COL_SHARD_COUNTS,
        min_col_width: int = MIN_COL_WIDTH,
        refine: bool = True,
        time_budget_s: float = 30.0,
        collective_latency_s: float | None = None,
        index_bytes: int = 8,
        table_sharding_types: Mapping[str, Sequence[str]] | None = None,
        estimator: str = "neo",
        packing_targets: int | None = None,
        check_settings_s: float = 20.0,
        fewer_types_share: float = 0.10,
        progress: bool = True,
    ) -> None:
        _check_planner_args(
            sharding_types, reserve_fraction, host_reserve_fraction, col_shard_counts, min_col_width,
            time_budget_s, collective_latency_s, index_bytes, table_sharding_types, packing_targets,
            check_settings_s,
        )
        if not (is_number(fewer_types_share) and 0 <= fewer_types_share <= 1):
            raise ConfigError(
                f"sharding.fewer_types_share must be a fraction of the step in [0, 1] (the least latency "
                f"fewer sharding types must save to be tried), got {fewer_types_share!r}."
            )
        # plans over fewer sharding types are tried where the collectives' latency they could
        # save is at least this share of the step (Search.fewer_types)
        self.fewer_types_share = float(fewer_types_share)
        for key, value in (("refine", refine), ("progress", progress)):
            if not isinstance(value, bool):
                raise ConfigError(f"sharding.{key} must be true or false, got {value!r}.")
        self.progress = progress
        self._status: Callable[[str], None] = _quiet
        # seconds to check, by planning, the topology settings a refusal names (the fewest
        # nodes, the memory): raised until the tables plan with them; 0: the memory bounds,
        # unchecked
        self.check_settings_s = float(check_settings_s)
        self._unfit = ""  # why the last settings check refused, where not for memory (``_fits``)
        if not 0.0 <= reserve_fraction < 1.0:
            raise ConfigError(f"sharding.reserve_fraction={reserve_fraction} must lie in [0, 1).")
        if not 0.0 <= host_reserve_fraction < 1.0:
            raise ConfigError(
                f"sharding.host_reserve_fraction={host_reserve_fraction} must lie in [0, 1)."
            )
        if estimator not in ESTIMATORS:
            raise ConfigError(
                f"sharding.estimator={estimator!r} is not known; choose one of {', '.join(ESTIMATORS)}."
            )
        # "neo": Neo's cost model (docs/cost_model.md); "torchrec": the same search over
        # TorchRec's EmbeddingPerfEstimator figures per shard (memory stays Neo's)
        self.estimator = estimator
        # packing restarts (Search.fit_restarts): by default only with TorchRec's estimator,
        # whose costing already takes 0.04-4 s; with Neo's model they would cost more than
        # the plan's time allows (MLPerf on 8 ranks: 4 -> 13 ms, TorchRec's planner 0.7 s)
        if packing_targets is None:
            packing_targets = PACKING_TARGETS if estimator == "torchrec" else 0
        self.packing_targets = int(packing_targets)
        if estimator == "torchrec":  # TorchRec's estimator has no per-collective latency
            collective_latency_s = 0.0
        self.allowed = (
            {ShardingType.parse(s) for s in sharding_types} if sharding_types else set(ShardingType)
        )
        # the types listed in sharding.sharding_types (none: all allowed, none asked for by name)
        self.asked = set(self.allowed) if sharding_types else set()
        self.params = CostParams(
            reserve_fraction=reserve_fraction,
            host_reserve_fraction=host_reserve_fraction,
            index_bytes=int(index_bytes),
            collective_latency_s=collective_latency_s,
        )
        self.col_shard_counts = tuple(int(k) for k in col_shard_counts)
        self.min_col_width = int(min_col_width)
        self.refine = refine
        if not time_budget_s > 0:
            raise ConfigError(f"sharding.time_budget_s={time_budget_s} must be a positive number of seconds.")
        self.time_budget_s = float(time_budget_s)
        # per-table restriction (table name -> allowed types), on top of ``sharding_types``
        self.table_types = {
            name: {ShardingType.parse(s) for s in types}
            for name, types in (table_sharding_types or {}).items()
        }
        self.last_search: Search | None = None

    # ---- planning ------------------------------------------------------------------
    def plan(self, tables: Sequence[TableSpec], context: PlanningContext) -> PlanResult:
        check_plan_input(tables, context)
        with _status_line("planning", self.progress) as self._status:
            try:
                return self._plan(tables, context)
            except PlanningError as exc:
                return self._check_settings(exc, tables, context)
            finally:
                self._status = _quiet

    def _check_settings(self, exc: PlanningError, tables: Sequence[TableSpec], context: PlanningContext) -> NoReturn:
        """Re-raise a refusal with the settings it names checked by planning (``_plans_with``),
        or as it is."""
        named: NamedSettings | None = getattr(exc, "named_settings", None)
        if named is None or self.check_settings_s <= 0:
            raise exc
        deadline = time.perf_counter() + self.check_settings_s
        found = [self._plans_with(tables, context, group, deadline) for group in named.groups]
        if all(f is None for f in found):
            raise exc
        groups = [f if isinstance(f, list) else g for f, g in zip(found, named.groups)]
        checked = [True if isinstance(f, list) else f or False for f in found]
        note = _settings_note(context.topology, groups, checked)
        raise PlanningError(str(exc).replace(named.anchor, named.keep + note, 1)) from None

    def _plans_with(
        self, tables: Sequence[TableSpec], context: PlanningContext, group: Sequence[Setting], deadline: float
    ) -> list[Setting] | str | None:
        """``group``'s settings (as a message names them), raised step by step until the
        tables plan with them, then lowered again between the last refused step and that one
        (two halvings); None where no step planned before ``deadline``, "limit" where a
        setting reached its largest value (``Topology.config_limits``) without a plan, and
        "tried: <settings>" where every step was refused, up to those settings. A step
        plans where the search places every table within memory (``_fits``: what the plan
        would be is not worked out)."""
        topology = context.topology
        values = {what: topology.setting_value(what, need) for what, need in group}
        limits = topology.config_limits

        def at(scale: float) -> dict[str, float]:
            return {w: min(math.ceil(v * scale - 1e-9) if w == "num_nodes" else math.ceil(v * scale * 10 - 1e-9) / 10,
                           limits.get(w, math.inf))
                    for w, v in values.items()}

        tried: dict[tuple, bool] = {}

        def plans(scale: float) -> bool:
            key = tuple(sorted(at(scale).items()))
            if key not in tried:
                self._status("refused; checking " + ", ".join(
                    f"{topology.config_keys[w][0]}={v:g}" for w, v in key) + " by planning")
                changed = topology
                for what, value in key:
                    changed = changed.with_setting(what, value)
                checked = dataclasses.replace(context, topology=changed)
                if context.global_batch and changed.world_size != topology.world_size:
                    # a global batch is divided by the ranks again (recipes/plan.py's rule)
                    checked = dataclasses.replace(
                        checked, batch_size_per_rank=max(1, context.global_batch // changed.world_size))
                tried[key] = self._fits(tables, checked, deadline)
            return tried[key]

        low, high = 1.0, None
        for scale in (1.0, 1.02, 1.05, 1.1, 1.2, 1.35, 1.6):
            if time.perf_counter() > deadline:
                return None
            if plans(scale):
                high = scale
                break
            low = scale
            if any(v >= limits.get(w, math.inf) for w, v in at(scale).items()):
                return "limit"  # refused at the most the setting can be
        if high is None:  # refused at every step: say how far it was checked, and why where not memory
            said = ", ".join(f"{topology.config_keys[w][0]}={v:g}" for w, v in at(scale).items())
            return "tried: " + said + (f" ({self._unfit})" if self._unfit else "")
        for _ in range(2 if high > 1.0 else 0):
            mid = (low + high) / 2
            if time.perf_counter() > deadline:
                break
            if plans(mid):
                high = mid
            else:
                low = mid
        unit = {w: topology.config_keys[w][1] for w in values}
        return [(w, v * unit[w]) for w, v in at(high).items()]

    def _fits(self, tables: Sequence[TableSpec], context: PlanningContext, deadline: float) -> bool:
        """Whether the search places every table within memory on ``context``: the capacity
        check, the first greedy, and the memory-priced runs, which run until one plan fits
        whatever the clock, and no further (refinement and the other restarts change the
        plan's speed, not whether it fits). Settings the tables cannot take there (a type no
        table can use on that many ranks) count as not fitting."""
        self._unfit = ""
        try:
            search = self._prepared(tables, context)[-1]
            search.progress = None  # the check's own status says what is tried
            search.solve(False, max(deadline - time.perf_counter(), 1e-3), first_fit=True)
        except PlanningError:
            return False
        except NeoError as exc:  # not memory: a setting the tables cannot take (said with the check)
            self._unfit = str(exc).split("; ")[0].rstrip(".")
            return False
        return True

    def _plan(self, tables: Sequence[TableSpec], context: PlanningContext) -> PlanResult:
        start = time.perf_counter()
        model, arrays, allowed, options, search = self._prepared(tables, context)
        # column types the fused kernel could split tables by (the dense kernel replicates them)
        column_types = allowed & set(MULTI_COL) if context.kernel.compute_kernel == "fused" else set()
        given = self.col_shard_counts != COL_SHARD_COUNTS
        unused = unused_col_counts(self.col_shard_counts, arrays.dims, column_types, context.topology,
                                   self.min_col_width, given=given)
        # refused where the user both set the column splits and asked for a column type by name
        # (a list of types Neo advises, without counts, plans on with a note)
        if column_types & self.asked and unused.all_unused and (given or self.min_col_width != MIN_COL_WIDTH):
            raise ConfigError(unused.refusal(column_types & self.asked, arrays.dims))
        search.progress = self._status
        greedy_max = search.solve(self.refine, self.time_budget_s, fit_targets=self.packing_targets)
        first_unplaced = search.first_unplaced
        refined, moves = float(search.loads.max()), search.moves
        step, types = search.step(), search.types_used()
        # fewer sharding types where their collectives' latency outweighs the balance they
        # buy: re-placing the tables of one type at a time, then up to 3 restricted solves
        # (each costs up to one solve, with its own time budget), fewer as tables grow and none
        # above 600 tables, where latency is a small share of the step
        fit_runs, fit_wins = search.fit_runs, search.fit_wins
        subsets = search.fewer_types(
            min(3, 600 // len(tables)), self.refine, self.time_budget_s, share=self.fewer_types_share,
            fit_targets=self.packing_targets,
        )
        host_shares = search.host_shares_used  # of the plan kept, which the fewer-types pass may replace
        self.last_search = search
        # the types a table is held to, where that holds it to fewer than sharding.sharding_types
        held = {name: kept for name, types in self.table_types.items() if (kept := types & self.allowed) != self.allowed}
        result = build_result(self.name, search, tables, context, left_out=types - search.types_used(), held=held)
        result.times_from = "TorchRec's estimator" if self.estimator == "torchrec" else "Neo's cost model"
        result.notes.extend(context_notes(result, context))
        if context.cache.prefetch_pipeline and result.cached_tables:
            result.notes.append(PREFETCH_NOTE)
        compressed = (context.compressor.forward_precision, context.compressor.backward_precision) != ("fp32", "fp32")
        if compressed and context.topology.world_size > 1 and self.estimator != "torchrec":
            result.notes.append(codec_note(context.topology))
        # on the fused kernel, where a type besides DP was allowed
        shardable = any(o.sharding_type is not ShardingType.DATA_PARALLEL for o in search.opts)
        odd = [t for t in tables if t.embedding_dim % 4] if context.kernel.compute_kernel == "fused" and shardable else []
        if odd:
            names = ", ".join(f"{t.name} (dim {t.embedding_dim})" for t in odd[:5])
            result.notes.append(
                f"{len(odd)} table(s) replicated on the unfused dense kernel, whatever their cost: their dim is not "
                f"a multiple of 4, which FBGEMM's fused kernel needs: {names}"
                + (f" and {len(odd) - 5} more" if len(odd) > 5 else "")
                + f"; pad the dim to {-(-odd[0].embedding_dim // 4) * 4} to shard them"
            )
        if unused.note:  # a count that gives no table column shards was silently unused
            result.notes.append(unused.note)
        elapsed = time.perf_counter() - start
        result.notes.append(
            f"searched {len(options)} options x {counted(len(tables), 'table')} in {elapsed:.2f} s; "
            # where the first greedy placed not every table, the first figure is the memory-priced
            # runs', refined within them: "greedy X -> refined X (911 moves)" read as moves that gained nothing
            + (f"slowest rank's load: memory-priced runs {greedy_max * 1e3:.3f} ms -> " if first_unplaced
               else f"slowest rank's load: greedy {greedy_max * 1e3:.3f} ms -> ")
            + (f"{'after the restarts' if first_unplaced else 'refined'} {refined * 1e3:.3f} ms ({moves} moves, "
               if self.refine else
               f"{refined * 1e3:.3f} ms, not refined (sharding.refine=false; ")
            + f"{search.restarts} restarts"
            + (f", {fit_runs} packing restarts, {fit_wins} better" if fit_runs else "")
            + f"); load lower bound {search.lower_bound() * 1e3:.3f} ms"
            + ("; times from TorchRec's EmbeddingPerfEstimator" if self.estimator == "torchrec" else "")
            # the figures above are the search's plan; the one kept may be the fewer-types pass's
            + ("; the fewer-types pass then changed the plan (its note below gives the kept plan's load and step)"
               if search.types_used() != types else "")
        )
        if host_shares:
            result.notes.append(
                "no plan was found with host memory shared by a node's ranks; this one holds each rank "
                "to its share of it (host_memory), which fits either way"
            )
        if first_unplaced:
            result.notes.append(
                "the first greedy left a table that fits no rank; the memory-priced runs (which weigh "
                "each option's memory) placed every table"
                + (", each run refined: the load above starts from theirs" if self.refine else
                   ": the load above is theirs")
            )
        if search.clock_stops:
            result.notes.append(
                f"wall-clock safety stop reached {search.clock_stops} time(s) (sharding.time_budget_s="
                f"{self.time_budget_s:g}): this plan may differ on a faster or slower machine; raise "
                "time_budget_s for a plan that depends on the input alone"
            )
        if search.types_used() != types:
            names = ", ".join(sorted(ShardingType(v).short for v in search.types_used()))
            dropped = ", ".join(sorted(ShardingType(v).short for v in types - search.types_used()))
            added = ", ".join(sorted(ShardingType(v).short for v in search.types_used() - types))
            # how the pass found it: alternatives re-placed from the plan, solved anew, or both
            kinds = [(n, how) for n, how in ((search.repairs, "re-placed from the plan"), (subsets, "solved anew")) if n]
            tried = [f"{counted(n, 'alternative') if k == 0 else n} {how}" for k, (n, how) in enumerate(kinds)]
            how = ", ".join(tried) + (
                f"; this one {'re-placed' if search.fewer_found_by == 're-placing' else 'solved'}" if len(tried) > 1 else ""
            )
            head = (
                f"sharding types swapped for less collective latency ({how}): now {names} ({added} added; "
                f"{dropped} left out)"
                if added else f"fewer sharding types ({how}): {names} only, without {dropped}"
            )
            result.notes.append(
                f"{head}; load {refined * 1e3:.3f} -> {float(search.loads.max()) * 1e3:.3f} ms, collective latency "
                f"{model.latency_time(types) * 1e3:.3f} -> {model.latency_time(search.types_used()) * 1e3:.3f} ms, "
                f"step {step * 1e3:.3f} -> {search.step() * 1e3:.3f} ms; the why-lines' alternatives include "
                "the types left out"
            )
        return result

    def check_fits(self, tables: Sequence[TableSpec], context: PlanningContext) -> None:
        """Raise :class:`PlanningError`, naming tables, memories and the topology's settings,
        where no sharding of the allowed types fits the tables into the cluster's memory.
        Neo's memory bounds hold any planner's plan: another planner's refusal is explained by
        them where they apply."""
        self._prepared(tables, context)

    def _prepared(
        self, tables: Sequence[TableSpec], context: PlanningContext
    ) -> tuple[CostModel, TableArrays, set[ShardingType], list[Option], Search]:
        """The cost model, tables, allowed types, options and search for a plan, once the
        tables are checked against the cluster's memory (``check_capacity``)."""
        validate_tables(tables, context)
        model = CostModel(context, self.params)
        arrays = TableArrays.from_specs(tables)
        allowed = self.allowed
        if context.kernel.data_parallel_only:
            check_data_parallel_allowed(context.kernel.name, self.allowed, self.table_types, tables)
            allowed = {ShardingType.DATA_PARALLEL}
        options = build_options(model, arrays, allowed, self.col_shard_counts, self.min_col_width)
        restrict_per_table(options, tables, self.table_types, self.min_col_width,
                           (context.topology, self.allowed, self.col_shard_counts))
        restrict_unaligned(options, tables, context)
        if self.estimator == "torchrec":
            from neo_plugins.sharding.planner.torchrec_score import torchrec_option_costs

            torchrec_option_costs(options, tables, context, status=self._status)
        search = Search(model, arrays, options)
        search.torchrec_times = self.estimator == "torchrec"

        def why_none(i: int) -> str:  # why table i has no option, type by type
            types = allowed & self.table_types.get(arrays.names[i], allowed)
            return why_no_option(types, int(arrays.rows[i]), int(arrays.dims[i]), model.W, model.L, model.N,
                                 self.col_shard_counts, self.min_col_width)

        check_capacity(search, arrays, why_none, lambda i: allowed & self.table_types.get(arrays.names[i], allowed))
        return model, arrays, allowed, options, search
    def sharders(self, context: PlanningContext) -> list[Any]:
        from neo_plugins.sharding.sharders import make_sharders

        return make_sharders(context)


def check_data_parallel_allowed(
    kernel: str, allowed: set[ShardingType], table_types: dict[str, set[ShardingType]], tables: Sequence[TableSpec]
) -> None:
    """A kernel that only replicates tables needs data parallel among the allowed types."""
    dp = ShardingType.DATA_PARALLEL
    where = None
    if dp not in allowed:
        where = f"sharding.sharding_types=[{','.join(sorted(s.short for s in allowed))}]"
    else:
        names = {t.name for t in tables}
        left_out = sorted(n for n, types in table_types.items() if n in names and dp not in types)
        if left_out:
            types = table_types[left_out[0]]
            where = f"sharding.table_sharding_types.{left_out[0]}=[{','.join(sorted(s.short for s in types))}]"
            if len(left_out) > 1:
                where += f" (and {len(left_out) - 1} more table(s))"
    if where:
        raise ConfigError(
            f"kernel {kernel} replicates every table (data parallel only), but {where} leaves out DP: "
            "allow DP there, or choose a kernel that shards tables (kernel=fused)."
        )


def restrict_per_table(
    options: list[Option],
    tables: Sequence[TableSpec],
    table_types: dict[str, set[ShardingType]],
    min_col_width: int = 16,
    where: tuple[Any, set[ShardingType] | None, Sequence[int]] | None = None,
) -> None:
    """Mark options invalid for tables whose allowed types (``table_sharding_types``) exclude them
    (``where``: the topology, the global sharding types and the column-shard counts, to say why
    none of a table's types applies)."""
    if not table_types:
        return
    names = {t.name for t in tables}
    unknown = sorted(set(table_types) - names)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        some = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ConfigError(
            f"sharding.table_sharding_types names unknown table(s): {', '.join(unknown)}{hint}; the tables are {some}."
        )
    for o in options:
        keep = np.array([o.sharding_type in table_types.get(t.name, (o.sharding_type,)) for t in tables])
        o.valid = o.valid & keep
    for i, t in enumerate(tables):
        if t.name in table_types and not any(o.valid[i] for o in options):
            allowed = ", ".join(sorted(s.short for s in table_types[t.name]))
            narrow = ""
            if table_types[t.name] & set(MULTI_COL) and t.embedding_dim < 2 * min_col_width:
                narrow = (
                    f" (column splits of its dim {t.embedding_dim} would be narrower than "
                    f"sharding.min_col_width={min_col_width}; lower that, to a multiple of 4)"
                )
            why = ""
            if where is not None:
                topology, global_types, counts = where
                left_out = sorted(s.short for s in table_types[t.name] - (global_types or table_types[t.name]))
                reasons = why_no_option(table_types[t.name], t.num_embeddings, t.embedding_dim, topology.world_size,
                                        topology.devices_per_node, topology.num_nodes, tuple(counts), min_col_width)
                why = "; ".join(filter(None, [reasons, f"{', '.join(left_out)}: not in sharding.sharding_types"
                                               if left_out else ""]))
                why = f" ({why})" if why and not narrow else ""
            raise ConfigError(
                f"Table {t.name!r} allows only {allowed}, none of which is possible on this "
                f"topology or with the global sharding_types{narrow}{why}; allow another type."
            )


def restrict_unaligned(options: list[Option], tables: Sequence[TableSpec], context: PlanningContext) -> None:
    """Tables whose dim is not a multiple of 4 are replicated only (data parallel).

    FBGEMM's fused kernel (and so every sharded type) needs ``embedding_dim % 4 == 0``; TorchRec
    runs data-parallel tables on its dense kernel, which takes any dim.
    """
    if context.kernel.compute_kernel != "fused":
        return
    odd = np.array([t.embedding_dim % 4 != 0 for t in tables])
    if not odd.any():
        return
    for o in options:
        if o.sharding_type is not ShardingType.DATA_PARALLEL:
            o.valid = o.valid & ~odd
    for i in np.flatnonzero(odd):
        if not any(o.valid[i] for o in options):
            t = tables[i]
            raise ConfigError(
                f"Table {t.name!r} has embedding_dim {t.embedding_dim}, not a multiple of 4: the fused "
                "kernel cannot shard it, and data parallel (which could) is not allowed for it; pad its dim "
                f"to {-(-t.embedding_dim // 4) * 4} or allow DP."
            )


def check_capacity(search: Search, t: TableArrays, why_none: Callable[[int], str] | None = None,
                   allowed_types: Callable[[int], set[ShardingType]] | None = None) -> None:
    """Fail early, naming tables, when tables cannot fit however they are sharded
    (``why_none(i)``: why table ``i`` has no option at all, where that is the cause;
    ``allowed_types(i)``: the sharding types the settings allow table ``i``). The error's
    ``named_settings`` holds the topology settings its message names, for the planner to
    check by planning."""
    noted: list[tuple[str, list[list[Setting]]]] = []
    try:
        _check_capacity(search, t, why_none, allowed_types, noted)
    except PlanningError as exc:
        text, groups = noted[-1] if noted else ("", [])
        exc.named_settings = NamedSettings(text, "", groups) if groups else None  # type: ignore[attr-defined]
        raise


def _check_capacity(search: Search, t: TableArrays, why_none: Callable[[int], str] | None,
                    allowed_types: Callable[[int], set[ShardingType]] | None,
                    noted: list[tuple[str, list[list[Setting]]]]) -> None:
    W = search.W
    cap_dev, cap_host = search.cap_dev, search.cap_host
    params = search.model.params
    # smallest whole-table footprint per table over its valid options
    dev = np.stack([np.where(o.valid, o.cost.mem_device * o.num_shards, np.inf) for o in search.opts])
    host = np.stack([np.where(o.valid, o.cost.mem_host * o.num_shards, np.inf) for o in search.opts])
    order = np.lexsort((host, dev), axis=0)[0]  # option with least device memory per table
    cols = np.arange(len(t))
    need_dev, need_host = dev[order, cols], host[order, cols]
    never = ~search.usable.any(axis=0)
    topology = search.model.context.topology

    def note(alternatives: Sequence[Setting | Sequence[Setting | None] | None]) -> str:
        groups, beyond = setting_groups(topology, alternatives)
        text = _settings_note(topology, groups)
        if text:
            noted.append((text, groups))
        elif beyond:  # a setting that cannot go as high as the tables need: what it gives at most
            text = " (" + "; ".join(f"{human_bytes(need)} a rank needed, {topology.beyond_limit(what, need)}"
                                    for what, need in beyond) + ")"
        return text

    on_gpu = topology.compute_device == "cuda"
    # CPU ranks hold their tables in RAM: the topology's "device memory" is each rank's share,
    # unless a larger topology is emulated here (its own per-device memory is planned for)
    if on_gpu:
        mem = "device memory"
    elif topology.emulated_from:
        mem = f"device memory (of {topology.emulated_from}, emulated on CPU ranks)"
    else:
        mem = "memory (each CPU rank's share of RAM)"
    mem_short = "device memory" if on_gpu else "memory"
    # a reserve raised above the default is the user's own lever, named first where the
    # default's reserve leaves room for what is short (``reserve_fix(short, room)``)
    freed = (1 - RESERVE_FRACTION) / (1 - params.reserve_fraction) - 1  # room the default adds, per usable byte

    def reserve_fix(short: float, usable: float, what: str) -> str:
        if params.reserve_fraction <= RESERVE_FRACTION or short > usable * freed:
            return ""
        return (f"lower sharding.reserve_fraction (now {params.reserve_fraction:g}: {params.reserve_fraction:.0%} of each "
                f"rank's {mem_short} is kept free; at {RESERVE_FRACTION:g}, the default, {what}), ")
    add_memory = topology.memory_fix  # where more ranks add no memory (CPU ranks splitting one machine's RAM)
    cached = search.model.cache_load_factor is not None
    cache = search.model.context.cache
    # a cache chosen for a CPU topology (an emulated GPU cluster too) is not used: tables stay in RAM
    cpu_cache = (f" (cache {cache.name} is not used on {topology.compute_device} ranks: every table stays in their memory)"
                 if not on_gpu and cache.load_factor else "")
    host_usable = " usable" if search.model.host_reserve else ""
    kernel = search.model.context.kernel
    # a cache holds shards of sharded tables; replicated (DP) tables stay in device memory (DP
    # may be all the types allowed, or a table's dim may keep the fused kernel from sharding it)
    shardable = any(o.sharding_type is not ShardingType.DATA_PARALLEL and o.valid.any() for o in search.opts)
    if kernel.data_parallel_only:  # every table replicated on the dense kernel: no cache applies
        cache_fix = "use kernel=fused, which can shard tables"
    elif not shardable:  # DP only allowed: the message's first fix (another type) comes first
        cache_fix = ""
        if cached:
            cpu_cache = f" (cache {cache.name} is not used: every table is replicated (DP), in device memory)"
    elif cached:  # the cache is on: less of each cached table in device memory is the lever
        cache_fix = LOWER_CACHE
    elif on_gpu:
        cache_fix = "hold tables in host memory behind a device cache (cache=lru cache.load_factor=0.05)"
    else:
        cache_fix = ""
    # a cache moves tables to host memory: no help where host memory could not hold them either
    to_host = cache_fix if not cached and on_gpu and not kernel.data_parallel_only and shardable else None
    # Whole-cluster memory. Each table takes one option: device bytes d_o and host bytes h_o
    # (summed over shards). Device memory is short when even the least-device options exceed
    # it. Host memory is short when, for some mu >= 0, sum_t min_o (h_o + mu d_o) - mu D > H:
    # that is a lower bound on the host bytes any assignment needs while keeping the device
    # total within D (Lagrangian relaxation), so exceeding H proves no plan fits.
    # (a table with no option at all is refused by name below, and left out of these sums)
    D, H = cap_dev * W, cap_host * W
    total_dev = float(need_dev[np.isfinite(need_dev)].sum())
    # replicated tables (their least-device option on every rank) need a copy per rank: more
    # ranks add their bytes as fast as they add memory
    replicated = np.array([search.opts[o].unit == ALL for o in order]) & np.isfinite(need_dev)
    # one batch's ids and pooled rows, counted in with the tables: with the batch per rank held,
    # the global batch, and so these buffers, grow with the ranks too (a rank's share stays; a
    # replica's are its own batch's); a global batch divided by the ranks shrinks a rank's share
    shards = np.array([o.num_shards for o in search.opts], dtype=np.float64)
    batch = np.stack([o.cost.batch for o in search.opts])[order, cols] * shards[order]
    batch_bytes = float(batch[np.isfinite(need_dev)].sum())
    held_batch = not search.model.context.global_batch
    batch_rank = batch_bytes / W if held_batch else 0.0
    copy_bytes = float((need_dev - batch)[replicated].sum()) / W  # one copy of each table, a rank's share
    fixed_rank = copy_bytes + batch_rank  # what each rank holds however many ranks there are
    finite = np.isfinite(host) & np.isfinite(dev)
    host0, dev0 = np.where(finite, host, 0.0), np.where(finite, dev, 0.0)
    some = finite.any(axis=0)
    mus = np.concatenate(([0.0], np.logspace(-3, 3, 25)))
    in_cache = np.array([o.placement == CACHED for o in search.opts])[:, None]

    def host_terms(dev_bytes: np.ndarray) -> list[tuple[float, float]]:
        """``sum_t min_o (h_o + mu d_o)`` for each ``mu``: the host bound's terms (below)."""
        return [(mu, float(np.where(finite, host0 + mu * dev_bytes, np.inf).min(axis=0)[some].sum())) for mu in mus]

    terms = host_terms(dev0)

    def host_needed(device: float, any_cache: bool = False) -> float:
        """Host bytes any plan needs with this much device memory; ``any_cache``: at any cache
        load factor, a cached option's device bytes taken as none (a lower factor shrinks them;
        its host bytes, the whole rows, stay). Only a refusal asks that, so its terms are
        computed then."""
        return max(total - mu * device
                   for mu, total in (host_terms(np.where(in_cache, 0.0, dev0)) if any_cache else terms))

    def more_nodes(least_ranks: float = 0.0) -> Setting | None:
        """The fewest nodes, at least ``least_ranks`` ranks, that the whole-cluster bounds allow."""
        per_node = topology.config_keys.get("num_nodes", ("", 0.0))[1]
        first = max(topology.num_nodes + 1, math.ceil(least_ranks / per_node - 1e-9)) if per_node else 0
        for nodes in range(first, first + 64 * topology.num_nodes) if per_node else ():
            ranks = nodes * per_node
            need = total_dev - fixed_rank * W + fixed_rank * ranks
            if need <= cap_dev * ranks and host_needed(cap_dev * ranks) <= cap_host * ranks:
                return "num_nodes", ranks
        return None

    if never.any():
        # a table with no option at all first: no memory would hold it; then the largest (its
        # least bytes over its options), whose shortfall is the one to fix
        least = np.where(some, np.where(finite, dev + host, np.inf).min(axis=0), 0.0)
        refused = sorted(np.flatnonzero(never), key=lambda j: (bool(some[j]), -float(least[j]), j))
        i = int(refused[0])
        rest = [t.names[j] for j in refused[1:]]
        named = ", ".join(map(repr, rest[:8])) + (f" and {len(rest) - 8} more" if len(rest) > 8 else "")
        more = f" ({counted(len(rest), 'more table')} also do{'es' if len(rest) == 1 else ''} not fit: {named})" if rest else ""
        size = f"Table {t.names[i]!r} ({int(t.rows[i]):,} rows x {int(t.dims[i])})"
        if kernel.compute_kernel == "fused" and int(t.dims[i]) % 4:
            size += " (a dim that is not a multiple of 4: the fused kernel cannot shard it, so it is replicated)"
            cache_fix = f"pad its dim to {-(-int(t.dims[i]) // 4) * 4} so it can be sharded"
        opts = [o for o in search.opts if o.valid[i]]
        if not opts:
            why = why_none(i) if why_none is not None else ""
            why = why or (
                f"row-wise types need a row per rank they span: {W} for RW, {search.L} for TWRW and GRID"
            )
            raise PlanningError(
                f"{size} has no sharding option among the allowed sharding types on this "
                f"topology{more} ({why}); allow another sharding type (e.g. TW or DP)."
            )
        # The option closest to fitting: a shard fits a rank when its device bytes fit the
        # usable device memory and the host bytes (cached placement) of the shards a node takes
        # fit the node's host memory, shared by its ranks.
        L, cap_node = search.L, search.cap_node

        def over(o: Option, j: int) -> tuple[float, float]:
            node_host = float(o.cost.mem_host[j]) * o.per_node(L, search.N)
            return max(0.0, float(o.cost.mem_device[j]) - cap_dev), max(0.0, node_host - cap_node)

        def closest(j: int, among: Sequence[Option] | None = None) -> Option | None:
            def closeness(o: Option) -> tuple[float, float, float]:  # relative overshoot, bytes over, bytes
                d, h = over(o, j)
                return max(d / max(cap_dev, 1.0), h / max(cap_node, 1.0)), d + h, float(o.cost.mem_device[j] + o.cost.mem_host[j])
            return min((o for o in (search.opts if among is None else among) if o.valid[j]), key=closeness, default=None)

        def needs_of(j: int) -> tuple[float, float]:
            """Device bytes per rank and host bytes per node that table ``j``'s option closest
            to fitting needs, where short of them (0 where not)."""
            o = closest(j)
            if o is None:
                return 0.0, 0.0
            d, h = over(o, j)
            return (float(o.cost.mem_device[j]) if d > 0 else 0.0,
                    float(o.cost.mem_host[j]) * o.per_node(L, search.N) if h > 0 else 0.0)

        best = closest(i)
        assert best is not None  # opts is not empty
        short_dev, short_host = over(best, i)
        # what every table that fits nowhere needs (the settings named hold them all)
        needs_all = [needs_of(int(j)) for j in np.flatnonzero(never)]
        dev_need, host_need = (max(n[k] for n in needs_all) for k in (0, 1))
        shard_dev, shard_host = float(best.cost.mem_device[i]), float(best.cost.mem_host[i])
        needs = f"{human_bytes(shard_dev)} of {mem_short}"
        if shard_host > 0:
            needs += f" and {human_bytes(shard_host)} of host memory"
        shorts, fixes = [], []
        on_ranks = "its 1 rank" if W == 1 else f"each of {W} ranks"
        if short_dev > 0:
            shorts.append(
                f"{short_dev:,.0f} bytes ({human_bytes(short_dev)}) over the {human_bytes(cap_dev)} "
                f"of {mem} usable on {on_ranks}"
            )
            fixes.append(mem_short)
        per_node = best.per_node(L, search.N)
        if short_host > 0:
            N = search.N
            shards = f"{per_node} shards, " if per_node > 1 else ""
            shorts.append(
                f"{short_host:,.0f} bytes ({human_bytes(short_host)}) over the {human_bytes(cap_node)} "
                f"of host memory{host_usable} on {'its 1 node' if N == 1 else f'each of {N} nodes'} "
                f"({shards}host memory being a node's, shared by its {counted(L, 'rank')})"
            )
            fixes.append("host memory")
        # where the closest option is on the device, what stops the cache's: its host memory
        alt = closest(i, [o for o in opts if o.placement == CACHED]) if best.placement != CACHED else None
        alt_host: Setting | None = None
        alt_dev, h = over(alt, i) if alt is not None else (0.0, 0.0)
        if alt is not None and alt_dev == 0 and h > 0:
            shorts.append(
                f"behind the cache (as {alt.label}) it fits the devices but is {h:,.0f} bytes ({human_bytes(h)}) "
                f"over the {human_bytes(cap_node)} of host memory{host_usable} a node's ranks share"
            )
            fixes.append("host memory")
            alt_host = ("host_memory",
                        float(alt.cost.mem_host[i]) * alt.per_node(L, search.N) / L / (1 - params.host_reserve_fraction))
        joined = (" or " if alt_host else " and ").join(fixes)  # the cache's option needs host memory alone
        fix = add_memory if add_memory and fixes == [mem_short] else f"add ranks or {joined}"
        if all(o.sharding_type is ShardingType.DATA_PARALLEL for o in opts) and not add_memory:
            # replicated: the whole table on every rank, however many
            fix = f"more ranks do not help, as it is whole on every rank: give each rank more {joined}"
        # the memory the closest options' shards need, and no less than the whole cluster's
        # bounds ask (the tables' least device bytes, and the host bytes they then leave) per rank
        dev_rank = max(dev_need, total_dev / W) if dev_need > 0 or total_dev > D else 0.0
        host_rank = max(host_need / L, host_needed(max(dev_rank, cap_dev) * W) / W)
        device_need: Setting | None = (("device_memory", dev_rank / (1 - params.reserve_fraction))
                                       if dev_rank > 0 else None)
        memory_settings = [  # the option closest to fitting needs each of them
            device_need,
            ("host_memory", host_rank / (1 - params.host_reserve_fraction))
            if host_need > 0 or host_rank > cap_host else None,
        ]
        # more ranks shrink row-wise shards: a shard of a + b / W bytes (a: what every shard
        # holds whatever the ranks) needs at least W x shard / capacity ranks to fit
        ranks_need = 0.0
        for j in np.flatnonzero(never):
            rw = [o for o in search.opts if o.valid[j] and o.sharding_type is ShardingType.ROW_WISE]
            ranks_need = max(ranks_need, min(
                (W * max(float(o.cost.mem_device[j]) / cap_dev, float(o.cost.mem_host[j]) * L / max(cap_node, 1.0))
                 for o in rw), default=math.inf))
        nodes_setting = more_nodes(ranks_need) if W < ranks_need < math.inf else None
        batch = float(best.cost.batch[i])
        batch_fills = short_dev > 0 and batch > 0.5 * shard_dev  # the batch's buffers, not the table, fill the shard
        if batch_fills and not search.model.context.global_batch and nodes_setting is None and not add_memory:
            # with the batch per rank held, a shard's buffers do not shrink with more ranks (and
            # no row-wise shard shrinks enough to fit: ``ranks_need``)
            fix = f"more ranks do not help, as a shard's batch buffers stay: give each rank more {joined}"
        fix += note([nodes_setting, memory_settings, alt_host])
        if alt_host is not None and cache_fix == LOWER_CACHE:
            cache_fix = ""  # the cached option fits the devices already: host memory stops it
        if batch_fills:
            fix = (f"lower the batch per rank (now {search.model.context.batch_size_per_rank:,}: {human_bytes(batch)} of the "
                   f"shard is one batch's ids and pooled rows; {batch_keys(search.model.context)}), {fix}")
            cache_fix = ""  # those stay in device memory wherever the rows live
        if cache_fix == to_host and shard_dev * per_node > cap_node:  # nor would the node's host memory hold it
            cache_fix = ""
        if cache_fix == LOWER_CACHE:
            # the most the load factor could be for a shard of it, and the whole cluster, to fit
            # device memory; none where the cached option's host bytes overfill a node too (the
            # factor does not change those)
            cached_host = [float(o.cost.mem_host[i]) * o.per_node(L, search.N) for o in search.opts
                           if o.placement == CACHED and o.valid[i]]
            bound = search.cache_bound(i) or 0.0
            host_short = bool(cached_host) and min(cached_host) > cap_node
            cache_fix = _lower_cache(float(search.model.cache_load_factor), bound) if bound > 0 and not host_short else ""
        # a cache holds shards of sharded tables: one held to DP (a replica) stays in device memory
        held_to_dp = allowed_types is not None and not allowed_types(i) - {ShardingType.DATA_PARALLEL}
        if held_to_dp and not kernel.data_parallel_only:
            cache_fix = ""
        if short_dev > 0 and cache_fix:
            fix += f", {cache_fix}"
        row_split = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)
        head = "is larger than the whole cluster allows"
        if kernel.data_parallel_only:  # every rank holds every table: ranks do not help
            fix = f"{cache_fix} (more ranks do not help: kernel {kernel.name} puts every table on each)"
            noted.clear()
            if device_need and (settings := note([device_need])):
                fix += f", give each rank more memory{settings}"
        elif W > 1 and allowed_types is not None and not allowed_types(i) & set(row_split):
            # the types allowed for it keep its shards' size whatever the ranks
            noted.clear()
            settings = note([memory_settings])
            allowed = ", ".join(dict.fromkeys(o.sharding_type.short for o in opts))
            head = f"does not fit with the sharding types allowed for it ({allowed})"
            fix = (f"allow it a row-wise sharding type (RW, TWRW or GRID), whose shards shrink as ranks are added "
                   f"(more ranks do not help with {allowed} only){', ' + cache_fix if short_dev > 0 and cache_fix else ''}"
                   + (f", or more memory{settings}" if settings else ""))
        raise PlanningError(
            f"{size} {head}: its smallest shard needs {needs} per "
            f"rank, {' and '.join(shorts)}{more}; "
            f"{reserve_fix(short_dev, cap_dev, 'a rank holds the shard') if short_dev > 0 else ''}"
            f"{fix}, or shrink the table{cpu_cache}."
        )
    if total_dev > D and kernel.data_parallel_only:  # each rank holds every table
        per_rank = total_dev / W
        biggest = np.argsort(-need_dev, kind="stable")[:5]
        names = ", ".join(f"{t.names[i]} ({human_bytes(need_dev[i] / W)})" for i in biggest)
        raise PlanningError(
            f"Kernel {kernel.name} replicates every table on every rank: each rank needs "
            f"{human_bytes(per_rank)} of {mem} for them, but has {human_bytes(cap_dev)} usable: "
            f"{per_rank - cap_dev:,.0f} bytes ({human_bytes(per_rank - cap_dev)}) short; largest: {names}; "
            f"{cache_fix}, "
            + (f"give each rank more memory ({more}), " if (more := topology.setting_for(
                "device_memory", per_rank / (1 - params.reserve_fraction))) else "")
            + "or shrink the tables (more ranks do not help)."
        )
    if total_dev > D:
        if cache_fix == to_host and total_dev > D + H:
            cache_fix = ""
        floor = ""
        least_host = host_needed(D, any_cache=True) if cache_fix == LOWER_CACHE else 0.0
        if cache_fix == LOWER_CACHE and least_host > H:
            # the cached tables' rows overfill host memory whatever the load factor: lowering it
            # would only move the refusal there
            cache_fix = ""
            floor = (f"; a lower cache load_factor does not help: host memory ({human_bytes(H)}{host_usable}) "
                     f"cannot hold the rows the devices would leave to it, at least "
                     f"{human_bytes(least_host)}")
        if cache_fix == LOWER_CACHE:
            bound = search.cache_bound() or 0.0
            if bound > 0:
                cache_fix = _lower_cache(float(search.model.cache_load_factor), bound)
            else:  # what stays in device memory whatever the load factor
                whole = search.least_cache_bytes()[0].min(axis=0)  # type: ignore[index]
                least = float(whole[np.isfinite(whole)].sum())
                cache_fix = ""
                state = ("4-byte row map" + (", LFU counter" if search.model.cache_algorithm == "lfu" else "")
                         + (" and row-wise optimizer state" if search.model.rowwise_state() else ""))
                in_batch = (f", {human_bytes(batch_bytes)} of it one batch's ids and pooled rows"
                            if batch_bytes >= 0.25 * least else "")
                floor = (f"; a lower cache load_factor does not help: even at the least, the tables need "
                         f"{human_bytes(least)} of {mem}{in_batch} (a cached table keeps its {state} in device "
                         "memory for every row)")
        grow = "add ranks or " + mem_short
        # where the batch's buffers are a large part, the batch per rank is the lever, not the tables
        big_batch = batch_bytes >= 0.25 * total_dev
        if fixed_rank >= cap_dev:  # what each rank holds alone overfills it, however many ranks
            held = [f"the replicated tables need {human_bytes(copy_bytes)}" if copy_bytes else "",
                    f"one batch's ids and pooled rows need {human_bytes(batch_rank)}" if batch_rank else ""]
            grow = (f"more ranks do not help: {' and '.join(filter(None, held))} on every rank, whatever the ranks; "
                    + ("lower the batch per rank or " if big_batch else "") + f"give each rank more {mem_short}")
            if batch_rank >= cap_dev:  # a cache holds table rows, not the batch's buffers
                cache_fix = ""
        short = total_dev - D
        where = " even with every cacheable table in host memory" if np.any(need_host > 0) else ""
        per_batch = ""
        tables_dev = need_dev
        if big_batch:
            per_batch = (
                f"; {human_bytes(batch_bytes)} of it is one batch's ids and pooled rows at "
                f"{search.model.context.batch_size_per_rank:,} samples per rank: a smaller batch per rank needs less "
                f"({batch_keys(search.model.context)})"
            )
            tables_dev = need_dev - batch  # name the tables by their own bytes, not their batch's
        biggest = np.argsort(-tables_dev, kind="stable")[:5]
        names = ", ".join(f"{t.names[i]} ({human_bytes(tables_dev[i])})" for i in biggest)
        names = f"largest{' tables, without their batch buffers' if big_batch else ''}: {names}"
        raise PlanningError(
            f"{mem_short.capitalize()} is short: the tables need {human_bytes(total_dev)} of {mem}"
            f"{where}, but {counted(W, 'rank')} offer{'s' if W == 1 else ''} {human_bytes(D)} usable: {short:,.0f} bytes "
            f"({human_bytes(short)}) short{per_batch}{floor}; {names}; {reserve_fix(short, D, 'the ranks hold the tables')}"
            f"{add_memory or grow}"
            + note([
                more_nodes(),
                # more device memory alone, where the host memory then holds the rest
                ("device_memory", total_dev / W / (1 - params.reserve_fraction)) if host_needed(total_dev) <= H else None,
            ])
            + ", "
            + (f"{cache_fix}, " if cache_fix else "")
            + f"or shrink the tables{cpu_cache}."
        )
    host_need = host_needed(D)
    if host_need > H:
        short = host_need - H
        biggest = np.argsort(-need_host, kind="stable")[:5]  # host bytes when held behind a cache
        names = ", ".join(f"{t.names[i]} ({human_bytes(need_host[i])})" for i in biggest if need_host[i] > 0)
        raise PlanningError(
            f"Host memory is short: with device memory filled ({human_bytes(D)} usable on {counted(W, 'rank')}"
            f"), the tables still need at least {human_bytes(host_need)} of host memory, but "
            f"{counted(search.N, 'node')} offer{'s' if search.N == 1 else ''} {human_bytes(H)}{host_usable}: {short:,.0f} bytes "
            f"({human_bytes(short)}) short; "
            f"largest in host memory: {names}; add ranks or host memory"
            + note([more_nodes(), ("host_memory", host_need / W / (1 - params.host_reserve_fraction))])
            + ", or shrink the tables."
        )


def _lower_cache(now: float, most: float) -> str:
    """The advice to lower the cache's load factor, with the most it could be (a bound from
    memory: placing the tables may need it lower)."""
    step = 10.0 ** (math.floor(math.log10(most)) - 1) if most > 0 else 1.0
    most = math.floor(most / step * (1 + 1e-9)) * step  # two significant digits, rounded down
    return (f"{LOWER_CACHE} (now {now:g}; about {most:.2g} or less, the most memory allows, placing the "
            "tables may need less)")


def _settings_note(topology: Any, groups: Sequence[Sequence[Setting]],
                   checked: Sequence[bool | str] | None = None) -> str:
    """' (topology.num_nodes=19 or more, now 16; or ...)' for the settings a topology names,
    each group one setting or several needed together ("both ... and"). ``checked``: which
    groups the tables were planned with (``NeoPlanner.check_settings_s``; "limit": refused
    even at the most a setting can be); None: none were tried, and each is the least that
    memory bounds allow (placing the tables may need more)."""
    status = list(checked) if checked is not None else [False] * len(groups)
    texts = []
    for group, state in zip(groups, status):
        if state == "limit":
            most = ", ".join(f"{topology.config_keys[w][0]}={topology.config_limits[w]:g}"
                             for w, _ in group if w in topology.config_limits)
            texts.append(f"not even {most}, the most it can be, holds them")
            continue
        named = [topology.setting_for(what, need) for what, need in group]
        text = named[0] if len(named) == 1 else "both " + ", and ".join(named)
        if isinstance(state, str) and state.startswith("tried: "):
            texts.append(f"{text}, the least memory allows, but the tables do not plan even with "
                         f"{state.removeprefix('tried: ')}: checked by planning")
            continue
        if state is False and any(s is not False for s in status):  # beside checked ones: marked itself
            text += " (the least it could be, packing may need more)"
        texts.append(text)
    if not texts:
        return ""
    one = len(groups) == 1 and len(groups[0]) == 1
    if True not in status:
        tail = (f"; the least {'this' if one else 'these'} could be, packing may need more"
                if all(state is False for state in status) else "")
    elif all(state is True for state in status):
        tail = f"; checked: the tables plan with {'it' if one else 'each'}"
    else:
        tail = "; the others checked: the tables plan with each"
    return f" ({'; or '.join(texts)}{tail})"


def _ms(seconds: float) -> str:
    """A time in ms: three decimals, or three significant digits below 0.1 ms, so that a line's
    shards x time per shard multiplies out to its total (a DP shard's 128th share read 0.000 ms,
    then 0.002 ms against a total of 0.222 ms)."""
    ms = seconds * 1e3
    if ms <= 0 or ms >= 0.1 or not math.isfinite(ms):
        return f"{ms:.3f} ms"
    return f"{ms:.{2 - math.floor(math.log10(ms))}f} ms"


def _why(opt: Option, search: Search, i: int, fused: bool = True, left_out: Collection[str] = ()) -> str:
    """One line that says why this option won, from the figures the search used."""
    t, model = search.t, search.model
    rows, dim = int(t.rows[i]), int(t.dims[i])
    whole = rows * dim * model.e
    st = opt.sharding_type
    def cost(o: int) -> str:  # shards x time per shard (what a rank carries) = total
        other = search.opts[o]
        return (
            f"{other.num_shards} x {_ms(float(other.shard_time[i]))} "
            f"= {_ms(float(search.total[o, i]))}"
        )

    alt = np.where(search.usable[:, i], search.total[:, i], np.inf)
    alt[search.choice[i]] = np.inf
    j = int(np.argmin(alt))
    cmp = ""
    if np.isfinite(alt[j]):  # the slowest rank decides, not the total: show both
        if alt[j] >= search.total[search.choice[i], i]:
            cmp = f"; the least total (next: {search.opts[j].label} {cost(j)})"
        else:
            other = search.opts[j]
            label = other.label + (" on device" if opt.placement == CACHED and other.placement != CACHED else "")
            why_not = []
            slowest = int(np.argmax(search.loads))
            if other.unit == ALL and search.W > 1:  # a shard on every rank: the slowest one's load grows
                why_not.append(f"a shard of {_ms(float(other.shard_time[i]))} on every rank, the slowest "
                               f"({slowest}) too")
            if other.sharding_type.value in left_out:  # the fewer-types pass, not this table's figures
                why_not.append(f"{other.sharding_type.short} left out of the plan to save its collectives' latency")
            if other.shard_time[i] > opt.shard_time[i]:
                why_not.append("larger shards")
            if other.cost.mem_device[i] > opt.cost.mem_device[i] * 1.01:  # what memory-tight plans give up
                why_not.append("more device memory per shard")
            if not why_not:  # nothing in the table's own figures: the balance of the plan
                if slowest in np.asarray(search.ranks[i]):
                    why_not.append(f"it is on the slowest rank ({slowest}), where " + (
                        "refinement left it" if search.refined else "the greedy put it (sharding.refine=false)"))
                else:
                    why_not.append(f"its ranks are under the slowest ({slowest}): its larger total does not "
                                   "lengthen the step")
            cmp = f"; least total would be {label} {cost(j)}" + "".join(f", {w}" for w in why_not)
    size = human_bytes(whole)
    reason = {
        ShardingType.DATA_PARALLEL: "replicated: no all-to-all, its gradients all-reduced",
        ShardingType.TABLE_WISE: "whole table on one rank",
        ShardingType.COLUMN_WISE: "column shards spread the lookups over ranks",
        ShardingType.TABLE_COLUMN_WISE: "columns spread inside one node",
        ShardingType.ROW_WISE: "rows spread over all ranks",
        ShardingType.TABLE_ROW_WISE: "rows spread inside one node, whose ranks share its traffic across nodes",
        ShardingType.GRID_SHARD: "column shards, each row-split over one node",
    }[st]
    if opt.placement == CACHED:
        reason += ", host memory behind device cache"
        if model.cache_load_factor is not None and not search.torchrec_times:  # the rate the times assume
            hit = float(cache_hit_rate(model.cache_load_factor, t.hot[i : i + 1])[0])
            reason += f" (predicted hit rate {hit:.0%}, for LRU and LFU alike)"
    others = [o for o in search.opts if o.sharding_type is not st]  # none: only DP was allowed
    if st is ShardingType.DATA_PARALLEL and not others:  # no choice was made
        reason = "replicated: the only sharding type allowed" + ("" if fused else " with this kernel")
    elif st is ShardingType.DATA_PARALLEL and dim % 4 and fused and not any(o.valid[i] for o in others):
        reason = f"replicated: dim {dim} is not a multiple of 4, which the fused kernel needs to shard it"
    return f"{size}, {reason}; {cost(int(search.choice[i]))}{cmp}"


def build_result(
    planner: str, search: Search, tables: Sequence[TableSpec], context: PlanningContext,
    left_out: Collection[str] = (), held: Mapping[str, Collection[ShardingType]] | None = None,
) -> PlanResult:
    """Table assignments and per-rank report from the search state. ``left_out``: sharding
    types the fewer-types pass dropped to save their collectives' latency; ``held``: the types
    ``sharding.table_sharding_types`` held tables to, which their why-lines say."""
    model = search.model
    W, L = search.W, search.L
    kinds = len(TIME_KINDS)
    time_by_kind = np.zeros((W, kinds))
    mem = {k: np.zeros(W) for k in ("weights", "optimizer", "gradients", "cache", "batch")}
    host = {k: np.zeros(W) for k in ("weights", "optimizer")}
    sent = np.zeros((W, 2))  # bytes sent per step: intra-node, inter-node
    option_bytes: dict[int, np.ndarray] = {}
    # where the times are the cost model's: the hit rate they assume, the bytes over the host link
    own_rates = model.cache_load_factor is not None and not search.torchrec_times
    linked = np.zeros(W)  # bytes over each rank's host link per step (cached shards)
    link_bytes: dict[int, np.ndarray] = {}
    assignments: list[TableAssignment] = []
    types_used: set[str] = set()
    for i, spec in enumerate(tables):
        o = int(search.choice[i])
        opt = search.opts[o]
        ranks = search.ranks[i]
        c = opt.cost
        np.add.at(time_by_kind, ranks, c.time[i])
        if o not in option_bytes:
            option_bytes[o] = np.stack(model.comm_bytes(search.t, opt.sharding_type, opt.k), axis=1)
        if W > 1:
            np.add.at(sent, ranks, option_bytes[o][i])
        if opt.placement == CACHED:  # optimizer state: row-wise on the device, else on the host
            if o not in link_bytes:
                link_bytes[o] = model.host_link_bytes(search.t, opt.sharding_type, opt.k)
            np.add.at(linked, ranks, link_bytes[o][i])
            np.add.at(mem["cache"], ranks, c.cache[i])
            # what is left of the sums: 0 where the state is elsewhere, not a rounding's -1e-10
            np.add.at(mem["optimizer"], ranks, max(float(c.mem_device[i] - c.cache[i] - c.batch[i]), 0.0))
            np.add.at(host["weights"], ranks, c.weights[i])
            np.add.at(host["optimizer"], ranks, max(float(c.mem_host[i] - c.weights[i]), 0.0))
        else:
            np.add.at(mem["weights"], ranks, c.weights[i])
            np.add.at(mem["optimizer"], ranks, c.optimizer[i])
            np.add.at(mem["gradients"], ranks, c.gradients[i])
        np.add.at(mem["batch"], ranks, c.batch[i])
        st = opt.sharding_type
        types_used.add(st.value)
        rows, dim = spec.num_embeddings, spec.embedding_dim
        width = dim // opt.k
        if st in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL):
            shapes = [(rows, dim)]
        elif st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            shapes = [(rows, width)] * opt.k
        elif st is ShardingType.ROW_WISE:
            shapes = [(r, dim) for r in rw_sizes(rows, W)]
        elif st is ShardingType.TABLE_ROW_WISE:
            shapes = [(r, dim) for r in rw_sizes(rows, L)]
        else:  # GRID: column shard major, each row-split over one node
            shapes = [(r, width) for _ in range(opt.k) for r in rw_sizes(rows, L)]
        if opt.placement == CACHED:
            kernel = "fused_uvm_caching"
        elif st is ShardingType.DATA_PARALLEL:
            kernel = "dense"
        else:
            kernel = context.kernel.compute_kernel
        assignments.append(
            TableAssignment(
                name=spec.name,
                sharding_type=st.value,
                compute_kernel=kernel,
                ranks=[int(r) for r in ranks],
                shard_shapes=shapes,
                predicted_hit_rate=(float(cache_hit_rate(model.cache_load_factor, search.t.hot[i : i + 1])[0])
                                    if own_rates and opt.placement == CACHED else None),
                why=_why(opt, search, i, fused=context.kernel.compute_kernel == "fused", left_out=left_out)
                + (f"; held to {', '.join(sorted(st.short for st in held[spec.name]))} by "
                   "sharding.table_sharding_types" if held and held.get(spec.name) else ""),
            )
        )
    latency = model.latency_time(types_used)
    reports = []
    for r in range(W):
        timed = {k: float(time_by_kind[r, j]) for j, k in enumerate(TIME_KINDS)}
        if latency:
            timed["comm_latency"] = latency
        memory = {k: float(v[r]) for k, v in mem.items() if v.any()}
        memory["reserve"] = model.reserve
        rep = RankReport(rank=r, memory=memory, memory_capacity=model.capacity_device, time=timed)
        rep.comm_bytes = {"intra_node": float(sent[r, 0]), "inter_node": float(sent[r, 1])}
        rep.host_memory_capacity = model.capacity_host  # what cached tables could use, used or not
        if own_rates and link_bytes:  # some table cached: its misses' traffic, beside the collectives'
            rep.host_link_bytes = float(linked[r])
        if host["weights"].any():
            rep.host_memory = {k: float(v[r]) for k, v in host.items()}
            if model.host_reserve:
                rep.host_memory["reserve"] = model.host_reserve
        reports.append(rep)
    topo = context.topology.to_dict()
    result = PlanResult(
        planner=planner,
        tables=assignments,
        ranks=reports,
        batch_size_per_rank=context.batch_size_per_rank,
        topology=topo,
    )
    result.notes.append(
        settings_note(context)
        + f"; reserve {model.params.reserve_fraction:.0%} of "
        + ("device memory" if context.topology.compute_device == "cuda" else "each rank's memory")
        + (
            f", {model.params.host_reserve_fraction:.0%} of host memory"
            if model.params.host_reserve_fraction
            else ""
        )
    )
    result.notes.append(result.types_note())
    return result
