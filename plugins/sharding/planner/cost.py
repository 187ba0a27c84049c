"""Neo's cost model: per-shard time (by kind) and memory of every sharding option.

All formulas are in ``docs/cost_model.md``. Every function is vectorised over tables: the
inputs are numpy arrays with one entry per table, the outputs one row per table. Costs of a
shard do not depend on which rank holds it (the topology is homogeneous), so the search only
needs these per-shard figures and each rank's running totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neo_core.sharding import PlanningContext, ShardingType, TableSpec

# Time kinds, in report order. Keys starting with "comm" count as communication.
TIME_KINDS: tuple[str, ...] = (
    "compute_fwd",
    "compute_bwd",
    "optimizer",
    "comm_input",
    "comm_fwd",
    "comm_bwd",
    "comm_allreduce",
)
K = len(TIME_KINDS)
CF, CB, OPT, CIN, CMF, CMB, CAR = range(K)

DEVICE = "device"
CACHED = "cached"  # host memory behind a device cache (GPU topologies only)

# Default per-collective latency (seconds) when the topology does not say: an assumption.
DEFAULT_LATENCY = {"cuda": 30e-6, "cpu": 300e-6}

# GPU lookup-kernel efficiency, TorchRec's empirical figures (torchrec/distributed/planner/
# constants.py): FBGEMM's kernel is tuned for rows of 128 columns (32 threads x 4-vectors);
# narrower shards run slower per byte, and the dense (data-parallel) kernel reaches half the
# fused kernel's bandwidth. Applied on cuda topologies only; not verified on hardware here.
# Like TorchRec's estimator (TableWiseEvaluator vs RowWise/TableRowWise/Grid/DataParallel),
# the block penalty and the 32-column minimum read apply to the table-wise family (TW, CW,
# TWCW) only: row-split shards and the dense kernel are costed at their plain row width.
FULL_BLOCK_COLS = 128
HALF_BLOCK_PENALTY = 1.15  # 64 <= cols < 128
QUARTER_BLOCK_PENALTY = 1.75  # cols < 64
DENSE_KERNEL_BW_FACTOR = 0.5
MIN_LOOKUP_COLS = 32  # rows narrower than this cost as much as 32 columns to read
CACHE_ASSOC = 32  # slots per set of FBGEMM's UVM cache (DEFAULT_ASSOC, CUDA)
# Data-parallel optimizer step on GPUs: torch.optim's default (multi-tensor) optimizers run
# several unfused elementwise kernels over the table; passes over its weight bytes at device
# bandwidth, measured on one H200 (torch 2.11, 4M rows of 32 and 128 columns; the mean of the
# two widths, which differ by under 10%): bench/gpu_lookup.py --updates, docs/benchmarks.md.
# TorchRec's estimator takes 9.22 passes at half the bandwidth (18.44) for every optimizer.
DP_OPTIMIZER_PASSES = {"sgd": 3.4, "adagrad": 14.8, "adam": 20.6}
# Row-split types on GPUs: after the all-gather of output gradients, a batched copy moves them
# into the lookup kernel's layout, TorchRec's BATCHED_COPY_PERF_FACTOR passes over the
# gathered bytes at device bandwidth. Empirical in TorchRec; an assumption here.
BATCHED_COPY_PASSES = 2.455
# The quantized-communication codec (``compression``): bytes/s of fp32 values a rank encodes
# and decodes back, where the topology does not say (``Topology.codec_bw``, which `neo
# calibrate` measures on CPUs). On GPUs a kernel pair moving 12 bytes of memory per fp32 value
# (read 4, write 2; read 2, write 4 for fp16): a third of the device bandwidth. On CPUs where it
# was not measured, an assumption below what `neo calibrate` measured on a 2-core VM (2.6-4.3
# GB/s, docs/benchmarks.md).
CODEC_MEMORY_PASSES = 3.0
DEFAULT_CPU_CODEC_BW = 2e9


def codec_bandwidth(topo: Any) -> float:
    """``Z``: fp32 bytes a second the topology's ranks encode and decode (its ``codec_bw``, else
    the model's default by device)."""
    given = getattr(topo, "codec_bw", None)
    if given:
        return float(given)
    return topo.device_memory_bw / CODEC_MEMORY_PASSES if topo.compute_device == "cuda" else DEFAULT_CPU_CODEC_BW


def codec_note(topo: Any) -> str:
    """What a compressed plan's codec was priced at, and where that figure comes from."""
    bw = codec_bandwidth(topo)
    if getattr(topo, "codec_bw", None):
        where = "measured: the calibration" if "codec_bw" in getattr(topo, "sources", {}) else "the topology's codec_bw"
    elif topo.compute_device == "cuda":
        where = "a third of device memory bandwidth, assumed"
    else:
        where = "assumed; `neo calibrate` measures this machine's"
    return (f"compression's codec (each element encoded where it is sent and decoded where it arrives) priced at "
            f"{bw / 1e9:,.3g} GB/s of fp32 values ({where}; docs/cost_model.md, z)")


@dataclass(frozen=True)
class CostParams:
    """Knobs of the cost model that are not properties of a plugin."""

    reserve_fraction: float = 0.15  # of device memory, kept for dense model, activations, workspace
    host_reserve_fraction: float = 0.0  # of host memory, kept for the process, data loading, pinned buffers
    index_bytes: int = 8  # bytes per id in the input all-to-all (int64 ids)
    output_bytes: int = 4  # bytes per pooled-embedding element written by the lookup kernel
    access_bytes: int | None = None  # memory access granularity; None: 32 on cuda, 64 on cpu
    collective_latency_s: float | None = None  # None: DEFAULT_LATENCY by device


@dataclass(frozen=True)
class TableArrays:
    """Table specs as arrays (float64 for arithmetic, exact ints kept separately)."""

    names: list[str]
    rows: np.ndarray  # int64
    dims: np.ndarray  # int64
    pooling: np.ndarray  # float64, mean ids per sample of each of the table's features
    hot: np.ndarray  # float64, nan when unknown
    # float64, the features that read the table: each looks up ``pooling`` ids a sample and gives
    # one pooled row (TorchRec's pooling_factors, one per feature)
    features: np.ndarray

    @classmethod
    def from_specs(cls, tables: Sequence[TableSpec]) -> TableArrays:
        return cls(
            names=[t.name for t in tables],
            rows=np.array([t.num_embeddings for t in tables], dtype=np.int64),
            dims=np.array([t.embedding_dim for t in tables], dtype=np.int64),
            pooling=np.array([t.pooling_factor for t in tables], dtype=np.float64),
            hot=np.array(
                [np.nan if t.hot_fraction is None else t.hot_fraction for t in tables], dtype=np.float64
            ),
            features=np.array([max(1, len(t.feature_names)) for t in tables], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class ShardCosts:
    """Per-shard cost of one option for every table (rows of the arrays are tables)."""

    time: np.ndarray  # (T, K) seconds per shard, by kind
    mem_device: np.ndarray  # (T,) bytes of device memory per shard
    mem_host: np.ndarray  # (T,) bytes of host memory per shard
    weights: np.ndarray  # (T,) bytes of weights per shard (wherever they live)
    optimizer: np.ndarray  # (T,) bytes of optimizer state per shard
    gradients: np.ndarray  # (T,) bytes of dense gradient buffer per shard (DP only)
    cache: np.ndarray  # (T,) bytes of device cache per shard (cached placement only)
    # (T,) bytes of one batch's ids and pooled rows on the shard's rank (device memory; TorchRec's
    # storage estimate counts the same input and output sizes per shard)
    batch: np.ndarray


def cache_hit_rate(load_factor: float, hot: np.ndarray) -> np.ndarray:
    """Predicted device-cache hit rate from the cached fraction of rows and access skew.

    ``hot`` is the fraction of lookups that hit the hottest 1% of rows (nan: uniform access).
    Rows beyond the hottest 1% are assumed equally likely.
    """
    lf = float(min(max(load_factor, 0.0), 1.0))
    uniform = np.full(hot.shape, lf)
    h = np.where(np.isnan(hot), 0.0, hot)
    skewed = np.where(lf >= 0.01, h + (1.0 - h) * (lf - 0.01) / 0.99, h * lf / 0.01)
    return np.clip(np.where(np.isnan(hot), uniform, skewed), 0.0, 1.0)


class CostModel:
    """Cost of each sharding option on ``context``: the only place formulas live."""

    def __init__(self, context: PlanningContext, params: CostParams | None = None) -> None:
        self.context = context
        self.params = params or CostParams()
        topo = context.topology
        self.W = topo.world_size
        self.L = topo.devices_per_node
        self.N = topo.num_nodes
        self.B = float(context.batch_size_per_rank)
        self.G = self.B * self.W
        kernel = context.kernel
        self.e = float(kernel.weight_bytes)
        self.fb = float(context.compressor.forward_bytes)
        self.bb = float(context.compressor.backward_bytes)
        # the reduce-scatter of row-split tables and its backward (no fp8 there: Compressor)
        self.fs = float(context.compressor.reduce_scatter_forward_bytes)
        self.bs = float(context.compressor.reduce_scatter_backward_bytes)
        # the reduce-scatter's time: gloo sums fp16 element by element as fp32 does (1M elements
        # on 2 ranks: fp16 3.6-4.5 ms, fp32 3.3-3.9 ms, bf16 1.9-2.1 ms), so on CPU ranks fp16
        # saves it no time, though it halves the bytes
        gloo_fp16 = topo.compute_device == "cpu" and context.compressor.reduce_scatter_forward_precision == "fp16"
        self.fs_time = 4.0 if gloo_fp16 else self.fs
        self.ib = float(self.params.index_bytes)
        self.ob = float(self.params.output_bytes)
        gran = self.params.access_bytes or (32 if topo.compute_device == "cuda" else 64)
        self.gran = float(gran)
        lat = self.params.collective_latency_s
        if lat is None:  # calibrated figure of the topology, else the default by device
            lat = getattr(topo, "collective_latency_s", None)
        self.latency = DEFAULT_LATENCY[topo.compute_device] if lat is None else float(lat)
        # CPU calibration: per-id costs beyond the bytes (0 unless the topology measured them)
        self.id_fwd = float(getattr(topo, "lookup_fwd_id_s", 0.0) or 0.0)
        self.id_bwd = float(getattr(topo, "lookup_bwd_id_s", 0.0) or 0.0)
        self.id_bucketize = float(getattr(topo, "bucketize_id_s", 0.0) or 0.0)
        # reduce-scatter / all-gather against an all-to-all of the same bytes (1: as fast)
        rs_bw, ag_bw = getattr(topo, "reduce_scatter_bw", None), getattr(topo, "all_gather_bw", None)
        self.rs_factor = topo.intra_node_bw / rs_bw if rs_bw else 1.0
        self.ag_factor = topo.intra_node_bw / ag_bw if ag_bw else 1.0
        # intra-node all-reduce bandwidth (data-parallel gradients); calibrated on CPUs, else X
        self.allreduce_bw = float(getattr(topo, "allreduce_bw", None) or topo.intra_node_bw)
        # seconds per byte a rank sends in an all-to-all spread evenly over all ranks
        self.a2a = ((self.L - 1) / self.W) / topo.intra_node_bw + ((self.W - self.L) / self.W) / (
            topo.inter_node_bw
        )
        self.dev_bw = topo.device_memory_bw
        # seconds per gathered gradient byte of the row-split types' batched copy (GPU only)
        self.batched_copy = BATCHED_COPY_PASSES / self.dev_bw if topo.compute_device == "cuda" else 0.0
        self.host_bw = topo.host_memory_bw
        self.h2d_bw = topo.host_to_device_bw
        codec_bw = codec_bandwidth(topo)
        # seconds per element a collective sends in each precision: encoded by one rank, decoded
        # by another, charged to the shard's rank as its bytes are; none where nothing is sent
        self.codec_fb, self.codec_bb, self.codec_fs, self.codec_bs = (
            4.0 / codec_bw if b < 4.0 and self.W > 1 else 0.0 for b in (self.fb, self.bb, self.fs, self.bs)
        )
        self.capacity_device = float(topo.device_memory)
        self.reserve = self.params.reserve_fraction * self.capacity_device
        self.capacity_host = float(topo.host_memory)
        self.host_reserve = self.params.host_reserve_fraction * self.capacity_host
        load = context.cache.load_factor
        self.cache_load_factor = load if topo.compute_device == "cuda" else None
        self.cache_algorithm = context.cache.algorithm.lower()
        self.cache_prefetch = bool(context.cache.prefetch_pipeline)

    # ---- building blocks -------------------------------------------------------------
    def row_bytes(self, cols: np.ndarray) -> np.ndarray:
        """Bytes moved to read one row of ``cols`` columns (rounded up to the access size)."""
        return np.ceil(cols * self.e / self.gran) * self.gran

    def opt_row_bytes(self, cols: np.ndarray) -> np.ndarray:
        """Optimizer-state bytes per row of a shard with ``cols`` columns."""
        kernel = self.context.kernel
        per_row = kernel.optimizer_state_bytes(1, 1)  # rowwise: 4 bytes per row
        per_elem = kernel.optimizer_state_bytes(1, 2) - per_row  # elementwise part
        return per_row - per_elem + per_elem * cols

    @staticmethod
    def block_penalty(cols: np.ndarray) -> np.ndarray:
        """Slowdown of the GPU lookup kernel for shards narrower than a full block."""
        cols = np.asarray(cols, dtype=np.float64)
        return np.where(
            cols >= FULL_BLOCK_COLS, 1.0, np.where(cols >= 64, HALF_BLOCK_PENALTY, QUARTER_BLOCK_PENALTY)
        )

    def seconds_per_byte(self, placement: str, hot: np.ndarray) -> np.ndarray:
        """Seconds per byte of lookup traffic where the rows live."""
        if placement == CACHED and self.cache_load_factor is not None:
            hit = cache_hit_rate(self.cache_load_factor, hot)
            return hit / self.dev_bw + (1.0 - hit) * (1.0 / self.h2d_bw + 1.0 / self.dev_bw)
        return np.full(hot.shape, 1.0 / self.dev_bw)

    def _lookup(
        self,
        t: TableArrays,
        n_ids: np.ndarray,
        n_out: np.ndarray,
        cols: np.ndarray,
        placement: str,
        fused: bool = True,
        block_terms: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward lookup time of one shard.

        ``block_terms``: apply the GPU block penalty and the 32-column minimum read (TorchRec
        applies them to the table-wise family TW/CW/TWCW only; see ``FULL_BLOCK_COLS``).
        """
        spb = self.seconds_per_byte(placement, t.hot)  # the rows' bytes, where they live
        dev = np.full(spb.shape, 1.0 / self.dev_bw)  # bytes in device memory
        cuda = self.context.topology.compute_device == "cuda"
        if cuda and block_terms:
            spb, dev = spb * self.block_penalty(cols), dev * self.block_penalty(cols)
        if cuda and not fused:
            spb, dev = spb / DENSE_KERNEL_BW_FACTOR, dev / DENSE_KERNEL_BW_FACTOR
        rb = self.row_bytes(cols)
        if cuda and block_terms:  # a warp reads at least 32 columns
            rb = self.row_bytes(np.maximum(cols, MIN_LOOKUP_COLS))
        if fused and placement == CACHED and self.cache_load_factor is not None:
            # FBGEMM's UVM cache: the forward's prefetch brings missed rows into the device cache
            # (spb: hit or miss) and writes the rows it evicts back over the host link. The ids,
            # pooled rows, their gradients, the backward's update of the cached rows and row-wise
            # optimizer state are device memory; element-wise state stays in host memory, uncached
            miss = 1.0 - cache_hit_rate(self.cache_load_factor, t.hot)
            state = self.opt_row_bytes(cols)
            on_device = state if self.rowwise_state() else np.zeros_like(state)
            host = (1.0 / self.h2d_bw + 1.0 / self.dev_bw) * dev * self.dev_bw  # with the block penalty
            fwd = (n_ids * self.ib + n_out * cols * self.ob) * dev + n_ids * rb * spb
            bwd = ((n_out * cols * self.ob + 2.0 * n_ids * (rb + on_device)) * dev
                   + 2.0 * n_ids * (state - on_device) * host + n_ids * miss * rb / self.h2d_bw)
        else:
            fwd = (n_ids * (self.ib + rb) + n_out * cols * self.ob) * spb
            if fused:  # read output grads; read+write each touched row and its optimizer state
                bwd = (n_out * cols * self.ob + n_ids * 2.0 * (rb + self.opt_row_bytes(cols))) * spb
            elif cuda:  # dense kernel: read the ids again, scatter-add (read+write) each row's gradient
                bwd = (n_out * cols * self.ob + n_ids * (self.ib + 2.0 * rb)) * spb
            else:  # dense kernel on CPU (calibrated as is): scatter gradients into a dense buffer
                bwd = (n_out * cols * self.ob + n_ids * rb) * spb
        if self.id_fwd or self.id_bwd:  # calibrated per-id costs (CPU calibration)
            fwd = fwd + n_ids * self.id_fwd
            bwd = bwd + n_ids * (self.id_bwd if fused else self.id_fwd)
        return fwd, bwd

    def rowwise_state(self) -> bool:
        """The optimizer keeps one state per row, not per element (row-wise Adagrad, SGD)."""
        kernel = self.context.kernel
        return kernel.optimizer_state_bytes(1, 2) == kernel.optimizer_state_bytes(1, 1)

    def _memory(
        self, rows: np.ndarray, cols: np.ndarray, placement: str
    ) -> tuple[np.ndarray, ...]:
        rows_f = rows.astype(np.float64)
        weights = rows_f * cols * self.e
        opt = rows_f * self.opt_row_bytes(cols)
        zero = np.zeros_like(weights)
        if placement == CACHED and self.cache_load_factor is not None:
            # FBGEMM's UVM cache (split_table_batched_embeddings_ops_training): the cached rows,
            # and its state in device memory: a 4-byte table map per row, 8 bytes of cache
            # state per slot, the LRU's 8 bytes per slot or the LFU's 8-byte counter per row,
            # and with a prefetch pipeline a 4-byte lock counter per slot. FBGEMM sizes a table
            # batch's cache in sets of 32 slots (at least one set) and its LFU counters for one
            # more row than the batch has: rounding each shard up holds any batch of them
            slots = np.ceil(np.ceil(rows_f * self.cache_load_factor) / CACHE_ASSOC) * CACHE_ASSOC
            lfu = rows_f * 8 + np.where(rows_f > 0, 8.0, 0.0)
            state = rows_f * 4 + slots * 8 + (lfu if self.cache_algorithm == "lfu" else slots * 8)
            if self.cache_prefetch:
                state = state + slots * 4
            cache = slots * cols * self.e + state
            # row-wise optimizer state stays in device memory (construct_split_state: "if
            # optimizer state is rowwise, optimizer is on device"); element-wise state goes to
            # host memory with the weights
            if self.rowwise_state():
                return cache + opt, weights, weights, opt, zero, cache
            return cache, weights + opt, weights, opt, zero, cache
        return weights + opt, zero, weights, opt, zero, zero

    # ---- options ---------------------------------------------------------------------
    def costs(
        self,
        t: TableArrays,
        sharding_type: ShardingType,
        num_col_shards: int | np.ndarray = 1,
        placement: str = DEVICE,
    ) -> ShardCosts:
        """Per-shard costs for every table under one option.

        ``num_col_shards`` is the number of column shards for CW, TWCW and GRID.
        """
        n = len(t)
        d = t.dims.astype(np.float64)
        F = t.features  # pooled rows per sample: one per feature reading the table
        P = t.pooling * F  # ids per sample over its features
        G, B, W, L = self.G, self.B, float(self.W), float(self.L)
        time = np.zeros((n, K))
        k = np.broadcast_to(np.asarray(num_col_shards, dtype=np.float64), (n,))
        st = ShardingType(sharding_type)
        topo = self.context.topology
        if st is ShardingType.DATA_PARALLEL:
            rows = t.rows
            fwd, bwd = self._lookup(t, B * P, B * F, d, DEVICE, fused=False)
            time[:, CF], time[:, CB] = fwd, bwd
            table_bytes = rows.astype(np.float64) * d * 4.0  # dense fp32 gradient
            weights = rows.astype(np.float64) * d * self.e
            # torch.optim steps replicas (SparseOptimizer.replica_optimizer: no row-wise Adagrad)
            opt = rows.astype(np.float64) * d * self.context.kernel.replica_state_bytes(1, 1)  # per element
            # read grad, read+write weights and optimizer state, once per step, on every rank;
            # at least torch.optim's measured passes over the table (DP_OPTIMIZER_PASSES) at the
            # copy bandwidth they were measured against (the device's on GPUs, the host's,
            # which CPU calibration measures by a copy, on CPUs)
            passes = DP_OPTIMIZER_PASSES[self.context.kernel.replica_optimizer.value]
            copy_bw = self.dev_bw if topo.compute_device == "cuda" else self.host_bw
            time[:, OPT] = np.maximum((table_bytes + 2 * weights + 2 * opt) / self.dev_bw, passes * weights / copy_bw)
            if topo.compute_device == "cpu":  # an effective 5 passes over the dense gradient at
                # copy bandwidth, which the fidelity runs' DP layouts check (docs/cost_model.md)
                time[:, OPT] += 5.0 * table_bytes / self.host_bw
            time[:, CAR] = table_bytes * (
                2 * (L - 1) / L / self.allreduce_bw
                + 2 * (self.N - 1) / self.N / L / topo.inter_node_bw
            )
            zero = np.zeros(n)
            batch = B * P * self.ib + B * F * d * self.ob
            return ShardCosts(time, weights + opt + table_bytes + batch, zero, weights, opt, table_bytes, zero, batch)
        if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            cols = d if st is ShardingType.TABLE_WISE else d / k
            rows = t.rows
            ids = G * P
            fwd, bwd = self._lookup(t, ids, G * F, cols, placement, block_terms=True)
            time[:, CF], time[:, CB] = fwd, bwd
            time[:, CIN] = G * P * self.ib * self.a2a
            time[:, CMF] = G * F * cols * (self.fb * self.a2a + self.codec_fb)
            time[:, CMB] = G * F * cols * (self.bb * self.a2a + self.codec_bb)
        elif st is ShardingType.ROW_WISE:
            cols = d
            rows = np.ceil(t.rows / W).astype(np.int64)
            ids = G * P / W
            fwd, bwd = self._lookup(t, ids, G * F, cols, placement)
            time[:, CF], time[:, CB] = fwd, bwd
            time[:, CIN] = G * P / W * (self.ib * self.a2a + self.id_bucketize)
            # reduce-scatter of pooled partial sums; all-gather of their gradients
            time[:, CMF] = G * F * cols * (self.fs_time * self.a2a * self.rs_factor + self.codec_fs)
            time[:, CMB] = G * F * cols * (self.bs * (self.a2a * self.ag_factor + self.batched_copy) + self.codec_bs)
        elif st in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD):
            cols = d if st is ShardingType.TABLE_ROW_WISE else d / k
            rows = np.ceil(t.rows / L).astype(np.int64)
            ids = G * P / L
            fwd, bwd = self._lookup(t, ids, G * F, cols, placement)
            time[:, CF], time[:, CB] = fwd, bwd
            buckets = G * P / L * self.id_bucketize / (1.0 if st is ShardingType.TABLE_ROW_WISE else k)
            time[:, CIN] = G * P / L * self.ib * self.a2a + buckets
            intra = (L - 1) / L / topo.intra_node_bw
            # reduce-scatter inside the node, then each rank's 1/L of the samples goes to the ranks
            # of its local rank on the other nodes (TorchRec's cross-node group): (N-1)/N of it leaves
            cross = (self.N - 1) / self.N / topo.inter_node_bw
            # the codec: the reduce-scatter inside the node, then the rank's 1/L sent across
            across = 1.0 / L if self.N > 1 else 0.0
            codec_f = (self.codec_fs if L > 1 else 0.0) + self.codec_fb * across
            codec_b = (self.codec_bs if L > 1 else 0.0) + self.codec_bb * across
            time[:, CMF] = G * F * cols * (self.fs_time * intra * self.rs_factor + self.fb * cross / L + codec_f)
            time[:, CMB] = G * F * cols * (
                self.bs * (intra * self.ag_factor + self.batched_copy) + self.bb * cross / L + codec_b)
        else:  # pragma: no cover - all members handled above
            raise ValueError(st)
        mem_dev, mem_host, weights, opt, grads, cache = self._memory(rows, cols, placement)
        batch = ids * self.ib + G * F * cols * self.ob  # the ids it looks up, the pooled rows it writes
        return ShardCosts(time, mem_dev + batch, mem_host, weights, opt, grads, cache, batch)

    def comm_bytes(
        self, t: TableArrays, sharding_type: ShardingType, num_col_shards: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bytes one shard's collectives move per step (input ids, pooled outputs, their
        gradients, all-reduce), split into (intra-node, inter-node), charged to the shard's rank
        as the time formulas charge them (the ranks that send its ids are not charged).

        An all-to-all spread evenly over all ranks keeps ``(L-1)/W`` of its bytes inside the
        node; TWRW/GRID reduce-scatter inside the node first and send ``1/L`` to the ranks of the
        same local rank on the other nodes (``(N-1)/N`` of it across); data parallel
        all-reduces hierarchically.
        """
        d = t.dims.astype(np.float64)
        F = t.features  # pooled rows per sample; ids per sample over its features below
        P, G, W, L, N = t.pooling * F, self.G, float(self.W), float(self.L), float(self.N)
        st = ShardingType(sharding_type)
        a2a_in, a2a_out = (L - 1) / W, (W - L) / W
        if st is ShardingType.DATA_PARALLEL:
            S = t.rows.astype(np.float64) * d * 4.0
            return S * 2 * (L - 1) / L, S * 2 * (N - 1) / N / L
        cols = d / num_col_shards if st in (
            ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD
        ) else d
        out = G * F * cols * (self.fb + self.bb)
        scattered = G * F * cols * (self.fs + self.bs)  # reduce-scatter and its backward
        if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            sent = G * P * self.ib + out
            return sent * a2a_in, sent * a2a_out
        if st is ShardingType.ROW_WISE:
            sent = G * P / W * self.ib + scattered
            return sent * a2a_in, sent * a2a_out
        ids = G * P / L * self.ib  # TWRW, GRID: ids to the table's node over every rank,
        across = out / L * (N - 1) / N  # pooled rows to the same local rank of the other nodes
        return ids * a2a_in + scattered * (L - 1) / L, ids * a2a_out + across

    def host_link_bytes(
        self, t: TableArrays, sharding_type: ShardingType, num_col_shards: int = 1
    ) -> np.ndarray:
        """Bytes one cached shard moves over its rank's host link per step, as the time formulas
        of ``_lookup`` charge them at ``1/H``: the missed rows read into the device cache, as many
        evicted rows written back, and element-wise optimizer state (left in host memory) read
        and written for each id; zero without a cache (CPU topologies, no load factor) and for
        data parallel, which is never cached."""
        n = len(t)
        st = ShardingType(sharding_type)
        if self.cache_load_factor is None or st is ShardingType.DATA_PARALLEL:
            return np.zeros(n)
        d = t.dims.astype(np.float64)
        P = t.pooling * t.features  # ids per sample over the table's features
        k = float(num_col_shards)
        split_cols = st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)
        cols = d / k if split_cols else d
        ids = self.G * P / {ShardingType.ROW_WISE: float(self.W), ShardingType.TABLE_ROW_WISE: float(self.L),
                            ShardingType.GRID_SHARD: float(self.L)}.get(st, 1.0)
        table_wise = st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)
        # the table-wise family reads at least 32 columns a row on GPUs (``block_terms``)
        cuda = self.context.topology.compute_device == "cuda"
        rb = self.row_bytes(np.maximum(cols, MIN_LOOKUP_COLS) if cuda and table_wise else cols)
        miss = 1.0 - cache_hit_rate(self.cache_load_factor, t.hot)
        state = self.opt_row_bytes(cols)
        host_state = np.zeros_like(state) if self.rowwise_state() else state
        return ids * (2.0 * miss * rb + 2.0 * host_state)

    def latency_time(self, types_used: set[str]) -> float:
        """Fixed collective latency per step: three all-to-alls per sharding type, one all-reduce."""
        n = sum(3 for s in types_used if s != ShardingType.DATA_PARALLEL.value)
        n += 1 if ShardingType.DATA_PARALLEL.value in types_used else 0
        return n * self.latency if self.W > 1 else 0.0
