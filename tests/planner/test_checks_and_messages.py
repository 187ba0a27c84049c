"""The checks a plan and its input pass, at their edges, and the figures their messages give:
check_plan's own memory check (a plugin's plan, a saved plan.json), TableSpec's and the
planner's argument ranges, the plan's text, the table generators and plan_tables' own checks."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re

import pytest

from neo_core.api import make_context, plan_tables
from neo_core.cache import CachePolicy
from neo_core.errors import ConfigError, PlanningError
from neo_core.sharding import Planner, PlanResult, RankReport, TableAssignment, TableSpec
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.search import human_bytes
from neo_plugins.sharding.planner.tables import production_like
from tests.planner import cluster

GIB = 2**30


# --- check_plan: a plugin's plan, checked against the tables and the topology -------------------


class Given(Planner):
    """A planner plugin whose plan is what the test gives it (assignments and rank reports)."""

    name = "given"

    def __init__(self, assignments, reports) -> None:
        self.assignments, self.reports = assignments, reports

    def plan(self, tables, context):
        return PlanResult("given", self.assignments, self.reports, context.batch_size_per_rank, {})

    def sharders(self, context):
        return []


def two_tables(dim: int = 16) -> list[TableSpec]:
    return [TableSpec("a", 1000, dim, 1.0), TableSpec("b", 1000, 16, 1.0)]


def reports(weights: float = 2**20, capacity: float = 16 * GIB, ranks: range = range(8)) -> list[RankReport]:
    return [RankReport(rank=r, memory={"weights": weights}, memory_capacity=capacity) for r in ranks]


def tw(dim: int = 16, kernel: str = "fused") -> list[TableAssignment]:
    return [TableAssignment("a", "table_wise", kernel, [0], [(1000, dim)]),
            TableAssignment("b", "table_wise", "fused", [1], [(1000, 16)])]


def refusal(assignments, ranks, tables=None) -> str:
    with pytest.raises(PlanningError) as err:
        plan_tables(tables or two_tables(), cluster(), 256, planner=Given(assignments, ranks))
    assert str(err.value).startswith("Sharding planner 'given' gave a plan that cannot run: "), str(err.value)
    return str(err.value)


def test_a_rank_over_its_memory_by_a_fraction_of_a_percent_is_refused() -> None:
    # the memory check's slack is a rounding's (1e-9), not a share of the device: 16.1 GiB on
    # a 16 GiB rank (0.6% over) fails on the device, so it is refused here
    over = reports()
    over[3].memory["weights"] = 16.1 * GIB
    assert "it fills rank 3's memory with 16.1GiB of 16.0GiB" in refusal(tw(), over)
    full = reports()
    full[3].memory["weights"] = 16 * GIB  # exactly full: runs
    assert plan_tables(two_tables(), cluster(), 256, planner=Given(tw(), full)).ranks[3].memory_total == 16 * GIB


def test_a_replicated_table_under_reported_on_its_ranks_is_refused_at_its_weights_bytes() -> None:
    # a replica holds the whole table on every rank: 1000 x 16 x 4 bytes = 62.5 KiB each, so a
    # rank reporting 40,000 bytes for two replicas (125 KiB) under-reports them
    dp = [TableAssignment(n, "data_parallel", "dense", list(range(8))) for n in ("a", "b")]
    message = refusal(dp, reports(weights=40_000))
    assert ("it reports 39.1KiB of device memory on rank 0, less than its shards' weights alone (125.0KiB at 4 "
            "bytes per element)") in message, message
    assert plan_tables(two_tables(), cluster(), 256, planner=Given(dp, reports(weights=128_000))).ranks


def test_a_rank_reported_twice_is_refused_naming_the_ranks_reported() -> None:
    # nine reports for eight ranks, rank 0 twice: its memory and time are counted twice
    ranks = [*reports(ranks=range(1)), *reports()]
    message = refusal(tw(), ranks)
    assert "it reports ranks 0,0-7, not each of the 8 ranks once" in message, message


def test_row_wise_shards_that_do_not_add_up_to_their_table_are_refused() -> None:
    # eight row-wise shards of 100 rows hold 800 of table a's 1000 rows
    rw = [TableAssignment("a", "row_wise", "fused", list(range(8)), [(100, 16)] * 8),
          TableAssignment("b", "table_wise", "fused", [1], [(1000, 16)])]
    message = refusal(rw, reports())
    assert ("it gives shard shapes (rows, cols) that do not make up their tables (a: [(100, 16), (100, 16), "
            "(100, 16), (100, 16)] ... for 1000 x 16)") in message, message
    rw[0].shard_shapes = [(125, 16)] * 8  # 1000 rows: runs
    assert plan_tables(two_tables(), cluster(), 256, planner=Given(rw, reports())).tables[0].ranks == list(range(8))


def test_shards_a_multiple_of_4_wide_pass_the_fused_kernels_width_check_and_cached_ones_do_not_escape_it() -> None:
    # FBGEMM's unit is 4 columns: 12 are fine (a Neo plan of a dim-12 table runs); 6 are not,
    # whichever fused kernel (fused, fused_uvm_caching) holds them
    result = plan_tables(two_tables(dim=12), cluster(), 256, planner=Given(tw(dim=12), reports()))
    assert result.tables[0].shard_shapes == [(1000, 12)]
    assert plan_tables([TableSpec("a", 100_000, 12, 4.0)], cluster(), 256).tables[0].sharding_type != "data_parallel"
    message = refusal(tw(dim=6, kernel="fused_uvm_caching"), reports(), tables=two_tables(dim=6))
    assert "shards whose width is not a multiple of 4, which FBGEMM refuses (a (6 columns))" in message, message


def test_a_negative_memory_figure_is_refused_though_the_total_covers_the_weights() -> None:
    # a kind of -4 KiB beside 1 MiB of weights: the total still holds the shards' weights, but
    # no memory is negative (a plugin's sign slip would hide bytes from the capacity check)
    negative = reports()
    negative[2].memory["cache"] = -4096.0
    assert "it reports memory that is not a number of bytes, 0 or more (rank 2)" in refusal(tw(), negative)


def test_a_plans_settings_say_no_prefetch_where_nothing_is_cached() -> None:
    # prefetch_pipeline=True with no load_factor: no table is cached, so no prefetch runs (plan.json's settings)
    result = plan_tables(two_tables(), cluster(), 256, cache=CachePolicy("lru", prefetch_pipeline=True))
    assert result.settings["cache"] == {"name": "lru", "algorithm": None, "load_factor": None,
                                        "prefetch_pipeline": False}


def test_a_plan_with_a_prefetch_pipeline_says_its_overlap_is_not_modelled() -> None:
    # prefetch_pipeline=true only added memory; the plan said "(load factor 0.05, prefetch
    # pipeline)" and predicted a step that no overlap shortens, as if the pipeline were costed
    from pathlib import Path

    from neo_plugins.sharding.planner.planner import PREFETCH_NOTE

    tables = [TableSpec(f"t{i}", 6_000_000, 64, 8.0) for i in range(16)]  # half go behind a cache on 2 GiB
    small = {"name": "zionex", "num_nodes": 1, "device_memory_gib": 2.0}

    def notes(topology, prefetch: bool) -> tuple[int, list[str]]:
        result = plan_tables(tables, topology, 4096, sharding_types=["TW"],
                             cache=CachePolicy("lru", load_factor=0.05, prefetch_pipeline=prefetch))
        return result.cached_tables, result.notes

    cached, said = notes(small, True)
    assert cached and PREFETCH_NOTE in said
    assert "the predicted step is an upper bound for a pipeline that overlaps them" in PREFETCH_NOTE
    assert PREFETCH_NOTE not in notes(small, False)[1]  # no pipeline
    cached, said = notes({**small, "device_memory_gib": 40.0}, True)  # nothing cached: nothing prefetched
    assert not cached and PREFETCH_NOTE not in said
    # docs/cost_model.md says the same where it counts the pipeline's memory
    docs = " ".join((Path(__file__).parents[2] / "docs" / "cost_model.md").read_text().split())
    assert PREFETCH_NOTE.removeprefix("cache.prefetch_pipeline=true: ") in docs


def test_plan_json_gives_each_nodes_host_memory_where_one_rank_holds_more_than_its_share(tmp_path) -> None:
    # a cached table of 107 GiB of host memory, table-wise on one rank: over that rank's share
    # (64 GiB) of its node's 128 GiB, which the node's two ranks share. plan.json alone must show
    # that it fits: each node's host bytes against the node's capacity
    tables = [TableSpec("huge", 1_800_000_000, 16, 1.0), *(TableSpec(f"t{i}", 100_000, 64, 4.0) for i in range(6))]
    result = plan_tables(tables, cluster(nodes=2, per_node=2, mem_gib=32), 256,
                         cache=CachePolicy("lru", load_factor=0.01), sharding_types=["table_wise"])
    result.save_json(tmp_path / "plan.json")
    saved = json.loads((tmp_path / "plan.json").read_text())
    host = {r["rank"]: sum(r["host_memory_bytes"].values()) for r in saved["ranks"]}
    holder = max(host, key=host.__getitem__)
    assert host[holder] == 1_800_000_000 * 16 * 4  # fp32 weights behind the cache (row-wise Adagrad's on the device)
    assert host[holder] > saved["ranks"][holder]["host_memory_capacity_bytes"] == 64 * GIB  # its share
    nodes = saved["nodes"]
    assert [n["ranks"] for n in nodes] == [[0, 1], [2, 3]]
    for n in nodes:
        assert n["host_memory_bytes"] == sum(host[r] for r in n["ranks"])
        assert n["host_memory_capacity_bytes"] == 2 * 64 * GIB
        assert n["host_memory_bytes"] <= n["host_memory_capacity_bytes"]
    assert nodes[holder // 2]["host_memory_bytes"] >= host[holder]
    assert "nodes" not in plan_tables(two_tables(), cluster(), 256).to_dict()  # nothing in host memory


def test_a_plugins_sharders_are_checked_before_a_rank_builds_with_them() -> None:
    # sharders() returning None failed in a traceback; [] in every rank, with a KeyError naming
    # TorchRec's EmbeddingBagCollection, not the plugin
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from neo_core.sharding import checked_sharders
    from neo_plugins.sharding.torchrec_planner import _meta_model

    context = make_context(cluster(), 256)
    planner = Given(tw(), reports())
    for returned, said in ((None, "returned NoneType;"), ([object()], "returned object, not a ModuleSharder;"),
                           ([], "returned no sharder for EmbeddingBagCollection (the model's tables; returned: none);")):
        planner.sharders = lambda context, returned=returned: returned
        with pytest.raises(PlanningError) as err:
            checked_sharders(planner, context)
        assert str(err.value).startswith(f"Sharding planner 'given': its sharders() {said} it must return a list "
                                         "of TorchRec ModuleSharders, one of them for EmbeddingBagCollection"), err
        with pytest.raises(PlanningError, match="sharders"):  # as a training run plans, before its ranks start
            planner.plan_module(_meta_model(two_tables(), context), two_tables(), context)
    sharders = [EmbeddingBagCollectionSharder()]
    planner.sharders = lambda context: sharders
    assert checked_sharders(planner, context) == sharders
    assert planner.plan_module(_meta_model(two_tables(), context), two_tables(), context).torchrec_plan is not None


# --- a saved plan (plan.json): its fields and what run_problems finds ------------------------


def saved_plan(capacity: float = 16 * GIB) -> PlanResult:
    spec = {"num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 1.0, "hot_fraction": None}
    tables = [TableAssignment("a", "table_wise", "fused", [0], [(1000, 16)], why="w", spec=spec)]
    ranks = [RankReport(rank=r, memory={"weights": 64_000.0 if r == 0 else 0.0}, memory_capacity=capacity,
                        time={"compute_fwd": 1e-3}) for r in range(2)]
    return PlanResult("neo", tables, ranks, 64, {})


def test_a_saved_plan_without_a_memory_capacity_is_said_to_have_none() -> None:
    # `neo chart` warns of it: a rank of capacity 0 is no device the plan could run on
    assert saved_plan().run_problems() == []
    none = saved_plan()
    none.ranks[1].memory_capacity = 0.0
    assert none.run_problems() == ["reports no device memory capacity for rank 1"]


def test_a_saved_plans_negative_shard_shape_is_named_by_its_field(tmp_path) -> None:
    data = saved_plan().to_dict()
    data["tables"][0]["shard_shapes"] = [[-1, 16]]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape("table 'a' has shard_shapes [[-1, 16]]; it must be a list of "
                                                    "[rows, cols] pairs of whole numbers (as Neo writes it)")):
        PlanResult.load_json(tmp_path / "plan.json")


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda d: d["tables"][0].update(ranks=[5]), "table 'a' is on rank 5, outside the plan's ranks 0-1"),
        (lambda d: d["tables"][0].update(ranks=[0, 1]),
         "table 'a' is TW on ranks 0,1, but a table-wise table is on one rank"),
        (lambda d: d["tables"][0].update(sharding_type="row_wise", ranks=[0, 1]),
         "table 'a' has 1 shard shape for 2 ranks; it needs one per rank"),
        (lambda d: d["tables"][0].update(sharding_type="row_wise", ranks=[0, 1], shard_shapes=[[500, 16], [400, 16]]),
         "table 'a' has shard shapes [[500, 16], [400, 16]], which do not make up its 1,000 rows x 16 columns (RW: its "
         "shards add up to the table)"),
        (lambda d: d["tables"].append(d["tables"][0]), "table 'a' is listed twice"),
        (lambda d: d["ranks"][1].update(rank=0), "the plan reports rank 0 twice"),
        (lambda d: d["topology"].update(num_nodes=2), "the plan reports 2 ranks, but its topology has 4 (2 node(s) x 2)"),
        (lambda d: d["tables"][0].update(predicted_hit_rate=1.5),
         "table 'a' has predicted_hit_rate 1.5; it must be a share from 0 to 1, or null (as Neo writes it)"),
    ],
    ids=["rank-outside", "tw-on-two", "shape-count", "shape-sum", "twice", "rank-twice", "topology", "hit-rate"],
)
def test_a_saved_plan_that_no_planner_could_make_is_refused_naming_the_file_and_table(tmp_path, edit, said) -> None:
    # a table on rank 5 of a 2-rank plan was read, charted, and called "cannot run" at most
    data = saved_plan().to_dict()
    data["topology"] = {"name": "local", "num_nodes": 1, "devices_per_node": 2, "world_size": 2}
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert PlanResult.load_json(tmp_path / "plan.json").tables[0].ranks == [0]  # as written: read
    edit(data)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        PlanResult.load_json(tmp_path / "plan.json")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'plan.json'}: {said}. Was the file edited?"), message
    assert "\n" not in message


# --- the plan's text ----------------------------------------------------------------------------


def test_the_texts_median_fullest_rank_and_exact_units() -> None:
    # four ranks of 1, 2, 3 and 4 ms: the median shown is the upper of the two middle ranks (3 ms).
    # Rank 1 holds less (1 GiB) than rank 0 (2 GiB) but on a device a quarter the size: it is the fullest
    ranks = [RankReport(rank=r, memory={"weights": float(m * GIB)}, memory_capacity=float(c * GIB),
                        time={"compute_fwd": t * 1e-3}) for r, (m, c, t) in enumerate(((2, 16, 1), (1, 4, 2), (0, 4, 3),
                                                                                       (0, 4, 4)))]
    text = PlanResult("x", [], ranks, 64, {}).format_text()
    assert "total min 1.000ms, median 3.000ms, max 4.000ms" in text, text
    # a GiB exactly is 1.0GiB, not 1024.0MiB
    assert "fullest device memory: rank 1, 1.0GiB of 4.0GiB (3.0GiB free)" in text, text


# --- TableSpec's and the planner's ranges, at their edges ------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"embedding_dim": 0}, "Table 'a' has embedding_dim 0; it must be a positive integer."),
        ({"num_embeddings": 2**62}, "Table 'a' has 4,611,686,018,427,387,904 rows; ids are 64-bit"),
        ({"hot_fraction": 100}, "lies in [0.01, 1] (0.01: uniform access) (a percentage? 100% is 1)."),
    ],
    ids=["dim-0", "rows-2**62", "hot-100"],
)
def test_table_specs_are_refused_at_the_edge_of_their_ranges(kwargs, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        TableSpec(**{"name": "a", "num_embeddings": 1000, "embedding_dim": 64, **kwargs})
    assert fragment in str(err.value), str(err.value)
    assert TableSpec("a", 2**62 - 1, 1).num_embeddings == 2**62 - 1  # the largest taken


def test_a_table_made_without_a_field_it_needs_is_named_with_the_field() -> None:
    # before: "TypeError: TableSpec.__init__() missing 1 required positional argument: 'embedding_dim'"
    for args, kwargs, said in (
        (("t", 1000), {}, "Table 't' has no embedding_dim (the width of each row); give it, e.g. TableSpec('t', 1000, 64)."),
        (("t",), {"embedding_dim": 32}, "Table 't' has no num_embeddings (its rows); give it, e.g. TableSpec('t', 1000000, 32)."),
        ((), {"num_embeddings": 10, "embedding_dim": 4}, "A table has no name; give it, e.g. TableSpec('user_id', 10, 4)."),
        (("t", 1000, 64), {"pooling": 2.0}, "Table 't' has no field 'pooling' (did you mean pooling_factor?); a table's "
                                            "fields: name, num_embeddings, embedding_dim, pooling_factor, feature_names, "
                                            "hot_fraction."),
    ):
        with pytest.raises(ConfigError) as err:
            TableSpec(*args, **kwargs)
        assert str(err.value) == said
    # made by position, by keyword, replaced, and read by its signature (a listed table set's check) as before
    table = TableSpec("t", 1000, embedding_dim=64, pooling_factor=2.0)
    assert table == TableSpec(name="t", num_embeddings=1000, embedding_dim=64, pooling_factor=2.0)
    assert dataclasses.replace(table, embedding_dim=32).embedding_dim == 32
    required = [n for n, p in inspect.signature(TableSpec).parameters.items() if p.default is inspect.Parameter.empty]
    assert required == ["name", "num_embeddings", "embedding_dim"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"col_shard_counts": [1, 2]}, "sharding.col_shard_counts must be a list of column-shard counts of 2 or more"),
        ({"min_col_width": 6}, "sharding.min_col_width must be a whole multiple of 4"),
        ({"reserve_fraction": 1.0}, "sharding.reserve_fraction=1.0 must lie in [0, 1)."),
    ],
    ids=["one-column-shard", "width-6", "reserve-all"],
)
def test_planner_arguments_are_refused_at_the_edge_of_their_ranges(kwargs, fragment) -> None:
    with pytest.raises(ConfigError) as err:
        NeoPlanner(**kwargs)
    assert fragment in str(err.value), str(err.value)


def test_a_planner_called_directly_with_no_batch_is_refused() -> None:
    # make_context refuses a batch of 0; a context built by hand reaches the planner with one
    context = dataclasses.replace(make_context(cluster(), 256), batch_size_per_rank=0)
    with pytest.raises(ConfigError, match=r"^batch_size_per_rank is 0; it must be a positive integer\.$"):
        NeoPlanner().plan(two_tables(), context)
    with pytest.raises(ConfigError, match=r"^batch_size_per_rank must be a positive integer, got 0\.$"):
        make_context(cluster(), 0)


# --- the planner's notes and refusals: their figures ---------------------------------------


def test_the_notes_count_the_odd_dim_tables_left_unnamed_and_say_the_reserve() -> None:
    # seven tables of dim 6: five named, "and 2 more"; the device reserve is the one asked for
    tables = [TableSpec(f"o{i}", 1000, 6, 1.0) for i in range(7)]
    notes = plan_tables(tables, cluster(), 256, reserve_fraction=0.2).notes
    [odd] = [n for n in notes if "replicated on the unfused dense kernel" in n]
    assert odd.endswith("o3 (dim 6), o4 (dim 6) and 2 more; pad the dim to 8 to shard them"), odd
    assert any(n.endswith("; reserve 20% of device memory") for n in notes), notes


def test_a_refused_tables_shortfall_is_one_figure_in_bytes_and_at_scale() -> None:
    # 4e8 rows x 128 fp32 split 8 ways, over each rank's usable 13.6 GiB: the bytes over and the
    # scaled figure beside them are the same amount
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("huge", 400_000_000, 128, 1.0)], cluster(), 256, check_settings_s=0)
    over, scaled = re.search(r"([\d,]+) bytes \(([^)]+)\) over the 13.60 GiB", str(err.value)).groups()
    assert human_bytes(float(over.replace(",", ""))) == scaled, str(err.value)


def test_short_host_memory_is_short_by_what_the_tables_need_less_what_the_nodes_offer() -> None:
    # 8 cached tables of 400M x 16: with a 90% host reserve the 2 nodes offer 51.2 GiB usable
    tables = [TableSpec(f"h{i}", 400_000_000, 16, 2.0) for i in range(8)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, cache=CachePolicy("lru", load_factor=0.01), host_reserve_fraction=0.9,
                    check_settings_s=0)
    msg = str(err.value)
    found = re.search(r"need at least ([\d.]+) GiB of host memory, but 2 nodes offer ([\d.]+) GiB usable: ([\d,]+) "
                      r"bytes \(([\d.]+) GiB\) short", msg)
    assert found, msg
    need, offered, short, scaled = found.groups()
    assert float(offered) == 51.2
    assert float(short.replace(",", "")) / GIB == pytest.approx(float(need) - float(offered), abs=0.01), msg
    assert float(scaled) == pytest.approx(float(need) - float(offered), abs=0.01), msg


def test_a_batch_bound_refusal_ranks_the_tables_it_names_by_their_own_bytes() -> None:
    # 'hot' (300 rows, 50 ids a sample) has the largest batch buffers but 76 KiB of rows: the
    # tables named as the largest, "without their batch buffers", are the largest by rows
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec(f"t{i}", 200 + 1000 * i, 64, 2.0) for i in range(26)] + [TableSpec("hot", 300, 64, 50.0)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=8), 4_000_000, check_settings_s=0)
    assert ("; largest tables, without their batch buffers: t25 (6.2 MiB), t24 (6.0 MiB), t23 (5.8 MiB), t22 (5.5 MiB), "
            "t21 (5.3 MiB);") in str(err.value), str(err.value)


# --- table generators -----------------------------------------------------------------------------


def test_production_like_tables_at_the_edges_of_their_parameters() -> None:
    # one row count for all (min_rows == max_rows) and mean pooling 1 are taken; exp(log(500))
    # is 499.99..., which int() truncated to 499 rows, one under min_rows
    same = production_like(num_tables=3, min_rows=500, max_rows=500, mean_pooling=1.0)
    assert [t.num_embeddings for t in same] == [500] * 3
    assert all(t.pooling_factor >= 1.0 for t in same)
    # a model of 10 parameters over 5 tables: every table keeps at least one row
    tiny = production_like(num_tables=5, dims=(16,), dim_weights=(1.0,), total_parameters=10)
    assert [t.num_embeddings for t in tiny] == [1] * 5
    with pytest.raises(ConfigError, match=r"^dim_weights must be numbers of 0 or more with a positive sum, got \[1, -0.5\]"):
        production_like(num_tables=3, dims=(16, 32), dim_weights=(1, -0.5))
    with pytest.raises(ConfigError, match=r"^mean_pooling must be a finite number of ids per sample, at least 1; got 0.5"):
        production_like(num_tables=3, mean_pooling=0.5)


# --- plan_tables' own checks ------------------------------------------------------------------------


def test_plan_tables_names_what_it_is_given_before_the_planner_sees_it() -> None:
    one = [TableSpec("t0", 1000, 16, 1.0)]
    # a planner object takes its own parameters: ones given beside it would be dropped silently
    with pytest.raises(ConfigError, match=r"^Planner parameters apply only when the planner is given by name\."):
        plan_tables(one, cluster(), 256, planner=NeoPlanner(), reserve_fraction=0.2)
    # a close slip of its own parameter's name ('kernal': difflib ratio 0.83)
    with pytest.raises(ConfigError, match=r"plan_tables\(\) has no parameter 'kernal'; did you mean kernel=\?"):
        plan_tables(one, cluster(), 256, kernal="fused")
    # a table that is not a TableSpec is named as such, not met by an AttributeError
    with pytest.raises(ConfigError, match=r"^Tables must be neo_core.sharding.TableSpec objects, got dict\.$"):
        plan_tables([{"name": "t0", "num_embeddings": 1000, "embedding_dim": 16}], cluster(), 256)


def test_a_compressed_plan_says_what_its_codec_was_priced_at_and_whence() -> None:
    # the GPU codec's figure decided every compressed plan's codec terms, cited nowhere
    from neo_plugins.topology.zionex import zionex_topology

    tables = [TableSpec("t", 1_000_000, 128, 4.0)]

    def codec(result):
        return [n for n in result.notes if n.startswith("compression's codec")]

    said = codec(plan_tables(tables, zionex_topology(num_nodes=2), 512, compressor="fp16"))
    assert said == ["compression's codec (each element encoded where it is sent and decoded where it arrives) priced at "
                    "518 GB/s of fp32 values (a third of device memory bandwidth, assumed; docs/cost_model.md, z)"]
    from neo_core.compression import Compressor

    mixed = codec(plan_tables(tables, zionex_topology(num_nodes=2), 512, compressor=Compressor("m", "fp32", "fp16")))
    assert mixed == said  # one direction compressed is compressed
    assert not codec(plan_tables(tables, zionex_topology(num_nodes=2), 512))  # nothing encoded
    assert not codec(plan_tables(tables, zionex_topology(num_nodes=1, devices_per_node=1), 512, compressor="fp16"))
    given = zionex_topology(num_nodes=2).replace(codec_bw=3e11)
    assert "priced at 300 GB/s of fp32 values (the topology's codec_bw;" in codec(
        plan_tables(tables, given, 512, compressor="bf16"))[0]
