"""Planner benchmark: Neo vs TorchRec's EmbeddingShardingPlanner on three suites (a fourth on request).

    .venv/bin/python bench/planner.py [--out bench_planner.json] [--torchrec-timeout 60]
        [--suites mlperf_dcnv2 ...] [--ranks 8 16 ...] [--repeats 5] [--no-torchrec]
        [--torchrec-cached] [--rescore KEPT.json]

For each suite (MLPerf DLRM-DCNv2, the 500-table production-like model, 12T with FP16 weights
in host memory behind a 5% LRU cache, which TorchRec's planner gets too) and rank count
(8, 16, 64, 128 on ZionEX-shaped nodes of 8, global batch 65536):
- plan with Neo (its own cost model; planning time: the fastest of ``--repeats`` runs, and where
  TorchRec's planner runs, of as many again after it, so that a change in the machine's speed
  during the case falls on both planners), give
  its predicted step time over its lower bound, and score the plan with TorchRec's estimator
  (max-rank summed ``Perf.total``, ms);
- plan with Neo searching over TorchRec's estimator (``estimator="torchrec"``): its predicted
  step is TorchRec's score of its plan;
- plan with Neo held to TorchRec's column options (``sharding.min_col_width`` 128, TorchRec's
  narrowest column shard), scored by TorchRec's estimator (``neo128/tr``): the search on the
  options both planners have;
- plan with TorchRec's planner (default proposers) in a child process, with TorchRec's own
  ``timeout_seconds`` set to ``--torchrec-timeout``: past it TorchRec stops proposing and
  keeps the best plan so far (marked ``>``; 0: no limit); the child is killed after
  ``--torchrec-kill``;
- score TorchRec's plan with Neo's cost model too (``neo/tr under Neo's model``).

``--rescore KEPT.json`` plans the cases of a kept result again with Neo (both estimators) and
recomputes the ratios against the TorchRec plans, scores and times kept in it, without
running TorchRec (left to finish, it takes 15-17 minutes a case): after a change to Neo's
planner or cost model, the long TorchRec runs stay comparable. TorchRec's plan is scored under
Neo's current cost model again (``neo/tr under Neo's model``) where the kept result holds it
(results written since plans were kept); otherwise that ratio is left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import multiprocessing as mp
import re
import sys
import time
import warnings
from pathlib import Path
from queue import Empty
from typing import Any

from args import check_writable
from charts import planner_chart
from tqdm import tqdm

from neo_core.api import make_context
from neo_core.cache import CachePolicy
from neo_core.errors import PlanningError
from neo_core.kernels import EmbeddingKernel
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.tables import mlperf_dcnv2, production_like, zionex_12t

SUITES = {
    "mlperf_dcnv2": (mlperf_dcnv2, {}),
    # 500 tables: TorchRec's planner needs over 15 minutes at 8 and 16 ranks on this machine, so
    # by default it runs under its own timeout_seconds and the cut cases are marked
    "production_like": (production_like, {}),
    "zionex_12t": (zionex_12t, {"weight_bytes": 2, "cache_load_factor": 0.05}),
    # not run by default: the production-like generator at 100 tables, where TorchRec finishes
    "production_like_100": (lambda: production_like(100), {}),
    # not run by default: the speed target's 1000 tables (on 128 ranks: --ranks 128 --no-torchrec)
    "production_like_1000": (lambda: production_like(1000), {}),
}
DEFAULT_SUITES = ("mlperf_dcnv2", "production_like", "zionex_12t")
RANKS = (8, 16, 64, 128)
GLOBAL_BATCH = 65536
# the narrowest column shard TorchRec's planner proposes (torchrec.distributed.planner.constants
# MIN_CW_DIM): the ``neo128/tr`` column plans Neo with sharding.min_col_width at it
TORCHREC_MIN_CW_DIM = 128


def _context(world: int, extra: dict[str, Any]) -> Any:
    kernel = EmbeddingKernel("fused", "fused", weight_bytes=extra.get("weight_bytes", 4))
    cache = CachePolicy("lru", load_factor=extra["cache_load_factor"]) if "cache_load_factor" in extra else None
    topo = {"name": "zionex", "num_nodes": max(1, world // 8), "devices_per_node": min(8, world)}
    return make_context(topo, GLOBAL_BATCH // world, kernel=kernel, cache=cache)


def _torchrec_child(suite: str, world: int, timeout: float, queue: Any) -> None:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from neo_plugins.sharding.planner.torchrec_score import torchrec_plan_and_score

    gen, extra = SUITES[suite]
    start = time.perf_counter()
    try:
        out = torchrec_plan_and_score(gen(), _context(world, extra), timeout_s=timeout or None)
        queue.put({**out, "time_s": time.perf_counter() - start, "timeout_s": timeout})
    except Exception as exc:  # TorchRec's planner failing is a result to report
        queue.put({"error": f"{type(exc).__name__}: {str(exc)[:200]}", "time_s": time.perf_counter() - start})


def run_torchrec(suite: str, world: int, timeout: float, kill_after: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_torchrec_child, args=(suite, world, timeout, queue))
    proc.start()
    # read the result before joining: a child whose result outgrows the pipe's buffer (TorchRec's
    # plan of 500 tables, about 150 KB) cannot exit until it is read, and a join first waited
    # out --torchrec-kill for a child that had finished
    deadline, out = time.monotonic() + kill_after, None
    while out is None and time.monotonic() < deadline:
        try:
            out = queue.get(timeout=1.0)
        except Empty:
            if not proc.is_alive() and queue.empty():
                break
    proc.join(10.0 if out is not None else 0.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
        if out is None:
            return {"skipped": f"killed after {kill_after:.0f} s"}
    return out if out is not None else {"error": f"exit code {proc.exitcode}"}


def time_plans(planner: NeoPlanner, tables: Any, ctx: Any, repeats: int) -> tuple[Any, list[float]]:
    """Plan ``repeats`` times (at least once); the plan and each run's time, or the refusal and
    its time (a refused case is timed to its refusal)."""
    times: list[float] = []
    for _ in range(max(1, repeats)):
        gc.collect()  # as timeit: no collection of the previous cases' garbage inside the timing
        gc.disable()
        start = time.perf_counter()
        try:
            result = planner.plan(tables, ctx)
        except PlanningError as exc:
            return exc, [time.perf_counter() - start]
        finally:
            gc.enable()
        times.append(time.perf_counter() - start)
    return result, times


def bench_case(
    suite: str,
    world: int,
    timeout: float,
    torchrec: bool,
    repeats: int = 5,
    kill_after: float = 600.0,
    torchrec_cached: bool = False,
    kept_torchrec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from neo_plugins.sharding.planner.torchrec_score import score_plan

    gen, extra = SUITES[suite]
    tables = gen()
    ctx = _context(world, extra)
    row: dict[str, Any] = {"suite": suite, "ranks": world, "tables": len(tables)}
    # a refused case is timed to its refusal: the settings its message names are left unchecked
    planner = NeoPlanner(check_settings_s=0)
    result, times = time_plans(planner, tables, ctx, repeats)
    if isinstance(result, PlanningError):
        row["neo"] = {"does_not_fit": str(result), "time_s": times[0]}
        return row
    neo = {"time_s": min(times), "times_s": times, "step_ms": result.predicted_step_time * 1e3}
    assert planner.last_search is not None
    # bound on the predicted step, collective latency included (Search.step_bound)
    neo["lower_bound_ms"] = planner.last_search.step_bound() * 1e3
    neo["vs_bound"] = neo["step_ms"] / neo["lower_bound_ms"]
    try:
        neo["torchrec_score_ms"] = score_plan(tables, result, ctx)
    except Exception as exc:
        neo["torchrec_score_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["neo"] = neo
    if torchrec:
        # Neo's search over TorchRec's estimator: its prediction is TorchRec's score of the plan
        # (tests/planner/test_torchrec_estimator.py); one run, timed
        start = time.perf_counter()
        tr_planner = NeoPlanner(estimator="torchrec", check_settings_s=0)
        tr_est = tr_planner.plan(tables, ctx)
        assert tr_planner.last_search is not None
        row["neo_torchrec_estimator"] = {
            "time_s": time.perf_counter() - start,
            "torchrec_score_ms": tr_est.predicted_step_time * 1e3,
            # Neo's bound over the same options, costed by TorchRec's estimator (no latency)
            "lower_bound_ms": tr_planner.last_search.step_bound() * 1e3,
        }
        row["neo_torchrec_estimator"]["vs_bound"] = (
            row["neo_torchrec_estimator"]["torchrec_score_ms"] / row["neo_torchrec_estimator"]["lower_bound_ms"]
        )
    if kept_torchrec is not None:  # --rescore: TorchRec's plan of a kept run, not planned again
        # its score under Neo's model was taken with the model of that run: scored again where
        # the plan was kept, else left out
        row["torchrec"] = {k: v for k, v in kept_torchrec.items() if k not in ("neo_model_step_ms", "neo_model_error")}
        if "plan" in kept_torchrec:
            from neo_plugins.sharding.planner.torchrec_score import neo_model_score, plan_from_json

            row["torchrec"].update(neo_model_score(tables, plan_from_json(kept_torchrec["plan"]), ctx))
    elif torchrec and "cache_load_factor" in extra and not torchrec_cached:
        row["torchrec"] = {"skipped": "skipped for time (about 3 min: 800 tables); --torchrec-cached runs it"}
    elif torchrec:
        # on the cached (UVM) suite TorchRec's planner gets the same cache and weight precision
        # (torchrec_score.constraints, meta_module)
        row["torchrec"] = run_torchrec(suite, world, timeout, kill_after)
        if "plan_s" in row["torchrec"]:
            # Neo's planning time is the fastest of runs before TorchRec's and as many after
            # it: a machine that slows or speeds up while the two planners run counts on both
            # sides (the ratio of two runs minutes apart moved by 2x with the machine's hour)
            after = time_plans(planner, tables, ctx, repeats)[1]
            neo["times_s"] = times + after
            neo["time_s"] = min(neo["times_s"])
    tr = row.get("torchrec", {})
    if "score_ms" in tr:
        # Neo held to TorchRec's column options: TorchRec's planner splits no column shard
        # narrower than 128 columns (its MIN_CW_DIM), so it column-splits no table of dim 128 or
        # less, where Neo's default goes down to 16 (sharding.min_col_width). The ratio of this
        # plan to TorchRec's separates the search from the wider option space
        try:  # fewer options can leave a memory-tight case without a plan
            narrow = NeoPlanner(min_col_width=TORCHREC_MIN_CW_DIM, check_settings_s=0).plan(tables, ctx)
        except PlanningError as exc:
            row["neo_cw128"] = {"does_not_fit": str(exc)}
        else:
            row["neo_cw128"] = {"step_ms": narrow.predicted_step_time * 1e3}
            try:
                row["neo_cw128"]["torchrec_score_ms"] = score_plan(tables, narrow, ctx)
            except Exception as exc:
                row["neo_cw128"]["torchrec_score_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if "score_ms" in tr and "torchrec_score_ms" in neo:
        row["neo_over_torchrec"] = neo["torchrec_score_ms"] / tr["score_ms"]
        row["torchrec_vs_bound"] = tr["score_ms"] / tr["bound_ms"]
        row["neo_vs_torchrec_bound"] = neo["torchrec_score_ms"] / tr["bound_ms"]
        if "torchrec_score_ms" in row.get("neo_cw128", {}):
            row["neo_cw128_over_torchrec"] = row["neo_cw128"]["torchrec_score_ms"] / tr["score_ms"]
        if "neo_torchrec_estimator" in row:
            neo_tr = row["neo_torchrec_estimator"]["torchrec_score_ms"]
            row["neo_tr_est_over_torchrec"] = neo_tr / tr["score_ms"]
            row["neo_tr_est_vs_torchrec_bound"] = neo_tr / tr["bound_ms"]
        # TorchRec's time: its EmbeddingShardingPlanner.plan call alone (plan_s), not the child's
        # building of the meta-device module nor the scoring after it (time_s)
        row["speedup"] = tr.get("plan_s", tr["time_s"]) / neo["time_s"]  # results kept from before plan_s: the child's time
    if "neo_model_step_ms" in tr:  # both plans under Neo's cost model
        row["neo_over_torchrec_neo_model"] = neo["step_ms"] / tr["neo_model_step_ms"]
    return row


def _fmt(v: Any, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, float) else "-"


def format_row(row: dict[str, Any]) -> str:
    neo, tr = row.get("neo", {}), row.get("torchrec", {})
    neo_tr = row.get("neo_torchrec_estimator", {})
    cut = ">" if tr.get("timed_out") else ""  # TorchRec stopped at its time limit
    note = ""
    if "does_not_fit" in neo:
        note = "does not fit: " + neo["does_not_fit"][:90]
    elif "skipped" in tr or "error" in tr:
        note = "torchrec: " + " ".join(tr.get("skipped", tr.get("error", "")).split())[:120]
    elif cut:
        note = f"torchrec cut at its {tr['timeout_s']:.0f} s limit after {tr['proposals']} proposals"
    elif tr.get("proposals"):
        note = f"torchrec finished: {tr['proposals']} proposals"
    if "neo_over_torchrec_neo_model" in row:
        note += f"; neo/tr under Neo's model {row['neo_over_torchrec_neo_model']:.3f}"
    tr_time = tr.get("plan_s", tr.get("time_s") if "score_ms" in tr else None)  # kept results from before plan_s
    tr_s = (cut + _fmt(tr_time, ".1f")) if tr_time is not None else "-"
    speed = (cut + _fmt(row.get("speedup"), ".0f") + "x") if "speedup" in row else "-"
    return (
        f"{row['suite']:<16} {row['ranks']:>5} {_fmt(neo.get('time_s'), '.2f'):>7} "
        f"{_fmt(neo_tr.get('time_s'), '.2f'):>9} {tr_s:>7} {speed:>8} "
        f"{_fmt(row.get('neo_over_torchrec')):>7} {_fmt(row.get('neo_cw128_over_torchrec')):>9} "
        f"{_fmt(row.get('neo_tr_est_over_torchrec')):>11} "
        f"{_fmt(neo.get('vs_bound')):>8} {_fmt(neo_tr.get('vs_bound')):>12} "
        f"{_fmt(row.get('torchrec_vs_bound')):>7}  {note}"
    )


def check_ranks(parser: argparse.ArgumentParser, ranks: list[int], flag: str = "--ranks") -> None:
    """Rank counts that ``_context`` builds as asked: one node of up to 8, or nodes of 8."""
    for world in ranks:
        if world < 1 or (world > 8 and world % 8):
            parser.error(f"{flag} {world}: use 1 to 8 ranks (one node) or a multiple of 8 (nodes of 8)")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject arguments that would plan a different cluster than asked, or fail after work."""
    check_ranks(parser, args.ranks)
    if args.torchrec_timeout < 0:
        parser.error(f"--torchrec-timeout {args.torchrec_timeout}: must be 0 (none) or more seconds")
    if args.torchrec_kill <= 0:
        parser.error(f"--torchrec-kill {args.torchrec_kill}: must be more than 0 seconds (it kills TorchRec's "
                     "planner after that long)")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    # the JSON is rewritten after every case: find a bad path before the first one runs
    check_writable(parser, "--out", Path(args.out))


def results_json(rows: list[dict[str, Any]]) -> str:
    """The results as indented JSON, each table of a kept TorchRec plan on one line (a
    500-table plan takes about a third of the fully indented size)."""
    tables: list[str] = []

    def mark(row: dict[str, Any]) -> dict[str, Any]:
        plan = row.get("torchrec", {}).get("plan")
        if not plan:
            return row
        marks = []
        for table in plan:
            marks.append(f"@plan-table-{len(tables)}@")
            tables.append(json.dumps(table, separators=(", ", ": ")))
        return {**row, "torchrec": {**row["torchrec"], "plan": marks}}

    text = json.dumps([mark(r) for r in rows], indent=2, default=lambda o: dataclasses.asdict(o))
    return re.sub(r'"@plan-table-(\d+)@"', lambda m: tables[int(m.group(1))], text) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results JSON (default bench_planner.json; with --rescore, its file)")
    parser.add_argument(
        "--torchrec-timeout", type=float, default=60.0,
        help="TorchRec's own timeout_seconds, after which it keeps its best plan (s; default 60; 0: none)"
    )
    parser.add_argument(
        "--torchrec-kill", type=float, default=600.0,
        help="kill TorchRec's child process after this many seconds, for a case it does not finish (default 600; "
             "more than 0)"
    )
    parser.add_argument("--suites", nargs="+", default=None, choices=list(SUITES),
                        help=f"default: {' '.join(DEFAULT_SUITES)}")
    parser.add_argument(
        "--ranks", nargs="+", type=int, default=None,
        help="world sizes: up to 8 (one node) or multiples of 8 (ZionEX-shaped nodes of 8); default: "
             + " ".join(map(str, RANKS)),
    )
    parser.add_argument("--no-torchrec", action="store_true",
                        help="plan with Neo only (no TorchRec planner, no search over its estimator): seconds")
    parser.add_argument(
        "--torchrec-cached", action="store_true",
        help="also run TorchRec's planner on the cached 12T suite (about 3 min more; off to stay under 15 min)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="Neo planning runs per case, and as many again after TorchRec's (the fastest is its time)")
    parser.add_argument(
        "--rescore", type=Path, default=None, metavar="JSON",
        help="plan the cases of a kept result again with Neo and score them against the TorchRec plans "
             "kept in it (TorchRec is not run; its scores and times are the kept ones); --out defaults to JSON",
    )
    args = parser.parse_args(argv)
    if args.no_torchrec and args.torchrec_cached:
        parser.error("--no-torchrec runs no TorchRec planner, so --torchrec-cached has nothing to add; give one of them")
    for flag, values in (("--ranks", args.ranks), ("--suites", args.suites)):
        twice = sorted({v for v in values or () if list(values).count(v) > 1})
        if twice:
            parser.error(f"{flag} names {', '.join(map(str, twice))} twice; each case runs once")
    kept: list[dict[str, Any]] | None = None
    if args.rescore is not None:
        if not args.rescore.is_file():
            parser.error(f"--rescore {args.rescore}: no such file")
        try:
            kept = json.loads(args.rescore.read_text())
            assert isinstance(kept, list) and all({"suite", "ranks"} <= r.keys() for r in kept)
            assert all(r["suite"] in SUITES for r in kept)
            assert all(isinstance(r["ranks"], int) and not isinstance(r["ranks"], bool) for r in kept)
        except (OSError, ValueError, AssertionError, AttributeError):
            parser.error(f"--rescore {args.rescore}: not a result of this bench (a JSON list of cases)")
        check_ranks(parser, [r["ranks"] for r in kept], f"--rescore {args.rescore}: a case of ranks")
        given = [flag for flag, value in (("--suites", args.suites), ("--ranks", args.ranks)) if value is not None]
        given += ["--no-torchrec"] if args.no_torchrec else []
        if given:
            parser.error(f"--rescore takes its cases from {args.rescore}; leave out {', '.join(given)}")
    args.suites = args.suites or list(DEFAULT_SUITES)
    args.ranks = args.ranks or list(RANKS)
    args.out = args.out or (str(args.rescore) if args.rescore is not None else "bench_planner.json")
    check_args(parser, args)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    killed: set[str] = set()  # suites where TorchRec's child had to be killed
    print(
        f"{'suite':<16} {'ranks':>5} {'neo s':>7} {'neo[TR] s':>9} {'tr s':>7} {'speedup':>8} "
        f"{'neo/tr':>7} {'neo128/tr':>9} {'neo[TR]/tr':>11} {'neo/LB':>8} {'neo[TR]/LB':>12} {'tr/LB':>7}"
    )
    if kept is not None:
        cases = [(r["suite"], r["ranks"], r) for r in kept]
    else:
        cases = [(suite, world, None) for suite in args.suites for world in args.ranks]

    def save(rows: list[dict[str, Any]]) -> None:
        with open(args.out, "w") as fh:
            fh.write(results_json(rows))

    progress = tqdm(cases, desc="planner bench", unit="case", file=sys.stderr, dynamic_ncols=True)
    for suite, world, old in progress:
        progress.set_postfix_str(f"{suite} @ {world} ranks")
        if old is not None:
            row = bench_case(suite, world, args.torchrec_timeout, "neo_torchrec_estimator" in old, args.repeats,
                             kept_torchrec=old.get("torchrec"))
            rows.append(row)
            tqdm.write(format_row(row), file=sys.stdout)
            continue  # the kept file is written once all its cases are planned (not cut short)
        run_tr = not args.no_torchrec and suite not in killed
        row = bench_case(
            suite, world, args.torchrec_timeout, run_tr, args.repeats, args.torchrec_kill, args.torchrec_cached
        )
        if suite in killed and "torchrec" not in row:
            row["torchrec"] = {"skipped": "not run: killed at fewer ranks (larger worlds take longer)"}
        if "killed" in row.get("torchrec", {}).get("skipped", ""):
            killed.add(suite)
        rows.append(row)
        tqdm.write(format_row(row), file=sys.stdout)
        save(rows)  # after every case: a run stopped part-way keeps what it measured
    save(rows)
    # the ratios and times as a chart beside the JSON (redraw: bench/charts.py OUT.json)
    chart = planner_chart(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} and {chart}", file=sys.stderr)


if __name__ == "__main__":
    main()
