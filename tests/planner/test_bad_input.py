"""Bad input and capacity errors: each message names the table, what is wrong and the fix."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from neo_core.api import plan_tables
from neo_core.cache import CachePolicy
from neo_core.errors import ConfigError, PlanningError
from neo_core.kernels import EmbeddingKernel
from neo_core.sharding import TableSpec
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.tables import make_tables
from neo_plugins.topology.local import local_topology
from neo_plugins.topology.zionex import zionex_topology
from tests.planner import cluster


def shortfalls(message: str) -> list[float]:
    """The byte counts a capacity message reports as over or short."""
    return [float(b.replace(",", "")) for b in re.findall(r"(-?[\d,]+) bytes", message)]


def test_cached_huge_table_blames_host_memory_with_a_positive_shortfall():
    # 2e9 rows x 128 fp32: 120 GiB per rank even split 8 ways; a 1% cache fits the devices,
    # the 64 GiB of host memory per rank does not
    huge = TableSpec("huge", 2_000_000_000, 128, 1.0)
    with pytest.raises(PlanningError) as err:
        plan_tables([huge], cluster(), 256, cache=CachePolicy("lru", load_factor=0.01))
    msg = str(err.value)
    assert "'huge'" in msg and "2,000,000,000 rows" in msg
    assert "over the 256.00 GiB of host memory on each of 2 nodes (4 shards, host memory being a node" in msg
    assert "of device memory usable" not in msg  # the device holds its cache share
    short = shortfalls(msg)
    assert len(short) == 1 and short[0] > 0
    assert "(-" not in msg
    assert "add ranks or host memory" in msg and "shrink the table" in msg


def test_uncached_huge_table_blames_device_memory_and_names_the_cache():
    # 4e8 rows x 128 fp32: 25.6 GB a rank split 8 ways, over the device memory, within the host's
    huge = TableSpec("huge", 400_000_000, 128, 1.0)
    with pytest.raises(PlanningError) as err:
        plan_tables([huge], cluster(), 256)
    msg = str(err.value)
    assert "'huge'" in msg and "over the 13.60 GiB of device memory usable on each of 8 ranks" in msg
    assert "GiB of host memory" not in msg  # nothing of it lives in host memory
    assert all(b > 0 for b in shortfalls(msg)) and shortfalls(msg)
    assert "cache=lru cache.load_factor=" in msg
    # 2e9 rows: 128 GB a rank would not fit the 64 GiB of host memory either: no cache offered
    with pytest.raises(PlanningError) as err:
        plan_tables([replace(huge, num_embeddings=2_000_000_000)], cluster(), 256)
    assert "over the 13.60 GiB of device memory" in str(err.value) and "cache=" not in str(err.value)


def test_a_table_too_big_for_its_allowed_types_names_them_not_the_cluster():
    # with TW and DP only, a table's smallest shard is the whole table however many ranks: the
    # message blamed the cluster ("add ranks or device memory")
    tables = [TableSpec("big", 1_000_000_000, 128, 1.0), TableSpec("s", 10, 8, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, "zionex", 512, sharding_types=["TW", "DP"])
    msg = str(err.value)
    assert msg.startswith("Table 'big' (1,000,000,000 rows x 128) does not fit with the sharding types allowed for "
                          "it (DP, TW): its smallest shard needs 480.59 GiB of device memory per rank"), msg  # + 32 MiB of batch
    assert "allow it a row-wise sharding type (RW, TWRW or GRID), whose shards shrink as ranks are added (more " \
           "ranks do not help with DP, TW only)" in msg and "add ranks" not in msg
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, "zionex", 512, table_sharding_types={"big": ["TW", "CW"]})
    assert "allowed for it (TW, CW)" in str(err.value) and "cache=lru" in str(err.value)  # CW shards fit a host
    plan_tables(tables, "zionex", 512)  # row-wise, it fits
    # DP only: a cache holds no replicated table, so none is offered, and a chosen one is
    # said to go unused (it was offered, and then the same refusal asked to lower its load factor)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, "zionex", 512, sharding_types=["DP"])
    assert "allowed for it (DP)" in str(err.value) and "cache" not in str(err.value)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, "zionex", 512, sharding_types=["DP"], cache={"name": "lru", "load_factor": 0.05})
    assert "load_factor" not in str(err.value)
    assert str(err.value).endswith("(cache lru is not used: every table is replicated (DP), in device memory).")


@pytest.mark.parametrize("dim", [30, 64])
def test_replicated_tables_are_not_told_to_add_ranks_or_a_cache(dim):
    # ten tables of 2M rows on one node of 2 GiB devices, replicated: by a dim the fused kernel
    # cannot shard (30), or by DP only (64). Each rank holds a copy of each, so more nodes only
    # add copies (the message offered topology.num_nodes=9, which needed 1 TiB on 72 ranks),
    # and a cache holds none of them (the message offered one, then asked to lower its share)
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec(f"t{i}", 2_000_000, dim, 2.0) for i in range(10)]
    kw = {"sharding_types": ["data_parallel"]} if dim % 4 == 0 else {}
    for cache in (None, {"name": "lru", "load_factor": 0.2}):
        with pytest.raises(PlanningError) as err:
            plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=2), 512, cache=cache, **kw)
        msg = str(err.value)
        assert "more ranks do not help: the replicated tables need" in msg, msg
        assert "num_nodes" not in msg and "add ranks" not in msg and "load_factor" not in msg, msg
        assert "topology.device_memory_gib=" in msg
        assert ("cache lru is not used" in msg) == (cache is not None)
    # where some tables can be sharded, more nodes still count the copies of the others
    mixed = [TableSpec(f"t{i}", 2_000_000, 64, 2.0) for i in range(10)]
    mixed += [TableSpec(f"s{i}", 20_000_000, 64, 2.0) for i in range(4)]
    with pytest.raises(PlanningError) as err:
        plan_tables(mixed, zionex_topology(num_nodes=1, device_memory_gib=6), 512,
                    table_sharding_types={"t0": ["data_parallel"], "t1": ["data_parallel"]}, check_settings_s=0)
    assert "more ranks do not help" not in str(err.value) and "topology.num_nodes=2 or more" in str(err.value)


def test_cpu_ranks_of_one_machine_are_not_told_to_add_ranks():
    # the local topology's CPU ranks split the machine's RAM: more of them add no memory
    big = [TableSpec("big", 10_000_000_000, 128, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(big, local_topology(world_size=2), 512)
    msg = str(err.value)
    assert "add memory (the ranks share this machine's RAM, so more ranks add none; where topology.memory_fraction=1 " \
           "is too little, use a machine with more RAM or several machines (topology.num_nodes, launched by torchrun on " \
           "each), or dry-run the cluster you plan for: recipes/plan.py +topology=zionex)" in msg and "add ranks" not in msg
    # more than all of the RAM: the most memory_fraction gives is said, not a value it cannot take
    most = local_topology(world_size=2, memory_fraction=1.0).device_memory / 2**30
    assert f"GiB a rank needed, {most:.2f} GiB a rank at most (topology.memory_fraction=1))" in msg
    assert "topology.memory_fraction=" not in msg.replace("topology.memory_fraction=1", "")
    # within the RAM: the memory_fraction that holds the tables, checked by planning
    four = [TableSpec(f"t{i}", 1_000_000, 128, 1.0) for i in range(4)]  # 2 GiB with their state
    small = local_topology(world_size=2, memory_fraction=0.5)
    fraction = 2 * 1.1 * 2**30 / 0.85 / (small.device_memory * 2 / 0.5)  # of the whole RAM, with room
    with pytest.raises(PlanningError) as err:
        plan_tables(four, local_topology(world_size=2, memory_fraction=fraction / 2), 512)
    msg = str(err.value)
    found = re.search(r"topology\.memory_fraction=([\d.]+) or more, now [\d.]+; checked", msg)
    assert found and float(found.group(1)) <= 1, msg
    assert plan_tables(four, local_topology(world_size=2, memory_fraction=float(found.group(1))), 512).ranks
    # another CPU topology of one node, whose ranks each bring their memory: more ranks help
    box = replace(local_topology(world_size=2), name="cpu_box", memory_fix=None)
    with pytest.raises(PlanningError) as err:
        plan_tables(big, box, 512)
    assert "add ranks or memory" in str(err.value)


def test_a_table_row_wise_types_could_not_split_is_not_told_to_allow_them():
    # nothing was restricted: one rank (no row-wise type there), or a dim the fused kernel cannot shard
    one = replace(cluster(), num_nodes=1, devices_per_node=1)
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("big", 4_000_000_000, 128, 5.0)], one, 64)
    msg = str(err.value)
    assert "is larger than the whole cluster allows" in msg and "on its 1 rank" in msg and "add ranks" in msg
    assert "row-wise sharding type" not in msg
    # the others that do not fit are named, not only counted
    many = [TableSpec(f"big{i}", 4_000_000_000, 128, 5.0) for i in range(11)] + [TableSpec("small", 10, 8)]
    with pytest.raises(PlanningError) as err:
        plan_tables(many, one, 64)
    msg = str(err.value)
    assert msg.startswith("Table 'big0' (4,000,000,000 rows x 128) is larger than the whole cluster allows"), msg
    assert ("(10 more tables also do not fit: 'big1', 'big2', 'big3', 'big4', 'big5', 'big6', 'big7', 'big8' "
            "and 2 more)") in msg
    with pytest.raises(PlanningError) as err:
        plan_tables(many[:2], one, 64)
    assert "(1 more table also does not fit: 'big1')" in str(err.value)
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("odd", 1_000_000_000, 130, 5.0)], "zionex", 512)
    assert "pad its dim to 132" in str(err.value) and "row-wise sharding type" not in str(err.value)
    # replicated, it is whole on every rank: more ranks are not offered
    assert "more ranks do not help, as it is whole on every rank: give each rank more device memory" in str(err.value)
    assert "add ranks" not in str(err.value) and "num_nodes" not in str(err.value)


def test_device_short_message_names_the_fix():
    tables = [TableSpec(f"d{i}", 100_000_000, 128, 1.0) for i in range(4)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256)
    msg = str(err.value)
    assert msg.startswith("Device memory is short") and "d0" in msg
    assert "add ranks or device memory" in msg and "shrink the tables." in msg
    assert "cache (cache=lru cache.load_factor=0.05)" in msg
    # tables the host memory could not hold either: no cache offered
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec(f"d{i}", 100_000_000, 128, 1.0) for i in range(16)], cluster(), 256)
    assert str(err.value).startswith("Device memory is short") and "cache=" not in str(err.value)
    # with a cache already on, the lever is its load factor
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, cache=CachePolicy("lru", load_factor=0.9))
    msg = str(err.value)
    assert msg.startswith("Device memory is short") and "lower the cache load_factor" in msg


def test_cpu_ranks_are_told_about_ram_not_device_memory():
    cpu = replace(cluster(), compute_device="cpu")
    tables = [TableSpec(f"d{i}", 100_000_000, 128, 1.0) for i in range(4)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cpu, 256)
    msg = str(err.value)
    assert msg.startswith("Memory is short") and "each CPU rank's share of RAM" in msg
    assert "device" not in msg and "cache" not in msg  # no device, and a cache has no effect on CPU
    # a cache chosen anyway (a GPU cluster emulated on CPU ranks): said not to be used
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cpu, 256, cache=CachePolicy("lru", load_factor=0.1))
    assert str(err.value).endswith("(cache lru is not used on cpu ranks: every table stays in their memory).")
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("huge", 2_000_000_000, 128, 1.0)], cpu, 256)
    msg = str(err.value)
    assert "of memory (each CPU rank's share of RAM) usable on each of 8 ranks" in msg
    assert "device" not in msg and "add ranks or memory" in msg


def test_an_emulated_topology_is_told_about_its_device_memory():
    emulated = cluster().emulated_on(2, "cpu")
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("huge", 2_000_000_000_000, 128, 1.0)], emulated, 256)
    assert "device memory (of test (2x4), emulated on CPU ranks) usable on each of 2 ranks" in str(err.value)
    assert "share of RAM" not in str(err.value)


def test_numpy_integers_are_accepted_as_plain_ints():
    spec = TableSpec("t", np.int64(10), np.int32(16))
    assert spec == TableSpec("t", 10, 16)
    assert type(spec.num_embeddings) is int and type(spec.embedding_dim) is int
    assert spec.num_parameters == 160
    # whole numbers written as floats, as everywhere: 1e7 rows
    spec = TableSpec("t", 1e7, np.float64(16))
    assert (spec.num_embeddings, spec.embedding_dim) == (10_000_000, 16) and type(spec.num_embeddings) is int


def test_numpy_floats_are_kept_as_plain_floats_and_the_plan_saves(tmp_path):
    # statistics from float32 arrays planned, then saving the plan failed: float32 is no JSON number
    from neo_core.api import plan_tables
    from neo_plugins.sharding.planner.report import save_all
    from neo_plugins.topology.local import local_topology

    spec = TableSpec("t", 1000, 16, pooling_factor=np.float32(2.5), hot_fraction=np.float32(0.25))
    assert type(spec.pooling_factor) is float and type(spec.hot_fraction) is float
    assert (spec.pooling_factor, spec.hot_fraction) == (2.5, 0.25)
    result = plan_tables([spec], local_topology(world_size=2, compute_device="cpu"), 64)
    saved = json.loads(save_all(result, tmp_path)["json"].read_text())
    assert [(t["spec"]["pooling_factor"], t["spec"]["hot_fraction"]) for t in saved["tables"]] == [(2.5, 0.25)]


@pytest.mark.parametrize(
    ("rows", "dim", "field", "kind"),
    [
        (10.5, 16, "num_embeddings", "float"),
        ("10", 16, "num_embeddings", "str"),
        (True, 16, "num_embeddings", "bool"),
        (10, 16.5, "embedding_dim", "float"),
        (10, np.float64(16.5), "embedding_dim", "float64"),
        (float("inf"), 16, "num_embeddings", "float"),
    ],
)
def test_non_integral_sizes_are_rejected_naming_table_and_field(rows, dim, field, kind):
    with pytest.raises(ConfigError) as err:
        TableSpec("tbl", rows, dim)
    msg = str(err.value)
    assert "'tbl'" in msg and field in msg and f"of type {kind}" in msg
    assert "whole number" in msg
    assert "at least 1 row" not in msg


def test_zero_and_negative_sizes_keep_their_messages():
    with pytest.raises(ConfigError, match=r"'z' has 0 rows; a table needs at least 1 row"):
        TableSpec("z", np.int64(0), 16)
    with pytest.raises(ConfigError, match=r"'n' has embedding_dim -4; it must be a positive integer"):
        TableSpec("n", 10, np.int16(-4))


def test_host_reserve_is_kept_back_and_reported():
    # 8 cached tables of 400M x 16 fp32 (23.8 GiB weights + 1.5 GiB optimizer each, 202 GiB):
    # the 8 devices hold at most 108.8 GiB, so host memory must hold over 90 GiB; a 90% host
    # reserve leaves 51.2 GiB of the 8 x 64 GiB
    tables = [TableSpec(f"h{i}", 400_000_000, 16, 2.0) for i in range(8)]
    lru = CachePolicy("lru", load_factor=0.01)
    result = plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=0.5)
    cap = 64 * 2**30
    for r in result.ranks:
        if r.host_memory:
            assert r.host_memory["reserve"] == 0.5 * cap and r.host_memory_capacity == cap
            assert sum(r.host_memory.values()) <= cap
    assert any(r.host_memory for r in result.ranks)
    assert any("50% of host memory" in n for n in result.notes)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=0.9)
    msg = str(err.value)
    assert msg.startswith("Host memory is short") and "GiB usable:" in msg and "h0" in msg
    with pytest.raises(ConfigError, match=r"sharding.host_reserve_fraction=1.5 must lie in \[0, 1\)"):
        plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=1.5)


# --- table generators (recipes/plan.py's plan_model.params) ---------------------------------


@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        ({"num_tabels": 10}, ("Unknown parameter 'num_tabels'", "Did you mean 'num_tables'?", "seed")),
        ({"num_tables": "abc"}, ("'num_tables'", "must be a whole number, got 'abc'",)),
        ({"num_tables": 2.5}, ("'num_tables'", "must be a whole number, got 2.5",)),
        ({"mean_pooling": "x"}, ("'mean_pooling'", "must be a number",)),
        ({"dims": 16}, ("dims must be a list of numbers, got 16.",)),
    ],
    ids=["misspelled", "string-for-int", "fraction-for-int", "string-for-float", "scalar-for-list"],
)
def test_table_generator_parameters_are_checked_by_name_and_kind(params, fragments) -> None:
    with pytest.raises(ConfigError) as err:
        make_tables("production_like", **params)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_table_generator_accepts_its_parameters() -> None:
    tables = make_tables("production_like", num_tables=7, mean_pooling=3, dims=[16, 32], dim_weights=[1, 1],
                         total_parameters=None)
    assert len(tables) == 7 and {t.embedding_dim for t in tables} <= {16, 32}
    # what YAML, the command line (1e7 is a float there) and numpy give are taken too
    same = make_tables("production_like", num_tables=7.0, mean_pooling=np.float32(3), dims=np.array([16, 32]),
                       dim_weights=[np.float32(1), 1], max_rows=1e7)
    assert [(t.num_embeddings, t.embedding_dim) for t in same] == [(t.num_embeddings, t.embedding_dim) for t in tables]


# --- planner, topology, cache and table arguments: kind and range, each error naming its key ----


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"collective_latency_s": -1.0}, "sharding.collective_latency_s must be a finite number of seconds, 0 or more"),
        ({"collective_latency_s": float("nan")}, "sharding.collective_latency_s"),
        ({"index_bytes": -8}, "sharding.index_bytes must be 4 (int32 ids) or 8 (int64 ids), got -8."),
        ({"col_shard_counts": [0]}, "sharding.col_shard_counts must be a list of column-shard counts of 2 or more"),
        ({"col_shard_counts": None}, "sharding.col_shard_counts"),
        ({"min_col_width": -5}, "sharding.min_col_width must be a whole multiple of 4"),
        ({"sharding_types": []}, "sharding.sharding_types must be a non-empty list"),
        ({"sharding_types": "TW"}, "sharding.sharding_types must be a non-empty list of sharding types, e.g. [TW, RW]; got 'TW'."),
        ({"table_sharding_types": ["t0"]}, "sharding.table_sharding_types must map table names to lists of types"),
        ({"table_sharding_types": {"t0": []}}, "sharding.table_sharding_types.t0 must be a non-empty list"),
        ({"reserve_fraction": "0.1"}, "sharding.reserve_fraction must be a number in [0, 1), got '0.1'."),
        ({"time_budget_s": float("inf")}, "sharding.time_budget_s must be a positive finite number"),
        ({"packing_targets": -1}, "sharding.packing_targets must be a whole number, 0 or more"),
        ({"packing_targets": 2.5}, "sharding.packing_targets"),
        ({"check_settings_s": -1}, "sharding.check_settings_s must be a finite number of seconds, 0 or more"),
        ({"check_settings_s": "10"}, "sharding.check_settings_s"),
        ({"fewer_types_share": 1.5}, "sharding.fewer_types_share must be a fraction of the step in [0, 1]"),
    ],
)
def test_planner_arguments_are_checked_by_kind_and_range(kwargs, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        NeoPlanner(**kwargs)
    assert fragment in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"num_nodes": True}, "topology.num_nodes must be a whole number, at least 1; got True."),
        ({"num_nodes": 2.5}, "topology.num_nodes must be a whole number"),
        ({"inter_node_bw": math.inf}, "topology.inter_node_bw must be a positive finite number, got inf."),
        ({"device_memory": math.nan}, "topology.device_memory must be a positive finite number"),
        ({"collective_latency_s": -1.0}, "topology.collective_latency_s must be a finite number, 0 or more"),
        ({"allreduce_bw": -1.0}, "topology.allreduce_bw must be a finite number, positive"),
        ({"lookup_fwd_id_s": -1e-3}, "topology.lookup_fwd_id_s"),
    ],
)
def test_topology_figures_are_checked_by_kind_and_range(changes, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        cluster().replace(**changes)
    assert fragment in str(err.value), str(err.value)


def test_topology_plugins_check_their_arguments_before_dividing_by_them(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"topology.devices_per_node must be at least 1, got 0."):
        zionex_topology(devices_per_node=0)
    # named as the user gave them, in their units (not the bytes they become)
    with pytest.raises(ConfigError, match=r"^topology.device_memory_gib must be a positive number of GiB, got -1.$"):
        zionex_topology(device_memory_gib=-1)
    with pytest.raises(ConfigError, match=r"^topology.inter_node_bw_gbps must be a positive number of GB/s, got 0.$"):
        zionex_topology(inter_node_bw_gbps=0)
    with pytest.raises(ConfigError, match=r"topology.world_size must be at least 1, got 0."):
        local_topology(world_size=0, compute_device="cpu")
    missing = tmp_path / "calibration.json"  # a named calibration must exist: a typo is not "none"
    with pytest.raises(ConfigError, match=r"topology.calibration=.* is not a file; run `neo calibrate --output"):
        local_topology(compute_device="cpu", calibration=str(missing))
    missing.write_text('{"collective_latency_s": -1}')
    with pytest.raises(ConfigError, match=r"topology.collective_latency_s .* calibration file"):
        local_topology(compute_device="cpu", calibration=str(missing))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"load_factor": -1.0}, "cache.load_factor=-1.0 (cache 'lru') must lie in (0, 1]"),
        ({"load_factor": float("nan")}, "must lie in (0, 1]"),
        ({"load_factor": 0.1, "algorithm": "fifo"}, "cache algorithm 'fifo' (cache 'lru') is not one FBGEMM"),
    ],
)
def test_a_cache_policy_checks_its_share_and_algorithm(kwargs, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        CachePolicy("lru", **kwargs)
    assert fragment in str(err.value), str(err.value)


def test_a_cache_policy_named_for_an_algorithm_uses_it() -> None:
    # CachePolicy("lfu", 0.1) evicted by LRU until the algorithm was taken from the name
    assert CachePolicy("lfu", 0.1).algorithm == "lfu" and CachePolicy("LRU", 0.1).algorithm == "lru"
    assert CachePolicy("my_policy", 0.1).algorithm == "lru"  # other names: LRU unless told
    assert CachePolicy("my_policy", 0.1, "lfu").algorithm == "lfu"
    with pytest.raises(ConfigError) as err:
        CachePolicy("lfu", 0.1, algorithm="lru")
    assert "cache 'lfu' with algorithm='lru'" in str(err.value) and "CachePolicy('lru', ...)" in str(err.value)
    import dataclasses  # the algorithm is stored resolved: a copy under another name says so

    assert "algorithm=None" in str(err.value)
    assert dataclasses.replace(CachePolicy("lru", 0.2), name="lfu", algorithm=None).algorithm == "lfu"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"pooling_factor": "5"}, "Table 'a' has pooling_factor '5'; it must be a number."),
        ({"pooling_factor": None}, "has pooling_factor None; it must be a number."),
        # was planned, then refused as "larger than the whole cluster allows" with a 300-digit figure
        ({"pooling_factor": 1e300}, "Table 'a' has pooling_factor 1e+300: it is the mean ids one sample looks up in "
                                    "each feature of the table, and more than 1,000,000 is no feature's"),
        ({"hot_fraction": "0.5"}, "has hot_fraction '0.5'; it must be a number."),
        # the hottest 1% of rows take at least 1% of lookups: below 0.01 predicted a hit rate
        # worse than uniform access
        ({"hot_fraction": 0.0001}, "has hot_fraction 0.0001; it is the share of lookups that hit the hottest 1% of "
                                   "rows, so it lies in [0.01, 1] (0.01: uniform access)."),
        ({"hot_fraction": 40}, "lies in [0.01, 1] (0.01: uniform access) (a percentage? 40% is 0.4)."),
        # TorchRec holds each table as a torch module named after it: training crashed on 'user.id'
        ({"name": "user.id"}, "Table 'user.id': a table name cannot contain '.' (TorchRec holds each table as a "
                              "torch module named after it, and module names cannot); rename it, e.g. 'user_id'."),
        ({"num_embeddings": 2**63}, "ids are 64-bit"),
        ({"name": "  "}, "Every table needs a non-empty name"),
        ({"feature_names": 5}, "Table 'a' has feature_names 5; give a feature name (a string) or a list of them."),
        ({"feature_names": [1, 2]}, "has feature_names [1, 2]; give a feature name"),
        ({"feature_names": ["x", "x"]}, "Table 'a' lists a feature twice in feature_names ['x', 'x']."),
    ],
)
def test_table_spec_fields_are_checked_by_kind(kwargs, fragment) -> None:
    fields = {"name": "a", "num_embeddings": 1000, "embedding_dim": 64, **kwargs}
    with pytest.raises(ConfigError) as err:
        TableSpec(**fields)
    assert fragment in str(err.value), str(err.value)
    assert TableSpec("a", 10, 8, feature_names="clicks").feature_names == ("clicks",)  # one name, not 6
    assert hash(TableSpec("a", 10, 8, feature_names=["x", "y"]))  # a list is kept as a tuple


def test_a_feature_read_by_two_tables_is_rejected_naming_both() -> None:
    tables = [TableSpec("a", 10, 8, feature_names="x"), TableSpec("b", 10, 8, feature_names=["y", "x"])]
    with pytest.raises(ConfigError, match=r"^Feature 'x' is read by tables 'a' and 'b'; each feature feeds one table"):
        plan_tables(tables, "zionex", 256)


def test_a_dim_that_is_not_a_multiple_of_4_is_replicated_not_sharded() -> None:
    # FBGEMM's fused kernel needs dim % 4 == 0; TorchRec runs data-parallel tables on its dense kernel
    tables = [TableSpec("odd", 1_000_000, 130, 2.0), TableSpec("even", 1_000_000, 128, 2.0)]
    result = plan_tables(tables, "zionex", 512)
    kinds = {t.name: (t.sharding_type, t.compute_kernel) for t in result.tables}
    assert kinds["odd"] == ("data_parallel", "dense") and kinds["even"][0] != "data_parallel", kinds
    with pytest.raises(ConfigError, match=r"'odd' has embedding_dim 130, not a multiple of 4.*pad its dim to 132"):
        plan_tables(tables, "zionex", 512, sharding_types=["TW"])
    with pytest.raises(PlanningError, match=r"not a multiple of 4: the fused kernel cannot shard it.*pad its dim to 132"):
        plan_tables([TableSpec("odd", 10**10, 130, 2.0)], "zionex", 512)


def test_grid_needs_a_row_per_rank_of_a_node_and_impossible_types_say_why() -> None:
    # GRID row-splits each column block over one node: 3 rows cannot cover 4 ranks
    tables = [TableSpec("tiny", 3, 128, 50.0), TableSpec("wide", 100_000, 128, 5.0)]
    result = plan_tables(tables, cluster(2, 4), 256, sharding_types=["GRID", "TW"])
    kinds = {t.name: t for t in result.tables}
    assert kinds["tiny"].sharding_type == "table_wise"
    assert all(rows > 0 for t in result.tables for rows, _ in t.shard_shapes)
    with pytest.raises(PlanningError, match=r"'tiny' \(3 rows x 128\) has no sharding option .*RW: 3 rows, fewer than the 8 ranks\)"):
        plan_tables(tables, cluster(2, 4), 256, sharding_types=["RW"])
    # the reason is the table's and the type's: too narrow a dim for column shards, not its rows
    with pytest.raises(PlanningError, match=r"'narrow' \(1,000 rows x 20\) has no sharding option .*CW: dim 20 splits "
                       r"into no column shards of 16 or more columns"):
        plan_tables([TableSpec("wide", 100_000, 128), TableSpec("narrow", 1000, 20)], cluster(2, 4), 256,
                    sharding_types=["CW"])
    with pytest.raises(PlanningError, match=r"No allowed sharding type \(GRID\) applies to any of the 2 tables, "
                       r"e.g. 'tiny' .* on 1 node\(s\) x 4 rank.*GRID: needs 2 or more nodes"):
        plan_tables(tables, cluster(1, 4), 256, sharding_types=["GRID"])
    with pytest.raises(PlanningError, match=r"applies to table 'x' \(1,000,000 rows x 30\).*GRID: dim 30 splits into no"):
        plan_tables([TableSpec("x", 10**6, 30)], cluster(2, 4), 256, sharding_types=["GRID"])
    # a dim that splits well, on too few ranks in a node for any column shard count: the count is the reason
    with pytest.raises(PlanningError, match=r"TWCW: its fewest column shards \(2, sharding.col_shard_counts\) need as "
                       r"many ranks in a node; here 1"):
        plan_tables([TableSpec("w", 10**5, 128)], cluster(2, 1), 256, sharding_types=["TWCW"])
    # 2 nodes of one rank: the nodes are there, the ranks per node are not, and the message says so
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(2, 1), 256, sharding_types=["TWRW"])
    assert "on 2 node(s) x 1 rank(s)" in str(err.value) and "TWRW: needs 2 or more nodes of 2 or more ranks (here 2 x 1)" in str(err.value)
    assert "devices_per_node" in str(err.value)
    # column shards narrower than sharding.min_col_width: that is the fix named, not the topology
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("d16", 10**5, 16)], cluster(1, 2), 256, sharding_types=["CW"])
    assert str(err.value).endswith("Allow another type, e.g. TW or DP, or sharding.min_col_width=8 (shards of 8 "
                                   "columns)."), str(err.value)
    assert plan_tables([TableSpec("d16", 10**5, 16)], cluster(1, 2), 256, sharding_types=["CW"],
                       min_col_width=8).tables[0].shard_shapes == [(10**5, 8), (10**5, 8)]  # as it says
    with pytest.raises(PlanningError) as err:  # dim 20 splits into no multiple of 4 at all: no width to name
        plan_tables([TableSpec("d20", 10**5, 20)], cluster(1, 2), 256, sharding_types=["CW"])
    assert str(err.value).endswith("Allow another type, e.g. TW or DP."), str(err.value)
    with pytest.raises(PlanningError) as err:  # more shards than ranks: fewer shards, or more ranks
        plan_tables([TableSpec("w", 10**5, 128)], cluster(1, 2), 256, sharding_types=["CW"], col_shard_counts=[4])
    assert ", or sharding.col_shard_counts with fewer shards (now [4]), or change the topology's num_nodes" in \
        str(err.value), str(err.value)


def test_a_table_left_without_room_is_never_reported_with_a_negative_shortfall() -> None:
    # 12T with a fifth of host memory reserved: the last tables find free bytes on enough ranks,
    # but not on ranks their shard pattern can take together
    from neo_core.api import make_context

    tables = make_tables("zionex_12t")
    kernel = EmbeddingKernel("fused", "fused", weight_bytes=2)
    context = make_context("zionex", 512, kernel=kernel, cache=CachePolicy("lru", load_factor=0.05))
    with pytest.raises(PlanningError) as err:
        NeoPlanner(host_reserve_fraction=0.2, check_settings_s=0).plan(tables, context)
    message = str(err.value)
    assert "-0." not in message and "bytes (-" not in message, message
    assert "lower the cache load_factor" in message and "use a cache" not in message, message


def test_a_cache_policy_without_a_load_factor_says_it_caches_nothing():
    result = plan_tables([TableSpec("t", 1000, 16, 1.0)], cluster(), 256, cache=CachePolicy("lru"))
    assert any("cache lru (no load_factor: nothing is cached; give one, e.g. 0.2)" in n for n in result.notes)
    none = plan_tables([TableSpec("t", 1000, 16, 1.0)], cluster(), 256)
    assert not any("no load_factor" in n for n in none.notes)
    cpu = plan_tables([TableSpec("t", 1000, 16, 1.0)], replace(cluster(), compute_device="cpu"), 256,
                      cache=CachePolicy("lru"))
    assert not any("no load_factor" in n for n in cpu.notes)  # no cache applies on CPU ranks anyway


def test_sizes_in_messages_keep_their_scale():
    from neo_plugins.sharding.planner.search import human_bytes

    assert human_bytes(46_064) == "45.0 KiB" and human_bytes(5 * 2**20) == "5.0 MiB"
    assert human_bytes(3 * 2**30) == "3.00 GiB"
    tiny = zionex_topology(num_nodes=1, device_memory_gib=0.001)
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("t", 1_000_000, 64, 1.0)], tiny, 256)
    assert "0.00 GiB" not in str(err.value) and "MiB" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("fault", "fragment"),
    [
        ("wrong_type", "returned dict, not a PlanResult"),
        ("unknown", "places tables the model does not have (ghost)"),
        ("missing", "leaves out 1 table(s) (b)"),
        ("twice", "places tables more than once (a)"),
        ("bad_rank", "puts tables on no rank or on ranks outside 0-7 (a)"),
        ("no_reports", "reports ranks none, not each of the 8 ranks once"),
        ("over_capacity", "fills rank 0's memory with 20.0GiB of 16.0GiB"),
        # checked against the topology's memory, not the capacity the plugin says (0: none said)
        ("no_capacity", "fills rank 0's memory with 20.0GiB of 16.0GiB"),
        ("big_capacity", "fills rank 0's memory with 20.0GiB of 16.0GiB"),
        ("nan_capacity", "fills rank 0's memory with 20.0GiB of 16.0GiB"),
        ("nan_memory", "reports memory that is not a number of bytes, 0 or more (rank 0)"),
        # host memory is a node's: rank 0 past its 64 GiB share is fine while node 0 (ranks 0-3) fits
        ("host_share", None),
        ("host_unsaid", None),  # ranks that say no capacity: the node's is the topology's
        ("host_node", "fills node 0's (ranks 0-3) host memory with 257.0GiB of 256.0GiB"),
        ("narrow", "shards whose width is not a multiple of 4, which FBGEMM refuses (a (6 columns))"),
        # what the plan's own tables say, not what the plugin reports of them
        ("under_report", "reports 1B of device memory on rank 0, less than its shards' weights alone (62.5KiB at "
                         "4 bytes per element)"),
        ("bad_type", "gives unknown sharding types ('tablewise' for a): use data_parallel (DP), table_wise (TW), "),
        ("short_type", None),  # "TW", as the docs and plan.txt name it: taken as table_wise
        ("dp_partial", "puts data-parallel (replicated) tables on some ranks only (a on 1): a replica is on every "
                       "rank, 0-7, so list them all"),
        ("bad_shapes", "gives shard shapes (rows, cols) that do not make up their tables (a: [(7, 3)] for 1000 x 16)"),
        ("bad_kernel", "Table 'a' has unknown compute kernel 'fuse'"),
        ("enum_type", None),  # a ShardingType member, as a plugin may write it
        ("shape_count", "gives other than one shard shape per rank listed (a: 2 shapes for 1 ranks)"),
        # checked as the ranks would build it, not only when they do (plan.py wrote such plans)
        ("cw_widths", "Table 'a' has 16 columns, which do not split evenly into 3 column shards"),
    ],
)
def test_a_planner_plugins_plan_is_checked_before_it_is_used(fault, fragment) -> None:
    # a third-party planner's result used to be taken as it came: an unknown or doubled
    # table trained silently, a missing rank report gave an infinite step in plan.json, an
    # over-full rank failed only on the device
    from neo_core.sharding import Planner, PlanResult, RankReport, ShardingType, TableAssignment

    class Faulty(Planner):
        name = "faulty"

        def plan(self, tables, context):
            W = context.topology.world_size
            assignments = [TableAssignment(t.name, "table_wise", "fused", [i % W]) for i, t in enumerate(tables)]
            # each rank's memory as a plugin might report it: a table's weights and state, and more
            reports = [RankReport(rank=r, memory={"weights": 2**20}, memory_capacity=16 * 2**30) for r in range(W)]
            if fault == "under_report":
                reports[0].memory["weights"] = 1.0
            if fault in ("bad_type", "short_type"):
                assignments[0].sharding_type = {"bad_type": "tablewise", "short_type": "TW"}[fault]
            if fault == "dp_partial":
                assignments[0] = TableAssignment("a", "data_parallel", "dense", [1])
            if fault == "bad_shapes":
                assignments[0].shard_shapes = [(7, 3)]
            if fault == "bad_kernel":
                assignments[0].compute_kernel = "fuse"
            if fault == "enum_type":
                assignments[0].sharding_type = ShardingType.TABLE_WISE
            if fault == "shape_count":
                assignments[0].shard_shapes = [(500, 16), (500, 16)]
            if fault == "cw_widths":
                assignments[0] = TableAssignment("a", "column_wise", "fused", [0, 1, 2])
            if fault == "wrong_type":
                return {"tables": assignments}
            if fault == "unknown":
                assignments.append(TableAssignment("ghost", "table_wise", "fused", [0]))
            if fault == "missing":
                assignments.pop()
            if fault == "twice":
                assignments.append(assignments[0])
            if fault == "bad_rank":
                assignments[0].ranks = [W]
            if fault == "no_reports":
                reports = []
            if fault == "narrow":
                assignments[0].shard_shapes = [(1000, 6)]
            if fault in ("over_capacity", "no_capacity", "big_capacity", "nan_capacity"):
                reports[0].memory["weights"] = 20 * 2**30
                reports[0].memory_capacity = {"no_capacity": 0.0, "big_capacity": 64 * 2**30,
                                              "nan_capacity": float("nan")}.get(fault, 16 * 2**30)
            if fault == "nan_memory":
                reports[0].memory["weights"] = float("nan")
            if fault in ("host_share", "host_node", "host_unsaid"):
                for r in reports:
                    r.host_memory_capacity = 0.0 if fault == "host_unsaid" else 64 * 2**30
                reports[0].host_memory["weights"] = 100 * 2**30
                reports[1].host_memory["weights"] = (157 if fault == "host_node" else 100) * 2**30
                if fault == "host_unsaid":
                    reports[0].host_memory_capacity = 64 * 2**30
            return PlanResult("faulty", assignments, reports, context.batch_size_per_rank, {})

        def sharders(self, context):
            return []

    dim = 6 if fault == "narrow" else 16  # TorchRec's planner on dim 6: every rank failed inside FBGEMM
    tables = [TableSpec("a", 1000, dim, 1.0), TableSpec("b", 1000, 16, 1.0)]
    if fragment is None:
        result = plan_tables(tables, cluster(), 256, planner=Faulty())
        assert result.ranks and result.tables[0].sharding_type == "table_wise"
        return
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, planner=Faulty())
    assert str(err.value).startswith(("Sharding planner 'faulty' gave a plan that cannot run: it",
                                      "Sharding planner 'faulty' gave a plan that cannot run: Table 'a'",
                                      "Sharding planner 'faulty' returned")), str(err.value)
    assert fragment in str(err.value), str(err.value)


def test_a_plugins_plan_is_checked_before_the_model_is_sharded_with_it() -> None:
    # training builds the TorchRec plan from the plugin's (plan_module): short type names were
    # refused there ("use a neo_core.sharding.ShardingType value") though plan.py took them,
    # and a plugin's mistakes met the builder's messages, which name no planner
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from neo_core.api import make_context
    from neo_core.sharding import Planner, PlanResult, RankReport, TableAssignment

    class Short(Planner):
        name = "short"

        def __init__(self, fault: str = "") -> None:
            self.fault = fault

        def plan(self, tables, context):
            W = context.topology.world_size
            found = [TableAssignment(t.name, "TW", "fused", [i % W]) for i, t in enumerate(tables)]
            if self.fault == "twice":
                found.append(found[0])
            reports = [RankReport(rank=r, memory={"weights": 2**20}, memory_capacity=16 * 2**30) for r in range(W)]
            return PlanResult("short", found, reports, context.batch_size_per_rank, {})

        def sharders(self, context):
            from neo_plugins.sharding.sharders import make_sharders

            return make_sharders(context)

    tables = [TableSpec("a", 1000, 16, 1.0), TableSpec("b", 1000, 16, 1.0)]
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=16, num_embeddings=1000,
                                                            feature_names=list(t.feature_names)) for t in tables],
                                 device=torch.device("meta"))
    context = make_context(cluster(), 256)
    result = Short().plan_module(ebc, tables, context)
    assert {p.sharding_type for p in result.torchrec_plan.plan[""].values()} == {"table_wise"}
    with pytest.raises(PlanningError, match=r"Sharding planner 'short' gave a plan that cannot run: it places "
                                            r"tables more than once \(a\)"):
        Short("twice").plan_module(ebc, tables, context)


def test_the_api_names_a_single_table_or_an_unknown_group() -> None:
    from neo_core.api import resolve

    one = TableSpec("t0", 1000, 16, 1.0)
    with pytest.raises(ConfigError, match="wrap the single table 't0' in a list"):
        plan_tables(one, cluster(), 256)
    with pytest.raises(ConfigError, match="got str"):
        plan_tables("t0", cluster(), 256)
    with pytest.raises(ConfigError, match="Unknown plugin group 'topolgy'; choose one of topology,"):
        resolve("topolgy", "zionex")
    with pytest.raises(ConfigError, match="Unknown plugin group \\['topology'\\]"):
        resolve(["topology"], "zionex")  # type: ignore[arg-type]


def test_the_api_names_its_own_parameter_where_a_keyword_would_be_taken_for_the_planners() -> None:
    # before: compression="fp16" was taken as the planner's key ("Unknown key sharding.compression")
    one = [TableSpec("t0", 1000, 16, 1.0)]
    for key, meant in (("compression", "compressor"), ("sharding", "planner"), ("compresor", "compressor"),
                       ("batch_size", "batch_size_per_rank")):
        with pytest.raises(ConfigError, match=rf"plan_tables\(\) has no parameter '{key}'; did you mean {meant}=\?"):
            plan_tables(one, cluster(), 256, **{key: "fp16"})
    with pytest.raises(ConfigError, match=r"kernel given as a mapping without 'name': name the kernel plugin, e.g. "
                                          r"\{'name': <plugin>, 'learning_rate': ...\}"):
        plan_tables(one, cluster(), 256, kernel={"learning_rate": 0.1})
    assert plan_tables(one, cluster(), 256, kernel={"name": "fused", "learning_rate": 0.1}, reserve_fraction=0.2)
    # batch_size= in place of the batch size: a bare "missing 1 required positional argument" before
    with pytest.raises(ConfigError, match=r"has no parameter 'batch_size'; did you mean batch_size_per_rank=\?"):
        plan_tables(one, cluster(), batch_size=256)
    with pytest.raises(ConfigError, match=r"^plan_tables\(\) needs batch_size_per_rank: the samples each rank"):
        plan_tables(one, cluster())


def test_the_api_gives_the_python_fix_for_another_groups_key() -> None:
    # before: learning_rate got the planner's close match (sharding.table_sharding_types), and
    # optimizer the command line's kernel.optimizer=<value>
    one = [TableSpec("user_id", 100_000, 64, 1.0)]
    head = "plan_tables() gives other keywords to the planner; "
    for given, keywords, said in (
        # a key of the cluster of one's own alone: a topology of it and nothing else is refused, so not offered
        ({"topology": "local"}, {"nic_gbit_s": 200}, "nic_gbit_s is not a key of topology 'local' (it is of 'cluster', a "
         "GPU cluster of your own, which takes every figure: conf/topology/cluster.yaml lists them)."),
        ({}, {"learning_rate": 0.1}, "learning_rate is a key of the kernel: kernel={'name': 'fused', 'learning_rate': 0.1}."),
        ({}, {"optimizer": "sgd"}, "optimizer is a key of the kernel: kernel={'name': 'fused', 'optimizer': 'sgd'}."),
        # the plugin the call named, its keys kept, and every key of it at once
        ({"kernel": {"name": "dense", "eps": 0.01}}, {"optimizer": "sgd", "learning_rate": 0.1, "reserve_fraction": 0.2},
         "optimizer and learning_rate are keys of the kernel: kernel={'name': 'dense', 'eps': 0.01, 'optimizer': 'sgd', "
         "'learning_rate': 0.1}."),
        ({}, {"load_factor": 0.2}, "load_factor is a key of the cache: cache={'name': 'lru', 'load_factor': 0.2}."),
        ({"compressor": "fp16"}, {"backward": "bf16"},
         "backward is a key of the compressor: compressor={'name': 'fp16', 'backward': 'bf16'}."),
        ({}, {"memory_fraction": 0.5},
         "memory_fraction is a key of the topology: topology={'name': 'local', 'memory_fraction': 0.5}."),
        ({}, {"embedding_dim": 32},
         "embedding_dim is a field of each table, given where it is made: TableSpec(name, num_embeddings, embedding_dim=32)."),
        ({}, {"timeout_s": 5}, "timeout_s is a key of planner 'torchrec': planner='torchrec', timeout_s=5."),
    ):
        with pytest.raises(ConfigError) as err:
            plan_tables(one, given.pop("topology", "local"), 64, **given, **keywords)
        assert str(err.value) == head + said
    # a key the planner takes is the planner's, whoever else takes it
    assert plan_tables(one, "local", 64, time_budget_s=5.0)
    # a key the cluster given does not take: the example of another plugin's is said to be another cluster
    with pytest.raises(ConfigError) as err:
        plan_tables(one, "zionex", 64, world_size=4)
    assert str(err.value) == head + ("world_size is not a key of topology 'zionex' (it is of 'local': topology="
                                     "{'name': 'local', 'world_size': 4} plans for that cluster instead).")
    from neo_core.topology import GiB, Topology

    two = Topology("two_nodes", 2, 2, "cpu", 4 * GiB, 4 * GiB, 1e10, 1e10, 1e10, 1e10, 1e9)
    with pytest.raises(ConfigError, match=r"device_memory_gib is not a key of the Topology given \(it is of 'zionex'.*"
                                          r"; a Topology's fields are set where it is made\.$"):
        plan_tables(one, two, 64, device_memory_gib=3)


def test_a_planner_plugin_that_takes_any_keyword_gets_them_all(register_plugin) -> None:
    # a factory with **kwargs was refused learning_rate as the kernel's and seed as the data's
    from neo_core import hookimpl

    seen: dict = {}

    def any_keyword(**params) -> NeoPlanner:
        seen.update(params)
        return NeoPlanner()

    class AnyKeyword:
        __name__ = "any_keyword_planner"

        @hookimpl
        def neo_register_sharders(self, registry) -> None:
            registry.register("any_keyword", any_keyword)

    register_plugin(AnyKeyword())
    plan_tables([TableSpec("user_id", 1000, 16)], "local", 64, planner="any_keyword", learning_rate=0.1, seed=3)
    assert seen == {"learning_rate": 0.1, "seed": 3}


def test_a_planner_plugin_that_takes_such_a_keyword_gets_it(register_plugin) -> None:
    from neo_core import hookimpl

    seen = {}

    def wide_planner(batch_size: int = 0) -> NeoPlanner:
        seen["batch_size"] = batch_size
        return NeoPlanner()

    class Wide:
        __name__ = "wide_planner"

        @hookimpl
        def neo_register_sharders(self, registry):
            registry.register("wide", wide_planner)

    register_plugin(Wide())
    assert plan_tables([TableSpec("t0", 1000, 16, 1.0)], cluster(), 256, planner="wide", batch_size=7)
    assert seen == {"batch_size": 7}


def test_replicated_tables_too_large_for_a_rank_say_ranks_do_not_help() -> None:
    """On the dense kernel every rank holds every table: the shortage is per rank, and the fix
    is a kernel that shards, not more ranks."""
    gib = 2**30
    tables = [TableSpec(f"t{i}", 2 * gib // (128 * 4), 128) for i in range(40)]  # 2 GiB each, 80 GiB in all
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, topology="zionex", batch_size_per_rank=512, kernel="dense")
    message = str(err.value)
    needed = re.match(r"Kernel dense replicates every table on every rank: each rank needs ([\d.]+) GiB", message)
    assert needed and float(needed[1]) >= 80, message  # the weights alone are 80 GiB on each rank
    assert "use kernel=fused, which can shard tables" in message and "more ranks do not help" in message
    assert "add ranks" not in message
    plan_tables(tables, topology="zionex", batch_size_per_rank=512)  # the fused kernel shards them


def test_column_shard_counts_that_split_no_table_are_noted() -> None:
    # col_shard_counts=[3] on dims of 128 left out CW, TWCW and GRID without a word
    tables = [TableSpec(f"t{i}", 1_000_000 * (i + 1), 128) for i in range(8)]
    notes = lambda **kw: [n for n in plan_tables(tables, "zionex", 256, **kw).notes if "col_shard" in n]  # noqa: E731
    assert notes(col_shard_counts=[3]) == [
        "sharding.col_shard_counts 3 splits no table: shards must be whole multiples of 4 columns, at least "
        "sharding.min_col_width=16, so CW, GRID, TWCW were not considered"]
    assert notes(col_shard_counts=[2, 3]) == [
        "sharding.col_shard_counts 3 splits no table: shards must be whole multiples of 4 columns, at least "
        "sharding.min_col_width=16"]
    assert notes(min_col_width=1000)[0].startswith("sharding.col_shard_counts 2, 4, 8 split no table")
    assert notes() == [] and notes(col_shard_counts=[3], sharding_types=["TW", "RW"]) == []


def test_column_shard_counts_above_the_ranks_are_noted_and_refused_where_cw_is_asked_for() -> None:
    # col_shard_counts=[3] or [4] on 2 ranks gave no column shards: [4] without a word, [3] blamed on
    # its split alone, with TWCW and GRID, which one node has none of; CW asked for by name planned on without it
    table = [TableSpec("user_id", 100_000, 64, 1.0)]
    notes = lambda **kw: [n for n in plan_tables(table, "local", 256, **kw).notes if "col_shard" in n]  # noqa: E731
    for k in (3, 4):
        assert notes(col_shard_counts=[k]) == [
            f"sharding.col_shard_counts {k} is more shards than the 2 ranks, so CW was not considered"]
    assert notes(col_shard_counts=[2, 4]) == ["sharding.col_shard_counts 4 is more shards than the 2 ranks"]
    assert notes() == []  # the default counts above a small cluster's ranks are no news
    with pytest.raises(ConfigError) as err:
        plan_tables(table, "local", 256, col_shard_counts=[3], sharding_types=["CW", "RW"])
    assert str(err.value) == (
        "sharding.sharding_types asks for CW, but no table can be split into columns here: sharding.col_shard_counts "
        "3 is more shards than the 2 ranks; give sharding.col_shard_counts=[2], or leave CW out of "
        "sharding.sharding_types.")
    with pytest.raises(ConfigError, match=r"3 splits no table: shards must be whole multiples of 4 columns, at least "
                                          r"sharding.min_col_width=16 \(table dims: 64\); give "
                                          r"sharding.col_shard_counts=\[2, 4\], or leave CW out"):
        plan_tables(table, "zionex", 256, col_shard_counts=[3], sharding_types=["CW", "TW"])
    with pytest.raises(ConfigError, match=r"give sharding.min_col_width=32, or leave CW out"):
        plan_tables(table, "local", 256, min_col_width=128, sharding_types=["CW", "RW"])
    assert plan_tables(table, "local", 256, col_shard_counts=[2, 3], sharding_types=["CW", "RW"])  # 2 splits it
    # CW in a list of types with the default splits (as Neo's own advice gives one): planned on, noted
    narrow = [TableSpec("narrow", 100_000, 16, 1.0)]
    assert [n for n in plan_tables(narrow, "zionex", 256, sharding_types=["CW", "TW"]).notes if "col_shard" in n] == [
        "sharding.col_shard_counts 2, 4, 8 split no table: shards must be whole multiples of 4 columns, at least "
        "sharding.min_col_width=16, so CW was not considered"]


def _setting(message: str, key: str) -> tuple[float, float]:
    """The value a capacity message asks of ``key``, and the value it says is set now."""
    found = re.search(rf"topology\.{key}=([\d.]+) or more, now ([\d.]+)", message)
    assert found, f"no topology.{key} in: {message}"
    return float(found.group(1)), float(found.group(2))


def test_a_short_cluster_is_told_which_topology_settings_would_hold_the_tables() -> None:
    # 40 tables of 50M x 128 fp32 (about 24 GiB each, 960 GiB) on 2 ZionEX nodes (16 x 34 GiB
    # usable): the fewest nodes whose memory holds them is 4, and a device of 70.7 GiB
    tables = [TableSpec(f"t{i}", 50_000_000, 128, 1.0) for i in range(40)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=2), 512)
    msg = str(err.value)
    assert msg.startswith("Device memory is short")
    nodes, now = _setting(msg, "num_nodes")
    assert (nodes, now) == (4, 2)
    gib, now = _setting(msg, "device_memory_gib")
    assert now == 40 and 70 < gib < 72
    # the settings named are the least that do: one node fewer, or 5% less memory, still fails
    with pytest.raises(PlanningError, match="Device memory is short"):
        plan_tables(tables, zionex_topology(num_nodes=int(nodes) - 1), 512)
    with pytest.raises(PlanningError, match="Device memory is short"):
        plan_tables(tables, zionex_topology(num_nodes=2, device_memory_gib=gib * 0.95), 512)
    assert plan_tables(tables, zionex_topology(num_nodes=int(nodes)), 512).ranks
    assert plan_tables(tables, zionex_topology(num_nodes=2, device_memory_gib=gib * 1.1), 512).ranks


def test_short_host_memory_is_told_its_topology_settings() -> None:
    # 16 cached tables of 400M x 128 fp32 (190 GiB each, 3 TiB) behind a 1% cache on one
    # ZionEX node (8 x 192 GiB of host memory, 1.5 TiB): host memory is short, not device memory
    tables = [TableSpec(f"h{i}", 400_000_000, 128, 1.0) for i in range(16)]
    lru = CachePolicy("lru", load_factor=0.01)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1), 512, cache=lru)
    msg = str(err.value)
    assert msg.startswith("Host memory is short")
    nodes, now = _setting(msg, "num_nodes")
    assert now == 1 and nodes >= 2
    gib, now = _setting(msg, "host_memory_gib_per_node")
    assert now == 1536 and gib > 1536
    with pytest.raises(PlanningError, match="memory is short"):
        plan_tables(tables, zionex_topology(num_nodes=int(nodes) - 1), 512, cache=lru)
    assert plan_tables(tables, zionex_topology(num_nodes=int(nodes)), 512, cache=lru).ranks
    assert plan_tables(tables, zionex_topology(num_nodes=1, host_memory_gib_per_node=gib * 1.1), 512,
                       cache=lru).ranks


def test_a_table_too_large_for_a_rank_is_told_the_memory_that_would_hold_its_shard() -> None:
    # 4e9 x 128 fp32 behind a cache, row-wise over one node: a shard of about 238 GiB of host
    # memory against 192 GiB a rank (1.5 TiB a node)
    huge = TableSpec("huge", 4_000_000_000, 128, 1.0)
    lru = CachePolicy("lru", load_factor=0.01)
    with pytest.raises(PlanningError) as err:
        plan_tables([huge], zionex_topology(num_nodes=1), 512, cache=lru)
    msg = str(err.value)
    assert msg.startswith("Table 'huge'") and "over the 1536.00 GiB of host memory on its 1 node (8 shards" in msg
    # the row-wise shard, the smallest (row-wise state and a 1% cache of its 5e8 rows on the
    # device), not a column shard as short of host memory with 4e9 rows' state on the device
    assert float(re.search(r"needs ([\d.]+) GiB of device memory", msg).group(1)) < 8
    gib, now = _setting(msg, "host_memory_gib_per_node")
    assert now == 1536 and 8 * 4e9 * 128 * 4 / 8 / 2**30 < gib < 1.05 * 8 * 4e9 * 128 * 4 / 8 / 2**30
    assert plan_tables([huge], zionex_topology(num_nodes=1, host_memory_gib_per_node=gib), 512, cache=lru).ranks


def test_a_table_the_packing_leaves_out_names_the_memory_and_the_levers() -> None:
    # nine table-wise tables, one a rank at most, on eight ranks: the cluster holds them in
    # sum (no whole-cluster shortage), the ninth fits on no rank once eight are placed
    tables = [TableSpec(f"t{i}", 15_000_000, 128, 1.0) for i in range(9)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, sharding_types=["TW"])
    msg = str(err.value)
    assert "fits on no rank once the larger tables are placed" in msg
    assert "more device memory than the ranks have left" in msg and "use a cache" in msg
    assert "add ranks or device memory" in msg
    assert "host_reserve_fraction" not in msg
    # on CPU ranks: no device, and no cache (it applies on GPUs only)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, replace(cluster(), compute_device="cpu"), 256, sharding_types=["TW"])
    msg = str(err.value)
    assert "more memory than the ranks have left" in msg and "cache" not in msg and "device" not in msg
    # cached tables held back by a host reserve: the reserve is named as a lever. Host memory
    # is a node's (4 ranks, 230.4 GiB usable with a 10% reserve): one 127-GiB table a node
    cached = [TableSpec(f"h{i}", 266_000_000, 128, 1.0) for i in range(3)]
    lru = CachePolicy("lru", load_factor=0.01)
    with pytest.raises(PlanningError) as err:
        plan_tables(cached, cluster(), 256, cache=lru, sharding_types=["TW"], host_reserve_fraction=0.1)
    msg = str(err.value)
    assert "more host memory than the nodes have left" in msg
    assert "add ranks or host memory" in msg and "lower sharding.host_reserve_fraction (now 0.1)" in msg
    assert "load_factor" not in msg  # a smaller cache frees device memory, not host memory


def test_capacity_messages_name_what_every_refused_table_needs_and_the_batch() -> None:
    # two tables too large for a rank: the larger ('b') is named first, and the device memory
    # named holds it, not just the first in order ('a')
    two = [TableSpec("a", 12_000_000_000, 128, 1.0), TableSpec("b", 20_000_000_000, 128, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(two, "zionex", 512)
    msg = str(err.value)
    assert msg.startswith("Table 'b'") and "(1 more table also does not fit: 'a')" in msg
    assert "checked: the tables plan with each" in msg
    gib, _ = _setting(msg, "device_memory_gib")
    assert gib > 20e9 * 128 * 4 / 128 / 2**30 / 0.85
    # row-wise, its shards shrink with more ranks: 'b' needs at least 36 nodes' worth
    nodes, now = _setting(msg, "num_nodes")
    assert now == 16 and nodes >= 20e9 * 128 * 4 / (34 * 2**30) / 8
    # a table short of both memories needs both settings: "and", not "or"
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("a", 10**11, 128, 1.0)], zionex_topology(num_nodes=2), 512, cache="lru")
    msg = str(err.value)
    dev, _ = _setting(msg, "device_memory_gib")
    host, _ = _setting(msg, "host_memory_gib_per_node")
    assert "; or both topology.device_memory_gib=" in msg and ", and topology.host_memory_gib_per_node=" in msg
    # more ranks shrink its row-wise shards: the fewest nodes the bound allows is named too,
    # and one node fewer cannot hold it
    nodes, now = _setting(msg, "num_nodes")
    assert now == 2 and nodes > 2
    with pytest.raises(PlanningError):
        plan_tables([TableSpec("a", 10**11, 128, 1.0)], zionex_topology(num_nodes=int(nodes) - 1), 512, cache="lru")
    both = zionex_topology(num_nodes=2, device_memory_gib=dev * 1.05, host_memory_gib_per_node=host * 1.05)
    assert plan_tables([TableSpec("a", 10**11, 128, 1.0)], both, 512, cache="lru").ranks
    # a batch whose ids and pooled rows fill the shard is named, and a cache is not offered
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("c", 1_000_000, 128, 1.0)], zionex_topology(num_nodes=1), 100_000_000)
    msg = str(err.value)
    assert "lower the batch per rank (now 100,000,000:" in msg and "cache=" not in msg
    assert "trainer.batch_size in training, batch_size_per_rank in recipes/plan.py" in msg


def test_an_empty_listed_table_set_says_it_is_empty() -> None:
    from neo_plugins.sharding.planner.tables import listed

    with pytest.raises(ConfigError, match="tables is empty: list at least one table"):
        listed([])
    with pytest.raises(ConfigError, match="tables must be a list of tables"):
        listed("user_id")


def test_a_table_file_is_planned_as_its_rows_say(tmp_path) -> None:
    # a feature store's dump had to be converted to a `listed` YAML or to TableSpecs by hand,
    # and its CSV strings given as they were were refused ("num_embeddings '200000000' of type str")
    from neo_core.api import read_tables

    csv = tmp_path / "tables.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor,hot_fraction,feature_names\n"
                   "user,5000000,64,1,0.3,\n"
                   "item,2e6,32,20,,item_a;item_b\n"
                   "\n"
                   "ads, 100000 ,16,3.5,0.9,\n")
    want = [TableSpec("user", 5_000_000, 64, 1.0, hot_fraction=0.3),
            TableSpec("item", 2_000_000, 32, 20.0, feature_names=("item_a", "item_b")),
            TableSpec("ads", 100_000, 16, 3.5, hot_fraction=0.9)]
    assert read_tables(csv) == want
    # JSON and YAML: a list of mappings, or one under 'tables'
    (tmp_path / "t.json").write_text(json.dumps([{"name": "user", "num_embeddings": 5_000_000, "embedding_dim": 64,
                                                   "hot_fraction": 0.3}]))
    (tmp_path / "t.yaml").write_text("tables:\n  - {name: user, num_embeddings: 5000000, embedding_dim: 64, "
                                     "hot_fraction: 0.3}\n")
    assert read_tables(tmp_path / "t.json") == read_tables(str(tmp_path / "t.yaml")) == want[:1]
    # a path is planned as its tables, from Python and from a plan_model file
    by_path = plan_tables(str(csv), zionex_topology(), 512)
    assert by_path.predicted_step_time == plan_tables(want, zionex_topology(), 512).predicted_step_time
    assert make_tables("file", path=str(csv)) == want


def test_a_table_file_saved_with_a_byte_order_mark_is_read(tmp_path) -> None:
    # a spreadsheet's "CSV UTF-8" export starts with a byte-order mark: its first column was
    # refused as '\ufeffname' ("Did you mean 'name'?"), and a JSON file as not JSON
    from neo_core.api import read_tables

    want = [TableSpec("user", 5_000_000, 64, 1.0)]
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbfname,num_embeddings,embedding_dim\r\nuser,5000000,64\r\n")
    (tmp_path / "t.json").write_bytes(b'\xef\xbb\xbf[{"name": "user", "num_embeddings": 5000000, "embedding_dim": 64}]')
    (tmp_path / "t.yaml").write_bytes(b"\xef\xbb\xbf- {name: user, num_embeddings: 5000000, embedding_dim: 64}\n")
    assert read_tables(tmp_path / "t.csv") == read_tables(tmp_path / "t.json") == read_tables(tmp_path / "t.yaml") == want


def test_a_feature_stores_dump_is_read_with_its_own_separator_and_columns(tmp_path, capsys) -> None:
    # a dump separated by ';' was refused as one column; one with a column of its own (an owner)
    # was refused outright
    from neo_core.api import read_tables

    for sep in (";", "\t", "|"):
        (tmp_path / "dump.csv").write_text(sep.join(("name", "num_embeddings", "embedding_dim", "owner", "pooling_factor"))
                                          + "\n" + sep.join(("user", "5000", "16", "ads", "2")) + "\n")
        assert read_tables(tmp_path / "dump.csv") == [TableSpec("user", 5000, 16, 2.0)], repr(sep)
        assert "dump.csv: column(s) 'owner' are not a table's fields" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("name,num_embedings\nuser,5\n", "column 'num_embedings' is not a table's field. Did you mean 'num_embeddings'?"),
    ("name,num_embeddings,embedding_dim\nuser,5,4\nitem,5x,4\n", "tables.csv, line 3: num_embeddings '5x' is not a number."),
    # a cell past the header's was dropped unsaid: a second feature in a ';'-separated file, a stray value
    ("name;num_embeddings;embedding_dim;feature_names\nt1;100;16;a;b\n",
     "tables.csv, line 2: 5 cells where the header has 4 (a feature_names cell of several, separated by ';', is "
     "quoted in a ';'-separated file)."),
    ("name,num_embeddings,embedding_dim\nt1,100,16,extra\n", "tables.csv, line 2: 4 cells where the header has 3."),
    ("name,num_embeddings,embedding_dim\n", "tables.csv: no tables in it (a header alone)."),
    ("", "tables.csv: no tables in it."),
    ("name,num_embeddings,embedding_dim,hot_fraction\nuser,5,4,30\n",
     "tables.csv, line 2: Table 'user' has hot_fraction 30.0;"),
    ("name,num_embeddings\nuser,5\n", "tables.csv, line 2 ('user') lacks embedding_dim"),
    ("name,num_embeddings,embedding_dim\nuser,5,4\n\nuser,6,4\n",
     "'user' is table file {tmp}/tables.csv, line 2, table file {tmp}/tables.csv, line 4; rename all but one"),
])
def test_a_table_file_names_the_line_and_field_it_cannot_read(tmp_path, text, message) -> None:
    from neo_core.api import read_tables

    (tmp_path / "tables.csv").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message.format(tmp=tmp_path))):
        read_tables(tmp_path / "tables.csv")


def test_a_table_file_that_is_not_one_is_refused_saying_what_is_read(tmp_path) -> None:
    from neo_core.api import read_tables

    with pytest.raises(ConfigError, match="is not a file \\(relative paths are from where the command runs"):
        read_tables(tmp_path / "none.csv")
    (tmp_path / "t.parquet").write_text("x")
    with pytest.raises(ConfigError, match="a .csv, .json, .yaml or .yml file is read, not .parquet"):
        read_tables(tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text('{"name": "user"}')
    with pytest.raises(ConfigError, match="give a list of tables, each a mapping of its fields"):
        read_tables(tmp_path / "t.json")
    (tmp_path / "t.json").write_text("[{")
    with pytest.raises(ConfigError, match="t.json: not JSON"):
        read_tables(tmp_path / "t.json")
    (tmp_path / "t.yaml").write_text("tables: [{name: a\n")  # yaml's error is no ValueError: it was a traceback
    with pytest.raises(ConfigError, match="t.yaml: not YAML \\(while parsing a flow mapping"):
        read_tables(tmp_path / "t.yaml")


def test_a_table_file_is_read_as_a_spreadsheet_or_a_shell_writes_it(tmp_path, monkeypatch) -> None:
    # spaces after the header's commas, digits grouped by '_', a trailing ';', a row of empty
    # cells (a spreadsheet's export), an upper-case suffix, a path from the home folder
    from neo_core.api import read_tables

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "TABLES.CSV").write_text("name, num_embeddings, embedding_dim, feature_names\n"
                                         "user,5_000_000,64,user_a;user_b;\n"
                                         ",,,\n"
                                         "item,2e6,32.0,\n")
    tables = read_tables("~/TABLES.CSV")
    assert tables == [TableSpec("user", 5_000_000, 64, feature_names=("user_a", "user_b")), TableSpec("item", 2_000_000, 32)]
    # whole numbers as whole numbers, as a plan saves them
    assert [(type(t.num_embeddings), type(t.embedding_dim)) for t in tables] == [(int, int)] * 2


def test_a_table_file_or_a_path_that_is_none_is_named_for_what_it_lacks(tmp_path) -> None:
    from neo_core.api import read_tables

    # JSON and YAML tables are named by their place in the list, from 1 (there are no lines to name)
    (tmp_path / "t.json").write_text(json.dumps([{"name": "user", "num_embeddings": 5, "embedding_dim": 4},
                                                 {"name": "item", "num_embeddings": 5}]))
    with pytest.raises(ConfigError, match=re.escape("t.json, table 2 ('item') lacks embedding_dim")):
        read_tables(tmp_path / "t.json")
    (tmp_path / "t.json").write_text("[]")
    with pytest.raises(ConfigError, match="t.json: give a list of tables, each a mapping of its fields"):
        read_tables(tmp_path / "t.json")
    with pytest.raises(ConfigError, match="a table file's path must be given \\(params.path, or data.tables=<file>\\), "
                                          "got '  '"):
        make_tables("file", path="  ")
    # a string that names no table file is not taken for one: a table's name given alone
    with pytest.raises(ConfigError, match=re.escape("tables must be a list of TableSpec objects or a table file's path "
                                                    "(.csv, .json, .yaml), got str 'user_id'.")):
        plan_tables("user_id", zionex_topology(), 512)
    # a file of another suffix is read for what it is
    (tmp_path / "tables.txt").write_text("name,num_embeddings,embedding_dim\nuser,5,4\n")
    with pytest.raises(ConfigError, match="a .csv, .json, .yaml or .yml file is read, not .txt"):
        plan_tables(str(tmp_path / "tables.txt"), zionex_topology(), 512)


def test_a_table_short_of_device_memory_is_told_what_stops_it_behind_the_cache() -> None:
    # on the device its row-wise shard is 41 GiB too large; behind the cache its shards fit the
    # devices, and the host memory a node's ranks share (200 GiB usable) is what stops them
    big = TableSpec("big", 20 * 10**9, 128, 1.0)
    topo = zionex_topology(host_memory_gib_per_node=400)
    with pytest.raises(PlanningError) as err:
        plan_tables([big], topo, 512, cache="lru", host_reserve_fraction=0.5)
    msg = str(err.value)
    assert "behind the cache (as RW cached) it fits the devices but is" in msg
    assert "add ranks or device memory or host memory" in msg and "load_factor" not in msg
    gib, now = _setting(msg, "host_memory_gib_per_node")
    assert now == 400 and gib == pytest.approx(2 * 8 * 20e9 * 128 * 4 / 128 / 2**30, rel=0.01)
    assert plan_tables([big], zionex_topology(host_memory_gib_per_node=gib), 512, cache="lru",
                       host_reserve_fraction=0.5).ranks


def test_the_settings_a_refusal_names_are_checked_by_planning() -> None:
    # MLPerf on one ZionEX node of 10 GiB GPUs: the memory bound (99 GiB of tables over 8
    # GPUs) names 14.6 GiB, but the tables pack into 14.8 GiB GPUs
    tables, one_node = make_tables("mlperf_dcnv2"), {"num_nodes": 1, "device_memory_gib": 10}
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(**one_node), 8192, check_settings_s=0)
    bound, now = _setting(str(err.value), "device_memory_gib")
    assert "the least these could be, packing may need more" in str(err.value) and now == 10
    with pytest.raises(PlanningError, match="fits on no rank once the larger tables are placed"):
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=bound), 8192)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(**one_node), 8192)
    msg = str(err.value)
    assert "; checked: the tables plan with each)" in msg and "packing may need more" not in msg
    gib, _ = _setting(msg, "device_memory_gib")
    nodes, _ = _setting(msg, "num_nodes")
    assert bound < gib < bound * 1.05 and nodes == 2
    assert plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=gib), 8192).ranks
    assert plan_tables(tables, zionex_topology(num_nodes=2, device_memory_gib=10), 8192).ranks
    # the check stops at its deadline: the bounds are then named unchecked, as with 0
    with pytest.raises(PlanningError, match="the least these could be, packing may need more"):
        plan_tables(tables, zionex_topology(**one_node), 8192, check_settings_s=1e-9)


def test_a_refused_table_is_told_the_memory_the_whole_cluster_needs_too() -> None:
    # two tables too large for a rank: each one's row-wise shard alone needs 88.4 GiB GPUs, but
    # a GPU holds a shard of both, which the whole cluster's bound (their sum) says
    two = [TableSpec("a", 12_000_000_000, 128, 1.0), TableSpec("b", 20_000_000_000, 128, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(two, "zionex", 512, check_settings_s=0)
    bound, _ = _setting(str(err.value), "device_memory_gib")
    assert bound > (12e9 + 20e9) * 128 * 4 / 128 / 2**30 / 0.85
    with pytest.raises(PlanningError) as err:
        plan_tables(two, "zionex", 512)
    gib, _ = _setting(str(err.value), "device_memory_gib")
    assert plan_tables(two, zionex_topology(device_memory_gib=gib), 512).ranks


def test_a_table_the_packing_leaves_out_is_told_settings_that_plan() -> None:
    # nine table-wise tables of 28.6 GiB (fp32) on one ZionEX node, 34 GiB usable a GPU: the
    # node's memory holds them in sum, but a GPU holds one; two a GPU need 67.9 GiB
    tables = [TableSpec(f"t{i}", 60_000_000, 128, 1.0) for i in range(9)]
    topo = zionex_topology(num_nodes=1)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, topo, 512, sharding_types=["TW"])
    msg = str(err.value)
    assert "fits on no rank once the larger tables are placed" in msg
    assert "add ranks or device memory (topology.num_nodes=2 or more, now 1; or topology.device_memory_gib=" in msg
    gib, _ = _setting(msg, "device_memory_gib")
    assert 2 * 60e6 * 128 * 4 / 2**30 / 0.85 < gib < 1.05 * 2 * 60e6 * 128 * 4 / 2**30 / 0.85
    assert plan_tables(tables, zionex_topology(num_nodes=2), 512, sharding_types=["TW"]).ranks
    assert plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=gib), 512, sharding_types=["TW"]).ranks
    # unchecked, the packing's refusal names no settings: it has no bound to offer
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, topo, 512, sharding_types=["TW"], check_settings_s=0)
    assert "topology." not in str(err.value) and "add ranks or device memory, use a cache" in str(err.value)


def test_a_table_with_no_option_is_named_first_among_refused_tables() -> None:
    # 'a' is too large for the cluster, 'b' has no option at all (too narrow for CW shards,
    # fewer rows than ranks for RW): no memory would hold 'b', so it is the one named (the
    # memory bounds leave it out rather than count it as infinitely large)
    tables = [TableSpec("a", 20_000_000_000, 128, 1.0), TableSpec("b", 10, 8, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=2), 512, sharding_types=["CW", "RW"])
    msg = str(err.value)
    assert msg.startswith("Table 'b' (10 rows x 8) has no sharding option among the allowed sharding types")
    assert "(1 more table also does not fit: 'a')" in msg and "allow another sharding type" in msg


def test_the_settings_check_keeps_to_what_the_topology_can_take() -> None:
    # the local topology's memory_fraction is at most 1: three table-wise tables, each a bit
    # over half of a rank's memory at memory_fraction=1, fit at no fraction; the check says so
    # rather than naming a fraction above 1
    topo = local_topology(world_size=2, compute_device="cpu", memory_fraction=0.5)
    rows = int(topo.config_keys["device_memory"][1] * 0.85 * 1.05 / 2 / (64 * 4 + 4))
    tables = [TableSpec(f"t{i}", rows, 64, 1.0) for i in range(3)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, topo, 1, sharding_types=["TW"])
    msg = str(err.value)
    assert "(not even topology.memory_fraction=1, the most it can be, holds them)" in msg, msg
    assert not re.search(r"memory_fraction=1\.\d", msg)
    # a setting the tables' own restrictions cannot take counts as not planning: 's' allows RW
    # only, which needs a row per rank, so more nodes cannot hold it; the check does not end
    # in that error (a ConfigError about a cluster the user does not have)
    two = [TableSpec("big", 200_000_000, 128, 1.0), TableSpec("s", 10, 16, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(two, zionex_topology(num_nodes=1, device_memory_gib=4), 512, table_sharding_types={"s": ["RW"]})
    msg = str(err.value)
    assert ("topology.num_nodes=4 or more, now 1, the least memory allows, but the tables do not plan even with "
            "topology.num_nodes=7 (Table 's' allows only RW, none of which is possible on this topology or with the "
            "global sharding_types (RW: 10 rows, fewer than the 56 ranks)): checked by planning") in msg, msg
    assert "; the others checked: the tables plan with each)" in msg
    # kernel dense replicates every table: the memory named is checked too
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("big", 20_000_000, 128, 1.0)], zionex_topology(num_nodes=1, device_memory_gib=4), 512,
                    kernel="dense")
    gib, _ = _setting(str(err.value), "device_memory_gib")
    assert "; checked: the tables plan with it)" in str(err.value)
    assert plan_tables([TableSpec("big", 20_000_000, 128, 1.0)], zionex_topology(num_nodes=1, device_memory_gib=gib),
                       512, kernel="dense").ranks


def test_a_refusal_says_when_the_batch_not_the_tables_fills_memory():
    # 26 small tables and 4M samples per rank: the batch's ids and pooled rows were counted with
    # the tables, and the message named 200-row tables as the largest, with no word of the batch
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec(f"t{i}", 200 + 1000 * i, 64, 2.0) for i in range(26)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=8), 4_000_000, check_settings_s=0)
    msg = str(err.value)
    assert re.search(r"short; [\d.]+ GiB of it is one batch's ids and pooled rows at 4,000,000 samples per rank: "
                     r"a smaller batch per rank needs less \(trainer.batch_size in training", msg), msg
    # with the batch per rank held, its buffers grow with the ranks: more ranks or a cache
    # cannot help (it named topology.num_nodes=4, which is refused the same way), and the
    # tables are named by their own bytes (t25's 8.11 GiB was its batch's)
    assert re.search(r"more ranks do not help: one batch's ids and pooled rows need [\d.]+ GiB on every rank, "
                     r"whatever the ranks; lower the batch per rank or give each rank more device memory", msg), msg
    assert "num_nodes" not in msg and "cache" not in msg, msg
    assert "largest tables, without their batch buffers: t25 (6.2 MiB)" in msg, msg
    # where more ranks do help, the batch's growth with them is counted in the nodes named
    tables = [TableSpec(f"t{i}", 3_000_000, 128, 20.0) for i in range(20)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=4), 200_000, check_settings_s=0)
    nodes = int(re.search(r"topology.num_nodes=(\d+) or more", str(err.value)).group(1))
    assert nodes > 2  # was 2, which is refused as short of device memory
    with pytest.raises(PlanningError, match="Device memory is short"):
        plan_tables(tables, zionex_topology(num_nodes=nodes - 1, device_memory_gib=4), 200_000, check_settings_s=0)
    # checked by planning, no number of nodes up to 1.6x that holds them (the batch's buffers
    # per table grow with the ranks): the message says so rather than "packing may need more"
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=4), 200_000)
    msg = str(err.value)
    most = math.ceil(nodes * 1.6)
    assert (f"topology.num_nodes={nodes} or more, now 1, the least memory allows, but the tables do not plan even "
            f"with topology.num_nodes={most}: checked by planning; or topology.device_memory_gib=") in msg, msg
    with pytest.raises(PlanningError, match="Device memory is short|fits on no rank"):
        plan_tables(tables, zionex_topology(num_nodes=most, device_memory_gib=4), 200_000, check_settings_s=0)
    with pytest.raises(PlanningError) as err:  # the tables themselves: no word of the batch
        plan_tables([TableSpec("big", 2_000_000_000, 128, 1.0)], zionex_topology(num_nodes=1), 512,
                    check_settings_s=0)
    assert "batch" not in str(err.value)


def test_a_table_that_fits_no_rank_because_of_the_batch_is_told_to_lower_it():
    # 3M samples per rank: one batch's buffers filled most of each rank; the refusal asked for
    # one more node at every size (1, 2, 3, 4, 8, 50) and for a cache, neither of which helps
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec("hist_items", 2_000_000, 128, 200.0), TableSpec("hist_queries", 1_000_000, 128, 150.0),
              TableSpec("user", 5_000_000, 64, 1.0), TableSpec("country", 300, 64, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=16), 3_000_000)
    msg = str(err.value)
    assert "fits on no rank once the larger tables are placed" in msg, msg
    assert re.search(r"lower the batch \([\d.]+ GiB of each rank's device memory is one batch's ids and pooled rows "
                     r"at 3,000,000 samples per rank; trainer.batch_size in training", msg), msg
    # more nodes are checked by planning, and said not to help
    assert "but the tables do not plan even with topology.num_nodes=" in msg and "cache" not in msg, msg
    # where the batch alone overfills a rank, more ranks are not offered at all
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=16), 6_000_000,
                    check_settings_s=0)
    msg = str(err.value)
    if "fits on no rank" in msg:
        assert "which more ranks do not shrink" in msg and "num_nodes" not in msg, msg
    else:
        assert "more ranks do not help" in msg and "num_nodes" not in msg, msg
    # and where the tables fill the rest, more nodes are offered, and plan (2 nodes here)
    mixed = tables[:2] + [TableSpec("country", 300, 64, 1.0)] + [TableSpec(f"user{u}", 12_000_000, 64, 1.0)
                                                                 for u in range(3)]
    with pytest.raises(PlanningError) as err:
        plan_tables(mixed, zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=16), 1_800_000)
    nodes = re.search(r"topology.num_nodes=(\d+) or more, now 1[;)]", str(err.value))
    assert nodes and "checked" in str(err.value), str(err.value)
    assert plan_tables(mixed, zionex_topology(num_nodes=int(nodes.group(1)), devices_per_node=2, device_memory_gib=16),
                       1_800_000, check_settings_s=0).ranks


def test_a_global_batch_is_divided_again_when_a_refusal_checks_more_nodes():
    # recipes/plan.py divides a table set's global batch by the ranks, but the check planned
    # more nodes with the batch per rank held: it said no node count up to 5632 planned one
    # table, and 3526 nodes did in the recipe
    import dataclasses

    from neo_core.api import make_context
    from neo_plugins.sharding.planner import NeoPlanner

    tables = [TableSpec("monster", 20_000_000_000, 256, 1.0)]
    held = make_context({"name": "zionex", "num_nodes": 1}, 65536 // 8)
    divided = dataclasses.replace(held, global_batch=65536)
    said = {}
    for name, context in (("held", held), ("divided", divided)):
        with pytest.raises(PlanningError) as err:
            NeoPlanner(check_settings_s=60).plan(tables, context)
        said[name] = str(err.value)
    nodes = int(re.search(r"topology.num_nodes=(\d+) or more, now 1", said["divided"]).group(1))
    assert "checked: the tables plan with each" in said["divided"], said["divided"]
    # what the recipe would run: that many nodes, the global batch divided by their ranks
    NeoPlanner(check_settings_s=0).plan(tables, make_context({"name": "zionex", "num_nodes": nodes},
                                                              65536 // (8 * nodes)))
    # held at 8,192 per rank, a row-wise shard's pooled rows (the global batch's) grow with the
    # ranks: more nodes are needed (84 against 71)
    assert int(re.search(r"topology.num_nodes=(\d+) or more", said["held"]).group(1)) > nodes



def test_a_lower_cache_load_factor_is_offered_with_the_most_it_could_be_or_not_at_all():
    # "lower the cache load_factor" came without a value, and again at load_factor=0.000001,
    # where a cached table's per-row device state (row map, row-wise optimizer state) is what
    # fills the devices
    from neo_plugins.topology.zionex import zionex_topology

    def topo():
        return zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=16)

    def refusal(n: int, load_factor: float) -> str:
        tables = [TableSpec(f"t{i}", 1_000_000_000, 64, 1.0) for i in range(n)]
        with pytest.raises(PlanningError) as err:
            plan_tables(tables, topo(), 512, cache={"name": "lru", "load_factor": load_factor}, check_settings_s=0)
        return str(err.value)

    msg = refusal(4, 1e-6)
    assert re.search(r"a lower cache load_factor does not help: even at the least, the tables need [\d.]+ GiB of "
                     r"device memory \(a cached table keeps its 4-byte row map and row-wise optimizer state in device "
                     r"memory for every row\)", msg), msg
    assert "lower the cache load_factor" not in msg, msg
    msg = refusal(3, 0.05)
    most = float(re.search(r"lower the cache load_factor \(now 0.05; about ([\d.]+) or less, the most memory "
                           r"allows", msg).group(1))
    tables = [TableSpec(f"t{i}", 1_000_000_000, 64, 1.0) for i in range(3)]
    with pytest.raises(PlanningError):  # a bound: just above it, the devices are short
        plan_tables(tables, topo(), 512, cache={"name": "lru", "load_factor": most * 1.03}, check_settings_s=0)
    assert plan_tables(tables, topo(), 512, cache={"name": "lru", "load_factor": most}, check_settings_s=0).ranks


def test_no_lower_load_factor_is_offered_where_host_memory_is_what_the_cache_lacks():
    # a user lowered the factor as told and was refused again, for host memory, which no factor
    # changes: a cached table's rows all live there
    from neo_plugins.topology.zionex import zionex_topology

    # the whole cluster: 10 tables of 256 GB against 1 node's 272 GiB of device and 1.5 TiB of host
    tables = [TableSpec(f"t{i}", 500_000_000, 128, 1.0) for i in range(10)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1), 512, cache={"name": "lru", "load_factor": 0.5},
                    check_settings_s=0)
    msg = str(err.value)
    assert msg.startswith("Device memory is short") and "lower the cache load_factor (" not in msg, msg
    assert re.search(r"a lower cache load_factor does not help: host memory \(1536.00 GiB\) cannot hold the rows the "
                     r"devices would leave to it, at least [\d.]+ GiB", msg), msg
    # one table: MLPerf on one node of 8 GiB devices and 50 GiB of host memory, where the big
    # tables fit behind the cache on the devices but not in host memory: more host memory is
    # named (and checked), a lower load factor is not
    from neo_plugins.sharding.planner.tables import mlperf_dcnv2

    def small(host_gib: float):
        return zionex_topology(num_nodes=1, device_memory_gib=8, host_memory_gib_per_node=host_gib)

    with pytest.raises(PlanningError) as err:
        plan_tables(mlperf_dcnv2(), small(50), 8192, cache={"name": "lru", "load_factor": 0.05})
    msg = str(err.value)
    assert "lower the cache load_factor" not in msg and "host memory to hold it behind the cache" in msg, msg
    host = float(re.search(r"topology.host_memory_gib_per_node=([\d.]+) or more, now 50", msg).group(1))
    assert "checked: the tables plan with each" in msg, msg
    assert plan_tables(mlperf_dcnv2(), small(host), 8192, cache={"name": "lru", "load_factor": 0.05}).ranks


def test_a_repeated_table_name_is_named_with_where_it_is_given():
    # "Table names must be unique; repeated: user." gave no place and no fix
    from neo_plugins.sharding.planner.tables import make_tables

    tables = [TableSpec("user", 10, 8, 1.0), TableSpec("item", 10, 8, 1.0), TableSpec("user", 20, 8, 1.0)]
    expected = (r"Table names must be unique \(a name keys its table's plan entry\): 'user' is tables\[0\], "
                r"tables\[2\]; rename all but one of each\.")
    with pytest.raises(ConfigError, match=expected):
        plan_tables(tables, "zionex", 512)
    listed = [{"name": t.name, "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim} for t in tables]
    with pytest.raises(ConfigError, match=expected):  # a table set of one's own: checked as it is read
        make_tables("listed", tables=listed)


def test_a_table_whose_allowed_types_are_all_impossible_is_told_why():
    # "allows only TWRW, none of which is possible on this topology or with the global
    # sharding_types" did not say which of the two, nor why
    tables = [TableSpec("a", 1000, 64, 1.0), TableSpec("b", 1000, 64, 1.0)]
    with pytest.raises(ConfigError, match=r"allows only TWRW, .*\(TWRW: needs 2 or more nodes of 2 or more ranks "
                                          r"\(here 1 x 2\)\); allow another type"):
        plan_tables(tables, {"name": "local", "world_size": 2}, 64, table_sharding_types={"a": ["TWRW"]})
    with pytest.raises(ConfigError, match=r"allows only CW, .*\(CW: not in sharding.sharding_types\)"):
        plan_tables(tables, {"name": "local", "world_size": 2}, 64, table_sharding_types={"a": ["CW"]},
                    sharding_types=["TW", "DP"])


def test_a_plan_counts_the_tables_it_puts_behind_the_cache():
    # metrics.json's cached_tables: 0 on CPU ranks; on a GPU cluster too small for the tables
    # on device, every table is behind the cache
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec(f"t{i}", 50_000_000, 128, 1.0) for i in range(4)]
    small = zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=4)
    plan = plan_tables(tables, small, 512, cache={"name": "lru", "load_factor": 0.05}, check_settings_s=0)
    assert plan.cached_tables == 4
    assert plan_tables(tables[:1], "zionex", 512, cache={"name": "lru", "load_factor": 0.05}).cached_tables == 0


def test_a_memory_given_in_gib_as_bytes_is_named():
    from neo_core.topology import GB, GiB, Topology

    figures = dict(name="h100x4", num_nodes=4, devices_per_node=4, compute_device="cuda", host_memory=256 * GiB,
                   device_memory_bw=3350 * GB, host_memory_bw=50 * GB, host_to_device_bw=64 * GB,
                   intra_node_bw=450 * GB, inter_node_bw=50 * GB)
    with pytest.raises(ConfigError, match=r"device_memory=80 bytes is under 1 MiB, .* \(80 GiB is 80 \* GiB\)"):
        Topology(device_memory=80, **figures)
    assert Topology(device_memory=80 * GiB, **figures).device_memory == 80 * GiB
    # through a plugin's key, in its unit: that key is named, not the field in bytes
    with pytest.raises(ConfigError, match=r"topology.device_memory_gib=0.0005 gives \d+ bytes of device memory per rank"):
        zionex_topology(num_nodes=1, device_memory_gib=0.0005)


def test_a_table_held_to_dp_is_not_offered_a_cache():
    from neo_core.sharding import TableSpec

    tables = [TableSpec("big", 100_000_000, 128, 10.0), TableSpec("small", 1000, 64, 1.0)]
    topo = zionex_topology(num_nodes=2)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, topo, 512, table_sharding_types={"big": ["DP"]}, progress=False)
    message = str(err.value)
    # a cache holds shards of sharded tables; a replica stays in device memory
    assert "sharding types allowed for it (DP)" in message and "allow it a row-wise sharding type" in message
    assert "cache" not in message
    # where a sharded type is allowed too, the cache is offered
    with pytest.raises(PlanningError, match="behind a device cache"):
        plan_tables(tables, topo, 512, table_sharding_types={"big": ["DP", "TW"]}, progress=False)
    # on one rank too, where the message takes another branch
    one = zionex_topology(num_nodes=1, devices_per_node=1)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, one, 512, table_sharding_types={"big": ["DP"]}, progress=False)
    assert "cache" not in str(err.value) and "more device memory" in str(err.value), str(err.value)


def test_a_planner_called_directly_names_what_it_was_given():
    from neo_core.api import make_context
    from neo_core.sharding import PlanningContext
    from neo_plugins.sharding.planner import NeoPlanner
    from neo_plugins.sharding.planner.tables import production_like
    from neo_plugins.sharding.torchrec_planner import TorchRecPlanner

    tables = production_like(3, seed=1)
    ctx = make_context("zionex", 512)
    named = replace(ctx, topology="zionex")
    for planner in (NeoPlanner(), TorchRecPlanner()):
        with pytest.raises(ConfigError, match=r"context.topology must be a Topology object, got 'zionex'; .*make_context"):
            planner.plan(tables, named)
        with pytest.raises(ConfigError, match="tables must be a list of TableSpec objects, got generator"):
            planner.plan((t for t in tables), ctx)
    with pytest.raises(ConfigError, match="context must be a PlanningContext, got dict"):
        NeoPlanner().plan(tables, {"topology": ctx.topology})
    # plan_tables given a context where the topology goes: pointed to the one it holds
    with pytest.raises(ConfigError, match=r"got a PlanningContext; it holds one: pass its .topology\.$"):
        plan_tables(tables, ctx, 512)
    assert isinstance(ctx, PlanningContext)


def test_weight_bytes_given_as_a_kernel_key_says_where_it_is_set():
    import dataclasses

    from neo_core.api import resolve
    from neo_core.sharding import TableSpec

    tables = [TableSpec("t0", 1000, 64, 1.0)]
    with pytest.raises(ConfigError, match=r"Unknown key kernel.weight_bytes .* plan_model.weight_bytes=2 "):
        plan_tables(tables, "zionex", 512, kernel={"name": "fused", "weight_bytes": 2})
    # the way it names works
    kernel = dataclasses.replace(resolve("kernel", "fused"), weight_bytes=2)
    assert plan_tables(tables, "zionex", 512, kernel=kernel, progress=False).tables[0].name == "t0"


def test_a_reserve_raised_above_its_default_is_named_as_the_first_fix():
    # a refusal caused by sharding.reserve_fraction=0.9 offered more ranks, bigger devices and
    # a cache, but never the user's own setting
    from neo_plugins.sharding.planner.tables import mlperf_dcnv2

    lower = "lower sharding.reserve_fraction (now 0.9: 90% of each rank's device memory is kept free; at 0.15, the default, "
    node = zionex_topology(num_nodes=1)
    with pytest.raises(PlanningError) as err:  # the cluster as a whole: 98 GiB for 8 x 4 GiB usable (8 x 34 at 0.15)
        plan_tables(mlperf_dcnv2(), node, 1024, planner=NeoPlanner(reserve_fraction=0.9))
    assert str(err.value).startswith("Device memory is short")
    assert f"; {lower}the ranks hold the tables), add ranks or device memory" in str(err.value), str(err.value)
    held = NeoPlanner(reserve_fraction=0.9, sharding_types=["table_wise"])
    with pytest.raises(PlanningError) as err:  # one table's shard: 19 GiB for 4 GiB usable (34 at 0.15)
        plan_tables([TableSpec("big", 40_000_000, 128, 1.0)], node, 1024, planner=held)
    assert str(err.value).startswith("Table 'big'") and f"; {lower}a rank holds the shard), " in str(err.value)
    with pytest.raises(PlanningError) as err:  # 143 GiB: the default's reserve would not make room either
        plan_tables([TableSpec("big", 300_000_000, 128, 1.0)], node, 1024, planner=held)
    assert "reserve_fraction" not in str(err.value)
    for reserve in (0.15, 0.1):  # at or under the default: not a fix to offer
        with pytest.raises(PlanningError) as err:
            plan_tables(mlperf_dcnv2(), zionex_topology(num_nodes=1, device_memory_gib=10), 1024,
                        planner=NeoPlanner(reserve_fraction=reserve))
        assert "reserve_fraction" not in str(err.value)


def test_of_the_tables_that_fit_nowhere_the_largest_is_named_first():
    # the first in list order was named, with the worst left to "1 more table also does not fit"
    tables = [TableSpec("small_but_first", 30_000_000, 128, 1.0), TableSpec("huge", 400_000_000, 128, 1.0),
              TableSpec("fits", 1000, 128, 1.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=1), 1024)
    assert str(err.value).startswith("Table 'huge' (400,000,000 rows x 128) is larger than the whole cluster allows")
    assert "(1 more table also does not fit: 'small_but_first')" in str(err.value)


@pytest.mark.parametrize("notes", [None, "one note", ["a", 3]])
def test_a_topologys_notes_that_are_not_texts_are_refused_naming_the_topology(notes) -> None:
    # notes=None ended in "TypeError: 'NoneType' object is not iterable"
    with pytest.raises(ConfigError, match=r"^topology 'test': notes must be a tuple of texts, got "):
        replace(cluster(), notes=notes)


def test_a_topologys_notes_given_as_a_list_or_generator_are_kept_as_a_tuple() -> None:
    assert replace(cluster(), notes=["a"]).notes == ("a",)
    assert replace(cluster(), notes=(n for n in ("a", "b"))).notes == ("a", "b")  # a generator was stored as ()
