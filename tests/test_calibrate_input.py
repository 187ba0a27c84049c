"""Calibration's bad input and failing ranks end in one sentence, before measuring or at once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from neo_core.errors import CalibrationError
from neo_plugins.sharding.planner import calibrate
from tests.conftest import ROOT, subprocess_env


def _failing_rank(rank: int, world: int, port: int, out) -> None:
    if rank == 1:
        raise SystemExit(3)
    time.sleep(60)  # rank 0 waits, as it would in a collective rank 1 never joins


def test_a_failing_rank_stops_the_step_and_is_named() -> None:
    start = time.monotonic()
    with pytest.raises(CalibrationError, match=r"failing_rank on 2 ranks: rank\(s\) 1 \(exit code 3\) failed"):
        calibrate._spawn(_failing_rank, 2)
    assert time.monotonic() - start < 30  # not the 300 s result timeout, nor rank 0's 60 s


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--ranks", "3"), "--ranks 3: use a power of two, at least 2"),
        (("--ranks", "1"), "--ranks 1: use a power of two, at least 2"),
        (("--nice", "-3"), "--nice -3: give how far above normal priority"),
        (("--out", "{file}/cal.json"), "cannot write the calibration to"),
        (("--out", "/"), "cannot write the calibration to /;"),
    ],
    ids=["ranks-3", "ranks-1", "negative-nice", "folder-is-a-file", "a-folder"],
)
def test_bad_arguments_are_one_line_before_measuring(args, fragment, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    args = [a.format(file=tmp_path / "file") for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "neo_plugins.sharding.planner.calibrate", *args],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in proc.stderr.splitlines()[-1], proc.stderr
