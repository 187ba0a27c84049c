"""The plugin manager: loads built-in and third-party plugins and fills the registries.

Built-in plugins are ordinary plugins listed in the ``neo`` entry-point group of this
distribution. ``NEO_PLUGINS=<module>[,...]`` loads plugin modules by import path, without
installing them. ``NEO_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points and loads only the
built-ins (imported directly) and the modules ``NEO_PLUGINS`` names, which are asked for by
name; ``NEO_STRICT_PLUGINS=1`` turns a plugin that fails to load into
an error instead of a warning.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from neo_core import hookspecs
from neo_core.errors import PluginClash, PluginError
from neo_core.registry import BUILTIN, Registry, _raised_at

# kind -> (hook name, config group)
KINDS: dict[str, tuple[str, str]] = {
    "topology": ("neo_register_topologies", "topology"),
    "sharder": ("neo_register_sharders", "sharding"),
    "kernel": ("neo_register_kernels", "kernel"),
    "cache policy": ("neo_register_cache_policies", "cache"),
    "compressor": ("neo_register_compressors", "compression"),
    "model": ("neo_register_models", "model"),
    "dataset": ("neo_register_datasets", "data"),
}

DEFAULT_PLUGINS: tuple[str, ...] = (
    "neo_plugins.topology",
    "neo_plugins.sharding",
    "neo_plugins.kernels",
    "neo_plugins.cache",
    "neo_plugins.compression",
    "neo_plugins.models",
    "neo_plugins.data",
)

BUILTIN_DISTRIBUTION = BUILTIN


def result_types() -> dict[str, type]:
    """kind -> the class every factory of that kind must return (README, 'Writing a plugin')."""
    from neo_core.cache import CachePolicy
    from neo_core.compression import Compressor
    from neo_core.data import DataSource
    from neo_core.kernels import EmbeddingKernel
    from neo_core.models import ModelBuilder
    from neo_core.sharding import Planner
    from neo_core.topology import Topology

    return {
        "topology": Topology,
        "sharder": Planner,
        "kernel": EmbeddingKernel,
        "cache policy": CachePolicy,
        "compressor": Compressor,
        "model": ModelBuilder,
        "dataset": DataSource,
    }


class PluginLoadWarning(UserWarning):
    """A plugin failed to load and was skipped."""


# The skip is printed on stderr once by the loader; the warning is for programs that catch it.
warnings.filterwarnings("ignore", category=PluginLoadWarning)


# the environment that chooses which plugins load (load_plugins): a command printed to be run
# again carries it (neo_core.cli.plugin_env_prefix)
PLUGIN_ENV = ("NEO_PLUGINS", "NEO_DISABLE_PLUGIN_AUTOLOAD", "NEO_STRICT_PLUGINS")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Plugins:
    """A loaded plugin manager with one registry per kind; the only way callers reach hooks."""

    pm: pluggy.PluginManager
    registries: dict[str, Registry[Any]]
    failed: dict[str, str] = field(default_factory=dict)  # plugin name -> error

    def registry(self, group: str) -> Registry[Any]:
        """The registry selected by config group ``group`` (e.g. "topology", "sharding")."""
        for reg in self.registries.values():
            if reg.group == group:
                return reg
        raise PluginError(f"Unknown plugin group {group!r}; groups: {', '.join(self.groups())}.")

    def groups(self) -> list[str]:
        return [reg.group for reg in self.registries.values()]

    def create(self, group: str, name: str, params: dict[str, Any] | None = None) -> Any:
        return self.registry(group).create(name, params)


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _register_module(
    pm: pluggy.PluginManager, module: Any, name: str, provider: str, providers: dict[str, str]
) -> None:
    if pm.is_registered(module):
        return
    if pm.has_plugin(name):  # a different plugin under a taken name would be dropped silently
        raise PluginClash(
            f"Two Neo plugins are named {name!r} ({providers.get(name, 'unknown')} and {provider}); "
            "rename one (its entry point or __name__)."
        )
    pm.register(module, name=name)
    providers[name] = provider


def _invalid_hook(exc: BaseException) -> str:
    """pluggy's complaint about a hook's arguments, in Neo's words."""
    import re

    text = str(exc)
    hook = next((h for h, _ in KINDS.values() if h in text), None)
    found = re.search(r"Argument\(s\) \{(.*?)\}", text)
    if not found:  # another misuse (a wrapper, a historic hook): pluggy's own words
        return text.strip().splitlines()[-1]
    return (f"{'its ' + hook if hook else 'a hook'} takes {found.group(1).replace(chr(39), '')}, which Neo does not "
            "pass; Neo's hooks take one argument, registry")


def _load_plugin(
    pm: pluggy.PluginManager, load: Callable[[], Any], name: str, provider: str, providers: dict[str, str],
    failed: dict[str, str], strict: bool, import_hint: str | None = None,
) -> None:
    """Import a third-party plugin module (``load``) and register it as ``name``; a module that
    fails to import, has a hook whose signature is not Neo's, or implements no Neo hook is
    reported by name and skipped (``import_hint``: the import failure's message, ``{}`` the
    error)."""
    try:
        module = load()
    except Exception as exc:  # a broken third-party plugin must not stop Neo
        if import_hint is not None:
            exc = PluginError(import_hint.format(f"{type(exc).__name__}: {exc}"))
        _report_failure(name, exc, failed, strict)
        return
    try:  # a hook whose signature is not Neo's (pluggy's PluginValidationError)
        _register_module(pm, module, name, provider, providers)
    except pluggy.PluginValidationError as exc:
        _report_failure(name, PluginError(_invalid_hook(exc)), failed, strict)
        return
    if not pm.get_hookcallers(module):  # loads, yet gives Neo nothing
        named = sorted(n for n in dir(module) if n.startswith("neo_register_") and callable(getattr(module, n)))
        said = (f" ({', '.join(named)} without @neo_core.hookimpl?)" if named else "")
        _report_failure(name, PluginError(f"it implements no Neo hook{said}"), failed, strict)


def _report_failure(name: str, exc: BaseException, failed: dict[str, str], strict: bool) -> None:
    message = f"Neo plugin {name!r} failed to load and was skipped: {type(exc).__name__}: {exc}"
    if strict:
        raise PluginError(
            f"Neo plugin {name!r} failed to load ({type(exc).__name__}: {exc}); "
            "unset NEO_STRICT_PLUGINS to skip it."
        ) from exc
    failed[name] = f"{type(exc).__name__}: {exc}"
    warnings.warn(message, PluginLoadWarning, stacklevel=3)
    if not _reported_elsewhere():
        print(f"warning: {message}", file=sys.stderr)


# set in the ranks a training run spawns: their parent loaded the same plugins and said so
QUIET_ENV = "NEO_PLUGIN_WARNINGS_SHOWN"


def _reported_elsewhere() -> bool:
    """A skipped plugin is said once per run: by the process that spawned the ranks, or by
    rank 0 of ranks launched by torchrun."""
    return bool(os.environ.get(QUIET_ENV)) or os.environ.get("RANK", "0") != "0"


_MIXED: list[str] = []  # the warning of built-ins from another checkout, once per process


def _check_one_checkout() -> None:
    """Warn where Neo's code comes from more than one checkout, or from another than the script
    run (``recipes/train.py`` of a checkout): an editable install maps ``neo_core`` and
    ``neo_plugins`` to the checkout it was installed from, so a second checkout run with the
    first one's environment ran the first one's code (all of it from its recipes, its plugins
    beside its own core under ``python -m`` or ``PYTHONPATH``), with the second one's ``conf/``,
    and an edit there changed nothing."""
    import neo_core
    import neo_plugins

    if _MIXED or os.environ.get("RANK", "0") != "0":
        return
    core = Path(neo_core.__file__).resolve().parent.parent
    home = Path(neo_plugins.__file__).resolve().parent.parent
    script = Path(sys.argv[0]).resolve().parent.parent if sys.argv and sys.argv[0] else None
    if script is not None and not ((script / "neo_core").is_dir() and (script / "conf").is_dir()):
        script = None  # not a script of a checkout (pytest, a notebook, an installed command)
    fix = ("Use this checkout's own environment (make setup here), or install it into this one "
           f"(pip install -e {script or core}).")
    if home != core:
        said = f"Neo's core comes from {core} but its built-in plugins (neo_plugins) from {home}"
    elif script is not None and script != core:
        said = f"{Path(sys.argv[0]).name} is {script}'s, but Neo's code (neo_core, neo_plugins) comes from {core}"
    else:
        return
    _MIXED.append(said)
    print(f"warning: {said}: two checkouts mixed, as an environment installed editable from the other one "
          f"gives (edits here do not run). {fix}", file=sys.stderr)


def load_plugins(
    extra: Iterable[Any] = (),
    *,
    autoload: bool | None = None,
    strict: bool | None = None,
) -> Plugins:
    """Build a plugin manager: built-ins, entry points (unless disabled) and ``extra`` plugins."""
    autoload = not _env_flag("NEO_DISABLE_PLUGIN_AUTOLOAD") if autoload is None else autoload
    strict = _env_flag("NEO_STRICT_PLUGINS") if strict is None else strict
    pm = _new_manager()
    failed: dict[str, str] = {}
    providers: dict[str, str] = {}

    if autoload:
        for ep in importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "unknown"
            _load_plugin(pm, ep.load, ep.name, dist, providers, failed, strict)
    # plugin modules named in NEO_PLUGINS (comma-separated import paths, found on sys.path /
    # PYTHONPATH): a plugin tried without installing it, under its module's name
    for module_name in (m.strip() for m in os.environ.get("NEO_PLUGINS", "").split(",")):
        if module_name:
            _load_plugin(
                pm, functools.partial(importlib.import_module, module_name), module_name,
                f"NEO_PLUGINS {module_name}", providers, failed, strict,
                import_hint=f"NEO_PLUGINS names module {module_name!r}, which failed to import "
                            "({}); give its import path, with its folder on PYTHONPATH",
            )
    for module_name in DEFAULT_PLUGINS:  # built-ins not reached through entry points
        if pm.has_plugin(module_name) or any(
            getattr(p, "__name__", None) == module_name for p in pm.get_plugins()
        ):
            continue
        module = importlib.import_module(module_name)
        _register_module(pm, module, module_name, BUILTIN_DISTRIBUTION, providers)
    _check_one_checkout()
    for plugin in extra:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        _register_module(pm, plugin, name, getattr(plugin, "__neo_provider__", name), providers)

    unknown: dict[str, list[str]] = {}  # plugin -> hooks it implements that Neo does not have
    for hook_name, hook_caller in list(vars(pm.hook).items()):
        if isinstance(hook_caller, pluggy.HookCaller) and not hook_caller.has_spec():
            for impl in hook_caller.get_hookimpls():
                unknown.setdefault(impl.plugin_name, []).append(hook_name)
    valid = [h for h, _ in KINDS.values()]
    for plugin_name, hooks in unknown.items():  # a misspelled hook: the plugin is skipped whole
        meant = [f"{h} -> {close[0]}" for h in hooks if (close := difflib.get_close_matches(h, valid, n=1))]
        exc = PluginError(
            f"Unknown hook implementation(s) {', '.join(f'{plugin_name}.{h}' for h in hooks)}; "
            + (f"did you mean {'; '.join(meant)}? " if meant else "")
            + f"valid hooks: {', '.join(valid)}"
        )
        _report_failure(plugin_name, exc, failed, strict)
        pm.unregister(name=plugin_name)
    pm.check_pending()

    registries: dict[str, Registry[Any]] = {}
    returns = result_types()
    for kind, (hook_name, group) in KINDS.items():
        registry: Registry[Any] = Registry(kind, group, returns.get(kind))
        hook = getattr(pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):
            plugin_name = impl.plugin_name
            if plugin_name in failed:  # a plugin that failed in another hook is skipped whole
                continue
            registry._set_provider(providers.get(plugin_name, plugin_name), plugin_name)
            before = len(registry)
            try:
                returned = impl.function(registry=registry)
            except PluginClash:  # two plugins want one name: which one is meant is the user's call
                raise
            except PluginError as exc:  # registry.register refused what it was given
                _report_failure(plugin_name, exc, failed, strict)
                continue
            except Exception as exc:
                _report_failure(plugin_name, PluginError(
                    f"its {hook_name} raised {type(exc).__name__}: {exc}{_raised_at(exc, hint=False)}"), failed, strict)
                continue
            if returned is not None and len(registry) == before:  # returned its plugins: none is registered
                _report_failure(plugin_name, PluginError(
                    f"its {hook_name} returned {type(returned).__name__} and registered nothing; a hook registers "
                    "with registry.register(name, factory) and returns nothing"), failed, strict)
        registries[kind] = registry
    for plugin_name in failed:  # and what it registered before failing goes too
        for registry in registries.values():
            registry.drop_plugin(plugin_name)
    return Plugins(pm=pm, registries=registries, failed=failed)


_lock = threading.Lock()
_plugins: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugin manager, loaded on first use."""
    global _plugins
    with _lock:
        if _plugins is None:
            bare = not logging.getLogger().handlers
            _plugins = load_plugins()
            if bare:
                _drop_implicit_root_handler()
        return _plugins


def _drop_implicit_root_handler() -> None:
    """FBGEMM logs through the root logger as it loads, which gives the root logger a stderr
    handler in logging's default format (``logging.basicConfig``): Hydra's ``--info`` then printed
    each line twice, once as ``DEBUG:hydra._internal.hydra:...``. That handler is removed."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if (type(handler) is logging.StreamHandler and handler.stream is sys.stderr and handler.formatter is not None
                and handler.formatter._fmt == logging.BASIC_FORMAT):
            root.removeHandler(handler)


def reset_plugins(plugins: Plugins | None = None) -> None:
    """Replace (or drop, with None) the process-wide plugin manager; used by tests."""
    global _plugins
    with _lock:
        _plugins = plugins
