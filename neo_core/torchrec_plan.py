"""Turn a Neo :class:`PlanResult` into the TorchRec ``ShardingPlan`` that DMP executes.

The meaning of ``TableAssignment.ranks`` per sharding type (``W`` = world size, ``L`` =
devices per node):

- ``data_parallel``: every rank (the list is informational).
- ``table_wise``: ``[r]``, the one rank that holds the table.
- ``row_wise``: all ``W`` ranks in order; TorchRec splits rows evenly (``ceil(rows / W)``).
- ``table_row_wise``: the ``L`` ranks of one node, in order.
- ``column_wise`` / ``table_column_wise``: the rank of each column shard, in column order
  (a rank may repeat). Column widths come from ``shard_shapes`` when given, else an even
  split. Table-column-wise keeps all shards on one node.
- ``grid_shard``: the rank of each shard, column block by column block; each block is split
  row-wise over the ``L`` ranks of one node (TorchRec's shard order). Block widths come from
  ``shard_shapes`` when given, else an even split.

Row splits always follow TorchRec's own rule, so ``shard_shapes`` only steer column splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from neo_core.errors import PlanningError
from neo_core.sharding import ShardingType

if TYPE_CHECKING:
    from torch import nn

    from neo_core.sharding import PlanningContext, PlanResult, TableAssignment

_DENSE = "dense"


def build_sharding_plan(
    module: nn.Module, result: PlanResult, context: PlanningContext, sharders: list[Any]
) -> Any:
    """Build the TorchRec ``ShardingPlan`` for every ``EmbeddingBagCollection`` in ``module``.

    ``module`` may live on the meta device. Raises :class:`PlanningError` for a table the plan
    does not cover or an assignment TorchRec cannot execute.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    topology = context.topology
    check_plan_matches(module, result, context)
    assignments = {t.name: t for t in result.tables}
    sharder = next(
        (s for s in sharders if issubclass(getattr(s, "module_type", object), EmbeddingBagCollection)),
        None,
    ) or EmbeddingBagCollectionSharder()

    plan: dict[str, Any] = {}
    for path, child in module.named_modules():
        if not isinstance(child, EmbeddingBagCollection):
            continue
        generators = {}
        for name in sharder.shardable_parameters(child):
            assignment = assignments.get(name)
            if assignment is None:
                where = f"module {path!r}" if path else "the model"
                raise PlanningError(
                    f"Table {name!r} in {where} has no assignment in the {result.planner!r} plan; "
                    "plan again with every table of the model."
                )
            generator = _generator(assignment, topology.world_size, topology.devices_per_node)
            if assignment.compute_kernel == "fused_uvm_caching":
                if context.cache.load_factor is None:
                    raise PlanningError(
                        f"Table {name!r} is planned behind a device cache (fused_uvm_caching) but cache "
                        f"{context.cache.name!r} has no load_factor; plan and train with the same cache "
                        "(e.g. cache=lru cache.load_factor=0.2)."
                    )
                generator = _with_cache(generator, _one_width_cache(context.cache.cache_params(), assignment))
            generators[name] = generator
        plan[path] = construct_module_sharding_plan(
            child,
            generators,
            sharder=sharder,
            local_size=topology.devices_per_node,
            world_size=topology.world_size,
            device_type=topology.compute_device,
        )
    return ShardingPlan(plan)


def model_tables(module: nn.Module, error: type[Exception], fix: str) -> list[tuple[str, Any]]:
    """(where, config) of every table of ``module``'s ``EmbeddingBagCollection``s, in order
    ("the model", or "module 'tower'" holding it). A plan names each table once, so a name in two
    collections raises ``error``, naming both, with ``fix``."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    seen: dict[str, str] = {}
    out = []
    for path, child in module.named_modules():
        if not isinstance(child, EmbeddingBagCollection):
            continue
        where = f"module {path!r}" if path else "the model"
        for config in child.embedding_bag_configs():
            if config.name in seen:
                raise error(f"Table {config.name!r} is in both {seen[config.name]} and {where}; a plan names each "
                            f"table once{fix}")
            seen[config.name] = where
            out.append((where, config))
    return out


def check_plan_matches(module: nn.Module, result: PlanResult, context: PlanningContext) -> None:
    """Refuse a plan made for another model, cluster or optimizer than ``module`` and
    ``context`` (a saved plan, or tables described by hand): TorchRec built such a plan
    without a word, with the plan's memory and time figures describing tables or ranks that
    are not these, or failed deep inside with a message about shards. What the plan does not
    record (a plan made by hand) is not checked."""

    topology = context.topology
    again = "plan again for this model and context (neo_core.api.plan_model)"
    planned = len(result.ranks)
    nodes, per_node = result.topology.get("num_nodes"), result.topology.get("devices_per_node")
    if not planned and nodes and per_node:
        planned = int(nodes) * int(per_node)
    if planned and planned != topology.world_size:
        raise PlanningError(
            f"The {result.planner!r} plan is for {planned} rank(s) ({result.topology_summary() or 'its topology'}), but "
            f"the topology here ({topology.name}) has {topology.world_size}: {again}, or use the plan's topology."
        )
    if per_node and int(per_node) != topology.devices_per_node and any(
            a.sharding_type in ("table_row_wise", "table_column_wise", "grid_shard") for a in result.tables):
        raise PlanningError(
            f"The {result.planner!r} plan splits tables within nodes of {int(per_node)} rank(s), but the topology "
            f"here ({topology.name}) has nodes of {topology.devices_per_node}: {again}, or use the plan's topology."
        )
    for key, here in (("optimizer", context.kernel.optimizer.value), ("weight_bytes", context.kernel.weight_bytes)):
        made = result.settings.get(key)
        if made is not None and made != here:
            raise PlanningError(
                f"The {result.planner!r} plan was made for {key} {made!r}, whose memory its figures count, but the "
                f"kernel here ({context.kernel.name}) has {key} {here!r}: {again}, or train with {key} {made!r}."
            )
    assignments = {a.name: a for a in result.tables}
    tables = model_tables(module, PlanningError, ", so both would get one assignment: give the tables names of their own.")
    seen = {config.name for _, config in tables}
    for where, config in tables:
        spec = assignments[config.name].spec if config.name in assignments else {}
        for key, has in (("num_embeddings", config.num_embeddings), ("embedding_dim", config.embedding_dim)):
            if spec.get(key) is not None and int(spec[key]) != int(has):
                raise PlanningError(
                    f"Table {config.name!r} in {where} has {key} {has}, but the {result.planner!r} plan was made "
                    f"for {key} {int(spec[key])}: {again}, from the model's tables (neo_core.api.table_specs)."
                )
    if seen and (extra := [a.name for a in result.tables if a.name not in seen]):
        listed = ", ".join(repr(n) for n in extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise PlanningError(
            f"The {result.planner!r} plan places {listed}, which the model has no table of: it was made for "
            f"another model; {again}."
        )


def _generator(assignment: TableAssignment, world_size: int, local_size: int) -> Any:
    """A TorchRec ``ParameterShardingGenerator`` for one table assignment."""
    from torchrec.distributed.sharding_plan import (
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )

    name, ranks, kernel = assignment.name, list(assignment.ranks), assignment.compute_kernel
    try:
        stype = ShardingType(assignment.sharding_type)
    except ValueError:
        raise PlanningError(
            f"Table {name!r} has unknown sharding type {assignment.sharding_type!r}; use a "
            "neo_core.sharding.ShardingType value."
        ) from None
    _check_kernel(name, stype, kernel)
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise PlanningError(
            f"Table {name!r} is placed on rank(s) {bad}, outside world size {world_size}; "
            "plan for this topology again."
        )
    nodes = sorted({r // local_size for r in ranks})

    if stype is ShardingType.DATA_PARALLEL:
        return _with_kernel(data_parallel(), kernel)
    if stype is ShardingType.TABLE_WISE:
        if len(ranks) != 1:
            raise PlanningError(f"Table {name!r} is table-wise but lists ranks {ranks}; give exactly one.")
        return table_wise(rank=ranks[0], compute_kernel=kernel)
    if stype is ShardingType.ROW_WISE:
        if ranks and ranks != list(range(world_size)):
            raise PlanningError(
                f"Table {name!r} is row-wise on ranks {ranks}; TorchRec row-wise sharding spans "
                f"all {world_size} ranks, so list them all (or use table_row_wise for one node)."
            )
        return row_wise(compute_kernel=kernel)
    if stype is ShardingType.TABLE_ROW_WISE:
        if len(nodes) != 1 or ranks != _node_ranks(nodes[0], local_size):
            raise PlanningError(
                f"Table {name!r} is table-row-wise on ranks {ranks}; list the {local_size} ranks "
                "of one node in order."
            )
        return _with_kernel(table_row_wise(host_index=nodes[0]), kernel)
    if stype in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        if not ranks:
            raise PlanningError(f"Table {name!r} is {stype.value} but lists no ranks; give one per column shard.")
        if stype is ShardingType.TABLE_COLUMN_WISE and len(nodes) != 1:
            raise PlanningError(
                f"Table {name!r} is table-column-wise across nodes {nodes}; keep its column shards "
                "on one node (or use column_wise)."
            )
        return _column_generator(assignment, stype, [[r] for r in ranks])
    # GRID_SHARD: column blocks, each row-wise over one node.
    blocks = [ranks[i : i + local_size] for i in range(0, len(ranks), local_size)]
    if not ranks or any(b != _node_ranks(b[0] // local_size, local_size) for b in blocks):
        raise PlanningError(
            f"Table {name!r} is grid-sharded on ranks {ranks}; list, per column block, the "
            f"{local_size} ranks of one node in order."
        )
    return _column_generator(assignment, stype, blocks)


def check_assignment(assignment: TableAssignment, dim: int, world_size: int, local_size: int) -> None:
    """Raise the ``PlanningError`` the ranks would meet building this assignment (its kernel,
    its ranks as its type lays them out, its column widths), without building it."""
    _generator(assignment, world_size, local_size)
    stype, ranks = ShardingType(assignment.sharding_type), list(assignment.ranks)
    if stype in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        _column_widths(assignment, dim, [[r] for r in ranks])
    elif stype is ShardingType.GRID_SHARD:
        _column_widths(assignment, dim, [ranks[i : i + local_size] for i in range(0, len(ranks), local_size)])


def _check_kernel(name: str, stype: ShardingType, kernel: str) -> None:
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel

    valid = {k.value for k in EmbeddingComputeKernel}
    if kernel not in valid:
        raise PlanningError(
            f"Table {name!r} has unknown compute kernel {kernel!r}; choose one of {sorted(valid)}."
        )
    if kernel == _DENSE and stype is not ShardingType.DATA_PARALLEL:
        raise PlanningError(
            f"Table {name!r} is {stype.value} with the dense kernel, which only runs data-parallel "
            "tables; use the fused kernel."
        )


def _node_ranks(node: int, local_size: int) -> list[int]:
    return list(range(node * local_size, (node + 1) * local_size))


def _with_kernel(generator: Any, kernel: str) -> Any:
    """Wrap a TorchRec generator that picks its own kernel so that it uses ``kernel``."""

    def generate(param: Any, local_size: int, world_size: int, device_type: str, sharder: Any) -> Any:
        sharding = generator(param, local_size, world_size, device_type, sharder)
        sharding.compute_kernel = kernel
        return sharding

    return generate


def _one_width_cache(cache_params: Any, assignment: TableAssignment) -> Any:
    """The cache parameters of one cached table, marked with its shard width.

    TorchRec puts the cached tables of one sharding type on a rank into one FBGEMM table batch
    unless their fused parameters differ, and FBGEMM makes that batch's cache rows as wide as
    its widest table (``max_D_cache``), while the cost model counts each shard's cache at its
    own width. ``reserved_memory`` (bytes FBGEMM keeps free of cache, read only when a cache
    would not fit the free memory) set to the shard width, a few hundred bytes at most, keeps
    each batch to tables of one width, so each cache is as wide as its tables.
    """
    import dataclasses

    width = assignment.shard_shapes[0][1] if assignment.shard_shapes else 0
    return dataclasses.replace(cache_params, reserved_memory=float(width)) if width else cache_params


def _with_cache(generator: Any, cache_params: Any) -> Any:
    """Give a cached table the cache the planner sized (load factor, algorithm); without it
    FBGEMM would build its default cache (20% of rows), not the one the plan's memory counts."""

    def generate(param: Any, local_size: int, world_size: int, device_type: str, sharder: Any) -> Any:
        sharding = generator(param, local_size, world_size, device_type, sharder)
        sharding.cache_params = cache_params
        return sharding

    return generate


def _column_widths(assignment: TableAssignment, dim: int, blocks: Sequence[Sequence[int]]) -> list[int]:
    """Width of each column block: from ``shard_shapes`` when given, else an even split."""
    n = len(blocks)
    if assignment.shard_shapes:
        shapes = [tuple(s) for s in assignment.shard_shapes]
        per_block = len(shapes) // n if len(shapes) % n == 0 else 0
        widths = [shapes[i * per_block][1] for i in range(n)] if per_block else []
        if sum(widths) != dim:
            raise PlanningError(
                f"Table {assignment.name!r} has shard_shapes {shapes} that do not split its {dim} "
                f"columns over {n} column shard(s); fix the shapes or leave them empty."
            )
        return widths
    if dim % n:
        raise PlanningError(
            f"Table {assignment.name!r} has {dim} columns, which do not split evenly into {n} "
            "column shards; give shard_shapes or change the shard count."
        )
    return [dim // n] * n


def _column_generator(
    assignment: TableAssignment, stype: ShardingType, blocks: list[list[int]]
) -> Any:
    """Generator for column splits: each block of columns is row-split over its ranks."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets, placement
    from torchrec.distributed.types import ParameterSharding

    def generate(param: Any, local_size: int, world_size: int, device_type: str, sharder: Any) -> Any:
        rows, dim = param.shape
        widths = _column_widths(assignment, dim, blocks)
        shards: list[Any] = []
        ranks: list[int] = []
        col = 0
        for width, block in zip(widths, blocks):
            if len(block) == 1:
                row_splits = [([rows, width], [0, col])]
            else:
                sizes, offsets = calculate_shard_sizes_and_offsets(
                    param[:, :width], world_size, len(block), ShardingType.TABLE_ROW_WISE.value
                )
                row_splits = [([s[0], width], [o[0], col]) for s, o in zip(sizes, offsets)]
            for (size, offset), rank in zip(row_splits, block):
                shards.append(
                    ShardMetadata(
                        shard_sizes=size,
                        shard_offsets=offset,
                        placement=placement(device_type, rank, local_size),
                    )
                )
                ranks.append(rank)
            col += width
        return ParameterSharding(
            sharding_type=stype.value,
            compute_kernel=assignment.compute_kernel,
            ranks=ranks,
            sharding_spec=EnumerableShardingSpec(shards),
        )

    return generate
