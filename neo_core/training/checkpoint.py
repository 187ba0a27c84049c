"""Distributed checkpoints: every rank saves and loads its own shards.

Lightning's own checkpoint of a DMP model keeps only rank 0's shards, so Neo saves with
``torch.distributed.checkpoint``: model and optimizer state dicts from every rank, plus a
small ``meta.json`` (step) written by rank 0 once the save has finished on all ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def read_checkpoint_step(path: Path) -> int:
    """The step a finished checkpoint in ``path`` was taken at (0 if there is none)."""
    meta = path / "meta.json"
    if not meta.is_file():
        return 0
    return int(json.loads(meta.read_text())["step"])


def _state(trainer: pl.Trainer, module: Any) -> dict[str, Any]:
    return {"model": module.model.state_dict(), "optim": trainer.optimizers[0].state_dict()}


class DistributedCheckpoint(pl.Callback):
    """Save at the end (and every ``every_n_steps``); optionally resume at fit start."""

    def __init__(
        self,
        path: Path,
        every_n_steps: int | None = None,
        save_at_end: bool = True,
        resume: bool = False,
        step_offset: int = 0,
    ) -> None:
        self.path = Path(path)
        self.every_n_steps = every_n_steps
        self.save_at_end = save_at_end
        self.resume = resume
        self.step_offset = step_offset
        self._last_saved = -1

    def save(self, trainer: pl.Trainer, module: Any) -> None:
        step = trainer.global_step + self.step_offset
        if step == self._last_saved:
            return
        meta = self.path / "meta.json"
        if trainer.is_global_zero and meta.exists():
            meta.unlink()  # the checkpoint is incomplete until meta.json is rewritten
        dcp.save(_state(trainer, module), checkpoint_id=str(self.path))
        if dist.is_initialized():
            dist.barrier()
        if trainer.is_global_zero:
            meta.write_text(json.dumps({"step": step}) + "\n")
        self._last_saved = step

    def on_fit_start(self, trainer: pl.Trainer, module: Any) -> None:
        if not self.resume:
            return
        optimizer = trainer.optimizers[0]
        for _, sub in getattr(optimizer, "optimizers", []):
            if hasattr(sub, "init_state") and not hasattr(sub, "fused_optimizer"):
                try:
                    sub.init_state()  # lazily-created dense states must exist before loading
                except Exception:  # noqa: BLE001 - fused optimizers keep their state already
                    pass
        state = _state(trainer, module)
        dcp.load(state, checkpoint_id=str(self.path))
        module.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        step = trainer.global_step + self.step_offset
        if self.every_n_steps and step % self.every_n_steps == 0:
            self.save(trainer, module)

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        if self.save_at_end:
            self.save(trainer, module)
