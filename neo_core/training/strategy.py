"""A Lightning strategy that shards with TorchRec's ``DistributedModelParallel``.

Lightning's stock DDP strategy cannot hold a sharded model: DDP's parameter-shape check sees
differently sized shards per rank, and its start-up state sync would overwrite every rank's
shards with rank 0's. This strategy keeps Lightning's process-group set-up, reductions and
barriers, and replaces model placement: DMP shards the tables and wraps the dense part in DDP
itself, so the module is never wrapped a second time, moved, or state-synced.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from neo_core.training.module import NeoModule


class NeoStrategy(DDPStrategy):
    """DDP process handling with TorchRec DMP model placement."""

    strategy_name = "neo_dmp"

    def _module(self) -> NeoModule:
        module = self.lightning_module
        if not isinstance(module, NeoModule):
            raise TypeError(f"NeoStrategy trains a NeoModule, got {type(module).__name__}.")
        return module

    def model_to_device(self) -> None:
        """DMP places the model when sharding; nothing is moved here."""

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        module = self._module()
        if not module.is_sharded:
            module.shard(self.root_device)
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    def configure_ddp(self) -> None:
        """Never wrap in DDP again: DMP already wrapped the dense part."""

    def teardown(self) -> None:
        # Keep shards where they are (the base class would move the module to the CPU).
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        device = device or self.root_device
        if hasattr(batch, "to"):
            return batch.to(device, non_blocking=device.type == "cuda")
        return super().batch_to_device(batch, device, dataloader_idx)
