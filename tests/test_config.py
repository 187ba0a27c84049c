"""Every option of every config group composes, validates and instantiates; typos name the key."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from neo_core.cache import CachePolicy
from neo_core.compression import Compressor
from neo_core.config import (
    PLUGIN_GROUPS,
    RunConfig,
    TrainerConfig,
    instantiate,
    plugin_default_node,
    register_plugin_options,
    validate,
)
from neo_core.data import DataSource
from neo_core.errors import ConfigError, PluginError
from neo_core.kernels import EmbeddingKernel
from neo_core.models import ModelBuilder
from neo_core.plugins import get_plugins, load_plugins
from neo_core.sharding import Planner
from neo_core.topology import Topology
from neo_core.training.run import build_parts, plan_run, resolve_launch

CONF = Path(__file__).resolve().parent.parent / "conf"
BASE_TYPES = {
    "topology": Topology,
    "sharding": Planner,
    "kernel": EmbeddingKernel,
    "cache": CachePolicy,
    "compression": Compressor,
    "model": ModelBuilder,
    "data": DataSource,
}


def yaml_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def group_options(group: str) -> list[str]:
    """YAML files in conf/<group>/ plus every registered plugin name (its generated option)."""
    names = set(yaml_options(group))
    if group in PLUGIN_GROUPS:
        for entry in load_plugins(autoload=False).registry(group).entries():
            names.add(entry.name)
            names.update(entry.options)
    return sorted(names)


# the figures an option leaves for the user to give (a cluster of one's own assumes none)
GIVEN = {("topology", "cluster"): ("topology.num_nodes=4", "topology.devices_per_node=8", "topology.device_memory_gib=40",
                                   "topology.device_memory_bw_gbps=1555", "topology.intra_node_bw_gbps=300",
                                   "topology.nics_per_node=1", "topology.nic_gbit_s=200",
                                   "topology.host_memory_gib_per_node=1024")}


def override_for(group: str, option: str) -> tuple[str, ...]:
    # topology is not in the defaults list (it defaults to this machine): it is added with "+"
    return (f"+topology={option}" if group == "topology" else f"{group}={option}", *GIVEN.get((group, option), ()))


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_plugin_options(CONF, plugins=load_plugins(autoload=False))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield


def compose_run(*overrides: str) -> dict[str, Any]:
    cfg = compose(config_name="train", overrides=[*overrides, "output_dir=/tmp/neo-test-unused"])
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


ALL_OPTIONS = [
    (group, option)
    for group in (*PLUGIN_GROUPS, "trainer", "experiment")
    for option in (group_options(group) if group in PLUGIN_GROUPS else yaml_options(group))
]


def test_every_group_has_options() -> None:
    for group in PLUGIN_GROUPS:
        assert yaml_options(group), f"conf/{group}/ has no options"
    assert set(yaml_options("experiment")) >= {"zionex_emulated", "torchrec_baseline"}
    # the root config is only the defaults list plus the default topology and run keys (and
    # Hydra's help text, output folders and the callback that holds them, which are not part of
    # the run's config)
    root = OmegaConf.load(CONF / "train.yaml")
    assert set(root) == {"defaults", "topology", "seed", "output_dir", "hydra"}
    assert set(root.hydra) == {"help", "run", "sweep", "callbacks"}


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_option_composes_validates_and_instantiates(hydra_conf, group: str, option: str) -> None:
    cfg = compose_run(*override_for(group, option))
    run = validate(cfg)
    assert isinstance(run, RunConfig)
    if group == "trainer":
        expected = OmegaConf.to_container(OmegaConf.load(CONF / "trainer" / f"{option}.yaml"))
        expected.pop("defaults", None)
        for key, value in expected.items():
            assert getattr(run.trainer, key) == value, key
        return
    if group == "experiment":
        parts = build_parts(run, resolve_launch(run))  # every plugin of the experiment instantiates
        assert parts.tables
        return
    node = getattr(run, group)
    if (CONF / group / f"{option}.yaml").exists():
        yaml_node = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
        given = {o.split("=")[0].removeprefix(f"{group}.") for o in GIVEN.get((group, option), ())}
        assert {k: node[k] for k in yaml_node if k not in given} == {k: v for k, v in yaml_node.items() if k not in given}
    obj = instantiate(group, node)
    assert isinstance(obj, BASE_TYPES[group])
    if group == "model":
        data = instantiate("data", run.data)
        tables = data.tables(node["embedding_dim"])
        model = obj.build(tables, data.num_dense, device="meta")
        assert sum(p.numel() for p in model.parameters()) > 0
    if group == "data":
        batch = obj.global_batch("train", 0, 8)
        assert batch.labels.shape == (8,)
        assert batch.dense_features.shape == (8, obj.num_dense)
        assert sorted(batch.sparse_features.keys()) == sorted(obj.feature_names())


PLAN_CASES = [(s, t) for s in group_options("sharding") for t in group_options("topology")]


@pytest.mark.parametrize(("sharding", "topology"), PLAN_CASES, ids=[f"{s}-{t}" for s, t in PLAN_CASES])
def test_every_planner_plans_the_default_tables_on_every_topology(hydra_conf, sharding: str, topology: str) -> None:
    run = validate(compose_run(f"sharding={sharding}", *override_for("topology", topology)))
    parts = build_parts(run, resolve_launch(run))
    result = plan_run(parts)
    assert sorted(a.name for a in result.tables) == sorted(t.name for t in parts.tables)
    assert len(parts.tables) == run.data["num_sparse"]
    world = resolve_launch(run).world_size
    assert len(result.ranks) == world
    assert all(0 <= r < world for a in result.tables for r in a.ranks)
    assert all(r.memory_total <= r.memory_capacity for r in result.ranks)
    assert result.predicted_step_time > 0
    assert result.torchrec_plan is not None
    if topology == "zionex":
        assert any(note.startswith("Emulating zionex") for note in result.notes), result.notes
        assert parts.topology.emulated_from or parts.topology.world_size == resolve_launch(run).world_size


def test_generated_option_for_a_plugin_without_yaml(hydra_conf, register_plugin) -> None:
    from neo_core import hookimpl

    class Plugin:
        __name__ = "generated_option_plugin"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            def half_cache(load_factor: float = 0.5, algorithm: str = "lru") -> CachePolicy:
                """A cache policy that exists only in code."""
                return CachePolicy(name="half_cache", load_factor=load_factor, algorithm=algorithm)

            registry.register("half_cache", half_cache, options={"quarter_cache": {"load_factor": 0.25}})

    plugins = register_plugin(Plugin())
    register_plugin_options(CONF, plugins=plugins)
    try:
        run = validate(compose_run("cache=half_cache", "cache.algorithm=lfu"))
        assert run.cache == {"name": "half_cache", "load_factor": 0.5, "algorithm": "lfu"}
        assert instantiate("cache", run.cache) == CachePolicy("half_cache", 0.5, "lfu")
        run = validate(compose_run("cache=quarter_cache"))
        assert instantiate("cache", run.cache).load_factor == 0.25
        # selecting by name through the YAML option's name key works as well
        run = validate(compose_run("cache.name=half_cache"))
        assert instantiate("cache", run.cache).load_factor == 0.5
    finally:
        repo = ConfigStore.instance().repo["cache"]
        repo.pop("half_cache.yaml", None)
        repo.pop("quarter_cache.yaml", None)


def test_yaml_option_takes_precedence_over_generated_one(hydra_conf) -> None:
    # the YAML file is the option (exactly its keys), not a merge with the factory's defaults
    for group in PLUGIN_GROUPS:
        stored = ConfigStore.instance().repo.get(group, {})
        for option in yaml_options(group):
            assert f"{option}.yaml" not in stored, f"{group}={option} is shadowed by a generated option"
    run = validate(compose_run("+topology=zionex"))
    assert run.topology == OmegaConf.to_container(OmegaConf.load(CONF / "topology" / "zionex.yaml"))
    assert run.kernel == OmegaConf.to_container(OmegaConf.load(CONF / "kernel" / "fused.yaml"))


def test_plugin_default_node_skips_required_and_non_yaml_defaults() -> None:
    from neo_core.registry import Entry

    def factory(required: int, size: int = 3, shape: tuple = (1, 2), obj: object = object()) -> None:
        """Doc."""

    node = plugin_default_node(Entry("f", factory, "cache policy", "test"))
    assert node == {"name": "f", "size": 3, "shape": [1, 2]}


# --- typos and bad values fail at start, naming the key -------------------------------------


def test_misspelled_trainer_key_names_it_and_suggests_the_right_one(hydra_conf) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose_run("+trainer.max_step=3"))
    assert str(err.value).startswith("Unknown key trainer.max_step. Did you mean 'max_steps'?")


def test_misspelled_plugin_key_names_it_and_suggests_the_right_one(hydra_conf) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose_run("+kernel.learning_rat=0.1"))
    assert "Unknown key kernel.learning_rat for kernel plugin 'fused'. Did you mean kernel.learning_rate?" in str(err.value)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+cache.load_factr=0.1", "Unknown key cache.load_factr for cache policy plugin 'none', which takes no keys. "
         "Did you mean cache.load_factor? cache.load_factor is a key of 'lru', 'lfu': select one with it, "
         "e.g. cache=lru cache.load_factor=<value>."),
        # LFU takes the key but refuses true (FBGEMM prefetches only under LRU): the fix said is lru
        ("+cache.prefetch_pipeline=true", "Unknown key cache.prefetch_pipeline for cache policy plugin 'none', which "
         "takes no keys. cache.prefetch_pipeline is a key of 'lru', 'lfu': select one with it, e.g. cache=lru "
         "cache.prefetch_pipeline=<value>."),
        ("+compression.backward=fp16", "Unknown key compression.backward for compressor plugin 'none', which takes "
         "no keys. compression.backward is a key of 'bf16', 'fp16': select one with it, e.g. compression=bf16 "
         "compression.backward=<value>."),
        ("+cache.shards=2", "Unknown key cache.shards for cache policy plugin 'none', which takes no keys."),
        # neo has a close key (time_budget_s), but timeout_s is TorchRec's own: that is what is said
        ("+sharding.timeout_s=60", "Unknown key sharding.timeout_s for sharder plugin 'neo'. sharding.timeout_s is "
         "a key of 'torchrec': select one with it, e.g. sharding=torchrec sharding.timeout_s=<value>. Its keys: "
         "check_settings_s, col_shard_counts, collective_latency_s, estimator, fewer_types_share, host_reserve_fraction, index_bytes, min_col_width, "
         "packing_targets, progress, refine, reserve_fraction, sharding_types, table_sharding_types, time_budget_s."),
    ],
    ids=["typo", "prefetch-of-none", "key-of-another-plugin", "key-of-none", "exact-key-of-another-plugin"],
)
def test_a_key_of_another_plugin_of_the_group_says_how_to_select_it(hydra_conf, override, said) -> None:
    # cache=none and compression=none take no keys: the key (or its close match) belongs to a
    # policy or compressor that must be selected first
    with pytest.raises(ConfigError) as err:
        validate(compose_run(override))
    assert str(err.value) == said


def test_misspelled_top_level_key() -> None:
    cfg = {group: {"name": get_plugins().registry(group).names()[0]} for group in PLUGIN_GROUPS}
    with pytest.raises(ConfigError, match="Unknown config key 'sed'. Did you mean 'seed'?"):
        validate({**cfg, "sed": 1})


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("progress=false", "Did you mean sharding.progress?"),
        ("max_steps=5", "Did you mean trainer.max_steps?"),
        ("load_factor=0.1", "cache.load_factor is a key of cache=lru and cache=lfu: select one with it, e.g. cache=lru"),
        ("refine=false", "Did you mean sharding.refine?"),  # an exact key before a close one ('trainer')
    ],
)
def test_a_key_given_without_its_group_is_told_the_group(hydra_conf, override, said) -> None:
    # a plugin's or the trainer's key typed at the top level, as `neo plugins` lists it
    with pytest.raises(ConfigError) as err:
        validate(compose_run(f"++{override}"))
    assert str(err.value).startswith(f"Unknown config key {override.split('=')[0]!r}. {said}")


def test_unknown_plugin_name(hydra_conf) -> None:
    with pytest.raises(PluginError) as err:
        validate(compose_run("sharding.name=neoo"))
    message = str(err.value)
    assert "sharding.name" in message and "Did you mean 'neo'?" in message and "Available: neo, torchrec." in message


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_steps=0", "trainer.max_steps must be a positive integer, got 0."),
        ("trainer.dense_optimizer=lamb", "trainer.dense_optimizer='lamb' is unknown; choose adagrad, adam or sgd."),
        ("+trainer.backend=mpi", "trainer.backend='mpi' is unknown; choose gloo or nccl."),
        ("~cache", "Config group 'cache' is missing; add cache=<name>"),
        ("cache.name=null", "cache.name is missing; pick one of: lfu, lru, none"),
        ("trainer.val_every_n_steps=-2", "trainer.val_every_n_steps must be a whole number, at least 1 (or null), got -2."),
        ("trainer.threads_per_rank=0", "trainer.threads_per_rank must be a whole number, at least 1 (or null), got 0."),
        ("trainer.checkpoint_every_n_steps=-1", "trainer.checkpoint_every_n_steps must be a whole number"),
        ("trainer.world_size=2.5", "trainer.world_size must be a whole number, at least 1 (or null), got 2.5."),
        ("trainer.resume=yes", "trainer.resume must be true or false, got 'yes'."),
        ("trainer.dense_learning_rate=-1", "trainer.dense_learning_rate must be a positive number, got -1."),
        ("seed=1.5", "seed must be a whole number, 0 or more, got 1.5."),
    ],
)
def test_bad_values_are_one_sentence(hydra_conf, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose_run(override))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def assert_all_named(message: str, first: str, *also: str) -> None:
    """One line that opens with ``first`` and names each of ``also`` after an "Also:"."""
    assert message.startswith(first), message
    for said in also:
        assert f"Also: {said}" in message, message
    assert "\n" not in message and message.count("settings are wrong") == 1


def test_every_bad_setting_is_named_at_once(hydra_conf) -> None:
    # only the first was named: a command (or a sweep's job) with three bad settings took three
    # runs to fix, each starting torch and TorchRec again
    with pytest.raises(ConfigError) as err:
        validate(compose_run("+kernel.learning_rat=0.1", "trainer.max_steps=0", "seed=-1", "+nonsense=1"))
    assert_all_named(str(err.value), "4 settings are wrong. Unknown config key 'nonsense'.",
                     "Unknown key kernel.learning_rat for kernel plugin 'fused'. Did you mean kernel.learning_rate?",
                     "trainer.max_steps must be a positive integer, got 0.",
                     "seed must be a whole number, 0 or more, got -1.")
    with pytest.raises(ConfigError) as err:  # one: as it was
        validate(compose_run("trainer.max_steps=0"))
    assert str(err.value) == "trainer.max_steps must be a positive integer, got 0."


def test_whole_numbers_written_as_floats_are_taken_everywhere(hydra_conf) -> None:
    # YAML and Hydra's command line read 1e3 and 2.0 as floats; every whole-number setting
    # (trainer, seed, plugin parameters, topology, data) takes them as the whole number
    run = validate(compose_run(
        "trainer.max_steps=1e3", "trainer.world_size=2.0", "trainer.val_batches=0.0", "seed=7.0",
        "+topology=zionex", "topology.num_nodes=2.0", "data.num_sparse=4.0", "data.seed=3e0",
        "+sharding.min_col_width=32.0", "model.dense_arch=[64.0,16]", "model.over_arch=[32,1.0]",
    ))
    assert (run.trainer.max_steps, run.trainer.world_size, run.trainer.val_batches, run.seed) == (1000, 2, 0, 7)
    assert all(type(v) is int for v in (run.trainer.max_steps, run.trainer.world_size, run.seed))
    topology = instantiate("topology", run.topology)
    assert (topology.num_nodes, type(topology.num_nodes)) == (2, int)
    data = instantiate("data", run.data)
    assert len(data.tables(16)) == 4
    assert instantiate("sharding", run.sharding).min_col_width == 32
    model = instantiate("model", run.model)
    assert (model.dense_arch, model.over_arch) == ([64, 16], [32, 1])
    # 2.5 is not whole anywhere
    for overrides, key in ((("+topology=zionex", "topology.num_nodes=2.5"), "topology.num_nodes"),
                           (("data.num_sparse=2.5",), "data.num_sparse"), (("trainer.max_steps=2.5",), "trainer.max_steps")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            run = validate(compose_run(*overrides))
            instantiate(key.split(".")[0], getattr(run, key.split(".")[0]))


def test_trainer_defaults_match_schema() -> None:
    default = OmegaConf.to_container(OmegaConf.load(CONF / "trainer" / "default.yaml"))
    schema = TrainerConfig()
    for key, value in default.items():
        assert key in TrainerConfig.__dataclass_fields__, f"trainer/default.yaml: unknown key {key}"
        assert getattr(schema, key) == value, f"trainer/default.yaml {key} differs from TrainerConfig"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("kernel.optimizer=adam", "kernel.optimizer=adam: FBGEMM's fused kernel has no Adam on CPU"),
        ("trainer.backend=nccl", "trainer.backend=nccl needs CUDA devices"),
    ],
)
def test_settings_cpu_ranks_cannot_run_are_refused_before_they_start(hydra_conf, override: str, message: str) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine these settings run")
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_launch(validate(compose_run(override)))


def test_ranks_torchrun_started_must_be_as_many_as_the_settings_say(hydra_conf, monkeypatch) -> None:
    # topology.world_size=1 under 2 torchrun ranks gave each rank the memory of the one rank the
    # local topology described: the plan counted the machine's RAM twice
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("NEO_SPAWNED", raising=False)
    assert resolve_launch(validate(compose_run("+topology.world_size=2"))).world_size == 2
    for override, key in (("+topology.world_size=1", "topology"), ("trainer.world_size=4", "trainer")):
        with pytest.raises(ConfigError, match=rf"^{key}.world_size=\d but the launcher started 2 ranks"):
            resolve_launch(validate(compose_run(override)))


def test_an_output_folder_that_cannot_take_the_run_is_refused_before_training(tmp_path: Path) -> None:
    from neo_core.training.run import check_output_dir

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"output_dir=.*/file/run' cannot be written"):
        check_output_dir(tmp_path / "file" / "run")
    (tmp_path / "run" / "metrics.json").mkdir(parents=True)  # would fail only after training
    with pytest.raises(ConfigError, match=r"metrics.json is in the way of the run's output"):
        check_output_dir(tmp_path / "run")
    check_output_dir(tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir() and not list((tmp_path / "fresh").iterdir())


def test_the_local_topologys_memory_advice_stays_with_it() -> None:
    # advice for messages (its CPU ranks split the RAM): not a figure in plan.json, and not kept by a
    # topology changed from it, nor by TorchRec's view of CPU ranks, which gets their memory as its ddr
    from neo_plugins.topology.local import local_topology

    local = local_topology(world_size=2, compute_device="cpu")
    assert local.memory_fix and "topology.memory_fraction=1 is too little" in local.memory_fix
    assert local.config_keys["device_memory"][0] == "topology.memory_fraction" and local.config_limits == {"device_memory": 1}
    assert "memory_fix" not in local.to_dict()
    assert local.replace(num_nodes=4).memory_fix is None
    assert local.replace(intra_node_bw=1e9).memory_fix == local.memory_fix
    assert local.emulated_on(2, "cuda").memory_fix is None
    from neo_plugins.topology.zionex import zionex_topology

    emulated = zionex_topology().emulated_on(2, "cpu")  # 40 GiB a device, 192 GiB of host memory
    assert {d.storage.ddr for d in emulated.to_torchrec().devices} == {emulated.device_memory}


def test_both_planners_take_time_budget_s_so_one_sweep_limits_both(hydra_conf) -> None:
    # `plan.py -m sharding=neo,torchrec sharding.time_budget_s=5` was refused for torchrec,
    # whose own key is timeout_s: it takes neo's name for the same limit
    from neo_plugins.sharding.torchrec_planner import TorchRecPlanner

    for sharding in ("neo", "torchrec"):
        validate(compose_run(f"sharding={sharding}", "+sharding.time_budget_s=5"))
    assert TorchRecPlanner(time_budget_s=5).timeout_s == 5 and TorchRecPlanner(timeout_s=7).timeout_s == 7
    with pytest.raises(ConfigError, match=r"sharding.timeout_s=7 and sharding.time_budget_s=5: give one"):
        TorchRecPlanner(timeout_s=7, time_budget_s=5)
    with pytest.raises(ConfigError, match=r"sharding.time_budget_s must be a positive number of seconds"):
        TorchRecPlanner(time_budget_s=-1)


@pytest.mark.parametrize("sharding", ["neo", "torchrec"])
def test_the_bytes_said_before_building_the_shards_count_every_table(hydra_conf, sharding) -> None:
    # the "building the tables' shards" line read the Neo planner's memory kinds: a TorchRec
    # plan has none of them, so it said nothing before a long build
    from neo_core.training.module import table_weight_bytes

    run = validate(compose_run(f"sharding={sharding}", "trainer.world_size=2"))
    parts = build_parts(run, resolve_launch(run))
    result = plan_run(parts)
    model = parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta")
    copies = {a.name: len(a.ranks) if a.sharding_type == "data_parallel" else 1 for a in result.tables}
    expected = sum(t.num_embeddings * t.embedding_dim * 4 * copies[t.name] for t in parts.tables)
    assert expected > 0 and table_weight_bytes(model, result) == expected


def test_a_models_dim_mismatch_says_which_settings_fix_it() -> None:
    # it said the model needs every table at model.embedding_dim=16, and no more
    from neo_core.sharding import TableSpec
    from neo_plugins.models import DLRMBuilder

    model = DLRMBuilder(embedding_dim=16, dense_arch=[64, 16], over_arch=[32, 1])
    with pytest.raises(ConfigError) as err:
        model.check([TableSpec("a", 100, 8), TableSpec("b", 100, 8)], 13)
    assert str(err.value) == ("Table 'a' has dim 8 but dlrm needs every table at model.embedding_dim=16; set "
                              "model.embedding_dim=8 model.dense_arch=[64,8] (the tables' dim), or give the tables "
                              "embedding_dim 16.")
    with pytest.raises(ConfigError) as err:
        model.check([TableSpec("a", 100, 16), TableSpec("b", 100, 8)], 13)
    assert str(err.value).endswith("; give every table one dim (the tables have 8, 16), and model.embedding_dim "
                                   "that dim.")


def test_every_bad_trainer_setting_is_named_at_once(hydra_conf) -> None:
    # an unknown trainer key hid the bad values beside it (one problem a group)
    with pytest.raises(ConfigError) as err:
        validate(compose_run("+trainer.bogus=1", "trainer.max_steps=0", "trainer.resume=yes", "seed=-1"))
    assert_all_named(str(err.value), "4 settings are wrong. Unknown key trainer.bogus.",
                     "trainer.max_steps must be a positive integer, got 0.",
                     "trainer.resume must be true or false, got 'yes'.",
                     "seed must be a whole number, 0 or more, got -1.")


def test_a_plan_a_rank_makes_itself_is_checked_as_the_printed_one_was(hydra_conf) -> None:
    # a rank plans anew where its machine has less memory than rank 0's: that plan may split
    # tables otherwise (row-wise), which the run's precision cannot send over gloo; it was built
    # unchecked, and failed inside TorchRec
    from neo_core.training.run import rank_plan

    run = validate(compose_run("compression=fp16", "compression.backward=int8", "+sharding.sharding_types=[RW,DP]",
                               "trainer.world_size=2"))
    launch = resolve_launch(run)
    parts = build_parts(run, launch)
    model = parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta")
    assert rank_plan(parts, model, None).tables  # without the launch: not checked
    with pytest.raises(ConfigError, match=r"cannot run over gloo for t_cat_0 \(RW\)"):
        rank_plan(parts, model, None, launch=launch)


def test_a_plan_made_in_a_rank_other_than_0_is_not_checked_there(hydra_conf, monkeypatch) -> None:
    # every rank runs rank 0's plan: another rank's own plan is not run, so not refused there
    from neo_core.training import run as run_module

    run = validate(compose_run("compression=fp16", "compression.backward=int8", "+sharding.sharding_types=[RW,DP]",
                               "trainer.world_size=2"))
    launch = resolve_launch(run)
    parts = build_parts(run, launch)
    model = parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta")
    monkeypatch.setattr(run_module, "dist_rank", lambda: 1)
    assert run_module.rank_plan(parts, model, None, launch=launch).tables


def test_a_rank_on_a_smaller_machine_plans_anew_rather_than_take_the_plan_made_here(hydra_conf, monkeypatch) -> None:
    # the plan the starting process made is for rank 0's machine: where the ranks' machines
    # differ, a rank plans for the least memory (and says why) instead of taking it
    from neo_core.training import run as run_module

    run = validate(compose_run("trainer.world_size=2"))
    parts = build_parts(run, resolve_launch(run))
    model = parts.model_builder.build(parts.tables, parts.data.num_dense, device="meta")
    made_here = object()
    monkeypatch.setitem(run_module._PLANNED_HERE, "digest", made_here)
    note = "The ranks' machines give them unequal memory (device memory 1 GiB to 2 GiB a rank): planned for the least"
    monkeypatch.setattr(run_module, "on_the_smallest_machine", lambda parts, every=None: (parts, note))
    anew = run_module.rank_plan(parts, model, "digest")
    assert anew is not made_here and anew.tables and anew.notes[0] == note
    # alike machines: the plan made here is taken, once
    monkeypatch.setattr(run_module, "on_the_smallest_machine", lambda parts, every=None: (parts, None))
    assert run_module.rank_plan(parts, model, "digest") is made_here and "digest" not in run_module._PLANNED_HERE


def test_a_sweep_job_is_planned_ahead_only_where_gloo_may_not_carry_its_precision(hydra_conf, monkeypatch) -> None:
    from dataclasses import replace

    from neo_core.training import run as run_module

    run = validate(compose_run("compression=fp16", "compression.backward=int8", "+sharding.sharding_types=[RW,DP]",
                               "trainer.world_size=2"))
    launch = resolve_launch(run)
    parts = build_parts(run, launch)
    with pytest.raises(ConfigError, match=r"cannot run over gloo for t_cat_0 \(RW\)"):
        run_module.check_job_plan(parts, launch)
    # not planned (a sweep's planning would double): one rank, or precisions gloo carries both ways
    monkeypatch.setattr(run_module, "checked_plan", lambda *a: pytest.fail("planned"))
    assert run_module.check_job_plan(parts, replace(launch, world_size=1)) is None
    assert run_module.check_job_plan(replace(parts, compressor=Compressor("h", "fp16", "bf16")), launch) is None
    # tables that do not fit fail the job at its turn, alone, as without compression (README): not the sweep
    from neo_core.errors import PlanningError

    def no_room(*args):
        raise PlanningError("Table 't_cat_0' is larger than the whole cluster allows")

    monkeypatch.setattr(run_module, "checked_plan", no_room)
    assert run_module.check_job_plan(parts, launch) is None


def test_torchrec_is_quieted_to_warnings_while_planning_and_as_it_was_after() -> None:
    import logging

    from neo_core.training.run import quiet_torchrec

    log = logging.getLogger("torchrec")
    level = log.level
    try:
        log.setLevel(logging.INFO)
        with quiet_torchrec():
            assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)
        assert log.level == logging.INFO
        log.setLevel(logging.ERROR)  # quieter already: left so
        with quiet_torchrec():
            assert not log.isEnabledFor(logging.WARNING)
        assert log.level == logging.ERROR
    finally:
        log.setLevel(level)
