"""Argument checks shared by the benches (standard library only: the GPU benches measure on
machines where Neo is not installed)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def check_writable(parser: argparse.ArgumentParser, flag: str, out: Path | None) -> None:
    """A results file that can be written, checked before any work (none: nothing to check).
    Folders it names that are not there yet are made, as for a run's output folder."""
    if out is None:
        return
    out = Path(out)
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        parser.error(f"{flag} {out}: a folder; give a file name in it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"{flag} {out}: cannot be written (its folder {folder} cannot be made: {exc.strerror})")
    if not os.access(out if out.exists() else folder, os.W_OK):
        parser.error(f"{flag} {out}: cannot be written (no write permission)")
