"""The rules every option is checked by, and the options' defaults.

Theory of operation.  Every number an option takes is checked where it is
given, by one of the rules here (``check_number`` and the rest), and an
error names the option and the rule (``ValueError`` for a value out of
range, ``TypeError`` for a value of the wrong type, ``nearest`` for an
unknown name).  The defaults are those of the servers connlist follows:
Node.js's two request timeouts, nginx's send timeout, Apache
mod_reqtimeout's minimum body rate, and a connection budget read from the
descriptor limit.  ``connlist.core.kinds.resolve`` applies them to the
options of every kind, and holds the rules between options (Node's for the
two request timeouts: ``resolve_timeouts``).

This module imports nothing of connlist's.
"""

from __future__ import annotations

import difflib
import math
import resource
from collections.abc import Sequence

__all__ = [
    "DEFAULT_BODY_GRACE",
    "DEFAULT_BODY_MIN_RATE",
    "DEFAULT_HEADERS_TIMEOUT",
    "DEFAULT_MAX_HEADER_SIZE",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SEND_TIMEOUT",
    "RESERVED_DESCRIPTORS",
    "UPGRADED_SHARE",
    "check_max_connections",
    "check_max_header_size",
    "check_max_upgraded",
    "check_number",
    "check_timeout",
    "check_whole",
    "default_max_connections",
    "default_max_upgraded",
    "nearest",
    "resolve_timeouts",
]


# -- the rules for numbers ---------------------------------------------------------


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


def check_whole(name: str, value: object, maximum: int) -> int:
    """Validate a whole number from 0 to ``maximum``: ``ValueError`` naming the option otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValueError(f"{name} must be an integer from 0 to {maximum}, got {value!r}")
    return value


def nearest(name: str, options: Sequence[str]) -> str:
    """What an error for an unknown option ``name`` says next: the nearest of ``options``, or all of them."""
    close = difflib.get_close_matches(name, options, n=1)
    return f"did you mean {close[0]!r}?" if close else f"the options are {', '.join(options)}"


# -- the options -----------------------------------------------------------------

# Node.js's requestTimeout and headersTimeout.
DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_HEADERS_TIMEOUT = 60.0
# Node.js's maxHeaderSize (--max-http-header-size): a request line and its headers, in bytes.
DEFAULT_MAX_HEADER_SIZE = 16384
# nginx's send_timeout.
DEFAULT_SEND_TIMEOUT = 60.0
# Apache mod_reqtimeout's default in Debian: body=10,MinRate=500.
DEFAULT_BODY_MIN_RATE = 500.0
DEFAULT_BODY_GRACE = 10.0
# Descriptors max_connections leaves to the rest of the worker by default:
# this many (the listening socket, stdin/out/err, the event loop's epoll and
# wake-up pipe, log files, the debug endpoint's socket and its clients) plus
# one in RESERVED_SHARE of the limit (the app's own connections to databases
# and other services, its files, and the connections the event loop accepts
# in one go before the budget sees them).
RESERVED_DESCRIPTORS = 64
RESERVED_SHARE = 8


def default_max_connections(limit: int | None = None) -> int:
    """The default budget: the descriptor limit less ``RESERVED_DESCRIPTORS`` and 1/``RESERVED_SHARE`` of it.

    ``limit`` defaults to the process's soft ``RLIMIT_NOFILE`` (``ulimit -n``);
    an unlimited one gives 0 (no budget).  1024 gives 832, 4096 gives 3,520.
    At least 1.
    """
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or limit < 0:
        return 0
    return max(1, limit - RESERVED_DESCRIPTORS - limit // RESERVED_SHARE)


# The share of max_connections upgraded connections (websockets) may hold
# by default: one in UPGRADED_SHARE (docs/settings.md says why half).
UPGRADED_SHARE = 2


def default_max_upgraded(max_connections: int) -> int:
    """The default share of upgraded connections: half the budget, at least 1; 0 (none) without a budget."""
    return max(1, max_connections // UPGRADED_SHARE) if max_connections else 0


# -- the rules between options ----------------------------------------------------


def resolve_timeouts(headers_timeout: float | None, request_timeout: float) -> tuple[float, float]:
    """Validate the two options as Node.js's ``http.createServer`` does; return the effective values."""
    request_timeout = check_number("request_timeout", request_timeout, "seconds")
    if headers_timeout is None:
        # Node: headersTimeout defaults to min(60 s, requestTimeout); with
        # the request timeout disabled, to 60 s.
        headers_timeout = min(DEFAULT_HEADERS_TIMEOUT, request_timeout) or DEFAULT_HEADERS_TIMEOUT
    headers_timeout = check_number("headers_timeout", headers_timeout, "seconds")
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        raise ValueError(
            f"headers_timeout ({headers_timeout:g}) must not be greater than "
            f"request_timeout ({request_timeout:g}) when both are enabled"
        )
    return headers_timeout, request_timeout


def check_max_connections(value: object) -> int:
    if value is None:
        return default_max_connections()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be None or an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(
            f"max_connections must be >= 0 (0 disables the budget, None derives it), got {value!r}"
        )
    return value


def check_max_header_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_header_size must be an int (bytes), got {type(value).__name__}")
    if value < 0:
        raise ValueError(
            f"max_header_size must be a number of bytes >= 0 (0 leaves the head to the server's own "
            f"limits), got {value!r}"
        )
    return value


def check_max_upgraded(value: object, max_connections: int) -> int:
    if value is None:
        return default_max_upgraded(max_connections)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_upgraded must be None or an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(
            f"max_upgraded must be >= 0 (0: no share of its own, None derives it), got {value!r}"
        )
    if max_connections and value > max_connections:
        raise ValueError(
            f"max_upgraded ({value}) must not be greater than max_connections ({max_connections}): "
            "upgraded connections count against the budget too"
        )
    return value
