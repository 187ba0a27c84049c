"""build_sharding_plan: TableAssignments become the right TorchRec ParameterShardings."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from neo_core.cache import CachePolicy
from neo_core.compression import Compressor
from neo_core.errors import PlanningError
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import PlanningContext, PlanResult, ShardingType, TableAssignment
from neo_core.topology import GiB, Topology
from neo_core.torchrec_plan import build_sharding_plan
from neo_plugins.sharding.sharders import NeoEmbeddingBagCollectionSharder, make_sharders


def cpu_context(
    num_nodes: int, devices_per_node: int, compressor: Compressor | None = None, learning_rate: float = 0.05
) -> PlanningContext:
    """A CPU cluster of ``num_nodes`` x ``devices_per_node`` ranks, fused EXACT_SGD kernel."""
    topology = Topology(
        name="test",
        num_nodes=num_nodes,
        devices_per_node=devices_per_node,
        compute_device="cpu",
        device_memory=4 * GiB,
        host_memory=4 * GiB,
        device_memory_bw=1e10,
        host_memory_bw=1e10,
        host_to_device_bw=1e10,
        intra_node_bw=1e10,
        inter_node_bw=1e9,
    )
    return PlanningContext(
        topology=topology,
        batch_size_per_rank=8,
        kernel=EmbeddingKernel(
            name="fused", compute_kernel="fused", optimizer=SparseOptimizer.SGD, learning_rate=learning_rate
        ),
        compressor=compressor or Compressor(name="none"),
        cache=CachePolicy(name="none"),
    )


class Model(torch.nn.Module):
    def __init__(self, names: list[str], dim: int = 32, rows: int = 100) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=n, embedding_dim=dim, num_embeddings=rows, feature_names=[f"f_{n}"])
                for n in names
            ],
            device=torch.device("meta"),
        )


def _plan(assignments: list[TableAssignment], context: PlanningContext, model: torch.nn.Module | None = None):
    model = model or Model([a.name for a in assignments])
    result = PlanResult("test", assignments, [], 8, context.topology.to_dict())
    return build_sharding_plan(model, result, context, make_sharders(context))


def _shards(ps) -> list[tuple[list[int], list[int], int]]:
    return [(s.shard_sizes, s.shard_offsets, s.placement.rank()) for s in ps.sharding_spec.shards]


def test_world_size_2_every_type() -> None:
    context = cpu_context(1, 2)
    tables = [
        TableAssignment("dp", "data_parallel", "dense", [0, 1]),
        TableAssignment("tw", "table_wise", "fused", [1]),
        TableAssignment("rw", "row_wise", "fused", [0, 1]),
        TableAssignment("cw", "column_wise", "fused", [1, 0]),
        TableAssignment("twrw", "table_row_wise", "fused", [0, 1]),
        TableAssignment("twcw", "table_column_wise", "fused", [0, 1, 1], [(100, 8), (100, 8), (100, 16)]),
        TableAssignment("grid", "grid_shard", "fused", [0, 1, 0, 1]),
    ]
    plan = _plan(tables, context).plan["ebc"]
    assert plan["dp"].sharding_type == "data_parallel" and plan["dp"].compute_kernel == "dense"
    assert plan["dp"].sharding_spec is None and plan["dp"].ranks == [0, 1]
    assert plan["tw"].ranks == [1] and _shards(plan["tw"]) == [([100, 32], [0, 0], 1)]
    assert plan["rw"].ranks == [0, 1]
    assert _shards(plan["rw"]) == [([50, 32], [0, 0], 0), ([50, 32], [50, 0], 1)]
    assert _shards(plan["cw"]) == [([100, 16], [0, 0], 1), ([100, 16], [0, 16], 0)]
    assert _shards(plan["twrw"]) == [([50, 32], [0, 0], 0), ([50, 32], [50, 0], 1)]
    assert plan["twcw"].ranks == [0, 1, 1]
    assert [s[0] for s in _shards(plan["twcw"])] == [[100, 8], [100, 8], [100, 16]]
    assert _shards(plan["grid"]) == [
        ([50, 16], [0, 0], 0),
        ([50, 16], [50, 0], 1),
        ([50, 16], [0, 16], 0),
        ([50, 16], [50, 16], 1),
    ]
    for t in tables:
        assert plan[t.name].sharding_type == t.sharding_type
        assert plan[t.name].compute_kernel == t.compute_kernel
        assert plan[t.name].ranks == t.ranks
        if plan[t.name].sharding_spec is not None:
            assert all(str(s.placement.device()) == "cpu" for s in plan[t.name].sharding_spec.shards)


def test_world_size_4_two_nodes() -> None:
    context = cpu_context(2, 2)
    tables = [
        TableAssignment("dp", "data_parallel", "dense", [0, 1, 2, 3]),
        TableAssignment("tw", "table_wise", "fused", [3]),
        TableAssignment("rw", "row_wise", "fused", [0, 1, 2, 3]),
        TableAssignment("cw", "column_wise", "fused", [0, 3]),
        TableAssignment("twrw", "table_row_wise", "fused", [2, 3]),
        TableAssignment("twcw", "table_column_wise", "fused", [2, 3]),
        TableAssignment("grid", "grid_shard", "fused", [0, 1, 2, 3]),
    ]
    plan = _plan(tables, context).plan["ebc"]
    for t in tables:
        assert plan[t.name].sharding_type == t.sharding_type
        assert plan[t.name].ranks == t.ranks
    assert [s[0] for s in _shards(plan["rw"])] == [[25, 32]] * 4
    assert _shards(plan["twrw"]) == [([50, 32], [0, 0], 2), ([50, 32], [50, 0], 3)]
    assert _shards(plan["grid"]) == [
        ([50, 16], [0, 0], 0),
        ([50, 16], [50, 0], 1),
        ([50, 16], [0, 16], 2),
        ([50, 16], [50, 16], 3),
    ]


def test_unknown_table_is_named() -> None:
    context = cpu_context(1, 2)
    model = Model(["known", "mystery"])
    with pytest.raises(PlanningError, match="mystery"):
        _plan([TableAssignment("known", "table_wise", "fused", [0])], context, model)


@pytest.mark.parametrize(
    "assignment, message",
    [
        (TableAssignment("t", "row_wise", "fused", [1]), "all 2 ranks"),
        (TableAssignment("t", "table_wise", "dense", [0]), "dense kernel"),
        (TableAssignment("t", "table_wise", "fused", [5]), "outside world size"),
        (TableAssignment("t", "column_wise", "fused", [0, 1, 0]), "split evenly"),
        (TableAssignment("t", "grid_shard", "fused", [1, 0]), "grid-sharded"),
    ],
)
def test_bad_assignments(assignment: TableAssignment, message: str) -> None:
    with pytest.raises(PlanningError, match=message):
        _plan([assignment], cpu_context(1, 2))


def test_sharder_offers_every_type_on_cpu() -> None:
    context = cpu_context(1, 2, Compressor(name="fp16", forward_precision="fp16", backward_precision="bf16"))
    (sharder,) = make_sharders(context)
    assert isinstance(sharder, NeoEmbeddingBagCollectionSharder)
    assert set(sharder.sharding_types("cpu")) == {t.value for t in ShardingType}
    assert sharder.compute_kernels("data_parallel", "cpu") == ["dense"]
    assert sharder.compute_kernels("row_wise", "cpu") == ["fused"]
    assert sharder.fused_params["learning_rate"] == context.kernel.learning_rate
    # the codecs TorchRec sends with: the compressor's precision each way, on every pooled collective
    codecs = {str(k).split(".")[-1]: (str(v.forward._comm_precision), str(v.backward._comm_precision))
              for k, v in sharder.qcomm_codecs_registry.items()}
    assert codecs["POOLED_EMBEDDINGS_ALL_TO_ALL"] == codecs["POOLED_EMBEDDINGS_REDUCE_SCATTER"] == ("fp16", "bf16")


def test_torchrec_planner_report_rebuilds_its_own_plan() -> None:
    import dataclasses

    from neo_core.sharding import TableSpec
    from neo_plugins.sharding.torchrec_planner import TorchRecPlanner, _meta_model

    context = cpu_context(1, 2)
    specs = [TableSpec(f"t{i}", 1000 * (i + 1), (64, 256)[i % 2], pooling_factor=2.0) for i in range(12)]
    model = _meta_model(specs, context)
    result = TorchRecPlanner().plan_module(model, specs, context)
    # in the model's order, as sharding=neo lists them (they were sorted by name: t0, t1, t10, t11, t2...)
    assert [t.name for t in result.tables] == [s.name for s in specs]
    assert [r.rank for r in result.ranks] == [0, 1] and result.predicted_step_time > 0
    assert all(r.memory_total > 0 for r in result.ranks)
    rebuilt = build_sharding_plan(model, result, context, TorchRecPlanner().sharders(context)).plan["ebc"]
    for name, want in result.torchrec_plan.plan["ebc"].items():
        got = rebuilt[name]
        assert (got.sharding_type, got.compute_kernel, got.ranks) == (
            want.sharding_type,
            want.compute_kernel,
            want.ranks,
        )
        if want.sharding_spec is not None:
            assert _shards(got) == _shards(want)

    tiny = dataclasses.replace(context, topology=context.topology.replace(device_memory=2**20, host_memory=2**20))
    with pytest.raises(PlanningError, match="no plan"):
        TorchRecPlanner().plan(specs, tiny)


def test_torchrec_planner_keeps_to_the_selected_cache_policy() -> None:
    # 8 tables of 25.6 GB on 8 GPUs of 8 GiB fit only behind a cache. TorchRec's planner used
    # to ignore the cache group: with cache=none it still cached at its default 20% of rows,
    # and with cache=lfu it sized and evicted by its own defaults
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm

    from neo_core.api import make_context
    from neo_core.cache import CachePolicy
    from neo_core.sharding import TableSpec
    from neo_plugins.sharding.torchrec_planner import TorchRecPlanner, _meta_model
    from tests.planner import cluster

    specs = [TableSpec(f"t{i}", 50_000_000, 128, 4.0) for i in range(8)]
    with pytest.raises(PlanningError) as err:
        TorchRecPlanner().plan(specs, make_context(cluster(mem_gib=8.0), 256))
    assert "behind a cache (cache=lru cache.load_factor=0.05)" in str(err.value)
    # Neo's memory bounds say by how much: the device memory is short, with the figure
    assert " Neo's memory bounds say why: Device memory is short: the tables need" in str(err.value)
    context = make_context(cluster(mem_gib=8.0), 256, cache=CachePolicy("lfu", load_factor=0.05))
    result = TorchRecPlanner().plan_module(_meta_model(specs, context), specs, context)
    for name, sharding in result.torchrec_plan.plan["ebc"].items():
        assert sharding.compute_kernel == "fused_uvm_caching", (name, sharding.compute_kernel)
        assert sharding.cache_params.algorithm == CacheAlgorithm.LFU
        assert sharding.cache_params.load_factor == 0.05
    # a cache of 5% of the rows: each table's device share is about 5% of its 25.6 GB
    assert max(r.memory_total for r in result.ranks) < 0.2 * 25.6e9


def test_torchrec_planning_counts_its_seconds_on_a_terminal() -> None:
    # it printed nothing for minutes on hundreds of tables
    import io
    import time

    from neo_plugins.sharding.torchrec_planner import elapsed_bar

    out = io.StringIO()
    with elapsed_bar("TorchRec's planner on 500 tables", file=out, tick_s=0.05, delay_s=0.2, disable=False):
        time.sleep(0.6)
    shown = out.getvalue()
    assert "TorchRec's planner on 500 tables: 00:00 so far" in shown and shown.count("\r") >= 3, shown
    assert shown.rstrip(" ").endswith("\r") and shown.split("\r")[-1].strip() == ""  # cleared at the end
    brief = io.StringIO()
    with elapsed_bar("x", file=brief, tick_s=0.05, delay_s=0.5, disable=False):  # over before the delay
        time.sleep(0.2)
    assert brief.getvalue() == ""


def test_torchrec_planning_off_a_terminal_says_every_so_often_that_it_is_still_planning(monkeypatch, capsys) -> None:
    # a log file, CI or `| tee` showed nothing for the minutes TorchRec's planner takes on
    # hundreds of tables; here a slow fake of it, and a line every 0.1 s instead of 30 s
    import re
    import time

    from neo_core.sharding import TableSpec
    from neo_plugins.sharding import torchrec_planner

    class SlowPlanner(torchrec_planner.EmbeddingShardingPlanner):
        def plan(self, *args, **kwargs):
            time.sleep(0.55)
            return super().plan(*args, **kwargs)

    monkeypatch.setattr(torchrec_planner, "EmbeddingShardingPlanner", SlowPlanner)
    monkeypatch.setattr(torchrec_planner, "OFF_TERMINAL_EVERY_S", 0.1, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    specs = [TableSpec(f"t{i}", 1000, 64, pooling_factor=2.0) for i in range(3)]
    torchrec_planner.TorchRecPlanner().plan(specs, cpu_context(1, 2))
    err = capsys.readouterr().err  # captured: not a terminal
    said = re.findall(r"^TorchRec's planner on 3 tables: still planning, \d+ s so far$", err, re.M)
    assert len(said) >= 3 and "\r" not in err, err


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adagrad"])  # FBGEMM has no Adam on CPU
def test_fbgemm_builds_the_optimizer_the_planner_budgets(optimizer: str) -> None:
    # the kernel's fused settings, as the sharders pass them, make FBGEMM's table batch: its
    # optimizer state must be what the plan's memory counts, with the kernel's rate and eps
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from neo_core.kernels import EmbeddingKernel, SparseOptimizer

    kernel = EmbeddingKernel("fused", "fused", SparseOptimizer(optimizer), learning_rate=0.03, eps=1e-5)
    params = kernel.fused_params()
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(100, 16, EmbeddingLocation.HOST, ComputeDevice.CPU)], **params)
    state = sum(t.numel() * t.element_size() for table in tbe.split_optimizer_states() for t in table)
    assert state == kernel.optimizer_state_bytes(100, 16)
    assert tbe.get_learning_rate() == pytest.approx(0.03)
    if optimizer != "sgd":
        assert tbe.optimizer_args.eps == pytest.approx(1e-5)
