"""One run at a time in an output folder.

Two runs given one folder (``hydra.run.dir=...``, ``hydra.sweep.dir=...``, a script started
twice) wrote over each other's files: the second removed the first's results as stale, so the
first ended with an error that blamed nothing, or both said ``done`` and the folder held one
run's plan, checkpoint and results beside both runs' transcripts. A run now holds its folder
while it writes there (:func:`hold_folder`: a file ``.neo-running`` made only if absent, naming
the process), and a second run is refused, naming the first. A holder that ended without
removing it (killed) is recognised on its machine by its process being gone.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path

from neo_core.errors import ConfigError

LOCK_NAME = ".neo-running"
_HELD: dict[str, Path] = {}  # folder -> its lock file, for this process


def hold_folder(folder: str | os.PathLike[str], key: str = "hydra.run.dir") -> None:
    """Hold ``folder`` for this process until it exits, or raise :class:`ConfigError` naming
    the live run that holds it (``key``: the setting that chooses another). A folder this
    process holds already is held once."""
    where = Path(os.path.abspath(folder))
    if str(where) in _HELD:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:  # a file in the way, no permission: the run's own check of its folder says so
        return
    lock = where / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join([Path(sys.argv[0]).name, *(a.removeprefix("++") for a in sys.argv[1:])])}
    for _ in range(5):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _holder(lock)
            if other is None or _ended(other):  # its process is gone (or it never said who): take it
                lock.unlink(missing_ok=True)
                continue
            if other.get("pid") == me["pid"] and other.get("host") == me["host"]:
                _HELD[str(where)] = lock
                return
            raise ConfigError(
                f"another run is writing in {where} (pid {other.get('pid')} on {other.get('host')}, since "
                f"{other.get('since')}: {other.get('command')}); wait for it to end, or choose another folder "
                f"({key}=...). If no run is writing there, remove {lock}."
            ) from None
        except OSError:  # a folder that cannot be written: the run's own check says so
            return
        with os.fdopen(fd, "w") as out:
            json.dump(me, out)
        _HELD[str(where)] = lock
        return
    raise ConfigError(f"{where} is held and released over and over by other runs; choose another folder ({key}=...).")


def release_folder(folder: str | os.PathLike[str]) -> None:
    """Let go of ``folder`` where this process holds it (its lock file is removed)."""
    lock = _HELD.pop(os.path.abspath(folder), None)
    if lock is not None:
        holder = _holder(lock)
        if holder is not None and holder.get("pid") == os.getpid():  # a forked child's copy removes nothing
            lock.unlink(missing_ok=True)


def release_folders() -> None:
    """Let go of every folder this process holds (at exit)."""
    for folder in list(_HELD):
        release_folder(folder)


def _holder(lock: Path) -> dict | None:
    """Who holds ``lock``; None where it says no one (empty or unreadable for over a second:
    a holder writes it at once)."""
    try:
        holder = json.loads(lock.read_text())
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        try:
            young = time.time() - lock.stat().st_mtime < 1.0
        except OSError:
            return None
        if young:  # being written: wait for it
            time.sleep(0.2)
            return _holder(lock) if lock.exists() else None
        return None


def _ended(holder: dict) -> bool:
    """Whether the holder's process is gone (only known on its own machine)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        pid = int(holder.get("pid", 0))
        if pid <= 0:
            return True
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError, OverflowError):
        return False
    try:  # killed, not yet reaped by its parent: a zombie holds nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


atexit.register(release_folders)
