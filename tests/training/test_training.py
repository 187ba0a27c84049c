"""End-to-end training: a learnable signal reaches an AUC; resuming reproduces the run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from neo_core.config import TrainerConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def composed(overrides: list[str], output_dir: Path) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"output_dir={output_dir}"])
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def dense_only_auc(data: dict[str, Any], batches: int, global_batch: int) -> float:
    """The AUC of the held-out batches ranked by the synthetic data's true dense logit (the
    labels' other term, the tables' effects, is independent of it): what no table adds to."""
    import torch

    from neo_plugins.data.synthetic import synthetic

    source = synthetic(**{k: v for k, v in data.items() if k != "name"})
    scores, labels = [], []
    for step in range(batches):
        batch = source.global_batch("val", step, global_batch)
        scores.append(batch.dense_features @ source.dense_weights)  # the logit's order: scale > 0
        labels.append(batch.labels)
    score, label = torch.cat(scores), torch.cat(labels).bool()
    ranks = torch.empty_like(score)
    ranks[score.argsort()] = torch.arange(1, len(score) + 1, dtype=score.dtype)  # no ties: continuous
    positives = int(label.sum())
    negatives = len(label) - positives
    return float((ranks[label].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def test_default_trainer_yaml_lists_every_trainer_key() -> None:
    listed = set(yaml.safe_load((CONF / "trainer" / "default.yaml").read_text()))
    assert listed == {f.name for f in dataclasses.fields(TrainerConfig)}


@pytest.mark.slow
def test_two_rank_training_learns_the_hidden_signal(tmp_path: Path) -> None:
    from neo_core.training.run import train

    config = composed(
        ["trainer.max_steps=60", "trainer.batch_size=128", "trainer.val_batches=8",
         "trainer.progress_bar=false", "trainer.checkpoint=false"],
        tmp_path,
    )
    metrics = train(config)
    assert metrics["world_size"] == 2 and metrics["steps"] == 60
    # the sparse features must have been learnt: the held-out batches ranked by the data's own
    # dense logit (the best a model that ignores every table can do) reach about 0.72, as does a model
    # whose lookups all hit one row; this one about 0.79
    dense_only = dense_only_auc(config["data"], batches=8, global_batch=2 * 128)
    assert 0.65 < dense_only < 0.75, dense_only
    assert metrics["val_auc"] >= dense_only + 0.04, (metrics["val_auc"], dense_only)
    losses = [h["loss"] for h in metrics["history"]]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["tables"]) == 26 and len(plan["ranks"]) == 2
    text = (tmp_path / "plan.txt").read_text()  # the printed plan, every table
    assert "predicted step" in text and all(t["name"] in text for t in plan["tables"])
    assert (tmp_path / "training.png").stat().st_size > 0
    assert "train/loss" in (tmp_path / "logs" / "metrics.csv").read_text()


@pytest.mark.slow
def test_two_ranks_train_the_whole_model_as_one_process_does(tmp_path: Path) -> None:
    # the full trainer (DLRM, dense layers under DDP, sharded tables) on 2 ranks of 128 samples
    # against 1 rank of 256: every global batch is the same, so the held-out loss after 40 steps
    # must be too. Row-wise shards on 2 ranks, whole tables on 1. SGD on both sides: a
    # replicated table keeps full Adagrad state where a sharded one keeps row-wise state, so
    # under Adagrad plans with different types train slightly differently by design.
    from neo_core.training.run import train

    common = ["trainer.max_steps=40", "trainer.val_batches=4", "trainer.progress_bar=false",
              "trainer.checkpoint=false", "kernel.optimizer=sgd", "trainer.dense_optimizer=sgd",
              "kernel.learning_rate=1.0", "trainer.dense_learning_rate=1.0"]
    one = train(composed([*common, "trainer.world_size=1", "trainer.batch_size=256"], tmp_path / "one"))
    two = train(composed([*common, "trainer.world_size=2", "trainer.batch_size=128",
                          "+sharding.sharding_types=[RW]"], tmp_path / "two"))
    plan = json.loads((tmp_path / "two" / "plan.json").read_text())
    assert {t["sharding_type"] for t in plan["tables"]} == {"row_wise"}
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-7, abs=0), (one["val_loss"], two["val_loss"])
    assert two["val_auc"] > 0.65, two["val_auc"]  # it learnt: the check is not of untrained models
    assert two["val_auc"] == pytest.approx(one["val_auc"], abs=1e-6)


@pytest.mark.slow
def test_hierarchical_types_run_on_a_topology_of_several_nodes_on_this_machine(tmp_path: Path) -> None:
    # (runs and keeps to the nodes; their numbers against one process are checked in
    # tests/distributed/test_sharding_equivalence.py and test_planned_training.py)
    # 4 spawned ranks planned as 2 nodes x 2: TorchRec forms the node groups of TWRW and GRID
    # from LOCAL_WORLD_SIZE, which used to say 4 (one node): GRID failed with "Shard offset
    # 2000 and length 1000 exceeds tensor dim", TWRW with an IndexError, in every rank
    from neo_core.training.run import train

    metrics = train(
        composed(
            ["trainer=smoke", "trainer.world_size=4", "+topology=zionex", "topology.num_nodes=2",
             "topology.devices_per_node=2", "model.embedding_dim=32", "model.dense_arch=[64,32]",
             "data.rows=[2000,500]", "+sharding.sharding_types=[TWRW,GRID]", "trainer.max_steps=4"],
            tmp_path,
        )
    )
    assert metrics["world_size"] == 4 and metrics["steps"] == 4
    assert all(0.0 < h["loss"] < 2.0 for h in metrics["history"]), metrics["history"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    types = {t["sharding_type"] for t in plan["tables"]}
    assert types <= {"table_row_wise", "grid_shard"} and types, types
    ranks = {tuple(t["ranks"]) for t in plan["tables"] if t["sharding_type"] == "table_row_wise"}
    assert ranks <= {(0, 1), (2, 3)}, ranks  # each table-row-wise table within one planned node


@pytest.mark.parametrize(
    ("backward", "types", "fragment"),
    [
        ("fp8", "[TW]", "sends fp8 (forward fp16, backward fp8), which TorchRec cannot run over gloo for t_cat_0 (TW)"),
        ("int8", "[RW]", "sends int8 (forward fp16, backward int8), which TorchRec cannot run over gloo for t_cat_0 (RW)"),
    ],
)
def test_a_precision_gloo_cannot_carry_is_refused_before_the_ranks_start(backward, types, fragment, tmp_path) -> None:
    # these fail inside TorchRec in every rank ("Tensor 'input' must have 2 dimension(s)",
    # "Unexpected `None`"); the refusal names the tables and the sharding types that work
    from neo_core.errors import ConfigError
    from neo_core.training.run import train

    with pytest.raises(ConfigError) as err:
        train(composed(["trainer=smoke", "compression=fp16", f"compression.backward={backward}",
                        f"+sharding.sharding_types={types}"], tmp_path))
    message = str(err.value)
    assert fragment in message and "and 21 more" in message, message
    assert "compression=fp16 compression.backward=fp16" in message
    if backward == "int8":  # TW and CW carry int8
        assert "keep to the sharding types that can carry int8: sharding.sharding_types=[DP,TW,CW,TWCW]" in message
    else:  # RW falls back to bf16 (no fp8 reduce-scatter): no type carries fp8 over gloo
        assert "sharding_types=[" not in message and "no sharding type sends fp8 over gloo" in message, message
        assert "or int8 where every table is of a type that carries it (DP,TW,CW,TWCW)" in message, message
    assert not (tmp_path / "logs").exists()  # no rank started


def test_node_local_sharding_the_launch_layout_cannot_give_is_refused(monkeypatch) -> None:
    # torchrun (or CUDA ranks) keep the machine's LOCAL_WORLD_SIZE; a plan of other nodes
    # failed inside TorchRec in every rank ("IndexError: list index out of range" in _shard)
    from neo_core.api import plan_tables
    from neo_core.errors import ConfigError
    from neo_core.sharding import TableSpec
    from neo_core.training.run import Launch, check_node_layout
    from tests.planner import cluster

    topo = cluster(2, 2)
    tables = [TableSpec(f"t{i}", 10_000, 32, 4.0) for i in range(3)]
    twrw = plan_tables(tables, topo, 64, sharding_types=["TWRW"])
    tw = plan_tables(tables, topo, 64, sharding_types=["TW"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ConfigError) as err:
        check_node_layout(twrw, Launch(4, "cpu", "gloo", external=True), topo)
    message = str(err.value)
    assert "splits t0 (TWRW), t1 (TWRW), t2 (TWRW) over nodes of 2 rank(s)" in message, message
    assert "4 rank(s) share each machine here" in message and "torchrun --nproc_per_node=2" in message
    with pytest.raises(ConfigError, match=r"topology.devices_per_node=4"):
        check_node_layout(twrw, Launch(4, "cuda", "nccl", external=False), topo)
    check_node_layout(tw, Launch(4, "cpu", "gloo", external=True), topo)  # no node-local tables
    check_node_layout(twrw, Launch(4, "cpu", "gloo", external=False), topo)  # spawned CPU ranks: emulated
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    check_node_layout(twrw, Launch(4, "cpu", "gloo", external=True), topo)  # the layout matches


def test_the_node_layout_refusal_names_the_node_local_tables_grid_ones_too(monkeypatch) -> None:
    # TorchRec forms the nodes of grid sharding as of table-row-wise; a table-wise table is
    # not split over a node, so it is not named
    from neo_core.errors import ConfigError
    from neo_core.sharding import PlanResult, RankReport, TableAssignment
    from neo_core.training.run import Launch, check_node_layout
    from tests.planner import cluster

    topo = cluster(2, 2)
    reports = [RankReport(r) for r in range(4)]
    mixed = PlanResult("neo", [TableAssignment("t0", "table_row_wise", "fused", [0, 1]),
                               TableAssignment("t1", "table_wise", "fused", [2]),
                               TableAssignment("t2", "grid_shard", "fused", [2, 3])], reports, 64, {})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"^The plan splits t0 \(TWRW\), t2 \(GRID\) over nodes of 2 rank\(s\)"):
        check_node_layout(mixed, Launch(4, "cpu", "gloo", external=True), topo)
    grid = PlanResult("neo", [TableAssignment("t2", "grid_shard", "fused", [2, 3])], reports, 64, {})
    with pytest.raises(ConfigError, match=r"^The plan splits t2 \(GRID\) over nodes of 2 rank\(s\)"):
        check_node_layout(grid, Launch(4, "cpu", "gloo", external=True), topo)
    # a launcher that does not say its local size: TorchRec takes all 4 ranks as one machine
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ConfigError, match=r"but 4 rank\(s\) share each machine here"):
        check_node_layout(grid, Launch(4, "cpu", "gloo", external=True), topo)


def test_the_fused_kernel_with_adam_is_refused_on_cpu_ranks_however_the_optimizer_is_written() -> None:
    from neo_core.training.run import cpu_kernel_problem

    for adam in ("adam", "Adam", "ADAM"):
        assert "FBGEMM's fused kernel has no Adam on CPU" in (cpu_kernel_problem("fused", adam) or ""), adam
    assert cpu_kernel_problem("dense", "adam") is None and cpu_kernel_problem("fused", "sgd") is None
    # a plugin's kernel known by name alone is judged once built, by its compute kernel
    assert cpu_kernel_problem("my_dense", "adam") is None


def test_the_precision_refusal_names_a_fix_the_planner_takes(tmp_path) -> None:
    from neo_core.api import plan_tables
    from neo_core.compression import Compressor
    from neo_core.errors import ConfigError
    from neo_core.sharding import TableSpec
    from neo_core.training.run import gloo_compression_problem, train

    with pytest.raises(ConfigError) as err:
        train(composed(["trainer=smoke", "sharding=torchrec", "compression=fp16", "compression.backward=fp8"],
                       tmp_path))
    assert "no sharding type sends fp8 over gloo" in str(err.value), str(err.value)
    # a planner without a list of sharding types (TorchRec's) is told to switch to Neo's
    rw = plan_tables([TableSpec("t", 1000, 16, 2.0)], {"name": "local", "world_size": 2, "compute_device": "cpu"},
                     64, sharding_types=["RW"])
    int8 = Compressor("int8ish", "fp16", "int8")
    assert "sharding=neo sharding.sharding_types=[DP,TW,CW,TWCW]" in gloo_compression_problem(rw, int8, object())
    assert "sharding=neo" not in gloo_compression_problem(rw, int8, NeoPlannerLike())


class NeoPlannerLike:
    allowed = None  # Neo's planner takes sharding.sharding_types


@pytest.mark.slow
def test_int8_gradients_run_where_the_plan_is_table_wise(tmp_path: Path) -> None:
    # runs over gloo (int8 is refused for the row-split types, above); a finite, sane loss only
    from neo_core.training.run import train

    metrics = train(composed(["trainer=smoke", "compression=fp16", "compression.backward=int8",
                              "+sharding.sharding_types=[TW]"], tmp_path))
    assert metrics["steps"] == 5 and all(0.0 < h["loss"] < 2.0 for h in metrics["history"])


@pytest.mark.slow
def test_resumed_run_reproduces_uninterrupted_losses(tmp_path: Path, capsys) -> None:
    from neo_core.training.run import train

    smoke = ["trainer=smoke", "trainer.checkpoint=true", "trainer.val_every_n_steps=3", "trainer.log_every_n_steps=3"]
    whole = train(composed([*smoke, "trainer.max_steps=6"], tmp_path / "whole"))
    assert [v["step"] for v in whole["val_history"]] == [3, 6]
    first = train(composed([*smoke, "trainer.max_steps=4"], tmp_path / "split"))
    assert [v["step"] for v in first["val_history"]] == [3, 4]  # and after the last step, off the interval
    assert json.loads((tmp_path / "split" / "checkpoint" / "meta.json").read_text())["step"] == 4
    # as if the run had gone on and been killed (kill -9): a log row past its checkpoint, no results
    log = tmp_path / "split" / "logs" / "metrics.csv"
    head = log.read_text().splitlines()[0].split(",")
    killed = ",".join({"step": "4", "train/loss": "9.5"}.get(c, "") for c in head)  # step 5, past the save
    log.write_text(log.read_text() + killed + "\n")
    (tmp_path / "split" / "metrics.json").unlink()
    capsys.readouterr()
    resumed = train(composed([*smoke, "trainer.max_steps=6", "trainer.resume=true"], tmp_path / "split"))
    # the segment's first step builds kernels and caches: its rate counts step 6
    assert "samples/s over steps 6-6 of this segment" in capsys.readouterr().out
    # the record before the checkpoint came with it (metrics.json was gone)
    assert [h["step"] for h in resumed["history"]] == [1, 2, 3, 4, 5, 6]
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in whole["history"]]
    # validation on the run's steps: 3 and 4 (the first run's end) kept, then 6, not 4 + 3
    assert [v["step"] for v in resumed["val_history"]] == [3, 4, 6]
    assert resumed["val_history"][-1] == whole["val_history"][-1]
    # its samples/s times this segment's steps only, and says which
    assert (whole["timed_from_step"], resumed["timed_from_step"]) == (1, 5)
    assert (whole["samples_per_sec_from_step"], resumed["samples_per_sec_from_step"]) == (2, 6)
    from neo_core.training.plots import chart_title  # the chart says so too

    assert chart_title(resumed).endswith(f"{resumed['samples_per_sec']:,.0f} samples/s (resumed: steps 6-6)")
    assert chart_title(whole).endswith(f"{whole['samples_per_sec']:,.0f} samples/s")
    # a run that does not resume is refused before it writes over the checkpoint
    from neo_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"holds the checkpoint of an earlier run \(step 6, .*\); continue it with "
                                          r"trainer.resume=true, or choose another output folder"):
        train(composed([*smoke, "trainer.max_steps=9"], tmp_path / "split"))
    # resuming a finished run (a restarted job script, a sweep run again) reports its results
    again = train(composed([*smoke, "trainer.max_steps=6", "trainer.resume=true"], tmp_path / "split"))
    assert again["steps"] == 6 and again["val_auc"] == resumed["val_auc"]
    with pytest.raises(ConfigError, match=r"is at step 6, not before trainer.max_steps=5; raise trainer.max_steps"):
        train(composed([*smoke, "trainer.max_steps=5", "trainer.resume=true"], tmp_path / "split"))
    # killed after its last save, before its results: said so, with where the record is
    (tmp_path / "split" / "metrics.json").unlink()
    with pytest.raises(ConfigError, match=r"is at step 6, trainer.max_steps, but .*metrics.json is missing or from an "
                                          r"earlier step: .*checkpoint/history.json; raise trainer.max_steps"):
        train(composed([*smoke, "trainer.max_steps=6", "trainer.resume=true"], tmp_path / "split"))
    # the resumed run's log rows follow the first run's, counted on from its checkpoint, the
    # killed run's row past it dropped: every step once
    def log_rows(run: str) -> list[tuple[str, str]]:
        lines = (tmp_path / run / "logs" / "metrics.csv").read_text().splitlines()
        head = lines[0].split(",")
        return [(r.split(",")[head.index("step")], r.split(",")[head.index("train/loss")])
                for r in lines[1:] if r.split(",")[head.index("train/loss")]]

    # logged on the run's cadence (every 3 steps: 0-based steps 2 and 5), resumed at step 4 or not
    assert log_rows("split") == log_rows("whole") and [step for step, _ in log_rows("whole")] == ["2", "5"]
    # resuming with another model is refused before any rank starts, naming what changed
    with pytest.raises(ConfigError, match=r"differs from the one that wrote the checkpoint: model\.embedding_dim: 16 -> 8\. Resume with that "
                       r"run's settings \(.*/checkpoint/config\.json\)"):
        train(composed([*smoke, "trainer.max_steps=9", "trainer.resume=true", "model.embedding_dim=8"],
                       tmp_path / "split"))


@pytest.mark.slow
def test_a_run_resumed_under_another_plan_loads_tables_that_moved_to_or_from_data_parallel(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Their weights load (the next step's loss is the uninterrupted run's) and their optimizer
    state, of another form in the checkpoint, starts afresh with a note naming them."""
    from neo_core.training.run import train

    base = ["trainer=smoke", "trainer.checkpoint=true", "trainer.batch_size=256"]
    whole = train(composed([*base, "trainer.max_steps=4"], tmp_path / "whole"))
    train(composed([*base, "trainer.max_steps=3"], tmp_path / "split"))
    first = json.loads((tmp_path / "split" / "plan.json").read_text())
    assert json.loads((tmp_path / "split" / "checkpoint" / "config.json").read_text())["sharding"]["name"] == "neo"
    capfd.readouterr()
    resumed = train(composed([*base, "trainer.max_steps=4", "trainer.resume=true", "sharding=torchrec"],
                             tmp_path / "split"))
    second = json.loads((tmp_path / "split" / "plan.json").read_text())

    def data_parallel(plan: dict[str, Any]) -> set[str]:
        return {t["name"] for t in plan["tables"] if t["sharding_type"] == "data_parallel"}

    moved = data_parallel(first) ^ data_parallel(second)
    assert moved  # the two plans disagree on which tables are data-parallel
    said = capfd.readouterr()
    assert "note: resuming from step 3 with settings that differ from the run that wrote the checkpoint: " \
           "sharding: 'neo' -> 'torchrec'" in said.out
    assert "starts afresh" in said.err and all(name in said.err for name in moved), said.err[-2000:]
    assert [h["step"] for h in resumed["history"]] == [1, 2, 3, 4]
    # step 4's loss comes from the weights loaded at step 3, whatever their new sharding
    assert resumed["history"][3]["loss"] == pytest.approx(whole["history"][3]["loss"], rel=1e-5)


def test_a_save_interrupted_at_any_point_leaves_the_newest_finished_checkpoint(tmp_path: Path) -> None:
    from neo_core.errors import CheckpointError
    from neo_core.training.checkpoint import latest_checkpoint

    path = tmp_path / "checkpoint"

    def finished(folder: Path, step: int) -> None:
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps({"step": step}))

    assert latest_checkpoint(path) is None
    finished(tmp_path / "checkpoint.old", 20)  # crash after the old one was moved aside ...
    (tmp_path / "checkpoint.tmp").mkdir()  # ... and before the new one was finished
    assert latest_checkpoint(path) == (tmp_path / "checkpoint.old", 20)
    (tmp_path / "checkpoint.tmp" / "meta.json").write_text('{"step": 30}')  # finished, not swapped in
    assert latest_checkpoint(path) == (tmp_path / "checkpoint.tmp", 30)
    finished(path, 30)
    assert latest_checkpoint(path)[1] == 30
    for bad in ("not json", "{}", '{"step": "x"}', '{"step": -5}'):
        (path / "meta.json").write_text(bad)
        with pytest.raises(CheckpointError, match=r"checkpoint/meta.json (is unreadable|names step)"):
            latest_checkpoint(path)


# the overrides of a run that trains until stopped, with a checkpoint every 3 steps
ENDLESS = ["trainer=smoke", "trainer.max_steps=100000", "trainer.checkpoint=true",
           "trainer.checkpoint_every_n_steps=3", "trainer.log_every_n_steps=2"]


def _signal_once_training(command: list[str], out: Path, sig: str) -> tuple[int, str]:
    """Start ``command`` in its own session, send ``sig`` to its process group once the first
    periodic checkpoint shows the ranks are training; returns its exit code and stderr."""
    import signal
    import subprocess

    from tests.conftest import ROOT, subprocess_env

    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    meta = out / "checkpoint" / "meta.json"
    try:
        deadline, seen = time.monotonic() + 240, False
        while not seen and proc.poll() is None and time.monotonic() < deadline:
            # seen once is enough: each save swaps the folder in by renames, so a second look
            # can fall between them (a run of 23 steps/s, a save every 3, failed so once)
            seen = meta.exists()
            time.sleep(0 if seen else 0.2)
        assert seen, proc.communicate(timeout=60)
        os.killpg(proc.pid, getattr(signal, sig))  # as a terminal (or a batch system) would
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_every_rank_after_one_step_and_saves(tmp_path: Path, sig: str) -> None:
    """SIGINT to the whole run (as a terminal sends it), or SIGTERM (as a batch system
    preempting the job): both ranks stop after the same step, the checkpoint holds that step,
    and a resumed run goes on from it."""
    import sys

    from neo_core.cli import script_command
    from tests.conftest import ROOT

    out = tmp_path / "run"
    meta = out / "checkpoint" / "meta.json"
    code, stderr = _signal_once_training(
        [sys.executable, str(ROOT / "recipes" / "train.py"), *ENDLESS, f"hydra.run.dir={out}"], out, sig
    )
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    said = "stopping on SIGTERM: the ranks" if sig == "SIGTERM" else "stopping: the ranks finish their step"
    assert stderr.count(said) == 1 and stderr.count("stopping") == 1, stderr[-3000:]
    step = json.loads(meta.read_text())["step"]
    assert 3 <= step < 100000 and step % 2 == 0  # after a step where the ranks compared notes
    # the command to continue repeats the run's overrides
    assert (f"interrupted: stopped after step {step} of 100000: checkpoint at step {step} in {out / 'checkpoint'}; "
            f"continue with: {script_command(ROOT / 'recipes' / 'train.py', ROOT)} trainer=smoke "
            "trainer.max_steps=100000 trainer.checkpoint=true "
            "trainer.checkpoint_every_n_steps=3 trainer.log_every_n_steps=2 trainer.resume=true "
            f"hydra.run.dir={out}") in stderr, stderr[-3000:]
    # the run's transcript keeps the plan, the notice and the line to continue with
    transcript = (out / "train.log").read_text().splitlines()
    assert "Sharding plan (neo), 2 ranks" in transcript and said in "\n".join(transcript)
    assert transcript[-1].startswith(f"interrupted: stopped after step {step} of 100000"), transcript[-5:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["steps"] == step
    assert not (out / "checkpoint.tmp").exists()

    from neo_core.training.run import train

    resumed = train(composed(["trainer=smoke", "trainer.checkpoint=true", "trainer.resume=true",
                              f"trainer.max_steps={step + 2}"], out))
    assert resumed["steps"] == step + 2 and resumed["interrupted"] is False
    assert [h["step"] for h in resumed["history"]][-2:] == [step + 1, step + 2]


@pytest.mark.slow
def test_torchruns_ranks_share_the_default_folder_whenever_they_start(tmp_path: Path) -> None:
    """Without hydra.run.dir each rank named outputs/<date>/<time> by its own clock: ranks that
    reached that a second apart (two runs in three on this machine) wrote into two folders, the
    checkpoint's shards split between them. Rank 1 starts 2 s late here; rank 0 names the
    folder, and rank 1 reads the name from torchrun's store."""
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env
    from tests.distributed.multi_process import free_port

    late = tmp_path / "late"
    late.mkdir()
    (late / "sitecustomize.py").write_text("import os, time\nif os.environ.get('RANK') == '1':\n    time.sleep(2.0)\n")
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--nproc-per-node=2", f"--master-port={free_port()}", str(ROOT / "recipes" / "train.py"),
         "trainer=smoke", "trainer.checkpoint=true"],
        cwd=tmp_path, env=subprocess_env(late), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = list((tmp_path / "outputs").glob("*/*"))
    assert len(folders) == 1, folders
    shards = sorted(p.name for p in (folders[0] / "checkpoint").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"], shards
    assert "could not learn the run's folder" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_under_torchrun_stops_after_an_agreed_step_and_saves(tmp_path: Path, sig: str) -> None:
    """Under torchrun the agent takes the terminal's SIGINT (or a batch system's SIGTERM) and
    passes it on to each rank (its workers run in their own session); the ranks stop after the
    same agreed step and save before the agent's shutdown timeout."""
    import sys

    from tests.conftest import ROOT
    from tests.distributed.multi_process import free_port

    out = tmp_path / "run"
    meta = out / "checkpoint" / "meta.json"
    torchrun = Path(sys.executable).parent / "torchrun"
    code, stderr = _signal_once_training(
        [str(torchrun), "--nproc-per-node=2", f"--master-port={free_port()}", "--shutdown-timeout=120",
         str(ROOT / "recipes" / "train.py"), *ENDLESS, "trainer.progress_bar=false", f"hydra.run.dir={out}"],
        out, sig,
    )
    assert code != 0  # torchrun reports the signal it got
    said = "stopping on SIGTERM: the ranks" if sig == "SIGTERM" else "stopping: the ranks finish their step"
    assert stderr.count(said) == 1, stderr[-3000:]  # rank 0 only
    step = json.loads(meta.read_text())["step"]
    assert 3 <= step < 100000 and step % 2 == 0, stderr[-3000:]
    assert f"interrupted: stopped after step {step} of 100000" in stderr, stderr[-3000:]
    transcript = (out / "train.log").read_text()  # rank 0's
    assert transcript.count(said) == 1 and f"interrupted: stopped after step {step} of 100000" in transcript
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["steps"] == step and metrics["world_size"] == 2
    assert not (out / "checkpoint.tmp").exists()


def test_first_ctrl_c_is_noted_and_the_second_stops(capsys, monkeypatch) -> None:
    import signal

    from neo_core.training import interrupt
    from neo_core.training.interrupt import HardStop, StopOnInterrupt

    before = signal.getsignal(signal.SIGINT)
    stop = StopOnInterrupt(every_n_steps=4, alone=True)
    with stop.installed():
        signal.raise_signal(signal.SIGINT)  # noted, not raised
        assert stop.requested()
        # the same request twice at once (timeout -s INT signals the process, then its group):
        # not a second Ctrl-C, which ended the run before it saved its checkpoint
        signal.raise_signal(signal.SIGINT)
        monkeypatch.setattr(interrupt, "ECHO_S", 0.0)  # a second Ctrl-C, later
        with pytest.raises(HardStop):  # not a KeyboardInterrupt: Lightning would exit(1) on that
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err.count("stopping: the ranks finish their step") == 1
    # a rank started by run_ranks leaves both the message and the second Ctrl-C to its parent
    started = StopOnInterrupt(every_n_steps=4)
    with started.installed():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert started.requested() and capsys.readouterr().err == ""
    # SIGTERM (preemption, or torchrun passing one on) asks to stop; repeated, it never stops at once
    term_before = signal.getsignal(signal.SIGTERM)
    termed = StopOnInterrupt(every_n_steps=4, alone=True)
    with termed.installed():
        # fit puts Lightning's SIGTERM handler (and its per-step broadcast) in place; training
        # start takes both back
        from types import SimpleNamespace

        signal.signal(signal.SIGTERM, lambda *_: pytest.fail("Lightning's handler ran"))
        broadcasts = []
        loop = SimpleNamespace(_broadcast_sigterm_tensor=lambda: broadcasts.append(1))
        termed.on_train_start(SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop)), None)
        loop._broadcast_sigterm_tensor()
        assert broadcasts == []
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert termed.requested()
    assert signal.getsignal(signal.SIGTERM) is term_before
    assert capsys.readouterr().err.count("stopping on SIGTERM") == 1
    # torchrun's agent passes a second Ctrl-C on as SIGTERM: after a SIGINT, it stops at once
    passed_on = StopOnInterrupt(every_n_steps=4, alone=True)
    with passed_on.installed():
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(HardStop):
            signal.raise_signal(signal.SIGTERM)


def test_lightnings_sigterm_notifier_is_silenced_before_fit_registers_it() -> None:
    import signal
    from types import SimpleNamespace

    from neo_core.training.interrupt import StopOnInterrupt

    stop = StopOnInterrupt(alone=True)
    connector = SimpleNamespace(_sigterm_notifier_fn=lambda *_: pytest.fail("Lightning's notifier ran"),
                                received_sigterm=False)
    trainer = SimpleNamespace(_signal_connector=connector)
    with stop.installed():
        stop.setup(trainer, None, "fit")
        connector._sigterm_notifier_fn(signal.SIGTERM, None)  # what Lightning's chained handler calls first
        connector.received_sigterm = True  # a SIGTERM that reached Lightning before setup anyway
        stop.on_train_start(trainer, None)
    assert stop.requested() and connector.received_sigterm is False


def test_a_rank_whose_starting_process_is_gone_stops() -> None:
    import os

    from neo_core.training.interrupt import StopOnInterrupt

    assert not StopOnInterrupt(parent=os.getppid()).requested()
    assert StopOnInterrupt(parent=os.getppid() + 10**7).requested()  # not this process's parent


def test_ranks_stop_together_at_agreement_points_but_not_after_the_last_step() -> None:
    from types import SimpleNamespace

    from neo_core.training.interrupt import StopOnInterrupt

    asked_anywhere = []  # what each rank brought to the all-reduce
    strategy = SimpleNamespace(reduce_boolean_decision=lambda d, all: asked_anywhere.append(d) or d)
    trainer = SimpleNamespace(strategy=strategy, global_step=0, max_steps=10, should_stop=False)
    stop = StopOnInterrupt(every_n_steps=3)
    stop.asked = True
    for step in (1, 2):
        trainer.global_step = step
        stop.on_train_batch_end(trainer, None, None, None, step)
    assert not trainer.should_stop and asked_anywhere == []  # no agreement point yet
    trainer.global_step = 3
    stop.on_train_batch_end(trainer, None, None, None, 3)
    assert trainer.should_stop and stop.stopped_at == 3 and asked_anywhere == [True]
    last = StopOnInterrupt(every_n_steps=5)
    last.asked = True
    trainer = SimpleNamespace(strategy=strategy, global_step=0, max_steps=10, should_stop=False)
    for step in range(1, 11):
        trainer.global_step = step
        if step < 10:
            last.asked = step >= 7  # asked after the agreement point at step 5
        last.on_train_batch_end(trainer, None, None, None, step)
    assert not trainer.should_stop and last.stopped_at is None  # step 10 was the last: finished


def _rank_waits_for_stop(local_rank: int, *args: Any) -> None:
    import signal
    import time

    *linger, stop = args
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # started ignoring them
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    if not stop.wait(120):
        raise SystemExit(3)
    time.sleep(linger[0] if linger else 0.0)


def _rank_never_stops(local_rank: int, stop: Any) -> None:
    import time

    time.sleep(600)


def _rank_one_fails(local_rank: int, stop: Any) -> None:
    import time

    if local_rank == 1:
        time.sleep(1.0)
        raise ValueError("rank 1 failed")
    time.sleep(600)  # SIGTERM ignored, as ranks start


def _rank_with_teardown_noise(local_rank: int, how: str, stop: Any) -> None:
    import atexit
    import sys

    atexit.register(lambda: print("interpreter teardown ran", file=sys.stderr, flush=True))
    if how == "fails":
        raise ValueError(f"rank {local_rank} failed")
    if how == "exits":
        raise SystemExit(130)
    if how == "exits-none":
        raise SystemExit()  # success, as sys.exit() in the interpreter
    if how == "exits-text":
        raise SystemExit(f"rank {local_rank} gave up")
    if how == "aborts" and local_rank == 1:  # as a library's C++ code aborts
        import os

        os.abort()


@pytest.mark.parametrize("how", ["returns", "fails", "exits", "exits-none", "exits-text", "aborts"])
def test_a_rank_leaves_without_the_interpreters_teardown(how: str, capfd) -> None:
    # the teardown of a rank holding a process group could abort ("terminate called without an
    # active exception") after the rank's results or error were in
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    from neo_core.training.interrupt import run_ranks

    if how in ("returns", "exits-none"):
        run_ranks(_rank_with_teardown_noise, (how,), 2)
    elif how == "exits-text":
        with pytest.raises(ProcessExitedException, match="exit code 1"):
            run_ranks(_rank_with_teardown_noise, (how,), 2)
    elif how == "fails":
        with pytest.raises(ProcessRaisedException, match=r"ValueError: rank [01] failed"):
            run_ranks(_rank_with_teardown_noise, (how,), 2)
    elif how == "aborts":
        with pytest.raises(ProcessExitedException, match="process 1 terminated with signal SIGABRT"):
            run_ranks(_rank_with_teardown_noise, (how,), 2)
    else:
        with pytest.raises(ProcessExitedException, match="exit code 130"):
            run_ranks(_rank_with_teardown_noise, (how,), 2)
    err = capfd.readouterr().err
    assert "interpreter teardown ran" not in err
    assert ("gave up" in err) is (how == "exits-text")  # printed, as the interpreter prints it
    # an aborted rank says where it was: its Python stack, down to the call that aborted
    assert ("Fatal Python error: Aborted" in err and "in _rank_with_teardown_noise" in err) is (how == "aborts"), err


def _rank_draws_a_bar(local_rank: int, alone: bool, ready: str, stop: Any) -> None:
    import time

    from tqdm import tqdm

    from neo_core.training.console import bars_without_semaphore

    if alone:
        bars_without_semaphore()
    with tqdm(total=10, disable=False) as bar:
        bar.update(1)
        Path(ready, str(local_rank)).touch()
        time.sleep(120)  # SIGINT ignored: the second Ctrl-C ends it (SIGKILL)


def test_ranks_ended_by_a_second_ctrl_c_leave_no_semaphore_behind(tmp_path: Path) -> None:
    # the resource tracker warned "There appear to be 1 leaked semaphore objects" as the run
    # exited: rank 0's progress bar lock
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    script = """if True:
        import os, signal, sys, threading, time
        from neo_core.training.interrupt import run_ranks
        from tests.training.test_training import _rank_draws_a_bar
        def ctrl_c_twice():  # once both ranks draw their bar: the first asks them to stop, the second ends them
            while len(os.listdir(sys.argv[2])) < 2:
                time.sleep(0.1)
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)
        threading.Thread(target=ctrl_c_twice, daemon=True).start()
        try:
            run_ranks(_rank_draws_a_bar, (sys.argv[1] == "alone", sys.argv[2]), 2)
        except KeyboardInterrupt:
            print("ended at once", file=sys.stderr)
    """
    for alone in (True, False):
        ready = tmp_path / str(alone)
        ready.mkdir()
        proc = subprocess.run([sys.executable, "-c", script, "alone" if alone else "default", str(ready)], cwd=ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert "ended at once" in proc.stderr, proc.stderr[-2000:]
        assert ("leaked semaphore" in proc.stderr) is not alone, proc.stderr[-2000:]


def test_a_failing_rank_ends_the_others_at_once() -> None:
    import time

    from torch.multiprocessing.spawn import ProcessRaisedException

    from neo_core.training.interrupt import run_ranks

    start = time.monotonic()
    with pytest.raises(ProcessRaisedException, match="rank 1 failed"):
        run_ranks(_rank_one_fails, (), 2)
    assert time.monotonic() - start < 25  # not torch's 30 s SIGTERM grace before SIGKILL


def test_the_starting_process_passes_ctrl_c_to_its_ranks_and_ends_them_on_the_second(capsys) -> None:
    import os
    import signal
    import threading
    import time

    from neo_core.training.interrupt import asked_as_it_finished, run_ranks

    before = signal.getsignal(signal.SIGINT)
    interrupt = lambda: os.kill(os.getpid(), signal.SIGINT)  # noqa: E731
    timer = threading.Timer(1.0, interrupt)
    timer.start()
    assert run_ranks(_rank_waits_for_stop, (), 2)  # each rank sees the flag and ends normally: asked
    timer.join()
    assert capsys.readouterr().err.count("stopping: the ranks finish their step") == 1
    # whether they stopped early or finished first is the results' to say (train()), not this
    assert not asked_as_it_finished()
    terminate = lambda: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
    timers = [threading.Timer(t, terminate) for t in (1.0, 1.3)]  # twice: one request, passed on once
    for timer in timers:
        timer.start()
    run_ranks(_rank_waits_for_stop, (1.5,), 2)  # the ranks linger: both arrive while they run
    for timer in timers:
        timer.join()
    assert capsys.readouterr().err.count("stopping on SIGTERM") == 1
    timers = [threading.Timer(t, interrupt) for t in (1.0, 1.5)]
    for timer in timers:
        timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_ranks(_rank_never_stops, (), 2)
    for timer in timers:
        timer.join()
    assert time.monotonic() - start < 60  # the ranks were ended, not waited for
    assert signal.getsignal(signal.SIGINT) is before


def test_a_plan_larger_than_this_machines_memory_is_refused_before_ranks_start(tmp_path: Path, monkeypatch) -> None:
    from neo_core.errors import PlanningError
    from neo_core.training import run

    monkeypatch.setattr(run, "_available_memory", lambda: 2**20)  # 1 MiB left on this machine
    with pytest.raises(PlanningError, match=r"on this machine's 2 CPU rank\(s\) \(topology zionex\), but only "
                                            r"0\.0 GiB of memory is available; make the tables smaller"):
        run.train(composed(["trainer=smoke", "+topology=zionex"], tmp_path))
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "plan.json").exists()


def test_a_plan_too_large_for_this_machine_names_the_listed_tables_key(tmp_path: Path, monkeypatch) -> None:
    # tables given as data.tables are shrunk by their num_embeddings: the message named data.rows alone
    from neo_core.errors import PlanningError
    from neo_core.training import run

    monkeypatch.setattr(run, "_available_memory", lambda: 2**20)
    tables = "data.tables=[{name: big, num_embeddings: 100000}, {name: small, num_embeddings: 100}]"
    with pytest.raises(PlanningError, match=r"make the tables smaller \(data\.rows, or num_embeddings in data\.tables\)"):
        run.train(composed(["trainer=smoke", "+topology=zionex", tables], tmp_path))


def test_resume_check_counts_a_left_out_key_as_its_default(tmp_path: Path) -> None:
    from neo_core.config import validate
    from neo_core.errors import ConfigError
    from neo_core.training.run import check_resumable

    # the run that wrote the checkpoint came from YAML (every key of the kernel written) ...
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(validate(composed(["trainer=smoke"], tmp_path)).to_dict()))
    written = json.loads(saved.read_text())["kernel"]
    assert written["name"] == "fused" and "optimizer" in written
    # ... the resumed one from Python, naming only the kernel: the same settings, so accepted
    python_run = validate(composed(["trainer=smoke"], tmp_path)).to_dict()
    python_run["kernel"] = {"name": "fused"}
    python_run["model"] = {**python_run["model"], "dense_arch": tuple(python_run["model"]["dense_arch"])}
    assert check_resumable(saved, python_run) == []  # a tuple is saved as a list: no change either
    # settings a resumed run may change are returned, to be noted
    python_run["trainer"] = {**python_run["trainer"], "max_steps": 300, "resume": True, "batch_size": 128}
    assert check_resumable(saved, python_run) == ["trainer.batch_size: 64 -> 128"]  # not what resuming is for
    # values as an override types them (it read "None -> 3")
    python_run["trainer"] = {**python_run["trainer"], "val_every_n_steps": 3}
    assert check_resumable(saved, python_run) == ["trainer.batch_size: 64 -> 128", "trainer.val_every_n_steps: null -> 3"]
    python_run["trainer"] = {**python_run["trainer"], "val_every_n_steps": None}
    # a left-out key whose default differs from what was written is still a change
    python_run["kernel"] = {"name": "fused", "learning_rate": written["learning_rate"]}
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "kernel": {**written, "optimizer": "adam"}}))
    with pytest.raises(ConfigError, match=r"kernel\.optimizer: 'adam' -> 'rowwise_adagrad'"):
        check_resumable(saved, python_run)


def test_the_combined_optimizer_runs_the_step_closure_once() -> None:
    """Lightning's closure is the step's forward and backward: TorchRec's CombinedOptimizer
    hands it to every part, so with two torch parts (MLPs, replicated tables) it ran twice."""
    import torch
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    from neo_core.training.module import OneClosureOptimizer

    mlp, table = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    parts = [
        ("dense", KeyedOptimizerWrapper({"mlp": mlp}, lambda ps: torch.optim.SGD(ps, lr=0.5))),
        ("embedding", KeyedOptimizerWrapper({"table": table}, lambda ps: torch.optim.SGD(ps, lr=0.5))),
    ]
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        for p in (mlp, table):
            p.grad = None
        loss = (mlp.sum() + table.sum()) ** 2 / 2
        loss.backward()
        return loss

    loss = OneClosureOptimizer(parts).step(closure)
    assert len(calls) == 1 and float(loss.detach()) == 12.5
    # both parts stepped on that one pass's gradients (d loss / d p = 5)
    assert mlp.tolist() == [-1.5, -1.5] and table.tolist() == [-1.5, -1.5, -1.5]


def test_ranks_that_end_without_results_are_an_error_not_an_earlier_runs_figures(tmp_path: Path, monkeypatch) -> None:
    from neo_core.errors import TrainingError
    from neo_core.training import run

    (tmp_path / "metrics.json").write_text('{"steps": 300, "val_auc": 0.9}')  # an earlier run's
    old = time.time() - 60
    os.utime(tmp_path / "metrics.json", (old, old))
    monkeypatch.setattr(run, "rank_main", lambda *a, **k: None)  # ranks that stop before writing
    with pytest.raises(TrainingError, match=r"The ranks ended without writing this run's results"):
        run.train(composed(["trainer=smoke", "trainer.world_size=1"], tmp_path))


def test_the_run_log_keeps_earlier_rows_and_counts_steps_over_the_run(tmp_path: Path) -> None:
    """logs/metrics.csv over a resumed run: rows after the checkpoint go, the earlier ones stay,
    new rows are appended under the file's columns (put in Lightning's sorted order first)."""
    from neo_core.training.logs import RunLog, keep_rows_before

    log = tmp_path / "logs" / "metrics.csv"
    log.parent.mkdir()
    log.write_text("step,train/loss,epoch\n9,0.7,0\n19,0.6,0\n29,0.5,0\n")
    keep_rows_before(log, 20)  # checkpoint after 20 steps: the row of step 29 was never saved
    logger = RunLog(tmp_path)
    logger.log_metrics({"train/loss": 0.4, "epoch": 0}, step=29)  # the run's 30th step, 10th of this segment
    logger.log_metrics({"val/auc": 0.8}, step=29)
    rows = log.read_text().splitlines()
    assert rows[0] == "epoch,step,train/loss,val/auc"
    assert rows[1:] == ["0,9,0.7,", "0,19,0.6,", "0,29,0.4,", ",29,,0.8"]


def test_a_damaged_checkpoint_index_or_config_is_named_with_the_fix(tmp_path: Path) -> None:
    from neo_core.errors import CheckpointError, ConfigError
    from neo_core.training.checkpoint import _check_metadata
    from neo_core.training.run import check_resumable

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    with pytest.raises(CheckpointError, match=r"checkpoint/\.metadata is missing: the checkpoint in .* is damaged"):
        _check_metadata(folder)
    (folder / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\.metadata is empty: .*start afresh in another output folder"):
        _check_metadata(folder)
    (folder / ".metadata").write_bytes(b"\x80\x04not a pickle")
    with pytest.raises(CheckpointError, match=r"\.metadata cannot be read \(\w+\): the checkpoint in"):
        _check_metadata(folder)
    # the settings a resume is checked against: missing or unreadable is an error, not a pass
    with pytest.raises(ConfigError, match=r"settings of the run that wrote the checkpoint are missing \(.*config\.json\)"):
        check_resumable(folder / "config.json", {})
    (folder / "config.json").write_text('{"model": {"name": "dl')
    with pytest.raises(ConfigError, match=r"config\.json, the settings of the run .* cannot be read \(JSONDecodeError\)"):
        check_resumable(folder / "config.json", {})


def test_a_diverging_run_stops_with_the_step_and_the_rates_to_lower(tmp_path: Path) -> None:
    # before: the NaN loss reached validation, where the AUC's input check failed in a rank
    from neo_core.errors import TrainingError
    from neo_core.training.run import train

    for earlier in ("metrics.json", "training.png"):  # an earlier run's results (it kept no checkpoint)
        (tmp_path / earlier).write_text("{}")
    with pytest.raises(TrainingError) as err:
        train(composed(["trainer=smoke", "trainer.world_size=1", "kernel.optimizer=sgd", "kernel.learning_rate=1e30",
                        "trainer.checkpoint=true", "trainer.checkpoint_every_n_steps=1"], tmp_path))
    message = str(err.value)
    assert message.startswith("The training loss is nan at step 2: training diverged."), message
    assert "no checkpoint was written for this step" in message
    # Lightning runs the checkpoint callback's batch-end hook before the module's: that hook checks
    # the loss before saving, so the diverged step 2 was not saved and step 1's checkpoint stays
    assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["step"] == 1
    # the failed run's folder does not offer the earlier run's results as its own
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "training.png").exists()
    assert "kernel.learning_rate=1e+30, sgd" in message and "trainer.dense_learning_rate=0.05" in message


def test_an_undefined_auc_is_recorded_as_not_measured(tmp_path: Path, capsys) -> None:
    # every label 0: torchmetrics gave an AUC of 0.0, reported as a result
    from neo_core.training.run import train

    metrics = train(composed(["trainer=smoke", "trainer.world_size=1", "+data.bias=-50"], tmp_path))
    assert math.isnan(metrics["val_auc"])
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["val_auc"] is None and all(v["auc"] is None for v in saved["val_history"])
    out = capsys.readouterr().out
    assert "every held-out label is 0, so the validation AUC is undefined" in out
    assert f"done: 5 steps, val AUC undefined, val loss {metrics['val_loss']:.4f}, " in out


def test_a_run_without_validation_says_so_where_it_printed_nan(tmp_path: Path, capsys) -> None:
    from neo_core.training.run import train

    metrics = train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.val_batches=0"], tmp_path))
    assert math.isnan(metrics["val_auc"]) and math.isnan(metrics["val_loss"])
    assert "done: 5 steps, no validation (trainer.val_batches=0), " in capsys.readouterr().out


def test_a_rank_in_the_process_that_planned_the_run_runs_that_plan(tmp_path: Path, monkeypatch) -> None:
    # one rank in this process (as each rank under torchrun): it planned the run, then its rank
    # planned the same model again; the plan is made once, and is the one saved and trained
    from neo_core.training import run
    from neo_core.training.module import plan_digest

    planned, ran = [], []
    checked_plan, rank_plan = run.checked_plan, run.rank_plan
    monkeypatch.setattr(run, "checked_plan", lambda parts, model: planned.append(1) or checked_plan(parts, model))
    monkeypatch.setattr(run, "rank_plan", lambda *a: ran.append(rank_plan(*a)) or ran[-1])
    run.train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2", "trainer.val_batches=1"],
                       tmp_path))
    assert len(planned) == 1 and len(ran) == 1
    saved = run.PlanResult.load_json(tmp_path / "plan.json")
    assert plan_digest(ran[0]) == plan_digest(saved) and not run._PLANNED_HERE  # taken, not kept


def test_running_out_of_memory_in_a_rank_names_the_batch_and_the_model(tmp_path: Path, monkeypatch) -> None:
    # the plan counts the tables only: a batch or MLP too large for memory died in a raw traceback
    from neo_core.errors import TrainingError
    from neo_core.training import module
    from neo_core.training.run import train

    def oom(self, batch, batch_idx):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 3840062992 bytes.")

    monkeypatch.setattr(module.NeoModule, "training_step", oom)
    with pytest.raises(TrainingError, match=r"Rank 0 ran out of cpu memory while training \(.*can't allocate memory.*\)"
                                            r"\. The plan counts the embedding tables only: lower trainer.batch_size "
                                            r"\(now 64 per rank\)"):
        train(composed(["trainer=smoke", "trainer.world_size=1"], tmp_path))
    monkeypatch.setattr(module.NeoModule, "training_step", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors keep their own
        train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.resume=false"], tmp_path / "b"))


def test_a_short_runs_throughput_leaves_out_its_first_step() -> None:
    # trainer=smoke reported 1,644 samples/s where its steps after the first ran at 6-9k/s
    from types import SimpleNamespace

    from neo_core.training.module import NeoModule

    def rate(times: list[float]) -> float:
        module = SimpleNamespace(_step_times=times, global_batch_size=10)
        module.warmup_steps = lambda warmup=5: NeoModule.warmup_steps(module, warmup)
        return NeoModule.samples_per_second(module)

    assert rate([1.0, 0.1, 0.1]) == pytest.approx(100.0)  # the first step left out
    assert rate([1.0] * 5 + [0.1] * 6) == pytest.approx(100.0)  # longer runs: the 5-step warm-up
    assert rate([0.5]) == pytest.approx(20.0) and rate([]) == 0.0


def test_the_per_step_rate_is_given_with_its_spread() -> None:
    # samples/s came as one figure: a run on a machine another process shared read as steady
    from types import SimpleNamespace

    from neo_core.training.module import NeoModule

    def spread(times: list[float]) -> tuple[float, float] | None:
        module = SimpleNamespace(_step_times=times, global_batch_size=100)
        module.warmup_steps = lambda warmup=5: NeoModule.warmup_steps(module, warmup)
        return NeoModule.samples_per_second_spread(module)

    # after the 5 warm-up steps: 10 steps at 1.0 s (100/s) and 10 at 0.5 s (200/s)
    p10, p90 = spread([9.0] * 5 + [1.0] * 10 + [0.5] * 10)
    assert p10 == pytest.approx(100.0) and p90 == pytest.approx(200.0)
    p10, p90 = spread([9.0] * 5 + [1.0 / (k + 1) for k in range(11)])  # 100 ... 1100/s
    assert p10 == pytest.approx(200.0) and p90 == pytest.approx(1000.0)
    assert spread([9.0] * 5 + [1.0] * 9) is None  # 9 timed steps: too few to say


def test_a_finished_run_whose_last_checkpoint_is_earlier_trains_nothing_when_resumed(tmp_path: Path, capsys) -> None:
    """Periodic checkpoints without the end-of-training save (trainer.checkpoint=false): the last
    one is before max_steps, yet the run finished; restarting it reports its results."""
    from neo_core.training.run import train

    settings = ["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=3", "trainer.checkpoint=false",
                "trainer.checkpoint_every_n_steps=2"]
    first = train(composed(settings, tmp_path))
    assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["step"] == 2
    written = (tmp_path / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    again = train(composed([*settings, "trainer.resume=true"], tmp_path))
    assert f"note: the run in {tmp_path} has finished its 3 steps already" in capsys.readouterr().out
    assert again["steps"] == 3 and again["val_auc"] == first["val_auc"]
    assert (tmp_path / "metrics.json").stat().st_mtime_ns == written  # nothing was trained again
    # with steps left, the run resumes from that checkpoint and says so
    more = train(composed([*settings[:2], "trainer.max_steps=4", *settings[3:], "trainer.resume=true"], tmp_path))
    assert f"note: resuming from step 2 ({tmp_path / 'checkpoint'}" in capsys.readouterr().out
    assert more["steps"] == 4


def test_a_finished_run_without_a_checkpoint_keeps_its_transcript_when_resumed(tmp_path: Path) -> None:
    # trainer.checkpoint=false, then trainer.resume=true: the run only says it has finished; its
    # transcript was replaced by a new run's header and that one line
    from neo_core.config import validate
    from neo_core.training.run import continues_earlier_run

    config = composed(["trainer=smoke", "trainer.max_steps=8"], tmp_path)
    assert not continues_earlier_run(tmp_path, True, config)
    (tmp_path / "metrics.json").write_text(json.dumps({"steps": 8, "val_auc": 0.7}))
    assert not continues_earlier_run(tmp_path, True, config)  # whose settings? (no config.json)
    (tmp_path / "config.json").write_text(json.dumps(validate(config).to_dict()))
    assert continues_earlier_run(tmp_path, True, config)
    assert not continues_earlier_run(tmp_path, True, {**config, "seed": 99})  # another run: it starts afresh
    assert not continues_earlier_run(tmp_path, True, composed(["trainer=smoke", "trainer.max_steps=9"], tmp_path))
    assert not continues_earlier_run(tmp_path, False, config)


def test_a_finished_run_without_a_checkpoint_trains_nothing_when_resumed(tmp_path: Path, capsys) -> None:
    # it trained again from step 0 (warning "holds no checkpoint"), as a sweep's job did not
    from neo_core.training.run import train

    settings = ["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2", "trainer.checkpoint=false"]
    first = train(composed(settings, tmp_path))
    written = (tmp_path / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    again = train(composed([*settings, "trainer.resume=true"], tmp_path))
    assert capsys.readouterr().out == (
        f"note: the run in {tmp_path} has finished its 2 steps already (results in its metrics.json); nothing to "
        "train (it saved no checkpoint: with a larger trainer.max_steps, it trains again from step 0)\n")
    assert again["val_auc"] == first["val_auc"] and (tmp_path / "metrics.json").stat().st_mtime_ns == written
    # with other settings it is another run: it trains afresh (a changed kernel with a checkpoint is refused)
    other = train(composed([*settings, "trainer.resume=true", "kernel=dense"], tmp_path))
    assert "holds no checkpoint; starting from step 0" in capsys.readouterr().out
    assert other["steps"] == 2 and (tmp_path / "metrics.json").stat().st_mtime_ns != written


def test_an_in_process_run_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    # world size 1 runs the rank here: its rank variables, seed, silenced loggers and warning
    # filters stayed for whatever ran next in the process (a multirun's next job, a notebook)
    import logging
    import warnings

    import torch

    from neo_core.training.run import QUIET_LOGGERS, train

    def state() -> tuple:
        levels = [logging.getLogger(name).level for name in (*QUIET_LOGGERS, "")]
        return dict(os.environ), list(warnings.filters), levels, torch.get_num_threads()

    import lightning.pytorch  # noqa: F401 - sets PYTORCH_NVML_BASED_CUDA_CHECK as it is first imported

    before = state()
    train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2"], tmp_path))
    after = state()
    assert {k: v for k, v in after[0].items() if before[0].get(k) != v} == {}
    assert set(before[0]) == set(after[0])
    assert after[1:] == before[1:]
    assert not torch.distributed.is_initialized()
    # a failed run too, which also leaves no process group for the next run to reuse
    from neo_core.errors import TrainingError

    with pytest.raises(TrainingError, match="training diverged"):
        train(composed(["trainer=smoke", "trainer.world_size=1", "kernel.optimizer=sgd", "kernel.learning_rate=1e30",
                        "trainer.checkpoint_every_n_steps=1"], tmp_path / "diverged"))
    assert state() == before and not torch.distributed.is_initialized()


def test_a_run_that_saves_no_checkpoint_does_not_start_in_a_folder_that_holds_one(tmp_path: Path) -> None:
    # it replaced the earlier run's metrics, plan and logs, leaving that run's checkpoint beside
    # a record of another run (and its resume then failed, or mixed the two records)
    from neo_core.errors import ConfigError
    from neo_core.training.run import train

    first = train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.checkpoint=true"], tmp_path))
    kept = {name: (tmp_path / name).read_bytes() for name in ("metrics.json", "plan.json", "config.json")}
    with pytest.raises(ConfigError) as err:
        train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=3"], tmp_path))
    assert str(err.value).startswith(
        f"{tmp_path} holds the checkpoint of an earlier run (step {first['steps']}, {tmp_path / 'checkpoint'}) "
        "(this run saves no checkpoint, yet would replace that run's results and logs); continue it with "
        "trainer.resume=true"), str(err.value)
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept


def test_a_run_does_not_start_in_a_dry_runs_folder(tmp_path: Path) -> None:
    # it replaced plan.json and plan.txt with its own, leaving the dry run's plan.png beside them
    from neo_core.config import validate
    from neo_core.errors import ConfigError
    from neo_core.training.console import console_log
    from neo_core.training.run import check_before_start

    for name in ("plan.json", "plan.png", "plan.log"):
        (tmp_path / name).write_bytes(b"")
    run = validate(composed(["trainer=smoke"], tmp_path))
    with pytest.raises(ConfigError) as err, console_log(tmp_path / "train.log"):
        check_before_start(run, write=False)
    assert not (tmp_path / "train.log").exists()  # the refused run's transcript is not left there
    assert str(err.value) == (
        f"{tmp_path} holds a dry run of recipes/plan.py (plan.json, plan.png, plan.log), whose plan this run's "
        "plan.json and plan.txt would replace; choose another folder (hydra.run.dir=...; a sweep's: "
        "hydra.sweep.dir=...).")
    (tmp_path / "config.json").write_text("{}")  # a training run's (a dry run refused there left plan.log)
    assert check_before_start(run, write=False) == (None, [])
    (tmp_path / "config.json").unlink()
    (tmp_path / "plan.log").unlink()  # a training run's folder with a chart `neo chart` drew
    assert check_before_start(run, write=False) == (None, [])
    (tmp_path / "plan.log").write_text("error: ...")  # a dry run that failed: it left no plan
    (tmp_path / "plan.json").unlink()
    (tmp_path / "plan.png").unlink()
    assert check_before_start(run, write=False) == (None, [])


def test_a_stop_asked_of_ranks_that_finished_anyway_is_told_to_the_caller(tmp_path: Path, monkeypatch) -> None:
    # the ranks' starting process got a Ctrl-C during their last step: they finished (no agreement
    # point was left), and a sweep must not start its next job
    from neo_core.training import interrupt
    from neo_core.training.run import train

    real = interrupt.run_ranks
    monkeypatch.setattr(interrupt, "run_ranks", lambda *args, **kwargs: real(*args, **kwargs) or True)  # as if asked
    metrics = train(composed(["trainer=smoke", "trainer.max_steps=2"], tmp_path))
    assert metrics["steps"] == 2 and not metrics["interrupted"]
    assert interrupt.asked_as_it_finished() and not interrupt.asked_as_it_finished()  # told once
    monkeypatch.setattr(interrupt, "run_ranks", real)
    train(composed(["trainer=smoke", "trainer.max_steps=2"], tmp_path / "quiet"))
    assert not interrupt.asked_as_it_finished()  # not asked: nothing told


def test_a_second_crash_cannot_lose_the_checkpoint_a_first_left_unswapped(tmp_path: Path, monkeypatch) -> None:
    # a crash between a save's renames left the newest checkpoint in .tmp; the next save deleted
    # that .tmp before its own was finished, so a crash during it fell back to .old's older step.
    # And a delete cut short left a meta.json that passed for a finished checkpoint.
    from neo_core.training.checkpoint import _remove, latest_checkpoint, settle

    path = tmp_path / "checkpoint"

    def finished(folder: Path, step: int) -> None:
        folder.mkdir()
        (folder / ".metadata").write_text("index")
        (folder / "meta.json").write_text(json.dumps({"step": step}))

    finished(tmp_path / "checkpoint.old", 10)
    finished(tmp_path / "checkpoint.tmp", 20)  # finished; the crash came before it was renamed
    settle(path)
    assert latest_checkpoint(path) == (path, 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    # only .old is finished (the folder in its place lost its meta.json): it is moved back
    (path / "meta.json").unlink()
    finished(tmp_path / "checkpoint.old", 10)
    settle(path)
    assert latest_checkpoint(path) == (path, 10) and not (tmp_path / "checkpoint.old").exists()
    settle(path)  # settled: nothing to do
    assert latest_checkpoint(path) == (path, 10)
    # a folder being removed stops passing for a finished checkpoint first: a delete cut short
    # (here, one that removes nothing) leaves no newer "finished" checkpoint without its files
    import shutil

    finished(tmp_path / "checkpoint.tmp", 30)
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)
    _remove(tmp_path / "checkpoint.tmp")
    assert (tmp_path / "checkpoint.tmp").exists() and latest_checkpoint(path) == (path, 10)


def test_a_steps_time_ends_before_the_callbacks_that_follow_it() -> None:
    # a step's time ran to the module's own batch-end hook, which Lightning calls after every
    # callback's: a checkpoint every step put its saves into samples/s (9,675 -> 1,041)
    from types import SimpleNamespace

    from neo_core.training.checkpoint import DistributedCheckpoint
    from neo_core.training.module import NeoModule, StepClock

    module = SimpleNamespace(_step_started=time.perf_counter(), _step_times=[], device=SimpleNamespace(type="cpu"))
    module.end_step_timing = lambda: NeoModule.end_step_timing(module)  # type: ignore[arg-type]
    StepClock().on_train_batch_end(None, module, None, None, 0)  # type: ignore[arg-type]
    time.sleep(0.05)  # a save
    module.end_step_timing()  # the module's own hook: timed already, nothing added
    assert len(module._step_times) == 1 and module._step_times[0] < 0.05
    import lightning.pytorch as pl

    trainer = pl.Trainer(callbacks=[StepClock(), DistributedCheckpoint(Path("unused"))], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    assert isinstance(trainer.callbacks[0], StepClock)  # Lightning calls it first


def test_a_finished_run_is_not_reported_for_other_settings(tmp_path: Path, capsys) -> None:
    # a sweep run again with its values in another order resumed each finished job and reported
    # its results under the other job's settings (fp16's AUC labelled none)
    from neo_core.errors import ConfigError
    from neo_core.training.run import train

    settings = ["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2", "trainer.checkpoint=true"]
    first = train(composed(settings, tmp_path))
    with pytest.raises(ConfigError, match=r"holds a run that finished its 2 steps with other settings: "
                                          r"compression: 'none' -> 'fp16'.*Its results are not this run's"):
        train(composed([*settings, "trainer.resume=true", "compression=fp16"], tmp_path))
    # a setting that does not shape the results: the finished run's are reported
    capsys.readouterr()
    again = train(composed([*settings, "trainer.resume=true", "trainer.progress_bar=false"], tmp_path))
    assert "has finished its 2 steps already" in capsys.readouterr().out and again["val_auc"] == first["val_auc"]


def test_tables_start_from_the_same_weights_whatever_the_plan() -> None:
    # TorchRec draws each shard from its rank's generator: two plans of one model started from
    # different weights, so a sweep comparing plans by AUC measured initialisation noise too
    from types import SimpleNamespace

    import torch

    from neo_core.training.module import INIT_BLOCK_ROWS, seeded_table_init

    rows, dim = 2 * INIT_BLOCK_ROWS + 100, 8

    class Sharded:  # a ShardedTensor's view: global size and this rank's shards
        def __init__(self, shards):
            self.shards = shards

        def size(self):
            return (rows, dim)

        def local_shards(self):
            return [SimpleNamespace(metadata=SimpleNamespace(shard_offsets=o, shard_sizes=s), tensor=t)
                    for o, s, t in self.shards]

    def init(value, seed=7):
        seeded_table_init(SimpleNamespace(state_dict=lambda: {"ebc.embedding_bags.t0.weight": value}), seed)

    whole = torch.zeros(rows, dim)
    init(whole)  # replicated (data parallel)
    bound = (1 / rows) ** 0.5
    assert whole.abs().max() <= bound and whole.std() > bound / 2  # TorchRec's default distribution
    split = INIT_BLOCK_ROWS + 37  # a row split inside a block, and column shards
    pieces = [((0, 0), (split, 4)), ((0, 4), (split, 4)), ((split, 0), (rows - split, 8))]
    shards = [(o, s, torch.zeros(*s)) for o, s in pieces]
    init(Sharded(shards))
    for (r, c), (h, w), t in shards:
        assert torch.equal(t, whole[r:r + h, c:c + w])
    again = torch.zeros(rows, dim)
    init(again, seed=8)  # another seed, other weights
    assert not torch.equal(again, whole)


def test_a_plan_of_a_gib_or_more_is_announced_before_its_shards_are_built(monkeypatch, capsys) -> None:
    # DMP took seconds to build 30M-row tables with nothing on screen; a TorchRec plan, which has
    # no memory kinds of Neo's, was said nothing of (its tables' weights are counted from the model)
    import dataclasses

    import torch
    import torchrec.distributed.model_parallel as model_parallel

    from neo_core.api import plan_tables
    from neo_core.sharding import TableSpec
    from neo_core.training.module import NeoModule
    from neo_plugins.models import DLRMBuilder

    built: list[tuple[str, dict[str, Any]]] = []

    def dmp(model: Any, **kwargs: Any) -> Any:  # what was on screen as DMP started, and what it got
        built.append((capsys.readouterr().out, kwargs))
        return model

    monkeypatch.setattr(model_parallel, "DistributedModelParallel", dmp)
    topology = {"name": "zionex", "num_nodes": 1, "devices_per_node": 2}

    def shard(tables: list[TableSpec], plan: Any = None) -> str:
        model = DLRMBuilder(embedding_dim=16, dense_arch=[16], over_arch=[8, 1]).build(tables, 4, device="meta")
        plan = plan or plan_tables(tables, topology, 512)
        module = NeoModule(model, planner_fn=lambda m: plan, sharders_fn=list, kernel=None,  # type: ignore[arg-type]
                           trainer_cfg=None, global_batch_size=1024)  # type: ignore[arg-type]
        module.shard(torch.device("cpu"))
        assert module.model is model and built[-1][1]["plan"] is plan.torchrec_plan
        return built[-1][0]

    # 20M rows of 16 fp32 (1.19 GiB) and their row-wise Adagrad state (0.07 GiB), in the plan's figures
    big = [TableSpec("big", 20_000_000, 16, 1.0), TableSpec("small", 1000, 16, 1.0)]
    assert shard(big) == "building the tables' shards: 1.3 GiB of weights and optimizer state over 2 rank(s) ...\n"
    # a plan without Neo's memory kinds (TorchRec's): the weights, from the model's tables
    plan = plan_tables(big, topology, 512)
    bare = dataclasses.replace(plan, ranks=[dataclasses.replace(r, memory={}) for r in plan.ranks])
    assert shard(big, bare) == "building the tables' shards: 1.2 GiB of weights over 2 rank(s) ...\n"
    # under a GiB: built without a word
    assert shard([TableSpec("t", 1_000_000, 16, 1.0), TableSpec("u", 1000, 16, 1.0)]) == ""


@pytest.mark.parametrize(("checkpoint", "every", "val_batches", "expected"), [
    (True, 0, 2, "the ranks finish their step, then save a checkpoint (Ctrl-C again to stop at once)"),
    (False, 0, 2, "the ranks finish their step, validate and end, saving no checkpoint at the stop "
                  "(trainer.checkpoint=false) (Ctrl-C again"),
    # no validation to run; the periodic checkpoints are kept (it said "no checkpoint")
    (False, 5, 0, "the ranks finish their step, end, saving no checkpoint at the stop "
                  "(trainer.checkpoint=false; the checkpoints saved every 5 steps are kept)"),
])
def test_the_first_ctrl_c_says_whether_a_checkpoint_will_be_saved(checkpoint, every, val_batches, expected,
                                                                   capsys) -> None:
    # with trainer.checkpoint=false it promised a checkpoint, then reported none
    import signal

    from neo_core.config import TrainerConfig
    from neo_core.training.interrupt import StopOnInterrupt
    from neo_core.training.run import _after_stop

    trainer = TrainerConfig(checkpoint=checkpoint, checkpoint_every_n_steps=every, val_batches=val_batches)
    stop = StopOnInterrupt(1, alone=True, then=_after_stop(trainer))
    stop._handler(signal.SIGINT, None)
    said = capsys.readouterr().err
    assert stop.asked and stop.interrupted
    assert expected in said
    assert ("then save a checkpoint" in said) == checkpoint
    assert ("validate" in said) == (val_batches > 0 and not checkpoint)


def test_a_run_whose_loss_exploded_but_stayed_finite_is_warned_of(tmp_path: Path, capsys) -> None:
    # kernel.learning_rate=1e6: the loss went from 0.7 to 4.5e9 and the run printed "done" with
    # no word of it (the divergence error fires on NaN and inf only)
    from neo_core.training.run import train

    settings = ["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=20", "trainer.checkpoint=false",
                "trainer.progress_bar=false"]
    metrics = train(composed([*settings, "kernel.learning_rate=1e6"], tmp_path / "hot"))
    err = capsys.readouterr().err
    assert metrics["train_loss"] > 10 * metrics["history"][0]["loss"]
    assert "warning: the training loss grew from" in err and "lower the tables' learning rate" in err
    train(composed(settings, tmp_path / "calm"))
    assert "training loss grew" not in capsys.readouterr().err


def test_metrics_json_says_which_settings_each_resumed_stretch_trained_with(tmp_path: Path) -> None:
    # a run resumed with compression=fp16 after 2 steps of none was recorded as fp16 throughout
    from neo_core.training.run import train

    smoke = ["trainer=smoke", "trainer.world_size=1", "trainer.val_batches=1", "trainer.progress_bar=false",
             "trainer.checkpoint=true"]
    first = train(composed([*smoke, "trainer.max_steps=2"], tmp_path))
    [segment] = first["segments"]
    planned = json.loads((tmp_path / "plan.json").read_text())
    assert segment.pop("predicted_step_time_s") == planned["predicted_step_time_s"]
    assert len(segment.pop("plan_digest")) == 12
    assert segment == {"from_step": 1, "to_step": 2, "sharding": "neo", "kernel": "fused", "compression": "none",
                       "compression_precision": "fp32/fp32", "cache": "none", "cache_load_factor": None,
                       "cache_prefetch_pipeline": False, "global_batch_size": 64, "batch_size_per_rank": 64}
    more = train(composed([*smoke, "trainer.max_steps=4", "trainer.resume=true", "compression=fp16",
                           "compression.backward=fp8"], tmp_path))
    assert [(s["from_step"], s["to_step"], s["compression"]) for s in more["segments"]] == [(1, 2, "none"), (3, 4, "fp16")]
    assert more["compression"] == "fp16"  # the top-level fields: the last stretch's
    # the backward precision was recorded nowhere but config.json; one rank sends nothing, so said unused
    assert more["compression_precision"] == "fp16/fp8" and more["not_used"] == ["compression fp16"]
    same = train(composed([*smoke, "trainer.max_steps=5", "trainer.resume=true", "compression=fp16",
                           "compression.backward=fp8"], tmp_path))
    assert [(s["from_step"], s["to_step"], s["compression"]) for s in same["segments"]] == [(1, 2, "none"), (3, 5, "fp16")]
    assert json.loads((tmp_path / "metrics.json").read_text())["segments"] == same["segments"]
    # the same plugins, another plan (every table replicated): its steps are a stretch of their own,
    # with the plan's prediction (one stretch before: the run was said to have run one plan)
    other = train(composed([*smoke, "trainer.max_steps=6", "trainer.resume=true", "compression=fp16",
                            "compression.backward=fp8", "+sharding.sharding_types=[DP]"], tmp_path))
    assert [(s["from_step"], s["to_step"]) for s in other["segments"]] == [(1, 2), (3, 5), (6, 6)]
    assert other["segments"][2]["plan_digest"] != other["segments"][1]["plan_digest"]
    assert other["segments"][2]["predicted_step_time_s"] == other["predicted_step_time_s"]


def test_metrics_json_says_the_batch_each_resumed_stretch_ran_at(tmp_path: Path, capsys) -> None:
    # resumed with trainer.batch_size 64 -> 32, the segments held no batch size and the top-level
    # global_batch_size was the last stretch's; seed: 0 -> 3 was noted as if it changed the run
    from neo_core.training.run import train

    smoke = ["trainer=smoke", "trainer.world_size=1", "trainer.val_batches=1", "trainer.progress_bar=false",
             "trainer.checkpoint=true"]
    train(composed([*smoke, "trainer.max_steps=2"], tmp_path))
    capsys.readouterr()
    more = train(composed([*smoke, "trainer.max_steps=3", "trainer.resume=true", "trainer.batch_size=32", "seed=3"],
                          tmp_path))
    said = capsys.readouterr().out
    assert [(s["from_step"], s["to_step"], s["global_batch_size"], s["batch_size_per_rank"])
            for s in more["segments"]] == [(1, 2, 64, 64), (3, 3, 32, 32)]
    assert more["global_batch_size"] == 32 and more["batch_size_per_rank"] == 32  # the last stretch's
    assert "trainer.batch_size: 64 -> 32" in said
    assert ("seed: 0 -> 3 (no effect on a resumed run: its weights come from the checkpoint and its data from "
            "data.seed and the step)") in said
    assert "trainer.batch_size: 64 -> 32 (no effect" not in said


def test_a_run_recorded_before_a_settings_field_existed_resumes_as_one_stretch(tmp_path: Path) -> None:
    # a metrics.json without compression_precision and cache_prefetch_pipeline (fields added
    # since): resumed with the same settings, its steps were split as if a setting had changed
    from neo_core.training.run import train

    smoke = ["trainer=smoke", "trainer.world_size=1", "trainer.val_batches=1", "trainer.progress_bar=false",
             "trainer.checkpoint=true"]
    train(composed([*smoke, "trainer.max_steps=2"], tmp_path))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for record in (metrics, *metrics["segments"]):
        for key in ("compression_precision", "cache_prefetch_pipeline"):
            del record[key]
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    more = train(composed([*smoke, "trainer.max_steps=3", "trainer.resume=true"], tmp_path))
    assert [(s["from_step"], s["to_step"]) for s in more["segments"]] == [(1, 3)], more["segments"]


def test_metrics_json_says_a_cache_chosen_on_cpu_ranks_held_no_table(tmp_path: Path) -> None:
    # metrics.json recorded cache lru and its load factor, as if the tables trained behind it
    from neo_core.training.run import train

    metrics = train(composed(["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2", "trainer.val_batches=1",
                              "trainer.progress_bar=false", "trainer.checkpoint=false", "cache=lru"], tmp_path))
    assert metrics["cache"] == "lru" and metrics["cached_tables"] == 0 and metrics["not_used"] == ["cache lru"]
    assert metrics["predicted_by"] == "Neo's cost model" and metrics["predicted_step_time_s"] > 0
    assert metrics["topology"] == "local" and metrics["emulated_from"] is None


def test_a_ranks_threads_are_the_cores_the_process_may_use_not_the_hosts(monkeypatch) -> None:
    # in a container given 2 of a host's 64 cores os.cpu_count() says 64: 32 threads per rank of
    # 2 ranks then waited on 2 cores
    import os

    from neo_core.training import run

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7}, raising=False)
    assert run.usable_cores() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: (_ for _ in ()).throw(OSError("not permitted")),
                        raising=False)
    assert run.usable_cores() == 64  # a system that refuses to say
    monkeypatch.delattr(os, "sched_getaffinity")  # a system that does not say (macOS)
    assert run.usable_cores() == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # nor how many cores it has
    assert run.usable_cores() == 1


def test_a_launch_that_says_no_local_size_is_checked_as_torchrec_forms_its_nodes(monkeypatch) -> None:
    # a launcher that sets RANK and WORLD_SIZE but no LOCAL_WORLD_SIZE was taken as one machine of
    # every rank, where TorchRec forms nodes of 8: a 2 x 8 plan was refused that TorchRec runs, and
    # a plan of other nodes was held to 16 ranks a machine
    from neo_core.api import plan_tables
    from neo_core.errors import ConfigError
    from neo_core.sharding import TableSpec
    from neo_core.training.run import Launch, check_node_layout
    from tests.planner import cluster

    for name in ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    tables = [TableSpec(f"t{i}", 100_000, 32, 4.0) for i in range(3)]
    launch = Launch(16, "cpu", "gloo", external=True)
    two_by_eight, four_by_four = cluster(2, 8), cluster(4, 4)
    check_node_layout(plan_tables(tables, two_by_eight, 64, sharding_types=["TWRW"]), launch, two_by_eight)
    with pytest.raises(ConfigError, match=r"over nodes of 4 rank\(s\) .*, but 8 rank\(s\) share each machine here "
                                          r"\(TorchRec's default where no LOCAL_WORLD_SIZE is set: 8"):
        check_node_layout(plan_tables(tables, four_by_four, 64, sharding_types=["TWRW"]), launch, four_by_four)


def test_threads_are_each_ranks_cores_over_the_ranks_that_share_them() -> None:
    # each rank first takes its cores over its machine's ranks (LOCAL_WORLD_SIZE); once the
    # ranks see each other, the cores each may use over the ranks of its host that may use them
    from neo_core.training.run import threads_by_cores, threads_note

    def ranks(host: str, bound: list[tuple[int, ...] | None], now: int) -> list[tuple]:
        return [(1, 1, host, cores, now) for cores in bound]

    # a launcher binding each of 8 ranks to 16 cores of its own (srun --cpu-bind): 16 each, not 2
    bound = ranks("a", [tuple(range(16 * r, 16 * r + 16)) for r in range(8)], 2)
    assert threads_by_cores(bound) == [16] * 8
    assert threads_note(bound, threads_by_cores(bound)) == (
        "torch threads set by the cores the ranks may run on: 8 ranks (rank 0: 2 -> 16), 16 core(s) shared by 1 "
        "rank(s) on a (trainer.threads_per_rank sets them).")
    # the machine's ranks sharing its cores (a container's 2 of 64): as they took them, nothing said
    shared = ranks("a", [(3, 7)] * 2, 1)
    assert threads_by_cores(shared) == [1, 1] and threads_note(shared, [1, 1]) is None
    # two launches of one rank each on one 2-core host: each took both cores; now one each
    crowded = ranks("a", [(0, 1)], 2) + ranks("a", [(0, 1)], 2)
    assert threads_by_cores(crowded) == [1, 1]
    assert threads_note(crowded, [1, 1]).startswith(
        "torch threads set by the cores the ranks may run on: 2 ranks (rank 0: 2 -> 1), 2 core(s) shared by 2 rank(s)")
    # ranks on other hosts do not share this host's cores; a rank whose cores are unknown keeps
    # its threads, and is counted as sharing the cores of its host's others
    mixed = ranks("a", [(0, 1, 2, 3)], 2) + ranks("b", [(0, 1, 2, 3)], 2) + ranks("b", [None], 3)
    assert threads_by_cores(mixed) == [4, 2, 3]
    assert threads_note(mixed, [4, 2, 3]) == (
        "torch threads set by the cores the ranks may run on: rank 0: 2 -> 4, 4 core(s) shared by 1 rank(s) on a "
        "(trainer.threads_per_rank sets them).")
    # cores shared in part: each rank's over the ranks it shares any with
    assert threads_by_cores(ranks("a", [(0, 1, 2, 3), (2, 3, 4, 5), (4, 5, 6, 7)], 1)) == [2, 1, 2]


def test_ranks_sharing_a_host_are_warned_of_only_beyond_the_launchs_ranks_a_machine(monkeypatch) -> None:
    # two torchrun agents of 2 ranks each on one host: warned of; one launch of 2 ranks a machine
    # on each of two hosts, or its 2 ranks on one: as launched, nothing said
    from neo_core.training.run import ranks_sharing_a_host

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert ranks_sharing_a_host(["a", "a"]) is None
    assert ranks_sharing_a_host(["a", "a", "b", "b"]) is None
    said = ranks_sharing_a_host(["b", "a", "a", "a", "a", "b"])
    assert said is not None and said.startswith("ranks 1, 2, 3, 4 run on one host (a), though the launch says 2 a "
                                                "machine (LOCAL_WORLD_SIZE)"), said
    assert ranks_sharing_a_host(["h1"] + ["h0"] * 9).startswith("ranks 1, 2, 3, 4, 5, 6, 7, 8 ... run on one host (h0)")
    assert ranks_sharing_a_host(None) is None
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # a launcher that does not say its ranks a machine
    assert ranks_sharing_a_host(["a", "a", "a"]) is None


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_ranks_whose_starting_process_is_killed_as_they_start_end_at_once_and_free_the_folder(tmp_path: Path) -> None:
    # kill -9 of the starting process as its ranks started: they read their parent after their
    # slow start, found init, and trained the whole run with no one holding the folder; a
    # resumed run then trained beside them into one record
    import fcntl
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "recipes" / "train.py"), *ENDLESS, f"hydra.run.dir={out}"],
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and proc.poll() is None and time.monotonic() < deadline:
            ranks = [c for c in _children(proc.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
            time.sleep(0.05)
        assert len(ranks) == 2, proc.communicate(timeout=60)
        os.kill(proc.pid, signal.SIGKILL)  # the starting process alone, as the ranks start
        _, stderr = proc.communicate(timeout=120)  # the ranks hold its stderr: read to their end
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{r}").exists() for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(Path(f"/proc/{r}").exists() for r in ranks), stderr[-3000:]
    finally:
        for r in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r, signal.SIGKILL)
    assert not (out / "checkpoint").exists() and not (out / "metrics.json").exists()
    with open(out / ".neo-running", "a") as lock:  # no one holds the folder
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert f"error: the run's starting process (pid {proc.pid}) is gone (killed?): its ranks stop at once, keeping " \
           f"the last checkpoint; continue with the run's command and trainer.resume=true hydra.run.dir={out}" in stderr, \
        stderr[-3000:]
    # no semaphore of the killed process is left for the resource tracker to remove and warn of below that line
    assert "leaked semaphore" not in stderr, stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("then_sigterm", [False, True])
def test_a_rank_killed_outright_ends_the_run_with_its_checkpoint_and_the_command_that_continues_it(
        tmp_path: Path, then_sigterm: bool) -> None:
    # the out-of-memory killer's SIGKILL of one rank ended the run in torch's traceback, naming
    # neither the checkpoint nor how to continue; train.log held the same traceback. With a
    # SIGTERM just after (a preemption), the run said it stopped on SIGTERM and would save
    import re
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "recipes" / "train.py"), *ENDLESS, f"hydra.run.dir={out}"],
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint" / "meta.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [c for c in _children(proc.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        assert len(ranks) == 2, proc.communicate(timeout=60)
        os.kill(max(ranks), signal.SIGKILL)
        if then_sigterm:
            time.sleep(0.05)
            os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, stderr[-3000:]
    step = json.loads((out / "checkpoint" / "meta.json").read_text())["step"]
    said = re.search(r"error: rank [01] was ended by signal SIGKILL \(the out-of-memory killer ends processes so: "
                     r"`dmesg` says whether it did\); the other ranks were stopped; the last finished checkpoint is at "
                     rf"step (\d+) in {re.escape(str(out / 'checkpoint'))}; continue with: .*train\.py .*"
                     rf"trainer\.resume=true hydra\.run\.dir={re.escape(str(out))}", stderr)
    assert said and int(said.group(1)) == step, stderr[-3000:]
    assert "Traceback" not in stderr and said.group(0) in (out / "train.log").read_text()


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_ends_the_run_in_one_line_and_leaves_no_unfinished_save(
        tmp_path: Path) -> None:
    # a full disk (here a file-size limit, as `ulimit -f` sets) during a save ended in torch's
    # "CheckpointException ranks:dict_keys([0, 1])" and nine tracebacks, the transcript's own
    # among them, and the unfinished checkpoint.tmp kept the space
    import resource
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    out = tmp_path / "run"

    def limited() -> None:  # the shards are larger than 3 MB; the run's logs smaller
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 2**20, 3 * 2**20))

    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "train.py"), "trainer=smoke", "trainer.checkpoint=true",
                           f"hydra.run.dir={out}"], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          preexec_fn=limited, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = (f"error: saving the checkpoint of step 5 into {out / 'checkpoint.tmp'} failed (RuntimeError: ")
    assert said in proc.stderr and "MiB free on its disk); the unfinished save was removed and no checkpoint was " \
        "finished before it: make room (a full disk, or a file-size limit: `ulimit -f`) and run the command again" \
        in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and said in (out / "train.log").read_text()
    assert not (out / "checkpoint.tmp").exists() and not (out / "checkpoint").exists()

