"""Ctrl-C during training: the first stops every rank after the same step, with a checkpoint;
the second stops at once. SIGTERM (a batch system's preemption, torchrun passing one on) is a
request to stop the same way; it never stops at once (SIGKILL does that).

A terminal sends SIGINT to every process of the run, but each rank is at its own point of its
step when it arrives. So a rank only notes it; every ``every_n_steps`` steps the ranks agree
(one all-reduce of a flag) and, if any was asked, all stop after that step. The fit then ends
as a finished one does: the checkpoint callback saves (unless ``trainer.checkpoint=false``)
and the results are written, marked ``interrupted``.

Ranks started here (``run_ranks``) begin with SIGINT ignored, so one arriving while they
import, plan or shard cannot kill them half-way; the starting process notes it in a flag the
ranks share, and they stop at their first agreement point. A second Ctrl-C ends the ranks
there and then. A rank whose starting process is gone (killed outright) stops the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import lightning.pytorch as pl

STOPPING = "\nstopping: the ranks finish their step, then save a checkpoint (Ctrl-C again to stop at once)"
STOPPING_TERM = "\nstopping on SIGTERM: the ranks finish their step, then save a checkpoint"


def after_stop(checkpoint: bool = True, every_n_steps: int = 0, validates: bool = True) -> str:
    """What the ranks do once they have finished their step, for the first Ctrl-C's line:
    save a checkpoint; or, with ``trainer.checkpoint=false``, validate (unless
    ``trainer.val_batches=0``) and end, keeping the periodic checkpoints there are."""
    if checkpoint:
        return "then save a checkpoint"
    end = "validate and end" if validates else "end"
    kept = (f"; the checkpoints saved every {every_n_steps} steps are kept" if every_n_steps
            else "")
    return f"{end}, saving no checkpoint at the stop (trainer.checkpoint=false{kept})"


def stopping(term: bool, then: str | None = None) -> str:
    """What the first Ctrl-C (or SIGTERM) says: the ranks finish their step, then what
    ``after_stop`` says they do (save a checkpoint, by default)."""
    said = STOPPING_TERM if term else STOPPING
    return said if then is None else said.replace("then save a checkpoint", then)


SIGNALS = (signal.SIGINT, signal.SIGTERM)
# a second SIGINT this soon after the first is the same request: coreutils' timeout -s INT
# sends it to the process and then to its group, microseconds apart (taken for a second
# Ctrl-C, it ended the ranks before they saved their checkpoint)
ECHO_S = 0.3


class HardStop(BaseException):
    """The second Ctrl-C inside ``fit``. Not a KeyboardInterrupt, which Lightning turns into
    ``sys.exit(1)``; Lightning tears down and re-raises this, and ``rank_main`` turns it back
    into a KeyboardInterrupt."""


class StopOnInterrupt(pl.Callback):
    """Stop all ranks after one agreed step once any rank, or the process that started them
    (``shared``, an ``Event``), got SIGINT or SIGTERM, or that process is gone (``parent``:
    its pid, for ranks it started).

    ``alone``: no starting process watches this rank (one process, or torchrun), so this rank
    says it is stopping and stops at once on a second SIGINT, or on a SIGTERM after a SIGINT
    (torchrun's agent passes a second Ctrl-C on as SIGTERM). Otherwise the starting process
    does both (``run_ranks``): ranks that stopped on their own at different points of a
    collective would leave the others waiting in it.
    """

    def __init__(
        self,
        every_n_steps: int = 1,
        alone: bool = False,
        shared: Any = None,
        announce: bool = True,
        parent: int | None = None,
        then: str | None = None,
    ) -> None:
        self.every_n_steps = max(1, int(every_n_steps))
        self.then = then  # what the ranks do once stopped (``after_stop``; what the first Ctrl-C says)
        self.alone = alone
        self.announce = alone and announce  # one rank of a torchrun job says it, not each
        self.shared = shared
        self.parent = parent
        self.asked = False  # this rank got a SIGINT or SIGTERM
        self.interrupted = False  # ... a SIGINT
        self._installed = False  # inside ``installed`` on the main thread
        self.stopped_at: int | None = None  # the trainer step after which all ranks stopped
        self._steps = 0
        self._first = 0.0  # when this rank got its first SIGINT or SIGTERM (monotonic)

    def _handler(self, signum: int, frame: Any) -> None:
        term = signum == signal.SIGTERM
        if self.asked and not term and time.monotonic() - self._first < ECHO_S:
            return  # the same request, sent twice at once
        if self.alone and (self.interrupted or (self.asked and not term)):
            # the second Ctrl-C (or torchrun passing it on as SIGTERM): stop now (Lightning
            # tears the rank down)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise HardStop
        if not self.asked and self.announce:
            print(stopping(term, self.then), file=sys.stderr, flush=True)
        if not self.asked:
            self._first = time.monotonic()
        self.asked = True
        self.interrupted = self.interrupted or not term

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Catch SIGINT and SIGTERM in this process while the block runs (main thread only;
        else no change)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._handler) for sig in SIGNALS}
        self._installed = True
        try:
            yield
        finally:
            self._installed = False
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def setup(self, trainer: pl.Trainer, module: Any, stage: str) -> None:
        # Lightning's fit puts its own SIGTERM handler in front of this one (chained) before
        # training starts, one that broadcasts from inside the handler (ranks caught at
        # different points of a step then wait in mismatched collectives) and ends the fit
        # without the end-of-training save. Its notifier is made a no-op before it is
        # registered (setup runs first), so a SIGTERM in between reaches this handler only
        connector = getattr(trainer, "_signal_connector", None)
        if self._installed and connector is not None and hasattr(connector, "_sigterm_notifier_fn"):
            connector._sigterm_notifier_fn = _nothing

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        # ... and SIGTERM is taken back here, for this fit (Lightning restores the handler it
        # found when fit ends)
        if not self._installed:
            return
        signal.signal(signal.SIGTERM, self._handler)
        connector = getattr(trainer, "_signal_connector", None)
        if getattr(connector, "received_sigterm", False):  # Lightning's flag would end the fit unsaved
            connector.received_sigterm = False
            self.asked = True
        # Lightning also broadcasts its SIGTERM flag before every training step (a collective
        # and a host sync per step); only its handler, now replaced, could set that flag. Every
        # rank runs this callback on its main thread, so every rank skips the broadcast.
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if epoch_loop is not None and hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
            epoch_loop._broadcast_sigterm_tensor = _nothing

    def requested(self) -> bool:
        if self.asked or (self.shared is not None and self.shared.is_set()):
            return True
        # the starting process was killed outright: its ranks would otherwise train on unwatched
        return self.parent is not None and os.getppid() != self.parent

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self._steps += 1
        if self._steps % self.every_n_steps:
            return
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return  # the last step: the run ends as a finished one
        # every rank calls this at the same step: the collective cannot deadlock
        if trainer.strategy.reduce_boolean_decision(self.requested(), all=False):
            trainer.should_stop = True
            self.stopped_at = trainer.global_step


# a stop asked for after the ranks' last agreement point (during the last step, the final
# validation or the save): the run finishes, and a sweep must not start its next job
_ASKED_AS_IT_FINISHED: list[bool] = []


def note_asked_as_it_finished() -> None:
    _ASKED_AS_IT_FINISHED[:] = [True]


def asked_as_it_finished(clear: bool = True) -> bool:
    """Whether a Ctrl-C or SIGTERM came as the last run finished, too late to stop it early
    (``clear``: forget it, so that it is said once)."""
    asked = bool(_ASKED_AS_IT_FINISHED)
    if clear:
        _ASKED_AS_IT_FINISHED.clear()
    return asked


def _nothing(*args: Any) -> None:
    """Stands in for Lightning's SIGTERM notifier and its per-step broadcast of that flag
    (``StopOnInterrupt.setup``, ``on_train_start``)."""


class SharedFlag:
    """A stop request the starting process sets and its ranks read: a byte of shared memory.

    A ``multiprocessing.Event`` is five semaphores, which a starting process killed outright
    (``kill -9``) left to the resource tracker: it removed them and warned of "5 leaked
    semaphore objects" below the ranks' own line saying what happened and what is kept. Shared
    memory is no semaphore; the tracker's warning stays for a leak of the ranks' own."""

    def __init__(self, context: Any) -> None:
        self._value = context.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the flag was set within ``timeout`` seconds (None: however long), as
        ``Event.wait`` answers; looked at every 50 ms."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True


def run_ranks(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, then: str | None = None) -> bool:
    """Start ``fn(local_rank, *args, stop_event)`` in ``nprocs`` spawned processes and wait;
    returns whether a Ctrl-C or SIGTERM asked them to stop (they may have finished first).

    The ranks start with SIGINT and SIGTERM ignored (they take them over for training,
    ``StopOnInterrupt``). Here the first SIGINT or SIGTERM sets ``stop_event`` and says so; a
    second SIGINT ends the ranks (SIGKILL: they take SIGTERM as a request) and raises
    KeyboardInterrupt. Ranks that end on an interrupt are a KeyboardInterrupt too, not an error.
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    stop = SharedFlag(mp.get_context("spawn"))
    main = threading.current_thread() is threading.main_thread()

    first = [0.0]  # when the first request came (monotonic)

    def handler(signum: int, frame: Any) -> None:
        term = signum == signal.SIGTERM
        if stop.is_set():
            if term or time.monotonic() - first[0] < ECHO_S:  # noted already; only a second Ctrl-C stops at once
                return
            raise KeyboardInterrupt
        first[0] = time.monotonic()
        stop.set()
        print(stopping(term, then), file=sys.stderr, flush=True)

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        if main:
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)  # inherited by the ranks as they start
        context = mp.start_processes(
            rank_entry, args=(fn, *args, stop), nprocs=nprocs, join=False, start_method="spawn"
        )
        if main:
            for sig in SIGNALS:
                signal.signal(sig, handler)
        try:
            _wait_for_ranks(context)
            while not context.join():
                pass
            return stop.is_set()
        except KeyboardInterrupt:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join()
            raise
        except (ProcessExitedException, ProcessRaisedException) as exc:
            # a rank that got the interrupt outside training, on another path; not one a signal
            # other than the user's ended (the out-of-memory killer's SIGKILL as a SIGTERM came)
            killed = isinstance(exc, ProcessExitedException) and exc.signal_name not in (None, "SIGINT", "SIGTERM")
            if stop.is_set() and not killed:
                raise KeyboardInterrupt from None
            raise
    finally:
        if main:
            for sig, old in previous.items():
                signal.signal(sig, old)


def rank_entry(local_rank: int, fn: Callable[..., None], *args: Any) -> None:
    """A rank as :func:`run_ranks` starts it: ``fn``, then out of the process without the
    interpreter's teardown, whether ``fn`` returned, exited or failed.

    In that teardown a rank holding a process group was seen to abort ("terminate called
    without an active exception": a communication thread still joinable as objects were
    freed), after its results were written or its error reported. A failure is written where
    torch's spawn wrapper (the caller) would write it, so the starting process reports it as
    before; should that file not be found, the error is left to the wrapper.
    """
    # a rank a signal ends (an abort inside a library) prints its Python stacks first: where it was
    import faulthandler

    with contextlib.suppress(Exception):  # a stderr with no file descriptor: left without
        faulthandler.enable(all_threads=True)
    try:
        fn(local_rank, *args)
    except SystemExit as exc:  # as the interpreter takes it: None is 0, other than an int is printed, 1
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        leave_process(0 if code is None else code if isinstance(code, int) else 1)
    except KeyboardInterrupt:
        raise  # the wrapper's way: a rank ended by the starting process
    except Exception:
        caller = sys._getframe(1)  # torch.multiprocessing.spawn._wrap(fn, i, args, error_file)
        error_file = caller.f_locals.get("error_file") if caller.f_code.co_name == "_wrap" else None
        if not isinstance(error_file, str):
            raise
        import pickle
        import traceback

        with open(error_file, "wb") as fh:
            pickle.dump(traceback.format_exc(), fh)
        leave_process(1)
    leave_process(0)


def leave_process(code: int) -> NoReturn:
    """Flush what was printed and logged, then end the process with ``code`` at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    try:  # semaphores this process created unregister from the resource tracker (else it warns of a leak)
        import multiprocessing.util

        multiprocessing.util._run_finalizers(0)
    except Exception:  # noqa: BLE001 - private API: at worst, the tracker's warning
        pass
    os._exit(code)


def _wait_for_ranks(context: Any) -> None:
    """Until every rank has ended, or one has failed: then the others are ended (SIGKILL) at
    once and ``context.join`` is left to raise the failed rank's error. torch's join would send
    them SIGTERM, which they take as a request to stop after a step and save (waiting for the
    failed rank in a collective), and kill them only after 30 s."""
    from multiprocessing.connection import wait

    processes = context.processes
    while True:
        alive = [p for p in processes if p.is_alive()]
        failed = [i for i, p in enumerate(processes) if p.exitcode not in (None, 0)]
        if failed:
            for process in alive:
                process.kill()
            for process in alive:
                process.join()
            # only the failed rank is left for join to report (it reports the first it sees)
            for sentinel, index in list(context.sentinels.items()):
                if index != failed[0]:
                    context.sentinels.pop(sentinel)
            return
        if not alive:
            return
        wait([p.sentinel for p in alive])
