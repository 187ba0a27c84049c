"""A run's console transcript: what the recipe prints, kept in the run's folder.

Hydra opens ``<run dir>/<recipe>.log`` for the ``logging`` records of a job, but Neo's
messages (the plan, notes, the ``done:`` line, an error) are printed, so the file stayed
empty. :func:`console_log` copies everything written to ``sys.stdout`` and ``sys.stderr``
into that file while the job runs, and rank 0 of the spawned ranks (``CONSOLE_LOG_ENV``)
copies its own output (its warnings and notes) there too. Progress bars stay on the console
(``logs/metrics.csv`` has the steps); a line redrawn with carriage returns keeps its last
state, and terminal colour codes are dropped. A failure's traceback, which Hydra prints after
the job has ended, is written to the file as the failure leaves the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

# the file rank 0 of the spawned ranks appends its output to (set while a job runs)
CONSOLE_LOG_ENV = "NEO_CONSOLE_LOG"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# a tqdm bar's counter and times: "| 30/30 [00:01<00:00, 30.0it/s, loss=0.5]", "| 0/? [00:00<?, ?it/s]"
_BAR = re.compile(r"\|\s*[\d.?]+[kMG]?/[\d.?]+[kMG]?\s*\[[^\]]*\]?")


def _shown(line: str) -> str | None:
    """What a console line leaves in the file: its last state (after a carriage return), no
    colour codes, no progress bar (a message printed right after a bar's last redraw, on its
    line, is kept); None for a line that was only a bar (or a bar cleared with '\\r   \\r')."""
    redrawn = "\r" in line or "\x1b" in line
    shown = _ANSI.sub("", line).rsplit("\r", 1)[-1].rstrip()
    if not redrawn:
        return shown
    bars = list(_BAR.finditer(shown))
    if bars:
        shown = shown[bars[-1].end():].strip()
    return shown or None


class _LineFile:
    """Whole lines for a file shared by stdout and stderr (:func:`_shown` says what each leaves)."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.lock = threading.Lock()
        self.partial = {"out": "", "err": ""}
        self.dropped = False  # :func:`discard_transcript`: nothing more is kept

    def write(self, stream: str, text: str) -> None:
        with self.lock:
            if self.dropped:
                return
            *lines, rest = (self.partial[stream] + text).split("\n")
            try:
                for line in lines:
                    if (shown := _shown(line)) is not None:
                        self.fh.write(shown + "\n")
                if "\r" in rest:  # a bar redrawn in place: only its last state can show
                    rest = "\r" + rest.rsplit("\r", 1)[-1]
                self.partial[stream] = rest
                if lines:
                    self.fh.flush()
            except OSError as exc:
                self._lost(exc)

    def close(self) -> None:
        with self.lock:
            if self.dropped:
                return
            try:
                for stream, rest in self.partial.items():
                    shown = _shown(rest)
                    if shown:
                        self.fh.write(shown + "\n")
                    self.partial[stream] = ""
                self.fh.flush()
            except OSError as exc:
                self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        """The file can be written no more (a full disk): the transcript stops there, said once on
        the console; the run goes on. It was a traceback of its own after the run's error."""
        self.dropped = True
        with contextlib.suppress(Exception):
            sys.__stderr__.write(f"warning: {getattr(self.fh, 'name', 'the transcript')} can be written no more "
                                 f"({exc.strerror or exc}): the run's transcript stops here\n")
        with contextlib.suppress(OSError):  # what is buffered cannot reach the disk either
            self.fh.close()


class _Tee:
    """A text stream that also writes to a :class:`_LineFile`; anything else is the stream's."""

    def __init__(self, stream: Any, lines: _LineFile, name: str) -> None:
        self._stream, self._lines, self._name = stream, lines, name

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        try:
            self._lines.write(self._name, text)
        except (OSError, ValueError):  # the file went away (disk full, closed): the console goes on
            pass
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tee_streams(path: str | os.PathLike[str], mode: str = "a") -> _LineFile:
    """Copy this process's ``sys.stdout`` and ``sys.stderr`` into ``path`` from now on
    (``mode`` "a": appended, "w": a fresh file)."""
    lines = _LineFile(open(path, mode, encoding="utf-8", errors="replace"))  # noqa: SIM115 - closed by the caller
    sys.stdout = _Tee(sys.stdout, lines, "out")  # type: ignore[assignment]
    sys.stderr = _Tee(sys.stderr, lines, "err")  # type: ignore[assignment]
    return lines


@contextlib.contextmanager
def console_log(
    path: str | os.PathLike[str],
    interrupted: Callable[[KeyboardInterrupt], str] | None = None,
    append: bool = False,
) -> Iterator[None]:
    """Keep what the job prints in ``path``; the spawned rank 0 adds its own
    (:func:`tee_rank_output`). With ``append`` (a resumed run) the transcript follows the
    earlier one's. Otherwise it replaces it once the run starts (:func:`replace_earlier_transcript`):
    a run refused before then (a checkpoint it may not write over, a bad key) leaves the
    earlier transcript, its own lines after it. An interrupt leaving the job is recorded as
    ``interrupted(exc)`` says (the line the recipe prints once Hydra has let go of it). Where
    ``path`` cannot be written, or its folder is another run's (:func:`neo_core.folder_lock.was_refused`),
    the job runs without a transcript: its own checks name the folder."""
    from neo_core.folder_lock import was_refused

    path = Path(path)
    if was_refused(path.parent):  # another run writes there (a sweep's job, refused as it starts)
        yield
        return
    out, err, before = sys.stdout, sys.stderr, os.environ.get(CONSOLE_LOG_ENV)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        earlier = path.stat().st_size if path.is_file() else 0
        lines = tee_streams(path, "a")
        if earlier and not append:  # kept until the run starts
            lines.fh.write(f"--- a new run in this folder, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
            lines.fh.flush()
            _EARLIER[:] = [(lines, path, lines.fh.tell())]
        _CURRENT[:] = [(lines, path, earlier)]
    except OSError:
        yield
        return
    os.environ[CONSOLE_LOG_ENV] = str(path)
    try:
        yield
    except KeyboardInterrupt as exc:
        said = interrupted(exc) if interrupted else f"interrupted: {exc}" if str(exc) else "interrupted"
        lines.write("err", said + "\n")
        raise
    except Exception as exc:  # the console shows it after the job; the file keeps it now
        lines.write("err", "".join(traceback.format_exception(exc)))
        raise
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = out, err
        if before is None:
            os.environ.pop(CONSOLE_LOG_ENV, None)
        else:
            os.environ[CONSOLE_LOG_ENV] = before
        _EARLIER.clear()
        _CURRENT.clear()
        lines.close()
        with contextlib.suppress(OSError):  # a full disk: said by lines.close()
            lines.fh.close()


# the transcript under way whose file still holds an earlier run's: (its lines, file, where this run's begin)
_EARLIER: list[tuple[_LineFile, Path, int]] = []


def replace_earlier_transcript() -> None:
    """The run has started: its transcript (:func:`console_log`) drops the earlier run's that
    it followed. Nothing to do outside a transcript, or with none before it."""
    if not _EARLIER:
        return
    lines, path, start = _EARLIER.pop()
    with contextlib.suppress(OSError, ValueError), lines.lock:
        lines.fh.flush()
        with open(path, "rb") as fh:
            fh.seek(start)
            own = fh.read()
        lines.fh.truncate(0)  # opened to append: what follows goes after this run's own lines
        lines.fh.buffer.write(own)
        lines.fh.flush()


# the transcript under way: (its lines, file, the size the file had before it)
_CURRENT: list[tuple[_LineFile, Path, int]] = []


def transcript_path() -> Path | None:
    """The file the run's transcript (:func:`console_log`) is kept in; None outside one."""
    return _CURRENT[-1][1] if _CURRENT else None


def discard_transcript() -> None:
    """The run is refused before it starts, in a folder that is another run's: its transcript
    is not kept there (the file is removed, or an earlier one is left as it was); the console
    still shows what follows. Nothing to do outside a transcript."""
    if not _CURRENT:
        return
    lines, path, earlier = _CURRENT.pop()
    _EARLIER.clear()
    with contextlib.suppress(OSError, ValueError), lines.lock:
        lines.dropped = True
        lines.fh.flush()
        if earlier:
            lines.fh.truncate(earlier)
        else:
            path.unlink(missing_ok=True)


def tee_rank_output(local_rank: int) -> None:
    """In a spawned rank: rank 0 copies its output into the job's console log, if there is one."""
    path = os.environ.get(CONSOLE_LOG_ENV)
    if local_rank == 0 and path:
        with contextlib.suppress(OSError):
            tee_streams(path, "a")


def bars_without_semaphore() -> None:
    """Progress bars in this process take a thread lock, not tqdm's default process lock.

    That one holds a named semaphore: a rank ended at once (a second Ctrl-C) leaves it to the
    resource tracker, which warns of a leak as the run exits. A rank draws its bars alone.
    """
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
