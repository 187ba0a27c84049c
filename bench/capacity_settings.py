"""Do the topology settings a refusal names plan? Random tight cases on ZionEX-shaped clusters.

    .venv/bin/python bench/capacity_settings.py [--seeds 0 400] [--json OUT.json]

Each seed draws 3-40 tables (10^5 to 2*10^8 rows, dims 32/64/128, pooling 1-30), a cluster of
1-3 nodes of 2, 4 or 8 GPUs with 1-8 GiB each and 4-64 GiB of host memory a node, sometimes an
LRU cache (2% or 10%) and restricted sharding types, and plans at 256 samples per rank. For
each refusal it reads the settings the message names (``topology.<key>=<value> or more``),
each alternative on its own, and plans again with them (they must plan), with 10% more of
them (they still should: "or more"), and with 3% less memory or one node fewer (how tight they
are). Prints the counts; no timing.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

from args import check_writable
from tqdm import tqdm

from neo_core.api import plan_tables
from neo_core.cache import CachePolicy
from neo_core.errors import PlanningError
from neo_core.sharding import TableSpec
from neo_plugins.topology.zionex import zionex_topology

NOTE = re.compile(r"\(((?:both )?topology\.[^()]*?(?:\([^()]*\)[^()]*?)*); (checked|the others checked|the least)")


def case(seed: int) -> tuple[list[TableSpec], dict[str, Any], dict[str, Any]]:
    rng = random.Random(seed)
    tables = [TableSpec(f"t{i}", int(10 ** rng.uniform(5, 8.3)), rng.choice([32, 64, 128]), rng.uniform(1, 30))
              for i in range(rng.randint(3, 40))]
    topo = {"num_nodes": rng.randint(1, 3), "devices_per_node": rng.choice([2, 4, 8]),
            "device_memory_gib": rng.choice([1, 2, 4, 8]), "host_memory_gib_per_node": rng.choice([4, 16, 64])}
    kwargs: dict[str, Any] = {}
    if rng.random() < 0.4:
        kwargs["cache"] = CachePolicy("lru", load_factor=rng.choice([0.02, 0.1]))
    types = rng.choice([None, None, ["TW"], ["TW", "CW"], ["RW", "TW"]])
    if types:
        kwargs["sharding_types"] = types
    return tables, topo, kwargs


def scaled(topo: dict[str, Any], values: dict[str, float], f: float) -> dict[str, Any]:
    """The cluster with the settings named, times ``f`` (nodes: one more or fewer at least)."""
    def value(key: str, v: float) -> float:
        if key != "num_nodes":
            return v * f
        return int(v) if f == 1 else math.ceil(v * f) if f > 1 else int(v) - 1
    return {**topo, **{k: value(k, v) for k, v in values.items()}}


def plans(tables: list[TableSpec], topo: dict[str, Any], kwargs: dict[str, Any]) -> bool:
    try:
        plan_tables(tables, zionex_topology(**topo), 256, **kwargs)
        return True
    except PlanningError:
        return False


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 400), metavar=("FIRST", "END"))
    parser.add_argument("--json", type=Path, default=None, help="write the counts here")
    args = parser.parse_args(argv)
    check_writable(parser, "--json", args.json)
    counts = {"cases": 0, "planned": 0, "refused": 0, "checked settings named": 0, "refusals with every setting checked": 0,
              "refusals with a setting unchecked": 0, "settings said to plan at no step checked": 0,
              "settings that plan": 0, "plan with 10% more": 0,
              "refused with 3% less or a node fewer": 0}
    failures = []
    for seed in tqdm(range(*args.seeds), desc="cases", file=sys.stderr):
        tables, topo, kwargs = case(seed)
        counts["cases"] += 1
        try:
            plan_tables(tables, zionex_topology(**topo), 256, **kwargs)
            counts["planned"] += 1
            continue
        except PlanningError as exc:
            message = str(exc)
        counts["refused"] += 1
        found = NOTE.search(message)
        if not found:
            continue
        checked = found.group(2) == "checked"
        counts["refusals with every setting checked" if checked else "refusals with a setting unchecked"] += 1
        for alternative in found.group(1).split("; or "):
            if found.group(2) == "the least" or "the least it could be" in alternative:
                continue  # a bound, not a checked value
            if "do not plan even with" in alternative:  # refused by planning at every step it checked
                counts["settings said to plan at no step checked"] += 1
                tried = alternative.split("even with ", 1)[1].split(": checked by planning")[0]
                most = {k: float(v) for k, v in re.findall(r"topology\.(\w+)=([\d.]+)", tried)}  # every setting
                if plans(tables, scaled(topo, most, 1.0), kwargs):  # the message's claim, checked again
                    failures.append({"seed": seed, "setting": alternative, "planned": True})
                continue
            values = {k: float(v) for k, v in re.findall(r"topology\.(\w+)=([\d.]+) or more", alternative)}
            counts["checked settings named"] += 1
            if plans(tables, scaled(topo, values, 1.0), kwargs):
                counts["settings that plan"] += 1
            else:
                failures.append({"seed": seed, "setting": alternative})
            counts["plan with 10% more"] += plans(tables, scaled(topo, values, 1.1), kwargs)
            counts["refused with 3% less or a node fewer"] += not plans(tables, scaled(topo, values, 0.97), kwargs)
    for key, value in counts.items():
        print(f"{key:>40}: {value}")
    for failure in failures:
        print(f"seed {failure['seed']}: {failure['setting']} " + ("planned" if failure.get("planned") else "did not plan"))
    out = {"seeds": list(args.seeds), "counts": counts, "failures": failures}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
