"""Running a training job: build the plugins, plan, start the ranks, collect the results.

``train(cfg)`` is the public entry point (the Hydra recipe calls it). It validates the
config, instantiates every plugin, plans once in this process so that configuration and
capacity errors surface as one sentence before any rank starts, writes ``plan.json``, then
runs the ranks:

- under torchrun (``RANK``/``WORLD_SIZE`` set by the launcher): this process is one rank;
- otherwise: it starts ``world_size`` local ranks itself with ``torch.multiprocessing``
  (a fresh free port per job), which keeps Hydra multirun sweeps working.

Every rank builds a Lightning ``Trainer`` with :class:`NeoStrategy` and a cluster environment
that says processes are created externally.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from neo_core.cache import CachePolicy
from neo_core.checks import as_whole
from neo_core.compression import Compressor
from neo_core.config import RunConfig, instantiate, plugin_default_node, validate
from neo_core.data import DataSource
from neo_core.errors import (
    CheckpointError,
    ConfigError,
    PlanningError,
    PluginError,
    RankLost,
    RunInterrupted,
    TrainingError,
)
from neo_core.kernels import EmbeddingKernel
from neo_core.models import ModelBuilder
from neo_core.plugins import get_plugins
from neo_core.sharding import (
    Planner,
    PlanningContext,
    PlanResult,
    ShardingType,
    TableSpec,
    check_plan,
    checked_sharders,
    sent_precision,
)
from neo_core.topology import Topology
from neo_core.training import dist_formed, started_as_rank
from neo_core.training.console import discard_transcript, replace_earlier_transcript

log = logging.getLogger("neo")


@dataclass
class RunParts:
    """The instantiated plugins of one run."""

    topology: Topology
    planner: Planner
    kernel: EmbeddingKernel
    cache: CachePolicy
    compressor: Compressor
    model_builder: ModelBuilder
    data: DataSource
    tables: list[TableSpec]
    context: PlanningContext
    notes: list[str]


@dataclass(frozen=True)
class Launch:
    """Where the ranks come from and what they run on."""

    world_size: int
    device_type: str  # "cpu" | "cuda"
    backend: str  # "gloo" | "nccl"
    external: bool  # True when torchrun (or another launcher) started this process as a rank
    plan_digest: str | None = None  # the plan printed and saved before the ranks start (plan_digest)


def resolve_launch(run: RunConfig) -> Launch:
    """World size, device and backend for this run on this machine."""
    external = started_as_rank()
    cuda = torch.cuda.is_available()
    if run.topology.get("name") == "local" and run.topology.get("compute_device"):
        cuda = run.topology["compute_device"] == "cuda"
    device_type = "cuda" if cuda else "cpu"
    nodes = local_nodes(run.topology)
    if external:
        world = int(os.environ["WORLD_SIZE"])
        if run.trainer.world_size not in (None, world):
            raise ConfigError(
                f"trainer.world_size={run.trainer.world_size} but the launcher started {world} ranks; "
                "drop trainer.world_size or make them equal."
            )
        local_ranks = run.topology.get("world_size") if run.topology.get("name") == "local" else None
        if local_ranks not in (None, world):  # it splits this machine's memory between that many
            raise ConfigError(
                f"topology.world_size={local_ranks} but the launcher started {world} ranks; the local topology "
                "splits the machine's memory between its ranks, so drop topology.world_size or make them equal."
            )
        if uneven := unequal_machines(world):  # Lightning forms its nodes of equal size, and failed in every rank
            raise ConfigError(
                f"The launch runs {uneven}: the recipes run as many ranks on every machine; start each machine "
                "with the same torchrun --nproc-per-node."
            )
        if problem := launch_nodes_problem(nodes, world):
            raise ConfigError(problem)
    else:
        if nodes and nodes > 1 and device_type == "cuda":
            raise ConfigError(
                f"topology.num_nodes={nodes} on this machine's CUDA devices: machines are emulated on one with CPU "
                "ranks only (+topology.compute_device=cpu); CUDA ranks keep the machine's layout. Launch the machines "
                f"with torchrun on each, or dry-run them: recipes/plan.py topology.num_nodes={nodes}."
            )
        if run.trainer.world_size is not None:
            world = run.trainer.world_size
            if nodes and world % nodes:  # said of the key given, not of the topology's copy of it
                raise ConfigError(
                    f"trainer.world_size={world} rank(s) do not split evenly over topology.num_nodes={nodes} "
                    f"machines: give a multiple of {nodes}."
                )
        elif run.topology.get("name") == "local" and run.topology.get("world_size"):
            world = int(run.topology["world_size"])
        else:
            world = (torch.cuda.device_count() if cuda else 2) * (nodes or 1)  # that many a machine, emulated here
    if device_type == "cuda" and not external and world > torch.cuda.device_count():
        raise ConfigError(
            f"{world} ranks requested but only {torch.cuda.device_count()} CUDA device(s) are visible; "
            "set trainer.world_size to at most that."
        )
    backend = run.trainer.backend or ("nccl" if device_type == "cuda" else "gloo")
    if backend == "nccl" and device_type == "cpu":
        raise ConfigError("trainer.backend=nccl needs CUDA devices; on CPU ranks use trainer.backend=gloo (or null).")
    problem = cpu_kernel_problem(run.kernel.get("name"), run.kernel.get("optimizer", "")) if device_type == "cpu" else None
    if problem:
        raise ConfigError(problem)
    return Launch(world, device_type, backend, external)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system says it (a
    container or ``taskset`` given 2 of a host's 64 cores: ``os.cpu_count()`` says 64, and 32
    threads per rank would wait on 2 cores), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this system (macOS, Windows)
        return os.cpu_count() or 1


def cpu_kernel_problem(kernel: Any, optimizer: Any) -> str | None:
    """Why the kernel cannot train on CPU ranks, with the fix; None where it can
    (``recipes/plan.py`` says it as a note on CPU topologies). ``kernel``: an
    :class:`EmbeddingKernel` (read by its TorchRec compute kernel, whatever a plugin names it),
    or before one is built, the kernel's name."""
    fused = kernel.compute_kernel == "fused" if hasattr(kernel, "compute_kernel") else kernel == "fused"
    if fused and str(getattr(optimizer, "value", optimizer)).lower() == "adam":
        return ("kernel.optimizer=adam: FBGEMM's fused kernel has no Adam on CPU; use rowwise_adagrad, "
                "adagrad or sgd, or kernel=dense.")
    return None


def build_parts(run: RunConfig, launch: Launch) -> RunParts:
    """Instantiate every plugin of ``run`` and derive the planning context."""
    plugins = get_plugins()
    notes: list[str] = []
    topo_node = dict(run.topology)
    if topo_node["name"] == "local":
        topo_node.setdefault("world_size", launch.world_size)
        if topo_node["world_size"] is None:
            topo_node["world_size"] = launch.world_size
        topo_node.setdefault("compute_device", launch.device_type)
        if topo_node["compute_device"] is None:
            topo_node["compute_device"] = launch.device_type
        if topo_node.get("num_nodes") is None and launch.external and (machines := launch_machines(launch.world_size)):
            topo_node["num_nodes"] = machines  # torchrun over several machines: a node each
    topology: Topology = instantiate("topology", topo_node, plugins)
    if topology.name == "local" and topology.num_nodes > 1 and not launch.external and launch.device_type == "cpu":
        # machines emulated on this one: all their ranks share its memory, not a machine's worth each
        share = topology.devices_per_node / launch.world_size
        topology = topology.replace(
            device_memory=int(topology.device_memory * share), host_memory=int(topology.host_memory * share),
            memory_fix=topology.memory_fix, config_limits=topology.config_limits,
            config_keys={k: (key, unit * share) for k, (key, unit) in topology.config_keys.items()},
        )
        notes.append(
            f"Emulating {topology.num_nodes} machines of {topology.devices_per_node} rank(s) on this one: its "
            f"{launch.world_size} ranks share its memory ({topology.device_memory / 2**30:.2f} GiB each), and "
            "talk through its loopback where the plan prices the network between machines."
        )
    if topology.world_size != launch.world_size or topology.compute_device != launch.device_type:
        nodes = f"{topology.num_nodes} node{'s' if topology.num_nodes != 1 else ''}"
        described = f"{topology.name} ({nodes} x {topology.devices_per_node} {topology.compute_device})"
        topology = topology.emulated_on(launch.world_size, launch.device_type)
        notes.append(
            f"Emulating {described} on {launch.world_size} local {launch.device_type} rank(s): planning "
            f"with its per-device memory and bandwidth model as {topology.num_nodes} node(s) x "
            f"{topology.devices_per_node} rank(s)."
        )
    planner: Planner = instantiate("sharding", run.sharding, plugins)
    kernel: EmbeddingKernel = instantiate("kernel", run.kernel, plugins)
    if launch.device_type == "cpu" and (problem := cpu_kernel_problem(kernel, kernel.optimizer)):
        raise ConfigError(problem)  # a plugin's fused kernel, which the launch's check knew only by its name
    cache: CachePolicy = instantiate("cache", run.cache, plugins)
    compressor: Compressor = instantiate("compression", run.compression, plugins)
    model_builder: ModelBuilder = instantiate("model", run.model, plugins)
    data: DataSource = instantiate("data", run.data, plugins)
    dim = int(run.model.get("embedding_dim", model_builder_default_dim(model_builder)))
    tables = list(data.tables(dim))
    model_builder.check(tables, data.num_dense)
    context = PlanningContext(
        topology=topology,
        batch_size_per_rank=run.trainer.batch_size,
        kernel=kernel,
        compressor=compressor,
        cache=cache,
    )
    return RunParts(topology, planner, kernel, cache, compressor, model_builder, data, tables, context, notes)


def model_builder_default_dim(builder: ModelBuilder) -> int:
    dim = getattr(builder, "embedding_dim", None)
    if dim is None:
        raise ConfigError(f"model {builder.name!r} does not say its embedding_dim; set model.embedding_dim.")
    return int(dim)


# The plan the starting process made before the ranks started (under torchrun and for one rank
# in this process, this process; spawned ranks are given it), by its digest: a rank runs it rather
# than planning the same model again (the planner ran once more per rank; TorchRec's planner takes
# seconds to minutes on large models)
_PLANNED_HERE: dict[str, PlanResult] = {}


def plan_run(parts: RunParts) -> PlanResult:
    """Plan the run's model on the meta device (no table memory is allocated)."""
    from neo_core.training.module import plan_digest

    result = meta_plan(parts)
    _PLANNED_HERE.clear()
    _PLANNED_HERE[plan_digest(result)] = replace(result, notes=list(result.notes))  # as a rank's own plan
    result.notes = [*parts.notes, *result.notes]
    return result


def rank_plan(parts: RunParts, model: Any, digest: str | None, threads_given: bool = True,
              launch: Launch | None = None) -> PlanResult:
    """A rank's plan: the one this process made before the rank started, where it made the
    plan the run printed (``digest``), else the rank's own (``checked_plan``; with ``launch``,
    checked as the printed one was before the ranks started: a plan made anew for a smaller
    machine may shard tables otherwise, e.g. row-wise, which int8 over gloo cannot run). Where
    ``threads_given`` is false (``trainer.threads_per_rank`` unset), the rank's threads are set
    anew from the cores the ranks share (:func:`threads_by_cores`)."""
    every = ranks_machines(parts.topology)  # one gather for the checks below
    parts, unequal = on_the_smallest_machine(parts, every)
    hosts = [e[2] for e in every] if every is not None else None
    if every is not None and not threads_given:
        set_threads_by_cores(every)
    if started_as_rank() and (crowded := ranks_sharing_a_host(hosts)) and dist_rank() == 0:
        print(f"warning: {crowded}", file=sys.stderr, flush=True)
    made = _PLANNED_HERE.pop(digest, None) if digest is not None and not unequal else None
    if made is not None:
        return made
    result = checked_plan(parts, model)
    if launch is not None and dist_rank() == 0:  # every rank runs rank 0's plan: another rank's is not run
        check_compression_on_gloo(result, launch, parts.compressor, parts.planner)
        check_node_layout(result, launch, parts.topology)
    if unequal:
        result.notes = [unequal, *result.notes]
    return result


UNEQUAL_MACHINES = "The ranks' machines give them unequal memory"
SHARED_HOST = "Ranks share a host's memory"
LEAST_MEMORY = (UNEQUAL_MACHINES, SHARED_HOST)  # the notes of a plan made for less memory than rank 0's topology
SAME_MEMORY = 0.01  # machines whose memory a rank differs by less than this share are alike


def ranks_machines(topology: Topology) -> list[tuple[int, int, str, tuple[int, ...] | None, int]] | None:
    """Every rank's device and host memory (as its machine's ``topology`` gives them), host
    name, the cores it may run on (None where the system does not say) and its torch threads,
    by rank; None outside a formed process group of two or more ranks. Collective."""
    import torch.distributed as dist

    if not dist_formed() or dist.get_world_size() == 1:
        return None
    try:
        cores: tuple[int, ...] | None = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this system (macOS, Windows)
        cores = None
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, (topology.device_memory, topology.host_memory, socket.gethostname(), cores,
                                   torch.get_num_threads()))
    return every


def dist_rank() -> int:
    """This process's rank in its formed process group (0 outside one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist_formed() else 0


def threads_by_cores(every: list[tuple[Any, ...]]) -> list[int]:
    """Each rank's torch threads: the cores it may run on over the ranks of its host that may
    run on any of them (:func:`ranks_machines`' ``every``). Each rank took its cores over its
    machine's ranks (``LOCAL_WORLD_SIZE``) before the ranks could see each other: too few where
    a launcher binds each rank to cores of its own (``srun --cpu-bind``, ``torchrun
    --numa-binding``: 16 cores a rank gave 2 threads of 8 ranks), too many where several
    launches share a host (two torchrun agents of one rank each took both of 2 cores, 8.5x
    slower). A rank whose cores are unknown keeps its threads."""
    return [max(1, len(e[3]) // n) if e[3] else e[4] for e, n in zip(every, _core_sharers(every))]


def _by_host(hosts: Sequence[str]) -> dict[str, list[int]]:
    """The ranks on each host, from every rank's host name (one pass)."""
    on: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        on.setdefault(host, []).append(rank)
    return on


def _core_sharers(every: list[tuple[Any, ...]]) -> list[int]:
    """For each rank (:func:`ranks_machines`' ``every``), the ranks of its host, itself too, that
    may run on any of its cores; a rank whose cores are unknown shares every core of its host.
    Compared within a host only: every pair of a large launch's ranks was thousands of ranks'
    cores each."""
    on = _by_host([e[2] for e in every])
    sharers = []
    for e in every:
        mine = set(e[3] or ())
        sharers.append(sum(1 for o in on[e[2]] if not every[o][3] or mine.intersection(every[o][3])))
    return sharers


def set_threads_by_cores(every: list[tuple[Any, ...]]) -> int:
    """Set this rank's torch threads by :func:`threads_by_cores` (rank 0 says what changed, in
    every rank); the threads set."""
    threads = threads_by_cores(every)
    mine = threads[dist_rank()]
    if mine != torch.get_num_threads():
        torch.set_num_threads(mine)
        os.environ["OMP_NUM_THREADS"] = str(mine)
    if dist_rank() == 0 and (said := threads_note(every, threads)):
        print(f"note: {said}", file=sys.stderr, flush=True)
    return mine


def threads_note(every: list[tuple[Any, ...]], threads: list[int]) -> str | None:
    """What :func:`threads_by_cores` changed, for rank 0 to say; None where nothing."""
    changed = [r for r, (e, t) in enumerate(zip(every, threads)) if e[4] != t]
    if not changed:
        return None
    r = changed[0]
    host, cores, sharing = every[r][2], every[r][3] or (), _core_sharers(every)[r]
    whose = f"rank {r}:" if len(changed) == 1 else f"{len(changed)} ranks (rank {r}:"
    return (f"torch threads set by the cores the ranks may run on: {whose} {every[r][4]} -> {threads[r]}"
            f"{')' if len(changed) > 1 else ''}, {len(cores)} core(s) shared by {sharing} rank(s) on {host} "
            "(trainer.threads_per_rank sets them).")


def ranks_sharing_a_host(hosts: list[str] | None) -> str | None:
    """Where more of a launch's ranks run on one host than its ranks a machine
    (``LOCAL_WORLD_SIZE``: several torchrun agents started on one host), what that costs and the
    fix; else None. The plan gives each machine of the launch a machine's memory, and without
    :func:`threads_by_cores` each rank took the host's cores over its machine's ranks as its
    threads (two agents of one rank each ran 2 threads a rank on 2 cores, 8x slower).
    ``hosts``: every rank's host name (:func:`ranks_machines`); None outside a group of ranks."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or not hosts:
        return None
    host, ranks = max(_by_host(hosts).items(), key=lambda item: (len(item[1]), item[0]))
    if len(ranks) <= int(local):
        return None
    return (f"ranks {', '.join(map(str, ranks[:8]))}{' ...' if len(ranks) > 8 else ''} run on one host ({host}), though "
            f"the launch says {local} a machine (LOCAL_WORLD_SIZE): they share its cores and its memory, where the "
            "plan gives each machine a machine's (torchrun started more than once on one host?); start torchrun "
            "once a machine, or emulate machines on this one with recipes/train.py +topology.num_nodes=N.")


def on_the_smallest_machine(parts: RunParts, every: list[tuple[Any, ...]] | None = None) -> tuple[RunParts, str | None]:
    """``parts`` planning for the least memory of the ranks' machines (:func:`least_memory`;
    ``every``: :func:`ranks_machines`, where gathered already), with its note; else ``parts``
    as they are, and None."""
    topology, note = least_memory(parts.topology, every)
    if note is None:
        return parts, None
    return replace(parts, topology=topology, context=replace(parts.context, topology=topology)), note


def least_memory(topology: Topology, every: list[tuple[Any, ...]] | None = None) -> tuple[Topology, str | None]:
    """``topology`` with the least device and host memory any rank's machine gives it, and a
    note saying so, where the ranks' machines differ (machines of a torchrun launch with more
    or less RAM); else ``topology`` as it is, and None. Every rank runs rank 0's plan: made for
    rank 0's machine, it ran out of memory on a smaller one. ``every``: :func:`ranks_machines`,
    where gathered already; else collective: in every rank of a formed process group (nothing
    outside one)."""
    from neo_core.sharding import _bytes

    if every is None and (every := ranks_machines(topology)) is None:
        return topology, None
    if topology.name == "local" and "NEO_SPAWNED" not in os.environ:  # the recipe's emulated nodes share already
        every, shared = _host_shares(every, topology.compute_device == "cpu")
    else:
        shared = None
    least = [min(e[at] for e in every) for at in (0, 1)]  # device, host
    said = []
    for kind, at in (("device memory", 0), ("host memory", 1)):
        most = max(e[at] for e in every)
        if most > least[at] * (1 + SAME_MEMORY):  # "alike" machines differ by a few pages of RAM
            rank = next(r for r, e in enumerate(every) if e[at] == least[at])
            said.append(f"{kind} {_bytes(least[at], 3)} to {_bytes(most, 3)} a rank, the least rank {rank}'s machine's")
    if not said and not shared:
        return topology, None
    device, host = least
    why = [f"{SHARED_HOST} ({shared})"] if shared else []
    if said:
        why.append(f"{UNEQUAL_MACHINES if not why else UNEQUAL_MACHINES.lower()} ({'; '.join(said)})")
    note = f"{'; '.join(why)}: planned for the least, as every rank runs this plan."
    return topology.replace(device_memory=int(device), host_memory=int(host), memory_fix=topology.memory_fix), note


def _host_shares(every: list[tuple[Any, ...]], cpu: bool) -> tuple[list[tuple[Any, ...]], str | None]:
    """``every`` (:func:`ranks_machines`) with each rank's memory its share of its host's, where
    more ranks run on the host than the launch's ranks a machine (``LOCAL_WORLD_SIZE``: torchrun
    started more than once on one host), and what that changed; else as it is, and None. Each
    launch's ranks took the host's memory as their machine's (the ``local`` topology), so
    together twice the host's where two launches share it. CUDA ranks share the host's memory,
    not their devices'."""
    from neo_core.sharding import _bytes

    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or int(local) < 1:
        return every, None
    on_host = {h: len(ranks) for h, ranks in _by_host([e[2] for e in every]).items()}
    crowded = {h: n for h, n in on_host.items() if n > int(local)}
    if not crowded:
        return every, None
    shared = [(e[0] * (int(local) / on_host[e[2]] if cpu and e[2] in crowded else 1),
               e[1] * (int(local) / on_host[e[2]] if e[2] in crowded else 1), *e[2:]) for e in every]
    host, n = max(crowded.items(), key=lambda item: (item[1], item[0]))
    rank = next(r for r, e in enumerate(every) if e[2] == host)
    kinds = "memory" if cpu else "host memory"
    return shared, (f"{n} ranks on {host}, though the launch says {local} a machine: {kinds} "
                    f"{_bytes(shared[rank][0 if cpu else 1], 3)} a rank, not {_bytes(every[rank][0 if cpu else 1], 3)}")


@contextlib.contextmanager
def quiet_torchrec() -> Iterator[None]:
    """TorchRec's planner logs every step of its work at INFO (hundreds of lines with
    ``sharding=torchrec``): within this, warnings and worse only."""
    torchrec_log = logging.getLogger("torchrec")
    level = torchrec_log.level
    torchrec_log.setLevel(max(torchrec_log.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        torchrec_log.setLevel(level)


def check_job_plan(parts: RunParts, launch: Launch) -> None:
    """A sweep's check of one job before any starts (``recipes/train.py::check_job``), where only
    the job's plan can tell: a compression that sends a precision gloo cannot carry for some
    sharding types (fp8, int8) fails the job where its plan gives a table such a type. The job's
    plan is made here as the job will make it. Other jobs are not planned ahead (a sweep's
    planning would double): a plan that does not fit still fails its own job alone."""
    if launch.backend != "gloo" or launch.world_size < 2:
        return
    if not {parts.compressor.forward_precision, parts.compressor.backward_precision} & set(_GLOO_FAILS):
        return
    try:
        with quiet_torchrec():
            plan = meta_plan(parts)
    except PlanningError:
        return  # tables that do not fit: the job fails at its turn, alone, as any job's plan does
    check_compression_on_gloo(plan, launch, parts.compressor, parts.planner)


def meta_plan(parts: RunParts) -> PlanResult:
    """The run's model built on the meta device (no table memory) and planned (:func:`checked_plan`)."""
    return checked_plan(parts, parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta"))


def checked_plan(parts: RunParts, model: Any) -> PlanResult:
    """The run's planner on ``model``, its result checked before any rank builds it."""
    result = parts.planner.plan_module(model, parts.tables, parts.context)
    name = getattr(parts.planner, "name", type(parts.planner).__name__)
    return check_plan(result, parts.tables, parts.topology.world_size, name, parts.context)


def _available_memory() -> float | None:
    """Bytes of memory this machine can still give (MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# Sharding types whose collectives TorchRec cannot run over gloo in a precision (TorchRec
# 1.8.0 on CPU, 2 ranks): fp8 fails in the all-to-all of pooled embeddings (measured with TW
# and CW: "Tensor 'input' must have 2 dimension(s)"), int8 in the reduce-scatter / all-gather
# of row-wise sharding (measured with RW: "Unexpected `None`"); TWCW shares CW's all-to-all,
# TWRW and GRID run both collectives. fp8 with RW or DP and int8 with TW or CW train.
_GLOO_FAILS = {
    "fp8": ("table_wise", "column_wise", "table_column_wise", "table_row_wise", "grid_shard"),
    "int8": ("row_wise", "table_row_wise", "grid_shard"),
}


def _some_tables(tables: list[Any], shown: int = 5) -> str:
    """``a (TW), b (RW) and 3 more``: the first tables of a list with their sharding types."""
    named = ", ".join(f"{t.name} ({ShardingType(t.sharding_type).short})" for t in tables[:shown])
    return named + (f" and {len(tables) - shown} more" if len(tables) > shown else "")


def check_node_layout(plan: PlanResult, launch: Launch, topology: Topology) -> None:
    """Refuse, before any rank starts, node-local sharding the ranks' layout cannot give.

    TorchRec forms the node groups of table-row-wise and grid sharding from
    ``LOCAL_WORLD_SIZE``: spawned CPU ranks are told their planned node (``_emulate_nodes``),
    but ranks launched by torchrun, and CUDA ranks, which choose their device by local rank,
    keep the machine's layout; a plan of other nodes fails inside TorchRec in every rank.
    """
    per_node = topology.devices_per_node
    if not node_local_tables(plan):
        return
    if launch.external:
        local, source = torchrec_local_size(launch.world_size)
        fix = f"launch {per_node} rank(s) per machine (torchrun --nproc_per_node={per_node})"
    elif launch.device_type == "cuda":
        local, source = launch.world_size, "LOCAL_WORLD_SIZE"
        fix = f"plan for this machine's layout (topology.devices_per_node={local})"
    else:
        return
    if problem := node_size_problem(plan, per_node, local, source, fix,
                                    "allow other types (sharding.sharding_types without TWRW and GRID)"):
        raise ConfigError(problem)


def torchrec_local_size(world: int) -> tuple[int, str]:
    """The ranks per machine from which TorchRec forms the nodes of table-row-wise and grid
    sharding, as it reads them (``LOCAL_WORLD_SIZE``, or an MPI launcher's variable; else 8,
    or the world where 8 does not divide it), and where that came from, for messages. A launch
    that sets none of these was taken as one machine of every rank, where TorchRec takes 8."""
    from torchrec.distributed.comm import get_local_size

    said = next((v for v in ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "MV2_COMM_WORLD_LOCAL_SIZE") if os.environ.get(v)), None)
    return get_local_size(world), said or (
        "TorchRec's default where no LOCAL_WORLD_SIZE is set: 8, or the world where 8 does not divide it")


def local_nodes(topology: Any) -> int | None:
    """The ``local`` topology's ``num_nodes`` setting as a whole number, None where unset (or
    another topology); a value that is none is refused, naming it."""
    if topology.get("name") != "local" or topology.get("num_nodes") is None:
        return None
    nodes = as_whole(topology["num_nodes"])
    if nodes is None or nodes < 1:
        raise ConfigError(f"topology.num_nodes must be a whole number of machines, at least 1; got "
                          f"{topology['num_nodes']!r}.")
    return nodes


def launch_nodes_problem(nodes: int | None, world: int) -> str | None:
    """Why the ``local`` topology's ``num_nodes`` (None: unset) cannot be the machines a launch
    of ``world`` ranks runs on, with the fix; None where it can, or where the launcher does not
    say its ranks per machine (``LOCAL_WORLD_SIZE``: then the setting is taken as given)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if nodes is None or not local.isdigit() or not 0 < int(local) <= world:
        return None
    machines = launch_machines(world) or (1 if int(local) == world else None)
    said = f"(WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local})"
    if machines is None:
        return (f"topology.num_nodes={nodes}, but the launch runs {unequal_machines(world) or said}, and the "
                "local topology is machines of equal rank counts: launch as many ranks on each machine "
                "(torchrun --nproc-per-node), or drop topology.num_nodes.")
    if nodes != machines:
        return (f"topology.num_nodes={nodes} but the launcher started {world} rank(s) on {machines} machine(s) "
                f"{said}: the local topology is the launch's machines, so drop topology.num_nodes or make them equal.")
    return None


def launch_machines(world: int) -> int | None:
    """The machines a launch's ``world`` ranks run on, where the launcher says its ranks per
    machine (torchrun's ``LOCAL_WORLD_SIZE``) and that is fewer and divides them; None for one
    machine, or a layout the ``local`` topology cannot give (machines of unequal rank counts,
    :func:`unequal_machines`)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or not 0 < int(local) < world or unequal_machines(world):
        return None
    return world // int(local)


def unequal_machines(world: int) -> str | None:
    """How a launch's ``world`` ranks lie on machines that run unequal numbers of them
    (``torchrun ... --nproc-per-node`` unlike on two machines), for messages; None where they
    are equal, or the launcher does not say. torchrun says its machines (``GROUP_WORLD_SIZE``):
    each rank sees its own machine's count alone, which may divide the world all the same (1
    and 2 ranks: 3 machines of 1, as rank 0 saw it)."""
    local, group = os.environ.get("LOCAL_WORLD_SIZE", ""), os.environ.get("GROUP_WORLD_SIZE", "")
    if not local.isdigit() or not 0 < int(local) <= world:
        return None
    if group.isdigit() and int(group) > 0 and int(group) * int(local) != world:
        return (f"{world} ranks on {group} machines, {local} on this one (WORLD_SIZE={world}, GROUP_WORLD_SIZE={group}, "
                f"LOCAL_WORLD_SIZE={local})")
    if not group.isdigit() and world % int(local):
        return f"{world} ranks, {local} on this machine (WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local})"
    return None


def node_local_tables(plan: PlanResult) -> list[Any]:
    """The plan's tables whose shards TorchRec places by node (table-row-wise and grid)."""
    return [t for t in plan.tables if t.sharding_type in ("table_row_wise", "grid_shard")]


def node_size_problem(plan: PlanResult, per_node: int, local: int, source: str, fix: str,
                      other_types: str) -> str | None:
    """Why the plan's table-row-wise and grid tables, split over nodes of ``per_node`` ranks,
    cannot run where ``local`` ranks share each machine (read from ``source``), with ``fix`` and
    ``other_types`` as the ways out; None where they can. TorchRec forms those types' nodes from
    the ranks a machine has, not from the plan."""
    hit = node_local_tables(plan)
    if local == per_node or not hit:
        return None
    return (
        f"The plan splits {_some_tables(hit)} over nodes of {per_node} rank(s) (topology.devices_per_node), but "
        f"{local} rank(s) share each machine here ({source}), and TorchRec forms the nodes of "
        f"table-row-wise and grid sharding from that: {fix}, or {other_types}."
    )


def check_compression_on_gloo(plan: PlanResult, launch: Launch, compressor: Compressor, planner: Any = None) -> None:
    """Refuse, before any rank starts, a precision the plan's collectives cannot run over gloo."""
    if launch.backend != "gloo" or launch.world_size < 2:
        return
    problem = gloo_compression_problem(plan, compressor, planner)
    if problem:
        raise ConfigError(problem)


def gloo_compression_problem(plan: PlanResult, compressor: Compressor, planner: Any = None,
                             api: bool = False) -> str | None:
    """Why the plan's collectives cannot run over gloo in the compressor's precisions, with the
    fix; None where they can (``recipes/plan.py`` says it as a note on CPU topologies). ``api``:
    the fix in ``plan_model``'s arguments, not the recipes' settings."""
    for precision, types in _GLOO_FAILS.items():
        if precision not in (compressor.forward_precision, compressor.backward_precision):
            continue
        hit = [t for t in plan.tables if t.sharding_type in types]
        if not hit:
            continue
        def listed(excluded: tuple[str, ...]) -> str:  # Python's list in plan_model's arguments
            names = [s.short for s in ShardingType if s.value not in excluded]
            return ", ".join(map(repr, names)) if api else ",".join(names)

        allowed = listed(types)
        # only Neo's planner takes a list of sharding types
        restrict = f"sharding_types=[{allowed}]" if api else f"sharding.sharding_types=[{allowed}]"
        if not hasattr(planner, "allowed"):
            restrict = f"planner='neo', {restrict}" if api else f"sharding=neo {restrict}"
        both = ("compressor={'name': 'fp16', 'backward': 'fp16'}" if api
                else "compression=fp16 compression.backward=fp16")
        if precision == "fp8":  # RW runs, but sends bf16 (no fp8 reduce-scatter); DP sends nothing
            int8 = listed(_GLOO_FAILS["int8"])
            other = (
                f"or int8 where every table is of a type that carries it ({int8}); no sharding type sends fp8 over "
                "gloo: row-wise tables send their gradients in bf16 instead (TorchRec has no fp8 reduce-scatter) and "
                "data-parallel tables exchange no embeddings"
            )
        else:
            other = f"or keep to the sharding types that can carry {precision}: {restrict}"
        return (
            f"compression {compressor.name!r} sends {precision} "
            f"(forward {compressor.forward_precision}, backward {compressor.backward_precision}), which "
            f"TorchRec cannot run over gloo for {_some_tables(hit)}. On CPU ranks send fp32, fp16 or bf16 both ways "
            f"(e.g. {both}); {other}."
        )
    return None


def check_fits_this_machine(plan: PlanResult, launch: Launch, topology: Topology) -> None:
    """CPU ranks hold their tables in this machine's memory: refuse a plan that cannot fit it.

    An emulated topology (ZionEX on a laptop) plans with its own per-device memory, which this
    machine may not have: the ranks would be killed for memory part-way through building.
    """
    if launch.device_type != "cpu" or launch.external:
        return
    need = sum(
        sum(v for k, v in r.memory.items() if k != "reserve") + sum(r.host_memory.values()) for r in plan.ranks
    )
    available = _available_memory()
    if available is None or need <= 0.9 * available:
        return
    fix = (
        "lower topology.memory_fraction or free memory"
        if topology.name == "local"
        else "or plan with this machine's memory (topology=local)"
    )
    raise PlanningError(
        f"The plan puts {need / 2**30:,.1f} GiB of embedding tables, optimizer state and gradients on "
        f"this machine's {launch.world_size} CPU rank(s) (topology {topology.name}), but only "
        f"{available / 2**30:,.1f} GiB of memory is available; make the tables smaller (data.rows, or num_embeddings in data.tables), {fix}."
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What a checkpoint's tensors and optimizer state were made with: resuming with any of these
# changed is refused (the kernel's learning rate and eps too: some of TorchRec's optimizers
# restore their settings with their state, so a change could be silently undone). The plan,
# world size and topology may change: shards are resharded on load
RESUME_KEYS = ("model", "data", "kernel")


TRAIN_FILES = ("plan.json", "config.json", "metrics.json", "training.png")


def check_output_dir(
    out: Path, files: tuple[str, ...] = TRAIN_FILES, folders: tuple[str, ...] = ("logs", "checkpoint"),
    write: bool = True,
) -> None:
    """Before a run: its folder can be written (made and tried, unless not ``write``: a check
    ahead of the run), and nothing it writes (``files``, ``folders``) is in the way."""
    try:
        if write:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".neo-write-check-{os.getpid()}"  # each rank its own: torchrun starts them together
            probe.write_text("")
            probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output_dir={str(out)!r} cannot be written ({exc.strerror}); choose another output_dir.") from None
    blocked = [out / n for n in files if (out / n).is_dir()] + [out / n for n in folders if (out / n).is_file()]
    if blocked:
        raise ConfigError(f"{blocked[0]} is in the way of the run's output; remove it or choose another output_dir.")


# Settings a resumed run may change (the plan and world size may change: shards are resharded
# on load); a change is noted, so that a resume command missing an override is seen
NOTED_KEYS = ("topology", "sharding", "cache", "compression", "trainer", "seed")
QUIET_KEYS = ("trainer.resume", "trainer.max_steps")  # what resuming is for: not noted
# settings that do not change a run's results (a finished run's are reported for them)
UNSHAPING_KEYS = ("trainer.progress_bar", "trainer.log_every_n_steps", "trainer.checkpoint",
                  "trainer.checkpoint_every_n_steps", "trainer.threads_per_rank")


def check_resumable(saved: Path, config: Mapping[str, Any]) -> list[str]:
    """Before any rank starts: the run resumed must match the one that wrote the checkpoint in
    ``RESUME_KEYS``; returns the other settings that differ (``NOTED_KEYS``), as ``key: old ->
    new``."""
    fix = ("put back the config.json of the run that wrote the checkpoint, or start afresh in another "
           "output folder")
    if not saved.is_file():
        raise ConfigError(
            f"trainer.resume=true, but the settings of the run that wrote the checkpoint are missing "
            f"({saved}): without them a changed model, data or kernel cannot be caught; {fix}."
        )
    try:
        before = json.loads(saved.read_text())
        if not isinstance(before, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"trainer.resume=true, but {saved}, the settings of the run that wrote the checkpoint, "
            f"cannot be read ({type(exc).__name__}); {fix}."
        ) from None
    config = json.loads(json.dumps(config))  # as it would be saved: tuples are lists

    def flat(node: Any, prefix: str) -> dict[str, Any]:
        if isinstance(node, Mapping):
            return {k: v for key, sub in node.items() for k, v in flat(sub, f"{prefix}.{key}").items()}
        return {prefix: node}

    def effective(group: str, node: Any) -> Any:
        # a key left out means the plugin's default: a run started from YAML (every key written)
        # and one from Python (only the keys given) with the same settings are the same run
        if not isinstance(node, Mapping) or "name" not in node:
            return node
        try:
            entry = get_plugins().registry(group).get(str(node["name"]))
        except (PluginError, KeyError):
            return node
        return {**plugin_default_node(entry), **node}

    def name(node: Any) -> Any:
        return node.get("name") if isinstance(node, Mapping) else None

    def shown(value: Any) -> str:  # as typed in an override: null, true
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)

    def differences(keys: tuple[str, ...]) -> list[str]:
        found = []
        for key in keys:
            if name(before.get(key)) != name(config.get(key)):  # another plugin: its keys differ too
                found.append(f"{key}: {shown(name(before.get(key)))} -> {shown(name(config.get(key)))}")
                continue
            old = flat(effective(key, before.get(key)), key)
            new = flat(effective(key, config.get(key)), key)
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in QUIET_KEYS)
            found += [f"{k}: {shown(old.get(k))} -> {shown(new.get(k))}" for k in changed]
        return found

    changed = differences(RESUME_KEYS)
    if changed:
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise ConfigError(
            f"trainer.resume=true, but this run differs from the one that wrote the checkpoint: "
            f"{'; '.join(changed[:4])}{more}. Resume with that run's settings ({saved}), or start afresh "
            "in another output folder."
        )
    return differences(NOTED_KEYS)


def finished_metrics(out: Path, steps: int) -> dict[str, Any] | None:
    """The results in ``out/metrics.json`` of a run that finished ``steps`` steps, else None."""
    try:
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(metrics, dict) or metrics.get("steps") != steps or metrics.get("interrupted"):
        return None
    return metrics


def finished_unchanged(out: Path, config: Mapping[str, Any] | RunConfig) -> dict[str, Any] | None:
    """The results in ``out`` of a run with these settings that finished its ``trainer.max_steps``
    and saved no checkpoint, else None: its ``config.json`` must be this run's (any change, a
    plugin's key or a progress bar, makes a new run, which starts afresh)."""
    try:
        run = config if isinstance(config, RunConfig) else validate(config)
    except Exception:  # noqa: BLE001 - the run reports its own bad settings
        return None
    results = finished_metrics(out, run.trainer.max_steps)
    if results is None:
        return None
    try:
        return results if not check_resumable(out / "config.json", run.to_dict()) else None
    except ConfigError:  # the model, data or kernel changed, or no readable config.json
        return None


def finished_note(out: Path, steps: int, checkpoint: bool = True) -> str:
    """What a run (a sweep's job too) says when it has nothing left to train; ``checkpoint``:
    whether it left one to train further from."""
    further = ("raise trainer.max_steps to train further" if checkpoint else
               "it saved no checkpoint: with a larger trainer.max_steps, it trains again from step 0")
    return (f"note: the run in {out} has finished its {steps} steps already (results in its metrics.json); "
            f"nothing to train ({further})")


def check_fresh_start(out: Path, run: RunConfig) -> tuple[Path, int] | None:
    """Before any rank starts: the checkpoint a resumed run starts from (folder, step), None if
    there is none; a run that does not resume must not write over an earlier run's
    checkpoint, and a resumed one must have steps left, unless it finished them all (then
    ``train`` reports the results it has)."""
    from neo_core.training.checkpoint import latest_checkpoint

    writes = run.trainer.checkpoint or run.trainer.checkpoint_every_n_steps
    try:
        latest = latest_checkpoint(out / "checkpoint")
    except CheckpointError:
        if run.trainer.resume or writes:
            raise
        return None  # a run that writes no checkpoint leaves the damaged one alone
    if latest is None:
        return None
    folder, step = latest
    if not run.trainer.resume:
        # a run that writes no checkpoint would still replace the earlier run's results, plan and
        # logs, leaving a folder whose checkpoint and record no longer belong together
        replaces = "" if writes else " (this run saves no checkpoint, yet would replace that run's results and logs)"
        raise ConfigError(
            f"{out} holds the checkpoint of an earlier run (step {step}, {folder}){replaces}; continue it "
            f"with trainer.resume=true, or choose another output folder (hydra.run.dir=...; a sweep's: hydra.sweep.dir=...), "
            f"or remove {folder} to start over there."
        )
    if step == run.trainer.max_steps and finished_metrics(out, step) is not None:
        return latest  # finished already (a restarted job script, a sweep run again): train() says so
    if step == run.trainer.max_steps:
        raise ConfigError(
            f"The checkpoint in {folder} is at step {step}, trainer.max_steps, but {out / 'metrics.json'} is "
            "missing or from an earlier step: the run stopped after its last save, before writing its "
            f"results. Its loss and validation record is in {folder / 'history.json'}; raise "
            "trainer.max_steps to train further."
        )
    if step >= run.trainer.max_steps:
        raise ConfigError(
            f"The checkpoint in {folder} is at step {step}, not before trainer.max_steps="
            f"{run.trainer.max_steps}; raise trainer.max_steps to train further."
        )
    return latest


def continues_earlier_run(out: Path, resume: bool, config: Mapping[str, Any] | None = None) -> bool:
    """Whether a run with ``trainer.resume=resume`` in ``out`` goes on from an earlier run's
    checkpoint, so that its transcript follows that run's: with none, ``resume=true`` starts
    afresh and its transcript replaces the folder's earlier one. A damaged checkpoint counts
    (the run refuses it, after the earlier transcript); so does a run with these settings
    (``config``) that finished without a checkpoint (it only says so, below that run's
    transcript)."""
    from neo_core.training.checkpoint import latest_checkpoint

    if not resume:
        return False
    try:
        found = latest_checkpoint(out / "checkpoint") is not None
    except CheckpointError:
        return True
    return found or (config is not None and finished_unchanged(out, config) is not None)


# what a dry run (recipes/plan.py) leaves: its transcript beside its plan (plan.json, plan.txt,
# plan.png), and no training record (config.json). A training folder may hold a plan.png
# (`neo chart`) or a plan.log (a dry run refused there, or one that failed: no plan)
DRY_RUN_LOG, DRY_RUN_PLAN = "plan.log", ("plan.json", "plan.txt", "plan.png")


def dry_run_files(out: Path) -> list[str]:
    """The files of a dry run of recipes/plan.py in ``out``; empty when it holds none."""
    plan = [n for n in DRY_RUN_PLAN if (out / n).is_file()]
    if not plan or not (out / DRY_RUN_LOG).is_file() or (out / "config.json").exists():
        return []
    return [*plan, DRY_RUN_LOG]


def check_not_a_dry_run(out: Path) -> None:
    """Refuse a folder that holds a dry run of recipes/plan.py: its plan is not this run's to replace."""
    dry = dry_run_files(out)
    if dry:
        discard_transcript()  # the dry run's folder gets no train.log
        raise ConfigError(
            f"{out} holds a dry run of recipes/plan.py ({', '.join(dry)}), whose plan this run's plan.json and "
            "plan.txt would replace; choose another folder (hydra.run.dir=...; a sweep's: hydra.sweep.dir=...)."
        )


def check_before_start(run: RunConfig, write: bool = True) -> tuple[tuple[Path, int] | None, list[str]]:
    """What :func:`train` checks of the run's folder before it plans: it can be written (not
    tried unless ``write``), nothing is in the way, a dry run's plan is not there to be mixed
    with this run's, a checkpoint is not written over, and a resumed run has steps left.
    Returns the checkpoint a resumed run starts from (folder, step) and the settings that
    differ from the run that wrote it; also what a sweep checks of each job before the first."""
    out = Path(run.output_dir)
    check_output_dir(out, write=write)
    resumed_from = check_fresh_start(out, run)
    if resumed_from is None:
        check_not_a_dry_run(out)
    changes = []
    if resumed_from is not None:  # the settings saved with the checkpoint (older ones: the folder's)
        saved = resumed_from[0] / "config.json"
        changes = check_resumable(saved if saved.is_file() else out / "config.json", run.to_dict())
        # a finished run has nothing to train: its results are reported as this run's, which
        # they are not where settings that shape them differ (a sweep run again, reordered)
        shaping = [c for c in changes if c.split(":", 1)[0] not in UNSHAPING_KEYS]
        done = max(resumed_from[1], run.trainer.max_steps)  # as train() tells a finished run
        finished = resumed_from[1] >= run.trainer.max_steps or finished_metrics(out, done) is not None
        if finished and shaping:
            more = f" (and {len(shaping) - 4} more)" if len(shaping) > 4 else ""
            raise ConfigError(
                f"{out} holds a run that finished its {done} steps with other settings: "
                f"{'; '.join(shaping[:4])}{more}. Its results are not this run's; choose another output "
                "folder (hydra.run.dir=...; a sweep's: hydra.sweep.dir=...), or raise trainer.max_steps to "
                "train that run further with these settings."
            )
    return resumed_from, changes


def train(cfg: Mapping[str, Any] | RunConfig) -> dict[str, Any]:
    """Train as configured; returns the metrics also written to ``metrics.json``."""
    run = cfg if isinstance(cfg, RunConfig) else validate(cfg)
    launch = resolve_launch(run)
    from neo_core.training.interrupt import asked_as_it_finished

    asked_as_it_finished()  # an earlier run's request is not this one's
    out = Path(run.output_dir)
    rank0 = not launch.external or int(os.environ.get("RANK", "0")) == 0
    resumed_from, changes = check_before_start(run)
    # finished: its last checkpoint is at max_steps, or earlier (checkpoint_every_n_steps without
    # the end-of-training save) with this run's results written; or resumed, its results written
    # without a checkpoint (trainer.checkpoint=false)
    done = max(resumed_from[1], run.trainer.max_steps) if resumed_from is not None else run.trainer.max_steps
    if resumed_from is not None:
        results = finished_metrics(out, done)
    else:
        results = finished_unchanged(out, run) if run.trainer.resume else None
    if (resumed_from is not None and resumed_from[1] >= run.trainer.max_steps) or results is not None:
        metrics = results or {}
        if rank0:
            print(finished_note(out, done, checkpoint=resumed_from is not None))
        for key in ("val_auc", "val_loss"):  # null in the file: not measured
            if key in metrics and metrics[key] is None:
                metrics[key] = math.nan
        return metrics
    if rank0 and changes:
        # the weights come from the checkpoint (every model key, or the load fails) and the data
        # from data.seed and the step: seed (torch's, NumPy's and Python's generators, and the
        # tables' initial weights) shapes nothing after the load
        changes = [f"{c} (no effect on a resumed run: its weights come from the checkpoint and its data from "
                   "data.seed and the step)" if c.startswith("seed:") else c for c in changes]
        more = f" (and {len(changes) - 6} more)" if len(changes) > 6 else ""
        print(f"note: resuming from step {resumed_from[1]} with settings that differ from the run that wrote "
              f"the checkpoint: {'; '.join(changes[:6])}{more}")
    elif rank0 and resumed_from is not None:
        print(f"note: resuming from step {resumed_from[1]} ({resumed_from[0]})")
    with quiet_torchrec():  # the plan text below says what matters
        parts = build_parts(run, launch)
        plan = plan_run(parts)
    check_fits_this_machine(plan, launch, parts.topology)
    check_compression_on_gloo(plan, launch, parts.compressor, parts.planner)
    check_node_layout(plan, launch, parts.topology)
    if rank0:  # the run's notes (parts.notes) are the plan's first ones, printed with it
        replace_earlier_transcript()  # the run starts: its files replace an earlier run's from here
        cores = usable_cores()
        if launch.device_type == "cpu" and not launch.external and launch.world_size > cores:
            print(f"note: {launch.world_size} ranks on {cores} core(s): ranks share cores, so steps are slower "
                  "than on a machine with a core per rank")
        print(parts.topology.describe())
        print(plan.format_text(rest="all in plan.json and plan.txt"))
        print("note: the predicted step is the embedding tables' share (lookups, their optimizer and their "
              "communication); the dense layers, data loading and the framework add to each measured step")
        _save_plan(plan, out)
        (out / "config.json").write_text(json.dumps(run.to_dict(), indent=2) + "\n")
    from neo_core.training.module import plan_digest

    launch = replace(launch, plan_digest=plan_digest(plan))  # the ranks' plan is checked against it
    payload = run.to_dict()
    launched = time.time()
    asked = False  # spawned ranks: the starting process got a Ctrl-C or SIGTERM
    if launch.external:
        rank_main(int(os.environ["RANK"]), launch, payload)
    elif launch.world_size == 1:
        with rank_in_this_process():
            rank_main(0, launch, payload, port=_free_port())
    else:
        from torch.multiprocessing.spawn import ProcessExitedException

        from neo_core.training.interrupt import run_ranks

        made = _PLANNED_HERE.get(launch.plan_digest) if launch.plan_digest else None  # each rank runs it
        try:
            asked = run_ranks(_spawned_rank, (launch, payload, _free_port(), made, os.getpid()), launch.world_size,
                              then=_after_stop(run.trainer))
        except ProcessExitedException as exc:  # a rank ended by a signal or an exit code, not a Python error
            raise rank_lost(exc, out) from None
    metrics_path = out / "metrics.json"
    if rank0 and (not metrics_path.exists() or metrics_path.stat().st_mtime < launched - 1.0):
        # every rank ended without an error, yet none wrote this run's results (an earlier
        # run's may be there): never report those as this run's
        raise TrainingError(
            f"The ranks ended without writing this run's results ({metrics_path}); the messages above "
            "say where they stopped."
        )
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    for key in ("val_auc", "val_loss"):  # null in the file: not measured
        if key in metrics and metrics[key] is None:
            metrics[key] = math.nan
    if asked and metrics and not metrics.get("interrupted"):  # asked to stop, too late: it finished
        from neo_core.training.interrupt import note_asked_as_it_finished

        note_asked_as_it_finished()
    if metrics.get("interrupted"):
        from neo_core.training.checkpoint import latest_checkpoint

        latest = latest_checkpoint(out / "checkpoint")
        saved = f"checkpoint at step {latest[1]} in {latest[0]}" if latest else "no checkpoint (trainer.checkpoint=false)"
        raise RunInterrupted(
            f"stopped after step {metrics['steps']} of {run.trainer.max_steps}: {saved}",
            resume_dir=str(out) if latest else None,
        )
    if rank0 and metrics:
        auc, loss = metrics["val_auc"], metrics["val_loss"]
        if not run.trainer.val_batches:
            validated = "no validation (trainer.val_batches=0)"
        elif math.isnan(loss):
            validated = "val AUC and loss not measured"
        else:  # an AUC is undefined when every held-out label is the same (noted above)
            validated = f"val AUC {'undefined' if math.isnan(auc) else f'{auc:.4f}'}, val loss {loss:.4f}"
        since = metrics.get("samples_per_sec_from_step", metrics.get("timed_from_step", 1))
        segment = " of this segment" if metrics.get("timed_from_step", 1) > 1 else ""
        timed = f" over steps {since}-{metrics['steps']}{segment}" if since > 1 else ""
        spread = metrics.get("samples_per_sec_p10_p90")  # how steady it was
        steady = f"per step {spread[0]:,.0f}-{spread[1]:,.0f}, 10th-90th percentile; " if spread else ""
        history = metrics.get("history") or []
        first, last = (history[0]["loss"], metrics.get("train_loss")) if history else (None, None)
        if first is not None and last is not None and math.isfinite(last) and last > max(10 * first, 10.0):
            # a finite loss that exploded: the run ends as usual, but its results mean nothing
            print(
                f"warning: the training loss grew from {first:.4g} (step {history[0]['step']}) to {last:.4g} (the "
                "last steps' mean): training diverged though the loss stayed finite; lower the tables' learning "
                "rate (kernel.learning_rate) or the dense layers' (trainer.dense_learning_rate)",
                file=sys.stderr,
            )
        print(
            f"done: {metrics['steps']} steps, {validated}, {metrics['samples_per_sec']:,.0f} samples/s{timed} "
            f"({steady}{launch.world_size} {launch.device_type} rank(s)); outputs in {out}"
        )
    return metrics


def _save_plan(plan: PlanResult, out: Path) -> None:
    """The run's plan.json and plan.txt (every table and rank); an earlier plan's chart goes
    (`neo chart` draws this one's)."""
    plan.save_json(out / "plan.json")
    (out / "plan.png").unlink(missing_ok=True)
    (out / "plan.txt").write_text(plan.format_text(max_tables=None, max_ranks=None) + "\n")


def _record_plan_run(plan: PlanResult, launch: Launch, out: Path) -> None:
    """Rank 0, once the ranks agree on a plan: where it is not the plan printed and saved before
    they started (a plugin whose result depends on the process: the rank, the time or the
    environment), plan.json and plan.txt are made the plan run, and the run says so."""
    from neo_core.training.module import plan_digest

    least = bool(plan.notes) and plan.notes[0].startswith(LEAST_MEMORY)
    if launch.plan_digest is None or (launch.plan_digest == plan_digest(plan) and not least):
        return
    _save_plan(plan, out)  # planned for the least memory: its capacities, even where its shards are the same
    if least and launch.plan_digest == plan_digest(plan):
        said = (f"note: {plan.notes[0][0].lower()}{plan.notes[0][1:].split(': planned')[0]}: the plan above, planned "
                "again for the least, puts the same shards on the same ranks; plan.json and plan.txt hold it with those "
                "capacities")
    else:
        why = ("some ranks have less memory than rank 0's machine gave each before they started, and the plan is for "
               "the least" if least else
               "a plugin whose result depends on the process: its rank, the time or its environment")
        said = f"warning: the ranks built another plan than the one printed above ({why}); they run rank 0's, which " \
               "plan.json and plan.txt now hold"
    print(f"{said}:\n{plan.format_text(rest='all in plan.json and plan.txt')}", flush=True)


def _spawned_rank(local_rank: int, launch: Launch, payload: dict[str, Any], port: int, made: PlanResult | None,
                  parent: int, stop: Any) -> None:
    """A rank the starting process (``parent``, its pid) spawned. ``made``: the plan that
    process made (and printed, saved and checked) for the run, which the rank runs rather than
    planning the model again (``rank_plan``; TorchRec's planner takes minutes on large models,
    once per rank)."""
    _end_when_orphaned(parent, local_rank, payload.get("output_dir"))
    from neo_core.plugins import QUIET_ENV

    if made is not None and launch.plan_digest is not None:
        _PLANNED_HERE[launch.plan_digest] = made

    os.environ[QUIET_ENV] = "1"  # the parent said which plugins were skipped
    from neo_core.training.console import bars_without_semaphore, tee_rank_output

    tee_rank_output(local_rank)  # its progress bar and warnings join the job's console log
    bars_without_semaphore()
    try:
        rank_main(local_rank, launch, payload, port=port, stop_event=stop, parent=parent)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: the parent reports it once
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one would interrupt the exit itself
        raise SystemExit(130) from None


QUIET_LOGGERS = ("torchrec", "lightning", "lightning.pytorch", "lightning.fabric", "torch.distributed")


def quiet_libraries() -> None:
    """In a rank: library log lines below errors and Python warnings are not shown (TorchRec notes
    every table batch; deprecation warnings name its internals)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.WARNING)  # FBGEMM logs every table batch at INFO on root
    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def rank_in_this_process() -> Iterator[None]:
    """A rank run in the calling process (world size 1) leaves it as it found it: the environment
    (rank variables, seed), library log levels, warning filters, torch's thread count, and no
    process group of its own, also when it failed. A later run in the same process (a Hydra
    multirun, a notebook) starts from the same state."""
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    env = dict(os.environ)
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS] + [logging.getLogger()]
    levels = [logger.level for logger in loggers]
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for key in set(os.environ) - set(env):
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        torch.set_num_threads(threads)
        if not grouped and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # a failed run's: the next would reuse it


def _after_stop(trainer: Any) -> str:
    """What the ranks do after the step a Ctrl-C stops them at (the first Ctrl-C's line)."""
    from neo_core.training.interrupt import after_stop

    return after_stop(trainer.checkpoint, trainer.checkpoint_every_n_steps, bool(trainer.val_batches))


def rank_lost(exc: Any, out: Path) -> RankLost:
    """The error for a spawned rank that ended without a Python error (``exc``: torch's
    ``ProcessExitedException``): a signal (the out-of-memory killer's SIGKILL) or an exit
    code. The other ranks were ended; what the run kept and how to continue. It was torch's
    traceback, naming neither the folder, the checkpoint nor the command."""
    from neo_core.training.checkpoint import readable_checkpoint

    how = (f"was ended by signal {exc.signal_name}" + (" (the out-of-memory killer ends processes so: `dmesg` says "
                                                        "whether it did)" if exc.signal_name == "SIGKILL" else "")
           if getattr(exc, "signal_name", None) else f"exited with code {exc.exit_code}")
    latest = readable_checkpoint(out / "checkpoint")
    said = f"rank {exc.error_index} {how}; the other ranks were stopped"
    if latest is None:
        return RankLost(f"{said}; no checkpoint was saved in {out}: run the command again to start over "
                        "(trainer.checkpoint_every_n_steps=<n> saves during training)")
    return RankLost(f"{said}; the last finished checkpoint is at step {latest[1]} in {latest[0]}", resume_dir=str(out))


ORPHAN_POLL_S = 0.2  # how often a spawned rank looks for its starting process


def _end_when_orphaned(parent: int, rank: int, out: str | None) -> None:
    """End this rank at once, now or as soon as it happens, where the run's starting process
    ``parent`` is gone (killed outright: ``kill -9``, the OOM killer). Its hold on the run's
    folder went with it, so ranks that trained on (to their next agreement point, or all of
    a run whose starting process died as they started) met a resumed run in the same folder:
    both trained and wrote one record. Ended at once, the ranks leave the last checkpoint, as a
    ``kill -9`` of the whole run does; rank 0 says so."""
    import threading

    def gone() -> bool:
        return os.getppid() != parent

    def end() -> None:
        if rank == 0:
            where = f" hydra.run.dir={out}" if out else ""
            print(f"error: the run's starting process (pid {parent}) is gone (killed?): its ranks stop at once, "
                  f"keeping the last checkpoint; continue with the run's command and trainer.resume=true{where}",
                  file=sys.stderr, flush=True)
        from neo_core.training.interrupt import leave_process

        leave_process(1)

    if gone():
        end()

    def watch() -> None:
        while not gone():
            time.sleep(ORPHAN_POLL_S)
        end()

    threading.Thread(target=watch, name="neo-orphan-watch", daemon=True).start()


def rank_main(
    rank: int,
    launch: Launch,
    payload: dict[str, Any],
    port: int | None = None,
    stop_event: Any = None,
    parent: int | None = None,
) -> None:
    """Body of one rank: shard, train, validate, checkpoint, report. ``stop_event``: set by the
    process that started the ranks (``parent``) on Ctrl-C or SIGTERM (``interrupt.run_ranks``)."""
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import LightningEnvironment, TorchElasticEnvironment

    from neo_core.config import TrainerConfig
    from neo_core.training.checkpoint import DistributedCheckpoint, latest_checkpoint, read_history
    from neo_core.training.datasets import RankStream
    from neo_core.training.interrupt import HardStop, StopOnInterrupt
    from neo_core.training.logs import RunLog, keep_rows_before
    from neo_core.training.module import NeoModule, StepClock
    from neo_core.training.strategy import NeoStrategy

    quiet_libraries()
    if not launch.external:
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(launch.world_size),
            LOCAL_WORLD_SIZE=str(launch.world_size),
            NODE_RANK="0",
            NEO_SPAWNED="1",
        )
    payload = dict(payload)
    payload["trainer"] = TrainerConfig(**payload["trainer"])
    run = RunConfig(**payload)
    cfg = run.trainer
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", launch.world_size))
    threads = cfg.threads_per_rank or max(1, usable_cores() // local_world)
    torch.set_num_threads(threads)
    # Lightning's strategy sets torch's threads again, to the cores over the ranks of one node,
    # unless OMP_NUM_THREADS is set: on an emulated topology of one rank per node that gave each
    # of the machine's ranks every core (samples/s fell 10-25x)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    pl.seed_everything(run.seed, verbose=False)
    # the process that started the run (this one, under torchrun or on one rank) built the same
    # plugins and showed what they print (a warning of a calibration file, a topology figure):
    # the ranks' copies would repeat it once per rank
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        parts = build_parts(run, launch)
    local_world = _emulate_nodes(parts.topology, launch, rank, local_world)
    out = Path(run.output_dir)
    ckpt_dir = out / "checkpoint"
    latest = latest_checkpoint(ckpt_dir) if cfg.resume else None
    start_step = latest[1] if latest else 0
    if cfg.resume and start_step == 0 and rank == 0:
        print(f"warning: trainer.resume=true but {ckpt_dir} holds no checkpoint; starting from step 0.")
    remaining = cfg.max_steps - start_step
    if remaining <= 0:
        raise ConfigError(
            f"The checkpoint in {ckpt_dir} is at step {start_step}, not before trainer.max_steps="
            f"{cfg.max_steps}; raise trainer.max_steps to train further."
        )
    model = parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta")
    module = NeoModule(
        model,
        planner_fn=lambda m: rank_plan(parts, m, launch.plan_digest, cfg.threads_per_rank is not None, launch),
        on_plan=(lambda plan: _record_plan_run(plan, launch, out)) if rank == 0 else None,
        sharders_fn=lambda: checked_sharders(parts.planner, parts.context),
        kernel=parts.kernel,
        trainer_cfg=cfg,
        global_batch_size=cfg.batch_size * launch.world_size,
        step_offset=start_step,
        seed=run.seed,
    )
    if latest is not None and (record := read_history(*latest)) is not None:
        module.history, module.val_history = record  # the steps before the checkpoint
        module.history_restored = True
    world, grank = launch.world_size, rank
    train_stream = RankStream(parts.data, "train", grank, world, cfg.batch_size, start_step, remaining)
    val_stream = RankStream(parts.data, "val", grank, world, cfg.batch_size, 0, max(cfg.val_batches, 1))
    loader = torch.utils.data.DataLoader
    devices = local_world
    num_nodes = max(1, world // local_world)
    checkpoint = DistributedCheckpoint(
        ckpt_dir, every_n_steps=cfg.checkpoint_every_n_steps, save_at_end=cfg.checkpoint,
        resume=cfg.resume and start_step > 0, step_offset=start_step, config=run.to_dict(),
    )
    # Ctrl-C: all ranks stop after the same step and save (the checkpoint callback, at train end)
    stop = StopOnInterrupt(
        cfg.log_every_n_steps, alone=stop_event is None, shared=stop_event, announce=rank == 0, parent=parent,
        then=_after_stop(cfg),
    )
    external_env = launch.external and TorchElasticEnvironment.detect()
    environment = TorchElasticEnvironment() if external_env else LightningEnvironment()
    trainer = pl.Trainer(
        accelerator="gpu" if launch.device_type == "cuda" else "cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=NeoStrategy(cluster_environment=environment, process_group_backend=launch.backend),
        max_steps=remaining,
        max_epochs=1,
        logger=RunLog(out),
        callbacks=[StepClock(), stop, checkpoint, *([steps_bar()] if cfg.progress_bar and rank == 0 else [])],
        enable_checkpointing=False,
        enable_progress_bar=cfg.progress_bar and rank == 0,
        enable_model_summary=False,
        log_every_n_steps=cfg.log_every_n_steps,
        val_check_interval=min(cfg.val_every_n_steps or remaining, remaining),
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.val_batches,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    _validate_at_run_steps(trainer, start_step, cfg.max_steps, cfg.val_every_n_steps)
    # Lightning counts logged steps from 0 in each fit: count them over the run, so that a
    # resumed run logs on the run's cadence (every log_every_n_steps from step 0) and its rows
    # carry the run's steps
    trainer.fit_loop.epoch_loop._batches_that_stepped = start_step
    log_csv = out / "logs" / "metrics.csv"  # appended to over a run's segments (RunLog)
    if rank == 0:
        if start_step > 0:  # rows after the checkpoint were logged by a run that did not save them
            keep_rows_before(log_csv, start_step)
        else:  # an earlier run's, in a folder started afresh: this run's replace them, or none are left
            for stale in (log_csv, out / "metrics.json", out / "training.png"):
                stale.unlink(missing_ok=True)
    started = time.perf_counter()
    try:
        with stop.installed():
            trainer.fit(
                module,
                train_dataloaders=loader(train_stream, batch_size=None),
                val_dataloaders=loader(val_stream, batch_size=None) if cfg.val_batches else None,
            )
            wall = time.perf_counter() - started
            if rank == 0:
                _write_results(out, module, run, launch, wall, interrupted=stop.stopped_at is not None,
                               cache=parts.cache)
            if stop.asked and stop.stopped_at is None and stop_event is None and not launch.external:
                from neo_core.training.interrupt import note_asked_as_it_finished

                note_asked_as_it_finished()  # a rank in this process: the caller (a sweep) is told
    except HardStop:  # the second Ctrl-C (inside fit, Lightning has torn the rank down)
        raise KeyboardInterrupt from None
    except RuntimeError as exc:  # torch's out-of-memory errors (CUDA's is a RuntimeError too)
        text = str(exc)
        if "can't allocate memory" not in text and "out of memory" not in text.lower():
            raise
        first = text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
        raise TrainingError(
            f"Rank {rank} ran out of {launch.device_type} memory while training ({first}). The plan counts the "
            f"embedding tables only: lower trainer.batch_size (now {cfg.batch_size} per rank) or the model's "
            "layer sizes (model.dense_arch, model.over_arch, ...), or run on more ranks."
        ) from None
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def steps_bar() -> Any:
    """Lightning's progress bar with the steps left as its total: over data of no set length
    (the synthetic stream) it showed ``3/?``."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    class StepsBar(TQDMProgressBar):
        @property
        def total_train_batches(self) -> int | float:
            trainer = self.trainer
            if trainer.max_steps is None or trainer.max_steps < 0:
                return trainer.num_training_batches
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)

    return StepsBar()


def _validate_at_run_steps(trainer: Any, start_step: int, max_steps: int, every: int | None) -> None:
    """Validate after every ``every``-th step of the whole run and after its last step.

    Lightning counts ``val_check_interval`` from the start of each ``fit``: a run resumed at
    step 40 with ``trainer.val_every_n_steps=25`` validated at 65 and 90 (not 50, 75, 100), and
    a run whose ``max_steps`` is no multiple of the interval ended without validating, so its
    reported AUC was an earlier step's. The epoch loop's decision is replaced on this trainer
    (a stop requested by Ctrl-C still validates first, as Lightning does).
    """
    loop = trainer.fit_loop.epoch_loop

    def should_check_val(data_fetcher: Any) -> bool:
        if not loop._should_check_val_epoch():
            return False
        if trainer.should_stop and trainer.fit_loop._can_stop_early:
            return True
        done = start_step + loop.total_batch_idx + 1  # steps of the run finished
        return done >= max_steps or bool(every) and done % every == 0

    loop._should_check_val_fx = should_check_val


def _emulate_nodes(topology: Topology, launch: Launch, rank: int, local_world: int) -> int:
    """Ranks per node as TorchRec and Lightning are to see them; sets the environment to match.

    Spawned CPU ranks all run on this machine, but a topology of several nodes (ZionEX
    emulated, or ``topology.num_nodes=2``) plans node-local groups for table-row-wise and
    grid sharding: TorchRec forms those groups from ``LOCAL_WORLD_SIZE``, so each rank is
    told the node the plan put it on. (CUDA ranks also pick their device by local rank, so
    they keep the machine's layout.)
    """
    per_node = topology.devices_per_node
    if launch.external or launch.device_type != "cpu" or per_node >= launch.world_size or launch.world_size % per_node:
        return local_world
    os.environ.update(LOCAL_WORLD_SIZE=str(per_node), LOCAL_RANK=str(rank % per_node), NODE_RANK=str(rank // per_node))
    return per_node


def not_used(notes: Sequence[str]) -> list[str]:
    """The settings a plan's notes say the run does not use: "cache lru", "compression fp16"
    (from ``neo_core.sharding.context_notes``' "<setting>[ and <setting>] not used: ...")."""
    found: list[str] = []
    for note in notes:
        head, sep, _ = note.partition(" not used: ")
        if sep and head.startswith(("cache ", "compression ")):
            found += [part for part in head.split(" and ") if part not in found]
    return found


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _write_results(
    out: Path, module: Any, run: RunConfig, launch: Launch, wall: float, interrupted: bool = False,
    cache: CachePolicy | None = None,
) -> None:
    from neo_core.training.module import plan_digest

    history, val_history = list(module.history), list(module.val_history)
    previous = out / "metrics.json"
    earlier: Any = None  # the earlier stretch's results, where this run resumed one
    if module.step_offset and previous.exists():
        with contextlib.suppress(ValueError):
            earlier = json.loads(previous.read_text())
    if module.step_offset and not module.history_restored and isinstance(earlier, dict):
        # a checkpoint saved without its record: the earlier run's metrics.json keeps it
        history = [h for h in earlier.get("history", []) if h["step"] <= module.step_offset] + history
        val_history = [
            {k: math.nan if v is None else v for k, v in h.items()}  # null in the file: not measured
            for h in earlier.get("val_history", []) if h["step"] <= module.step_offset
        ] + val_history
    last = history[-10:]
    val = val_history[-1] if val_history else {"auc": math.nan, "loss": math.nan}
    steps = module.global_step + module.step_offset
    # the plugins each stretch of steps trained with (a resumed run may change some: the
    # top-level fields are the last stretch's)
    planned = (module.plan.settings if module.plan else None) or {}
    settings = {
        "sharding": run.sharding["name"], "kernel": run.kernel["name"], "compression": run.compression["name"],
        # forward/backward, as the plan's tables send them ("fp16/fp8"; "fp16/bf16" where row-wise
        # tables fall back from fp8, neo_core.sharding.sent_precision); null where no plan says
        "compression_precision": sent_precision(module.plan) if module.plan else None,
        "cache": run.cache["name"],
        "cache_load_factor": cache.load_factor if cache is not None else run.cache.get("load_factor"),  # as built
        "cache_prefetch_pipeline": bool((planned.get("cache") or {}).get("prefetch_pipeline")),
        # the batch its steps ran at: a resumed run may change trainer.batch_size or the ranks
        "global_batch_size": module.global_batch_size,
        "batch_size_per_rank": run.trainer.batch_size,
        # the plan: a resumed run can plan anew with the same plugins (another calibration, a
        # sharding setting), and its steps then ran another plan, predicted otherwise
        "plan_digest": plan_digest(module.plan)[:12] if module.plan else None,
        "predicted_step_time_s": module.plan.predicted_step_time if module.plan else None,
    }
    segments: list[dict[str, Any]] = []
    if isinstance(earlier, dict):
        with contextlib.suppress(KeyError, TypeError):
            kept = earlier.get("segments") or [
                {"from_step": 1, "to_step": earlier["steps"], **{k: earlier[k] for k in settings if k in earlier}}]
            segments = [{**seg, "to_step": min(seg["to_step"], module.step_offset)}
                        for seg in kept if seg["from_step"] <= module.step_offset]
    # a setting an earlier run did not record (a field added since) is not taken for a change
    if segments and all(segments[-1].get(k, v) == v for k, v in settings.items()):
        segments[-1]["to_step"] = steps  # the same settings go on
    else:
        segments.append({"from_step": module.step_offset + 1, "to_step": steps, **settings})
    metrics = {
        "steps": steps,
        "max_steps": run.trainer.max_steps,
        "interrupted": interrupted,  # stopped by Ctrl-C before max_steps
        "world_size": launch.world_size,
        "device": launch.device_type,
        "global_batch_size": module.global_batch_size,
        "train_loss": sum(h["loss"] for h in last) / max(len(last), 1),
        "val_auc": val["auc"],
        "val_loss": val["loss"],
        "samples_per_sec": module.samples_per_second(),
        # per-step samples/s over the same steps: 10th and 90th percentile (null below 10 steps)
        "samples_per_sec_p10_p90": module.samples_per_second_spread(),
        # a resumed run times its own steps only: the steps its samples/s and wall time cover
        "timed_from_step": module.step_offset + 1,
        # the first step samples/s counts (the first steps build kernels and caches)
        "samples_per_sec_from_step": module.step_offset + 1 + module.warmup_steps(),
        "wall_time_s": wall,
        **settings,
        "segments": segments,  # [{from_step, to_step, and the settings above}], one per resumed stretch
        # tables the plan put behind the device cache: 0 where the cache chosen is not used (CPU ranks)
        "cached_tables": module.plan.cached_tables if module.plan else 0,
        # chosen settings the plan says this run does not use ("cache lru", "compression fp16"): its
        # results are those of a run without them
        "not_used": not_used(module.plan.notes) if module.plan else [],
        "threads_per_rank": torch.get_num_threads(),  # torch's intra-op threads as the run trained
        "model": run.model["name"],
        "topology": run.topology["name"],
        # the cluster the plan was made for, where it was emulated on these ranks ("zionex (16x8)")
        "emulated_from": (module.plan.topology or {}).get("emulated_from") if module.plan else None,
        # whose model gave predicted_step_time_s (with the settings above: the last stretch's plan's)
        # ("Neo's cost model", "TorchRec's estimator"): runs' predictions
        # compare on one scale only
        "predicted_by": (module.plan.times_from or f"the {module.plan.planner} planner") if module.plan else None,
        "history": history,
        "val_history": val_history,
    }
    # strict JSON: a value that is not a number (no validation: trainer.val_batches=0) is null
    (out / "metrics.json").write_text(json.dumps(_no_nan(metrics), indent=2, allow_nan=False) + "\n")
    try:
        from neo_core.training.plots import plot_training

        plot_training(metrics, out / "training.png")
    except Exception as exc:  # a plot must never fail a finished run
        print(f"warning: could not draw training.png: {exc}", file=sys.stderr)
