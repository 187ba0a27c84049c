"""Figures the cost model, the search and its refusals give, each checked against a value
derived another way: a GRID shard's bytes as a TWRW table's of its width, the search's priced
peak as the placement it makes, a refusal's shortfall from the bytes it compares."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from neo_core.api import make_context, plan_tables
from neo_core.errors import PlanningError
from neo_core.sharding import PlanResult, RankReport, ShardingType, TableAssignment, TableSpec, check_plan
from neo_core.topology import GiB, Topology
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.cost import CostModel, CostParams, TableArrays
from neo_plugins.sharding.planner.score import score_assignments
from neo_plugins.sharding.planner.search import Search, build_options
from neo_plugins.topology.zionex import zionex_topology
from tests.planner import cluster
from tests.test_torchrec_plan import cpu_context

CIN = 3  # the input all-to-all's column of ShardCosts.time


def topology(nodes: int = 2, per_node: int = 4, **changes) -> Topology:
    """The planner tests' GPU cluster (:func:`tests.planner.cluster`) with ``changes``."""
    return dataclasses.replace(cluster(nodes, per_node), **changes)


@pytest.mark.parametrize("k", [2, 4])
def test_a_grid_shard_moves_the_bytes_of_a_table_row_wise_table_of_its_width(k: int) -> None:
    # each GRID shard is one column block of the table, row-split over a node as TWRW splits a table
    model = CostModel(make_context(topology(), 100))
    grid = model.comm_bytes(TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)]), ShardingType.GRID_SHARD, k)
    narrow = model.comm_bytes(TableArrays.from_specs([TableSpec("t", 1000, 128 // k, 10.0)]),
                              ShardingType.TABLE_ROW_WISE)
    assert [float(x[0]) for x in grid] == [float(x[0]) for x in narrow]


@pytest.mark.parametrize("k", [2, 4])
def test_a_grid_tables_ids_are_bucketized_once_over_its_column_shards(k: int) -> None:
    # CPU calibration prices bucketizing an id (bucketize_id_s); GRID's k column shards share one
    # bucketizing of the ids, TWRW's one shard does it all
    def input_time(stype: ShardingType, per_id: float, shards: int = 1) -> float:
        model = CostModel(make_context(topology(compute_device="cpu", bucketize_id_s=per_id), 100))
        return float(model.costs(TableArrays.from_specs([TableSpec("t", 1000, 128, 10.0)]), stype, shards).time[0, CIN])

    twrw = input_time(ShardingType.TABLE_ROW_WISE, 1e-9) - input_time(ShardingType.TABLE_ROW_WISE, 0.0)
    grid = input_time(ShardingType.GRID_SHARD, 1e-9, k) - input_time(ShardingType.GRID_SHARD, 0.0, k)
    assert twrw > 0 and grid == pytest.approx(twrw / k, rel=1e-9)


def test_each_option_is_placed_where_the_search_priced_it() -> None:
    # the search prices every option from the sorted loads (_unmasked_peaks) and places the one it
    # picks by another path (place): both must give the same ranks' peak, over many load patterns
    tables = [TableSpec("probe", 50_000, 128, 4.0)] + [TableSpec(f"f{j}", 1000 * (j + 1), 128, 1.0 + j % 5)
                                                        for j in range(12)]
    model = CostModel(make_context(topology(), 64))
    arrays = TableArrays.from_specs(tables)
    options = build_options(model, arrays, set(ShardingType))
    rng = np.random.default_rng(0)
    checked = set()
    for _ in range(40):
        search = Search(model, arrays, options)
        for j in range(1, len(tables)):  # other tables on random options and ranks: uneven loads
            o = int(rng.choice(np.flatnonzero(search.usable[:, j])))
            placed = search.place(o, j)
            search._apply(j, o, placed[1], +1.0)
        fit, peaks = search._unmasked_peaks(0)
        for idx, o in enumerate(search._options_of(0)[0].tolist()):
            if not fit[idx]:
                continue
            peak, ranks = search.place(o, 0)
            assert peak == pytest.approx(float(peaks[idx]), rel=1e-12), options[o].label
            before = search.loads.copy()
            search._apply(0, o, ranks, +1.0)
            assert float(search.loads[ranks].max()) == pytest.approx(peak, rel=1e-12), options[o].label
            assert np.array_equal(np.delete(search.loads, ranks), np.delete(before, ranks))
            search._apply(0, o, ranks, -1.0)
            checked.add(options[o].sharding_type)
    assert checked == set(ShardingType)


def test_a_shard_fits_a_rank_with_exactly_its_bytes_free() -> None:
    model = CostModel(make_context(topology(nodes=1, per_node=2), 100), CostParams(reserve_fraction=0.0))
    arrays = TableArrays.from_specs([TableSpec(name, rows, 128, 1.0) for name, rows in (("a", 2000), ("b", 1000),
                                                                                          ("probe", 1000))])
    options = build_options(model, arrays, {ShardingType.TABLE_WISE})
    search = Search(model, arrays, options)
    search._apply(0, 0, np.array([0]), +1.0)
    search._apply(1, 0, np.array([1]), +1.0)
    # rank 1 is left exactly the probe's bytes; rank 0, holding the larger table, less
    search.cap_dev = float(search.mem_dev[1] + options[0].cost.mem_device[2])
    search._mem_max = None
    assert search.place(0, 2)[1].tolist() == [1]


def refusal(device_memory: float | None = None, zionex_gib: float | None = None) -> tuple[Search, PlanningError]:
    """t0 placed table-wise on rank 0 of two; t1 then fits no rank as TW, and as RW not on both."""
    topo = zionex_topology(num_nodes=1, devices_per_node=2, device_memory_gib=zionex_gib) if zionex_gib \
        else topology(nodes=1, per_node=2, device_memory=device_memory)
    model = CostModel(make_context(topo, 100))
    arrays = TableArrays.from_specs([TableSpec("t0", 120_000, 128, 1.0), TableSpec("t1", 200_000, 128, 1.0)])
    options = build_options(model, arrays, {ShardingType.TABLE_WISE, ShardingType.ROW_WISE})
    search = Search(model, arrays, options)
    tw = next(o for o, opt in enumerate(options) if opt.sharding_type is ShardingType.TABLE_WISE)
    search._apply(0, tw, np.array([0]), +1.0)
    return search, search.no_fit_error(1)


def test_a_refusal_names_what_the_freest_rank_lacks_for_the_smallest_whole_shard() -> None:
    search, error = refusal(device_memory=1e8)
    tw = next(opt for opt in search.opts if opt.sharding_type is ShardingType.TABLE_WISE)
    free = search.cap_dev - search.mem_dev
    short = int(round(float(tw.cost.mem_device[1]) - free.max()))
    assert short > 0 and f"even as TW a shard needs {short:,} bytes" in str(error), str(error)


def test_the_device_memory_a_refusal_suggests_holds_the_shard_after_the_reserve() -> None:
    search, error = refusal(zionex_gib=0.1)
    reserve = search.model.params.reserve_fraction
    [memory] = [value for group in error.named_settings.groups for key, value in group if key == "device_memory"]
    short = int(re.search(r"needs ([\d,]+) bytes", str(error)).group(1).replace(",", ""))
    assert memory * (1 - reserve) == pytest.approx(search.cap_dev + short, rel=1e-6)


def test_a_cluster_short_of_device_memory_is_told_by_how_many_usable_bytes() -> None:
    # 8 tables of 30M x 128 (fp32 weights, one row-wise Adagrad value a row) on 2 ranks of 16 GiB,
    # 15% held back: the shortfall is what the tables need over 85% of the memory (batches aside)
    tables = [TableSpec(f"t{i}", 30_000_000, 128, 1.0) for i in range(8)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(1, 2, mem_gib=16.0), 64, planner=NeoPlanner(check_settings_s=0))
    short = int(re.search(r"usable: ([\d,]+) bytes \([^)]*\) short", str(err.value)).group(1).replace(",", ""))
    need = 8 * 30_000_000 * (128 * 4 + 4)
    assert short == pytest.approx(need - 0.85 * 2 * 16 * GiB, rel=1e-4)


def test_a_cached_shard_is_weighed_against_its_nodes_host_memory() -> None:
    # a 47.7 GiB shard behind a cache fits the 128 GiB of host memory its node's 4 ranks share:
    # the refusal is about device memory only
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("big", 100_000_000, 128, 1.0)], topology(nodes=1, host_memory=32 * GiB), 64,
                    cache={"name": "lru", "load_factor": 0.9}, planner=NeoPlanner(check_settings_s=0, sharding_types=["TW"]))
    message = str(err.value)
    assert "of device memory usable on each of 4 ranks" in message and message.count(" over the ") == 1, message


@pytest.mark.parametrize("stype", ["TW", "RW", "CW", "TWRW", "TWCW", "GRID", "DP"])
def test_scoring_a_plan_gives_the_planners_own_figures_for_every_type(stype: str) -> None:
    tables = [TableSpec(f"t{i}", 10_000 * (i + 1), 32, 4.0) for i in range(4)]
    context = cpu_context(2, 2)
    planned = NeoPlanner(table_sharding_types={t.name: [stype] for t in tables}).plan(tables, context)
    assert len({a.sharding_type for a in planned.tables}) == 1 and planned.tables[0].sharding_type != "data_parallel" \
        or stype == "DP"
    scored = score_assignments(tables, planned.tables, context)
    assert scored.predicted_step_time == pytest.approx(planned.predicted_step_time, rel=1e-9)


def test_a_plugin_plan_that_leaves_its_replicas_out_of_memory_is_refused() -> None:
    tables = [TableSpec("d", 1_000_000, 128, 1.0)]
    plan = PlanResult(planner="p", tables=[TableAssignment("d", "data_parallel", "dense", [0, 1])],
                      ranks=[RankReport(rank=r, memory={"weights": 0.0}, memory_capacity=0.0, time={}) for r in range(2)],
                      batch_size_per_rank=64, topology={})
    with pytest.raises(PlanningError, match=r"reports 0B of device memory on rank 0, less than its shards' weights alone"):
        check_plan(plan, tables, 2, "p", cpu_context(1, 2))
