"""Run a function on N local ranks (one process each) and collect what every rank returns.

Written once for all multi-process tests; a backend is a class attribute, so an NCCL variant
is a subclass that sets ``backend = "nccl"``.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from neo_core.training.interrupt import leave_process


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MultiProcessRunner:
    """Spawns ``world_size`` ranks running ``fn(rank, world_size, *args)`` in a process group."""

    backend: str = "gloo"
    timeout_s: float = 120.0

    def run(self, fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
        """Each rank's return value, by rank; a failing rank fails the caller with its traceback.

        ``fn`` must be a picklable top-level function; its return value is saved with
        ``torch.save`` (tensors, dicts, lists).
        """
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="neo_mp_") as tmp:
            context = mp.start_processes(
                _entry,
                args=(self.backend, port, world_size, tmp, fn, args),
                nprocs=world_size,
                join=False,
                start_method="spawn",
            )
            errors: list[str] = []
            try:
                deadline = time.monotonic() + self.timeout_s
                while not context.join(timeout=0.5):
                    if time.monotonic() > deadline:
                        errors.append(f"ranks did not finish within {self.timeout_s:.0f} s")
                        break
            except Exception as exc:  # a rank died: report its own traceback first
                errors.append(str(exc))
            finally:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
            out = Path(tmp)
            errors = [p.read_text() for p in sorted(out.glob("rank*.err"))] + errors
            if errors:  # the Python stacks of a rank that a signal ended, where it left them
                errors += [f"{p.stem}, ended by a signal:\n{p.read_text()}"
                           for p in sorted(out.glob("rank*.fault")) if p.stat().st_size]
            assert not errors, "a rank failed:\n" + "\n".join(errors)
            return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _entry(
    rank: int,
    backend: str,
    port: int,
    world_size: int,
    tmp: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    # a rank killed by a signal (an abort inside gloo) leaves its Python stacks here for the report
    fault = open(os.path.join(tmp, f"rank{rank}.fault"), "w")  # noqa: SIM115 - open until os._exit
    faulthandler.enable(file=fault, all_threads=True)
    code = 0
    try:
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
        # no rank tears its connections down while another still uses them (a rank whose peer
        # has gone can abort inside gloo, with no Python error to report)
        dist.barrier()
    except BaseException:
        Path(tmp, f"rank{rank}.err").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # out without the interpreter's teardown, as training's ranks leave: there a rank holding
    # gloo's threads was seen to abort ("terminate called without an active exception") after
    # its result was saved, failing a run whose ranks all agreed
    leave_process(code)
