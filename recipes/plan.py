"""Dry-run planning for a cluster you may not have; allocates no table memory.

    python recipes/plan.py +topology=zionex model=zionex_12t
    python recipes/plan.py +topology=zionex model=production_like topology.inter_node_bw_gbps=2.5

``model=`` names a table set in conf/plan_model/; an unknown option of any group is reported
with that group's choices, and an unknown key (``sharding.estimtor=``, ``plan_model.params.x=``)
with its close match; plain ``key=value`` overrides need no ``+``. Writes plan.json, plan.txt and plan.png to the run folder and
prints the plan. A model that cannot fit is reported by table and bytes.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from neo_core.cli import force_add_overrides, user_errors
from neo_core.config import register_plugin_options

CONF = Path(__file__).resolve().parent.parent / "conf"
# Config groups plan.yaml selects from; ``model=`` is the documented alias of ``plan_model=``.
GROUPS = ("topology", "sharding", "kernel", "cache", "compression", "plan_model")
ALIASES = {"model": "plan_model"}


def option_names(group: str) -> list[str]:
    """Every option ``group=<name>`` selects: YAML files in conf/<group>/ and registered plugins."""
    from hydra.core.config_store import ConfigStore

    names = {p.stem for p in (CONF / group).glob("*.yaml")}
    try:
        names.update(n.removesuffix(".yaml") for n in ConfigStore.instance().list(group))
    except OSError:  # no plugin of this group lacks a YAML file
        pass
    return sorted(names)


def check_options(argv: list[str]) -> None:
    """Reject ``group=<option>`` for an option the group lacks, naming the key and the choices.

    Hydra's own message for this spans several lines and is followed by its search path.
    """
    from neo_core.errors import ConfigError

    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("+")
        group = ALIASES.get(key, key)
        if not eq or group not in GROUPS or any(c in value for c in "()[]{}$*?"):
            continue  # not a group selection, or a sweep expression Hydra expands itself
        choices = option_names(group)
        for option in value.split(","):
            if option and option != "null" and option not in choices:
                close = difflib.get_close_matches(option, choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"Unknown {key} option {option!r}{hint}; choose one of {', '.join(choices)}.")


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


# plan.yaml's keys, and a plan model's (conf/plan_model/*.yaml)
TOP_KEYS = ("topology", "sharding", "kernel", "cache", "compression", "plan_model", "batch_size_per_rank", "output_dir")
MODEL_KEYS = ("generator", "params", "global_batch", "weight_bytes", "cache_load_factor")


def check_keys(cfg: dict[str, Any]) -> None:
    """Reject a key plan.yaml or the plan model does not have, naming it and its close match.

    Plain dotted overrides reach here as ``++key=value`` (``force_add_overrides``), so a typo
    is reported by Neo instead of being added silently or refused by Hydra in several lines.
    Plugin keys are checked when each plugin is resolved.
    """
    from neo_core.errors import ConfigError

    for where, node, known in (("", cfg, TOP_KEYS), ("plan_model.", cfg.get("plan_model") or {}, MODEL_KEYS)):
        for key in node:
            if key not in known and key != "hydra":
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" Did you mean {where}{close[0]}?" if close else ""
                raise ConfigError(f"Unknown key {where}{key}.{hint} Keys here: {', '.join(known)}.")


def run(cfg: dict[str, Any]) -> Any:
    """Plan the configured table set; returns the PlanResult."""
    check_keys(cfg)
    logging.getLogger("torchrec").setLevel(logging.WARNING)  # its estimator logs each use at INFO
    from neo_core.api import make_context, resolve
    from neo_core.cache import CachePolicy
    from neo_plugins.sharding.planner.report import save_all
    from neo_plugins.sharding.planner.tables import make_tables

    model = cfg["plan_model"]
    tables = make_tables(model["generator"], **(model.get("params") or {}))
    topology = resolve("topology", cfg["topology"])
    batch = cfg.get("batch_size_per_rank")
    if batch is None:
        batch = max(1, int(model.get("global_batch", 65536)) // topology.world_size)
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
    with user_errors():
        run(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]


if __name__ == "__main__":
    with user_errors():
        register_plugin_options(CONF)
        check_options(sys.argv[1:])
    sys.argv = [sys.argv[0], *force_add_overrides(_model_alias(sys.argv[1:]))]
    main()
