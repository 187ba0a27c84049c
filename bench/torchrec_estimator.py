"""Neo's search over TorchRec's estimator (``sharding.estimator=torchrec``), timed with and without ``quick_estimates``.

In one process, with the same plans.

    .venv/bin/python bench/torchrec_estimator.py [--suites mlperf_dcnv2 production_like]
        [--ranks 8 16 64 128] [--json out.json]

For each suite and rank count of ``bench/planner.py`` (same contexts), plans once with TorchRec's
enumerator and estimator called as they come (the baseline) and once inside
``torchrec_score.quick_estimates``, alternating which runs first, and checks that both give
the same plan and the same predicted step. Prints both times and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from args import check_writable  # noqa: E402
from planner import RANKS, SUITES, _context, check_ranks  # noqa: E402

from neo_plugins.sharding.planner import NeoPlanner, torchrec_score  # noqa: E402


def plan_timed(tables: list[Any], ctx: Any, quick: bool) -> tuple[float, Any]:
    saved = torchrec_score.quick_estimates
    if not quick:
        torchrec_score.quick_estimates = contextlib.nullcontext  # type: ignore[assignment]
    gc.collect()
    try:
        start = time.perf_counter()
        result = NeoPlanner(estimator="torchrec").plan(tables, ctx)
        return time.perf_counter() - start, result
    finally:
        torchrec_score.quick_estimates = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", nargs="+", default=["mlperf_dcnv2", "production_like"], choices=list(SUITES))
    parser.add_argument("--ranks", nargs="+", type=int, default=list(RANKS))
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    check_ranks(parser, args.ranks)
    check_writable(parser, "--json", Path(args.json) if args.json else None)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    plan_timed(SUITES["mlperf_dcnv2"][0](), _context(8, {}), True)  # imports and first-call costs
    rows = []
    print(f"{'suite':<16} {'ranks':>5} {'as is s':>8} {'quick s':>8} {'ratio':>6}")
    cases = [(s, w) for s in args.suites for w in args.ranks]
    for n, (suite, world) in enumerate(tqdm(cases, desc="estimator bench", unit="case", file=sys.stderr)):
        gen, extra = SUITES[suite]
        tables, ctx = gen(), _context(world, extra)
        order = (False, True) if n % 2 == 0 else (True, False)
        runs = {quick: plan_timed(tables, ctx, quick) for quick in order}
        (slow, a), (fast, b) = runs[False], runs[True]
        same = [(t.sharding_type, list(t.ranks)) for t in a.tables] == [
            (t.sharding_type, list(t.ranks)) for t in b.tables
        ]
        if not same or a.predicted_step_time != b.predicted_step_time:
            sys.exit(f"error: {suite} at {world} ranks: the plans differ with and without quick_estimates")
        row = {"suite": suite, "ranks": world, "as_is_s": slow, "quick_s": fast, "ratio": slow / fast}
        rows.append(row)
        tqdm.write(f"{suite:<16} {world:>5} {slow:>8.2f} {fast:>8.2f} {slow / fast:>5.1f}x", file=sys.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
