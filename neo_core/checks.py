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
