"""Measure this machine for the ``local`` topology: memory bandwidth, lookup rate, gloo collectives.

    .venv/bin/python -m neo_plugins.sharding.planner.calibrate [--out PATH] [--ranks 2]

Writes JSON (bytes/s, keyed by Topology field) to ``NEO_CALIBRATION`` or
``~/.cache/neo/calibration.json``, which ``neo_plugins.topology.local`` reads. ``lookup_fwd_id_s``,
``lookup_bwd_id_s``, ``collective_latency_s``, ``bucketize_id_s``, ``reduce_scatter_bw`` and
``all_gather_bw`` feed the CPU cost model (docs/cost_model.md, "CPU calibration"); the other
extra keys (``lookup_rate_ids_per_s``, ``gloo_latency_s``, ``torchrec_step_*``,
``lookup_concurrency_slowdown``) are informational; ``allreduce_bw`` prices data-parallel
gradient all-reduces, ``codec_bw`` the encoding and decoding compression adds to a collective. Takes about 20 s on an idle 2-core machine.

Run by torchrun on every machine of several (``torchrun --nnodes=N --nproc-per-node=L ...
$(command -v neo) calibrate``), it measures the network between them instead: each rank
exchanges 32 MiB with its counterpart on the next machine, all ranks at once (as they send in
an all-to-all), and every machine's local rank 0 writes ``inter_node_bw`` (bytes/s a rank) into
its calibration file, keeping the file's other figures, with the machines and ranks it was
measured between. The ``local`` topology plans several machines with it; a file's
``inter_node_bw`` without that record is one machine's loopback, which it does not take for
the network.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from queue import Empty
from typing import Any

import torch

from neo_core.errors import CalibrationError
from neo_core.topology import MAX_BW


def _best(fn: Any, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memory_bandwidth(mib: int = 256) -> float:
    """Bytes/s of a large tensor copy (read + write), one thread (as one rank runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.empty(mib * 2**20 // 4, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src)
        return 2 * src.numel() * 4 / _best(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(threads)


def lookup_rate(rows: int = 2_000_000, dim: int = 64, batch: int = 4096, pooling: int = 16) -> tuple[float, float]:
    """(row bytes/s, ids/s) of pooled embedding lookups on random ids."""
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    ids = torch.randint(0, rows, (batch * pooling,))
    offsets = torch.arange(0, batch * pooling, pooling)
    with torch.no_grad():
        t = _best(lambda: bag(ids, offsets))
    return ids.numel() * dim * 4 / t, ids.numel() / t


def lookup_costs(
    rows: int = 500_000, dims: tuple[int, ...] = (16, 32, 64, 128), batch: int = 4096, pooling: int = 16
) -> dict[str, float]:
    """Per-id costs of FBGEMM's fused CPU kernel (one thread, as one rank runs), fitted to the cost model.

    The cost model charges a lookup ``bytes / device_memory_bw`` (docs/cost_model.md); on CPUs
    a per-id part (index handling, sorting ids for the fused update) adds to that. Forward and
    fused-backward times per id at four widths are fitted together (least squares) as
    ``modelled bytes / device_memory_bw + lookup_{fwd,bwd}_id_s``: one bandwidth (slope), one
    intercept per direction.
    """
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        OptimType,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = batch * pooling
        ids = torch.randint(0, rows, (n,))
        offsets = torch.arange(0, n + 1, pooling)
        tbes = [
            SplitTableBatchedEmbeddingBagsCodegen(
                [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                optimizer=OptimType.EXACT_ROWWISE_ADAGRAD,
                learning_rate=0.01,
            )
            for dim in dims
        ]
        t_f, t_b = [float("inf")] * len(dims), [float("inf")] * len(dims)
        for rep in range(16):  # widths interleaved, so a busy moment of the machine hits them alike
            for i, tbe in enumerate(tbes):
                start = time.perf_counter()
                out = tbe(ids, offsets)
                mid = time.perf_counter()
                out.backward(torch.ones_like(out))
                end = time.perf_counter()
                if rep:  # the first round warms up
                    t_f[i], t_b[i] = min(t_f[i], mid - start), min(t_b[i], end - mid)
        fwd, bwd, fbytes, bbytes = [], [], [], []
        for i, dim in enumerate(dims):
            rb = -(-dim * 4 // 64) * 64  # row bytes at the CPU access granularity
            out_b = dim * 4 / pooling  # pooled output per id
            fwd.append(t_f[i] / n)
            bwd.append(t_b[i] / n)
            fbytes.append(8 + rb + out_b)
            bbytes.append(2 * (rb + 4) + out_b)
    finally:
        torch.set_num_threads(threads)
    import numpy as np

    k = len(dims)
    design = np.zeros((2 * k, 3))  # columns: bytes, forward indicator, backward indicator
    design[:k, 0], design[k:, 0] = fbytes, bbytes
    design[:k, 1], design[k:, 2] = 1.0, 1.0
    (slope, fwd_id, bwd_id), *_ = np.linalg.lstsq(design, np.array(fwd + bwd), rcond=None)
    # a noisy machine: fall back to bytes alone, where the fit's slope is not positive, or so
    # nearly flat that its bandwidth (over 1 PB/s) is no memory's and the topology refuses it
    if slope <= 1.0 / MAX_BW:
        slope, fwd_id, bwd_id = sum(fwd + bwd) / sum(fbytes + bbytes), 0.0, 0.0
    return {
        "device_memory_bw": float(1.0 / slope),
        "lookup_fwd_id_s": max(0.0, float(fwd_id)),
        "lookup_bwd_id_s": max(0.0, float(bwd_id)),
    }


def bucketize_cost(rows: int = 200_000, ids: int = 147_456, pooling: int = 32) -> float:
    """Seconds per id of FBGEMM's block bucketization (row-wise input split), one thread."""
    import fbgemm_gpu  # noqa: F401  (registers the fbgemm operators)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        values = torch.randint(0, rows, (ids,))
        lengths = torch.full((ids // pooling,), pooling)
        block = torch.tensor([-(-rows // 2)])
        op = torch.ops.fbgemm.block_bucketize_sparse_features
        return _best(lambda: op(lengths, values, False, False, block, 2), repeat=7) / ids
    finally:
        torch.set_num_threads(threads)


def measure_codec(values: int = 1 << 19) -> float:
    """Bytes/s of fp32 values FBGEMM's quantized-communication codec (TorchRec's qcomms) encodes
    to fp16 and decodes back, one thread: the work compression adds to each all-to-all."""
    from fbgemm_gpu.quantize_comm import QuantizedCommCodec
    from fbgemm_gpu.split_embedding_configs import SparseType

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        codec = QuantizedCommCodec(SparseType.FP16)
        x = torch.randn(values)
        return values * 4 / _best(lambda: codec.decode(codec.encode(x)), repeat=7)
    finally:
        torch.set_num_threads(threads)


def _collectives(rank: int, world: int, port: int, out: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    big = torch.ones(8 * 2**20 // 4)  # 8 MiB per rank
    recv = torch.empty_like(big)
    tiny, tiny_out = torch.ones(world), torch.empty(world)
    dist.barrier()
    a2a = _best(lambda: dist.all_to_all_single(recv, big))
    ar = _best(lambda: dist.all_reduce(big))
    lat = _best(lambda: dist.all_to_all_single(tiny_out, tiny), repeat=20)
    part = torch.empty(big.numel() // world)
    rs = _best(lambda: dist.reduce_scatter_single(part, big))
    ag = _best(lambda: dist.all_gather_single(recv, part))
    if rank == 0:
        sent = big.numel() * 4 * (world - 1) / world
        out.put({
            "a2a": sent / a2a, "allreduce": 2 * sent / ar, "latency": lat,
            "reduce_scatter": sent / rs, "all_gather": sent / ag,
        })
    dist.destroy_process_group()


def _one_table_ranks(rank: int, world: int, port: int) -> None:
    """Join the calibration's gloo group, one torch thread a rank (as each training rank runs)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _one_table_dmp(world: int, rows: int, dim: int, compression: str = "none") -> Any:
    """One table-wise table on rank 0 under DMP on the fused kernel, its collectives sent in
    ``compression``'s precisions."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from neo_core.api import make_context
    from neo_core.sharding import PlanResult, TableAssignment
    from neo_core.topology import Topology
    from neo_core.torchrec_plan import build_sharding_plan
    from neo_plugins.sharding.sharders import make_sharders

    topo = Topology("calibration", 1, world, "cpu", 2**30, 2**30, 1e9, 1e9, 1e9, 1e9, 1e9)
    ctx = make_context(topo, 1, compressor=compression)
    sharders = make_sharders(ctx)
    result = PlanResult("calibration", [TableAssignment("t", "table_wise", "fused", [0])], [], 1, {})
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", num_embeddings=rows, embedding_dim=dim, feature_names=["f"])],
        device=torch.device("meta"),
    )
    return DistributedModelParallel(
        ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        plan=build_sharding_plan(ebc, result, ctx, sharders), sharders=sharders,
    )


def _one_table_batch(rows: int, batch: int, pooling: int) -> Any:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.randint(0, rows, (batch * pooling,)),
        lengths=torch.full((batch,), pooling, dtype=torch.long),
    )


def _fastest_steps(steps: list[tuple[Any, Any]], rounds: int) -> list[float]:
    """Each (model, batch) stepped forward and backward ``rounds`` times, interleaved, from
    barrier to barrier (the slower rank bounds it); the fastest after 3 warm-up rounds."""
    import torch.distributed as dist

    times = [float("inf")] * len(steps)
    for rep in range(rounds):
        for i, (dmp, kjt) in enumerate(steps):
            dist.barrier()
            start = time.perf_counter()
            dmp(kjt).values().sum().backward()
            dist.barrier()
            if rep >= 3:  # warm-up
                times[i] = min(times[i], time.perf_counter() - start)
    return times


def _torchrec_steps(rank: int, world: int, port: int, out: Any) -> None:
    """Step times of one table-wise table on rank 0 (DMP, fused kernel) at a small and a large batch."""
    import torch.distributed as dist

    _one_table_ranks(rank, world, port)
    rows, dim = 20_000, 16
    dmp = _one_table_dmp(world, rows, dim)
    times = _fastest_steps([(dmp, _one_table_batch(rows, batch, pooling)) for batch, pooling in _TORCHREC_SIZES], 64)
    if rank == 0:
        out.put({"times": times, "dim": dim})
    dist.destroy_process_group()


# (rows, dim, batch per rank) of the table the codec steps send: one id per sample of wide rows,
# so that the all-to-alls of pooled rows, which compression changes, are most of the step
_CODEC_TABLE = (20_000, 128, 1024)


def _codec_steps(rank: int, world: int, port: int, out: Any) -> None:
    """Step times of one table-wise table on rank 0 (DMP, fused kernel) sending its pooled rows
    and their gradients in fp32 and in fp16, interleaved: what TorchRec's quantized
    communication adds to a step beyond the bytes it saves."""
    import torch.distributed as dist

    _one_table_ranks(rank, world, port)
    rows, dim, batch = _CODEC_TABLE
    kjt = _one_table_batch(rows, batch, 1)
    times = _fastest_steps([(_one_table_dmp(world, rows, dim, c), kjt) for c in ("none", "fp16")], 40)
    if rank == 0:
        out.put({"times": times})
    dist.destroy_process_group()


def codec_cost(world: int, a2a_bw: float, alone: float) -> float:
    """``codec_bw``: fp32 bytes a second that TorchRec's quantized communication encodes and
    decodes, as a compressed all-to-all costs it in a step. An fp16 step of one table-wise
    table sends ``E = 2 G d`` elements (pooled rows and their gradients), each encoded and
    decoded (``4 E / Z``, as the cost model charges it to the table's rank) and 2 bytes fewer
    (``2 E`` at the all-to-all's seconds per byte), so ``t16 - t32 = 4 E / Z - 2 E a``. No
    faster than the codec alone (``alone``, :func:`measure_codec`), which is taken where noise
    leaves no cost to see."""
    t32, t16 = _spawn(_codec_steps, world)["times"]
    _, dim, batch = _CODEC_TABLE
    elements = 2 * batch * world * dim
    per_element = (t16 - t32) / elements + 2 * (world - 1) / world / a2a_bw
    return min(4 / per_element, alone) if per_element > 0 else alone


def _concurrency(rank: int, world: int, port: int, out: Any) -> None:
    """One fused lookup step (forward, backward, update) on rank 0 alone, then on every rank at once."""
    import torch.distributed as dist
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        OptimType,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows, dim, n, pooling = 500_000, 64, 65_536, 16
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=OptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
    )
    ids, offsets = torch.randint(0, rows, (n,)), torch.arange(0, n + 1, pooling)

    def step() -> float:
        start = time.perf_counter()
        pooled = tbe(ids, offsets)
        pooled.backward(torch.ones_like(pooled))
        return time.perf_counter() - start

    for _ in range(3):
        step()
    alone, together = [], []
    for _ in range(15):
        dist.barrier()
        if rank == 0:
            alone.append(step())
        dist.barrier()
        together.append(step())
    dist.barrier()
    if rank == 0:
        out.put({"alone": min(alone), "together": min(together)})
    dist.destroy_process_group()


# (batch per rank, ids per sample) of the two TorchRec step measurements
_TORCHREC_SIZES = ((16, 1), (1024, 16))


def _spawn(target: Any, world: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300
    while True:  # a rank that fails leaves the others waiting: stop them and say which
        try:
            result = queue.get(timeout=1.0)
            break
        except Empty:
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if not failed and time.monotonic() <= deadline:
                continue
            try:  # the result may have arrived just as a rank failed while tearing down
                result = queue.get(timeout=0.5)
                break
            except Empty:
                pass
            for p in procs:
                p.kill()
                p.join()
            what = (
                "rank(s) " + ", ".join(f"{r} (exit code {procs[r].exitcode})" for r in failed) + " failed"
                if failed else "no result in 300 s"
            )
            raise CalibrationError(f"calibration step {target.__name__.strip('_')} on {world} ranks: {what}.") from None
    for p in procs:
        p.join()
    return result


def torchrec_overheads(world: int, kernel_costs: dict[str, float], a2a_bw: float) -> dict[str, float]:
    """TorchRec's costs beyond kernels and bandwidth, from two steps of one table-wise table.

    The small step (a few ids) is almost all fixed cost: one input, one output and one gradient
    all-to-all with their bookkeeping, so ``collective_latency_s`` is a third of it. The large
    step's excess over the cost model's kernel and all-to-all time, per id, is the per-id
    cost of TorchRec's input pipeline (splitting, permuting, bounds checks), added to
    ``lookup_fwd_id_s``.
    """
    got = _spawn(_torchrec_steps, world)
    (t_small, t_large), dim = got["times"], got["dim"]
    (b0, p0), (b1, p1) = _TORCHREC_SIZES
    bw = kernel_costs["device_memory_bw"]
    rb = -(-dim * 4 // 64) * 64
    per_id_model = (
        (8 + rb + 2 * (rb + 4)) / bw + kernel_costs["lookup_fwd_id_s"] + kernel_costs["lookup_bwd_id_s"]
    )
    a2a_share = (world - 1) / world / a2a_bw  # seconds per byte sent, all-to-all
    n0, n1 = b0 * p0 * world, b1 * p1 * world  # ids rank 0 looks up per step
    model0 = n0 * per_id_model + (n0 * 8 + 2 * b0 * world * dim * 4) * a2a_share
    model1 = n1 * per_id_model + (n1 * 8 + 2 * b1 * world * dim * 4) * a2a_share
    fixed = max(t_small - model0, 0.0)
    per_id = max((t_large - model1 - fixed) / n1, 0.0)
    return {
        "collective_latency_s": fixed / 3,
        "lookup_fwd_id_s": kernel_costs["lookup_fwd_id_s"] + per_id,
        "torchrec_step_small_s": t_small,
        "torchrec_step_large_s": t_large,
    }


def collective_bandwidth(world: int = 2) -> dict[str, float]:
    return _spawn(_collectives, world)


def calibrate(world: int = 2) -> dict[str, float]:
    """All measurements, in the calibration file's format."""
    copy_bw = memory_bandwidth()
    _, ids = lookup_rate()
    costs = lookup_costs()
    coll = collective_bandwidth(world)
    overheads = torchrec_overheads(world, costs, coll["a2a"])
    conc = _spawn(_concurrency, world)
    return {
        **costs,
        **overheads,
        "bucketize_id_s": bucketize_cost(),
        "reduce_scatter_bw": coll["reduce_scatter"],
        "all_gather_bw": coll["all_gather"],
        "host_memory_bw": copy_bw,
        "host_to_device_bw": copy_bw,
        "intra_node_bw": coll["a2a"],
        "inter_node_bw": coll["a2a"],
        "allreduce_bw": coll["allreduce"],
        "codec_bw": codec_cost(world, coll["a2a"], measure_codec()),
        "gloo_latency_s": coll["latency"],
        "lookup_rate_ids_per_s": ids,
        "lookup_concurrency_slowdown": conc["together"] / conc["alone"],
        "measured_at": time.time(),
        "ranks": world,  # the collectives' figures are this many ranks'
    }


NETWORK_MIB = 32  # a rank's message to its counterpart: large enough that latency is a small part


def network_bandwidth(rank: int, world: int, per_machine: int, repeat: int = 5) -> float:
    """Bytes/s a rank sends to another machine while every rank does (its counterpart on the
    next machine), the slowest rank's, best of ``repeat``; in a process group formed already."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    send = torch.ones(NETWORK_MIB * 2**20 // 4)
    recv = torch.empty_like(send)
    to, frm = (rank + per_machine) % world, (rank - per_machine) % world

    def exchange() -> None:
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]):
            req.wait()

    exchange()  # the connections are made on first use
    best = float("inf")
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        exchange()
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's: all send at once
        best = min(best, float(took))
    return send.numel() * 4 / best


def _read_record(path: Path) -> dict[str, Any]:
    """The calibration file at ``path`` as a dict; empty where there is none, or it is
    unreadable, not JSON, not text or not an object."""
    try:
        read = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return read if isinstance(read, dict) else {}


def _merged(path: Path, figures: dict[str, Any]) -> dict[str, Any]:
    """The calibration file at ``path`` with ``figures`` written over its own; an unreadable
    one is replaced, and said so."""
    data = _read_record(path)
    if path.is_file() and not data:
        print(f"warning: {path} was not a calibration file `neo calibrate` writes; replaced by the network's "
              "figure alone (run `neo calibrate` on one machine for the others)", file=sys.stderr)
    return {**data, **figures}


NETWORK_KEYS = ("inter_node_bw", "inter_node_machines", "inter_node_ranks_per_machine", "inter_node_measured_at",
                "inter_node_hosts")


def _write_whole(path: Path, data: dict[str, Any]) -> None:
    """``data`` as ``path``'s JSON, replaced whole (another machine may write a shared file at
    the same time); where ``path`` is a link, the file it points to is written."""
    target = path.resolve()
    part = target.with_name(f".{target.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        part.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def calibrate_network(path: Path, unwritable: str | None) -> None:
    """Under a launch over several machines (torchrun's ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE``):
    measure the network between them and write it into every machine's calibration file.
    ``unwritable``: why this machine's file cannot be written, found before measuring. Every
    rank learns what every other found (a path that cannot be written, machines of unequal rank
    counts, a write that failed), so all stop alike rather than some waiting on the others."""
    import torch.distributed as dist

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    host = socket.gethostname()
    dist.init_process_group("gloo")
    try:
        said: list[Any] = [None] * world
        dist.all_gather_object(said, (local, host, unwritable))
        counts = sorted({c for c, _, _ in said})
        if len(counts) > 1 or world % counts[0]:
            raise CalibrationError(
                f"the machines run unequal numbers of ranks ({', '.join(map(str, counts))} a machine, "
                f"{world} in all): start as many on each (torchrun --nproc-per-node), as the training will run.")
        refused = [(h, why) for _, h, why in said if why]
        if refused:
            raise CalibrationError(f"on {refused[0][0]}: {refused[0][1]}")
        per_machine, machines = counts[0], world // counts[0]
        hosts = sorted({h for _, h, _ in said})
        if rank == 0:
            print(f"measuring the network between {machines} machines ({per_machine} rank(s) each, "
                  f"{NETWORK_MIB} MiB a rank at once) ...", file=sys.stderr, flush=True)
            if len(hosts) < machines:  # torchrun's agents started on one host by mistake: its loopback
                print(f"warning: the {machines} machines are {len(hosts)} host(s) ({', '.join(hosts)}): ranks of one "
                      "host talk through its loopback, not the network; start torchrun once on every machine",
                      file=sys.stderr, flush=True)
        bw = network_bandwidth(rank, world, per_machine)
        failed = None
        if int(os.environ.get("LOCAL_RANK", rank % per_machine)) == 0:  # one writer a machine
            data = _merged(path, {
                "inter_node_bw": bw,
                "inter_node_machines": machines,
                "inter_node_ranks_per_machine": per_machine,
                "inter_node_measured_at": time.time(),
                "inter_node_hosts": len(hosts),  # fewer than the machines: a loopback's figure (plans say so)
            })
            try:
                _write_whole(path, data)
            except OSError as exc:
                failed = f"{path} ({exc.strerror})"
        written: list[Any] = [None] * world
        dist.all_gather_object(written, (host, failed))
    finally:
        dist.destroy_process_group()
    failures = [(h, f) for h, f in written if f]
    if failures:
        raise CalibrationError(
            f"cannot write the calibration to {failures[0][1]} on {failures[0][0]}"
            + (f" (and on {len(failures) - 1} more machine(s))" if len(failures) > 1 else "")
            + f": the network gave inter_node_bw={bw:.4g} bytes/s ({bw / 1e9:.3f} GB/s a rank); give "
            f"topology.inter_node_bw_gbps={bw / 1e9:.3g} instead."
        )
    if rank != 0 and int(os.environ.get("LOCAL_RANK", rank % per_machine)) == 0:  # each machine says its own
        print(f"wrote {path} on this machine ({host}): inter_node_bw {bw / 1e9:.3f} GB/s a rank, between {machines} "
              f"machines of {per_machine} rank(s)")
    if rank == 0:
        print(f"{'inter_node_bw':>24}: {bw / 1e9:.3f} GB/s a rank, between {machines} machines of {per_machine} rank(s)")
        print(f"wrote {path} on each machine: the local topology plans {machines} machines of CPU ranks with it")
        if torch.cuda.is_available():  # local on CUDA devices reads no calibration file
            print(f"note: CUDA ranks plan with assumed figures, not this file's: give them topology.inter_node_bw_gbps="
                  f"{bw / 1e9:.3g} (gloo's figure; NCCL's may be higher)")


def _kept_network(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a calibration of this machine) with the network figure the file at ``path``
    holds, where ``neo calibrate`` under torchrun measured it between machines: a calibration
    of one machine does not measure the network, so it keeps it (and says so)."""
    old = _read_record(path)
    machines, bw = old.get("inter_node_machines"), old.get("inter_node_bw")
    if not (isinstance(machines, int) and not isinstance(machines, bool) and machines >= 2) or \
            isinstance(bw, bool) or not isinstance(bw, (int, float)):
        return data
    print(f"note: kept the network figure {path} had, measured between {machines} machines (inter_node_bw="
          f"{bw / 1e9:.3f} GB/s a rank)", file=sys.stderr)
    return {**data, **{k: old[k] for k in NETWORK_KEYS if k in old}}


def _launched_over_machines(parser: argparse.ArgumentParser, ranks_given: bool, nice_given: bool) -> bool:
    """Whether a launcher started this process as one rank of several machines (then the
    network is measured); a launch on one machine is refused, as its ranks would each measure
    the machine and write one file at once. Decided alike in every rank of a launch: by
    whether the machine holds fewer ranks than the launch."""
    from neo_core.training import started_as_rank

    if not started_as_rank():
        return False
    world = os.environ["WORLD_SIZE"]
    if not world.isdigit() or int(world) < 2:
        return False  # one rank: it measures this machine, as without a launcher
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if not local.isdigit() or int(local) >= int(world):
        parser.error(f"started as one of {world} ranks on one machine (LOCAL_WORLD_SIZE="
                     f"{local or 'unset'}): run neo calibrate without torchrun to measure this "
                     "machine (it starts its own --ranks), or by torchrun on every machine of several (--nnodes) to "
                     "measure the network between them")
    if ranks_given:
        parser.error("--ranks is for one machine; under torchrun over several machines the ranks are torchrun's")
    if nice_given:
        parser.error("--nice is for one machine's measurement; the network's is measured without it")
    return True


def main(out: str | None = None, argv: Sequence[str] | None = None) -> None:
    """Command line entry; ``neo calibrate --output PATH`` calls it with ``out`` and its other
    flags as ``argv``."""
    from neo_plugins.topology.local import calibration_path

    # run as `neo calibrate`: its usage and errors name that command and its --output flag
    flag = "--output" if out is not None else "--out"
    parser = argparse.ArgumentParser(prog="neo calibrate" if out is not None else None,
                                     description=__doc__.splitlines()[0])
    parser.add_argument(flag, dest="out", default=None, metavar=flag.lstrip("-").upper(), help="calibration JSON path")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks that measure the collectives: a power of two, 2 or more (as many as will train)")
    parser.add_argument(
        "--nice", type=int, default=0,
        help="measure this much above normal priority (needs root): concurrent jobs disturb it less",
    )
    args = parser.parse_args(list(argv or ()) if out is not None else argv)
    network = _launched_over_machines(parser, args.ranks != parser.get_default("ranks"), args.nice != 0)
    # the collectives split an 8 MiB buffer evenly over the ranks
    if args.ranks < 2 or args.ranks & (args.ranks - 1):
        parser.error(f"--ranks {args.ranks}: use a power of two, at least 2 (the collectives need 2 or more ranks)")
    if args.nice < 0:
        parser.error(f"--nice {args.nice}: give how far above normal priority, 0 or more")
    if args.out is not None and not args.out.strip():  # not the default file, which every local plan reads
        parser.error(f"{flag} is empty; give a file path, or leave {flag} out to write {calibration_path()}")
    path = Path(out or args.out) if (out or args.out) else calibration_path()
    unwritable = None
    try:  # before measuring, so the measurements are not lost to a bad path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() or not os.access(path if path.exists() else path.parent, os.W_OK):
            raise PermissionError
    except OSError:
        folder = f" ({path} is a folder: give a file in it, e.g. {path / 'calibration.json'})" if path.is_dir() else ""
        unwritable = f"cannot write the calibration to {path}{folder}; choose another path."
    if network:  # every machine learns of another's bad path, rather than waiting for it
        calibrate_network(path, unwritable)
        return
    if unwritable:
        raise CalibrationError(unwritable)
    # one rank of torchrun: the ranks it starts below form their own group, not one on torchrun's
    # store (inherited, this made each wait 300 s for a store that has no server)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    if args.nice:
        try:
            os.nice(-args.nice)  # inherited by the spawned ranks
        except PermissionError:
            parser.error(f"--nice {args.nice} needs root (raising priority); run without --nice")
    # about 15 s with nothing to show until the figures: say what runs, and that a busy machine
    # takes longer (61 s, said as 15 s)
    print(f"measuring this machine's memory bandwidth, lookup rate, gloo collectives and compression's codec on {args.ranks} ranks "
          "(about 20 s on an idle machine, longer on a busy one) ...", file=sys.stderr, flush=True)
    data = _kept_network(path, calibrate(args.ranks))
    try:  # a path that passed the check can still refuse the write (/proc, a full disk)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        print(json.dumps(data, indent=2))  # the measurements, so they are not lost
        raise CalibrationError(
            f"cannot write the calibration to {path} ({exc.strerror}); the figures are printed above: save them "
            "to a file and point NEO_CALIBRATION (or topology.calibration) at it."
        ) from None
    for k, v in data.items():
        if k in NETWORK_KEYS[1:]:
            continue  # the record of the network figure kept (said above)
        if k == "measured_at":
            print(f"{k:>24}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(v))}")
        else:
            print(f"{k:>24}: {v / 1e9:.3f} GB/s" if k.endswith("_bw") else f"{k:>24}: {v:.6g}")
    # a fit's per-id cost at or below zero is stored as 0, which plans then price at nothing: a
    # measurement a busy machine spoilt, not this machine's figure
    clamped = [k for k in ("lookup_fwd_id_s", "lookup_bwd_id_s") if data.get(k) == 0]
    if clamped:
        print(f"warning: {' and '.join(clamped)} came out at or below zero in the fit and were stored as 0, as on a "
              "busy machine: plans with this file price that per-id work at nothing; re-run `neo calibrate` on an "
              "otherwise idle machine.", file=sys.stderr)
    if path.absolute() == calibration_path().absolute():
        print(f"wrote {path}: the local topology plans with it from now on")
    else:
        print(f"wrote {path}: plan with it by topology.calibration={path} (or NEO_CALIBRATION={path})")


if __name__ == "__main__":
    from neo_core.cli import user_errors

    with user_errors():
        main()
