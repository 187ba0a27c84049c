"""The ``neo`` command: ``neo plugins`` lists plugins by kind; user errors are one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neo_core import hookimpl
from neo_core.cache import CachePolicy
from neo_core.cli import (
    SweepFailures,
    check_group_options,
    config_groups,
    force_add_overrides,
    list_plugins,
    main,
    print_failed_jobs,
    user_errors,
)
from neo_core.errors import ConfigError
from neo_core.run_folders import check_run_dirs, claim_folder
from tests.conftest import ROOT, subprocess_env

NEO_SCRIPT = Path(sys.executable).parent / "neo"


class ListedPlugin:
    __name__ = "listed_plugin"
    __neo_provider__ = "neo-listed-dist"

    @hookimpl
    def neo_register_cache_policies(self, registry):
        def listed_cache(load_factor: float = 0.1) -> CachePolicy:
            """A cache policy that shows up in the listing."""
            return CachePolicy("listed_cache", load_factor)

        def needs_share(load_factor: float) -> CachePolicy:
            """A cache policy whose factory has no default for its key."""
            return CachePolicy("needs_share", load_factor)

        registry.register("listed_cache", listed_cache, options={"listed_cache_small": {"load_factor": 0.01}})
        registry.register("listed_cache_with_a_long_name", listed_cache)
        registry.register("needs_share", needs_share)


def test_neo_plugins_lists_every_kind_with_provider(register_plugin, capsys) -> None:
    plugins = register_plugin(ListedPlugin())
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for registry in plugins.registries.values():
        assert f"{registry.kind} (config group '{registry.group}'):" in out
        width = max([14, *(len(e.name) for e in registry.entries())])
        for entry in registry.entries():  # a name longer than the column widens it for its group
            assert f"  {entry.name:<{width}} [{entry.provider}]" in out
    assert "  listed_cache                  [neo-listed-dist]  A cache policy that shows up in the listing." in out
    assert "  listed_cache_with_a_long_name [neo-listed-dist]" in out
    # descriptions in one column whatever the provider's name
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "[" in line}
    assert lines["lru"].index(lines["lru"].split("]")[1].strip()) == lines["listed_cache"].index("A cache policy")
    assert f"  {'':<29} keys: load_factor=0.1" in out  # what cache.<key>= takes
    assert f"  {'':<29} keys: load_factor (required)" in out  # a key without a default: said so
    assert f"  {'':<29} options: listed_cache_small" in out
    assert "  zionex         [neo-dlrm]" in out
    assert "failed to load" not in out


def test_neo_plugins_lists_the_option_clashes_the_recipes_refuse(register_plugin) -> None:
    class Clashing:
        __name__ = "clashing_plugin"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register("mine", lambda load_factor=0.2: CachePolicy("mine", load_factor),
                              options={"lfu": {"load_factor": 0.3}, "mine_small": {"load_factor": 0.1}})

    register_plugin(Clashing())
    clashes = [line for line in list_plugins().splitlines() if line.startswith("clash")]
    assert clashes == [
        "clash (the recipes refuse to start): cache option 'lfu' of cache policy plugin 'mine' (clashing_plugin) "
        "clashes with the cache policy plugin 'lfu' (neo-dlrm); rename the option (meanwhile "
        "NEO_DISABLE_PLUGIN_AUTOLOAD=1 runs with the built-ins only)."
    ]
    assert not [line for line in list_plugins().splitlines() if "mine_small" in line and "clash" in line]
    from neo_core.cli import main as neo_main

    assert neo_main(["plugins"]) == 1  # listed, and the exit says the recipes will not start


def test_neo_plugins_names_an_option_hidden_by_a_yaml_file(register_plugin, tmp_path, monkeypatch) -> None:
    class Hidden:
        __name__ = "hidden_plugin"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register("mine", lambda load_factor=0.2: CachePolicy("mine", load_factor),
                              options={"extra": {"load_factor": 0.3}})

    register_plugin(Hidden())
    conf = tmp_path / "conf"
    (conf / "cache").mkdir(parents=True)
    (conf / "train.yaml").write_text("defaults: []\n")
    (conf / "cache" / "extra.yaml").write_text("name: lru\n")
    said = ("clash (the recipes refuse to start): cache option 'extra' of cache policy plugin 'mine' (hidden_plugin) "
            f"clashes with the option file {conf / 'cache' / 'extra'}.yaml;")
    assert said in list_plugins(conf)
    assert "clash" not in list_plugins()  # the checkout's conf/ has no cache/extra.yaml
    import neo_core.cli

    monkeypatch.setattr(neo_core.cli, "CHECKOUT_CONF", conf)
    assert said in list_plugins()  # the checkout's conf/ by default


def test_neo_plugins_reports_failed_plugins(register_plugin) -> None:
    class Failing:
        __name__ = "failing_listed"

        @hookimpl
        def neo_register_models(self, registry):
            raise ImportError("needs a missing package")

    with pytest.warns(UserWarning):
        register_plugin(Failing(), strict=False)
    assert re.fullmatch(r"failed to load: failing_listed: PluginError: its neo_register_models raised ImportError: "
                        r"needs a missing package \(raised at test_cli\.py:\d+ in neo_register_models\)",
                        list_plugins().splitlines()[-1])
    # an option it would have given is reported missing with the failure beside it
    with pytest.raises(ConfigError, match=r"Unknown model option 'its_model'.*'failing_listed' failed to load"):
        check_group_options(["model=its_model"], ROOT / "conf", ("model",))


def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEO_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info, user_errors():
        raise ConfigError("Unknown key trainer.max_step. Did you mean 'max_steps'?")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: Unknown key trainer.max_step. Did you mean 'max_steps'?\n"
    # an error raised inside a spawned rank arrives wrapped, with the original class in its text
    wrapped = RuntimeError("-- Process 1 terminated with the following error:\nTraceback ...\n"
                           "neo_core.errors.PlanningError: Table 't' does not fit.")
    with pytest.raises(SystemExit), user_errors():
        raise wrapped
    assert capsys.readouterr().err == "error: Table 't' does not fit.\n"
    with pytest.raises(KeyError), user_errors():  # not a user error: the traceback is kept
        raise KeyError("bug")
    monkeypatch.setenv("NEO_TRACEBACK", "1")
    with pytest.raises(ConfigError), user_errors():
        raise ConfigError("shown with its traceback on request")


def test_unknown_command_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plugin"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'plugin'" in capsys.readouterr().err


def test_installed_plugin_is_listed_by_both_entry_commands(plugin_site) -> None:
    env = subprocess_env(*plugin_site.values())
    proc = subprocess.run(
        [sys.executable, "-m", "neo_core", "plugins"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "  my_policy      [neo-example-plugin]  Example cache policy from a third-party package" in proc.stdout
    assert "  tiny_cluster   [neo-example-plugin]" in proc.stdout
    assert "  none           [neo-dlrm]" in proc.stdout
    assert "failed to load: broken: RuntimeError: neo_broken_plugin is broken on purpose" in proc.stdout
    assert "broken" not in proc.stderr  # said once, in the listing
    assert "Traceback" not in proc.stderr
    # the console script, with strict mode: the broken plugin stops it in one line
    assert NEO_SCRIPT.exists()
    proc = subprocess.run(
        [str(NEO_SCRIPT), "plugins"], cwd=ROOT, env={**env, "NEO_STRICT_PLUGINS": "1"},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: Neo plugin 'broken' failed to load (RuntimeError: neo_broken_plugin is broken")
    assert "unset NEO_STRICT_PLUGINS" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_plain_overrides_reach_neo_and_group_selections_stay_with_hydra() -> None:
    groups = ("sharding", "trainer", "topology")
    argv = [
        "sharding=torchrec",  # a group option: Hydra selects it
        "trainer.max_step=3",  # a key: ++ so a typo reaches Neo's check, not Hydra's struct error
        "seeed=1",  # a top-level key, misspelled: the same
        "topology=zionex",  # the group the recipes append: same as +topology=zionex
        "+topology=zionex", "++seed=2", "~cache", "-m", "hydra.run.dir=/tmp/x", "hydra/launcher=basic",
        "+trainer.batch_size=8", "+seed=3", "+hydra.run.dir=/tmp/y",  # Hydra: "Either remove + prefix"
        "+sharding@foo=neo", "sharding@foo=neo",  # a group at another package: Hydra's (Neo names foo)
    ]
    assert force_add_overrides(argv, groups) == [
        "sharding=torchrec", "++trainer.max_step=3", "++seeed=1", "+topology=zionex",
        "+topology=zionex", "++seed=2", "~cache", "-m", "hydra.run.dir=/tmp/x", "hydra/launcher=basic",
        "++trainer.batch_size=8", "++seed=3", "++hydra.run.dir=/tmp/y",
        "+sharding@foo=neo", "sharding@foo=neo",
    ]


def test_hydras_command_line_mistakes_are_one_sentence_or_mended(tmp_path: Path) -> None:
    from neo_core.cli import check_command_line, flags_first

    for argv, message in (
        (["trainer=smoke", "trainer.max_steps"], "trainer.max_steps has no value: give a setting as "
         "trainer.max_steps=<value> (python recipes/train.py --help lists the settings)."),
        (["--config-dir", str(tmp_path / "none")], f"--config-dir {tmp_path / 'none'}: no such folder"),
        ([f"-cd={tmp_path / 'none'}"], f"-cd {tmp_path / 'none'}: no such folder"),
        (["hello world"], "'hello world' is not a setting: give settings as key=value (python recipes/train.py "
         "--help lists them)."),
        (["--config-dir=~/conf"], "--config-dir ~/conf: '~' is not expanded here (the shell leaves it quoted, or "
         f"after '='); write the folder out: --config-dir {Path('~/conf').expanduser()}"),
        # Hydra's grammar: its parser's message, the override shown with the ++ the recipes add, and a link
        (["output_dir=~/plans/x"], "output_dir=~/plans/x: '~' is not expanded here (the shell leaves it quoted, or "
         f"after '='); write the folder out: output_dir={Path('~/plans/x').expanduser()}"),
        (["seed=b=c"], "seed=b=c: Hydra cannot read this value (mismatched input '=' expecting <EOF>); quote it, as "
         "Hydra reads quotes: seed='b=c' (in the shell: \"seed='b=c'\")."),
        (["a=x#y"], "a=x#y: Hydra cannot read this value ('#' is not read unquoted); quote it"),
        (["a=x'y"], "a=x'y: Hydra cannot read this value (\"'\" is not read unquoted); quote it, as Hydra reads "
         "quotes: a=\"x'y\" (in the shell: \"a=\\\"x'y\\\"\")."),
        (["model.dense_arch=[64,32"], "model.dense_arch=[64,32: Hydra cannot read this value (a bracket is not "
         "closed); close it, or put the item that holds it in quotes, as Hydra reads them ('...')."),
        # quoted whole, a list or a sweep would be one string; quoted as suggested, it must read
        (["a=x#y,z"], "a=x#y,z: Hydra cannot read this value ('#' is not read unquoted); put the item that holds it "
         "in quotes, as Hydra reads them ('...')."),
        (["a=x'y\"z"], "a=x'y\"z: Hydra cannot read this value (\"'\" is not read unquoted); see how Hydra reads "
         "quotes: https://hydra.cc/docs/advanced/override_grammar/basic/"),
        (["a=it's$HOME"], "a=it's$HOME: Hydra cannot read this value (\"'\" is not read unquoted); quote it, as Hydra reads quotes: a=\"it's$HOME\" (in the shell: 'a=\"it'\"'\"'s$HOME\"')."),
        (["a b=1"], "a b=1: Hydra cannot read the key 'a b' (' ' is not read in a key); a key is names joined by dots"),
        # a name with a space under a mapping (a table's name): how to give it, in a form Hydra reads
        (["+sharding.table_sharding_types.my table=[TW]"], "+sharding.table_sharding_types.my table=[TW]: Hydra "
         "cannot read the key '+sharding.table_sharding_types.my table' (' ' is not read in a key); a key is names "
         "joined by dots (trainer.max_steps); a name with ' ' in it goes inside the mapping, which sets it whole: "
         "'+sharding.table_sharding_types={my table: [TW]}'."),
        (["hydra.sweep.dir=~/a,~/b"], "hydra.sweep.dir=~/a,~/b: '~' is not expanded here (the shell leaves it "
         "quoted, or after '='); write the folder out: hydra.sweep.dir="
         f"{Path('~/a').expanduser()},{Path('~/b').expanduser()}"),
        # a sweep function misspelled or misused: Hydra's reason, not advice to quote it (a string, no sweep)
        (["a=rnage(1,3)"], "a=rnage(1,3): Hydra cannot evaluate 'rnage(1,3)': Unknown function 'rnage' (its "
         "functions: bool, choice, float, glob, int, interval, range, shuffle, sort, str, tag)."),
        (["a=choice()"], "a=choice(): Hydra cannot evaluate 'choice()': empty choice is not legal."),
        (["-cd", "~nosuchuser/conf"], "-cd ~nosuchuser/conf: '~' is not expanded here (the shell leaves it quoted, "
         "or after '='); write the folder out: its full path"),  # was expanduser's RuntimeError
        (["-m", "a=1,2", "--cfg", "job"], "-m and --cfg cannot be given together: Hydra does one of a run, a sweep "
         "(-m), --cfg, --info or --shell-completion (--cfg shows one job's config: leave out -m and give each key "
         "one value)."),
    ):
        with pytest.raises(ConfigError) as err:
            check_command_line(argv, "recipes/train.py")
        assert str(err.value).startswith(message), str(err.value)
    # flags and their values, deletions: no override is missing its value
    check_command_line(["-m", "--config-dir", str(tmp_path), "-cn", "train", "-p", "trainer", "~cache", "a=1",
                        "--help"], "recipes/train.py")
    check_command_line(["--cfg", "job", "a=1"], "recipes/train.py")
    check_command_line(["--info", "config", "a=1", "--resolve"], "recipes/train.py")
    # a flag among the overrides: Hydra showed its usage and called the overrides that follow unrecognized
    assert flags_first(["trainer=smoke", "-m", "kernel=fused,dense"]) == ["-m", "trainer=smoke", "kernel=fused,dense"]
    assert flags_first(["a=1", "--cfg", "job", "b=2", "-cd=x", "--info", "c=3", "-i", "config"]) == [
        "--cfg", "job", "-cd=x", "--info=all", "-i", "config", "a=1", "b=2", "c=3"]
    # a bare --info (Hydra's "all") moved before an override would take the override as its value
    assert flags_first(["+topology=zionex", "-i"]) == ["--info=all", "+topology=zionex"]
    # a group chosen twice: Hydra's message offered defaults-list syntax
    with pytest.raises(ConfigError, match=r"^topology is chosen twice \(\+topology=zionex and \+topology=local\); give "):
        check_group_options(["+topology=zionex", "+topology=local"], ROOT / "conf", ("topology",))
    with pytest.raises(ConfigError, match=r"^model is chosen twice \(model=zionex_12t and model=mlperf_dcnv2\); give"):
        check_group_options(["model=zionex_12t", "model=mlperf_dcnv2"], ROOT / "conf", ("plan_model",), {"model": "plan_model"})


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("cache=lfru", "Unknown cache option 'lfru' (did you mean 'lru'?); choose one of lfu, lru, none."),
        ("sharding=null", "sharding needs an option; choose one of neo, torchrec."),
        ("kernel=", "kernel needs an option; choose one of dense, fused."),
    ],
)
def test_a_group_option_is_checked_against_the_config_folder(arg: str, message: str) -> None:
    groups = ("sharding", "kernel", "cache", "experiment")
    with pytest.raises(ConfigError) as err:
        check_group_options([arg], ROOT / "conf", groups, nullable=("experiment",))
    # plugins registered by other tests may add choices (each registered plugin is an option)
    head, _, names = message.partition("choose one of ")
    assert str(err.value).startswith(head + "choose one of "), str(err.value)
    assert set(names.rstrip(".").split(", ")) <= set(str(err.value).rstrip(".").split("choose one of ")[1].split(", "))
    check_group_options(["experiment=null", "cache=lru,lfu", "sharding=neo"], ROOT / "conf", groups,
                        nullable=("experiment",))


def test_a_backward_precision_given_as_the_compression_option_says_where_it_goes() -> None:
    from neo_core.plugins import get_plugins

    for arg in ("compression=fp8", "compression=INT8"):
        with pytest.raises(ConfigError) as err:
            check_group_options([arg], ROOT / "conf", ("compression",))
        precision = arg.split("=")[1].lower()
        assert (f"{precision} is a precision of the backward pass only: e.g. compression=fp16 "
                f"compression.backward={precision}") in str(err.value), str(err.value)
    # compression.forward: the forward precision is the option's name
    message = get_plugins().registry("compression").unknown_key("fp16", "forward")
    assert "The forward precision is the option's name (compression=bf16 sends bf16 forward)" in message, message


def test_groups_of_an_added_config_dir_are_groups(tmp_path) -> None:
    (tmp_path / "scheduler").mkdir()
    for argv in (["-cd", str(tmp_path)], [f"--config-dir={tmp_path}"], ["--config-dir", str(tmp_path)]):
        groups = config_groups(ROOT / "conf", argv)
        assert "scheduler" in groups and "topology" in groups, argv
        # a new group's option goes to Hydra as a selection, not as a ++key
        assert force_add_overrides([*argv, "scheduler=cosine"], groups)[-1] == "scheduler=cosine"
    assert "scheduler" not in config_groups(ROOT / "conf", [])
    assert force_add_overrides(["scheduler=cosine"], config_groups(ROOT / "conf")) == ["++scheduler=cosine"]


def test_neo_traceback_stops_a_sweep_at_its_first_failure(tmp_path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    # Hydra's launcher keeps an Exception a job raises and runs the next job: the sweep went on
    from neo_core.cli import SweepFailures

    def failing() -> None:
        raise ConfigError("trainer.batch_size must be a positive integer, got 0.")

    monkeypatch.setenv("NEO_TRACEBACK", "1")
    with pytest.raises(SystemExit) as stop:
        SweepFailures().job(failing, tmp_path, 0, "trainer.batch_size=0")
    assert stop.value.code == 1 and not isinstance(stop.value, Exception)
    err = capsys.readouterr().err
    assert "ConfigError: trainer.batch_size must be a positive integer" in err  # the traceback
    assert "job #0 (trainer.batch_size=0) failed; NEO_TRACEBACK=1 stops the sweep here" in err
    monkeypatch.delenv("NEO_TRACEBACK")
    sweep = SweepFailures()
    assert sweep.job(failing, tmp_path, 1, "trainer.batch_size=0") is None  # reported and kept
    assert sweep.jobs and "earlier run" not in (tmp_path / "error.txt").read_text()
    # a rerun into a folder whose job once succeeded: its results are not this job's
    (tmp_path / "metrics.json").write_text("{}")
    os.utime(tmp_path / "metrics.json", (1, 1))
    sweep.job(failing, tmp_path, 1, "trainer.batch_size=0")
    assert "(this job wrote no results: metrics.json in this folder is an earlier run's)" in (
        tmp_path / "error.txt").read_text()


def test_listed_values_without_multirun_name_the_flag() -> None:
    # Hydra's "Ambiguous value for argument '++trainer.max_steps=1,2'" showed an override the user never typed
    from neo_core.cli import check_sweep_values

    with pytest.raises(ConfigError, match=r"^trainer.max_steps=1,2 lists several values: add -m to run one job per "
                                          r"value \(python recipes/train.py -m ...\), or give one value \(a list value "
                                          r"goes in brackets: trainer.max_steps=\[1,2\]\)\.$"):
        check_sweep_values(["trainer.max_steps=1,2"], "recipes/train.py")
    with pytest.raises(ConfigError, match=r"^kernel=fused,dense lists several values: .* give one value\.$"):
        check_sweep_values(["kernel=fused,dense"], "recipes/train.py")
    for fine in (["-m", "kernel=fused,dense"], ["model.dense_arch=[64,16]"], ["data.name='a,b'"],
                 ["hydra.sweeper.params={a: 1,2}"], ["--config-dir", "x,y"],
                 ["hydra.mode=MULTIRUN", "trainer.max_steps=1,2"], ["data.name=a\\,b"]):
        check_sweep_values(fine, "recipes/train.py")


def test_a_sweeps_failures_that_share_a_message_are_listed_with_it_once(tmp_path: Path, capsys) -> None:
    failures = SweepFailures()

    def bad_key():
        raise ConfigError("Unknown key trainer.max_step. Did you mean 'max_steps'?")

    def bad_value():
        raise ConfigError("trainer.max_steps must be a positive integer, got 0.")

    for num, (fn, overrides) in enumerate([(bad_key, "+trainer.max_step=3"), (bad_key, "+trainer.max_step=4"),
                                           (bad_value, "trainer.max_steps=0")]):
        assert failures.job(fn, tmp_path / str(num), num, overrides) is None
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        failures.exit()
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "3 job(s) of the sweep failed (each folder's error.txt says why):",
        "  #0 +trainer.max_step=3",
        "  #1 +trainer.max_step=4",
        "    all 2: Unknown key trainer.max_step. Did you mean 'max_steps'?",
        "  #2 trainer.max_steps=0: trainer.max_steps must be a positive integer, got 0.",
    ]


def test_a_run_folder_hydra_cannot_make_is_one_sentence_before_it_starts(tmp_path: Path) -> None:
    # Hydra made hydra.run.dir before the recipe ran: a file in the way was its traceback
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [
        ([f"hydra.run.dir={afile}"], f"hydra.run.dir={afile} cannot hold the run's output (a file of that name is "
                                     "in the way); choose another hydra.run.dir."),
        ([f"hydra.run.dir={afile}/sub"], f"({afile} is a file, not a folder)"),
        (["-m", f"hydra.sweep.dir={afile}"], f"hydra.sweep.dir={afile} cannot hold the run's output"),
        # the shell leaves ~ after key= as it is: Hydra made a folder named ~, and this check one in the home folder
        (["hydra.run.dir=~/runs/a"], "hydra.run.dir=~/runs/a: '~' is not expanded here (the shell leaves it quoted, "
         f"or after '='); write the folder out: hydra.run.dir={Path('~/runs/a').expanduser()}"),
        (["hydra.run.dir='~/runs/${now:%H}'"], "hydra.run.dir=~/runs/${now:%H}: '~' is not expanded here"),
        (["-m", "+hydra.sweep.dir='~nosuchuser/s'"], "hydra.sweep.dir=~nosuchuser/s: '~' is not expanded here (the "
         "shell leaves it quoted, or after '='); write the folder out: its full path"),
    ]
    for argv, said in cases:
        with pytest.raises(ConfigError) as err:
            check_run_dirs(argv)
        assert said in str(err.value), str(err.value)
    check_run_dirs(["-m", f"hydra.run.dir={afile}"])  # a sweep does not use it
    check_run_dirs([f"hydra.sweep.dir={afile}"])  # nor a single run this one
    check_run_dirs(["hydra.run.dir=outputs/${now:%H}"])  # Hydra resolves it
    check_run_dirs([f"hydra.run.dir={tmp_path / 'new' / 'run'}"])
    assert (tmp_path / "new" / "run").is_dir()


def test_a_claimed_folder_is_this_process_alone(tmp_path: Path) -> None:
    # runs started in the same second took Hydra's one outputs/<date>/<time> folder, and the
    # second wrote its log, plan and checkpoints over the first's
    name = str(tmp_path / "outputs" / "day" / "12-00-00")
    assert claim_folder(name) == name and Path(name).is_dir()
    (Path(name) / "plan.json").write_text("{}")
    assert claim_folder(name) == f"{name}-2"
    Path(f"{name}-3").write_text("a file in the way")
    assert claim_folder(name) == f"{name}-4" and Path(f"{name}-4").is_dir()
    assert (Path(name) / "plan.json").read_text() == "{}"
    # processes claiming one name at once each get their own
    racing = str(tmp_path / "race" / "12-00-00")
    code = ("import sys, time; from neo_core.run_folders import claim_folder\n"
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); print(claim_folder(sys.argv[1]))")
    start = f"{time.time() + 3:.3f}"
    procs = [subprocess.Popen([sys.executable, "-c", code, racing, start], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env(), cwd=ROOT) for _ in range(6)]
    got = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert got == sorted([racing] + [f"{racing}-{n}" for n in range(2, 7)]), got
    # a place that cannot hold it: the name as given, for Hydra to say why
    blocked = str(tmp_path / "plan.txt" / "run")
    (tmp_path / "plan.txt").write_text("")
    assert claim_folder(blocked) == blocked and not Path(blocked).exists()


def test_a_launchers_ranks_without_torchruns_store_name_hydras_folder_unclaimed(tmp_path: Path, monkeypatch) -> None:
    # every rank must name the same folder, and a claim would give each its own; under torchrun
    # rank 0's claim is shared through its store (tests/training: test_torchruns_ranks_share_...)
    from neo_core import run_folders

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_folders, "_FRESH_DIRS", {})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("NEO_SPAWNED", raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    name = run_folders.fresh_run_dir("outputs")
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", name) and not (tmp_path / "outputs").exists()
    monkeypatch.delenv("RANK")
    assert run_folders.fresh_run_dir("outputs") == name  # once per process and base
    fresh = run_folders.fresh_run_dir("multirun")
    assert fresh.startswith("multirun/") and (tmp_path / fresh).is_dir()


def test_a_failed_jobs_bad_settings_are_listed_a_line_each(capsys) -> None:
    # config.validate names every bad setting of a job at once; the sweep's list gives each a line
    print_failed_jobs([
        (0, "seed=-1", "2 settings are wrong. trainer.max_steps must be a positive integer, got 0. Also: seed must "
                       "be a whole number, 0 or more, got -1."),
        (1, "seed=3", "trainer.max_steps must be a positive integer, got 0."),
        (2, "seed=4", "trainer.max_steps must be a positive integer, got 0."),
    ])
    # what every job has is said once, after them: #0's own problem on its line
    assert capsys.readouterr().err.splitlines() == [
        "  #0 seed=-1: seed must be a whole number, 0 or more, got -1.",
        "  #1 seed=3",
        "  #2 seed=4",
        "    all 3: trainer.max_steps must be a positive integer, got 0.",
    ]
    two = "2 settings are wrong. trainer.max_steps must be a positive integer, got 0. Also: data.rows must be positive."
    print_failed_jobs([
        (0, "seed=-1", two.replace("2 settings", "3 settings") + " Also: seed must be a whole number, 0 or more, got -1."),
        (1, "seed=3", two),
        (2, "seed=4", "data.num_dense must be a whole number >= 0, got -1."),
    ])
    assert capsys.readouterr().err.splitlines() == [  # nothing all three have: each job's own, whole
        "  #0 seed=-1: trainer.max_steps must be a positive integer, got 0.",
        "      also: data.rows must be positive.",
        "      also: seed must be a whole number, 0 or more, got -1.",
        "  #1 seed=3: trainer.max_steps must be a positive integer, got 0.",
        "      also: data.rows must be positive.",
        "  #2 seed=4: data.num_dense must be a whole number >= 0, got -1.",
    ]
    print_failed_jobs([(0, "seed=1", two), (1, "seed=2", two)])
    assert capsys.readouterr().err.splitlines() == [
        "  #0 seed=1", "  #1 seed=2",
        "    all 2: trainer.max_steps must be a positive integer, got 0.",
        "      also: data.rows must be positive.",
    ]
    # a long message (a refusal's list of tables) was cut mid-number with nothing said
    long = "Device memory is short; largest: " + ", ".join(f"t{i:03d} (53.34 GiB)" for i in range(40)) + "; add ranks."
    print_failed_jobs([(0, "x=1", long)])
    line = capsys.readouterr().err.strip()
    assert line.startswith("#0 x=1: Device memory is short; largest: t000 (53.34 GiB), ")
    head, _, rest = line.removeprefix("#0 x=1: ").partition(" ... ")
    assert rest == "(the rest in its error.txt)" and long.startswith(head + " ") and 250 < len(head) <= 300, line
    print_failed_jobs([(0, "x=1", long)], width=None)
    assert capsys.readouterr().err.strip() == f"#0 x=1: {long}"


def test_every_job_of_a_sweep_is_checked_as_it_will_run_before_the_first_starts(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        "import hydra\n"
        "from neo_core.cli import check_sweep_jobs\n"
        "from neo_core.errors import ConfigError\n"
        "def check(cfg):\n"
        "    if cfg['x'] == 1:\n"
        "        raise ValueError('not a setting: the job reports it')\n"
        "    if cfg['x'] >= 2:\n"
        "        raise ConfigError(f\"x={cfg['x']} is bad (job {cfg['num']} in {cfg['out']})\")\n"
        "@hydra.main(version_base='1.3', config_path=None, config_name=None)\n"
        "def main(cfg):\n"
        "    print('ran', cfg.x)\n"
        "check_sweep_jobs(lambda cfg: None)\n"
        "check_sweep_jobs(check)  # the last one given: Hydra's sweeper is wrapped once\n"
        "main()\n"
    )

    def sweep(values: str, *more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(app), "-m", f"+x={values}", "+num=${hydra:job.num}",
             "+out=${hydra:runtime.output_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *more],
            capture_output=True, text=True, env=subprocess_env(ROOT), timeout=120,
        )

    proc = sweep("0,1")  # no Neo error: every job runs (the one whose check broke too)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("ran")] == ["ran 0", "ran 1"]
    proc = sweep("0,1,2,3")
    assert proc.returncode == 2 and "ran" not in proc.stdout, proc.stderr
    out = (tmp_path / "sweep").absolute()
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        "error: 2 of the 4 jobs of the sweep would fail, so none was started (fix them, or leave them out of the sweep):")
    assert len(lines) == 3  # each job with its number, overrides and message, as the job itself would see it
    for num, line in enumerate(lines[1:], start=2):
        assert line.startswith(f"  #{num} +x={num} ") and line.endswith(f": x={num} is bad (job {num} in {out / str(num)})")
    proc = sweep("3")
    assert proc.stderr.splitlines()[0] == "error: the one job of the sweep would fail, so it was not started:"
    # in batches (hydra.sweeper.max_batch_size): every batch is checked before the first starts
    proc = sweep("0,1,2,3", "hydra.sweeper.max_batch_size=2")
    assert proc.returncode == 2 and "ran" not in proc.stdout, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("error: 2 of the 4 jobs of the sweep would fail, so none was started")
    assert proc.stderr.splitlines()[2].endswith(f"x=3 is bad (job 3 in {out / '3'})")


def test_a_sweep_whose_every_job_failed_still_writes_its_summary(tmp_path: Path, capsys) -> None:
    # no summary.csv at all: a script collecting the sweeps' summaries broke where all had failed
    import csv

    from neo_core.errors import PlanningError

    sweep = SweepFailures(lambda m: {"val AUC": (m["auc"], ".4f")})
    for num, why in enumerate(("does not fit", "no such table")):
        def job(why=why):
            raise PlanningError(why)

        (tmp_path / str(num)).mkdir()
        sweep.job(job, tmp_path / str(num), num, f"seed={num} trainer=smoke")
    with pytest.raises(SystemExit) as exit_:
        sweep.exit()
    assert exit_.value.code == 2
    assert capsys.readouterr().out.splitlines() == [
        f"sweep results: none, no job finished ({tmp_path / 'summary.csv'} lists each job and why)"]
    assert list(csv.reader((tmp_path / "summary.csv").open())) == [
        ["job", "overrides", "folder", "status", "error"],
        ["0", "seed=0 trainer=smoke", str(tmp_path / "0"), "failed", "does not fit"],
        ["1", "seed=1 trainer=smoke", str(tmp_path / "1"), "failed", "no such table"],
    ]
    assert not (tmp_path / "summary.png").exists()  # nothing to draw


def test_a_sweep_ends_with_its_jobs_results_side_by_side(tmp_path: Path, capsys, monkeypatch) -> None:
    # comparing a sweep's jobs meant opening each folder's metrics.json
    import csv
    import math

    from neo_core.errors import PlanningError

    sweep = SweepFailures(lambda m: {"val AUC": (m["auc"], ".4f"), "step": (m["ms"], ".1f", "ms")})
    common = "trainer=smoke trainer.max_steps=3"
    results = {0: {"auc": 0.81234, "ms": 2.0}, 1: PlanningError("does not fit"), 2: {"auc": 0.7, "ms": 10.25}}
    for num, kernel in enumerate(("fused", "dense", "dense cache=lru")):
        outcome = results[num]

        def job(outcome=outcome):
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        (tmp_path / str(num)).mkdir()
        sweep.job(job, tmp_path / str(num), num, f"kernel={kernel} {common}")
    sweep.finished(3, f"kernel=fused {common} seed=1", tmp_path / "3", {"auc": 0.5, "ms": 1.0})  # reported, not run
    (tmp_path / "5").mkdir()  # an earlier sweep's job, beyond this one's: said, not summed up
    (tmp_path / "5" / "plan.json").write_text("{}")
    (tmp_path / "4").mkdir()  # an empty folder is nobody's results
    with pytest.raises(SystemExit) as exit_:
        sweep.exit()
    assert exit_.value.code == 2
    assert capsys.readouterr().out.splitlines() == [
        f"sweep results ({tmp_path / 'summary.csv'}):",
        "  #0 kernel=fused: val AUC 0.8123, step 2.0 ms",  # what differs between the jobs
        "  #1 kernel=dense: failed (error.txt)",
        "  #2 kernel=dense cache=lru: val AUC 0.7000, step 10.2 ms",
        "  #3 kernel=fused seed=1: val AUC 0.5000, step 1.0 ms",
        f"note: {tmp_path} also holds job folder(s) 5 of an earlier sweep, which this one did not run: their "
        "results are not in summary.csv",
        f"chart: {tmp_path / 'summary.png'}",  # the same, to look at: a panel per result, a bar per job
    ]
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from neo_core.training.plots import plot_sweep  # an infinite result is drawn as n/a, not a failure

    assert plot_sweep([("#0 a", {"samples/s": (math.inf, ",.0f")}), ("#1 b", {"samples/s": (5.0, ",.0f")})],
                      tmp_path / "inf.png", "t")
    assert not plot_sweep([("#0 a", {"types": ("TW 3", "s")})], tmp_path / "none.png", "t")  # nothing to draw
    rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert rows[0] == ["job", "overrides", "folder", "status", "val AUC", "step (ms)", "error"]
    assert rows[2] == ["1", f"kernel=dense {common}", str(tmp_path / "1"), "failed", "", "", "does not fit"]
    assert rows[3][3:] == ["done", "0.7", "10.25", ""]
    # the summary goes to hydra.sweep.dir, wherever the jobs' folders are under it; a result a
    # job has not (no validation) is n/a, not nan
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(  # relative: to the launch folder
        sweep=SimpleNamespace(dir="sweep"), runtime=SimpleNamespace(cwd=str(tmp_path)))))
    nested = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    for num, auc in enumerate((0.5, math.nan)):
        (tmp_path / "sweep" / "by-kernel" / str(num)).mkdir(parents=True)  # as Hydra makes them
        nested.job(lambda auc=auc: auc, tmp_path / "sweep" / "by-kernel" / str(num), num, f"seed={num}")
    with pytest.raises(SystemExit):
        nested.exit()
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "  #1 seed=1: val AUC n/a", f"chart: {tmp_path / 'sweep' / 'summary.png'}"]
    assert list(csv.reader((tmp_path / "sweep" / "summary.csv").open()))[2][-2:] == ["", ""]  # n/a, no error
    monkeypatch.undo()


def test_a_one_job_sweep_ends_with_its_results_as_any_sweep(tmp_path: Path, capsys) -> None:
    # a -m sweep of one value wrote no summary.csv nor summary.png and printed nothing, its job
    # failed or not: scripts gathering every sweep folder's summary.csv broke on it
    import csv

    from neo_core.errors import PlanningError

    alone = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    (tmp_path / "0").mkdir()
    alone.job(lambda: 0.5, tmp_path / "0", 0, "seed=3 trainer=smoke")
    with pytest.raises(SystemExit) as exit_:
        alone.exit()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.splitlines() == [
        f"sweep results ({tmp_path / 'summary.csv'}):", "  #0 seed=3 trainer=smoke: val AUC 0.5000",
        f"chart: {tmp_path / 'summary.png'}"]
    assert list(csv.reader((tmp_path / "summary.csv").open()))[1] == [
        "0", "seed=3 trainer=smoke", str(tmp_path / "0"), "done", "0.5", ""]
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def fails() -> None:
        raise PlanningError("does not fit")

    failed = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    (tmp_path / "f" / "0").mkdir(parents=True)
    failed.job(fails, tmp_path / "f" / "0", 0, "seed=3")
    with pytest.raises(SystemExit) as exit_:
        failed.exit()
    assert exit_.value.code == 2
    assert capsys.readouterr().out.splitlines() == [
        f"sweep results: none, no job finished ({tmp_path / 'f' / 'summary.csv'} lists each job and why)"]
    assert list(csv.reader((tmp_path / "f" / "summary.csv").open()))[1] == [
        "0", "seed=3", str(tmp_path / "f" / "0"), "failed", "does not fit"]
    # a run without -m runs no job of a sweep: no summary
    SweepFailures(lambda m: {"val AUC": (m, ".4f")}).summary()
    assert capsys.readouterr().out == ""


def test_a_sweep_over_a_numeric_setting_is_charted_against_its_value(tmp_path: Path, monkeypatch) -> None:
    # summary.png drew a bar per job only: a cache share or a bandwidth swept was not an x-axis,
    # and a second setting swept (cache=lru,lfu) was not a line of its own
    from neo_core.errors import PlanningError
    from neo_core.training import plots

    drawn, real = [], plots.sweep_lines

    def spy(*args, **kwargs):  # what summary.png is drawn from
        drawn.append(real(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(plots, "sweep_lines", spy)
    steps = {("lru", "0.05"): 5.8, ("lru", "0.1"): 5.9, ("lru", "0.2"): 6.0, ("lfu", "0.05"): 5.4, ("lfu", "0.1"): 5.7}
    sweep = SweepFailures(lambda ms: {"predicted step": (ms, ".3f", "ms"), "ranks": (8, "")})
    for num, (policy, share) in enumerate((p, s) for p in ("lru", "lfu") for s in ("0.1", "0.05", "0.2")):
        def job(key=(policy, share)):
            if key not in steps:
                raise PlanningError("the cache does not fit")
            return steps[key]

        (tmp_path / str(num)).mkdir()
        sweep.job(job, tmp_path / str(num), num, f"+topology=zionex cache={policy} cache.load_factor={share}")
    sweep.summary()
    chart = drawn[-1]
    assert (chart.x, chart.by, chart.log_x) == ("cache.load_factor", ["cache"], False)  # 0.05 to 0.2: 4x
    assert chart.columns == ["predicted step"]  # the ranks, the same in every job, are no result
    assert chart.lines == {"cache=lru": {"predicted step": [(0.05, 5.8), (0.1, 5.9), (0.2, 6.0)]},
                           "cache=lfu": {"predicted step": [(0.05, 5.4), (0.1, 5.7)]}}
    assert chart.missing == {"cache=lru": [], "cache=lfu": [(0.2, "failed")]}  # marked at its x
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def lines(*settings: dict, rows=None, statuses=None):
        jobs = [(f"#{n}", {"step": (float(n + 1), ".1f")} if rows is None else rows[n]) for n in range(len(settings))]
        return plots.sweep_lines(jobs, list(settings), statuses)

    # a bandwidth from 25 to 1.5 GB/s spans more than 10x: a log axis; nothing else varies: one line
    bandwidths = lines(*({"topology.inter_node_bw_gbps": v, "model": "mlperf_dcnv2"} for v in ("25", "12", "6", "3", "1.5")))
    assert (bandwidths.x, bandwidths.by, bandwidths.log_x) == ("topology.inter_node_bw_gbps", [], True)
    assert bandwidths.lines == {"": {"step": [(1.5, 5.0), (3.0, 4.0), (6.0, 3.0), (12.0, 2.0), (25.0, 1.0)]}}
    # a result no job has a number for (TorchRec's plans give no bytes) gets no empty panel
    nan = float("nan")
    bytes_none = lines(*({"topology.inter_node_bw_gbps": v} for v in ("25", "12")),
                       rows=[{"step": (1.0, ".1f"), "bytes": (nan, ".1f")}, {"step": (2.0, ".1f"), "bytes": (nan, ".1f")}])
    assert bytes_none.columns == ["step"]
    # a capacity is drawn dashed in its result's panel, not in a panel of its own repeating the
    # device size swept
    sizes = lines(*({"topology.device_memory_gib": v} for v in ("16", "40")),
                  rows=[{"mem": (12.2, ".2f"), "mem capacity": (13.6, ".2f")},
                        {"mem": (19.3, ".2f"), "mem capacity": (34.0, ".2f")}])
    assert sizes.columns == ["mem"] and sizes.capacity == {"": {"mem": [(16.0, 13.6), (40.0, 34.0)]}}
    # and in a bar chart, marked on the result's bars
    assert plots.bar_columns([{"mem": (12.2, ".2f"), "mem capacity": (13.6, ".2f")},
                              {"mem": (19.3, ".2f"), "mem capacity": (34.0, ".2f")}]) == ["mem"]
    assert plots.plot_sweep([("#0", {"mem": (12.2, ".2f"), "mem capacity": (13.6, ".2f")}),
                             ("#1", {"mem": (19.3, ".2f"), "mem capacity": (34.0, ".2f")})], tmp_path / "mem.png", "t",
                            [{"topology.device_memory_gib": "16"}, {"topology.device_memory_gib": "40"}])
    # two numeric settings: the one of more values is the x-axis, a line per value of the other
    grid = [{"topology.num_nodes": n, "cache.load_factor": f} for f in ("0.1", "0.2") for n in ("1", "2", "4")]
    both = lines(*grid, rows=[None, *({"step": (float(i), ".1f")} for i in range(1, 6))],
                 statuses=["stopped", *[""] * 5])
    assert (both.x, both.by) == ("topology.num_nodes", ["cache.load_factor"])
    assert both.lines["cache.load_factor=0.1"] == {"step": [(2.0, 1.0), (4.0, 2.0)]}
    assert both.missing["cache.load_factor=0.1"] == [(1.0, "stopped")]
    # no numeric setting varied (a seed is a name, not a quantity): a bar per job
    assert lines({"sharding": "neo"}, {"sharding": "torchrec"}) is None
    assert lines({"seed": "1"}, {"seed": "2"}, {"seed": "3"}) is None
    assert plots.plot_sweep([("#0 sharding=neo", {"step": (1.0, ".1f")}), ("#1 sharding=torchrec", None)],
                            tmp_path / "bars.png", "t", [{"sharding": "neo"}, {"sharding": "torchrec"}])


def test_a_sweeps_chart_draws_its_axis_past_the_top_of_every_whisker(tmp_path: Path, monkeypatch) -> None:
    # the line chart's y-axis was drawn to the highest mean and capacity only: a per-step 90th
    # percentile above every mean ran off the top of its panel
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from neo_core.training import plots

    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))  # the figure, kept to read its axes
    step = [{"samples/s": (mean, ",.0f"), "samples/s p10": (low, ",.0f"), "samples/s p90": (high, ",.0f")}
            for mean, low, high in ((100.0, 90.0, 180.0), (120.0, 60.0, 400.0), (150.0, 140.0, 160.0))]
    assert plots.plot_sweep([(f"#{n}", row) for n, row in enumerate(step)], tmp_path / "lines.png", "t",
                            [{"topology.num_nodes": n} for n in ("1", "2", "4")])
    low, top = drawn[-1].axes[0].get_ylim()
    assert low == 0 and top >= 400.0, (low, top)  # the highest whisker's top, not the highest mean (150)
    # and a bar chart's axis reaches past the whiskers and the capacities marked on its bars
    rows = [{"step": (2.0, ".1f", "ms"), "step p10": (1.0, ".1f"), "step p90": (30.0, ".1f"),
             "mem": (3.0, ".1f", "GiB"), "mem capacity": (16.0, ".1f")},
            {"step": (4.0, ".1f", "ms"), "mem": (5.0, ".1f", "GiB"), "mem capacity": (40.0, ".1f")}]
    assert plots.plot_sweep([("#0 sharding=neo", rows[0]), ("#1 sharding=torchrec", rows[1])],
                            tmp_path / "bars.png", "t", [{"sharding": "neo"}, {"sharding": "torchrec"}])
    panels = {ax.get_title().split(" (")[0]: ax.get_xlim() for ax in drawn[-1].axes}
    assert panels["step"][0] == 0 and panels["step"][1] >= 30.0, panels  # the whisker's top, not the bars' 4
    assert panels["mem"][0] == 0 and panels["mem"][1] >= 40.0, panels  # the larger capacity, not the bars' 5
    # the capacity's mark is said in the legend, as the line chart's dashed line is
    said = [t.get_text() for legend in drawn[-1].legends for t in legend.get_texts()]
    assert "capacity (the whole device or node)" in said, said
    for fig in drawn:
        close(fig)


def test_a_sweeps_bar_chart_of_many_results_wraps_its_panels_into_rows(tmp_path: Path, monkeypatch) -> None:
    # `sharding=neo,torchrec` drew its seven panels in one row: a strip 2060 px wide and 224 high
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from neo_core.training import plots

    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))  # the figure, kept to read its panels
    results = [f"result {n}" for n in range(7)]
    jobs = [(f"#{j} sharding={name}", {c: (float(n + j + 1), ".1f", "ms") for n, c in enumerate(results)})
            for j, name in enumerate(("neo", "torchrec"))]
    assert plots.plot_sweep(jobs, tmp_path / "bars.png", "t", [{"sharding": "neo"}, {"sharding": "torchrec"}])
    fig = drawn[-1]
    panels = {ax.get_title().split(" (")[0]: ax.get_subplotspec() for ax in fig.axes if ax.get_title()}
    assert sorted(panels) == results  # every result drawn once, the grid's spare cells left blank
    rows = sorted({spec.rowspan.start for spec in panels.values()})
    assert len(rows) > 1 and max(spec.colspan.start for spec in panels.values()) < plots.BAR_PANELS, panels
    width, height = fig.get_size_inches()
    assert width / height < 4, (width, height)  # was 20.6 by 2.2 inches
    for fig in drawn:
        close(fig)


def test_neo_chart_prints_and_draws_a_saved_plan(tmp_path: Path, capsys) -> None:
    # a training run writes plan.json and plan.txt but no chart; a kept plan could not be drawn again
    import json

    from neo_core.api import plan_tables
    from neo_core.cli import main as neo_main
    from neo_core.sharding import PlanResult, TableSpec

    plan = plan_tables([TableSpec(f"t{i}", 1000 * (i + 1), 16, 2.0) for i in range(6)], "zionex", 64)
    plan.save_json(tmp_path / "plan.json")
    again = PlanResult.load_json(tmp_path / "plan.json")
    assert json.dumps(again.to_dict()) == json.dumps(plan.to_dict())  # every figure and note as saved
    assert again.times_from == "Neo's cost model"
    assert again.format_text() == plan.format_text()
    assert neo_main(["chart", str(tmp_path / "plan.json")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Sharding plan (neo), 128 ranks") and shown.endswith(f"wrote {tmp_path / 'plan.png'}\n")
    assert (tmp_path / "plan.png").stat().st_size > 0
    (tmp_path / "config.json").write_text('{"trainer": {}}')
    for path, said in ((tmp_path / "config.json", "is not a plan.json that Neo wrote (KeyError: 'planner')"),
                       (tmp_path / "none.json", "cannot read")):
        with pytest.raises(SystemExit):
            neo_main(["chart", str(path)])
        assert said in capsys.readouterr().err
    # --out without a suffix: the file matplotlib writes (.png) is named; a format it has not is one sentence
    assert neo_main(["chart", str(tmp_path / "plan.json"), "--out", str(tmp_path / "noext")]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'noext.png'}\n") and (tmp_path / "noext.png").is_file()
    with pytest.raises(SystemExit):
        neo_main(["chart", str(tmp_path / "plan.json"), "--out", str(tmp_path / "x.txt")])
    err = capsys.readouterr().err
    assert "cannot draw a chart as x.txt: .txt is not an image format here; choose one of" in err and ".svg" in err
    assert "Traceback" not in err and not (tmp_path / "x.txt").exists()
    # the run's folder names its plan ("cannot read ...: Is a directory" before)
    (tmp_path / "plan.png").unlink()
    assert neo_main(["chart", str(tmp_path)]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'plan.png'}\n") and (tmp_path / "plan.png").is_file()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        neo_main(["chart", str(tmp_path / "empty")])
    assert "empty is a folder without a plan.json; give a run's folder or its plan.json." in capsys.readouterr().err
    (tmp_path / "charts").mkdir()  # a folder: plan.png in it (it wrote charts.png beside it)
    for out, written in (("charts", "charts/plan.png"), ("new/", "new/plan.png"), ("y.", "y.png")):
        assert neo_main(["chart", str(tmp_path / "plan.json"), "--out", f"{tmp_path}/{out}"]) == 0
        assert capsys.readouterr().out.endswith(f"wrote {tmp_path / written}\n") and (tmp_path / written).is_file()


def test_neo_chart_of_a_sweeps_folder_points_to_its_jobs_plans_and_the_sweeps_chart(tmp_path: Path, capsys) -> None:
    # `neo chart multirun/<sweep>` said only "a folder without a plan.json"
    from neo_core.cli import main as neo_main

    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)  # a job that failed: no plan
    (sweep / "0" / "error.txt").write_text("the job's error\n")
    (sweep / "summary.csv").write_text("job,overrides,folder,status\n")

    def said() -> str:
        with pytest.raises(SystemExit):
            neo_main(["chart", str(sweep)])
        return capsys.readouterr().err

    assert (f"{sweep} is a sweep's folder, without a plan.json of its own: no job of it wrote a plan.json "
            "(summary.csv says why).") in said()
    for job in ("2", "10"):  # the first job with a plan named, by number
        (sweep / job).mkdir()
        (sweep / job / "plan.json").write_text("{}")
    assert (f"{sweep} is a sweep's folder, without a plan.json of its own: each job's plan is in its numbered "
            f"folder (neo chart {sweep / '2'}).") in said()
    (sweep / "summary.png").write_bytes(b"")
    assert (f"{sweep} is a sweep's folder, without a plan.json of its own: each job's plan is in its numbered "
            f"folder (neo chart {sweep / '2'}); the sweep's own chart is {sweep / 'summary.png'}.") in said()


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda d: d["tables"][0].update(sharding_type="diagonal"),
         "table 't0' has sharding_type 'diagonal'; it must be one of data_parallel, table_wise,"),
        (lambda d: d["tables"][1].update(ranks="0-63"), "table 't1' has ranks '0-63'; it must be a list of rank numbers"),
        (lambda d: d["ranks"][3]["time_s"].update(comm_fwd="x"), "rank 3 has time_s {"),
        (lambda d: d["ranks"][2].update(memory_bytes=None), "rank 2 has memory_bytes None; it must be a mapping"),
    ],
    ids=["type", "ranks", "time", "memory"],
)
def test_an_edited_plan_is_named_by_its_field_not_failed_inside_the_chart(tmp_path: Path, capsys, edit, said) -> None:
    # each failed inside format_text or the chart with a Python error
    import json

    from neo_core.api import plan_tables
    from neo_core.cli import main as neo_main
    from neo_core.sharding import TableSpec

    plan = plan_tables([TableSpec(f"t{i}", 1000 * (i + 1), 16, 2.0) for i in range(4)], {"name": "zionex", "num_nodes": 1}, 64)
    data = plan.to_dict()
    edit(data)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        neo_main(["chart", str(tmp_path / "plan.json")])
    err = capsys.readouterr().err
    assert said in err and "Was the file edited? Plan again, or mend that field." in err and "Traceback" not in err, err


def test_a_plan_that_could_not_run_is_drawn_with_a_warning_and_one_that_is_no_plan_is_refused(
        tmp_path: Path, capsys) -> None:
    import json

    from neo_core.api import plan_tables
    from neo_core.cli import main as neo_main
    from neo_core.sharding import TableSpec

    plan = plan_tables([TableSpec(f"t{i}", 1000 * (i + 1), 16, 2.0) for i in range(4)], {"name": "zionex", "num_nodes": 1}, 64)
    plan.save_json(tmp_path / "plan.json")
    assert neo_main(["chart", str(tmp_path / "plan.json")]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err, err  # a plan as written: nothing to say
    assert out.splitlines()[1].startswith("  for zionex: 1 node(s) x 8 cuda rank(s); device memory 40.0 GiB"), out
    data = plan.to_dict()
    data["ranks"][5]["memory_bytes"]["weights"] = 1e12  # over its 40 GiB: a what-if, drawn
    (tmp_path / "edited.json").write_text(json.dumps(data))
    drawn = (tmp_path / "plan.png").stat().st_mtime_ns
    assert neo_main(["chart", str(tmp_path / "edited.json")]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"cannot run as written: it fills rank 5's memory with 93\d\.\dGiB of 40\.0GiB\.", err), err
    assert re.search(r" -89\d\.\dGiB ", out), out  # its free memory, readable
    # the copy's chart is its own: the run's plan.png is left as it was
    assert out.endswith(f"wrote {tmp_path / 'edited.png'}\n") and (tmp_path / "plan.png").stat().st_mtime_ns == drawn
    # a rank the plan does not have is no plan: refused (it was drawn with a warning), nothing drawn
    data["tables"][0]["ranks"] = [999]
    (tmp_path / "edited.json").write_text(json.dumps(data))
    (tmp_path / "edited.png").unlink()
    with pytest.raises(SystemExit):
        neo_main(["chart", str(tmp_path / "edited.json")])
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'edited.json'}: table 't0' is on rank 999, outside the plan's ranks 0-7." in err, err
    assert "wrote" not in out and not (tmp_path / "edited.png").exists()


def test_a_cached_plan_whose_rank_holds_more_than_its_host_share_is_not_called_unrunnable(
        tmp_path: Path, capsys) -> None:
    # host memory is a node's: a rank of it may hold more than its even share; the check of a
    # saved plan held each rank to its share and warned of Neo's own plans
    import json

    from neo_core.api import plan_tables
    from neo_core.cli import main as neo_main
    from neo_core.sharding import TableSpec

    topo = {"name": "zionex", "num_nodes": 1, "device_memory_gib": 8, "host_memory_gib_per_node": 400}
    plan = plan_tables([TableSpec("big", 30_000_000, 512, 1.0), TableSpec("small", 1000, 16, 1.0)], topo, 64,
                       cache={"name": "lru", "load_factor": 0.05}, table_sharding_types={"big": ["TW"]})
    rank = max(plan.ranks, key=lambda r: sum(r.host_memory.values()))
    assert sum(rank.host_memory.values()) > rank.host_memory_capacity  # over its share, within its node's
    plan.save_json(tmp_path / "plan.json")
    assert neo_main(["chart", str(tmp_path / "plan.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    # a plan.json written before plans kept their tables' specs: said so, its memory still checked
    data = plan.to_dict()
    for table in data["tables"]:
        table.pop("spec")
    data["ranks"][3]["memory_bytes"]["weights"] = 1e12
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert neo_main(["chart", str(tmp_path / "old.json")]) == 0
    err = capsys.readouterr().err
    assert "was written before plan.json kept each table's spec: its ranks and memory are checked" in err, err
    assert "cannot run as written: it fills rank 3's memory with" in err and "no spec" not in err, err


def test_the_yaml_check_reads_what_hydra_composes_and_names_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    from neo_core.cli import check_yaml_files
    from neo_core.errors import ConfigError
    from tests.conftest import ROOT

    conf = ROOT / "conf"
    mine = tmp_path / "mine"
    (mine / "plan_model").mkdir(parents=True)
    (mine / ".github").mkdir()
    (mine / ".github" / "ci.yaml").write_text("a: 1\n---\nb: 2\n")  # two documents: not Hydra's, not read
    (mine / "notes").mkdir()
    (mine / "notes" / "x.yaml").write_text("a: [1\n")  # no config group of the recipes: not read
    check_yaml_files(conf, ["--config-dir", str(mine)])
    (mine / "plan_model" / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.yaml: not UTF-8 text \(byte 0xe9 at 9\); save it as UTF-8"):
        check_yaml_files(conf, ["--config-dir", str(mine)])


def test_a_chart_of_many_ranks_draws_the_slowest_and_the_fullest_with_fixed_colours(tmp_path: Path) -> None:
    # past 128 ranks it drew the first 128, where the text names the slowest and the fullest; and a
    # kind's colour depended on which kinds a plan had
    from matplotlib import pyplot as plt

    from neo_core.sharding import PlanResult, RankReport
    from neo_plugins.sharding.planner import report

    ranks = [RankReport(r, memory={"weights": 1.0}, memory_capacity=10.0, time={"comm_bwd": 1e-3 * (r % 7)})
             for r in range(300)]
    ranks[5].memory["weights"] = 9.0  # the fullest, not among the slowest
    plan = PlanResult(planner="neo", tables=[], ranks=ranks, batch_size_per_rank=1, topology={})
    slowest = [r for r in range(300) if r % 7 == 6][:19]
    assert [r.rank for r in report.chart_ranks(plan, 20)] == sorted([*slowest, 5])
    assert len(report.chart_ranks(plan, 300)) == 300
    with pytest.raises(ConfigError, match="max_ranks=0: a chart draws at least 1 rank"):
        report.chart_ranks(plan, 0)
    ranks[6].memory["weights"] = 9.5  # the fullest among the slowest: as many ranks drawn
    assert [r.rank for r in report.chart_ranks(plan, 20)] == [r for r in range(300) if r % 7 == 6][:20]
    ranks[6].memory["weights"] = 1.0
    drawn = []
    real = plt.Axes.bar

    def spy(ax, x, height, *args, **kwargs):
        drawn.append((len(x), kwargs.get("label"), kwargs.get("color")))
        return real(ax, x, height, *args, **kwargs)

    try:
        plt.Axes.bar = spy
        report.save_chart(plan, tmp_path / "c.png", max_ranks=20)
        ranks[6].time = {"compute_fwd": 1e-3, "comm_bwd": 6e-3}  # another kind in the plan: the same colour
        report.save_chart(plan, tmp_path / "d.png", max_ranks=20)
    finally:
        plt.Axes.bar = real
    assert [d for d in drawn if d[1] == "comm_bwd"] == [(20, "comm_bwd", "tab:pink")] * 2
    assert (20, "compute_fwd", "tab:blue") in drawn


def test_hydras_launch_lines_show_the_overrides_as_typed(capsys) -> None:
    # they showed the ++ the recipes add and a swept boolean as Python writes it (True)
    import logging

    from neo_core.cli import as_typed, launch_lines_as_typed

    assert [as_typed(o) for o in ("++trainer.checkpoint=True", "+topology=zionex", "seed=False1", "~cache")] == [
        "trainer.checkpoint=true", "+topology=zionex", "seed=False1", "~cache"]
    launch_lines_as_typed()
    launch_lines_as_typed()  # once only
    launcher = logging.getLogger("hydra._internal.core_plugins.basic_launcher")
    assert len(launcher.filters) == 1
    record = logging.LogRecord(launcher.name, logging.INFO, __file__, 1, "\t#%d : %s", (3, "++seed=1 a=False"), None)
    launcher.filters[0].filter(record)
    assert record.getMessage() == "\t#3 : seed=1 a=false"
    # the line before a failed job's traceback showed them as the recipe passed them
    from hydra.core.utils import JobReturn, JobStatus

    failed = JobReturn(overrides=["+topology=zionex", "++sharding.fail=True"], status=JobStatus.FAILED)
    failed.return_value = KeyError("boom")
    with pytest.raises(KeyError):
        failed.return_value  # noqa: B018 - Hydra reads it so
    assert capsys.readouterr().err.startswith(
        "Error executing job with overrides: ['+topology=zionex', 'sharding.fail=true']")
    done = JobReturn(overrides=["a=1"], status=JobStatus.COMPLETED)
    done.return_value = 0.5
    assert done.return_value == 0.5


def test_a_sweeps_note_on_its_results_follows_them(tmp_path: Path, capsys) -> None:
    # the note that a planning sweep's times come from two models came before the results it is about
    sweep = SweepFailures(lambda m: {"step": (m, ".1f", "ms")})
    for num in range(2):
        sweep.finished(num, f"sharding={('neo', 'torchrec')[num]}", tmp_path / str(num), 1.0 + num)
    with pytest.raises(SystemExit) as done:
        sweep.exit(lambda: "note: two scales")
    assert done.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sweep results") and out[-1] == "note: two scales"


def test_neo_plugins_lists_the_built_ins_beside_a_name_registered_twice(tmp_path, monkeypatch, capsys) -> None:
    # the clash stopped the listing a user would reach for to find it
    from neo_core.cli import main as neo_main
    from neo_core.plugins import reset_plugins
    from tests.test_plugins import _entry_point_plugin

    _entry_point_plugin(tmp_path, "clash", "from neo_core import hookimpl\nfrom neo_core.cache import CachePolicy\n"
                        "@hookimpl\ndef neo_register_cache_policies(registry):\n"
                        "    registry.register('lru', lambda: CachePolicy('lru'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_plugins(None)
    try:
        assert neo_main(["plugins"]) == 1
    finally:
        reset_plugins(None)
    said = capsys.readouterr()
    assert said.err.startswith("error: cache policy plugin 'lru' is registered twice (neo-dlrm and clash); rename one")
    assert "  lru            [neo-dlrm]" in said.out and "sharder (config group 'sharding'):" in said.out
    assert said.out.endswith("(the built-in plugins only: a plugin name is registered twice, see the error above)\n")


def test_a_config_dir_option_that_is_never_read_or_replaces_a_plugins_is_warned_of(tmp_path: Path) -> None:
    # a --config-dir cache/lru.yaml was silently ignored (the recipes' own comes first), and one
    # named as a plugin's option silently replaced it
    from neo_core import hookimpl
    from neo_core.cache import CachePolicy
    from neo_core.cli import config_dir_shadows
    from neo_core.plugins import load_plugins

    class Clock:
        __name__ = "clock_plugin"
        __neo_provider__ = "clock-dist"

        @hookimpl
        def neo_register_cache_policies(self, registry):
            registry.register("clock", lambda load_factor=0.1: CachePolicy("clock", load_factor),
                              options={"clock_small": {"load_factor": 0.05}})

    plugins = load_plugins(extra=[Clock()], autoload=False)
    mine = tmp_path / "mine"
    (mine / "cache").mkdir(parents=True)
    for name in ("lru", "clock_small", "mine"):
        (mine / "cache" / f"{name}.yaml").write_text("name: lru\nload_factor: 0.7\n")
    conf = ROOT / "conf"
    said = config_dir_shadows(conf, ["--config-dir", str(mine), "cache=lru"], plugins)
    assert said == [
        f"warning: {mine / 'cache' / 'clock_small.yaml'} replaces the option cache=clock_small of the cache policy "
        "plugin 'clock' (clock-dist); give it another name to keep both.",
        f"warning: {mine / 'cache' / 'lru.yaml'} is never read: the recipes' {conf / 'cache' / 'lru.yaml'} comes "
        "first in Hydra's search path, so cache=lru selects that one; give yours another name (e.g. lru_mine.yaml, "
        "selected with cache=lru_mine).",
    ]
    assert config_dir_shadows(conf, ["cache=lru"], plugins) == []  # no config dir: nothing to say


def test_an_unknown_option_says_when_installed_plugins_are_not_loaded(monkeypatch) -> None:
    # an installed plugin's option (cache=warm_lfu) was "Unknown" with no word of the switch
    monkeypatch.setenv("NEO_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(ConfigError, match=r"NEO_DISABLE_PLUGIN_AUTOLOAD is set: installed plugins are not loaded"):
        check_group_options(["cache=warm_lfu"], ROOT / "conf", ("cache",))
    monkeypatch.setenv("NEO_PLUGINS", "neo_no_such_module")  # named modules are still loaded: the note says so
    with pytest.raises(ConfigError, match=r"only the built-ins and NEO_PLUGINS' neo_no_such_module\.\)"):
        check_group_options(["cache=warm_lfu"], ROOT / "conf", ("cache",))
    monkeypatch.delenv("NEO_PLUGINS")
    monkeypatch.delenv("NEO_DISABLE_PLUGIN_AUTOLOAD")
    with pytest.raises(ConfigError) as err:
        check_group_options(["cache=warm_lfu"], ROOT / "conf", ("cache",))
    assert "NEO_DISABLE_PLUGIN_AUTOLOAD" not in str(err.value)


def test_a_stopped_sweep_lists_the_results_so_far(tmp_path: Path, capsys) -> None:
    # a Ctrl-C in a sweep left no summary of the jobs that had finished
    import csv

    sweep = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    for num, auc in enumerate((0.61, 0.72)):
        (tmp_path / str(num)).mkdir()
        sweep.job(lambda auc=auc: auc, tmp_path / str(num), num, f"seed={num} trainer=smoke")
    sweep._seen(2, tmp_path / "2")  # the job a Ctrl-C stopped, as it was running
    sweep.started[2] = "seed=2 trainer=smoke"
    sweep.summary(stopped=2)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"sweep results so far, the sweep stopped at job #2 ({tmp_path / 'summary.csv'}):"
    assert out[1:] == ["  #0 seed=0: val AUC 0.6100", "  #1 seed=1: val AUC 0.7200",
                       "  #2 seed=2: stopped by the Ctrl-C (its checkpoint, if any, is in its folder)",
                       f"chart: {tmp_path / 'summary.png'}"]
    rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert [(r[0], r[3]) for r in rows] == [("job", "status"), ("0", "done"), ("1", "done"), ("2", "stopped")]
    # one job finished before the stop: named by what differs from the stopped one (it was "(the
    # sweep's settings)", the stopped job left out)
    one = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    one.job(lambda: 0.61, tmp_path / "0", 0, "compression=none trainer=smoke")
    one._seen(1, tmp_path / "1")
    one.started[1] = "compression=fp16 trainer=smoke"
    one.summary(stopped=1)
    assert capsys.readouterr().out.splitlines()[1:3] == [
        "  #0 compression=none: val AUC 0.6100",
        "  #1 compression=fp16: stopped by the Ctrl-C (its checkpoint, if any, is in its folder)"]
    # the first job stopped: the summary says so (none was written)
    first = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    first.sweep_dir = tmp_path / "first"
    first.sweep_dir.mkdir()
    first._seen(0, first.sweep_dir / "0")
    first.started[0] = "compression=none"
    first.summary(stopped=0)
    assert "#0 compression=none: stopped by the Ctrl-C" in capsys.readouterr().out
    assert (first.sweep_dir / "summary.csv").is_file()


def test_a_second_sweep_in_one_process_lists_only_its_own_jobs_as_not_run(tmp_path: Path, capsys, monkeypatch) -> None:
    # the jobs Hydra was about to launch were kept across sweeps: a second sweep in the process
    # (the recipes called from Python, one after another) stopped by a Ctrl-C listed the first
    # sweep's later jobs as its own, not run
    from neo_core import cli

    monkeypatch.setattr(cli, "SWEEP_JOBS", {})
    monkeypatch.setenv("NEO_SKIP_SWEEP_CHECK", "1")  # the jobs' configs are not composed here

    class Sweeper:  # as Hydra's BasicSweeper holds its batches, each sweep a sweeper of its own
        def __init__(self, *batches: list[list[str]]) -> None:
            self.overrides = list(batches)

    first = [[f"seed={n}", "trainer=smoke"] for n in range(4)]
    cli._check_batch(Sweeper(first), first)
    assert cli.SWEEP_JOBS == {n: f"seed={n} trainer=smoke" for n in range(4)}
    second = [["cache=lru", "trainer=smoke"], ["cache=lfu", "trainer=smoke"]]
    cli._check_batch(Sweeper(second), second)
    assert cli.SWEEP_JOBS == {0: "cache=lru trainer=smoke", 1: "cache=lfu trainer=smoke"}
    sweep = SweepFailures(lambda m: {"val AUC": (m, ".4f")})
    sweep._seen(0, tmp_path / "0")  # the job a Ctrl-C stopped, as it was running
    sweep.started[0] = "cache=lru trainer=smoke"
    sweep.summary(stopped=0)
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  #0 cache=lru: stopped by the Ctrl-C (its checkpoint, if any, is in its folder)",
        "  #1 cache=lfu: not run (the sweep was stopped before it)"]  # not the first sweep's #2 and #3
    # a later batch of one sweep (a sweeper that makes its batches as it goes) adds to its jobs
    later = [["cache=lfu", "trainer=smoke", "seed=1"]]
    sweeper = Sweeper()
    cli._check_batch(sweeper, second)
    cli._check_batch(sweeper, later)
    assert cli.SWEEP_JOBS == {0: "cache=lru trainer=smoke", 1: "cache=lfu trainer=smoke",
                              2: "cache=lfu trainer=smoke seed=1"}


def test_a_setting_given_twice_is_noted_with_the_value_used() -> None:
    from neo_core.cli import repeated_settings

    assert repeated_settings(["trainer.batch_size=64", "seed=1", "+trainer.batch_size=32", "-m"]) == [
        "note: trainer.batch_size is given 2 times (64, 32): 32 is used"]
    assert repeated_settings(["trainer.batch_size=64", "kernel=dense", "--config-dir=x"]) == []


def test_a_charts_title_says_whose_model_gave_its_times(tmp_path: Path) -> None:
    # two planners' charts side by side (neo, torchrec) read as one scale: the title says which
    from matplotlib.figure import Figure

    from neo_core.sharding import PlanResult, RankReport
    from neo_plugins.sharding.planner import report

    titles = []
    real = Figure.suptitle

    def spy(fig, text, *args, **kwargs):
        titles.append(text)
        return real(fig, text, *args, **kwargs)

    ranks = [RankReport(r, memory={"weights": 1.0}, memory_capacity=10.0, time={"comm_bwd": 1e-3}) for r in range(4)]
    cluster = {"name": "zionex", "num_nodes": 1, "devices_per_node": 8, "compute_device": "cuda",
               "device_memory": 40 * 2**30, "host_memory": 192 * 2**30, "intra_node_bw": 300e9, "inter_node_bw": 25e9}
    try:
        Figure.suptitle = spy
        for source in ("TorchRec's estimator", ""):
            plan = PlanResult(planner="torchrec", tables=[], ranks=ranks, batch_size_per_rank=1, topology={},
                              times_from=source)
            report.save_chart(plan, tmp_path / "c.png")
        # a narrow chart (few ranks): the cluster's line is wrapped, not cut off at both ends
        plan = PlanResult(planner="neo", tables=[], ranks=ranks, batch_size_per_rank=1, topology=cluster)
        report.save_chart(plan, tmp_path / "c.png")
    finally:
        Figure.suptitle = real
    lines = titles.pop().splitlines()
    assert " ".join(lines[1:]) == plan.topology_summary() and len(lines) > 2
    assert max(map(len, lines)) <= 6 * 13
    assert titles == ["torchrec: 4 ranks, step 1.000 ms (TorchRec's estimator), imbalance 1.00",
                      "torchrec: 4 ranks, step 1.000 ms, imbalance 1.00"]
