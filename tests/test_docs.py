"""Meta-tests that keep the documentation honest: every hook is documented and tested, and the
Python examples of the docs run."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from neo_core import hookspecs
from neo_core.plugins import KINDS

ROOT = Path(__file__).resolve().parent.parent
HOOKS = sorted(name for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and name.startswith("neo_"))


def test_hooks_found() -> None:
    assert len(HOOKS) == len(KINDS) == 7


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_docstring_naming_its_config_group(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook))
    assert doc and len(doc.splitlines()[0]) > 10, f"{hook} has no docstring"
    group = next(g for h, g in KINDS.values() if h == hook)
    assert f"``{group}`` config group" in doc, f"{hook}'s docstring does not name config group {group!r}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_in_readme(hook: str) -> None:
    readme = ROOT / "README.md"
    assert readme.exists(), "README.md is missing"
    assert hook in readme.read_text(), f"README.md does not document hook {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_exercised_by_a_test(hook: str) -> None:
    tests = [p for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_docs.py"]
    assert any(hook in p.read_text() for p in tests), f"no test implements or calls {hook}"


def _python_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_the_python_examples_run(tmp_path, monkeypatch) -> None:
    # docs/planner.md: plan a table on ZionEX from Python, print and save the plan
    [planner] = _python_blocks(ROOT / "docs" / "planner.md")
    monkeypatch.chdir(tmp_path)
    exec(compile(planner, "docs/planner.md", "exec"), {})
    assert (tmp_path / "plan.json").stat().st_size > 100
    # README: a third-party cache plugin; its factory registers and builds what it says
    from neo_core.cache import CachePolicy
    from neo_core.registry import Registry

    [plugin] = _python_blocks(ROOT / "README.md")
    namespace: dict = {}
    exec(compile(plugin, "README.md", "exec"), namespace)
    registry = Registry("cache policy", "cache", CachePolicy)
    namespace["neo_register_cache_policies"](registry)
    assert registry.create("warm_lfu") == CachePolicy("warm_lfu", 0.3, "lfu")
    assert registry.create("warm_lfu", {"load_factor": 0.1}).load_factor == 0.1


def test_the_planners_options_are_documented_with_what_each_type_needs() -> None:
    # docs/planner.md gave TWCW as "(k <= L)", and the planner refused it on one node of 2 ranks
    import re

    from neo_core.api import make_context
    from neo_core.sharding import ShardingType, TableSpec
    from neo_core.topology import Topology
    from neo_plugins.sharding.planner.cost import CostModel, TableArrays
    from neo_plugins.sharding.planner.search import build_options

    text = " ".join((ROOT / "docs" / "planner.md").read_text().split())
    line = text.split("1. Options per table", 1)[1].split("each on device", 1)[0]
    said = {short: needs for short, needs in re.findall(r"\b([A-Z]{2,4})(?: x\{[\d,]+\})?(?: \(([^)]*)\))?", line)}
    assert set(said) == {t.short for t in ShardingType}, said
    # each condition the doc may state, as the shapes (N nodes of L ranks), shard count k and rows read it
    words = {
        "2 or more ranks": lambda N, L, k, rows: N * L >= 2,
        "2 or more nodes of 2 or more ranks": lambda N, L, k, rows: N >= 2 and L >= 2,
        "2 or more nodes": lambda N, L, k, rows: N >= 2,
        "k <= W": lambda N, L, k, rows: k <= N * L, "k <= L": lambda N, L, k, rows: k <= L,
        "k <= N": lambda N, L, k, rows: k <= N,
        "rows >= W": lambda N, L, k, rows: rows >= N * L, "rows >= L": lambda N, L, k, rows: rows >= L,
    }
    needs = {t: [words[w] for w in said[t.short].split(", ") if w] for t in ShardingType}  # KeyError: unread words
    for N in (1, 2, 3):
        for L in (1, 2, 4):
            topology = Topology("t", N, L, "cuda", 2**34, 2**34, 1e12, 1e11, 1e10, 1e11, 1e10)
            for rows in (3, 1000):
                arrays = TableArrays.from_specs([TableSpec("t", rows, 128)])  # 128 columns split into 2, 4 or 8
                options = build_options(CostModel(make_context(topology, 64)), arrays, set(ShardingType), (2, 4, 8), 16)
                for t in ShardingType:
                    for k in ((2, 4, 8) if t.short in ("CW", "TWCW", "GRID") else (1,)):
                        planned = any(o.sharding_type is t and o.k == k and o.valid[0] for o in options)
                        documented = all(need(N, L, k, rows) for need in needs[t])
                        assert planned == documented, (t.short, k, f"{N} x {L}", rows, said[t.short])


def test_every_setting_is_in_the_settings_reference() -> None:
    # keys that neo plugins listed but no document named (data.bias, topology.device_memory_bw_gbps, ...)
    import yaml

    from neo_core.plugins import load_plugins

    text = (ROOT / "docs" / "settings.md").read_text()
    missing = []
    for registry in load_plugins(autoload=False).registries.values():
        for entry in registry.entries():
            if f"`{entry.name}`" not in text:
                missing.append(f"{registry.group}={entry.name}")
            missing += [f"{registry.group}.{key}" for key in entry.parameters() if f"`{registry.group}.{key}`" not in text]
    conf = ROOT / "conf"
    for group in ("trainer", "plan_model"):
        for path in sorted((conf / group).glob("*.yaml")):
            missing += [f"{group}.{key}" for key in yaml.safe_load(path.read_text())
                        if key != "defaults" and f"`{group}.{key}`" not in text]
    for path in sorted((conf / "experiment").glob("*.yaml")):
        missing += [f"experiment={path.stem}"] if f"`{path.stem}`" not in text else []
    for recipe in ("train.yaml", "plan.yaml"):
        top = yaml.safe_load((conf / recipe).read_text())
        missing += [key for key, value in top.items()
                    if key not in ("defaults", "hydra") and not isinstance(value, dict) and f"`{key}`" not in text]
    assert not missing, f"docs/settings.md does not name: {', '.join(missing)}"
    assert "docs/settings.md" in (ROOT / "README.md").read_text()
