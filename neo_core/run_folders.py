"""The recipes' run folders: each run's own (``neo_fresh_dir``), checked and made before Hydra
writes there, and held while a run writes there (:mod:`neo_core.folder_lock`); under torchrun,
rank 0 names and holds the folder for every rank; a sweep's jobs hold theirs as Hydra's
launcher names them."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from neo_core.errors import ConfigError, NeoError


def _cli() -> Any:
    """:mod:`neo_core.cli`, which imports this module: its ``user_errors``, ``is_sweep`` and
    ``_tilde_not_expanded``, read as called."""
    from neo_core import cli

    return cli


# folders check_run_dirs made for this launch (they were not there before): a sweep refused
# before its first job may remove the one it was given
_MADE_DIRS: dict[str, Path] = {}  # a folder -> the outermost of those made for it


HYDRA_SWEEP_DIR = "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}"  # Hydra's default: made by each launch


# each base's folder this process took (Hydra reads hydra.run.dir more than once)
_FRESH_DIRS: dict[str, str] = {}


# Hydra's flags that show the config or help and run nothing: no folder is claimed or held
INSPECTING = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc")


_CLAIMING = [True]


def runs_nothing(argv: Sequence[str]) -> bool:
    """Whether the command only shows the config or help (``--cfg``, ``--help``, ``--info``)."""
    return any(a.split("=", 1)[0] in INSPECTING for a in argv)


def fresh_run_dir(base: str) -> str:
    """The recipes' default output folder (``${neo_fresh_dir:outputs}`` in conf/), named as
    Hydra names it, ``base/<date>/<time>``, but this run's alone: it is made here, and where a
    run started in the same second has it already (a shell loop that starts several runs, a
    scheduler), this one takes ``<time>-2``, then ``-3``, and so on. Hydra's own name gave both
    runs one folder, where the second wrote its log, plan and checkpoints over the first's.
    One folder per process and base. Under torchrun every rank must write into one folder, and
    each rank naming its own by its clock gave ranks that started a second apart two folders
    (a checkpoint split between them): rank 0 claims the folder and the others read its name
    from the launch's store (:func:`_rank0s_name`)."""
    if base in _FRESH_DIRS:
        return _FRESH_DIRS[base]
    from datetime import datetime

    from neo_core.training import started_as_rank

    now = datetime.now()
    name = os.path.join(base, now.strftime("%Y-%m-%d"), now.strftime("%H-%M-%S"))
    if not _CLAIMING[0]:  # --cfg hydra --resolve shows the name: nothing is made
        return name
    with _cli().user_errors():  # a bad NEO_RUN_DIR_TIMEOUT_S: one line, not Hydra's traceback
        _FRESH_DIRS[base] = _rank0s_name(base, name) if started_as_rank() else claim_folder(name)
    if os.environ.get("RANK", "0") == "0" and os.path.isdir(_FRESH_DIRS[base]):
        # this run's until it ends (hold_run_folders). A launcher's rank keeps the clock's name
        # (_rank0s_name), which a live run started in the same second may hold: Hydra reads this
        # before the recipe's own handlers, and showed its traceback for the refusal
        with _cli().user_errors():
            hold_for_launch(_FRESH_DIRS[base], "hydra.sweep.dir" if _cli().is_sweep(sys.argv[1:]) else "hydra.run.dir")
    return _FRESH_DIRS[base]


def hold_for_launch(folder: str | os.PathLike[str], key: str) -> None:
    """Rank 0 (or a run without ranks) holds ``folder`` (:func:`neo_core.folder_lock.hold_folder`);
    under torchrun, a refusal is also put in the launch's store, where the other ranks wait for
    rank 0's word before Hydra writes into the folder (:class:`HoldRunFolder`)."""
    from neo_core.folder_lock import hold_folder

    try:
        hold_folder(folder, key)
    except NeoError as exc:
        _tell_ranks(str(exc))
        raise


_HELD_WORD = "held"  # the store's key (:func:`_launch_key`) for rank 0's word on the run's folder


def _tell_ranks(refusal: str) -> None:
    """Under torchrun: rank 0 tells the other ranks whether it holds the run's folder (``""``)
    or was refused it (the refusal), in the launch's store."""
    try:
        store = _launch_store()
        if store is not None:
            store.set(_launch_key(_HELD_WORD), refusal)
    except ConfigError:  # NEO_RUN_DIR_TIMEOUT_S not a number of seconds: said, every rank refuses it
        raise
    except Exception:  # noqa: BLE001, S110 - no store: the ranks do not wait for it
        pass


class HoldRunFolder:
    """A Hydra callback (``hydra.callbacks`` in conf/train.yaml and conf/plan.yaml): the run's
    folder (``hydra.run.dir``, or a sweep's ``hydra.sweep.dir``), as Hydra resolved it, is
    checked and held before Hydra writes its ``.hydra/`` records there. The command line's
    folder was held before (:func:`hold_given_dirs`); this one covers a folder given as
    ``${...}`` or by a config file, and the other ranks of a torchrun launch: they wait for
    rank 0's word, and where rank 0 was refused the folder, leave without writing there (rank
    0 says why). A sweep's jobs hold their own folders as they start (:func:`hold_job_folder`)."""

    def on_run_start(self, config: Any, **_: Any) -> None:
        self._hold(config, "hydra.run.dir")

    def on_multirun_start(self, config: Any, **_: Any) -> None:
        self._hold(config, "hydra.sweep.dir")

    # Hydra calls every hook of a callback (hydra.experimental.callback.Callback's, not imported
    # here: 70 ms more for each `neo` command)
    def on_run_end(self, config: Any, **_: Any) -> None:
        pass

    def on_multirun_end(self, config: Any, **_: Any) -> None:
        pass

    def on_job_start(self, config: Any, **_: Any) -> None:
        pass

    def on_job_end(self, config: Any, job_return: Any, **_: Any) -> None:
        pass

    @staticmethod
    def _hold(config: Any, key: str) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        if not _CLAIMING[0]:
            return
        with _cli().user_errors():
            if os.environ.get("RANK", "0") != "0":
                _wait_for_rank0()
                return
            HydraConfig.instance().set_config(config)  # as Hydra sets it to resolve the folder
            folder = str(OmegaConf.select(config, key))
            check_run_dir(key, folder)
            hold_for_launch(folder, key)
            _tell_ranks("")


def _wait_for_rank0() -> None:
    """A torchrun rank other than 0: wait for rank 0's word on the run's folder
    (:func:`_tell_ranks`); where rank 0 was refused it, leave (status 2) before Hydra writes
    there. Without the launch's store (another launcher) the rank goes on."""
    try:
        store = _launch_store()
        if store is None:
            return
        refusal = store.get(_launch_key(_HELD_WORD)).decode()
    except ConfigError:  # a bad NEO_RUN_DIR_TIMEOUT_S: refused, not heard as rank 0's silence
        raise
    except Exception as exc:  # noqa: BLE001 - as for the folder's name: said, and the rank goes on
        print(f"warning: rank {os.environ.get('RANK')} heard nothing from rank 0 on the run's folder "
              f"({type(exc).__name__}: {exc}); it goes on", file=sys.stderr)
        return
    if refusal:  # rank 0 has said why
        raise SystemExit(2)


_STORE: list[Any] = []  # the launch's store, kept open while the process runs


def _launch_store() -> Any | None:
    """The store torchrun's agent keeps for the launch, where ranks pass each other word
    (``TORCHELASTIC_USE_AGENT_STORE``), kept open while the process runs; ``None`` without one
    (another launcher, or none). A rank waits up to ``NEO_RUN_DIR_TIMEOUT_S`` seconds (600) for
    a word."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return None
    if not _STORE:
        said = os.environ.get("NEO_RUN_DIR_TIMEOUT_S", "600")
        try:
            wait = float(said)
        except ValueError:
            wait = -1.0
        if not 0 < wait < float("inf"):
            raise ConfigError(f"NEO_RUN_DIR_TIMEOUT_S={said!r}: give the seconds a rank waits for rank 0's word "
                              "on the run's folder, a number above 0 (600 where it is not set).")
        from datetime import timedelta

        import torch.distributed as dist

        _STORE.append(dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                    is_master=False, timeout=timedelta(seconds=wait)))
    return _STORE[0]


def _launch_key(what: str) -> str:
    """A key of this launch (and restart) in the launch's store."""
    return (f"neo/{what}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")


def _rank0s_name(base: str, name: str) -> str:
    """Under torchrun: rank 0 claims ``name`` (:func:`claim_folder`) and puts what it got in the
    store torchrun's agent keeps for the launch (``TORCHELASTIC_USE_AGENT_STORE``), where the
    other ranks read it, on every node. Without such a store (another launcher) each rank keeps
    ``name``, as Hydra's default did; so does a rank that cannot reach the store or hears nothing
    from rank 0 within ``NEO_RUN_DIR_TIMEOUT_S`` seconds (600), with a warning to give every
    rank one ``hydra.run.dir``."""
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return name
    key = _launch_key(base)
    try:
        store = _launch_store()
        if rank == 0:
            name = claim_folder(name)
            store.set(key, name)
            return name
        return store.get(key).decode()
    except ConfigError:  # a bad NEO_RUN_DIR_TIMEOUT_S: refused, not a folder of this rank's own
        raise
    except Exception as exc:  # noqa: BLE001 - the run goes on in this rank's own folder, said
        print(f"warning: rank {rank} could not learn the run's folder from rank 0 ({type(exc).__name__}: {exc}); "
              f"it writes into {name}, which may not be rank 0's: give every rank one hydra.run.dir=...",
              file=sys.stderr)
        return name


def claim_folder(name: str) -> str:
    """Make the folder ``name`` (its parents as needed), or where it is there already
    ``name-2``, ``name-3``, ...: the first that this call made, so that processes claiming one
    name at once each get their own. Returns the name made (``name`` as given where a folder
    cannot be made here: Hydra's own attempt then says why)."""
    day = Path(os.path.abspath(name)).parent
    made, top = not day.exists(), day  # the outermost folder made here
    while not top.parent.exists():
        top = top.parent
    try:
        day.mkdir(parents=True, exist_ok=True)
    except OSError:
        return name
    claimed = name
    for n in range(2, 1_000_000):
        try:
            os.mkdir(claimed)  # atomic: of two processes, one makes it and the other takes the next
        except FileExistsError:
            claimed = f"{name}-{n}"
            continue
        except OSError:
            return name
        folder = Path(os.path.abspath(claimed))
        _MADE_DIRS[str(folder)] = top if made else folder  # a refused sweep removes what it made
        return claimed
    return name


def hold_given_dirs(argv: Sequence[str]) -> None:
    """Hold the folder ``hydra.run.dir`` (``hydra.sweep.dir`` with ``-m``) names on the command
    line, before the recipe loads its plugins (:class:`HoldRunFolder` holds a folder given as
    ``${...}`` or by a config file, as Hydra resolved it, before Hydra writes there). Under
    torchrun rank 0 holds it for the ranks."""
    if runs_nothing(argv):  # --cfg, --help, --info: no folder is claimed or held
        _CLAIMING[0] = False
        return
    if os.environ.get("RANK", "0") != "0":
        return
    for key, value in given_run_dirs(argv):
        if "${" not in value and not value.startswith("~"):  # check_run_dirs refuses ~; Hydra resolves ${...}
            hold_for_launch(value, key)


def hold_run_folders(output_dir: str | os.PathLike[str]) -> None:
    """A recipe's run, or a sweep's job, holds its output folder while it writes there
    (:func:`neo_core.folder_lock.hold_folder`): a second run given the same folder is refused,
    naming the first. A sweep's own folder is held by the process that launched it
    (:func:`hold_given_dirs`, :func:`fresh_run_dir`), not by its jobs: a launcher that runs
    them in other processes, or on other machines, would have each refused."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from neo_core.folder_lock import hold_folder

    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:  # a job: refused as a job, the sweep going on
        return
    own = os.path.abspath(output_dir) != os.path.abspath(str(hydra.runtime.output_dir))
    hold_folder(output_dir, "output_dir" if own else "hydra.run.dir")  # the key that chose it


def hold_job_folder(out: Path) -> None:
    """A sweep's job holds its folder (:func:`hold_run_folders`); where another run holds it,
    the job is refused (``SweepFailures.job``'s ``before``: reported as not run, the sweep goes
    on) and its transcript is not kept there."""
    from neo_core.folder_lock import hold_folder
    from neo_core.training.console import discard_transcript

    try:
        hold_folder(out, "hydra.sweep.dir")
    except NeoError:
        discard_transcript()
        raise


def hold_jobs_before_hydra_writes() -> None:
    """Hydra's launcher (the one that runs a sweep's jobs in this process) writes a job's
    ``.hydra/`` records into its folder before the job runs, and so before the job holds its
    folder (:func:`hold_job_folder`): a job whose folder another run held wrote its records
    over that run's. Each job's folder is now held as Hydra names it, just before Hydra writes
    there, until the job ends; where another run holds it, Hydra writes no records for the job
    (``hydra.output_subdir`` unset for it), no transcript is opened there, and a job that writes
    there (its ``output_dir``, by default) is refused as it starts, as before."""
    import hydra.core.utils
    from hydra._internal.core_plugins import basic_launcher

    launched = hydra.core.utils.run_job
    if getattr(launched, "neo_holds", False):
        return

    def run_job(*, config: Any, job_dir_key: str, job_subdir_key: str | None, **kwargs: Any) -> Any:
        from neo_core.folder_lock import release_folder

        held = None
        if job_subdir_key is not None:  # a sweep's job (a single run's folder is held already)
            held = _hold_job_first(config, job_dir_key, job_subdir_key)
        try:
            return launched(config=config, job_dir_key=job_dir_key, job_subdir_key=job_subdir_key, **kwargs)
        finally:  # the job lets go of its folder as it ends (SweepFailures.job does of its output_dir,
            if held is not None:  # which a job may set elsewhere: a sweep held every job's folder till it ended)
                release_folder(held)

    run_job.neo_holds = True  # type: ignore[attr-defined]
    # Hydra's plugin scan loads its launcher's module anew, which takes run_job from hydra.core.utils
    hydra.core.utils.run_job = run_job  # type: ignore[assignment]
    basic_launcher.run_job = run_job  # type: ignore[attr-defined]


def _job_folder(config: Any, dir_key: str = "hydra.sweep.dir", subdir_key: str = "hydra.sweep.subdir") -> str:
    """A sweep job's folder as Hydra's launcher names it from the job's ``config`` (its
    ``hydra.sweep.dir`` and ``subdir``, resolved with the job's own config as Hydra's)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    kept = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(config)  # as Hydra sets it to resolve the folder
        return os.path.join(str(OmegaConf.select(config, dir_key)), str(OmegaConf.select(config, subdir_key)))
    finally:
        HydraConfig.instance().cfg = kept


def _hold_job_first(config: Any, dir_key: str, subdir_key: str) -> str | None:
    """Hold a sweep job's folder as Hydra will name it (:func:`hold_jobs_before_hydra_writes`);
    where another run holds it, the job's config asks Hydra to write no records there. The
    folder this call took hold of (None: held already, refused, or not resolved)."""
    from omegaconf import open_dict, read_write

    from neo_core.folder_lock import hold_folder, is_held

    try:
        folder = _job_folder(config, dir_key, subdir_key)
    except Exception:  # noqa: BLE001 - Hydra's own resolution says what is wrong
        return None
    if is_held(folder):
        return None
    try:
        hold_folder(folder, "hydra.sweep.dir")
    except NeoError:  # the job says so as it starts where it writes there (hold_job_folder)
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.output_subdir = None
            # nor its log: Hydra's file handler appends to <folder>/<job name>.log, the other
            # run's transcript (plan.log, train.log)
            logging_cfg = config.hydra.get("job_logging") or {}
            files = [n for n, h in (logging_cfg.get("handlers") or {}).items() if "filename" in (h or {})]
            for name in files:
                del logging_cfg.handlers[name]
            root = logging_cfg.get("root") or {}
            if files and root.get("handlers"):
                root.handlers = [h for h in root.handlers if h not in files]
        return None
    return folder


def use_fresh_run_dirs() -> None:
    """Register ``neo_fresh_dir`` (:func:`fresh_run_dir`), which conf/'s ``hydra.run.dir`` and
    ``hydra.sweep.dir`` use. Done at import too: a launcher that runs a sweep's jobs in other
    processes unpickles the recipe there, importing this module, before Hydra reads the
    folders (their values come with the config, from the resolver's cache)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("neo_fresh_dir", fresh_run_dir, use_cache=True, replace=True)


use_fresh_run_dirs()


def _remove_made_sweep_dir(sweeper: Any) -> None:
    """Remove the sweep's folder where this launch made it (``check_run_dirs``, with the
    folders it made around it; or the seconds folder of Hydra's dated default) and it holds
    nothing but the ``multirun.yaml`` Hydra wrote; a folder that was there before the launch is
    left as it is."""
    with contextlib.suppress(Exception):
        node = sweeper.config.hydra.sweep._get_node("dir")
        raw = node._value() if node is not None else None
        folder = Path(os.path.abspath(str(sweeper.config.hydra.sweep.dir)))
        dated = raw == HYDRA_SWEEP_DIR
        from neo_core.folder_lock import LOCK_NAME, release_folder

        kept = [p.name for p in folder.iterdir() if p.name != LOCK_NAME]  # this launch's hold goes with it
        if (str(folder) in _MADE_DIRS or dated) and kept == ["multirun.yaml"]:
            (folder / "multirun.yaml").unlink()
            release_folder(folder)
            folder.rmdir()
            # the folders made here around it (Hydra's dated ones may hold other sweeps, or be
            # the user's: they stay)
            top = _MADE_DIRS.get(str(folder), folder)
            parent = folder
            while parent != top and parent.parent != parent:
                parent = parent.parent
                if any(parent.iterdir()):
                    break
                parent.rmdir()


def given_run_dirs(argv: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``(key, folder)`` for each ``hydra.run.dir=`` (``hydra.sweep.dir=`` with ``-m``) the
    command line gives, its quotes stripped."""
    key = "hydra.sweep.dir" if _cli().is_sweep(argv) else "hydra.run.dir"
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name.lstrip("+") == key and value:
            yield key, value.strip("'\"")


def check_run_dirs(argv: Sequence[str]) -> None:
    """``hydra.run.dir`` (or ``hydra.sweep.dir`` with ``-m``) must name a folder that is or can
    be made: Hydra creates it before the recipe runs, and a file in the way, a parent that is a
    file or a place that cannot be written ended in its traceback. The folder is made here, as
    Hydra would make it. Values Hydra resolves (``${...}``) are left to it."""
    for key, value in given_run_dirs(argv):
        if value.startswith("~"):  # Hydra would make a folder named ~ here
            raise ConfigError(f"{key}={value}: {_cli()._tilde_not_expanded(value, key + '=')}")
        if "${" not in value:  # Hydra resolves it: checked as resolved (HoldRunFolder)
            check_run_dir(key, value)


def check_run_dir(key: str, value: str) -> None:
    """The folder ``key`` gives (``value``) is or can be made, and is made here
    (:func:`check_run_dirs`)."""
    path = Path(os.path.abspath(value))  # as the sweep's folder is compared later (x/../y is y)
    problem = None
    if path.exists():
        if not path.is_dir():
            problem = "a file of that name is in the way"
        elif not os.access(path, os.W_OK | os.X_OK):
            problem = "it cannot be written"
    else:
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            problem = f"{parent} is a file, not a folder"
        elif not os.access(parent, os.W_OK | os.X_OK):
            problem = f"{parent} cannot be written"
    if problem is None:
        top = path  # the outermost folder made here
        while not top.parent.exists():
            top = top.parent
        made = not path.exists()
        try:  # as Hydra will; some places only refuse when asked (/proc, a full or read-only mount)
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
        if made and problem is None:
            _MADE_DIRS[str(path)] = top
    if problem:
        raise ConfigError(f"{key}={value} cannot hold the run's output ({problem}); choose another {key}.")
