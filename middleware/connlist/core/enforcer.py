"""Per-worker enforcement of every timeout and of the connection budget.

The enforcer owns one worker's ConnectionsList, its settings, its counters
and its log summary, and cuts what is due through each connection's handle.
Its one timer (``connlist.core.timer``) is armed at the earliest moment
anything can be due (``_next_due``: the least of the sweep's steps' ``due``,
``connlist.core.sweep``):

* a request's headers or request timeout (``ConnectionsList.next_deadline``
  finds it near the head of the ordered ``active`` list);
* a body's minimum rate (the bodies past their grace period, at the head of
  ``body``; the others cannot be due before their grace ends);
* a stalled response's next sample: a stalled connection is sampled every
  ``send_timeout / 4`` and cut once it made no progress for its allowance
  (``kinds.send_allowance``: ``send_timeout``, or longer for a client
  whose window opens in large steps), so it is cut up to ``send_timeout /
  4`` (plus the timer's lateness) after its allowance ran out.  Progress is
  what the client acknowledged (``TCP_INFO``), or, where the kernel does not
  tell, fewer bytes unsent;
* a closed connection's linger (``LINGER``), after which it is aborted;
* the next log summary, while one is pending;
* an idle connection's keep-alive time, where the server integration times
  the server's keep-alive (``keep_alive_timed``: ``response_complete``),
  shortened under pressure (see below), and at least every
  ``PRESSURE_TICK`` while pressed.  A connection idle for exactly its
  time is due (uvicorn's rule), so the timer fires at that time.

Something can be due while a connection is active, stalled or closing, idle
under a keep-alive the list times, or a log summary is pending
(``_anything_due``).  The server layer's common case, a whole request in one
read on an idle connection, never makes one active, so it never touches the
timer.  The steps tell the enforcer what they cut (``cut``, ``report``,
``close_keepalive``) and what their walks found (``rate_walked``); the
enforcer keeps the state.

The connection budget (``max_connections``) is kept at connect, not by the
timer: the server layer reports each new connection (``join``), and over
the budget one connection goes, the first that exists of: the longest-idle
keep-alive connection (closed), the oldest still sending its headers (``408``,
then aborted), the body furthest behind the minimum rate (the same), and
only when every connection is a request being served, the new one (``503``).
Above ``PRESSURE_WATERMARK`` of the budget the enforcer is *pressed*: its
sweeps shrink the headers timeout and the keep-alive idle time (``shrink``,
linear down to ``PRESSURE_FLOOR`` at the budget) and pass them to the same
ordered walks, so one timer still serves every deadline.

The server layer (``connlist.servers.uvicorn.protocols``), or ``connlist.asgi.asgi_only`` in ASGI-only
mode, feeds the list, and calls ``watch()`` after any event that can make
something due (``message_begin``, ``stall``; ``join`` does at connect); what
is due is closed through the connection's handle.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import resource
import sys
import time
from collections.abc import Callable

from connlist.core.budget import PRESSURE_TICK, Budget
from connlist.core.connections import ConnectionsList
from connlist.core.kinds import (
    HEADER_OVERFLOW,
    TIMEOUT_BY_NAME,
    Kind,
    Settings,
    TimeoutKind,
    Totals,
    deadline,
)
from connlist.core.logs import Summary, log, logger
from connlist.core.records import Address, Connection, ConnectionHandle
from connlist.core.sweep import STEPS, Step
from connlist.core.timer import CARRY_ON_WHOLE, SWEEP_TIME, Timer

__all__ = [
    "LINGER",
    "PRESSURE_FLOOR",
    "PRESSURE_WATERMARK",
    "Enforcer",
    "OnTimeout",
    "shrink",
]

# How long a connection connlist closed may take to go (long enough for a
# well-behaved client to read the 408) before it is aborted.
LINGER = 1.0
# An on_timeout callback that runs longer than this is warned about, once.
SLOW_CALLBACK = 0.010

# Pressure: above this share of max_connections the headers timeout and the
# keep-alive idle time shrink, linearly, to PRESSURE_FLOOR seconds at the
# budget (Envoy's overload manager, reduce_timeouts).
PRESSURE_WATERMARK = 0.8
PRESSURE_FLOOR = 2.0
# uvicorn's --timeout-keep-alive default, until a protocol tells its own.
KEEP_ALIVE = 5.0
# The most of one read a server's parser is fed at a time while requests may follow in it: the
# requests parsed ahead of their responses, and what a parser keeps after a message, stay under it.
FEED_SLICE = 16384
# What asyncio (and uvloop) tell the loop's exception handler when accept fails for want of descriptors.
_ACCEPT_ERRORS = ("socket.accept() out of system resource", "error status in uv_stream_t.listen callback")


def shrink(timeout: float, pressure: float) -> float:
    """``timeout`` under ``pressure`` (occupied / max_connections): the curve of docs/settings.md.

    Unchanged up to ``PRESSURE_WATERMARK``, then linear down to
    ``PRESSURE_FLOOR`` at 1.0 and beyond; a timeout at or below the floor,
    or disabled (0), is never changed.
    """
    if pressure <= PRESSURE_WATERMARK or timeout <= PRESSURE_FLOOR:
        return timeout
    share = min((pressure - PRESSURE_WATERMARK) / (1.0 - PRESSURE_WATERMARK), 1.0)
    return timeout - (timeout - PRESSURE_FLOOR) * share


def _out_of_descriptors(exc: object) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _log_out_of_descriptors(exc: object, tracked: int, max_connections: int) -> None:
    """The ERROR line of the first ``accept()`` that failed for want of descriptors, with the numbers."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # Counted without opening one (listing /proc/self/fd would need a
    # descriptor, and there is none); once per worker, so the cost is fine.
    open_fds = sum(_is_open(fd) for fd in range(min(soft, 1 << 16)))
    log.error(
        "accept() failed for want of file descriptors (%s): %d connections tracked, "
        "max_connections %d, RLIMIT_NOFILE %d, %d descriptors open. The budget leaves too few "
        "descriptors to the rest of the worker: lower max_connections or raise the limit (ulimit -n). "
        "Later failures are counted in the view (accept_failures), not logged.",
        exc,
        tracked,
        max_connections,
        soft,
        open_fds,
    )


OnTimeout = Callable[[Connection, TimeoutKind], object]


class Enforcer(Budget, Timer):
    """One worker's ConnectionsList, its settings, its timer, its counters and its log summary.

    Its timer (``connlist.core.timer``) runs on ``loop`` if one is given,
    else on the server's, else on the loop running when it is armed; it
    reads ``clock``, the list's clock.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        on_timeout: OnTimeout | None = None,
        clock: Callable[[], float] = time.monotonic,
        linger: float = LINGER,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(loop)
        self.connections = ConnectionsList(clock, self._idle_joined)
        self.settings = Settings() if settings is None else settings
        self.on_timeout = on_timeout
        self.totals = Totals()
        self.summary = Summary()
        # "asgi" until a connlist protocol of the server announces itself
        # (or the server's start tells which is in use: connlist.servers.integration).
        self.mode = "asgi"
        # Why the server integration is off, once that is known (None: it is
        # on, or not known yet); and whether ASGI-only mode was logged.
        self.integration_off: str | None = None
        self.asgi_told = False
        # The server_integration option in force ("auto", "required", "off").
        self.server_integration = "auto"
        # The list's clock.
        self.clock = clock
        self.linger = linger
        # What the rate step told of its last walk (``rate_walked``): the
        # earliest rate deadline of the bodies it kept, and the end of the
        # next grace period (see connlist.core.sweep.rate_expired).
        self.rate_next: float | None = None
        self.grace_end: float | None = None
        # When the last idle connection was closed at its keep-alive time
        # (``close_keepalive``; see connlist.core.sweep.KEEPALIVE_BATCH).
        self.keepalive_closed_at = -math.inf
        # A sweep carrying on (``_work``): the steps the last one left, and
        # the clock value from which the next sweep is whole again.
        self._left: tuple[Step, ...] = ()
        self._whole_by = -math.inf
        self._slow_callback_warned = False
        self._failure_logged = False
        # Above the watermark of the budget (see admit and pressure).
        self.pressed = False
        # uvicorn's keep-alive idle time (the protocol tells it: attach),
        # and whether the list times it (the server layer says, at each
        # protocol's making): else uvicorn's timers do, and the list only
        # closes idle connections sooner under pressure.
        self.keep_alive = KEEP_ALIVE
        self.keep_alive_timed = False
        # The protocol class that told it the above and its mode (the server
        # layer's, once per server and loop; None: none since the server started).
        self.fed_by: type | None = None

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._settings = settings
        # The headers timeout the last sweep applied (shortened under pressure).
        self.headers_timeout_now = settings.headers_timeout
        # Connections up to which join leaves admit out (no budget: all).
        budget = settings.max_connections
        self._quiet_below = budget * PRESSURE_WATERMARK if budget else math.inf
        # The keep-alive idle time the last sweep applied (shortened under pressure).
        self.idle_time_now = math.inf
        # The bytes a request's head may take (max_header_size; without it, no bound of connlist's),
        # and the longest read at rest a protocol feeds its parser as it is (longer ones are
        # checked for their head's end, and fed FEED_SLICE at a time): what it compares reads with.
        self.head_limit = settings.max_header_size or sys.maxsize
        self.whole_read = min(self.head_limit, FEED_SLICE)

    @property
    def headers_timeout(self) -> float:
        return self.settings.headers_timeout

    @property
    def request_timeout(self) -> float:
        return self.settings.request_timeout

    def deadline(self, conn: Connection) -> tuple[str, float] | None:
        """Which timeout cuts ``conn`` off first under this enforcer's settings, and when; or None.

        ``connlist.core.kinds.deadline`` has the rules; the debug view shows it.
        """
        return deadline(conn, self.settings)

    def configure(self, settings: Settings, *, on_timeout: OnTimeout | None) -> None:
        """Take over another owner's settings (already validated); re-arm the timer."""
        self.settings = settings
        self.on_timeout = on_timeout
        self.cancel()
        self.watch()

    # -- what is due -----------------------------------------------------------

    def _anything_due(self) -> bool:
        connections = self.connections
        return bool(
            connections.active_count  # a body being received is active too
            or connections.stalled_count
            or connections.closing
            or self.summary.pending
            or self.pressed
            or (self.keep_alive_timed and connections.idle_queue)
        )

    def _next_due(self, now: float) -> float | None:
        """The earliest clock value at which anything can be due, or None if nothing can."""
        self._apply_pressure()
        candidates = [due for step in STEPS if (due := step.due(self, now)) is not None]
        if self.pressed:
            # Deadlines move earlier as the pressure rises.
            candidates.append(now + PRESSURE_TICK)
        if self.summary.pending:
            candidates.append(self.summary.due)
        return min(candidates) if candidates else None

    def _apply_pressure(self) -> None:
        """The headers timeout and keep-alive idle time the steps apply now: shrunk while pressed.

        The idle time is infinite where nothing closes idle connections: the
        keep-alive is uvicorn's to time, and the pressure does not shorten it.
        """
        keep_alive = self.keep_alive
        idle_time = keep_alive if self.keep_alive_timed else math.inf
        if self.pressed:
            pressure = self.pressure
            self.headers_timeout_now = shrink(self.settings.headers_timeout, pressure)
            shrunk = shrink(keep_alive, pressure)
            self.idle_time_now = shrunk if shrunk < keep_alive else idle_time
        else:
            self.headers_timeout_now = self.settings.headers_timeout
            self.idle_time_now = idle_time

    def _work(self, floor: float = 0.0, carrying: bool = False) -> bool:
        """Cut off what is due, within ``SWEEP_TIME``; whether everything due was done.

        ``floor``: the time the timer was armed for, if it fired (now is no
        earlier).  ``carrying``: the last sweep did not finish; this one runs
        the steps it left, and all of them once ``CARRY_ON_WHOLE`` has passed
        since the last that did (connlist.core.timer).
        """
        started = self.clock()
        now = max(started, floor)
        if carrying and started < self._whole_by:
            steps = self._left
        else:
            steps = STEPS
            self._whole_by = started + CARRY_ON_WHOLE
        if self.pressed:
            self.pressed = self.pressure > PRESSURE_WATERMARK
            self._apply_pressure()
        elif steps is STEPS:
            self._apply_pressure()
        stop = started + SWEEP_TIME
        left: list[Step] = []
        for i, step in enumerate(steps):
            # A step that stopped at its own limit (the keep-alive's per
            # iteration) leaves the others their turn; the sweep's time, none.
            if left and self.clock() > stop:
                left += steps[i:]
                break
            if not step.run(self, now, stop):
                left.append(step)
        self._left = tuple(left)
        if left:
            return False
        self.summary.flush(self.clock())
        return True

    def join(
        self, client: Address = None, server: Address = None, handle: ConnectionHandle | None = None
    ) -> Connection:
        """A new connection: it joins the list, counted, within the budget (``admit``), and it is watched.

        The server layer's one call per connection, at connect; the record
        leaves the list at ``ConnectionsList.remove``.
        """
        connections = self.connections
        record = connections.connect(client, server, handle)
        self.totals.connections += 1
        if connections.occupied > self._quiet_below:
            self.admit(record)  # max_connections: may make room, or refuse this one
        if self._timer is None and self._carry is None:
            self._arm()
        return record

    def request_received(self, record: Connection) -> None:
        """A request's headers are complete: it goes to the app (or waits behind the one running), counted."""
        connections = self.connections
        connections.headers_complete(record)
        connections.response_begin(record)
        self.totals.requests += 1

    def _idle_joined(self, record: Connection) -> None:
        """A response's end put ``record`` in the idle queue: the timer fires by the end of its keep-alive.

        (Not called for a record already queued: the timer, armed while the
        queue holds any, fires by the end of its oldest idle time already.)
        """
        if self.keep_alive_timed:
            due = record.responded_at + self.keep_alive
            if due < self.timer_at:
                self.wake_by(due)

    def attach(self, loop: asyncio.AbstractEventLoop, keep_alive: float | None) -> None:
        """The server's first connection on ``loop``: learn its keep-alive time, watch accept's failures.

        asyncio and uvloop report an ``accept()`` that failed for want of
        descriptors to the loop's exception handler, asyncio with a
        traceback each time (and it stops accepting for a second).  The
        first is logged once with the numbers; later ones are counted
        (``accept_failures``), not logged.
        """
        if keep_alive is not None and keep_alive >= 0:
            self.keep_alive = float(keep_alive)
        if self.attached_loop is loop:
            return
        self.attached_loop = loop
        get_handler = getattr(loop, "get_exception_handler", None)
        if get_handler is None:
            # A loop with only what the protocols use (uvicorn's own tests' MockLoop):
            # no accept() to watch there.
            return
        previous = get_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
            if context.get("message") in _ACCEPT_ERRORS and _out_of_descriptors(context.get("exception")):
                self._accept_failed(context.get("exception"))
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)

    def _accept_failed(self, exc: object) -> None:
        self.totals.accept_failures += 1
        if self.totals.accept_failures == 1:
            _log_out_of_descriptors(exc, len(self.connections), self.settings.max_connections)

    # -- closing -------------------------------------------------------------

    def count(self, kind: Kind, conn: Connection) -> None:
        """Count ``conn`` in ``kind``'s total, and in the log summary (a DEBUG line)."""
        totals = self.totals
        setattr(totals, kind.counter, getattr(totals, kind.counter) + 1)
        self.summary.add(kind.name, conn.client, self._detail(kind), room=kind.room)

    def _detail(self, kind: Kind) -> Callable[[], str]:
        """``kind``'s DEBUG line under this enforcer's settings, built only if it is written."""
        return lambda: kind.message.format(s=self.settings, now=self.headers_timeout_now)

    def report(self, conn: Connection, kind: TimeoutKind) -> None:
        """Count a timeout, log it, and call ``on_timeout``."""
        self.count(TIMEOUT_BY_NAME[kind], conn)
        on_timeout = self.on_timeout
        if on_timeout is not None:
            conn.keep_from_handle()  # the callback may keep the record
            started = self.clock()
            try:
                on_timeout(conn, kind)
            except Exception:
                if self._failure_logged:
                    self.summary.failures += 1
                else:
                    self._failure_logged = True
                    logger.exception(
                        "on_timeout callback failed; closing the connection anyway "
                        "(later failures are counted in the summary)"
                    )
            elapsed = self.clock() - started
            if elapsed > SLOW_CALLBACK and not self._slow_callback_warned:
                self._slow_callback_warned = True
                log.warning(
                    "on_timeout took %.0f ms; it runs on the event loop and delays every "
                    "connection behind it: keep it short (this warning is not repeated)",
                    elapsed * 1000,
                )

    def cut(self, conn: Connection, kind: TimeoutKind) -> None:
        """An expired connection: count, log, call back, then 408 (if possible) and close, and linger."""
        self.report(conn, kind)
        handle = conn.handle
        if handle is not None:
            self.call(handle.connlist_close_expired)
            self.connections.linger(conn)

    def overflow(self, conn: Connection, close: Callable[[], object]) -> None:
        """A request head past ``max_header_size``: count and log it, ``close`` (431 if it can), linger.

        Not a timeout: ``on_timeout`` is not called.  The protocol that saw
        the head pass the limit calls it from its read, before its parser has
        seen the bytes past it, with its own close (``connlist_close_overflow``:
        only a server integration sees a head).
        """
        self.count(HEADER_OVERFLOW, conn)
        connections = self.connections
        connections.time_out(conn)
        self.call(close)
        connections.linger(conn)
        self.bring_forward(self.clock() + self.linger)

    def close_keepalive(self, batch: list[Connection], now: float) -> None:
        """Idle connections at their keep-alive time (shortened under pressure, see ``shrink``): closed.

        At uvicorn's own time each is counted and closed as uvicorn closes
        it; sooner, under pressure, each is counted and logged as the
        budget's cuts are, closed, and aborted if it does not go within the
        linger.  ``now``: the sweep's (``keepalive_closed_at``).  A batch
        per call: a mass close makes thousands.
        """
        self.keepalive_closed_at = now
        if self.idle_time_now < self.keep_alive:
            for conn in batch:
                self.connections.evict(conn)
                self.count(TIMEOUT_BY_NAME["keepalive"], conn)
                if conn.handle is not None:
                    self.call(conn.handle.connlist_close_idle)
            return
        self.totals.keepalive_timeouts += len(batch)
        for conn in batch:
            handle = conn.handle
            if handle is not None:
                # ``call``, written out: one call less per connection.
                try:
                    handle.connlist_close_keepalive()
                except Exception:  # a handle must not stop the sweep
                    logger.exception("closing a connection failed")

    def rate_walked(self, rate_next: float | None, grace_end: float | None) -> None:
        """What the rate step's walk found (``sweep.rate_expired``): no body is due before either."""
        self.rate_next = rate_next
        self.grace_end = grace_end

    @staticmethod
    def call(method: Callable[[], object]) -> None:
        try:
            method()
        except Exception:  # pragma: no cover - a handle must not stop the sweep
            logger.exception("closing a connection failed")
