"""connlist's options: their defaults, their rules, and the one validated set an enforcer runs with.

Every option is checked here, once, when a middleware (or a fallback
enforcer) is built, so that a bad value fails at start-up with an error that
names the option and the rule; docs/settings.md is the reference.  The rules
for numbers are here too, for every option of the package (the list's own
arguments, the metrics' interval, the view's limit): ``check_number`` and
``check_whole``, each error naming its option.
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_BODY_GRACE",
    "DEFAULT_BODY_MIN_RATE",
    "DEFAULT_HEADERS_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SEND_TIMEOUT",
    "RESERVED_DESCRIPTORS",
    "Settings",
    "check_number",
    "check_rate",
    "check_timeout",
    "check_whole",
    "default_max_connections",
    "resolve",
    "resolve_timeouts",
]


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


# Node.js's requestTimeout and headersTimeout.
DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_HEADERS_TIMEOUT = 60.0
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


@dataclass(frozen=True)
class Settings:
    """The effective, validated options of one enforcer (seconds, and bytes per second)."""

    headers_timeout: float = DEFAULT_HEADERS_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    send_timeout: float = DEFAULT_SEND_TIMEOUT
    body_min_rate: float = DEFAULT_BODY_MIN_RATE
    body_grace: float = DEFAULT_BODY_GRACE
    # Connections per worker (0: no budget); read from RLIMIT_NOFILE when built.
    max_connections: int = field(default_factory=default_max_connections)

    @property
    def shortest(self) -> float:
        """The shortest time in which anything that starts now can be due (0: nothing is ever due).

        The enforcer's timer never sleeps longer than this, so an event that
        starts a clock (a request, a body, a stall) never has to re-arm it.
        """
        candidates = [self.headers_timeout or self.request_timeout]
        if self.body_min_rate:
            candidates.append(self.body_grace)
        if self.send_timeout:
            # A stall is sampled four times per send_timeout (see the enforcer).
            candidates.append(self.send_timeout / 4)
        enabled = [value for value in candidates if value]
        return min(enabled) if enabled else 0.0


def resolve_timeouts(headers_timeout: float | None, request_timeout: float) -> tuple[float, float]:
    """Validate the two options as Node.js's ``http.createServer`` does; return the effective values."""
    request_timeout = check_timeout("request_timeout", request_timeout)
    if headers_timeout is None:
        # Node: headersTimeout defaults to min(60 s, requestTimeout); with
        # the request timeout disabled, to 60 s.
        headers_timeout = min(DEFAULT_HEADERS_TIMEOUT, request_timeout) or DEFAULT_HEADERS_TIMEOUT
    headers_timeout = check_timeout("headers_timeout", headers_timeout)
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        raise ValueError(
            f"headers_timeout ({headers_timeout:g}) must not be greater than "
            f"request_timeout ({request_timeout:g}) when both are enabled"
        )
    return headers_timeout, request_timeout


def _check_max_connections(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be None or an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(
            f"max_connections must be >= 0 (0 disables the budget, None derives it), got {value!r}"
        )
    return value


def resolve(
    *,
    headers_timeout: float | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    body_min_rate: float = DEFAULT_BODY_MIN_RATE,
    body_grace: float = DEFAULT_BODY_GRACE,
    max_connections: int | None = None,
) -> Settings:
    """Validate every option (``ValueError``/``TypeError`` naming it) and return the effective settings."""
    headers_timeout, request_timeout = resolve_timeouts(headers_timeout, request_timeout)
    send_timeout = check_timeout("send_timeout", send_timeout)
    body_min_rate = check_rate("body_min_rate", body_min_rate)
    body_grace = check_timeout("body_grace", body_grace)
    if body_min_rate and not body_grace:
        # With no grace a body would be behind the moment its headers are in.
        raise ValueError("body_grace must be greater than 0 while body_min_rate is enabled (0 disables it)")
    budget = default_max_connections() if max_connections is None else _check_max_connections(max_connections)
    return Settings(headers_timeout, request_timeout, send_timeout, body_min_rate, body_grace, budget)
