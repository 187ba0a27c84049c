"""The cost model's figures against values worked out by hand from docs/cost_model.md.

One small cluster with round numbers (2 nodes x 4 ranks; device memory 1e12 B/s, host to
device 1e10, intra-node 1e11, inter-node 1e10, host memory 5e10), 100 samples per rank
(G = 800), fp32 weights with row-wise Adagrad (e = 4, s(c) = 4), ids of 8 bytes, outputs of 4.
Every expected figure below is arithmetic on those numbers, not a call into the model, so a
changed constant, a swapped bandwidth or a dropped term fails here.

All-to-all seconds per byte: a = (3/8)/1e11 + (4/8)/1e10 = 5.375e-11.
"""

from __future__ import annotations

import pytest

from neo_core.api import make_context
from neo_core.cache import CachePolicy
from neo_core.compression import Compressor
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import ShardingType, TableSpec
from neo_core.topology import Topology
from neo_plugins.sharding.planner.cost import CACHED, CostModel, TableArrays

A = 5.375e-11  # all-to-all seconds per byte sent
INTRA = 0.75 / 1e11  # (L-1)/(L X): the intra-node stage of TWRW and GRID
CROSS = 0.5 / 1e10  # (N-1)/(N I): their cross-node stage, among the ranks of one local rank
COPY = 2.455 / 1e12  # batched copy of gathered gradients (GPU row-split types)
CODEC = 12 / 1e12  # compression's codec per value on GPUs: read 4, write 2, read 2, write 4 bytes at 1e12


def topology(device: str = "cuda", **calibrated) -> Topology:
    return Topology(
        name="round", num_nodes=2, devices_per_node=4, compute_device=device,
        device_memory=10**11, host_memory=10**12,
        device_memory_bw=1e12, host_memory_bw=5e10, host_to_device_bw=1e10,
        intra_node_bw=1e11, inter_node_bw=1e10, **calibrated,
    )


def costs(stype, table=("t", 1000, 128, 10.0, None), k=1, placement="device", device="cuda",
          compressor=None, cache=None, kernel=None, **calibrated) -> dict[str, float]:
    name, rows, dim, pooling, hot = table
    ctx = make_context(topology(device, **calibrated), 100, kernel=kernel, compressor=compressor, cache=cache)
    model = CostModel(ctx)
    arrays = TableArrays.from_specs([TableSpec(name, rows, dim, pooling, hot_fraction=hot)])
    c = model.costs(arrays, ShardingType(stype), k, placement)
    kinds = ("compute_fwd", "compute_bwd", "optimizer", "comm_input", "comm_fwd", "comm_bwd", "comm_allreduce")
    out = {kind: float(c.time[0, i]) for i, kind in enumerate(kinds)}
    out.update(device=float(c.mem_device[0]), host=float(c.mem_host[0]))
    return out


def check(got: dict[str, float], **expected: float) -> None:
    for kind, value in expected.items():
        assert got[kind] == pytest.approx(value, rel=1e-9, abs=1e-18), (kind, got[kind], value)


def test_table_wise_on_gpu():
    # n = G P = 8000 ids, m = G = 800 rows out, c = 128: rb = 512, no block penalty
    check(
        costs("table_wise"),
        compute_fwd=(8000 * (8 + 512) + 800 * 128 * 4) / 1e12,  # ids + rows read, outputs written
        compute_bwd=(800 * 128 * 4 + 2 * 8000 * (512 + 4)) / 1e12,  # grads read, rows + state r/w
        comm_input=8000 * 8 * A, comm_fwd=800 * 128 * 4 * A, comm_bwd=800 * 128 * 4 * A,
        optimizer=0.0, comm_allreduce=0.0,
        device=1000 * 128 * 4 + 1000 * 4 + 8000 * 8 + 800 * 128 * 4, host=0.0,  # + one batch's ids and rows
    )


def test_fp16_comms_halve_only_the_pooled_all_to_alls():
    # ... and add the codec: each value encoded by its sender and decoded by its receiver
    check(costs("table_wise", compressor="fp16"),
          comm_fwd=800 * 128 * (2 * A + CODEC), comm_bwd=800 * 128 * (2 * A + CODEC), comm_input=8000 * 8 * A)


def test_the_codec_costs_what_the_topology_measured_on_cpus():
    # 1e9 fp32 bytes/s encoded and decoded (neo calibrate's codec_bw): 4e-9 s a value, which on
    # CPU ranks is more than the 2 bytes fp16 saves over this network (2 * A = 1.1e-10 s)
    check(costs("table_wise", compressor="fp16", device="cpu", codec_bw=1e9),
          comm_fwd=800 * 128 * (2 * A + 4e-9), comm_bwd=800 * 128 * (2 * A + 4e-9))
    check(costs("row_wise", compressor="bf16", device="cpu", codec_bw=1e9),
          comm_fwd=800 * 128 * (2 * A + 4e-9), comm_bwd=800 * 128 * (2 * A + 4e-9))
    # gloo sums an fp16 reduce-scatter as slowly as an fp32 one: its time is fp32's (the bytes it
    # moves are halved all the same); its all-gather, which sums nothing, is halved; GPUs halve both
    check(costs("row_wise", compressor="fp16", device="cpu", codec_bw=1e9),
          comm_fwd=800 * 128 * (4 * A + 4e-9), comm_bwd=800 * 128 * (2 * A + 4e-9))
    check(costs("table_row_wise", compressor="fp16", device="cpu", codec_bw=1e9),
          comm_fwd=800 * 128 * (4 * INTRA + 2 * CROSS / 4 + 4e-9 * 1.25))
    check(costs("row_wise", compressor="fp16"), comm_fwd=800 * 128 * (2 * A + CODEC))
    model = CostModel(make_context(topology("cpu"), 100, compressor="fp16"))
    rw = 1000 * 8 + 800 * 128 * (2 + 2)
    one = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)])
    assert [float(x[0]) for x in model.comm_bytes(one, ShardingType.ROW_WISE)] == pytest.approx([rw * 3 / 8, rw * 4 / 8])
    # unmeasured: the model's assumed CPU codec, 2 GB/s
    check(costs("table_wise", compressor="fp16", device="cpu"), comm_fwd=800 * 128 * (2 * A + 2e-9))
    # uncompressed: no codec runs
    check(costs("table_wise", device="cpu", codec_bw=1e9), comm_fwd=800 * 128 * 4 * A, comm_bwd=800 * 128 * 4 * A)
    # nor on one rank, which sends nothing; on one node, TWRW encodes its reduce-scatter alone;
    # one rank a node has no reduce-scatter: TWRW encodes what it sends across nodes alone
    arrays = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)])
    for nodes, per_node, twrw_values in ((1, 1, 0.0), (1, 4, 400 * 128), (2, 1, 200 * 128)):
        one = Topology(name="one", num_nodes=nodes, devices_per_node=per_node, compute_device="cpu",
                       device_memory=10**11, host_memory=10**12, device_memory_bw=1e12, host_memory_bw=5e10,
                       host_to_device_bw=1e10, intra_node_bw=1e11, inter_node_bw=1e10, codec_bw=1e9)
        plain, packed = (CostModel(make_context(one, 100, compressor=c)) for c in (None, "bf16"))
        for column in (4, 5):  # comm_fwd, comm_bwd
            twrw = [m.costs(arrays, ShardingType.TABLE_ROW_WISE).time[0, column] for m in (plain, packed)]
            assert twrw[1] - twrw[0] / 2 == pytest.approx(twrw_values * 4e-9, abs=1e-18), (nodes, per_node, column)
        if nodes * per_node == 1:  # a table-wise table on the one rank: no codec, as no bytes
            assert [float(x) for x in packed.costs(arrays, ShardingType.TABLE_WISE).time[0, 4:6]] == [0.0, 0.0]


def test_fp8_sends_its_bytes_where_torchrec_can_and_fp16_or_bf16_in_reduce_scatters():
    # TorchRec has no fp8 reduce-scatter: forward fp8 goes as fp16 there, backward fp8 as bf16
    fp8 = Compressor("x", "fp8", "fp8")
    check(costs("row_wise", compressor=fp8), comm_fwd=800 * 128 * (2 * A + CODEC),
          comm_bwd=800 * 128 * (2 * (A + COPY) + CODEC))
    # TWRW's codec: the reduce-scatter's values, then the quarter of them sent across nodes
    check(costs("table_row_wise", compressor=fp8), comm_fwd=800 * 128 * (2 * INTRA + 1 * CROSS / 4 + CODEC * 1.25),
          comm_bwd=800 * 128 * (2 * (INTRA + COPY) + 1 * CROSS / 4 + CODEC * 1.25))
    check(costs("table_wise", compressor=fp8), comm_fwd=800 * 128 * (1 * A + CODEC),
          comm_bwd=800 * 128 * (1 * A + CODEC))
    # the bytes the report says a rank sends follow the same precisions
    model = CostModel(make_context(topology(), 100, compressor=Compressor("h", "fp16", "bf16")))
    arrays = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)])
    tw = 8000 * 8 + 800 * 128 * (2 + 2)
    assert [float(x[0]) for x in model.comm_bytes(arrays, ShardingType.TABLE_WISE)] == pytest.approx([tw * 3 / 8, tw * 4 / 8])
    rw = 1000 * 8 + 800 * 128 * (2 + 2)
    assert [float(x[0]) for x in model.comm_bytes(arrays, ShardingType.ROW_WISE)] == pytest.approx([rw * 3 / 8, rw * 4 / 8])


def test_a_table_read_by_two_features_looks_up_and_sends_for_both():
    # feature_names (a, b), pooling 10 each: n = G P F = 16000 ids, m = G F = 1600 pooled rows,
    # as TorchRec's estimator counts pooling factors [10, 10]
    ctx = make_context(topology(), 100)
    model = CostModel(ctx)
    two = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0, feature_names=("a", "b"))])
    kinds = ("compute_fwd", "compute_bwd", "optimizer", "comm_input", "comm_fwd", "comm_bwd", "comm_allreduce")
    c = model.costs(two, ShardingType.TABLE_WISE)
    got = {kind: float(c.time[0, i]) for i, kind in enumerate(kinds)}
    got.update(device=float(c.mem_device[0]), host=float(c.mem_host[0]))
    check(
        got,
        compute_fwd=(16000 * (8 + 512) + 1600 * 128 * 4) / 1e12,
        compute_bwd=(1600 * 128 * 4 + 2 * 16000 * (512 + 4)) / 1e12,
        comm_input=16000 * 8 * A, comm_fwd=1600 * 128 * 4 * A, comm_bwd=1600 * 128 * 4 * A,
        device=1000 * 128 * 4 + 1000 * 4 + 16000 * 8 + 1600 * 128 * 4,
    )
    # the bytes the report counts, and row-wise's reduce-scatter, double with the features
    one = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)])
    for stype in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        assert [float(x[0]) for x in model.comm_bytes(two, stype)] == pytest.approx(
            [2 * float(x[0]) for x in model.comm_bytes(one, stype)]), stype
    rw_two, rw_one = model.costs(two, ShardingType.ROW_WISE), model.costs(one, ShardingType.ROW_WISE)
    assert rw_two.time[0, 4] == pytest.approx(2 * rw_one.time[0, 4])  # comm_fwd


@pytest.mark.parametrize(
    ("dim", "k", "rb", "penalty"),
    [(128, 2, 256, 1.15), (128, 4, 128, 1.75), (64, 4, 128, 1.75)],  # c = 64, 32, 16 (read as 32)
    ids=["c64-half-block", "c32-quarter-block", "c16-read-as-32"],
)
def test_column_wise_on_gpu_pays_the_block_terms(dim, k, rb, penalty):
    c = dim // k
    check(
        costs("column_wise", table=("t", 1000, dim, 10.0, None), k=k),
        compute_fwd=(8000 * (8 + rb) + 800 * c * 4) * penalty / 1e12,
        compute_bwd=(800 * c * 4 + 2 * 8000 * (rb + 4)) * penalty / 1e12,
        comm_fwd=800 * c * 4 * A,
        device=1000 * c * 4 + 1000 * 4 + 8000 * 8 + 800 * c * 4,
    )


def test_table_column_wise_costs_as_column_wise():
    # TorchRec's TWCW is CW with every column shard in one node: the same flat all-to-all
    assert costs("table_column_wise", k=2) == costs("column_wise", k=2)
    check(costs("table_column_wise", k=2), comm_fwd=800 * 64 * 4 * A, comm_input=8000 * 8 * A)


def test_row_wise_on_gpu():
    # n = G P / W = 1000 ids per shard, still G = 800 pooled (partial) rows; 125 rows per shard
    check(
        costs("row_wise"),
        compute_fwd=(1000 * (8 + 512) + 800 * 128 * 4) / 1e12,
        compute_bwd=(800 * 128 * 4 + 2 * 1000 * (512 + 4)) / 1e12,
        comm_input=1000 * 8 * A,
        comm_fwd=800 * 128 * 4 * A,  # reduce-scatter, at the all-to-all rate on GPUs
        comm_bwd=800 * 128 * 4 * (A + COPY),  # all-gather + batched copy
        device=125 * 128 * 4 + 125 * 4 + 1000 * 8 + 800 * 128 * 4,
    )


def test_table_row_wise_and_grid_reduce_inside_the_node_first():
    # TWRW: n = G P / L = 2000 ids per shard, 250 rows; intra-node stage, then 1/L of the
    # samples to the same local rank of the other node (none of it stays inside this node)
    check(
        costs("table_row_wise"),
        compute_fwd=(2000 * (8 + 512) + 800 * 128 * 4) / 1e12,
        compute_bwd=(800 * 128 * 4 + 2 * 2000 * (512 + 4)) / 1e12,
        comm_input=2000 * 8 * A,
        comm_fwd=800 * 128 * 4 * (INTRA + CROSS / 4),
        comm_bwd=800 * 128 * 4 * (INTRA + CROSS / 4 + COPY),
        device=250 * 128 * 4 + 250 * 4 + 2000 * 8 + 800 * 128 * 4,
    )
    # GRID x2: c = 64 at its plain width (no block terms for row-split shards): rb = 256
    check(
        costs("grid_shard", k=2),
        compute_fwd=(2000 * (8 + 256) + 800 * 64 * 4) / 1e12,
        compute_bwd=(800 * 64 * 4 + 2 * 2000 * (256 + 4)) / 1e12,
        comm_fwd=800 * 64 * 4 * (INTRA + CROSS / 4),
        device=250 * 64 * 4 + 250 * 4 + 2000 * 8 + 800 * 64 * 4,
    )


def test_data_parallel_on_gpu():
    # dense kernel at M/2; n = B P = 1000, m = B = 100; S = 4 R d = 512,000 bytes of gradient
    S = 4 * 1000 * 128
    check(
        costs("data_parallel"),
        compute_fwd=(1000 * (8 + 512) + 100 * 128 * 4) / 5e11,
        compute_bwd=(100 * 128 * 4 + 1000 * (8 + 2 * 512)) / 5e11,
        # max((S + 2 weights + 2 state) / M, 14.8 weights / M): torch.optim's Adagrad steps a
        # replica (full state, 4 bytes per element, not row-wise), its measured passes win
        optimizer=max((S + 2 * 512_000 + 2 * 512_000) / 1e12, 14.8 * 512_000 / 1e12),
        comm_allreduce=S * (2 * 3 / 4 / 1e11 + 2 * 1 / 2 / 4 / 1e10),
        comm_input=0.0, comm_fwd=0.0, comm_bwd=0.0,
        device=512_000 + 512_000 + S + 1000 * 8 + 100 * 128 * 4,  # + a replica's batch: B P ids, B rows
    )


def test_cached_table_wise_reads_misses_over_the_host_link():
    # 10% of rows cached, uniform access: h = 0.1; the rows' bytes at spb = h/M + (1-h)(1/H + 1/M);
    # ids, pooled rows, their gradients, the backward's update of the cached rows and the
    # row-wise state in device memory at 1/M; each miss's evicted row written back at 1/H
    spb = 0.1 / 1e12 + 0.9 * (1 / 1e10 + 1 / 1e12)
    got = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1))
    slots = 128  # 100 rows, rounded up to sets of 32 slots
    state = 4 * 1000 + 8 * slots + 8 * slots  # table map per row, cache state and LRU per slot
    check(
        got,
        compute_fwd=(8000 * 8 + 800 * 128 * 4) / 1e12 + 8000 * 512 * spb,
        compute_bwd=(800 * 128 * 4 + 2 * 8000 * (512 + 4)) / 1e12 + 8000 * 0.9 * 512 / 1e10,
        device=slots * 128 * 4 + state + 1000 * 4 + 8000 * 8 + 800 * 128 * 4,  # cache, its state, row-wise state, batch
        host=1000 * 128 * 4,  # the weights
    )
    # 50% of lookups on the hottest 1% of rows: h = 0.5 + 0.5 (0.1 - 0.01) / 0.99
    h = 0.5 + 0.5 * 0.09 / 0.99
    skewed = costs("table_wise", table=("t", 1000, 128, 10.0, 0.5), placement=CACHED,
                   cache=CachePolicy("lru", load_factor=0.1))
    check(skewed, compute_fwd=(8000 * 8 + 800 * 512) / 1e12 + 8000 * 512 * (h / 1e12 + (1 - h) * (1 / 1e10 + 1 / 1e12)))
    # element-wise state (Adagrad: 4 bytes per element) stays in host memory, uncached: its read
    # and write cross the host link on every id
    adagrad = costs("table_wise", placement=CACHED, cache=CachePolicy("lru", load_factor=0.1),
                    kernel=EmbeddingKernel("f", "fused", SparseOptimizer.ADAGRAD))
    check(adagrad, compute_bwd=(800 * 128 * 4 + 2 * 8000 * 512) / 1e12 + 2 * 8000 * 512 * (1 / 1e10 + 1 / 1e12)
          + 8000 * 0.9 * 512 / 1e10)
    # LFU keeps its 8-byte counter per row (and one more), not per slot
    lfu = costs("table_wise", placement=CACHED, cache=CachePolicy("lfu", load_factor=0.1))
    check(lfu, device=slots * 128 * 4 + (4 * 1000 + 8 * slots + 8 * 1001) + 1000 * 4 + 8000 * 8 + 800 * 128 * 4)


def test_cpu_terms():
    # 64-byte access granularity, no block terms, dense kernel at full M and a cheaper backward
    S = 4 * 1000 * 128
    check(
        costs("table_wise", table=("t", 1000, 40, 10.0, None), device="cpu"),
        compute_fwd=(8000 * (8 + 192) + 800 * 40 * 4) / 1e12,  # 160 bytes read as 192
    )
    check(
        costs("data_parallel", device="cpu"),
        compute_bwd=(100 * 128 * 4 + 1000 * 512) / 1e12,
        # Adagrad's measured passes at the host's copy bandwidth outweigh the bytes at M; then
        # the zero-fill and bucket copies
        optimizer=max((S + 2 * 512_000 + 2 * 512_000) / 1e12, 14.8 * 512_000 / 5e10) + 5 * S / 5e10,
    )
    # calibrated figures: per-id costs, bucketizing, gloo's slower reduce-scatter / all-gather
    check(
        costs("row_wise", device="cpu", lookup_fwd_id_s=2e-9, lookup_bwd_id_s=3e-9, bucketize_id_s=1e-9,
              reduce_scatter_bw=0.25e11, all_gather_bw=0.5e11),
        compute_fwd=(1000 * 520 + 800 * 512) / 1e12 + 1000 * 2e-9,
        compute_bwd=(800 * 512 + 2 * 1000 * 516) / 1e12 + 1000 * 3e-9,
        comm_input=1000 * (8 * A + 1e-9),
        comm_fwd=800 * 128 * 4 * A * 4,  # X / reduce_scatter_bw = 4
        comm_bwd=800 * 128 * 4 * A * 2,  # X / all_gather_bw = 2, no batched copy on CPUs
    )


def test_latency_and_bytes_sent():
    model = CostModel(make_context(topology(), 100))
    assert model.latency_time({"table_wise", "row_wise", "data_parallel"}) == pytest.approx(7 * 30e-6)
    arrays = TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)])

    def sent(stype):
        intra, inter = model.comm_bytes(arrays, ShardingType(stype))
        return float(intra[0]), float(inter[0])

    tw = 8000 * 8 + 800 * 128 * 8  # ids, pooled outputs and their gradients (fp32)
    assert sent("table_wise") == pytest.approx((tw * 3 / 8, tw * 4 / 8))
    out = 800 * 128 * 8
    ids = 2000 * 8  # a flat all-to-all to the table's node; then 1/L of the pooled rows goes to the
    # same local rank of the other node: all of it across, none inside this node
    assert sent("table_row_wise") == pytest.approx((ids * 3 / 8 + out * 3 / 4, ids * 4 / 8 + out / 4 / 2))
    S = 4 * 1000 * 128
    assert sent("data_parallel") == pytest.approx((2 * S * 3 / 4, 2 * S / 2 / 4))
