"""The LightningModule: one training step of a sharded recommendation model.

The model arrives unsharded, with its tables on the meta device; :class:`NeoStrategy` calls
:meth:`NeoModule.shard`, which plans and wraps it in TorchRec's ``DistributedModelParallel``.
Embedding tables on the fused kernel are updated inside backward by FBGEMM; everything else
(MLPs) by the dense optimizer, and replicated tables on the dense kernel by the kernel's
optimizer, unfused. All live in one TorchRec ``CombinedOptimizer``, whose ``step`` hands
Lightning's closure (forward and backward) to every part that takes one: with two torch
parts, every step ran forward and backward twice, fused tables were updated twice and the
logged loss was the second pass's. :class:`OneClosureOptimizer` runs the closure once.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import nn
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch
from torchrec.optim.keyed import CombinedOptimizer

from neo_core.config import TrainerConfig
from neo_core.errors import ConfigError, TrainingError
from neo_core.kernels import EmbeddingKernel
from neo_core.sharding import PlanResult


def plan_digest(plan: Any) -> str:
    """What the ranks must agree on: every table's type, kernel, ranks and shard shapes."""
    import hashlib
    import json

    key = [(a.name, a.sharding_type, a.compute_kernel, list(a.ranks), [list(s) for s in a.shard_shapes])
           for a in plan.tables]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def table_weight_bytes(model: nn.Module, plan: PlanResult) -> float:
    """Bytes of the model's embedding tables once sharded by ``plan``: every table's rows x dim
    x element size, a replicated (data-parallel) table once per rank that holds it."""
    from torchrec.modules.embedding_configs import data_type_to_dtype

    copies = {a.name: len(a.ranks) if a.sharding_type == "data_parallel" else 1 for a in plan.tables}
    total = 0
    for module in model.modules():
        configs = (module.embedding_bag_configs() if hasattr(module, "embedding_bag_configs")
                   else module.embedding_configs() if hasattr(module, "embedding_configs") else ())
        for config in configs:
            size = data_type_to_dtype(config.data_type).itemsize
            total += config.num_embeddings * config.embedding_dim * size * copies.get(config.name, 1)
    return float(total)


def agree_on_plan(plan: Any, own_capacity: float | None = None) -> tuple[Any, list[int]]:
    """Every rank has its own plan (made in its process, before the rank started or by the
    rank: ``run.rank_plan``); all must build the same plan, or DMP shards tables
    differently per rank (a table held twice, another by no rank) and trains on silently.
    Returns rank 0's plan and the ranks whose own plan differed from it (then rank 0's plan,
    sent to every rank, is the one run). Where rank 0's plan does not fit a rank's machine
    (``own_capacity``: the device memory this rank's machine gives it, else what its own plan
    says), every rank stops (:func:`memory_short`)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return plan, []
    me = dist.get_rank()
    # each rank's plan, and the device memory its own machine gives it (its topology, as it planned)
    own = plan.ranks[me].memory_capacity if me < len(getattr(plan, "ranks", ())) else 0.0
    own = own_capacity if own_capacity is not None else own
    # rank 0's plan's memory by rank (capacity, total, reserve), which every rank checks alike
    loads = [(r.memory_capacity, r.memory_total, r.memory.get("reserve", 0.0)) for r in plan.ranks] if me == 0 else None
    said: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(said, (plan_digest(plan), own, loads))
    differ = [r for r, (d, _, _) in enumerate(said) if d != said[0][0]]
    if differ:
        sent = [plan if me == 0 else None]
        dist.broadcast_object_list(sent, src=0)
        plan = sent[0]
    capacities = [c for _, c, _ in said]
    # a plan made elsewhere (own_capacity: each rank's machine now): its ranks against rank 0's machine
    # now, not against the budget it was made with (another memory_fraction on alike machines)
    reference = capacities[0] if own_capacity is not None else None
    if short := memory_short(said[0][2], capacities, reference):  # in every rank alike: all stop, none waits
        raise ConfigError(short)
    return plan, differ


def memory_short(loads: list[tuple[float, float, float]], capacities: list[float],
                 reference: float | None = None) -> str | None:
    """Why rank 0's plan, which every rank runs (``loads``: its device memory capacity, total
    and reserve by rank), does not fit the ranks whose own machine gives them less device
    memory than rank 0's planned with (``capacities``: each rank's own, 0 where unknown), with
    the fix; None where it fits them all. Machines of several launched by torchrun are taken as
    alike to rank 0's: a smaller one ran out of memory in DMP. ``reference``: what rank 0's
    machine gives now, for a plan made elsewhere (else the capacity the plan records)."""
    short = []
    for rank, capacity in enumerate(capacities):
        if not capacity or rank >= len(loads):
            continue
        planned, total, reserve = loads[rank]
        bigger = reference if reference is not None else planned
        if not planned or not bigger or capacity >= bigger:
            continue
        used = total - reserve
        room = capacity * (1 - reserve / planned)  # the same share held back as on rank 0's machine
        if used > room:
            short.append((rank, capacity, bigger, used, room))
    if not short:
        return None
    from neo_core.sharding import _bytes

    rank, capacity, planned, used, room = short[0]
    more = f" (and rank(s) {', '.join(str(s[0]) for s in short[1:])})" if len(short) > 1 else ""
    return (
        f"Rank {rank}{more} has {_bytes(capacity, 3)} of device memory on its machine, less than the "
        f"{_bytes(planned, 3)} a rank of rank 0's machine, and every rank runs rank 0's "
        f"plan: it puts {_bytes(used, 3)} on rank {rank}, where {_bytes(room, 3)} fit with the reserve. Plan for "
        f"the smallest machine: a topology whose device_memory is {capacity:.0f} bytes a rank, or a lower "
        "topology.memory_fraction on every machine."
    )


def _gather_uneven(values: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-d ``values`` in rank order, however many each holds (a data source whose
    ranks hold different numbers of held-out samples: all_gather needs equal sizes)."""
    world = dist.get_world_size()
    count = torch.tensor([values.numel()], device=values.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    padded = torch.nn.functional.pad(values, (0, max(sizes) - values.numel()))
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)])


class StepClock(pl.Callback):
    """Ends each step's timing as soon as the step's training is done: first among the
    callbacks, before a checkpoint save, the ranks' Ctrl-C agreement or the progress bar (the
    module's own hook runs after every callback's, and timed them all). On CUDA it waits for
    the device first, which has work queued when the host gets here."""

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        module.end_step_timing()


class OneClosureOptimizer(CombinedOptimizer):
    """TorchRec's ``CombinedOptimizer`` that runs the step's closure once, then steps every part."""

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, opt in self.optimizers:
            opt.step()
        return loss


INIT_BLOCK_ROWS = 1 << 14  # rows drawn from one generator (seeded_table_init)


def seeded_table_init(model: nn.Module, seed: int) -> None:
    """Give every table the initial weights it would have whatever the plan: TorchRec's
    default distribution, uniform in +-sqrt(1 / rows), drawn per block of rows from a
    generator seeded by (seed, table, block), so that each shard holds the rows and columns
    the whole table would. TorchRec draws each shard from the rank's own generator, so two
    plans of one model started from different weights (a sweep comparing plans measured
    initialisation noise too)."""
    import hashlib

    def stream(table: str, block: int) -> torch.Generator:
        digest = hashlib.blake2b(f"{seed}/{table}/{block}".encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)

    with torch.no_grad(), warnings.catch_warnings():
        # TorchRec's shards are ShardedTensors, whose every use warns of their deprecation
        warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)
        for key, value in model.state_dict().items():
            if "embedding_bags" not in key or not key.endswith(".weight"):
                continue
            table = key.split(".")[-2]
            rows, dim = (int(n) for n in value.size())
            bound = (1.0 / max(rows, 1)) ** 0.5
            if hasattr(value, "local_shards"):
                pieces = [(s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in value.local_shards()]
            else:  # replicated: the whole table on each rank
                pieces = [((0, 0), (rows, dim), value)]
            for (r, c), (h, w), tensor in pieces:
                for block in range(r // INIT_BLOCK_ROWS, (r + h - 1) // INIT_BLOCK_ROWS + 1 if h else 0):
                    first = block * INIT_BLOCK_ROWS
                    count = min(INIT_BLOCK_ROWS, rows - first)
                    values = torch.rand(count, dim, generator=stream(table, block)) * (2 * bound) - bound
                    lo, hi = max(r, first), min(r + h, first + count)
                    tensor[lo - r: hi - r].copy_(values[lo - first: hi - first, c: c + w])


def _torch_optimizer(name: str, lr: float, eps: float = 1e-8) -> Callable[[Any], torch.optim.Optimizer]:
    def make(params: Any) -> torch.optim.Optimizer:
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr)
        if name == "adam":
            return torch.optim.Adam(params, lr=lr, eps=eps)
        return torch.optim.Adagrad(params, lr=lr, eps=eps)

    return make


class NeoModule(pl.LightningModule):
    """Trains ``model(dense, sparse) -> logits`` with binary cross-entropy."""

    def __init__(
        self,
        model: nn.Module,
        planner_fn: Callable[[nn.Module], PlanResult],
        sharders_fn: Callable[[], list[Any]],
        kernel: EmbeddingKernel,
        trainer_cfg: TrainerConfig,
        global_batch_size: int,
        step_offset: int = 0,
        on_plan: Callable[[PlanResult], None] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.planner_fn = planner_fn
        self.sharders_fn = sharders_fn
        self.kernel = kernel
        self.trainer_cfg = trainer_cfg
        self.global_batch_size = global_batch_size
        self.step_offset = step_offset
        self.on_plan = on_plan  # told the plan the ranks agreed on, before it is run
        self.seed = seed  # the tables' initial weights (seeded_table_init); None: TorchRec's per shard
        self.plan: PlanResult | None = None
        self.loss_fn = nn.BCEWithLogitsLoss()
        self._val_preds: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []
        self._said_one_class = False  # the note that the AUC is undefined, said once
        self.history: list[dict[str, float]] = []  # per logged step, this rank
        self.val_history: list[dict[str, float]] = []
        self.history_restored = False  # the steps before step_offset came with the checkpoint
        self._pending: tuple[int, torch.Tensor] | None = None  # (step, loss) of the step in progress
        self._step_started: float | None = None
        self._step_times: list[float] = []

    @property
    def is_sharded(self) -> bool:
        from torchrec.distributed.model_parallel import DistributedModelParallel

        return isinstance(self.model, DistributedModelParallel)

    def shard(self, device: torch.device) -> None:
        """Plan and wrap the model in ``DistributedModelParallel`` (materialises local shards)."""
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv

        self.plan, differ = agree_on_plan(self.planner_fn(self.model))
        if differ and dist.get_rank() == 0:
            print(
                f"warning: rank(s) {', '.join(map(str, differ))} built another plan than rank 0 (a plugin whose "
                "result depends on the rank or the time: the planner, or a topology, model, kernel or other "
                "factory the plan reads); every rank runs rank 0's plan",
                flush=True,
            )
        if self.on_plan is not None:
            self.on_plan(self.plan)
        pg = dist.group.WORLD if dist.is_initialized() else None
        env = ShardingEnv.from_process_group(pg) if pg is not None else ShardingEnv.from_local(1, 0)
        held = sum(r.memory.get("weights", 0.0) + r.memory.get("optimizer", 0.0) for r in self.plan.ranks)
        # the plan's memory kinds are the planner's own (a TorchRec plan has none of these, a
        # cached table's host part is not among them): the tables' weights, from the model
        weights = table_weight_bytes(self.model, self.plan)
        what = "weights and optimizer state" if held >= weights else "weights"
        held = max(held, weights)
        if held >= 2**30 and (not dist.is_initialized() or dist.get_rank() == 0):  # seconds with nothing on screen
            print(f"building the tables' shards: {held / 2**30:.1f} GiB of {what} over "
                  f"{len(self.plan.ranks)} rank(s) ...", flush=True)
        self.model = DistributedModelParallel(
            self.model,
            env=env,
            device=device,
            plan=self.plan.torchrec_plan,
            sharders=self.sharders_fn(),
        )
        if self.seed is not None:
            seeded_table_init(self.model, self.seed)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model(batch.dense_features, batch.sparse_features).squeeze(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        from torchrec.optim.keyed import KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        model = self.model
        named = dict(in_backward_optimizer_filter(model.named_parameters()))
        embedding = {k: v for k, v in named.items() if "embedding_bags" in k}
        dense = {k: v for k, v in named.items() if k not in embedding}
        cfg = self.trainer_cfg
        parts: list[tuple[str, Any]] = [("fused", model.fused_optimizer)]
        if dense:
            parts.append(
                ("dense", KeyedOptimizerWrapper(dense, _torch_optimizer(cfg.dense_optimizer, cfg.dense_learning_rate)))
            )
        if embedding:  # replicated tables (dense compute kernel): the kernel's optimizer, unfused
            opt = self.kernel.replica_optimizer.value  # row-wise Adagrad: full Adagrad here
            parts.append(
                ("embedding", KeyedOptimizerWrapper(
                    embedding, _torch_optimizer(opt, self.kernel.learning_rate, self.kernel.eps)
                ))
            )
        return OneClosureOptimizer(parts)

    # -- training -----------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started = time.perf_counter()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        loss = self.loss_fn(logits, batch.labels)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        self._pending = (self.global_step + self.step_offset + 1, loss.detach())  # recorded at batch end
        return loss

    def finite_loss(self, outputs: Any) -> float:
        """The step's loss (one device sync per step; the checkpoint callback, which Lightning
        calls first, reads it before saving): a diverged run stops here, naming what to lower."""
        loss = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)
        if not math.isfinite(loss):
            raise TrainingError(
                f"The training loss is {loss} at step {self.global_step + self.step_offset}: training diverged. "
                f"Lower the tables' learning rate (kernel.learning_rate={self.kernel.learning_rate:g}, "
                f"{self.kernel.optimizer.value}) or the dense layers' (trainer.dense_learning_rate="
                f"{self.trainer_cfg.dense_learning_rate:g}, {self.trainer_cfg.dense_optimizer}); no checkpoint was "
                "written for this step (earlier ones may hold weights that had already diverged)."
            )
        return loss

    def end_step_timing(self) -> None:
        """The step's time, from its start to here (``StepClock``, or this module's hook when
        no clock runs)."""
        if self._step_started is not None:
            self._step_times.append(time.perf_counter() - self._step_started)
            self._step_started = None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.end_step_timing()  # timed already when a StepClock runs
        step = self.global_step + self.step_offset
        loss = self.finite_loss(outputs)
        self.history.append({"step": step, "loss": loss})
        self._pending = None
        every = self.trainer_cfg.log_every_n_steps
        if self._step_times and step % every == 0:
            recent = self._step_times[-every:]
            rate = self.global_batch_size * len(recent) / sum(recent)
            self.log("train/samples_per_sec", rate, prog_bar=True, on_step=True, on_epoch=False)

    def record(self) -> dict[str, list[dict[str, float]]]:
        """Loss per step and validation results so far, the step in progress included (a
        checkpoint callback runs before this module's ``on_train_batch_end`` records it)."""
        history = list(self.history)
        if self._pending is not None and (not history or history[-1]["step"] < self._pending[0]):
            history.append({"step": self._pending[0], "loss": float(self._pending[1])})
        return {"history": history, "val_history": list(self.val_history)}

    def samples_per_second(self, warmup: int = 5) -> float:
        """Global samples/s over this run's steps after ``warmup`` (training time only); a run of
        ``2 * warmup`` steps or fewer leaves out its first step alone (it builds the kernels and
        caches: 10-20x a later step on CPU)."""
        times = self._step_times[self.warmup_steps(warmup):]
        return self.global_batch_size * len(times) / sum(times) if times else 0.0

    def samples_per_second_spread(self, warmup: int = 5) -> tuple[float, float] | None:
        """The 10th and 90th percentile of the per-step samples/s over the steps
        ``samples_per_second`` counts: how steady the rate was (None below 10 such steps, too
        few to say)."""
        rates = [self.global_batch_size / t for t in self._step_times[self.warmup_steps(warmup):] if t > 0]
        if len(rates) < 10:
            return None
        deciles = statistics.quantiles(rates, n=10, method="inclusive")  # linear between the closest ranks
        return deciles[0], deciles[-1]

    def warmup_steps(self, warmup: int = 5) -> int:
        """How many of this run's first steps ``samples_per_second`` leaves out."""
        n = len(self._step_times)
        return warmup if n > 2 * warmup else 1 if n > 1 else 0

    # -- validation ---------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_preds, self._val_labels = [], []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        # logits, on the device: gathered there (NCCL carries device tensors only), ranked as
        # logits (sigmoids saturate into ties: past |logit| ~17 in float32)
        self._val_preds.append(self(batch).detach().float())
        self._val_labels.append(batch.labels.detach().float())

    def on_validation_epoch_end(self) -> None:
        gathered = dist.is_initialized() and dist.get_world_size() > 1
        if not self._val_preds and not gathered:
            return
        # a rank without held-out batches still takes part in the gather the others wait in
        none = torch.empty(0, device=self.device)
        logits = torch.cat(self._val_preds) if self._val_preds else none
        labels = torch.cat(self._val_labels) if self._val_labels else none
        if gathered:
            logits, labels = _gather_uneven(logits), _gather_uneven(labels)
        if not logits.numel():
            return
        logits, labels = logits.cpu().double(), labels.cpu()
        classes = labels.long().unique()
        if len(classes) < 2:  # AUC is undefined (torchmetrics gives 0.0): recorded as not measured
            auc = math.nan
            if not self._said_one_class and (not dist.is_initialized() or dist.get_rank() == 0):
                self._said_one_class = True
                print(f"note: every held-out label is {int(classes[0]) if len(classes) else '-'}, so the "
                      "validation AUC is undefined (recorded as null); the data's labels have one class "
                      "(data.bias?) or trainer.val_batches x batch is too small", flush=True)
        else:
            # ranked by the logits' order, as scores in [0, 1] (torchmetrics takes values outside
            # [0, 1] through a sigmoid, which ties them at 1.0 past a logit of ~37 in float64)
            distinct, order = torch.unique(logits, return_inverse=True)
            auc = float(binary_auroc(order.double() / max(1, len(distinct) - 1), labels.long()))
        loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.double()))
        self.log("val/auc", auc, prog_bar=True, rank_zero_only=True)
        self.log("val/loss", loss, rank_zero_only=True)
        self.val_history.append({"step": self.global_step + self.step_offset, "auc": auc, "loss": loss})
