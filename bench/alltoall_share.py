"""Does the share of an all-to-all that stays on its rank cost link time? Measured on gloo.

    .venv/bin/python bench/alltoall_share.py [--mib 16] [--repeats 9] [--json X.json]

The two cost models disagree on this for every table-wise and column-wise shard: TorchRec's
estimator charges a shard's whole pooled output to the link, Neo's cost model only the
share that leaves the rank, ``(W-1)/W`` of it in one node (docs/cost_model.md). Two gloo
ranks (one torch thread each) exchange the same buffer per rank in ``all_to_all_single``,
with a growing share of it addressed to the rank itself: 0 (everything crosses), then 1/4,
1/2, 3/4 and all of it. Neo predicts the time to fall with the bytes that cross, TorchRec a
time that does not change. Each share is timed as the fastest of ``--repeats`` calls (other
jobs on the machine add noise, never remove it), the shares interleaved per round; the
figures are rank 0's clock between barriers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from args import check_writable  # noqa: E402

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)  # of each rank's buffer addressed to itself


def _rank(rank: int, port: int, mib: int, repeats: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        n = mib * 2**20 // 4
        send, recv = torch.full((n,), float(rank + 1)), torch.empty(n)
        best = {s: float("inf") for s in SHARES}
        for repeat in range(repeats):
            for share in SHARES:
                own = int(n * share)
                splits = [own, n - own] if rank == 0 else [n - own, own]  # [to rank 0, to rank 1]
                dist.barrier()
                start = time.perf_counter()
                dist.all_to_all_single(recv, send, output_split_sizes=splits, input_split_sizes=splits)
                dist.barrier()
                best[share] = min(best[share], time.perf_counter() - start)
                if repeat == 0:  # the kept share came from this rank, the rest from the other
                    kept = recv[:own] if rank == 0 else recv[n - own:]
                    came = recv[own:] if rank == 0 else recv[:n - own]
                    if not (bool((kept == rank + 1).all()) and bool((came == 2 - rank).all())):
                        raise RuntimeError(f"rank {rank}: the exchange at share {share} did not split as asked")
        # the barrier's own time, taken off every figure
        barrier = float("inf")
        for _ in range(repeats * 4):
            dist.barrier()
            start = time.perf_counter()
            dist.barrier()
            barrier = min(barrier, time.perf_counter() - start)
        if rank == 0:
            Path(out).write_text(json.dumps({"best_s": {str(s): t for s, t in best.items()}, "barrier_s": barrier}))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16, help="MiB each rank sends (default 16)")
    parser.add_argument("--repeats", type=int, default=9, help="calls per share; the fastest is kept")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag, value in (("--mib", args.mib), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    check_writable(parser, "--json", args.json)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"alltoall_share_{os.getpid()}.json"
    try:
        mp.spawn(_rank, args=(port, args.mib, args.repeats, str(out)), nprocs=2)
        raw = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    barrier = raw["barrier_s"]
    times = {float(s): max(t - barrier, 0.0) for s, t in raw["best_s"].items()}
    whole = max(times[0.0], 1e-9)  # everything crosses: the reference for both models
    buffer = args.mib * 2**20
    rows = []
    print(f"2 gloo ranks, {args.mib} MiB per rank, fastest of {args.repeats} calls, barrier {barrier * 1e6:.0f} us taken off")
    print(f"{'share kept':>10} {'bytes crossing':>15} {'measured ms':>12} {'/ all cross':>12} {'Neo':>6} {'TorchRec':>9}")
    for share in SHARES:
        t = times[share]
        row = {"share_kept": share, "bytes_crossing": buffer * (1 - share), "measured_s": t,
               "over_all_crossing": t / whole, "neo": 1 - share, "torchrec": 1.0}
        rows.append(row)
        print(f"{share:>10.2f} {row['bytes_crossing'] / 2**20:>11.1f} MiB {t * 1e3:>12.2f} {t / whole:>12.2f} "
              f"{row['neo']:>6.2f} {row['torchrec']:>9.2f}")
    print(f"(columns Neo and TorchRec: each model's time for the share, over its time when everything crosses; "
          f"{buffer * 1e-9 / whole:.2f} GB/s per rank when everything crosses)")
    if args.json:
        args.json.write_text(json.dumps({"mib": args.mib, "repeats": args.repeats, "barrier_s": barrier,
                                         "machine": f"{os.cpu_count()} cpus, torch {torch.__version__}",
                                         "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
