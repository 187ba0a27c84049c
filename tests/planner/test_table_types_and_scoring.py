"""Per-table sharding-type restrictions and costing fixed plans with Neo's cost model."""

from __future__ import annotations

import re

import pytest

from neo_core.api import plan_tables
from neo_core.errors import ConfigError, PlanningError
from neo_core.sharding import ShardingType, TableAssignment, TableSpec
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.score import score_assignments
from tests.planner import cluster
from tests.test_torchrec_plan import cpu_context

TABLES = [TableSpec(f"t{i}", 10_000 * (i + 1), 32, 4.0) for i in range(4)]


def test_table_sharding_types_force_types_per_table() -> None:
    forced = {"t0": ["RW"], "t1": ["CW"], "t2": ["TWRW"], "t3": ["GRID"]}
    result = NeoPlanner(table_sharding_types=forced).plan(TABLES, cpu_context(2, 2))
    got = {a.name: ShardingType(a.sharding_type).short for a in result.tables}
    assert got == {"t0": "RW", "t1": "CW", "t2": "TWRW", "t3": "GRID"}
    # the why-lines say so: a reader sees where a forced type came from
    why = {a.name: a.why for a in result.tables}
    assert why["t0"].endswith("; held to RW by sharding.table_sharding_types")
    # held to what sharding.sharding_types allows of its list; not where that holds it to nothing less
    some = NeoPlanner(sharding_types=["TW", "RW", "DP"], table_sharding_types={"t0": ["TW", "CW"], "t1": ["TW", "RW", "DP"]})
    why = {a.name: a.why for a in some.plan(TABLES, cpu_context(2, 2)).tables}
    assert why["t0"].endswith("; held to TW by sharding.table_sharding_types")
    assert all("table_sharding_types" not in why[n] for n in ("t1", "t2", "t3")), why


def test_table_sharding_types_reject_unknown_or_impossible() -> None:
    names = sorted(t.name for t in TABLES)
    with pytest.raises(ConfigError) as err:
        NeoPlanner(table_sharding_types={f"{names[0]}x": ["TW"]}).plan(TABLES, cpu_context(1, 2))
    assert str(err.value).startswith(
        f"sharding.table_sharding_types names unknown table(s): {names[0]}x (did you mean {names[0]!r}?); the tables "
        f"are {', '.join(names[:5])}"), str(err.value)
    with pytest.raises(ConfigError, match=r"Table 't0' allows only TWRW, .*\(TWRW: needs 2 or more nodes of 2 or "
                                          r"more ranks \(here 1 x 2\)\); allow another type"):  # one node
        NeoPlanner(table_sharding_types={"t0": ["TWRW"]}).plan(TABLES, cpu_context(1, 2))
    # dim 16 splits into columns narrower than min_col_width: the message names the lever
    narrow = [TableSpec("n0", 1000, 16, 4.0)]
    with pytest.raises(ConfigError, match=r"'n0' allows only CW, .*column splits of its dim 16 would be narrower "
                                          r"than sharding.min_col_width=16; lower that"):
        NeoPlanner(table_sharding_types={"n0": ["CW"]}).plan(narrow, cpu_context(1, 2))
    result = NeoPlanner(table_sharding_types={"n0": ["CW"]}, min_col_width=8).plan(narrow, cpu_context(1, 2))
    assert ShardingType(result.tables[0].sharding_type).short == "CW"


def test_score_assignments_refuses_what_a_plan_check_refuses_and_keeps_the_planners_reasons() -> None:
    # a doubled table was scored at its last place, silently (a planner plugin's bug became
    # another plan); a rank out of range failed inside numpy, naming no table
    ctx = cpu_context(1, 2)
    planned = [TableAssignment(t.name, "TW", "fused", [i % 2], why=f"round robin: rank {i % 2}")
               for i, t in enumerate(TABLES)]
    for bad, fragment in (
        (planned + [TableAssignment(TABLES[0].name, "table_wise", "fused", [1])],
         f"places tables more than once ({TABLES[0].name})"),
        ([TableAssignment(TABLES[0].name, "table_wise", "fused", [5]), *planned[1:]],
         f"puts tables on no rank or on ranks outside 0-1 ({TABLES[0].name})"),
        ([TableAssignment(TABLES[0].name, "tablewise", "fused", [0]), *planned[1:]],
         f"gives unknown sharding types ('tablewise' for {TABLES[0].name})"),
    ):
        with pytest.raises(PlanningError, match=re.escape(f"The assignments of planner 'fixed' cannot be scored: the "
                                                          f"plan {fragment}")):
            score_assignments(TABLES, bad, ctx)
    # what the ranks would refuse: a kernel typo was scored as the fused kernel, TW on two ranks as TW
    for bad, fragment in (
        ([TableAssignment(TABLES[0].name, "table_wise", "fuse", [0]), *planned[1:]],
         f"Table '{TABLES[0].name}' has unknown compute kernel 'fuse'"),
        ([TableAssignment(TABLES[0].name, "table_wise", "fused", [0, 1]), *planned[1:]],
         f"Table '{TABLES[0].name}' is table-wise but lists ranks [0, 1]; give exactly one"),
    ):
        with pytest.raises(PlanningError, match=re.escape(f"The assignments of planner 'fixed' cannot be scored: "
                                                          f"{fragment}")):
            score_assignments(TABLES, bad, ctx)
    scored = score_assignments(TABLES, planned, ctx)  # "TW", as plan.txt names it, is table_wise
    assert scored.times_from == "Neo's cost model" and scored.tables[0].sharding_type == "table_wise"
    assert scored.tables[1].why.startswith("round robin: rank 1 (the planner's reason); Neo's cost model: ")
    assert planned[0].sharding_type == "TW"  # the caller's assignments are left as they were
    # a Neo plan scored again keeps Neo's line, once
    again = score_assignments(TABLES, NeoPlanner().plan(TABLES, ctx).tables, ctx)
    assert all("the planner's reason" not in a.why for a in again.tables), [a.why for a in again.tables]


def test_score_assignments_matches_planner_and_sees_imbalance() -> None:
    ctx = cpu_context(1, 2)
    planned = NeoPlanner(sharding_types=["TW"]).plan(TABLES, ctx)
    again = score_assignments(TABLES, planned.tables, ctx)
    assert again.predicted_step_time == pytest.approx(planned.predicted_step_time)
    one_rank = [TableAssignment(t.name, "table_wise", "fused", [0]) for t in TABLES]
    assert score_assignments(TABLES, one_rank, ctx).predicted_step_time > planned.predicted_step_time


def test_score_assignments_counts_column_shards_stacked_on_one_rank() -> None:
    # TorchRec's planner may put two column shards of a table on the same rank: both count
    ctx = cpu_context(1, 2)
    tables = [TableSpec("t0", 100_000, 64, 8.0)]
    spread = score_assignments(tables, [TableAssignment("t0", "column_wise", "fused", [0, 1])], ctx)
    stacked = score_assignments(tables, [TableAssignment("t0", "column_wise", "fused", [0, 0])], ctx)
    (s0, s1), (k0, k1) = spread.ranks, stacked.ranks
    assert k0.memory["weights"] == pytest.approx(s0.memory["weights"] + s1.memory["weights"])
    assert k1.memory["weights"] == 0.0 and k1.time["compute_fwd"] == 0.0
    for kind in ("compute_fwd", "compute_bwd", "comm_fwd"):
        assert k0.time[kind] == pytest.approx(s0.time[kind] + s1.time[kind])
    assert stacked.predicted_step_time > spread.predicted_step_time


def test_torchrec_planner_report_puts_host_bytes_under_host_memory() -> None:
    # a table larger than a GPU, held in host memory behind a cache: TorchRec's ddr bytes are
    # host memory, not device memory (which would read as over capacity)
    tables = [TableSpec("big", 100_000_000, 128, 5.0), TableSpec("small", 1000, 64)]
    result = plan_tables(tables, cluster(1, 2, mem_gib=16.0), 256, planner="torchrec",
                         cache={"name": "lru", "load_factor": 0.05})
    assert any(r.host_memory.get("ddr", 0) > 0 for r in result.ranks)
    for r in result.ranks:
        assert set(r.memory) == {"hbm"} and r.memory_total <= r.memory_capacity, r
        assert r.host_memory["ddr"] <= r.host_memory_capacity, r


def test_torchrec_planner_takes_a_time_limit_named_by_its_key() -> None:
    from neo_core.plugins import load_plugins

    planner = load_plugins(autoload=False).create("sharding", "torchrec", {"timeout_s": 5})
    assert planner.timeout_s == 5
    for bad in (0, -1, float("inf"), "5"):
        with pytest.raises(ConfigError, match=r"sharding.timeout_s"):
            load_plugins(autoload=False).create("sharding", "torchrec", {"timeout_s": bad})


def test_plan_text_keeps_its_columns_for_long_kernels_and_scattered_ranks() -> None:
    from neo_core.sharding import PlanResult, RankReport

    tables = [
        TableAssignment("a", "table_wise", "fused_uvm_caching", [5], [(10, 8)], why="why-a"),
        TableAssignment("b", "grid_shard", "fused", [*range(96, 112), *range(80, 96), 3, 1], why="why-b"),
        TableAssignment("c", "column_wise", "fused", list(range(0, 128, 2)), why="why-c"),
    ]
    result = PlanResult("neo", tables, [RankReport(rank=r) for r in range(128)], 256, {})
    lines = result.format_text().splitlines()
    header = next(line for line in lines if line.lstrip().startswith("table"))
    rows = {line.split()[0]: line for line in lines if line.strip().startswith(("a ", "b ", "c "))}
    column = header.index("why")
    assert all(rows[n].index(f"why-{n}") == column for n in "abc"), lines[:5]
    assert " 96-111,80-95,3,1 " in rows["b"]  # shard order kept, runs folded
    assert ",... (64 ranks)" in rows["c"] and len(rows["c"]) < 140


@pytest.mark.parametrize("step", [2, 3, 5, 7])
def test_rank_lists_are_cut_after_the_last_whole_run_that_fits(step: int) -> None:
    from neo_core.sharding import _compact_ranks

    ranks = list(range(0, 100 * step, step))
    text = _compact_ranks(ranks, width=40)
    kept, tail = text.split(",... ")
    assert tail == "(100 ranks)"
    listed = [int(r) for r in kept.split(",")]
    assert listed == ranks[: len(listed)]  # shard order, nothing skipped
    assert len(kept) <= 40 < len(f"{kept},{ranks[len(listed)]}")  # the next one would not fit
    assert _compact_ranks([3, 4, 5, 9], width=40) == "3-5,9"


def test_cache_and_compression_unused_by_the_dense_kernel_are_noted() -> None:
    from neo_core.api import make_context

    tables = [TableSpec(f"t{i}", 1000, 16, 2.0) for i in range(3)]
    ctx = make_context({"name": "zionex", "num_nodes": 2}, 256, kernel="dense", compressor="fp16", cache="lru")
    notes = NeoPlanner().plan(tables, ctx).notes
    assert any(n.startswith("cache lru and compression fp16 not used: kernel dense replicates every table")
               and n.endswith("so no table sits behind a cache and no pooled embeddings are exchanged")
               for n in notes), notes
    # the compressor alone: the cache's clause is not said (it read as if a cache were chosen)
    alone = make_context({"name": "zionex", "num_nodes": 2}, 256, kernel="dense", compressor="fp16")
    notes = NeoPlanner().plan(tables, alone).notes
    assert "compression fp16 not used: kernel dense replicates every table (data parallel), so no pooled " \
           "embeddings are exchanged" in notes, notes
    fused = make_context({"name": "zionex", "num_nodes": 2}, 256, compressor="fp16", cache="lru")
    sharded = NeoPlanner(sharding_types=["TW", "RW"]).plan(tables, fused)
    # the compression is used; the cache is not, as these small tables fit in device memory
    assert [n for n in sharded.notes if "not used" in n] == [
        "cache lru not used: every table was placed in device memory, which is faster; a table goes to host "
        "memory behind the cache only where device memory cannot hold it"], sharded.notes
    # one rank: nothing is exchanged, so nothing in reduced precision (its runs' AUCs were identical)
    one = make_context({"name": "local", "world_size": 1}, 256, compressor="fp16")
    notes = NeoPlanner(sharding_types=["TW"]).plan(tables, one).notes
    assert [n for n in notes if "not used" in n] == [
        "compression fp16 not used: one rank exchanges no pooled embeddings, so nothing is sent in reduced "
        "precision (its quality effect shows on 2 ranks or more)"], notes


def test_plans_of_a_data_parallel_only_kernel_note_what_they_leave_unused_whichever_planner() -> None:
    # the notes come from the run's context, not from Neo's planner: TorchRec's plans get them too
    tables = [TableSpec(f"t{i}", 1000, 16, 2.0) for i in range(3)]
    cpu = {"name": "local", "world_size": 2, "compute_device": "cpu"}
    for planner in ("neo", "torchrec"):
        notes = plan_tables(tables, cpu, 64, cache="lru", planner=planner).notes
        assert sum(n.startswith("cache lru not used: cpu ranks have no device memory") for n in notes) == 1, notes
    # every table replicated by the allowed types (not by the kernel): said so
    dp = plan_tables(tables, {"name": "zionex", "num_nodes": 2}, 256, compressor="fp16", cache="lru",
                     sharding_types=["DP"])
    assert any(n.startswith("cache lru and compression fp16 not used: every table is data parallel")
               for n in dp.notes), dp.notes


def test_a_data_parallel_only_kernel_refuses_types_that_leave_out_data_parallel() -> None:
    from neo_core.api import make_context

    tables = [TableSpec(f"t{i}", 1000, 16, 2.0) for i in range(3)]
    ctx = make_context({"name": "zionex", "num_nodes": 2}, 256, kernel="dense")
    with pytest.raises(ConfigError, match=r"kernel dense replicates every table .* sharding.sharding_types=\[RW,TW\] "
                                          r"leaves out DP: allow DP there, or choose a kernel that shards"):
        NeoPlanner(sharding_types=["TW", "RW"]).plan(tables, ctx)
    with pytest.raises(ConfigError, match=r"sharding.table_sharding_types.t1=\[TW\] leaves out DP"):
        NeoPlanner(table_sharding_types={"t1": ["TW"], "t2": ["DP", "TW"]}).plan(tables, ctx)
    assert {a.sharding_type for a in NeoPlanner(sharding_types=["TW", "DP"]).plan(tables, ctx).tables} == {
        "data_parallel"}


def test_fp8_gradients_of_row_split_tables_are_costed_and_noted_as_bf16() -> None:
    # TorchRec has no fp8 reduce-scatter: its codecs send bf16 there (get_qcomm_codecs_registry)
    tables = [TableSpec(f"t{i}", 100_000, 64, 8.0) for i in range(4)]
    topo = {"name": "zionex", "num_nodes": 2}

    def plan(backward: str, types: list[str]):
        return plan_tables(tables, topo, 256, compressor={"name": "fp16", "backward": backward}, sharding_types=types)

    def sent(p, kind: str) -> float:
        return sum(r.comm_bytes[kind] for r in p.ranks)

    rw8, rw16 = plan("fp8", ["RW"]), plan("bf16", ["RW"])
    assert rw8.predicted_step_time == rw16.predicted_step_time
    assert sent(rw8, "inter_node") == sent(rw16, "inter_node") and sent(rw8, "intra_node") == sent(rw16, "intra_node")
    note = [n for n in rw8.notes if "TorchRec has no fp8 reduce-scatter" in n]
    assert len(note) == 1 and "(t0, t1, t2, t3) backward fp8 is sent as bf16" in note[0], rw8.notes
    # table-wise all-to-alls do carry fp8; table-row-wise sends fp8 across nodes, bf16 inside
    tw8, tw16 = plan("fp8", ["TW"]), plan("bf16", ["TW"])
    assert tw8.predicted_step_time < tw16.predicted_step_time
    assert not any("reduce-scatter" in n for n in tw8.notes)
    twrw8, twrw16 = plan("fp8", ["TWRW"]), plan("bf16", ["TWRW"])
    assert sent(twrw8, "inter_node") < sent(twrw16, "inter_node")
    assert twrw8.predicted_step_time < twrw16.predicted_step_time
    assert any("TorchRec has no fp8 reduce-scatter" in n for n in twrw8.notes)


def test_the_precision_a_plan_sends_is_what_its_tables_send() -> None:
    # metrics.json's compression_precision said fp16/fp8 where row-wise tables sent bf16 gradients
    from neo_core.compression import Compressor
    from neo_core.sharding import sent_precision

    tables = [TableSpec(f"t{i}", 100_000, 64, 8.0) for i in range(4)]

    def sent(forward: str, backward: str, types: list[str]) -> str | None:
        plan = plan_tables(tables, {"name": "zionex", "num_nodes": 2}, 256, sharding_types=types,
                           compressor=Compressor("mine", forward, backward))
        return sent_precision(plan)

    assert sent("fp16", "fp8", ["RW"]) == "fp16/bf16"
    assert sent("fp8", "fp16", ["RW"]) == "fp16/fp16"  # a custom compressor's fp8 forward
    assert sent("fp16", "fp8", ["TW"]) == "fp16/fp8"
    assert sent("fp16", "bf16", ["RW"]) == "fp16/bf16"
    # table-row-wise sends fp8 across nodes, bf16 inside
    assert sent("fp16", "fp8", ["TWRW"]) == "fp16/fp8 (fp16/bf16 in row-split tables' reduce-scatters)"
    mixed = plan_tables(tables, {"name": "zionex", "num_nodes": 2}, 256, compressor={"name": "fp16", "backward": "fp8"},
                        table_sharding_types={"t0": ["RW"], "t1": ["TW"], "t2": ["TW"], "t3": ["TW"]})
    assert sent_precision(mixed) == "fp16/fp8 (fp16/bf16 in row-split tables' reduce-scatters)"
    # every table replicated: nothing is sent, and the notes say the compression is not used
    assert sent("fp16", "fp8", ["DP"]) == "fp16/fp8"
    # table-row-wise on one node (TorchRec's planner places it so) reduce-scatters alone, as
    # row-wise does: bf16, no fp8
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    one_node = PlanResult("torchrec", [TableAssignment("t0", "table_row_wise", "fused", [0, 1, 2, 3])],
                          [RankReport(rank=r) for r in range(4)], 256, {"num_nodes": 1, "devices_per_node": 4},
                          settings={"compression": {"name": "mine", "forward": "fp16", "backward": "fp8"}})
    assert sent_precision(one_node) == "fp16/bf16"
    # one rank sends nothing, a table called row-wise or not: the precisions asked for
    alone = PlanResult("torchrec", [TableAssignment("t0", "row_wise", "fused", [0])], [RankReport(rank=0)], 256,
                       {"num_nodes": 1, "devices_per_node": 1}, settings=one_node.settings)
    assert sent_precision(alone) == "fp16/fp8"


@pytest.mark.parametrize(
    ("params", "why", "noted"),
    [
        ({}, "replicated: dim 10 is not a multiple of 4, which the fused kernel needs to shard it", True),
        ({"sharding_types": ["DP"]}, "replicated: the only sharding type allowed", False),
        ({"kernel": "dense"}, "replicated: the only sharding type allowed with this kernel", False),
    ],
    ids=["fused", "dp-only", "dense-kernel"],
)
def test_a_replicated_odd_dim_table_is_blamed_on_its_dim_only_where_that_is_why(params, why, noted) -> None:
    tables = [TableSpec("odd", 1000, 10, pooling_factor=1.0), TableSpec("b", 100_000, 16, pooling_factor=2.0)]
    result = plan_tables(tables, topology="zionex", batch_size_per_rank=512, **params)
    assert why in result.tables[0].why
    assert any("pad the dim to 12" in note for note in result.notes) == noted
