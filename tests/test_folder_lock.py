"""One run at a time in an output folder (neo_core.folder_lock): a second run given a folder
another is writing in is refused, naming it, before it writes anything there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from neo_core import folder_lock
from neo_core.errors import ConfigError
from neo_core.folder_lock import LOCK_NAME, hold_folder, release_folder
from tests import forked
from tests.conftest import ROOT, subprocess_env

HOLD = "import sys, time; from neo_core.folder_lock import hold_folder; hold_folder(sys.argv[1]); print('held', flush=True); time.sleep(120)"


def holder(folder: Path) -> subprocess.Popen:
    """A process that holds ``folder`` until it is ended."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env(), cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def assert_refused_before_writing(script: Path, args: list[str], run: Path, sweep: Path,
                                  holders: list[subprocess.Popen]) -> None:
    """``script args`` (a sweep with -m) is refused in one line naming the holder of ``run``
    (``sweep``), and writes nothing there: no .hydra/, no log."""
    proc = forked.run(script, *args, env=subprocess_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    folder, key = (sweep, "hydra.sweep.dir") if "-m" in args else (run, "hydra.run.dir")
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: another run is writing in {folder} (pid {holders[folder == sweep].pid} on "), proc.stderr
    assert f"choose another folder ({key}=...)" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]


def test_a_folder_another_live_run_holds_is_refused_until_it_ends(tmp_path: Path) -> None:
    proc = holder(tmp_path / "run")
    try:
        with pytest.raises(ConfigError) as err:
            hold_folder(tmp_path / "run")
        said = str(err.value)
        assert said.startswith(f"another run is writing in {tmp_path / 'run'} (pid {proc.pid} on ")
        assert f"choose another folder (hydra.run.dir=...). If no run is writing there, remove {tmp_path / 'run' / LOCK_NAME}." in said
        proc.kill()  # killed, not yet reaped: its lock is left behind, and holds nothing
        time.sleep(0.5)
        hold_folder(tmp_path / "run")
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
        hold_folder(tmp_path / "run")  # this process's already
    finally:
        proc.kill()
        proc.wait()
        release_folder(tmp_path / "run")
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    # a lock file that names no one (written by hand, cut short) holds nothing
    (tmp_path / "run" / LOCK_NAME).write_text("")
    os.utime(tmp_path / "run" / LOCK_NAME, (time.time() - 10, time.time() - 10))
    hold_folder(tmp_path / "run")
    release_folder(tmp_path / "run")
    # a holder on another machine is not second-guessed
    (tmp_path / "run" / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "then",
                                                          "command": "train.py"}))
    with pytest.raises(ConfigError, match=r"\(pid 1 on elsewhere, since then: train.py\)"):
        hold_folder(tmp_path / "run", "hydra.sweep.dir")
    # a folder that cannot be made is not held: the run's own check of its folder names the problem
    (tmp_path / "afile").write_text("")
    hold_folder(tmp_path / "afile" / "x")
    assert not (tmp_path / "afile" / "x").exists()


def test_recipes_refuse_a_folder_a_live_run_holds_before_writing_there(tmp_path: Path) -> None:
    # two runs given one folder: the second deleted the first's results as stale, or both said
    # "done" and the folder held one run's plan beside both transcripts
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    procs = [holder(run), holder(sweep)]
    try:
        for script, args in ((ROOT / "recipes" / "plan.py", ["+topology=zionex", f"hydra.run.dir={run}"]),
                             (ROOT / "recipes" / "train.py", ["trainer=smoke", f"hydra.run.dir={run}"]),
                             (ROOT / "recipes" / "plan.py", ["-m", "+topology=zionex", "compression=none,fp16",
                                                             f"hydra.sweep.dir={sweep}"])):
            assert_refused_before_writing(script, args, run, sweep, procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    proc = forked.run(ROOT / "recipes" / "plan.py", "+topology=zionex", "topology.num_nodes=1",
                      f"hydra.run.dir={run}", env=subprocess_env())  # its holder gone: the folder is free
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "plan.json").is_file() and not (run / LOCK_NAME).exists()


def test_a_held_folder_given_as_an_interpolation_or_by_a_config_file_is_refused_before_hydra_writes(
        tmp_path: Path) -> None:
    # such a folder was held only once the recipe ran, after Hydra had written its .hydra/
    # records (over the live run's) and a log there
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "fixed.yaml").write_text(f"# @package _global_\nhydra:\n  run:\n    dir: {run}\n")
    procs = [holder(run), holder(sweep)]
    given_run = f"hydra.run.dir={tmp_path}/r${{oc.env:NEO_TEST_UNSET,un}}"  # a variable not set: .../run
    try:
        for script, args in ((ROOT / "recipes" / "plan.py", ["+topology=zionex", given_run]),
                             (ROOT / "recipes" / "plan.py", ["-m", "+topology=zionex", "compression=none,fp16",
                                                             f"hydra.sweep.dir={tmp_path}/swe${{oc.env:NEO_TEST_UNSET,ep}}"]),
                             (ROOT / "recipes" / "train.py", ["--config-dir", str(tmp_path / "conf"), "experiment=fixed",
                                                              "trainer=smoke"])):
            assert_refused_before_writing(script, args, run, sweep, procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    proc = forked.run(ROOT / "recipes" / "plan.py", "+topology=zionex", "topology.num_nodes=1",
                      given_run, env=subprocess_env())  # free again
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "plan.json").is_file() and not (run / LOCK_NAME).exists()


def test_a_sweeps_job_whose_folder_is_held_is_not_run_and_the_sweep_goes_on(tmp_path: Path) -> None:
    # the job's refusal ended the whole sweep: the jobs after it never ran, and no summary
    sweep = tmp_path / "sweep"
    proc = holder(sweep / "1")
    try:
        run = forked.run(ROOT / "recipes" / "plan.py", "-m", "+topology=zionex", "topology.num_nodes=1",
                         "compression=none,fp16,bf16", f"hydra.sweep.dir={sweep}", env=subprocess_env())
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 2, run.stderr[-2000:]
    assert (sweep / "0" / "plan.json").is_file() and (sweep / "2" / "plan.json").is_file()
    assert not (sweep / "1" / "plan.json").exists() and not (sweep / "1" / "plan.log").exists()
    # nor Hydra's records, which went over the other run's (the job held its folder only as it started)
    assert sorted(p.name for p in (sweep / "1").iterdir()) == [LOCK_NAME]
    assert (sweep / "0" / ".hydra" / "overrides.yaml").is_file() and (sweep / "2" / ".hydra" / "overrides.yaml").is_file()
    assert "  #1 compression=fp16: not run (its folder is another run's)" in run.stdout
    assert f"error: job #1 (+topology=zionex topology.num_nodes=1 compression=fp16): another run is writing in " \
           f"{sweep / '1'} (pid {proc.pid} on " in run.stderr
    assert (sweep / "summary.csv").is_file()


def test_a_refused_sweep_job_leaves_the_live_runs_transcript_untouched(tmp_path: Path) -> None:
    # the job opened its transcript in the held folder before it was refused, wrote into the
    # live run's plan.log, then cut it back to its size before: lines the live run wrote
    # meanwhile were lost
    sweep = tmp_path / "sweep"
    proc = holder(sweep / "1")
    log = sweep / "1" / "plan.log"
    log.write_text("the live run's lines\n")
    os.utime(log, ns=(10**18, 10**18))  # any write or truncation moves it
    try:
        run = forked.run(ROOT / "recipes" / "plan.py", "-m", "+topology=zionex", "topology.num_nodes=1",
                         "compression=none,fp16", f"hydra.sweep.dir={sweep}", env=subprocess_env())
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 2 and "  #1 compression=fp16: not run (its folder is another run's)" in run.stdout, \
        run.stderr[-2000:]
    assert log.read_text() == "the live run's lines\n" and log.stat().st_mtime_ns == 10**18


def test_a_sweep_whose_jobs_write_elsewhere_lets_go_of_each_jobs_folder_as_it_ends(tmp_path: Path) -> None:
    # with output_dir set per job, each job's Hydra folder stayed held until the sweep ended
    # (a thousand jobs, a thousand open files)
    wrapper = tmp_path / "held_at_exit.py"
    wrapper.write_text(textwrap.dedent(f"""
        import atexit, runpy, sys
        from neo_core import folder_lock
        atexit.register(lambda: print("held at exit:", sorted(folder_lock._HELD)))
        sys.argv = [{str(ROOT / "recipes" / "plan.py")!r}, *sys.argv[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """))
    sweep = tmp_path / "sweep"
    run = forked.run(wrapper, "-m", "+topology=zionex", "topology.num_nodes=1", "compression=none,fp16",
                     f"output_dir={tmp_path}/out/${{hydra:job.num}}", f"hydra.sweep.dir={sweep}", env=subprocess_env())
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "out" / "1" / "plan.json").is_file() and (sweep / "1" / ".hydra").is_dir()
    assert f"held at exit: [{str(sweep)!r}]" in run.stdout, run.stdout[-1000:]  # the sweep's own folder only


def test_commands_that_only_show_the_config_claim_and_hold_nothing(tmp_path: Path) -> None:
    # --cfg hydra --resolve made empty outputs/<date>/<time> and multirun/... folders; --help
    # and --info were refused while a run held the folder they named
    proc = holder(tmp_path / "held")
    try:
        for flags in (["--cfg", "hydra", "--resolve"], ["--help"], ["--info"], ["--cfg", "job"]):
            run = forked.run(ROOT / "recipes" / "train.py", *flags, f"hydra.run.dir={tmp_path / 'held'}",
                             env=subprocess_env(), cwd=tmp_path)
            assert run.returncode == 0 and "another run" not in run.stderr, (flags, run.stderr[-2000:])
            run = forked.run(ROOT / "recipes" / "plan.py", *flags, env=subprocess_env(), cwd=tmp_path)
            assert run.returncode == 0, (flags, run.stderr[-2000:])
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held"]


def _forked(folder: Path, gate: tuple[int, int], out: int) -> int:
    """A forked process that tries to hold ``folder`` once ``gate`` is closed, writes to ``out``
    whether it got it (``+``) or was refused (``-``), and stays until it is killed."""
    pid = os.fork()
    if pid == 0:
        try:
            os.close(gate[1])
            os.read(gate[0], 1)
            try:
                hold_folder(folder)
                os.write(out, b"+")
            except ConfigError:
                os.write(out, b"-")
            time.sleep(120)
        finally:
            os._exit(0)
    return pid


def _at_once(folder: Path, n: int, out: int) -> list[int]:
    """``n`` forked processes that try to hold ``folder`` at one moment (:func:`_forked`)."""
    gate = os.pipe()
    pids = [_forked(folder, gate, out) for _ in range(n)]
    os.close(gate[1])  # all go
    os.close(gate[0])
    return pids


def test_runs_taking_over_a_killed_runs_folder_at_once_get_one_holder(tmp_path: Path) -> None:
    # each of two runs started at once on a killed run's folder removed its lock as stale and made
    # its own, and both wrote there (4 runs at once: 4 trials in 20 had two holders)
    said, out = os.pipe()
    try:
        for trial in range(20):
            folder = tmp_path / str(trial)
            (killed,) = _at_once(folder, 1, out)
            assert os.read(said, 1) == b"+"
            os.kill(killed, signal.SIGKILL)
            os.waitpid(killed, 0)
            runs = _at_once(folder, 4, out)
            try:
                got = b"".join(os.read(said, 1) for _ in runs)
            finally:
                for pid in runs:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            assert got.count(b"+") == 1, f"trial {trial}: {got.count(b'+')} of 4 runs hold the folder"
    finally:
        os.close(said)
        os.close(out)


def test_a_forked_child_letting_go_leaves_its_parents_hold(tmp_path: Path) -> None:
    # a forked child shares its parent's lock: its release (or its exit) must not end the parent's
    hold_folder(tmp_path)
    try:
        child = os.fork()
        if child == 0:
            try:
                release_folder(tmp_path)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        assert (tmp_path / LOCK_NAME).is_file()
        other = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path)], capture_output=True, text=True,
                               env=subprocess_env(), cwd=ROOT, timeout=60)
        assert other.returncode == 1 and f"another run is writing in {tmp_path} (pid {os.getpid()} on " in other.stderr
    finally:
        release_folder(tmp_path)
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_file_left_by_a_terminated_run_never_refuses_the_next(tmp_path: Path) -> None:
    # a run ended by SIGTERM (plan.py has no handler: no exit handlers run) leaves its lock file;
    # the next run took it over only while no process had its pid, and was refused once one had
    proc = holder(tmp_path)
    proc.terminate()
    proc.wait()
    lock = tmp_path / LOCK_NAME
    left = json.loads(lock.read_text())
    assert left["pid"] == proc.pid
    lock.write_text(json.dumps({**left, "pid": os.getppid()}))  # its pid given to a live process since
    try:
        hold_folder(tmp_path)
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        release_folder(tmp_path)


def test_a_launchers_rank_whose_dated_folder_a_live_run_holds_is_refused_in_one_line(tmp_path: Path) -> None:
    # a launcher's rank (RANK and WORLD_SIZE set, no torchrun store) keeps outputs/<date>/<time>
    # as its clock names it; where a run started in the same second held it, Hydra, reading the
    # folder before the recipe's own handlers, showed a traceback for the refusal. Every folder
    # the next minute would name is held here, as by such a run.
    from datetime import datetime, timedelta

    now = datetime.now()
    held = [tmp_path / base / f"{now + timedelta(seconds=s):%Y-%m-%d/%H-%M-%S}" for s in range(90)
            for base in ("outputs", "multirun")]
    for folder in held:
        hold_folder(folder)
    try:
        env = {**subprocess_env(), "RANK": "0", "WORLD_SIZE": "1"}
        for script, args, key in (
            (ROOT / "recipes" / "plan.py", ["+topology=zionex", "topology.num_nodes=1"], "hydra.run.dir"),
            (ROOT / "recipes" / "train.py", ["trainer=smoke"], "hydra.run.dir"),
            (ROOT / "recipes" / "plan.py", ["-m", "+topology=zionex", "topology.num_nodes=1,2"], "hydra.sweep.dir"),
        ):
            proc = forked.run(script, *args, env=env, cwd=tmp_path, timeout=120)
            assert proc.returncode == 2, proc.stderr[-2000:]
            line = proc.stderr.strip().splitlines()[-1]
            base = "multirun" if key == "hydra.sweep.dir" else "outputs"
            assert line.startswith(f"error: another run is writing in {tmp_path / base}") and \
                f"(pid {os.getpid()} on " in line and f"choose another folder ({key}=...)" in line, proc.stderr
            assert "Traceback" not in proc.stderr
        assert all(sorted(p.name for p in folder.iterdir()) == [LOCK_NAME] for folder in held)  # no .hydra/, no log
    finally:
        for folder in held:
            release_folder(folder)


def test_torchruns_other_ranks_write_nothing_in_a_folder_rank_0_is_refused(tmp_path: Path) -> None:
    # rank 0 was refused the folder, but rank 1 went on into Hydra, which wrote its .hydra/
    # records (over the live run's) and an empty train.log there before torchrun stopped it.
    # Rank 0 starts 3 s late here, so rank 1 is first to reach Hydra
    from tests.distributed.multi_process import free_port

    run = tmp_path / "run"
    late = tmp_path / "late"
    late.mkdir()
    (late / "sitecustomize.py").write_text("import os, time\nif os.environ.get('RANK') == '0':\n    time.sleep(3.0)\n")
    proc = holder(run)
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node=2", f"--master-port={free_port()}",
             str(ROOT / "recipes" / "train.py"), "trainer=smoke", f"hydra.run.dir={run}"],
            cwd=tmp_path, env=subprocess_env(late), capture_output=True, text=True, timeout=300)
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME], done.stderr[-3000:]  # no .hydra/, no log
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith("error: another run is writing in")]
    assert len(refusals) == 1 and f"(pid {proc.pid} on " in refusals[0], done.stderr[-3000:]  # rank 0's, once
    assert "heard nothing from rank 0" not in done.stderr
    assert f'File "{ROOT / "neo_core"}' not in done.stderr and f'File "{ROOT / "recipes"}' not in done.stderr  # no rank's traceback


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="runs a process as another user")
def test_another_users_run_is_refused_and_its_lock_file_left_behind_taken() -> None:
    # another user's lock file (not this user's to write) left the folder not held: live or not
    def as_nobody(folder: Path) -> bytes:
        said, out = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                folder_lock._HELD.clear()  # a process of its own, not a fork that holds its parent's folders
                os.setgid(65534)
                os.setuid(65534)
                try:
                    hold_folder(folder)
                    os.write(out, b"held" if str(folder) in folder_lock._HELD else b"not held")
                except ConfigError as exc:
                    os.write(out, str(exc).encode())
            finally:
                os._exit(0)
        os.close(out)
        os.waitpid(pid, 0)
        with os.fdopen(said, "rb") as got:
            return got.read()

    with tempfile.TemporaryDirectory() as tmp:  # pytest's own are this user's alone
        run = Path(tmp) / "run"
        hold_folder(run)
        Path(tmp).chmod(0o755)
        run.chmod(0o777)
        try:
            assert as_nobody(run).startswith(f"another run is writing in {run} (pid {os.getpid()} on ".encode())
        finally:
            os.close(folder_lock._HELD.pop(str(run))[1])  # its lock goes, its file stays: as if killed
        assert as_nobody(run) == b"held"
        assert (run / LOCK_NAME).stat().st_uid == 65534  # made anew, the other user's run's


def test_a_sweeps_jobs_let_go_of_their_folders_as_each_ends(tmp_path: Path) -> None:
    # each job's lock stayed held (an open file) until the sweep's process exited: a sweep of a
    # thousand jobs ran out of open files, and later folders went silently unheld
    from neo_core.cli import SweepFailures
    from neo_core.run_folders import hold_job_folder

    sweep = SweepFailures()
    fds = len(os.listdir("/proc/self/fd"))
    for num in range(20):
        out = tmp_path / str(num)
        assert sweep.job(lambda out=out: str(out) in folder_lock._HELD, out, num, f"x={num}",
                         before=lambda out=out: hold_job_folder(out)) is True  # held while the job ran
        assert str(out) not in folder_lock._HELD and not (out / LOCK_NAME).exists()
    assert len(os.listdir("/proc/self/fd")) <= fds


def test_a_link_in_the_lock_files_place_is_removed_not_written_through(tmp_path: Path) -> None:
    # O_CREAT followed a .neo-running link, and the lock's JSON replaced its target's contents
    precious = tmp_path / "precious.txt"
    precious.write_text("important data\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(precious)
    hold_folder(tmp_path / "run")
    try:
        assert precious.read_text() == "important data\n"
        lock = tmp_path / "run" / LOCK_NAME
        assert not lock.is_symlink() and json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        release_folder(tmp_path / "run")


@pytest.mark.parametrize("said", ["ten", "0", "-5", "inf"])
def test_a_bad_wait_for_rank_0s_word_is_refused_naming_the_variable(monkeypatch, said: str) -> None:
    # it was read in three places, each with a bare float(): "ten" ended in a ValueError traceback
    from neo_core import run_folders

    monkeypatch.setattr(run_folders, "_STORE", [])
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("NEO_RUN_DIR_TIMEOUT_S", said)
    with pytest.raises(ConfigError, match=rf"^NEO_RUN_DIR_TIMEOUT_S='{said}': give the seconds a rank waits for rank "
                                          r"0's word on the run's folder, a number above 0 \(600 where it is not set\)"):
        run_folders._launch_store()
    # each rank's use of the store refuses it too: the refusal was swallowed as the store's
    # silence, and the ranks went on in folders of their own
    for use in (run_folders._wait_for_rank0, lambda: run_folders._tell_ranks(""),
                lambda: run_folders._rank0s_name("outputs", "outputs/day/time")):
        with pytest.raises(ConfigError, match=r"^NEO_RUN_DIR_TIMEOUT_S="):
            use()


def test_a_config_naming_the_hold_at_its_former_place_still_finds_it() -> None:
    # a run's saved .hydra/config.yaml from before the run-folder code moved names
    # neo_core.cli.HoldRunFolder as its callback's target
    from hydra.utils import get_class

    from neo_core.run_folders import HoldRunFolder

    assert get_class("neo_core.cli.HoldRunFolder") is HoldRunFolder
