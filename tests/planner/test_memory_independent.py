"""Memory capacity is never exceeded in a produced plan, recomputed from the plan alone.

The planner keeps its own per-rank memory accounting (``RankReport.memory``). These tests do
not trust it: for seeded random cases (heavy-tailed table sizes, mixed dims and pooling,
``local`` and ``zionex`` topologies of several sizes, with and without a device cache,
several optimizers and weight precisions) they plan with ``NeoPlanner`` and rebuild every
rank's device and host bytes from what the plan says (sharding type, compute kernel, ranks
and shard shapes of each table; shard sizes and placements of the TorchRec
``ParameterSharding`` it converts to), with the formulas of ``docs/cost_model.md``
("Memory (per rank)") written out here from first principles:

- a shard of ``rows x cols`` stores ``rows * cols * e`` bytes of weights (``e`` bytes per
  element) and its optimizer state: none for SGD, one fp32 per row for row-wise Adagrad,
  one fp32 per element for Adagrad, two for Adam;
- a data-parallel table is replicated on every rank, with a dense fp32 gradient of the
  whole table besides its weights and optimizer state (``torch.optim``'s: full Adagrad under
  row-wise Adagrad, which ``torch.optim`` lacks);
- a cached shard (``fused_uvm_caching``) keeps ``ceil(load_factor * rows)`` rows in device
  memory, with FBGEMM's cache state there too (a 4-byte table map entry per row, 8 bytes of
  cache state per slot, and the LRU's 8 bytes per slot or the LFU's 8 bytes per row, as
  ``split_table_batched_embeddings_ops_training`` lists them); its weights are in host memory,
  and so is its optimizer state unless that is row-wise, which FBGEMM keeps on the device;
- the usable device memory of a rank is its capacity less the reserve (15% by default);
  host memory has no reserve, and is a node's, shared by its ranks (``topology.host_memory`` is
  each rank's share).

Every rank must fit, and the recomputation must agree with the planner's own report, which
catches accounting drift in either direction. The TorchRec plan must hold the same shards, and
the caches it builds are checked at the load factor TorchRec actually uses (the plan's
``cache_params``, else the sharder's fused params, else FBGEMM's default of 20%).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pytest

from neo_core.api import make_context
from neo_core.cache import CachePolicy
from neo_core.errors import PlanningError
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import ShardingType, TableSpec
from neo_core.topology import Topology
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.topology.local import local_topology
from neo_plugins.topology.zionex import zionex_topology

RESERVE = 0.15  # NeoPlanner's default reserve_fraction (docs/cost_model.md)
NUM_RANDOM = 100  # random cases besides the hand-picked ones
ROUNDING = 1e-3  # most the even-split rounding may add to a rank, of usable device memory
CACHED_KERNEL = "fused_uvm_caching"
FBGEMM_DEFAULT_LOAD_FACTOR = 0.2  # FBGEMM's TBE default when no cache_load_factor is passed
DIMS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 256, 512)
ROW_SPLIT = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)
COL_SPLIT = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)


def state_bytes(optimizer: SparseOptimizer, rows: int, cols: int) -> int:
    """Optimizer state of a ``rows x cols`` shard, in bytes (fp32 state)."""
    if optimizer is SparseOptimizer.SGD:
        return 0
    if optimizer is SparseOptimizer.ROWWISE_ADAGRAD:
        return 4 * rows
    if optimizer is SparseOptimizer.ADAGRAD:
        return 4 * rows * cols
    if optimizer is SparseOptimizer.ADAM:
        return 8 * rows * cols
    raise AssertionError(optimizer)


@dataclass(frozen=True)
class Case:
    """One planning problem: the tables come from ``seed``; ``fill`` sizes them.

    ``fill`` is the tables' total bytes (weights + optimizer state, as held without a cache)
    over the cluster's usable device memory (over one rank's for a data-parallel-only
    kernel), or over usable device plus host memory when ``host_fill`` is set.
    """

    seed: int
    topology: str  # "local" or "zionex"
    size: int  # local: world size; zionex: nodes
    optimizer: SparseOptimizer = SparseOptimizer.ROWWISE_ADAGRAD
    weight_bytes: int = 4
    dense: bool = False  # the unfused, data-parallel-only kernel
    load_factor: float | None = None  # cache plugin's load factor (None: no cache)
    fill: float = 0.5
    host_fill: bool = False
    tables: int = 24
    device_gib: float = 40.0  # zionex only
    host_gib_per_node: float = 1536.0  # zionex only
    tight: str = ""  # "device" / "host": that memory must end up nearly full
    algorithm: str = "lru"  # the cache's eviction (the LFU keeps a counter per row on the device)
    prefetch: bool = False  # the cache built for a prefetching pipeline (a lock counter per slot)

    @property
    def label(self) -> str:
        parts = [f"s{self.seed}", f"{self.topology}{self.size}", self.optimizer.value, f"e{self.weight_bytes}"]
        if self.dense:
            parts.append("dense")
        if self.load_factor is not None:
            parts.append(f"lf{self.load_factor}{self.algorithm}" + ("+prefetch" if self.prefetch else ""))
        return "-".join(parts + [f"fill{self.fill}"])


CASES = [
    # device memory binds: tables fill most of the cluster's usable device memory
    Case(1, "local", 1, fill=0.9, tight="device"),
    Case(2, "local", 2, SparseOptimizer.SGD, fill=0.93, tight="device"),
    Case(3, "local", 3, SparseOptimizer.ADAM, fill=0.9, tight="device"),
    Case(4, "local", 4, SparseOptimizer.ADAGRAD, weight_bytes=2, fill=0.9, tight="device"),
    Case(5, "local", 8, SparseOptimizer.ADAGRAD, dense=True, fill=0.9, tight="device", tables=12),
    Case(6, "local", 4, load_factor=0.1, fill=0.8),  # a cache on CPU ranks is never used
    Case(7, "zionex", 1, fill=0.92, tight="device"),
    Case(8, "zionex", 2, SparseOptimizer.ADAM, weight_bytes=2, fill=0.9, tight="device"),
    # more than the devices hold: tables must go to host memory behind the cache
    Case(9, "zionex", 2, load_factor=0.05, fill=2.5, prefetch=True),
    Case(10, "zionex", 4, SparseOptimizer.ADAGRAD, load_factor=0.2, fill=1.6, tight="device"),
    Case(11, "zionex", 2, weight_bytes=2, load_factor=0.5, fill=1.3, tight="device"),
    Case(12, "zionex", 16, load_factor=0.1, fill=1.5, tables=40, tight="device", algorithm="lfu"),
    # host memory binds too: small hosts, most of the bytes behind the cache
    Case(13, "zionex", 2, load_factor=0.1, fill=0.85, host_fill=True, device_gib=8.0,
         host_gib_per_node=256.0, tight="host"),
    # light loads, everything on the devices
    Case(14, "zionex", 4, SparseOptimizer.SGD, fill=0.3),
    Case(15, "local", 2, SparseOptimizer.ADAM, fill=0.2),
]


def make_topology(case: Case) -> Topology:
    if case.topology == "local":
        # default bandwidths whatever this machine calibrated (conftest points NEO_CALIBRATION at
        # a missing file); memory is this machine's RAM
        return local_topology(world_size=case.size, compute_device="cpu")
    return zionex_topology(
        num_nodes=case.size, device_memory_gib=case.device_gib, host_memory_gib_per_node=case.host_gib_per_node
    )


def make_kernel(case: Case) -> EmbeddingKernel:
    if case.dense:
        return EmbeddingKernel(
            "dense", "dense", case.optimizer, weight_bytes=case.weight_bytes, data_parallel_only=True,
            fused_backward=False,
        )
    return EmbeddingKernel("fused", "fused", case.optimizer, weight_bytes=case.weight_bytes)


def random_tables(case: Case, topo: Topology) -> list[TableSpec]:
    """Heavy-tailed row counts (Pareto), mixed dims, log-normal pooling, some access skew."""
    rng = np.random.default_rng(case.seed)
    n = case.tables
    dims = rng.choice(np.asarray(DIMS), size=n)
    rows = (rng.pareto(1.1, n) + 1.0) * 10.0 ** rng.uniform(1.0, 4.0, n)
    pooling = np.clip(rng.lognormal(1.5, 1.2, n), 1.0, 400.0)
    hot = np.where(rng.random(n) < 0.5, np.nan, rng.uniform(0.05, 0.95, n))
    e, opt = case.weight_bytes, case.optimizer
    per_row = np.array([d * e + state_bytes(opt, 1, int(d)) + (4 * d if case.dense else 0) for d in dims])
    usable = topo.device_memory * (1 - RESERVE)
    if case.host_fill:
        usable += topo.host_memory
    budget = case.fill * usable * (1 if case.dense else topo.world_size)
    rows = np.maximum(1, np.floor(rows * budget / float((rows * per_row).sum()))).astype(np.int64)
    return [
        TableSpec(
            f"t{i:02d}",
            int(rows[i]),
            int(dims[i]),
            round(float(pooling[i]), 2),
            hot_fraction=None if np.isnan(hot[i]) else round(float(hot[i]), 3),
        )
        for i in range(n)
    ]


@functools.cache
def plan_case(case: Case, module: bool = False):
    """Tables, context, planner and plan of ``case`` (planned once per session)."""
    topo = make_topology(case)
    tables = random_tables(case, topo)
    cache = CachePolicy(case.algorithm, load_factor=case.load_factor, algorithm=case.algorithm,
                        prefetch_pipeline=case.prefetch) if case.load_factor else None
    ctx = make_context(topo, 512, kernel=make_kernel(case), cache=cache)
    planner = NeoPlanner(time_budget_s=1.0)
    if not module:
        return tables, ctx, planner, planner.plan(tables, ctx)
    return tables, ctx, planner, planner.plan_module(ebc_on_meta(tables), tables, ctx)


def ebc_on_meta(tables: list[TableSpec]):
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def check_shards_tile(name: str, rows: int, dim: int, shards: list[tuple[int, int, int, int]]) -> None:
    """``(row_offset, col_offset, rows, cols)`` shards cover the table exactly once."""
    for r0, c0, nr, nc in shards:
        assert r0 >= 0 and c0 >= 0 and nr >= 0 and nc > 0, (name, shards)
        assert r0 + nr <= rows and c0 + nc <= dim, (name, rows, dim, shards)
    rcuts = sorted({0, rows} | {r0 for r0, *_ in shards} | {r0 + nr for r0, _, nr, _ in shards})
    ccuts = sorted({0, dim} | {c0 for _, c0, _, _ in shards} | {c0 + nc for _, c0, _, nc in shards})
    cover = np.zeros((len(rcuts) - 1, len(ccuts) - 1), dtype=np.int64)
    for r0, c0, nr, nc in shards:
        if nr:
            cover[rcuts.index(r0) : rcuts.index(r0 + nr), ccuts.index(c0) : ccuts.index(c0 + nc)] += 1
    assert (cover == 1).all(), (name, rows, dim, shards)


def shard_memory(
    rows: int, cols: int, cached: bool, load_factor: float | None, kernel: EmbeddingKernel, algorithm: str = "lru",
    prefetch: bool = False,
) -> tuple[int, int]:
    """(device, host) bytes of one sharded (not replicated) shard."""
    weights = rows * cols * kernel.weight_bytes
    state = state_bytes(kernel.optimizer, rows, cols)
    if cached:
        assert load_factor is not None
        slots = math.ceil(math.ceil(load_factor * rows) / 32) * 32  # each shard rounded up to sets of 32
        cache_state = 4 * rows + 8 * slots + (8 * (rows + (rows > 0)) if algorithm == "lfu" else 8 * slots)
        cache_state += 4 * slots if prefetch else 0  # the prefetch pipeline's lock counter per slot
        device = slots * cols * kernel.weight_bytes + cache_state
        if kernel.optimizer in (SparseOptimizer.ROWWISE_ADAGRAD, SparseOptimizer.SGD):
            return device + state, weights  # row-wise state (or none) in device memory
        return device, weights + state
    return weights + state, 0


def batch_bytes(st: ShardingType, spec: TableSpec, cols: int, ctx) -> float:
    """One batch's ids (int64) and pooled fp32 rows on a shard's rank: TorchRec's input and
    output sizes of a shard (``_calculate_shard_io_sizes``; ``test_batch_bytes_hold_torchrecs``)."""
    B, W, L = ctx.batch_size_per_rank, ctx.topology.world_size, ctx.topology.devices_per_node
    G, P = B * W, spec.pooling_factor
    if st is ShardingType.DATA_PARALLEL:
        return B * P * 8 + B * cols * 4
    ids = {ShardingType.ROW_WISE: G * P / W, ShardingType.TABLE_ROW_WISE: G * P / L,
           ShardingType.GRID_SHARD: G * P / L}.get(st, G * P)
    return ids * 8 + G * cols * 4


def fbgemm_cache_bytes(result, ctx) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: the device bytes of the plan's UVM caches as FBGEMM allocates them, and as the
    shards' own figures (``shard_memory``) count them.

    TorchRec batches a rank's cached shards of one sharding type and one width (each table's
    cache parameters carry its width: ``neo_core/torchrec_plan.py``); FBGEMM gives each batch
    one cache of ``ceil(int(f * rows) / 32)`` sets of 32 slots (at least one set), as wide as the
    batch, with 8 bytes of state per slot, a 4-byte table map per row, and the LRU's 8 bytes per
    slot or the LFU's 8 bytes per row and one more (``split_table_batched_embeddings_ops_training``,
    ``_apply_cache_state``); a prefetch pipeline adds a 4-byte lock counter per slot."""
    W, f, e = ctx.topology.world_size, ctx.cache.load_factor, ctx.kernel.weight_bytes
    lfu, prefetch = ctx.cache.algorithm == "lfu", bool(ctx.cache.prefetch_pipeline)
    batches: dict[tuple[int, str, int], int] = {}
    shards = np.zeros(W)
    for a in result.tables:
        if a.compute_kernel != CACHED_KERNEL:
            continue
        for r, (rows, cols) in zip(a.ranks, a.shard_shapes):
            key = (r, a.sharding_type, cols)
            batches[key] = batches.get(key, 0) + rows
            slots = math.ceil(math.ceil(f * rows) / 32) * 32
            shards[r] += slots * cols * e + 4 * rows + 8 * slots + (8 * (rows + (rows > 0)) if lfu else 8 * slots)
            shards[r] += 4 * slots if prefetch else 0
    fbgemm = np.zeros(W)
    for (r, _, cols), rows in batches.items():
        slots = max(1, (int(rows * f) + 31) // 32) * 32
        fbgemm[r] += slots * cols * e + 4 * rows + 8 * slots + (8 * (rows + 1) if lfu else 8 * slots)
        fbgemm[r] += 4 * slots if prefetch else 0
    return fbgemm, shards


def replica_memory(spec: TableSpec, kernel: EmbeddingKernel) -> int:
    """Device bytes of one data-parallel replica: weights, optimizer state, dense fp32 gradient.
    A replica is stepped by ``torch.optim`` (``neo_core/training/module.py``), which has no
    row-wise Adagrad: under row-wise Adagrad it holds full Adagrad state."""
    rows, dim = spec.num_embeddings, spec.embedding_dim
    optimizer = SparseOptimizer.ADAGRAD if kernel.optimizer is SparseOptimizer.ROWWISE_ADAGRAD else kernel.optimizer
    return rows * dim * kernel.weight_bytes + state_bytes(optimizer, rows, dim) + 4 * rows * dim


def memory_from_assignments(result, tables, ctx) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank (device, host) bytes from the plan's table assignments alone."""
    topo, kernel = ctx.topology, ctx.kernel
    W, L = topo.world_size, topo.devices_per_node
    dev, host = np.zeros(W), np.zeros(W)
    specs = {t.name: t for t in tables}
    assert sorted(a.name for a in result.tables) == sorted(specs)
    for a in result.tables:
        spec, st = specs[a.name], ShardingType(a.sharding_type)
        R, d = spec.num_embeddings, spec.embedding_dim
        cached = a.compute_kernel == CACHED_KERNEL
        if cached:
            assert topo.compute_device == "cuda" and ctx.cache.load_factor is not None, a
            assert st is not ShardingType.DATA_PARALLEL, a
        if st is ShardingType.DATA_PARALLEL:
            assert a.ranks == list(range(W)), a
            dev += replica_memory(spec, kernel) + batch_bytes(st, spec, d, ctx)
            continue
        ranks, shapes = list(a.ranks), [tuple(s) for s in a.shard_shapes]
        assert ranks and len(ranks) == len(shapes), a
        assert all(0 <= r < W for r in ranks), a
        # place each shard in the table, in the order the plan documents (neo_core/torchrec_plan.py)
        nodes = {r // L for r in ranks}
        if st is ShardingType.TABLE_WISE:
            assert len(ranks) == 1 and shapes == [(R, d)], a
            tiles = [(0, 0, R, d)]
        elif st in COL_SPLIT:
            assert all(nr == R for nr, _ in shapes), a
            offsets = np.cumsum([0] + [nc for _, nc in shapes])[:-1]
            tiles = [(0, int(c0), R, nc) for c0, (_, nc) in zip(offsets, shapes)]
            if st is ShardingType.TABLE_COLUMN_WISE:
                assert len(nodes) == 1, a
        elif st in ROW_SPLIT:
            assert all(nc == d for _, nc in shapes), a
            if st is ShardingType.ROW_WISE:
                assert ranks == list(range(W)), a
            else:
                assert len(nodes) == 1 and ranks == sorted(ranks) and len(ranks) == L, a
            offsets = np.cumsum([0] + [nr for nr, _ in shapes])[:-1]
            tiles = [(int(r0), 0, nr, d) for r0, (nr, _) in zip(offsets, shapes)]
        else:  # GRID: column blocks, each row-split over the L ranks of one node
            assert len(ranks) % L == 0, a
            tiles, c0 = [], 0
            for b in range(len(ranks) // L):
                block, bshapes = ranks[b * L : (b + 1) * L], shapes[b * L : (b + 1) * L]
                assert len({r // L for r in block}) == 1 and len({nc for _, nc in bshapes}) == 1, a
                r0 = 0
                for nr, nc in bshapes:
                    tiles.append((r0, c0, nr, nc))
                    r0 += nr
                c0 += bshapes[0][1]
        check_shards_tile(a.name, R, d, tiles)
        for r, (_, _, nr, nc) in zip(ranks, tiles):
            dd, hh = shard_memory(nr, nc, cached, ctx.cache.load_factor, kernel, ctx.cache.algorithm, bool(ctx.cache.prefetch_pipeline))
            dev[r] += dd + batch_bytes(st, spec, nc, ctx)
            host[r] += hh
    return dev, host


def memory_from_torchrec(plan, tables, ctx, load_factor_of) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank (device, host) bytes from TorchRec's ``ParameterSharding``s alone.

    ``load_factor_of(ps)`` gives the cache load factor a cached table is built with.
    """
    kernel, W = ctx.kernel, ctx.topology.world_size
    dev, host = np.zeros(W), np.zeros(W)
    params = plan.plan[""]
    specs = {t.name: t for t in tables}
    assert sorted(params) == sorted(specs)
    for name, ps in params.items():
        spec = specs[name]
        st = ShardingType(ps.sharding_type)
        if st is ShardingType.DATA_PARALLEL:
            assert ps.sharding_spec is None and ps.compute_kernel == "dense", (name, ps)
            dev += replica_memory(spec, kernel) + batch_bytes(st, spec, spec.embedding_dim, ctx)
            continue
        cached = ps.compute_kernel == CACHED_KERNEL
        shards = ps.sharding_spec.shards
        tiles = [(*m.shard_offsets, *m.shard_sizes) for m in shards]
        check_shards_tile(name, spec.num_embeddings, spec.embedding_dim, tiles)
        for m in shards:
            r = m.placement.rank()
            assert 0 <= r < W, (name, m)
            dd, hh = shard_memory(*m.shard_sizes, cached, load_factor_of(ps) if cached else None, kernel,
                                  ctx.cache.algorithm, bool(ctx.cache.prefetch_pipeline))
            dev[r] += dd + batch_bytes(st, spec, m.shard_sizes[1], ctx)
            host[r] += hh
    return dev, host


def even_split_uplift(result, tables, ctx) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, (device, host) bytes of row-split shards counted at the row count of their
    split's largest shard, less those at their own row count."""
    kernel, W, L = ctx.kernel, ctx.topology.world_size, ctx.topology.devices_per_node
    dev, host = np.zeros(W), np.zeros(W)
    for a in result.tables:
        st = ShardingType(a.sharding_type)
        if st not in ROW_SPLIT and st is not ShardingType.GRID_SHARD:
            continue
        cached = a.compute_kernel == CACHED_KERNEL
        n = len(a.ranks) if st is ShardingType.ROW_WISE else L  # shards per row split
        for start in range(0, len(a.ranks), n):
            split = a.shard_shapes[start : start + n]
            largest = max(nr for nr, _ in split)
            for r, (nr, nc) in zip(a.ranks[start : start + n], split):
                full = shard_memory(largest, nc, cached, ctx.cache.load_factor, kernel, ctx.cache.algorithm, bool(ctx.cache.prefetch_pipeline))
                own = shard_memory(nr, nc, cached, ctx.cache.load_factor, kernel, ctx.cache.algorithm, bool(ctx.cache.prefetch_pipeline))
                dev[r] += full[0] - own[0]
                host[r] += full[1] - own[1]
    return dev, host


def reported(result) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The planner's own per-rank figures: device (less reserve), host, and their capacities."""
    dev = np.array([r.memory_total - r.memory.get("reserve", 0.0) for r in result.ranks])
    host = np.array([sum(r.host_memory.values()) for r in result.ranks])
    cap = np.array([r.memory_capacity for r in result.ranks])
    reserve = np.array([r.memory.get("reserve", 0.0) for r in result.ranks])
    return dev, host, cap, reserve


def assert_fits(case: Case, ctx, dev: np.ndarray, host: np.ndarray, what: str) -> None:
    topo = ctx.topology
    usable_dev = topo.device_memory - RESERVE * topo.device_memory
    worst = int(np.argmax(dev / usable_dev))
    assert (dev <= usable_dev).all(), (
        f"{case.label} ({what}): rank {worst} holds {dev[worst]:,.0f} device bytes, over the "
        f"{usable_dev:,.0f} usable ({topo.device_memory:,} less the {RESERVE:.0%} reserve)"
    )
    # host memory is a node's, shared by its ranks: each rank's share is topology.host_memory
    nodes = host.reshape(topo.num_nodes, topo.devices_per_node).sum(axis=1)
    node_cap = topo.host_memory * topo.devices_per_node
    worst = int(np.argmax(nodes))
    assert (nodes <= node_cap).all(), (
        f"{case.label} ({what}): node {worst} holds {nodes[worst]:,.0f} host bytes, over {node_cap:,}"
    )


def random_case(seed: int) -> Case:
    """A case with every setting drawn at random (seeded)."""
    rng = np.random.default_rng(1000 + seed)
    local = bool(rng.random() < 0.4)
    size = int(rng.choice([1, 2, 3, 4, 6, 8] if local else [1, 2, 3, 4, 8]))
    dense = local and bool(rng.random() < 0.2)
    optimizers = [o for o in SparseOptimizer if not (dense and o is SparseOptimizer.ROWWISE_ADAGRAD)]
    load_factor = None
    if not local and rng.random() < 0.6:
        load_factor = float(rng.choice([0.02, 0.05, 0.1, 0.2, 0.5]))
    # with a cache, more than the devices hold, but caches of all tables must leave room
    fill = rng.uniform(0.9, min(2.0, 0.85 / load_factor)) if load_factor else rng.uniform(0.2, 0.95)
    return Case(
        seed=1000 + seed,
        topology="local" if local else "zionex",
        size=size,
        optimizer=optimizers[int(rng.integers(len(optimizers)))],
        weight_bytes=int(rng.choice([2, 4])),
        dense=dense,
        load_factor=load_factor,
        fill=round(fill, 2),
        tables=int(rng.integers(4, 40)),
        device_gib=float(rng.choice([16.0, 40.0, 80.0])),
    )


RANDOM_CASES = [random_case(i) for i in range(NUM_RANDOM)]


@pytest.mark.parametrize("case", CASES + RANDOM_CASES, ids=lambda c: c.label)
def test_every_rank_fits_recomputed_from_the_plan(case):
    try:
        tables, ctx, _, result = plan_case(case)
    except PlanningError as exc:  # a refusal is no violation, but every case here should plan
        pytest.fail(f"{case.label}: no plan ({exc})")
    topo = ctx.topology
    dev, host = memory_from_assignments(result, tables, ctx)
    assert_fits(case, ctx, dev, host, "table assignments")

    # the planner's own report agrees with the recomputation, and states the same capacities
    rep_dev, rep_host, cap, reserve = reported(result)
    assert (cap == topo.device_memory).all()
    assert np.allclose(reserve, RESERVE * topo.device_memory)
    if host.any():
        assert all(r.host_memory_capacity == topo.host_memory for r in result.ranks)
    # The report charges every shard of a row split as many rows as the split's largest shard
    # (an even split, rounded up); apart from that it must agree to the byte, either way.
    up_dev, up_host = even_split_uplift(result, tables, ctx)
    usable_dev = topo.device_memory * (1 - RESERVE)
    for name, mine, uplift, theirs in (("device", dev, up_dev, rep_dev), ("host", host, up_host, rep_host)):
        assert np.allclose(theirs, mine + uplift, rtol=1e-9, atol=1.0), (
            case.label, name, "recomputed", mine + uplift, "reported", theirs, "gap", theirs - mine - uplift
        )
        assert (uplift <= ROUNDING * usable_dev).all(), (case.label, name, uplift)

    # the caches as FBGEMM sizes them, one per batch of a rank's cached shards, fit in what
    # the shards' own figures count (rounded up to sets of 32 slots each)
    fbgemm, counted = fbgemm_cache_bytes(result, ctx)
    assert (fbgemm <= counted).all(), (case.label, "FBGEMM's caches", fbgemm, "counted", counted)

    # every case uses the cache where it can and must, and near-capacity cases do bind
    cached = [a for a in result.tables if a.compute_kernel == CACHED_KERNEL]
    if case.load_factor is None or topo.compute_device == "cpu":
        assert not cached and not host.any()
    elif case.fill > 1.0 or case.host_fill:
        assert cached
    if case.tight == "device":
        assert dev.max() >= 0.85 * usable_dev, (case.label, dev.max() / usable_dev)
    if case.tight == "host":
        nodes = host.reshape(topo.num_nodes, topo.devices_per_node).sum(axis=1)
        node_cap = topo.host_memory * topo.devices_per_node
        assert nodes.max() >= 0.9 * node_cap, (case.label, nodes.max() / node_cap)



@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_torchrec_plan_holds_the_planned_shards(case):
    """The ``ParameterSharding``s DMP executes hold exactly the shards recomputed above."""
    tables, ctx, _, result = plan_case(case, module=True)
    params = result.torchrec_plan.plan[""]
    for a in result.tables:
        ps = params[a.name]
        assert (ps.sharding_type, ps.compute_kernel) == (a.sharding_type, a.compute_kernel), a.name
    planned = memory_from_assignments(result, tables, ctx)
    executed = memory_from_torchrec(result.torchrec_plan, tables, ctx, lambda ps: ctx.cache.load_factor)
    assert np.array_equal(planned[0], executed[0]) and np.array_equal(planned[1], executed[1])
    assert_fits(case, ctx, *executed, "TorchRec plan")


def effective_load_factor(ps, sharder) -> float:
    """The cache load factor TorchRec builds a cached table with: the ``ParameterSharding``'s
    ``cache_params``, else the sharder's fused params, else FBGEMM's default."""
    if ps.cache_params is not None and ps.cache_params.load_factor is not None:
        return float(ps.cache_params.load_factor)
    return float((sharder.fused_params or {}).get("cache_load_factor", FBGEMM_DEFAULT_LOAD_FACTOR))


CACHE_SIZE_CASES = [c for c in CASES if c.topology == "zionex" and (c.load_factor or 1.0) < FBGEMM_DEFAULT_LOAD_FACTOR]


@pytest.mark.parametrize("case", CACHE_SIZE_CASES, ids=lambda c: c.label)
def test_torchrec_plan_builds_caches_of_the_planned_size(case):
    tables, ctx, planner, result = plan_case(case, module=True)
    sharder = planner.sharders(ctx)[0]
    params = result.torchrec_plan.plan[""]
    cached = [a.name for a in result.tables if a.compute_kernel == CACHED_KERNEL]
    assert cached
    factors = {name: effective_load_factor(params[name], sharder) for name in cached}
    dev, host = memory_from_torchrec(
        result.torchrec_plan, tables, ctx, lambda ps: effective_load_factor(ps, sharder)
    )
    assert_fits(case, ctx, dev, host, f"TorchRec plan as built, load factors {set(factors.values())}")
    assert set(factors.values()) == {case.load_factor}
    # FBGEMM sizes a table batch's cache at its widest table; each cached table carries its
    # shard width, so TorchRec batches only tables of one width and the per-shard count holds
    for name in cached:
        widths = {int(size[1]) for size in (s.shard_sizes for s in params[name].sharding_spec.shards)}
        assert len(widths) == 1 and params[name].cache_params.reserved_memory == float(widths.pop()), name
        # the eviction and prefetch the plan's memory was counted for (LFU's counters are per row)
        built = params[name].cache_params
        assert str(built.algorithm.name).lower() == ctx.cache.algorithm.lower(), (name, built)
        assert bool(built.prefetch_pipeline) == bool(ctx.cache.prefetch_pipeline), (name, built)


def test_cached_tables_of_one_width_share_an_fbgemm_batch_and_no_other():
    from torchrec.distributed.embedding_sharding import group_tables
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel, ShardedEmbeddingTable
    from torchrec.distributed.types import ParameterSharding
    from torchrec.distributed.utils import add_params_from_parameter_sharding

    from neo_core.sharding import TableAssignment
    from neo_core.torchrec_plan import _one_width_cache

    cache = CachePolicy("lru", load_factor=0.1).cache_params()

    def table(name: str, dim: int, one_width: bool) -> ShardedEmbeddingTable:
        params = cache
        if one_width:
            params = _one_width_cache(cache, TableAssignment(name, "table_wise", CACHED_KERNEL, [0], [(100, dim)]))
        fused = add_params_from_parameter_sharding(
            {}, ParameterSharding(sharding_type="table_wise", compute_kernel=CACHED_KERNEL, ranks=[0], cache_params=params)
        )
        return ShardedEmbeddingTable(
            name=name, embedding_dim=dim, num_embeddings=100, feature_names=[name], local_rows=100, local_cols=dim,
            compute_kernel=EmbeddingComputeKernel.FUSED_UVM_CACHING, fused_params=fused,
        )

    def batches(one_width: bool) -> list[list[str]]:
        [rank] = group_tables([[table("a", 32, one_width), table("b", 128, one_width), table("c", 32, one_width)]])
        return [[t.name for t in group.embedding_tables] for group in rank]

    assert batches(one_width=False) == [["a", "b", "c"]]  # one cache, 128 wide for all three
    assert batches(one_width=True) == [["a", "c"], ["b"]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_batch_bytes_hold_torchrecs(case):
    """A shard's batch of ids and pooled rows, as counted here, holds what TorchRec's storage
    estimate gives the same shard (it gives empty row shards none; here they count in full)."""
    from torchrec.distributed.planner.shard_estimators import _calculate_shard_io_sizes

    tables, ctx, _, result = plan_case(case)
    specs = {t.name: t for t in tables}
    W, L, B = ctx.topology.world_size, ctx.topology.devices_per_node, ctx.batch_size_per_rank
    for a in result.tables:
        spec, st = specs[a.name], ShardingType(a.sharding_type)
        shapes = [[spec.num_embeddings, spec.embedding_dim]] * W if st is ShardingType.DATA_PARALLEL else a.shard_shapes
        inputs, outputs = _calculate_shard_io_sizes(
            sharding_type=st.value, batch_sizes=[B], world_size=W, local_world_size=L,
            input_lengths=[spec.pooling_factor], emb_dim=spec.embedding_dim, shard_sizes=[list(x) for x in shapes],
            input_data_type_size=8, output_data_type_size=4, num_poolings=[1.0], is_pooled=True,
        )
        for (rows, cols), i, o in zip(shapes, inputs, outputs):
            counted = batch_bytes(st, spec, cols, ctx)
            assert counted >= i + o - 2, (case.label, a.name, st, rows, cols, counted, i + o)  # TorchRec rounds each up
            assert rows == 0 or counted <= i + o, (case.label, a.name, st, counted, i + o)


def test_random_cases_bind_memory_and_use_the_cache():
    """The random sweep is no easy test: memory binds in most cases, many place tables in
    host memory behind the cache, and host memory fills in some."""
    full_device = cached = full_host = 0
    for case in RANDOM_CASES:
        tables, ctx, _, result = plan_case(case)
        dev, host = memory_from_assignments(result, tables, ctx)
        full_device += dev.max() >= 0.85 * ctx.topology.device_memory * (1 - RESERVE)
        cached += any(a.compute_kernel == CACHED_KERNEL for a in result.tables)
        full_host += host.max() >= 0.5 * ctx.topology.host_memory
    assert full_device >= NUM_RANDOM // 2 and cached >= NUM_RANDOM // 5 and full_host >= 3, (
        full_device, cached, full_host
    )
