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
