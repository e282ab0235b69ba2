"""The rules for numbers, for every option of the package: each error names its option and the rule.

The kinds' options (``connlist.kinds.resolve``), the list's own arguments,
the metrics' interval and the view's limit are all checked by these, once,
where they are given, so that a bad value fails at start-up;
docs/settings.md is the reference.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence

__all__ = ["check_number", "check_rate", "check_timeout", "check_whole", "nearest"]


def check_number(name: str, value: object, unit: str, *, none_disables: bool = False) -> float:
    """Validate a finite number of ``unit`` >= 0 (0 disables it) and return it as a float.

    ``TypeError`` for anything but an int or a float (a bool is not a
    number here), ``ValueError`` for a negative, infinite or NaN value; both
    name the option.  With ``none_disables``, None is accepted, as 0.
    """
    if value is None and none_disables:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = f"a number of {unit} or None" if none_disables else f"a number of {unit}"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of {unit} >= 0 (0 disables it), got {value!r}")
    return float(value)


def check_timeout(name: str, value: object) -> float:
    """Validate one timeout (seconds, 0 disables) and return it as a float."""
    return check_number(name, value, "seconds")


def check_rate(name: str, value: object) -> float:
    """Validate one rate (bytes per second, 0 disables) and return it as a float."""
    return check_number(name, value, "bytes per second")


def check_whole(name: str, value: object, maximum: int) -> int:
    """Validate a whole number from 0 to ``maximum``: ``ValueError`` naming the option otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValueError(f"{name} must be an integer from 0 to {maximum}, got {value!r}")
    return value


def nearest(name: str, options: Sequence[str]) -> str:
    """What an error for an unknown option ``name`` says next: the nearest of ``options``, or all of them."""
    close = difflib.get_close_matches(name, options, n=1)
    return f"did you mean {close[0]!r}?" if close else f"the options are {', '.join(options)}"
