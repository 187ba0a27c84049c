"""Search: sharding type, column-shard count, placement and ranks for every table.

1. Candidate generation: every valid option of every table is costed at once (numpy).
2. Greedy, largest table first: each table takes the option and ranks that minimise
   ``max(slowest rank, (total load + lower bound of the tables still to place) / world)``,
   under every rank's memory capacity.
3. Refinement: tables on the slowest rank are re-placed (any option) or swapped with a
   table-wise table elsewhere while that strictly lowers the slowest rank.
4. Restarts (``solve``), then fewer sharding types where their collectives' fixed latency
   outweighs the balance they buy (``fewer_types``); ``step_bound`` bounds the result.
Everything is deterministic: ties go to the lowest option index and the lowest rank.
"""

from __future__ import annotations

import copy
import hashlib
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from neo_core.errors import PlanningError
from neo_core.sharding import ShardingType
from neo_plugins.sharding.planner.cost import CACHED, DEVICE, CostModel, ShardCosts, TableArrays

GiB = 1024**3


# A topology setting a message names: ("num_nodes", ranks in all) or ("device_memory" |
# "host_memory", bytes per rank), as Topology.setting_for takes it
Setting = tuple[str, float]


@dataclass
class NamedSettings:
    """The topology settings a :class:`PlanningError`'s message could name (its
    ``named_settings``): ``groups`` are alternatives, each settings needed together. The
    planner checks them by planning (``NeoPlanner.check_settings_s``) and puts ``keep`` plus
    the note of what it found in place of ``anchor`` in the message."""

    anchor: str
    keep: str
    groups: list[list[Setting]]


def setting_groups(
    topology: Any, alternatives: Sequence[Setting | Sequence[Setting | None] | None]
) -> tuple[list[list[Setting]], list[Setting]]:
    """The alternatives (each one setting, or several needed together) that the topology
    names config keys for, and the settings left out because their key cannot go that high
    (``Topology.config_limits``)."""
    groups, beyond = [], []
    for alt in alternatives:
        items = [alt] if isinstance(alt, tuple) or alt is None else alt
        keyed = [s for s in items if s is not None and s[0] in topology.config_keys]
        over = [s for s in keyed if topology.beyond_limit(*s)]
        beyond += over
        if keyed and not over:
            groups.append(keyed)
    return groups, beyond


def planning_error(message: str, named: NamedSettings | None) -> PlanningError:
    """A :class:`PlanningError` carrying the settings its message could name."""
    exc = PlanningError(message)
    exc.named_settings = named  # type: ignore[attr-defined]
    return exc


def batch_keys(context: Any) -> str:
    """Where the batch per rank is set, for a message that asks for a smaller one."""
    if context.global_batch:  # recipes/plan.py divides a table set's global batch by the ranks
        return (f"plan_model.global_batch in recipes/plan.py, now {context.global_batch:,} over "
                f"{context.topology.world_size} ranks, or batch_size_per_rank; trainer.batch_size in training")
    return "trainer.batch_size in training, batch_size_per_rank in recipes/plan.py"


def human_bytes(n: float) -> str:
    """A byte count at a readable scale: GiB down to a tenth of one, then MiB, then KiB."""
    if n >= GiB / 10:
        return f"{n / GiB:.2f} GiB"
    if n >= 2**20 / 10:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"

# How an option's shards are laid onto ranks.
SINGLE, ANY_K, NODE_K, NODE_ALL, NODES_K, ALL = "single", "any_k", "node_k", "node_all", "nodes_k", "all"
# a best_option call's table, bound of the rest and near-tie band, in its memo key
_KEY = struct.Struct("<qdd")


@dataclass
class Option:
    """One way to shard a table (costed for all tables; ``valid`` says for which)."""

    sharding_type: ShardingType
    k: int  # column shards (1 unless CW/TWCW/GRID)
    placement: str  # DEVICE or CACHED
    unit: str  # SINGLE ... ALL
    num_shards: int
    cost: ShardCosts
    valid: np.ndarray  # (T,) bool
    shard_time: np.ndarray = field(init=False)  # (T,) seconds per shard

    def __post_init__(self) -> None:
        self.shard_time = self.cost.time.sum(axis=1)

    @property
    def label(self) -> str:
        s = self.sharding_type.short
        if self.sharding_type in (
            ShardingType.COLUMN_WISE,
            ShardingType.TABLE_COLUMN_WISE,
            ShardingType.GRID_SHARD,
        ):
            s += f"x{self.k}"
        return s + (" cached" if self.placement == CACHED else "")

    def per_node(self, L: int, N: int, most: bool = False) -> int:
        """How many of this option's shards one node holds (host memory is a node's, shared by
        its ranks): one for a lone shard, ``k`` for k shards inside one node, ``L`` where the
        option fills whole nodes; shards placed rank by rank (CW) put at least ``ceil(k / N)``
        on some node and (``most``) at most ``min(k, L)`` on one."""
        if self.unit == ANY_K:
            return min(self.k, L) if most else -(-self.k // N)
        if self.unit == SINGLE:
            return 1
        return min(self.k, L) if self.unit == NODE_K else L

    def nodes_needed(self, N: int) -> int:
        """How many nodes must each take ``per_node`` of its shards."""
        return {ANY_K: min(self.k, N), NODES_K: self.k, ALL: N}.get(self.unit, 1)

    def ranks_taken(self, L: int, N: int) -> int:
        """How many distinct ranks ``Search.place`` puts its shards on (as many as there are,
        where ``k`` asks for more)."""
        return {SINGLE: 1, ANY_K: min(self.k, L * N), NODE_K: min(self.k, L), NODE_ALL: L,
                NODES_K: min(self.k, N) * L}.get(self.unit, L * N)


def splits_into(dims: Any, k: int, min_col_width: int) -> Any:
    """Whether ``dims`` (an int or an array) split into ``k`` column shards the fused kernel
    takes: whole shards of a multiple of 4 columns, at least ``min_col_width``."""
    width = dims // k
    return (dims % k == 0) & (width % 4 == 0) & (width >= min_col_width)


def _no_option_reasons(
    allowed: set[ShardingType], rows: int, dim: int, W: int, L: int, N: int,
    col_shard_counts: tuple[int, ...], min_col_width: int,
) -> dict[ShardingType, tuple[str, str, list[int]]]:
    """Per allowed type that gives a table of ``rows`` x ``dim`` no option on ``N`` nodes of
    ``L`` ranks (``W`` in all), as :func:`build_options` decides: why, what kind of fix it
    needs ("topology", "counts": fewer column shards, "width": narrower ones) and, for "width",
    the shard widths the dim splits into under sharding.min_col_width."""

    def columns(limit: int, where: str) -> tuple[str, str, list[int]] | None:
        """Why no column split of at most ``limit`` shards applies (None: one does), with
        build_options' rule: a shard count of the sharding.col_shard_counts up to ``limit``
        whose shards are whole multiples of 4 columns, at least sharding.min_col_width."""
        counts = [k for k in col_shard_counts if k <= limit]
        if not counts:
            return (f"its fewest column shards ({min(col_shard_counts)}, sharding.col_shard_counts) need as "
                    f"many {where}; here {limit}", "counts", [])
        if any(splits_into(dim, k, min_col_width) for k in counts):
            return None
        return (f"dim {dim} splits into no column shards of {min_col_width} or more columns in multiples of 4 "
                f"({', '.join(map(str, counts))} shards; sharding.min_col_width)", "width",
                [dim // k for k in counts if dim % k == 0 and (dim // k) % 4 == 0])

    def topology(why: str) -> tuple[str, str, list[int]]:
        return why, "topology", []

    nodes = topology(f"needs 2 or more nodes of 2 or more ranks (here {N} x {L})")
    reasons = {
        ShardingType.COLUMN_WISE: columns(W, "ranks"),
        ShardingType.TABLE_COLUMN_WISE: nodes if N < 2 else columns(L, "ranks in a node"),
        ShardingType.GRID_SHARD: nodes if N < 2 or L < 2 else (
            topology(f"{rows:,} rows, fewer than the {L} ranks of a node") if rows < L else columns(N, "nodes")),
        ShardingType.ROW_WISE: topology("needs 2 or more ranks") if W < 2 else (
            topology(f"{rows:,} rows, fewer than the {W} ranks") if rows < W else None),
        ShardingType.TABLE_ROW_WISE: nodes if N < 2 or L < 2 else (
            topology(f"{rows:,} rows, fewer than the {L} ranks of a node") if rows < L else None),
    }
    return {st: why for st, why in reasons.items() if st in allowed and why is not None}


def why_no_option(
    allowed: set[ShardingType], rows: int, dim: int, W: int, L: int, N: int,
    col_shard_counts: tuple[int, ...] = (2, 4, 8), min_col_width: int = 16,
) -> str:
    """Why none of the ``allowed`` types applies to a table of ``rows`` x ``dim`` on ``N``
    nodes of ``L`` ranks (``W`` in all): one reason per type, as :func:`build_options` decides."""
    reasons = _no_option_reasons(allowed, rows, dim, W, L, N, col_shard_counts, min_col_width)
    return "; ".join(f"{st.short}: {reasons[st][0]}" for st in sorted(reasons, key=lambda st: st.short))


def no_option_fixes(
    allowed: set[ShardingType], rows: int, dim: int, W: int, L: int, N: int,
    col_shard_counts: tuple[int, ...] = (2, 4, 8), min_col_width: int = 16,
) -> str:
    """What would give a table of ``rows`` x ``dim`` an option, by :func:`why_no_option`'s
    reasons: another type always; a narrower ``sharding.min_col_width`` where the dim splits
    into column shards under it; smaller ``sharding.col_shard_counts`` where the fewest shards
    outnumber the ranks or nodes; other node shapes where a type needs more nodes or ranks."""
    reasons = _no_option_reasons(allowed, rows, dim, W, L, N, col_shard_counts, min_col_width).values()
    kinds = {kind for _, kind, _ in reasons}
    widths = [w for _, _, found in reasons for w in found]
    fixes = ["allow another type, e.g. TW or DP"]
    if widths:  # shards narrower than allowed
        fixes.append(f"sharding.min_col_width={max(widths)} (shards of {max(widths)} columns)")
    if "counts" in kinds:
        fixes.append(f"sharding.col_shard_counts with fewer shards (now {list(col_shard_counts)})")
    if kinds & {"topology", "counts"}:
        fixes.append(
            "change the topology's num_nodes / devices_per_node (when training on an emulated topology, its "
            "trainer.world_size ranks are spread over at most topology.num_nodes nodes: e.g. "
            "topology.num_nodes=2 with trainer.world_size=4 gives 2 nodes of 2 ranks)")
    text = ", or ".join(fixes)
    return text[0].upper() + text[1:]


def build_options(
    model: CostModel,
    t: TableArrays,
    allowed: set[ShardingType],
    col_shard_counts: tuple[int, ...] = (2, 4, 8),
    min_col_width: int = 16,
) -> list[Option]:
    """All options for all tables, with validity masks (memory is checked later)."""
    W, L, N = model.W, model.L, model.N
    n = len(t)
    ones = np.ones(n, dtype=bool)
    placements = [DEVICE] + ([CACHED] if model.cache_load_factor is not None else [])
    opts: list[Option] = []

    def col_ok(k: int) -> np.ndarray:
        return splits_into(t.dims, k, min_col_width)

    def add(st: ShardingType, k: int, place: str, unit: str, nsh: int, valid: np.ndarray) -> None:
        if st in allowed and valid.any():
            opts.append(Option(st, k, place, unit, nsh, model.costs(t, st, k, place), valid))

    add(ShardingType.DATA_PARALLEL, 1, DEVICE, ALL, W, ones)
    for place in placements:
        add(ShardingType.TABLE_WISE, 1, place, SINGLE, 1, ones)
        for k in col_shard_counts:
            if k <= W:
                add(ShardingType.COLUMN_WISE, k, place, ANY_K, k, col_ok(k))
            if N > 1 and k <= L:
                add(ShardingType.TABLE_COLUMN_WISE, k, place, NODE_K, k, col_ok(k))
            if N > 1 and L > 1 and k <= N:
                # each column block is row-split over one node: a row per rank at least
                add(ShardingType.GRID_SHARD, k, place, NODES_K, k * L, col_ok(k) & (t.rows >= L))
        if W > 1:
            add(ShardingType.ROW_WISE, 1, place, ALL, W, t.rows >= W)
        if N > 1 and L > 1:
            add(ShardingType.TABLE_ROW_WISE, 1, place, NODE_ALL, L, t.rows >= L)
    if not opts:
        names = ", ".join(sorted(st.short for st in allowed)) or "none"
        which = f"table {t.names[0]!r}" if n == 1 else f"any of the {n} tables, e.g. {t.names[0]!r}"
        shape = (allowed, int(t.rows[0]), int(t.dims[0]), W, L, N, col_shard_counts, min_col_width)
        raise PlanningError(
            f"No allowed sharding type ({names}) applies to {which} ({int(t.rows[0]):,} rows x "
            f"{int(t.dims[0])}) on {N} node(s) x {L} rank(s): {why_no_option(*shape)}. {no_option_fixes(*shape)}."
        )
    return opts


def capped(base: np.ndarray, shard: np.ndarray, bound: float, cap: float | None) -> np.ndarray:
    """Options whose shard time is at most ``cap x bound`` (all of a table's, where none is)."""
    if cap is None:
        return base
    allowed = base & (shard <= bound * cap)
    return np.where(allowed.any(axis=0), allowed, base)


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: what is kept from it (``Search._options_of``) is kept until it
    is assigned anew, so it must not change in place."""
    view = a.view()
    view.flags.writeable = False
    return view


class _Repeat(Exception):
    """A greedy run reached a step an earlier run of the same solve took (``_greedy``)."""


def _min_max_over_shard_times(shard: np.ndarray, f: Callable[[float], float]) -> float:
    """``min over tau of max(tau, f(tau))`` for a non-increasing step function ``f`` that only
    changes at the (finite) shard times ``shard``, ``tau`` at least the largest of the tables'
    smallest shard times (every table's shard sits on some rank): a binary search for the
    first shard time at or above ``f``, and the value just before it."""
    floor = float(shard.min(axis=0).max())
    taus = np.unique(shard[np.isfinite(shard)])
    taus = taus[taus >= floor]
    lo, hi = 0, len(taus) - 1  # f(taus[hi]) is finite: every option allowed
    if f(float(taus[hi])) > float(taus[hi]):
        return f(float(taus[hi]))
    while lo < hi:  # smallest k with taus[k] >= f(taus[k])
        mid = (lo + hi) // 2
        if float(taus[mid]) >= f(float(taus[mid])):
            hi = mid
        else:
            lo = mid + 1
    best = float(taus[lo])
    if lo > 0:  # between two breakpoints: max(tau, f(previous)) is least at f(previous)
        best = min(best, max(float(taus[lo - 1]), f(float(taus[lo - 1]))))
    return best


class Search:
    """Greedy placement plus refinement over the options of every table."""

    def __init__(self, model: CostModel, t: TableArrays, options: list[Option]) -> None:
        self.model, self.t, self.opts = model, t, options
        self.torchrec_times = False  # the options' times are TorchRec's estimator's, not the cost model's
        self.W, self.L, self.N = model.W, model.L, model.N
        self.cap_dev = model.capacity_device - model.reserve
        self.cap_host = model.capacity_host - model.host_reserve  # a rank's share of its node's
        # host memory is one node's, shared by its ranks (FBGEMM's UVM tables live in the node's
        # DRAM): cached shards fit while their node's sum fits, whichever rank holds them
        self.host_group = self.L  # ranks that share one host memory: a node's (1: each its share)
        self.cap_node = self.cap_host * self.L
        self._host_nodes: np.ndarray | None = None  # host bytes per node (_node_host)
        n = len(t)
        self.loads = np.zeros(self.W)
        self.mem_dev = np.zeros(self.W)
        self.mem_host = np.zeros(self.W)
        self.choice = np.full(n, -1, dtype=np.int64)
        self.ranks: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
        # which tables have a shard on which rank, and each placed table's shard time, built
        # when refinement first asks (``tables_on``): most greedy runs of the restarts end
        # without refinement
        self._on: tuple[np.ndarray, np.ndarray] | None = None
        # each table-wise (one-shard) table's rank, shard time and memory, -1 for others, built
        # when a swap first asks (``_singles``)
        self._single: tuple[np.ndarray, ...] | None = None
        self._least_cache: tuple[np.ndarray, np.ndarray] | None = None  # ``least_cache_bytes``, once
        ot = np.stack([o.shard_time for o in options])  # (O, T)
        valid = np.stack([o.valid for o in options])
        self.total = np.where(valid, ot * np.array([o.num_shards for o in options])[:, None], np.inf)
        shard_dev = np.stack([o.cost.mem_device for o in options])
        shard_host = np.stack([o.cost.mem_host for o in options])
        self.shard_dev, self.shard_host = shard_dev, shard_host  # (O, T) bytes per shard
        # whether any option holds host memory: where none does, a node's host bytes stay 0
        self._host_used = bool((shard_host > 0).any())
        per_node = np.array([o.per_node(self.L, self.N) for o in options], dtype=float)[:, None]
        # shards a node may take of each option: the most (where any ranks may be chosen) and
        # what a rank's own check counts (1 for shards placed rank by rank, ``_spread``)
        self.most_per_node = np.array([o.per_node(self.L, self.N, most=True) for o in options])
        self.rank_per_node = np.array([1 if o.unit == ANY_K else o.per_node(self.L, self.N) for o in options])
        self._node_counts = (self.most_per_node, self.rank_per_node)
        fits = (shard_dev <= self.cap_dev) & (shard_host * per_node <= self.cap_node)
        self.usable = valid & fits  # (O, T)
        self.moves = 0
        self._pre: list | None = None  # _sorted_loads of the current loads
        self._mem_max: tuple[float, float] | None = None  # _fullest of the current memory
        self._ties: np.ndarray | None = None  # _load_ties of the current loads
        self._all_rank_ids = np.arange(self.W)
        # where each option's peak before its shard is read in ``_peak_bases``: the slowest
        # rank (ALL), the k-th least loaded rank (SINGLE, ANY_K), the least k-th load of any
        # node (NODE_K), the k-th least loaded node's slowest rank (NODE_ALL, NODES_K)
        first = {ALL: 0, SINGLE: 1, ANY_K: 1, NODE_K: 1 + self.W, NODE_ALL: 1 + self.W + self.L, NODES_K: 1 + self.W + self.L}
        self._peak_at = np.array([first[o.unit] + o.k - 1 if o.unit != ALL else 0 for o in options], dtype=np.int64)
        self._unit = np.array([o.unit for o in options])  # each option's unit and shard count
        self._k = np.array([o.k for o in options], dtype=np.int64)
        self._by_node = np.isin(self._unit, (NODE_K, NODE_ALL, NODES_K))
        # how many distinct ranks each option's shards take, as ``_place_on`` picks them: the
        # least peak ``place`` can reach is that many ranks' least load (``_masked_floor``)
        self._ranks_taken = np.array([o.ranks_taken(self.L, self.N) for o in options], dtype=np.int64)
        self._options_seen: dict[tuple, tuple] = {}  # ``_options_of`` by table, host rule and content
        self._node_ranks = np.arange(self.W).reshape(self.N, self.L)  # ranks of each node
        # digests of the greedy steps taken by this solve's greedy runs (_greedy): a restart
        # that reaches one of them would repeat an earlier plan, and stops there. None outside
        # ``solve``: a greedy called on its own always runs to the end
        self.greedy_steps: set[bytes] | None = None
        # greedy decisions of this solve (best_option): by state, table, rest bound and band,
        # then the table's options and totals (as bytes)
        self.decided: dict[bytes, list[tuple[bytes, tuple[int, np.ndarray] | None]]] = {}
        self.decided_hits = 0
        self.repeats_cut = 0
        self._all_ranks = np.ones(self.W, dtype=bool)
        # wall-clock safety stops that fired (refinement deadlines, restarts not started):
        # only then can the plan depend on the machine's speed
        self.clock_stops = 0
        self.node_index = np.arange(self.N)
        self.shard_times = ot  # (O, T) seconds per shard
        self.time_scale = max(float(self.min_total().sum()) / self.W, 1e-30)
        self.tolerance = 0.005  # relative near-tie band of the greedy score
        self.by_memory = False  # place on the emptiest ranks (retry when memory is tight)
        self.memory_prices = (0.0, 0.0)  # (lam, mu) where the memory bound peaks (memory_bound)
        self.first_unplaced = False  # the last solve's first greedy left a table unplaced
        self.host_shares_used = False  # the last solve's plan holds each rank to its host share
        self.restarts = 0  # bound-guided restarts run by the last solve
        self.best_restart = 0  # the one whose plan was kept (0: the first greedy or a priced run)
        self.fit_runs = 0  # packing restarts run by the last solve (fit_restarts)
        self.refined = True  # the last solve refined its plans (``solve``'s ``refine``)
        self.repairs = 0  # fewer-types alternatives tried by re-placing tables (fewer_types)
        self.fewer_found_by = ""  # how fewer_types found its plan: "re-placing", "solving" or ""
        self.fit_wins = 0  # those whose plan replaced the best so far
        # told what the search is at, for a status line (NeoPlanner.progress): after the first
        # greedy, each restart and fewer-types solve's, and every 200 refinement moves
        self.progress: Callable[[str], None] | None = None
        self.progress_prefix = ""  # the types a fewer-types solve keeps, e.g. "DP+GRID only, "
        self._best_news = "no plan yet"

    # ---- placing one option --------------------------------------------------------
    def place(self, o: int, i: int) -> tuple[float, np.ndarray] | None:
        """Best ranks for option ``o`` of table ``i``: (peak load after, ranks) or None."""
        opt = self.opts[o]
        add_dev, add_host = opt.cost.mem_device[i], opt.cost.mem_host[i]
        fullest = self._fullest()
        if (
            not self.by_memory and fullest[0] + add_dev <= self.cap_dev
            and fullest[1] + self.most_per_node[o] * add_host <= self.cap_node
        ):  # fits on every rank (the common case): ranks in load order, nothing masked
            return self._place_unmasked(opt.unit, opt.k, float(opt.shard_time[i]))
        feas = self._fits(add_dev, add_host, int(self.rank_per_node[o]))
        if self.by_memory:  # memory-tight retry: fill the emptiest ranks first
            key = self.utilisation(add_dev, add_host) + self._load_ties()
        else:
            key = self.loads
        return self._place_on(o, i, feas, key)

    def _load_ties(self) -> np.ndarray:
        """Per rank, a millionth of its load over the slowest's: the memory-tight retry's tie
        break between ranks of equal fullness (once per state)."""
        if self._ties is None:
            self._ties = 1e-6 * self.loads / max(float(self.loads.max()), 1e-30)
        return self._ties

    def _place_on(self, o: int, i: int, feas: np.ndarray, key: np.ndarray) -> tuple[float, np.ndarray] | None:
        """``place`` on the ranks ``feas`` allows (memory), the lowest ``key`` first."""
        opt = self.opts[o]
        T = opt.shard_time[i]
        add_host = opt.cost.mem_host[i]
        sel = np.where(feas, key, np.inf)
        unit = opt.unit
        if unit == ALL:
            return (float(self.loads.max() + T), np.arange(self.W)) if feas.all() else None
        if unit == SINGLE:
            r = int(np.argmin(sel))
            return None if not np.isfinite(sel[r]) else (float(self.loads[r] + T), np.array([r]))
        if unit == ANY_K:
            order = np.argsort(sel, kind="stable")
            idx = self._spread(order, np.isfinite(sel), opt.k, add_host)
            if idx is None:
                return None
            return float(self.loads[idx].max() + T), np.sort(idx)
        grid = sel.reshape(self.N, self.L)
        loads = self.loads.reshape(self.N, self.L)
        if unit == NODE_K:
            order = np.argsort(grid, axis=1, kind="stable")[:, : opt.k]
            rows = self.node_index
            keys = grid[rows, order[:, -1]]  # sorted ascending: the k-th smallest is the max
            node = int(np.argmin(keys))
            if not np.isfinite(keys[node]):
                return None
            return float(loads[node, order[node]].max() + T), np.sort(order[node]) + node * self.L
        keys = grid.max(axis=1)
        peaks = np.where(np.isfinite(keys), loads.max(axis=1), np.inf)
        if unit == NODE_ALL:
            node = int(np.argmin(keys))
            if not np.isfinite(keys[node]):
                return None
            return float(peaks[node] + T), np.arange(node * self.L, (node + 1) * self.L)
        # NODES_K: k distinct whole nodes, one per column shard
        nodes = np.argsort(keys, kind="stable")[: opt.k]
        if not np.isfinite(keys[nodes[-1]]):
            return None
        ranks = (nodes[:, None] * self.L + np.arange(self.L)[None, :]).reshape(-1)
        return float(peaks[nodes].max() + T), ranks

    def _fullest(self) -> tuple[float, float]:
        """The most device memory any rank and host memory any node holds, once per state (as
        ``_sorted_loads``)."""
        if self._mem_max is None:
            host = float(self._node_host().max()) if self._host_used else 0.0
            self._mem_max = (float(self.mem_dev.max()), host)
        return self._mem_max

    def _host_shares(self, on: bool) -> None:
        """Hold each rank to its share of its node's host memory (``on``), a stricter rule
        whose plans fit either way, or let a node's ranks share it (the default)."""
        self.host_group = 1 if on else self.L
        self.cap_node = self.cap_host * self.host_group
        ones = np.ones(len(self.opts), dtype=np.int64)
        self.most_per_node, self.rank_per_node = (ones, ones) if on else self._node_counts
        self._host_nodes = self._mem_max = self._ties = None
        self._table_opts = {}  # host bytes a node takes changed (``_options_of``)

    def _node_host(self) -> np.ndarray:
        """Host bytes per node, once per state."""
        if self._host_nodes is None:
            self._host_nodes = self.mem_host.reshape(-1, self.host_group).sum(axis=1)
        return self._host_nodes

    def _fits(self, add_dev: float, add_host: float, m: int) -> np.ndarray:
        """Per rank: a shard's device bytes fit the rank, and ``m`` shards' host bytes its node."""
        ok = self.mem_dev + add_dev <= self.cap_dev
        if add_host > 0:
            ok &= np.repeat(self._node_host() + m * add_host <= self.cap_node, self.host_group)
        return ok

    def _spread(self, order: np.ndarray, ok: np.ndarray, k: int, add_host: float) -> np.ndarray | None:
        """The first ``k`` ranks of ``order`` that are ``ok``, where each node's host memory
        holds the shards it takes (several may land on one node); None if there are not ``k``."""
        idx = order[:k]
        if not ok[idx].all():
            return None
        if add_host <= 0:
            return idx
        host = self._node_host()
        counts = np.bincount(idx // self.host_group, minlength=len(host))
        if (host + counts * add_host <= self.cap_node).all():
            return idx
        taken, counts = [], np.zeros(len(host), dtype=np.int64)
        for r in order.tolist():  # rank by rank, skipping ranks of nodes already full
            if not ok[r]:
                break  # ``order`` puts the ranks that are not ok last
            n = r // self.host_group
            if host[n] + (counts[n] + 1) * add_host <= self.cap_node:
                taken.append(r)
                counts[n] += 1
                if len(taken) == k:
                    return np.array(taken, dtype=np.int64)
        return None

    def _sorted_loads(self, nodes: bool) -> list:
        """The loads in the orders every unmasked placement reads, computed once per state of
        ``loads`` (a re-insertion tries many options on the same loads): rank order, the
        slowest rank and, with ``nodes``, each node's loads sorted, the nodes' slowest ranks
        and node order (stable sorts, so ties go to the lower index as ``argmin`` and
        ``argsort`` do); then ``_peak_bases``' vectors."""
        pre = self._pre
        if pre is None:
            pre = self._pre = [np.argsort(self.loads, kind="stable"), float(self.loads.max()), None, None, None]
        if nodes and pre[2] is None:
            gsorted = np.sort(self.loads.reshape(self.N, self.L), axis=1)
            keys = gsorted[:, -1]
            pre[2] = (gsorted, keys, np.argsort(keys, kind="stable"))
        return pre

    def _peak_bases(self, nodes: bool) -> np.ndarray:
        """The peaks ``_place_unmasked`` reads before adding a shard, in one vector that
        ``_peak_at`` indexes: the slowest rank, the loads in order and, with ``nodes``, each
        node's k-th load at its least and the nodes' slowest ranks in order (once per state)."""
        pre = self._sorted_loads(nodes)
        if pre[3] is None:
            pre[3] = np.concatenate(([pre[1]], self.loads[pre[0]]))
        if not nodes:
            return pre[3]
        if pre[4] is None:
            gsorted, keys, norder = pre[2]
            pre[4] = np.concatenate((pre[3], gsorted.min(axis=0), keys[norder]))
        return pre[4]

    @property
    def usable(self) -> np.ndarray:
        """(O, T) bool: the options each table may take (restarts restrict it)."""
        return self._usable

    @usable.setter
    def usable(self, value: np.ndarray) -> None:
        self._usable, self._table_opts = _frozen(value), {}

    @property
    def total(self) -> np.ndarray:
        """(O, T): each option's summed shard time, as the greedy weighs it (priced restarts
        add memory to it)."""
        return self._total

    @total.setter
    def total(self, value: np.ndarray) -> None:
        self._total, self._table_opts = _frozen(value), {}

    def _options_of(self, i: int) -> tuple:
        """Table ``i``'s usable options and what ``best_option`` reads of each, kept until the
        mask, the totals or the host rule change: option indices, shard times, totals, device
        bytes, host bytes its fullest node takes, where its peak is read (``_peak_at``),
        whether any is placed by node, the options and totals as bytes (the memo's), then what
        ``_masked_floor`` reads: host bytes a node takes as a rank's check counts them
        (``_fits``), which options hold none (their check is skipped) and whether any does,
        and where in a (row per option, ranks sorted) array each option's
        ``_ranks_taken``-th least load is."""
        got = self._table_opts.get(i)
        if got is None:  # restarts change a few tables' options: the others' are kept by content
            usable, total = self._usable[:, i], self._total[:, i]
            key = (i, self.host_group, usable.tobytes(), total.tobytes())
            got = self._options_seen.get(key)
            if got is None:
                cand = np.flatnonzero(usable)
                tots = total[cand]
                host = self.shard_host[cand, i]
                got = self._options_seen[key] = (
                    cand, self.shard_times[cand, i], tots, self.shard_dev[cand, i],
                    self.most_per_node[cand] * host, self._peak_at[cand],
                    bool(self._by_node[cand].any()), cand.tobytes() + tots.tobytes(),
                    self.rank_per_node[cand] * host, (host <= 0)[:, None], bool((host > 0).any()),
                    np.arange(len(cand)) * self.W + self._ranks_taken[cand] - 1,
                )
            self._table_opts[i] = got
        return got

    def _unmasked_peaks(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """For table ``i``'s options (``_options_of``): which fit on every rank (``place``
        takes its unmasked path for them), and the peak load after placing each that does (as
        ``_place_unmasked``, all at once; undefined where it does not fit). Not in the memory-packing
        retry (``by_memory``), which ``best_option`` hands to ``_best_by_memory``."""
        _, T, _, dev_need, host_need, peak_at, nodes = self._options_of(i)[:7]
        dev, host = self._fullest()
        fit = dev + dev_need <= self.cap_dev
        if self._host_used or self.cap_node < 0:  # else every option's host test holds (0 <= cap)
            fit &= host + host_need <= self.cap_node
        return fit, self._peak_bases(nodes)[peak_at] + T

    def _masked_floor(self, i: int) -> np.ndarray:
        """For table ``i``'s options (``_options_of``), a peak load below which ``place``
        cannot put them, all at once: the ``_ranks_taken``-th least load among the ranks each
        fits on (``_fits``, the same sums), plus its shard time; inf where too few ranks fit,
        and ``place`` finds none. ``place`` takes that many distinct ranks that fit, so its
        peak is at least this (where an option fits on every rank too: a node unit chooses
        among fewer ranks). Memory-tight refinement tries many options whose free ranks are
        all busy: this turns them away without placing each."""
        _, T, _, dev_need, _, _, _, _, node_need, unhosted, hosted, taken = self._options_of(i)
        feas = self.mem_dev[None, :] + dev_need[:, None] <= self.cap_dev
        if hosted:  # a node's host memory holds ``rank_per_node`` shards, where they hold any
            node_ok = self._node_host()[None, :] + node_need[:, None] <= self.cap_node
            feas &= np.repeat(node_ok | unhosted, self.host_group, axis=1)
        least = np.sort(np.where(feas, self.loads[None, :], np.inf), axis=1)
        return least.take(taken) + T

    def _unmasked_ranks(self, o: int, i: int) -> np.ndarray:
        opt = self.opts[o]
        return self._place_unmasked(opt.unit, opt.k, float(opt.shard_time[i]))[1]

    def _place_unmasked(self, unit: str, k: int, T: float) -> tuple[float, np.ndarray]:
        """``place`` where the option fits on every rank: the same ranks and peak, read off
        ``_sorted_loads`` instead of sorting the loads for every option."""
        if unit == ALL:
            return self._sorted_loads(False)[1] + T, self._all_rank_ids
        if unit == SINGLE:
            r = int(self._sorted_loads(False)[0][0])
            return float(self.loads[r] + T), np.array([r])
        if unit == ANY_K:
            idx = self._sorted_loads(False)[0][:k]
            return float(self.loads[idx[-1]] + T), np.sort(idx)
        gsorted, keys, norder = self._sorted_loads(True)[2]
        if unit == NODE_K:
            node = int(np.argmin(gsorted[:, k - 1]))
            ranks = np.sort(np.argsort(self.loads[node * self.L : (node + 1) * self.L], kind="stable")[:k])
            return float(gsorted[node, k - 1] + T), ranks + node * self.L
        if unit == NODE_ALL:
            node = int(norder[0])
            return float(keys[node] + T), np.arange(node * self.L, (node + 1) * self.L)
        nodes = norder[:k]  # NODES_K
        return float(keys[nodes[-1]] + T), self._node_ranks[nodes].reshape(-1)

    def _apply(self, i: int, o: int, ranks: np.ndarray, sign: float, distinct: bool = True) -> None:
        """Add (``sign`` +1) or remove (-1) option ``o`` of table ``i`` on ``ranks``. The search
        places an option's shards on distinct ranks (``place``); a plan from elsewhere may put
        two shards on one rank (``distinct=False``: each counts)."""
        opt = self.opts[o]
        self._pre = self._mem_max = self._host_nodes = self._ties = None
        if distinct:
            # a shard on every rank: the whole vectors (the same sums, without an index)
            at = slice(None) if len(ranks) == self.W else ranks
            self.loads[at] += sign * opt.shard_time[i]
            self.mem_dev[at] += sign * opt.cost.mem_device[i]
            if host := opt.cost.mem_host[i]:
                self.mem_host[at] += sign * host
        else:
            np.add.at(self.loads, ranks, sign * opt.shard_time[i])
            np.add.at(self.mem_dev, ranks, sign * opt.cost.mem_device[i])
            np.add.at(self.mem_host, ranks, sign * opt.cost.mem_host[i])
        if sign > 0:
            self.choice[i], self.ranks[i] = o, ranks
        if self._single is not None and opt.unit == SINGLE:
            rank, T, dev, host = self._single
            rank[i] = int(ranks[0]) if sign > 0 else -1
            T[i], dev[i], host[i] = opt.shard_time[i], opt.cost.mem_device[i], opt.cost.mem_host[i]
        if self._on is not None:
            on, shard = self._on
            on[i, ranks] = sign > 0
            shard[i] = opt.shard_time[i]

    def _singles(self) -> tuple[np.ndarray, ...]:
        """Per table: the rank of its one shard where its option has one (-1 otherwise), and
        that shard's time, device and host bytes."""
        if self._single is None:
            n = len(self.choice)
            rank, T, dev, host = np.full(n, -1, dtype=np.int64), np.zeros(n), np.zeros(n), np.zeros(n)
            for i in np.flatnonzero(self.choice >= 0).tolist():
                opt = self.opts[self.choice[i]]
                if opt.unit == SINGLE:
                    rank[i] = int(self.ranks[i][0])
                    T[i], dev[i], host[i] = opt.shard_time[i], opt.cost.mem_device[i], opt.cost.mem_host[i]
            self._single = (rank, T, dev, host)
        return self._single

    def tables_on(self, r: int) -> list[int]:
        """The tables with a shard on rank ``r``, largest shard first (ties: the lower table)."""
        if self._on is None:  # (tables, ranks) bool and each placed table's shard time
            on = np.zeros((len(self.choice), self.W), dtype=bool)
            placed = np.flatnonzero(self.choice >= 0)
            for i in placed.tolist():
                on[i, self.ranks[i]] = True
            shard = np.zeros(len(self.choice))
            shard[placed] = self.shard_times[self.choice[placed], placed]
            self._on = (on, shard)
        on, shard = self._on
        tabs = np.flatnonzero(on[:, r])
        return tabs[np.lexsort((tabs, -shard[tabs]))].tolist()

    def best_option(self, i: int, rest_lb: float) -> tuple[int, np.ndarray] | None:
        """The option and ranks for table ``i`` with the best projected slowest rank: ``max(
        slowest rank, peak after placing, (summed load + the option's total + rest_lb) / W)``;
        near-ties (within ``tolerance``) go to the least summed cost, then the lowest option."""
        if self.by_memory:
            return self._best_by_memory(i, rest_lb)
        cand, T, tots, _, _, _, _, seen = self._options_of(i)[:8]
        # remembered for greedy runs that reach the same state with the same options (restarts)
        h = hashlib.blake2b(self.loads, digest_size=16)
        h.update(self.mem_dev)
        if self._host_used:  # else all zero
            h.update(self.mem_host)
        h.update(_KEY.pack(i, rest_lb, self.tolerance))
        key = h.digest()
        for options, result in self.decided.get(key, ()):
            if options == seen:
                self.decided_hits += 1
                return result
        cur_max = self._sorted_loads(False)[1]
        cur_sum = float(self.loads.sum())
        # every option that fits on every rank at once (the common case) ...
        fit, peaks = self._unmasked_peaks(i)
        avg = (cur_sum + tots + rest_lb) / self.W
        scores = np.maximum(np.maximum(cur_max, peaks), avg)
        masked: list[tuple[float, float, int, np.ndarray]] = []
        all_fit = bool(fit.all())
        if not all_fit:
            scores[~fit] = np.inf
        best_score = float(scores.min()) if len(cand) else float("inf")
        if not all_fit:  # ... then the others one by one (``place`` masks full ranks), in the
            # order of a score none of their placements can beat, while that can enter the band
            low = np.maximum(np.maximum(cur_max, float(self.loads.min()) + T), avg)
            out = np.flatnonzero(~fit)
            least = None  # the options' floors (``_masked_floor``), once one is to be placed
            for n in out[np.argsort(low[out], kind="stable")].tolist():
                if low[n] > best_score * (1.0 + self.tolerance):
                    break
                if least is None:
                    least = self._masked_floor(i)
                # no ranks, or a score above the band: neither ``best_score`` nor the choice
                # would change (the band only narrows)
                if least[n] == np.inf or least[n] > best_score * (1.0 + self.tolerance):
                    continue
                placed = self.place(int(cand[n]), i)
                if placed is None:
                    continue
                score = max(cur_max, placed[0], (cur_sum + float(tots[n]) + rest_lb) / self.W)
                masked.append((score, float(tots[n]), int(cand[n]), placed[1]))
                best_score = min(best_score, score)
        result = None
        if np.isfinite(best_score):
            floor = best_score * (1.0 + self.tolerance)
            band = np.flatnonzero(scores <= floor)
            found = masked
            if len(band):  # the least total, then score (stable: then the lower option)
                n = int(band[0]) if len(band) == 1 else int(band[np.lexsort((scores[band], tots[band]))[0]])
                found = [(float(scores[n]), float(tots[n]), int(cand[n]), None)] + masked
            if len(found) == 1:
                o, ranks = found[0][2], found[0][3]
            else:
                _, _, o, ranks = min((f for f in found if f[0] <= floor), key=lambda f: (f[1], f[0], f[2]))
            result = o, ranks if ranks is not None else self._unmasked_ranks(o, i)
        self.decided.setdefault(key, []).append((seen, result))
        return result

    def _best_by_memory(self, i: int, rest_lb: float) -> tuple[int, np.ndarray] | None:
        """``best_option`` for the memory-tight retry: the fullest rank touched after placing
        decides, the projected slowest rank breaks ties. Every option of the table is placed at
        once (``_memory_places``, as ``place`` would, the emptiest ranks first); the chosen
        one's ranks are then read off ``_place_on``."""
        cand, _, tots = self._options_of(i)[:3]
        if not len(cand):
            return None
        feas, key, full, chosen, ok, scalar = self._memory_places(i, cand)
        peak = np.where(chosen, self.loads[None, :], -np.inf).max(axis=1) + self.shard_times[cand, i]
        util = np.where(chosen, full, -np.inf).max(axis=1)
        for n in scalar:  # CW shards whose first ranks' nodes lack host memory: rank by rank
            placed = self._place_on(int(cand[n]), i, feas[n], key[n])
            ok[n] = placed is not None
            if placed is not None:
                peak[n], util[n] = placed[0], full[n, placed[1]].max()
        if not ok.any():
            return None
        score = np.maximum(np.maximum(float(self.loads.max()), peak), (float(self.loads.sum()) + tots + rest_lb) / self.W)
        final = np.where(ok, util + 1e-3 * score / self.time_scale, np.inf)
        band = np.flatnonzero(final <= float(final.min()) * (1.0 + self.tolerance))
        n = int(band[np.lexsort((final[band], tots[band]))[0]])  # least total, then score, then option
        placed = self._place_on(int(cand[n]), i, feas[n], key[n])
        assert placed is not None
        return int(cand[n]), placed[1]

    def _memory_places(self, i: int, cand: np.ndarray) -> tuple:
        """``place``'s memory-tight retry for options ``cand`` of table ``i``, all at once: per
        option (rows), the ranks each fits on (``_fits``), the order it fills them in (its
        ``utilisation`` after placing plus ``_load_ties``), that utilisation, the ranks it
        takes (a mask), whether it fits anywhere, and the rows ``_spread`` must place rank by
        rank (CW shards whose first ranks' nodes lack host memory)."""
        W, N, L = self.W, self.N, self.L
        add_dev, add_host = self.shard_dev[cand, i], self.shard_host[cand, i]
        host, group = self._node_host(), np.arange(W) // self.host_group
        feas = self.mem_dev[None, :] + add_dev[:, None] <= self.cap_dev
        hosted = add_host > 0
        if hosted.any():
            fits_node = host[None, :] + (self.rank_per_node[cand] * add_host)[:, None] <= self.cap_node
            feas &= fits_node[:, group] | ~hosted[:, None]
        full = (self.mem_dev[None, :] + add_dev[:, None]) / max(self.cap_dev, 1.0)
        if self.cap_node > 0:
            full = np.maximum(full, (host[None, :] + add_host[:, None])[:, group] / self.cap_node)
        key = full + self._load_ties()[None, :]
        sel = np.where(feas, key, np.inf)
        units, ks = self._unit[cand], self._k[cand]
        chosen = np.zeros(sel.shape, dtype=bool)
        ok = np.zeros(len(cand), dtype=bool)
        scalar: list[int] = []
        j = np.flatnonzero(units == SINGLE)  # the emptiest rank
        if len(j):
            r = sel[j].argmin(axis=1)
            ok[j] = np.isfinite(sel[j, r])
            chosen[j, r] = True
        j = np.flatnonzero(units == ALL)
        if len(j):
            ok[j] = feas[j].all(axis=1)
            chosen[j] = True
        j = np.flatnonzero(units == ANY_K)  # the k emptiest ranks
        if len(j):
            order = np.argsort(sel[j], axis=1, kind="stable")
            first = order.argsort(axis=1) < ks[j][:, None]  # each rank's place in its row's order
            rows = np.arange(len(j))
            ok[j] = np.isfinite(sel[j[rows], order[rows, ks[j] - 1]])
            chosen[j] = first
            check = hosted[j] & ok[j]
            if check.any():
                taken = first.reshape(len(j), -1, self.host_group).sum(axis=2)
                over = ~(host[None, :] + taken * add_host[j][:, None] <= self.cap_node).all(axis=1)
                scalar += j[check & over].tolist()
        j = np.flatnonzero(units == NODE_K)  # the node whose k-th emptiest rank is emptiest
        if len(j):
            grid = sel[j].reshape(len(j), N, L)
            gorder = np.argsort(grid, axis=2, kind="stable")
            rows = np.arange(len(j))
            kth = grid[rows[:, None], np.arange(N)[None, :], gorder[rows, :, ks[j] - 1]]
            node = kth.argmin(axis=1)
            ok[j] = np.isfinite(kth[rows, node])
            ranks = node[:, None] * L + gorder[rows, node]  # the node's ranks, emptiest first
            take = np.arange(L)[None, :] < ks[j][:, None]
            chosen[np.repeat(j, L)[take.reshape(-1)], ranks[take]] = True
        j = np.flatnonzero((units == NODE_ALL) | (units == NODES_K))  # the emptiest whole nodes
        if len(j):
            keys = sel[j].reshape(len(j), N, L).max(axis=2)
            norder = np.argsort(keys, axis=1, kind="stable")
            k = np.where(units[j] == NODE_ALL, 1, ks[j])
            rows = np.arange(len(j))
            ok[j] = np.isfinite(keys[rows, norder[rows, k - 1]])
            chosen[j] = np.repeat(norder.argsort(axis=1) < k[:, None], L, axis=1)
        return feas, key, full, chosen, ok, scalar

    # ---- the two phases ------------------------------------------------------------
    def utilisation(self, add_dev: float = 0.0, add_host: float = 0.0) -> np.ndarray:
        """Per rank, the fuller of its device memory and its node's host memory (fraction of
        usable capacity)."""
        dev = (self.mem_dev + add_dev) / max(self.cap_dev, 1.0)
        if self.cap_node <= 0:
            return dev
        return np.maximum(dev, np.repeat(self._node_host() + add_host, self.host_group) / self.cap_node)

    def reset(self) -> None:
        self.loads[:] = 0.0
        self._pre = self._mem_max = self._host_nodes = self._ties = None
        self.mem_dev[:] = 0.0
        self.mem_host[:] = 0.0
        self.choice[:] = -1
        self._on = self._single = None

    def greedy(self) -> None:
        """Place every table; if memory runs out, retry filling the emptiest ranks first."""
        try:
            self._greedy()
        except PlanningError:
            self.reset()
            self.by_memory = True
            try:
                self._greedy()
            finally:
                self.by_memory = False

    def _greedy(self) -> None:
        min_total = self.min_total()
        size = min_total
        if self.by_memory:  # first-fit decreasing by the smallest whole-table footprint
            foot = np.stack([o.cost.mem_device * o.num_shards / max(self.cap_dev, 1.0) for o in self.opts])
            if self.cap_host > 0:
                foot = foot + np.stack([o.cost.mem_host * o.num_shards / self.cap_host for o in self.opts])
            size = np.where(self.usable, foot, np.inf).min(axis=0)
        order = np.lexsort((np.arange(len(self.t)), -size))
        rest = float(min_total.sum())
        track = self.greedy_steps is not None and not self.by_memory
        if track:
            ahead, steps = self._inputs_ahead(order, min_total), []
            done = hashlib.blake2b(digest_size=16)
        for k, i in enumerate(order):
            rest -= float(min_total[i])
            if track:
                step = done.digest() + ahead[k] + np.float64(rest).tobytes()
                if step in self.greedy_steps:  # this greedy goes on as an earlier one did
                    self.greedy_steps.update(steps)
                    raise _Repeat
                steps.append(step)
            found = self.best_option(int(i), max(rest, 0.0))
            if found is None:
                raise self.no_fit_error(int(i))
            self._apply(int(i), found[0], found[1], +1.0)
            if track:
                done.update(np.int64([i, found[0]]).tobytes() + np.asarray(found[1], dtype=np.int64).tobytes())
        if track:
            self.greedy_steps.update(steps)

    def _inputs_ahead(self, order: np.ndarray, min_total: np.ndarray) -> list[bytes]:
        """Per greedy step ``k``, a digest of everything the steps from ``k`` on read besides
        the placements made so far: the tables still to place in order, their usable options,
        summed costs and bounds, and the near-tie band. A greedy step with the same digest,
        the same placements before it and the same bound of the rest decides as an earlier
        one did, and so does every step after it: the greedy repeats that plan."""
        ahead = [b""] * len(order)
        h = np.float64(self.tolerance).tobytes()
        for k in range(len(order) - 1, -1, -1):
            i = int(order[k])
            h = hashlib.blake2b(
                h + np.int64(i).tobytes() + self.usable[:, i].tobytes() + self.total[:, i].tobytes()
                + np.float64(min_total[i]).tobytes(),
                digest_size=16,
            ).digest()
            ahead[k] = h
        return ahead

    def plan_key(self) -> bytes:
        """The current choice and ranks of every table, as bytes (to recognise a plan)."""
        return self.choice.tobytes() + b"".join(np.asarray(r, dtype=np.int64).tobytes() + b"|" for r in self.ranks)

    def snapshot(self) -> tuple:
        return (
            self.loads.copy(), self.mem_dev.copy(), self.mem_host.copy(), self.choice.copy(),
            list(self.ranks),
        )

    def restore(self, snap: tuple) -> None:
        loads, dev, host, choice, ranks = snap
        self.loads, self.mem_dev, self.mem_host = loads.copy(), dev.copy(), host.copy()
        self._pre = self._mem_max = self._host_nodes = self._ties = None
        self.choice, self.ranks, self._on, self._single = choice.copy(), list(ranks), None, None

    def solve(
        self,
        refine: bool = True,
        time_budget_s: float = 30.0,
        caps: tuple[float, ...] = (1.0, 1.05, 1.1, 1.2, 1.35, 1.6),
        slack: float = 0.02,
        tolerances: tuple[float, ...] = (0.15, 0.3),
        wide_slack: float = 0.08,
        max_restarts: int = 24,
        fit_targets: int = 0,
        first_fit: bool = False,
    ) -> float:
        """Greedy (+ refinement), then bound-guided restarts, then up to ``fit_targets``
        packing restarts (``fit_restarts``); keeps the plan with the lowest slowest rank.
        ``first_fit``: stop at the first plan that places every table (whether one does is
        what a check by planning asks; the runs after it change only its speed).
        Returns the first greedy's slowest rank (for the report; when that greedy
        could not place every table, ``first_unplaced``, the best memory-priced plan's).

        A restart caps every table's shard time at ``cap x tau*``, where ``tau*`` is the shard
        time at which the lower bound is attained (``lower_bound``): tables then take options
        whose shards fit under the bound instead of cheaper-total but coarser ones, which is
        what few tables on many ranks need. If the best plan is then still more than
        ``wide_slack`` above the bound, the same restarts (uncapped first) run again with wider
        near-tie bands of the greedy (``tolerances``): the plans differ in which near-equal
        option each table takes, and the best is kept. Restarts stop once the plan is within
        ``slack`` of the bound, after ``max_restarts`` greedy runs (skipped duplicates do not
        count); candidate order and choice are deterministic. A wall-clock safety stop ends
        the restarts once ``time_budget_s`` has passed (counted in ``clock_stops``).
        """
        start = time.perf_counter()
        self.refined = refine  # whether its plans are refined (the why-lines say so)
        args = (refine, time_budget_s, caps, slack, tolerances, wide_slack, max_restarts, fit_targets, first_fit)
        self.greedy_steps, self.decided = set(), {}
        self.host_shares_used = False
        try:
            return self._solve(start, *args)
        except PlanningError as exc:
            # Last: only options whose shards each fit their rank's share of host memory. A
            # node's ranks share it, so more options are open, and one that fits its node can
            # lead the greedy to where device memory runs out; without them it may not.
            host = np.stack([o.cost.mem_host for o in self.opts])
            share = self.usable & (host <= self.cap_host)
            if not (host[self.usable] > 0).any() or self.host_group == 1 or not share.any(axis=0).all():
                raise
            saved = (self.usable, getattr(self, "_bound_cache", None), self.memory_prices)
            self.usable, self.greedy_steps, self.decided = share, set(), {}
            self._host_shares(True)
            try:
                first = self._solve(time.perf_counter(), *args)
                self.host_shares_used = True
                return first
            except PlanningError:
                raise exc from None  # the message of the search with shared host memory
            finally:
                self._host_shares(False)
                self.usable, self._bound_cache, self.memory_prices = saved
        finally:  # what this solve remembered is its own: a later greedy or solve starts clean
            self.greedy_steps, self.decided = None, {}

    def _solve(
        self,
        start: float,
        refine: bool,
        time_budget_s: float,
        caps: tuple[float, ...],
        slack: float,
        tolerances: tuple[float, ...],
        wide_slack: float,
        max_restarts: int,
        fit_targets: int = 0,
        first_fit: bool = False,
    ) -> float:
        bound = self.lower_bound()
        self._best_news = f"no plan yet (bound {bound * 1e3:.3f})"  # this solve's, not an earlier one's
        target = bound * (1 + 1e-4)  # refining closer than 0.01% of the bound is not worth it
        lam, mu = self.memory_prices
        unplaced: PlanningError | None = None
        try:
            self.greedy()
        except PlanningError as exc:  # the memory-priced runs below may still fit every table
            unplaced = exc
        if unplaced is None:
            first, first_plan = float(self.loads.max()), self.plan_key()
            self._news("first greedy", first, bound)  # refinement's news reads its figures
            if refine:
                self.refine(time_budget_s, target=target)
            best, snap = float(self.loads.max()), self.snapshot()
            plans = {first_plan}
            if first_fit:
                return first
        else:
            first, best, snap, plans = float("inf"), float("inf"), None, set()
        shard = np.stack([o.shard_time for o in self.opts])
        base = self.usable
        # a restart whose option mask, or whose greedy plan, was seen before ends where that
        # one did (greedy and refinement are deterministic): skip it
        tol0 = self.tolerance
        masks = {(base.tobytes(), tol0)}
        restarts = 0
        self.best_restart = 0
        # Memory-priced restarts, when memory binds (the memory bound's multipliers are > 0):
        # the greedy weighs each option's total plus its device and host bytes at those prices
        # (times ``factor``), so memory-hungry fast options give way where memory is scarce,
        # first with shard times capped at the bound (as the capped restarts below), then
        # uncapped; refinement then uses the true totals. The bound's prices understate what
        # the greedy needs when memory is tight, so they are raised step by step (1.5x, 2x,
        # 3x) before being lowered; the runs stop once a plan is within ``slack`` of the
        # bound. At most seven runs, under the same wall-clock safety stop as the restarts
        # below. 12T on 128 ranks with a 5% cache: 110.9 -> 51.6 ms (1.07x the bound); with
        # 10%: 284 -> 62.7 ms. When the first greedy could not place every table they are the
        # fallback (12T with a 10% LFU cache: short by 46 KB on one rank without them).
        if lam > 0 or mu > 0:
            shards = np.array([o.num_shards for o in self.opts], dtype=np.float64)[:, None]
            extra = lam * np.stack([o.cost.mem_device for o in self.opts]) * shards
            extra = extra + mu * np.stack([o.cost.mem_host for o in self.opts]) * shards
            true_total = self.total
            for cap, factor in ((1.0, 1.0), (1.0, 1.5), (1.0, 2.0), (1.0, 3.0), (1.0, 0.85), (None, 1.0), (None, 0.85)):
                if best <= bound * (1 + slack) or (first_fit and snap is not None):
                    break
                # safety stop only, and not before a plan fits (at most seven runs): whether
                # one is found must not depend on the machine's speed
                if snap is not None and time.perf_counter() - start > time_budget_s:
                    self.clock_stops += 1
                    break
                usable = capped(base, shard, bound, cap)
                peak = self._restart(usable, true_total + factor * extra, tol0, True, plans, refine, time_budget_s / 4, target)
                if peak is not None and peak < best * (1 - 1e-9):
                    best, snap = peak, self.snapshot()
                self._news("memory-priced runs", best, bound)
        if snap is None:  # no run placed every table: the first greedy's message says where
            assert unplaced is not None
            raise unplaced
        self.first_unplaced = unplaced is not None
        if unplaced is not None:
            first = best  # the report's "greedy" figure: the best memory-priced plan
        if first_fit:
            self.restore(snap)
            return first
        runs = [(cap, tol0) for cap in caps]
        runs += [(cap, tol) for tol in tolerances for cap in (None, *caps)]
        for cap, tol in runs:
            if best <= bound * (1 + slack):
                break
            if time.perf_counter() - start > time_budget_s:  # safety stop only
                self.clock_stops += 1
                break
            if restarts >= max_restarts:
                break
            if tol != tol0 and best <= bound * (1 + wide_slack):
                break
            usable = capped(base, shard, bound, cap)
            if (usable.tobytes(), tol) in masks:
                continue
            masks.add((usable.tobytes(), tol))
            restarts += 1
            peak = self._restart(usable, self.total, tol, False, plans, refine, time_budget_s / 4, target)
            if peak is not None and peak < best * (1 - 1e-9):
                best, snap = peak, self.snapshot()
                self.best_restart = restarts
            self._news("restarts", best, bound)
        self.restarts = restarts
        self.fit_runs = self.fit_wins = 0
        # packing restarts, unless the plan is within ``slack`` of the bound or memory binds
        # (they do not weigh memory: 12T with a 5% cache, 24 runs, none better)
        if fit_targets > 0 and best > bound * (1 + slack) and lam <= 0 and mu <= 0:
            self.restore(snap)
            snap = self.fit_restarts(fit_targets, bound, plans, refine, start, time_budget_s, target)
        self.restore(snap)
        return first

    def fit_restarts(
        self,
        targets: int,
        bound: float,
        plans: set[bytes],
        refine: bool,
        start: float,
        time_budget_s: float,
        target: float,
        over: float = 0.05,
        band: float = 0.02,
    ) -> tuple:
        """Packing restarts: best-fit decreasing under a target slowest rank ``M``
        (``_fit_greedy``, two table orders), for ``targets`` values of ``M`` evenly from the
        lower bound up to ``1 + over`` times the current plan's slowest rank, each refined.
        Starts from the current plan and returns the snapshot of the best: a packed plan
        replaces it only with a strictly lower slowest rank and a predicted step no higher,
        so no plan gets worse.

        The greedy puts each table on the least loaded ranks. Where a few coarse shards must
        fill many ranks (MLPerf with TorchRec's estimator on 64-128 ranks, where a column-wise
        table's 8 shards fill one node), that spreads the shards into gaps nothing else fits:
        MLPerf at 128 ranks ends 18.5% above the bound. Filling the fullest ranks that stay
        under ``M`` first, with the option that fills them best, leaves whole ranks and nodes
        for the shards still to come (7.0% above the bound there). A heuristic's packing under
        ``M`` is not monotone in ``M``, and refinement often ends well below the ``M`` a plan
        was packed for (above the current plan too), so every target runs (no bisection).
        Deterministic: counts bound the runs (a plan seen before is not refined again); the
        clock is the same safety stop as for the restarts.
        """
        best, best_step, snap = float(self.loads.max()), self.step(), self.snapshot()
        top = best * (1 + over)
        for j in range(targets):
            M = bound + (top - bound) * j / max(targets - 1, 1)
            for by_cheapest in (False, True):
                if best <= bound * (1 + 1e-4):
                    return snap
                if time.perf_counter() - start > time_budget_s:  # safety stop only
                    self.clock_stops += 1
                    return snap
                self.fit_runs += 1
                self.reset()
                self._fit_greedy(M, band, by_cheapest)
                if (self.choice < 0).any():
                    continue
                plan = self.plan_key()
                if plan in plans:
                    continue
                plans.add(plan)
                if refine:
                    self.refine(time_budget_s / 4, target=target)
                peak = float(self.loads.max())
                if peak < best * (1 - 1e-9) and self.step() <= best_step:
                    best, best_step, snap = peak, self.step(), self.snapshot()
                    self.fit_wins += 1
                self._news("packing restarts", best, bound)
        return snap

    def _fit_place(self, o: int, i: int, M: float) -> tuple[float, np.ndarray] | None:
        """Best-fit ranks for option ``o`` of table ``i`` under a target slowest rank ``M``:
        of the ranks a shard fits on (memory) and stays at most ``M``, the fullest; (the
        fullest touched rank after placing, ranks) or None. Ties go to the lower index."""
        opt = self.opts[o]
        T = float(opt.shard_time[i])
        ok = self.loads <= M - T
        add_dev, add_host = opt.cost.mem_device[i], opt.cost.mem_host[i]
        fullest = self._fullest()
        if fullest[0] + add_dev > self.cap_dev or fullest[1] + self.most_per_node[o] * add_host > self.cap_node:
            ok &= self._fits(add_dev, add_host, int(self.rank_per_node[o]))
        unit = opt.unit
        if unit == ALL:
            return (float(self.loads.max()) + T, self._all_rank_ids) if ok.all() else None
        key = np.where(ok, self.loads, -np.inf)
        if unit == SINGLE:
            r = int(np.argmax(key))
            return (float(self.loads[r]) + T, np.array([r])) if ok[r] else None
        if unit == ANY_K:
            idx = self._spread(np.argsort(-key, kind="stable"), ok, opt.k, add_host)
            if idx is None:
                return None
            return float(self.loads[idx].max()) + T, np.sort(idx)
        grid = key.reshape(self.N, self.L)
        if unit == NODE_K:
            order = np.argsort(-grid, axis=1, kind="stable")[:, : opt.k]
            kth = grid[self.node_index, order[:, -1]]  # the node's k-th fullest rank that fits
            node = int(np.argmax(kth))
            if not np.isfinite(kth[node]):
                return None
            ranks = np.sort(order[node]) + node * self.L
            return float(self.loads[ranks].max()) + T, ranks
        whole = ok.reshape(self.N, self.L).all(axis=1)
        keys = np.where(whole, self.loads.reshape(self.N, self.L).max(axis=1), -np.inf)
        if unit == NODE_ALL:
            node = int(np.argmax(keys))
            if not whole[node]:
                return None
            return float(keys[node]) + T, self._node_ranks[node]
        nodes = np.argsort(-keys, kind="stable")[: opt.k]  # NODES_K
        if not whole[nodes[-1]]:
            return None
        nodes = np.sort(nodes)
        return float(keys[nodes].max()) + T, self._node_ranks[nodes].reshape(-1)

    def _fit_greedy(self, M: float, band: float, by_cheapest: bool) -> None:
        """Best-fit decreasing under a target slowest rank ``M``, over the options whose
        shards are at most ``M`` (all of a table's, where none is). Tables whose cheapest
        such option (least total) is an every-rank one (DP, RW) go first, as they load every
        rank alike; then the rest, largest shard first: the smallest shard a table can take,
        or (``by_cheapest``) the shard of its cheapest option. Each table takes, of its
        options within ``band`` of the least total that fit under ``M`` (``_fit_place``), the
        one leaving its fullest touched rank fullest (best fit), then the lower total and
        option index. A table that fits nowhere under ``M`` takes the greedy's choice
        (``best_option``); one that fits nowhere at all is left unplaced (choice -1)."""
        usable = self.usable
        fit = usable & (self.shard_times <= M)
        fit = np.where(fit.any(axis=0), fit, usable)
        tot = np.where(fit, self.total, np.inf)
        least = tot.argmin(axis=0)
        every = np.array([self.opts[o].unit == ALL for o in least.tolist()])
        n = len(self.t)
        if by_cheapest:
            shard = self.shard_times[least, np.arange(n)]
        else:
            shard = np.where(fit, self.shard_times, np.inf).min(axis=0)
        order = np.lexsort((np.arange(n), -shard, ~every))
        min_total = self.min_total()
        rest = float(min_total.sum())
        for i in order.tolist():
            rest -= float(min_total[i])
            cand = np.flatnonzero(fit[:, i])
            cand = cand[np.argsort(tot[cand, i], kind="stable")]
            chosen: tuple[float, float, int, np.ndarray] | None = None
            floor = np.inf
            for o in cand.tolist():
                t = float(tot[o, i])
                if t > floor:
                    break
                placed = self._fit_place(o, i, M)
                if placed is None:
                    continue
                if chosen is None:
                    floor = t * (1 + band)
                key = (-placed[0], t, o)
                if chosen is None or key < chosen[:3]:
                    chosen = (key[0], key[1], key[2], placed[1])
            if chosen is not None:
                self._apply(i, chosen[2], chosen[3], +1.0)
                continue
            found = self.best_option(i, max(rest, 0.0))
            if found is None:
                return
            self._apply(i, found[0], found[1], +1.0)

    def _restart(
        self,
        usable: np.ndarray,
        total: np.ndarray,
        tolerance: float,
        memory_retry: bool,
        plans: set[bytes],
        refine: bool,
        budget_s: float,
        target: float,
    ) -> float | None:
        """A greedy from scratch with these options, totals and near-tie band (then refined
        with the true ones); its slowest rank, or None if it failed or repeats a plan in
        ``plans``. ``memory_retry``: retry packing by memory if the greedy runs out of it."""
        base = (self.usable, self.total, self.tolerance)
        self.usable, self.total, self.tolerance = usable, total, tolerance
        self.reset()
        try:
            self.greedy() if memory_retry else self._greedy()
        except PlanningError:
            return None
        except _Repeat:  # its plan would be one in ``plans``: skipped as such
            self.repeats_cut += 1
            return None
        finally:
            self.usable, self.total, self.tolerance = base
        plan = self.plan_key()
        if plan in plans:
            return None
        plans.add(plan)
        if refine:
            self.refine(budget_s, target=target)
        return float(self.loads.max())

    def _news(self, phase: str, best: float, bound: float) -> None:
        """Tell ``progress`` (if any) the best slowest rank's load so far, its bound, and what
        the search is at (figures first: a terminal's width cuts the end)."""
        self._best_news = f"load {best * 1e3:.3f} ms (bound {bound * 1e3:.3f})"
        if self.progress is not None:
            self.progress(f"{self._best_news}: {self.progress_prefix}{phase}")

    def refine(self, time_budget_s: float = 30.0, max_moves: int = 100000, target: float = 0.0) -> None:
        """Lower the slowest rank by re-placing or swapping its tables until stuck (or until
        it is at most ``target``, e.g. just above the lower bound)."""
        deadline = time.perf_counter() + time_budget_s
        eps = 1e-12
        while self.moves < max_moves:
            if time.perf_counter() >= deadline:  # safety stop only
                self.clock_stops += 1
                return
            r = int(np.argmax(self.loads))
            cur = float(self.loads[r])
            if cur <= max(target, 0.0):
                return
            if self.progress is not None and self.moves % 200 == 0 and self.moves:
                self.progress(f"{self._best_news}: {self.progress_prefix}refining, {self.moves} moves")
            improved = False
            for i in self.tables_on(r):
                if self._try_reinsert(i, cur - eps * max(cur, 1e-9)) or self._try_swap(i, r, cur):
                    improved = True
                    self.moves += 1
                    break
            if not improved:
                return

    def _try_reinsert(self, i: int, limit: float) -> bool:
        old_o, old_ranks = int(self.choice[i]), self.ranks[i]
        self._apply(i, old_o, old_ranks, -1.0)
        cand, T, tots = self._options_of(i)[:3]
        # a peak no option can go below (``_masked_floor``): where none is under ``limit``,
        # nothing is placed (most tries when memory is tight)
        floor = self._masked_floor(i)
        if not (floor < limit).any():
            self._apply(i, old_o, old_ranks, +1.0)
            return False
        # the option of least peak under ``limit`` (ties: the lower total, then option index):
        # those that fit on every rank at once, then the others in the order of a peak they
        # cannot beat (the least loaded rank plus one shard) while that is under both, unless
        # their floor says they cannot get under it
        fit, peaks = self._unmasked_peaks(i)
        peaks = np.where(fit & (peaks < limit), peaks, np.inf)
        best: tuple[float, float, int, np.ndarray | None] | None = None
        if np.isfinite(peaks).any():
            n = int(np.lexsort((cand, tots, peaks))[0])
            best = (float(peaks[n]), float(tots[n]), int(cand[n]), None)
        low = float(self.loads.min()) + T
        for n in np.flatnonzero(~fit)[np.argsort(low[~fit], kind="stable")].tolist():
            if low[n] >= limit or (best is not None and low[n] > best[0]):
                break
            if floor[n] >= limit:  # ``place`` ends at or above ``limit`` or finds no ranks
                continue
            placed = self.place(int(cand[n]), i)
            if placed is None or placed[0] >= limit:
                continue
            entry = (placed[0], float(tots[n]), int(cand[n]), placed[1])
            if best is None or entry[:3] < best[:3]:
                best = entry
        if best is None:
            self._apply(i, old_o, old_ranks, +1.0)
            return False
        self._apply(i, best[2], best[3] if best[3] is not None else self._unmasked_ranks(best[2], i), +1.0)
        return True

    def _try_swap(self, i: int, r: int, cur: float) -> bool:
        """Swap table-wise table ``i`` on rank ``r`` with a cheaper table-wise table elsewhere."""
        opt_i = self.opts[self.choice[i]]
        if opt_i.unit != SINGLE:
            return False
        Ti = opt_i.shard_time[i]
        di, hi = opt_i.cost.mem_device[i], opt_i.cost.mem_host[i]
        # every other table-wise table at once: a cheaper one on a less loaded rank, the swap
        # lowering the slowest of the two ranks, both ranks' memory (and nodes') within capacity
        rank, T, dev, host_j = self._singles()
        r2 = np.where(rank >= 0, rank, 0)
        load2 = self.loads[r2]
        new = np.maximum(cur - Ti + T, load2 - T + Ti)
        ok = (rank >= 0) & (rank != r) & (load2 + 1e-15 < cur) & (T < Ti) & (new < cur * (1 - 1e-12))
        ok &= (self.mem_dev[r] - di + dev <= self.cap_dev) & (self.mem_dev[r2] - dev + di <= self.cap_dev)
        node, node2 = r // self.host_group, r2 // self.host_group
        host = self._node_host()
        ok &= (node2 == node) | ((host[node] - hi + host_j <= self.cap_node) & (host[node2] - host_j + hi <= self.cap_node))
        if not ok.any():
            return False
        # the least loaded such rank (ties: the lower rank), then its swap of least slowest load
        # (ties: the lower table)
        cand = np.flatnonzero(ok)
        position = np.empty(self.W, dtype=np.int64)
        position[np.argsort(self.loads, kind="stable")] = np.arange(self.W)
        pos = position[r2[cand]]
        there = cand[pos == pos.min()]
        j = int(there[np.argmin(new[there])])
        oi, oj = int(self.choice[i]), int(self.choice[j])
        ri, rj = self.ranks[i], self.ranks[j]
        self._apply(i, oi, ri, -1.0)
        self._apply(j, oj, rj, -1.0)
        self._apply(i, oi, rj, +1.0)
        self._apply(j, oj, ri, +1.0)
        return True

    # ---- fixed collective latency ----------------------------------------------------
    def types_used(self) -> set[str]:
        """Sharding types (TorchRec names) of the current plan."""
        return {self.opts[o].sharding_type.value for o in self.choice if o >= 0}

    def step(self) -> float:
        """Predicted step of the current plan: slowest rank plus the fixed collective latency
        of the sharding types it uses (``CostModel.latency_time``)."""
        return float(self.loads.max()) + self.model.latency_time(self.types_used())

    def _of_types(self, types: set[str] | frozenset[str]) -> np.ndarray:
        """The usable mask restricted to options of these sharding types."""
        keep = np.array([o.sharding_type.value in types for o in self.opts])
        return self.usable & keep[:, None]

    def _bound_over(self, usable: np.ndarray, cheap: bool = False) -> float:
        """``lower_bound`` (``cheap``: ``flat_bound``) over a restricted option mask, inf if a
        table is left without an option; the search's own mask, cached bound and memory
        prices are kept."""
        if not usable.any(axis=0).all():
            return float("inf")
        saved = (self.usable, getattr(self, "_bound_cache", None), self.memory_prices)
        self.usable = usable
        try:
            return self.flat_bound() if cheap else self.lower_bound()
        finally:
            self.usable, self._bound_cache, self.memory_prices = saved

    def present_types(self) -> list[str]:
        """Sharding types (TorchRec names) that some table can use, sorted."""
        return sorted({o.sharding_type.value for j, o in enumerate(self.opts) if self.usable[j].any()})

    def fewer_types(
        self,
        max_solves: int,
        refine: bool = True,
        time_budget_s: float = 30.0,
        share: float = 0.10,
        max_restarts: int = 24,
        fit_targets: int = 0,
        wide_slack: float = 0.0,
    ) -> int:
        """After ``solve``: plans over fewer of its sharding types, where their collectives
        cost more than the balance they buy.

        Each sharding type in a plan adds fixed-latency collectives (three all-to-alls; one
        all-reduce for DP) that the load balance does not see. First, always (cheap): each type
        the plan uses left out, or swapped for an unused one of less latency, by re-placing
        only its tables, where they are at most half of them (``_repair_types``); a type that
        serves a few small tables costs its latency for almost no balance. Then the restricted
        solves, which rebuild the whole plan. Nothing more is tried when the
        latency fewer types could save (the plan's, less that of the cheapest single type) is
        under ``share`` of the step: there the balance a type buys mostly outweighs it (MLPerf
        on 8 and 16 ranks: 8% of the step; a share of 0.03 wins nothing at 8 ranks and 2% at 16,
        for 3x the time; on 128 ranks: 23%, 13% won). Otherwise
        every proper subset ``S`` of the plan's types, every single type the plan does not
        use, and the plan's types with one of them swapped for one it does not use, gets a
        cheap bound: ``flat_bound`` over its options plus ``latency(S)``. Those whose bound is
        below the current step are solved in bound order (``solve`` restricted to ``S``, with
        at most ``max_restarts`` restarts), at most ``max_solves`` of them, and the plan with
        the lowest predicted step (``step``) is kept. A restricted solve runs its wide-band
        restarts while its plan is more than ``wide_slack`` above its bound (``solve``'s
        default: 8%), until within ``slack`` (2%) or out of restarts: fewer types leave fewer
        near-ties to try, and the few percent they leave is the win (MLPerf on 128 ranks:
        1.034 -> 1.011 ms). Deterministic; returns the number of subsets solved.
        """
        latency = self.model.latency_time
        used = sorted(self.types_used())
        self.repairs, self.fewer_found_by = 0, ""
        if len(used) <= 1 or latency({ShardingType.TABLE_WISE.value}) <= 0:
            return 0
        best, keep = self.step(), self.snapshot()
        unused = [st for st in self.present_types() if st not in used]
        least = min(latency({st}) for st in self.present_types())
        gated = latency(set(used)) - least < share * best
        first, shares = best, self.host_shares_used  # shares: the kept plan held ranks to host shares
        best, keep = self._repair_types(used, unused, best, keep, refine, time_budget_s)
        if best < first:  # re-placed under the search's own rule: a node's ranks share its host memory
            self.fewer_found_by, shares = "re-placing", False
        if max_solves <= 0 or gated:
            self.host_shares_used = shares
            return 0
        restarts = (self.restarts, self.best_restart)
        subsets = {combo for size in range(1, len(used)) for combo in combinations(used, size)}
        subsets |= {(st,) for st in unused}  # one type for all
        # one type swapped for another of less latency (MLPerf on 32 nodes of 4 GPUs at 175
        # GB/s: CW+GRID -> DP+GRID); one of as much is a plan the full solve could have made
        swaps = {tuple(sorted({*used} - {u} | {v})) for u in used for v in unused}
        subsets |= {c for c in swaps if latency(set(c)) < latency(set(used)) * (1 - 1e-9)}
        candidates = []
        for combo in sorted(subsets):
            usable = self._of_types(set(combo))
            value = self._bound_over(usable, cheap=True) + latency(set(combo))
            if value < best * (1 - 1e-9):
                candidates.append((value, combo, usable))
        candidates.sort(key=lambda c: (c[0], c[1]))
        base, cache, prices = self.usable, getattr(self, "_bound_cache", None), self.memory_prices
        solved = 0
        for value, combo, usable in candidates:
            if solved >= max_solves or value >= best * (1 - 1e-9):
                break
            solved += 1
            self.progress_prefix = "+".join(sorted(ShardingType(t).short for t in combo)) + " only, "
            self.usable = usable
            self.reset()
            try:
                self.solve(
                    refine, time_budget_s, max_restarts=max_restarts, fit_targets=fit_targets, wide_slack=wide_slack
                )
                step = self.step()
            except PlanningError:
                step = float("inf")
            finally:
                self.usable, self._bound_cache, self.memory_prices = base, cache, prices
                self.progress_prefix = ""
            if step < best * (1 - 1e-9):
                best, keep = step, self.snapshot()
                self.fewer_found_by, shares = "solving", self.host_shares_used
        self.restarts, self.best_restart = restarts
        self.host_shares_used = shares
        self.restore(keep)
        return solved

    def _repair_types(self, used: list[str], unused: list[str], best: float, keep: tuple, refine: bool,
                      time_budget_s: float) -> tuple[float, tuple]:
        """From the plan ``keep`` (step ``best``): each type the plan uses left out, or swapped
        for an unused one of less latency, by re-placing only the tables that used it
        (greedily, largest first). The one whose re-placed plan has the least step is refined;
        if that lowers the step, it is kept and the pass goes on from it. Returns the best step
        and its snapshot."""
        latency = self.model.latency_time
        base = self.usable
        while len(used) > 1:
            if self.progress is not None:
                self.progress(f"{self._best_news}: fewer types, re-placing tables")
            cands = [tuple(sorted(set(used) - {u})) for u in used]
            cands += [tuple(sorted(set(used) - {u} | {v})) for u in used for v in unused]
            cands = sorted({c for c in cands if latency(set(c)) < latency(set(used)) * (1 - 1e-9)})
            top: tuple[float, np.ndarray, tuple] | None = None
            for combo in cands:
                self.usable = base
                usable = self._of_types(set(combo))
                moved = int((~usable[keep[3], np.arange(len(keep[3]))]).sum())
                if 2 * moved > len(keep[3]):  # past half the tables, a restricted solve's work
                    continue
                if self._bound_over(usable, cheap=True) + latency(set(combo)) >= best * (1 - 1e-9):
                    continue
                self.restore(keep)
                self.repairs += 1
                step = self._replace_out(usable)
                if np.isfinite(step) and (top is None or step < top[0]):
                    top = (step, usable, self.snapshot())
            if top is None:
                break
            self.restore(top[2])
            self.usable = top[1]
            if refine:
                self.refine(time_budget_s)
            if self.step() >= best * (1 - 1e-9):
                break
            best, keep = self.step(), self.snapshot()
            used = sorted(self.types_used())
            unused = [st for st in self.present_types() if st not in used]
        self.usable = base
        self.restore(keep)
        return best, keep

    def _replace_out(self, usable: np.ndarray) -> float:
        """Re-place the tables whose option ``usable`` leaves out, the largest first, as the
        greedy would, with the options ``usable`` allows (left as the search's mask); the
        plan's step, or inf if a table finds no place."""
        self.usable = usable
        idx = np.arange(len(self.choice))
        out = np.flatnonzero(~usable[self.choice, idx])
        for i in out.tolist():
            self._apply(i, int(self.choice[i]), self.ranks[i], -1.0)
            self.choice[i] = -1
        min_total = self.min_total()
        rest = float(min_total[out].sum())
        for i in out[np.lexsort((out, -min_total[out]))].tolist():
            rest -= float(min_total[i])
            found = self.best_option(i, max(rest, 0.0))
            if found is None:
                return float("inf")
            self._apply(i, found[0], found[1], +1.0)
        return self.step()

    def step_bound(self, max_evals: int = 16) -> float:
        """A bound on the predicted step (slowest rank plus collective latency) of every plan.

        A plan whose options all have sharding types in ``S`` has a slowest rank of at least
        ``lower_bound`` over those options, and pays ``latency(S)`` at least; so the minimum
        over ``S`` of both summed bounds every plan. Subsets are visited largest first: a
        subset's load bound is at least its supersets', so subsets whose supersets' bound plus
        their own latency cannot beat the best are not computed; past ``max_evals`` computed
        subsets the rest count with the larger of that and ``flat_bound`` (cheaper, still valid).
        The set of every type also takes ``memory_shard_bound`` (its subsets inherit it).
        """
        present = self.present_types()
        latency = self.model.latency_time
        full = frozenset(present)
        floor = {full: max(self.lower_bound(), self.memory_shard_bound())}
        best = floor[full] + latency(set(full))
        evals = 0
        for size in range(len(present) - 1, 0, -1):
            for combo in combinations(present, size):
                subset = frozenset(combo)
                sup = max(floor[subset | {x}] for x in full - subset)
                lat = latency(set(subset))
                floor[subset] = sup
                if sup + lat >= best:
                    continue
                usable = self._of_types(subset)
                if evals < max_evals:
                    evals += 1
                    floor[subset] = max(sup, self._bound_over(usable))
                else:
                    floor[subset] = max(sup, self._bound_over(usable, cheap=True))
                best = min(best, floor[subset] + lat)
        return best

    # ---- bounds and messages -------------------------------------------------------
    def min_total(self) -> np.ndarray:
        """Per table, the smallest summed cost over its usable options."""
        tot = np.where(self.usable, self.total, np.inf).min(axis=0)
        return np.where(np.isfinite(tot), tot, 0.0)

    def lower_bound(self) -> float:
        """A bound no plan over these options can beat (see docs/cost_model.md): the larger of
        ``flat_bound`` and ``all_rank_bound``; cached per option mask."""
        key = self.usable.tobytes()
        cached = getattr(self, "_bound_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = max(self.flat_bound(), self.all_rank_bound(), self.memory_bound())
        self._bound_cache = (key, value)
        return value

    def memory_bound(self, points: int = 25) -> float:
        """Bound from the cluster's memory: fast options that do not all fit force slower ones.

        With ``d``, ``h`` an option's device and host bytes (all shards) and ``D``, ``H`` the
        cluster's usable device and host memory, any plan that fits has, for every ``lam, mu
        >= 0``, ``sum_t total_t >= sum_t min_o (total + lam d + mu h) - lam D - mu H``
        (Lagrangian relaxation of the two capacity constraints), and its slowest rank carries
        at least ``1/W`` of the sum. The largest value over a log grid of ``lam`` and ``mu``
        (scaled to time per byte of the whole cluster) is kept.
        """
        total = np.where(self.usable, self.total, np.inf)
        if not np.isfinite(total).any(axis=0).all():
            return 0.0
        cheapest = self._cheapest_fit(total)
        if cheapest is not None:  # no price can lift the bound: its value at price 0
            self.memory_prices = (0.0, 0.0)
            return cheapest / self.W
        best, lam, mu = self._lagrangian(total, self._memory_terms(total, points))
        self.memory_prices = (lam, mu)  # (0, 0) when no price lifts the bound
        return best / self.W

    def _cheapest_fit(self, total: np.ndarray) -> float | None:
        """``sum_t min_o total`` where each table's cheapest option, taken together, fits the
        cluster's memory with room to spare (then no price lifts ``memory_bound``: with ``o*``
        those options, ``sum_t min_o (total + lam d + mu h) - lam D - mu H <= sum_t total_o* +
        lam (sum d_o* - D) + mu (sum h_o* - H)``, below the value at price 0); None otherwise."""
        cheapest = np.argmin(total, axis=0)
        cols = np.arange(total.shape[1])
        shards = np.array([o.num_shards for o in self.opts], dtype=np.float64)[cheapest]
        dev = float((self.shard_dev[cheapest, cols] * shards).sum())
        host = float((self.shard_host[cheapest, cols] * shards).sum())
        D, H = self.cap_dev * self.W, self.cap_host * self.W
        if dev > D * (1 - 1e-6) or (host > 0 and host > H * (1 - 1e-6)):
            return None
        return float(total[cheapest, cols][None].sum(axis=1)[0])

    def _memory_terms(self, total: np.ndarray, points: int) -> tuple:
        """Per option and table its device and host bytes (all shards; 0 where unusable), the
        cluster's usable device and host memory, and the grid of prices: 0 and ``points`` steps
        from 1e-3 to 1e3 times the cluster's time per byte."""
        ok = np.isfinite(total)
        shards = np.array([o.num_shards for o in self.opts], dtype=np.float64)[:, None]
        dev = np.where(ok, np.stack([o.cost.mem_device for o in self.opts]) * shards, 0.0)
        host = np.where(ok, np.stack([o.cost.mem_host for o in self.opts]) * shards, 0.0)
        D, H = self.cap_dev * self.W, self.cap_host * self.W
        scale = float(total.min(axis=0).sum())
        grid = np.concatenate(([0.0], np.logspace(-3, 3, points)))
        lams = grid * scale / max(D, 1.0)
        mus = grid * scale / max(H, 1.0) if H > 0 else np.zeros(1)
        return dev, host, D, H, lams, mus

    @staticmethod
    def _lagrangian(cost: np.ndarray, terms: tuple) -> tuple[float, float, float]:
        """The largest ``sum_t min_o (cost + lam d + mu h) - lam D - mu H`` over the price grid
        (at least 0), with the prices that give it."""
        dev, host, D, H, lams, mus = terms
        best, best_lam, best_mu = 0.0, 0.0, 0.0
        for lam in lams:
            base = cost + lam * dev  # (O, T)
            value = (base[None] + mus[:, None, None] * host[None]).min(axis=1).sum(axis=1) - lam * D - mus * H
            j = int(np.argmax(value))
            if float(value[j]) > best:
                best, best_lam, best_mu = float(value[j]), float(lam), float(mus[j])
        return best, best_lam, best_mu

    def memory_shard_bound(self, points: int = 25) -> float:
        """``memory_bound`` and ``flat_bound`` combined: a plan with slowest rank ``M`` uses only
        options whose shard time is ``<= M`` and fits the cluster's memory, so its summed totals
        are at least the memory bound's Lagrangian over those options alone; ``M`` is at least
        ``min over tau of max(tau, g(tau))``, ``g(tau)`` that Lagrangian (best over the same grid
        of prices) over options with shard time ``<= tau``, divided by ``W``. ``g`` is
        non-increasing (fewer options, each price's minimum only grows), so a binary search over
        the shard times finds the minimum, as in ``flat_bound``. Never below either bound (the
        grid holds price 0, and ``tau`` ranges up to every option); tighter where memory forces
        slow options and the fast ones have large shards (12T on 128 ranks). Costs about 15
        memory bounds: used for the reported ``step_bound``, not inside the search.
        """
        shard = np.where(self.usable, np.stack([o.shard_time for o in self.opts]), np.inf)
        total = np.where(self.usable, self.total, np.inf)
        if not np.isfinite(total).any(axis=0).all():
            return 0.0
        terms = self._memory_terms(total, points)

        def g(tau: float) -> float:
            cost = np.where(shard <= tau, total, np.inf)
            if not np.isfinite(cost).any(axis=0).all():
                return float("inf")
            return self._lagrangian(cost, terms)[0] / self.W

        return _min_max_over_shard_times(shard, g)

    def all_rank_bound(self, max_points: int = 2048, chunk: int = 64) -> float:
        """Bound that charges the shards of every-rank options (DP, RW) to the slowest rank.

        In a plan with slowest rank ``M``, let ``A`` be the tables on every-rank options and
        ``s*`` the largest shard of the other tables: the rank holding ``s*`` also holds one
        shard of every table in ``A``, so ``M >= s* + sum_A shard``; and ``M >= sum_A shard +
        sum_(not A) total / W``. With ``x_t`` a table's smallest every-rank shard and
        ``c_t(tau)`` its cheapest other total with shard ``<= tau``, over ``W``, ``M`` is at
        least ``min over tau`` of the fractional optimum of ``sum_A x_t + max(tau, sum_(not A)
        c_t)``, solved per ``tau`` by taking tables out of ``A`` in order of ``x_t / c_t``. The
        ``tau`` are the shard times of the other options; past ``max_points`` of them, a
        coarser grid takes ``tau`` at an interval's left end and ``c`` at its right (still valid).
        """
        every = np.array([o.unit == ALL for o in self.opts])
        shard = np.where(self.usable, self.shard_times, np.inf)
        total = np.where(self.usable, self.total, np.inf) / self.W
        if not every.any() or not np.isfinite(shard).any():
            return 0.0
        x = shard[every].min(axis=0)  # (T,) inf when the table has no every-rank option
        other_shard, other_total = shard[~every], total[~every]
        points = np.unique(other_shard[np.isfinite(other_shard)])
        points = np.concatenate(([0.0], points))
        if len(points) > max_points:  # intervals [lo, hi): tau >= lo, c(tau) >= c(hi)
            idx = np.unique(np.linspace(0, len(points) - 1, max_points).astype(np.int64))
            lo = points[idx]
            hi = np.concatenate((points[idx[1:]], [np.inf]))
        else:
            lo = hi = points
        best = np.inf
        fx = np.isfinite(x)
        for start in range(0, len(lo), chunk):  # the taus in order, ``chunk`` at a time
            if lo[start] >= best:  # the bound at tau is at least tau
                break
            tau, tau_c = lo[start : start + chunk], hi[start : start + chunk]
            best = min(best, self._all_rank_values(x, fx, other_shard, other_total, tau, tau_c))
        return float(best) if np.isfinite(best) else 0.0

    @staticmethod
    def _all_rank_values(
        x: np.ndarray, fx: np.ndarray, other_shard: np.ndarray, other_total: np.ndarray, tau: np.ndarray,
        tau_c: np.ndarray,
    ) -> float:
        """``all_rank_bound``'s least value over the points ``tau`` (``c`` read at ``tau_c``),
        all at once: per point, the tables forced onto every-rank options or off them, and the
        fractional optimum over the free ones (in order of ``x / c``; inf where a table has
        neither)."""
        P, T = len(tau), len(x)
        if len(other_shard):
            c = np.where(other_shard[None] <= tau_c[:, None, None], other_total[None], np.inf).min(axis=1)
        else:
            c = np.full((P, T), np.inf)
        fc = np.isfinite(c)
        ok = (fx[None] | fc).all(axis=1)
        free = fx[None] & fc
        forced_all = np.where(~fc & fx[None], x[None], 0.0).sum(axis=1)
        forced_other = np.where(~fx[None] & fc, c, 0.0).sum(axis=1)
        xf = np.where(free, x[None], 0.0)
        cf = np.where(free, np.maximum(c, 1e-300), 0.0)
        ratio = np.where(free, xf / np.where(free, cf, 1.0), 0.0)
        order = np.argsort(-ratio, axis=1, kind="stable")
        xf, cf, ratio = (np.take_along_axis(a, order, axis=1) for a in (xf, cf, ratio))
        room = np.maximum(tau - forced_other, 0.0)
        before = np.cumsum(cf, axis=1) - cf
        inside = np.clip(room[:, None] - before, 0.0, cf)
        gain = (ratio * inside).sum(axis=1) + (np.maximum(ratio - 1.0, 0.0) * (cf - inside)).sum(axis=1)
        value = forced_all + xf.sum(axis=1) + np.maximum(tau, forced_other) - gain
        value = np.where(ok, value, np.inf)
        return float(value.min()) if P else float("inf")

    def flat_bound(self) -> float:
        """A bound no plan over these options can beat (see docs/cost_model.md).

        In any plan with slowest rank ``M`` every chosen option has a shard time ``<= M``
        (the shard sits on some rank) and the chosen totals sum to ``<= W M``. So
        ``M >= min over tau of max(tau, f(tau))`` with ``f(tau)`` the sum over tables of the
        cheapest total among options whose shard time is ``<= tau``, divided by ``W``.
        ``f`` is a non-increasing step function of ``tau``: a binary search over the shard
        times finds the minimum. It is never below ``max(mean, largest single shard)``.
        """
        shard = np.where(self.usable, np.stack([o.shard_time for o in self.opts]), np.inf)
        total = np.where(self.usable, self.total, np.inf)
        has = np.isfinite(shard).any(axis=0)
        if not has.any():
            return 0.0
        shard, total = shard[:, has], total[:, has]

        def f(tau: float) -> float:
            return float(np.where(shard <= tau, total, np.inf).min(axis=0).sum()) / self.W

        return _min_max_over_shard_times(shard, f)

    def least_cache_bytes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each option's device bytes per table at the least cache load factor (one set of 32
        slots a shard: what a cached shard keeps whatever the factor), as (whole table, one
        shard); options on device as they are. None without a cache. For a refusal that would
        ask for a lower load factor."""
        if self.model.cache_load_factor is None:
            return None
        if self._least_cache is None:
            tiny = copy.copy(self.model)
            tiny.cache_load_factor = 1e-12
            shard = np.stack([
                np.where(o.valid, tiny.costs(self.t, o.sharding_type, o.k, CACHED).mem_device
                         if o.placement == CACHED else o.cost.mem_device, np.inf)
                for o in self.opts])
            whole = shard * np.array([o.num_shards for o in self.opts], dtype=np.float64)[:, None]
            self._least_cache = (whole, shard)
        return self._least_cache

    def cache_bound(self, i: int | None = None) -> float | None:
        """The largest cache load factor at which memory bounds let the tables fit device
        memory (table ``i``: also a shard of it fit one rank), from each option's bytes at the
        current factor and at the least (``least_cache_bytes``; bytes grow linearly with the
        factor between them); None without a cache, 0.0 where no factor fits."""
        least = self.least_cache_bytes()
        if least is None:
            return None
        lf = float(self.model.cache_load_factor)
        now_whole = np.stack([np.where(o.valid, o.cost.mem_device * o.num_shards, np.inf) for o in self.opts])
        low_total = float(np.where(np.isfinite(m := least[0].min(axis=0)), m, 0.0).sum())
        now_total = float(np.where(np.isfinite(m := now_whole.min(axis=0)), m, 0.0).sum())
        D = self.cap_dev * self.W
        bound = lf if now_total <= D else (lf * (D - low_total) / (now_total - low_total) if low_total < D else 0.0)
        if i is not None:  # a shard of table i on one rank: the best of its cached options
            fits = [lf if now <= self.cap_dev else lf * (self.cap_dev - low) / (now - low)
                    for o, low in zip(self.opts, least[1][:, i])
                    if o.placement == CACHED and o.valid[i] and low < self.cap_dev
                    for now in (float(o.cost.mem_device[i]),)]
            bound = min(bound, max(fits, default=0.0))
        return bound

    def _fits_at_least_cache(self, i: int) -> bool:
        """Whether, at the least cache load factor, the tables placed so far would leave room
        for a shard of table ``i`` (as many ranks as its option has shards) on device memory."""
        least = self.least_cache_bytes()
        if least is None:
            return False
        used = np.zeros(self.W)
        for j in np.flatnonzero(self.choice >= 0).tolist():
            if j != i:
                np.add.at(used, np.asarray(self.ranks[j]), least[1][self.choice[j], j])
        free = np.sort(self.cap_dev - used)[::-1]
        # a cached shard's host bytes (the whole rows) do not shrink with the load factor: its
        # nodes must hold them as they are
        free_host = np.sort(self.cap_node - self._node_host())[::-1]
        return any(o.valid[i] and least[1][r, i] <= free[min(o.num_shards, self.W) - 1]
                   and o.cost.mem_host[i] * o.per_node(self.L, self.N) <= free_host[o.nodes_needed(self.N) - 1]
                   for r, o in enumerate(self.opts))

    def no_fit_error(self, i: int) -> PlanningError:
        name = self.t.names[i]
        free_dev = np.sort(self.cap_dev - self.mem_dev)[::-1]  # most free first
        free_host = np.sort(self.cap_node - self._node_host())[::-1]  # per node, most free first
        best: tuple[float, str, str] | None = None
        for opt in self.opts:
            if not opt.valid[i]:
                continue
            k = min(opt.num_shards, self.W)  # the k-th freest rank must hold a shard
            short, where = opt.cost.mem_device[i] - free_dev[k - 1], "device"
            # the nodes_needed-th freest node must hold per_node shards' host bytes
            host = opt.cost.mem_host[i] * opt.per_node(self.L, self.N) - free_host[opt.nodes_needed(self.N) - 1]
            if opt.cost.mem_host[i] > 0 and host > short:
                short, where = host, "host"
            if best is None or short < best[0]:
                best = (float(short), opt.label, where)
        short, label, where = best if best else (0.0, "?", "device")
        rows, dim = int(self.t.rows[i]), int(self.t.dims[i])
        topology = self.model.context.topology
        on_gpu = topology.compute_device == "cuda"
        memory = f"{where} memory" if on_gpu else "memory"
        if short > 0:
            why = (f"even as {label} a shard needs {short:,.0f} bytes ({human_bytes(short)}) more {memory} "
                   f"than the {'nodes' if where == 'host' else 'ranks'} have left")
        else:  # enough room on enough ranks, but not on ranks a shard pattern can take together
            why = (
                f"even as {label} its shards would fit on the freest ranks, but not on ranks it can take "
                "together (TWRW and TWCW keep a table in one node; GRID row-splits each column block "
                "within one node; the cached shards a node takes share its host memory)"
            )
        # one batch's ids and pooled rows, on the ranks' device memory with the tables placed so
        # far: where they fill half of it, the batch per rank is the lever. With the batch per
        # rank held, more ranks keep (DP) or grow (TW: the global batch) each shard's buffers,
        # and a cache holds table rows, not those.
        placed = [(j, c) for j, c in enumerate(self.choice) if c >= 0 and j != i]
        batch_held = sum(float(self.opts[c].cost.batch[j]) * self.opts[c].num_shards for j, c in placed)
        used = float(self.mem_dev.sum())
        batch_bound = where == "device" and short > 0 and used > 0 and batch_held >= 0.5 * used
        context = self.model.context
        fixes = [topology.memory_fix or f"add ranks or {memory if short > 0 else 'memory'}"]
        nodes: Setting | None = ("num_nodes", self.W + self.L)
        if batch_bound:
            held = human_bytes(batch_held / self.W)
            per_rank = f"{context.batch_size_per_rank:,} samples per rank"
            if context.global_batch or batch_held / self.W < self.cap_dev:
                # more ranks may still help: they spread the tables (and a global batch)
                fixes.insert(0, f"lower the batch ({held} of each rank's device memory is one batch's ids and "
                                f"pooled rows at {per_rank}; {batch_keys(context)})")
            else:  # the batch alone overfills a rank, and its share stays with more ranks
                fixes = [f"lower the batch per rank ({held} of each rank's device memory is one batch's ids and "
                         f"pooled rows at {per_rank}, which more ranks do not shrink; {batch_keys(context)})",
                         f"give each rank more {memory}"]
                nodes = None
        # what the planner may check by planning: a node more, or the memory short by ``short``
        memory_setting: Setting | None = None
        if short > 0 and where == "device":
            memory_setting = ("device_memory", (self.cap_dev + short) / (1 - self.model.params.reserve_fraction))
        elif short > 0:
            memory_setting = ("host_memory", (self.cap_node + short) / self.L
                              / (1 - self.model.params.host_reserve_fraction))
        # a shard short of device memory whose cached option fits the devices but not its
        # nodes' host memory: more host memory places it too
        host_setting: Setting | None = None
        cached_short = [
            float(o.cost.mem_host[i] * o.per_node(self.L, self.N) - free_host[o.nodes_needed(self.N) - 1])
            for o in self.opts
            if o.valid[i] and o.placement == CACHED and o.cost.mem_device[i] <= free_dev[min(o.num_shards, self.W) - 1]
        ]
        if short > 0 and where == "device" and cached_short and min(cached_short) > 0:
            host_setting = ("host_memory", (self.cap_node + min(cached_short)) / self.L
                            / (1 - self.model.params.host_reserve_fraction))
            if not topology.memory_fix:
                fixes[-1] = f"add ranks, {memory}, or host memory to hold it behind the cache"
        groups = setting_groups(topology, [nodes, memory_setting, host_setting])[0]
        named = NamedSettings(fixes[-1], fixes[-1], groups) if groups else None
        # a cache applies on GPUs, to device memory, for a table that may be sharded (not DP only)
        shardable = any(
            self.usable[j, i] and o.sharding_type is not ShardingType.DATA_PARALLEL for j, o in enumerate(self.opts)
        )
        if on_gpu and shardable and (where == "device" or short <= 0) and not batch_bound:
            if self.model.cache_load_factor is None:
                fixes.append("use a cache (e.g. cache=lru cache.load_factor=0.05)")
            elif self._fits_at_least_cache(i):  # not where the per-row state alone leaves it no room
                fixes.append(f"lower the cache load_factor (now {self.model.cache_load_factor:g})")
        if self.model.host_reserve and (where == "host" or short <= 0):
            fixes.append(f"lower sharding.host_reserve_fraction (now {self.model.params.host_reserve_fraction:g})")
        return planning_error(
            f"Table {name!r} ({rows:,} rows x {dim}) fits on no rank once the larger tables are "
            f"placed: {why}; {', '.join(fixes)}, or shrink the tables.",
            named,
        )
