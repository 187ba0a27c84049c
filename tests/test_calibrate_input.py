"""Calibration's bad input and failing ranks end in one sentence, before measuring or at once."""

from __future__ import annotations

import time

import pytest

from neo_core.errors import CalibrationError, ConfigError
from neo_plugins.sharding.planner import calibrate
from tests import forked
from tests.conftest import subprocess_env


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
        (("--out", "/"), "cannot write the calibration to / (/ is a folder: give a file in it, e.g. /calibration.json)"),
        (("--out", ""), "--out is empty; give a file path"),  # not the default file every local plan reads
    ],
    ids=["ranks-3", "ranks-1", "negative-nice", "folder-is-a-file", "a-folder", "empty-out"],
)
def test_bad_arguments_are_one_line_before_measuring(args, fragment, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    args = [a.format(file=tmp_path / "file") for a in args]
    proc = forked.run("-m", "neo_plugins.sharding.planner.calibrate", *args, env=subprocess_env(), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in proc.stderr.splitlines()[-1], proc.stderr


def test_an_empty_output_path_is_refused_not_the_default(capsys) -> None:
    # `neo calibrate --output ''` used to write the machine's default file, changing the local
    # topology of every later run
    from neo_core.cli import main as neo_main

    with pytest.raises(SystemExit) as exit_:
        neo_main(["calibrate", "--output", " "])
    assert exit_.value.code == 2
    assert "neo calibrate --output is empty" in capsys.readouterr().err


def test_a_write_that_fails_after_measuring_keeps_the_figures(monkeypatch, capsys, tmp_path) -> None:
    # a path that passes the check but refuses the write (/proc, a full disk) used to end in a
    # traceback, the measurements lost
    from pathlib import Path

    monkeypatch.setattr(calibrate, "calibrate", lambda ranks: {"device_memory_bw": 1e10})

    def refuse(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", refuse)
    with pytest.raises(CalibrationError, match=r"cannot write the calibration to .*cal.json \(No space left on device\)"):
        calibrate.main(str(tmp_path / "cal.json"))
    assert '"device_memory_bw": 10000000000.0' in capsys.readouterr().out


def test_a_per_id_cost_the_fit_clamped_at_zero_is_warned_of_as_it_is_written(monkeypatch, capsys, tmp_path) -> None:
    # a busy machine's fit put the forward intercept below zero; it was stored as 0 without a word,
    # and plans with the file priced that per-id work at nothing
    measured = {"device_memory_bw": 1e10, "lookup_fwd_id_s": 0.0, "lookup_bwd_id_s": 2e-8}
    monkeypatch.setattr(calibrate, "calibrate", lambda ranks: dict(measured))
    calibrate.main(str(tmp_path / "cal.json"))
    err = capsys.readouterr().err
    assert "warning: lookup_fwd_id_s came out at or below zero in the fit and were stored as 0, as on a busy " \
           "machine: plans with this file price that per-id work at nothing" in err, err
    assert "lookup_bwd_id_s came out" not in err
    measured["lookup_fwd_id_s"] = 3e-8  # both measured: nothing said
    calibrate.main(str(tmp_path / "cal2.json"))
    assert "came out at or below zero" not in capsys.readouterr().err


def test_neo_calibrate_takes_the_measurements_flags_and_says_how_to_use_its_file(monkeypatch, capsys, tmp_path) -> None:
    # `neo calibrate --ranks 4` was refused as an unknown argument; the file it wrote was not
    # said how to use, and its time was printed as 1.79646e+09
    from neo_core.cli import main as neo_main

    asked = []
    monkeypatch.setattr(calibrate, "calibrate", lambda ranks: asked.append(ranks) or {
        "device_memory_bw": 1e10, "measured_at": time.mktime((2026, 12, 5, 9, 30, 0, 0, 0, -1))})
    out = tmp_path / "cal.json"
    assert neo_main(["calibrate", "--output", str(out), "--ranks", "4"]) == 0
    said = capsys.readouterr()
    shown = said.out.splitlines()
    assert asked == [4] and out.is_file()
    # what runs is said before the measurements start (about 15 s of silence otherwise), and
    # how long on an idle machine: a busy one took 61 s where it was said to take 15
    assert ("measuring this machine's memory bandwidth, lookup rate, gloo collectives and compression's codec on 4 ranks (about 20 s on "
            "an idle machine, longer on a busy one) ...") in said.err
    assert shown[-2:] == ["             measured_at: 2026-12-05 09:30:00",
                          f"wrote {out}: plan with it by topology.calibration={out} (or NEO_CALIBRATION={out})"]
    with pytest.raises(SystemExit):
        neo_main(["calibrate", "--output", str(tmp_path)])
    assert f"({tmp_path} is a folder: give a file in it, e.g. {tmp_path / 'calibration.json'})" in capsys.readouterr().err


def test_neo_calibrate_names_itself_and_its_flags(capsys) -> None:
    # a bad flag to `neo calibrate` showed the module's usage: "neo [--out OUT] ..."
    from neo_core.cli import main as neo_main

    with pytest.raises(SystemExit) as exit_:
        neo_main(["calibrate", "--ranks", "3", "--output", "/tmp/unused.json"])
    assert exit_.value.code == 2
    usage, error = capsys.readouterr().err.splitlines()[-2:]
    assert usage.startswith("usage: neo calibrate [-h] [--output OUTPUT] [--ranks RANKS]"), usage
    assert error.startswith("neo calibrate: error: --ranks 3: use a power of two"), error


def test_a_figure_no_cpu_gives_is_warned_of_with_its_plausible_range(tmp_path, capsys) -> None:
    # a hand edit in other units (ms per id, GB/s) plans as given, but not without a word
    from neo_plugins.topology.local import PLAUSIBLE, local_topology

    path = tmp_path / "calibration.json"
    path.write_text('{"device_memory_bw": 9e9, "lookup_bwd_id_s": 0.43, "intra_node_bw": 2e9, "inter_node_bw": 2e9}')
    topo = local_topology(compute_device="cpu", calibration=str(path))
    assert topo.lookup_bwd_id_s == 0.43  # planned with as given
    err = capsys.readouterr().err
    assert f"warning: calibration file {path}: lookup_bwd_id_s=0.43 s (plausible: 0 s to 1e-05 s)" in err, err
    assert "device_memory_bw" not in err and err.count("warning") == 1  # in range: not named
    # a figure of each kind at its range's ends passes; 0 means not measured, never warned of
    path.write_text(str({k: high for k, (_, high) in PLAUSIBLE.items()}).replace("'", '"'))
    local_topology(compute_device="cpu", calibration=str(path))
    path.write_text('{"device_memory_bw": 0, "host_memory_bw": 4e12}')  # 4 TB/s: a figure in bits/s?
    local_topology(compute_device="cpu", calibration=str(path))
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "host_memory_bw=4e+03 GB/s (plausible: 0.5 GB/s to 80 GB/s)" in err, err
    # a bandwidth given in GB/s (11.5) is refused as a slip of units; it was first warned of as
    # planned with (1.15e-08 GB/s), which the error then contradicted
    path.write_text('{"device_memory_bw": 11.5}')
    with pytest.raises(ConfigError, match=r"gives device_memory_bw=11.5, under 1 MB/s: its bandwidths are bytes/s"):
        local_topology(compute_device="cpu", calibration=str(path))
    assert "warning" not in capsys.readouterr().err
    # over 1 PB/s (a fit of a busy machine's timings that came out flat): refused naming the file,
    # where Topology's own refusal named none, and every run on the machine reads this file
    path.write_text('{"device_memory_bw": 2e15}')
    with pytest.raises(ConfigError, match=rf"^Calibration file {path} gives device_memory_bw=2e\+15 bytes/s, over "
                                          r"1 PB/s, .*re-run `neo calibrate` on a quiet machine, or delete the file\.$"):
        local_topology(compute_device="cpu", calibration=str(path))
    assert "warning" not in capsys.readouterr().err


def test_a_figure_no_cpu_gives_is_in_the_plans_notes_as_well_as_on_the_console(tmp_path) -> None:
    # the warning went to the console and plan.log only: plan.txt and plan.json, kept and
    # shared, gave the plan without a word of the figure it was made with
    import json

    from tests.conftest import ROOT

    path = tmp_path / "calibration.json"
    path.write_text('{"device_memory_bw": 2e11, "intra_node_bw": 2e9, "inter_node_bw": 2e9}')  # 200 GB/s
    out = tmp_path / "plan"
    proc = forked.run(ROOT / "recipes" / "plan.py", "topology.compute_device=cpu", f"topology.calibration={path}",
                      "model=production_like", "plan_model.params.num_tables=10", f"hydra.run.dir={out}",
                      env=subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = f"calibration file {path}: device_memory_bw=200 GB/s (plausible: 0.5 GB/s to 80 GB/s)"
    assert f"warning: {said}" in proc.stderr, proc.stderr
    assert f"  note: {said}" in (out / "plan.txt").read_text()
    notes = json.loads((out / "plan.json").read_text())["notes"]
    assert sum(n.startswith(said) for n in notes) == 1, notes


def test_a_calibration_file_that_is_not_an_object_is_named(tmp_path) -> None:
    from neo_plugins.topology.local import local_topology

    bad = tmp_path / "calibration.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"Calibration file .*calibration.json holds a JSON list, not the object"):
        local_topology(compute_device="cpu", calibration=str(bad))
    bad.write_text('{"device_memory_bw": -5}')
    with pytest.raises(ConfigError, match=r"Calibration file .*calibration.json gives device_memory_bw=-5.0, a negative"):
        local_topology(compute_device="cpu", calibration=str(bad))
    # a figure in GB/s: named with the file and the bytes/s to write (it was advice for Python code)
    bad.write_text('{"device_memory_bw": 11.7}')
    with pytest.raises(ConfigError, match=r"Calibration file .*calibration.json gives device_memory_bw=11.7, under 1 "
                                          r"MB/s: its bandwidths are bytes/s \(for 11.7 GB/s write 1.17e\+10\)"):
        local_topology(compute_device="cpu", calibration=str(bad))
    # a misspelt key would leave the assumed figure in place without a word
    bad.write_text('{"devce_memory_bw": 1e10}')
    with pytest.raises(ConfigError, match=r"unknown key 'devce_memory_bw'. Did you mean 'device_memory_bw'\?"):
        local_topology(compute_device="cpu", calibration=str(bad))


def test_a_calibration_key_the_planner_does_not_read_is_said_and_ignored(tmp_path, capsys) -> None:
    from neo_plugins.topology.local import local_topology

    # a note, or a record a newer `neo calibrate` writes, must not stop every CPU plan
    path = tmp_path / "calibration.json"
    path.write_text('{"device_memory_bw": 7e9, "note": "after the BIOS update"}')
    topo = local_topology(compute_device="cpu", calibration=str(path))
    assert topo.device_memory_bw == 7e9
    assert "key 'note' is not one the planner reads; ignored" in capsys.readouterr().err
