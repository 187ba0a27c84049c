"""Ctrl-C during training: the first stops every rank after the same step, with a checkpoint;
the second stops at once.

A terminal sends SIGINT to every process of the run, but each rank is at its own point of its
step when it arrives. So a rank only notes it; every ``every_n_steps`` steps the ranks agree
(one all-reduce of a flag) and, if any was asked, all stop after that step. The fit then ends
as a finished one does: the checkpoint callback saves (unless ``trainer.checkpoint=false``)
and the results are written, marked ``interrupted``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl

STOPPING = "\nstopping: the ranks finish their step, then save a checkpoint (Ctrl-C again to stop at once)"


class StopOnInterrupt(pl.Callback):
    """Stop all ranks after one agreed step once any rank got SIGINT."""

    def __init__(self, every_n_steps: int = 1, announce: bool = False) -> None:
        self.every_n_steps = max(1, int(every_n_steps))
        self.announce = announce  # say so on the first SIGINT (no parent process to say it)
        self.asked = False  # this rank got a SIGINT
        self.stopped_at: int | None = None  # the trainer step after which all ranks stopped
        self._steps = 0

    def _handler(self, signum: int, frame: Any) -> None:
        if self.asked:  # the second: stop now (Lightning tears the rank down)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.asked = True
        if self.announce:
            print(STOPPING, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Catch SIGINT in this process while the block runs (main thread only; else no change)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self._steps += 1
        if self._steps % self.every_n_steps:
            return
        # every rank calls this at the same step: the collective cannot deadlock
        if trainer.strategy.reduce_boolean_decision(self.asked, all=False):
            trainer.should_stop = True
            self.stopped_at = trainer.global_step


@contextlib.contextmanager
def parent_of_ranks() -> Iterator[None]:
    """In the process that started the ranks: the first SIGINT is left to them (they stop after
    an agreed step and save), the second raises KeyboardInterrupt here as well."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        print(STOPPING, file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
