"""Per-worker enforcement of the headers and request timeouts, with one timer.

Node.js checks its ConnectionsList every ``connectionsCheckingInterval``
(30 s by default), so its ``408`` can come up to 30 s late.  connlist keeps one
``loop.call_later`` timer per worker instead, armed at the earliest deadline
any active connection can reach; ``ConnectionsList.next_deadline`` finds it
near the head of the ordered ``active`` list.  After each sweep the timer is
armed again, never further away than the shortest timeout: a message that
begins after the timer was armed cannot have an earlier deadline than that.
A timer is armed only while some connection is active, since nothing else can
expire.  The server layer's common case, a whole request in one read on an
idle connection, never makes one active, so it never touches the timer; and a
loop with no timer of ours in its heap does less at each iteration (asyncio's
loop reads its clock at every iteration while any timer is scheduled: about
1,400 instructions per request of a hello world in benchmarks/per_request.py).

The server layer (``connlist.uvicorn``) or the middleware in ASGI-only mode
feeds the list, calls ``watch()`` after any event that can leave a connection
active (``connect``, ``message_begin``) and ``unwatch()`` after one that can
leave none active (``message_complete``, ``remove``); what expires is closed
through the connection's handle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from connlist.connections import Connection, ConnectionsList, check_timeout

__all__ = [
    "DEFAULT_HEADERS_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "STATE_KEY",
    "Enforcer",
    "TimeoutKind",
    "Totals",
    "format_address",
    "resolve_timeouts",
]

logger = logging.getLogger("connlist")

# The key under which the middleware hands its enforcer to the server's
# protocols, in the ASGI lifespan state (uvicorn gives every protocol it).
STATE_KEY = "connlist.enforcer"

DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_HEADERS_TIMEOUT = 60.0

# A timer that fires exactly at a deadline finds nothing expired: Node's rule
# is strict (``start < now - timeout``).  Fire this much later.
_SLACK = 0.001

TimeoutKind = Literal["headers", "request"]
OnTimeout = Callable[[Connection, TimeoutKind], object]


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


def format_address(address: object) -> str | None:
    """``("127.0.0.1", 5000)`` -> ``"127.0.0.1:5000"``; None stays None."""
    if isinstance(address, (tuple, list)) and len(address) == 2:
        host, port = address
        if port is None:
            return str(host)
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return None if address is None else str(address)


@dataclass
class Totals:
    """Counters since the worker started."""

    connections: int = 0
    requests: int = 0
    headers_timeouts: int = 0
    request_timeouts: int = 0


class Enforcer:
    """One worker's ConnectionsList, its timeouts, its timer and its counters."""

    def __init__(
        self,
        *,
        headers_timeout: float | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        on_timeout: OnTimeout | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connections = ConnectionsList(clock)
        self.headers_timeout, self.request_timeout = resolve_timeouts(headers_timeout, request_timeout)
        self.on_timeout = on_timeout
        self.totals = Totals()
        # "asgi" until a connlist protocol of the server announces itself.
        self.mode = "asgi"
        # The list's clock, read where a request has no record (ASGI-only mode).
        self.clock = clock
        # ASGI-only mode: requests without a body have nothing left to
        # receive, so nothing to time and no record; the view lists them from
        # here: key -> (id, start, scope).
        self.in_flight: dict[int, tuple[int, float, Any]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def configure(
        self, *, headers_timeout: float, request_timeout: float, on_timeout: OnTimeout | None
    ) -> None:
        """Take over another owner's settings (already validated); re-arm the timer."""
        self.headers_timeout, self.request_timeout = headers_timeout, request_timeout
        self.on_timeout = on_timeout
        self.cancel()
        self.watch()

    # -- the timer -----------------------------------------------------------

    def watch(self) -> None:
        """Arm the timer if none is armed; call after ``connect`` and ``message_begin``."""
        if self._timer is None:
            self._arm()

    def unwatch(self) -> None:
        """Cancel the timer if no connection is active; call after ``message_complete`` and ``remove``."""
        if self._timer is not None and not self.connections.active_count:
            self.cancel()

    def cancel(self) -> None:
        if self._timer is not None:
            loop = self._timer_loop
            if loop is not None and not loop.is_closed():
                self._timer.cancel()
            self._timer = None
            self._timer_loop = None

    def _arm(self) -> None:
        shortest = self.headers_timeout or self.request_timeout
        if not shortest or not self.connections.active_count:
            return  # both timeouts disabled, or nothing can expire until a message begins
        deadline = self.connections.next_deadline(self.headers_timeout, self.request_timeout)
        # Never later than ``shortest``: a message begun after this cannot expire earlier than that.
        delay = shortest if deadline is None else min(max(deadline - self.clock(), 0.0) + _SLACK, shortest)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._sweep)
        self._timer_loop = loop

    def _sweep(self) -> None:
        self._timer = None
        for conn in self.connections.expired(self.headers_timeout, self.request_timeout):
            self._expire(conn)
        self._arm()

    # -- closing -------------------------------------------------------------

    def _expire(self, conn: Connection) -> None:
        # The headers timeout is the shorter one, so a connection whose
        # headers were still incomplete ran out of headers time.
        kind: TimeoutKind = "headers" if self.headers_timeout and not conn.headers_completed else "request"
        if kind == "headers":
            self.totals.headers_timeouts += 1
            limit = self.headers_timeout
        else:
            self.totals.request_timeouts += 1
            limit = self.request_timeout
        logger.warning(
            "%s - %s timeout: %s not received within %gs, closing",
            format_address(conn.client) or "unknown client",
            kind,
            "headers" if kind == "headers" else "request",
            limit,
        )
        if self.on_timeout is not None:
            try:
                self.on_timeout(conn, kind)
            except Exception:
                logger.exception("on_timeout callback failed; closing the connection anyway")
        if conn.handle is not None:
            try:
                conn.handle.connlist_close_expired()
            except Exception:  # pragma: no cover - a handle must not stop the sweep
                logger.exception("closing an expired connection failed")
