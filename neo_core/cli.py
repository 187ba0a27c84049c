"""The ``neo`` command: ``neo plugins`` lists every registered plugin by kind."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from neo_core.errors import ConfigError, NeoError
from neo_core.run_folders import (
    HoldRunFolder,  # noqa: F401  (its former place: a run's saved .hydra config names it)
    _job_folder,
    _remove_made_sweep_dir,
)
from neo_core.training.plots import SPREAD, capacity_of, is_capacity

# the recipes' config folder in a checkout (an installed package has none)
CHECKOUT_CONF = Path(__file__).resolve().parent.parent / "conf"


def script_command(script: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
                   python: bool = True) -> str:
    """How to run ``script`` again from ``cwd`` (the folder the command was typed in): ``python``
    when that is this interpreter on PATH (an activated environment), else this interpreter's
    path; the script relative to ``cwd`` when it lies below it, else its full path. Without
    ``python``, the script's part alone (for torchrun)."""
    import shlex
    import shutil

    on_path = shutil.which("python")
    interpreter = "python" if on_path and Path(on_path).absolute() == Path(sys.executable).absolute() else sys.executable
    script, here = Path(script).resolve(), Path(cwd or os.getcwd()).resolve()
    shown = shlex.quote(str(script.relative_to(here) if script.is_relative_to(here) else script))
    return f"{shlex.quote(interpreter)} {shown}" if python else shown


def plugin_env_prefix() -> str:
    """What a command printed to be run again needs of this process's environment to load the
    same plugins, as ``NAME=value `` words for a shell: ``NEO_PLUGINS`` and the loader's switches
    where set, and ``PYTHONPATH`` with ``NEO_PLUGINS`` (where its modules are found). Without
    them a resumed run of a ``NEO_PLUGINS`` plugin's option was refused as an unknown option."""
    import shlex

    from neo_core.plugins import PLUGIN_ENV

    names = [n for n in PLUGIN_ENV if os.environ.get(n)]
    if os.environ.get("NEO_PLUGINS") and os.environ.get("PYTHONPATH"):
        names.append("PYTHONPATH")
    return "".join(f"{n}={shlex.quote(os.environ[n])} " for n in names)


# a refusal of a number, or a true/false switch, quoting what it got as text ('2', '1e3', 'true'):
# the value came in as a string, as ${oc.env:NAME} gives one
NUMBER_AS_TEXT = re.compile(
    r"(number|integer|fraction|seconds|true or false)[^.;]*?, got "
    r"'([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|true|false|True|False)'")


def user_error_message(exc: BaseException) -> str | None:
    """The one line to show for a :class:`NeoError`, also one raised inside a spawned rank
    (it arrives wrapped, as text); None for anything else (a bug: its traceback is wanted)."""
    if isinstance(exc, NeoError):
        text = str(exc)
        if NUMBER_AS_TEXT.search(text):  # a number as text, where a number is asked: what ${oc.env:...} gives
            text = text.removesuffix(".") + (" (a value given as text, as ${oc.env:NAME} gives it: "
                                             "${oc.decode:${oc.env:NAME}} reads it as YAML would).")
        return text
    if type(exc).__module__ == "omegaconf.errors" and "Interpolation" in type(exc).__name__:
        return _interpolation_message(exc)
    if isinstance(exc, Exception):
        for line in reversed(str(exc).splitlines()):
            if line.startswith("neo_core.errors.") and ": " in line:
                return line.split(": ", 1)[1]
    return None


def _interpolation_message(exc: BaseException) -> str:
    """A config value's ``${...}`` that does not resolve, as one line naming its key: an unset
    environment variable (``${oc.env:NAME}``) with the way to give it a default."""
    key = getattr(exc, "full_key", None) or "a config value"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    unset = re.search(r"Environment variable '([^']+)' not found", text)
    if unset:
        name = unset.group(1)
        return (f"{key}: environment variable {name} is not set (${{oc.env:{name}}}); set it, or give the "
                f"interpolation a default: ${{oc.env:{name},<value>}}")
    return f"{key}: {text}"


def task_overrides() -> list[str]:
    """This Hydra job's command-line overrides as typed, ``${...}`` left unresolved (reading
    them through the config would resolve each, and fail on an unset environment variable)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    task = HydraConfig.get().overrides.task
    if OmegaConf.is_config(task):
        task = OmegaConf.to_container(task, resolve=False)
    return [str(o) for o in task]  # type: ignore[union-attr]


def plugin_blame(exc: BaseException) -> str | None:
    """The third-party plugin whose code the error passed through, as ``<kind> plugin 'name'
    (distribution)``, from the files of its traceback (a spawned rank's arrives as text); None
    when it passed through none."""
    import traceback

    text = "".join(traceback.format_exception(exc))
    try:
        from neo_core.plugins import get_plugins

        registries = get_plugins().registries.values()
    except Exception:  # noqa: BLE001 - no plugins to blame
        return None
    found = []
    groups: dict[int, str] = {}  # each plugin found: its config group
    for registry in registries:
        for entry in registry.entries():
            module = sys.modules.get(getattr(entry.factory, "__module__", "") or "")
            if module is None or module.__name__.split(".")[0] in ("neo_core", "neo_plugins"):
                continue
            file = getattr(module, "__file__", None)
            if not file:
                continue
            # a package: any of its files; a single module: that file (its folder holds others')
            mark = f'File "{Path(file).parent}{os.sep}' if Path(file).name == "__init__.py" else f'File "{file}"'
            if mark in text:
                found.append((registry.kind, entry))
                groups[id(entry)] = registry.group
    if len(found) > 1:  # one package's several plugins: the one whose code the frames ran, if they tell
        found = _ran_in_frames(exc, found) or found
    if len(found) > 1:  # or the one the run chose (a spawned rank's error has no frames, only text)
        chosen = _run_choices()
        found = [(k, e) for k, e in found if chosen.get(groups[id(e)]) in (e.name, *e.options)] or found
    if len(found) == 1:
        kind, entry = found[0]
        return f"{kind} plugin {entry.name!r} ({entry.provider})"
    if not found:
        return None
    providers = ", ".join(dict.fromkeys(entry.provider for _, entry in found))
    return f"code of {providers}, which provides the {', '.join(f'{kind} plugin {e.name!r}' for kind, e in found)}"


def _run_choices() -> dict[str, str]:
    """The options the running Hydra job chose per config group (``data=flaky``); empty outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return {str(k): str(v) for k, v in HydraConfig.get().runtime.choices.items() if v is not None}
    except Exception:  # noqa: BLE001 - not in a Hydra job
        return {}


def _ran_in_frames(exc: BaseException, found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The plugins among ``found`` whose factory, or an object its class made, ran in the
    traceback's frames (an error from a spawned rank has text only: none)."""
    hits = []
    for kind, entry in found:
        factory = entry.factory
        for cause in (exc, exc.__cause__, exc.__context__):
            tb = cause.__traceback__ if cause is not None else None
            while tb is not None:
                frame = tb.tb_frame
                me = frame.f_locals.get("self")
                if frame.f_code is getattr(factory, "__code__", None) or (
                        isinstance(factory, type) and isinstance(me, factory)):
                    hits.append((kind, entry))
                    break
                tb = tb.tb_next
            if hits and hits[-1][1] is entry:
                break
    return hits


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Print a :class:`NeoError` as one line and exit with status 2 (no traceback); for other
    errors (a bug: the traceback is wanted), name the third-party plugin it came through."""
    try:
        yield
    except Exception as exc:
        message = user_error_message(exc)
        if message is None and (blame := plugin_blame(exc)):
            print(f"error: raised in the {blame}; its traceback follows", file=sys.stderr)
        if message is None or os.environ.get("NEO_TRACEBACK"):
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


# what a finished job leaves in its folder (train.py or plan.py)
RESULT_FILES = ("metrics.json", "training.png", "config.json", "plan.json", "plan.txt", "plan.png")


def _measured(value: Any) -> bool:
    """A result a job has: not None nor NaN (a run without validation has no AUC)."""
    return value is not None and not (isinstance(value, float) and value != value)


class SweepFailures:
    """The failed jobs of a Hydra multirun sweep; each job runs through :meth:`job`.

    An error in a job is reported, kept in the job's folder (``error.txt``; an earlier run's is
    removed first) and the sweep goes on. A Neo error (a bad combination, a plan that does
    not fit) is one line; anything else (a failure inside a library, a bug) is named by its
    type, with the traceback in ``error.txt``. :meth:`exit` then lists the failed jobs and
    exits 2, or 1 when any failure was not a Neo error. ``NEO_TRACEBACK=1`` stops the sweep at
    the first failure with its traceback.

    With ``row`` (a finished job's result -> ``{column: (value, format spec[, unit])}``), :meth:`exit`
    first lists every job's results side by side, by the overrides that differ between jobs,
    and writes them to ``summary.csv`` in the sweep's folder. The ``unsaid`` columns are in
    summary.csv and summary.png only: a job's printed line is long already.
    """

    def __init__(self, row: Callable[[Any], dict[str, tuple[Any, ...]]] | None = None,
                 stopped_note: str = "its checkpoint, if any, is in its folder", unsaid: Collection[str] = ()) -> None:
        self.stopped_note = stopped_note  # what a job a Ctrl-C stopped left (the summary says it)
        self.unsaid = tuple(unsaid)
        self.jobs: list[tuple[int, str, str]] = []  # (job number, overrides, message)
        self.internal: list[int] = []  # jobs among them that did not fail with a Neo error
        self.row = row
        self.done: dict[int, tuple[str, dict[str, tuple[Any, ...]]]] = {}  # finished: overrides, row
        self.folders: dict[int, Path] = {}  # every job's folder
        self.sweep_dir: Path | None = None  # hydra.sweep.dir, as the jobs ran
        self.refused: list[int] = []  # failed jobs whose folder was another run's: no error.txt written
        self.started: dict[int, str] = {}  # every job begun: its overrides (a Ctrl-C's job among them)

    def _seen(self, num: int, out: Path) -> None:
        from hydra.core.hydra_config import HydraConfig

        self.folders[num] = out
        with contextlib.suppress(Exception):  # outside a Hydra job: the jobs' common folder
            hydra = HydraConfig.get()  # a relative sweep.dir is the launch folder's (hydra.job.chdir moves the job)
            self.sweep_dir = Path(os.path.abspath(Path(hydra.runtime.cwd) / str(hydra.sweep.dir)))

    def finished(self, num: int, overrides: str, out: Path, result: Any) -> None:
        """Keep a finished job's results for the summary (``job`` does; a recipe too for a job
        it reports without running it)."""
        self._seen(num, out)
        if self.row is not None and result is not None:
            self.done[num] = (overrides, self.row(result))

    def job(self, fn: Any, out: Path, num: int, overrides: str, passthrough: tuple[type, ...] = (),
            before: Callable[[], None] | None = None) -> Any:
        """``fn()``, or None when it failed (reported and kept); ``passthrough`` errors propagate.

        ``before()`` checks that the folder is the job's to write (not another run's): when it
        refuses, the refusal is reported and the folder is left as it is, its error.txt too.
        What it holds (the folder's lock) is let go of when the job ends: a sweep of a thousand
        jobs held a thousand open files until it exited."""
        import traceback

        from neo_core.folder_lock import release_folder

        self._seen(num, out)
        self.started[num] = overrides
        started = time.time()
        ours = before is None
        try:
            if before is not None:
                before()
                ours = True
            (out / "error.txt").unlink(missing_ok=True)
            result = fn()
            self.finished(num, overrides, out, result)
            return result
        except passthrough:
            raise
        except Exception as exc:
            if os.environ.get("NEO_TRACEBACK"):
                # Hydra's launcher keeps a job's exception and runs the next job: a SystemExit
                # is not an Exception, so it ends the sweep here
                traceback.print_exc()
                print(f"error: job #{num} ({overrides}) failed; NEO_TRACEBACK=1 stops the sweep here", file=sys.stderr)
                raise SystemExit(1) from exc
            message = user_error_message(exc)
            detail = message
            if message is None:
                self.internal.append(num)
                # a rank's failure (torch's ProcessRaisedException) opens with "-- Process N
                # terminated with the following error:" and ends with the rank's own "Type: message"
                lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
                first = (lines[-1] if type(exc).__name__ == "ProcessRaisedException" else lines[0]) if lines else ""
                blame = plugin_blame(exc)
                where = f"raised in the {blame}" if blame else "not a Neo error"
                message = f"{type(exc).__name__}: {first} ({where}; traceback in error.txt)"
                detail = "".join(traceback.format_exception(exc))
            if ours or num in self.internal:  # a traceback is kept even beside another run's files
                out.mkdir(parents=True, exist_ok=True)
                earlier = [n for n in RESULT_FILES if (out / n).is_file() and (out / n).stat().st_mtime < started - 1.0]
                if earlier:  # a rerun into the folder of a job that once succeeded
                    detail += (f"\n(this job wrote no results: {', '.join(earlier)} in this folder "
                               f"{'is' if len(earlier) == 1 else 'are'} an earlier run's)")
                (out / "error.txt").write_text(detail + "\n")
            else:
                self.refused.append(num)
            print(f"error: job #{num} ({overrides}): {message}", file=sys.stderr)
            self.jobs.append((num, overrides, message))
            return None
        finally:
            if before is not None and ours:  # the job's folder, held by before(): the next run's to take
                release_folder(out)

    def summary(self, stopped: int | None = None) -> None:
        """Every job's results (a failed job: that it failed), printed and in ``summary.csv``;
        ``stopped``: the job a Ctrl-C stopped, the results so far (the jobs after it not run)."""
        import csv

        # a one-job sweep too: scripts gather summary.csv from every sweep's folder (a run
        # without -m has no job folders)
        if self.row is None or not self.folders:
            return
        none_done = not self.done and stopped is None  # every job failed: summary.csv lists them and why
        failed = {num: (overrides, message) for num, overrides, message in self.jobs}
        halted = set()  # the job a Ctrl-C stopped, as it ran
        if stopped is not None and stopped not in self.done and stopped not in failed and stopped in self.started:
            failed[stopped] = (self.started[stopped], "stopped")
            halted.add(stopped)
        unreached = set()  # the jobs after it, which the Ctrl-C left unlaunched
        if stopped is not None:
            for num, overrides in SWEEP_JOBS.items():
                if num > stopped and num not in self.started and num not in self.done and num not in failed:
                    failed[num] = (overrides, "not run: the sweep was stopped before it")
                    unreached.add(num)
        nums = sorted(set(self.done) | set(failed))
        status = {num: "done" if num in self.done else "not run" if num in unreached or num in self.refused
                  else "stopped" if num in halted else "failed" for num in nums}  # summary.csv's, and the chart's
        words = {num: (self.done.get(num) or failed[num])[0].split() for num in nums}
        # what tells the jobs apart: against one another, or (one job so far) the sweep's axes
        common = set.intersection(*(set(w) for w in words.values())) if len(nums) > 1 else set()
        folders = [str(f) for f in self.folders.values()]
        where = Path(os.path.commonpath(folders))
        where = self.sweep_dir or (where.parent if str(where) in folders else where)
        columns = list(dict.fromkeys(c for overrides, row in self.done.values() for c in row))
        units = {c: v[2] for _, row in self.done.values() for c, v in row.items() if len(v) > 2}
        # what tells the jobs apart, in the list and on the chart
        labels = {num: " ".join(w for w in words[num] if w not in common) or "(the sweep's settings)" for num in nums}
        so_far = f" so far, the sweep stopped at job #{stopped}" if stopped is not None else ""
        print(f"sweep results: none, no job finished ({where / 'summary.csv'} lists each job and why)"
              if none_done else f"sweep results{so_far} ({where / 'summary.csv'}):")
        for num in [] if none_done else nums:
            label = labels[num]
            if num in self.done:
                said = ", ".join(_said({c: v for c, v in self.done[num][1].items() if c not in self.unsaid}))
            elif num in halted:
                said = f"stopped by the Ctrl-C ({self.stopped_note})"
            elif num in unreached:
                said = "not run (the sweep was stopped before it)"
            else:
                said = "not run (its folder is another run's)" if num in self.refused else "failed (error.txt)"
            print(f"  #{num} {label}: {said}")
        if stopped is None:  # a sweep run again into a folder of one with more jobs: theirs are left
            ours = {os.path.abspath(f) for f in folders}
            with contextlib.suppress(OSError):
                stale = sorted((p.name for p in where.iterdir() if p.is_dir() and p.name.isdigit()
                                and os.path.abspath(p) not in ours
                                and any((p / n).exists() for n in (*RESULT_FILES, "error.txt"))), key=int)
                if stale:
                    print(f"note: {where} also holds job folder(s) {', '.join(stale)} of an earlier sweep, which "
                          "this one did not run: their results are not in summary.csv")
        try:
            with open(where / "summary.csv", "w", newline="") as fh:
                table = csv.writer(fh)
                table.writerow(["job", "overrides", "folder", "status",
                                *(f"{c} ({units[c]})" if c in units else c for c in columns), "error"])
                for num in nums:
                    row = self.done.get(num, ("", {}))[1]
                    # a failed job's reason beside its empty results (the whole of it is in its error.txt)
                    error = "" if num in self.done or num in halted else str(failed[num][1]).strip().splitlines()[0:1]
                    table.writerow([num, (self.done.get(num) or failed[num])[0], self.folders.get(num, ""),
                                    status[num],
                                    *(row[c][0] if c in row and _measured(row[c][0]) else "" for c in columns),
                                    error[0] if error else ""])
        except OSError as exc:
            print(f"warning: could not write {where / 'summary.csv'}: {exc.strerror}", file=sys.stderr)
        try:  # the same, to look at: against the value of a numeric setting the sweep varies, if any
            from neo_core.training.plots import plot_sweep

            settings = [dict(w.lstrip("+~").split("=", 1) for w in words[num] if "=" in w) for num in nums]
            statuses = [status[num] for num in nums]
            if plot_sweep([(f"#{num} {labels[num]}", self.done[num][1] if num in self.done else None) for num in nums],
                          where / "summary.png", f"sweep results ({where})", settings, statuses):
                print(f"chart: {where / 'summary.png'}")
        except (OSError, ImportError, ValueError) as exc:
            print(f"warning: could not draw {where / 'summary.png'}: {exc}", file=sys.stderr)

    def exit(self, note: Callable[[], str | None] | None = None) -> None:
        """List the jobs' results (``row``), then ``note()`` on them if it has one; exit 0 when
        no job failed, else list the failed ones and exit 2 (1 if any was not a Neo error)."""
        self.summary()
        said = note() if note is not None else None
        if said:
            print(said)
        if not self.jobs:
            raise SystemExit(0)
        why = " (each folder's error.txt says why)" if len(self.refused) < len(self.jobs) else ""
        print(f"{len(self.jobs)} job(s) of the sweep failed{why}:", file=sys.stderr)
        print_failed_jobs(self.jobs, whole=self.refused)  # a refused job has no error.txt
        raise SystemExit(1 if self.internal else 2)


def _said(row: dict[str, tuple[Any, ...]]) -> list[str]:
    """A finished job's results as the summary prints them: "samples/s 39,955 (per step
    28,661-64,730)" (the spread folded into its column), "fullest rank device memory without the
    reserve 25.28 of 40.00 GiB" (the capacity folded into what is used of it), an empty text
    result left out."""
    said = []
    for c, v in row.items():
        if (c.endswith(SPREAD) and c[: -len(SPREAD[0])] in row) or is_capacity(c, row) or (v[1] == "s" and not v[0]):
            continue
        unit = f" {v[2]}" if len(v) > 2 else ""
        cap = row.get(capacity_of(c))
        of = f" of {format(cap[0], cap[1])}" if cap and _measured(cap[0]) else ""
        text = f"{c} {format(v[0], v[1])}{of}{unit}" if _measured(v[0]) else f"{c} n/a"
        low, high = row.get(c + SPREAD[0]), row.get(c + SPREAD[1])
        if low and high and _measured(low[0]) and _measured(high[0]):
            stalled = _measured(v[0]) and v[0] < low[0]  # the whole run slower than most of its steps
            text += (f" (per step {format(low[0], low[1])}-{format(high[0], high[1])}"
                     f"{'; slower overall: some steps stalled' if stalled else ''})")
        said.append(text)
    return said


def print_failed_jobs(failed: Sequence[tuple[int, str, str]], width: int | None = 300,
                      rest: str = "the rest in its error.txt", whole: Collection[int] = ()) -> None:
    """``(job number, overrides, message)`` one job a line, each of its problems on a line of its
    own (a message of several: config.validate's "N settings are wrong. A Also: B"); a problem
    every job has (a bad key or value they share) is given once, after them, and so is a message
    several jobs share. A message over ``width`` characters is cut at a word and says where the
    ``rest`` is (None: whole), except those of the jobs in ``whole`` (no error.txt holds theirs)."""
    whole_messages = {message for num, _, message in failed if num in whole}

    def clip(text: str) -> str:
        if width is None or len(text) <= width or any(text in m for m in whole_messages):
            return text
        return text[:width].rsplit(" ", 1)[0].rstrip(",;:") + f" ... ({rest})"

    def problems(message: str) -> list[str]:
        first, *more = message.split(" Also: ")
        return [_SEVERAL_WRONG.sub("", first) if more else first, *more]

    jobs = [(num, overrides, problems(message)) for num, overrides, message in failed]
    shared = [p for p in jobs[0][2] if all(p in job[2] for job in jobs[1:])] if len(jobs) > 1 else []
    by_rest: dict[tuple[str, ...], list[tuple[int, str]]] = {}
    for num, overrides, found in jobs:
        by_rest.setdefault(tuple(p for p in found if p not in shared), []).append((num, overrides))

    def tell(listed: list[tuple[int, str]], said: Sequence[str]) -> None:
        first, *more = said
        if len(listed) == 1:
            print(f"  #{listed[0][0]} {listed[0][1]}: {clip(first)}", file=sys.stderr)
        else:
            for num, overrides in listed:
                print(f"  #{num} {overrides}", file=sys.stderr)
            print(f"    all {len(listed)}: {clip(first)}", file=sys.stderr)
        for problem in more:
            print(f"      also: {clip(problem)}", file=sys.stderr)

    for own, listed in by_rest.items():
        if own:
            tell(listed, own)
        else:  # only what every job has: said once, below
            for num, overrides in listed:
                print(f"  #{num} {overrides}", file=sys.stderr)
    if shared:
        print(f"    all {len(jobs)}: {clip(shared[0])}", file=sys.stderr)
        for problem in shared[1:]:
            print(f"      also: {clip(problem)}", file=sys.stderr)


# config.validate's head of a message naming several problems
_SEVERAL_WRONG = re.compile(r"^\d+ settings are wrong\. ")


# the check a sweep runs on its jobs before they start (check_sweep_jobs: the last one given)
_SWEEP_CHECK: list[Callable[[dict[str, Any]], None]] = []


def check_sweep_jobs(check: Callable[[dict[str, Any]], None]) -> None:
    """Before a ``-m`` sweep launches a job, check every job: ``check(config)`` gets each one's
    config as the job itself will (resolved, ``output_dir`` its folder). If any would fail with
    a Neo error, none is started: the failing jobs are listed and the process exits 2. What a
    check cannot know ahead (a plan that does not fit; ``recipes/train.py`` plans only the jobs
    whose compression gloo may not carry) still fails only its own job.

    Hydra composes every job of a batch before launching it (``Sweeper.validate_batch_is_legal``);
    the check runs there, so a sweep from the config (``hydra.sweeper.params``) and an added
    config folder are covered as Hydra sees them. Hydra's own sweeper knows every batch from
    the start (``hydra.sweeper.max_batch_size``): all are checked before the first. A sweeper
    that makes its batches as it goes has each checked before it starts. Jobs that another
    launcher runs elsewhere are not checked here (their devices are not this machine's).
    ``NEO_SKIP_SWEEP_CHECK=1`` launches without the check.
    """
    from hydra.plugins.sweeper import Sweeper

    _SWEEP_CHECK[:] = [check]
    if not getattr(Sweeper.validate_batch_is_legal, "neo_checks_jobs", False):
        composed = Sweeper.validate_batch_is_legal

        def validate_batch_is_legal(self: Any, batch: Sequence[Sequence[str]]) -> None:
            composed(self, batch)
            _check_batch(self, batch)

        validate_batch_is_legal.neo_checks_jobs = True  # type: ignore[attr-defined]
        Sweeper.validate_batch_is_legal = validate_batch_is_legal  # type: ignore[method-assign]


def _check_batch(sweeper: Any, batch: Sequence[Sequence[str]]) -> None:
    """:func:`check_sweep_jobs`' check of ``batch`` (with Hydra's sweeper, of all its batches at
    the first), as ``sweeper`` is about to launch it."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import filter_overrides
    from omegaconf import OmegaConf, open_dict, read_write

    first = sweeper.__dict__.get("neo_launched", 0)  # Hydra numbers the jobs on across batches
    sweeper.neo_launched = first + len(batch)
    batches = getattr(sweeper, "overrides", None)  # Hydra's sweeper: every batch, from the start
    if first and sweeper.__dict__.get("neo_checked_all"):
        return
    if not first and isinstance(batches, list) and batches and batches[0] == batch:
        batch = [job for jobs in batches for job in jobs]
        sweeper.neo_checked_all = True
    from hydra.core.utils import filter_overrides as _shown

    if not first:  # a sweep's first batch: another sweep's jobs in this process are not this one's
        SWEEP_JOBS.clear()
    for num, overrides in enumerate(batch, start=first):  # a Ctrl-C's summary names the jobs not reached
        SWEEP_JOBS[num] = " ".join(as_typed(o) for o in _shown(list(overrides)))
    if os.environ.get("NEO_SKIP_SWEEP_CHECK") or type(getattr(sweeper, "launcher", None)).__name__ != "BasicLauncher":
        return
    loader = sweeper.hydra_context.config_loader
    failed, before = [], HydraConfig.instance().cfg
    try:
        for num, overrides in enumerate(batch, start=first):
            try:
                config = loader.load_sweep_config(sweeper.config, list(overrides))
                with open_dict(config):  # as Hydra's launcher gives the job its number and folder
                    config.hydra.job.id = config.hydra.job.num = num
                out = os.path.abspath(_job_folder(config))
                with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
                    config.hydra.runtime.output_dir = out
                HydraConfig.instance().set_config(config)
                with open_dict(config):  # the job's keys alone (hydra.run.dir would claim a folder)
                    del config["hydra"]
                job = OmegaConf.to_container(config, resolve=True)
                _SWEEP_CHECK[0](job)  # type: ignore[arg-type]
            except NeoError as exc:
                shown = " ".join(as_typed(o) for o in filter_overrides(list(overrides)))
                failed.append((num, shown, str(exc)))
            except Exception:  # noqa: BLE001, S112 - not a setting's fault: the job reports it, traceback and all
                continue
    finally:
        HydraConfig.instance().cfg = before
    if failed:
        n, where = len(batch), "the sweep" if not first else f"this batch (jobs #{first}-#{first + len(batch) - 1})"
        if n == 1:
            head = f"the one job of {where} would fail, so it was not started:"
        elif len(failed) == n:
            head = f"all {n} jobs of {where} would fail, so none was started:"
        else:
            head = (f"{len(failed)} of the {n} jobs of {where} would fail, so none was started (fix them, or "
                    "leave them out of the sweep):")
        print(f"error: {head}", file=sys.stderr)
        print_failed_jobs(failed, width=None)  # a setting's error: whole (no job ran to keep it)
        if not first:  # nothing ran: the folder made for the sweep (its multirun.yaml alone) goes
            _remove_made_sweep_dir(sweeper)
        raise SystemExit(2)


# a sweep's jobs as Hydra will launch them, number -> overrides as typed (_check_batch): a sweep
# a Ctrl-C stops lists those it never reached as not run, where it left them out
SWEEP_JOBS: dict[int, str] = {}


# keys a recipe took under another name (plan.py: model= for plan_model=): named as typed
TYPED_KEYS: dict[str, str] = {}


def as_typed(override: str) -> str:
    """An override as it is typed: without the ``++`` the recipes add (:func:`force_add_overrides`),
    a boolean as YAML writes it (Hydra's sweeper gives ``True``), a key by the name it was given
    (:data:`TYPED_KEYS`)."""
    key, eq, value = override.removeprefix("++").partition("=")
    key = TYPED_KEYS.get(key, key)
    return f"{key}={value.lower()}" if eq and value in ("True", "False") else f"{key}{eq}{value}"


class _LaunchLinesAsTyped(logging.Filter):
    """Hydra's line for each job it launches (``#0 : ++trainer.max_steps=3 ...``) with the
    overrides as typed (:func:`as_typed`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        head, sep, overrides = record.getMessage().partition(" : ")
        if sep and head.strip().startswith("#"):
            record.msg, record.args = head + sep + " ".join(as_typed(o) for o in overrides.split(" ")), ()
        return True


def launch_lines_as_typed() -> None:
    """Hydra's launch lines name each job's overrides as typed (``-m`` sweeps), and so does its
    line before a failed job's traceback ("Error executing job with overrides: [...]")."""
    from hydra.core.utils import JobReturn, JobStatus

    launcher = logging.getLogger("hydra._internal.core_plugins.basic_launcher")
    if not any(isinstance(f, _LaunchLinesAsTyped) for f in launcher.filters):
        launcher.addFilter(_LaunchLinesAsTyped())
    hydras = JobReturn.return_value
    if getattr(hydras.fget, "neo_as_typed", False):
        return

    def return_value(job: Any) -> Any:
        if job.status == JobStatus.FAILED:  # Hydra's own line, with the overrides as typed
            sys.stderr.write(f"Error executing job with overrides: {[as_typed(o) for o in job.overrides]}{os.linesep}")
            raise job._return_value
        return hydras.fget(job)

    return_value.neo_as_typed = True  # type: ignore[attr-defined]
    JobReturn.return_value = property(return_value, hydras.fset)  # type: ignore[method-assign, assignment]


# Config groups the recipes leave out of their defaults lists, so that ``+topology=zionex``
# (the documented form) works; ``topology=zionex`` is taken to mean the same.
APPENDED_GROUPS = ("topology",)


def force_add_overrides(argv: Sequence[str], groups: Collection[str] = (), selected: Collection[str] = ()) -> list[str]:
    """Turn plain ``group.key=value`` and ``key=value`` overrides into ``++...`` ones.

    Hydra rejects a key the composed config lacks ("not in struct") before Neo sees it; with
    ``++`` every key reaches Neo's validation, which names a misspelled key and its close
    match, and accepts any parameter of a plugin selected by name only. ``key=value`` where
    ``key`` is one of ``groups`` (the config's group folders) selects an option and is left
    to Hydra, except an appended group (``topology=zionex`` becomes ``+topology=zionex``).
    ``+group=option`` for a group the recipe's defaults list already ``selected`` (Hydra:
    "Multiple values for cache") is taken as ``group=option``, as ``+topology=`` is written;
    ``+key=value`` for a key (Hydra: "Either remove + prefix"; Hydra's own keys too) as
    ``++key=value``; ``+group@package=option`` is left to Hydra.
    """
    out = []
    for arg in argv:
        key, eq, _ = arg.partition("=")
        group = key.lstrip("+").split("@")[0]  # cache@foo: the cache group at another package
        if eq and key.startswith("+") and not key.startswith("++") and key[1:] in selected:
            out.append(arg[1:])
        elif eq and key.startswith("+") and not key.startswith("++") and group not in groups and "/" not in key:
            # +trainer.max_steps=3, +hydra.run.dir=x: Hydra refused a key that is there ("remove +")
            out.append(f"+{arg}")
        elif not eq or key.startswith(("-", "+", "~", "hydra")) or "/" in key:
            out.append(arg)
        elif key in APPENDED_GROUPS:
            out.append(f"+{arg}")
        elif "." in key or group not in groups:
            out.append(f"++{arg}")
        else:
            out.append(arg)
    return out


def select_by_name(argv: Sequence[str], conf: str | os.PathLike[str], groups: Collection[str]) -> list[str]:
    """Turn ``group.name=<option>`` into ``group=<option>`` where ``<option>`` is one of the
    group's options (YAML files and registered plugins).

    ``group.name=`` alone would rename the selected option and keep its other keys (the
    default kernel's optimizer and learning rate handed to another kernel plugin); selecting
    the option gives the plugin its own defaults. A name that is no option is left for the
    plugin registry to name; a group also selected as ``group=`` is an error.
    """
    out = list(argv)
    for n, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        group = key.lstrip("+").removesuffix(".name")
        if not eq or not key.lstrip("+").endswith(".name") or group not in groups or not value:
            continue
        if any(c in value for c in "()[]{}$*?") or not set(value.split(",")) <= set(option_names(conf, group, argv)):
            continue
        chosen = [a for a in argv if a.partition("=")[0].lstrip("+") == group]
        if chosen:
            raise ConfigError(
                f"{chosen[0]} and {arg} both select the {group}; keep one ({group}={value} selects "
                f"{value!r} with its own defaults)."
            )
        out[n] = f"{group}={value}"
    return out


def option_names(conf: str | os.PathLike[str], group: str, argv: Sequence[str] = ()) -> list[str]:
    """Every option ``group=<name>`` selects: YAML files in <dir>/<group>/ of every config
    directory (``config_dirs``) and registered plugins."""
    from hydra.core.config_store import ConfigStore

    names = {p.stem for d in config_dirs(conf, argv) for p in (d / group).glob("*.yaml")}
    try:
        names.update(n.removesuffix(".yaml") for n in ConfigStore.instance().list(group))
    except OSError:  # no plugin of this group lacks a YAML file
        pass
    return sorted(names)


def _failed_note() -> str:
    """Plugins that failed to load, for a message about an option that is missing."""
    from neo_core.plugins import _env_flag, get_plugins

    failed = get_plugins().failed
    note = f" (Plugin(s) {', '.join(map(repr, failed))} failed to load; see the warning above.)" if failed else ""
    if _env_flag("NEO_DISABLE_PLUGIN_AUTOLOAD"):  # installed plugins' options are not offered
        named = [m.strip() for m in os.environ.get("NEO_PLUGINS", "").split(",") if m.strip()]
        note += (" (NEO_DISABLE_PLUGIN_AUTOLOAD is set: installed plugins are not loaded, only the built-ins"
                 + (f" and NEO_PLUGINS' {', '.join(named)}" if named else "") + ".)")
    return note


def check_group_options(
    argv: Sequence[str],
    conf: str | os.PathLike[str],
    groups: Collection[str],
    aliases: Mapping[str, str] | None = None,
    nullable: Collection[str] = (),
) -> None:
    """Reject ``group=<option>`` for an option the group lacks, naming the key and the choices.

    Hydra's own message for this spans several lines and is followed by its search path; for
    ``group=null`` it is a traceback. ``nullable`` groups (e.g. ``experiment``) take null.
    """
    aliases = aliases or {}
    chosen: dict[str, str] = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("+")
        group = aliases.get(key, key)
        if eq and group in groups:
            if group in chosen:  # Hydra: "Multiple values for ...", with defaults-list advice
                raise ConfigError(f"{key} is chosen twice ({chosen[group]} and {arg}); give it once.")
            chosen[group] = arg
        if not eq or group not in groups or any(c in value for c in "()[]{}$*?"):
            continue  # not a group selection, or a sweep expression Hydra expands itself
        choices = option_names(conf, group, argv)
        if value in ("", "null") and group not in nullable:
            raise ConfigError(f"{key} needs an option; choose one of {', '.join(choices)}.")
        for option in value.split(","):
            if option and option != "null" and option not in choices:
                close = [c for c in choices if c.lower() == option.lower()]
                close = close or difflib.get_close_matches(option, choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                own = ""
                if group == "plan_model" and not close:  # a table set of one's own is a file, not an option
                    own = (f" Tables of your own: a file {group}/<name>.yaml in a --config-dir, with "
                           "'generator: listed' and params.tables (docs/planner.md).")
                if group == "compression" and option.lower() in ("fp8", "int8"):  # a backward precision
                    own = (f" {option.lower()} is a precision of the backward pass only: e.g. {key}=fp16 "
                           f"{key}.backward={option.lower()} (the option names the forward precision).")
                raise ConfigError(
                    f"Unknown {key} option {option!r}{hint}; choose one of {', '.join(choices)}.{own}{_failed_note()}"
                )


# Hydra's flags that take a value (``--info`` may: one of INFO_VALUES)
VALUE_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg", "-p",
               "--package", "--experimental-rerun")
INFO_VALUES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


# Hydra's flags that each choose what it does (only one may be given), by their long names
MODE_FLAGS = {"-r": "--run", "--run": "--run", "-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg",
              "--cfg": "--cfg", "-i": "--info", "--info": "--info", "-sc": "--shell-completion",
              "--shell-completion": "--shell-completion"}


def overrides_of(argv: Sequence[str]) -> Iterator[tuple[int, str]]:
    """``(index, arg)`` of each override on the command line: not a flag nor a flag's value."""
    take = False
    for n, arg in enumerate(argv):
        if take:
            take = False
            continue
        if arg in VALUE_FLAGS:
            take = True
        elif arg in ("-i", "--info"):
            take = n + 1 < len(argv) and argv[n + 1] in INFO_VALUES
        elif not arg.startswith("-"):
            yield n, arg


def _tilde_not_expanded(folder: str, prefix: str) -> str:
    """Why a folder written with ``~`` is refused, and the folder (each of a sweep's) written out
    (``prefix``: how it is given)."""
    try:
        written = prefix + ",".join(str(Path(f).expanduser()) if f.startswith("~") else f for f in folder.split(","))
    except RuntimeError:  # ~name of no user here
        written = "its full path"
    return f"'~' is not expanded here (the shell leaves it quoted, or after '='); write the folder out: {written}"


def check_command_line(argv: Sequence[str], recipe: str) -> None:
    """What Hydra refuses in its own words, or with a usage text: an override with no value, a
    config folder that is not there. (A flag among the overrides is moved: :func:`flags_first`.)"""
    for n, arg in enumerate(argv):
        if arg in ("-cd", "--config-dir") and n + 1 < len(argv) or arg.startswith(("-cd=", "--config-dir=")):
            folder = argv[n + 1] if "=" not in arg else arg.partition("=")[2]
            flag = arg.partition("=")[0]
            if folder.startswith("~") and not Path(folder).is_dir():  # Hydra reads it as written
                raise ConfigError(f"{flag} {folder}: {_tilde_not_expanded(folder, f'{flag} ')}")
            if not Path(folder).is_dir():
                raise ConfigError(f"{arg.partition('=')[0]} {folder}: no such folder; give the folder that holds your "
                                  "config groups (e.g. a cache/ or experiment/ folder of YAML files).")
    modes = {MODE_FLAGS[a.partition("=")[0]]: a for n, a in enumerate(argv)
             if a.partition("=")[0] in MODE_FLAGS and n not in dict(overrides_of(argv))}
    if len(modes) > 1:  # Hydra: "Only one of --run, --multirun, --cfg..." in a ValueError's traceback
        given = " and ".join(modes.values())
        hint = (" (--cfg shows one job's config: leave out -m and give each key one value)"
                if {"--multirun", "--cfg"} <= set(modes) else "")
        raise ConfigError(f"{given} cannot be given together: Hydra does one of a run, a sweep (-m), --cfg, --info "
                          f"or --shell-completion{hint}.")
    for _, arg in overrides_of(argv):
        if "=" not in arg and not re.fullmatch(r"[+~]*[A-Za-z_][\w.@/-]*", arg):  # a stray word, a sentence
            raise ConfigError(
                f"{arg!r} is not a setting: give settings as key=value (python {recipe} --help lists them)."
            )
        if "=" not in arg and not arg.startswith("~"):
            raise ConfigError(
                f"{arg} has no value: give a setting as {arg.lstrip('+')}=<value> (python {recipe} --help lists "
                "the settings)."
            )
        unreadable = _unreadable(arg)
        if unreadable:
            raise ConfigError(unreadable)


def _unreadable(override: str) -> str | None:
    """Why Hydra's override grammar cannot read ``override`` (``key=~/x``, ``key=a=b``, ``key=[1,2``,
    ``key=rnage(1,3)``), in one sentence: Hydra's own message is its parser's, with the override as
    the recipe passes it (``++key=...``) and a link."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parse = OverridesParser.create().parse_overrides
    try:
        parse([override])
        return None
    except OverrideParseException as exc:
        lines = str(exc).splitlines()
    key, _, value = override.partition("=")
    name = key.lstrip("+~")
    evaluating = next((line for line in lines if " while evaluating " in line), None)
    if evaluating is not None:  # a sweep function (range, choice...) misspelled or misused: Hydra's reason
        call, _, reason = evaluating.partition(" while evaluating ")[2].partition(": ")
        available = next((line.removeprefix("Available: ") for line in lines if line.startswith("Available: ")), "")
        functions = f" (its functions: {available.replace(',', ', ')})" if available else ""
        return f"{override}: Hydra cannot evaluate {call}: {reason.rstrip('.')}{functions}."
    if value.startswith("~") or ",~" in value:
        return f"{name}={value}: {_tilde_not_expanded(value, name + '=')}"
    at = -1
    if lines and lines[0].startswith("LexerNoViableAltException: ") and len(lines) > 1 and "^" in lines[1]:
        at = lines[1].index("^") - len("LexerNoViableAltException: ")
    if 0 <= at < len(key):
        said = (f"{override}: Hydra cannot read the key {key!r} ({override[at]!r} is not read in a key); a key is "
                "names joined by dots (trainer.max_steps)")
        parent, dot, last = key.rpartition(".")
        if dot and at > len(parent) and value:  # in the last name: a mapping's key, such as a table's name
            return (f"{said}; a name with {override[at]!r} in it goes inside the mapping, which sets it whole: "
                    f"'{parent}={{{last.strip()}: {value}}}'.")
        return said + "."
    if 0 <= at < len(override):
        why = f"{override[at]!r} is not read unquoted"
    elif any(value.count(a) > value.count(b) for a, b in ("[]", "{}", "()")):
        why = "a bracket is not closed"
    else:  # the parser's words, without its list of tokens
        why = next((line for line in lines if "input" in line), lines[0] if lines else "").split(" expecting {")[0]
    said = f"{override}: Hydra cannot read this value ({why})"
    close = "close it, or " if why == "a bracket is not closed" else ""
    if value[:1] in "[{(" or "," in value:  # a list, a dict, a sweep: quoted whole, it would be one string
        return f"{said}; {close}put the item that holds it in quotes, as Hydra reads them ('...')."
    quoted = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
    try:
        parse([quoted])
    except OverrideParseException:
        return f"{said}; see how Hydra reads quotes: https://hydra.cc/docs/advanced/override_grammar/basic/"
    if "'" not in quoted:
        shell = f"'{quoted}'"
    elif not set(quoted) & set("$`\\!"):  # in double quotes, with its own escaped
        shell = '"' + quoted.replace('"', '\\"') + '"'
    else:
        shell = shlex.quote(quoted)
    return f"{said}; {close}quote it, as Hydra reads quotes: {quoted} (in the shell: {shell})."


def flags_first(argv: Sequence[str]) -> list[str]:
    """Hydra's flags (``-m``, ``--cfg job``, ``-cd <dir>``...) moved before the overrides, in
    the order given: Hydra takes them before or after all the overrides, and one between
    overrides (``a=1 -m b=2``) showed its usage and the overrides after it as unrecognized."""
    overrides = dict(overrides_of(argv))
    # a bare --info takes the word after it as its value: moved before an override, that would be the
    # override ("invalid choice"); it is given its value (all, as Hydra's default)
    bare_info = {n for n, a in enumerate(argv) if a in ("-i", "--info") and "".join(argv[n + 1:n + 2]) not in INFO_VALUES}
    flags = ["--info=all" if n in bare_info else a for n, a in enumerate(argv) if n not in overrides]
    return [*flags, *overrides.values()]


def is_sweep(argv: Sequence[str]) -> bool:
    """Whether the command line asks Hydra for a sweep: ``-m``, ``--multirun`` or ``hydra.mode=MULTIRUN``."""
    return any(a in ("-m", "--multirun") or a.lstrip("+").replace(" ", "") == "hydra.mode=MULTIRUN" for a in argv)


def check_not_a_sweep_under_torchrun(argv: Sequence[str]) -> None:
    """A ``-m`` sweep inside torchrun's ranks re-forms the process group from torchrun's settings
    for each job after the first; a second job on the dense kernel hung there for good."""
    from neo_core.errors import ConfigError
    from neo_core.training import started_as_rank

    # torchrun's own variable, or the ranks of another launcher, as the launch resolves them
    if is_sweep(argv) and ("TORCHELASTIC_RUN_ID" in os.environ or started_as_rank()):
        raise ConfigError(
            "recipes/train.py -m under torchrun (or another launcher's ranks: RANK and WORLD_SIZE set) is not "
            "supported: its ranks would form the process group anew for "
            "each job, which can hang (a second job on the dense kernel does). Launch each job on its own "
            "(one torchrun or launcher command a job), or sweep without a launcher (the recipe starts this "
            "machine's ranks itself)."
        )


def check_sweep_values(argv: Sequence[str], recipe: str) -> None:
    """Without ``-m``, an override that lists values (``trainer.max_steps=1,2``) is refused
    naming the flag; Hydra's own message ("Ambiguous value") shows it as rewritten (``++``)."""
    if is_sweep(argv):
        return
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key.startswith("-") or key.lstrip("+~").startswith("hydra"):
            continue
        depth, quoted, escaped = 0, None, False
        for ch in value:
            if escaped:  # a\,b: one value with a comma
                escaped = False
            elif ch == "\\":
                escaped = True
            elif quoted:
                quoted = None if ch == quoted else quoted
            elif ch in "'\"":
                quoted = ch
            elif ch in "[{(":
                depth += 1
            elif ch in "]})":
                depth -= 1
            elif ch == "," and depth == 0:
                listed = f" (a list value goes in brackets: {key.lstrip('+')}=[{value}])" if "." in key else ""
                raise ConfigError(
                    f"{arg} lists several values: add -m to run one job per value (python {recipe} -m ...), "
                    f"or give one value{listed}."
                )


def config_dirs(conf: str | os.PathLike[str], argv: Sequence[str] = ()) -> list[Path]:
    """``conf`` and the config directory ``argv`` adds with ``--config-dir``/``-cd`` (the last
    one given, as Hydra takes it)."""
    added, args = None, list(argv)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in ("--config-dir", "-cd"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            added = Path(value) if value else added
    return [Path(conf)] if added is None else [Path(conf), added]


def help_groups(conf: str | os.PathLike[str], groups: Sequence[str], argv: Sequence[str] = (),
                shown: Mapping[str, str] | None = None) -> str:
    """A recipe's groups and their options for ``--help``, a line each: YAML files of conf/
    (and a ``--config-dir``) and installed plugins (``option_names``). ``shown``: how a group
    is named there (``topology`` is added with ``+topology``)."""
    shown = {"topology": "+topology", **(shown or {})}
    return "\n".join(f"{shown.get(g, g)}: {', '.join(option_names(conf, g, argv))}" for g in groups)


def _selected_in_files(argv: Sequence[str], conf: str | os.PathLike[str], config_name: str, group: str) -> bool:
    """Whether the recipe's config (``config_name``, or ``-cn``'s) or an experiment the command
    line chooses selects an option of ``group`` other than ``none``."""
    from omegaconf import OmegaConf

    names, args = [f"{config_name}.yaml"], list(argv)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in ("--config-name", "-cn"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            names = [f"{value.removesuffix('.yaml')}.yaml"] if value else names
        elif flag.lstrip("+") == "experiment" and eq:
            names += [f"experiment/{v.strip()}.yaml" for v in value.split(",") if v.strip()]
    for name in names:
        found = next((d / name for d in reversed(config_dirs(conf, argv)) if (d / name).is_file()), None)
        if found is None:
            continue
        with contextlib.suppress(Exception):  # a broken file is check_yaml_files' to name
            content = OmegaConf.to_container(OmegaConf.load(found))
            if any(g == group and option not in (None, "none") for g, option in defaults_choices(content)):
                return True
    return False


def defaults_choices(content: Any) -> Iterator[tuple[str, Any]]:
    """The group options a config file's ``defaults:`` list selects, as (group, option):
    ``override /cache: lru`` is ``("cache", "lru")``."""
    entries = content.get("defaults") if isinstance(content, dict) else None
    for entry in entries or []:
        for key, option in (entry.items() if isinstance(entry, dict) else ()):
            yield str(key).removeprefix("override").strip().lstrip("/"), option


def cache_keys_select_lru(argv: Sequence[str], conf: str | os.PathLike[str], config_name: str,
                          doing: str) -> tuple[list[str], str | None]:
    """``cache.<key>`` given without a cache policy selects ``cache=lru``, in recipes/plan.py and
    recipes/train.py alike: the default ``none`` takes no keys, and LRU takes every cache key with
    every value (LFU refuses ``cache.prefetch_pipeline=true``: FBGEMM prefetches only under LRU).
    Returns ``argv`` with ``cache=lru`` added last (Hydra applies a group choice before values)
    and the note that says so, ``doing`` naming the run ("planning"); ``argv`` itself and None
    where the command line selects a policy (``cache=``, ``cache.name=``), or the recipe's
    config or an experiment chosen does."""
    keys = [a.partition("=")[0].lstrip("+") for a in argv]
    cache_keys = [k for k in keys if k.startswith("cache.") and k != "cache.name"]
    if (not cache_keys or "cache" in keys or "cache.name" in keys
            or _selected_in_files(argv, conf, config_name, "cache")):
        return list(argv), None
    return [*argv, "cache=lru"], (f"note: {cache_keys[0]} without a cache policy: {doing} with cache=lru (the "
                                  "default, none, takes no keys)")


def repeated_settings(argv: Sequence[str]) -> list[str]:
    """Notes for a setting given twice on the command line (``trainer.batch_size=64 ...
    trainer.batch_size=32``): the last is used, as Hydra applies them in order, and the note
    says which. A config group chosen twice is refused instead (``check_group_options``)."""
    given: dict[str, list[str]] = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and not key.startswith("-"):
            given.setdefault(key.lstrip("+~"), []).append(value)
    return [f"note: {key} is given {len(values)} times ({', '.join(values)}): {values[-1]} is used"
            for key, values in given.items() if len(values) > 1]


def config_dir_shadows(conf: str | os.PathLike[str], argv: Sequence[str] = (), plugins: Any = None) -> list[str]:
    """Warnings for the option files of a ``--config-dir`` that do not do what their name says:
    one named as a recipes' option is never read (the recipes' folder comes first in Hydra's
    search path), one named as a plugin's option replaces that option."""
    dirs = config_dirs(conf, argv)
    if len(dirs) < 2 or not dirs[1].is_dir():
        return []
    if plugins is None:
        from neo_core.plugins import get_plugins

        plugins = get_plugins()
    offered = {}  # (group, option) -> the plugin whose option it is
    for registry in plugins.registries.values():
        for entry in registry.entries():
            for option in (entry.name, *entry.options):
                offered[(registry.group, option)] = f"{registry.kind} plugin {entry.name!r} ({entry.provider})"
    said = []
    for path in sorted(dirs[1].glob("*/*.yaml")):
        group, name = path.parent.name, path.stem
        if (Path(conf) / group / path.name).is_file():
            said.append(f"warning: {path} is never read: the recipes' {Path(conf) / group / path.name} comes first in "
                        f"Hydra's search path, so {group}={name} selects that one; give yours another name (e.g. "
                        f"{name}_mine.yaml, selected with {group}={name}_mine).")
        elif (group, name) in offered:
            said.append(f"warning: {path} replaces the option {group}={name} of the {offered[(group, name)]}; "
                        "give it another name to keep both.")
    return said


def check_yaml_files(conf: str | os.PathLike[str], argv: Sequence[str] = ()) -> None:
    """Refuse, as one line naming the file, line and column, a YAML option file of the recipes'
    folders or a ``--config-dir`` that does not parse (Hydra reads them only when an option is
    composed, and failed with a traceback through its loader)."""
    import yaml
    from omegaconf._utils import get_yaml_loader  # Hydra's loader: what it refuses, refused here

    loader = get_yaml_loader()
    groups = {p.name for p in Path(conf).iterdir() if p.is_dir()}  # the recipes' groups (data, plan_model, ...)
    for folder in config_dirs(conf, argv):
        if not folder.is_dir():
            continue
        # the files the recipes compose from: the folder's own, and their config groups' (not hidden ones)
        paths = sorted(folder.glob("*.yaml")) + sorted(p for p in folder.glob("*/*.yaml") if p.parent.name in groups)
        for path in paths:
            if path.name.startswith(".") or path.parent.name.startswith("."):
                continue
            try:
                yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a SafeLoader
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}.") from None
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#x} at {exc.start}); save it as "
                                  "UTF-8 (or move it out of the config folder).") from None
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
                problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
                context = getattr(exc, "context", None)
                raise ConfigError(f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")
                                  + "; mend the file (or move it out of the config folder).") from None


def config_groups(conf: str | os.PathLike[str], argv: Sequence[str] = ()) -> list[str]:
    """The config group folders of ``config_dirs(conf, argv)``."""
    return sorted({p.name for d in config_dirs(conf, argv) if d.is_dir() for p in d.iterdir() if p.is_dir()})


def _as_typed(value: Any) -> str:
    """A default as it is typed in an override (null, true, [2, 4, 8])."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def list_plugins(conf_dir: str | os.PathLike[str] | None = None) -> str:
    """Every registered plugin, grouped by kind, with the distribution that provided it, then
    the plugins that failed to load and the options the recipes would refuse as clashes.

    ``conf_dir``: the YAML options plugin options must not clash with (default: the checkout's
    ``conf/``, when there is one).
    """
    return plugin_listing(conf_dir)[0]


def plugin_listing(conf_dir: str | os.PathLike[str] | None = None) -> tuple[str, bool]:
    """:func:`list_plugins`, and whether the recipes refuse to start on a clash it shows."""
    from neo_core.errors import PluginClash
    from neo_core.plugins import QUIET_ENV, get_plugins, load_plugins

    said = os.environ.get(QUIET_ENV)
    os.environ[QUIET_ENV] = "1"  # a plugin that failed to load is said in the listing, not twice
    try:
        plugins = get_plugins()
    except PluginClash as exc:  # a name registered twice: the listing is where one looks for it
        print(f"error: {exc} (the recipes refuse to start until it is mended; the built-in plugins follow)",
              file=sys.stderr)
        return _listing(load_plugins(autoload=False), conf_dir, clash=True)[0], True
    finally:
        if said is None:
            del os.environ[QUIET_ENV]
        else:
            os.environ[QUIET_ENV] = said
    return _listing(plugins, conf_dir)


def _listing(plugins: Any, conf_dir: str | os.PathLike[str] | None, clash: bool = False) -> tuple[str, bool]:
    """The listing of this plugin manager, and whether it has option clashes (``clash``: a name
    registered twice, said in its last line)."""
    from neo_core.config import option_clashes

    if conf_dir is None and (CHECKOUT_CONF / "train.yaml").exists():
        conf_dir = CHECKOUT_CONF
    lines = []
    for registry in plugins.registries.values():
        lines.append(f"{registry.kind} (config group '{registry.group}'):")
        entries = list(registry.entries())
        width = max([14, *(len(e.name) for e in entries)])  # descriptions in one column
        wide = max((len(e.provider) + 2 for e in entries), default=0)
        for entry in entries:
            desc = f"  {' ' * (wide - len(entry.provider) - 2)}{entry.description}" if entry.description else ""
            lines.append(f"  {entry.name:<{width}} [{entry.provider}]{desc}")
            keys = ", ".join(
                f"{k} (required)" if v is inspect.Parameter.empty else f"{k}={_as_typed(v)}"
                for k, v in entry.parameters().items()
            )
            if keys:
                lines.append(f"  {'':<{width}} keys: {keys}")
            if entry.options:
                lines.append(f"  {'':<{width}} options: {', '.join(entry.options)}")
        if not len(registry):
            lines.append("  (none)")
    for name, error in plugins.failed.items():
        lines.append(f"failed to load: {name}: {error}")
    clashes = option_clashes(conf_dir, plugins)
    lines += [f"clash (the recipes refuse to start): {found}" for found in clashes]
    if clash:
        lines.append("(the built-in plugins only: a plugin name is registered twice, see the error above)")
    return "\n".join(lines), bool(clashes)


def _no_plan_in(folder: Path, given: str) -> str:
    """Why ``neo chart <folder>`` has no plan to draw; of a sweep's folder (multirun/<date>/<time>),
    where its jobs' plans and its own chart are."""
    jobs = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / "plan.json").is_file())
    if not jobs and not (folder / "summary.csv").is_file():
        return f"{given} is a folder without a plan.json; give a run's folder or its plan.json."
    first = os.path.join(given, str(jobs[0])) if jobs else None
    said = (f"each job's plan is in its numbered folder (neo chart {first})" if first
            else "no job of it wrote a plan.json (summary.csv says why)")
    chart = (f"; the sweep's own chart is {os.path.join(given, 'summary.png')}"
             if (folder / "summary.png").is_file() else "")
    return f"{given} is a sweep's folder, without a plan.json of its own: {said}{chart}."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neo", description="Neo: sharded DLRM training on TorchRec.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list registered plugins by kind")
    calibrate = sub.add_parser("calibrate", help="measure this machine's bandwidths for the local topology")
    calibrate.add_argument(
        "--output", default=None, help="where to write the calibration JSON (default: NEO_CALIBRATION or ~/.cache/neo/calibration.json)"
    )
    calibrate.add_argument("--ranks", default=None, help="gloo ranks that measure the collectives: a power of two, "
                           "2 or more (as many as will train; default 2)")
    calibrate.add_argument("--nice", default=None, help="measure this much above normal priority (needs root)")
    chart = sub.add_parser("chart", help="print a plan.json's plan and draw its chart (plan.png beside it; X.png for X.json)")
    chart.add_argument("plan", help="the plan.json of a training run or of recipes/plan.py, or the run's folder")
    chart.add_argument("--out", default=None, help="where to draw the chart (default: beside the plan, named after it: plan.png)")
    chart.add_argument("--all", action="store_true",
                       help="print every table and rank, not only the first tables and the slowest ranks")
    args = parser.parse_args(argv)
    with user_errors():
        if args.command == "plugins":
            listing, refused = plugin_listing()
            print(listing)
            if refused:
                return 1  # listed, but the recipes will not start
        elif args.command == "chart":
            from neo_core.sharding import PlanResult
            from neo_plugins.sharding.planner.report import save_chart

            given = Path(args.plan)
            if given.is_dir():  # a run's folder: its plan
                if not (given / "plan.json").is_file():
                    raise ConfigError(_no_plan_in(given, args.plan))
                given = given / "plan.json"
            plan = PlanResult.load_json(given)
            for problem in plan.run_problems():  # an edited or a plugin's plan: drawn, but said
                print(f"warning: {given} cannot run as written: it {problem}.", file=sys.stderr)
            if plan.tables and not all(a.spec for a in plan.tables):
                print(f"note: {given} was written before plan.json kept each table's spec: its ranks and memory are "
                      "checked, its tables' shards are not (plan again to check them).", file=sys.stderr)
            print(plan.format_text(max_tables=None, max_ranks=None) if args.all else plan.format_text(rest="all in plan.json; --all prints them"))
            # beside the plan, named after it: another file's chart leaves the run's plan.png alone
            out = args.out or given.with_suffix(".png")
            try:
                print(f"wrote {save_chart(plan, out)}")
            except OSError as exc:
                raise ConfigError(f"cannot draw the chart to {out} ({exc.strerror}); choose another --out.") from None
        elif args.command == "calibrate":
            from neo_plugins.sharding.planner.calibrate import main as calibrate_main
            from neo_plugins.topology.local import calibration_path

            if args.output is not None and not args.output.strip():
                raise ConfigError("neo calibrate --output is empty; give a file path, or leave --output out to "
                                  f"write the machine's default ({calibration_path()}).")
            flags = [f for name in ("ranks", "nice") if getattr(args, name) is not None
                     for f in (f"--{name}", getattr(args, name))]
            calibrate_main(args.output or str(calibration_path()), flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())
