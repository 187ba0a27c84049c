"""The ``local`` topology over several machines like this one: as torchrun launches over them,
emulated on this one, or dry-run; and ``neo calibrate`` measuring the network between them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neo_core.errors import ConfigError
from neo_core.topology import GB
from neo_plugins.topology.local import _total_ram, local_topology
from tests.conftest import subprocess_env
from tests.distributed.multi_process import free_port

ROOT = Path(__file__).resolve().parents[1]


def _launch(monkeypatch, world: int | None, local: int | None, machines: int | None = None) -> None:
    """This process as rank 0 of a launch of ``world`` ranks, ``local`` on its machine (None:
    unset), on ``machines`` machines (torchrun's ``GROUP_WORLD_SIZE``; None: unset)."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "NEO_SPAWNED"):
        monkeypatch.delenv(key, raising=False)
    if world is not None:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(world))
    if local is not None:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    if machines is not None:
        monkeypatch.setenv("GROUP_WORLD_SIZE", str(machines))


def test_machines_split_the_ranks_and_each_machine_its_own_memory() -> None:
    one = local_topology(world_size=4, compute_device="cpu")
    two = local_topology(world_size=4, num_nodes=2, compute_device="cpu")
    assert (one.num_nodes, one.devices_per_node) == (1, 4)
    assert (two.num_nodes, two.devices_per_node) == (2, 2)
    # a machine's RAM over its own 2 ranks, where one machine's was split 4 ways
    assert two.device_memory == int(_total_ram() * 0.5 / 2) == pytest.approx(2 * one.device_memory, abs=1)
    # world_size unset: 2 CPU ranks a machine, as on one
    assert local_topology(num_nodes=3, compute_device="cpu").world_size == 6
    assert local_topology(num_nodes=2.0, world_size=4.0, compute_device="cpu").devices_per_node == 2  # 2.0 is 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"world_size": 5, "num_nodes": 2},
         "topology.world_size=5 rank(s) do not split evenly over topology.num_nodes=2 machines: give a multiple of 2"),
        ({"num_nodes": 0}, "topology.num_nodes must be a whole number of machines, at least 1; got 0."),
        ({"num_nodes": 1.5}, "topology.num_nodes must be a whole number of machines, at least 1; got 1.5."),
        ({"num_nodes": 2, "inter_node_bw_gbps": 0}, "topology.inter_node_bw_gbps must be a positive number of GB/s"),
        ({"num_nodes": 2, "inter_node_bw_gbps": "fast"}, "topology.inter_node_bw_gbps must be a positive number"),
        ({"inter_node_bw_gbps": 10},
         "topology.inter_node_bw_gbps=10 is the network between machines, but this topology is one machine"),
        # named as given, in GB/s: not as a calibration file's figure (there is none)
        ({"num_nodes": 2, "inter_node_bw_gbps": 0.0001},
         "topology.inter_node_bw_gbps=0.0001 GB/s is under 1 MB/s (0.001 GB/s); give it in GB/s."),
        ({"num_nodes": 2, "inter_node_bw_gbps": 2e6},
         "topology.inter_node_bw_gbps=2000000.0 GB/s is over 1 PB/s (1,000,000 GB/s), faster than any link"),
    ],
    ids=["uneven", "no-machines", "half-a-machine", "zero-network", "text-network", "network-of-one-machine",
         "bytes-as-gb", "gb-as-bytes"],
)
def test_bad_machine_settings_are_refused_naming_the_key(settings, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        local_topology(compute_device="cpu", **settings)


def test_the_network_is_assumed_unless_measured_between_machines_or_given(tmp_path, monkeypatch) -> None:
    # a calibration of one machine writes its ranks' loopback as inter_node_bw (2.5 GB/s here):
    # not the network's, so several machines plan with an assumed figure, and say so
    path = tmp_path / "calibration.json"
    one_machine = {"intra_node_bw": 2.5 * GB, "inter_node_bw": 2.5 * GB, "ranks": 2}
    path.write_text(json.dumps(one_machine))
    monkeypatch.setenv("NEO_CALIBRATION", str(path))
    alone = local_topology(world_size=2, compute_device="cpu")
    assert alone.inter_node_bw == 2.5 * GB and alone.notes == ()  # one machine: as the file says
    two = local_topology(num_nodes=2, compute_device="cpu")
    assert two.inter_node_bw == pytest.approx(1.25 * GB / 2)  # 10 Gb/s a machine, over its 2 ranks
    assert "inter_node_bw" in two.assumed and "*" in two.describe().splitlines()[2].split("inter-node")[1]
    assert two.notes == (
        # a figure of the network typed into the file by hand is not dropped without a word
        "the calibration file's inter_node_bw (2.5 GB/s) is not planned with: the file does not record it as "
        "measured between machines (inter_node_machines), so it is its ranks' loopback on one machine; a network's "
        "figure of your own is topology.inter_node_bw_gbps.",
        "inter_node_bw, the network between the 2 machines, is assumed: 0.625 GB/s a rank (10 Gb/s a machine over "
        "its 2 rank(s)); measure it with `neo calibrate` run by torchrun on every machine (docs/cost_model.md, "
        "\"Several machines\"), or give topology.inter_node_bw_gbps.",)
    # never faster than inside a machine (the planner would keep traffic off the machine's links)
    path.write_text(json.dumps({**one_machine, "intra_node_bw": 0.4 * GB}))
    capped = local_topology(num_nodes=2, world_size=2, compute_device="cpu")
    assert capped.inter_node_bw == 0.4 * GB  # 10 Gb/s a machine, one rank each: 1.25 GB/s, capped
    assert "is assumed: 0.4 GB/s a rank (10 Gb/s a machine over its 1 rank(s), capped at intra_node_bw, the figure " \
           "inside a machine)" in capped.notes[-1]

    # measured between machines: planned with, and its source said
    path.write_text(json.dumps({**one_machine, "inter_node_bw": 0.9 * GB, "inter_node_machines": 2,
                                "inter_node_ranks_per_machine": 2, "inter_node_measured_at": 1.8e9}))
    measured = local_topology(num_nodes=2, compute_device="cpu")
    assert measured.inter_node_bw == 0.9 * GB and "inter_node_bw" not in measured.assumed
    assert measured.sources["inter_node_bw"].startswith("measured between 2 machines of 2 rank(s), 2027-")
    assert "; its network figure measured between 2 machines of 2 rank(s)" in measured.describe()
    # where it came from is in the plan's notes (plan.txt), as an assumed one's is
    assert len(measured.notes) == 1 and measured.notes[0].startswith(
        "inter_node_bw 0.9 GB/s a rank, the network between the 2 machines: measured between 2 machines of 2 rank(s)")
    # with another number of ranks a machine than will share its network, or of machines: said
    four = local_topology(num_nodes=2, world_size=8, compute_device="cpu")
    assert four.inter_node_bw == 0.9 * GB
    assert four.notes[1:] == ("inter_node_bw was measured with 2 rank(s) a machine sending at once, and this topology "
                              "has 4: re-run `neo calibrate` by torchrun with --nproc-per-node=4 on every machine for "
                              "their share of the network.",)
    assert "inter_node_bw was measured between 2 machines, and this topology has 3." in \
        local_topology(num_nodes=3, world_size=6, compute_device="cpu").notes
    # measured with both "machines" on one host (torchrun started twice there): said in every plan
    path.write_text(json.dumps({**one_machine, "inter_node_bw": 0.9 * GB, "inter_node_machines": 2,
                                "inter_node_ranks_per_machine": 2, "inter_node_hosts": 1}))
    assert "inter_node_bw was measured on 1 host(s) standing for 2 machines: their loopback, not a network's " \
           "figure." in local_topology(num_nodes=2, compute_device="cpu").notes
    # given: over any file, and said where it came from
    given = local_topology(num_nodes=2, compute_device="cpu", inter_node_bw_gbps=3)
    assert given.inter_node_bw == 3 * GB and given.sources["inter_node_bw"] == "given: topology.inter_node_bw_gbps=3"
    assert "network figure" not in given.describe()
    assert given.notes == ("inter_node_bw 3 GB/s a rank, the network between the 2 machines: given: "
                           "topology.inter_node_bw_gbps=3.",)


def test_measured_figures_of_a_machine_slower_inside_than_between_are_not_called_swapped(tmp_path, monkeypatch,
                                                                                         capsys) -> None:
    # both from neo calibrate: a machine's loopback can be slower than its network; the warning
    # that the two look swapped is for figures someone typed
    from neo_core.registry import doubt_bandwidths

    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"intra_node_bw": 0.75 * GB, "inter_node_bw": 1.07 * GB, "inter_node_machines": 2,
                                "inter_node_ranks_per_machine": 2}))
    monkeypatch.setenv("NEO_CALIBRATION", str(path))
    monkeypatch.delenv("RANK", raising=False)
    doubt_bandwidths(local_topology(num_nodes=2, compute_device="cpu"), "topology=local")
    assert "are the two swapped" not in capsys.readouterr().err
    doubt_bandwidths(local_topology(num_nodes=2, world_size=6, compute_device="cpu", inter_node_bw_gbps=1.07),
                     "topology=local")  # one given: said
    assert "are the two swapped" in capsys.readouterr().err


def test_a_networks_gbits_given_as_gbytes_is_warned_of(capsys) -> None:
    local_topology(num_nodes=2, compute_device="cpu", inter_node_bw_gbps=400)
    assert ("warning: topology.inter_node_bw_gbps=400 is GB/s (bytes) per rank, 3,200 Gb/s: faster than any network "
            "card; a network of 400 Gb/s is inter_node_bw_gbps=50.") in capsys.readouterr().err
    local_topology(num_nodes=2, compute_device="cpu", inter_node_bw_gbps=50)
    assert "faster than any network card" not in capsys.readouterr().err


def test_a_calibration_of_one_machine_keeps_the_network_figure_measured_between_machines(tmp_path, monkeypatch,
                                                                                          capsys) -> None:
    # run after the network's calibration (as the docs say to), a plain `neo calibrate` wrote a
    # new file, and plans of several machines went back to an assumed network without a word
    from neo_plugins.sharding.planner import calibrate

    path = tmp_path / "calibration.json"
    network = {"inter_node_bw": 0.9 * GB, "inter_node_machines": 2, "inter_node_ranks_per_machine": 2,
               "inter_node_measured_at": 1.8e9}
    path.write_text(json.dumps({"intra_node_bw": 2.0 * GB, "inter_node_bw": 2.0 * GB, **network}))
    machine = {"intra_node_bw": 2.4 * GB, "inter_node_bw": 2.4 * GB, "ranks": 2, "measured_at": 1.8e9}
    monkeypatch.setattr(calibrate, "calibrate", lambda ranks: dict(machine))  # the 25 s of measuring
    calibrate.main(argv=["--out", str(path)])
    data = json.loads(path.read_text())
    assert data == {**machine, **network}
    assert "note: kept the network figure" in capsys.readouterr().err
    monkeypatch.setenv("NEO_CALIBRATION", str(path))
    assert local_topology(num_nodes=2, compute_device="cpu").inter_node_bw == 0.9 * GB
    # a file of one machine's figures only: replaced as before
    path.write_text(json.dumps(machine))
    calibrate.main(argv=["--out", str(path)])
    assert json.loads(path.read_text()) == machine and "kept" not in capsys.readouterr().err
    # a file that is not text, or a network record without its figure: replaced, not a traceback
    # after the measurement
    for content in (b"\xff\xfe\x00binary", json.dumps({"inter_node_machines": 2, "inter_node_bw": None}).encode()):
        path.write_bytes(content)
        calibrate.main(argv=["--out", str(path)])
        assert json.loads(path.read_text()) == machine
    assert calibrate._merged(path.with_name("x.bin"), {"a": 1}) == {"a": 1}
    path.write_bytes(b"\xff\xfe\x00binary")
    assert calibrate._merged(path, {"inter_node_bw": 1.0}) == {"inter_node_bw": 1.0}


def test_a_launch_over_machines_is_the_local_topologys_machines(monkeypatch) -> None:
    from neo_core.config import validate
    from neo_core.training.run import build_parts, resolve_launch
    from tests.test_config import compose_run

    with _hydra():
        _launch(monkeypatch, 4, 2)  # torchrun --nnodes=2 --nproc-per-node=2
        run = validate(compose_run("+topology.compute_device=cpu"))
        launch = resolve_launch(run)
        topology = build_parts(run, launch).topology
        assert (topology.num_nodes, topology.devices_per_node) == (2, 2)
        assert topology.device_memory == int(_total_ram() * 0.5 / 2)
        # a number of machines the launch does not have: refused, naming what the launch says
        with pytest.raises(ConfigError, match=r"^topology.num_nodes=3 but the launcher started 4 rank\(s\) on 2 "
                                              r"machine\(s\) \(WORLD_SIZE=4, LOCAL_WORLD_SIZE=2\)"):
            resolve_launch(validate(compose_run("+topology.compute_device=cpu", "+topology.num_nodes=3")))
        resolve_launch(validate(compose_run("+topology.compute_device=cpu", "+topology.num_nodes=2")))
        # one machine of 4: as before
        _launch(monkeypatch, 4, 4)
        launch = resolve_launch(run)
        assert build_parts(run, launch).topology.num_nodes == 1
        # a launcher that does not say its ranks a machine: the setting is taken as given
        _launch(monkeypatch, 4, None)
        two = validate(compose_run("+topology.compute_device=cpu", "+topology.num_nodes=2"))
        assert build_parts(two, resolve_launch(two)).topology.num_nodes == 2


@pytest.mark.parametrize(
    ("launch", "overrides", "message"),
    [
        # the key given is named, not the topology's copy of it
        (None, ("trainer.world_size=3", "+topology.num_nodes=2"),
         "trainer.world_size=3 rank(s) do not split evenly over topology.num_nodes=2 machines: give a multiple of 2."),
        (None, ("+topology.num_nodes=abc",), "topology.num_nodes must be a whole number of machines, at least 1; got 'abc'."),
        # torchrun with 3 ranks on one machine and 1 on another: not "one machine"
        # unequal machines are refused by the recipes with or without num_nodes (Lightning forms
        # its nodes of one size, and failed in every rank after planning)
        ((4, 3), ("+topology.num_nodes=2",),
         "The launch runs 4 ranks, 3 on this machine (WORLD_SIZE=4, LOCAL_WORLD_SIZE=3): the recipes run as many "
         "ranks on every machine; start each machine with the same torchrun --nproc-per-node."),
        ((3, 1, 2), (), "The launch runs 3 ranks on 2 machines, 1 on this one (WORLD_SIZE=3, GROUP_WORLD_SIZE=2, "
                        "LOCAL_WORLD_SIZE=1): the recipes run as many ranks on every machine"),
    ],
    ids=["trainer-world", "not-a-number", "unequal-machines", "one-then-two"],
)
def test_machine_settings_the_run_cannot_take_are_refused_naming_the_key(monkeypatch, launch, overrides, message):
    from neo_core.config import validate
    from neo_core.training.run import resolve_launch
    from tests.test_config import compose_run

    _launch(monkeypatch, *(launch or (None, None)))
    with _hydra(), pytest.raises(ConfigError) as err:
        resolve_launch(validate(compose_run("+topology.compute_device=cpu", *overrides)))
    assert str(err.value).startswith(message), str(err.value)


def test_machines_are_not_emulated_on_cuda_devices(monkeypatch) -> None:
    # CUDA ranks keep the machine's layout, and the refusal named trainer.world_size
    import torch

    from neo_core.config import validate
    from neo_core.training.run import resolve_launch
    from tests.test_config import compose_run

    _launch(monkeypatch, None, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    with _hydra(), pytest.raises(ConfigError, match=r"^topology.num_nodes=2 on this machine's CUDA devices: machines "
                                                    r"are emulated on one with CPU ranks only"):
        resolve_launch(validate(compose_run("+topology.num_nodes=2")))


def test_machines_emulated_on_this_one_share_its_memory(monkeypatch) -> None:
    from neo_core.config import validate
    from neo_core.training.run import build_parts, resolve_launch
    from tests.test_config import compose_run

    _launch(monkeypatch, None, None)
    with _hydra():
        run = validate(compose_run("+topology.compute_device=cpu", "+topology.num_nodes=2"))
        launch = resolve_launch(run)
        assert launch.world_size == 4 and not launch.external  # 2 CPU ranks a machine
        parts = build_parts(run, launch)
    assert (parts.topology.num_nodes, parts.topology.devices_per_node) == (2, 2)
    # all 4 ranks run here: this machine's memory over 4, not a machine's over 2
    assert parts.topology.device_memory == int(_total_ram() * 0.5 / 2) // 2 == pytest.approx(_total_ram() * 0.5 / 4, abs=2)
    assert parts.topology.config_keys["device_memory"][1] == pytest.approx(_total_ram() / 4)  # memory_fraction=1's
    assert any(n.startswith("Emulating 2 machines of 2 rank(s) on this one: its 4 ranks share its memory")
               for n in parts.notes), parts.notes


def test_a_plan_for_the_least_memory_is_saved_and_said_even_where_its_shards_are_the_same(tmp_path, capsys) -> None:
    # planned again for the smaller machine, the shards came out the same: plan.txt kept the
    # larger machine's capacities, and nothing said the plan was for the least
    from neo_core.sharding import PlanResult, RankReport, TableAssignment
    from neo_core.training.module import plan_digest
    from neo_core.training.run import UNEQUAL_MACHINES, Launch, _record_plan_run

    plan = PlanResult("neo", [TableAssignment("t", "table_wise", "fused", [0], [(10, 4)])],
                      [RankReport(0, memory_capacity=2**30), RankReport(1, memory_capacity=2**30)], 64, {},
                      notes=[f"{UNEQUAL_MACHINES} (1.00GiB to 8.00GiB of device memory a rank): planned for the least"])
    launch = Launch(2, "cpu", "gloo", True, plan_digest=plan_digest(plan))
    _record_plan_run(plan, launch, tmp_path)
    assert "note: the ranks' machines give them unequal memory (1.00GiB to 8.00GiB of device memory a rank): the plan " \
           "above, planned again for the least, puts the same shards on the same ranks" in capsys.readouterr().out
    assert UNEQUAL_MACHINES in (tmp_path / "plan.txt").read_text()
    # alike machines, the same plan: nothing to save again or say
    (tmp_path / "plan.txt").unlink()
    _record_plan_run(PlanResult("neo", plan.tables, plan.ranks, 64, {}), launch, tmp_path)
    assert not (tmp_path / "plan.txt").exists() and capsys.readouterr().out == ""


def _hydra():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from neo_core.config import register_plugin_options
    from neo_core.plugins import load_plugins

    conf = ROOT / "conf"
    register_plugin_options(conf, plugins=load_plugins(autoload=False))
    GlobalHydra.instance().clear()
    return initialize_config_dir(config_dir=str(conf), version_base="1.3")


def test_calibrate_under_a_launch_on_one_machine_is_refused_and_ranks_are_torchruns(monkeypatch, capsys) -> None:
    from neo_plugins.sharding.planner import calibrate

    _launch(monkeypatch, 2, 2)  # torchrun --nproc-per-node=2 on one machine: each rank would measure it
    with pytest.raises(SystemExit):
        calibrate.main(argv=[])
    assert ("started as one of 2 ranks on one machine (LOCAL_WORLD_SIZE=2): run neo calibrate without torchrun to "
            "measure this machine") in capsys.readouterr().err
    _launch(monkeypatch, 4, 2)
    with pytest.raises(SystemExit):
        calibrate.main(argv=["--ranks", "4"])
    assert "--ranks is for one machine; under torchrun over several machines the ranks are torchrun's" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):  # it was ignored without a word
        calibrate.main(argv=["--nice", "5"])
    assert "--nice is for one machine's measurement; the network's is measured without it" in capsys.readouterr().err


def test_calibrate_as_torchruns_one_rank_starts_its_ranks_off_torchruns_store(tmp_path, monkeypatch) -> None:
    # `torchrun --nproc-per-node=1 neo calibrate`: the ranks it starts inherited torchrun's
    # TORCHELASTIC_USE_AGENT_STORE and waited 300 s for a store that has no server
    from neo_plugins.sharding.planner import calibrate

    _launch(monkeypatch, 1, 1)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    seen = []
    monkeypatch.setattr(calibrate, "calibrate",
                        lambda ranks: seen.append(os.environ.get("TORCHELASTIC_USE_AGENT_STORE")) or {"ranks": ranks})
    calibrate.main(argv=["--out", str(tmp_path / "cal.json")])
    assert seen == [None] and json.loads((tmp_path / "cal.json").read_text()) == {"ranks": 2}


@pytest.mark.slow
def test_calibrate_then_train_over_two_machines_launched_by_torchrun(tmp_path) -> None:
    # two torchrun agents on this host stand for two machines (--nnodes=2): the network figure
    # neo calibrate measures between them is planned with, and a plan that splits tables over
    # the machines (table-row-wise, node by node) trains
    env = subprocess_env()
    shared = tmp_path / "shared.json"  # the calibration file is a link to it: the file written, the link kept
    shared.write_text(json.dumps({"intra_node_bw": 2.5 * GB, "inter_node_bw": 2.5 * GB, "ranks": 2,
                                  "lookup_fwd_id_s": 1e-8}))
    cal = tmp_path / "calibration.json"
    cal.symlink_to(shared)
    env["NEO_CALIBRATION"] = str(cal)
    torchrun = str(Path(sys.executable).parent / "torchrun")

    def agents(per_machine: int, *command: str, second: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
        port = free_port()
        procs = [subprocess.Popen(
            [torchrun, "--nnodes=2", f"--node-rank={node}", f"--nproc-per-node={per_machine}",
             "--master-addr=127.0.0.1", f"--master-port={port}", *command],
            cwd=tmp_path, env={**env, **(second or {})} if node else env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for node in (0, 1)]
        done = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done

    # a machine whose file cannot be written (a file where its folder would be): both stop at
    # once, naming it, and measure nothing
    (tmp_path / "wall").write_text("")
    node0, node1 = agents(1, "-m", "neo_plugins.sharding.planner.calibrate",
                          second={"NEO_CALIBRATION": str(tmp_path / "wall" / "cal.json")})
    for node in (node0, node1):
        assert node.returncode != 0 and "error: on " in node.stderr and "cannot write the calibration to" in \
            node.stderr, node.stderr[-2000:]
    assert "measuring the network" not in node0.stderr

    node0, node1 = agents(1, "-m", "neo_plugins.sharding.planner.calibrate")
    assert node0.returncode == node1.returncode == 0, node0.stderr[-2000:] + node1.stderr[-2000:]
    assert "measuring the network between 2 machines (1 rank(s) each" in node0.stderr
    # both agents on this host, as by mistake: said
    assert "warning: the 2 machines are 1 host(s) (" in node0.stderr
    assert cal.is_symlink()
    data = json.loads(cal.read_text())
    assert data["inter_node_machines"] == 2 and data["inter_node_ranks_per_machine"] == 1
    assert data["inter_node_hosts"] == 1  # remembered: plans say the figure is a loopback's
    # the other machine says what it wrote too
    assert f"wrote {cal} on this machine (" in node1.stdout, node1.stdout[-2000:]
    assert data["lookup_fwd_id_s"] == 1e-8 and data["intra_node_bw"] == 2.5 * GB  # the machine's kept
    assert 1e6 < data["inter_node_bw"] < 1e12
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".shared.json")]  # no part left

    # training over both, stopped by a Ctrl-C on the first machine alone: the other machine's
    # ranks stop after the same step, and its first rank says so (its log had torchrun's exit
    # code only)
    run_dir = tmp_path / "run"
    port = free_port()
    procs = [subprocess.Popen(
        [torchrun, "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2", "--master-addr=127.0.0.1",
         f"--master-port={port}", "--shutdown-timeout=120", str(ROOT / "recipes" / "train.py"), "trainer=smoke",
         "trainer.max_steps=100000", "trainer.checkpoint=true", "trainer.checkpoint_every_n_steps=3",
         "trainer.log_every_n_steps=2", "+topology.compute_device=cpu", "sharding.sharding_types=[TWRW,DP]",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for node in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoint" / "meta.json").exists() and time.monotonic() < deadline and \
                all(p.poll() is None for p in procs):
            time.sleep(0.2)
        os.killpg(procs[0].pid, signal.SIGINT)  # as the first machine's terminal sends it
        (_, err0), (_, err1) = (p.communicate(timeout=240) for p in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    step = json.loads((run_dir / "checkpoint" / "meta.json").read_text())["step"]
    assert f"interrupted: stopped after step {step} of 100000" in err0, err0[-3000:]
    assert f"interrupted: stopped after step {step} of 100000: checkpoint at step {step}" in err1 and \
        "(rank 2, this machine's first, stopped with the others)" in err1, err1[-3000:]
    assert "rank 3" not in err1  # one line a machine
    # two agents on one host: their ranks share its cores and memory, which each took as its machine's
    assert "warning: ranks 0, 1, 2, 3 run on one host (" in err0 and "they share its cores and its memory" in err0, \
        err0[-3000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["topology"]["num_nodes"], plan["topology"]["devices_per_node"]) == (2, 2)
    assert plan["topology"]["inter_node_bw"] == data["inter_node_bw"]
    assert {t["sharding_type"] for t in plan["tables"]} >= {"table_row_wise"}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["steps"] == step and metrics["world_size"] == 4
