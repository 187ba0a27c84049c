"""Neo's planner in your own TorchRec training code: plan the model's tables, shard the model
with TorchRec's DistributedModelParallel, and train it with your own loop.

    torchrun --nproc_per_node 2 docs/examples/own_training_loop.py

Each rank plans (and runs rank 0's plan, should its own differ), checks the
sharded model's output against the same model unsharded, and trains 40 steps on a label that
the ``country`` table can learn.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.optimizers import in_backward_optimizer_filter

from neo_core.api import plan_model, seeded_table_init

TABLES = {"user_id": (100_000, 32), "item_id": (50_000, 32), "category": (500, 16), "country": (200, 8)}
POOLING = {"user_id": 1, "item_id": 4, "category": 2, "country": 1}  # mean ids per sample
BATCH = 64  # samples per rank and step


class Model(nn.Module):
    def __init__(self, tables: torch.device) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Linear(sum(d for _, d in TABLES.values()), 16), nn.ReLU(), nn.Linear(16, 1))
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n])
                    for n, (r, d) in TABLES.items()],
            device=tables,  # "meta": no table memory until DMP builds each rank's shards
        )

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(features).to_dict()  # by feature: a sharded EBC gives its keys in another order
        return self.head(torch.cat([pooled[n] for n in TABLES], dim=1)).squeeze(-1)


def batch(step: int, rank: int) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = {n: torch.randint(1, 2 * POOLING[n], (BATCH,), generator=g) for n in TABLES}
    ids = {n: torch.randint(0, TABLES[n][0], (int(lengths[n].sum()),), generator=g) for n in TABLES}
    labels = (ids["country"] < 100).float()  # one country id per sample
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=list(TABLES), values=torch.cat([ids[n] for n in TABLES]), lengths=torch.cat([lengths[n] for n in TABLES]))
    return features, labels


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model(torch.device("meta"))
    reference = Model(torch.device("cpu"))  # the same model, unsharded, for the check below
    reference.head.load_state_dict(model.head.state_dict())

    # "local": this machine's ranks, as many as the process group has (CPU ranks over gloo).
    # The planner chooses each table's sharding; here three are held to a type, to show them
    result = plan_model(model, "local", BATCH, pooling_factors=POOLING,
                        table_sharding_types={"user_id": ["RW"], "item_id": ["CW"], "category": ["DP"]})
    if rank == 0:
        print(result.format_text(), flush=True)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=result.torchrec_plan,
                                   sharders=result.torchrec_sharders)
    seeded_table_init(dmp, seed=0)  # each shard holds the rows the unsharded table would
    seeded_table_init(reference, seed=0)

    features, labels = batch(0, rank)
    with torch.no_grad():
        diff = (dmp(features) - reference(features)).abs().max().item()
    print(f"rank {rank}: the sharded model's output is the unsharded model's (max |difference| {diff:.1e})",
          flush=True)

    # the tables on the fused kernel update in their backward (the kernel's optimizer, row-wise
    # Adagrad); the dense head, and any data-parallel table (dense kernel), need an optimizer
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    optimizer = torch.optim.Adagrad(dense.values(), lr=0.05)
    losses = []
    for step in range(40):
        features, labels = batch(step, rank)
        loss = nn.functional.binary_cross_entropy_with_logits(dmp(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    if rank == 0:
        print(f"loss over the ranks: first 10 steps {sum(losses[:10]) / 10:.4f}, last 10 {sum(losses[-10:]) / 10:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    import os
    import sys

    if "RANK" not in os.environ:  # run with plain python: torch's env:// rendezvous fails with a traceback
        sys.exit("run it with torchrun, which starts the ranks: torchrun --nproc_per_node 2 "
                 "docs/examples/own_training_loop.py")
    main()
