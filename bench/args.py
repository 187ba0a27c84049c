"""Argument checks shared by the benches (standard library only: the GPU benches measure on
machines where Neo is not installed)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def check_writable(parser: argparse.ArgumentParser, flag: str, out: Path | None) -> None:
    """A results file that can be written, checked before any work (none: nothing to check)."""
    if out is None:
        return
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir() or not folder.is_dir() or not os.access(out if out.exists() else folder, os.W_OK):
        parser.error(f"{flag} {out}: cannot be written (is its folder there and writable?)")
