"""Two gloo ranks on this machine, for the benches of single collectives: spawned with one
torch thread each, calls timed barrier to barrier, rank 0's figures returned."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from neo_core.training.interrupt import rank_entry


def fastest(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn``, barrier to barrier (other jobs on the
    machine add noise, never remove it); with ``fn`` doing nothing, the barrier's own time."""
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        best = min(best, time.perf_counter() - start)
    return best


def _entry(rank: int, target: Callable[..., dict[str, Any]], port: int, out: str, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = target(rank, *args)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_pair(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``target(rank, *args)`` on two gloo ranks; returns rank 0's result (a JSON object)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.json")
        # each rank leaves without the interpreter's teardown, where a rank holding a gloo group
        # was seen to abort ("terminate called without an active exception") after its work
        mp.spawn(rank_entry, args=(_entry, target, port, out, args), nprocs=2)
        return json.loads(Path(out).read_text())


def write_result(path: Path, settings: dict[str, Any], barrier_s: float, rows: list[dict[str, Any]]) -> None:
    """A bench's JSON: its settings, the barrier time taken off, this machine, its rows."""
    machine = f"{os.cpu_count()} cpus, torch {torch.__version__}"
    path.write_text(json.dumps({**settings, "barrier_s": barrier_s, "machine": machine, "rows": rows}, indent=2) + "\n")
    print(f"wrote {path}")


def pair_args(parser: Any, argv: list[str] | None, mib: int, mib_help: str, repeats: int, repeats_help: str) -> Any:
    """A two-rank bench's arguments: ``--mib``, ``--repeats`` (each at least 1) and ``--json``
    (a file that can be written), parsed from ``argv``."""
    from args import check_writable

    parser.add_argument("--mib", type=int, default=mib, help=mib_help)
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag, value in (("--mib", args.mib), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    check_writable(parser, "--json", args.json)
    return args
