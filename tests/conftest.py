"""Shared test helpers: a temporary-plugin fixture and the installed third-party fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from neo_core.plugins import Plugins, load_plugins, reset_plugins

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PLUGIN_FIXTURES = ("neo_example_plugin", "neo_broken_plugin")
NEO_SWITCHES = ("NEO_STRICT_PLUGINS", "NEO_DISABLE_PLUGIN_AUTOLOAD", "NEO_TRACEBACK")

# Tests plan with the local topology's documented defaults, not whatever a user's earlier
# `neo calibrate` left in ~/.cache/neo: point the calibration at a file that does not exist.
os.environ["NEO_CALIBRATION"] = str(ROOT / "tests" / "no-calibration.json")


@pytest.fixture
def register_plugin() -> Iterator[Callable[..., Plugins]]:
    """Install temporary plugins as the process-wide manager; the global one is reset afterwards.

    ``register_plugin(obj, ...)`` loads the built-ins plus ``obj`` (a module or object with
    ``@hookimpl`` functions), makes the result what ``get_plugins()`` returns, and returns it.
    """

    def register(*plugins: Any, **kwargs: Any) -> Plugins:
        kwargs.setdefault("autoload", False)
        loaded = load_plugins(extra=plugins, **kwargs)
        reset_plugins(loaded)
        return loaded

    reset_plugins(None)
    yield register
    reset_plugins(None)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """pip-install each fixture distribution into its own folder (once per session).

    Entry points are read from the ``*.dist-info`` folders on ``sys.path``, so putting a folder
    on ``PYTHONPATH`` (or ``sys.path``) makes its plugin discoverable; the venv stays untouched.
    Returns fixture name -> install folder.
    """
    base = tmp_path_factory.mktemp("plugin_site")
    procs = {}
    for name in PLUGIN_FIXTURES:
        source = base / "src" / name  # build from a copy: setuptools writes build/ beside the sources
        shutil.copytree(FIXTURES / name, source)
        target = base / name
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
               "--no-compile", "--disable-pip-version-check", "--target", str(target), str(source)]
        procs[name] = (target, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    sites = {}
    for name, (target, proc) in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"pip install of {name} failed:\n{output}"
        sites[name] = target
    return sites


def subprocess_env(*paths: Path, **extra: str) -> dict[str, str]:
    """This environment with ``paths`` on PYTHONPATH and Neo's switches cleared (``extra`` set)."""
    env = {k: v for k, v in os.environ.items() if k not in NEO_SWITCHES}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env
