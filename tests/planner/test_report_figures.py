"""What a plan's report says, checked against the figures it is made of: a saved plan.json
reads back to the same plan and text, the compute/communication split, the ranks a chart
shows, TorchRec's forward and backward communication kept apart, and the table sets' own figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from neo_core.api import make_context
from neo_core.compression import Compressor
from neo_core.sharding import PlanResult, RankReport, ShardingType, TableAssignment
from neo_plugins.sharding.planner.cost import CMB, CMF, CostModel, TableArrays
from neo_plugins.sharding.planner.report import chart_ranks
from neo_plugins.sharding.planner.search import build_options
from neo_plugins.sharding.planner.tables import mlperf_dcnv2, production_like, zionex_12t
from neo_plugins.sharding.planner.torchrec_score import meta_module, torchrec_option_costs
from neo_plugins.sharding.sharders import make_sharders


def test_a_saved_plan_reads_back_to_the_same_plan_and_text(tmp_path: Path) -> None:
    ranks = [RankReport(r, memory={"weights": 1e6}, memory_capacity=1e9, time={"compute_fwd": 1e-3 * (r + 1)},
                        comm_bytes={"intra_node": 10.0 * r, "inter_node": 3.0 * r}) for r in range(2)]
    plan = PlanResult("neo", [TableAssignment("t", "table_wise", "fused", [1], [(10, 4)], why="w")], ranks,
                      batch_size_per_rank=8, topology={"devices_per_node": 2}, times_from="TorchRec's estimator",
                      notes=["n"], settings={"optimizer": "adagrad"})
    plan.save_json(tmp_path / "plan.json")
    back = PlanResult.load_json(tmp_path / "plan.json")
    assert back.to_dict() == plan.to_dict()
    assert back.format_text() == plan.format_text()


def test_the_plans_text_marks_assumed_figures_and_says_once_how_to_measure_them(tmp_path: Path) -> None:
    # the text gave the local topology's assumed 1 GB/s as if measured, where describe() marks it
    from neo_core.api import plan_tables
    from neo_core.sharding import TableSpec
    from neo_plugins.sharding.planner.report import save_all

    tables = [TableSpec("user_id", 100_000, 64, 1.0)]
    plan = plan_tables(tables, "local", 256)  # conftest: no calibration file, so its bandwidths are assumed
    assert "intra-node 1 GB/s*, inter-node 1 GB/s* per rank" in plan.topology_summary()
    assert "device memory 5" in plan.topology_summary() and "GiB*" not in plan.topology_summary()  # the RAM's, read
    key = "(* assumed, not verified against a primary source; `neo calibrate` measures this machine's)"
    lines = plan.format_text().splitlines()
    assert lines[2] == f"  {key}" and plan.format_text().count("neo calibrate") == 1, lines[:3]
    save_all(plan, tmp_path)
    assert (tmp_path / "plan.txt").read_text().count("neo calibrate") == 1
    assert PlanResult.load_json(tmp_path / "plan.json").format_text() == plan.format_text()  # plan.json keeps them
    # another cluster's assumed figures: marked, with no command that would measure this machine
    zionex = plan_tables(tables, "zionex", 256).format_text().splitlines()
    assert "device memory 40.0 GiB*, host 192.0 GiB* per rank; intra-node 300 GB/s*" in zionex[1], zionex[1]
    assert zionex[2] == "  (* assumed, not verified against a primary source)"
    # figures not said to be assumed (a plan.json written before it kept them): unmarked, no key
    plan.topology = {k: v for k, v in plan.topology.items() if k != "assumed"}
    assert "*" not in plan.topology_summary() and plan.assumed_note() == ""
    assert "neo calibrate" not in plan.format_text()


def test_the_optimizer_and_prefetch_count_as_compute_in_the_report() -> None:
    rank = RankReport(0, memory={"weights": 1.0}, memory_capacity=2.0,
                      time={"compute_fwd": 1e-3, "compute_bwd": 1e-3, "optimizer": 2e-3, "prefetch": 1e-3, "comm_fwd": 3e-3})
    text = PlanResult("x", [], [rank], batch_size_per_rank=1, topology={}).format_text()
    assert "(compute 5.000ms, comm 3.000ms)" in text, text
    assert "   5.000ms    3.000ms    8.000ms" in text, text  # the rank's row: compute, comm, total


def test_the_chart_shows_the_slowest_ranks_and_the_fullest() -> None:
    ranks = [RankReport(r, memory={"weights": 9.0 if r == 3 else 1.0}, memory_capacity=10.0,
                        time={"compute_fwd": float(10 - r)}) for r in range(6)]
    plan = PlanResult("x", [], ranks, batch_size_per_rank=1, topology={})
    assert [r.rank for r in chart_ranks(plan, 2)] == [0, 3]  # the slowest, then the fullest (not the 2nd slowest)


def test_the_busiest_inter_node_rank_is_the_first_of_a_tie() -> None:
    ranks = [RankReport(r, comm_bytes={"intra_node": 0.0, "inter_node": b}) for r, b in enumerate([5.0, 9.0, 9.0, 1.0])]
    assert PlanResult("x", [], ranks, batch_size_per_rank=1, topology={}).busiest_inter_node() == (1, 9.0)


def test_torchrecs_forward_and_backward_communication_stay_apart() -> None:
    # fp16 forward, fp32 backward: TorchRec's two figures differ, and each lands in its own kind
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ParameterConstraints

    tables = production_like(1, seed=3)
    context = make_context({"name": "zionex", "num_nodes": 2, "devices_per_node": 4}, 512,
                           compressor=Compressor("h", "fp16", "fp32"))
    option = next(o for o in build_options(CostModel(context), TableArrays.from_specs(tables),
                                           {ShardingType.TABLE_WISE}, (), 16) if o.placement != "cached")
    torchrec_option_costs([option], tables, context)
    topology = context.topology.to_torchrec()
    t = tables[0]
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor], sharding_types=["table_wise"],
                                                compute_kernels=[context.kernel.compute_kernel])}
    enumerator = EmbeddingEnumerator(topology, 512, constraints, estimator=[EmbeddingPerfEstimator(topology, constraints)])
    perf = enumerator.enumerate(meta_module(tables, context), make_sharders(context))[0].shards[0].perf
    assert perf.fwd_comms != pytest.approx(perf.bwd_comms)
    assert option.cost.time[0, CMF] * 1e3 == pytest.approx(perf.fwd_comms, rel=1e-9)
    assert option.cost.time[0, CMB] * 1e3 == pytest.approx(perf.bwd_comms, rel=1e-9)


def test_the_table_sets_have_their_published_figures() -> None:
    mlperf = mlperf_dcnv2()  # Criteo 1TB's 26 features, capped at 40M rows, MLPerf's multi-hot sizes
    rows = [t.num_embeddings for t in mlperf]
    assert len(mlperf) == 26 and max(rows) == 40_000_000 and rows.count(40_000_000) == 5
    assert sum(rows) == 204_184_588
    assert sum(t.pooling_factor for t in mlperf) == 214 and mlperf[20].pooling_factor == 100.0
    big = zionex_12t()  # the paper's 12 trillion parameters
    assert len(big) == 800 and sum(t.num_embeddings * t.embedding_dim for t in big) == pytest.approx(12e12, rel=0.01)
    hot = [t.hot_fraction for t in production_like(500)]
    assert 0.1 <= min(hot) < 0.15 and 0.85 < max(hot) <= 0.9


def test_a_why_line_names_only_what_the_alternative_really_costs_more() -> None:
    # "larger shards" only where the alternative's shard is larger, not equal: table 0 took
    # CWx4 (4 x 1 ms), the least total is CWx2 (2 x 1 ms) with the same shard (a stub search)
    from types import SimpleNamespace as NS

    import numpy as np

    from neo_plugins.sharding.planner.planner import NeoPlanner, _why
    from tests.planner import cluster
    from tests.planner.test_planner import mixed_tables

    def option(label: str, k: int) -> NS:
        return NS(label=label, num_shards=k, k=k, sharding_type=ShardingType.COLUMN_WISE, placement="device",
                  unit="any_k", shard_time=np.array([1e-3]), cost=NS(mem_device=np.array([1e6])))

    opts = [option("CWx4", 4), option("CWx2", 2)]
    search = NS(t=NS(rows=np.array([1000]), dims=np.array([64]), hot=np.array([0.5])),
                model=NS(e=4, cache_load_factor=None), opts=opts, usable=np.array([[True], [True]]),
                total=np.array([[4e-3], [2e-3]]), choice=np.array([0]), loads=np.array([4e-3, 1e-3]), W=4,
                ranks=[np.array([0, 1, 2, 3])], refined=True, torchrec_times=False)
    why = _why(opts[0], search, 0)
    assert "least total would be CWx2 2 x 1.000 ms = 2.000 ms" in why and "larger shards" not in why, why
    # "more device memory per shard" where the alternative's shard takes over 1% more: TW holds
    # the whole table where TWRW holds a quarter of it
    plan = NeoPlanner().plan(mixed_tables(), make_context(cluster(), 1024))
    assert plan.table("small").why.endswith(
        "least total would be TW 1 x 0.0574 ms = 0.0574 ms, larger shards, more device memory per shard")
    # an alternative whose total ties the chosen one's is not "less": it is named as the next
    plan = NeoPlanner().plan(mlperf_dcnv2(), make_context(cluster(4, 8, mem_gib=4.0), 1024))
    why = plan.table("cat_9").why
    assert "; the least total (next: TWCWx8 8 x 0.297 ms = 2.378 ms)" in why and "would be" not in why, why


def test_the_columns_legend_names_a_fixed_latency_only_where_one_is_charged() -> None:
    # under TorchRec's estimator no latency is charged, yet the legend said "with their fixed latency"
    def plan(kinds: dict) -> PlanResult:
        ranks = [RankReport(r, memory={"weights": 1e6}, memory_capacity=1e9, time=kinds) for r in range(2)]
        return PlanResult("neo", [TableAssignment("t", "table_wise", "fused", [1], [(10, 4)], why="w")], ranks,
                          batch_size_per_rank=8, topology={"devices_per_node": 2})

    charged = plan({"compute_fwd": 1e-3, "comm_fwd": 1e-3, "comm_latency": 1e-4}).format_text()
    assert "'comm' the collectives with their fixed latency, per step" in charged
    uncharged = plan({"compute_fwd": 1e-3, "comm_fwd": 1e-3}).format_text()
    assert "'comm' the collectives, per step" in uncharged and "fixed latency" not in uncharged


def test_a_plan_charts_title_names_the_cache_and_the_compression_where_set(tmp_path: Path, monkeypatch) -> None:
    # charts of runs that differ in cache or compression alone had the same title
    import matplotlib.figure

    from neo_core.api import plan_tables
    from neo_core.cache import CachePolicy
    from neo_core.sharding import TableSpec
    from neo_plugins.sharding.planner.report import chart_title, save_chart

    tables = [TableSpec(f"t{i}", 6_000_000, 64, 8.0) for i in range(16)]  # half go behind a cache on 2 GiB
    topology = {"name": "zionex", "num_nodes": 1, "device_memory_gib": 2.0}
    both = plan_tables(tables, topology, 4096, cache=CachePolicy("lru", load_factor=0.2), compressor="fp16",
                       sharding_types=["TW"])
    assert chart_title(both).splitlines()[1] == "cache lru 0.2, compression fp16/fp16"
    piped = plan_tables(tables, topology, 4096, cache=CachePolicy("lru", load_factor=0.05, prefetch_pipeline=True),
                        sharding_types=["TW"])
    assert chart_title(piped).splitlines()[1] == "cache lru 0.05 with prefetch pipeline"
    said = []  # what save_chart draws
    real = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, text, **kw: said.append(text) or real(fig, text, **kw))
    save_chart(both, tmp_path / "plan.png")
    assert "\ncache lru 0.2, compression fp16/fp16\n" in said[-1], said
    # neither set (no cache, compression none): the title as before, the cluster on its second line
    plain = plan_tables(tables[:4], "zionex", 4096)
    assert "cache" not in chart_title(plain) and "compression" not in chart_title(plain)
    assert chart_title(plain).splitlines()[1].startswith("zionex: ")
