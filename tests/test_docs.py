"""Meta-tests that keep the documentation honest: every hook is documented and tested."""

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
