"""Public Python API: plan embedding tables onto a cluster without building a model, or plan a
model's tables for TorchRec's ``DistributedModelParallel`` in your own training code.

>>> from neo_core.api import plan_tables
>>> from neo_core.sharding import TableSpec
>>> result = plan_tables([TableSpec("t0", 10_000_000, 128, 20.0)], "zionex", 512)
>>> print(result.format_text())

>>> result = plan_model(model, "local", 64, pooling_factors={"user_id": 20.0})  # in each rank
>>> dmp = DistributedModelParallel(model, env=env, device=device, plan=result.torchrec_plan,
...                                sharders=result.torchrec_sharders)

Plugins may be given as objects or by registry name (``"zionex"``, ``"fp16"``); names are
resolved through the plugin manager, so third-party plugins work the same way.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from neo_core.cache import CachePolicy
from neo_core.checks import as_whole
from neo_core.compression import Compressor
from neo_core.errors import ConfigError
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.sharding import (
    Planner,
    PlanningContext,
    PlanResult,
    TableSpec,
    check_plan,
    check_table_names,
    check_table_specs,
    checked_sharders,
)
from neo_core.topology import Topology
from neo_core.training import dist_formed

__all__ = ["check_ranks", "make_context", "plan_model", "plan_tables", "read_tables", "resolve", "seeded_table_init",
           "table_specs"]

_TYPES: dict[str, type] = {
    "topology": Topology,
    "kernel": EmbeddingKernel,
    "cache": CachePolicy,
    "compression": Compressor,
    "sharding": Planner,
}


def _default(group: str) -> Any:
    """Built-in defaults that need no plugin: fused row-wise Adagrad, no compression, no cache."""
    if group == "kernel":
        return EmbeddingKernel("fused", "fused", SparseOptimizer.ROWWISE_ADAGRAD)
    if group == "compression":
        return Compressor("none")
    if group == "cache":
        return CachePolicy("none")
    raise ConfigError(f"{group} has no default; name a {group} plugin.")


def resolve(group: str, value: Any, params: Mapping[str, Any] | None = None) -> Any:
    """A plugin object for ``group``: ``value`` itself, the registry entry it names, or the default.

    ``value`` may be an instance, a registry name, a mapping with ``name`` and parameters, or
    None (the group's default).
    """
    kind = _TYPES.get(group) if isinstance(group, str) else None
    if kind is None:
        raise ConfigError(f"Unknown plugin group {group!r}; choose one of {', '.join(_TYPES)}.")
    if isinstance(value, kind):
        if group == "topology":  # one made in Python, not by a plugin: the same doubts
            from neo_core.registry import doubt_bandwidths

            doubt_bandwidths(value, f"topology {value.name!r}")
        return value
    if value is None and group not in ("topology", "sharding"):
        return _default(group)
    if isinstance(value, Mapping):
        node = dict(value)
        name = node.pop("name", None)
        if name is None:
            example = "{'name': <plugin>, " + ", ".join(f"{k!r}: ..." for k in node) + "}" if node else "{'name': <plugin>}"
            raise ConfigError(
                f"{group} given as a mapping without 'name': name the {group} plugin, e.g. {example} "
                f"(`neo plugins` lists them)."
            )
        params = {**node, **(params or {})}
        value = name
    if not isinstance(value, str) or not value:
        inner = getattr(value, group, None)  # a PlanningContext holds one of each group
        hint = (f"; it holds one: pass its .{group}" if isinstance(inner, kind) else "")
        shown = repr(value) if len(repr(value)) <= 80 else f"a {type(value).__name__}"
        raise ConfigError(f"{group} must be a {kind.__name__} or a plugin name, got {shown}{hint}.")
    from neo_core.plugins import get_plugins

    return get_plugins().create(group, value, dict(params or {}))  # unknown: names the choices


def checked_batch(batch_size_per_rank: Any) -> int:
    """``batch_size_per_rank`` as a whole number of at least 1, or a :class:`ConfigError`."""
    whole = as_whole(batch_size_per_rank)
    if whole is None or whole < 1:
        raise ConfigError(f"batch_size_per_rank must be a positive integer, got {batch_size_per_rank!r}.")
    return whole


def make_context(
    topology: Topology | str | Mapping[str, Any],
    batch_size_per_rank: int,
    kernel: EmbeddingKernel | str | Mapping[str, Any] | None = None,
    compressor: Compressor | str | Mapping[str, Any] | None = None,
    cache: CachePolicy | str | Mapping[str, Any] | None = None,
) -> PlanningContext:
    """The :class:`PlanningContext` for a topology, batch size and optional plugins."""
    return PlanningContext(
        topology=resolve("topology", topology),
        batch_size_per_rank=checked_batch(batch_size_per_rank),
        kernel=resolve("kernel", kernel),
        compressor=resolve("compression", compressor),
        cache=resolve("cache", cache),
    )


# keywords meant for plan_tables' own parameters: plugin groups by the parameter that takes them
_MEANT = {"compression": "compressor", "sharding": "planner", "batch_size": "batch_size_per_rank"}


# plan_tables' parameters that take a plugin of a group other than the planner's, by group
_GROUP_PARAMS = {"kernel": "kernel", "compression": "compressor", "cache": "cache", "topology": "topology"}
# the plugin an example selects where the call names none that takes the key: the default
# kernel, and LRU, the cache FBGEMM also prefetches with (conf/cache/lru.yaml)
_USUAL = {"kernel": "fused", "cache": "lru", "topology": "zionex"}


def _check_planner_params(params: Mapping[str, Any], planner: Any, given: Mapping[str, Any] | None = None,
                          caller: str = "plan_tables") -> None:
    """A keyword that names a plugin group, or is a typo of plan_tables' own parameter, or is a
    key of another group's plugin (``optimizer``: the kernel's) or of another planner, is not
    the planner's key it would otherwise be taken for (unless the planner takes it); ``given``:
    the plugins the call gave, by parameter (``kernel``: "dense"), which its examples keep;
    ``caller``: the function the messages name (``plan_model`` takes the same keywords)."""
    own = ("topology", "batch_size_per_rank", "kernel", "compressor", "cache", "planner")
    takes: Collection[str] = ()
    if isinstance(planner, str):
        from neo_core.plugins import get_plugins

        try:
            entry = get_plugins().registry("sharding").get(planner)
        except Exception:  # noqa: BLE001 - an unknown planner is named by resolve below
            entry = None
        if entry is not None and entry.accepts_any_keyword():  # its factory takes every keyword
            return
        takes = entry.parameters() if entry is not None else ()
    stray = [k for k in params if k not in takes]
    for key in stray:
        meant = _MEANT.get(key) or next(iter(difflib.get_close_matches(key, own, n=1, cutoff=0.8)), None)
        if meant:
            raise ConfigError(
                f"{caller}() has no parameter {key!r}; did you mean {meant}=? (other keyword arguments go "
                "to the planner, e.g. reserve_fraction=0.2)"
            )
    # before the planner's registry names them as command-line keys (kernel.optimizer=<value>),
    # or a close match of its own wins over another group's exact key
    for key in stray:
        fix = _elsewhere(key, {k: params[k] for k in stray}, planner, dict(given or {}), caller)
        if fix:
            raise ConfigError(f"{caller}() gives other keywords to the planner; {fix}.")


def _elsewhere(key: str, stray: Mapping[str, Any], planner: Any, given: Mapping[str, Any],
               caller: str = "plan_tables") -> str:
    """How to give ``key`` in Python where it is a field of each table, a key of another group's
    plugin (with the other ``stray`` keywords that plugin takes), or of another planner; "" where
    it is none of these."""
    import dataclasses

    fields = [f.name for f in dataclasses.fields(TableSpec)]
    if caller == "plan_model" and key in ("pooling_factor", "hot_fraction"):
        value = stray[key]
        example = value if isinstance(value, Mapping) else {"<table>": value}
        return f"a table's {key} is given by table name: {key}s={example!r}"
    if caller == "plan_model" and key in fields[1:]:
        return f"{key} is read from each table's EmbeddingBagConfig in the model"
    if key in fields[1:]:
        before = ", ".join(fields[: min(fields.index(key), 3)])  # the fields given by position
        return f"{key} is a field of each table, given where it is made: TableSpec({before}, {key}={stray[key]!r})"
    from neo_core.plugins import get_plugins

    registries = {r.group: r for r in get_plugins().registries.values()}
    for group, param in _GROUP_PARAMS.items():
        registry = registries.get(group)
        if registry is None:
            continue
        owners = [e.name for e in registry.entries() if not e.accepts_any_keyword() and key in e.parameters()]
        if not owners:
            continue
        value = given.get(param)  # a name, a mapping with one, an object with one, or None
        named = value.get("name") if isinstance(value, Mapping) else value if isinstance(value, str) else None
        named = named or getattr(value, "name", None)
        if group == "topology" and value is not None and (named not in owners or isinstance(value, Topology)):
            # the cluster given takes no such key: an example of another plugin's would plan another cluster
            which = "the Topology given" if isinstance(value, Topology) else f"topology {named!r}"
            made = "; a Topology's fields are set where it is made" if isinstance(value, Topology) else ""
            other = _USUAL[group] if _USUAL[group] in owners else owners[0]
            if other == "cluster":  # a cluster of one's own is made of every figure, not this one alone
                return (f"{key} is not a key of {which} (it is of 'cluster', a GPU cluster of your own, which takes "
                        f"every figure: conf/topology/cluster.yaml lists them){made}")
            return (f"{key} is not a key of {which} (it is of {other!r}: topology={{'name': {other!r}, "
                    f"{key!r}: {stray[key]!r}}} plans for that cluster instead){made}")
        name = next((n for n in (named, _USUAL.get(group)) if n in owners), owners[0])
        node = dict(value) if isinstance(value, Mapping) and value.get("name") == name else {}
        keys = registry.get(name).parameters()
        moved = {k: v for k, v in stray.items() if k in keys}  # all the call's keys of that plugin at once
        node = {"name": name, **{k: v for k, v in node.items() if k != "name"}, **moved}
        these = " and ".join(moved)
        return f"{these} {'is a key' if len(moved) == 1 else 'are keys'} of the {param}: {param}={node!r}"
    if isinstance(planner, str) and "sharding" in registries:
        others = [e.name for e in registries["sharding"].entries()
                  if e.name != planner and not e.accepts_any_keyword() and key in e.parameters()]
        if others:
            return f"{key} is a key of planner {others[0]!r}: planner={others[0]!r}, {key}={stray[key]!r}"
    for group, registry in registries.items():  # a model's or a data set's: nothing plan_tables() builds
        if group not in _GROUP_PARAMS and group != "sharding" and any(
                not e.accepts_any_keyword() and key in e.parameters() for e in registry.entries()):
            return (f"{key} is a key of the {group} group, which {caller}() does not take: it plans the tables "
                    + ("of the model given" if caller == "plan_model" else "given"))
    return ""


def plan_tables(
    tables: Sequence[TableSpec] | str | os.PathLike[str],
    topology: Topology | str | Mapping[str, Any],
    batch_size_per_rank: int | None = None,
    kernel: EmbeddingKernel | str | Mapping[str, Any] | None = None,
    compressor: Compressor | str | Mapping[str, Any] | None = None,
    cache: CachePolicy | str | Mapping[str, Any] | None = None,
    planner: Planner | str = "neo",
    **params: Any,
) -> PlanResult:
    """Plan ``tables`` (or the tables of a file, :func:`read_tables`) on ``topology`` for
    ``batch_size_per_rank`` samples per rank.

    No table memory is allocated. ``params`` go to the planner's factory (e.g.
    ``reserve_fraction=0.2``). Raises :class:`~neo_core.errors.NeoError` subclasses with a
    one-sentence message for bad input or a model that cannot fit.
    """
    given = {"topology": topology, "kernel": kernel, "compressor": compressor, "cache": cache}
    if batch_size_per_rank is None:  # required; a default of None lets batch_size= be named as a slip
        _check_planner_params(params, planner, given)
        raise ConfigError("plan_tables() needs batch_size_per_rank: the samples each rank trains on per step.")
    tables = _checked_tables(tables)
    chosen, context = _planning(topology, batch_size_per_rank, kernel, compressor, cache, planner, params)
    name = planner if isinstance(planner, str) else chosen.name
    return check_plan(chosen.plan(tables, context), tables, context.topology.world_size, name, context)


def read_tables(path: str | os.PathLike[str]) -> list[TableSpec]:
    """Your tables from a file: a CSV whose header names :class:`TableSpec`'s fields (``name``,
    ``num_embeddings``, ``embedding_dim``, and any of ``pooling_factor``, ``hot_fraction``,
    ``feature_names``, several separated by ``;``), or a JSON or YAML list of mappings of them.
    Errors name the file, the line and the field. ``plan_tables`` takes such a path too, as do
    a ``plan_model`` file's ``generator: file`` (``params.path``) and ``data.tables``."""
    from neo_plugins.sharding.planner.tables import table_file

    return table_file(os.fspath(path))


def _checked_tables(tables: Any) -> list[TableSpec]:
    """``tables`` as a non-empty list of :class:`TableSpec`, each checked, names unique (a
    path: the tables of that file, :func:`read_tables`)."""
    if isinstance(tables, (str, os.PathLike)):
        if os.path.splitext(tables)[1].lower() not in (".csv", ".json", ".yaml", ".yml") and not os.path.isfile(tables):
            raise ConfigError(f"tables must be a list of TableSpec objects or a table file's path (.csv, .json, .yaml), "
                              f"got {type(tables).__name__} {os.fspath(tables)!r}.")
        return read_tables(tables)
    if isinstance(tables, TableSpec):
        raise ConfigError(f"tables must be a list of TableSpec objects; wrap the single table {tables.name!r} in a list.")
    if isinstance(tables, (str, bytes, Mapping)) or not isinstance(tables, Sequence | Iterable):
        raise ConfigError(f"tables must be a list of TableSpec objects, got {type(tables).__name__}.")
    tables = list(tables)
    if not tables:
        raise ConfigError("The table list is empty; give at least one embedding table to plan.")
    check_table_specs(tables)
    check_table_names(tables)
    return tables


def _planning(topology: Any, batch_size_per_rank: Any, kernel: Any, compressor: Any, cache: Any,
              planner: Planner | str, params: Mapping[str, Any],
              caller: str = "plan_tables") -> tuple[Planner, PlanningContext]:
    """The planner and the context of :func:`plan_tables` and :func:`plan_model`."""
    given = {"topology": topology, "kernel": kernel, "compressor": compressor, "cache": cache}
    _check_planner_params(params, planner, given, caller)
    context = make_context(topology, batch_size_per_rank, kernel, compressor, cache)
    chosen = resolve("sharding", planner, params if not isinstance(planner, Planner) else None)
    if isinstance(planner, Planner) and params:
        raise ConfigError("Planner parameters apply only when the planner is given by name.")
    return chosen, context


def table_specs(
    model: Any,
    pooling_factors: Mapping[str, float] | None = None,
    hot_fractions: Mapping[str, float] | None = None,
) -> list[TableSpec]:
    """The :class:`TableSpec` of every table of ``model``'s TorchRec ``EmbeddingBagCollection``s
    (the model itself may be one; on the meta device or not): its name, rows, dim and features.
    ``pooling_factors`` and ``hot_fractions`` give, by table name, the mean ids per sample of
    each feature reading the table (1.0 where not given: lookups and communication grow with
    it, so give yours) and the share of lookups that hit the hottest 1% of rows."""
    import sys

    from torchrec.modules.embedding_modules import EmbeddingCollection

    for given, what in ((pooling_factors, "pooling_factors"), (hot_fractions, "hot_fractions")):
        if given is not None and not isinstance(given, Mapping):
            raise ConfigError(f"{what} is given by table name, e.g. {what}={{'user_id': 2.0}}; got a "
                              f"{type(given).__name__}.")
    from neo_core.torchrec_plan import model_tables

    for path, child in model.named_modules():
        if isinstance(child, EmbeddingCollection) and os.environ.get("RANK", "0") == "0":
            print(f"warning: module {path or 'the model'!r} is an EmbeddingCollection, which plan_model does not plan "
                  "(EmbeddingBagCollections only): DMP builds it unplanned, and its memory is not in the plan",
                  file=sys.stderr)
    tables = model_tables(model, ConfigError, ": give the tables names of their own (EmbeddingBagConfig(name=...)).")
    where = {config.name: here for here, config in tables}
    features = {f: config.name for _, config in tables for f in config.feature_names}  # feature -> its table
    specs = [TableSpec(config.name, config.num_embeddings, config.embedding_dim,
                       _as_float((pooling_factors or {}).get(config.name, 1.0)), tuple(config.feature_names),
                       _as_float((hot_fractions or {}).get(config.name)))
             for _, config in tables]
    if not specs:
        raise ConfigError(
            f"{type(model).__name__} holds no TorchRec EmbeddingBagCollection: plan_model plans the tables of "
            "those (plan_tables plans tables described by TableSpec)."
        )
    for given, what in ((pooling_factors, "pooling_factors"), (hot_fractions, "hot_fractions")):
        if unknown := sorted(set(given or {}) - set(where)):
            close = difflib.get_close_matches(unknown[0], list(where), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; its tables: {', '.join(sorted(where)[:10])}"
            if unknown[0] in features:  # a feature's name: the table it reads is meant
                hint = (f": it is a feature, which reads table {features[unknown[0]]!r} (a table read by several "
                        "features: the mean ids per sample of each)")
            raise ConfigError(f"{what} names {unknown[0]!r}, which is no table of the model{hint}.")
    return specs


def _as_float(value: Any) -> Any:
    """A number as a float (numpy's and a 0-d tensor too: plan.json writes floats); anything
    else as given, for TableSpec to name (a string, a bool, None where not given)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def plan_model(
    model: Any,
    topology: Topology | str | Mapping[str, Any],
    batch_size_per_rank: int | None = None,
    kernel: EmbeddingKernel | str | Mapping[str, Any] | None = None,
    compressor: Compressor | str | Mapping[str, Any] | None = None,
    cache: CachePolicy | str | Mapping[str, Any] | None = None,
    planner: Planner | str = "neo",
    pooling_factors: Mapping[str, float] | None = None,
    hot_fractions: Mapping[str, float] | None = None,
    plan: PlanResult | None = None,
    **params: Any,
) -> PlanResult:
    """Plan every table of ``model`` (:func:`table_specs`) and build what TorchRec's
    ``DistributedModelParallel`` executes: ``result.torchrec_plan`` (its ``plan=``) and
    ``result.torchrec_sharders`` (its ``sharders=``), the report beside them as
    :func:`plan_tables` gives it. Call it in every rank (it is collective: a rank that does not
    call it leaves the others waiting). Within a process group every rank runs rank 0's plan (a
    search its time budget cut short may plan otherwise in another rank), the plan is checked
    against the group's ranks (:func:`check_ranks`; under torchrun before the group is formed,
    against its ``WORLD_SIZE``), and the ``local`` topology has as many ranks as the group.
    ``plan``: a plan made before (``PlanResult.load_json``), built for ``model`` instead of
    planning anew, with the same checks (its topology, kernel and cache are still given here:
    the sharders are built from them)."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ConfigError(f"plan_model() takes the model (a torch nn.Module) first, got {type(model).__name__}: "
                          "plan_model(model, topology, batch_size_per_rank, ...).")
    given = {"topology": topology, "kernel": kernel, "compressor": compressor, "cache": cache}
    if batch_size_per_rank is None:
        _check_planner_params(params, planner, given, "plan_model")
        raise ConfigError("plan_model() needs batch_size_per_rank: the samples each rank trains on per step.")
    tables = table_specs(model, pooling_factors, hot_fractions)
    topology = _local_as_the_group(topology)
    chosen, context = _planning(topology, batch_size_per_rank, kernel, compressor, cache, planner, params,
                                "plan_model")
    if plan is not None:
        if not isinstance(plan, PlanResult):
            raise ConfigError(f"plan= takes a PlanResult (PlanResult.load_json('plan.json')), got {type(plan).__name__}.")
        if dist_formed():  # made elsewhere: rank 0's in every rank, and every rank's machine holds its part
            from neo_core.training.module import agree_on_plan

            plan, _ = agree_on_plan(plan, own_capacity=float(context.topology.device_memory))
        plan.torchrec_plan = chosen.to_torchrec_plan(model, plan, context)
        result = plan
    else:
        from neo_core.training.run import least_memory

        least, unequal = least_memory(context.topology)  # machines of unequal memory: the plan is for the least
        if unequal:
            context = replace(context, topology=least)
        result = _rank0s_plan(chosen.plan_module(model, tables, context), chosen, model, context)
        if unequal:
            result.notes = [unequal, *result.notes]
            if os.environ.get("RANK", "0") == "0":
                print(f"note: {unequal}", file=sys.stderr)
    result.torchrec_sharders = checked_sharders(chosen, context)
    # the sharders' kernel and compressor, whatever a saved plan says
    check_ranks(result, kernel=context.kernel, compressor=context.compressor, planner=chosen)
    return result


def _rank0s_plan(result: PlanResult, planner: Planner, model: Any, context: PlanningContext) -> PlanResult:
    """Within a process group, rank 0's plan in every rank: a plan is the same for the same input,
    but a search cut short by its wall-clock safety stop (``time_budget_s``), or a plugin that
    reads the rank or the time, plans otherwise in some rank, and DMP then shards tables
    differently per rank (a table held twice, another by no rank) without a word."""
    import sys

    import torch.distributed as dist

    from neo_core.training.module import agree_on_plan

    if not dist_formed():
        return result
    agreed, differ = agree_on_plan(result)
    if not differ:
        return result
    if dist.get_rank() == 0:
        print(f"warning: rank(s) {', '.join(map(str, differ))} planned otherwise than rank 0 (a search cut short "
              "by sharding's time_budget_s, or a plugin whose result depends on the rank or the time); every rank "
              "runs rank 0's plan", file=sys.stderr, flush=True)
    if agreed is not result:  # sent by rank 0: TorchRec's plan for this rank's model, built anew
        agreed.torchrec_plan = planner.to_torchrec_plan(model, agreed, context)
    return agreed


def _group_size() -> int | None:
    """The ranks of the process group, or of the launch where the group is not formed yet
    (torchrun's ``WORLD_SIZE``); None outside both."""
    import torch.distributed as dist

    if dist_formed():
        return dist.get_world_size()
    world = os.environ.get("WORLD_SIZE")
    return int(world) if world and world.isdigit() else None


def _local_as_the_group(topology: Any) -> Any:
    """``local`` (by name, without a world size) within a process group, or a launch: its ranks."""
    import sys

    world = _group_size()
    if world is None:
        return topology
    if not (topology == "local" or (isinstance(topology, Mapping) and topology.get("name") == "local")):
        return topology
    from neo_core.training.run import launch_machines, launch_nodes_problem, local_nodes, unequal_machines

    node = {"name": "local"} if topology == "local" else dict(topology)
    node.setdefault("world_size", world)
    if node["world_size"] == world and (problem := launch_nodes_problem(local_nodes(node), world)):
        raise ConfigError(problem)  # machines the launch does not have: each given another's memory
    machines = launch_machines(world)  # torchrun over several machines: a node each
    if node.get("num_nodes") is None and machines and node["world_size"] == world:
        node["num_nodes"] = machines
    elif (uneven := unequal_machines(world)) and os.environ.get("RANK", "0") == "0":
        print(f"warning: the launch runs {uneven}: topology 'local' is machines of equal rank counts, so it plans "
              f"one machine of all {world} ranks (this machine's memory split among them, every link inside it); "
              "give a Topology of your machines (neo_core.topology.Topology) for a plan of them", file=sys.stderr)
    return node


def check_ranks(result: PlanResult, process_group: Any = None, kernel: EmbeddingKernel | None = None,
                compressor: Compressor | None = None, planner: Planner | None = None) -> None:
    """Refuse a plan that the ranks of ``process_group`` (the default group; before it is
    formed, the launch's ``WORLD_SIZE``; nothing outside both) cannot execute: another number
    of ranks, another kind of device than the group's backend drives (NCCL: CUDA, gloo: CPU),
    a fused kernel FBGEMM has no CPU code for on CPU ranks (``kernel``: the one the sharders
    are built with; else the plan's settings), or nodes of another size than the machines'
    ranks (``LOCAL_WORLD_SIZE``, from which TorchRec forms the nodes of table-row-wise and grid
    sharding), or a precision of ``compressor`` the plan's collectives cannot send over gloo
    (``planner``: the one that planned, for the fix). TorchRec failed deep inside on each, with
    an IndexError, a shard's device or FBGEMM's AssertionError."""
    import torch.distributed as dist

    formed = dist_formed()
    world = dist.get_world_size(process_group) if formed else _group_size()
    if world is None:  # outside a process group and a launch: nothing to check against
        return
    planned = len(result.ranks)
    made_for = result.topology_summary() or "its topology"
    if planned and planned != world:
        raise ConfigError(
            f"The plan is for {planned} rank(s) ({made_for}), but the {'process group' if formed else 'launch (WORLD_SIZE)'} "
            f"has {world}: plan for "
            f"{world} ranks (e.g. topology={{'name': 'local', 'world_size': {world}}}), or start {planned}."
        )
    device = result.topology.get("compute_device")
    # the device the ranks compute on: the backend's, or before the group is formed, the plan's
    runs_on = {"nccl": "cuda", "gloo": "cpu"}.get(str(dist.get_backend(process_group))) if formed else device
    if formed and device and runs_on and device != runs_on:
        raise ConfigError(
            f"The plan is for {device} ranks ({made_for}), but the process group's backend "
            f"({dist.get_backend(process_group)}) runs on {runs_on}: plan for {runs_on} ranks (topology "
            f"compute_device={runs_on!r}, e.g. {{'name': 'local', 'compute_device': {runs_on!r}}}), or start "
            f"the group with {'nccl' if device == 'cuda' else 'gloo'}."
        )
    fused = any(a.compute_kernel.startswith("fused") for a in result.tables)  # data parallel alone: none
    if runs_on == "cpu" and fused:  # a kernel FBGEMM has no CPU code for failed inside DMP (Adam: an AssertionError)
        from neo_core.training.run import cpu_kernel_problem

        # without the kernel, its tables' compute kernel (fused, here): a plan's settings name
        # the kernel as registered, which a plugin's fused kernel is not called
        used, optimizer = ((kernel, kernel.optimizer) if kernel is not None
                           else ("fused", result.settings.get("optimizer")))
        if problem := cpu_kernel_problem(used, optimizer):
            raise ConfigError(f"The kernel cannot run on these CPU ranks: {problem.replace('kernel.optimizer=', 'optimizer ')}")
    if formed and compressor is not None and str(dist.get_backend(process_group)) == "gloo" and world > 1:
        from neo_core.training.run import gloo_compression_problem

        if problem := gloo_compression_problem(result, compressor, planner, api=True):
            raise ConfigError(problem)  # TorchRec failed inside the first step, with a shape error or an assertion
    from neo_core.training.run import node_local_tables, node_size_problem, torchrec_local_size

    if not node_local_tables(result):
        return  # (TorchRec's reading of the local size warns where no variable gives it)

    per_node = result.devices_per_node()
    if problem := node_size_problem(
        result, per_node, *torchrec_local_size(world),
        f"start {per_node} rank(s) a machine (torchrun --nproc_per_node={per_node})",
        "plan without them (sharding_types=[...] without 'TWRW' and 'GRID')",
    ):
        raise ConfigError(problem)


def seeded_table_init(model: Any, seed: int) -> None:
    """Give every table of ``model`` (sharded by DMP or not) the weights it would have whatever
    the plan, from ``seed``: two plans of one model, or a sharded model and the same model
    unsharded, start from the same tables (TorchRec draws each shard from its rank's own
    generator)."""
    from neo_core.training.module import seeded_table_init as init

    init(model, seed)
