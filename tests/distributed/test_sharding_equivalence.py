"""Sharded training on 2 gloo ranks matches the single-process model, for every sharding type.

One spawn trains one EBC holding a table per sharding type (process start-up dominates the
cost), then a table-wise model with fp16 communication; each type is checked separately.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from neo_core.compression import Compressor
from neo_core.sharding import PlanResult, ShardingType, TableAssignment
from tests.distributed.multi_process import MultiProcessRunner
from tests.test_torchrec_plan import cpu_context

WORLD_SIZE = 2
BATCH_PER_RANK = 8
STEPS = 5
LEARNING_RATE = 0.1
FP16 = Compressor(name="fp16", forward_precision="fp16", backward_precision="fp16")

# name -> (rows, dim, sharding type, kernel, ranks); one node of two ranks.
TABLES: dict[str, tuple[int, int, ShardingType, str, list[int]]] = {
    "tw": (64, 16, ShardingType.TABLE_WISE, "fused", [1]),
    "rw": (150, 16, ShardingType.ROW_WISE, "fused", [0, 1]),
    "cw": (100, 32, ShardingType.COLUMN_WISE, "fused", [1, 0]),
    "dp": (80, 16, ShardingType.DATA_PARALLEL, "dense", [0, 1]),
    "twrw": (200, 16, ShardingType.TABLE_ROW_WISE, "fused", [0, 1]),
    "twcw": (120, 32, ShardingType.TABLE_COLUMN_WISE, "fused", [0, 1]),
    "grid": (90, 32, ShardingType.GRID_SHARD, "fused", [0, 1, 0, 1]),
}
FP16_TABLES = {"tw16": (64, 16, ShardingType.TABLE_WISE, "fused", [0])}
SCENARIOS: dict[str, tuple[dict[str, Any], Compressor | None]] = {
    "fp32": (TABLES, None),
    "fp16": (FP16_TABLES, FP16),
}


class SumOfSquares(nn.Module):
    """EBC whose loss is the batch mean of the squared pooled embeddings."""

    def __init__(self, tables: dict[str, Any], device: torch.device) -> None:
        super().__init__()
        configs = [
            EmbeddingBagConfig(name=n, num_embeddings=t[0], embedding_dim=t[1], feature_names=[f"f_{n}"])
            for n, t in tables.items()
        ]
        self.ebc = EmbeddingBagCollection(tables=configs, device=device)

    def forward(self, features: KeyedJaggedTensor) -> Any:
        return self.ebc(features)


def initial_weights(tables: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The same starting weights everywhere: seeded per table."""
    out = {}
    for i, (name, (rows, dim, *_)) in enumerate(tables.items()):
        generator = torch.Generator().manual_seed(1000 + i)
        out[name] = 0.1 * torch.randn(rows, dim, generator=generator)
    return out


def global_batches(tables: dict[str, Any]) -> list[dict[str, tuple[torch.Tensor, list[torch.Tensor]]]]:
    """Per step and feature: lengths (global batch) and each sample's ids."""
    generator = torch.Generator().manual_seed(7)
    batch = BATCH_PER_RANK * WORLD_SIZE
    steps = []
    for _ in range(STEPS):
        step = {}
        for name, (rows, *_) in tables.items():
            lengths = torch.randint(0, 4, (batch,), generator=generator)
            ids = [torch.randint(0, rows, (int(n),), generator=generator) for n in lengths]
            step[f"f_{name}"] = (lengths, ids)
        steps.append(step)
    return steps


def features(step: dict[str, Any], start: int, stop: int) -> KeyedJaggedTensor:
    keys = list(step)
    lengths = torch.cat([step[k][0][start:stop] for k in keys])
    values = torch.cat([torch.cat(step[k][1][start:stop]) for k in keys])
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values.long(), lengths=lengths)


def loss_of(pooled: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(p.pow(2).sum(dim=1).mean() for p in pooled.values())


def train_sharded(rank: int, world_size: int) -> dict[str, Any]:
    """Rank entry: per scenario, the local outputs per step and the local shards at the end."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neo_core.torchrec_plan import build_sharding_plan
    from neo_plugins.sharding.sharders import make_sharders

    results: dict[str, Any] = {}
    for scenario, (tables, compressor) in SCENARIOS.items():
        context = cpu_context(1, world_size, compressor, learning_rate=LEARNING_RATE)
        model = SumOfSquares(tables, torch.device("meta"))
        assignments = [TableAssignment(n, t[2].value, t[3], list(t[4])) for n, t in tables.items()]
        result = PlanResult("test", assignments, [], BATCH_PER_RANK, context.topology.to_dict())
        sharders = make_sharders(context)
        plan = build_sharding_plan(model, result, context, sharders)
        dmp = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(dist.group.WORLD),
            device=torch.device("cpu"),
            plan=plan,
            sharders=sharders,
        )
        init = initial_weights(tables)
        _load(dmp, init)
        dense = [(n, p) for n, p in in_backward_optimizer_filter(dmp.named_parameters())]
        dense_opt = (
            KeyedOptimizerWrapper(dict(dense), lambda ps: torch.optim.SGD(ps, lr=LEARNING_RATE))
            if dense
            else None
        )
        outputs = []
        start, stop = rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK
        for step in global_batches(tables):
            pooled = dmp(features(step, start, stop)).to_dict()
            outputs.append({k: v.detach().clone() for k, v in pooled.items()})
            loss_of(pooled).backward()
            if dense_opt is not None:
                dense_opt.step()
                dense_opt.zero_grad()
        results[scenario] = {"outputs": outputs, "shards": _local_shards(dmp)}
    return results


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


def train_reference(tables: dict[str, Any]) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The unsharded model on the global batches: outputs per step, final weights."""
    model = SumOfSquares(tables, torch.device("cpu"))
    init = initial_weights(tables)
    with torch.no_grad():
        for name, bag in model.ebc.embedding_bags.items():
            bag.weight.copy_(init[name])
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    outputs = []
    for step in global_batches(tables):
        pooled = model(features(step, 0, BATCH_PER_RANK * WORLD_SIZE)).to_dict()
        outputs.append({k: v.detach().clone() for k, v in pooled.items()})
        optimizer.zero_grad()
        loss_of(pooled).backward()
        optimizer.step()
    weights = {n: b.weight.detach().clone() for n, b in model.ebc.embedding_bags.items()}
    return outputs, weights


@pytest.fixture(scope="module")
def sharded_runs() -> list[dict[str, Any]]:
    return MultiProcessRunner().run(train_sharded, WORLD_SIZE)


def _check(runs: list[dict[str, Any]], scenario: str, table: str, atol: float) -> None:
    tables = SCENARIOS[scenario][0]
    ref_outputs, ref_weights = train_reference(tables)
    feature = f"f_{table}"
    for step, ref in enumerate(ref_outputs):
        for rank, run in enumerate(runs):
            got = run[scenario]["outputs"][step][feature]
            want = ref[feature][rank * BATCH_PER_RANK : (rank + 1) * BATCH_PER_RANK]
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=lambda m, where=f"step {step} rank {rank}": f"{where}: {m}")
    trained = ref_weights[table]
    covered = torch.zeros_like(trained, dtype=torch.bool)
    for run in runs:
        for (r, c), shard in run[scenario]["shards"][table]:
            h, w = shard.shape
            torch.testing.assert_close(shard, trained[r : r + h, c : c + w], atol=atol, rtol=0)
            covered[r : r + h, c : c + w] = True
    assert covered.all(), f"the shards of {table} do not cover the table"
    assert not torch.allclose(trained, initial_weights(tables)[table]), "training did not change the table"


@pytest.mark.slow
@pytest.mark.parametrize("table", list(TABLES), ids=[TABLES[t][2].short for t in TABLES])
def test_sharded_matches_unsharded(sharded_runs: list[dict[str, Any]], table: str) -> None:
    _check(sharded_runs, "fp32", table, atol=1e-5)


@pytest.mark.slow
def test_table_wise_fp16_comms_close_to_unsharded(sharded_runs: list[dict[str, Any]]) -> None:
    _check(sharded_runs, "fp16", "tw16", atol=5e-3)
