"""Terms of the cost model that the worked figures of ``test_cost_formulas.py`` leave untested,
each against docs/cost_model.md worked out by hand, or against a relation the formula implies.

They pin the edges those figures do not reach: a cache under 1% of the rows, the block penalty
on a cached shard's device and host terms, row-split shards narrower than 32 columns, forward
and backward compressors of different precisions, the calibrated CPU terms of TWRW, GRID and
data parallel, data parallel's fp32 gradient with fp16 weights and its optimizer's byte term,
the cache's prefetch counters and element-wise state in host memory, row splits that do not
divide, the latency's precedence, the Topology's own helpers, the ZionEX figures per rank,
the fits ``neo calibrate`` makes of its timings (fed synthetic ones, so no measuring), and
scoring with TorchRec's estimator: column widths, shard counts, its bound and host tables.

Same round cluster as ``test_cost_formulas.py``: 2 nodes x 4 ranks; device memory 1e12 B/s,
host to device 1e10, intra-node 1e11, inter-node 1e10, host memory 5e10; 100 samples per rank
(G = 800); fp32 weights and row-wise Adagrad unless a test says otherwise.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from neo_core.api import make_context
from neo_core.cache import CachePolicy
from neo_core.compression import Compressor
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import ShardingType, TableSpec
from neo_core.topology import GB, GiB, Topology
from neo_plugins.sharding.planner import calibrate
from neo_plugins.sharding.planner.cost import CACHED, CostModel, CostParams, TableArrays, cache_hit_rate
from neo_plugins.topology.zionex import zionex_topology

A = 5.375e-11  # all-to-all seconds per byte: (3/8)/1e11 + (4/8)/1e10
INTRA = 0.75 / 1e11  # (L-1)/(L X)
CROSS = 0.5 / 1e10  # (N-1)/(N I)
COPY = 2.455 / 1e12  # batched copy of gathered gradients (GPU row-split types)
CODEC = 12 / 1e12  # compression's codec per value on GPUs: read 4, write 2, read 2, write 4 bytes at 1e12
MISS = 1 / 1e10 + 1 / 1e12  # a row read from host memory through the cache: 1/H + 1/M
KINDS = ("compute_fwd", "compute_bwd", "optimizer", "comm_input", "comm_fwd", "comm_bwd", "comm_allreduce")


def topology(device: str = "cuda", nodes: int = 2, per_node: int = 4, **changes) -> Topology:
    figures = dict(
        name="round", num_nodes=nodes, devices_per_node=per_node, compute_device=device,
        device_memory=10**11, host_memory=10**12, device_memory_bw=1e12, host_memory_bw=5e10,
        host_to_device_bw=1e10, intra_node_bw=1e11, inter_node_bw=1e10,
    )
    return Topology(**{**figures, **changes})


def costs(stype: str, rows: int = 1000, dim: int = 128, k: int = 1, placement: str = "device",
          features: tuple[str, ...] = ("f",), hot: float | None = None, topo: Topology | None = None,
          kernel=None, compressor=None, cache=None) -> dict[str, float]:
    ctx = make_context(topo or topology(), 100, kernel=kernel, compressor=compressor, cache=cache)
    arrays = TableArrays.from_specs([TableSpec("t", rows, dim, 10.0, hot_fraction=hot, feature_names=features)])
    c = CostModel(ctx).costs(arrays, ShardingType(stype), k, placement)
    out = {kind: float(c.time[0, i]) for i, kind in enumerate(KINDS)}
    # memory, bytes per shard (``state``: the optimizer's, apart from its time above)
    for key, field in (("device", "mem_device"), ("host", "mem_host"), ("weights", "weights"), ("state", "optimizer"),
                       ("gradients", "gradients"), ("cache", "cache"), ("batch", "batch")):
        out[key] = float(getattr(c, field)[0])
    return out


def check(got: dict[str, float], **expected: float) -> None:
    for kind, value in expected.items():
        assert got[kind] == pytest.approx(value, rel=1e-9, abs=1e-18), (kind, got[kind], value)


def kernel(optimizer: SparseOptimizer = SparseOptimizer.ROWWISE_ADAGRAD, weight_bytes: int = 4) -> EmbeddingKernel:
    return EmbeddingKernel("k", "fused", optimizer, weight_bytes=weight_bytes)


# --- the cache ------------------------------------------------------------------------------


def test_a_cache_under_one_percent_of_the_rows_hits_in_proportion_to_the_hot_share():
    # h = q f / 0.01 below f = 1%: half the lookups on the hottest 1%, half a percent cached
    assert cache_hit_rate(0.005, np.array([0.5]))[0] == pytest.approx(0.25)
    assert cache_hit_rate(0.002, np.array([1.0]))[0] == pytest.approx(0.2)
    # the two branches meet at f = 1%: the cache holds exactly the hot rows
    assert cache_hit_rate(0.01, np.array([0.3]))[0] == pytest.approx(0.3)
    # uniform access: h = f whatever f
    assert cache_hit_rate(0.005, np.array([np.nan]))[0] == pytest.approx(0.005)


def test_a_cached_narrow_shard_pays_the_block_penalty_on_its_device_terms_not_its_write_back():
    # CW x2 of 128 columns: c = 64, penalty 1.15, rb = 256; h = 0.1 (uniform)
    lru = CachePolicy("lru", load_factor=0.1)
    spb = 0.1 / 1e12 + 0.9 * MISS
    check(
        costs("column_wise", k=2, placement=CACHED, cache=lru),
        compute_fwd=1.15 * ((8000 * 8 + 800 * 64 * 4) / 1e12 + 8000 * 256 * spb),
        compute_bwd=1.15 * (800 * 64 * 4 + 2 * 8000 * (256 + 4)) / 1e12 + 8000 * 0.9 * 256 / 1e10,
    )
    # element-wise state (Adagrad, 4c = 256 bytes a row) in host memory pays it too
    check(
        costs("column_wise", k=2, placement=CACHED, cache=lru, kernel=kernel(SparseOptimizer.ADAGRAD)),
        compute_bwd=1.15 * ((800 * 64 * 4 + 2 * 8000 * 256) / 1e12 + 2 * 8000 * 256 * MISS)
        + 8000 * 0.9 * 256 / 1e10,
    )
    # c = 16: read as 32 columns (rb = 128) by the kernel and by the write-back; penalty 1.75
    check(
        costs("column_wise", k=8, placement=CACHED, cache=lru),
        compute_bwd=1.75 * (800 * 16 * 4 + 2 * 8000 * (128 + 4)) / 1e12 + 8000 * 0.9 * 128 / 1e10,
    )


def test_a_cache_with_a_prefetch_pipeline_keeps_a_lock_counter_per_slot():
    # 100 rows cached: 128 slots; state = 4 rows + 8 slots + 8 slots (LRU) + 4 slots (prefetch)
    plain = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1))
    piped = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1, prefetch_pipeline=True))
    check(piped, cache=128 * 128 * 4 + 4 * 1000 + 8 * 128 + 8 * 128 + 4 * 128)
    assert piped["device"] - plain["device"] == pytest.approx(4 * 128)


def link_bytes(stype: str, dim: int = 128, k: int = 1, hot: float | None = None, kernel=None,
               cache=None, topo: Topology | None = None) -> float:
    """``CostModel.host_link_bytes`` of one table of 1000 rows and pooling 10 (G P = 8000 ids)."""
    ctx = make_context(topo or topology(), 100, kernel=kernel, cache=cache or CachePolicy("lru", load_factor=0.1))
    arrays = TableArrays.from_specs([TableSpec("t", 1000, dim, 10.0, hot_fraction=hot, feature_names=("f",))])
    return float(CostModel(ctx).host_link_bytes(arrays, ShardingType(stype), k)[0])


def test_a_cached_shards_host_link_bytes_are_its_misses_read_and_written_back_and_host_state():
    # 8000 ids, 90% missed, 512-byte rows: each miss reads a row in and writes an evicted one back
    assert link_bytes("table_wise") == pytest.approx(8000 * 0.9 * 512 * 2)
    # element-wise Adagrad's state stays in host memory: read and written for each id (512 bytes)
    assert link_bytes("table_wise", kernel=kernel(SparseOptimizer.ADAGRAD)) == pytest.approx(
        8000 * (0.9 * 512 * 2 + 2 * 512))
    # a row split has its share of the ids (RW 1/8, TWRW 1/4); the hot share raises the hit rate
    assert link_bytes("row_wise") == pytest.approx(1000 * 0.9 * 512 * 2)
    assert link_bytes("table_row_wise", hot=0.5) == pytest.approx(2000 * (1 - (0.5 + 0.5 * 0.09 / 0.99)) * 512 * 2)
    # a 16-column shard is read as 32 columns by the table-wise family, not by a row split
    assert link_bytes("column_wise", dim=64, k=4) == pytest.approx(8000 * 0.9 * 128 * 2)
    assert link_bytes("grid_shard", dim=32, k=2) == pytest.approx(2000 * 0.9 * 64 * 2)
    # nothing crosses the host link without a cache, on CPUs, or for a replica
    assert link_bytes("table_wise", cache=CachePolicy("lru")) == 0.0
    assert link_bytes("table_wise", topo=topology("cpu")) == 0.0
    assert link_bytes("data_parallel") == 0.0


@pytest.mark.parametrize("stype, dim, k", [("table_wise", 128, 1), ("column_wise", 256, 2), ("row_wise", 128, 1),
                                           ("table_row_wise", 128, 1), ("grid_shard", 256, 2)])
@pytest.mark.parametrize("optimizer", [SparseOptimizer.ROWWISE_ADAGRAD, SparseOptimizer.ADAGRAD])
def test_host_link_bytes_are_what_the_cached_time_charges_to_the_host_link(stype, dim, k, optimizer):
    # full 128-column shards (no block penalty): the time's 1/H terms are the bytes over H
    lru = CachePolicy("lru", load_factor=0.1)
    times = [costs(stype, dim=dim, k=k, placement=CACHED, hot=0.3, cache=lru, kernel=kernel(optimizer),
                   topo=topology(host_to_device_bw=bw)) for bw in (1e10, 2e10)]
    charged = sum(times[0][c] - times[1][c] for c in ("compute_fwd", "compute_bwd"))
    moved = link_bytes(stype, dim=dim, k=k, hot=0.3, cache=lru, kernel=kernel(optimizer))
    assert moved > 0 and charged == pytest.approx(moved * (1 / 1e10 - 1 / 2e10), rel=1e-9)


def test_cached_rows_are_stored_at_the_kernels_weight_precision():
    # fp16 weights: the cache holds 128 slots of 128 columns at 2 bytes, the host the table at 2
    got = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1), kernel=kernel(weight_bytes=2))
    check(got, cache=128 * 128 * 2 + 4 * 1000 + 8 * 128 + 8 * 128, host=1000 * 128 * 2)


def test_element_wise_state_of_a_cached_table_lives_in_host_memory_with_its_weights():
    got = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1),
                kernel=kernel(SparseOptimizer.ADAGRAD))
    # host: weights 4 R d + Adagrad's 4 R d; device: the cache and its state, and the batch only
    check(got, host=1000 * 128 * 4 + 1000 * 128 * 4,
          device=128 * 128 * 4 + 4 * 1000 + 8 * 128 + 8 * 128 + 8000 * 8 + 800 * 128 * 4)


# --- lookups and communication --------------------------------------------------------------


def test_row_split_shards_narrower_than_32_columns_are_read_at_their_own_width():
    # GRID x8 of 128 columns: c = 16, rb = 64 (no 32-column minimum, no penalty), n = 2000 ids
    check(
        costs("grid_shard", k=8),
        compute_fwd=(2000 * (8 + 64) + 800 * 16 * 4) / 1e12,
        compute_bwd=(800 * 16 * 4 + 2 * 2000 * (64 + 4)) / 1e12,
    )


def test_data_parallel_is_costed_at_its_plain_width_on_gpus():
    # dim 64: no 1.15 block penalty for the dense kernel, only its half bandwidth
    check(costs("data_parallel", dim=64), compute_fwd=(1000 * (8 + 256) + 100 * 64 * 4) / 5e11)


def test_forward_and_backward_compressors_are_charged_apart():
    # fp16 forward, fp32 backward: fb = fs = 2, bb = bs = 4
    mixed = Compressor("m", "fp16", "fp32")
    # (the codec runs in the compressed direction alone)
    check(costs("table_wise", compressor=mixed), comm_fwd=800 * 128 * (2 * A + CODEC), comm_bwd=800 * 128 * 4 * A)
    check(costs("row_wise", compressor=mixed), comm_fwd=800 * 128 * (2 * A + CODEC),
          comm_bwd=800 * 128 * 4 * (A + COPY))
    check(costs("table_row_wise", compressor=mixed), comm_fwd=800 * 128 * (2 * (INTRA + CROSS / 4) + CODEC * 1.25),
          comm_bwd=800 * 128 * 4 * (INTRA + COPY + CROSS / 4))
    # fp32 forward, fp8 backward: the all-gather goes as bf16 (bs = 2), the cross-node stage at 1
    back8 = Compressor("b", "fp32", "fp8")
    check(costs("table_row_wise", compressor=back8), comm_fwd=800 * 128 * 4 * (INTRA + CROSS / 4),
          comm_bwd=800 * 128 * (2 * (INTRA + COPY) + 1 * CROSS / 4 + CODEC * 1.25))


def test_calibrated_cpu_figures_scale_the_hierarchical_types_intra_node_stage():
    # X / reduce_scatter_bw = 4, X / all_gather_bw = 2; no batched copy on CPUs; 2000 ids a shard
    cpu = topology("cpu", reduce_scatter_bw=0.25e11, all_gather_bw=0.5e11, bucketize_id_s=1e-9)
    check(costs("table_row_wise", topo=cpu), comm_input=2000 * (8 * A + 1e-9),
          comm_fwd=800 * 128 * 4 * (4 * INTRA + CROSS / 4), comm_bwd=800 * 128 * 4 * (2 * INTRA + CROSS / 4))
    # GRID x2: c = 64; its ids are bucketized once over the k column shards
    check(costs("grid_shard", k=2, topo=cpu), comm_input=2000 * (8 * A + 1e-9 / 2),
          comm_fwd=800 * 64 * 4 * (4 * INTRA + CROSS / 4), comm_bwd=800 * 64 * 4 * (2 * INTRA + CROSS / 4))


def test_calibrated_per_id_costs_of_the_dense_kernel_and_of_a_backward_alone():
    # the dense kernel's backward takes the forward's per-id cost (docs: "dense kernel: lookup_fwd_id_s")
    cpu = topology("cpu", lookup_fwd_id_s=2e-9, lookup_bwd_id_s=3e-9)
    check(costs("data_parallel", topo=cpu), compute_fwd=(1000 * (8 + 512) + 100 * 128 * 4) / 1e12 + 1000 * 2e-9,
          compute_bwd=(100 * 128 * 4 + 1000 * 512) / 1e12 + 1000 * 2e-9)
    # a backward figure with no forward one is still charged
    only_bwd = topology("cpu", lookup_bwd_id_s=3e-9)
    check(costs("table_wise", topo=only_bwd), compute_fwd=(8000 * (8 + 512) + 800 * 128 * 4) / 1e12,
          compute_bwd=(800 * 128 * 4 + 2 * 8000 * (512 + 4)) / 1e12 + 8000 * 3e-9)


# --- data parallel --------------------------------------------------------------------------


def test_data_parallel_gradients_are_fp32_whatever_the_weights_precision():
    S = 4 * 1000 * 128
    fp16 = costs("data_parallel", kernel=kernel(weight_bytes=2))
    # weights R d e = 2 bytes, torch.optim's Adagrad 4 bytes per element, gradient 4 R d
    check(fp16, weights=1000 * 128 * 2, state=1000 * 128 * 4, optimizer=max((S + 2 * 256_000 + 2 * 512_000) / 1e12, 14.8 * 256_000 / 1e12),
          gradients=S, comm_allreduce=S * (2 * 3 / 4 / 1e11 + 2 * 1 / 2 / 4 / 1e10))
    # so its all-reduce is the fp32 one's
    assert fp16["comm_allreduce"] == pytest.approx(costs("data_parallel")["comm_allreduce"])
    # on CPUs the 5 passes over the dense gradient are over its fp32 bytes too
    cpu = costs("data_parallel", topo=topology("cpu"), kernel=kernel(weight_bytes=2))
    check(cpu, optimizer=max((S + 2 * 256_000 + 2 * 512_000) / 1e12, 14.8 * 256_000 / 5e10) + 5 * S / 5e10)


def test_data_parallel_optimizer_reads_the_gradient_and_reads_and_writes_weights_and_state():
    # a host copy bandwidth of 1e13 makes torch.optim's passes (14.8 W / 1e13) cheaper than the
    # bytes at M, so the byte term (S + 2 W + 2 s') / M is the figure
    S = W = state = 4 * 1000 * 128  # fp32 gradient, fp32 weights, Adagrad replica (4 bytes per element)
    fast_copy = topology("cpu", host_memory_bw=1e13)
    check(costs("data_parallel", topo=fast_copy), optimizer=(S + 2 * W + 2 * state) / 1e12 + 5 * S / 1e13)
    # Adam's replica state is 8 bytes per element
    check(costs("data_parallel", topo=fast_copy, kernel=kernel(SparseOptimizer.ADAM)),
          optimizer=(S + 2 * W + 2 * 2 * state) / 1e12 + 5 * S / 1e13)


def test_a_calibrated_all_reduce_bandwidth_replaces_x_in_the_intra_node_part_only():
    S = 4 * 1000 * 128
    cpu = topology("cpu", allreduce_bw=0.5e11)
    check(costs("data_parallel", topo=cpu), comm_allreduce=S * (2 * 3 / 4 / 0.5e11 + 2 * 1 / 2 / 4 / 1e10))


def test_a_replica_read_by_two_features_holds_both_features_pooled_rows():
    # B P F = 2000 ids and B F = 200 pooled rows of 128 columns on every replica
    check(costs("data_parallel", features=("a", "b")), batch=2000 * 8 + 200 * 128 * 4)


# --- memory of row splits, the reserve ------------------------------------------------------


def test_a_row_split_that_does_not_divide_is_charged_for_its_largest_shard():
    # 1001 rows: RW over 8 ranks, ceil = 126 rows; TWRW over a node's 4 ranks, ceil = 251
    check(costs("row_wise", rows=1001), weights=126 * 128 * 4, state=126 * 4)
    check(costs("table_row_wise", rows=1001), weights=251 * 128 * 4, state=251 * 4)


def test_the_reserves_are_their_fraction_of_memory_once():
    ctx = make_context(topology(), 100)
    model = CostModel(ctx, CostParams(reserve_fraction=0.2, host_reserve_fraction=0.1))
    assert model.reserve == pytest.approx(0.2 * 10**11)
    assert model.host_reserve == pytest.approx(0.1 * 10**12)


# --- latency --------------------------------------------------------------------------------


def test_one_rank_pays_no_collective_latency_and_a_set_latency_overrides_the_calibrated_one():
    one = CostModel(make_context(topology(nodes=1, per_node=1), 100))
    assert one.latency_time({"table_wise", "data_parallel"}) == 0.0
    measured = topology("cpu", collective_latency_s=1e-3)
    assert CostModel(make_context(measured, 100)).latency_time({"table_wise"}) == pytest.approx(3e-3)
    given = CostModel(make_context(measured, 100), CostParams(collective_latency_s=2e-4))
    assert given.latency_time({"table_wise"}) == pytest.approx(6e-4)


# --- Topology and ZionEX --------------------------------------------------------------------


def test_a_setting_is_rounded_up_to_whole_nodes_or_a_tenth_of_its_unit():
    topo = topology(config_keys={"num_nodes": ("topology.num_nodes", 4), "device_memory": ("topology.device_memory_gib", GiB)})
    assert topo.setting_value("num_nodes", 9) == 3  # 9 ranks need 3 nodes of 4
    assert topo.setting_value("num_nodes", 8) == 2
    assert topo.setting_value("device_memory", 40.01 * GiB) == pytest.approx(40.1)
    assert topo.setting_value("device_memory", 40.0 * GiB) == pytest.approx(40.0)


def test_a_setting_at_exactly_its_limit_is_within_it():
    topo = topology(config_keys={"device_memory": ("topology.memory_fraction", 10 * GiB)},
                    config_limits={"device_memory": 1.0})
    assert topo.beyond_limit("device_memory", 10 * GiB) is None
    assert topo.beyond_limit("device_memory", 10.5 * GiB) == "10.00 GiB a rank at most (topology.memory_fraction=1)"


def test_torchrec_gets_the_topologys_figures_in_bytes_per_ms_and_a_cpu_ranks_memory_as_ddr():
    tr = topology().to_torchrec()
    assert (tr.intra_host_bw, tr.inter_host_bw) == pytest.approx((1e8, 1e7))
    assert (tr.hbm_mem_bw, tr.ddr_mem_bw, tr.hbm_to_ddr_mem_bw) == pytest.approx((1e9, 5e7, 1e7))
    cpu = topology("cpu").to_torchrec()
    assert cpu.devices[0].storage.ddr == 10**11  # a CPU rank's tables are in its own memory, Neo's device memory


def test_an_emulated_topology_keeps_its_nodes_apart_where_the_ranks_allow():
    # 2 nodes x 4 on 4 ranks: 2 nodes of 2, not 4 nodes of 1
    small = topology().emulated_on(4, "cpu")
    assert (small.num_nodes, small.devices_per_node) == (2, 2)


def test_ranks_are_numbered_node_by_node():
    # torch.distributed's launchers (and TorchRec's local rank, rank % L) number a node's ranks
    # together: 2 nodes x 4, ranks 0-3 on node 0 and 4-7 on node 1
    assert [topology().node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]

def test_topology_edges_a_bandwidth_of_1_mb_per_s_and_a_latency_of_0_are_accepted():
    assert topology(inter_node_bw=1e6).inter_node_bw == 1e6
    assert topology(collective_latency_s=0.0).collective_latency_s == 0.0


def test_zionex_shares_a_nodes_host_memory_and_bandwidth_among_its_gpus(capsys):
    topo = zionex_topology(num_nodes=2, devices_per_node=8, host_memory_gib_per_node=1536.0,
                           host_memory_bw_gbps_per_node=400.0, inter_node_bw_gbps=100.0)
    assert topo.host_memory == 192 * GiB
    assert topo.host_memory_bw == pytest.approx(50 * GB)
    assert topo.setting_value("num_nodes", 17) == 3  # ranks, in nodes of 8
    assert topo.setting_value("host_memory", 200 * GiB) == pytest.approx(1600.0)  # per node
    assert capsys.readouterr().err == ""  # 100 GB/s is a NIC that exists: no warning


# --- neo calibrate's fits, fed synthetic timings ---------------------------------------------


def test_memory_bandwidth_counts_a_copys_read_and_write(monkeypatch):
    monkeypatch.setattr(calibrate, "_best", lambda fn, repeat=5: 1e-3)
    assert calibrate.memory_bandwidth(mib=1) == pytest.approx(2 * 2**20 / 1e-3)


def test_the_lookup_fit_recovers_the_bandwidth_and_per_id_costs_of_the_cost_models_bytes(monkeypatch):
    # a kernel that takes exactly the cost model's bytes / M + a per-id cost (docs: t_f, t_b on
    # CPUs with g = 64 and row-wise state s = 4): the fit must give back M and both intercepts
    M, fwd_id, bwd_id, pooling = 5e9, 3e-8, 7e-8, 16
    clock = [0.0]

    def rb(dim):
        return -(-dim * 4 // 64) * 64

    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, weight, n, dim):
            ctx.n, ctx.dim = n, dim
            clock[0] += n * ((8 + rb(dim) + dim * 4 / pooling) / M + fwd_id)
            return torch.zeros(n // pooling, dim)

        @staticmethod
        def backward(ctx, grad):
            clock[0] += ctx.n * ((2 * (rb(ctx.dim) + 4) + ctx.dim * 4 / pooling) / M + bwd_id)
            return torch.zeros(1), None, None

    class FakeTBE:
        def __init__(self, specs, **kwargs):
            self.dim = specs[0][1]
            self.weight = torch.zeros(1, requires_grad=True)

        def __call__(self, ids, offsets):
            return Step.apply(self.weight, ids.numel(), self.dim)

    import fbgemm_gpu.split_table_batched_embeddings_ops_training as tbe

    monkeypatch.setattr(tbe, "SplitTableBatchedEmbeddingBagsCodegen", FakeTBE)
    monkeypatch.setattr(calibrate, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    got = calibrate.lookup_costs(rows=100, dims=(10, 24, 64, 100), batch=64, pooling=pooling)
    assert got["device_memory_bw"] == pytest.approx(M, rel=1e-6)
    assert got["lookup_fwd_id_s"] == pytest.approx(fwd_id, rel=1e-6)
    assert got["lookup_bwd_id_s"] == pytest.approx(bwd_id, rel=1e-6)


def test_torchrec_overheads_recover_the_fixed_and_per_id_costs_of_synthetic_steps(monkeypatch):
    # two steps of one table-wise table (dim 16, rb = 64 at g = 64) on 2 ranks: each id costs the
    # kernel's bytes (8 + rb forward, 2 (rb + 4) backward) / M and the per-id intercepts; the
    # all-to-all sends the ids (8 bytes) and the pooled rows and their gradients (2 G d 4 bytes)
    # at (W-1)/W of the bytes over its bandwidth; the small step carries 3 fixed latencies, the
    # large one those and a per-id pipeline cost
    world, dim, M, a2a_bw, lat, pipeline = 2, 16, 4e9, 1e9, 5e-4, 2e-8
    kernel_costs = {"device_memory_bw": M, "lookup_fwd_id_s": 1e-8, "lookup_bwd_id_s": 3e-8}

    def step(batch, pooling, per_id_extra):
        ids = batch * pooling * world  # rank 0 holds the table: every rank's ids
        per_id = (8 + 64 + 2 * (64 + 4)) / M + 1e-8 + 3e-8 + per_id_extra
        sent = (ids * 8 + 2 * batch * world * dim * 4) * (world - 1) / world / a2a_bw
        return ids * per_id + sent + 3 * lat

    (b0, p0), (b1, p1) = calibrate._TORCHREC_SIZES
    times = [step(b0, p0, 0.0), step(b1, p1, pipeline)]
    monkeypatch.setattr(calibrate, "_spawn", lambda target, w: {"times": times, "dim": dim})
    got = calibrate.torchrec_overheads(world, kernel_costs, a2a_bw)
    assert got["collective_latency_s"] == pytest.approx(lat, rel=1e-9)
    assert got["lookup_fwd_id_s"] == pytest.approx(1e-8 + pipeline, rel=1e-9)


def test_all_reduce_bandwidth_counts_a_ring_all_reduces_two_passes(monkeypatch):
    # a ring all-reduce of S bytes sends 2 S (W-1)/W a rank (a reduce-scatter, then an
    # all-gather), so docs' allreduce_bw is 2 S (W-1)/W per second: collectives that all move
    # their bytes at one rate give that rate for the all-reduce as for the all-to-all
    import torch.distributed as dist

    rate, world, taken = 1e9, 2, []

    def sends(share):  # a collective whose rank sends share x its tensor's bytes, at `rate`
        def run(*tensors):
            taken.append(share * max(t.numel() for t in tensors) * 4 / rate)
        return run

    part = (world - 1) / world
    for name, share in (("all_to_all_single", part), ("all_reduce", 2 * part),
                        ("reduce_scatter_single", part), ("all_gather_single", part)):
        monkeypatch.setattr(dist, name, sends(share))
    for name in ("init_process_group", "barrier", "destroy_process_group"):
        monkeypatch.setattr(dist, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(calibrate, "_best", lambda fn, repeat=5: (fn(), taken[-1])[1])
    results = []
    calibrate._collectives(0, world, 0, types.SimpleNamespace(put=results.append))
    got = results[0]
    assert got["a2a"] == pytest.approx(rate) and got["allreduce"] == pytest.approx(rate)
    # so the cost model's all-reduce of the measured 8 MiB on one node of those 2 ranks
    # (S 2 (L-1)/(L allreduce_bw), docs) takes the time the all-reduce took
    measured = 2 * part * 8 * 2**20 / rate
    one_node = topology("cpu", nodes=1, per_node=world, allreduce_bw=got["allreduce"])
    check(costs("data_parallel", rows=2**14, dim=128, topo=one_node), comm_allreduce=measured)


# --- scoring with TorchRec's estimator ---------------------------------------------------------


def test_a_cached_options_kinds_are_torchrecs_own_perf_fields():
    # TorchRec's fwd_compute and bwd_compute land in compute_fwd and compute_bwd, its
    # prefetch_compute (the cache's; 0 without cache statistics) in comm_input
    # (torchrec_option_costs' docstring), each apart
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ParameterConstraints

    from neo_plugins.sharding.planner.cost import CB, CF, CIN
    from neo_plugins.sharding.planner.search import build_options
    from neo_plugins.sharding.planner.torchrec_score import meta_module, torchrec_option_costs
    from neo_plugins.sharding.sharders import make_sharders

    tables = [TableSpec("t", 100_000, 64, 8.0)]
    context = make_context({"name": "zionex", "num_nodes": 2, "devices_per_node": 4}, 512,
                           cache=CachePolicy("lru", load_factor=0.2))
    option = next(o for o in build_options(CostModel(context), TableArrays.from_specs(tables),
                                           {ShardingType.TABLE_WISE}, (), 16) if o.placement == CACHED)
    torchrec_option_costs([option], tables, context)
    topo = context.topology.to_torchrec()
    constraints = {"t": ParameterConstraints(pooling_factors=[8.0], sharding_types=["table_wise"],
                                             compute_kernels=["fused_uvm_caching"], cache_params=context.cache.cache_params())}
    enumerator = EmbeddingEnumerator(topo, 512, constraints, estimator=[EmbeddingPerfEstimator(topo, constraints)])
    perf = enumerator.enumerate(meta_module(tables, context), make_sharders(context))[0].shards[0].perf
    assert perf.fwd_compute != pytest.approx(perf.bwd_compute)
    got = option.cost.time[0] * 1e3
    assert (got[CF], got[CB], got[CIN]) == pytest.approx((perf.fwd_compute, perf.bwd_compute, perf.prefetch_compute))


def test_torchrecs_score_of_a_rank_sums_the_shards_it_holds():
    from neo_core.sharding import PlanResult, TableAssignment
    from neo_plugins.sharding.planner.torchrec_score import score_plan

    tables = [TableSpec("a", 100_000, 64, 8.0), TableSpec("b", 50_000, 128, 2.0)]
    context = make_context({"name": "zionex", "num_nodes": 1, "devices_per_node": 2}, 512)

    def score(names, ranks):
        chosen = [t for t in tables if t.name in names]
        plan = [TableAssignment(t.name, "table_wise", "fused", [r]) for t, r in zip(chosen, ranks)]
        return score_plan(chosen, PlanResult("given", plan, [], 512, {}), context)

    a, b = score("a", [0]), score("b", [0])
    assert score("ab", [0, 0]) == pytest.approx(a + b)  # one rank holds both
    assert score("ab", [0, 1]) == pytest.approx(max(a, b))  # one each


def test_int8_weights_are_configured_as_int8_for_torchrec():
    from torchrec.modules.embedding_configs import DataType

    from neo_plugins.sharding.planner.torchrec_score import meta_module

    tables = [TableSpec("t", 1000, 64, 1.0)]
    for weight_bytes, dtype in ((1, DataType.INT8), (2, DataType.FP16), (4, DataType.FP32)):
        ctx = make_context(topology(), 8, kernel=kernel(weight_bytes=weight_bytes))
        assert meta_module(tables, ctx).embedding_bag_configs()[0].data_type is dtype


def test_a_column_split_is_estimated_by_torchrec_at_the_options_width():
    # 128 columns in 2 shards of 64: TorchRec's own column split would keep 128 columns whole
    # (its MIN_CW_DIM), so the width is pinned; the option stays valid with the figures
    # TorchRec gives a 64-column shard
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ParameterConstraints

    from neo_plugins.sharding.planner.cost import CB, CF, CMB, CMF
    from neo_plugins.sharding.planner.search import build_options
    from neo_plugins.sharding.planner.torchrec_score import meta_module, torchrec_option_costs
    from neo_plugins.sharding.sharders import make_sharders

    tables = [TableSpec("t", 100_000, 128, 8.0)]
    context = make_context({"name": "zionex", "num_nodes": 1, "devices_per_node": 2}, 512)
    option = next(o for o in build_options(CostModel(context), TableArrays.from_specs(tables),
                                           {ShardingType.COLUMN_WISE}, (2,), 16))
    torchrec_option_costs([option], tables, context)
    assert option.valid[0]
    topo = context.topology.to_torchrec()
    constraints = {"t": ParameterConstraints(pooling_factors=[8.0], sharding_types=["column_wise"],
                                             compute_kernels=["fused"], min_partition=64)}
    enumerator = EmbeddingEnumerator(topo, 512, constraints, estimator=[EmbeddingPerfEstimator(topo, constraints)])
    shards = enumerator.enumerate(meta_module(tables, context), make_sharders(context))[0].shards
    assert [tuple(s.size) for s in shards] == [(100_000, 64)] * 2
    perf = shards[0].perf
    got = option.cost.time[0] * 1e3
    assert (got[CF], got[CB], got[CMF], got[CMB]) == pytest.approx(
        (perf.fwd_compute, perf.bwd_compute, perf.fwd_comms, perf.bwd_comms))


def test_a_column_split_torchrec_makes_with_another_shard_count_is_invalid():
    # 24 columns in 4 shards of 6: TorchRec widens a shard to a multiple of 4 that divides the
    # table (8: 3 shards), so it has no estimate of this option (torchrec_option_costs' docstring)
    from neo_plugins.sharding.planner.cost import DEVICE
    from neo_plugins.sharding.planner.search import ANY_K, Option
    from neo_plugins.sharding.planner.torchrec_score import torchrec_option_costs

    tables = [TableSpec("t", 1000, 24, 2.0)]
    context = make_context({"name": "zionex", "num_nodes": 1, "devices_per_node": 4}, 512)
    cw = ShardingType.COLUMN_WISE
    option = Option(cw, 4, DEVICE, ANY_K, 4, CostModel(context).costs(TableArrays.from_specs(tables), cw, 4, DEVICE),
                    np.array([True]))
    torchrec_option_costs([option], tables, context)
    assert not option.valid[0]


def test_a_single_tables_bound_is_its_cheapest_largest_shard_which_torchrecs_plan_reaches():
    # one table: no plan beats its option whose largest shard is smallest, and TorchRec's
    # planner finds that option, so the bound (docstring: the larger of the summed perf over
    # the ranks and that shard) is its score. Here table-wise sums least (one shard) and row-wise
    # has the smallest shard, larger than table-wise's 1/8
    import logging

    from neo_plugins.sharding.planner.torchrec_score import torchrec_plan_and_score

    context = make_context({"name": "zionex", "num_nodes": 1, "devices_per_node": 8}, 512)
    logging.disable(logging.WARNING)
    try:
        out = torchrec_plan_and_score([TableSpec("t", 100_000, 64, 1.0)], context)
    finally:
        logging.disable(logging.NOTSET)
    assert out["bound_ms"] == pytest.approx(out["score_ms"], rel=1e-9)


def test_tables_torchrec_puts_in_host_memory_are_named_unless_behind_the_contexts_cache():
    # 100 MiB of device memory a rank: neither table (512 and 256 MB) fits even split over both
    # ranks, so TorchRec puts both in host memory; with no cache set, Neo's settings allow
    # neither there, cached or not (torchrec_plan_and_score's docstring)
    import logging

    from neo_plugins.sharding.planner.torchrec_score import torchrec_plan_and_score

    tables = [TableSpec("a", 10**6, 128, 8.0), TableSpec("b", 10**6, 64, 8.0)]
    small = topology(nodes=1, per_node=2, device_memory=100 * 2**20)
    logging.disable(logging.WARNING)
    try:
        plain = torchrec_plan_and_score(tables, make_context(small, 512))
        cached = torchrec_plan_and_score(tables, make_context(small, 512, cache=CachePolicy("lru", load_factor=0.1)))
    finally:
        logging.disable(logging.NOTSET)
    assert plain["host_tables"] == ["a", "b"]
    # behind the context's own cache they are where its settings allow
    assert {a["compute_kernel"] for a in cached["plan"]} == {"fused_uvm_caching"}
    assert cached["host_tables"] == []


def test_a_column_wise_plan_is_scored_at_its_shards_width_on_the_ranks_it_gives():
    # 128 columns in 2 shards of 64 (TorchRec would keep 128 whole): two equal shards, so both
    # on one rank cost twice what each of two ranks holds
    from neo_core.sharding import PlanResult, TableAssignment
    from neo_plugins.sharding.planner.torchrec_score import score_plan

    tables = [TableSpec("t", 100_000, 128, 8.0)]
    context = make_context({"name": "zionex", "num_nodes": 1, "devices_per_node": 2}, 512)

    def score(ranks):
        plan = [TableAssignment("t", "column_wise", "fused", ranks, [(100_000, 64)] * 2)]
        return score_plan(tables, PlanResult("given", plan, [], 512, {}), context)

    assert score([0, 0]) == pytest.approx(2 * score([0, 1]))


def test_the_codec_is_what_a_compressed_step_adds_beyond_the_bytes_it_saves(monkeypatch) -> None:
    # one table-wise table of 128 columns, 1024 samples a rank, 2 ranks: E = 2 G d = 524,288
    # elements, each encoded and decoded (4 E / Z) and 2 bytes fewer at a = (1/2) / 1e9 seconds
    # a byte (a 1 GB/s all-to-all): t16 - t32 = 4 E / Z - 2 E a
    elements, a = 2 * 2048 * 128, 0.5 / 1e9
    for z in (1e9, 3e9):
        t32 = 0.010
        t16 = t32 + 4 * elements / z - 2 * elements * a
        monkeypatch.setattr(calibrate, "_spawn", lambda target, world, t=(t32, t16): {"times": list(t)})
        assert calibrate.codec_cost(2, 1e9, alone=1e10) == pytest.approx(z)
    # never faster than the codec alone; noise that hides its cost leaves the codec alone's figure
    assert calibrate.codec_cost(2, 1e9, alone=2e9) == pytest.approx(2e9)
    monkeypatch.setattr(calibrate, "_spawn", lambda target, world: {"times": [0.010, 0.010 - 4 * elements * a]})
    assert calibrate.codec_cost(2, 1e9, alone=5e9) == 5e9


def test_the_codec_alone_is_fp32_bytes_encoded_and_decoded_a_second_on_one_thread(monkeypatch) -> None:
    # codec_bw counts 4 bytes a value (the fp32 a collective would have sent), not the 2 sent
    timed = []

    def best(fn, repeat=5):
        timed.append((fn(), torch.get_num_threads()))
        return 0.5

    monkeypatch.setattr(calibrate, "_best", best)
    threads = torch.get_num_threads()
    assert calibrate.measure_codec(values=1000) == pytest.approx(1000 * 4 / 0.5)
    (decoded, during), = timed
    assert during == 1 and torch.get_num_threads() == threads  # one rank's thread, then as it was
    assert decoded.shape == (1000,) and decoded.dtype == torch.float32  # encoded and decoded back
