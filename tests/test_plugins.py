"""The plugin manager: built-ins by kind, duplicates, unknown names, broken and misspelled plugins."""

from __future__ import annotations

import inspect
import math
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neo_core import hookimpl, hookspecs
from neo_core.cache import CachePolicy
from neo_core.errors import ConfigError, PluginClash, PluginError
from neo_core.plugins import (
    BUILTIN_DISTRIBUTION,
    DEFAULT_PLUGINS,
    KINDS,
    PluginLoadWarning,
    get_plugins,
    load_plugins,
    reset_plugins,
)
from neo_core.registry import Registry, check_kind
from neo_core.topology import GiB, Topology

BUILTINS = {
    "topology": ["cluster", "local", "zionex"],
    "sharding": ["neo", "torchrec"],
    "kernel": ["dense", "fused"],
    "cache": ["lfu", "lru", "none"],
    "compression": ["bf16", "fp16", "none"],
    "model": ["dcnv2", "dlrm"],
    "data": ["synthetic"],
}


def hook_names() -> list[str]:
    return [name for name, fn in vars(hookspecs).items() if callable(fn) and name.startswith("neo_register_")]


class TempCache:
    """A temporary plugin object registering one cache policy."""

    __neo_provider__ = "temp-dist"

    def __init__(self, name: str = "temp_cache", plugin_name: str = "") -> None:
        self.__name__ = plugin_name or f"temp_plugin_{name}"
        self.cache_name = name

    @hookimpl
    def neo_register_cache_policies(self, registry):
        def factory(load_factor: float = 0.25) -> CachePolicy:
            """A temporary cache policy."""
            return CachePolicy(name=self.cache_name, load_factor=load_factor)

        registry.register(self.cache_name, factory)


@pytest.fixture
def installed(plugin_site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The two fixture distributions on ``sys.path`` of this process, removed afterwards."""
    for site in plugin_site.values():
        monkeypatch.syspath_prepend(str(site))
    for switch in ("NEO_STRICT_PLUGINS", "NEO_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(switch, raising=False)
    yield
    for module in ("neo_example_plugin", "neo_broken_plugin"):
        sys.modules.pop(module, None)


def test_every_hookspec_is_a_kind_and_every_kind_has_a_config_group() -> None:
    assert sorted(hook for hook, _ in KINDS.values()) == sorted(hook_names())
    assert sorted(group for _, group in KINDS.values()) == sorted(BUILTINS)


@pytest.mark.parametrize("autoload", [True, False], ids=["entry-points", "no-autoload"])
def test_builtins_are_registered_by_kind(autoload: bool) -> None:
    plugins = load_plugins(autoload=autoload, strict=True)
    assert {group: plugins.registry(group).names() for group in plugins.groups()} == BUILTINS
    for registry in plugins.registries.values():
        assert {e.provider for e in registry.entries()} == {BUILTIN_DISTRIBUTION}
        assert all(e.description for e in registry.entries()), registry.kind
    # built-ins come through the same plugin path as third-party ones: one pluggy plugin each
    registered = {getattr(p, "__name__", None) for p in plugins.pm.get_plugins()}
    assert set(DEFAULT_PLUGINS) <= registered


def test_builtins_are_entry_points_of_this_distribution() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group=hookspecs.ENTRY_POINT_GROUP) if ep.dist and ep.dist.name == BUILTIN_DISTRIBUTION]
    assert sorted(ep.value for ep in eps) == sorted(DEFAULT_PLUGINS)


def test_unknown_group_names_the_groups() -> None:
    with pytest.raises(PluginError, match="groups: topology, sharding, kernel"):
        load_plugins(autoload=False).registry("sharder")


def test_unknown_name_names_group_choices_and_close_match() -> None:
    registry = load_plugins(autoload=False).registry("sharding")
    with pytest.raises(PluginError) as err:
        registry.get("neoo")
    message = str(err.value)
    assert "sharding.name" in message
    assert "Available: neo, torchrec." in message
    assert "Did you mean 'neo'?" in message
    with pytest.raises(PluginError) as err:
        registry.create("zzzz")
    assert "Did you mean" not in str(err.value) and "Available: neo, torchrec." in str(err.value)
    # a plugin registered with capitals is suggested as registered, not as lower-cased to match
    registry.register("MyPlanner", lambda: None)
    with pytest.raises(PluginError, match=re.escape("plugin 'myplaner' for sharding.name. Did you mean 'MyPlanner'?")):
        registry.get("myplaner")


@pytest.mark.parametrize(("group", "given", "meant"), [("cache", "LRU", "lru"), ("compression", "FP16", "fp16"),
                                                       ("sharding", "Neo", "neo"), ("kernel", "FUSED", "fused"),
                                                       ("topology", "ZionEX", "zionex"), ("cache", "LFRU", "lru")])
def test_an_unknown_plugin_name_in_other_case_is_told_its_match(group, given, meant) -> None:
    # neo_core.api.plan_tables(..., cache="LRU") said "Unknown cache policy plugin 'LRU'" and no more
    from neo_core.api import resolve

    with pytest.raises(PluginError, match=re.escape(f"plugin {given!r} for {group}.name. Did you mean {meant!r}?")):
        resolve(group, given)


def test_temporary_plugin_is_global_then_reset(register_plugin) -> None:
    plugins = register_plugin(TempCache())
    assert get_plugins() is plugins
    entry = plugins.registry("cache").get("temp_cache")
    assert entry.provider == "temp-dist"
    assert entry.description == "A temporary cache policy."
    policy = plugins.create("cache", "temp_cache", {"load_factor": 0.5})
    assert policy == CachePolicy(name="temp_cache", load_factor=0.5)
    reset_plugins(None)
    assert "temp_cache" not in get_plugins().registry("cache")


def test_plugin_module_is_accepted(register_plugin) -> None:
    module = types.ModuleType("neo_temp_module_plugin")

    @hookimpl
    def neo_register_models(registry):
        from neo_plugins.models import dlrm

        registry.register("tiny_dlrm", dlrm, description="DLRM under another name.")

    module.neo_register_models = neo_register_models
    plugins = register_plugin(module)
    entry = plugins.registry("model").get("tiny_dlrm")
    assert entry.provider == "neo_temp_module_plugin"
    assert "tiny_dlrm" in plugins.registry("model").names()


def test_duplicate_names_raise_naming_both_providers() -> None:
    with pytest.raises(PluginError, match=r"'temp_cache' is registered twice \(temp-dist and temp-dist\)"):
        load_plugins(extra=[TempCache(plugin_name="one"), TempCache(plugin_name="two")], autoload=False)
    clash = TempCache("none")
    with pytest.raises(PluginError, match=r"'none' is registered twice \((.+) and (.+)\); rename one") as err:
        load_plugins(extra=[clash], autoload=False)
    providers = set(re.search(r"twice \(([^)]+) and ([^)]+)\)", str(err.value)).groups())
    assert providers == {"temp-dist", BUILTIN_DISTRIBUTION}


def test_two_plugins_with_one_name_raise_instead_of_dropping_one() -> None:
    with pytest.raises(PluginError, match="Two Neo plugins are named 'same'"):
        load_plugins(extra=[TempCache("a", plugin_name="same"), TempCache("b", plugin_name="same")], autoload=False)
    # a third-party entry point may not reuse a built-in one's name either ("cache" here)
    with pytest.raises(PluginError, match="Two Neo plugins are named 'cache'"):
        load_plugins(extra=[TempCache(plugin_name="cache")], autoload=True)
    # registering the very same object twice is harmless
    plugin = TempCache()
    assert "temp_cache" in load_plugins(extra=[plugin, plugin], autoload=False).registry("cache")


def test_misspelled_hook_implementation_is_rejected() -> None:
    class Misspelled:
        __name__ = "misspelled_plugin"

        @hookimpl
        def neo_register_cache_polices(self, registry):  # sic: "polices"
            raise AssertionError("must never be called")

        @hookimpl
        def neo_register_kernels(self, registry):  # a valid hook of the same plugin: skipped too
            registry.register("never_kernel", lambda: None)

    # skipped whole with a warning naming the hook, like any plugin that fails to load ...
    with pytest.warns(PluginLoadWarning, match=r"misspelled_plugin.neo_register_cache_polices; did you mean "
                      r"neo_register_cache_polices -> neo_register_cache_policies\? valid hooks: "):
        plugins = load_plugins(extra=[Misspelled()], autoload=False)
    assert "misspelled_plugin" in plugins.failed and "lru" in plugins.registry("cache")
    assert "never_kernel" not in plugins.registry("kernel")
    # ... and an error under NEO_STRICT_PLUGINS
    with pytest.raises(PluginError) as err:
        load_plugins(extra=[Misspelled()], autoload=False, strict=True)
    assert "misspelled_plugin.neo_register_cache_polices" in str(err.value)
    assert "neo_register_cache_policies" in str(err.value)


def test_wrong_hook_arguments_are_rejected() -> None:
    class WrongArgs:
        __name__ = "wrong_args_plugin"

        @hookimpl
        def neo_register_kernels(self, reg):  # the spec's argument is "registry"
            pass

    import pluggy

    with pytest.raises(pluggy.PluginValidationError, match=r"Argument\(s\) \{'reg'\} are declared in the hookimpl"):
        load_plugins(extra=[WrongArgs()], autoload=False)


def test_plugin_failing_to_register_is_named_and_skipped(capsys) -> None:
    class Failing:
        __name__ = "failing_plugin"

        @hookimpl
        def neo_register_datasets(self, registry):
            raise RuntimeError("no data here")

    with pytest.warns(PluginLoadWarning, match="'failing_plugin' failed to load and was skipped"):
        plugins = load_plugins(extra=[Failing()], autoload=False, strict=False)
    assert re.fullmatch(r"PluginError: its neo_register_datasets raised RuntimeError: no data here "
                        r"\(raised at test_plugins\.py:\d+ in neo_register_datasets\)", plugins.failed["failing_plugin"])
    assert plugins.registry("data").names() == ["synthetic"]
    assert "failing_plugin" in capsys.readouterr().err
    with pytest.raises(PluginError, match="'failing_plugin' failed to load .*NEO_STRICT_PLUGINS"):
        load_plugins(extra=[Failing()], autoload=False, strict=True)
    # said once per run: not again by the ranks it spawns, nor by torchrun's ranks other than 0
    from neo_core.plugins import QUIET_ENV

    for env, value in ((QUIET_ENV, "1"), ("RANK", "1")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(env, value)
            with pytest.warns(PluginLoadWarning):
                again = load_plugins(extra=[Failing()], autoload=False, strict=False)
        assert again.failed and "failing_plugin" not in capsys.readouterr().err


def test_strict_mode_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing:
        __name__ = "failing_plugin"

        @hookimpl
        def neo_register_datasets(self, registry):
            raise RuntimeError("no data here")

    monkeypatch.setenv("NEO_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="failing_plugin"):
        load_plugins(extra=[Failing()], autoload=False)


def test_create_rejects_unknown_and_missing_keys() -> None:
    plugins = load_plugins(autoload=False)
    with pytest.raises(ConfigError, match=r"Unknown key kernel\.learning_rat .*Did you mean kernel\.learning_rate\?"):
        plugins.create("kernel", "fused", {"learning_rat": 0.1})

    class NeedsParam:
        __name__ = "needs_param"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register("needs_lf", lambda load_factor: CachePolicy("needs_lf", load_factor))

        @hookimpl
        def neo_register_topologies(self, registry):  # **extra: Python's TypeError named no setting
            registry.register("needs_nodes", lambda num_nodes, gpus=4, **extra: Topology(
                "n", num_nodes, gpus, "cuda", GiB, GiB, 1e9, 1e9, 1e9, 1e9, 1e9))

    plugins = load_plugins(extra=[NeedsParam()], autoload=False)
    with pytest.raises(ConfigError, match=r"needs cache\.load_factor"):
        plugins.create("cache", "needs_lf")
    with pytest.raises(ConfigError, match=r"^topology plugin 'needs_nodes' needs topology\.num_nodes=<value>\.$"):
        plugins.create("topology", "needs_nodes", {"gpus": 2})
    assert plugins.create("topology", "needs_nodes", {"num_nodes": 2, "nics": 1}).num_nodes == 2
    # a factory of **kwargs that takes its own name is given it, as one without them is
    plugins.registry("cache").register("named_kw", lambda name, load_factor=0.1, **extra: CachePolicy(name, load_factor))
    assert plugins.create("cache", "named_kw").name == "named_kw"


def test_a_key_of_another_group_is_pointed_to_its_group() -> None:
    # sharding.load_factor, kernel.load_factor, sharding.optimizer and cache.reserve_fraction
    # got only "Unknown key ... Its keys: ..."
    from neo_core.plugins import get_plugins

    plugins = get_plugins()
    for group, name, key, said in (
        ("sharding", "neo", "load_factor", "load_factor is a key of the cache group ('lfu', 'lru'): cache.load_factor=<value>."),
        ("kernel", "fused", "load_factor", "cache.load_factor=<value>."),
        ("sharding", "neo", "optimizer", "optimizer is a key of the kernel group ('dense', 'fused'): kernel.optimizer=<value>."),
        ("cache", "lru", "reserve_fraction", "a key of the sharding group ('neo'): sharding.reserve_fraction=<value>."),
    ):
        with pytest.raises(ConfigError) as err:
            plugins.create(group, name, {key: 0.1})
        assert str(err.value).startswith(f"Unknown key {group}.{key} for ") and said in str(err.value), str(err.value)
    # a key no group has: no pointer
    with pytest.raises(ConfigError) as err:
        plugins.create("sharding", "neo", {"zzz_nothing": 1})
    assert "is a key of the" not in str(err.value), str(err.value)


# --- third-party distributions, discovered through the "neo" entry-point group ---------------


def test_installed_plugin_is_discovered_with_its_distribution(installed) -> None:
    with pytest.warns(PluginLoadWarning, match="'broken' failed to load"):
        plugins = load_plugins()
    cache = plugins.registry("cache")
    assert cache.names() == ["lfu", "lru", "my_policy", "none"]
    assert cache.get("my_policy").provider == "neo-example-plugin"
    assert plugins.registry("topology").get("tiny_cluster").provider == "neo-example-plugin"
    assert plugins.create("cache", "my_policy", {"load_factor": 0.5}).algorithm == "lfu"
    assert plugins.registry("cache").get("my_policy").options == {"my_policy_half": {"load_factor": 0.5}}
    topo = plugins.create("topology", "tiny_cluster", {"num_nodes": 3})
    assert topo.world_size == 3
    # the plugin that raises on import is reported by its entry-point name and skipped
    assert list(plugins.failed) == ["broken"]
    assert "neo_broken_plugin is broken on purpose" in plugins.failed["broken"]
    # a factory's ValueError becomes a ConfigError naming the group and the distribution
    with pytest.raises(ConfigError, match=r"cache=my_policy \(neo-example-plugin\): cache.load_factor must be in"):
        plugins.create("cache", "my_policy", {"load_factor": 2.0})


def test_broken_plugin_is_fatal_in_strict_mode(installed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEO_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="Neo plugin 'broken' failed to load .*broken on purpose"):
        load_plugins()


def test_disabled_autoload_loads_builtins_only(installed, monkeypatch: pytest.MonkeyPatch, recwarn) -> None:
    monkeypatch.setenv("NEO_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins = load_plugins()
    assert {group: plugins.registry(group).names() for group in plugins.groups()} == BUILTINS
    assert plugins.failed == {}
    assert not [w for w in recwarn if issubclass(w.category, PluginLoadWarning)]
    assert "neo_example_plugin" not in sys.modules and "neo_broken_plugin" not in sys.modules


def test_hook_signatures_take_only_the_registry() -> None:
    for name in hook_names():
        params = list(inspect.signature(getattr(hookspecs, name)).parameters)
        assert params == ["registry"], name


class EveryKind:
    """A temporary plugin implementing every registration hook (aliases of the built-ins)."""

    __name__ = "every_kind_plugin"

    @hookimpl
    def neo_register_topologies(self, registry):
        from neo_plugins.topology.zionex import zionex_topology

        registry.register("alias_topology", zionex_topology)

    @hookimpl
    def neo_register_sharders(self, registry):
        from neo_plugins.sharding.planner import NeoPlanner

        registry.register("alias_sharder", NeoPlanner)

    @hookimpl
    def neo_register_kernels(self, registry):
        from neo_plugins.kernels import dense_kernel

        registry.register("alias_kernel", dense_kernel)

    @hookimpl
    def neo_register_cache_policies(self, registry):
        registry.register("alias_cache", lambda: CachePolicy("alias_cache"))

    @hookimpl
    def neo_register_compressors(self, registry):
        from neo_plugins.compression import fp16_compression

        registry.register("alias_compressor", fp16_compression)

    @hookimpl
    def neo_register_models(self, registry):
        from neo_plugins.models import dcnv2

        registry.register("alias_model", dcnv2)

    @hookimpl
    def neo_register_datasets(self, registry):
        from neo_plugins.data import synthetic

        registry.register("alias_data", synthetic)


def test_every_hook_registers_into_its_kind(register_plugin) -> None:
    from neo_core.config import instantiate, validate

    plugins = register_plugin(EveryKind())
    aliases = {"topology": "alias_topology", "sharding": "alias_sharder", "kernel": "alias_kernel",
               "cache": "alias_cache", "compression": "alias_compressor", "model": "alias_model",
               "data": "alias_data"}
    for group, name in aliases.items():
        assert name in plugins.registry(group), group
        assert plugins.registry(group).get(name).provider == "every_kind_plugin"
    run = validate({group: {"name": name} for group, name in aliases.items()})  # uses get_plugins()
    for group in aliases:
        assert instantiate(group, getattr(run, group)) is not None
    assert instantiate("topology", run.topology).world_size == 128


def test_builtin_cache_policies_lru_and_lfu() -> None:
    plugins = load_plugins(autoload=False)
    lru = plugins.create("cache", "lru", {"load_factor": 0.1})
    assert (lru.name, lru.algorithm, lru.load_factor) == ("lru", "lru", 0.1)
    assert plugins.create("cache", "lfu", {}).algorithm == "lfu"
    for bad in (0.0, 1.5, float("nan"), "0.2"):
        # a string is refused by its kind (the factory's float default), a number by its range
        with pytest.raises(ConfigError, match=r"cache\.load_factor(=.* must lie in \(0, 1\]| must be a number)"):
            plugins.create("cache", "lru", {"load_factor": bad})


def test_plugin_parameters_are_checked_by_their_annotations_not_their_defaults() -> None:
    plugins = load_plugins(autoload=False)
    registry: Registry[Any] = Registry("topology", "topology")  # no result type: any factory

    def roomy(gbps: float = 25, nodes: int = 2, flag: bool = False, sizes: tuple[int, ...] | int = (1,)) -> Any:
        return (gbps, nodes, flag, sizes)

    registry.register("roomy_topology", roomy)
    # a float annotation takes a fraction though its default is whole; 1e7 (a float on the
    # command line) is a whole number; a list-or-number parameter takes either
    assert registry.create("roomy_topology", {"gbps": 12.5, "nodes": 1e7, "sizes": 5}) == (
        12.5, 10_000_000, False, 5)
    assert registry.create("roomy_topology", {"flag": 1})[2] == 1
    for params, message in (({"nodes": 2.5}, "topology.nodes must be a whole number, got 2.5."),
                            ({"gbps": "fast"}, "topology.gbps must be a number, got 'fast'."),
                            ({"flag": "maybe"}, "topology.flag must be true or false, got 'maybe'.")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            registry.create("roomy_topology", params)
    # the built-in data plugin takes one number for every table, as documented
    data = plugins.create("data", "synthetic", {"rows": 1000, "num_sparse": 2, "pooling": 2})
    assert [t.num_embeddings for t in data.tables(16)] == [1000, 1000]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rows": [1.5, 2.7]}, "data.rows must hold whole numbers, got [1.5, 2.7]."),  # not 1 and 2 rows
        ({"rows": [True, 5]}, "data.rows must hold whole numbers, got [True, 5]."),
        ({"pooling": ["x"]}, "data.pooling must hold numbers, got ['x']."),
    ],
)
def test_synthetic_data_sizes_are_not_truncated_or_taken_from_bools(params, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_plugins(autoload=False).create("data", "synthetic", {"num_sparse": 2, **params})
    assert [t.num_embeddings for t in load_plugins(autoload=False).create(
        "data", "synthetic", {"num_sparse": 2, "rows": [1e3, 20]}).tables(16)] == [1000, 20]


def test_evaluated_optional_annotations_are_checked_too() -> None:
    # a plugin module without ``from __future__ import annotations`` has real typing objects
    from typing import Optional

    for annotation in (Optional[int], int | None):
        assert check_kind("cache.ways", None, annotation) is None
        assert check_kind("cache.ways", 4.0, annotation) == 4
        with pytest.raises(ConfigError, match=re.escape("cache.ways must be a whole number (or null), got 'abc'.")):
            check_kind("cache.ways", "abc", annotation)
    assert check_kind("cache.size", "any", int | str) == "any"  # a union of kinds: the plugin's to check


def test_a_text_parameter_takes_text_only() -> None:
    # cache.tag=5 reached a str parameter as the int 5
    for annotation in ("str", str):
        assert check_kind("cache.tag", "warm", annotation) == "warm"
        with pytest.raises(ConfigError, match=re.escape("cache.tag must be text, got 5 (quote it to give it as text: "
                                                        "cache.tag='5').")):
            check_kind("cache.tag", 5, annotation)
    assert check_kind("cache.tag", None, "str | None") is None
    with pytest.raises(ConfigError, match=re.escape("cache.tag must be text (or null), got [1].")):
        check_kind("cache.tag", [1], "str | None")


def test_a_factory_returning_the_wrong_class_is_named(register_plugin) -> None:
    class WrongType:
        __name__ = "wrong_type_plugin"

        @hookimpl
        def neo_register_compressors(self, registry):
            registry.register("half_as_dict", lambda: {"forward": "fp16"})

            def refuses(level: int = 3):
                raise ValueError(f"level {level} is not supported")

            registry.register("refuses", refuses)

            def breaks():
                raise RuntimeError("factory blew up")  # the line named

            registry.register("breaks", breaks)

    plugins = register_plugin(WrongType())
    breaks_line = next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                       if line.endswith("# the line named"))
    with pytest.raises(PluginError) as err:
        plugins.create("compression", "half_as_dict")
    assert str(err.value) == (
        "compressor plugin 'half_as_dict' (wrong_type_plugin) returned dict, not "
        "neo_core.compression.Compressor: its factory must return one (README, 'Writing a plugin')."
    )
    # a factory's own TypeError/ValueError names the plugin's distribution
    with pytest.raises(ConfigError, match=r"^compression=refuses \(wrong_type_plugin\): level 5 is not supported$"):
        plugins.create("compression", "refuses", {"level": 5})
    # any other failure of the factory is named too (it was a bare traceback), its cause chained
    with pytest.raises(PluginError) as err:
        plugins.create("compression", "breaks")
    assert str(err.value) == (  # where: it read like the user's mistake, with no file or line
        "compressor plugin 'breaks' (wrong_type_plugin) failed to build: RuntimeError: factory blew up (raised at "
        f"test_plugins.py:{breaks_line} in breaks; NEO_TRACEBACK=1 shows the traceback)")
    assert isinstance(err.value.__cause__, RuntimeError)


@pytest.mark.parametrize("precisions", [("fp16", "fp8"), ("bf16", "fp8"), ("fp8", "fp16"), ("fp16", "int8"), ("bf16", "fp32")])
def test_the_reduce_scatter_precisions_are_those_torchrec_sends(precisions, caplog) -> None:
    # the cost model charges row-split tables' reduce-scatters at these precisions: they must be
    # what TorchRec's codec registry builds for that collective (no fp8 there), and the
    # all-to-alls keep the asked ones
    from neo_core.compression import Compressor

    c = Compressor("x", *precisions)
    import logging

    import torchrec.distributed.fbgemm_qcomm_codec  # noqa: F401 - FBGEMM notes each library it loads

    logging.getLogger().setLevel(logging.INFO)  # as Hydra's job logging sets it
    with caplog.at_level(logging.INFO):
        registry = c.qcomm_codecs_registry()
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # one codec line each, fp8 notes
    assert logging.getLogger().level == logging.INFO
    scatter, a2a = registry["POOLED_EMBEDDINGS_REDUCE_SCATTER"], registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    assert (str(scatter.forward._comm_precision), str(scatter.backward._comm_precision)) == (
        c.reduce_scatter_forward_precision, c.reduce_scatter_backward_precision)
    assert (str(a2a.forward._comm_precision), str(a2a.backward._comm_precision)) == precisions


def test_compressor_precisions_are_checked() -> None:
    from neo_core.compression import Compressor

    with pytest.raises(ConfigError, match=r"compression 'mine': backward_precision='fp12' is not a precision; "
                                          r"choose one of fp32, fp16, bf16, fp8, int8\."):
        Compressor("mine", "fp16", "fp12")
    from neo_plugins.compression import fp16_compression

    with pytest.raises(ConfigError, match=r"compression 'fp16': compression.backward='fp12' is not a precision"):
        fp16_compression(backward="fp12")
    assert fp16_compression(backward="int8").backward_bytes == 1.25  # over gloo: checked against the plan
    # compression.backward=16 was told to quote it, and '16' was then refused: the precisions, and fp16
    said = "is not a precision; choose one of fp32, fp16, bf16, fp8, int8 (did you mean fp16?)."
    for given in (16, 16.0):
        with pytest.raises(ConfigError) as err:
            get_plugins().registry("compression").create("fp16", {"backward": given})
        assert str(err.value) == f"compression.backward={given!r} {said}"
    with pytest.raises(ConfigError, match=re.escape(f"compression.backward='16' {said}")):
        fp16_compression(backward="16")
    with pytest.raises(ConfigError, match=re.escape("backward_precision=8 is not a precision; choose one of fp32, "
                                                    "fp16, bf16, fp8, int8 (did you mean fp8?).")):
        Compressor("mine", "fp16", 8)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"int8\.$"):  # no precision is 4 bits
        Compressor("mine", "fp16", "4")
    # FBGEMM's own count: int8 rows of 32 elements carry an fp32 scale and bias, fp8 (table-wise) none
    from fbgemm_gpu.quantize_comm import QuantizedCommCodec
    from fbgemm_gpu.split_embedding_configs import SparseType

    for precision in ("int8", "fp8", "fp16", "bf16", "fp32"):
        codec = QuantizedCommCodec(SparseType(precision))
        wire = codec.calc_quantized_size(32 * 1024, codec.create_context()) * codec.quantized_dtype.itemsize
        assert Compressor("x", precision, precision).forward_bytes == wire / (32 * 1024), precision


def test_a_plugin_failing_part_way_leaves_nothing_registered(capsys) -> None:
    class HalfDone:
        __name__ = "half_done_plugin"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register("half_cache", lambda: CachePolicy("half_cache", 0.5))
            raise RuntimeError("second policy broke")

        @hookimpl
        def neo_register_topologies(self, registry):
            registry.register("half_topology", lambda: None)

    with pytest.warns(PluginLoadWarning):
        plugins = load_plugins(extra=[HalfDone()], autoload=False, strict=False)
    assert plugins.failed["half_done_plugin"].startswith(
        "PluginError: its neo_register_cache_policies raised RuntimeError: second policy broke (raised at")
    assert "half_cache" not in plugins.registry("cache") and "half_topology" not in plugins.registry("topology")
    assert "lru" in plugins.registry("cache")  # the others stay


@pytest.fixture
def config_store() -> Iterator[None]:
    """Hydra's ConfigStore is process-wide: put back what a test stored in it (options stored
    without a config folder would shadow conf/'s YAML files in later tests)."""
    import copy

    from hydra.core.config_store import ConfigStore

    saved = copy.deepcopy(ConfigStore.instance().repo)
    yield
    ConfigStore.instance().repo = saved


def cache_policies_plugin(plugin_name: str, options: dict[str, dict[str, dict[str, float]]]) -> Any:
    """A plugin registering cache policies (name -> its extra options), each a plain CachePolicy."""

    class Policies:
        __name__ = plugin_name

        @hookimpl
        def neo_register_cache_policies(self, registry):
            for name, extra in options.items():
                registry.register(name, lambda load_factor=0.2, name=name: CachePolicy(name, load_factor),
                                  options=extra)

    return Policies()


@pytest.mark.parametrize(
    ("option", "clash"),
    [
        ("lfu", "the cache policy plugin 'lfu' (neo-dlrm)"),  # a plugin's own name
        ("mine_small", "an option of the cache policy plugin 'mine' (options_plugin)"),  # its other option
    ],
)
def test_an_option_that_would_stand_in_for_another_raises(register_plugin, config_store, option, clash) -> None:
    from neo_core.config import register_plugin_options

    plugins = register_plugin(cache_policies_plugin(
        "options_plugin", {"mine": {"mine_small": {"load_factor": 0.1}}, "mine_too": {option: {"load_factor": 0.3}}}
    ))
    with pytest.raises(PluginError) as err:
        register_plugin_options(None, plugins=plugins)
    assert str(err.value) == (
        f"cache option {option!r} of cache policy plugin 'mine_too' (options_plugin) clashes with {clash}; "
        "rename the option (meanwhile NEO_DISABLE_PLUGIN_AUTOLOAD=1 runs with the built-ins only)."
    )


def test_an_option_hidden_by_a_yaml_file_raises(register_plugin, config_store, tmp_path) -> None:
    from neo_core.config import register_plugin_options

    shadowed = cache_policies_plugin("shadowed_plugin", {"mine": {"tiny": {"load_factor": 0.1}}})
    conf = tmp_path / "conf"
    (conf / "cache").mkdir(parents=True)
    (conf / "cache" / "tiny.yaml").write_text("name: lru\nload_factor: 0.01\n")
    with pytest.raises(PluginError, match=r"'tiny' of cache policy plugin 'mine' \(shadowed_plugin\) clashes with "
                                          r"the option file .*cache/tiny\.yaml"):
        register_plugin_options(conf, plugins=register_plugin(shadowed))


def test_the_readme_plugin_example_loads_and_runs() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Writing a plugin"):]
    code = re.search(r"```python\n# (\w+)\.py\n(.*?)```", section, re.S)
    entry = re.search(r"\[project\.entry-points\.neo\]\n(\w+) = \"(\w+)\"", section)
    assert code and entry and entry.group(2) == code.group(1)
    module = types.ModuleType(code.group(1))
    exec(compile(code.group(2), "README.md", "exec"), module.__dict__)
    plugins = load_plugins(extra=[module], autoload=False, strict=True)  # no clash with a built-in
    name = re.search(r"cache\.name=(\w+)", section).group(1)
    policy = plugins.create("cache", name, {"load_factor": 0.1})
    assert isinstance(policy, CachePolicy) and policy.load_factor == 0.1


def _imported_plugin(site: Path, name: str, monkeypatch: pytest.MonkeyPatch, register_plugin: Any) -> Any:
    """The module ``site/<name>.py``, imported afresh and registered as a plugin."""
    import importlib

    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    register_plugin(module)
    return module


def test_a_plugins_bug_is_named_by_the_files_of_its_traceback(tmp_path, register_plugin, monkeypatch) -> None:
    """An error that is no Neo error keeps its traceback; the third-party plugin it passed
    through is named, also when it arrives as text from a spawned rank."""
    import textwrap

    from neo_core.cli import plugin_blame

    (tmp_path / "buggy_plugin.py").write_text(textwrap.dedent("""
        from neo_core import hookimpl
        from neo_core.cache import CachePolicy

        def buggy(load_factor=None):
            return CachePolicy("buggy", load_factor)

        def explode():
            return 1 / 0

        @hookimpl
        def neo_register_cache_policies(registry):
            registry.register("buggy", buggy)
    """))
    buggy_plugin = _imported_plugin(tmp_path, "buggy_plugin", monkeypatch, register_plugin)
    with pytest.raises(ZeroDivisionError) as err:
        buggy_plugin.explode()
    blame = plugin_blame(err.value)
    assert blame is not None and blame.startswith("cache policy plugin 'buggy' ("), blame
    rank = RuntimeError(f'Traceback (most recent call last):\n  File "{tmp_path / "buggy_plugin.py"}", line 9, in '
                        "explode\nZeroDivisionError: division by zero")
    assert plugin_blame(rank) == blame  # a spawned rank's error, as text
    with pytest.raises(ValueError) as other:
        int("x")
    assert plugin_blame(other.value) is None  # not through the plugin: nothing named


def test_kernel_and_cache_objects_check_their_fields() -> None:
    from neo_core.cache import CachePolicy
    from neo_core.kernels import EmbeddingKernel, SparseOptimizer

    assert EmbeddingKernel("k", "fused", "adam").optimizer is SparseOptimizer.ADAM  # a name is parsed
    bad = [
        (dict(optimizer="adamw"), r"kernel.optimizer='adamw' is not an optimizer"),
        (dict(optimizer=3), r"kernel.optimizer must be an optimizer name, got 3"),
        (dict(compute_kernel="sparse"), r"compute_kernel='sparse' is not one of TorchRec's kernels Neo runs"),
        (dict(learning_rate=float("nan")), r"kernel.learning_rate must be a positive finite number, got nan"),
        (dict(learning_rate=float("inf")), r"kernel.learning_rate must be a positive finite number, got inf"),
        (dict(learning_rate=0), r"kernel.learning_rate must be a positive finite number, got 0"),
        (dict(eps=-1e-8), r"kernel.eps must be a positive finite number"),
        (dict(weight_bytes=0), r"weight_bytes must be 4 \(fp32\), 2 \(fp16\) or 1 \(int8\), got 0"),
    ]
    for fields, message in bad:
        with pytest.raises(ConfigError, match=message):
            EmbeddingKernel(**{"name": "k", "compute_kernel": "fused", **fields})
    plugins = load_plugins(autoload=False)
    for kernel in ("fused", "dense"):
        with pytest.raises(ConfigError, match=r"kernel.learning_rate must be a positive finite number, got inf"):
            plugins.create("kernel", kernel, {"learning_rate": float("inf")})
    with pytest.raises(ConfigError, match=r"cache 'none' with load_factor=0.1: the policy named none caches "
                                          r"nothing; .* CachePolicy\('lru', 0.1\)"):
        CachePolicy("none", 0.1)
    with pytest.raises(ConfigError, match=r"cache.prefetch_pipeline must be true or false, got 'yes'"):
        CachePolicy("lru", 0.1, prefetch_pipeline="yes")
    # FBGEMM asserts "Only LRU cache policy supports prefetch_pipeline" inside a GPU rank
    with pytest.raises(ConfigError, match=r"cache 'warm': prefetch_pipeline=true needs LRU eviction.*evicts by LFU"):
        CachePolicy("warm", 0.1, algorithm="lfu", prefetch_pipeline=True)
    with pytest.raises(ConfigError, match=r"cache 'lfu': prefetch_pipeline=true needs LRU eviction.*use cache=lru "
                                          r"cache.prefetch_pipeline=true"):
        plugins.create("cache", "lfu", {"prefetch_pipeline": True})
    assert plugins.create("cache", "lfu", {"prefetch_pipeline": False}).algorithm == "lfu"  # a sweep's false

def test_replicated_tables_take_the_kernels_eps() -> None:
    # the dense kernel's tables (and the fused kernel's data-parallel ones) train with torch's
    # optimizer: kernel.eps reaches it (it was left at torch's default)
    from types import SimpleNamespace

    import torch
    from torchrec.optim.keyed import CombinedOptimizer

    from neo_core.config import TrainerConfig
    from neo_core.kernels import EmbeddingKernel
    from neo_core.training.module import NeoModule

    model = torch.nn.Module()
    model.embedding_bags = torch.nn.ParameterDict({"t": torch.nn.Parameter(torch.zeros(4, 2))})
    model.over = torch.nn.Linear(2, 1)
    model.fused_optimizer = CombinedOptimizer([])
    for opt, eps in (("adagrad", 0.25), ("adam", 0.5)):
        kernel = EmbeddingKernel("dense", "dense", opt, learning_rate=0.2, eps=eps, data_parallel_only=True)
        made = NeoModule.configure_optimizers(SimpleNamespace(model=model, kernel=kernel, trainer_cfg=TrainerConfig()))
        groups = {name: o.param_groups for name, o in made.optimizers}
        (table_group,) = groups["embedding"]
        assert (table_group["lr"], table_group["eps"]) == (0.2, eps), table_group
        assert groups["dense"][0]["eps"] == 1e-8  # kernel.eps is the tables' alone


def _entry_point_plugin(site: Path, name: str, source: str) -> None:
    """A module ``name`` on ``site`` with the dist-info that makes it a Neo entry point (as pip would)."""
    (site / f"{name}.py").write_text(source)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{hookspecs.ENTRY_POINT_GROUP}]\n{name} = {name}\n")


def test_a_plugin_neo_cannot_use_is_named_and_skipped(tmp_path: Path, monkeypatch, capsys) -> None:
    # a hook with another argument name stopped every command with pluggy's traceback; a hook
    # without @hookimpl, or one returning its plugins, was dropped without a word
    _entry_point_plugin(tmp_path, "argname", "from neo_core import hookimpl\n@hookimpl\n"
                        "def neo_register_cache_policies(reg):\n    pass\n")
    _entry_point_plugin(tmp_path, "nodeco", "def neo_register_cache_policies(registry):\n    pass\n")
    _entry_point_plugin(tmp_path, "hookret", "from neo_core import hookimpl\n@hookimpl\n"
                        "def neo_register_cache_policies(registry):\n    return {'mine': dict}\n")
    # registers and returns something as well: kept (it loaded before)
    _entry_point_plugin(tmp_path, "regret", "from neo_core import hookimpl\nfrom neo_core.cache import CachePolicy\n"
                        "@hookimpl\ndef neo_register_cache_policies(registry):\n"
                        "    registry.register('reg_lfu', lambda: CachePolicy('reg_lfu', 0.2))\n    return registry\n")
    _entry_point_plugin(tmp_path, "importsonly", "import neo_core\n")  # no hook: imports are not named
    _entry_point_plugin(tmp_path, "wrapper", "from neo_core import hookimpl\n@hookimpl(hookwrapper=True)\n"
                        "def neo_register_cache_policies(registry):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(PluginLoadWarning):
        plugins = load_plugins(strict=False)
    assert plugins.failed == {
        "argname": "PluginError: its neo_register_cache_policies takes reg, which Neo does not pass; Neo's hooks "
                   "take one argument, registry",
        "nodeco": "PluginError: it implements no Neo hook (neo_register_cache_policies without @neo_core.hookimpl?)",
        "hookret": "PluginError: its neo_register_cache_policies returned dict and registered nothing; a hook "
                   "registers with registry.register(name, factory) and returns nothing",
        "importsonly": "PluginError: it implements no Neo hook",
        "wrapper": plugins.failed["wrapper"],
    }
    assert "generator function" in plugins.failed["wrapper"] and "takes" not in plugins.failed["wrapper"]
    assert {"lru", "reg_lfu"} <= set(plugins.registry("cache").names())  # the others load
    assert capsys.readouterr().err.count("warning: Neo plugin") == 5


def test_a_plugin_class_without_a_docstring_is_not_described_by_its_base() -> None:
    # neo plugins described a third-party planner with Planner's own docstring
    from neo_core.registry import Registry
    from neo_core.sharding import Planner

    class RoundRobin(Planner):
        name = "round_robin"

        def plan(self, tables, context):
            raise NotImplementedError

        def sharders(self, context):
            return []

    class Described(RoundRobin):
        """Tables dealt to ranks in turn."""

    registry = Registry("sharder", "sharding", None)
    registry.register("round_robin", RoundRobin)
    registry.register("described", Described)
    assert registry.get("round_robin").description == ""
    assert registry.get("described").description == "Tables dealt to ranks in turn."


def _policy(load_factor: float = 0.1) -> CachePolicy:
    return CachePolicy("clock", load_factor)


@pytest.mark.parametrize("args, kwargs, said", [
    ((_policy, "clock"), {}, r"'clock' .*arguments are swapped; it takes the name first: registry.register\('clock'"),
    (("clock/v3", _policy), {}, r"the name 'clock/v3' cannot be selected as cache=clock/v3"),
    (("1e5", _policy), {}, r"the name '1e5' reads as a value, not a name, in cache=1e5"),
    (("True", _policy), {}, r"the name 'True' reads as a value"),
    (("clock", CachePolicy("clock", 0.1)), {}, r"'clock' .*its factory is a CachePolicy, not callable"),
    (("clock", _policy), {"options": {"clock_bad": 0.05}}, r"options=\{'clock_bad': 0.05\}: an option is a mapping"),
    (("clock", _policy), {"options": {"clock_small": {"load_factr": 0.05}}},
     r"gives 'load_factr', which its factory does not take; its keys: load_factor"),
    (("clock", _policy), {"options": [("clock_small", {})]}, r"is not a mapping"),
])
def test_a_registration_neo_cannot_use_is_named_and_the_plugin_skipped(args, kwargs, said) -> None:
    # each stopped every recipe (a bad option only when a recipe made config options, blamed on
    # the user's config), or was listed and failed only when selected
    class Plugin:
        __name__ = "clock_plugin"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register(*args, **kwargs)

    with pytest.warns(PluginLoadWarning):
        plugins = load_plugins(extra=[Plugin()], autoload=False, strict=False)
    assert re.search(said, plugins.failed["clock_plugin"]), plugins.failed
    assert plugins.registry("cache").names() == ["lfu", "lru", "none"]  # the rest load


def test_names_hydra_selects_as_typed_are_taken(register_plugin) -> None:
    plugins = register_plugin(types.SimpleNamespace(
        __name__="names_plugin",
        neo_register_cache_policies=hookimpl(lambda registry: [
            registry.register(n, _policy) for n in ("clock+v2", "clock:v3", "clock@home", "clock-4.1", "_clock")])))
    assert {"clock+v2", "clock:v3", "clock@home", "clock-4.1", "_clock"} <= set(plugins.registry("cache").names())
    assert not plugins.failed


def _registering(hook: str, provider: str, **factories: Any) -> Any:
    """A plugin of distribution ``provider`` whose ``hook`` registers ``factories`` by name."""

    def register(registry: Registry) -> None:
        for name, factory in factories.items():
            registry.register(name, factory)

    return types.SimpleNamespace(__name__=f"{provider}_plugin", __neo_provider__=provider, **{hook: hookimpl(register)})


def test_a_third_party_plugins_values_refused_by_neos_classes_name_the_plugin(register_plugin) -> None:
    # Topology's own check named its field in bytes/s, which the user had not typed, and no plugin
    from neo_core.topology import GB, Topology

    def mini(intra_node_bw_gbps: float = 300.0) -> Topology:
        return Topology("mini", 2, 4, "cuda", 40 * 2**30, 100 * 2**30, 1500 * GB, 100 * GB, 32 * GB,
                        intra_node_bw_gbps * GB, 25 * GB)

    def in_gb(device_memory_bw_gbps: float = 1500.0) -> Topology:  # bandwidths in GB/s by mistake
        return Topology("in_gb", 2, 4, "cuda", 40 * 2**30, 100 * 2**30, device_memory_bw_gbps, 100.0, 32.0,
                        300.0, 25.0)

    plugins = register_plugin(_registering("neo_register_topologies", "mini-dist", mini=mini, in_gb=in_gb))
    with pytest.raises(ConfigError, match=r"^topology=mini \(mini-dist\): topology.intra_node_bw must be a positive"):
        plugins.create("topology", "mini", {"intra_node_bw_gbps": -5})
    with pytest.raises(ConfigError, match=r"^topology=in_gb \(mini-dist\): topology 'in_gb': device_memory_bw=1500.0 "
                                          r"bytes/s is under 1 MB/s, surely a slip of units.*multiplied by neo_core.topology.GB"):
        plugins.create("topology", "in_gb")
    # Neo's own plugins' messages are as they were: they name what the user typed
    with pytest.raises(ConfigError, match=r"^topology.intra_node_bw_gbps must be a positive number of GB/s"):
        plugins.create("topology", "zionex", {"intra_node_bw_gbps": -5})
    with pytest.raises(ConfigError, match=r"^topology.inter_node_bw_gbps=0.0005 GB/s is under 1 MB/s \(0.001 GB/s\)"):
        plugins.create("topology", "zionex", {"inter_node_bw_gbps": 0.0005})
    # and the other way: bytes/s typed as GB/s was warned of as a fast NIC, then planned with
    with pytest.raises(ConfigError, match=r"^topology.inter_node_bw_gbps=200000000000.0 GB/s is over 1 PB/s "
                                          r"\(1,000,000 GB/s\).*\(2e\+11 bytes/s is inter_node_bw_gbps=200\)\.$"):
        plugins.create("topology", "zionex", {"inter_node_bw_gbps": 200e9})
    with pytest.raises(ConfigError, match=r"^topology 'twice': intra_node_bw=3e\+20 bytes/s is over 1 PB/s"):
        Topology("twice", 2, 4, "cuda", 40 * 2**30, 100 * 2**30, 1500 * GB, 100 * GB, 32 * GB, 300 * GB * GB, 25 * GB)
    assert Topology("fast", 2, 4, "cuda", 40 * 2**30, 100 * 2**30, 8000 * GB, 100 * GB, 32 * GB, 900 * GB,
                    100 * GB).device_memory_bw == 8e12  # a fast GPU's HBM is not refused


def test_the_topology_line_gives_small_bandwidths_as_the_plans_line_does() -> None:
    # rounded to 0.1 GB/s, a what-if of 0.25 GB/s read 0.2 (the plan's header below it: 0.25) and
    # one of 0.004 read 0.0
    from neo_plugins.topology.zionex import zionex_topology

    # (a figure given is the user's, not marked assumed: a what-if sweep's every value was)
    line = zionex_topology(inter_node_bw_gbps=0.25).describe().splitlines()[2]
    assert line == "  bandwidth/rank: device mem 1,555 GB/s*, host mem 50 GB/s*, host-to-device 32 GB/s*, intra-node 300 GB/s*, inter-node 0.25 GB/s"
    line = zionex_topology(inter_node_bw_gbps=0.004, intra_node_bw_gbps=0.04).describe().splitlines()[2]
    assert line.endswith("intra-node 0.04 GB/s, inter-node 0.004 GB/s"), line
    line = zionex_topology(device_memory_bw_gbps=999.7).describe().splitlines()[2]  # not 1e+03
    assert line.startswith("  bandwidth/rank: device mem 1,000 GB/s, "), line
    # and the plan's own header alike (it gave 1.23e+03 GB/s beside the topology line's 1,234)
    from neo_core.api import plan_tables
    from neo_core.sharding import TableSpec

    plan = plan_tables([TableSpec("t", 1000, 16)], {"name": "zionex", "num_nodes": 2, "intra_node_bw_gbps": 1234.5}, 64)
    assert "intra-node 1,234 GB/s, inter-node 25 GB/s* per rank" in plan.topology_summary(), plan.topology_summary()
    given = zionex_topology(inter_node_bw_gbps=2.5)
    assert "inter_node_bw" not in given.assumed and "intra_node_bw" in given.assumed
    assert given.sources["inter_node_bw"] == "given: topology.inter_node_bw_gbps=2.5"


def test_a_zionex_nic_faster_than_any_made_is_taken_with_a_warning_in_bits(capsys) -> None:
    # the NIC is sold as 200 Gb/s; typed as inter_node_bw_gbps=200 it modelled a link 8x too fast, silently
    from neo_plugins.topology.zionex import zionex_topology

    topo = zionex_topology(inter_node_bw_gbps=200)
    assert topo.inter_node_bw == 200e9  # planned as given
    assert capsys.readouterr().err == (
        "warning: topology.inter_node_bw_gbps=200 is GB/s (bytes) per rank, 1,600 Gb/s: faster than any "
        "scale-out NIC; a NIC of 200 Gb/s is inter_node_bw_gbps=25.\n")
    zionex_topology(inter_node_bw_gbps=100)  # an 800 Gb/s NIC: no warning
    zionex_topology()
    assert capsys.readouterr().err == ""


def test_a_plugins_own_default_that_its_annotation_refuses_is_the_plugins_fault(register_plugin) -> None:
    # "cache.load_factor must be a number, got None", though nobody had typed it
    def sloppy(load_factor: float = None) -> CachePolicy:  # type: ignore[assignment]
        return CachePolicy("sloppy", load_factor)

    def quoted(load_factor: float = "0.2") -> CachePolicy:  # type: ignore[assignment]
        return CachePolicy("quoted", float(load_factor))

    class Named(CachePolicy):
        """A policy class registered as its own factory: it takes its name."""

    plugins = register_plugin(_registering("neo_register_cache_policies", "sloppy-dist", sloppy=sloppy, named=Named,
                                           quoted=quoted))
    with pytest.raises(PluginError, match=r"its own default for load_factor, '0.2', .*; the plugin should change the "
                                          r"default to one\. Meanwhile give cache.load_factor=<value>\.$"):
        plugins.create("cache", "quoted", {"load_factor": "0.2"})
    with pytest.raises(PluginError, match=r"cache policy plugin 'sloppy' \(sloppy-dist\): its own default for "
                                          r"load_factor, None, is not of its annotated kind, float \(cache.load_factor "
                                          r"must be a number, got None\); the plugin should annotate it 'float \| None'"):
        plugins.create("cache", "sloppy", {"load_factor": None})
    with pytest.raises(ConfigError, match=r"cache.load_factor must be a number, got 'x'"):
        plugins.create("cache", "sloppy", {"load_factor": "x"})  # typed by the user: theirs
    made = plugins.create("cache", "named", {"load_factor": 0.1})  # it asked for cache.name
    assert (made.name, made.load_factor, made.algorithm) == ("named", 0.1, "lru")


def test_a_cache_policy_of_its_own_name_says_how_it_evicts() -> None:
    # a policy "clock" evicted by LRU (FBGEMM's default) and its plan said only "cache clock"
    from neo_core.api import plan_tables
    from neo_core.sharding import TableSpec

    tables = [TableSpec(f"t{i}", 1_000_000, 64, 10.0) for i in range(8)]
    for policy, said in ((CachePolicy("clock", 0.05), "cache clock (LRU eviction, load factor 0.05)"),
                         (CachePolicy("warm", 0.05, algorithm="lfu"), "cache warm (LFU eviction, load factor 0.05)"),
                         (CachePolicy("lfu", 0.05), "cache lfu (load factor 0.05)")):
        plan = plan_tables(tables, {"name": "zionex", "num_nodes": 1}, 512, cache=policy)
        assert said in plan.notes[0], plan.notes[0]
        # these tables fit in device memory, so none is behind the cache: the plan says so
        assert all(t.compute_kernel == "fused" for t in plan.tables)
        assert (f"cache {policy.name} not used: every table was placed in device memory, which is faster; a table "
                "goes to host memory behind the cache only where device memory cannot hold it") in plan.notes
    big = [TableSpec(f"t{i}", 200_000_000, 128, 10.0) for i in range(8)]  # 102 GB each: over 8 x 40 GiB
    plan = plan_tables(big, {"name": "zionex", "num_nodes": 1}, 512, cache=CachePolicy("lru", 0.05))
    assert any(t.compute_kernel == "fused_uvm_caching" for t in plan.tables)
    assert not any("not used" in n for n in plan.notes)


def test_a_bug_in_one_of_a_packages_plugins_is_not_blamed_on_another(tmp_path, register_plugin, monkeypatch) -> None:
    # a compressor's bug was said to be "raised in the topology plugin 'mini2'", the package's first
    import textwrap

    from neo_core.cli import plugin_blame

    (tmp_path / "two_plugins.py").write_text(textwrap.dedent("""
        from neo_core import hookimpl
        from neo_core.compression import Compressor
        from neo_core.topology import Topology

        def mini2():
            return None

        class Codec(Compressor):
            def qcomm_codecs_registry(self):
                raise RuntimeError("codec broke")

        @hookimpl
        def neo_register_topologies(registry):
            registry.register("mini2", mini2)

        @hookimpl
        def neo_register_compressors(registry):
            registry.register("codec", Codec)
    """))
    two_plugins = _imported_plugin(tmp_path, "two_plugins", monkeypatch, register_plugin)
    with pytest.raises(RuntimeError) as err:
        two_plugins.Codec("codec").qcomm_codecs_registry()
    assert plugin_blame(err.value) == "compressor plugin 'codec' (two_plugins)"
    # from a spawned rank, as text, the frames are gone: the package and both its plugins
    rank = RuntimeError(f'Traceback (most recent call last):\n  File "{tmp_path / "two_plugins.py"}", line 11, in '
                        "qcomm_codecs_registry\nRuntimeError: codec broke")
    assert plugin_blame(rank) == ("code of two_plugins, which provides the topology plugin 'mini2', compressor "
                                  "plugin 'codec'")
    # ... unless the run chose one of them (compression=codec): that one
    import neo_core.cli as cli

    monkeypatch.setattr(cli, "_run_choices", lambda: {"compression": "codec", "topology": "local"})
    assert plugin_blame(rank) == "compressor plugin 'codec' (two_plugins)"


def test_neo_plugins_says_a_plugin_that_failed_to_load_once(tmp_path: Path, monkeypatch, capsys) -> None:
    from neo_core.cli import main as neo_main
    from neo_core.plugins import QUIET_ENV

    _entry_point_plugin(tmp_path, "broken_once", "raise ImportError('no such thing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(QUIET_ENV, raising=False)
    reset_plugins(None)
    try:
        with pytest.warns(PluginLoadWarning):
            assert neo_main(["plugins"]) == 0
    finally:
        reset_plugins(None)
    out, err = capsys.readouterr()
    assert "failed to load: broken_once: ImportError: no such thing" in out
    assert "broken_once" not in err and QUIET_ENV not in __import__("os").environ


def test_a_topology_reaches_torchrecs_planner_figure_by_figure() -> None:
    # every bandwidth distinct, so a swapped pair shows; TorchRec's figures are bytes per ms
    from neo_core.topology import GB, GiB, Topology

    topo = Topology("t", 2, 4, "cuda", 40 * GiB, 100 * GiB, 1500 * GB, 90 * GB, 30 * GB, 300 * GB, 25 * GB)
    tr = topo.to_torchrec()
    assert (tr.world_size, tr.local_world_size, tr.compute_device) == (8, 4, "cuda")
    assert (tr.hbm_mem_bw, tr.ddr_mem_bw, tr.hbm_to_ddr_mem_bw) == (1500e6, 90e6, 30e6)
    assert (tr.intra_host_bw, tr.inter_host_bw) == (300e6, 25e6)
    assert tr.devices[0].storage.hbm == 40 * GiB and tr.devices[0].storage.ddr == 100 * GiB


@pytest.mark.parametrize(("shape", "ranks", "emulated"), [
    ((16, 8), 2, (2, 1)), ((16, 8), 4, (4, 1)), ((2, 4), 8, (2, 4)), ((3, 2), 4, (2, 2)), ((16, 8), 6, (6, 1)),
])
def test_an_emulated_cluster_keeps_as_many_nodes_as_its_ranks_allow(shape, ranks, emulated) -> None:
    # the inter-node terms of the plan need nodes; one node of every rank would drop them
    from neo_plugins.topology.zionex import zionex_topology

    topo = zionex_topology(num_nodes=shape[0], devices_per_node=shape[1]).emulated_on(ranks, "cpu")
    assert (topo.num_nodes, topo.devices_per_node, topo.compute_device) == (*emulated, "cpu")
    assert topo.world_size == ranks and topo.emulated_from == f"zionex ({shape[0]}x{shape[1]})"
    assert topo.device_memory == 40 * 2**30  # a device's memory model is the cluster's


def test_neo_plugins_loads_a_plugin_module_without_installing_it(tmp_path, monkeypatch) -> None:
    # a plugin tried before it is packaged: its module's import path in NEO_PLUGINS, its folder
    # on the path (entry points need an installed distribution)
    import subprocess

    from tests.conftest import ROOT, subprocess_env

    (tmp_path / "my_neo_cache.py").write_text(
        "from neo_core import hookimpl\n"
        "from neo_core.cache import CachePolicy\n\n\n"
        "def warm_lfu(load_factor: float = 0.3) -> CachePolicy:\n"
        "    return CachePolicy(name='warm_lfu', load_factor=load_factor, algorithm='lfu')\n\n\n"
        "@hookimpl\n"
        "def neo_register_cache_policies(registry):\n"
        "    registry.register('warm_lfu', warm_lfu)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NEO_PLUGINS", "my_neo_cache")
    plugins = load_plugins(autoload=False)
    assert plugins.create("cache", "warm_lfu").load_factor == 0.3
    assert plugins.registry("cache").get("warm_lfu").provider == "NEO_PLUGINS my_neo_cache"
    monkeypatch.setenv("NEO_PLUGINS", "my_neo_cache, no_such_module")
    with pytest.warns(PluginLoadWarning, match=r"NEO_PLUGINS names module 'no_such_module', which failed to import"):
        plugins = load_plugins(autoload=False)
    assert "warm_lfu" in plugins.registry("cache").names()
    # the recipes and the CLI see it too (ranks inherit the environment)
    env = {**subprocess_env(), "NEO_PLUGINS": "my_neo_cache",
           "PYTHONPATH": f"{tmp_path}:{subprocess_env().get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "neo_core", "plugins"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warm_lfu" in proc.stdout and "NEO_PLUGINS my_neo_cache" in proc.stdout


def _neo_plugins_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A plugin module of ``source`` named ``name`` on the path, and named in NEO_PLUGINS."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NEO_PLUGINS", name)


def test_a_clash_with_a_neo_plugins_module_says_to_leave_it_out(tmp_path, monkeypatch) -> None:
    # it advised NEO_DISABLE_PLUGIN_AUTOLOAD=1, which still loads the modules NEO_PLUGINS names
    _neo_plugins_module(tmp_path, monkeypatch, "my_clash", (
        "from neo_core import hookimpl\n"
        "from neo_core.cache import CachePolicy\n\n\n"
        "@hookimpl\n"
        "def neo_register_cache_policies(registry):\n"
        "    registry.register('lru', lambda: CachePolicy(name='lru', load_factor=0.1, algorithm='lru'))\n"
    ))
    with pytest.raises(PluginClash, match=r"registered twice \(neo-dlrm and NEO_PLUGINS my_clash\); rename one of "
                                          r"them \(meanwhile leave my_clash out of NEO_PLUGINS\)"):
        load_plugins(autoload=False)


def test_a_plugin_topology_with_doubtful_bandwidths_is_warned_of_and_its_bad_values_named_as_given(
        tmp_path, monkeypatch, capsys) -> None:
    # a per-node NIC given to each GPU (or Gb/s typed as GB/s) planned 2x too fast in silence,
    # and a refused figure was named only as the Topology field the plugin filled
    _neo_plugins_module(tmp_path, monkeypatch, "my_topo", (
        "from neo_core import hookimpl\n"
        "from neo_core.topology import GB, GiB, Topology\n\n\n"
        "def acme(nic_gbps: float = 100.0, nvlink_gbps: float = 300.0) -> Topology:\n"
        "    return Topology(name='acme', num_nodes=4, devices_per_node=4, device_memory=80 * GiB,\n"
        "                    host_memory=256 * GiB, device_memory_bw=2000 * GB, host_memory_bw=100 * GB,\n"
        "                    host_to_device_bw=32 * GB, intra_node_bw=nvlink_gbps * GB,\n"
        "                    inter_node_bw=nic_gbps * GB, compute_device='cuda')\n\n\n"
        "@hookimpl\n"
        "def neo_register_topologies(registry):\n"
        "    registry.register('acme', acme)\n"
    ))
    plugins = load_plugins(autoload=False)
    capsys.readouterr()
    plugins.create("topology", "acme", {"nic_gbps": 25.0})  # the NIC over the 4 GPUs: no word
    assert capsys.readouterr().err == ""
    plugins.create("topology", "acme", {"nic_gbps": 800.0, "nvlink_gbps": 300.0})
    err = capsys.readouterr().err
    assert ("warning: topology=acme (NEO_PLUGINS my_topo) gives each rank 800 GB/s across nodes (6,400 Gb/s), "
            "faster than any scale-out NIC") in err and "over the 4 ranks" in err, err
    assert "less than the" in err  # 300 GB/s inside a node, 800 across
    with pytest.raises(ConfigError, match=r"topology=acme \(NEO_PLUGINS my_topo\): topology.inter_node_bw must be a "
                                          r"positive finite number, got -1000000000.0 \(built by the plugin from "
                                          r"topology.nic_gbps=-1\)\."):
        plugins.create("topology", "acme", {"nic_gbps": -1})


def test_links_inside_a_node_slower_than_across_are_warned_of_for_built_ins_and_python_objects(capsys) -> None:
    # zionex with intra_node_bw_gbps=10 (below its 25 GB/s NICs), and a Topology made in Python,
    # planned silently: the warning was for plugin topologies only
    import dataclasses

    from neo_core.api import make_context
    from neo_core.plugins import get_plugins

    capsys.readouterr()
    get_plugins().create("topology", "zionex", {"intra_node_bw_gbps": 10.0})
    err = capsys.readouterr().err
    assert "warning: topology=zionex (" in err and "gives its ranks 10 GB/s inside a node, less than the 25 GB/s" in err, err
    assert "faster than any scale-out NIC" not in err  # zionex refuses that itself
    topo = get_plugins().create("topology", "zionex", {})
    assert capsys.readouterr().err == ""  # NVLink over the NICs: no word
    make_context(dataclasses.replace(topo, name="mine", intra_node_bw=3e9, inter_node_bw=150e9), 512)
    err = capsys.readouterr().err
    assert "warning: topology 'mine' gives its ranks 3 GB/s inside a node, less than the 150 GB/s" in err, err
    assert "faster than any scale-out NIC" in err, err
    # a topology its plugin built, then given to make_context (as the recipes do): warned of once
    slow = get_plugins().create("topology", "zionex", {"intra_node_bw_gbps": 12.0})
    make_context(slow, 512)
    assert capsys.readouterr().err.count("gives its ranks 12 GB/s inside a node") == 1


def test_an_unannotated_parameter_given_a_value_unlike_its_default_is_named_when_the_factory_fails(
        tmp_path, monkeypatch) -> None:
    # topology.nic=fast reached the factory and failed inside it ("can't multiply sequence by
    # non-int of type 'float'"), without the key; an unannotated parameter is the plugin's to
    # check (it may take text or null where its default is a number), so it is named then
    _neo_plugins_module(tmp_path, monkeypatch, "my_loose", (
        "import math\n"
        "from neo_core import hookimpl\n"
        "from neo_core.cache import CachePolicy\n\n\n"
        "def loose(share=0.2, limit=0, latency=math.nan):\n"
        "    return CachePolicy(name='loose', load_factor=share * 1.0, algorithm='lru')\n\n\n"
        "@hookimpl\n"
        "def neo_register_cache_policies(registry):\n"
        "    registry.register('loose', loose)\n"
    ))
    plugins = load_plugins(autoload=False)
    # what the plugin may take is left to it: null, text and NaN where the default is a number
    assert plugins.create("cache", "loose", {"share": 1, "limit": None, "latency": math.nan}).load_factor == 1.0
    assert plugins.create("cache", "loose", {"limit": "1GiB"}).load_factor == 0.2
    with pytest.raises(ConfigError, match=r"cache=loose \(NEO_PLUGINS my_loose\): can't multiply sequence .*; given "
                                          r"a value unlike its default: cache.share='fast' \(its default: 0.2\)"):
        plugins.create("cache", "loose", {"share": "fast"})


def test_a_plugin_whose_object_calls_itself_by_another_name_is_named_as_registered(register_plugin, capsys) -> None:
    # a copy of lru registered as lru_clone, its policy calling itself lru: plans and sweep
    # summaries said "cache lru", and the user could not tell their plugin from the built-in
    from neo_core.compression import Compressor
    from neo_core.kernels import EmbeddingKernel, SparseOptimizer
    from neo_plugins.models import dlrm
    from neo_plugins.sharding.planner import NeoPlanner
    from neo_plugins.topology.zionex import zionex_topology

    shared = CachePolicy("lru", load_factor=0.3)  # one object its factory hands out each time
    module = types.ModuleType("neo_clones")

    @hookimpl
    def neo_register_cache_policies(registry):
        registry.register("lru_clone", lambda: shared)

    @hookimpl
    def neo_register_compressors(registry):
        registry.register("fp16_clone", lambda: Compressor("fp16", "fp16", "fp16"))

    @hookimpl
    def neo_register_kernels(registry):
        registry.register("fused_clone", lambda: EmbeddingKernel("fused", "fused", SparseOptimizer.ROWWISE_ADAGRAD))

    @hookimpl
    def neo_register_topologies(registry):
        registry.register("zionex_clone", zionex_topology)

    @hookimpl
    def neo_register_sharders(registry):
        registry.register("neo_clone", NeoPlanner)

    @hookimpl
    def neo_register_models(registry):
        registry.register("dlrm_clone", dlrm)

    for hook in (neo_register_cache_policies, neo_register_compressors, neo_register_kernels,
                 neo_register_topologies, neo_register_sharders, neo_register_models):
        setattr(module, hook.__name__, hook)
    plugins = register_plugin(module)
    for group, name in (("cache", "lru_clone"), ("compression", "fp16_clone"), ("kernel", "fused_clone"),
                        ("sharding", "neo_clone"), ("model", "dlrm_clone")):
        assert plugins.create(group, name).name == name
    # a topology keeps its own: its name says which cluster it is, and "local" (this machine's
    # ranks) is what the calibration hint, the cores note and the recipes' memory advice read
    assert plugins.create("topology", "zionex_clone").name == "zionex"
    policy = plugins.create("cache", "lru_clone")
    assert (policy.algorithm, policy.load_factor) == ("lru", 0.3)
    assert shared.name == "lru"  # a copy is renamed, not the object the plugin keeps
    assert plugins.create("cache", "lru").name == "lru"
    err = capsys.readouterr().err
    # said once per plugin, naming it, its object's own name and the name reports use
    assert err.count("note: cache policy plugin 'lru_clone' (neo_clones) calls its CachePolicy 'lru'; Neo's "
                     "reports name it 'lru_clone', the name it is selected by.") == 1, err
    assert "kernel plugin 'fused_clone' (neo_clones) calls its EmbeddingKernel 'fused'" in err
    # what Neo checks of a kernel reads its compute kernel, not its name: the renamed fused
    # kernel with Adam is still refused on CPU ranks (FBGEMM failed inside with an AssertionError)
    import dataclasses

    from neo_core.training.run import cpu_kernel_problem

    clone = dataclasses.replace(plugins.create("kernel", "fused_clone"), optimizer=SparseOptimizer.ADAM)
    assert clone.name == "fused_clone" and "no Adam on CPU" in (cpu_kernel_problem(clone, clone.optimizer) or "")
    dense = EmbeddingKernel("fused", "dense", SparseOptimizer.ADAM)  # a dense kernel named fused: no such problem
    assert cpu_kernel_problem(dense, dense.optimizer) is None


def test_built_in_plugins_from_another_checkout_than_the_core_are_warned_of(monkeypatch, capsys, tmp_path: Path) -> None:
    # a second checkout run with the first one's environment (installed editable from the first)
    # took its core from the one and neo_plugins from the other, and a sweep failed with a
    # TypeError from code that was not in the checkout being run
    import neo_core
    from neo_core import plugins

    monkeypatch.setattr(plugins, "_MIXED", [])
    load_plugins(autoload=False)
    assert "two checkouts mixed" not in capsys.readouterr().err  # one checkout: nothing said
    monkeypatch.setattr(neo_core, "__file__", str(tmp_path / "other" / "neo_core" / "__init__.py"))
    load_plugins(autoload=False)
    load_plugins(autoload=False)
    err = capsys.readouterr().err
    home = Path(plugins.__file__).resolve().parent.parent
    assert err.count(f"warning: Neo's core comes from {tmp_path / 'other'} but its built-in plugins (neo_plugins) "
                     f"from {home}: two checkouts mixed") == 1, err  # once per process
    assert f"(pip install -e {tmp_path / 'other'})" in err


def test_a_checkouts_recipe_run_with_another_checkouts_code_is_warned_of(monkeypatch, capsys, tmp_path: Path) -> None:
    # a second checkout's recipes/plan.py, run with the first one's environment, imported all of
    # Neo from the first (the recipe's folder, not the checkout, is on sys.path): an edit to the
    # second changed nothing, without a word
    from neo_core import plugins

    other = tmp_path / "second"
    for folder in ("neo_core", "conf", "recipes"):
        (other / folder).mkdir(parents=True)
    monkeypatch.setattr(plugins, "_MIXED", [])
    monkeypatch.setattr(sys, "argv", [str(other / "recipes" / "plan.py")])
    load_plugins(autoload=False)
    err = capsys.readouterr().err
    home = Path(plugins.__file__).resolve().parent.parent
    assert f"warning: plan.py is {other}'s, but Neo's code (neo_core, neo_plugins) comes from {home}: two checkouts " \
           f"mixed" in err and f"(pip install -e {other})" in err, err
    # a script outside any checkout (an installed command, a notebook) is no such thing
    monkeypatch.setattr(plugins, "_MIXED", [])
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere" / "run.py")])
    load_plugins(autoload=False)
    assert "checkouts mixed" not in capsys.readouterr().err


def test_a_zionex_shape_given_is_cited_as_given_not_as_the_paper() -> None:
    # a 4-node cluster of 4 GPUs each was cited in plan.json as "128 GPUs in 16 ZionEX nodes"
    # and "8 GPUs, one RoCE NIC per GPU"
    from neo_plugins.topology.zionex import zionex_topology

    given = zionex_topology(num_nodes=4, devices_per_node=4)
    assert given.sources["num_nodes"] == "given: topology.num_nodes=4"
    assert given.sources["devices_per_node"] == "given: topology.devices_per_node=4"
    default = zionex_topology()
    assert "16 ZionEX nodes" in default.sources["num_nodes"] and "8 GPUs" in default.sources["devices_per_node"]


CLUSTER = dict(label="a100_4x8", num_nodes=4, devices_per_node=8, device_memory_gib=40, device_memory_bw_gbps=1555,
               intra_node_bw_gbps=300, host_memory_gib_per_node=1024)


def test_a_cluster_of_your_own_is_planned_with_its_figures_and_named_by_its_label() -> None:
    # a cluster other than ZionEX was described as `name: zionex` plus its keys: plans called it
    # zionex, cited the paper for its shape and marked the figures typed in as assumed
    from neo_core.api import plan_tables
    from neo_core.sharding import TableSpec
    from neo_core.topology import GB, GiB
    from neo_plugins.topology.cluster import cluster_topology

    # one 200 Gb/s NIC a node, shared by its 8 GPUs: 25 GB/s over 8
    topo = cluster_topology(**CLUSTER, nics_per_node=1, nic_gbit_s=200)
    assert (topo.name, topo.world_size, topo.compute_device) == ("a100_4x8", 32, "cuda")
    assert topo.inter_node_bw == pytest.approx(3.125 * GB) and topo.device_memory == 40 * GiB
    assert topo.host_memory == 128 * GiB  # the node's host memory over its GPUs
    assert topo.sources["inter_node_bw"] == ("given: topology.nics_per_node=1 x topology.nic_gbit_s=200 (Gb/s) over 8 "
                                             "GPU(s): 3.125 GB/s a GPU")
    # what was given is unmarked; the two host figures left out are assumed, and marked
    assert set(topo.assumed) == {"host_memory_bw", "host_to_device_bw"}
    described = topo.describe()
    assert described.startswith("topology a100_4x8: 4 node(s) x 8 cuda rank(s) = 32 ranks")
    assert "device 40.0 GiB," in described and "inter-node 3.12 GB/s\n" in described
    assert "host mem 50 GB/s*, host-to-device 32 GB/s*," in described  # both left out: assumed
    assert all(s.startswith("given: ") for k, s in topo.sources.items() if k not in topo.assumed)
    # each GPU's share given instead; both host figures given: nothing assumed
    share = cluster_topology(**CLUSTER, inter_node_bw_gbps=3.125, host_memory_bw_gbps_per_node=800,
                             host_to_device_bw_gbps=64)
    assert share.inter_node_bw == topo.inter_node_bw and share.assumed == ()
    assert share.host_memory_bw == pytest.approx(100 * GB) and share.host_to_device_bw == pytest.approx(64 * GB)
    # by its registered name, as a config gives it; the plan is the cluster's
    result = plan_tables([TableSpec("t", 10_000_000, 128, 4.0)], {"name": "cluster", **CLUSTER,
                                                                  "inter_node_bw_gbps": 3.125}, 1024)
    assert result.topology["name"] == "a100_4x8" and len(result.ranks) == 32


@pytest.mark.parametrize(("changes", "message"), [
    ({"device_memory_gib": None, "intra_node_bw_gbps": None},
     "topology cluster 'a100_4x8' needs topology.device_memory_gib, topology.intra_node_bw_gbps, "
     "topology.inter_node_bw_gbps (or nics_per_node and nic_gbit_s): nothing is assumed for a cluster of your own. "
     "For example: topology.num_nodes=4"),
    ({"inter_node_bw_gbps": 3.125, "nic_gbit_s": 200}, "give the network once, either topology.inter_node_bw_gbps"),
    ({"nics_per_node": 2}, "needs topology.nic_gbit_s: nothing is assumed"),
    ({"label": "zionex", "inter_node_bw_gbps": 3.0}, "topology.label must name your cluster (e.g. a100_4x8), not 'zionex'"),
    ({"label": " Local ", "inter_node_bw_gbps": 3.0}, "topology.label must name your cluster (e.g. a100_4x8), not ' Local '"),
    # a NIC's slip of units is said in the key and unit typed, not in the per-GPU share worked out from it
    ({"nics_per_node": 1, "nic_gbit_s": 0.004}, "topology.nic_gbit_s=0.004 is a NIC's Gb/s (bits), from 0.008 to 8e+06"),
    ({"nics_per_node": 1, "nic_gbit_s": 2e8}, "topology.nic_gbit_s=2e+08 is a NIC's Gb/s (bits)"),
    ({"devices_per_node": 0, "inter_node_bw_gbps": 3.0}, "topology.devices_per_node must be a whole number, at least 1"),
    ({"device_memory_bw_gbps": 1.5e12, "inter_node_bw_gbps": 3.0}, "topology.device_memory_bw_gbps=1500000000000.0 GB/s is over 1 PB/s"),
    ({"nics_per_node": 1, "nic_gbit_s": "200G"}, "topology.nic_gbit_s must be a positive number of Gb/s"),
    # a NIC of no speed is named as typed, not as the share of each GPU made of it
    ({"nics_per_node": 1, "nic_gbit_s": 0}, "topology.nic_gbit_s must be a positive number of Gb/s (a NIC as sold"),
    ({"nics_per_node": 0, "nic_gbit_s": 200}, "topology.nics_per_node must be a whole number, at least 1; got 0."),
    ({"inter_node_bw_gbps": 0}, "topology.inter_node_bw_gbps must be a positive number of GB/s, got 0."),
    ({"host_memory_gib_per_node": 0, "inter_node_bw_gbps": 3.0},
     "topology.host_memory_gib_per_node must be a positive number of GiB, got 0."),
    ({"label": "local", "inter_node_bw_gbps": 3.0}, "topology.label must name your cluster (e.g. a100_4x8), not 'local'"),
    ({"label": "  ", "inter_node_bw_gbps": 3.0}, "topology.label must name your cluster (e.g. a100_4x8), not '  '"),
])
def test_a_cluster_of_your_own_refuses_what_it_lacks_naming_it(changes, message) -> None:
    from neo_plugins.topology.cluster import cluster_topology

    with pytest.raises(ConfigError, match=re.escape(message)):
        cluster_topology(**(CLUSTER | changes))


def test_a_cluster_of_your_own_counts_every_nic_names_its_keys_and_doubts_only_a_share(capsys) -> None:
    from neo_core.topology import GB
    from neo_plugins.topology.cluster import cluster_topology

    # two 400 Gb/s NICs a node over its 8 GPUs: 100 GB/s a node, 12.5 a GPU
    topo = cluster_topology(**(CLUSTER | {"label": " a100_4x8 "}), nics_per_node=2, nic_gbit_s=400)
    assert topo.inter_node_bw == pytest.approx(12.5 * GB) and topo.name == "a100_4x8"
    # the host figures left out, as assumed: PCIe Gen4 x16 a GPU, 400 GB/s a node over its GPUs
    assert topo.host_to_device_bw == pytest.approx(32 * GB) and topo.host_memory_bw == pytest.approx(50 * GB)
    # what a plan that does not fit asks for is said in the keys typed: nodes, and GiB a node
    assert topo.setting_for("num_nodes", 64) == "topology.num_nodes=8 or more, now 4"
    assert topo.setting_for("host_memory", 256 * GiB) == "topology.host_memory_gib_per_node=2048 or more, now 1024"
    assert topo.setting_for("device_memory", 80 * GiB) == "topology.device_memory_gib=80 or more, now 40"
    assert capsys.readouterr().err == ""
    # a NIC's Gb/s as sold is not doubted, however fast it makes each GPU's share ...
    cluster_topology(**(CLUSTER | {"devices_per_node": 1}), nics_per_node=2, nic_gbit_s=800)
    assert capsys.readouterr().err == ""
    # ... a share faster than any NIC is: most often a NIC's Gb/s typed as GB/s
    cluster_topology(**CLUSTER, inter_node_bw_gbps=200)
    assert "warning: topology.inter_node_bw_gbps=200 is GB/s (bytes) per rank" in capsys.readouterr().err


def test_a_cluster_of_one_node_needs_no_network_and_a_nic_faster_than_any_sold_is_doubted(capsys) -> None:
    from neo_plugins.topology.cluster import cluster_topology

    one = cluster_topology(**(CLUSTER | {"num_nodes": 1}))  # nothing crosses a network: none is asked for
    assert one.world_size == 8 and one.sources["inter_node_bw"].startswith("not given: one node")
    with pytest.raises(ConfigError, match="needs topology.inter_node_bw_gbps"):
        cluster_topology(**(CLUSTER | {"num_nodes": 2}))
    cluster_topology(**CLUSTER, nics_per_node=1, nic_gbit_s=25600)  # 3,200 GB/s: GB/s typed as Gb/s x 8?
    assert "topology.nic_gbit_s=25600 Gb/s is faster than any NIC sold (800 Gb/s)" in capsys.readouterr().err
