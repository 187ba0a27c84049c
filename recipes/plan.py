"""Dry-run planning for a cluster you may not have; allocates no table memory.

    python recipes/plan.py +topology=zionex model=zionex_12t
    python recipes/plan.py +topology=zionex model=production_like topology.inter_node_bw_gbps=2.5

``model=`` names a table set in conf/plan_model/; an unknown option of any group is reported
with that group's choices, and an unknown key (``sharding.estimtor=``, ``plan_model.params.x=``)
with its close match; plain ``key=value`` overrides need no ``+``. Writes plan.json, plan.txt
and plan.png to the run folder and prints the plan. A model that cannot fit is reported by
table and bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import logging
import math
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from neo_core.cli import (
    APPENDED_GROUPS,
    TYPED_KEYS,
    SweepFailures,
    as_typed,
    cache_keys_select_lru,
    check_command_line,
    check_group_options,
    check_sweep_jobs,
    check_sweep_values,
    check_yaml_files,
    config_dir_shadows,
    config_dirs,
    config_groups,
    flags_first,
    force_add_overrides,
    help_groups,
    launch_lines_as_typed,
    repeated_settings,
    select_by_name,
    task_overrides,
    user_errors,
)
from neo_core.config import register_plugin_options
from neo_core.errors import PlanningError
from neo_core.run_folders import (
    check_run_dirs,
    hold_given_dirs,
    hold_job_folder,
    hold_jobs_before_hydra_writes,
    hold_run_folders,
    use_fresh_run_dirs,
)
from neo_core.training.console import (
    console_log,
    discard_transcript,
    replace_earlier_transcript,
    transcript_path,
)

CONF = Path(__file__).resolve().parent.parent / "conf"
# the jobs of a -m sweep: their plans' figures side by side, the failed ones' messages
def times_by(plan: Any) -> str:
    """Whose cost model a plan's predicted times come from: plans are compared on one scale only."""
    return plan.times_from or f"the {plan.planner} planner"


def moved(plan: Any, where: str) -> float:
    """MiB a plan's shards move per step inside nodes or across them (``where``: intra_node,
    inter_node); NaN where the planner predicts none (TorchRec's)."""
    if not any(r.comm_bytes for r in plan.ranks):
        return math.nan
    return sum(r.comm_bytes.get(where, 0.0) for r in plan.ranks) / 2**20


def most_inter_node(plan: Any) -> float:
    """MiB the rank that sends the most across nodes sends per step (its own link's load); NaN
    where the planner predicts no bytes."""
    if not any(r.comm_bytes for r in plan.ranks):
        return math.nan
    return plan.busiest_inter_node()[1] / 2**20


def cache_said(plan: Any) -> str:
    """The plan's cache as the summary gives it: its name and share ("lru 0.05"), "none", or ""
    where the plan does not say (a plugin's)."""
    cache = (getattr(plan, "settings", None) or {}).get("cache")
    if not cache:
        return ""
    share = cache.get("load_factor")
    return "none" if share is None else f"{cache.get('name')} {share:g}"


def cache_hit_rate(plan: Any) -> float | None:
    """The mean predicted hit rate of the plan's cached tables (plan.json's
    ``predicted_hit_rate``), weighted by their lookups (ids per sample: each table's
    ``pooling_factor``, where its spec gives one); None where no table is cached or the plan
    gives no rate (TorchRec's estimator's times)."""
    rated = [(rate, float((getattr(t, "spec", None) or {}).get("pooling_factor") or 1.0))
             for t in getattr(plan, "tables", ()) if (rate := getattr(t, "predicted_hit_rate", None)) is not None]
    weight = sum(w for _, w in rated)
    return sum(rate * w for rate, w in rated) / weight if rated and weight > 0 else None


def compression_said(plan: Any) -> str:
    """The plan's communication precisions, forward/backward ("fp16/fp32")."""
    comp = (getattr(plan, "settings", None) or {}).get("compression") or {}
    return f"{comp.get('forward', '?')}/{comp.get('backward', '?')}" if comp else ""


def memory_columns(plan: Any) -> dict[str, tuple[Any, ...]]:
    """GiB the fullest rank holds in device memory, the reserve (``sharding.reserve_fraction``)
    left out, against its device's, and where any table is
    in host memory, the fullest node's against its own (a node's ranks share it): a cache or
    rank-count sweep is explained by them (a larger cache leaves less device memory, so tables
    move to slower kernels)."""
    if not plan.ranks:
        return {}

    # what the plan holds, the reserve left out (a share of the device, it grew with the device,
    # so one plan swept over device sizes read as more memory used on larger devices), against
    # the whole device: Neo's planner reports its reserve, TorchRec's holds its own back unsaid
    def used(rank: Any) -> float:
        return rank.memory_total - float(rank.memory.get("reserve", 0.0))

    fullest = max(plan.ranks, key=lambda r: (used(r) / r.memory_capacity if r.memory_capacity > 0 else 0.0, used(r)))
    # said in the column's name: plan.txt's "fullest device memory" counts the reserve (7.3 GiB
    # there, 1.27 GiB here, unexplained)
    columns = {"fullest rank device memory without the reserve": (used(fullest) / 2**30, ",.2f", "GiB"),
               "fullest rank device memory capacity": (fullest.memory_capacity / 2**30, ",.2f", "GiB")}
    if plan.holds_host_memory:
        node, held, cap = plan.fullest_node()
        per_node = plan.devices_per_node()
        reserve = sum(float(r.host_memory.get("reserve", 0.0)) for r in plan.ranks if int(r.rank) // per_node == node)
        columns.update({"fullest node host memory": ((held - reserve) / 2**30, ",.2f", "GiB"),
                        "fullest node host memory capacity": (cap / 2**30, ",.2f", "GiB")})
    return columns


SWEEP = SweepFailures(lambda plan: {
    "predicted step": (plan.predicted_step_time * 1e3, ".3f", "ms"), "samples/s": (plan.predicted_samples_per_second, ",.0f"),
    # what a cache or compression sweep varies, by value: an option's name alone does not say it
    "cache": (cache_said(plan), "s"), "compression": (compression_said(plan), "s"),
    "imbalance": (plan.imbalance, ".2f"), "times by": (times_by(plan), "s"),
    # a sweep over topologies or their shapes changes the world size: said, not left to infer;
    # a table set's global batch is divided over the ranks, so more ranks plan a smaller batch each
    "ranks": (len(plan.ranks), ""), "batch/rank": (plan.batch_size_per_rank, ","),
    "global batch": (plan.batch_size_per_rank * len(plan.ranks), ","),
    # how the plan shards, and where its traffic goes (a slower network moves it inside nodes)
    "types": (plan.types_note().removeprefix("types: ").replace(", ", " + "), "s"),  # one field of the row
    "intra-node all ranks": (moved(plan, "intra_node"), ",.0f", "MiB per step"),
    "inter-node all ranks": (moved(plan, "inter_node"), ",.0f", "MiB per step"),
    # a slower network is felt by the rank that sends the most across nodes
    "busiest rank inter-node": (most_inter_node(plan), ",.1f", "MiB per step"),
    # tables in host memory behind the device cache: a larger cache can move more there
    "cached tables": (plan.cached_tables, ""),
    # the share of their lookups the device cache serves, as the cost model predicts it
    "cache hit rate": (cache_hit_rate(plan), ".1%"),
    **memory_columns(plan),
}, stopped_note="no plan written", unsaid=("global batch",))


def interrupted_line() -> str:
    """The line a Ctrl-C ends with: in a sweep, after the results so far (summary.csv), which
    jobs wrote their plans (the sweep said "no plan was written" after some had)."""
    if not SWEEP.folders:
        return INTERRUPTED
    failed = {num for num, _, _ in SWEEP.jobs}
    running = [n for n in SWEEP.started if n not in SWEEP.done and n not in failed]  # the job the Ctrl-C stopped
    with contextlib.suppress(Exception):  # the line below matters more
        SWEEP.summary(stopped=running[-1] if running else max(SWEEP.folders))
    done = ", ".join(f"#{n}" for n in sorted(SWEEP.done))
    if running:
        return (f"interrupted: job #{running[-1]} of the sweep was stopped and wrote no plan; "
                + (f"job(s) {done} wrote theirs, each in its folder" if done else "no job wrote a plan"))
    return (f"interrupted between jobs of the sweep, after job #{max(SWEEP.folders)}: "
            + (f"job(s) {done} wrote their plans, each in its folder" if done else "no job wrote a plan"))


def mixed_scales_note() -> str | None:
    """A sweep whose plans' times come from different cost models is not a ranking of them."""
    scales = sorted({row["times by"][0] for _, row in SWEEP.done.values()})
    if len(scales) < 2:
        return None
    return (f"note: these plans' predicted times come from different models ({', '.join(scales)}), which are "
            "not on one scale: compare plans within one model; sharding=neo sharding.estimator=torchrec scores "
            "Neo's plans with TorchRec's estimator, and bench/planner.py scores both planners with both")
# Config groups plan.yaml selects from; ``model=`` is the documented alias of ``plan_model=``.
GROUPS = ("topology", "sharding", "kernel", "cache", "compression", "plan_model")
ALIASES = {"model": "plan_model"}


# recipes/train.py's groups, which a dry run has no use for (conf/ holds both recipes' groups)
TRAIN_GROUPS = ("trainer", "data", "experiment")


def check_options(argv: list[str]) -> None:
    """Reject ``group=<option>`` for an option the group lacks, naming the key and the choices;
    a training setting (``trainer=smoke``, ``model=dlrm``) is named as recipes/train.py's."""
    from neo_core.errors import ConfigError

    plan_models = _options(argv, "plan_model")
    train_models = _options(argv, "model") - plan_models
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq:  # a flag, or a flag's value (--config-dir data)
            continue
        key = key.lstrip("+")
        root = key.split(".")[0]
        if key.startswith("model.") and key.split(".")[1] in MODEL_KEYS:  # model= names a table set
            raise ConfigError(
                f"Unknown key {key}. Did you mean plan_{key}? (model= selects a table set; its own "
                "settings are plan_model.<key>)"
            )
        trained = root == "model" and "." not in key and any(v.strip() in train_models for v in value.split(","))
        if root in TRAIN_GROUPS or trained or key.startswith("model."):
            raise ConfigError(
                f"{arg.lstrip('+')} is a setting of recipes/train.py. A dry run plans a table set: "
                f"model=<{' | '.join(sorted(plan_models))}> (conf/plan_model/), with +topology=, sharding, "
                "kernel, cache, compression and batch_size_per_rank; a table set's own settings are "
                "plan_model.params.<key> (e.g. plan_model.params.num_tables=100 for production_like)."
            )
    check_group_options(argv, CONF, GROUPS, ALIASES)


def _options(argv: list[str], group: str) -> set[str]:
    """The options of config group ``group`` in conf/ and a ``--config-dir``."""
    return {p.stem for d in config_dirs(CONF, argv) for p in (d / group).glob("*.yaml")}


# notes on the command line, printed when the run starts (so its plan.log has them)
NOTES: list[str] = []
INTERRUPTED = "interrupted: no plan was written"
PLAN_FILES = ("plan.json", "plan.txt", "plan.png")  # what a run writes (save_all)


def _model_alias(argv: list[str]) -> list[str]:
    """Accept ``model=<name>`` for a table set in conf/plan_model/ (``plan_model=<name>``), or in
    the plan_model/ folder of a ``--config-dir``; ``model=<a>,<b>`` (a sweep) too. Give
    ``cache.load_factor`` (or another cache key) without a cache policy and the policy is LRU
    (``cache_keys_select_lru``)."""
    names = _options(argv, "plan_model")
    TYPED_KEYS.pop("plan_model", None)
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("model", "+model") and value and all(v.strip() in names for v in value.split(",")):
            arg = f"plan_model={value}"
            TYPED_KEYS["plan_model"] = "model"  # a job's label, Hydra's launch line
        out.append(arg)
    out, note = cache_keys_select_lru(out, CONF, "plan", "planning")  # as recipes/train.py
    NOTES.extend([note] if note else [])
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
    from neo_core.config import owner_hint, raise_all
    from neo_core.errors import ConfigError

    problems = []  # every unknown key, named at once
    for where, node, known in (("", cfg, TOP_KEYS), ("plan_model.", cfg.get("plan_model") or {}, MODEL_KEYS)):
        # ``model`` is how the docs name plan_model: a typo of either is matched
        named = (*known, *ALIASES) if not where else known
        for key in node:
            if key not in known and key != "hydra":
                close = difflib.get_close_matches(key, named, n=1)
                hint = f" Did you mean {where}{close[0]}?" if close else ""
                if not where:  # a plugin's key without its group (progress=false): an exact key first
                    hint = owner_hint(key, cfg, groups=[g for g in GROUPS if g != "plan_model"]) or hint
                listed = ", ".join(f"{k} (model)" if k in ALIASES.values() and not where else k for k in known)
                problems.append(ConfigError(f"Unknown key {where}{key}.{hint} Keys here: {listed}."))
    raise_all(problems)


def check_model_values(model: dict[str, Any]) -> None:
    """A plan model's own figures: stored bytes per weight, its cache share, its global batch."""
    from neo_core.checks import as_whole, is_number
    from neo_core.errors import ConfigError

    checks = {
        "weight_bytes": (lambda v: v in (1, 2, 4), "1 (int8), 2 (fp16/bf16) or 4 (fp32)"),
        "cache_load_factor": (lambda v: 0 < v <= 1, "a number in (0, 1]: the share of rows held in device memory"),
        "global_batch": (lambda v: (as_whole(v) or 0) >= 1, "a whole number, at least 1"),
    }
    if not model.get("generator"):  # a YAML without it ended in a KeyError
        from neo_plugins.sharding.planner.tables import GENERATORS

        choice = _model_choice()
        raise ConfigError(
            f"{f'model={choice}: ' if choice else ''}plan_model.generator is not set: a table set names its "
            f"generator ({', '.join(sorted(GENERATORS))}) and gives its parameters under params: (conf/plan_model/"
            f"production_like.yaml is one); it has {', '.join(map(repr, model)) or 'no keys'}."
        )
    for key, (ok, what) in checks.items():
        value = model.get(key)
        if value is None:
            continue
        if not is_number(value) or not ok(value):
            raise ConfigError(f"plan_model.{key} must be {what}; got {value!r}.")


def check_plan_folder(out: Path) -> None:
    """The dry run's folder can be written and is not a training run's (:func:`check_not_trained`)."""
    from neo_core.training.run import check_output_dir

    check_output_dir(out, files=PLAN_FILES, folders=())
    check_not_trained(out)


def check_not_trained(out: Path) -> None:
    """The folder is not a training run's, whose plan.json and plan.txt a dry run would replace
    (and whose folder a plan.log would make look like a dry run's to train.py)."""
    from neo_core.errors import ConfigError

    trained = [n for n in ("checkpoint", "metrics.json", "config.json") if (out / n).exists()]
    if trained:
        discard_transcript()
        raise ConfigError(
            f"{out} holds a training run ({', '.join(trained)}), whose plan.json and plan.txt this dry run "
            "would replace; choose another folder (hydra.run.dir=...; a sweep's: hydra.sweep.dir=...)."
        )


def _model_choice() -> str | None:
    """The plan_model option this run chose (``model=...``), where Hydra says (None: it does not)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get("plan_model")
    except Exception:  # noqa: BLE001 - no Hydra run (a call from Python): the message goes without it
        return None


def prepare(cfg: dict[str, Any], cache_share_set: bool = False, no_cache: bool = False) -> tuple:
    """The configured tables, topology, planning context and planner, every key and value
    checked (``run``'s first half, and each job's check before a sweep starts)."""
    from neo_core.config import noted, raise_all

    problems: list[NeoError] = []  # every bad setting, named at once
    with noted(problems):
        check_keys(cfg)
    logging.getLogger("torchrec").setLevel(logging.WARNING)  # its estimator logs each use at INFO
    from neo_core.api import checked_batch, make_context, resolve
    from neo_core.cache import CachePolicy
    from neo_core.errors import ConfigError, NeoError
    from neo_plugins.sharding.planner.tables import GENERATORS, make_tables

    model = cfg["plan_model"]
    tables = topology = kernel = cache = planner = compressor = None
    with noted(problems):
        check_model_values(model)
        try:
            tables = make_tables(model["generator"], **(model.get("params") or {}))
        except ConfigError as exc:  # the generator's own words: say where its parameters are set
            choice = _model_choice()
            where = f"model={choice}: " if choice else ""
            if model["generator"] not in GENERATORS:  # the generator's name, not its parameters
                raise ConfigError(f"{where}plan_model.generator: {exc}") from None
            raise ConfigError(f"{where}plan_model.params (table set {model['generator']!r}): {exc}") from None
    with noted(problems):
        topology = resolve("topology", cfg["topology"])
        # a dry run: more machines like this one bring their memory (named by num_nodes alone where the
        # world size follows it; a world_size given would no longer split over the machines named)
        if topology.name == "local" and (cfg["topology"] or {}).get("world_size") is None:
            topology = topology.replace(
                config_keys={**topology.config_keys, "num_nodes": ("topology.num_nodes", topology.devices_per_node)},
                memory_fix=topology.memory_fix and (
                    "add memory (a machine's ranks share its RAM, so more ranks on one add none; more machines like "
                    "this one do, and so does topology.memory_fraction up to 1; or dry-run the cluster you plan "
                    "for: recipes/plan.py +topology=zionex)"))
    batch = cfg.get("batch_size_per_rank")
    if batch is not None:
        with noted(problems):
            checked_batch(batch)
    with noted(problems):
        kernel = resolve("kernel", cfg["kernel"])
    with noted(problems):
        compressor = resolve("compression", cfg["compression"])
    with noted(problems):
        cache = resolve("cache", cfg["cache"])
    with noted(problems):
        planner = resolve("sharding", cfg["sharding"])
    raise_all(problems)
    if batch is None:
        wanted = int(model.get("global_batch", 65536))
        batch = max(1, wanted // topology.world_size)
        if batch * topology.world_size != wanted:  # samples/s and the plan are for the batch run
            print(f"note: plan_model.global_batch={wanted} is not a whole number per rank on "
                  f"{topology.world_size} ranks; planning for {batch} per rank ({batch * topology.world_size} "
                  "in all). batch_size_per_rank=<n> sets it directly.", file=sys.stderr)
    if model.get("weight_bytes") is not None:
        kernel = dataclasses.replace(kernel, weight_bytes=int(model["weight_bytes"]))
    share = model.get("cache_load_factor")
    if share is not None and not cache_share_set and not no_cache:
        if cache.name == "none":  # no cache (cache=none): LRU at the share
            cache = CachePolicy("lru", load_factor=float(share))
        else:  # the policy's eviction, at the share
            if cache.load_factor is not None and cache.load_factor != float(share):
                print(f"note: cache {cache.name} holds plan_model.cache_load_factor={share:g} of each cached "
                      f"table's rows, the share this table set is sized for, not its own {cache.load_factor:g}; "
                      "cache.load_factor=<share> sets another", file=sys.stderr)
            try:
                cache = dataclasses.replace(cache, load_factor=float(share))
            except TypeError:  # a plugin's CachePolicy subclass with its own __init__
                raise ConfigError(
                    f"plan_model.cache_load_factor={share} cannot be applied to cache {cache.name!r}; give "
                    "its share with cache.load_factor=<share>."
                ) from None
    context = make_context(topology, batch, kernel, compressor, cache)
    if cfg.get("batch_size_per_rank") is None:  # the table set's global batch, divided by the ranks
        context = dataclasses.replace(context, global_batch=int(model.get("global_batch", 65536)))
    return tables, topology, context, planner


def check_job(cfg: dict[str, Any]) -> None:
    """What a job checks before it plans (its keys, the table set's values, every plugin), for
    every job of a ``-m`` sweep before the first starts; its notes and warnings are left to the
    job itself."""

    from neo_core.registry import doubts_unsaid

    share_set, no_cache = cache_overrides(task_overrides(), cfg.get("cache"))  # the job's, as it is checked
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()), doubts_unsaid():
        prepare(cfg, share_set, no_cache)


def cache_overrides(overrides: list[str], cache: Any = None) -> tuple[bool, bool]:
    """Whether the overrides give a cache share (``cache.load_factor=...``, which wins over the
    table set's; deleting the key does not), or the cache option chosen has one of its own
    (:func:`option_sets_share`, ``cache`` its config), and whether they say ``cache=none`` (no
    cache)."""
    share_set = any(o.split("=", 1)[0].lstrip("+") == "cache.load_factor" for o in overrides)
    return share_set or option_sets_share(cache), any(o.lstrip("+") == "cache=none" for o in overrides)


def option_sets_share(cache: Any) -> bool:
    """Whether the cache option this job chose gives its own share of rows: a plugin's ready-made
    option (``options={"big": {"load_factor": 0.5}}``) or a YAML file of an added config folder.
    This project's ``conf/cache/`` options and a plugin's own name (its factory's defaults) give
    the default share, which a table set's ``cache_load_factor`` replaces."""
    from hydra.core.hydra_config import HydraConfig

    from neo_core.plugins import get_plugins

    choice = HydraConfig.get().runtime.choices.get("cache")
    if not choice or not isinstance(cache, dict) or cache.get("load_factor") is None:
        return False
    if (CONF / "cache" / f"{choice}.yaml").exists():
        return False
    return not any(reg.group == "cache" and choice in reg for reg in get_plugins().registries.values())


def run(cfg: dict[str, Any], cache_share_set: bool = False, no_cache: bool = False, table_set: str | None = None) -> Any:
    """Plan the configured table set (``table_set``: its option in conf/plan_model/, named in the
    plan's first note); returns the PlanResult.

    A plan model's ``cache_load_factor`` is the share its tables were sized for: it applies to
    the selected cache policy (its eviction kept; the default ``cache=none`` becomes LRU)
    unless ``cache_share_set`` (``cache.load_factor`` given on the command line, or by the
    cache option chosen: :func:`option_sets_share`) or ``no_cache`` (``cache=none`` given on
    the command line: plan without a cache).
    """
    out = Path(cfg.get("output_dir") or ".")
    check_plan_folder(out)
    for stale in PLAN_FILES:  # a failed plan, bad keys included, leaves none behind
        (out / stale).unlink(missing_ok=True)
    replace_earlier_transcript()  # the earlier plan is gone: so is its transcript
    from neo_core.sharding import check_plan
    from neo_plugins.sharding.planner.report import save_all

    tables, topology, context, planner = prepare(cfg, cache_share_set, no_cache)
    print(topology.describe())
    print(f"{len(tables)} tables, {sum(t.num_parameters for t in tables):,} parameters, batch {context.batch_size_per_rank}/rank")
    try:
        planned = planner.plan(tables, context)
    except PlanningError as exc:
        raise more_than_this_machine(exc, tables, context, table_set) from None
    result = check_plan(planned, tables, topology.world_size, cfg["sharding"]["name"], context)
    if table_set:  # plan.json and plan.txt say which model they are the plan of
        result.notes.insert(0, f"table set: model={table_set} ({len(tables)} tables, "
                               f"{sum(t.num_parameters for t in tables):,} parameters)")
    from neo_core.training.run import usable_cores

    cores = usable_cores()
    # each machine's ranks: a dry run of several machines like this one gives each its own cores
    if topology.name == "local" and topology.compute_device == "cpu" and topology.devices_per_node > cores:
        # a what-if of more ranks on this machine read as twice the samples/s at twice the ranks
        where = "this machine's" if topology.num_nodes == 1 else "each machine's (like this one's)"
        result.notes.append(f"{topology.devices_per_node} ranks on {where} {cores} core(s): the cost model gives each "
                            "rank a core of its own, so ranks sharing cores train slower than predicted")
    print(result.format_text(rest="all in plan.json and plan.txt"))
    if topology.compute_device == "cpu":  # what train.py would refuse on these ranks
        from neo_core.training.run import cpu_kernel_problem, gloo_compression_problem

        problems = [("", cpu_kernel_problem(context.kernel, context.kernel.optimizer))]
        if topology.world_size > 1:  # CPU ranks train over gloo
            problems.append((" (gloo)", gloo_compression_problem(result, context.compressor, planner)))
        for over, problem in problems:
            if problem:
                print(f"note: this plan cannot train on these CPU ranks{over}: {problem}", file=sys.stderr)
    try:
        paths = save_all(result, out)
    except BaseException:  # a Ctrl-C as plan.png is drawn: a plan is its three files, or none
        for written in PLAN_FILES:  # (a sweep's summary and the line said "no plan written" beside two)
            (out / written).unlink(missing_ok=True)
        raise
    log = transcript_path()  # what it printed, as README says it writes
    print("wrote " + ", ".join(str(p) for p in [*paths.values(), *([log] if log is not None else [])]))
    return result


def more_than_this_machine(exc: PlanningError, tables: list[Any], context: Any, table_set: str | None) -> PlanningError:
    """``exc``, led by what to do where the tables' weights alone are more than the local
    topology's ranks could hold (with all of the machine's memory): plan.py plans for this
    machine unless ``+topology=`` names a cluster (a bare ``recipes/plan.py`` planned MLPerf's
    97 GiB on two CPU ranks, and the way out was one clause of a long capacity message)."""
    topology = context.topology
    weights = sum(t.num_parameters for t in tables) * context.kernel.weight_bytes
    per_rank = topology.device_memory
    if "device_memory" in topology.config_keys and "device_memory" in topology.config_limits:
        per_rank = topology.config_keys["device_memory"][1] * topology.config_limits["device_memory"]  # all of it
    room = per_rank * topology.world_size
    if topology.name != "local" or weights <= room:
        return exc
    model = f" model={table_set}" if table_set else ""
    held = (f"this machine's {topology.world_size} {topology.compute_device} rank(s) hold"
            if topology.num_nodes == 1 else
            f"{topology.num_nodes} machines like this one hold ({topology.world_size} {topology.compute_device} ranks)")
    return PlanningError(
        f"The tables{model and ' of' + model} hold {weights / 2**30:,.1f} GiB of weights, more than {held} "
        f"({room / 2**30:,.1f} GiB): without +topology=, plan.py plans for this machine (topology.num_nodes=N for N "
        f"machines like it: the planner's reason below says how many hold them, where any do); dry-run the "
        f"cluster you plan for, e.g. recipes/plan.py +topology=zionex{model}. The planner's reason: {exc}"
    )


@hydra.main(version_base=None, config_path="../conf", config_name="plan")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    overrides = task_overrides()
    table_set = HydraConfig.get().runtime.choices.get("plan_model")
    with user_errors():  # a ${...} that does not resolve (an unset environment variable) named by its key
        config = OmegaConf.to_container(cfg, resolve=True)
        hold_run_folders(config["output_dir"])  # type: ignore[index]
    share_set, no_cache = cache_overrides(overrides, config.get("cache"))  # type: ignore[union-attr]
    with console_log(Path(config["output_dir"]) / "plan.log", lambda exc: INTERRUPTED):  # type: ignore[index]
        for note in NOTES:
            print(note, file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # a failing job is reported and kept; the sweep goes on
            SWEEP.job(lambda: run(config, cache_share_set=share_set, no_cache=no_cache, table_set=table_set),  # type: ignore[arg-type]
                      Path(config["output_dir"]), HydraConfig.get().job.num,  # type: ignore[index]
                      " ".join(as_typed(o) for o in overrides),
                      before=lambda: (hold_job_folder(Path(config["output_dir"])),  # type: ignore[index]
                                      check_not_trained(Path(config["output_dir"]))))  # type: ignore[index]
            return
        with user_errors():
            run(config, cache_share_set=share_set, no_cache=no_cache, table_set=table_set)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.argv[1:] = flags_first(sys.argv[1:])
    try:
        with user_errors():
            check_command_line(sys.argv[1:], "recipes/plan.py")
            register_plugin_options(CONF)  # loads the plugins, torch and TorchRec with them
            check_yaml_files(CONF, sys.argv[1:])
            for warning in config_dir_shadows(CONF, sys.argv[1:]):
                print(warning, file=sys.stderr)
            check_options(sys.argv[1:])
            for note in repeated_settings(sys.argv[1:]):
                print(note, file=sys.stderr)
            check_sweep_values(sys.argv[1:], "recipes/plan.py")
            check_run_dirs(sys.argv[1:])
            hold_given_dirs(sys.argv[1:])
            use_fresh_run_dirs()
            argv = select_by_name(sys.argv[1:], CONF, GROUPS)
            typed = list(sys.argv[1:])
            OmegaConf.register_new_resolver(
                "neo_plan_groups", lambda: help_groups(CONF, GROUPS, typed, {"plan_model": "model (plan_model)"}),
                replace=True)
    except KeyboardInterrupt:  # a traceback through the libraries' imports said nothing more
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)
    selected = [g for g in GROUPS if g not in APPENDED_GROUPS]
    sys.argv = [sys.argv[0], *force_add_overrides(_model_alias(argv), config_groups(CONF, argv), selected)]
    check_sweep_jobs(check_job)  # a -m sweep: every job before the first starts
    launch_lines_as_typed()
    hold_jobs_before_hydra_writes()
    try:
        main()
    except KeyboardInterrupt:  # planning holds nothing worth a traceback
        print(interrupted_line(), file=sys.stderr)
        sys.exit(130)
    SWEEP.exit(mixed_scales_note)
