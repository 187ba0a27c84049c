"""One run at a time in an output folder.

Two runs given one folder (``hydra.run.dir=...``, ``hydra.sweep.dir=...``, a script started
twice) wrote over each other's files: the second removed the first's results as stale, so the
first ended with an error that blamed nothing, or both said ``done`` and the folder held one
run's plan, checkpoint and results beside both runs' transcripts. A run now holds its folder
while it writes there (:func:`hold_folder`): it locks a file ``.neo-running`` (``flock``) that
names the process, and a second run is refused, naming the first. The kernel lets go of the
lock when its process ends, killed too, so a file left behind by a run that was killed holds
nothing: the next run takes it. (Removing such a file and making a new one, as was done, let
two runs that took it over at once both hold the folder.)
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from neo_core.errors import ConfigError

LOCK_NAME = ".neo-running"
_HELD: dict[str, tuple[Path, int, int]] = {}  # folder -> its lock file, the open locked fd, the pid that locked it
_REFUSED: set[str] = set()  # folders this process was last refused (another run holds them)


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
        opened = _open(lock)
        if opened is None:  # a folder that cannot be written: the run's own check says so
            return
        fd, mine = opened
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live run's, unless it let go of it as this one opened it
            gone = not _still_there(fd, lock)
            os.close(fd)
            if gone:
                continue
            _REFUSED.add(str(where))
            raise _refusal(where, _holder(lock), key) from None
        except OSError:  # a file system without locks: the folder is not held
            os.close(fd)
            return
        if not _still_there(fd, lock):  # removed by the run that held it as it ended: lock the next one
            os.close(fd)
            continue
        other = _said(os.pread(fd, 1 << 16, 0))
        if other.get("host", me["host"]) != me["host"]:  # another machine's run: its lock may not reach here
            os.close(fd)
            _REFUSED.add(str(where))
            raise _refusal(where, other, key)
        if not mine:  # left by another user's run that ended: made anew, this run's
            try:
                lock.unlink()
            except OSError:  # a folder this run cannot write in: the run's own check says so
                return
            finally:
                os.close(fd)
            continue
        os.ftruncate(fd, 0)  # a run that was killed left it: this run's now
        os.pwrite(fd, json.dumps(me).encode(), 0)
        _HELD[str(where)] = (lock, fd, me["pid"])
        _REFUSED.discard(str(where))
        return
    raise ConfigError(f"{where} is held and released over and over by other runs; choose another folder ({key}=...).")


def is_held(folder: str | os.PathLike[str]) -> bool:
    """Whether this process holds ``folder``."""
    return os.path.abspath(folder) in _HELD


def was_refused(folder: str | os.PathLike[str]) -> bool:
    """Whether this process's last try to hold ``folder`` found another run holding it (a
    sweep's job, whose folder is tried before Hydra writes there: its transcript is then not
    opened there, where it wrote into the other run's and cut it back)."""
    return os.path.abspath(folder) in _REFUSED


def release_folder(folder: str | os.PathLike[str]) -> None:
    """Let go of ``folder`` where this process holds it (its lock file is removed)."""
    held = _HELD.pop(os.path.abspath(folder), None)
    if held is not None:
        lock, fd, pid = held
        if pid == os.getpid():  # a forked child's copy removes nothing (the lock is its parent's)
            lock.unlink(missing_ok=True)  # while locked: a run that opened it and locks it next sees it gone
        os.close(fd)


def release_folders() -> None:
    """Let go of every folder this process holds (at exit)."""
    for folder in list(_HELD):
        release_folder(folder)


def _refusal(where: Path, holder: dict, key: str) -> ConfigError:
    """The error for a folder ``holder`` (what its lock file says) is writing in."""
    return ConfigError(
        f"another run is writing in {where} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since "
        f"{holder.get('since', '?')}: {holder.get('command', '?')}); wait for it to end, or choose another folder "
        f"({key}=...). If no run is writing there, remove {where / LOCK_NAME}."
    )


def _open(lock: Path) -> tuple[int, bool] | None:
    """An fd on ``lock``, made where absent (not inherited by programs this process starts),
    and whether this process may write it: another user's file is opened to read, which is
    enough to lock it. None where it cannot be opened."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)  # a link in its place is not followed: its target is not this run's
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR | nofollow, 0o644)
            mine = True
        except PermissionError:
            try:
                fd, mine = os.open(lock, os.O_RDONLY | nofollow), False
            except OSError:
                return None
        except OSError as exc:
            if exc.errno == errno.ELOOP and lock.is_symlink():  # a link named .neo-running: removed, not written through
                with contextlib.suppress(OSError):
                    lock.unlink()
                continue
            return None
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd, mine
        os.close(fd)  # a folder or a device named .neo-running: nothing to lock
        return None
    return None


def _still_there(fd: int, lock: Path) -> bool:
    """Whether the file ``fd`` has open is still ``lock`` (not removed, or removed and made anew)."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(lock))
    except OSError:
        return False


def _said(text: bytes) -> dict:
    """Who a lock file names (empty where it names no one)."""
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _holder(lock: Path) -> dict:
    """Who the live run that holds ``lock`` is (it writes that just after it locks it)."""
    for _ in range(10):
        try:
            holder = _said(lock.read_bytes())
        except OSError:
            holder = {}
        if holder:
            return holder
        time.sleep(0.05)
    return {}


atexit.register(release_folders)
