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
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gloo_pair import fastest, pair_args, run_pair, write_result  # noqa: E402

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)  # of each rank's buffer addressed to itself


def _measure(rank: int, mib: int, repeats: int) -> dict[str, Any]:
    n = mib * 2**20 // 4
    send, recv = torch.full((n,), float(rank + 1)), torch.empty(n)
    exchanges = {}
    for share in SHARES:
        own = int(n * share)
        splits = [own, n - own] if rank == 0 else [n - own, own]  # [to rank 0, to rank 1]

        def exchange(splits: list[int] = splits) -> None:
            dist.all_to_all_single(recv, send, output_split_sizes=splits, input_split_sizes=splits)

        exchange()  # the kept share came from this rank, the rest from the other
        kept = recv[:own] if rank == 0 else recv[n - own:]
        came = recv[own:] if rank == 0 else recv[:n - own]
        if not (bool((kept == rank + 1).all()) and bool((came == 2 - rank).all())):
            raise RuntimeError(f"rank {rank}: the exchange at share {share} did not split as asked")
        exchanges[str(share)] = exchange
    best = {share: float("inf") for share in exchanges}
    for _ in range(repeats):  # the shares interleaved, a call of each per round
        for share, exchange in exchanges.items():
            best[share] = min(best[share], fastest(exchange, 1))
    return {"best_s": best, "barrier_s": fastest(lambda: None, repeats * 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = pair_args(parser, argv, 16, "MiB each rank sends (default 16)", 9, "calls per share; the fastest is kept")
    raw = run_pair(_measure, args.mib, args.repeats)
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
        write_result(args.json, {"mib": args.mib, "repeats": args.repeats}, barrier, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
