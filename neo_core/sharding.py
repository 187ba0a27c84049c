"""Sharding planners: which sharding type each embedding table gets and where its shards go.

A sharding plugin's factory returns a :class:`Planner`. The planner turns table specs and a
:class:`PlanningContext` into a :class:`PlanResult`: a TorchRec ``ShardingPlan`` that
``DistributedModelParallel`` executes, plus a per-table and per-rank report.
"""

from __future__ import annotations

import abc
import difflib
import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from neo_core.checks import counted
from neo_core.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from neo_core.cache import CachePolicy
    from neo_core.compression import Compressor
    from neo_core.kernels import EmbeddingKernel
    from neo_core.topology import Topology


class ShardingType(str, enum.Enum):
    """The seven ways TorchRec can split a table; values are TorchRec's own names."""

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"

    @property
    def short(self) -> str:
        return _SHORT[self]

    @classmethod
    def parse(cls, value: str) -> ShardingType:
        """Accept TorchRec names ("row_wise"), short names ("RW") and members."""
        if isinstance(value, cls):
            return value
        text = str(value).strip()
        for member in cls:
            if text.lower() == member.value or text.upper() == member.short:
                return member
        choices = ", ".join(f"{m.short} ({m.value})" for m in cls)
        raise ConfigError(f"Unknown sharding type {value!r}; choose one of {choices}.")


_SHORT = {
    ShardingType.DATA_PARALLEL: "DP",
    ShardingType.TABLE_WISE: "TW",
    ShardingType.COLUMN_WISE: "CW",
    ShardingType.ROW_WISE: "RW",
    ShardingType.TABLE_ROW_WISE: "TWRW",
    ShardingType.TABLE_COLUMN_WISE: "TWCW",
    ShardingType.GRID_SHARD: "GRID",
}


# the topology's figures a plan's text shows (PlanResult.topology_summary), which it marks where assumed
_SUMMARY_FIGURES = ("device_memory", "host_memory", "intra_node_bw", "inter_node_bw")

# the most ids per sample a feature is taken to read (MLPerf's largest multi-hot is 100, the
# production-like tables' 500): above it a pooling factor is a slip of units, not a feature
MAX_POOLING = 1_000_000


def _names_what_is_missing(cls: type) -> type:
    """``cls`` (a dataclass) whose ``__init__`` refuses a table made without a field it needs, or
    with a field it has not, by a :class:`ConfigError` naming the table, the field and an example
    (Python's own TypeError named neither the table nor what the field is)."""
    import dataclasses
    import functools

    init = cls.__init__
    fields = [f.name for f in dataclasses.fields(cls)]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    meaning = {"num_embeddings": " (its rows)", "embedding_dim": " (the width of each row)"}

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        missing = [f for f in required[len(args):] if f not in kwargs]
        unknown = [k for k in kwargs if k not in fields]
        if missing or unknown:
            given = dict(zip(fields, args), **{k: v for k, v in kwargs.items() if k in fields})
            name = given.get("name")
            example = (f"TableSpec({name if 'name' in given else 'user_id'!r}, {given.get('num_embeddings', 1_000_000)!r}, "
                       f"{given.get('embedding_dim', 64)!r})")
            who = f"Table {name!r}" if "name" in given else "A table"
            if unknown:
                close = difflib.get_close_matches(unknown[0], fields, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{who} has no field {unknown[0]!r}{hint}; a table's fields: {', '.join(fields)}.")
            said = " or ".join(f"{f}{meaning.get(f, '')}" for f in missing)
            raise ConfigError(f"{who} has no {said}; give {'it' if len(missing) == 1 else 'them'}, e.g. {example}.")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@_names_what_is_missing
@dataclass(frozen=True)
class TableSpec:
    """One embedding table as the planner sees it (no weights are allocated)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0  # mean ids per sample of each feature that reads the table
    feature_names: tuple[str, ...] = ()
    # Fraction of lookups that hit the hottest 1% of rows (None: unknown / uniform).
    hot_fraction: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"Every table needs a non-empty name (a string); got {self.name!r}.")
        if "." in self.name:  # TorchRec makes each table a torch module, named after it
            raise ConfigError(
                f"Table {self.name!r}: a table name cannot contain '.' (TorchRec holds each table as a torch "
                f"module named after it, and module names cannot); rename it, e.g. {self.name.replace('.', '_')!r}."
            )
        from numbers import Real

        from neo_core.checks import as_whole

        for key in ("num_embeddings", "embedding_dim"):  # numpy integers and 1e7 too, stored as int
            value = getattr(self, key)
            if as_whole(value) is None:
                raise ConfigError(
                    f"Table {self.name!r} has {key} {value!r} of type {type(value).__name__}; "
                    "it must be a whole number (an int)."
                )
            object.__setattr__(self, key, as_whole(value))
        if self.num_embeddings < 1:
            raise ConfigError(
                f"Table {self.name!r} has {self.num_embeddings!r} rows; a table needs at least 1 row."
            )
        if self.embedding_dim < 1:
            raise ConfigError(
                f"Table {self.name!r} has embedding_dim {self.embedding_dim!r}; it must be a "
                "positive integer."
            )
        if self.num_embeddings >= 2**62:  # ids are int64; the cost model multiplies rows by bytes
            raise ConfigError(
                f"Table {self.name!r} has {self.num_embeddings:,} rows; ids are 64-bit, so a table "
                "holds fewer than 2**62 rows."
            )
        for key in ("pooling_factor", "hot_fraction"):
            value = getattr(self, key)
            if (value is not None or key == "pooling_factor") and (
                isinstance(value, bool) or not isinstance(value, Real)
            ):
                raise ConfigError(f"Table {self.name!r} has {key} {value!r}; it must be a number.")
            if value is not None and type(value) is not float:  # numpy's float32 too: plan.json writes floats
                object.__setattr__(self, key, float(value))
        if not self.pooling_factor > 0 or math.isinf(self.pooling_factor):
            raise ConfigError(
                f"Table {self.name!r} has pooling_factor {self.pooling_factor!r}; it must be "
                "a positive number."
            )
        if self.pooling_factor > MAX_POOLING:  # refused later as a table "larger than the cluster"
            raise ConfigError(
                f"Table {self.name!r} has pooling_factor {self.pooling_factor:g}: it is the mean ids one sample "
                f"looks up in each feature of the table, and more than {MAX_POOLING:,.0f} is no feature's (a total "
                "over a batch or a dataset? divide it by the samples)."
            )
        if self.hot_fraction is not None and not 0.01 <= self.hot_fraction <= 1.0:
            # the hottest 1% of rows take at least 1% of the lookups (0.01: uniform access)
            hint = (f" (a percentage? {self.hot_fraction:g}% is {self.hot_fraction / 100:g})"
                    if 1.0 < self.hot_fraction <= 100.0 else "")
            raise ConfigError(
                f"Table {self.name!r} has hot_fraction {self.hot_fraction!r}; it is the share of lookups that hit "
                f"the hottest 1% of rows, so it lies in [0.01, 1] (0.01: uniform access){hint}."
            )
        names = self.feature_names
        if isinstance(names, str):  # one name, not its characters
            names = (names,)
        names = tuple(names) if isinstance(names, Iterable) and not isinstance(names, (bytes, Mapping)) else None
        if names is None or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(
                f"Table {self.name!r} has feature_names {self.feature_names!r}; give a feature name (a string) "
                "or a list of them."
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"Table {self.name!r} lists a feature twice in feature_names {list(names)}.")
        object.__setattr__(self, "feature_names", names or (f"f_{self.name}",))

    @property
    def num_parameters(self) -> int:
        return self.num_embeddings * self.embedding_dim



def check_table_specs(tables: Sequence[Any]) -> None:
    """Every table a :class:`TableSpec` (a planner reads their fields)."""
    bad = [t for t in tables if not isinstance(t, TableSpec)]
    if bad:
        raise ConfigError(f"Tables must be neo_core.sharding.TableSpec objects, got {type(bad[0]).__name__}.")


def check_table_names(tables: Sequence[TableSpec], where_of: Callable[[int], str] | None = None) -> None:
    """Each table name once, and each feature read by one table (TorchRec's bag collections
    key their input by feature); ``where_of(n)`` names the n-th table (``tables[n]``)."""
    names = [t.name for t in tables]
    dupes = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
    if dupes:
        where_of = where_of or (lambda k: f"tables[{k}]")
        where = "; ".join(f"{n!r} is {', '.join(where_of(k) for k, m in enumerate(names) if m == n)}" for n in dupes)
        raise ConfigError(f"Table names must be unique (a name keys its table's plan entry): {where}; rename "
                          "all but one of each.")
    readers: dict[str, str] = {}
    for t in tables:
        for feature in t.feature_names:
            if feature in readers:
                raise ConfigError(
                    f"Feature {feature!r} is read by tables {readers[feature]!r} and {t.name!r}; each feature "
                    "feeds one table (give them their own feature_names)."
                )
            readers[feature] = t.name


@dataclass(frozen=True)
class PlanningContext:
    """Everything besides the tables that a plan depends on."""

    topology: Topology
    batch_size_per_rank: int
    kernel: EmbeddingKernel
    compressor: Compressor
    cache: CachePolicy
    # the global batch the batch per rank was divided from (recipes/plan.py's table sets), so
    # that on more or fewer ranks it is divided again; None: the batch per rank is held (training)
    global_batch: int | None = None


def plan_settings(context: PlanningContext) -> dict[str, Any]:
    """What a plan's figures assume besides the tables and the topology (plan.json's
    ``settings``)."""
    return {
        "optimizer": context.kernel.optimizer.value,
        "weight_bytes": context.kernel.weight_bytes,
        "kernel": context.kernel.name,
        "compression": {"name": context.compressor.name, "forward": context.compressor.forward_precision,
                        "backward": context.compressor.backward_precision},
        # eviction and prefetch only where something is cached (a load factor)
        "cache": {"name": context.cache.name,
                  "algorithm": context.cache.algorithm if context.cache.load_factor is not None else None,
                  "load_factor": context.cache.load_factor,
                  "prefetch_pipeline": bool(context.cache.prefetch_pipeline and context.cache.load_factor is not None)},
    }


def settings_note(context: PlanningContext) -> str:
    """The plan note naming what the plan was made for: kernel, compression and cache."""
    cache = context.cache
    share = ""
    # FBGEMM's cache evicts by LRU or LFU: a policy of another name says which of the two it is
    evicts = f"{cache.algorithm.upper()} eviction, " if cache.name.lower() not in ("lru", "lfu", "none") else ""
    if cache.load_factor:
        prefetch = ", prefetch pipeline" if cache.prefetch_pipeline else ""
        share = f" ({evicts}load factor {cache.load_factor}{prefetch})"
    elif cache.name != "none" and context.topology.compute_device == "cuda" and not context.kernel.data_parallel_only:
        share = " (no load_factor: nothing is cached; give one, e.g. 0.2)"
    weights = {4: "fp32", 2: "fp16", 1: "int8"}.get(context.kernel.weight_bytes, f"{context.kernel.weight_bytes}-byte")
    return (
        f"kernel {context.kernel.name} ({context.kernel.optimizer.value}, {weights} weights), "
        f"compression {context.compressor.name} "
        f"({context.compressor.forward_precision}/{context.compressor.backward_precision}), cache {cache.name}{share}"
    )


@dataclass
class TableAssignment:
    """Where one table went and why."""

    name: str
    sharding_type: str  # ShardingType value
    compute_kernel: str  # TorchRec EmbeddingComputeKernel value
    ranks: list[int]
    shard_shapes: list[tuple[int, int]] = field(default_factory=list)  # (rows, cols) per shard
    why: str = ""
    # of a table in host memory behind the device cache (``fused_uvm_caching``): the share of its
    # lookups the cost model predicts the cache serves (0-1), which its times assume; None for a
    # table not cached, or where the plan's times are not Neo's cost model's
    predicted_hit_rate: float | None = None
    # the table as planned (num_embeddings, embedding_dim, pooling_factor, hot_fraction), so a
    # plan.json can be checked on its own; filled by check_plan where a planner leaves it out
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankReport:
    """Predicted load of one rank: memory by kind (bytes) and time by kind (seconds)."""

    rank: int
    memory: dict[str, float] = field(default_factory=dict)
    memory_capacity: float = 0.0
    time: dict[str, float] = field(default_factory=dict)
    # Host memory (bytes) of tables kept in host DDR behind a device cache; empty when unused.
    host_memory: dict[str, float] = field(default_factory=dict)
    host_memory_capacity: float = 0.0
    # Predicted bytes this rank sends per step, by "intra_node" / "inter_node"; empty when unknown.
    comm_bytes: dict[str, float] = field(default_factory=dict)
    # Predicted bytes its cached shards move over its host link per step (rows the cache missed
    # read in, evicted rows written back, element-wise optimizer state); None where no table is
    # cached or the plan's times are not Neo's cost model's.
    host_link_bytes: float | None = None

    @property
    def memory_total(self) -> float:
        return float(sum(self.memory.values()))

    @property
    def time_total(self) -> float:
        return float(sum(self.time.values()))


@dataclass
class PlanResult:
    """A plan: the TorchRec ``ShardingPlan`` to execute and the report that explains it."""

    planner: str
    tables: list[TableAssignment]
    ranks: list[RankReport]
    batch_size_per_rank: int
    topology: dict[str, Any]
    torchrec_plan: Any = None  # torchrec.distributed.types.ShardingPlan when built for a model
    # the TorchRec sharders that execute it (neo_core.api.plan_model): DMP's sharders=
    torchrec_sharders: Any = None
    # what the plan's figures assume besides the tables and topology: the kernel's optimizer
    # and bytes per weight, the compressor's precisions, the cache (filled by check_plan)
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # whose cost model gave the predicted times ("Neo's cost model", "TorchRec's estimator"); plans
    # are compared on one scale only. Empty: the planner plugin did not say.
    times_from: str = ""

    def __repr__(self) -> str:  # the dataclass's own ran to hundreds of KB on a large plan
        return (
            f"PlanResult(planner={self.planner!r}, {counted(len(self.tables), 'table')}, "
            f"{counted(len(self.ranks), 'rank')}, predicted step {self.predicted_step_time * 1e3:.3f} ms, "
            f"{self.types_note()}; .format_text() or print() shows it)"
        )

    def __str__(self) -> str:
        return self.format_text()

    def devices_per_node(self) -> int:
        """Ranks per node, as the plan's topology says (1 where it does not)."""
        return int(self.topology.get("devices_per_node") or 1)

    def _assumed_shown(self) -> set[str]:
        """The figures of :meth:`topology_summary` that the plan's topology lists as assumed
        (plan.json's ``topology.assumed``; none in a plan written before it kept them)."""
        listed = self.topology.get("assumed")
        listed = listed if isinstance(listed, (list, tuple)) else ()
        return {key for key in _SUMMARY_FIGURES if key in listed}

    def topology_summary(self) -> str:
        """The cluster the plan is for, in one line ("" where the plan does not say): plans of
        several what-if clusters side by side are told apart by it. Assumed figures are marked
        '*', as :meth:`Topology.describe` marks them (:meth:`assumed_note` is the key)."""
        from neo_core.topology import gbps

        t = self.topology
        assumed = self._assumed_shown()

        def mark(key: str) -> str:
            return "*" if key in assumed else ""

        try:
            shape = (f"{t['name']}: {int(t['num_nodes'])} node(s) x {int(t['devices_per_node'])} "
                     f"{t.get('compute_device', '')} rank(s)").replace("  ", " ")
            memory = (f"device memory {float(t['device_memory']) / 2**30:.1f} GiB{mark('device_memory')}, host "
                      f"{float(t['host_memory']) / 2**30:.1f} GiB{mark('host_memory')} per rank")
            links = (f"intra-node {gbps(float(t['intra_node_bw']))} GB/s{mark('intra_node_bw')}, inter-node "
                     f"{gbps(float(t['inter_node_bw']))} GB/s{mark('inter_node_bw')} per rank")
        except (KeyError, TypeError, ValueError):
            return ""
        emulated = f", emulating {t['emulated_from']}" if t.get("emulated_from") else ""
        return f"{shape}{emulated}; {memory}; {links}"

    def assumed_note(self) -> str:
        """The key to :meth:`topology_summary`'s '*' marks, with how to measure the figures
        where Neo can (``neo calibrate`` on this machine's CPU ranks); "" where none is marked."""
        if not self._assumed_shown() or not self.topology_summary():
            return ""
        from neo_core.topology import assumed_note

        return assumed_note(str(self.topology.get("name")), str(self.topology.get("compute_device")))

    def node_host_memory(self, per_node: int | None = None) -> tuple[dict[int, float], dict[int, float]]:
        """Host memory used and offered per node (a node's ranks share it): two dicts by node,
        of ``per_node`` ranks each (by default the plan's topology's)."""
        per_node = per_node or self.devices_per_node()
        used: dict[int, float] = {}
        cap: dict[int, float] = {}
        for r in self.ranks:
            n = int(r.rank) // per_node
            used[n] = used.get(n, 0.0) + sum(r.host_memory.values())
            cap[n] = cap.get(n, 0.0) + r.host_memory_capacity
        return used, cap

    def fullest_node(self) -> tuple[int, float, float]:
        """The node whose host memory is fullest, as a share of its own: its number, the bytes
        its ranks hold there and the node's capacity (the lowest such node)."""
        used, cap = self.node_host_memory()
        node = max(used, key=lambda n: (used[n] / cap[n] if cap[n] else 0.0, -n))
        return node, used[node], cap[node]

    def table(self, name: str) -> TableAssignment:
        """The assignment of the table called ``name``."""
        for t in self.tables:
            if t.name == name:
                return t
        from neo_core.errors import ConfigError

        close = difflib.get_close_matches(name, [t.name for t in self.tables], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"The plan has no table {name!r}.{hint} It has {counted(len(self.tables), 'table')}.")

    @property
    def predicted_step_time(self) -> float:
        return max((r.time_total for r in self.ranks), default=0.0)

    @property
    def imbalance(self) -> float:
        """Slowest rank over mean rank time (1.0 is perfectly balanced)."""
        times = [r.time_total for r in self.ranks]
        mean = sum(times) / len(times) if times else 0.0
        return max(times) / mean if mean > 0 else 1.0

    @property
    def predicted_samples_per_second(self) -> float:
        step = self.predicted_step_time
        world = len(self.ranks)
        return self.batch_size_per_rank * world / step if step > 0 else math.inf

    @property
    def cached_tables(self) -> int:
        """How many tables the plan puts in host memory behind the device cache."""
        return sum(t.compute_kernel == "fused_uvm_caching" for t in self.tables)

    def busiest_inter_node(self) -> tuple[int, float]:
        """The rank that sends the most bytes across nodes per step, and those bytes (the lowest
        such rank; 0.0 where the plan predicts none). A rank's inter-node bytes go through its
        own link, so a slower network is felt by this rank; hierarchical types spread a table's
        share over its node's ranks where TW sends it all from one."""
        busiest = max(self.ranks, key=lambda r: (r.comm_bytes.get("inter_node", 0.0), -int(r.rank)))
        return int(busiest.rank), float(busiest.comm_bytes.get("inter_node", 0.0))

    def types_note(self) -> str:
        """The plan note counting its tables by sharding type: ``types: DP 3, TW 20``."""
        counts: dict[str, int] = {}
        for table in self.tables:
            short = ShardingType(table.sharding_type).short
            counts[short] = counts.get(short, 0) + 1
        return "types: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "planner": self.planner,
            "topology": self.topology,
            "batch_size_per_rank": self.batch_size_per_rank,
            "predicted_step_time_s": self.predicted_step_time,
            "predicted_samples_per_second": self.predicted_samples_per_second,
            "imbalance": self.imbalance,
            "times_from": self.times_from,
            "settings": self.settings,
            "tables": [asdict(t) for t in self.tables],
            "ranks": [
                {
                    "rank": r.rank,
                    "memory_bytes": r.memory,
                    "memory_total_bytes": r.memory_total,
                    "memory_capacity_bytes": r.memory_capacity,
                    "time_s": r.time,
                    "time_total_s": r.time_total,
                    "host_memory_bytes": r.host_memory,
                    "host_memory_capacity_bytes": r.host_memory_capacity,
                    "comm_bytes": r.comm_bytes,
                    **({"host_link_bytes": r.host_link_bytes} if r.host_link_bytes is not None else {}),
                }
                for r in self.ranks
            ],
            **({"nodes": self.node_rows()} if self.holds_host_memory else {}),
            "notes": self.notes,
        }

    @property
    def holds_host_memory(self) -> bool:
        """Whether any rank holds host memory (cached tables' weights, their state)."""
        return any(sum(r.host_memory.values()) > 0 for r in self.ranks)

    def node_rows(self) -> list[dict[str, Any]]:
        """Per node, its ranks and the host memory they hold against the node's: a rank's
        ``host_memory_capacity_bytes`` is its share of its node's host memory, which the node's
        ranks share, so one rank may hold more than its share; the node's total is the limit."""
        per_node = self.devices_per_node()
        used, cap = self.node_host_memory(per_node)
        ranks: dict[int, list[int]] = {}
        for r in self.ranks:
            ranks.setdefault(int(r.rank) // per_node, []).append(int(r.rank))
        return [{"node": n, "ranks": sorted(ranks[n]), "host_memory_bytes": used[n],
                 "host_memory_capacity_bytes": cap[n]} for n in sorted(used)]

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load_json(cls, path: str | Path) -> PlanResult:
        """The plan :meth:`save_json` wrote (a training run's ``plan.json``, a dry run's), for
        its text and chart; without TorchRec's ShardingPlan."""
        try:
            data = json.loads(Path(path).read_text())
            plan = cls(
                planner=data["planner"],
                tables=[TableAssignment(**{**t, "shard_shapes": [tuple(s) for s in t["shard_shapes"]]})
                        for t in data["tables"]],
                ranks=[
                    RankReport(
                        rank=r["rank"], memory=r["memory_bytes"], memory_capacity=r["memory_capacity_bytes"],
                        time=r["time_s"], host_memory=r.get("host_memory_bytes", {}),
                        host_memory_capacity=r.get("host_memory_capacity_bytes", 0.0),
                        comm_bytes=r.get("comm_bytes", {}), host_link_bytes=r.get("host_link_bytes"),
                    )
                    for r in data["ranks"]
                ],
                batch_size_per_rank=data["batch_size_per_rank"],
                topology=data["topology"],
                notes=list(data.get("notes", [])),
                times_from=str(data.get("times_from", "")),
                settings=dict(data.get("settings", {})),
            )
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}.") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{path} is not a plan.json that Neo wrote ({type(exc).__name__}: {exc}); give the plan.json of a "
                "training run or of recipes/plan.py."
            ) from None
        return plan.check_fields(path).check_layout(path)

    def check_fields(self, path: str | Path) -> PlanResult:
        """This plan, read from ``path``, with each field of the kind its text and chart read
        (a hand-edited file failed inside them with a Python error); else a ConfigError naming
        the table or rank, the field and its value."""

        def number(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        def whole(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def refuse(where: str, key: str, value: Any, want: str) -> NoReturn:
            raise ConfigError(f"{path}: {where} has {key} {value!r}; it must be {want} (as Neo writes it). Was the "
                              "file edited? Plan again, or mend that field.")

        for t in self.tables:
            where = f"table {t.name!r}"
            if not isinstance(t.name, str):
                refuse("a table", "name", t.name, "a string")
            try:
                t.sharding_type = ShardingType.parse(t.sharding_type).value
            except (ConfigError, TypeError, ValueError):
                refuse(where, "sharding_type", t.sharding_type, "one of " + ", ".join(m.value for m in ShardingType))
            if not isinstance(t.compute_kernel, str):
                refuse(where, "compute_kernel", t.compute_kernel, "a string")
            if not isinstance(t.ranks, list) or not all(whole(r) and r >= 0 for r in t.ranks):
                refuse(where, "ranks", t.ranks, "a list of rank numbers")
            if not all(len(shape) == 2 and all(whole(x) and x >= 0 for x in shape) for shape in t.shard_shapes):
                refuse(where, "shard_shapes", [list(x) for x in t.shard_shapes], "a list of [rows, cols] pairs of whole numbers")
            if t.predicted_hit_rate is not None and not (number(t.predicted_hit_rate) and 0 <= t.predicted_hit_rate <= 1):
                refuse(where, "predicted_hit_rate", t.predicted_hit_rate, "a share from 0 to 1, or null")
        for r in self.ranks:
            if not whole(r.rank) or r.rank < 0:
                refuse("a rank", "rank", r.rank, "a rank number")
            where = f"rank {r.rank}"
            for key, value in (("memory_bytes", r.memory), ("time_s", r.time), ("host_memory_bytes", r.host_memory),
                               ("comm_bytes", r.comm_bytes)):
                if not isinstance(value, dict) or not all(isinstance(k, str) and number(v) for k, v in value.items()):
                    refuse(where, key, value, "a mapping of kinds to numbers")
            for key, value in (("memory_capacity_bytes", r.memory_capacity),
                               ("host_memory_capacity_bytes", r.host_memory_capacity)):
                if not number(value):
                    refuse(where, key, value, "a number of bytes")
            if r.host_link_bytes is not None and not number(r.host_link_bytes):
                refuse(where, "host_link_bytes", r.host_link_bytes, "a number of bytes")
        if not whole(self.batch_size_per_rank):
            refuse("the plan", "batch_size_per_rank", self.batch_size_per_rank, "a whole number")
        return self

    def check_layout(self, path: str | Path) -> PlanResult:
        """This plan, read from ``path`` (its fields of their kinds: :meth:`check_fields`), with
        what the file alone says holding together: its ranks each reported once and as many as
        its topology has, each table once, on those ranks, as its sharding type lays them out
        (``neo_core.torchrec_plan``), with one shard shape per rank that make up the table its
        ``spec`` gives; else a ConfigError naming the file, the table and the problem. Memory
        over capacity is left to :meth:`run_problems`: a what-if edit that is still a plan."""

        def whole(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def refuse(what: str, problem: str) -> NoReturn:
            mend = "that table" if what.startswith("table ") else "the file"
            raise ConfigError(f"{path}: {what} {problem}. Was the file edited? Plan again, or mend {mend}.")

        world = len(self.ranks)
        if not world:
            refuse("the plan", "reports no ranks")
        reported = sorted(r.rank for r in self.ranks)
        if reported != list(range(world)):
            twice = sorted({r for r in reported if reported.count(r) > 1})
            refuse("the plan", f"reports rank {twice[0]} twice" if twice else
                   f"reports ranks {_compact_ranks(reported)}, not each of 0-{world - 1} once")
        t = self.topology
        nodes, per_node, size = t.get("num_nodes"), t.get("devices_per_node"), t.get("world_size")
        shape = whole(nodes) and whole(per_node) and nodes > 0 and per_node > 0
        for said, of in ((size, "world_size"), (nodes * per_node if shape else None, f"{nodes} node(s) x {per_node}")):
            if whole(said) and said != world:
                refuse("the plan", f"reports {counted(world, 'rank')}, but its topology has {said} ({of})")
        ranks = "rank 0" if world == 1 else f"ranks 0-{world - 1}"
        local = per_node if whole(per_node) and per_node > 0 else None  # where the topology says it
        seen: set[str] = set()
        for a in self.tables:
            where = f"table {a.name!r}"
            if a.name in seen:
                refuse(where, "is listed twice")
            seen.add(a.name)
            if not a.ranks:
                refuse(where, "is on no rank")
            if outside := [r for r in a.ranks if r >= world]:
                refuse(where, f"is on rank {outside[0]}, outside the plan's {ranks}")
            stype = ShardingType(a.sharding_type)
            if layout := _layout_problem(stype, list(a.ranks), world, local):
                refuse(where, f"is {stype.short} on ranks {_compact_ranks(a.ranks)}, but {layout}")
            shapes = [tuple(x) for x in a.shard_shapes]
            counts = (1, len(a.ranks)) if stype is ShardingType.DATA_PARALLEL else (len(a.ranks),)
            if shapes and len(shapes) not in counts:
                refuse(where, f"has {counted(len(shapes), 'shard shape')} for {counted(len(a.ranks), 'rank')}; it "
                       "needs one per rank")
            rows, dim = a.spec.get("num_embeddings"), a.spec.get("embedding_dim")
            if shapes and whole(rows) and whole(dim) and not shapes_make_up(a.sharding_type, shapes, rows, dim):
                refuse(where, f"has shard shapes {[list(x) for x in shapes[:4]]}{' ...' if len(shapes) > 4 else ''}, "
                       f"which do not make up its {rows:,} rows x {dim} columns ({stype.short}: "
                       + ("each shard is the whole table)" if stype in (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE)
                          else "its shards add up to the table)"))
        return self

    def run_problems(self) -> list[str]:
        """Why this plan, as its file has it, could not run (each an "it ..." clause): checked as
        :func:`check_plan` checks a planner's plan, against the tables its entries name (their
        ``spec``) and the memory capacities it reports. Empty where nothing is found."""
        import copy

        from neo_core.errors import PlanningError

        problems = []
        if all(a.spec for a in self.tables):
            try:
                tables = [TableSpec(a.name, a.spec["num_embeddings"], a.spec["embedding_dim"],
                                    a.spec.get("pooling_factor") or 1.0, tuple(a.spec.get("feature_names") or ()))
                          for a in self.tables]
            except (ConfigError, KeyError, TypeError) as exc:
                return [f"gives a table a spec Neo cannot read ({exc})"]
        else:  # written before plan.json kept each table's spec: its memory and ranks still checked
            tables = []
        plan = copy.deepcopy(self)
        if not tables:
            plan.tables = []
        try:
            check_plan(plan, tables, len(self.ranks), self.planner)
        except PlanningError as exc:
            problems.append(str(exc).split(": it ", 1)[-1].rstrip("."))
        if none := [r.rank for r in self.ranks if not r.memory_capacity > 0]:
            problems.append(f"reports no device memory capacity for rank {none[0]}")
        return problems

    def slowest_ranks(self, n: int) -> list[RankReport]:
        """The ``n`` ranks with the largest predicted time (ties: the lower rank first)."""
        return sorted(self.ranks, key=lambda r: (-r.time_total, r.rank))[:n]

    def fullest_rank(self) -> RankReport:
        """The rank whose device memory is fullest, as a share of its capacity."""
        return max(self.ranks, key=lambda r: r.memory_total / r.memory_capacity if r.memory_capacity else 0.0)

    def format_text(self, max_tables: int | None = 40, max_ranks: int | None = 32, rest: str | None = None) -> str:
        """The plan as a readable table: per table, then per rank.

        Past ``max_tables`` tables or ``max_ranks`` ranks (``None``: no limit) the text keeps the
        first tables and the slowest ranks, and says how many it left out and where the rest are
        (``rest``, e.g. "plan.json and plan.txt"; by default, how to ask this method for all).
        """
        rest = rest or "format_text(max_tables=None, max_ranks=None) shows all"
        for key, limit in (("max_tables", max_tables), ("max_ranks", max_ranks)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
                raise ConfigError(f"format_text({key}={limit!r}): give a whole number, 0 or more, or None for all.")
        lines = [f"Sharding plan ({self.planner}), {counted(len(self.ranks), 'rank')}"]
        if cluster := self.topology_summary():
            lines.append(f"  for {cluster}")
            if note := self.assumed_note():  # once, beside the figures it marks
                lines.append(f"  {note}")
        kw = max([10, *(len(t.compute_kernel) for t in self.tables)])  # fused_uvm_caching is 17
        rw = max([16, *(len(_compact_ranks(t.ranks)) for t in self.tables)])
        nw = max([24, *(len(t.name) for t in self.tables)])
        lines.append(f"  {'table':<{nw}} {'type':<6} {'kernel':<{kw}} {'ranks':<{rw}} why")
        shown_tables = self.tables if max_tables is None else self.tables[:max_tables]
        for t in shown_tables:
            ranks = _compact_ranks(t.ranks)
            short = ShardingType(t.sharding_type).short
            lines.append(f"  {t.name:<{nw}} {short:<6} {t.compute_kernel:<{kw}} {ranks:<{rw}} {t.why}")
        if len(shown_tables) < len(self.tables):
            lines.append(f"  ... {len(self.tables) - len(shown_tables)} more tables ({rest})")
        has_bytes = any(r.comm_bytes for r in self.ranks)
        has_link = any(r.host_link_bytes is not None for r in self.ranks)  # some table cached
        kinds = list(dict.fromkeys(k for r in self.ranks for k in r.memory))  # device memory by kind
        has_host = self.holds_host_memory
        lines.append(
            f"  device memory by kind: {', '.join(kinds)}; columns 'memory'/'capacity' are their sum and the "
            "device's size, 'free' what is left of it; 'compute' is lookups and the optimizer, 'comm' the "
            + ("collectives with their fixed latency" if any("comm_latency" in r.time for r in self.ranks)
               else "collectives")  # TorchRec's estimator charges no fixed latency
            + ", per step" + ("; 'host' is host memory (weights of cached tables, and their optimizer state unless row-wise), "
                               "'node host' how full its node's host memory is, which its ranks share (a rank may hold "
                               "more than its even share)"
                               if has_host else "")
            + ("; 'intra-node'/'inter-node' are the bytes the rank's shards move per step (their ids, pooled "
               "rows and gradients, charged to the shard's rank as its time is)" if has_bytes else "")
            + ("; 'host link' the bytes its cached tables move over its host link per step (rows the cache missed "
               "read in, evicted rows written back, element-wise optimizer state), part of its compute time"
               if has_link else "")
        )
        lines.append(
            f"  {'rank':<6} " + "".join(f"{k[:10]:>11}" for k in kinds)
            + f" {'memory':>10} {'capacity':>10} {'free':>10}"
            + (f" {'host':>10} {'node host':>10}" if has_host else "")
            + f" {'compute':>10} {'comm':>10} {'total':>10}"
            + (f" {'intra-node':>10} {'inter-node':>10}" if has_bytes else "")
            + (f" {'host link':>10}" if has_link else "")
        )
        if has_host:  # a node's host memory, which its ranks share
            per_node = self.devices_per_node()
            node_used, node_cap = self.node_host_memory(per_node)
        shown_ranks = self.ranks
        if max_ranks is not None and len(self.ranks) > max_ranks:
            slowest = self.slowest_ranks(max_ranks)
            shown_ranks = sorted(slowest, key=lambda r: r.rank)
        for r in shown_ranks:
            compute = _compute_time(r)
            comm = r.time_total - compute
            sent = ""
            if has_bytes:
                sent = (
                    f" {_bytes(r.comm_bytes.get('intra_node', 0.0)):>10}"
                    f" {_bytes(r.comm_bytes.get('inter_node', 0.0)):>10}"
                )
            if has_link:
                sent += f" {_bytes(r.host_link_bytes or 0.0):>10}"
            by_kind = "".join(f"{_bytes(r.memory.get(k, 0.0)):>11}" for k in kinds)
            host = ""
            if has_host:
                node = int(r.rank) // per_node
                fill = f"{100 * node_used[node] / node_cap[node]:.0f}%" if node_cap.get(node) else "-"
                host = f" {_bytes(sum(r.host_memory.values())):>10} {fill:>10}"
            lines.append(
                f"  {r.rank:<6} {by_kind} {_bytes(r.memory_total):>10} {_bytes(r.memory_capacity):>10}"
                f" {_bytes(r.memory_capacity - r.memory_total):>10}{host} "
                f"{compute * 1e3:>8.3f}ms {comm * 1e3:>8.3f}ms {r.time_total * 1e3:>8.3f}ms{sent}"
            )
        if self.ranks:  # where the step and the memory are tightest, whatever the ranks shown
            totals = sorted(r.time_total for r in self.ranks)
            slow = self.slowest_ranks(1)[0]
            compute = _compute_time(slow)
            fullest = self.fullest_rank()
            shown = (f"the {len(shown_ranks)} slowest of {len(self.ranks)} ranks shown ({rest}); "
                     if len(shown_ranks) < len(self.ranks) else "")
            lines.append(
                f"  {'... ' if shown else ''}{shown}slowest rank {slow.rank}: {slow.time_total * 1e3:.3f}ms (compute "
                f"{compute * 1e3:.3f}ms, comm {(slow.time_total - compute) * 1e3:.3f}ms); total min "
                f"{totals[0] * 1e3:.3f}ms, median {totals[len(totals) // 2] * 1e3:.3f}ms, max {totals[-1] * 1e3:.3f}ms; "
                f"fullest device memory: rank {fullest.rank}, {_bytes(fullest.memory_total)} of "
                f"{_bytes(fullest.memory_capacity)} ({_bytes(fullest.memory_capacity - fullest.memory_total)} free)"
            )
        if has_host and self.topology.get("devices_per_node"):  # a plugin's plan may not say its nodes
            node, used_bytes, cap_bytes = self.fullest_node()
            lines.append(
                f"  host memory is a node's, shared by its ranks: fullest node {node}, {_bytes(used_bytes)} "
                f"of {_bytes(cap_bytes)}"
            )
        if has_bytes:
            intra = sum(r.comm_bytes.get("intra_node", 0.0) for r in self.ranks)
            inter = sum(r.comm_bytes.get("inter_node", 0.0) for r in self.ranks)
            rank, most = self.busiest_inter_node()
            lines.append(
                f"  predicted bytes sent per step (all ranks): intra-node {_bytes(intra, 3)}, "
                f"inter-node {_bytes(inter, 3)}"
                + (f"; most inter-node from one rank: {_bytes(most, 3)} (rank {rank})" if inter > 0 else "")
            )
        if has_link:
            link = max(self.ranks, key=lambda r: (r.host_link_bytes or 0.0, -int(r.rank)))
            lines.append(
                f"  predicted bytes over the host links per step (cache misses; all ranks): "
                f"{_bytes(sum(r.host_link_bytes or 0.0 for r in self.ranks), 3)}; most on one rank: "
                f"{_bytes(link.host_link_bytes or 0.0, 3)} (rank {link.rank})"
            )
        lines.append(
            f"  predicted step {self.predicted_step_time * 1e3:.3f} ms, "
            f"{self.predicted_samples_per_second:,.0f} samples/s, imbalance {self.imbalance:.2f} "
            "(slowest rank over the mean)"
            + (f" (times from {self.times_from})" if self.times_from else "")
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


_ROW_SPLIT = ("row_wise", "table_row_wise", "grid_shard")  # reduce-scatter their pooled rows


def context_notes(plan: PlanResult, context: PlanningContext) -> list[str]:
    """What of the run's cache and compressor the plan cannot use, whichever planner made it,
    after what its topology says of its figures (``Topology.notes``: a calibration figure no CPU
    gives, which the console's warning alone left out of plan.txt)."""
    notes = list(context.topology.notes)
    compressor, cache = context.compressor, context.cache
    compressed = {compressor.forward_precision, compressor.backward_precision} != {"fp32"}
    unused = [f"cache {cache.name}"] if cache.load_factor is not None else []
    unused += [f"compression {compressor.name}"] if compressed else []
    all_dp = bool(plan.tables) and all(t.sharding_type == "data_parallel" for t in plan.tables)
    if compressed and context.topology.world_size == 1 and not (context.kernel.data_parallel_only or all_dp):
        notes.append(f"compression {compressor.name} not used: one rank exchanges no pooled embeddings, so "
                     "nothing is sent in reduced precision (its quality effect shows on 2 ranks or more)")
        unused, compressed = [u for u in unused if not u.startswith("compression ")], False
    if unused and (context.kernel.data_parallel_only or all_dp):
        why = (
            f"kernel {context.kernel.name} replicates every table (data parallel)"
            if context.kernel.data_parallel_only
            else "every table is data parallel (replicated)"
        )
        effects = ["no table sits behind a cache"] if cache.load_factor is not None else []
        effects += ["no pooled embeddings are exchanged"] if compressed else []
        notes.append(f"{' and '.join(unused)} not used: {why}, so {' and '.join(effects)}")
        return notes
    if cache.load_factor is not None and context.topology.compute_device != "cuda":
        notes.append(
            f"cache {cache.name} not used: {context.topology.compute_device} ranks have no device "
            "memory apart from host memory, so every table stays in place"
        )
    elif cache.load_factor is not None and plan.tables and not any("caching" in t.compute_kernel for t in plan.tables):
        notes.append(
            f"cache {cache.name} not used: every table was placed in device memory, which is faster; a table goes "
            "to host memory behind the cache only where device memory cannot hold it"
        )
    changed = [
        f"{kind} {asked} is sent as {sent}"
        for kind, asked, sent in (
            ("forward", compressor.forward_precision, compressor.reduce_scatter_forward_precision),
            ("backward", compressor.backward_precision, compressor.reduce_scatter_backward_precision),
        )
        if asked != sent
    ]
    split = [t for t in plan.tables if t.sharding_type in _ROW_SPLIT]
    if changed and split and compressed:
        names = ", ".join(t.name for t in split[:5]) + (f" and {len(split) - 5} more" if len(split) > 5 else "")
        notes.append(
            f"compression {compressor.name}: TorchRec has no fp8 reduce-scatter, so in the row-split "
            f"tables' reduce-scatters ({names}) {' and '.join(changed)} (costed so)"
        )
    return notes


def sent_precision(plan: PlanResult) -> str | None:
    """The precisions, forward/backward, the plan's tables send their pooled embeddings and
    gradients in ("fp16/fp8"); None where the plan does not say (no ``settings``).

    TorchRec has no fp8 reduce-scatter (``Compressor.reduce_scatter_*_precision``): row-split
    tables send another precision in their reduce-scatters, as the plan's note says. Where every
    table that sends anything sends only reduce-scatters (row-wise tables; table-row-wise and
    grid tables on one node) that precision is given ("fp16/bf16"); where tables differ, both
    ("fp16/fp8 (fp16/bf16 in row-split tables' reduce-scatters)"). A plan that sends nothing
    (one rank, every table replicated) gives the precisions asked for: its notes say they are
    not used.
    """
    from neo_core.compression import Compressor

    comp = (plan.settings or {}).get("compression") or {}
    if not comp.get("forward") or not comp.get("backward"):
        return None
    asked = f"{comp['forward']}/{comp['backward']}"
    try:
        compressor = Compressor(str(comp.get("name", "")), comp["forward"], comp["backward"])
    except Exception:  # a precision this version does not know: said as planned
        return asked
    scattered = f"{compressor.reduce_scatter_forward_precision}/{compressor.reduce_scatter_backward_precision}"
    world = len(plan.ranks) or int(plan.topology.get("world_size") or 1)
    sending = [t for t in plan.tables if t.sharding_type != "data_parallel"]
    split = [t for t in sending if t.sharding_type in _ROW_SPLIT]
    if scattered == asked or not split or world <= 1:
        return asked
    # table-row-wise and grid tables send to the other nodes by all-to-all, in the precision asked
    nodes = int(plan.topology.get("num_nodes") or max(1, world // plan.devices_per_node()))
    all_to_all = [t for t in sending if t.sharding_type not in _ROW_SPLIT or (t.sharding_type != "row_wise" and nodes > 1)]
    if not all_to_all:
        return scattered
    return f"{asked} ({scattered} in row-split tables' reduce-scatters)"


def checked_sharders(planner: Planner, context: PlanningContext) -> list[Any]:
    """``planner.sharders(context)``, checked before any rank builds its model with them: a list
    of TorchRec ``ModuleSharder``s with one for the model's ``EmbeddingBagCollection`` (a plugin
    that returned None failed in a traceback, and one that returned [] failed in every rank,
    with a KeyError naming TorchRec's class, not the plugin)."""
    from torchrec.distributed.types import ModuleSharder
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from neo_core.errors import PlanningError

    who = f"Sharding planner {getattr(planner, 'name', type(planner).__name__)!r}"
    sharders = planner.sharders(context)
    fix = ("it must return a list of TorchRec ModuleSharders, one of them for EmbeddingBagCollection "
           "(e.g. [EmbeddingBagCollectionSharder()], from torchrec.distributed.embeddingbag)")
    if not isinstance(sharders, (list, tuple)):
        raise PlanningError(f"{who}: its sharders() returned {type(sharders).__name__}; {fix}.")
    odd = [type(s).__name__ for s in sharders if not isinstance(s, ModuleSharder)]
    if odd:
        raise PlanningError(f"{who}: its sharders() returned {', '.join(odd)}, not a ModuleSharder; {fix}.")
    if not any(issubclass(getattr(s, "module_type", object), EmbeddingBagCollection) for s in sharders):
        found = ", ".join(type(s).__name__ for s in sharders) or "none"
        raise PlanningError(f"{who}: its sharders() returned no sharder for EmbeddingBagCollection (the model's "
                            f"tables; returned: {found}); {fix}.")
    return list(sharders)


def check_plan(
    result: Any, tables: Sequence[TableSpec], world_size: int, planner: str, context: PlanningContext | None = None
) -> PlanResult:
    """``result`` as a plan the ranks can run: a :class:`PlanResult` placing every table once,
    on ranks of this world, reporting every rank once within its memory capacity.

    Neo's planners pass this by construction; a planner plugin's result is checked here
    before any rank builds it (otherwise a missing report gives an infinite step, an unknown
    or doubled table trains silently, and an over-full rank fails only on the device).
    With ``context``, the plan gets the notes of :func:`context_notes` (once).
    """
    from neo_core.errors import PlanningError

    who = f"Sharding planner {planner!r}"
    if not isinstance(result, PlanResult):
        raise PlanningError(f"{who} returned {type(result).__name__}, not a PlanResult; its plan() must return one.")
    refuse_unbuildable(result.tables, tables, world_size, context.topology.devices_per_node if context else None,
                       f"{who} gave a plan that cannot run")
    problems: list[str] = []
    narrow = [f"{a.name} ({c} columns)" for a in result.tables if a.compute_kernel.startswith("fused")
              for c in sorted({int(c) for _, c in a.shard_shapes if int(c) % 4})[:1]]
    if narrow:
        problems.append(f"gives the fused kernel shards whose width is not a multiple of 4, which FBGEMM "
                        f"refuses ({', '.join(narrow[:5])}): use embedding dims that are multiples of 4, or "
                        "Neo's planner (sharding=neo), which replicates such tables")
    if context is not None:  # the topology's memory, whatever capacity a plugin reports (0: not said)
        device_cap, host_cap = float(context.topology.device_memory), float(context.topology.host_memory)
        for r in result.ranks:  # not 0 < capacity <= the topology's (0, negative, NaN): the topology's
            if not 0 < r.memory_capacity <= device_cap:
                r.memory_capacity = device_cap
            if sum(r.host_memory.values()) and not 0 < r.host_memory_capacity <= host_cap:
                r.host_memory_capacity = host_cap
    if odd := [r.rank for r in result.ranks if not all(math.isfinite(v) and v >= 0 for v in
                                                        [*r.memory.values(), *r.host_memory.values()])]:
        problems.append(f"reports memory that is not a number of bytes, 0 or more (rank {odd[0]})")
    reported = sorted(int(r.rank) for r in result.ranks)
    if reported != list(range(world_size)):
        problems.append(f"reports ranks {_compact_ranks(reported) if reported else 'none'}, not each of the "
                        f"{world_size} ranks once")
    for r in result.ranks:
        if r.memory_capacity and r.memory_total > r.memory_capacity * (1 + 1e-9):
            problems.append(f"fills rank {r.rank}'s memory with {_bytes(r.memory_total)} of {_bytes(r.memory_capacity)}")
            break
    if context is not None and not problems:  # what its shards hold at least, whatever it reports
        least = _least_device_bytes(result, tables, world_size, context)
        by_rank = {int(r.rank): r for r in result.ranks}
        for rank in range(world_size):
            r = by_rank[rank]
            if least[rank] > r.memory_total * (1 + 1e-6):
                problems.append(
                    f"reports {_bytes(r.memory_total)} of device memory on rank {rank}, less than its shards' "
                    f"weights alone ({_bytes(least[rank])} at {context.kernel.weight_bytes} bytes per element): "
                    "report each rank's memory by kind (RankReport.memory: weights, optimizer state, batch "
                    "buffers), or score the plan with Neo's cost model (neo_plugins.sharding.planner.score_assignments)")
                break
    # host memory is a node's, shared by its ranks (each reports its share as its capacity;
    # with the topology known, the node's is the topology's, whatever ranks say)
    # without a context (a saved plan): the node its own topology says, else a rank alone
    per_node = context.topology.devices_per_node if context is not None else result.devices_per_node()
    used, offered = result.node_host_memory(per_node)
    for node in sorted(used):
        host = used[node]
        cap = float(context.topology.host_memory) * per_node if context is not None else offered[node]
        if cap and host > cap * (1 + 1e-9):
            ranks = sorted(int(r.rank) for r in result.ranks if int(r.rank) // per_node == node)
            where = f"rank {ranks[0]}'s" if per_node == 1 else f"node {node}'s (ranks {_compact_ranks(ranks)})"
            problems.append(f"fills {where} host memory with {_bytes(host)} of {_bytes(cap)}")
            break
    if problems:
        raise PlanningError(f"{who} gave a plan that cannot run: it {'; it '.join(problems)}.")
    specs = {t.name: t for t in tables}
    for a in result.tables:  # the table as planned, beside where it went
        if not a.spec:
            t = specs[a.name]
            a.spec = {"num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim,
                      "pooling_factor": t.pooling_factor, "hot_fraction": t.hot_fraction}
            if len(t.feature_names) > 1:  # each feature looks up and sends its own (F in docs/cost_model.md)
                a.spec["feature_names"] = list(t.feature_names)
    if context is not None:
        if not result.settings:
            result.settings = plan_settings(context)
        if not result.topology:  # plan.json's memory is checked against it
            result.topology = context.topology.to_dict()
        result.notes.extend(n for n in context_notes(result, context) if n not in result.notes)
    return result


def _layout_problem(stype: ShardingType, ranks: list[int], world: int, local: int | None) -> str:
    """What in ``ranks`` (within 0 to ``world`` - 1) a table of type ``stype`` cannot be laid out
    on, as ``neo_core.torchrec_plan`` reads them; its nodes (``local`` ranks each) only where
    known. "" where they fit."""
    if stype is ShardingType.TABLE_WISE and len(ranks) != 1:
        return "a table-wise table is on one rank"
    if stype is ShardingType.DATA_PARALLEL and sorted(ranks) != list(range(world)):
        return "a replicated table is on every rank"
    if stype is ShardingType.ROW_WISE and sorted(ranks) != list(range(world)):
        return "a row-wise table is on every rank once"
    if local is None:
        return ""
    node = [list(range(n * local, (n + 1) * local)) for n in range(world // local)]
    if stype is ShardingType.TABLE_ROW_WISE and sorted(ranks) not in node:
        return f"a table-row-wise table is on the {local} ranks of one node, each once"
    if stype is ShardingType.TABLE_COLUMN_WISE and len({r // local for r in ranks}) != 1:
        return "a table-column-wise table's shards are on one node"
    blocks = [ranks[i: i + local] for i in range(0, len(ranks), local)]
    if stype is ShardingType.GRID_SHARD and not all(sorted(b) in node for b in blocks):
        return f"a grid-sharded table's column blocks are each on the {local} ranks of one node, each once"
    return ""


def refuse_unbuildable(
    assignments: Sequence[TableAssignment], tables: Sequence[TableSpec], world_size: int, local_size: int | None,
    head: str, subject: str = "it",
) -> None:
    """Raise ``PlanningError("<head>: <subject> <problem>; it <problem>.")`` for what
    :func:`assignment_problems` finds, then, given the ranks per node (``local_size``), the
    first assignment the ranks could not build as laid out (kernel, ranks per type, column
    widths: ``neo_core.torchrec_plan.check_assignment``), as ``"<head>: <its message>"``."""
    from neo_core.errors import PlanningError

    problems = assignment_problems(assignments, tables, world_size)
    if problems:  # the builder's checks read the tables' types and shapes
        raise PlanningError(f"{head}: {subject} {'; it '.join(problems)}.")
    if local_size is None:
        return
    from neo_core.torchrec_plan import check_assignment

    dims = {t.name: t.embedding_dim for t in tables}
    for a in assignments:
        try:
            check_assignment(a, dims[a.name], world_size, local_size)
        except PlanningError as exc:
            raise PlanningError(f"{head}: {exc}") from None


def assignment_problems(assignments: Sequence[TableAssignment], tables: Sequence[TableSpec], world_size: int) -> list[str]:
    """What in table assignments cannot be built: tables the model lacks, left out or placed
    twice, ranks outside the world, an unknown sharding type (a short name, "TW", or a member
    is taken as its TorchRec name, in place), a replicated table not on every rank, other than
    one shard shape per rank, shapes that do not make up their table. Each an "it ..." clause
    (:func:`check_plan`'s message)."""
    from collections import Counter

    known = {t.name for t in tables}
    counts = Counter(a.name for a in assignments)
    problems = []
    if unknown := sorted(set(counts) - known):
        problems.append(f"places tables the model does not have ({', '.join(unknown[:5])})")
    if missing := [t.name for t in tables if t.name not in counts]:
        problems.append(f"leaves out {len(missing)} table(s) ({', '.join(missing[:5])})")
    if twice := sorted(n for n, c in counts.items() if c > 1):
        problems.append(f"places tables more than once ({', '.join(twice[:5])})")
    if bad := [a.name for a in assignments if not a.ranks or any(not 0 <= int(r) < world_size for r in a.ranks)]:
        problems.append(f"puts tables on no rank or on ranks outside 0-{world_size - 1} ({', '.join(bad[:5])})")
    specs = {t.name: t for t in tables}
    untyped, partial, shapes, miscounted = [], [], [], []
    for a in assignments:
        try:
            a.sharding_type = ShardingType.parse(a.sharding_type).value
        except ConfigError:
            untyped.append(f"{a.sharding_type!r} for {a.name}")
            continue
        spec = specs.get(a.name)
        if spec is None:
            continue
        if a.sharding_type == ShardingType.DATA_PARALLEL.value and sorted(int(r) for r in a.ranks) != list(range(world_size)):
            partial.append(f"{a.name} on {_compact_ranks(sorted(int(r) for r in a.ranks))}")
        rows, dim = spec.num_embeddings, spec.embedding_dim
        given = [(int(r), int(c)) for r, c in a.shard_shapes]
        if given and a.sharding_type != ShardingType.DATA_PARALLEL.value and len(given) != len(a.ranks):
            miscounted.append(f"{a.name}: {len(given)} shapes for {len(a.ranks)} ranks")
            continue
        if given and not shapes_make_up(a.sharding_type, given, rows, dim):
            shapes.append(f"{a.name}: {given[:4]}{' ...' if len(given) > 4 else ''} for {rows} x {dim}")
    if untyped:
        problems.append(f"gives unknown sharding types ({', '.join(untyped[:5])}): use "
                        + ", ".join(f"{m.value} ({m.short})" for m in ShardingType))
    if partial:
        problems.append(f"puts data-parallel (replicated) tables on some ranks only ({', '.join(partial[:5])}): a "
                        f"replica is on every rank, 0-{world_size - 1}, so list them all")
    if miscounted:
        problems.append(f"gives other than one shard shape per rank listed ({'; '.join(miscounted[:3])}): give one "
                        "(rows, cols) per entry of ranks, or leave shard_shapes empty")
    if shapes:
        problems.append(f"gives shard shapes (rows, cols) that do not make up their tables "
                        f"({'; '.join(shapes[:3])}): a table-wise shard or a replica is the whole table "
                        "(rows x dim), other shards lie within it and add up to it; or leave shard_shapes empty")
    return problems


def shapes_make_up(sharding_type: str, shapes: Sequence[tuple[int, int]], rows: int, dim: int) -> bool:
    """Whether shard ``shapes`` (rows, cols) make up a table of ``rows`` x ``dim`` as its type
    lays it out: a replica (one shape, or one per rank) or a table-wise shard is the whole
    table; other shards lie within it and add up to it."""
    replica = sharding_type == ShardingType.DATA_PARALLEL.value
    whole = sharding_type == ShardingType.TABLE_WISE.value
    if replica:
        return set(shapes) == {(rows, dim)}
    if whole:
        return list(shapes) == [(rows, dim)]
    return all(0 <= r <= rows and 0 < c <= dim for r, c in shapes) and sum(r * c for r, c in shapes) == rows * dim


def _least_device_bytes(result: PlanResult, tables: Sequence[TableSpec], world_size: int,
                        context: PlanningContext) -> list[float]:
    """Per rank, the device bytes a plan's shards hold at least: their weights at the run's
    kernel's bytes per element (optimizer state is left to the planner's own model: TorchRec's
    counts it otherwise), shards of tables behind a cache or in host memory left out; only
    shards whose shapes the plan gives, or that are whole tables."""
    per_element = context.kernel.weight_bytes
    specs = {t.name: t for t in tables}
    least = [0.0] * world_size
    for a in result.tables:
        spec = specs[a.name]
        if "uvm" in a.compute_kernel:  # fused_uvm, fused_uvm_caching: rows in host memory
            continue
        rows, dim = spec.num_embeddings, spec.embedding_dim
        if a.sharding_type == ShardingType.DATA_PARALLEL.value:
            least = [b + rows * dim * per_element for b in least]
            continue
        shapes = [(int(r), int(c)) for r, c in a.shard_shapes] or (
            [(rows, dim)] if a.sharding_type == ShardingType.TABLE_WISE.value else [])
        if len(shapes) != len(a.ranks):
            continue
        for rank, (r, c) in zip(a.ranks, shapes):
            least[int(rank)] += r * c * per_element
    return least


def _compute_time(rank: RankReport) -> float:
    """A rank's predicted time other than communication (seconds)."""
    return sum(v for k, v in rank.time.items() if not k.startswith("comm"))


def _bytes(n: float, digits: int = 0) -> str:
    """Bytes at a binary scale: one decimal (1.2GiB), or ``digits`` significant digits
    (``digits=3``: 1.23GiB, 12.3MiB, 123MiB) for totals that plans are compared by, where a
    one-decimal figure hides a few percent."""
    if n < 0:  # over capacity: "free" is negative
        return "-" + _bytes(-n, digits)
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            if not digits:
                return f"{n / size:.1f}{unit}"
            value = float(f"{n / size:.{digits}g}")  # rounded first: 9.996 is 10.0, not 10.00
            return f"{value:.{max(0, digits - 1 - int(math.floor(math.log10(value))))}f}{unit}"
    return f"{n:.0f}B"


def _compact_ranks(ranks: Sequence[int], width: int = 40) -> str:
    """Shard ranks in shard order, runs of consecutive ranks as ``a-b``, cut at ``width``."""
    if not ranks:
        return "-"
    runs: list[tuple[int, int]] = []
    start = prev = int(ranks[0])
    for r in map(int, ranks[1:]):
        if r != prev + 1:
            runs.append((start, prev))
            start = r
        prev = r
    runs.append((start, prev))
    parts = [f"{a}-{b}" if b - a >= 2 else f"{a},{b}" if b > a else f"{a}" for a, b in runs]
    text = ",".join(parts)
    if len(text) <= width:
        return text
    kept = parts[:1]  # the first run always; then whole runs while they fit (plan.json has every rank)
    for part in parts[1:]:
        if len(",".join([*kept, part])) > width:
            break
        kept.append(part)
    return f"{','.join(kept)},... ({len(ranks)} ranks)"


class Planner(abc.ABC):
    """A sharding plugin: plans tables onto ranks and supplies the TorchRec sharders."""

    name: str = "planner"

    @abc.abstractmethod
    def plan(self, tables: Sequence[TableSpec], context: PlanningContext) -> PlanResult:
        """Plan ``tables`` for ``context.topology`` without allocating table memory."""

    def plan_module(
        self, module: nn.Module, tables: Sequence[TableSpec], context: PlanningContext
    ) -> PlanResult:
        """Plan for a model (on the meta device): fills ``PlanResult.torchrec_plan``, once the
        plan is checked (:func:`check_plan`: a plugin's mistakes named before the build meets them)."""
        name = getattr(self, "name", type(self).__name__)
        result = check_plan(self.plan(tables, context), tables, context.topology.world_size, name, context)
        result.torchrec_plan = self.to_torchrec_plan(module, result, context)
        return result

    def to_torchrec_plan(self, module: nn.Module, result: PlanResult, context: PlanningContext) -> Any:
        """Turn the table assignments into a TorchRec ``ShardingPlan`` for ``module``."""
        from neo_core.torchrec_plan import build_sharding_plan

        return build_sharding_plan(module, result, context, checked_sharders(self, context))

    @abc.abstractmethod
    def sharders(self, context: PlanningContext) -> list[Any]:
        """TorchRec ``ModuleSharder``s that execute this planner's plans."""
