"""The ``neo`` command: ``neo plugins`` lists every registered plugin by kind."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from neo_core.errors import NeoError


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Print a :class:`NeoError` as one line and exit with status 2 (no traceback)."""
    try:
        yield
    except NeoError as exc:
        if os.environ.get("NEO_TRACEBACK"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:  # errors raised inside spawned ranks arrive wrapped
        message = str(exc)
        for line in reversed(message.splitlines()):
            if line.startswith("neo_core.errors.") and ": " in line:
                if os.environ.get("NEO_TRACEBACK"):
                    raise
                print(f"error: {line.split(': ', 1)[1]}", file=sys.stderr)
                raise SystemExit(2) from None
        raise


def force_add_overrides(argv: Sequence[str]) -> list[str]:
    """Turn plain ``group.key=value`` overrides into ``++group.key=value``.

    Hydra rejects a key the composed config lacks ("not in struct") before Neo sees it; with
    ``++`` every key reaches Neo's validation, which names a misspelled key and its close
    match, and accepts any parameter of a plugin selected by name only.
    """
    out = []
    for arg in argv:
        key, eq, _ = arg.partition("=")
        plain = eq and "." in key and not key.startswith(("-", "+", "~", "hydra."))
        out.append(f"++{arg}" if plain else arg)
    return out


def list_plugins() -> str:
    """Every registered plugin, grouped by kind, with the distribution that provided it."""
    from neo_core.plugins import get_plugins

    plugins = get_plugins()
    lines = []
    for registry in plugins.registries.values():
        lines.append(f"{registry.kind} (config group '{registry.group}'):")
        for entry in registry.entries():
            desc = f"  {entry.description}" if entry.description else ""
            lines.append(f"  {entry.name:<14} [{entry.provider}]{desc}")
        if not len(registry):
            lines.append("  (none)")
    for name, error in plugins.failed.items():
        lines.append(f"failed to load: {name}: {error}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neo", description="Neo: sharded DLRM training on TorchRec.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list registered plugins by kind")
    calibrate = sub.add_parser("calibrate", help="measure this machine's bandwidths for the local topology")
    calibrate.add_argument(
        "--output", default=None, help="where to write the calibration JSON (default: NEO_CALIBRATION or ~/.cache/neo/calibration.json)"
    )
    args = parser.parse_args(argv)
    with user_errors():
        if args.command == "plugins":
            print(list_plugins())
        elif args.command == "calibrate":
            from neo_plugins.sharding.planner.calibrate import main as calibrate_main
            from neo_plugins.topology.local import calibration_path

            calibrate_main(args.output or str(calibration_path()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
