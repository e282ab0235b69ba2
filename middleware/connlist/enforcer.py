"""Per-worker enforcement of every timeout, with one timer.

Node.js checks its ConnectionsList every ``connectionsCheckingInterval``
(30 s by default), so its ``408`` can come up to 30 s late.  connlist keeps one
``loop.call_later`` timer per worker instead, armed at the earliest moment
anything can be due:

* a request's headers or request timeout (``ConnectionsList.next_deadline``
  finds it near the head of the ordered ``active`` list);
* a body's minimum rate (the bodies past their grace period, at the head of
  ``body``; the others cannot be due before their grace ends);
* a stalled response's next sample: a stalled connection is sampled every
  ``send_timeout / 4`` and cut once it made no progress for its allowance
  (``connections.send_allowance``: ``send_timeout``, or longer for a client
  whose window opens in large steps), so it is cut up to ``send_timeout /
  4`` (plus the timer's lateness) after its allowance ran out.  Progress is
  what the client acknowledged (``TCP_INFO``), or, where the kernel does not
  tell, fewer bytes unsent;
* a closed connection's linger (``LINGER``), after which it is aborted;
* the next log summary, while one is pending;
* under pressure (see below), an idle connection's shortened keep-alive
  time, and at least every ``PRESSURE_TICK``.

After each sweep the timer is armed again, never further away than
``Settings.shortest``: anything that starts a clock after the timer was armed
(a request, a body, a stall) cannot be due before that, so it never has to
move the timer, only to arm one if there is none (``watch``).  A timer is
armed only while something can be due: a connection is active, stalled or
closing, or a log summary is pending.  The server layer's common case, a
whole request in one read on an idle connection, never makes one active, so
it never touches the timer; and a loop with no timer of ours in its heap does
less at each iteration (asyncio's loop reads its clock at every iteration
while any timer is scheduled: about 1,400 instructions per request of a hello
world in benchmarks/per_request.py).  ``unwatch`` cancels the timer once
nothing can be due; a close that starts a linger outside a sweep brings the
timer forward.

Cutting a connection off costs tens of microseconds (the ``408``, the
transport, the callback), so a mass timeout is spread over loop iterations:
one sweep spends at most ``BUDGET`` seconds closing, then yields to the loop
and carries on at the next iteration, so requests of other clients are served
in between.

The connection budget (``max_connections``) is kept at connect, not by the
timer: the server layer calls ``admit`` once per new connection, and over
the budget one connection goes, the first that exists of: the longest-idle
keep-alive connection (closed), the oldest still sending its headers (``408``,
then aborted), the body furthest behind the minimum rate (the same), and
only when every connection is a request being served, the new one (``503``).
Above ``PRESSURE_WATERMARK`` of the budget the enforcer is *pressed*: its
sweeps shrink the headers timeout and the keep-alive idle time (``shrink``,
linear down to ``PRESSURE_FLOOR`` at the budget) and pass them to the same
ordered walks, so one timer still serves every deadline.

The server layer (``connlist.uvicorn``), or ``connlist.asgi`` in ASGI-only
mode, feeds the list, calls ``watch()`` after any event that can make
something due (``connect``, ``message_begin``, ``stall``) and ``unwatch()``
after one that can leave nothing due (``message_complete``, ``remove``); what
is due is closed through the connection's handle.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal, get_args

from connlist.connections import Connection, ConnectionsList, send_allowance
from connlist.logs import Summary, log, logger
from connlist.settings import Settings

__all__ = [
    "BUDGET",
    "BUDGET_KINDS",
    "LINGER",
    "PRESSURE_FLOOR",
    "PRESSURE_WATERMARK",
    "STATE_KEY",
    "TIMEOUT_KINDS",
    "Enforcer",
    "Kind",
    "RoomKind",
    "TimeoutKind",
    "Totals",
    "shrink",
]

# The key under which the middleware hands its enforcer to the server's
# protocols, in the ASGI lifespan state (uvicorn gives every protocol it).
STATE_KEY = "connlist.enforcer"

# A timer that fires exactly at a deadline finds nothing expired: Node's rule
# is strict (``start < now - timeout``).  Fire this much later.
_SLACK = 0.001
# How long a connection connlist closed may take to go (long enough for a
# well-behaved client to read the 408) before it is aborted.
LINGER = 1.0
# Seconds of cutting-off work per loop iteration, and how many connections
# are taken from a list at a time between two looks at the clock.
BUDGET = 0.008
_BATCH = 32
# A body that keeps just ahead of the minimum rate is looked at again no
# sooner than this: the cost of watching it stays bounded, the cut-off at most
# this late.
RATE_RESOLUTION = 0.1
# An on_timeout callback that runs longer than this is warned about, once.
SLOW_CALLBACK = 0.010

# The names of the rows of TIMEOUT_KINDS, as on_timeout receives them.
TimeoutKind = Literal["headers", "request", "rate", "send"]
# What went to make room for a new connection at the budget (see Enforcer.admit).
RoomKind = Literal["idle", "headers", "body", "refused"]

# Pressure: above this share of max_connections the headers timeout and the
# keep-alive idle time shrink, linearly, to PRESSURE_FLOOR seconds at the
# budget (Envoy's overload manager, reduce_timeouts).
PRESSURE_WATERMARK = 0.8
PRESSURE_FLOOR = 2.0
# While under pressure the timer fires at least this often, so that deadlines
# moved earlier by a rising pressure are met within it.
PRESSURE_TICK = 0.25
# uvicorn's --timeout-keep-alive default, until a protocol tells its own.
KEEP_ALIVE = 5.0
# Bodies looked at for the slowest one, when no idle or header-reading
# connection can make room.
BODY_LOOK = 32
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


def _reading_paused(conn: Connection) -> bool:
    """A body behind the rate is excused while the server, not the client, holds it up."""
    handle = conn.handle
    return handle is not None and handle.connlist_reading_paused()


OnTimeout = Callable[[Connection, TimeoutKind], object]


@dataclass
class Totals:
    """Counters since the worker started: one ``<kind>_timeouts`` per ``TimeoutKind``.

    Every count is an explicit increment by the one feeder that sees the
    event: ``connections`` and ``requests`` by the server integration's
    protocols (``connlist.uvicorn``), or by ASGI-only mode (``connlist.asgi``),
    which counts each request once in each (a request is a connection of its
    own there); the timeouts by the enforcer.  So the counts stay exact when
    one feeder takes over from the other at a lifespan restart.
    """

    connections: int = 0
    requests: int = 0
    headers_timeouts: int = 0
    request_timeouts: int = 0
    rate_timeouts: int = 0
    send_timeouts: int = 0
    # Connections let go to make room at max_connections, by kind
    # (``<kind>_evictions``: RoomKind), idle ones closed under pressure (the
    # keep-alive idle time shrunk), and new ones refused with 503.
    idle_evictions: int = 0
    headers_evictions: int = 0
    body_evictions: int = 0
    keepalive_evictions: int = 0
    refused: int = 0
    # accept() failed for want of descriptors (logged once).
    accept_failures: int = 0


# -- the kinds -----------------------------------------------------------------
#
# Every way the enforcer cuts a connection, or lets one go, is one row of
# TIMEOUT_KINDS or BUDGET_KINDS: the enforcer counts, logs and sweeps by the
# rows, the views (connlist.debug, connlist.page) and the metrics
# (connlist.prometheus) list them from the rows.  A new kind is a row here,
# its Totals field, its step (if a sweep finds it), and the list and the
# feeder's event that give it its connections.

# A step of the sweep: cuts what is due in one list, within the budget
# (``stop``, a clock value); whether it finished (see Enforcer._drain).
Step = Callable[["Enforcer", float, float], bool]


@dataclass(frozen=True)
class Kind:
    """One row of TIMEOUT_KINDS or BUDGET_KINDS."""

    # The name on_timeout, the log lines and the metrics' ``kind`` label use.
    name: str
    # Its field of Totals.
    counter: str
    # The Settings field that turns it on (a value of 0 turns it off), and
    # what the views call it; None: on with max_connections.
    setting: str | None
    label: str
    # The unit of the setting's value, as the views write it.
    unit: str
    # The ConnectionsList list its connections are found in.
    list: str
    # Its DEBUG line, formatted with ``s`` (the Settings) and ``now`` (the
    # headers timeout the last sweep applied, shortened under pressure).
    message: str
    # What the metrics' help says of it, and whether it is a row of
    # BUDGET_KINDS (let go for max_connections: the summary's budget part).
    help: str = ""
    room: bool = False
    # Whether ASGI-only mode can enforce it: it sees a request once its
    # headers are in, and never sees the response stall (docs/how-it-works.md).
    asgi: bool = False
    # The sweep's step that finds and cuts it (None: admit's, Enforcer._make_room).
    step: Step | None = None

    def detail(self, enforcer: Enforcer) -> Callable[[], str]:
        """Its DEBUG line for ``enforcer``, built only if it is written."""
        return lambda: self.message.format(s=enforcer.settings, now=enforcer.headers_timeout_now)


def _step_keepalive(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Under pressure: keep-alive connections idle longer than the shrunk idle time, closed."""
    idle_time = enforcer.idle_time_now
    if idle_time >= enforcer.keep_alive:
        return True
    connections = enforcer.connections
    kind = BUDGET_BY_NAME["keepalive"]

    def close(conn: Connection) -> None:
        connections.let_go(conn)
        enforcer.count(kind, conn)
        if conn.handle is not None:
            enforcer._call(conn.handle.connlist_close_idle)

    return enforcer._drain(lambda n: connections.idle_expired(idle_time, now, n), close, stop)


def _step_active(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Headers and request timeouts, one walk of ``active`` (Node's rule)."""
    settings = enforcer.settings
    headers_timeout = enforcer.headers_timeout_now
    if not (headers_timeout or settings.request_timeout):
        return True
    connections = enforcer.connections

    def cut(conn: Connection) -> None:
        headers = settings.headers_timeout and not conn.headers_completed
        enforcer._cut(conn, "headers" if headers else "request")

    return enforcer._drain(
        lambda n: connections.expired(headers_timeout, settings.request_timeout, n), cut, stop
    )


def _step_rate(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Bodies behind the minimum rate, past their grace (``body``)."""
    settings = enforcer.settings
    if not settings.body_min_rate:
        return True
    connections = enforcer.connections

    def take(n: int) -> list[Connection]:
        batch, enforcer._rate_next, enforcer._grace_end = connections.rate_expired(
            settings.body_min_rate, settings.body_grace, now, n, _reading_paused
        )
        return batch

    return enforcer._drain(take, lambda conn: enforcer._cut(conn, "rate"), stop)


def _step_send(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Stalled responses: sampled, and those without progress for their allowance aborted."""
    send_timeout = enforcer.settings.send_timeout
    if not send_timeout:
        return True
    connections = enforcer.connections
    # Samples are stamped now, and a stall that began during this sweep (a
    # callback wrote) may be stamped later than its start.
    now = enforcer.clock()

    def sample(conn: Connection) -> None:
        handle = conn.handle
        if handle is None:
            pending, acked = 0, None
        else:
            pending, acked = handle.connlist_pending(), handle.connlist_acked()
        still = connections.stall_sample(conn, pending, now, acked)
        if still >= send_allowance(send_timeout, conn.out_step):
            connections.unstall(conn)
            enforcer._record(conn, "send")
            if handle is not None:
                enforcer._call(handle.connlist_abort)

    return enforcer._drain(lambda n: connections.stalled_due(send_timeout / 4, now, n), sample, stop)


def _step_linger(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Closed connections that did not go within the linger, aborted."""
    connections = enforcer.connections

    # Read again: the steps before may have taken a while.
    now = enforcer.clock()

    def abort(conn: Connection) -> None:
        if conn.handle is not None:
            enforcer._call(conn.handle.connlist_abort)

    return enforcer._drain(lambda n: connections.lingered(enforcer.linger, now, n), abort, stop)


TIMEOUT_KINDS = (
    Kind(
        "headers",
        "headers_timeouts",
        "headers_timeout",
        "headers timeout",
        "s",
        "active",
        "headers not received within {now:g}s, closing",
        step=_step_active,
    ),
    Kind(
        "request",
        "request_timeouts",
        "request_timeout",
        "request timeout",
        "s",
        "active",
        "request not received within {s.request_timeout:g}s, closing",
        asgi=True,
        step=_step_active,
    ),
    Kind(
        "rate",
        "rate_timeouts",
        "body_min_rate",
        "minimum body rate",
        "bytes/s",
        "body",
        "body slower than {s.body_min_rate:g} bytes/s, closing",
        asgi=True,
        step=_step_rate,
    ),
    Kind(
        "send",
        "send_timeouts",
        "send_timeout",
        "send timeout",
        "s",
        "stalled",
        "response not taken for {s.send_timeout:g}s or more, aborting",
        step=_step_send,
    ),
)

# In the order admit looks for room (keepalive is the sweep's, under pressure).
BUDGET_KINDS = (
    Kind(
        "idle",
        "idle_evictions",
        None,
        "max_connections",
        "connections",
        "idle",
        "longest-idle keep-alive connection closed at {s.max_connections} connections",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "headers",
        "headers_evictions",
        None,
        "max_connections",
        "connections",
        "active",
        "oldest connection sending its headers cut at {s.max_connections} connections (408)",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "body",
        "body_evictions",
        "body_min_rate",
        "max_connections",
        "connections",
        "body",
        "slowest body cut at {s.max_connections} connections (408)",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "keepalive",
        "keepalive_evictions",
        None,
        "max_connections",
        "connections",
        "idle",
        "idle keep-alive connection closed under pressure",
        help="idle past the keep-alive time shortened under pressure",
        room=True,
        step=_step_keepalive,
    ),
    Kind(
        "refused",
        "refused",
        None,
        "max_connections",
        "connections",
        "all",
        "refused with 503: {s.max_connections} connections all serving requests",
        help="503",
        room=True,
    ),
)

TIMEOUT_BY_NAME = {kind.name: kind for kind in TIMEOUT_KINDS}
BUDGET_BY_NAME = {kind.name: kind for kind in BUDGET_KINDS}
# The sweep's steps, in order: each list once, the closing connections last.
STEPS: tuple[Step, ...] = (
    *dict.fromkeys(kind.step for kind in (*BUDGET_KINDS, *TIMEOUT_KINDS) if kind.step is not None),
    _step_linger,
)


def _check_kinds() -> None:
    # The rows, their names for on_timeout and their counters agree.
    counters = {field.name for field in fields(Totals)}
    for kind in (*TIMEOUT_KINDS, *BUDGET_KINDS):
        if kind.counter not in counters:  # pragma: no cover - a row without its Totals field
            raise AssertionError(f"Totals has no field {kind.counter!r} for the kind {kind.name!r}")
    if tuple(TIMEOUT_BY_NAME) != get_args(TimeoutKind):  # pragma: no cover - a row without its name
        raise AssertionError("TimeoutKind must list the names of TIMEOUT_KINDS, in order")
    if set(get_args(RoomKind)) - set(BUDGET_BY_NAME):  # pragma: no cover
        raise AssertionError("every RoomKind must be a row of BUDGET_KINDS")


_check_kinds()


class Enforcer:
    """One worker's ConnectionsList, its settings, its timer, its counters and its log summary.

    The timer runs on ``loop`` if one is given (it uses ``call_later``,
    ``call_soon`` and ``is_closed``: the tests give a mock loop and move
    ``clock`` by hand), else on the loop running when it is armed.
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
        self.connections = ConnectionsList(clock)
        self.settings = Settings() if settings is None else settings
        self.on_timeout = on_timeout
        self.totals = Totals()
        self.summary = Summary()
        # "asgi" until a connlist protocol of the server announces itself
        # (or the server's start tells which is in use: connlist.integration).
        self.mode = "asgi"
        # Why the server integration is off, once that is known (None: it is
        # on, or not known yet); and whether ASGI-only mode was logged.
        self.integration_off: str | None = None
        self.asgi_told = False
        # The list's clock.
        self.clock = clock
        self.linger = linger
        self.loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        # A sweep that ran out of its budget continues at the next iteration.
        self._continuing = False
        self._soon: asyncio.Handle | None = None
        # From the last sweep: the earliest rate deadline of the bodies it
        # kept, and the end of the next grace period (see rate_expired).
        self._rate_next: float | None = None
        self._grace_end: float | None = None
        self._slow_callback_warned = False
        self._failure_logged = False
        # Above the watermark of the budget (see admit and pressure).
        self.pressed = False
        # uvicorn's keep-alive idle time (the protocol tells it: attach).
        self.keep_alive = KEEP_ALIVE
        self.attached_loop: asyncio.AbstractEventLoop | None = None

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._settings = settings
        # The headers timeout the last sweep applied (shortened under pressure).
        self.headers_timeout_now = settings.headers_timeout
        # Connections up to which admit has nothing to do.
        budget = settings.max_connections
        self._quiet_below = budget * PRESSURE_WATERMARK if budget else math.inf
        # The keep-alive idle time the last sweep applied (shortened under pressure).
        self.idle_time_now = math.inf

    @property
    def headers_timeout(self) -> float:
        return self.settings.headers_timeout

    @property
    def request_timeout(self) -> float:
        return self.settings.request_timeout

    def deadline(self, conn: Connection) -> tuple[str, float] | None:
        """Which timeout cuts ``conn`` off first under this enforcer's settings, and when; or None.

        ``ConnectionsList.deadline`` has the rules; the debug view shows it.
        """
        s = self.settings
        return self.connections.deadline(
            conn, s.headers_timeout, s.request_timeout, s.send_timeout, s.body_min_rate, s.body_grace
        )

    def configure(self, settings: Settings, *, on_timeout: OnTimeout | None) -> None:
        """Take over another owner's settings (already validated); re-arm the timer."""
        self.settings = settings
        self.on_timeout = on_timeout
        self.cancel()
        self.watch()

    # -- the timer -----------------------------------------------------------

    def watch(self) -> None:
        """Arm the timer if none is armed; call after ``connect``, ``message_begin`` and ``stall``."""
        if self._timer is None and not self._continuing:
            self._arm()

    def unwatch(self) -> None:
        """Cancel the timer if nothing can be due; call after ``message_complete`` and ``remove``."""
        if self._timer is not None and not self._anything_due():
            self.cancel()

    def _anything_due(self) -> bool:
        connections = self.connections
        return bool(
            connections.active_count  # a body being received is active too
            or connections.stalled_count
            or connections.closing_head_since() is not None
            or self.summary.pending
            or self.pressed
        )

    def cancel(self) -> None:
        """Forget the timer (and a sweep waiting to carry on): a server is starting, or nothing is due."""
        loop = self._timer_loop
        live = loop is not None and not loop.is_closed()
        if self._timer is not None:
            if live:
                self._timer.cancel()
            self._timer = None
        if self._soon is not None:
            if live:
                self._soon.cancel()
            self._soon = None
            self._continuing = False
        self._timer_loop = None

    def bring_forward(self, when: float) -> None:
        """Make sure the timer fires by ``when`` (a clock value): for clocks started outside a sweep."""
        if self._continuing or (self._timer is not None and self._timer_at <= when):
            return
        self.cancel()
        self._arm()

    def _next_due(self, now: float) -> float | None:
        """The earliest clock value at which anything can be due, or None if nothing can."""
        settings = self.settings
        connections = self.connections
        candidates: list[float] = []
        headers_timeout = settings.headers_timeout
        if self.pressed:
            pressure = self.pressure
            headers_timeout = shrink(headers_timeout, pressure)
            idle_time = shrink(self.keep_alive, pressure)
            since = connections.idle_head_since()
            if idle_time < self.keep_alive:
                # Unstamped records are stamped at the next sweep.
                candidates.append(now + PRESSURE_TICK if since is None else since + idle_time + _SLACK)
            # Deadlines move earlier as the pressure rises.
            candidates.append(now + PRESSURE_TICK)
        deadline = connections.next_deadline(headers_timeout, settings.request_timeout)
        if deadline is not None:
            candidates.append(deadline + _SLACK)
        if settings.body_min_rate:
            # Bodies begun since the last sweep cannot be due before
            # ``Settings.shortest`` from now, which bounds every delay.
            if self._rate_next is not None:
                candidates.append(max(self._rate_next + _SLACK, now + RATE_RESOLUTION))
            if self._grace_end is not None:
                candidates.append(self._grace_end + _SLACK)
        if settings.send_timeout:
            sampled = connections.stalled_head_sampled()
            if sampled is not None:
                candidates.append(sampled + settings.send_timeout / 4)
        since = connections.closing_head_since()
        if since is not None:
            candidates.append(since + self.linger)
        if self.summary.pending:
            candidates.append(self.summary.due)
        return min(candidates) if candidates else None

    def _arm(self) -> None:
        now = self.clock()
        due = self._next_due(now)
        shortest = self.settings.shortest
        if due is None:
            if not shortest or not self._anything_due():
                return  # nothing can be due until a connection is active, stalled or closing
            # A body that began since the last sweep (with no other timeout on).
            due = now + shortest
        elif shortest:
            # Never later: what starts a clock after this cannot be due earlier than that.
            due = min(due, now + shortest)
        loop = self.loop or asyncio.get_running_loop()
        delay = max(due - now, 0.0)
        self._timer = loop.call_later(delay, self._sweep)
        self._timer_at = now + delay
        self._timer_loop = loop

    def _sweep(self) -> None:
        self._timer = None
        self._soon = None
        self._continuing = False
        if self._work():
            self.summary.flush(self.clock())
            self._arm()
        else:
            # Out of budget: carry on at the next loop iteration, after the
            # I/O that is ready (other clients) has been served.
            self._continuing = True
            loop = self.loop or asyncio.get_running_loop()
            self._soon = loop.call_soon(self._sweep)
            self._timer_loop = loop

    def _work(self) -> bool:
        """Cut off what is due, within ``BUDGET``; whether everything due was done."""
        now = self.clock()
        stop = now + BUDGET
        settings = self.settings
        headers_timeout = settings.headers_timeout
        self.idle_time_now = math.inf
        if self.pressed:
            pressure = self.pressure
            self.pressed = pressure > PRESSURE_WATERMARK
            headers_timeout = shrink(headers_timeout, pressure)
            self.idle_time_now = shrink(self.keep_alive, pressure)
        self.headers_timeout_now = headers_timeout
        return all(step(self, now, stop) for step in STEPS)

    def _drain(
        self, take: Callable[[int], list[Connection]], act: Callable[[Connection], object], stop: float
    ) -> bool:
        """A step's loop: ``act`` on the batches ``take`` finds, until one is short or ``stop`` passed.

        Whether the list has nothing more due (False: the budget ran out).
        """
        while True:
            batch = take(_BATCH)
            for conn in batch:
                act(conn)
            if len(batch) < _BATCH:
                return True
            if self.clock() > stop:
                return False

    # -- the connection budget ------------------------------------------------

    @property
    def pressure(self) -> float:
        """Connections counted against ``max_connections``, as a share of it (0 without a budget)."""
        budget = self.settings.max_connections
        return self.connections.occupied / budget if budget else 0.0

    def admit(self, record: Connection) -> None:
        """A new connection joined the list: make room if the worker is over its budget.

        Called by the server layer once per connection, after ``connect``.
        Over ``max_connections``, one connection goes, the first of these
        that exists (each found in O(1) from the head of a list, see
        ConnectionsList): the longest-idle keep-alive connection (closed, as
        nginx reuses connections); the oldest connection still sending its
        headers, or connected and silent (``408``, then aborted); the body
        furthest behind ``body_min_rate``; and only if every other
        connection is a request being served, the new one, refused with
        ``503``.  A request being served is never cut to make room.  Crossing
        ``PRESSURE_WATERMARK`` of the budget starts the shorter timeouts.
        """
        occupied = self.connections.occupied
        if occupied <= self._quiet_below:
            return  # under the watermark (or no budget): one comparison per connection
        if occupied > self._settings.max_connections:
            self._make_room(record)
        if not self.pressed:
            self.pressed = True
            self.bring_forward(self.clock() + PRESSURE_TICK)

    def _make_room(self, record: Connection) -> None:
        connections = self.connections
        settings = self.settings
        kind: RoomKind
        victim = connections.idle_oldest()
        if victim is not None:
            kind = "idle"
        else:
            victim = connections.headers_oldest(record)
            if victim is not None:
                kind = "headers"
            elif settings.body_min_rate and (
                victim := connections.body_slowest(
                    settings.body_min_rate, self.clock(), BODY_LOOK, _reading_paused
                )
            ):
                kind = "body"
            else:
                victim, kind = record, "refused"
        self.count(BUDGET_BY_NAME[kind], victim)
        connections.let_go(victim)
        handle = victim.handle
        if handle is not None:
            if kind == "idle":
                # Closed, never aborted: one that will not close now is already
                # closing, flushing its last response (``Connection: close``),
                # and an abort is a reset that would drop that response.
                self._call(handle.connlist_close_idle)
            elif kind == "refused":
                self._call(handle.connlist_refuse)
            else:
                # The 408 is written first: a client that sent a request head in time reads why.
                self._call(handle.connlist_close_expired)
                self._call(handle.connlist_abort)
        self.watch()

    def attach(self, loop: asyncio.AbstractEventLoop, keep_alive: float | None) -> None:
        """The server's first connection on ``loop``: learn its keep-alive time, watch accept's failures.

        asyncio and uvloop report an ``accept()`` that failed for want of
        descriptors to the loop's exception handler, asyncio with a
        traceback each time (and it stops accepting for a second).  The
        first is logged once with the numbers; later ones are counted
        (``accept_failures``), not logged.
        """
        if keep_alive is not None and keep_alive > 0:
            self.keep_alive = float(keep_alive)
        if self.attached_loop is loop:
            return
        self.attached_loop = loop
        previous = loop.get_exception_handler()

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
        if self.totals.accept_failures > 1:
            return
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
            len(self.connections),
            self.settings.max_connections,
            soft,
            open_fds,
        )

    # -- closing -------------------------------------------------------------

    def count(self, kind: Kind, conn: Connection) -> None:
        """Count ``conn`` in ``kind``'s total, and in the log summary (a DEBUG line)."""
        totals = self.totals
        setattr(totals, kind.counter, getattr(totals, kind.counter) + 1)
        self.summary.add(kind.name, conn.client, kind.detail(self), room=kind.room)

    def _record(self, conn: Connection, kind: TimeoutKind) -> None:
        """Count a timeout, log it, and call ``on_timeout``."""
        self.count(TIMEOUT_BY_NAME[kind], conn)
        on_timeout = self.on_timeout
        if on_timeout is not None:
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

    def _cut(self, conn: Connection, kind: TimeoutKind) -> None:
        """An expired connection: count, log, call back, then 408 (if possible) and close, and linger."""
        self._record(conn, kind)
        handle = conn.handle
        if handle is not None:
            self._call(handle.connlist_close_expired)
            self.connections.linger(conn)

    @staticmethod
    def _call(method: Callable[[], object]) -> None:
        try:
            method()
        except Exception:  # pragma: no cover - a handle must not stop the sweep
            logger.exception("closing a connection failed")
