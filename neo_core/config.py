"""Configuration schemas and validation: a typo fails at start and names the key.

The Hydra tree has one group per plugin kind. Each group's node holds ``name`` (a registry
entry) plus that plugin's parameters, which are checked against the plugin factory's
signature. ``trainer`` is checked against :class:`TrainerConfig`, the root against
:class:`RunConfig`'s fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neo_core.checks import as_whole, is_number
from neo_core.errors import ConfigError, NeoError, PluginClash
from neo_core.plugins import KINDS, Plugins, get_plugins
from neo_core.registry import meanwhile, suggested_order

PLUGIN_GROUPS: tuple[str, ...] = tuple(group for _, group in KINDS.values())
DEFAULT_TOPOLOGY = "local"


@dataclass
class TrainerConfig:
    """How long and how to train; every field is a ``trainer.<key>`` override."""

    max_steps: int = 300
    batch_size: int = 256  # per rank
    dense_optimizer: str = "adagrad"  # adagrad | adam | sgd
    dense_learning_rate: float = 0.05
    val_batches: int = 20
    val_every_n_steps: int | None = None  # None: validate once, at the end
    log_every_n_steps: int = 10
    checkpoint: bool = True  # save a distributed checkpoint at the end
    checkpoint_every_n_steps: int | None = None
    resume: bool = False  # continue from the output folder's checkpoint
    progress_bar: bool = True
    world_size: int | None = None  # ranks to launch here; None: the local topology's
    backend: str | None = None  # gloo | nccl; None: nccl on CUDA, gloo on CPU
    threads_per_rank: int | None = None  # torch intra-op threads; None: cores / ranks


@dataclass
class RunConfig:
    """A validated run: plugin selections (name + parameters) and trainer settings."""

    topology: dict[str, Any]
    sharding: dict[str, Any]
    kernel: dict[str, Any]
    cache: dict[str, Any]
    compression: dict[str, Any]
    model: dict[str, Any]
    data: dict[str, Any]
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 0
    output_dir: str = "outputs/run"
    experiment: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _close(key: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(key, choices, n=1)
    return f" Did you mean {match[0]!r}?" if match else ""


def owner_hint(
    key: str, cfg: Mapping[str, Any], plugins: Plugins | None = None, trainer: bool = False,
    groups: Sequence[str] = PLUGIN_GROUPS,
) -> str:
    """" Did you mean <group>.<key>?" where a top-level ``key`` is a key of the plugin one of
    ``groups`` of ``cfg`` selects (``progress=false``: ``sharding.progress``), or (``trainer``)
    of the trainer; where it is a key of other plugins of a group, which; "" otherwise."""
    if trainer and key in {f.name for f in dataclasses.fields(TrainerConfig)}:
        return f" Did you mean trainer.{key}?"
    plugins = plugins or get_plugins()
    others: list[tuple[str, str]] = []
    for group in groups:
        node = cfg.get(group)
        name = node.get("name") if isinstance(node, Mapping) else node
        registry = plugins.registry(group)
        if isinstance(name, str) and name in registry and key in registry.get(name).parameters():
            return f" Did you mean {group}.{key}?"
        others += [(group, e.name) for e in registry.entries() if e.name != name and key in e.parameters()]
    if others:  # a key of a plugin not selected: cache.load_factor while cache=none
        group = others[0][0]
        names = suggested_order(group, [name for g, name in others if g == group])
        return (f" {group}.{key} is a key of {' and '.join(f'{group}={n}' for n in names)}: select one with it, "
                f"e.g. {group}={names[0]} {group}.{key}=<value>.")
    return ""


def _check_plugin_node(group: str, node: Any, plugins: Plugins) -> dict[str, Any]:
    if isinstance(node, str):
        node = {"name": node}
    if not isinstance(node, Mapping):
        raise ConfigError(f"Config group {group!r} must be a mapping with a 'name' key, got {node!r}.")
    node = dict(node)
    name = node.pop("name", None)
    registry = plugins.registry(group)
    if not name:
        raise ConfigError(
            f"{group}.name is missing; pick one of: {', '.join(registry.names())} "
            f"(e.g. {group}={registry.names()[0] if registry.names() else '<name>'})."
        )
    entry = registry.get(str(name))  # raises PluginError with choices
    if not entry.accepts_any_keyword():
        accepted = entry.parameters()
        for key in node:
            if key not in accepted:
                raise ConfigError(registry.unknown_key(str(name), key))
    return {"name": str(name), **node}


def _check_trainer(node: Any) -> TrainerConfig:
    """The trainer's keys and values, every problem named at once (:func:`raise_all`)."""
    node = dict(node or {})
    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    problems: list[NeoError] = []
    for key in list(node):
        if key not in fields:
            problems.append(ConfigError(
                f"Unknown key trainer.{key}.{_close(key, list(fields))} "
                f"Trainer keys: {', '.join(fields)}."
            ))
            del node[key]
    cfg = TrainerConfig(**node)
    whole: dict[str, int | None] = {}
    for key in ("max_steps", "batch_size", "val_batches", "log_every_n_steps"):
        value = getattr(cfg, key)
        least = 0 if key == "val_batches" else 1  # no validation: val_batches=0
        whole[key] = as_whole(value)
        if whole[key] is None or whole[key] < least:  # type: ignore[operator]
            what = "a whole number, 0 or more" if least == 0 else "a positive integer"
            problems.append(ConfigError(f"trainer.{key} must be {what}, got {value!r}."))
    if cfg.dense_optimizer not in ("adagrad", "adam", "sgd"):
        problems.append(ConfigError(
            f"trainer.dense_optimizer={cfg.dense_optimizer!r} is unknown; choose adagrad, adam or sgd."
        ))
    if cfg.backend not in (None, "gloo", "nccl"):
        problems.append(ConfigError(f"trainer.backend={cfg.backend!r} is unknown; choose gloo or nccl."))
    for key in ("world_size", "val_every_n_steps", "checkpoint_every_n_steps", "threads_per_rank"):
        value = getattr(cfg, key)  # each may be null: its default
        whole[key] = None if value is None else as_whole(value)
        if value is not None and (whole[key] is None or whole[key] < 1):  # type: ignore[operator]
            problems.append(ConfigError(
                f"trainer.{key} must be a whole number, at least 1 (or null), got {value!r}."))
    for key in ("checkpoint", "resume", "progress_bar"):
        if not isinstance(getattr(cfg, key), bool):
            problems.append(ConfigError(f"trainer.{key} must be true or false, got {getattr(cfg, key)!r}."))
    rate = cfg.dense_learning_rate
    if not is_number(rate) or not 0 < rate < math.inf:
        problems.append(ConfigError(f"trainer.dense_learning_rate must be a positive number, got {rate!r}."))
    raise_all(problems)
    return dataclasses.replace(cfg, **whole)  # 1e3 and 1000.0 are 1000


def _check_seed(seed: Any) -> int:
    whole = as_whole(seed)
    if whole is None or whole < 0:
        raise ConfigError(f"seed must be a whole number, 0 or more, got {seed!r}.")
    return whole


def validate(cfg: Mapping[str, Any], plugins: Plugins | None = None) -> RunConfig:
    """Check a composed config (plain dict or DictConfig) and return a :class:`RunConfig`."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    cfg = dict(cfg)
    plugins = plugins or get_plugins()
    allowed = [f.name for f in dataclasses.fields(RunConfig)]
    # every problem, not only the first: a command (or a sweep's job) with two bad settings
    # is then fixed in one go, not in as many runs
    problems: list[NeoError] = []
    for key in cfg:
        if key not in allowed and key != "hydra":
            hint = owner_hint(key, cfg, plugins, trainer=True) or _close(key, allowed)  # an exact key first
            problems.append(ConfigError(f"Unknown config key {key!r}.{hint} Top-level keys: {', '.join(allowed)}."))
    cfg.setdefault("topology", {"name": DEFAULT_TOPOLOGY})
    nodes = {}
    for group in PLUGIN_GROUPS:
        if group not in cfg or cfg[group] is None:
            problems.append(ConfigError(f"Config group {group!r} is missing; add {group}=<name> (see `neo plugins`)."))
            continue
        with noted(problems):
            nodes[group] = _check_plugin_node(group, cfg[group], plugins)
    with noted(problems):
        trainer = _check_trainer(cfg.get("trainer"))
    with noted(problems):
        seed = _check_seed(cfg.get("seed", 0))
    raise_all(problems)
    return RunConfig(
        **nodes,
        trainer=trainer,
        seed=seed,
        output_dir=str(cfg.get("output_dir", "outputs/run")),
        experiment=cfg.get("experiment"),
    )


@contextlib.contextmanager
def noted(problems: list[NeoError]) -> Iterator[None]:
    """Add a setting's error to ``problems`` instead of raising it (:func:`raise_all`)."""
    try:
        yield
    except NeoError as exc:  # several at once (raise_all) are counted one by one
        problems.extend(getattr(exc, "problems", None) or [exc])


def raise_all(problems: Sequence[NeoError]) -> None:
    """Raise the settings' errors as one: the one error itself, or several in a
    :class:`ConfigError` of one line ("N settings are wrong. <first> Also: <second> ...")."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        error = ConfigError(f"{len(problems)} settings are wrong. " + " Also: ".join(str(p) for p in problems))
        error.problems = list(problems)  # type: ignore[attr-defined]
        raise error


def instantiate(group: str, node: Mapping[str, Any], plugins: Plugins | None = None) -> Any:
    """Create the plugin a validated group node selects."""
    params = dict(node)
    name = params.pop("name")
    return (plugins or get_plugins()).create(group, name, params)


def _yaml_safe(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_yaml_safe(v) for v in value]
    if isinstance(value, list):
        return [_yaml_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError


def plugin_default_node(entry: Any) -> dict[str, Any]:
    """``{name: ..., **defaults}`` for a registry entry: its auto-generated config option."""
    node: dict[str, Any] = {"name": entry.name}
    for key, default in entry.parameters().items():
        if default is inspect.Parameter.empty:
            continue
        try:
            node[key] = _yaml_safe(default)
        except TypeError:
            continue
    return node


def register_plugin_options(conf_dir: str | Path | None = None, plugins: Plugins | None = None) -> None:
    """Make every registered plugin a config option: ``<group>=<name>`` works without YAML.

    A plugin whose option already exists as ``<conf_dir>/<group>/<name>.yaml`` keeps its YAML;
    plugins may add named options with ``registry.register(..., options={...})``.
    """
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    plugins = plugins or get_plugins()
    conf = Path(conf_dir) if conf_dir is not None else None

    def store(group: str, name: str, node: dict[str, Any]) -> None:
        if conf is not None and (conf / group / f"{name}.yaml").exists():
            return
        cs.store(group=group, name=name, node=node)

    clashes = option_clashes(conf, plugins)
    if clashes:
        raise PluginClash(clashes[0])
    for registry in plugins.registries.values():
        for entry in registry.entries():
            store(registry.group, entry.name, plugin_default_node(entry))
            for option, params in entry.options.items():
                store(registry.group, option, {"name": entry.name, **dict(params)})


def option_clashes(conf_dir: str | Path | None = None, plugins: Plugins | None = None) -> list[str]:
    """One sentence per plugin option that would quietly stand in for another: a plugin's own
    name, another plugin's option, or a YAML file under ``conf_dir`` (which would win, hiding
    the option). The recipes refuse to start on the first; ``neo plugins`` lists them all."""
    plugins = plugins or get_plugins()
    conf = Path(conf_dir) if conf_dir is not None else None
    clashes = []
    for registry in plugins.registries.values():
        taken = {e.name: f"the {registry.kind} plugin {e.name!r} ({e.provider})" for e in registry.entries()}
        providers = {e.name: e.provider for e in registry.entries()}
        for entry in registry.entries():
            for option in entry.options:
                other = taken.get(option)
                if other is None and conf is not None and (conf / registry.group / f"{option}.yaml").exists():
                    other = f"the option file {conf / registry.group / option}.yaml"
                if other is not None:
                    clashes.append(
                        f"{registry.group} option {option!r} of {registry.kind} plugin {entry.name!r} "
                        f"({entry.provider}) clashes with {other}; rename the option "
                        f"({meanwhile(entry.provider, providers.get(option, ''))})."
                    )
                else:
                    taken[option] = f"an option of the {registry.kind} plugin {entry.name!r} ({entry.provider})"
    return clashes
