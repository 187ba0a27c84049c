"""Dry-run planning for a cluster you may not have; allocates no table memory.

    python recipes/plan.py +topology=zionex model=zionex_12t
    python recipes/plan.py +topology=zionex model=production_like topology.inter_node_bw_gbps=2.5

``model=`` names a table set in conf/plan_model/. Writes plan.json, plan.txt and plan.png to
the run folder and prints the plan. A model that cannot fit is reported by table and bytes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parent.parent / "conf"


def _model_alias(argv: list[str]) -> list[str]:
    """Accept ``model=<name>`` for a table set in conf/plan_model/ (``plan_model=<name>``)."""
    names = {p.stem for p in (CONF / "plan_model").glob("*.yaml")}
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("model", "+model") and value in names:
            arg = f"plan_model={value}"
        out.append(arg)
    return out


def run(cfg: dict[str, Any]) -> Any:
    """Plan the configured table set; returns the PlanResult."""
    from neo_core.api import make_context, resolve
    from neo_core.cache import CachePolicy
    from neo_plugins.sharding.planner.report import save_all
    from neo_plugins.sharding.planner.tables import make_tables

    model = cfg["plan_model"]
    tables = make_tables(model["generator"], **(model.get("params") or {}))
    topology = resolve("topology", cfg["topology"])
    batch = cfg.get("batch_size_per_rank") or max(1, int(model.get("global_batch", 65536)) // topology.world_size)
    kernel = resolve("kernel", cfg["kernel"])
    if model.get("weight_bytes"):
        kernel = dataclasses.replace(kernel, weight_bytes=int(model["weight_bytes"]))
    cache = resolve("cache", cfg["cache"])
    if model.get("cache_load_factor") and cache.load_factor is None:
        cache = CachePolicy("lru", load_factor=float(model["cache_load_factor"]))
    context = make_context(topology, batch, kernel, cfg["compression"], cache)
    planner = resolve("sharding", cfg["sharding"])
    print(topology.describe())
    print(f"{len(tables)} tables, {sum(t.num_parameters for t in tables):,} parameters, batch {batch}/rank")
    result = planner.plan(tables, context)
    print(result.format_text())
    paths = save_all(result, cfg.get("output_dir") or ".")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return result


@hydra.main(version_base=None, config_path="../conf", config_name="plan")
def main(cfg: DictConfig) -> None:
    from neo_core.errors import NeoError

    container = OmegaConf.to_container(cfg, resolve=True)
    try:
        run(container)  # type: ignore[arg-type]
    except NeoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *_model_alias(sys.argv[1:])]
    main()
