"""Typed registries: each kind of plugin has one, keyed by the names users type."""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from neo_core.checks import as_whole, is_number
from neo_core.errors import ConfigError, NeoError, PluginClash, PluginError

T = TypeVar("T")

BUILTIN = "neo-dlrm"  # the distribution of Neo's own plugins


def check_kind(key: str, value: Any, annotation: Any) -> Any:
    """``value`` for ``key`` if it is of the kind its parameter is annotated with, else an error.

    Only plain annotations are checked: ``int`` takes a whole number (``1e7`` too), ``float``
    any real number but NaN, ``bool`` true/false (or 0/1), ``str`` text; each may be ``| None`` (or
    ``Optional[...]``), which also takes null. Anything else (lists, unions, none given) is
    left to the plugin. A whole float for an ``int`` comes back as an int.
    """
    optional = False
    if not isinstance(annotation, str) and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)  # Optional[int], int | None (evaluated annotations)
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return value  # a union of several kinds: the plugin's to check
        annotation, optional = rest[0], len(rest) < len(args)
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace(" ", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text, optional = text[len("Optional[") : -1], True
    for none in ("|None", "None|"):
        if none in text:
            text, optional = text.replace(none, ""), True
    if text not in ("int", "float", "bool", "str") or (optional and value is None):
        return value
    if text == "str":
        if not isinstance(value, str):
            if isinstance(value, (int, float)) and key.rpartition(".")[2] in PRECISION_KEYS.get(key.partition(".")[0], ()):
                from neo_core.compression import not_a_precision

                raise ConfigError(not_a_precision(key, value))  # 16: no text quoted would do
            quoted = f" (quote it to give it as text: {key}='{value}')" if isinstance(value, (int, float)) else ""
            raise ConfigError(f"{key} must be text{' (or null)' if optional else ''}, got {value!r}{quoted}.")
        return value
    if text == "bool":
        ok, kind = isinstance(value, bool) or (is_number(value) and value in (0, 1)), "true or false"
    elif text == "int":
        ok, kind = as_whole(value) is not None, "a whole number"
    else:
        ok, kind = is_number(value), "a number"  # NaN is not
    if not ok:
        raise ConfigError(f"{key} must be {kind}{' (or null)' if optional else ''}, got {value!r}.")
    return int(value) if text == "int" else value


# keys that take a precision's name (compression.backward=16 is answered with the precisions)
PRECISION_KEYS = {"compression": ("forward", "backward")}

# the option a message suggests first where several options of a group take a key: LRU takes
# every cache key with every value (LFU refuses cache.prefetch_pipeline=true)
SUGGESTED_FIRST = {"cache": "lru"}


def suggested_order(group: str, names: list[str]) -> list[str]:
    """``names`` (options of ``group``) with the one to suggest first (``SUGGESTED_FIRST``) first."""
    return sorted(names, key=lambda n: n != SUGGESTED_FIRST.get(group))


# a key no plugin of the group takes but users reach for: where its setting is given instead
KEY_NOTES = {
    ("compression", "forward"): "The forward precision is the option's name (compression=bf16 sends bf16 "
                                "forward); compression.backward sets the backward one.",
    ("kernel", "weight_bytes"): "Bytes per stored weight are a field of the kernel object, not a key (training "
                                "stores fp32): a dry run sets them with plan_model.weight_bytes=2 "
                                "(recipes/plan.py); in Python, dataclasses.replace(resolve('kernel', 'fused'), "
                                "weight_bytes=2), resolve from neo_core.api.",
}


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered plugin: its name, factory and where it came from."""

    name: str
    factory: Callable[..., T]
    kind: str
    provider: str  # distribution (or module) that registered it
    description: str = ""
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    plugin: str = ""  # the plugin (entry point or module) whose hook registered it

    def parameters(self) -> dict[str, Any]:
        """The factory's keyword parameters with their defaults (``inspect.Parameter.empty`` if none)."""
        target = self.factory
        sig = inspect.signature(target)
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def annotations(self) -> dict[str, Any]:
        """The factory's keyword parameters' annotations (strings under postponed evaluation)."""
        return {
            p.name: p.annotation
            for p in inspect.signature(self.factory).parameters.values()
            if p.annotation is not inspect.Parameter.empty
        }

    def accepts_any_keyword(self) -> bool:
        return any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(self.factory).parameters.values()
        )


FASTEST_NIC = 100e9  # bytes/s: an 800 Gb/s NIC, the fastest scale-out NIC sold today
_DOUBTED: set[tuple[float, float, int, int]] = set()  # the figures of topologies warned of in this process
_RENAMED: set[tuple[str, str]] = set()  # (registered name, its object's own name) said in this process


def _unlike_defaults(group: str, entry: Any, params: Mapping[str, Any]) -> str:
    """For a factory's TypeError: the values given whose kind is not their default's (text
    where the default is a number, or the other way), which a parameter without an annotation
    lets through unchecked."""
    defaults = entry.parameters()
    odd = []
    for key, value in params.items():
        default = defaults.get(key, inspect.Parameter.empty)
        if default is inspect.Parameter.empty or default is None or value is None:
            continue
        number = (int, float)
        if isinstance(value, str) != isinstance(default, str) or (
                isinstance(default, number) and not isinstance(value, (*number, str))):
            odd.append(f"{group}.{key}={value!r} (its default: {default!r})")
    return f"; given a value unlike its default: {', '.join(odd)}" if odd else ""


@contextlib.contextmanager
def doubts_unsaid() -> Iterator[None]:
    """Bandwidth warnings (and notes of a plugin's renamed object) given inside are not
    remembered as given: a check whose output is hidden (a sweep's pre-check of plan.py's jobs)
    leaves them to the job it checks, which otherwise never gave them."""
    kept, renamed = set(_DOUBTED), set(_RENAMED)
    try:
        yield
    finally:
        _DOUBTED.intersection_update(kept)
        _RENAMED.intersection_update(renamed)


def doubt_bandwidths(topology: Any, who: str, nic: bool = True) -> None:
    """Warn of a topology's bandwidths that are most often a slip: node-internal links slower
    than the network, and (``nic``: not for the built-ins, which refuse it themselves) a
    per-rank inter-node figure faster than any NIC (a NIC's Gb/s typed as GB/s, or a node's one
    NIC given to each of its ranks)."""
    if getattr(topology, "num_nodes", 1) < 2 or os.environ.get("RANK", "0") != "0":
        return
    inter, intra = topology.inter_node_bw, topology.intra_node_bw
    # once per process and cluster (a sweep's check builds each job's too; a recipe's topology
    # reaches make_context after its plugin built it): keyed by its figures, not by who says them
    key = (inter, intra, topology.devices_per_node, topology.num_nodes)
    if key in _DOUBTED:
        return
    _DOUBTED.add(key)
    if nic and inter > FASTEST_NIC:
        print(f"warning: {who} gives each rank {inter / 1e9:g} GB/s across nodes ({inter * 8 / 1e9:,.0f} Gb/s), "
              "faster than any scale-out NIC: a NIC's Gb/s is its GB/s x 8, and a NIC a node's ranks share is "
              f"given as its bandwidth over the {topology.devices_per_node} ranks (Topology.inter_node_bw is "
              "per rank).", file=sys.stderr)
    sources = getattr(topology, "sources", {}) or {}
    measured = all(str(sources.get(k, "")).startswith("measured") for k in ("intra_node_bw", "inter_node_bw"))
    # both measured (neo calibrate: a machine's loopback may be slower than its network): no slip
    if topology.devices_per_node > 1 and intra < inter and not measured:
        print(f"warning: {who} gives its ranks {intra / 1e9:g} GB/s inside a node, less than the {inter / 1e9:g} "
              "GB/s across nodes: the planner then keeps traffic off the node's links (are the two swapped?).",
              file=sys.stderr)


def meanwhile(*providers: str) -> str:
    """How to run until a clash between plugins of these providers is mended: leave a module
    named in NEO_PLUGINS out of it (those load even without autoload), or load the built-ins only."""
    named = list(dict.fromkeys(p.removeprefix("NEO_PLUGINS ") for p in providers if p.startswith("NEO_PLUGINS ")))
    if named:
        return f"meanwhile leave {' or '.join(named)} out of NEO_PLUGINS"
    return "meanwhile NEO_DISABLE_PLUGIN_AUTOLOAD=1 runs with the built-ins only"


class Registry(Generic[T]):
    """Plugins of one kind (``group`` is the config group that selects them)."""

    def __init__(self, kind: str, group: str, returns: type | None = None) -> None:
        self.kind = kind
        self.group = group
        self.returns = returns  # what every factory must return (None: not checked)
        self._entries: dict[str, Entry[T]] = {}
        self._provider = "unknown"
        self._plugin = ""

    def register(
        self,
        name: str,
        factory: Callable[..., T],
        *,
        description: str = "",
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Add a plugin.

        ``factory`` is called with the parameters of the selected config option. ``options``
        optionally names extra ready-made config options for the ``group`` (option name ->
        parameters), selectable as ``<group>=<option>``.
        """
        if not isinstance(name, str) and callable(name) and isinstance(factory, str):
            raise PluginError(
                f"{self.kind} plugin {factory!r} from {self._provider}: registry.register's arguments are swapped; "
                f"it takes the name first: registry.register({factory!r}, factory)."
            )
        if not name or not isinstance(name, str):
            raise PluginError(f"A {self.kind} plugin from {self._provider} has no name (registry.register's first "
                              f"argument is {name!r}; give the name users select it by, as text).")
        bad = _bad_name(name, self.group)
        if bad:
            raise PluginError(f"{self.kind} plugin {name!r} from {self._provider}: {bad}")
        if name in self._entries:
            other = self._entries[name].provider
            raise PluginClash(
                f"{self.kind} plugin {name!r} is registered twice ({other} and {self._provider}); "
                f"rename one of them ({meanwhile(other, self._provider)})."
            )
        if not callable(factory):
            raise PluginError(
                f"{self.kind} plugin {name!r} from {self._provider}: its factory is a {type(factory).__name__}, not "
                "callable; give a function or class that builds the plugin from its config keys."
            )
        self._check_options(name, factory, options)
        if not description:
            # its own docstring: inspect.getdoc would give a class the base class's (Planner's)
            own = factory.__doc__ if isinstance(factory, type) else getattr(factory, "__doc__", None)
            doc = inspect.cleandoc(own) if isinstance(own, str) else ""
            description = doc.splitlines()[0] if doc else ""
        self._entries[name] = Entry(
            name, factory, self.kind, self._provider, description, dict(options or {}), self._plugin
        )

    def _check_options(self, name: str, factory: Callable[..., T], options: Any) -> None:
        """A plugin's ready-made options must be ``{option name: {key: value}}`` with keys its
        factory takes: a bad one broke every recipe, blamed on the user's config."""
        where = f"{self.kind} plugin {name!r} from {self._provider}: options="
        if options is None:
            return
        if not isinstance(options, Mapping):
            raise PluginError(f"{where}{options!r} is not a mapping; give {{option name: {{key: value}}}}.")
        probe = Entry(name, factory, self.kind, self._provider)
        try:
            keys, any_key = set(probe.parameters()), probe.accepts_any_keyword()
        except (TypeError, ValueError):  # no signature to read (a builtin): the keys are left to create()
            keys, any_key = set(), True
        for option, params in options.items():
            bad = _bad_name(option, self.group) if isinstance(option, str) else f"option name {option!r} is not text."
            if bad:
                raise PluginError(f"{where}{{{option!r}: ...}}: {bad}")
            if not isinstance(params, Mapping):
                raise PluginError(
                    f"{where}{{{option!r}: {params!r}}}: an option is a mapping of the factory's keys to values, "
                    f"e.g. {{{option!r}: {{'load_factor': 0.1}}}}."
                )
            unknown = [k for k in params if k != "name" and k not in keys]
            if unknown and not any_key:
                raise PluginError(
                    f"{where}{{{option!r}: ...}} gives {', '.join(map(repr, unknown))}, which its factory does not "
                    f"take; its keys: {', '.join(sorted(keys)) or 'none'}."
                )
            if params.get("name", name) != name:
                raise PluginError(f"{where}{{{option!r}: ...}} names plugin {params['name']!r}; an option selects "
                                  "the plugin that registers it, so leave 'name' out.")

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> Entry[T]:
        if name not in self._entries:
            raise PluginError(self._unknown(name))
        return self._entries[name]

    def _unknown(self, name: str) -> str:
        choices = self.names()
        # a name in other case first ('LRU': 'lru'), which difflib's close matches miss
        close = [c for c in choices if c.lower() == str(name).lower()] or difflib.get_close_matches(
            str(name).lower(), [c.lower() for c in choices], n=1)
        close = [next((c for c in choices if c.lower() == m), m) for m in close]
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (
            f"Unknown {self.kind} plugin {name!r} for {self.group}.name.{hint} "
            f"Available: {', '.join(choices) or 'none'}."
        )

    def unknown_key(self, name: str, key: str) -> str:
        """The message for ``<group>.<key>``, a key plugin ``name`` does not take: the other
        plugins of the group that take the key itself and how to select one
        (``sharding.timeout_s`` while ``sharding=neo``, ``cache.load_factor`` while
        ``cache=none``), else its close match, else another plugin's close match."""
        accepted = sorted(self.get(name).parameters())
        owners: dict[str, list[str]] = {}
        for other in self.entries():
            if other.name == name or other.accepts_any_keyword():
                continue
            keys = list(other.parameters())
            match = key if key in keys else next(iter(difflib.get_close_matches(key, keys, n=1)), None)
            if match:
                owners.setdefault(match, []).append(other.name)
        owners = {k: suggested_order(self.group, v) for k, v in owners.items()}
        close = [] if key in owners else difflib.get_close_matches(key, accepted, n=1)
        hint = f" Did you mean {self.group}.{close[0]}?" if close else ""
        if not close and owners:
            match = key if key in owners else next(iter(owners))
            hint = (
                (f" Did you mean {self.group}.{match}?" if match != key else "")
                + f" {self.group}.{match} is a key of {', '.join(map(repr, owners[match]))}: select one "
                f"with it, e.g. {self.group}={owners[match][0]} {self.group}.{match}=<value>."
            )
        if not hint and (self.group, key) in KEY_NOTES:
            hint = " " + KEY_NOTES[self.group, key]
        if not hint:  # a key of another group, given to this one (sharding.load_factor for cache.load_factor)
            hint = self._other_groups_key(key)
        if not accepted:
            return f"Unknown key {self.group}.{key} for {self.kind} plugin {name!r}, which takes no keys.{hint}"
        return f"Unknown key {self.group}.{key} for {self.kind} plugin {name!r}.{hint} Its keys: {', '.join(accepted)}."

    def _other_groups_key(self, key: str) -> str:
        """' <key> is a key of the <group> group (...): <group>.<key>=<value>.' where plugins of
        another group take ``key`` itself; '' where none do."""
        try:
            from neo_core.plugins import get_plugins

            registries = list(get_plugins().registries.values())
        except Exception:  # noqa: BLE001 - no other groups to look in
            return ""
        for registry in registries:
            if registry.group == self.group:
                continue
            names = [e.name for e in registry.entries() if not e.accepts_any_keyword() and key in e.parameters()]
            if names:
                return (f" {key} is a key of the {registry.group} group ({', '.join(map(repr, names[:3]))}): "
                        f"{registry.group}.{key}=<value>.")
        return ""

    def create(self, name: str, params: Mapping[str, Any] | None = None) -> T:
        """Instantiate plugin ``name`` with ``params``, rejecting keys its factory does not take."""
        entry = self.get(name)
        params = dict(params or {})
        accepted = entry.parameters()
        if not entry.accepts_any_keyword():
            for key in params:
                if key not in accepted:
                    raise ConfigError(self.unknown_key(name, key))
            annotations = entry.annotations()
            for key, value in params.items():
                try:
                    params[key] = check_kind(f"{self.group}.{key}", value, annotations.get(key))
                except ConfigError as exc:
                    if not _is_default(value, accepted.get(key, inspect.Parameter.empty)):
                        raise
                    kind = _annotation_text(annotations.get(key))
                    fix = (f"annotate it '{kind} | None'" if value is None else "change the default to one")
                    raise PluginError(  # nobody typed it: the plugin's default contradicts its annotation
                        f"{self.kind} plugin {name!r} ({entry.provider}): its own default for {key}, {value!r}, is "
                        f"not of its annotated kind, {kind} ({str(exc).rstrip('.')}); the plugin should {fix}. "
                        f"Meanwhile give {self.group}.{key}=<value>."
                    ) from None
        if "name" in accepted and accepted["name"] is inspect.Parameter.empty and "name" not in params:
            params["name"] = name  # a factory (a CachePolicy subclass) that takes its own name
        # the parameters it needs that nobody gave (a factory taking **kwargs too: Python's
        # "missing 1 required positional argument" named no setting)
        missing = [k for k, v in accepted.items() if v is inspect.Parameter.empty and k not in params]
        if missing:
            raise ConfigError(
                f"{self.kind} plugin {name!r} needs {', '.join(f'{self.group}.{m}=<value>' for m in missing)}."
            )
        try:
            made = entry.factory(**params)
        except (TypeError, ValueError) as exc:  # its verdict on a value; a TypeError may be a slip: where it was raised
            where = _raised_at(exc) if isinstance(exc, TypeError) else ""
            raise ConfigError(f"{self.group}={name} ({entry.provider}): {exc}{where}{_unlike_defaults(self.group, entry, params)}") from exc
        except NeoError as exc:
            if entry.provider == BUILTIN or not isinstance(exc, ConfigError):
                raise
            # a check of Neo's classes (Topology, CachePolicy...) on what a third-party factory gave
            # them: it names the class's field, which the user may not have typed: and what they typed
            defaults = entry.parameters()
            given = ", ".join(f"{self.group}.{k}={v!r}" for k, v in params.items()
                              if k != "name" and not _is_default(v, defaults.get(k, inspect.Parameter.empty)))
            made_from = f" (built by the plugin from {given})" if given else ""
            said = str(exc).rstrip(".") + made_from + "." if made_from else str(exc)
            raise ConfigError(f"{self.group}={name} ({entry.provider}): {said}") from exc
        except Exception as exc:  # a plugin's own failure: name the plugin, keep the traceback chained
            raise PluginError(
                f"{self.kind} plugin {name!r} ({entry.provider}) failed to build: {type(exc).__name__}: {exc}"
                f"{_raised_at(exc)}"
            ) from exc
        if self.returns is not None and not isinstance(made, self.returns):
            expected = f"{self.returns.__module__}.{self.returns.__qualname__}"
            raise PluginError(
                f"{self.kind} plugin {name!r} ({entry.provider}) returned {type(made).__name__}, not "
                f"{expected}: its factory must return one (README, 'Writing a plugin')."
            )
        if self.kind != "topology":  # a topology's name says which cluster it is ("local": this machine's ranks)
            made = _as_registered(made, name, f"{self.kind} plugin {name!r} ({entry.provider})")
        if self.kind == "topology":
            doubt_bandwidths(made, f"{self.group}={name} ({entry.provider})", nic=entry.provider != BUILTIN)
        return made

    def _set_provider(self, provider: str, plugin: str = "") -> None:
        self._provider = provider
        self._plugin = plugin

    def drop_plugin(self, plugin: str) -> list[str]:
        """Remove what ``plugin`` registered (it failed part-way); the names removed."""
        gone = [n for n, e in self._entries.items() if e.plugin == plugin]
        for n in gone:
            del self._entries[n]
        return gone


def _as_registered(made: Any, name: str, who: str) -> Any:
    """``made`` under the name it is registered and selected by: an object whose ``name`` is
    another's (a copy of lru registered as lru_clone, calling itself lru) was reported as that
    other, so plans and summaries could not tell the two apart. A copy is renamed (a factory may
    hand out one shared object); a name that cannot be set (a property) is left."""
    own = getattr(made, "name", None)
    if not isinstance(own, str) or own == name:
        return made
    try:
        renamed = copy.copy(made)
        object.__setattr__(renamed, "name", name)  # frozen dataclasses too: the name is for people
    except Exception:  # noqa: BLE001 - a read-only name: reports keep the object's own
        return made
    if (name, own) not in _RENAMED and os.environ.get("RANK", "0") == "0":
        _RENAMED.add((name, own))
        print(f"note: {who} calls its {type(made).__name__} {own!r}; Neo's reports name it {name!r}, the name it "
              "is selected by.", file=sys.stderr)
    return renamed


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, tuple) and isinstance(value, list):  # a config gives a tuple back as a list
        value = tuple(value)
    try:
        return default is not inspect.Parameter.empty and bool(value == default) and type(value) is type(default)
    except Exception:  # noqa: BLE001 - values that do not compare are not the default
        return False


def _annotation_text(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _bad_name(name: str, group: str = "<group>") -> str | None:
    """Why ``name`` cannot be typed as ``<group>=<name>``: a character Hydra's override grammar
    reads otherwise (``/`` a folder, ``=``, ``,`` a sweep, a space, quotes, brackets), or a name
    it reads as a number, true/false or null."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+:@-]*", name) or name.endswith(".yaml"):
        return (f"the name {name!r} cannot be selected as {group}={name}; use letters, digits and _ - . + : @, "
                "starting with a letter, digit or _.")
    try:
        float(name)
        parsed = True
    except ValueError:
        parsed = name.lower() in ("true", "false", "null")
    if parsed:
        return f"the name {name!r} reads as a value, not a name, in {group}={name}; give it a name with a letter."
    return None


def _raised_at(exc: BaseException, hint: bool = True) -> str:
    """`` (raised at file:line in function; NEO_TRACEBACK=1 shows the traceback)`` for an error a
    plugin's factory raised: a bad value it refused reads like a bug in its code otherwise."""
    import os
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if len(frames) < 2:  # raised by the call itself (arguments that do not bind): nothing of the plugin's
        return ""
    last = frames[-1]
    shown = "; NEO_TRACEBACK=1 shows the traceback" if hint else ""
    return f" (raised at {os.path.basename(last.filename)}:{last.lineno} in {last.name}{shown})"
