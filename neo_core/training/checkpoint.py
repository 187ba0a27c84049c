"""Distributed checkpoints: every rank saves and loads its own shards.

Lightning's own checkpoint of a DMP model keeps only rank 0's shards, so Neo saves with
``torch.distributed.checkpoint``: model and optimizer state dicts from every rank, plus a
small ``meta.json`` (step) written by rank 0 once the save has finished on all ranks.

A save never touches the previous checkpoint until the new one is complete: it is written
to ``checkpoint.tmp``, finished with its ``meta.json`` (written whole, flushed to disk), and
only then swapped in (``checkpoint`` -> ``checkpoint.old``, ``checkpoint.tmp`` ->
``checkpoint``, the old one removed, its ``meta.json`` first). A crash at any point leaves at
least one complete checkpoint, and resuming takes the latest complete one of the three
folders; the next save first moves that one into ``checkpoint`` (``settle``), so a second
crash cannot lose it.

A resumed run may plan differently (another world size or planner): weights are resharded on
load. A table that moved between data parallel (a torch optimizer's state) and sharded (the
fused optimizer's) has optimizer state of another form in the checkpoint; its weights load
and its optimizer state starts afresh, which the run notes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from neo_core.errors import CheckpointError


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _meta_step(folder: Path) -> int | None:
    """The step in ``folder/meta.json``; None when the folder holds no finished checkpoint."""
    meta = folder / "meta.json"
    if not meta.is_file():
        return None
    try:
        step = json.loads(meta.read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{meta} is unreadable ({type(exc).__name__}); delete {folder} to start afresh there, or "
            "choose another output folder."
        ) from None
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise CheckpointError(f"{meta} names step {step!r}, not a positive whole number; delete {folder}.")
    return step


def _remove(folder: Path) -> None:
    """Delete a checkpoint folder, its ``meta.json`` first: a delete cut short leaves a folder
    that no longer passes for a finished checkpoint."""
    (folder / "meta.json").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def _write_durably(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file, flushed to disk, renamed)."""
    import os

    part = path.with_name(path.name + ".part")
    with open(part, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    part.replace(path)


def settle(path: Path) -> None:
    """Make ``path`` hold the newest finished checkpoint, where a crash between a save's two
    renames left it in ``.tmp`` (or in ``.old`` alone): a later save would otherwise delete that
    ``.tmp`` before its own was finished, and a second crash then lose it. Rank 0's to call."""
    latest = latest_checkpoint(path)
    if latest is None or latest[0] == path:
        return
    old = _sibling(path, ".old")
    if latest[0] != old:  # the newest is .tmp, finished but not swapped in
        _remove(old)
        if path.exists():
            path.rename(old)
        latest[0].rename(path)
        _remove(old)
    else:  # only .old is finished: the folder in its place is not
        _remove(path)
        old.rename(path)


def readable_checkpoint(path: Path) -> tuple[Path, int] | None:
    """:func:`latest_checkpoint`, or None where a damaged one cannot be read: what an error
    message may say is kept."""
    try:
        return latest_checkpoint(path)
    except CheckpointError:
        return None


def latest_checkpoint(path: Path) -> tuple[Path, int] | None:
    """The newest finished checkpoint among ``path`` and its ``.tmp``/``.old`` siblings."""
    found = [(step, folder) for folder in (path, _sibling(path, ".tmp"), _sibling(path, ".old"))
             if (step := _meta_step(folder)) is not None]
    if not found:
        return None
    step, folder = max(found, key=lambda f: f[0])
    return folder, step


def read_history(folder: Path, step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The run's loss and validation record up to ``step``, as saved with the checkpoint in
    ``folder`` (``history.json``); None for a checkpoint saved without one."""
    path = folder / "history.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        history = [h for h in saved["history"] if h["step"] <= step]
        val_history = [h for h in saved["val_history"] if h["step"] <= step]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}); delete it to resume without the earlier steps' "
            "record in metrics.json, or delete the checkpoint to start afresh."
        ) from None
    return history, val_history


@contextlib.contextmanager
def _quiet_reader() -> Iterator[None]:
    """torch.distributed.checkpoint logs a warning with a traceback for each file it cannot
    read; the error raised says it once."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _check_metadata(folder: Path) -> None:
    """The checkpoint's index (``.metadata``, written last by every save) is there and reads."""
    index = folder / ".metadata"
    fix = (f"the checkpoint in {folder} is damaged (cut short or copied in part); restore it, or start "
           "afresh in another output folder (a run that does not resume keeps this folder's checkpoint).")
    if not index.is_file() or index.stat().st_size == 0:
        raise CheckpointError(f"{index} is {'empty' if index.is_file() else 'missing'}: {fix}")
    try:
        with _quiet_reader():
            dcp.FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to read the index means the same
        raise CheckpointError(f"{index} cannot be read ({type(exc).__name__}): {fix}") from None


def _state(trainer: pl.Trainer, module: Any) -> dict[str, Any]:
    return {"model": module.model.state_dict(), "optim": trainer.optimizers[0].state_dict()}


def _optimizer_state_not_saved(state: dict[str, Any], folder: Path) -> list[str]:
    """Optimizer state keys of this run that the checkpoint lacks, when every model key is
    there (then those may load partially); otherwise [] (a full load, which says what is
    missing)."""
    try:
        saved = set(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - unreadable: the load itself reports it
        return []
    flat, _ = flatten_state_dict(state)
    missing = [k for k in flat if k not in saved]
    if any(not k.startswith("optim.") for k in missing):
        return []
    return missing


def _note_fresh_state(fresh: list[str], say: bool) -> None:
    """Name, once for all ranks (a collective: every rank calls it), the parameters whose
    optimizer state starts afresh."""
    tables = {m.group(1) for k in fresh if (m := re.search(r"embedding_bags\.([^.]+)\.weight\b", k))}
    others = {k.rsplit(".", 1)[0] for k in fresh if "embedding_bags." not in k}
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (tables, others))
        tables = set().union(*(g[0] for g in gathered))
        others = set().union(*(g[1] for g in gathered))
    if not (tables or others) or not say:
        return
    parts = []
    if tables:
        names = sorted(tables)
        shown = ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")
        parts.append(f"tables {shown} (data-parallel in one plan, sharded in the other)")
    if others:
        parts.append(f"{len(others)} other parameter(s) (another optimizer)")
    print(
        f"note: the optimizer state of {' and '.join(parts)} is not in the checkpoint and starts afresh; "
        "their weights are loaded",
        file=sys.stderr,
    )


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class DistributedCheckpoint(pl.Callback):
    """Save at the end (and every ``every_n_steps``); optionally resume at fit start."""

    def __init__(
        self,
        path: Path,
        every_n_steps: int | None = None,
        save_at_end: bool = True,
        resume: bool = False,
        step_offset: int = 0,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.config = config  # the run's settings, kept with each checkpoint (config.json)
        self.every_n_steps = every_n_steps
        self.save_at_end = save_at_end
        self.resume = resume
        self.step_offset = step_offset
        self._last_saved = -1

    def save(self, trainer: pl.Trainer, module: Any) -> None:
        step = trainer.global_step + self.step_offset
        if step == self._last_saved:
            return
        tmp, old = _sibling(self.path, ".tmp"), _sibling(self.path, ".old")
        if trainer.is_global_zero:
            settle(self.path)  # a finished .tmp of a save cut short is swapped in, not deleted
            _remove(tmp)  # an unfinished save of an earlier run
        _barrier()
        try:
            dcp.save(_state(trainer, module), checkpoint_id=str(tmp))
        except (Exception, CheckpointException) as exc:  # every rank's save failed alike (a collective)
            if trainer.is_global_zero:
                _remove(tmp)
            raise CheckpointError(self._save_failed(step, tmp, exc)) from exc
        _barrier()
        if trainer.is_global_zero:
            try:
                if self.config is not None:  # what resuming compares with: the run that wrote it
                    (tmp / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
                # the record so far, so that metrics.json covers every step after a crash and resume
                (tmp / "history.json").write_text(json.dumps(module.record()) + "\n")
                _write_durably(tmp / "meta.json", json.dumps({"step": step}) + "\n")  # the save is finished
            except OSError as exc:
                _remove(tmp)
                raise CheckpointError(self._save_failed(step, tmp, exc)) from exc
            _remove(old)
            if self.path.exists():
                self.path.rename(old)
            tmp.rename(self.path)
            _remove(old)
        _barrier()
        self._last_saved = step

    def _save_failed(self, step: int, tmp: Path, exc: BaseException) -> str:
        """What a failed save says, on one line: its cause (a rank's, where the collective save
        wraps them: torch's message alone was "CheckpointException ranks:dict_keys([0, 1])"),
        the room left, what is kept and how to continue once there is room. The unfinished
        save is removed: it held the space a full disk needs."""
        cause: BaseException = exc
        failures = getattr(exc, "failures", None)
        if isinstance(failures, dict) and failures:
            first = failures[min(failures)]
            cause = first[0] if isinstance(first, tuple) else first
        text = (str(cause).strip().splitlines() or [""])[0]
        said = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
        try:
            room = f"; {shutil.disk_usage(self.path.parent).free / 2**20:,.0f} MiB free on its disk"
        except OSError:
            room = ""
        latest = readable_checkpoint(self.path)
        fix = "make room (a full disk, or a file-size limit: `ulimit -f`) and "
        if latest:
            return (f"saving the checkpoint of step {step} into {tmp} failed ({said}{room}); the unfinished save was "
                    f"removed and the last finished checkpoint, of step {latest[1]}, is kept in {latest[0]}: {fix}"
                    f"continue with the run's command and trainer.resume=true hydra.run.dir={self.path.parent}")
        return (f"saving the checkpoint of step {step} into {tmp} failed ({said}{room}); the unfinished save was "
                f"removed and no checkpoint was finished before it: {fix}run the command again")

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
        latest = latest_checkpoint(self.path)
        if latest is None:
            raise CheckpointError(f"{self.path} holds no finished checkpoint to resume from.")
        folder = latest[0]
        _check_metadata(folder)
        state = _state(trainer, module)
        fresh = _optimizer_state_not_saved(state, folder)
        _note_fresh_state(fresh, trainer.is_global_zero)
        try:
            with _quiet_reader():
                dcp.load(state, checkpoint_id=str(folder), planner=DefaultLoadPlanner(allow_partial_load=bool(fresh)))
            module.model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - each means the same to the user
            failures = getattr(exc, "failures", None)  # a CheckpointException's, by rank
            if failures:
                exc = next(iter(failures.values()))
                exc = exc[0] if isinstance(exc, tuple) and exc else exc  # (exception, traceback)
            first = (str(exc).strip().splitlines() or [""])[0] or "a file ends early"
            if len(first) > 300:  # at a word's end
                first = first[:300].rsplit(" ", 1)[0] + " ..."
            raise CheckpointError(
                f"The checkpoint in {folder} does not load into this run ({type(exc).__name__}: {first}); "
                "it was written with a different model, data, kernel or plan (its config is in "
                "config.json next to it) or is damaged. Resume with that config, or start afresh in "
                "another output folder."
            ) from None

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        step = trainer.global_step + self.step_offset
        if self.every_n_steps and step % self.every_n_steps == 0:
            if hasattr(module, "finite_loss"):  # a diverged step is not saved (the module's own hook runs later)
                module.finite_loss(outputs)
            self.save(trainer, module)

    def on_validation_end(self, trainer: pl.Trainer, module: Any) -> None:
        # validation after a step runs after that step's save: add its result to the record
        if trainer.is_global_zero and self._last_saved == trainer.global_step + self.step_offset:
            if (self.path / "meta.json").is_file() and _meta_step(self.path) == self._last_saved:
                tmp = self.path / "history.json.tmp"
                tmp.write_text(json.dumps(module.record()) + "\n")
                tmp.replace(self.path / "history.json")

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        if self.save_at_end:
            self.save(trainer, module)
