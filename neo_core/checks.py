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


def got(value: Any) -> str:
    """``got <value>`` for a message about a value that must be whole: a whole number written
    with a decimal point (2.0, 1e3, as YAML and Hydra read them) says how to write it."""
    if isinstance(value, float) and value.is_integer():
        return f"got {value!r} (write it without a decimal point or exponent: {int(value)})"
    return f"got {value!r}"
