"""Ranks agree on one plan: a planner that plans differently per rank is overruled by rank 0."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed.multi_process import MultiProcessRunner


def _agree(rank: int, world_size: int, rank_dependent: bool) -> dict[str, Any]:
    from neo_core.sharding import PlanResult, RankReport, TableAssignment
    from neo_core.training.module import agree_on_plan, plan_digest

    owner = rank if rank_dependent else 0  # the rank-dependent planner puts the table on itself
    plan = PlanResult("mine", [TableAssignment("t", "table_wise", "fused", [owner], [(10, 4)])],
                      [RankReport(rank=r) for r in range(world_size)], 8, {})
    agreed, differ = agree_on_plan(plan)
    return {"ranks": agreed.tables[0].ranks, "differ": differ, "digest": plan_digest(agreed)}


@pytest.mark.slow  # spawns 3 gloo ranks
@pytest.mark.parametrize("rank_dependent", [False, True])
def test_every_rank_runs_rank_zeros_plan(rank_dependent: bool) -> None:
    out = MultiProcessRunner().run(_agree, 3, rank_dependent)
    assert [o["ranks"] for o in out] == [[0], [0], [0]]  # rank 0's plan everywhere
    assert len({o["digest"] for o in out}) == 1
    assert all(o["differ"] == ([1, 2] if rank_dependent else []) for o in out)


GiB = 2**30


def _on_machines(rank: int, world_size: int, capacities: list[float], loads: list[float]) -> list[str | None]:
    """Rank ``rank`` on a machine giving it ``capacities[rank]`` of device memory: its own plan
    says so; rank 0's plan puts each of ``loads`` in turn (and a 15% reserve of rank 0's
    capacity) on each rank. The error each agreement raised, or None."""
    from neo_core.errors import ConfigError
    from neo_core.sharding import PlanResult, RankReport, TableAssignment
    from neo_core.training.module import agree_on_plan

    mine, errors = capacities[rank], []
    for used in loads:
        plan = PlanResult("neo", [TableAssignment("t", "table_wise", "fused", [0], [(10, 4)])],
                          [RankReport(rank=r, memory={"weights": used, "reserve": 0.15 * mine}, memory_capacity=mine)
                           for r in range(world_size)], 8, {})
        try:
            agree_on_plan(plan)
            errors.append(None)
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


@pytest.mark.slow  # spawns 2 gloo ranks
def test_a_plan_for_rank_0s_machine_that_a_smaller_machines_rank_cannot_hold_stops_every_rank() -> None:
    # torchrun over machines of unequal memory: every rank runs rank 0's plan, made for rank 0's
    # machine; rank 1's holds 4 GiB a rank, and 5 GiB of tables there ran out of memory in DMP.
    # What fits the smaller machine with its reserve (3 GiB) runs, in both ranks alike.
    out = MultiProcessRunner().run(_on_machines, 2, [8 * GiB, 4 * GiB], [5 * GiB, 3 * GiB])
    assert out[0] == out[1] == [
        "Rank 1 has 4.00GiB of device memory on its machine, less than the 8.00GiB a rank of rank 0's machine, "
        "and every rank runs rank 0's plan: it puts 5.00GiB on rank 1, where 3.40GiB fit "
        f"with the reserve. Plan for the smallest machine: a topology whose device_memory is {4 * GiB} bytes a "
        "rank, or a lower topology.memory_fraction on every machine.", None]
    # a larger machine than rank 0's: nothing to say
    assert MultiProcessRunner().run(_on_machines, 2, [4 * GiB, 8 * GiB], [3 * GiB]) == [[None], [None]]


def _smallest(rank: int, world_size: int, fractions: list[float]) -> dict[str, Any]:
    """Rank ``rank`` on a machine whose local topology gives it ``fractions[rank]`` of its memory."""
    from neo_core.api import make_context
    from neo_core.training.run import RunParts, on_the_smallest_machine
    from neo_plugins.topology.local import local_topology

    topology = local_topology(world_size=world_size, num_nodes=world_size, compute_device="cpu",
                              memory_fraction=fractions[rank])
    context = make_context(topology, 64)
    parts = RunParts(topology, None, context.kernel, context.cache, context.compressor, None, None, [], context, [])
    planned, note = on_the_smallest_machine(parts)
    return {"mine": topology.device_memory, "device": planned.topology.device_memory,
            "context": planned.context.topology.device_memory, "host": planned.topology.host_memory, "note": note}


@pytest.mark.slow  # spawns 2 gloo ranks
def test_ranks_on_machines_of_unequal_memory_plan_for_the_least() -> None:
    out = MultiProcessRunner().run(_smallest, 2, [0.5, 0.25])
    least = out[1]["mine"]
    assert least < out[0]["mine"]
    assert [(o["device"], o["context"], o["host"]) for o in out] == [(least, least, least)] * 2
    assert out[0]["note"] == out[1]["note"] and out[0]["note"].startswith(
        "The ranks' machines give them unequal memory (device memory ") and \
        "a rank, the least rank 1's machine's; host memory " in out[0]["note"] and \
        out[0]["note"].endswith("): planned for the least, as every rank runs this plan."), out[0]["note"]
    # alike machines, to within a few pages of RAM: the plan is each one's own, and nothing is said
    assert [o["note"] for o in MultiProcessRunner().run(_smallest, 2, [0.5, 0.4999])] == [None, None]


def _threads(rank: int, world_size: int, bound: list[list[int]], start: int) -> dict[str, Any]:
    """Rank ``rank`` bound to the cores ``bound[rank]`` (as a launcher binds it), having taken
    ``start`` threads: the threads it runs with once the ranks compared their cores."""
    import contextlib
    import io
    import os

    import torch

    from neo_core.training.run import ranks_machines, set_threads_by_cores
    from neo_plugins.topology.local import local_topology

    os.sched_setaffinity(0, bound[rank])
    torch.set_num_threads(start)
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        set_threads_by_cores(ranks_machines(local_topology(world_size=world_size, compute_device="cpu")))
    return {"threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "said": said.getvalue()}


@pytest.mark.slow  # spawns 2 gloo ranks
def test_ranks_sharing_cores_take_threads_of_their_share_and_rank_0_says_so() -> None:
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    # two launches of one rank each on one host (two torchrun agents): each took every core
    out = MultiProcessRunner().run(_threads, 2, [cores, cores], len(cores))
    assert [o["threads"] for o in out] == [len(cores) // 2] * 2
    assert [o["omp"] for o in out] == [str(len(cores) // 2)] * 2
    assert out[0]["said"].startswith(f"note: torch threads set by the cores the ranks may run on: 2 ranks (rank 0: "
                                     f"{len(cores)} -> {len(cores) // 2}), {len(cores)} core(s) shared by 2 rank(s)")
    assert out[1]["said"] == ""  # rank 0 says it
    # bound to cores of their own: each rank its own, as it took them; nothing to say
    out = MultiProcessRunner().run(_threads, 2, [cores[:1], cores[1:2]], 1)
    assert [(o["threads"], o["said"]) for o in out] == [(1, ""), (1, "")]


def _on_one_host(rank: int, world_size: int, local: int, device: str) -> dict[str, Any]:
    """Rank ``rank`` of a launch of ``local`` ranks a machine, all on this host (torchrun
    started more than once on it): the memory it plans with."""
    import os

    from neo_core.training.run import least_memory
    from neo_plugins.topology.local import local_topology

    os.environ["LOCAL_WORLD_SIZE"] = str(local)
    topology = local_topology(world_size=world_size, num_nodes=world_size // local, compute_device="cpu")
    if device == "cuda":  # a GPU machine's topology: its devices' memory is each rank's own
        topology = topology.replace(compute_device="cuda", memory_fix=topology.memory_fix)
    planned, note = least_memory(topology)
    return {"mine": (topology.device_memory, topology.host_memory),
            "planned": (planned.device_memory, planned.host_memory), "note": note}


@pytest.mark.slow  # spawns 2 gloo ranks
def test_launches_sharing_a_host_plan_for_their_share_of_its_memory() -> None:
    import socket

    from neo_core.sharding import _bytes

    # two torchrun agents of one rank each on one host: each took the host's memory as its
    # machine's, so the plan could put twice the host's memory on it
    out = MultiProcessRunner().run(_on_one_host, 2, 1, "cpu")
    (device, host) = out[0]["mine"]
    assert [o["planned"] for o in out] == [(device // 2, host // 2)] * 2
    host_name = socket.gethostname()
    assert out[0]["note"] == out[1]["note"] == (
        f"Ranks share a host's memory (2 ranks on {host_name}, though the launch says 1 a machine: memory "
        f"{_bytes(device // 2, 3)} a rank, not {_bytes(device, 3)}): planned for the least, as every rank runs this "
        "plan."), out[0]["note"]
    # CUDA ranks share the host's memory, not their devices'
    out = MultiProcessRunner().run(_on_one_host, 2, 1, "cuda")
    (device, host) = out[0]["mine"]
    assert [o["planned"] for o in out] == [(device, host // 2)] * 2
    assert f"though the launch says 1 a machine: host memory {_bytes(host // 2, 3)} a rank" in out[0]["note"]
    # one launch of 2 ranks on this host: nothing shared beyond the launch's own ranks
    assert [o["note"] for o in MultiProcessRunner().run(_on_one_host, 2, 2, "cpu")] == [None, None]


def _topology(name: str, device: str = "cpu") -> Any:
    from neo_core.topology import Topology

    return Topology(name=name, num_nodes=2, devices_per_node=1, compute_device=device, device_memory=8 * 2**30,
                    host_memory=64 * 2**30, device_memory_bw=1e10, host_memory_bw=1e10, host_to_device_bw=1e10,
                    intra_node_bw=1e9, inter_node_bw=1e9)


def test_the_least_memory_of_the_ranks_machines_is_planned_for_from_what_they_said(monkeypatch) -> None:
    # every rank's (device memory, host memory, host, cores, threads), as ranks_machines gathers
    # them: the same figures as the slow cases above, without spawning ranks
    from neo_core.sharding import _bytes
    from neo_core.training.run import least_memory

    GiB = 2**30
    monkeypatch.delenv("NEO_SPAWNED", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    topology = _topology("cluster")
    every = [(8 * GiB, 64 * GiB, "a", None, 1), (4 * GiB, 96 * GiB, "b", None, 1), (8 * GiB, 32 * GiB, "c", None, 1)]
    planned, note = least_memory(topology, every)
    assert (planned.device_memory, planned.host_memory) == (4 * GiB, 32 * GiB)
    assert note == (f"The ranks' machines give them unequal memory (device memory {_bytes(4 * GiB, 3)} to "
                    f"{_bytes(8 * GiB, 3)} a rank, the least rank 1's machine's; host memory {_bytes(32 * GiB, 3)} to "
                    f"{_bytes(96 * GiB, 3)} a rank, the least rank 2's machine's): planned for the least, as every "
                    "rank runs this plan.")
    # alike to within 1% (a few pages of RAM): as it is, nothing said
    alike = [(8 * GiB, 64 * GiB, "a", None, 1), (int(8 * GiB * 0.995), 64 * GiB, "b", None, 1)]
    assert least_memory(topology, alike) == (topology, None)


def test_launches_sharing_a_host_plan_for_their_share_from_what_the_ranks_said(monkeypatch) -> None:
    from neo_core.sharding import _bytes
    from neo_core.training.run import least_memory

    GiB = 2**30
    monkeypatch.delenv("NEO_SPAWNED", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    # two launches of one rank on host h, one on g: h's ranks take half its memory each, less
    # than g's rank, and both are said
    every = [(8 * GiB, 64 * GiB, "h", None, 1), (8 * GiB, 64 * GiB, "h", None, 1), (8 * GiB, 64 * GiB, "g", None, 1)]
    planned, note = least_memory(_topology("local"), every)
    assert (planned.device_memory, planned.host_memory) == (4 * GiB, 32 * GiB)
    assert note == (f"Ranks share a host's memory (2 ranks on h, though the launch says 1 a machine: memory "
                    f"{_bytes(4 * GiB, 3)} a rank, not {_bytes(8 * GiB, 3)}); the ranks' machines give them unequal "
                    f"memory (device memory {_bytes(4 * GiB, 3)} to {_bytes(8 * GiB, 3)} a rank, the least rank 0's "
                    f"machine's; host memory {_bytes(32 * GiB, 3)} to {_bytes(64 * GiB, 3)} a rank, the least rank 0's "
                    "machine's): planned for the least, as every rank runs this plan.")
    # one host of two launches: shared alike, so only the sharing is said
    assert least_memory(_topology("local"), every[:2])[1] == (
        f"Ranks share a host's memory (2 ranks on h, though the launch says 1 a machine: memory {_bytes(4 * GiB, 3)} "
        f"a rank, not {_bytes(8 * GiB, 3)}): planned for the least, as every rank runs this plan.")
    # CUDA ranks share the host's memory, not their devices'
    planned, note = least_memory(_topology("local", "cuda"), every)
    assert (planned.device_memory, planned.host_memory) == (8 * GiB, 32 * GiB)
    assert f"though the launch says 1 a machine: host memory {_bytes(32 * GiB, 3)} a rank, not" in note
    # as many ranks on each host as the launch says a machine; a cluster's own figures; the
    # recipe's spawned ranks (which share the machine already): nothing shared
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert least_memory(_topology("local"), every)[1] is None
    # (a host of fewer ranks than a machine's keeps its memory: 3 ranks on h share 2 machines' worth)
    note = least_memory(_topology("local"), [*every, every[0]])[1]
    assert f"host memory {_bytes(64 * GiB * 2 / 3, 3)} to {_bytes(64 * GiB, 3)} a rank" in note, note
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert least_memory(_topology("cluster"), every)[1] is None
    monkeypatch.setenv("NEO_SPAWNED", "1")
    assert least_memory(_topology("local"), every)[1] is None
