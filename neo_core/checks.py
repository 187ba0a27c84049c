"""Kinds of configured values, shared by every check that names a bad key."""

from __future__ import annotations

import numbers
from typing import Any


def is_number(value: Any) -> bool:
    """A real number (numpy's too): not a bool, not NaN. Infinity passes; ranges say if it may."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value


def is_whole(value: Any) -> bool:
    """A whole number (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def as_whole(value: Any) -> int | None:
    """``value`` as an int if it is a whole number, else None.

    A whole number may be written 1000, 1e3 or 1000.0: YAML and Hydra's command line read the
    last two as floats, and every whole-number setting takes them. Bools, 2.5, NaN, infinity
    and strings are not whole.
    """
    if is_whole(value):
        return int(value)
    if is_number(value) and abs(value) != float("inf") and float(value).is_integer():
        return int(value)
    return None


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1 (``1 rank``, ``8 ranks``)."""
    return f"{n} {word}" + ("" if n == 1 else "s")
