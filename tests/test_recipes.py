"""recipes/train.py and recipes/plan.py end to end: bad input is one sentence, plugins are
selectable, sweeps run."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from neo_core.cli import script_command
from neo_core.config import register_plugin_options
from neo_core.errors import NeoError, PlanningError, PluginError
from neo_core.plugins import load_plugins
from neo_core.training.run import train
from tests import forked
from tests.conftest import ROOT, subprocess_env

CONF = ROOT / "conf"
RECIPE = ROOT / "recipes" / "train.py"
PLAN_RECIPE = ROOT / "recipes" / "plan.py"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
HUGE_TABLE = ("data.rows=[100000000000]", "data.num_sparse=1")


def run_recipe(*overrides: str, env: dict[str, str] | None = None, timeout: int = 300,
               cold: bool = False) -> subprocess.CompletedProcess:
    """``python recipes/train.py *overrides``: forked from preloaded imports (:mod:`tests.forked`),
    or ``cold``, a fresh interpreter that imports everything itself."""
    return forked.run(RECIPE, *overrides, env=env or subprocess_env(), timeout=timeout, cold=cold)


def assert_one_sentence(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def composed(*overrides: str, output_dir: Path) -> dict:
    register_plugin_options(CONF, plugins=load_plugins(autoload=False))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, f"output_dir={output_dir}", "trainer=smoke"])
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


# --- bad input: the Python API raises one sentence before any rank starts --------------------


@pytest.mark.parametrize(
    ("overrides", "error", "fragments"),
    [
        (("sharding.name=neoo",), PluginError, ("sharding.name", "Did you mean 'neo'?", "Available: neo, torchrec.")),
        (("+trainer.max_step=3",), NeoError, ("trainer.max_step", "Did you mean 'max_steps'?")),
        (("+kernel.learning_rat=0.1",), NeoError, ("kernel.learning_rat", "Did you mean kernel.learning_rate?")),
        (("+model.embedding_dm=8",), NeoError, ("model.embedding_dm", "Did you mean model.embedding_dim?")),
        (HUGE_TABLE, PlanningError, ("'t_cat_0'", "100,000,000,000 rows", "GiB", "over the", "of memory (each CPU rank's share of RAM) usable",
                                      "add memory (the ranks share this machine's RAM, so more ranks add none; where "
                                      "topology.memory_fraction=1 is too little, use a machine with more RAM",
                                      "GiB a rank at most (topology.memory_fraction=1)")),
        ((*HUGE_TABLE, "sharding=torchrec"), PlanningError, ("no plan that fits", "add memory (the ranks share")),
        (("kernel.learning_rate=inf",), NeoError, ("kernel.learning_rate must be a positive finite number, got inf",)),
        (("kernel=dense", "kernel.eps=-1"), NeoError, ("kernel.eps must be a positive finite number, got -1",)),
        (("cache=lru", "cache.prefetch_pipeline=maybe"), NeoError, ("cache.prefetch_pipeline must be true or false",)),
        (("kernel=dense", "+sharding.sharding_types=[TW,RW]"), NeoError,
         ("kernel dense replicates every table", "sharding.sharding_types=[RW,TW] leaves out DP")),
        (("model.dense_arch=5",), NeoError, ("model.dense_arch must be a list of layer sizes of 1 or more, got 5",)),
        (("model.embedding_dim=8",), NeoError, ("model.dense_arch must end with the embedding dim (8), got [64, 16]; "
                                               "e.g. model.dense_arch=[64,8].",)),
        (("model=dcnv2", "model.dcn_num_layers=-1"), NeoError,
         ("model.dcn_num_layers must be a positive whole number, got -1",)),
        (("data.num_dense=0",), NeoError, ("needs at least one dense feature, got 0 (data.num_dense",)),
        (("trainer.max_steps=2.5",), NeoError, ("trainer.max_steps must be a positive integer, got 2.5",)),
    ],
    ids=["unknown-plugin", "trainer-key", "kernel-key", "model-key", "huge-table-neo", "huge-table-torchrec",
         "infinite-lr", "negative-eps", "prefetch-not-bool", "dense-kernel-without-dp", "dense-arch-int", "dense-arch-dim",
         "dcn-layers", "no-dense-features", "steps-not-whole"],
)
def test_train_rejects_bad_input_before_ranks_start(tmp_path: Path, overrides, error, fragments) -> None:
    with pytest.raises(error) as err:
        train(composed(*overrides, output_dir=tmp_path))
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert not (tmp_path / "plan.json").exists()  # nothing was planned or started


def test_resume_without_a_checkpoint_starts_a_fresh_transcript(tmp_path: Path) -> None:
    # trainer.resume=true with nothing to resume from starts afresh: its transcript followed the
    # folder's earlier one as if it went on from it
    (tmp_path / "train.log").write_text("an earlier run's plan\nerror: it failed\n")
    proc = run_recipe("trainer=smoke", "trainer.max_steps=2", "trainer.world_size=1", "trainer.resume=true",
                      f"hydra.run.dir={tmp_path}", cold=True)  # one training run that imports for itself
    assert proc.returncode == 0, proc.stderr[-3000:]
    transcript = (tmp_path / "train.log").read_text()
    assert "an earlier run's" not in transcript and "---" not in transcript, transcript[:500]
    assert f"warning: trainer.resume=true but {tmp_path / 'checkpoint'} holds no checkpoint; starting from step 0." \
        in transcript and "done: 2 steps" in transcript


def test_recipe_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = run_recipe(*HUGE_TABLE, "trainer=smoke", f"hydra.run.dir={tmp_path}", cold=True)
    assert proc.returncode == 2
    assert_one_sentence(proc, "Table 't_cat_0'", "GiB", "over the")
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert (tmp_path / "train.log").read_text().splitlines()[-1] == error  # the run's transcript keeps it


def test_recipe_unknown_plugin_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = run_recipe("sharding.name=neoo", "trainer=smoke", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert_one_sentence(proc, "Unknown sharder plugin 'neoo' for sharding.name.", "Did you mean 'neo'?",
                        "Available: neo, torchrec.")


def test_recipe_misspelled_key_without_plus_suggests_the_right_one(tmp_path: Path) -> None:
    proc = run_recipe("trainer.max_step=3", "trainer=smoke", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, "trainer.max_step", "max_steps")


# --- recipes/plan.py: an unknown option names the key, the value and the group's choices ------


def run_plan(*overrides: str, timeout: int = 120, cold: bool = False) -> subprocess.CompletedProcess:
    """``python recipes/plan.py *overrides``, as :func:`run_recipe` runs train.py."""
    return forked.run(PLAN_RECIPE, *overrides, env=subprocess_env(), timeout=timeout, cold=cold)


def choices(group: str) -> str:
    """The options ``group=`` offers: YAML files plus built-in plugins (each is an option)."""
    names = {p.stem for p in (CONF / group).glob("*.yaml")}
    if group != "plan_model":
        names.update(load_plugins(autoload=False).registry(group).names())
    return ", ".join(sorted(names))


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("plan_model=nope", ("Unknown plan_model option 'nope'; choose one of " + choices("plan_model") + ".",
                             "Tables of your own: a file plan_model/<name>.yaml in a --config-dir, with "
                             "'generator: listed'")),
        ("model=zionex12t", ("Unknown model option 'zionex12t' (did you mean 'zionex_12t'?)", choices("plan_model"))),
        ("cache=lfru", ("Unknown cache option 'lfru'", "choose one of " + choices("cache") + ".")),
        ("sharding=neo,neoo", ("Unknown sharding option 'neoo' (did you mean 'neo'?)", choices("sharding"))),
    ],
    ids=["plan_model", "model-alias", "cache", "sweep-list"],
)
def test_plan_recipe_unknown_option_is_one_sentence_with_choices(tmp_path: Path, override: str, fragments) -> None:
    proc = run_plan("+topology=zionex", override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert_one_sentence(proc, *fragments)
    assert "Config search path" not in proc.stderr  # Hydra's own report did not follow
    assert not list(tmp_path.iterdir())  # stopped before planning


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (("sharding.estimtor=torchrec",), ("sharding.estimtor", "Did you mean sharding.estimator?")),
        (("topolgy.num_nodes=2",), ("Unknown key topolgy.", "Did you mean topology?")),
        (("modle=mlperf_dcnv2",), ("Unknown key modle.", "Did you mean model?", "plan_model (model)")),
        (("progress=false",), ("Unknown key progress.", "Did you mean sharding.progress?")),
        (("seed=3",), ("Unknown key seed. Keys here:",)),  # data.seed is train.py's: not offered here
        (("model=production_like", "plan_model.params.num_tabels=10"),
         ("'num_tabels'", "'production_like'", "Did you mean 'num_tables'?")),
        (("batch_size_per_rank=0",), ("batch_size_per_rank must be a positive integer, got 0.",)),
        (("model=production_like", "plan_model.params.num_tables=0"),
         ("model=production_like: plan_model.params (table set 'production_like'): num_tables must be at least 1, got 0.",)),
    ],
    ids=["plugin-key", "top-level-key", "model-alias-key", "key-without-group", "training-key", "generator-parameter",
         "zero-batch", "generator-value"],
)
def test_plan_recipe_bad_key_or_value_is_one_sentence_naming_it(tmp_path: Path, overrides, fragments) -> None:
    # plain dotted overrides, as a user types them: Neo names the key, not Hydra's struct error
    (tmp_path / "plan.json").write_text("{}")  # an earlier run's plan: not left to look current
    proc = run_plan("+topology=zionex", *overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert_one_sentence(proc, *fragments)
    assert "not in struct" not in proc.stderr
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("override", ["trainer=smoke", "+trainer=smoke", "+experiment=dcnv2", "model=dlrm",
                                      "model.embedding_dim=8", "data.num_samples=5"])
def test_plan_recipe_names_a_training_setting_as_train_pys(tmp_path: Path, override: str) -> None:
    # these used to end in Hydra's "Could not override", whose advice (+trainer=) then failed too
    proc = run_plan("+topology=zionex", override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert_one_sentence(proc, f"{override.lstrip('+')} is a setting of recipes/train.py",
                        "model=<mlperf_dcnv2 | production_like | zionex_12t>")
    assert not list(tmp_path.iterdir())


def test_plan_recipe_takes_a_table_sets_setting_under_its_alias_as_plan_models(tmp_path: Path) -> None:
    proc = run_plan("+topology=zionex", "model=mlperf_dcnv2", "model.global_batch=1000", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, "Unknown key model.global_batch. Did you mean plan_model.global_batch?")
    # a flag's value is no setting: a config folder named data is not train.py's data group
    (tmp_path / "data").mkdir()
    proc = run_plan("--config-dir", str(tmp_path / "data"), "+topology=zionex", "model=mlperf_dcnv2",
                    f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_plan_recipe_help_says_which_groups_are_train_pys() -> None:
    proc = run_plan("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "(trainer, data, experiment and the training models dcnv2 and dlrm belong to recipes/train.py.)" in groups
    listed = {line.split(":")[0].split(" (")[0].lstrip("+"): set(line.split(": ")[1].split(", "))
              for line in groups.splitlines() if ": " in line and not line.startswith("(")}
    listed["plan_model"] = listed.pop("model")
    # each of plan.py's groups with every option its folder has, and no other group
    assert listed == {g: {f.stem for f in (ROOT / "conf" / g).glob("*.yaml")} for g in (
        "topology", "plan_model", "sharding", "kernel", "cache", "compression")}


def test_a_bare_info_flag_after_the_overrides_shows_hydras_information_once() -> None:
    # moved before the overrides, a bare --info took +topology=zionex as its value ("invalid choice");
    # and a root log handler left by FBGEMM's import printed each line again as DEBUG:hydra._internal...
    proc = run_plan("+topology=zionex", "--info", cold=True)  # the handler comes with FBGEMM's import
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Installed Hydra Plugins" in proc.stdout and "Defaults List" in proc.stdout
    assert "DEBUG:" not in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_plan_recipe_says_when_a_cpu_plan_cannot_train_in_its_precision(tmp_path: Path) -> None:
    # train.py refuses fp8 over gloo for table-wise tables; the dry run for the same CPU ranks says so
    args = ("model=production_like", "plan_model.params.num_tables=20", "compression=fp16", "compression.backward=fp8")
    proc = run_plan(*args, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: this plan cannot train on these CPU ranks (gloo): compression 'fp16' sends fp8" in proc.stderr
    zionex = run_plan("+topology=zionex", *args, f"hydra.run.dir={tmp_path}")  # GPUs: NCCL carries fp8
    assert zionex.returncode == 0 and "cannot train on these CPU ranks" not in zionex.stderr


def test_plan_recipe_says_when_a_cpu_plan_cannot_train_with_its_kernel(tmp_path: Path) -> None:
    # train.py refuses FBGEMM's fused Adam on CPU ranks; the dry run for them says so, and
    # TorchRec's plans get the run's cache note too
    proc = run_plan("kernel.optimizer=adam", "sharding=torchrec", "cache=lru", "model=production_like",
                    "plan_model.params.num_tables=20", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: this plan cannot train on these CPU ranks: kernel.optimizer=adam: FBGEMM's fused kernel has no " \
           "Adam on CPU" in proc.stderr
    assert "note: cache lru not used: cpu ranks have no device memory" in proc.stdout, proc.stdout[-2000:]


def test_a_bare_plan_of_a_cluster_scale_table_set_leads_with_plan_py_planning_for_this_machine(tmp_path: Path) -> None:
    # `python recipes/plan.py` with its defaults (MLPerf's tables, no +topology=) planned 97 GiB
    # on two CPU ranks, and the way out (+topology=zionex) was one clause of a long message
    from neo_plugins.topology.local import _total_ram

    if _total_ram() >= 97 * 2**30:  # a machine that holds MLPerf's weights plans them (or says the planner's reason)
        pytest.skip("this machine's memory holds MLPerf's tables")
    proc = run_plan("topology.compute_device=cpu", f"hydra.run.dir={tmp_path}")  # (a CUDA host's local is its GPUs)
    assert proc.returncode == 2
    said = proc.stderr.strip().splitlines()[-1]
    machines = math.ceil(97.4 * 2**30 / _total_ram())  # like this one, for the weights alone
    assert said.startswith("error: The tables of model=mlperf_dcnv2 hold 97.4 GiB of weights, more than this "
                           "machine's 2 cpu rank(s) hold (") and \
        "without +topology=, plan.py plans for this machine (topology.num_nodes=N for N machines like it: the " \
        "planner's reason below says how many hold them, where any do); dry-run the cluster you plan for, e.g. " \
        "recipes/plan.py +topology=zionex model=mlperf_dcnv2. The planner's reason: Table 'cat_20'" in said, said
    # several machines like this one, still too few: said of them, with how many do hold them
    if machines > 2:
        proc = run_plan("topology.compute_device=cpu", "topology.num_nodes=2", f"hydra.run.dir={tmp_path / 'two'}")
        said = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and said.startswith(
            "error: The tables of model=mlperf_dcnv2 hold 97.4 GiB of weights, more than 2 machines like this one "
            "hold (4 cpu ranks) ("), said
        found = re.search(r"\(topology\.num_nodes=(\d+) or more, now 2; checked: the tables plan with it\)", said)
        assert found and int(found.group(1)) >= machines, said
    # a world size given counts every machine's ranks: num_nodes alone named would not split it
    proc = run_plan("topology.compute_device=cpu", "topology.world_size=4", f"hydra.run.dir={tmp_path / 'four'}")
    assert proc.returncode == 2 and "topology.num_nodes=" not in proc.stderr.replace("topology.num_nodes=N", ""), \
        proc.stderr[-2000:]
    # where the weights fit the machine, the planner's own message stands
    proc = run_plan("model=production_like", "plan_model.params.num_tables=20", "sharding.sharding_types=[TW]",
                    "topology.memory_fraction=0.001", f"hydra.run.dir={tmp_path / 'small'}")
    assert proc.returncode == 2 and "without +topology=" not in proc.stderr, proc.stderr[-2000:]


def test_a_group_selected_with_a_plus_is_selected(tmp_path: Path) -> None:
    # "+cache=lru" failed inside Hydra ("Multiple values for cache"); +topology= is the written form
    proc = run_plan("+topology=zionex", "topology.num_nodes=2", "+cache=lfu", "+compression=FP16",
                    f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and "Unknown compression option 'FP16' (did you mean 'fp16'?)" in proc.stderr
    proc = run_plan("+topology=zionex", "topology.num_nodes=2", "+cache=lfu", "+compression=fp16",
                    f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = (tmp_path / "plan.txt").read_text()
    assert "compression fp16 (fp16/fp16), cache lfu (load factor 0.2)" in plan, plan[-2000:]


def test_train_recipe_names_plan_recipe_settings(tmp_path: Path) -> None:
    for arg in ("plan_model=production_like", "model=zionex_12t", "batch_size_per_rank=64"):
        proc = run_recipe(arg, "trainer=smoke", f"hydra.run.dir={tmp_path}")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert_one_sentence(proc, f"{arg} is a setting of recipes/plan.py", "recipes/train.py trains model=<dlrm | dcnv2>")
    help_text = run_recipe("--help").stdout
    assert "(plan_model, the table sets for dry runs, belongs to recipes/plan.py.)" in help_text
    # its groups are its own: plan.py's table sets are not offered as one
    groups = help_text.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "model: dcnv2, dlrm" in groups and "plan_model:" not in groups and "zionex_12t" not in groups
    assert "`neo plugins` lists every key with its default" in help_text


def test_plan_recipe_accepts_a_plain_planner_override(tmp_path: Path) -> None:
    proc = run_plan("+topology=zionex", "topology.num_nodes=2", "sharding.refine=false",
                    f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 node(s) x 8 cuda rank(s) = 16 ranks" in proc.stdout, proc.stdout[:2000]
    assert json.loads((tmp_path / "plan.json").read_text())["topology"]["world_size"] == 16


def test_plan_recipe_plans_a_model_by_its_alias(tmp_path: Path) -> None:
    proc = run_plan("+topology=zionex", "model=mlperf_dcnv2", f"hydra.run.dir={tmp_path}", cold=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "26 tables" in proc.stdout and "predicted step" in proc.stdout
    assert len(json.loads((tmp_path / "plan.json").read_text())["tables"]) == 26
    assert json.loads((tmp_path / "plan.json").read_text())["notes"][0].startswith(  # which model it plans
        "table set: model=mlperf_dcnv2 (26 tables, ")
    assert "is not a whole number per rank" not in proc.stderr  # 65536 over 128 ranks
    assert (tmp_path / "plan.log").read_text() == proc.stdout  # the console's transcript
    again = run_plan("+topology=zionex", "model=mlperf_dcnv2", "topology.num_nodes=1", f"hydra.run.dir={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "plan.log").read_text() == again.stdout  # the earlier plan's transcript went with it


def test_plan_recipes_last_line_names_every_file_it_wrote_its_plan_log_too(tmp_path: Path) -> None:
    # the line named plan.json, plan.txt and plan.png, not the plan.log README says it writes
    proc = run_plan("+topology=zionex", "topology.num_nodes=1", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "wrote " + ", ".join(
        str(tmp_path / n) for n in ("plan.json", "plan.txt", "plan.png", "plan.log")), proc.stdout[-2000:]
    assert (tmp_path / "plan.log").read_text() == proc.stdout  # the line in it too


def test_plan_recipe_names_an_output_folder_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "plan.json").mkdir()
    proc = run_plan("+topology=zionex", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, f"{tmp_path / 'plan.json'} is in the way of the run's output")
    (tmp_path / "afile").write_text("")
    proc = run_plan("+topology=zionex", f"output_dir={tmp_path / 'afile' / 'x'}", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, f"output_dir='{tmp_path / 'afile' / 'x'}' cannot be written (Not a directory)")
    proc = run_plan("+topology=zionex", f"hydra.run.dir={tmp_path / 'afile'}")  # was Hydra's traceback
    assert_one_sentence(proc, f"hydra.run.dir={tmp_path / 'afile'} cannot hold the run's output (a file of that "
                              "name is in the way)")


def test_plan_recipe_leaves_a_training_runs_plan_alone(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "plan.json").write_text("the run's plan")
    proc = run_plan("+topology=zionex", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, f"{tmp_path} holds a training run (metrics.json), whose plan.json and plan.txt this "
                              "dry run would replace; choose another folder (hydra.run.dir=...; a sweep's: "
                              "hydra.sweep.dir=...).")
    assert (tmp_path / "plan.json").read_text() == "the run's plan"
    assert not (tmp_path / "plan.log").exists()  # a training run would take the folder for a dry run's
    (tmp_path / "metrics.json").unlink()
    (tmp_path / "config.json").write_text("{}")  # a training run that stopped before its first result
    proc = run_plan("+topology=zionex", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, f"{tmp_path} holds a training run (config.json)")
    assert (tmp_path / "plan.json").read_text() == "the run's plan"


def test_a_plan_sweep_leaves_a_training_jobs_folder_as_it_is(tmp_path: Path) -> None:
    # the refusal used to replace the training job's error.txt with its own; and with hydra.job.chdir
    # and a relative sweep folder, summary.csv went to a folder inside the last job's
    (tmp_path / "sw" / "0").mkdir(parents=True)
    (tmp_path / "sw" / "0" / "metrics.json").write_text("{}")
    (tmp_path / "sw" / "0" / "error.txt").write_text("the training job's error\n")
    proc = forked.run(PLAN_RECIPE, "-m", "hydra.sweep.dir=sw", "hydra.job.chdir=true", "+topology=zionex",
                      "topology.num_nodes=1", "model=mlperf_dcnv2", "batch_size_per_rank=64,128",
                      cwd=tmp_path, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (f"error: job #0 (+topology=zionex topology.num_nodes=1 model=mlperf_dcnv2 batch_size_per_rank=64): "
            f"{tmp_path / 'sw' / '0'} holds a training run (metrics.json)") in proc.stderr
    assert (tmp_path / "sw" / "0" / "error.txt").read_text() == "the training job's error\n"
    assert sorted(p.name for p in (tmp_path / "sw" / "0").iterdir()) == [".hydra", "error.txt", "metrics.json"]
    assert json.loads((tmp_path / "sw" / "1" / "plan.json").read_text())["tables"]
    assert "#0 batch_size_per_rank=64: not run (its folder is another run's)" in proc.stdout
    assert "1 job(s) of the sweep failed:\n" in proc.stderr
    rows = (tmp_path / "sw" / "summary.csv").read_text().splitlines()
    assert rows[1].startswith("0,") and ",not run" in rows[1] and rows[2].startswith("1,") and ",done," in rows[2]
    # any other refusal of a folder is the job's own failure, kept in its error.txt
    (tmp_path / "sw2" / "0" / "plan.json").mkdir(parents=True)
    proc = run_plan("-m", f"hydra.sweep.dir={tmp_path / 'sw2'}", "+topology=zionex", "topology.num_nodes=1",
                    "model=mlperf_dcnv2", "batch_size_per_rank=64,128")
    assert proc.returncode == 2 and "1 job(s) of the sweep failed (each folder's error.txt says why):" in proc.stderr
    assert "plan.json is in the way" in (tmp_path / "sw2" / "0" / "error.txt").read_text()


def test_plan_recipe_says_when_the_global_batch_is_rounded(tmp_path: Path) -> None:
    # samples/s and the plan are for the batch that is planned, not the one asked for
    # (1e3: a whole number written as a float is taken as one)
    proc = run_plan("+topology=zionex", "model=mlperf_dcnv2", "plan_model.global_batch=1e3", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plan_model.global_batch=1000 is not a whole number per rank on 128 ranks; planning for 7 per rank " \
        "(896 in all)" in proc.stderr
    assert "batch 7/rank" in proc.stdout and json.loads((tmp_path / "plan.json").read_text())["batch_size_per_rank"] == 7


def test_plan_recipe_selects_a_plugin_by_name_with_its_own_defaults(tmp_path: Path) -> None:
    # kernel.name=dense alone would keep the fused option's optimizer (rowwise_adagrad), which
    # the dense kernel refuses; as kernel=dense it gets the dense option's own keys
    proc = run_plan("+topology=zionex", "kernel.name=dense", "model=production_like",
                    "plan_model.params.num_tables=10", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {t["sharding_type"] for t in json.loads((tmp_path / "plan.json").read_text())["tables"]} == {
        "data_parallel"}
    proc = run_plan("kernel=fused", "kernel.name=dense", f"hydra.run.dir={tmp_path / 'both'}")
    assert proc.returncode == 2
    assert_one_sentence(proc, "kernel=fused and kernel.name=dense both select the kernel", "keep one (kernel=dense")


# --- third-party plugin selected from the command line ---------------------------------------


SELECT_SCRIPT = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from neo_core.config import instantiate, register_plugin_options, validate
register_plugin_options(sys.argv[1])
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose(config_name="train", overrides=sys.argv[2:] + ["output_dir=unused"])
run = validate(OmegaConf.to_container(cfg, resolve=True))
cache = instantiate("cache", run.cache)
topo = instantiate("topology", run.topology)
print(json.dumps({"cache": run.cache, "policy": [cache.name, cache.load_factor, cache.algorithm],
                  "topology": [topo.name, topo.world_size]}))
"""


def test_installed_plugin_is_selectable_by_option_and_by_name(plugin_site) -> None:
    env = subprocess_env(plugin_site["neo_example_plugin"])
    overrides = ["cache=my_policy_half", "+topology=tiny_cluster", "topology.num_nodes=4"]
    proc = subprocess.run([sys.executable, "-c", SELECT_SCRIPT, str(CONF), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {
        "cache": {"name": "my_policy", "load_factor": 0.5},
        "policy": ["my_policy", 0.5, "lfu"],
        "topology": ["tiny_cluster", 4],
    }


def test_a_plugin_cache_options_own_share_wins_over_the_table_sets(plugin_site, tmp_path: Path) -> None:
    # my_policy_half is {"load_factor": 0.5}: a share given by choosing it, which the table set's
    # 0.1 silently replaced (a sweep over such options planned each at 0.1); my_policy alone
    # (no share) takes the table set's, with its own LFU eviction, where it became LRU
    env = subprocess_env(plugin_site["neo_example_plugin"])
    common = ["+topology=zionex", "topology.num_nodes=2", "model=mlperf_dcnv2", "plan_model.cache_load_factor=0.1"]
    for option, expected in (("my_policy_half", "load factor 0.5"), ("my_policy", "load factor 0.1")):
        proc = forked.run(PLAN_RECIPE, *common, f"cache={option}", f"hydra.run.dir={tmp_path / option}", env=env,
                          timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = next(line for line in proc.stdout.splitlines() if "cache my_policy (" in line)
        assert expected in said and "LFU" in said, said
    # the project's lru option gives the default share: the table set's replaces it, and says so
    proc = run_plan(*common, "cache=lru", f"hydra.run.dir={tmp_path / 'lru'}")
    assert proc.returncode == 0 and "cache lru (load factor 0.1)" in proc.stdout, proc.stderr[-3000:]
    assert ("note: cache lru holds plan_model.cache_load_factor=0.1 of each cached table's rows, the share this "
            "table set is sized for, not its own 0.2; cache.load_factor=<share> sets another") in proc.stderr


def test_a_plan_names_a_plugin_by_its_registered_name_not_its_objects_own(tmp_path: Path) -> None:
    # lru_clone's policy calls itself lru: plan.txt, plan.json (and so a sweep's summary.csv,
    # read from it) said "cache lru", which the user could not tell from the built-in
    (tmp_path / "lru_clone_plugin.py").write_text(textwrap.dedent("""
        from neo_core import hookimpl
        from neo_core.cache import CachePolicy


        def lru_clone(load_factor: float = 0.3) -> CachePolicy:
            return CachePolicy(name="lru", load_factor=load_factor)


        @hookimpl
        def neo_register_cache_policies(registry):
            registry.register("lru_clone", lru_clone)
    """))
    env = subprocess_env(tmp_path, NEO_PLUGINS="lru_clone_plugin")
    out = tmp_path / "plan"
    proc = forked.run(PLAN_RECIPE, "+topology=zionex", "topology.num_nodes=2", "cache=lru_clone",
                      f"hydra.run.dir={out}", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cache lru_clone (LRU eviction, load factor 0.3)" in (out / "plan.txt").read_text()
    plan = json.loads((out / "plan.json").read_text())
    assert plan["settings"]["cache"]["name"] == "lru_clone"
    assert any(n.startswith("kernel fused (") and "cache lru_clone (" in n for n in plan["notes"]), plan["notes"]
    assert ("note: cache policy plugin 'lru_clone' (NEO_PLUGINS lru_clone_plugin) calls its CachePolicy 'lru'; "
            "Neo's reports name it 'lru_clone', the name it is selected by.") in proc.stderr


def test_both_recipes_help_lists_an_installed_plugins_options(plugin_site) -> None:
    # a plugin's options are selected like conf/'s; --help listed conf/'s YAML files only
    env = subprocess_env(plugin_site["neo_example_plugin"])
    for recipe in (PLAN_RECIPE, RECIPE):
        proc = subprocess.run([sys.executable, str(recipe), "--help"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        groups = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
        lines = {line.split(":")[0].lstrip("+"): line for line in groups.splitlines() if ": " in line}
        assert "my_policy, my_policy_half, none" in lines["cache"], (recipe.name, lines["cache"])
        assert "tiny_cluster" in lines["topology"] and "zionex" in lines["topology"], (recipe.name, lines)


@pytest.mark.slow
def test_recipe_trains_with_installed_plugin_on_emulated_zionex(plugin_site, tmp_path: Path) -> None:
    """One real run: ZionEX emulated on the local ranks, the third-party cache policy selected by
    name, and the broken plugin skipped with a message naming it."""
    env = subprocess_env(*plugin_site.values())
    proc = run_recipe("+topology=zionex", "cache.name=my_policy", "trainer=smoke", "trainer.max_steps=2",
                      "topology.inter_node_bw_gbps=200", f"hydra.run.dir={tmp_path}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Emulating zionex (16 nodes x 8 cuda) on 2 local cpu rank(s)" in proc.stdout
    # what a plugin says as it is built is said once, not again by each rank that builds it
    assert proc.stderr.count("warning: topology.inter_node_bw_gbps=200 is GB/s") == 1, proc.stderr[-3000:]
    assert "note: the predicted step is the embedding tables' share" in proc.stdout  # not the whole step's
    assert "Neo plugin 'broken' failed to load and was skipped" in proc.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["topology"] == "zionex" and metrics["cache"] == "my_policy"
    assert metrics["emulated_from"] == "zionex (16x8)"  # planned for the cluster, run on these ranks
    # the cores split between the machine's 2 ranks: Lightning gave each of them every core, as a
    # node of one rank (the emulated 2 nodes x 1) would have, and samples/s fell 10-25x
    from neo_core.training.run import usable_cores

    assert metrics["threads_per_rank"] == max(1, usable_cores() // 2)
    # selected as an option: the plugin's own defaults, not the replaced option's keys
    assert json.loads((tmp_path / "config.json").read_text())["cache"] == {
        "name": "my_policy", "load_factor": None, "algorithm": "lfu"}
    assert (tmp_path / "plan.json").exists()


@pytest.mark.slow
def test_the_spawned_ranks_run_the_plan_printed_whatever_their_plugins_would_plan(plugin_site, tmp_path: Path) -> None:
    # a topology whose figures depend on the process (here: 100x slower inter-node links in the
    # ranks than in the process that starts them). Each rank planned again, and ran its own plan
    # (plan.json then had to be rewritten, with a warning); the ranks are now given the plan the
    # starting process made, printed and saved, and run it
    env = subprocess_env(plugin_site["neo_example_plugin"])
    proc = run_recipe("+topology=tiny_cluster", "topology.skew=ranks", "trainer=smoke", "trainer.max_steps=2",
                      f"hydra.run.dir={tmp_path}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "built another plan" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["topology"]["inter_node_bw"] == 1e9  # the starting process's topology: the plan printed
    step = f"predicted step {plan['predicted_step_time_s'] * 1e3:.3f} ms"
    assert step in proc.stdout and step in (tmp_path / "plan.txt").read_text()
    assert json.loads((tmp_path / "metrics.json").read_text())["predicted_step_time_s"] == plan["predicted_step_time_s"]


@pytest.mark.slow
def test_sweep_over_every_experiment(tmp_path: Path) -> None:
    proc = run_recipe("-m", f"experiment={','.join(EXPERIMENTS)}", "trainer=smoke", "trainer.max_steps=2",
                      f"hydra.sweep.dir={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == len(EXPERIMENTS)
    metrics = {}
    for job in jobs:
        overrides = OmegaConf.load(job / ".hydra" / "overrides.yaml")
        experiment = next(o.split("=", 1)[1] for o in overrides if o.startswith("experiment="))
        metrics[experiment] = json.loads((job / "metrics.json").read_text())
        assert metrics[experiment]["steps"] == 2, job
        assert json.loads((job / "config.json").read_text())["experiment"] == experiment  # the run's record
    assert set(metrics) == set(EXPERIMENTS)
    assert metrics["torchrec_baseline"]["sharding"] == "torchrec"
    assert metrics["unfused_baseline"]["kernel"] == "dense"
    assert metrics["fp16_comms"]["compression"] == "fp16"
    assert metrics["dcnv2"]["model"] == "dcnv2"
    assert metrics["zionex_emulated"]["topology"] == "zionex"
    assert "Emulating zionex" in proc.stdout


def test_plan_recipe_takes_options_from_an_added_config_dir(tmp_path: Path) -> None:
    # a user's own cluster, next to the shipped ones: --config-dir adds its folder to Hydra's
    # search path, and Neo's option check must look there too
    user = tmp_path / "conf"
    (user / "topology").mkdir(parents=True)
    (user / "topology" / "my_cluster.yaml").write_text(
        "name: zionex\nnum_nodes: 3\ndevices_per_node: 4\ndevice_memory_gib: 40.0\n"
    )
    (user / "plan_model").mkdir()
    (user / "plan_model" / "my_model.yaml").write_text(
        "generator: mlperf_dcnv2\nparams:\n  embedding_dim: 64\nglobal_batch: 4096\n"
    )
    run_dir = tmp_path / "run"
    proc = run_plan("--config-dir", str(user), "topology=my_cluster", "model=my_model", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 node(s) x 4 cuda rank(s) = 12 ranks" in proc.stdout, proc.stdout[:2000]
    assert {t["shard_shapes"][0][1] for t in json.loads((run_dir / "plan.json").read_text())["tables"]} <= {64, 32, 16}
    # an option in neither folder is still named, with the added one's choices
    proc = run_plan(f"--config-dir={user}", "topology=my_clustr", f"hydra.run.dir={run_dir}")
    assert_one_sentence(proc, "Unknown topology option 'my_clustr' (did you mean 'my_cluster'?)", "local")
    # tables of one's own, listed ("Unknown key plan_model.tables" before: only the generators)
    listed = ("generator: listed\nparams:\n  tables:\n"
              "    - {name: user_id, num_embeddings: 5000000, embedding_dim: 64, pooling_factor: 1.0}\n"
              "    - {name: item_id, num_embeddings: 2000000, embedding_dim: 32, pooling_factor: 20.0}\n")
    (user / "plan_model" / "my_tables.yaml").write_text(listed)
    proc = run_plan("--config-dir", str(user), "topology=my_cluster", "model=my_tables", f"hydra.run.dir={tmp_path / 'own'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = json.loads((tmp_path / "own" / "plan.json").read_text())["tables"]
    assert [t["name"] for t in tables] == ["user_id", "item_id"]
    (user / "plan_model" / "my_tables.yaml").write_text(listed.replace("num_embeddings: 2000000", "num_embedings: 2000000"))
    proc = run_plan("--config-dir", str(user), "topology=my_cluster", "model=my_tables", f"hydra.run.dir={tmp_path / 'own'}")
    assert_one_sentence(proc, "model=my_tables: plan_model.params (table set 'listed'): tables[1] ('item_id') has an unknown field "
                              "'num_embedings'. Did you mean 'num_embeddings'?")
    # tables at the top level, without a generator: named, not a KeyError traceback
    (user / "plan_model" / "my_tables.yaml").write_text("tables:\n  - {name: user_id, num_embeddings: 500, embedding_dim: 8}\n")
    proc = run_plan("--config-dir", str(user), "topology=my_cluster", "model=my_tables", f"hydra.run.dir={tmp_path / 'own'}")
    assert_one_sentence(proc, "model=my_tables: plan_model.generator is not set: a table set names its generator (")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("cache=lfu",), "cache lfu (load factor 0.1)"),  # the model's share, the policy's eviction
        (("cache=lfu", "cache.load_factor=0.3"), "cache lfu (load factor 0.3)"),  # the user's share
        ((), "cache lru (load factor 0.1)"),  # no cache selected: LRU at the model's share
        (("cache=none",), "cache none"),  # said so: no cache
        (("cache.load_factor=0.3",), "cache lru (load factor 0.3)"),  # a share alone: LRU at it
        (("cache.prefetch_pipeline=true",), "cache lru (load factor 0.1, prefetch pipeline)"),  # another key alone: LRU
    ],
    ids=["model-share", "user-share", "default-lru", "said-none", "share-alone", "prefetch-alone"],
)
def test_plan_recipe_applies_the_models_cache_share_unless_one_is_given(tmp_path: Path, overrides, expected) -> None:
    proc = run_plan("+topology=zionex", "topology.num_nodes=2", "model=mlperf_dcnv2",
                    "plan_model.cache_load_factor=0.1", *overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout, proc.stdout[-2000:]


def test_a_cache_key_without_a_cache_policy_selects_lru_in_both_recipes(tmp_path: Path) -> None:
    # plan.py planned cache.prefetch_pipeline=true with cache=lru; train.py refused it and
    # suggested cache=lfu, which refuses prefetch_pipeline=true
    from neo_core.cli import cache_keys_select_lru

    for config_name in ("plan", "train"):
        argv, note = cache_keys_select_lru(["cache.prefetch_pipeline=true"], CONF, config_name, "training")
        assert argv == ["cache.prefetch_pipeline=true", "cache=lru"]
        assert note == ("note: cache.prefetch_pipeline without a cache policy: training with cache=lru (the default, "
                        "none, takes no keys)")
    for chosen in (["cache=lfu"], ["cache.name=lfu"], ["+cache=none"]):
        assert cache_keys_select_lru([*chosen, "cache.load_factor=0.1"], CONF, "train", "training") == (
            [*chosen, "cache.load_factor=0.1"], None)
    # an experiment (of a --config-dir) that selects a cache keeps it
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "cached.yaml").write_text("# @package _global_\ndefaults:\n"
                                                                  "  - override /cache: lfu\n")
    given = ["--config-dir", str(tmp_path / "conf"), "experiment=cached", "cache.load_factor=0.1"]
    assert cache_keys_select_lru(given, CONF, "train", "training") == (given, None)
    assert cache_keys_select_lru(given[:2] + given[3:], CONF, "train", "training")[0][-1] == "cache=lru"
    proc = run_recipe("trainer=smoke", "trainer.world_size=1", "trainer.max_steps=1", "trainer.val_batches=0",
                      "cache.prefetch_pipeline=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: cache.prefetch_pipeline without a cache policy: training with cache=lru" in proc.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["cache"]["name"] == "lru"


def test_plan_recipe_sweeps_plan_models_by_their_model_name(tmp_path: Path) -> None:
    proc = run_plan("-m", "+topology=zionex", "topology.num_nodes=2", "model=mlperf_dcnv2,production_like",
                    "cache.load_factor=0.3", f"hydra.sweep.dir={tmp_path}")  # a share alone: LRU, after -m
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "0" / "plan.json").is_file() and (tmp_path / "1" / "plan.json").is_file()
    assert "26 tables" in proc.stdout and "500 tables" in proc.stdout, proc.stdout[-2000:]
    assert proc.stdout.count("cache lru (load factor 0.3)") == 2, proc.stdout[-2000:]
    launched = [line for line in (proc.stdout + proc.stderr).splitlines() if "[HYDRA] \t#" in line]
    assert len(launched) == 2 and launched[0].endswith(  # the overrides as typed, not as the recipe passes them
        "#0 : +topology=zionex topology.num_nodes=2 model=mlperf_dcnv2 cache.load_factor=0.3 cache=lru"), launched
    # the summary says how each plan shards and where its traffic goes, as its plan.json does
    plan = json.loads((tmp_path / "0" / "plan.json").read_text())
    intra, inter = (sum(r["comm_bytes"].get(k, 0.0) for r in plan["ranks"]) / 2**20 for k in ("intra_node", "inter_node"))
    types = next(n for n in plan["notes"] if n.startswith("types: ")).removeprefix("types: ").replace(", ", " + ")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("  #0 model=mlperf_dcnv2:"))
    assert intra > 0 and inter > 0 and " + " in types, (intra, inter, types)  # two nodes: both links
    assert (f"types {types}, intra-node all ranks {intra:,.0f} MiB per step, inter-node all ranks {inter:,.0f} MiB "
            "per step") in row, row
    busiest = max(r["comm_bytes"].get("inter_node", 0.0) for r in plan["ranks"]) / 2**20
    assert 0 < busiest < inter  # one rank's share of the total
    assert f"busiest rank inter-node {busiest:,.1f} MiB per step" in row and "ranks 16," in row, row  # two nodes of 8


def test_a_plan_sweeps_summary_gives_the_batch_and_the_fullest_memory(tmp_path: Path) -> None:
    # a rank-count sweep holds the global batch, so each rank's batch shrinks, and a cache sweep
    # is explained by device memory: neither was in summary.csv, only in each job's log
    import csv

    proc = run_plan("-m", "+topology=zionex", "model=mlperf_dcnv2", "topology.num_nodes=1,2",
                    "topology.device_memory_gib=12", "cache.load_factor=0.05", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = list(csv.DictReader((tmp_path / "summary.csv").open()))
    for num, job in enumerate(table):
        plan = json.loads((tmp_path / str(num) / "plan.json").read_text())
        world = len(plan["ranks"])
        assert (int(job["batch/rank"]), int(job["global batch"])) == (65536 // world, 65536), job
        # the reserve (15% of the device) left out of both: it grew with the device, so one plan
        # swept over device sizes read as more memory used on larger devices
        used = max(r["memory_total_bytes"] - r["memory_bytes"]["reserve"] for r in plan["ranks"])
        assert float(job["fullest rank device memory without the reserve (GiB)"]) == pytest.approx(used / 2**30)
        assert float(job["fullest rank device memory capacity (GiB)"]) == 12.0
        nodes = plan.get("nodes")  # where a table is in host memory: the fullest node's, against the node's
        host = (job["fullest node host memory (GiB)"], job["fullest node host memory capacity (GiB)"])
        if nodes:
            node = max(nodes, key=lambda n: n["host_memory_bytes"] / n["host_memory_capacity_bytes"])
            assert [float(h) for h in host] == pytest.approx(
                [node["host_memory_bytes"] / 2**30, node["host_memory_capacity_bytes"] / 2**30])
        else:
            assert host == ("", ""), job
        # the bytes moved are per step, over all ranks
        intra = sum(r["comm_bytes"].get("intra_node", 0.0) for r in plan["ranks"]) / 2**20
        assert float(job["intra-node all ranks (MiB per step)"]) == pytest.approx(intra)
    assert [len(json.loads((tmp_path / n / "plan.json").read_text()).get("nodes", [])) for n in "01"] == [1, 0]
    # the printed line gives the batch per rank and the fullest memory, used of capacity
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  #")]
    memory = [float(job["fullest rank device memory without the reserve (GiB)"]) for job in table]
    assert "ranks 8, batch/rank 8,192," in rows[0] and "ranks 16, batch/rank 4,096," in rows[1], rows
    assert (f"fullest rank device memory without the reserve {memory[0]:,.2f} of 12.00 GiB, fullest node host "
            "memory ") in rows[0], rows
    assert rows[1].endswith(f"fullest rank device memory without the reserve {memory[1]:,.2f} of 12.00 GiB"), rows
    assert "global batch" not in rows[0]  # in summary.csv: the line is long already


def test_a_plan_sweeps_summary_gives_the_cached_tables_hit_rate_weighted_by_their_lookups() -> None:
    # summary.csv said how many tables were cached, not how often their cache hits: the row's
    # "cache hit rate" is the cached tables' predicted rates, weighted by their ids per sample
    import importlib.util

    from neo_core.api import plan_tables
    from neo_core.cache import CachePolicy
    from neo_core.sharding import TableSpec
    from neo_plugins.topology.zionex import zionex_topology

    spec = importlib.util.spec_from_file_location("plan_recipe", PLAN_RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    # 16 tables of 1.43 GiB on 8 ranks of 2 GiB: half behind the cache; odd ones hot, every fourth pools 2 ids
    tables = [TableSpec(f"t{i}", 6_000_000, 64, 2.0 if i % 4 == 0 else 8.0, hot_fraction=0.5 if i % 2 else None)
              for i in range(16)]
    cached = plan_tables(tables, zionex_topology(num_nodes=1, device_memory_gib=2.0), 4096,
                         cache=CachePolicy("lru", load_factor=0.05), sharding_types=["TW"])
    rated = [(a.predicted_hit_rate, a.spec["pooling_factor"]) for a in cached.tables if a.predicted_hit_rate is not None]
    assert len(rated) == cached.cached_tables > 1 and len({r for r, _ in rated}) == 2 and len({w for _, w in rated}) == 2
    weighted = sum(r * w for r, w in rated) / sum(w for _, w in rated)
    assert weighted != pytest.approx(sum(r for r, _ in rated) / len(rated))  # the weights matter here
    row = recipe.SWEEP.row(cached)
    assert row["cache hit rate"] == (pytest.approx(weighted), ".1%")
    assert list(row).index("cache hit rate") == list(row).index("cached tables") + 1
    # nothing cached: empty in summary.csv ("n/a" in the printed line), no panel of its own
    roomy = plan_tables(tables, zionex_topology(num_nodes=1), 4096, cache=CachePolicy("lru", load_factor=0.05),
                        sharding_types=["TW"])
    assert roomy.cached_tables == 0 and recipe.SWEEP.row(roomy)["cache hit rate"][0] is None


def test_a_plan_of_more_local_ranks_than_cores_says_they_share_them(tmp_path: Path) -> None:
    # a what-if of 4 ranks on a 2-core machine predicted twice the samples/s of 2 ranks; measured, fewer
    from neo_core.training.run import usable_cores

    cores = usable_cores()
    common = ["model=production_like", "plan_model.params.num_tables=20"]
    proc = run_plan(*common, f"topology.world_size={cores + 2}", f"hydra.run.dir={tmp_path / 'more'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = (f"{cores + 2} ranks on this machine's {cores} core(s): the cost model gives each rank a core of its own, "
            "so ranks sharing cores train slower than predicted")
    assert said in proc.stdout and said in (tmp_path / "more" / "plan.txt").read_text()
    proc = run_plan(*common, "topology.world_size=1", f"hydra.run.dir={tmp_path / 'one'}")
    assert proc.returncode == 0 and "ranks sharing cores" not in proc.stdout, proc.stderr[-3000:]
    # a dry run of several machines like this one: each has its own cores (it said 24 ranks on 2 cores for 12)
    proc = run_plan(*common, "topology.num_nodes=3", f"topology.world_size={3 * cores}", f"hydra.run.dir={tmp_path / 'three'}")
    assert proc.returncode == 0 and "ranks sharing cores" not in proc.stdout, proc.stderr[-3000:]
    proc = run_plan(*common, "topology.num_nodes=2", f"topology.world_size={2 * cores + 2}",
                    f"hydra.run.dir={tmp_path / 'two'}")
    assert f"{cores + 1} ranks on each machine's (like this one's) {cores} core(s)" in proc.stdout, proc.stdout[-2000:]


def test_a_ctrl_c_in_a_plan_sweep_says_which_jobs_wrote_their_plans(tmp_path: Path) -> None:
    # it said "interrupted: no plan was written" after job #0 had written its plan, and kept no summary
    wrapper = tmp_path / "stopped_plan_sweep.py"
    wrapper.write_text(textwrap.dedent(f"""
        import runpy, sys
        from neo_plugins.sharding.planner import report

        save_all, calls = report.save_all, []

        def stop_at_the_second(result, out):  # a Ctrl-C as job #1 is about to write its plan
            calls.append(out)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return save_all(result, out)

        report.save_all = stop_at_the_second
        sys.argv = [{str(PLAN_RECIPE)!r}, *sys.argv[1:]]
        runpy.run_path({str(PLAN_RECIPE)!r}, run_name="__main__")
    """))
    sweep = tmp_path / "sweep"
    proc = forked.run(wrapper, "-m", "+topology=zionex", "topology.num_nodes=1,2,4", "model=mlperf_dcnv2",
                      f"hydra.sweep.dir={sweep}", env=subprocess_env(), timeout=300)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "interrupted: job #1 of the sweep was stopped and wrote no plan; job(s) #0 wrote theirs, each in its folder")
    assert (sweep / "0" / "plan.json").is_file() and not (sweep / "1" / "plan.json").exists()
    assert f"sweep results so far, the sweep stopped at job #1 ({sweep / 'summary.csv'}):" in proc.stdout
    assert "  #1 topology.num_nodes=2: stopped by the Ctrl-C (no plan written)" in proc.stdout, proc.stdout[-2000:]
    # the job the Ctrl-C left unlaunched is listed, where it was left out of the list, the file and the chart
    assert "  #2 topology.num_nodes=4: not run (the sweep was stopped before it)" in proc.stdout, proc.stdout[-2000:]
    rows = (sweep / "summary.csv").read_text().splitlines()
    assert len(rows) == 4 and ",done," in rows[1] and ",stopped," in rows[2] and ",not run," in rows[3], rows
    # the summary gives a plan's cache and compression by value, as a cache or compression sweep varies them
    assert "cache none, compression fp32/fp32" in proc.stdout, proc.stdout[-2000:]


def test_a_ctrl_c_as_the_chart_is_drawn_leaves_no_plan_where_it_says_none_was_written(tmp_path: Path) -> None:
    # it said "interrupted: no plan was written" beside a whole plan.json and plan.txt, which a
    # script gathering */plan.json took as finished (a sweep's summary said "stopped" of it)
    wrapper = tmp_path / "stopped_chart.py"
    wrapper.write_text(textwrap.dedent(f"""
        import runpy, sys
        from neo_plugins.sharding.planner import report

        def stopped(result, path):  # plan.json and plan.txt are written by now
            raise KeyboardInterrupt

        report.save_chart = stopped
        sys.argv = [{str(PLAN_RECIPE)!r}, *sys.argv[1:]]
        runpy.run_path({str(PLAN_RECIPE)!r}, run_name="__main__")
    """))
    out = tmp_path / "run"
    proc = forked.run(wrapper, "+topology=zionex", "topology.num_nodes=1", "model=mlperf_dcnv2",
                      f"hydra.run.dir={out}", env=subprocess_env(), timeout=300)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "interrupted: no plan was written"
    assert not [n for n in ("plan.json", "plan.txt", "plan.png") if (out / n).exists()], sorted(out.iterdir())


def test_a_ctrl_c_between_plan_sweep_jobs_calls_none_of_them_stopped(tmp_path: Path, capsys) -> None:
    # the highest job seen was said to be "stopped and wrote no plan" though it had finished
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("plan_recipe_between", PLAN_RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    plan = SimpleNamespace(planner="neo", notes=[], predicted_step_time=3e-3, predicted_samples_per_second=1.0,
                           imbalance=1.0, times_from="Neo's cost model", ranks=[], types_note=lambda: "types: TW 3",
                           cached_tables=0, settings={}, batch_size_per_rank=64)
    for num in (0, 1):
        recipe.SWEEP.started[num] = f"x={num}"
        recipe.SWEEP.finished(num, f"x={num}", tmp_path / str(num), plan)
    assert recipe.interrupted_line() == (
        "interrupted between jobs of the sweep, after job #1: job(s) #0, #1 wrote their plans, each in its folder")
    recipe.SWEEP.started[2] = "x=2"  # begun, neither finished nor failed: the one stopped
    recipe.SWEEP.folders[2] = tmp_path / "2"
    assert recipe.interrupted_line() == (
        "interrupted: job #2 of the sweep was stopped and wrote no plan; job(s) #0, #1 wrote theirs, each in its folder")
    assert "  #2 x=2: stopped by the Ctrl-C (no plan written)" in capsys.readouterr().out


def test_a_plan_sweeps_device_memory_column_says_it_leaves_out_the_reserve_plan_txt_counts(
        tmp_path: Path, capsys, monkeypatch) -> None:
    # summary.csv said "fullest rank device memory" 1.27 of 40.00 GiB where the job's plan.txt
    # said "fullest device memory: rank 96, 7.3GiB of 40.0GiB": the 6 GiB reserve, left out unsaid
    import csv
    import importlib.util
    from types import SimpleNamespace

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from neo_core.cli import SweepFailures

    spec = importlib.util.spec_from_file_location("plan_recipe_memory", PLAN_RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    gib = 2**30

    def plan(tables: float) -> SimpleNamespace:  # a rank of 40 GiB, 6 GiB of it the reserve
        rank = SimpleNamespace(rank=0, memory_total=(tables + 6.0) * gib, memory={"reserve": 6.0 * gib},
                               memory_capacity=40.0 * gib)
        return SimpleNamespace(ranks=[rank], holds_host_memory=False)

    sweep = SweepFailures(recipe.memory_columns)
    for num, tables in enumerate((1.25, 2.5)):
        (tmp_path / str(num)).mkdir()
        sweep.job(lambda tables=tables: plan(tables), tmp_path / str(num), num, f"sharding={('neo', 'torchrec')[num]}")
    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))  # the chart, kept to read its panels
    sweep.summary()
    header, *rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert header[4:6] == ["fullest rank device memory without the reserve (GiB)",
                           "fullest rank device memory capacity (GiB)"], header
    assert [r[4:6] for r in rows] == [["1.25", "40.0"], ["2.5", "40.0"]], rows
    assert "  #0 sharding=neo: fullest rank device memory without the reserve 1.25 of 40.00 GiB" in capsys.readouterr().out
    assert [ax.get_title().replace("\n", " ") for ax in drawn[-1].axes] == [
        "fullest rank device memory without the reserve (GiB)"]
    for fig in drawn:
        close(fig)


def test_a_plan_sweep_warns_of_a_topologys_doubtful_bandwidths_as_a_single_plan_does(tmp_path: Path) -> None:
    # the sweep's pre-check built each job's topology with its output hidden, and the warning,
    # given once per process, was then never given by the job
    proc = run_plan("-m", "+topology=zionex", "topology.num_nodes=2", "topology.intra_node_bw_gbps=10",
                    "model=mlperf_dcnv2", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("gives its ranks 10 GB/s inside a node, less than the 25 GB/s across "
                                             "nodes") == 1, proc.stderr[-3000:]
    # a sweep of one job ends as any sweep does: its results, summary.csv and summary.png
    assert f"sweep results ({tmp_path / 'summary.csv'}):" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "summary.csv").read_text().splitlines()[1].startswith("0,"), proc.stdout[-2000:]
    assert (tmp_path / "summary.png").is_file()


def test_a_plan_sweep_of_one_job_that_fails_still_writes_its_summary(tmp_path: Path) -> None:
    # a -m sweep of one value wrote no summary.csv: scripts gathering every sweep's broke on it
    import csv

    proc = run_plan("-m", "+topology=zionex", "topology.num_nodes=1", "topology.device_memory_gib=2",
                    "model=mlperf_dcnv2", f"hydra.sweep.dir={tmp_path}")  # its tables do not fit
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"sweep results: none, no job finished ({tmp_path / 'summary.csv'} lists each job and why)" in proc.stdout
    rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert [r[:4] for r in rows[1:]] == [["0", "+topology=zionex topology.num_nodes=1 topology.device_memory_gib=2 "
                                          "model=mlperf_dcnv2", str(tmp_path / "0"), "failed"]], rows
    assert rows[1][-1].startswith("Table 'cat_20' (40,000,000 rows x 128) is larger than the whole cluster allows"), rows


def test_a_config_dirs_file_that_is_not_yaml_is_named_by_line_not_a_traceback(tmp_path: Path) -> None:
    # a table set with an unclosed brace failed inside Hydra's loader with a 100-line traceback,
    # in a sweep too, in place of the list of failing jobs
    (tmp_path / "mine" / "plan_model").mkdir(parents=True)
    (tmp_path / "mine" / "plan_model" / "broken.yaml").write_text(
        "generator: listed\nparams:\n  tables:\n    - {name: a, num_embeddings: 10\n")
    for sweep in ((), ("-m",)):
        proc = run_plan(*sweep, "--config-dir", str(tmp_path / "mine"), "+topology=zionex", "model=broken",
                        f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert (f"error: {tmp_path / 'mine' / 'plan_model' / 'broken.yaml'}:5:1: not valid YAML: expected ',' or '}}', "
                "but got '<stream end>' (while parsing a flow mapping)") in proc.stderr, proc.stderr[-2000:]


def test_an_unset_environment_variable_is_named_by_its_key(tmp_path: Path) -> None:
    # ${oc.env:...} unset ended in OmegaConf's traceback, raised while reading the overrides
    proc = run_plan("+topology=zionex", "plan_model=mlperf_dcnv2", "topology.num_nodes=${oc.env:NEO_TEST_NO_SUCH_VAR}",
                    f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("error: topology.num_nodes: environment variable NEO_TEST_NO_SUCH_VAR is not set "
            "(${oc.env:NEO_TEST_NO_SUCH_VAR}); set it, or give the interpolation a default: "
            "${oc.env:NEO_TEST_NO_SUCH_VAR,<value>}") in proc.stderr, proc.stderr[-2000:]
    # set, it is text: the refusal says how to read it as a number
    proc = forked.run(PLAN_RECIPE, "+topology=zionex", "plan_model=mlperf_dcnv2",
                      "topology.num_nodes=${oc.env:NEO_TEST_NODES}", f"hydra.run.dir={tmp_path}",
                      env=subprocess_env(NEO_TEST_NODES="2"), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("got '2' (a value given as text, as ${oc.env:NAME} gives it: ${oc.decode:${oc.env:NAME}} reads it "
            "as YAML would).") in proc.stderr, proc.stderr[-2000:]


def test_the_text_hint_is_for_numbers_and_switches_only() -> None:
    from neo_core.cli import user_error_message
    from neo_core.errors import ConfigError

    hint = "a value given as text"
    for asked in ("topology.num_nodes must be a whole number, got '2'.", "x must be a fraction in (0, 1], got '.5'.",
                  "trainer.progress_bar must be true or false, got 'true'.", "x must be a positive number, got '1E3'."):
        assert hint in user_error_message(ConfigError(asked)), asked
    # a text field quoting a digit is not a number given as text
    for text in ("topology.compute_device must be 'cpu' or 'cuda', got '2'.",
                 "sharding.sharding_types must be a non-empty list of sharding types, e.g. [TW, RW]; got '2'."):
        assert user_error_message(ConfigError(text)) == text


@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_sweep(tmp_path: Path) -> None:
    # a failure only the job's plan shows (its tables do not fit the memory it is given): the
    # check before the sweep does not plan it, so the job fails alone
    proc = run_recipe("-m", "topology.memory_fraction=0.0001,0.5", "trainer=smoke",
                      "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path}", timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    job = "topology.memory_fraction=0.0001 trainer=smoke trainer.max_steps=2"
    said = "Table 't_cat_0' (100,000 rows x 16) is larger than the whole cluster allows"
    assert f"error: job #0 ({job}): {said}" in proc.stderr
    assert (tmp_path / "0" / "error.txt").read_text().startswith(said)
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["steps"] == 2  # the next job ran
    # each job's transcript is its own: the error in the first, the plan and results in the second
    first = (tmp_path / "0" / "train.log").read_text()
    assert first.startswith(f"error: job #0 ({job}): {said}") and first.count("\n") == 1
    second = (tmp_path / "1" / "train.log").read_text()
    assert "Sharding plan (neo), 2 ranks" in second and "done: 2 steps, val AUC" in second and "error" not in second
    assert "1 job(s) of the sweep failed" in proc.stderr and f"  #0 {job}: {said}" in proc.stderr


def test_a_sweep_plans_a_job_whose_compression_gloo_may_not_carry(tmp_path: Path) -> None:
    # fp8 over gloo fails where the job's plan makes a table table-wise: the job's own plan,
    # made before the sweep starts, says so (it failed an hour into a sweep, at its own turn)
    proc = run_recipe("-m", "compression=fp16", "compression.backward=fp16,fp8,int8", "trainer=smoke",
                      "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[-2:] == [
        "error: 1 of the 3 jobs of the sweep would fail, so none was started (fix them, or leave them out of the "
        "sweep):",
        "  #1 compression=fp16 compression.backward=fp8 trainer=smoke trainer.max_steps=2: compression 'fp16' sends "
        "fp8 (forward fp16, backward fp8), which TorchRec cannot run over gloo for " + lines[-1].split(" for ", 1)[1],
    ], proc.stderr[-2000:]
    assert "gloo for t_cat_0 (TW), t_cat_1 (TW)" in lines[-1]  # the tables the job's plan makes table-wise
    # int8 is carried by the table-wise tables this plan makes: that job was not refused
    assert "#2" not in proc.stderr
    assert "Launching" not in proc.stderr + proc.stdout and not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_a_sweep_with_a_job_that_would_fail_starts_none(tmp_path: Path) -> None:
    # a bad combination, a misspelled key: each job failed in turn, hours into a sweep
    proc = run_recipe("-m", "trainer=smoke", "trainer.max_steps=2", "kernel=fused,dense",
                      "kernel.optimizer=adam,sgd", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-2:] == [
        "error: 1 of the 4 jobs of the sweep would fail, so none was started (fix them, or leave them out of the "
        "sweep):",
        "  #0 trainer=smoke trainer.max_steps=2 kernel=fused kernel.optimizer=adam: kernel.optimizer=adam: FBGEMM's "
        "fused kernel has no Adam on CPU; use rowwise_adagrad, adagrad or sgd, or kernel=dense.",
    ]
    assert "Launching" not in proc.stderr + proc.stdout and not [p for p in tmp_path.iterdir() if p.is_dir()]
    # a sweep the config holds (hydra.sweeper.params), from an added config folder, is checked as Hydra runs it
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "batches.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      trainer.batch_size: 0,8\n")
    proc = run_recipe("-m", "--config-dir", str(conf), "experiment=batches", "trainer=smoke",
                      "trainer.max_step=2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[-4] == "error: all 2 jobs of the sweep would fail, so none was started:"
    # job #0 has two bad settings, both named; the misspelled key both jobs have is said once
    assert lines[-3] == ("  #0 trainer.batch_size=0 experiment=batches trainer=smoke trainer.max_step=2: "
                         "trainer.batch_size must be a positive integer, got 0.")
    assert lines[-2] == "  #1 trainer.batch_size=8 experiment=batches trainer=smoke trainer.max_step=2"
    assert lines[-1].startswith("    all 2: Unknown key trainer.max_step. Did you mean 'max_steps'?")
    # without the check, each job fails in turn, as before
    proc = run_recipe("-m", "--config-dir", str(conf), "experiment=batches", "trainer=smoke", "trainer.max_step=2",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}", env={**subprocess_env(), "NEO_SKIP_SWEEP_CHECK": "1"})
    assert proc.returncode == 2 and "2 job(s) of the sweep failed" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "sweep" / "1" / "error.txt").read_text().startswith("Unknown key trainer.max_step.")


def test_a_training_sweeps_summary_says_what_its_speeds_are_of(tmp_path: Path, capsys, monkeypatch) -> None:
    # a cache sweep on CPU ranks: identical runs whose samples/s differed by a stall; the summary
    # gave the mean alone and did not say the cache was not used
    import csv
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_recipe_rows", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    from neo_core.cli import SweepFailures

    monkeypatch.chdir(tmp_path)
    sweep = SweepFailures(recipe.sweep_row)
    base = {"val_auc": 0.8114, "val_loss": 0.5208, "steps": 100, "world_size": 2, "global_batch_size": 512,
            "cached_tables": 0, "not_used": ["cache lru"], "predicted_step_time_s": 0.00123,
            "predicted_by": "Neo's cost model"}
    runs = {0: {**base, "samples_per_sec": 7_333.0, "samples_per_sec_p10_p90": [43_283.0, 45_068.0]},
            1: {**base, "samples_per_sec": 43_930.0, "samples_per_sec_p10_p90": [43_100.0, 44_900.0],
                "not_used": ["cache lfu"], "predicted_by": "TorchRec's estimator"}}
    for num, policy in enumerate(("lru", "lfu")):
        (tmp_path / str(num)).mkdir()
        sweep.job(lambda m=runs[num]: m, tmp_path / str(num), num, f"cache={policy} trainer.max_steps=100")
    monkeypatch.setattr(recipe, "SWEEP", sweep)  # the note reads the recipe's sweep
    with pytest.raises(SystemExit):
        sweep.exit(recipe.mixed_scales_note)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("  #0 cache=lru: val AUC 0.8114, val loss 0.5208, samples/s 7,333 (per step 43,283-45,068; "
                      "slower overall: some steps stalled), predicted step 1.230 ms, predicted by Neo's cost model, "
                      "steps 100, ranks 2, global batch 512, cached tables 0, not used cache lru"), out
    # two models' predictions are not ranked against each other
    assert out[-1] == ("note: these runs' predicted steps come from different models (Neo's cost model, TorchRec's "
                       "estimator), which are not on one scale: their samples/s, measured, are"), out
    assert "samples/s 43,930 (per step 43,100-44,900), " in out[2] and out[2].endswith("not used cache lfu"), out
    rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert rows[0][4:] == ["val AUC", "val loss", "samples/s", "samples/s p10", "samples/s p90", "predicted step (ms)",
                           "predicted by", "steps", "ranks", "global batch", "cached tables", "not used", "error"]
    assert rows[1][6:9] == ["7333.0", "43283.0", "45068.0"] and rows[1][-2:] == ["cache lru", ""]
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_continue_command_keeps_the_config_folder_flags() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_recipe", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    argv = ["-m", "--config-dir", "/my/conf", "trainer=smoke", "-cn=train", "-cd=/other", "model.embedding_dim=8"]
    assert recipe.config_flags(argv) == ["--config-dir", "/my/conf", "-cn=train", "-cd=/other"]


def test_a_group_the_command_line_takes_from_an_experiment_is_noted(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_recipe", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    choices = {"experiment": "dcnv2", "model": "dlrm", "kernel": "fused"}
    assert recipe.experiment_replaced(choices, []) == [
        "note: model=dlrm on the command line replaces experiment dcnv2's model=dcnv2"]
    assert recipe.experiment_replaced({**choices, "model": "dcnv2"}, []) == []  # the experiment's own
    assert recipe.experiment_replaced({**choices, "experiment": None}, []) == []
    # an experiment of an added config folder, by the name it has there
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /kernel: dense\n  - override /model: dcnv2\n")
    assert recipe.experiment_replaced({**choices, "experiment": "mine"}, ["-cd", str(tmp_path)]) == [
        "note: kernel=fused on the command line replaces experiment mine's kernel=dense",
        "note: model=dlrm on the command line replaces experiment mine's model=dcnv2"]
    # a key the experiment sets itself (zionex_emulated: topology.name), compared with the run's
    config = {"topology": {"name": "local"}, "trainer": {"max_steps": 5}}
    assert recipe.experiment_replaced({**choices, "experiment": "zionex_emulated"}, [], config) == [
        "note: topology.name=local on the command line replaces experiment zionex_emulated's topology.name=zionex"]
    config["topology"]["name"] = "zionex"
    assert recipe.experiment_replaced({**choices, "experiment": "zionex_emulated"}, [], config) == []


def test_a_sweep_job_failing_outside_neo_is_kept_and_the_sweep_goes_on(tmp_path, monkeypatch) -> None:
    # a failure inside a library used to stop being handled here: Hydra went on with the
    # other jobs, then re-raised only the first traceback (later failures unreported, no
    # error.txt, no list of failed jobs)
    import importlib.util
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    import neo_core.training.run as run_module
    from neo_core.errors import ConfigError

    spec = importlib.util.spec_from_file_location("train_recipe_sweep", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    from torch.multiprocessing.spawn import ProcessRaisedException

    rank_failed = ProcessRaisedException(
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "twrw_sharding.py", line 219, in _shard\nIndexError: list index out of range\n', 1, 4242)
    jobs = iter([(0, ValueError("Shard offset 2000 exceeds tensor dim")), (1, ConfigError("bad key x.")), (2, None),
                 (3, rank_failed), (4, None)])
    state = {}

    def fake_train(config):
        num, exc = state["job"]
        if exc is not None:
            raise exc
        return {"val_auc": 0.7}

    monkeypatch.setattr(run_module, "train", fake_train)
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(
        job=SimpleNamespace(num=state["job"][0]), overrides=SimpleNamespace(task=[f"seed={state['job'][0]}"]))))
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "error.txt").write_text("an earlier run's failure\n")  # this run succeeds there
    (tmp_path / "4").mkdir()  # a dry run's folder, whose own failure is kept
    for name, text in (("plan.json", "{}"), ("plan.log", ""), ("error.txt", "the dry run's failure\n")):
        (tmp_path / "4" / name).write_text(text)
    results = []
    for job in jobs:
        state["job"] = job
        results.append(recipe._sweep_job({"output_dir": str(tmp_path / str(job[0]))}))
    assert results == [{}, {}, {"val_auc": 0.7}, {}, {}]
    assert [(n, o) for n, o, _ in recipe.SWEEP.jobs] == [(0, "seed=0"), (1, "seed=1"), (3, "seed=3"), (4, "seed=4")]
    assert recipe.SWEEP.jobs[3][2].startswith(f"{tmp_path / '4'} holds a dry run of recipes/plan.py (plan.json, "
                                              "plan.log)")
    assert (tmp_path / "4" / "error.txt").read_text() == "the dry run's failure\n"
    assert recipe.SWEEP.refused == [4]
    # a rank's failure is summed up by the rank's own error, not torch's opening line
    assert recipe.SWEEP.jobs[2][2] == (
        "ProcessRaisedException: IndexError: list index out of range (not a Neo error; traceback in error.txt)")
    assert recipe.SWEEP.jobs[0][2] == (
        "ValueError: Shard offset 2000 exceeds tensor dim (not a Neo error; traceback in error.txt)")
    assert "Traceback" in (tmp_path / "0" / "error.txt").read_text()
    assert (tmp_path / "1" / "error.txt").read_text() == "bad key x.\n"
    assert not (tmp_path / "2" / "error.txt").exists()
    assert recipe.SWEEP.internal == [0, 3]  # the command then exits 1, not 2


def test_a_continued_sweep_starts_the_jobs_that_saved_no_checkpoint_without_a_warning(
        tmp_path, monkeypatch, capsys) -> None:
    # continuing an interrupted sweep (trainer.resume=true) warned "holds no checkpoint" for
    # every job that had not started: those start afresh, as the sweep's command says
    import importlib.util
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    import neo_core.training.run as run_module

    spec = importlib.util.spec_from_file_location("train_recipe_continue", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    seen = {}
    state = {"num": 0}
    monkeypatch.setattr(run_module, "train", lambda config: seen.setdefault(state["num"], config["trainer"]) and {})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(
        job=SimpleNamespace(num=state["num"]), overrides=SimpleNamespace(task=["trainer.resume=true"]))))
    # a job that finished without a checkpoint (trainer.checkpoint=false) reports its results
    from neo_core.config import validate

    configs = {n: composed("trainer.resume=true", "trainer.max_steps=8", output_dir=tmp_path / str(n)) for n in range(4)}
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "metrics.json").write_text('{"steps": 8, "val_auc": null, "val_loss": 0.5}')
    (tmp_path / "3" / "config.json").write_text(json.dumps(validate(configs[3]).to_dict()))  # the same settings
    results = []
    for num, meta in ((0, '{"step": 4}'), (1, None), (2, "not json"), (3, None)):
        if meta is not None:
            (tmp_path / str(num) / "checkpoint").mkdir(parents=True)
            (tmp_path / str(num) / "checkpoint" / "meta.json").write_text(meta)
        state["num"] = num
        results.append(recipe._sweep_job(configs[num]))
    assert [seen[n]["resume"] for n in range(3)] == [True, False, True] and 3 not in seen  # a damaged one is the job's
    assert results[3]["steps"] == 8 and math.isnan(results[3]["val_auc"]) and results[3]["val_loss"] == 0.5
    assert capsys.readouterr().out == (
        f"note: job #1 saved no checkpoint in {tmp_path / '1'}; it starts from step 0\n"
        f"note: the run in {tmp_path / '3'} has finished its 8 steps already (results in its metrics.json); "
        "nothing to train (it saved no checkpoint: with a larger trainer.max_steps, it trains again from step 0)\n")


def test_a_failing_plan_job_does_not_stop_the_plan_sweep(tmp_path: Path) -> None:
    # the sweep used to end at the first job that could not plan (exit 2 from inside Hydra's
    # multirun): later jobs never ran, and no error.txt or list of failed jobs was left
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "plan.json").write_text("{}")  # an earlier run's plan: not left to look current
    proc = run_plan("-m", "+topology=zionex", "topology.num_nodes=1", "model=zionex_12t,mlperf_dcnv2",
                    f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: job #0 (+topology=zionex topology.num_nodes=1 model=zionex_12t): Device memory is short" \
        in proc.stderr
    assert (tmp_path / "0" / "error.txt").read_text().startswith("Device memory is short")
    assert not (tmp_path / "0" / "plan.json").exists()
    assert json.loads((tmp_path / "1" / "plan.json").read_text())["tables"]  # the next job planned
    assert "1 job(s) of the sweep failed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_plans_bad_settings_are_named_at_once(tmp_path: Path) -> None:
    # the first alone was named: three bad settings took three runs to find
    proc = run_plan("+topology=zionex", "batch_size_per_rank=-1", "sharding.foo=1", "cache.load_factor=7",
                    "plan_model.global_batch=0", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, "4 settings are wrong. plan_model.global_batch must be a whole number, at least 1; "
                              "got 0. Also: batch_size_per_rank must be a positive integer, got -1.",
                        "Also: cache.load_factor=7 (cache 'lru') must lie in (0, 1]",
                        "Also: Unknown key sharding.foo for sharder plugin 'neo'.")
    proc = run_plan("+topology=zionex", "batch_size_per_rank=-1", f"hydra.run.dir={tmp_path}")  # one: as it was
    assert_one_sentence(proc, "error: batch_size_per_rank must be a positive integer, got -1.")
    proc = run_plan("+topology=zionex", "+foo=1", "+bar=2", f"hydra.run.dir={tmp_path}")  # each unknown key
    assert_one_sentence(proc, "error: 2 settings are wrong. Unknown key foo.", "Also: Unknown key bar.")
    # a misspelled generator is the generator's key, not its parameters'
    proc = run_plan("plan_model.generator=listd", f"hydra.run.dir={tmp_path}")
    assert_one_sentence(proc, "error: model=mlperf_dcnv2: plan_model.generator: Unknown table generator 'listd'; "
                              "choose one of file, listed, mlperf_dcnv2, production_like, zionex_12t.")


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path: Path) -> None:
    # Hydra's default outputs/<date>/<time> gave runs started in the same second one folder:
    # the second wrote its log, plan and checkpoints over the first's. Every folder the next
    # minute would name is taken here (as by runs started beside this one): the run and the
    # sweep each take <time>-2, and the taken ones are left as they were.
    from datetime import datetime, timedelta

    now = datetime.now()
    taken = []
    for base in ("outputs", "multirun"):
        for s in range(90):
            at = now + timedelta(seconds=s)
            folder = tmp_path / base / at.strftime("%Y-%m-%d") / at.strftime("%H-%M-%S")
            folder.mkdir(parents=True)
            (folder / "mine.txt").write_text(str(folder))
            taken.append(folder)
    plan = forked.run(PLAN_RECIPE, "+topology=zionex", "topology.num_nodes=1", env=subprocess_env(), cwd=tmp_path,
                      timeout=120)
    sweep = forked.run(PLAN_RECIPE, "-m", "+topology=zionex", "topology.num_nodes=1", "compression=none,fp16",
                       env=subprocess_env(), cwd=tmp_path, timeout=120)
    assert plan.returncode == 0 and sweep.returncode == 0, plan.stderr[-2000:] + sweep.stderr[-2000:]
    assert all(sorted(p.name for p in folder.iterdir()) == ["mine.txt"] for folder in taken)
    ran = [p for p in (tmp_path / "outputs").glob("*/*") if p not in taken]
    swept = [p for p in (tmp_path / "multirun").glob("*/*") if p not in taken]
    assert len(ran) == 1 and ran[0].name.endswith("-2") and (ran[0] / "plan.json").is_file(), ran
    assert len(swept) == 1 and swept[0].name.endswith("-2"), swept
    assert (swept[0] / "0" / "plan.json").is_file() and (swept[0] / "1" / "plan.json").is_file()
    assert f"wrote {ran[0] / 'plan.json'}" in plan.stdout


def test_a_plan_sweep_checks_every_job_before_the_first_plans(tmp_path: Path) -> None:
    # a key only one planner takes failed the second job after the first had planned (a 12T
    # sweep's minutes lost); a plan that does not fit still fails only its own job (above)
    proc = run_plan("-m", "+topology=zionex", "model=mlperf_dcnv2", "sharding=neo,torchrec", "sharding.progress=false",
                    f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[0] == ("error: 1 of the 2 jobs of the sweep would fail, so none was started (fix them, or leave "
                        "them out of the sweep):")
    assert lines[1].startswith("  #1 +topology=zionex model=mlperf_dcnv2 sharding=torchrec sharding.progress=false: "
                               "Unknown key sharding.progress for sharder plugin 'torchrec'.")
    assert not (tmp_path / "0").exists()
    assert (tmp_path / "multirun.yaml").exists()  # pytest made the folder: it was there, so it stays
    # a folder made for this launch holds only Hydra's multirun.yaml: it goes (it was left behind)
    fresh = tmp_path / "fresh" / "sweep"
    proc = run_plan("-m", "+topology=zionex", "model=mlperf_dcnv2", "sharding=neo,torchrec", "sharding.progress=false",
                    f"hydra.sweep.dir={fresh}")
    assert proc.returncode == 2 and not (tmp_path / "fresh").exists(), proc.stderr[-2000:]  # and the folder made for it


def test_the_interrupted_line_says_what_there_is_to_continue(tmp_path: Path) -> None:
    # it said "the last finished checkpoint, if any, is in the run's checkpoint/ folder; continue
    # with ... trainer.resume=true" also when nothing had started, or no checkpoint was saved
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_recipe", ROOT / "recipes" / "train.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    assert recipe.interrupted_message(KeyboardInterrupt()) == "interrupted before the run started: nothing was written"
    recipe.OUTPUT_DIR[:], recipe.CONTINUE[:] = [str(tmp_path)], ["python recipes/train.py trainer.resume=true"]
    assert recipe.interrupted_message(KeyboardInterrupt()) == (
        f"interrupted: no checkpoint was saved in {tmp_path}; run the command again to start over "
        "(trainer.checkpoint_every_n_steps=<n> saves during training)")
    recipe.SWEEPING[:] = [True]
    assert recipe.interrupted_message(KeyboardInterrupt()) == (
        f"interrupted: no checkpoint of this job was saved in {tmp_path}; continue the sweep with: "
        "python recipes/train.py trainer.resume=true")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "meta.json").write_text('{"step": 40}\n')
    assert recipe.interrupted_message(KeyboardInterrupt()) == (
        f"interrupted: the last finished checkpoint is at step 40 in {tmp_path / 'checkpoint'}; continue with: "
        "python recipes/train.py trainer.resume=true")


def test_a_plan_sweep_says_when_its_plans_times_come_from_different_models() -> None:
    # sharding=neo,torchrec put Neo's and TorchRec's predicted steps side by side as if one scale
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("plan_recipe_scales", PLAN_RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    neo = SimpleNamespace(planner="neo", notes=["searched 6 options"], predicted_step_time=3e-3,
                          predicted_samples_per_second=1.0, imbalance=1.0, times_from="Neo's cost model",
                          ranks=[], types_note=lambda: "types: TW 3", cached_tables=0, batch_size_per_rank=64)
    scored = SimpleNamespace(**{**vars(neo), "times_from": "TorchRec's estimator"})
    torchrec = SimpleNamespace(**{**vars(neo), "planner": "torchrec", "times_from": "TorchRec's estimator"})
    theirs = SimpleNamespace(**{**vars(neo), "planner": "mine", "times_from": ""})  # a plugin that did not say
    assert [recipe.times_by(p) for p in (neo, scored, torchrec, theirs)] == [
        "Neo's cost model", "TorchRec's estimator", "TorchRec's estimator", "the mine planner"]
    recipe.SWEEP.finished(0, "sharding=torchrec", Path("0"), torchrec)
    recipe.SWEEP.finished(1, "sharding=neo sharding.estimator=torchrec", Path("1"), scored)
    assert recipe.mixed_scales_note() is None  # one scale
    recipe.SWEEP.finished(2, "sharding=neo", Path("2"), neo)
    assert recipe.mixed_scales_note().startswith(
        "note: these plans' predicted times come from different models (Neo's cost model, TorchRec's estimator), "
        "which are not on one scale")


def test_a_stop_asked_as_a_sweep_job_finishes_stops_the_sweep(tmp_path: Path) -> None:
    # a Ctrl-C or SIGTERM during a job's last step, validation or save: the job finished as asked,
    # then the sweep ran every other job and exited 0
    wrapper = tmp_path / "stopped_sweep.py"
    wrapper.write_text(textwrap.dedent(f"""
        import os, runpy, sys
        import neo_core.training.run as run
        from neo_core.training import interrupt

        def train(cfg):  # a job that finished as the stop request came
            if cfg["cache"]["name"] == os.environ["ASKED_IN"]:
                interrupt.note_asked_as_it_finished()
            return {{"steps": 2, "val_auc": 0.5, "val_loss": 0.7, "samples_per_sec": 1.0}}

        run.train = train
        sys.argv = [{str(RECIPE)!r}, *sys.argv[1:]]
        runpy.run_path({str(RECIPE)!r}, run_name="__main__")
    """))
    sweep = tmp_path / "sweep"
    proc = forked.run(wrapper, "-m", "cache=none,lru", "trainer=smoke", f"hydra.sweep.dir={sweep}",
                      env=subprocess_env(ASKED_IN="none"), timeout=300)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert not (sweep / "1" / "train.log").exists()  # the next job did not start
    assert proc.stderr.strip().splitlines()[-1] == (
        f"interrupted: stopped as job #0 finished, before job #1 started; continue with: "
        f"{script_command(RECIPE, ROOT)} -m cache=none,lru trainer=smoke trainer.resume=true hydra.sweep.dir={sweep}")
    # plugins of NEO_PLUGINS: the command loads them again (without, a resumed job of one of
    # their options was refused as an unknown option)
    plugin = ROOT / "tests" / "fixtures" / "neo_example_plugin"
    env = subprocess_env(plugin, ASKED_IN="none", NEO_PLUGINS="neo_example_plugin")
    proc = forked.run(wrapper, "-m", "cache=none,my_policy_half", "trainer=smoke", f"hydra.sweep.dir={tmp_path / 'np'}",
                      env=env, timeout=300)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"; continue with: NEO_PLUGINS=neo_example_plugin PYTHONPATH={shlex.quote(env['PYTHONPATH'])} "
        f"{script_command(RECIPE, ROOT)} -m cache=none,my_policy_half trainer=smoke trainer.resume=true "
        f"hydra.sweep.dir={tmp_path / 'np'}"), proc.stderr[-2000:]
    # asked as the last job finished: the sweep is over, and says so with its results
    proc = forked.run(wrapper, "-m", "cache=none,lru", "trainer=smoke", f"hydra.sweep.dir={tmp_path / 'last'}",
                      env=subprocess_env(ASKED_IN="lru"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: the stop request came as the last job was finishing; it finished, and so did the sweep" in proc.stdout
    assert (tmp_path / "last" / "summary.csv").is_file()


def test_the_command_to_continue_runs_from_where_it_was_typed(tmp_path: Path, monkeypatch) -> None:
    # it said "python recipes/train.py" from any folder, and with python not this environment's
    import shutil

    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}/usr/bin")
    assert shutil.which("python") == str(venv_bin / "python")
    assert script_command(RECIPE, ROOT) == "python recipes/train.py"  # the environment's python on PATH
    assert script_command(RECIPE, ROOT / "recipes") == "python train.py"
    assert script_command(RECIPE, tmp_path) == f"python {RECIPE}"  # typed elsewhere: the full path
    monkeypatch.setenv("PATH", "/usr/bin")
    assert script_command(RECIPE, ROOT) == f"{venv_bin / 'python'} recipes/train.py"  # another python on PATH
    assert script_command(RECIPE, ROOT, python=False) == "recipes/train.py"  # torchrun's
    spaced = tmp_path / "my env" / "python"
    spaced.parent.mkdir()
    spaced.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(spaced))
    assert script_command(RECIPE, ROOT) == f"'{spaced}' recipes/train.py"


def test_the_launcher_check_leaves_plain_runs_and_spawned_ranks_alone(monkeypatch) -> None:
    from neo_core.cli import check_not_a_sweep_under_torchrun
    from neo_core.errors import ConfigError

    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "NEO_SPAWNED"):
        monkeypatch.delenv(key, raising=False)
    check_not_a_sweep_under_torchrun(["-m", "kernel=fused,dense"])  # no launcher: the recipe's own sweep
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_not_a_sweep_under_torchrun(["kernel=fused"])  # one run under a launcher
    with pytest.raises(ConfigError, match="another launcher's ranks"):
        check_not_a_sweep_under_torchrun(["-m", "kernel=fused,dense"])
    monkeypatch.setenv("NEO_SPAWNED", "1")  # the recipe's own spawned ranks
    check_not_a_sweep_under_torchrun(["-m", "kernel=fused,dense"])


def test_a_sweep_inside_torchruns_ranks_is_refused(tmp_path: Path) -> None:
    # its ranks formed the process group anew for each job: a second job on the dense kernel hung
    env = subprocess_env(TORCHELASTIC_RUN_ID="test", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    said = "error: recipes/train.py -m under torchrun (or another launcher's ranks: RANK and WORLD_SIZE set) is not"
    proc = run_recipe("-m", "trainer=smoke", "kernel=fused,dense", env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(said)
    # another launcher's ranks (srun, mpirun) set RANK and WORLD_SIZE but not torchrun's variable
    proc = run_recipe("-m", "trainer=smoke", "kernel=fused,dense", env=subprocess_env(RANK="0", WORLD_SIZE="2"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(said), proc.stderr[-2000:]
    # a sweep its config asks for (hydra.mode), not the command line: refused in the job
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "swept.yaml").write_text("# @package _global_\nhydra:\n  mode: MULTIRUN\n")
    proc = run_recipe("--config-dir", str(tmp_path / "conf"), "experiment=swept", "trainer=smoke",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}", env=env)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "sweep" / "0" / "metrics.json").exists()
