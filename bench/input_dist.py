"""What sending the ids costs against sending the pooled embeddings, on gloo.

    .venv/bin/python bench/input_dist.py [--batch 4096] [--dim 64] [--repeats 15] [--json X.json]

Before a table-wise shard can look anything up, TorchRec's input distribution sends every
sample's ids for that table to the shard's rank (``KJTAllToAll``: splits, lengths, then the ids as
int64); after the lookup the pooled embeddings come back (``PooledEmbeddingsAllToAll``).
Neo's cost model charges both all-to-alls by their bytes: ``P ib`` per sample for the ids
(``ib = 8``, ``P`` the pooling factor) against ``d ob`` for the pooled row (``ob = 4``), so
the ids cost more than the pooled output once ``P > d/2``. TorchRec's estimator charges the
pooled output only. Two gloo ranks (one torch thread each) each own one of two features;
each rank sends the other feature's ids of its ``--batch`` samples to the other rank, and the
pooled rows back, at pooling factors 1 to 128. Each figure is the fastest of ``--repeats``
calls (rank 0's clock, barrier to barrier, the barrier's own time taken off).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from args import check_writable  # noqa: E402
from gloo_pair import fastest, run_pair, write_result  # noqa: E402

POOLING = (1, 8, 32, 128)


def _measure(rank: int, batch: int, dim: int, repeats: int) -> dict[str, Any]:
    from torchrec.distributed.dist_data import KJTAllToAll, PooledEmbeddingsAllToAll
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    pg = dist.group.WORLD
    ids_a2a = KJTAllToAll(pg, [1, 1])  # feature f0 to rank 0, f1 to rank 1
    pooled_a2a = PooledEmbeddingsAllToAll(pg, [dim, dim])
    # the pooled rows of the feature this rank owns, for both ranks' samples
    pooled = torch.randn(2 * batch, dim)
    gen = torch.Generator().manual_seed(rank)
    rows = {}
    for pooling in POOLING:
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["f0", "f1"], values=torch.randint(0, 1_000_000, (2 * batch * pooling,), generator=gen),
            lengths=torch.full((2 * batch,), pooling, dtype=torch.long),
        )
        got = ids_a2a(kjt).wait().wait()
        if got.values().numel() != 2 * batch * pooling or got.keys() != [f"f{rank}"]:  # its feature, both ranks'
            raise RuntimeError(f"rank {rank}: got {got.keys()} with {got.values().numel()} ids at pooling {pooling}")
        ids = fastest(lambda kjt=kjt: ids_a2a(kjt).wait().wait(), repeats)
        out_rows = fastest(lambda: pooled_a2a(pooled, batch_size_per_rank=[batch, batch]).wait(), repeats)
        rows[str(pooling)] = (ids, out_rows)
    return {"rows": rows, "barrier_s": fastest(lambda: None, repeats * 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank (default 4096)")
    parser.add_argument("--dim", type=int, default=64, help="embedding columns (default 64)")
    parser.add_argument("--repeats", type=int, default=15, help="calls per case; the fastest is kept")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag, value in (("--batch", args.batch), ("--dim", args.dim), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    check_writable(parser, "--json", args.json)
    raw = run_pair(_measure, args.batch, args.dim, args.repeats)
    barrier = raw["barrier_s"]
    rows = []
    print(f"2 gloo ranks, {args.batch} samples per rank, {args.dim} columns, fastest of {args.repeats} calls, "
          f"barrier {barrier * 1e6:.0f} us taken off")
    print(f"{'pooling':>7} {'ids ms':>8} {'pooled ms':>10} {'ids / pooled':>13} {'Neo (bytes)':>12} {'TorchRec':>9}")
    for pooling in POOLING:
        ids, pooled = (max(t - barrier, 1e-9) for t in raw["rows"][str(pooling)])
        row = {"pooling": pooling, "ids_s": ids, "pooled_s": pooled, "ids_over_pooled": ids / pooled,
               "neo": pooling * 8 / (args.dim * 4), "torchrec": 0.0}
        rows.append(row)
        print(f"{pooling:>7} {ids * 1e3:>8.2f} {pooled * 1e3:>10.2f} {row['ids_over_pooled']:>13.2f} "
              f"{row['neo']:>12.2f} {row['torchrec']:>9.2f}")
    print("(Neo, TorchRec: each model's ids time over its pooled-output time, bytes alone: "
          "Neo's fixed cost per all-to-all, its collective latency, comes on top of both)")
    if args.json:
        write_result(args.json, {"batch": args.batch, "dim": args.dim, "repeats": args.repeats}, barrier, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
