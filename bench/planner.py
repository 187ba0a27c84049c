"""Planner benchmark: Neo vs TorchRec's EmbeddingShardingPlanner on three suites.

    .venv/bin/python bench/planner.py [--out bench_planner.json] [--torchrec-timeout 120]
        [--suites mlperf_dcnv2 ...] [--ranks 8 16 ...] [--repeats 3] [--no-torchrec]

For each suite (MLPerf DLRM-DCNv2, production-like, 12T) and rank count (8, 16, 64, 128 on
ZionEX-shaped nodes of 8, global batch 65536): plan with Neo and with TorchRec's planner (in a
child process, skipped past the timeout), score both with TorchRec's estimator (max-rank
summed Perf.total, ms), give Neo's own predicted step time and lower bound, and time both
(Neo: the fastest of ``--repeats`` runs, 3 by default; TorchRec: one run, in a child process).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing as mp
import time
import warnings
from typing import Any

from neo_core.api import make_context
from neo_core.cache import CachePolicy
from neo_core.errors import PlanningError
from neo_core.kernels import EmbeddingKernel
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.tables import mlperf_dcnv2, production_like, zionex_12t

SUITES = {
    "mlperf_dcnv2": (mlperf_dcnv2, {}),
    # the production-like generator at 100 tables: the largest where TorchRec's planner finishes
    # within the per-case timeout on this machine (500 tables: over 10 minutes at 8 ranks)
    "production_like_100": (lambda: production_like(100), {}),
    "production_like": (production_like, {}),
    "zionex_12t": (zionex_12t, {"weight_bytes": 2, "cache_load_factor": 0.05}),
}
RANKS = (8, 16, 64, 128)
GLOBAL_BATCH = 65536


def _context(world: int, extra: dict[str, Any]) -> Any:
    kernel = EmbeddingKernel("fused", "fused", weight_bytes=extra.get("weight_bytes", 4))
    cache = CachePolicy("lru", load_factor=extra["cache_load_factor"]) if "cache_load_factor" in extra else None
    topo = {"name": "zionex", "num_nodes": max(1, world // 8), "devices_per_node": min(8, world)}
    return make_context(topo, GLOBAL_BATCH // world, kernel=kernel, cache=cache)


def _torchrec_child(suite: str, world: int, queue: Any) -> None:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from neo_plugins.sharding.planner.torchrec_score import torchrec_plan_and_score

    gen, extra = SUITES[suite]
    start = time.perf_counter()
    try:
        score, bound = torchrec_plan_and_score(gen(), _context(world, extra))
        queue.put({"score_ms": score, "bound_ms": bound, "time_s": time.perf_counter() - start})
    except Exception as exc:  # TorchRec's planner failing is a result to report
        queue.put({"error": f"{type(exc).__name__}: {str(exc)[:200]}", "time_s": time.perf_counter() - start})


def run_torchrec(suite: str, world: int, timeout: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_torchrec_child, args=(suite, world, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"skipped": f"did not finish within {timeout:.0f} s"}
    return queue.get() if not queue.empty() else {"error": f"exit code {proc.exitcode}"}


def bench_case(suite: str, world: int, timeout: float, torchrec: bool, repeats: int = 3) -> dict[str, Any]:
    from neo_plugins.sharding.planner.torchrec_score import score_plan

    gen, extra = SUITES[suite]
    tables = gen()
    ctx = _context(world, extra)
    row: dict[str, Any] = {"suite": suite, "ranks": world, "tables": len(tables)}
    planner = NeoPlanner()
    times = []
    for _ in range(max(1, repeats)):  # planning time: the fastest of ``repeats`` runs
        start = time.perf_counter()
        try:
            result = planner.plan(tables, ctx)
        except PlanningError as exc:
            row["neo"] = {"does_not_fit": str(exc), "time_s": time.perf_counter() - start}
            return row
        times.append(time.perf_counter() - start)
    neo = {"time_s": min(times), "times_s": times, "step_ms": result.predicted_step_time * 1e3}
    assert planner.last_search is not None
    neo["lower_bound_ms"] = planner.last_search.lower_bound() * 1e3 + result.ranks[0].time.get("comm_latency", 0) * 1e3
    neo["vs_bound"] = neo["step_ms"] / neo["lower_bound_ms"]
    if "cache_load_factor" not in extra:
        try:
            neo["torchrec_score_ms"] = score_plan(tables, result, ctx)
        except Exception as exc:
            neo["torchrec_score_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["neo"] = neo
    if torchrec and "cache_load_factor" not in extra:
        tr = run_torchrec(suite, world, timeout)
        row["torchrec"] = tr
        if "score_ms" in tr and "torchrec_score_ms" in neo:
            row["neo_over_torchrec"] = neo["torchrec_score_ms"] / tr["score_ms"]
            row["torchrec_vs_bound"] = tr["score_ms"] / tr["bound_ms"]
            row["neo_vs_torchrec_bound"] = neo["torchrec_score_ms"] / tr["bound_ms"]
            row["speedup"] = tr["time_s"] / neo["time_s"]
    elif "cache_load_factor" in extra:
        row["torchrec"] = {"skipped": "cached (UVM) tables: not compared"}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_planner.json")
    parser.add_argument("--torchrec-timeout", type=float, default=120.0)
    parser.add_argument("--suites", nargs="*", default=list(SUITES))
    parser.add_argument("--ranks", nargs="*", type=int, default=list(RANKS))
    parser.add_argument("--no-torchrec", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="Neo planning runs per case (min time)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    timed_out: set[str] = set()  # suites where TorchRec already ran past the timeout
    header = (
        f"{'suite':<16} {'ranks':>5} {'neo s':>7} {'tr s':>7} {'speedup':>8} {'neo/tr (TR est)':>15} "
        f"{'neo/LB (neo)':>12} {'neo/LB (TR)':>11} {'tr/LB (TR)':>10}"
    )
    print(header)
    for suite in args.suites:
        for world in args.ranks:
            row = bench_case(
                suite, world, args.torchrec_timeout, not args.no_torchrec and suite not in timed_out, args.repeats
            )
            if suite in timed_out and "torchrec" not in row:
                row["torchrec"] = {"skipped": "not run: timed out at fewer ranks (larger worlds take longer)"}
            if "did not finish" in row.get("torchrec", {}).get("skipped", ""):
                timed_out.add(suite)
            rows.append(row)
            neo, tr = row.get("neo", {}), row.get("torchrec", {})

            def f(v: Any, spec: str = ".3f") -> str:
                return format(v, spec) if isinstance(v, float) else "-"

            note = ""
            if "does_not_fit" in neo:
                note = "does not fit: " + neo["does_not_fit"][:90]
            elif "skipped" in tr or "error" in tr:
                note = "torchrec: " + tr.get("skipped", tr.get("error", ""))[:90]
            print(
                f"{suite:<16} {world:>5} {f(neo.get('time_s'), '.2f'):>7} {f(tr.get('time_s'), '.1f'):>7} "
                f"{f(row.get('speedup'), '.0f'):>8} {f(row.get('neo_over_torchrec')):>15} "
                f"{f(neo.get('vs_bound')):>12} {f(row.get('neo_vs_torchrec_bound')):>11} "
                f"{f(row.get('torchrec_vs_bound')):>10} {note}",
                flush=True,
            )
            with open(args.out, "w") as fh:
                json.dump(rows, fh, indent=2, default=lambda o: dataclasses.asdict(o))


if __name__ == "__main__":
    main()
