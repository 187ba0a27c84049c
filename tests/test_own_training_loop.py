"""Neo's planner in a user's own TorchRec code (neo_core.api.plan_model, table_specs,
check_ranks, seeded_table_init): the plan DistributedModelParallel executes, and the plans
and ranks that cannot be executed refused with the fix before TorchRec meets them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from neo_core.api import make_context, plan_model, plan_tables, resolve, table_specs
from neo_core.errors import ConfigError, NeoError, PlanningError
from neo_core.sharding import TableSpec
from tests.conftest import ROOT, subprocess_env
from tests.distributed.multi_process import MultiProcessRunner, free_port


def ebc(*tables: tuple[str, int, int], feature: str = "f_") -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"{feature}{n}"])
                for n, r, d in tables],
        device=torch.device("meta"))


def test_the_own_training_loop_run_without_torchrun_says_how_to_run_it() -> None:
    # with plain python, torch's env:// rendezvous failed with a 15-line traceback
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "own_training_loop.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        "run it with torchrun, which starts the ranks: torchrun --nproc_per_node 2 docs/examples/own_training_loop.py"
    ), proc.stderr[-2000:]


def test_the_documented_own_training_loop_runs_on_two_ranks_and_matches_the_unsharded_model() -> None:
    # docs/planner.md points here: plan_model's plan and sharders in DMP, as a user writes it
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node=2", f"--master-port={free_port()}",
         str(ROOT / "docs" / "examples" / "own_training_loop.py")],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"user_id +RW .*\n *item_id +CW .*\n *category +DP +dense", out), out
    # seeded_table_init read TorchRec's ShardedTensors, and each read warned of their deprecation
    assert "Please use DTensor instead" not in proc.stderr, proc.stderr[-3000:]
    diffs = [float(d) for d in re.findall(r"rank \d: the sharded model's output is the unsharded model's "
                                          r"\(max \|difference\| (\S+)\)", out)]
    assert len(diffs) == 2 and max(diffs) <= 1e-5, out
    first, last = (float(x) for x in re.search(r"first 10 steps (\S+), last 10 (\S+)", out).groups())
    assert last < first / 2, out


def test_table_specs_reads_the_models_tables_and_names_a_bad_name(capsys) -> None:
    model = nn.Module()
    model.user, model.item = ebc(("user_id", 1000, 16)), ebc(("item_id", 500, 8))
    specs = table_specs(model, pooling_factors={"item_id": 3.0}, hot_fractions={"user_id": 0.4})
    assert [(s.name, s.num_embeddings, s.embedding_dim, s.pooling_factor, s.feature_names, s.hot_fraction)
            for s in specs] == [("user_id", 1000, 16, 1.0, ("f_user_id",), 0.4), ("item_id", 500, 8, 3.0, ("f_item_id",), None)]
    with pytest.raises(ConfigError, match=r"^pooling_factors names 'itme_id', which is no table of the model "
                                          r"\(did you mean 'item_id'\?\)\.$"):
        table_specs(model, pooling_factors={"itme_id": 3.0})
    # two towers with a table of one name each: a plan could not tell them apart
    model.item = ebc(("user_id", 500, 8), feature="i_")
    with pytest.raises(ConfigError, match=r"^Table 'user_id' is in both module 'user' and module 'item'; "):
        table_specs(model)
    with pytest.raises(ConfigError, match=r"^Linear holds no TorchRec EmbeddingBagCollection"):
        table_specs(nn.Linear(2, 2))
    # a feature's name, a list, an EmbeddingCollection beside, arguments swapped: each said as such
    with pytest.raises(ConfigError, match=r"^pooling_factors names 'f_item_id', which is no table of the model: it is "
                                          r"a feature, which reads table 'item_id'"):
        table_specs(ebc(("user_id", 10, 8), ("item_id", 10, 8)), pooling_factors={"f_item_id": 2.0})
    with pytest.raises(ConfigError, match=r"^pooling_factors is given by table name, e\.g\. pooling_factors="
                                          r"\{'user_id': 2\.0\}; got a list\.$"):
        table_specs(ebc(("user_id", 10, 8)), pooling_factors=[2.0])
    with pytest.raises(ConfigError, match=r"^plan_model\(\) takes the model \(a torch nn.Module\) first, got str"):
        plan_model("local", ebc(("user_id", 10, 8)), 64)
    with pytest.raises(ConfigError, match=r"^plan_model\(\) needs batch_size_per_rank: the samples each rank"):
        plan_model(ebc(("user_id", 10, 8)), "local")
    with pytest.raises(ConfigError, match=r"^plan= takes a PlanResult \(PlanResult\.load_json\('plan\.json'\)\), "
                                          r"got str\.$"):
        plan_model(ebc(("user_id", 10, 8)), "local", 64, plan="plan.json")
    # a name like none of the tables: the tables named instead
    with pytest.raises(ConfigError, match=r"^hot_fractions names 'ads', which is no table of the model; its tables: "
                                          r"item_id, user_id\.$"):
        table_specs(ebc(("user_id", 10, 8), ("item_id", 10, 8)), hot_fractions={"ads": 0.5})
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    both = nn.Module()
    both.bag = ebc(("user_id", 10, 8))
    both.seq = EmbeddingCollection(tables=[EmbeddingConfig(name="s", num_embeddings=10, embedding_dim=8,
                                                           feature_names=["s"])], device=torch.device("meta"))
    assert [s.name for s in table_specs(both)] == ["user_id"]
    assert "warning: module 'seq' is an EmbeddingCollection, which plan_model does not plan" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^Table 'user_id' has pooling_factor 'x'; it must be a number\.$"):
        table_specs(ebc(("user_id", 10, 8)), pooling_factors={"user_id": "x"})  # not float()'s ValueError
    # a number of numpy's or a 0-d tensor is a float, as plan.json writes it
    import numpy as np

    [spec] = table_specs(ebc(("user_id", 10, 8)), pooling_factors={"user_id": np.float32(2.0)},
                         hot_fractions={"user_id": torch.tensor([0.2, 0.4]).mean()})
    assert type(spec.pooling_factor) is float and spec.pooling_factor == 2.0
    assert type(spec.hot_fraction) is float and abs(spec.hot_fraction - 0.3) < 1e-6


def test_a_plan_made_for_other_tables_ranks_or_optimizer_is_refused_for_this_model() -> None:
    # each was built without a word by TorchRec (rows and TW dims, a second table of one name, a
    # table the model lacks), or failed inside it on shard shapes or ranks
    model = ebc(("user_id", 100_000, 32), ("item_id", 500, 16))
    neo = resolve("sharding", "neo")
    ctx = make_context({"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    right = table_specs(model)
    assert neo.plan_module(model, right, ctx).torchrec_plan is not None
    fewer_rows = [TableSpec("user_id", 1000, 32), right[1]]
    with pytest.raises(PlanningError, match=r"^Table 'user_id' in the model has num_embeddings 100000, but the 'neo' "
                                            r"plan was made for num_embeddings 1000: plan again"):
        neo.plan_module(model, fewer_rows, ctx)
    wider = [TableSpec("user_id", 100_000, 64), right[1]]
    with pytest.raises(PlanningError, match=r"has embedding_dim 32, but the 'neo' plan was made for embedding_dim 64"):
        neo.plan_module(model, wider, ctx)
    more = [*right, TableSpec("ads", 10, 8)]
    with pytest.raises(PlanningError, match=r"^The 'neo' plan places 'ads', which the model has no table of"):
        neo.plan_module(model, more, ctx)
    # a saved plan used with another context
    saved = plan_tables(right, {"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    four = make_context({"name": "local", "world_size": 4, "compute_device": "cpu"}, 64)
    with pytest.raises(PlanningError, match=r"^The 'neo' plan is for 2 rank\(s\) \(local: 1 node\(s\) x 2 cpu "
                                            r"rank\(s\);.*but the topology here \(local\) has 4: plan again"):
        neo.to_torchrec_plan(model, saved, four)
    sgd = make_context({"name": "local", "world_size": 2, "compute_device": "cpu"}, 64,
                       kernel={"name": "fused", "optimizer": "sgd"})
    with pytest.raises(PlanningError, match=r"^The 'neo' plan was made for optimizer 'rowwise_adagrad', whose memory "
                                            r"its figures count, but the kernel here \(fused\) has optimizer 'sgd'"):
        neo.to_torchrec_plan(model, saved, sgd)
    assert neo.to_torchrec_plan(model, saved, ctx) is not None


def test_plan_model_under_torchrun_before_the_group_is_formed_plans_and_checks_for_its_world(monkeypatch) -> None:
    # planned before init_process_group, "local" was 2 ranks under a 4-rank torchrun, and DMP
    # failed with an IndexError inside TorchRec
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    model = ebc(("user_id", 100_000, 32), ("item_id", 500, 16))
    assert len(plan_model(model, "local", 64).ranks) == 4
    with pytest.raises(ConfigError, match=r"^The plan is for 2 rank\(s\) .*but the launch \(WORLD_SIZE\) has 4: plan "
                                          r"for 4 ranks"):
        plan_model(model, {"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    # what needs no group is checked before it too: the machines' ranks, a kernel on CPU ranks
    from neo_core.topology import GiB, Topology

    two_by_two = Topology("two_nodes", 2, 2, "cpu", 4 * GiB, 4 * GiB, 1e10, 1e10, 1e10, 1e10, 1e9)
    with pytest.raises(ConfigError, match=r"^The plan splits user_id \(TWRW\).* over nodes of 2 rank\(s\) .*, but 4 rank\(s\) share "
                                          r"each machine here \(LOCAL_WORLD_SIZE\).*: start 2 rank\(s\) a machine "
                                          r"\(torchrun --nproc_per_node=2\)"):
        plan_model(model, two_by_two, 64, table_sharding_types={"user_id": ["TWRW"]})
    with pytest.raises(ConfigError, match=r"^The kernel cannot run on these CPU ranks: optimizer adam"):
        plan_model(model, "local", 64, kernel={"name": "fused", "optimizer": "adam"})
    # data parallel alone runs no fused kernel: Adam is no matter there
    assert plan_model(model, "local", 64, kernel={"name": "fused", "optimizer": "adam"},
                      sharding_types=["DP"]).torchrec_plan is not None


def _check_ranks_refusals(rank: int, world: int) -> list[Any]:
    """In a 2-rank gloo group: plans its ranks cannot execute, each refused by plan_model; the
    local size an MPI launcher gives; and a rank that plans otherwise than rank 0."""
    import os

    from neo_core.api import check_ranks
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    model = ebc(("user_id", 100_000, 32), ("item_id", 500, 16))
    said = []
    for topology in ({"name": "local", "world_size": 4, "compute_device": "cpu"},
                     {"name": "zionex", "num_nodes": 1, "devices_per_node": 2}):
        try:
            plan_model(model, topology, 64)
        except NeoError as exc:
            said.append(str(exc))
        else:
            said.append("accepted")
    # a node of 2 ranks where each machine runs one (torchrun --nnodes 2 --nproc_per_node 1):
    # table-row-wise needs 4 ranks to plan, so the plan is written out here
    nodal = PlanResult("neo", [TableAssignment("user_id", "table_row_wise", "fused", [0, 1])],
                       [RankReport(0), RankReport(1)], 64, {"devices_per_node": 2, "compute_device": "cpu"})
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    try:
        check_ranks(nodal)
    except NeoError as exc:
        said.append(str(exc))
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    check_ranks(nodal)
    # an MPI launcher says its local size otherwise, and TorchRec reads that too
    del os.environ["LOCAL_WORLD_SIZE"]
    os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"
    single = PlanResult("neo", [TableAssignment("user_id", "table_row_wise", "fused", [0])],
                        [RankReport(0), RankReport(1)], 64, {"devices_per_node": 1, "compute_device": "cpu"})
    check_ranks(single)
    said.append(str(len(plan_model(model, "local", 64).ranks)))  # local: the group's ranks
    # a kernel FBGEMM has no CPU code for failed inside DMP with an AssertionError
    try:
        plan_model(model, "local", 64, kernel={"name": "fused", "optimizer": "adam"})
    except NeoError as exc:
        said.append(str(exc))
    # a plan made before, built for the model; one for another rank count refused
    saved = plan_tables(table_specs(model), {"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    said.append(plan_model(model, "local", 64, plan=saved).torchrec_plan is not None)
    try:
        plan_model(model, "local", 64, plan=plan_tables(
            table_specs(model), {"name": "local", "world_size": 4, "compute_device": "cpu"}, 64))
    except NeoError as exc:
        said.append(str(exc))
    # a plan made before, put to machines of unequal memory (rank 1's gives it a fifth of rank 0's,
    # as a memory_fraction of 0.1 against 0.5 says here): rank 1's part does not fit its machine,
    # and every rank stops (one alone would leave the others waiting). Alike machines take a plan
    # made with another budget (memory_fraction) than theirs, as outside a group.
    roomy = plan_tables(table_specs(model), {"name": "local", "world_size": 2, "compute_device": "cpu",
                                             "memory_fraction": 1.0}, 64)
    roomy.ranks[1].memory["weights"] = 0.7 * roomy.ranks[1].memory_capacity
    said.append(plan_model(model, "local", 64, plan=roomy).torchrec_plan is not None)
    try:
        plan_model(model, {"name": "local", "memory_fraction": 0.5 if rank == 0 else 0.1}, 64, plan=roomy)
    except NeoError as exc:
        said.append(str(exc))
    # precisions TorchRec cannot send over gloo failed inside the first step (a shape error, an
    # assertion); fp16 both ways trains
    for backward, types in (("fp8", ["TW"]), ("int8", ["RW"]), ("fp16", ["TW", "RW"])):
        try:
            plan_model(model, "local", 64, compressor={"name": "fp16", "backward": backward}, sharding_types=types)
            said.append("accepted")
        except NeoError as exc:
            said.append(str(exc))
    # a rank that plans otherwise (a search its time budget cut short) runs rank 0's plan
    neo = resolve("sharding", "neo", {"table_sharding_types": {"user_id": ["TW"], "item_id": ["TW"]}})
    twins = ebc(("user_id", 1000, 16), ("item_id", 1000, 16))
    planned = neo.plan
    own: list[list[int]] = []

    def by_rank(tables: Any, context: Any) -> Any:
        result = planned(tables, context)
        first, second = result.tables
        if rank == 1:
            first.ranks, second.ranks = second.ranks, first.ranks
        own.extend([first.ranks, second.ranks])
        return result

    neo.plan = by_rank  # type: ignore[method-assign]
    result = plan_model(twins, "local", 64, planner=neo)
    ran = [a.ranks for a in result.tables]
    built = [ps.ranks for ps in result.torchrec_plan.plan[""].values()]
    said.append((own, ran, built))
    return said


def test_plan_model_refuses_a_plan_the_process_groups_ranks_cannot_execute_and_runs_rank_0s() -> None:
    # TorchRec failed inside on each: an IndexError, a shard's device, a node group of ranks
    # that LOCAL_WORLD_SIZE does not give
    every = MultiProcessRunner().run(_check_ranks_refusals, 2)
    said = every[0]
    assert said[0].startswith("The plan is for 4 rank(s) (local: 1 node(s) x 4 cpu rank(s);") and \
        said[0].endswith("but the process group has 2: plan for 2 ranks (e.g. topology={'name': 'local', "
                         "'world_size': 2}), or start 4."), said[0]
    assert said[1].startswith("The plan is for cuda ranks (zionex: 1 node(s) x 2 cuda rank(s);") and \
        "but the process group's backend (gloo) runs on cpu: plan for cpu ranks" in said[1], said[1]
    assert said[2].startswith("The plan splits user_id (TWRW) over nodes of 2 rank(s) (topology.devices_per_node), "
                              "but 1 rank(s) share each machine here (LOCAL_WORLD_SIZE)") and "torchrun --nproc_per_node=2" in said[2], said[2]
    assert said[3] == "2"
    assert said[4].startswith("The kernel cannot run on these CPU ranks: optimizer adam: FBGEMM's fused "
                              "kernel has no Adam on CPU"), said[4]
    assert said[5] is True and said[6].startswith("The 'neo' plan is for 4 rank(s)") and "has 2: plan again" in said[6]
    assert said[7] is True  # alike machines
    assert said[8].startswith("Rank 1 has ") and "of device memory on its machine, less than the " in said[8] and \
        "Plan for the smallest machine" in said[8], said[8]
    assert every[1][8] == said[8]  # in both ranks alike
    assert said[9].startswith("compression 'fp16' sends fp8 (forward fp16, backward fp8), which TorchRec cannot run "
                              "over gloo for user_id (TW), item_id (TW). On CPU ranks send fp32, fp16 or bf16 both "
                              "ways (e.g. compressor={'name': 'fp16', 'backward': 'fp16'}); or int8 where every table "
                              "is of a type that carries it ('DP', 'TW', 'CW', 'TWCW')"), said[9]
    assert said[10].startswith("compression 'fp16' sends int8 (forward fp16, backward int8), which TorchRec cannot "
                               "run over gloo for user_id (RW)") and said[10].endswith(
        "or keep to the sharding types that can carry int8: sharding_types=['DP', 'TW', 'CW', 'TWCW']."), said[10]
    assert said[11] == "accepted" and every[1][9:12] == said[9:12]
    (own0, ran0, built0), (own1, ran1, built1) = (rank[-1] for rank in every)
    assert own0 != own1 and sorted(map(tuple, own0)) == [(0,), (1,)], (own0, own1)  # rank 1 planned otherwise
    assert ran0 == ran1 == own0 and built0 == built1 == own0, (ran0, ran1, built0, built1)  # rank 0's, in both


def _no_launch(monkeypatch) -> None:
    for variable in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "MPI_LOCALNRANKS",
                     "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(variable, raising=False)


def test_plan_model_gives_local_the_launchs_ranks_and_machines(monkeypatch, capsys) -> None:
    _no_launch(monkeypatch)
    model = ebc(("user_id", 100_000, 32), ("item_id", 500, 16))
    # outside a launch the topology is as given: nothing to check it against
    assert len(plan_model(model, {"name": "local", "world_size": 4, "compute_device": "cpu"}, 64).ranks) == 4
    monkeypatch.setenv("WORLD_SIZE", "auto")  # no number of ranks: as outside a launch
    assert len(plan_model(model, {"name": "local", "world_size": 4, "compute_device": "cpu"}, 64).ranks) == 4
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    # 'local' given as a mapping without its world size is the launch's ranks too
    assert len(plan_model(model, {"name": "local", "compute_device": "cpu"}, 64).ranks) == 4
    assert "warning" not in capsys.readouterr().err  # one machine of all 4 ranks: 'local' is it
    cpu = {"name": "local", "compute_device": "cpu"}  # (a GPU's memory is not split between ranks)
    one = plan_model(model, cpu, 64)
    assert (one.topology["num_nodes"], one.topology["devices_per_node"]) == (1, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun over 2 machines of 2 ranks: 'local' is them
    two = plan_model(model, cpu, 64)
    assert (two.topology["num_nodes"], two.topology["devices_per_node"]) == (2, 2)
    # each machine's ranks split its memory, not one machine's all 4
    assert two.topology["device_memory"] == pytest.approx(2 * one.topology["device_memory"], rel=1e-6)
    assert "inter_node_bw, the network between the 2 machines, is assumed" in " ".join(two.notes)
    assert "warning" not in capsys.readouterr().err
    # machines the launch does not have: refused, as each machine's memory would be given to another's ranks
    with pytest.raises(ConfigError, match=r"^topology.num_nodes=1 but the launcher started 4 rank\(s\) on 2 machine"):
        plan_model(model, {**cpu, "num_nodes": 1}, 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"^topology.num_nodes=2 but the launcher started 4 rank\(s\) on 1 machine"):
        plan_model(model, {**cpu, "num_nodes": 2}, 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # 3 and 1: machines of unequal ranks, which 'local' is not
    assert len(plan_model(model, "local", 64).ranks) == 4
    assert ("warning: the launch runs 4 ranks, 3 on this machine (WORLD_SIZE=4, LOCAL_WORLD_SIZE=3): topology 'local' "
            "is machines of equal rank counts, so it plans one machine of all 4 ranks") in capsys.readouterr().err
    # 1 here and 2 on the other of 2 machines (torchrun says its machines): not 3 machines of 1, as 1 divides 3
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    uneven = plan_model(model, cpu, 64)
    assert (uneven.topology["num_nodes"], uneven.topology["devices_per_node"]) == (1, 3)
    assert "warning: the launch runs 3 ranks on 2 machines, 1 on this one" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.delenv("GROUP_WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")  # said by rank 0 alone
    plan_model(model, "local", 64)
    assert "warning" not in capsys.readouterr().err


def test_check_ranks_refuses_node_sharding_the_local_size_cannot_give_naming_where_it_was_read(monkeypatch) -> None:
    # TorchRec forms the nodes of grid sharding as of table-row-wise, and reads an MPI
    # launcher's local size where LOCAL_WORLD_SIZE is not set
    from neo_core.api import check_ranks
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    _no_launch(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
    grid = PlanResult("neo", [TableAssignment("user_id", "grid_shard", "fused", [0, 1]),
                              TableAssignment("item_id", "table_wise", "fused", [0])],
                      [RankReport(0), RankReport(1)], 64, {"devices_per_node": 2, "compute_device": "cpu"})
    with pytest.raises(ConfigError, match=r"^The plan splits user_id \(GRID\) over nodes of 2 rank\(s\) .*, but 1 "
                                          r"rank\(s\) share each machine here \(OMPI_COMM_WORLD_LOCAL_SIZE\).*: start "
                                          r"2 rank\(s\) a machine \(torchrun --nproc_per_node=2\)"):
        check_ranks(grid)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    check_ranks(grid)
    # a plan written by hand without its ranks' reports: its rank count is not known, not 0
    check_ranks(PlanResult("neo", [TableAssignment("user_id", "table_wise", "fused", [0])], [], 64,
                           {"compute_device": "cpu"}))


def test_a_saved_plan_that_records_no_kernel_is_checked_with_the_kernel_plan_model_builds(monkeypatch) -> None:
    # the sharders are built with the kernel given here: Adam's fused kernel on CPU ranks failed
    # inside DMP with FBGEMM's AssertionError (one fused table is enough)
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    _no_launch(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = ebc(("user_id", 1000, 16), ("item_id", 500, 16))
    by_hand = PlanResult("neo", [TableAssignment("user_id", "table_wise", "fused", [0]),
                                 TableAssignment("item_id", "data_parallel", "dense", [0, 1])],
                         [RankReport(0), RankReport(1)], 64, {"compute_device": "cpu"})
    assert plan_model(model, "local", 64, plan=by_hand).torchrec_plan is not None
    with pytest.raises(ConfigError, match=r"^The kernel cannot run on these CPU ranks: optimizer adam"):
        plan_model(model, "local", 64, kernel={"name": "fused", "optimizer": "adam"}, plan=by_hand)


def test_check_ranks_without_a_kernel_refuses_adam_on_fused_tables_whatever_the_kernels_registered_name(
        monkeypatch) -> None:
    # a plan's settings name its kernel as registered: a plugin's fused kernel ("fused_clone")
    # with Adam passed check_ranks(result), then failed inside DMP with FBGEMM's AssertionError
    from neo_core.api import check_ranks
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    _no_launch(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = {"kernel": "fused_clone", "optimizer": "adam"}
    fused = PlanResult("neo", [TableAssignment("user_id", "table_wise", "fused", [0])],
                       [RankReport(0), RankReport(1)], 64, {"compute_device": "cpu"}, settings=settings)
    with pytest.raises(ConfigError, match=r"^The kernel cannot run on these CPU ranks: optimizer adam"):
        check_ranks(fused)
    dense = PlanResult("neo", [TableAssignment("user_id", "data_parallel", "dense", [0, 1])],
                       [RankReport(0), RankReport(1)], 64, {"compute_device": "cpu"}, settings=settings)
    check_ranks(dense)  # no fused table: Adam is no matter


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_a_plan_for_another_device_than_the_groups_backend_names_the_backend_to_start(one_rank_group) -> None:
    from neo_core.api import check_ranks
    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    on_cuda = PlanResult("neo", [TableAssignment("user_id", "table_wise", "fused", [0])], [RankReport(0)], 64,
                         {"compute_device": "cuda"})
    with pytest.raises(ConfigError, match=r"^The plan is for cuda ranks .*, but the process group's backend \(gloo\) "
                                          r"runs on cpu: plan for cpu ranks .*, or start the group with nccl\.$"):
        check_ranks(on_cuda)


def test_rank_0_alone_says_which_ranks_planned_otherwise_and_each_runs_rank_0s_plan(one_rank_group, monkeypatch,
                                                                                   capsys) -> None:
    from neo_core import api
    from neo_core.training import module

    model = ebc(("user_id", 1000, 16), ("item_id", 1000, 16))
    neo = resolve("sharding", "neo")
    ctx = make_context({"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    own = neo.plan_module(model, table_specs(model), ctx)
    rank0s = neo.plan_module(model, table_specs(model), ctx)
    for table in rank0s.tables:
        table.sharding_type, table.ranks = "table_wise", [1 - table.ranks[0]]
    rank0s.torchrec_plan = "rank 0's, for rank 0's model"  # what this rank runs is built for its own model
    monkeypatch.setattr(module, "agree_on_plan", lambda plan: (rank0s, [1]))
    ran = api._rank0s_plan(own, neo, model, ctx)
    assert ran is rank0s and [ps.ranks for ps in ran.torchrec_plan.plan[""].values()] == [t.ranks for t in rank0s.tables]
    assert [t.ranks for t in rank0s.tables] != [t.ranks for t in own.tables]
    assert "warning: rank(s) 1 planned otherwise than rank 0" in capsys.readouterr().err
    monkeypatch.setattr(one_rank_group, "get_rank", lambda group=None: 1)
    api._rank0s_plan(own, neo, model, ctx)
    assert "warning" not in capsys.readouterr().err


def test_a_plan_written_by_hand_is_refused_on_what_it_records_of_ranks_nodes_weights_and_tables() -> None:
    import dataclasses

    from neo_core.sharding import PlanResult, RankReport, TableAssignment

    model = ebc(("user_id", 1000, 32), ("item_id", 500, 16))
    neo = resolve("sharding", "neo")
    two = make_context({"name": "local", "world_size": 2, "compute_device": "cpu"}, 64)
    four = make_context({"name": "local", "world_size": 4, "compute_device": "cpu"}, 64)
    placed = [TableAssignment("user_id", "table_wise", "fused", [0]), TableAssignment("item_id", "table_wise", "fused", [1])]
    # no rank reports: the ranks are its topology's nodes times their ranks
    nodes = PlanResult("neo", placed, [], 64, {"num_nodes": 1, "devices_per_node": 4, "compute_device": "cpu"})
    with pytest.raises(PlanningError, match=r"^The 'neo' plan is for 4 rank\(s\) .*but the topology here \(local\) "
                                            r"has 2: plan again"):
        neo.to_torchrec_plan(model, nodes, two)
    # table-column-wise keeps a table's shards within one node, as the plan's nodes were
    within = PlanResult("neo", [TableAssignment("user_id", "table_column_wise", "fused", [0, 1]), placed[1]],
                        [RankReport(r) for r in range(4)], 64,
                        {"num_nodes": 2, "devices_per_node": 2, "compute_device": "cpu"})
    with pytest.raises(PlanningError, match=r"^The 'neo' plan splits tables within nodes of 2 rank\(s\), but the "
                                            r"topology here \(local\) has nodes of 4: plan again"):
        neo.to_torchrec_plan(model, within, four)
    # the bytes per weight its memory figures count
    fp16 = dataclasses.replace(resolve("kernel", "fused"), weight_bytes=2)
    halves = plan_tables(table_specs(model), {"name": "local", "world_size": 2, "compute_device": "cpu"}, 64,
                         kernel=fp16)
    with pytest.raises(PlanningError, match=r"^The 'neo' plan was made for weight_bytes 2, whose memory its figures "
                                            r"count, but the kernel here \(fused\) has weight_bytes 4"):
        neo.to_torchrec_plan(model, halves, two)
    # tables the model lacks: five named, the rest counted
    extra = [TableAssignment(n, "table_wise", "fused", [0]) for n in "abcdefg"]
    more = PlanResult("neo", [*placed, *extra], [RankReport(0), RankReport(1)], 64, {"compute_device": "cpu"})
    with pytest.raises(PlanningError, match=r"^The 'neo' plan places 'a', 'b', 'c', 'd', 'e' and 2 more, which the "
                                            r"model has no table of"):
        neo.to_torchrec_plan(model, more, two)
    # a model whose tables are in no EmbeddingBagCollection (a model plugin's own module): its
    # tables are not known, so not checked, and TorchRec's plan has nothing to shard
    assert neo.to_torchrec_plan(nn.Linear(2, 2), more, two).plan == {}
