"""Measure this machine for the ``local`` topology: memory bandwidth, lookup rate, gloo collectives.

    .venv/bin/python -m neo_plugins.sharding.planner.calibrate [--out PATH] [--ranks 2]

Writes JSON (bytes/s, keyed by Topology field) to ``NEO_CALIBRATION`` or
``~/.cache/neo/calibration.json``, which ``neo_plugins.topology.local`` reads. Extra keys
(``lookup_rate_ids_per_s``, ``allreduce_bw``, ``collective_latency_s``) are informational.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch


def _best(fn: Any, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memory_bandwidth(mib: int = 256) -> float:
    """Bytes/s of a large tensor copy (read + write)."""
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best(lambda: dst.copy_(src))


def lookup_rate(rows: int = 2_000_000, dim: int = 64, batch: int = 4096, pooling: int = 16) -> tuple[float, float]:
    """(row bytes/s, ids/s) of pooled embedding lookups on random ids."""
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    ids = torch.randint(0, rows, (batch * pooling,))
    offsets = torch.arange(0, batch * pooling, pooling)
    with torch.no_grad():
        t = _best(lambda: bag(ids, offsets))
    return ids.numel() * dim * 4 / t, ids.numel() / t


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
    if rank == 0:
        sent = big.numel() * 4 * (world - 1) / world
        out.put({"a2a": sent / a2a, "allreduce": 2 * sent / ar, "latency": lat})
    dist.destroy_process_group()


def collective_bandwidth(world: int = 2) -> dict[str, float]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=300)
    for p in procs:
        p.join()
    return result


def calibrate(world: int = 2) -> dict[str, float]:
    """All measurements, in the calibration file's format."""
    copy_bw = memory_bandwidth()
    row_bw, ids = lookup_rate()
    coll = collective_bandwidth(world)
    return {
        "device_memory_bw": row_bw,
        "host_memory_bw": copy_bw,
        "host_to_device_bw": copy_bw,
        "intra_node_bw": coll["a2a"],
        "inter_node_bw": coll["a2a"],
        "allreduce_bw": coll["allreduce"],
        "collective_latency_s": coll["latency"],
        "lookup_rate_ids_per_s": ids,
        "measured_at": time.time(),
    }


def main() -> None:
    from neo_plugins.topology.local import calibration_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="calibration JSON path")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    data = calibrate(args.ranks)
    path = Path(args.out) if args.out else calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    for k, v in data.items():
        print(f"{k:>24}: {v / 1e9:.3f} GB/s" if k.endswith("_bw") else f"{k:>24}: {v:.6g}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
