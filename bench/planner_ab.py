"""A/B of Neo's planner at two revisions: planning time and the plans, case by case.

    .venv/bin/python bench/planner_ab.py [--base HEAD] [--cases suite] [--rounds 3]
        [--repeats 3] [--seeds 0 150] [--out planner_ab.json]

The base is a git revision (default ``HEAD``), extracted with ``git archive``; the head is the
working tree. Each round runs one child process per revision, base first on even rounds and
head first on odd ones, so that a machine's drift over the run falls on both alike (timings on
a shared machine vary by 20% from run to run: only a ratio of runs in one such A/B means
anything). A case's time is the fastest of its ``--repeats`` plans in every round; its plan is
compared by digest (every table's type, kernel, ranks and shard shapes) and by predicted step.

Cases (``--cases``, several may be given):
- ``suite``: MLPerf DLRM-DCNv2 on 8/16/64/128 ZionEX ranks (global batch 65536), on 64 nodes of
  2 GPUs and on 32 nodes of 4 at 175 GB/s, 200 production-like tables on 128 ranks, 500 on 8
  and 128, 1000 on 128;
- ``cached``: 900 production-like tables on 2 nodes of 8 GPUs of 8 GiB behind a 20% LRU cache
  (memory-tight: the slow case);
- ``random``: the random clusters of seeds ``--seeds A B`` (MLPerf, or 100 or 200
  production-like tables, on 2-64 nodes of 2-8 GPUs at 6.25-800 GB/s, batch 256-2048 per rank),
  one plan each;
- ``tight``: ``bench/capacity_settings.py``'s random tight clusters of those seeds, with
  memory at 1x, 2x, 5x and 12x, one plan each (refusals compared as such).

Prints a line per case (base ms, head ms, base/head, the steps, ``same`` or the change) and a
summary: plans better, worse and the same, and the planning time of each side in all.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from args import check_writable

ROOT = Path(__file__).resolve().parent.parent


def _cases(kinds: list[str], seeds: tuple[int, int]) -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (tables, planning context, plan_tables keyword arguments)."""
    from neo_core.api import make_context
    from neo_core.cache import CachePolicy
    from neo_plugins.sharding.planner.tables import mlperf_dcnv2, production_like

    def ctx(batch: int, cache: Any = None, **topo: Any) -> Any:
        with contextlib.redirect_stderr(io.StringIO()):  # the units warning of fast links
            return make_context({"name": "zionex", **topo}, batch, cache=cache)

    mlperf = mlperf_dcnv2()
    out: dict[str, tuple[Any, Any, dict[str, Any]]] = {}
    if "suite" in kinds:
        for w in (8, 16, 64, 128):
            out[f"mlperf {w}"] = (mlperf, ctx(65536 // w, num_nodes=max(1, w // 8), devices_per_node=min(8, w)), {})
        out["mlperf 64x2"] = (mlperf, ctx(512, num_nodes=64, devices_per_node=2), {})
        out["mlperf 32x4 @175"] = (mlperf, ctx(512, num_nodes=32, devices_per_node=4, inter_node_bw_gbps=175), {})
        out["prod200 128"] = (production_like(200), ctx(512), {})
        out["prod500 8"] = (production_like(500), ctx(8192, num_nodes=1), {})
        out["prod500 128"] = (production_like(500), ctx(512), {})
        out["prod1000 128"] = (production_like(1000), ctx(512), {})
    if "cached" in kinds:
        cache = CachePolicy("lru", load_factor=0.2)
        out["cached900 2x8"] = (production_like(900), ctx(512, cache, num_nodes=2, device_memory_gib=8), {})
    if "random" in kinds:
        sizes = {n: production_like(n) for n in (100, 200)}
        for seed in range(*seeds):
            rng = random.Random(seed)
            tables = mlperf if rng.random() < 0.75 else sizes[rng.choice([100, 200])]
            topo = dict(num_nodes=rng.choice([2, 4, 8, 16, 32, 64]), devices_per_node=rng.choice([2, 4, 8]),
                        inter_node_bw_gbps=rng.choice([6.25, 12.5, 25, 50, 100, 175, 400, 800]))
            out[f"random {seed}"] = (tables, ctx(rng.choice([256, 512, 1024, 2048]), **topo), {})
    if "tight" in kinds:
        from capacity_settings import case

        for seed in range(*seeds):
            tables, topo, kwargs = case(seed)
            cache = kwargs.pop("cache", None)
            for f in (1, 2, 5, 12):
                scaled = {**topo, "device_memory_gib": topo["device_memory_gib"] * f,
                          "host_memory_gib_per_node": topo["host_memory_gib_per_node"] * f}
                out[f"tight {seed} x{f}"] = (tables, ctx(256, cache, **scaled), kwargs)
    return out


def _digest(result: Any) -> str:
    rows = [(t.name, t.sharding_type, t.compute_kernel, list(t.ranks), [tuple(s) for s in t.shard_shapes])
            for t in result.tables]
    return hashlib.md5(repr(rows).encode()).hexdigest()[:12]


def child(kinds: list[str], seeds: tuple[int, int], repeats: int) -> None:
    """Plan every case, print one JSON line each: fastest time, digest, predicted step."""
    import neo_plugins.sharding.planner.search as search
    from neo_core.errors import PlanningError
    from neo_plugins.sharding.planner import NeoPlanner

    print(json.dumps({"code": str(Path(search.__file__).resolve())}), flush=True)
    for name, (tables, context, kwargs) in _cases(kinds, seeds).items():
        times, digest, step = [], "refused", float("inf")
        for _ in range(1 if name.startswith(("random", "tight")) else repeats):
            planner = NeoPlanner(check_settings_s=0, **kwargs)  # child output is a pipe: no status line
            gc.collect()
            gc.disable()
            start = time.perf_counter()
            try:
                result = planner.plan(tables, context)
                digest, step = _digest(result), result.predicted_step_time
            except PlanningError:
                pass
            times.append(time.perf_counter() - start)
            gc.enable()
        print(json.dumps({"case": name, "s": min(times), "digest": digest, "step": step}), flush=True)


def extract(revision: str, into: Path) -> Path:
    """The revision's ``neo_core`` and ``plugins`` (importable as ``neo_plugins``) under ``into``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "neo_core", "plugins", "bench"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "neo_plugins").symlink_to(into / "plugins")
    return into


def run_side(path: Path | None, kinds: list[str], seeds: tuple[int, int], repeats: int, cwd: Path) -> dict[str, dict]:
    """One child process planning every case with the code at ``path`` (None: the working tree)."""
    env = dict(os.environ)
    bench = (path or ROOT) / "bench"
    env["PYTHONPATH"] = os.pathsep.join([str(path)] if path else []) + os.pathsep + str(bench)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--cases", *kinds,
           "--seeds", str(seeds[0]), str(seeds[1]), "--repeats", str(repeats)]
    # cwd outside the repository: the working tree's folders must not shadow the base's
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"planner_ab: the {'base' if path else 'head'} child failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    expected = ((path or ROOT) / "plugins").resolve()
    if not rows or not Path(rows[0].get("code", "")).is_relative_to(expected):
        raise SystemExit(f"planner_ab: the {'base' if path else 'head'} child planned with the code in "
                         f"{rows[0].get('code') if rows else '?'}, not under {expected}")
    return {row["case"]: row for row in rows[1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare the working tree with")
    parser.add_argument("--cases", nargs="+", default=["suite"], choices=["suite", "cached", "random", "tight"])
    parser.add_argument("--rounds", type=int, default=3, help="child runs per side, alternating (>= 1)")
    parser.add_argument("--repeats", type=int, default=3, help="plans per suite case in each child (>= 1)")
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 150), metavar=("A", "B"))
    parser.add_argument("--out", type=Path, help="also write the cases and summary as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    if not 0 <= args.seeds[0] < args.seeds[1]:
        parser.error(f"--seeds A B needs 0 <= A < B, got {args.seeds[0]} {args.seeds[1]}")
    seeds = (args.seeds[0], args.seeds[1])
    if args.child:
        child(args.cases, seeds, args.repeats)
        return
    check_writable(parser, "--out", args.out)
    try:
        base_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base + "^{commit}"],
                                  check=True, capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError:
        parser.error(f"--base {args.base}: not a revision of this repository")
    from tqdm import tqdm

    rows: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = extract(base_rev, Path(tmp) / "base")
        bar = tqdm(total=2 * args.rounds, desc="planner A/B", unit="run", disable=None)
        for rnd in range(args.rounds):
            sides = [("base", base), ("head", None)]
            for side, path in sides if rnd % 2 == 0 else sides[::-1]:
                bar.set_postfix_str(f"{side}, round {rnd + 1}")
                for name, row in run_side(path, args.cases, seeds, args.repeats, Path(tmp)).items():
                    rows.setdefault(name, {}).setdefault(side, []).append(row)
                bar.update()
        bar.close()

    table, counts, totals = [], {"better": 0, "worse": 0, "same plan": 0, "same step": 0}, {"base": 0.0, "head": 0.0}
    print(f"base {base_rev} vs the working tree; fastest of {args.rounds} rounds x {args.repeats} repeats")
    print(f"{'case':18s} {'base ms':>9s} {'head ms':>9s} {'base/head':>9s}  {'base step':>11s} {'head step':>11s}  plan")
    for name, sides in rows.items():
        b, h = min(r["s"] for r in sides["base"]), min(r["s"] for r in sides["head"])
        totals["base"] += b
        totals["head"] += h
        bs, hs = sides["base"][0]["step"], sides["head"][0]["step"]
        unsteady = [s for s in sides if len({r["digest"] for r in sides[s]}) > 1]
        if sides["base"][0]["digest"] == sides["head"][0]["digest"]:
            change = "same"
            counts["same plan"] += 1
        elif abs(hs - bs) <= 1e-9 * max(bs, hs, 1e-12) or bs == hs:
            change = "other plan, same step"
            counts["same step"] += 1
        elif hs < bs:
            change = f"better ({hs / bs:.4f})"
            counts["better"] += 1
        else:
            change = f"WORSE ({hs / bs:.4f})"
            counts["worse"] += 1
        if unsteady:
            change += f"; {' and '.join(unsteady)} planned differently from round to round"
        fmt = lambda s: "refused" if s == float("inf") else f"{s * 1e3:.4f}"  # noqa: E731
        print(f"{name:18s} {b * 1e3:9.1f} {h * 1e3:9.1f} {b / h:9.2f}  {fmt(bs):>11s} {fmt(hs):>11s}  {change}")
        table.append({"case": name, "base_s": b, "head_s": h, "base_step_s": bs if bs != float("inf") else None,
                      "head_step_s": hs if hs != float("inf") else None, "change": change})
    print(f"plans: {counts['better']} better, {counts['worse']} worse, {counts['same plan']} the same, "
          f"{counts['same step']} other with the same step; planning in all: base {totals['base']:.2f} s, "
          f"head {totals['head']:.2f} s (base/head {totals['base'] / totals['head']:.2f})")
    if args.out:
        summary = {"base": base_rev, "rounds": args.rounds, "repeats": args.repeats, "cases": args.cases,
                   "seeds": list(seeds), "counts": counts, "totals_s": totals, "rows": table}
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
