"""tests.forked: a command forked from the preloaded server gives what a fresh interpreter gives."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests import forked
from tests.conftest import ROOT, subprocess_env


def cold(*command: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return forked.run(*command, env=env, cwd=cwd, cold=True)


def same_run(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess, *folders: Path) -> None:
    def norm(text: str) -> str:  # the runs' folders and timings differ
        for folder in folders:
            text = text.replace(str(folder), "<folder>")
        return re.sub(r"in \d+\.\d+ s", "in <t> s", text)

    assert [norm(arg) for arg in a.args] == [norm(arg) for arg in b.args]
    assert (a.returncode, norm(a.stdout), norm(a.stderr)) == (b.returncode, norm(b.stdout), norm(b.stderr))


def test_a_forked_plan_is_the_cold_runs(tmp_path: Path) -> None:
    args = ("recipes/plan.py", "+topology=zionex", "topology.num_nodes=1", "model=mlperf_dcnv2")
    warm = forked.run(*args, f"hydra.run.dir={tmp_path / 'warm'}", env=subprocess_env())
    fresh = cold(*args, f"hydra.run.dir={tmp_path / 'cold'}", env=subprocess_env())
    assert fresh.returncode == 0 and "predicted step" in fresh.stdout, fresh.stderr[-2000:]
    same_run(warm, fresh, tmp_path / "warm", tmp_path / "cold")
    assert (tmp_path / "warm" / "plan.log").read_text() == warm.stdout  # the transcript, written at exit


def test_a_forked_refusal_and_a_modules_usage_error_are_the_cold_runs(tmp_path: Path) -> None:
    bad = ("recipes/train.py", "trainer=smoke", "kernel.learning_rate=-1", f"hydra.run.dir={tmp_path}")
    warm = forked.run(*bad, env=subprocess_env())
    assert warm.returncode == 2 and warm.stderr.startswith("error: kernel.learning_rate"), warm.stderr[-2000:]
    same_run(warm, cold(*bad, env=subprocess_env()))
    usage = ("-m", "neo_plugins.sharding.planner.calibrate", "--ranks", "3")
    same_run(forked.run(*usage, cwd=tmp_path, env=subprocess_env()), cold(*usage, cwd=tmp_path, env=subprocess_env()))


def test_what_a_fork_cannot_give_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    # the hash seed and the import path are read as the interpreter starts: a fork would keep the server's
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(hash('neo'), sys.path[0], os.getcwd())\n")
    runs = [forked.run(script, cwd=tmp_path, env=subprocess_env(PYTHONHASHSEED=seed)) for seed in ("1", "2")]
    assert [r.stdout for r in runs] == [cold(str(script), cwd=tmp_path, env=subprocess_env(PYTHONHASHSEED=seed)).stdout
                                        for seed in ("1", "2")]
    assert runs[0].stdout != runs[1].stdout
    # otherwise forked, with the script's folder first on the path, as python puts it
    assert forked.run(script, env=subprocess_env()).stdout.split()[1:] == [str(tmp_path), str(ROOT)]


ENDINGS = {
    "interrupted": "raise KeyboardInterrupt",
    "excepthook": "import sys\nsys.excepthook = lambda t, v, tb: print('hook:', v)\nraise ValueError('x')",
    "exit-text": "raise SystemExit('bye')",
    "exit-big": "raise SystemExit(256 + 3)",
    "unbuffered": "import os, sys\nprint('before', flush=False)\nos.system('echo child')\nprint('after')",
    "time-zone": "import time\nprint(time.strftime('%Z'))",
    "random": "import random\nprint(random.random())",
}


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_odd_endings_and_settings_are_the_cold_runs(name: str, tmp_path: Path) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(ENDINGS[name] + "\n")
    env = subprocess_env(TZ="Asia/Tokyo", PYTHONUNBUFFERED="1")
    warm, fresh = forked.run(script.name, cwd=tmp_path, env=env), cold(script.name, cwd=tmp_path, env=env)
    if name == "random":  # seeded afresh in each fork, as in each interpreter
        assert warm.stdout != forked.run(script.name, cwd=tmp_path, env=env).stdout
        return
    strip = re.compile(r'  File "[^"]*(forked\.py|runpy[^"]*)", line.*\n(    .*\n)*')  # the fork's own frames
    warm.stderr = strip.sub("", warm.stderr)
    same_run(warm, fresh, tmp_path)


def test_a_missing_script_and_a_missing_folder_are_told_as_python_tells_them(tmp_path: Path) -> None:
    same_run(forked.run("no_such.py", cwd=tmp_path, env=subprocess_env()),
             cold("no_such.py", cwd=tmp_path, env=subprocess_env()), tmp_path)
    with pytest.raises(FileNotFoundError):
        forked.run("no_such.py", cwd=tmp_path / "gone", env=subprocess_env())


def test_a_timed_out_command_is_ended_and_the_next_one_runs(tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text("import subprocess, sys, time\nprint('started', flush=True)\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        forked.run(script, env=subprocess_env(), timeout=3)
    assert expired.value.stdout == "started\n"
    again = forked.run(script.with_name("quick.py"), env=subprocess_env())
    assert again.returncode == 2  # the server was replaced; this one ran
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "time.sleep(60)" not in ps  # the command's own child went with it
