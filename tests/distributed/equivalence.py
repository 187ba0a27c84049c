"""Shared pieces of the sharded-versus-single-process comparisons.

A model is one EmbeddingBagCollection whose loss is the batch mean of the squared pooled
embeddings. Every table starts from the same seeded weights on every rank and in the
reference; ranks train on their slice of each global batch with the fused EXACT_SGD kernel,
the reference on the whole batch with torch SGD. Outputs per step and the final shards must
match the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from neo_core.sharding import PlanningContext, PlanResult

# name -> (rows, dim, ...); only the first two fields are read here.
Tables = Mapping[str, tuple[Any, ...]]
Step = dict[str, tuple[torch.Tensor, list[torch.Tensor]]]


class SumOfSquares(nn.Module):
    """EBC whose loss is the batch mean of the squared pooled embeddings."""

    def __init__(self, tables: Tables, device: torch.device) -> None:
        super().__init__()
        configs = [
            EmbeddingBagConfig(name=n, num_embeddings=t[0], embedding_dim=t[1], feature_names=[f"f_{n}"])
            for n, t in tables.items()
        ]
        self.ebc = EmbeddingBagCollection(tables=configs, device=device)

    def forward(self, features: KeyedJaggedTensor) -> Any:
        return self.ebc(features)


def loss_of(pooled: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(p.pow(2).sum(dim=1).mean() for p in pooled.values())


def initial_weights(tables: Tables) -> dict[str, torch.Tensor]:
    """The same starting weights everywhere: seeded per table."""
    out = {}
    for i, (name, (rows, dim, *_)) in enumerate(tables.items()):
        generator = torch.Generator().manual_seed(1000 + i)
        out[name] = 0.1 * torch.randn(rows, dim, generator=generator)
    return out


def make_batches(max_ids: Mapping[str, tuple[int, int]], batch: int, steps: int, seed: int) -> list[Step]:
    """Per step and feature: lengths of the global batch and each sample's ids.

    ``max_ids`` maps a table name to (rows, most ids per sample).
    """
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        step = {}
        for name, (rows, most) in max_ids.items():
            lengths = torch.randint(0, most + 1, (batch,), generator=generator)
            ids = [torch.randint(0, rows, (int(n),), generator=generator) for n in lengths]
            step[f"f_{name}"] = (lengths, ids)
        out.append(step)
    return out


def features(step: Step, start: int, stop: int) -> KeyedJaggedTensor:
    keys = list(step)
    lengths = torch.cat([step[k][0][start:stop] for k in keys])
    values = torch.cat([torch.cat(step[k][1][start:stop]) for k in keys])
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values.long(), lengths=lengths)


def _table_of(key: str) -> str:
    return key.split(".")[-2]


def _load(dmp: nn.Module, init: dict[str, torch.Tensor]) -> None:
    """Copy the global initial weights into this rank's shards."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            full = init[_table_of(key)]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r : r + h, c : c + w])
            else:
                value.copy_(full)


def _local_shards(dmp: nn.Module) -> dict[str, list[tuple[list[int], torch.Tensor]]]:
    out: dict[str, list[tuple[list[int], torch.Tensor]]] = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            shards = [(list(s.metadata.shard_offsets), s.tensor.detach().clone()) for s in value.local_shards()]
        else:
            shards = [([0, 0], value.detach().clone())]
        out[_table_of(key)] = shards
    return out


def train_sharded(
    rank: int,
    tables: Tables,
    result: PlanResult,
    context: PlanningContext,
    batches: list[Step],
    batch_per_rank: int,
    learning_rate: float,
) -> dict[str, Any]:
    """On one rank: shard with ``result``, train, return local outputs per step and final shards."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neo_core.torchrec_plan import build_sharding_plan
    from neo_plugins.sharding.sharders import make_sharders

    model = SumOfSquares(tables, torch.device("meta"))
    sharders = make_sharders(context)
    plan = build_sharding_plan(model, result, context, sharders)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
    )
    _load(dmp, initial_weights(tables))
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dense_opt = (
        KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=learning_rate)) if dense else None
    )
    outputs = []
    start, stop = rank * batch_per_rank, (rank + 1) * batch_per_rank
    for step in batches:
        pooled = dmp(features(step, start, stop)).to_dict()
        outputs.append({k: v.detach().clone() for k, v in pooled.items()})
        loss_of(pooled).backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()
    return {"outputs": outputs, "shards": _local_shards(dmp)}


def train_reference(
    tables: Tables, batches: list[Step], learning_rate: float
) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The unsharded model on the whole global batches: outputs per step, final weights."""
    model = SumOfSquares(tables, torch.device("cpu"))
    init = initial_weights(tables)
    with torch.no_grad():
        for name, bag in model.ebc.embedding_bags.items():
            bag.weight.copy_(init[name])
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    outputs = []
    for step in batches:
        batch = len(next(iter(step.values()))[0])
        pooled = model(features(step, 0, batch)).to_dict()
        outputs.append({k: v.detach().clone() for k, v in pooled.items()})
        optimizer.zero_grad()
        loss_of(pooled).backward()
        optimizer.step()
    return outputs, {n: b.weight.detach().clone() for n, b in model.ebc.embedding_bags.items()}


def assert_matches_reference(
    runs: list[dict[str, Any]],
    tables: Tables,
    table: str,
    reference: tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    batch_per_rank: int,
    atol: float,
) -> None:
    """Each rank's outputs for ``table`` equal its slice of the reference; shards equal and cover it."""
    ref_outputs, ref_weights = reference
    feature = f"f_{table}"
    for step, ref in enumerate(ref_outputs):
        for rank, run in enumerate(runs):
            got = run["outputs"][step][feature]
            want = ref[feature][rank * batch_per_rank : (rank + 1) * batch_per_rank]
            torch.testing.assert_close(
                got, want, atol=atol, rtol=0, msg=lambda m, w=f"{table} step {step} rank {rank}": f"{w}: {m}"
            )
    trained = ref_weights[table]
    covered = torch.zeros_like(trained, dtype=torch.bool)
    for run in runs:
        for (r, c), shard in run["shards"][table]:
            h, w = shard.shape
            torch.testing.assert_close(
                shard, trained[r : r + h, c : c + w], atol=atol, rtol=0, msg=lambda m, t=table: f"{t} weights: {m}"
            )
            covered[r : r + h, c : c + w] = True
    assert covered.all(), f"the shards of {table} do not cover the table"
    assert not torch.allclose(trained, initial_weights(tables)[table]), f"training did not change {table}"
