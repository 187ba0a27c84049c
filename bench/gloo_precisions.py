"""What a precision saves each gloo collective that compression sends in: measured on 2 ranks.

    .venv/bin/python bench/gloo_precisions.py [--mib 4] [--repeats 25] [--json X.json]

Compression halves the bytes of the pooled rows' all-to-all and of the row-split tables'
reduce-scatter. On a network the bytes are the time; on gloo between CPU ranks a
reduce-scatter also sums what it receives, element by element, in the precision sent, so
halving its bytes need not halve its time (the cost model's ``fs`` in time, docs/cost_model.md).
Two gloo ranks (one torch thread each) run ``reduce_scatter_tensor`` and ``all_to_all_single``
on the same number of elements in fp32, fp16 and bf16, each the fastest of ``--repeats`` calls,
the precisions interleaved per round; rank 0's clock between barriers.
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

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _measure(rank: int, mib: int, repeats: int) -> dict[str, Any]:
    n = mib * 2**20 // 4  # elements: an fp32 buffer of ``mib`` MiB
    calls = {}
    for name, dtype in PRECISIONS.items():
        send = torch.full((n,), float(rank + 1), dtype=dtype)
        scattered, exchanged = torch.empty(n // 2, dtype=dtype), torch.empty(n, dtype=dtype)

        def reduce_scatter(send: torch.Tensor = send, out: torch.Tensor = scattered) -> None:
            dist.reduce_scatter_tensor(out, send)

        def all_to_all(send: torch.Tensor = send, out: torch.Tensor = exchanged) -> None:
            dist.all_to_all_single(out, send)

        reduce_scatter()
        if not bool((scattered == 3).all()):  # 1 + 2, summed in every precision
            raise RuntimeError(f"rank {rank}: the {name} reduce-scatter did not sum the two ranks' values")
        calls[f"{name} reduce-scatter"], calls[f"{name} all-to-all"] = reduce_scatter, all_to_all
    best = {name: float("inf") for name in calls}
    for _ in range(repeats):  # interleaved, a call of each per round
        for name, call in calls.items():
            best[name] = min(best[name], fastest(call, 1))
    return {"best_s": best, "barrier_s": fastest(lambda: None, repeats * 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = pair_args(parser, argv, 4, "MiB of fp32 each rank sends, the same elements in each precision (default 4)",
                     25, "calls of each; the fastest is kept")
    raw = run_pair(_measure, args.mib, args.repeats)
    barrier = raw["barrier_s"]
    times = {name: max(t - barrier, 0.0) for name, t in raw["best_s"].items()}
    elements = args.mib * 2**20 // 4
    print(f"2 gloo ranks, {elements:,} elements per rank, fastest of {args.repeats} calls, barrier "
          f"{barrier * 1e6:.0f} us taken off")
    print(f"{'collective':<26} {'ms':>8} {'/ fp32':>8} {'bytes / fp32':>13}")
    rows = []
    for name, t in times.items():
        precision, collective = name.split(" ", 1)
        base = max(times[f"fp32 {collective}"], 1e-9)
        row = {"precision": precision, "collective": collective, "elements": elements, "measured_s": t,
               "over_fp32": t / base, "bytes_over_fp32": 1.0 if precision == "fp32" else 0.5}
        rows.append(row)
        print(f"{name:<26} {t * 1e3:>8.2f} {t / base:>8.2f} {row['bytes_over_fp32']:>13.2f}")
    if args.json:
        write_result(args.json, {"mib": args.mib, "repeats": args.repeats}, barrier, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
