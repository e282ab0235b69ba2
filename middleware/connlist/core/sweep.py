"""The enforcer's sweep: its steps, one per list, and the walks over the queues they take.

Theory of operation.  When the enforcer's timer fires, ``Enforcer._work``
runs the ``STEPS`` in order, each over one list of ``ConnectionsList``:
``run(enforcer, now, stop)`` cuts what is due, within the sweep's time
(``stop``, a clock value), and says whether it finished (``drain``);
``due(enforcer, now)`` is the earliest clock value at
which it can find anything (None: nothing in its list can be due), where the
timer is armed next.  Each walk starts at the head of its list and stops at
the first record too young to be due, so its cost is that of what it finds.
Each step takes what is due in batches, and tells the enforcer
what to cut (``Enforcing``: ``cut``, ``report``, ``close_keepalive``) and
what its walk found (``rate_walked``): the enforcer writes its own state,
the steps read it.  The pressure it applies (``headers_timeout_now``,
``idle_time_now``) is set before any step or due time is asked for.  The
rules are the table's (``connlist.core.kinds``); every timeout kind is cut
by one step (``Step.kinds``, checked at import).

The idle order.  ``ConnectionsList.idle_queue`` is a heap of idle
connections keyed by a clock value no later than the start of their idle
time: a record joins at ``message_complete``, keyed by its message's start
(no clock is read there).  A whole request on an idle connection
(``message``, the common case) neither moves it nor reads a clock, so when a
walk finds a record at the top, its key may be behind.  ``idle_look``
therefore gives it a second chance, as the CLOCK page-replacement algorithm
does, and corrects its key on the way:

* a record serving a request (``responding``), or whose client is taking a
  response (stalled), goes back keyed now: its idle time starts later;
* a record whose last response ended after its key (``responded_at``: the
  server layer writes it at each response's end) goes back keyed by that
  time, exactly;
* one with no response ended since its message did (the response ended
  before the request's body, or the feeder does not say) goes back keyed
  now: its idle time counts from the first look;
* one that is no longer idle (a request began, it expired, it is closing,
  it was let go) leaves the heap, to join again at its next
  ``message_complete``;
* the rest is idle since its key: the keep-alive step (``idle_expired``)
  closes it once that is ``keep_alive`` ago, and the budget may let it go
  (``connlist.core.budget.idle_oldest``).

A record goes back at most once per idle time begun, so a connection is
looked at about once per keep-alive period, however many requests it
serves.  A request being served is never let go.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from connlist.core.connections import ConnectionsList
from connlist.core.kinds import TIMEOUT_KINDS, Settings, TimeoutKind, send_allowance
from connlist.core.records import OUT_CLOSING, OUT_STALLED, Connection

__all__ = [
    "STEPS",
    "Enforcing",
    "Step",
    "drain",
    "idle_expired",
    "idle_look",
    "lingered",
    "rate_expired",
    "reading_paused",
    "stall_sample",
    "stalled_due",
]

_INF = math.inf
# How many connections a step takes from its list at a time, between two looks at the clock.
_BATCH = 32


class Enforcing(Protocol):
    """What the steps read of the enforcer (``connlist.core.enforcer.Enforcer``), and what they tell it."""

    @property
    def connections(self) -> ConnectionsList: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def linger(self) -> float: ...
    @property
    def keep_alive(self) -> float: ...
    @property
    def headers_timeout_now(self) -> float: ...
    @property
    def idle_time_now(self) -> float: ...
    @property
    def rate_next(self) -> float | None: ...
    @property
    def grace_end(self) -> float | None: ...
    @property
    def keepalive_closed_at(self) -> float: ...
    def cut(self, conn: Connection, kind: TimeoutKind) -> None: ...
    def report(self, conn: Connection, kind: TimeoutKind) -> None: ...
    def close_keepalive(self, batch: list[Connection], now: float) -> None: ...
    def rate_walked(self, rate_next: float | None, grace_end: float | None) -> None: ...
    def call(self, method: Callable[[], object]) -> None: ...


def drain(
    clock: Callable[[], float],
    take: Callable[[int], list[Connection]],
    act: Callable[[Connection], object],
    stop: float,
) -> bool:
    """One step's loop: ``act`` on each batch ``take`` finds, until one is short.

    Whether the list has nothing more due (False: the sweep's time, ``stop``
    on ``clock``, ran out).
    """
    while True:
        batch = take(_BATCH)
        for conn in batch:
            act(conn)
        if len(batch) < _BATCH:
            return True
        if clock() > stop:
            return False


def idle_look(
    connections: ConnectionsList, nodes: list[Connection], now: float, due: list[Connection]
) -> None:
    """``nodes``, just taken off the idle queue: the ones idle since their key join ``due``.

    See "The idle order".  The others go back into the queue, keyed anew,
    or, no longer idle, leave it.  A batch per call: the keep-alive step
    looks at every connection of a mass close.
    """
    push = connections.idle_queue.push
    for node in nodes:
        if node.last_message_start != 0.0 or node.evicted or node.out_state == OUT_CLOSING:
            continue
        if node.responding or node.out_state == OUT_STALLED:
            push(node, now)
        elif node.responded_at > node.idle_since:
            push(node, node.responded_at)
        elif node.responded_at == 0.0:
            # No response ended since its message did (it ended first, or the
            # feeder does not say): idle from the first look on.
            node.responded_at = now
            push(node, now)
        else:
            due.append(node)


def idle_expired(connections: ConnectionsList, idle_time: float, now: float, limit: int) -> list[Connection]:
    """Take out and return up to ``limit`` connections idle (and closable) for ``idle_time`` or more."""
    take_through = connections.idle_queue.take_through
    bound = now - idle_time
    due: list[Connection] = []
    while len(due) < limit:
        taken = take_through(bound, limit - len(due))
        if not taken:
            break
        idle_look(connections, taken, now, due)
    return due


def rate_expired(
    connections: ConnectionsList,
    min_rate: float,
    grace: float,
    now: float,
    limit: int = -1,
    excused: Callable[[Connection], bool] | None = None,
) -> tuple[list[Connection], float | None, float | None]:
    """Unlink and return the bodies that fell behind ``min_rate`` bytes/s (after ``grace`` seconds).

    A body that began at ``t`` with ``b`` bytes received is behind when
    ``now > t + grace + b / min_rate``.  Expired connections leave
    ``body`` and ``active`` (they count as timed out, like ``expired``).
    A body behind for which ``excused(conn)`` is true (the server itself
    stopped reading it) is not the client's fault: its clock starts
    again, now, with a new grace period, at the tail of ``body``.
    Walks ``body`` from the head and stops at the first body still in
    its grace period, or after ``limit`` expired ones (``-1``: no
    limit).  For the timer, also returns the earliest deadline of the
    bodies it walked and kept, and the end of the grace period of the
    body it stopped at (each None if there is none): no other body can
    be due before either.
    """
    expired: list[Connection] = []
    earliest = _INF
    grace_end: float | None = None
    body = connections.body
    young = now - grace
    for node in body:
        started = node.body_started
        if started >= young:
            grace_end = started + grace
            break
        deadline = started + grace + node.body_received / min_rate
        if now > deadline and excused is not None and excused(node):
            node.body_started = now
            node.body_received = 0
            body.move_to_end(node)
        elif now > deadline:
            if len(expired) == limit:
                break
            connections.time_out(node)
            expired.append(node)
        elif deadline < earliest:
            earliest = deadline
    return expired, (None if earliest == _INF else earliest), grace_end


def stalled_due(connections: ConnectionsList, interval: float, now: float, limit: int) -> list[Connection]:
    """Up to ``limit`` stalled connections, oldest first, last sampled at least ``interval`` ago."""
    return connections.stalled.due(now - interval, limit)


def stall_sample(
    connections: ConnectionsList,
    conn: Connection,
    pending: int,
    now: float,
    acked: tuple[int, int] | None = None,
) -> float:
    """Record a sample of a stalled connection (``Connection.sample``); return how long it made no progress.

    The record moves to the tail of ``stalled``, stamped ``now`` (``now``
    must not be older than any stamp in the queue).
    """
    if conn.out_state != OUT_STALLED:
        return 0.0
    conn.sample(now, pending, acked)
    # To the tail: the least recently sampled stay ahead.
    connections.stalled.move_to_end(conn)
    return now - conn.out_since


def lingered(connections: ConnectionsList, linger: float, now: float, limit: int) -> list[Connection]:
    """Unlink and return up to ``limit`` closing connections closed at least ``linger`` ago."""
    done = connections.closing.due(now - linger, limit)
    for conn in done:
        connections.out_leave(conn)
    return done


# -- the steps ------------------------------------------------------------------------

# A timer that fires exactly at a deadline finds nothing expired: Node's rule
# is strict (``start < now - timeout``).  Fire this much later.
SLACK = 0.001
# A body that keeps just ahead of the minimum rate is looked at again no
# sooner than this: the cost of watching it stays bounded, the cut-off at most
# this late.
RATE_RESOLUTION = 0.1
# When keep-alive connections reach their time one after the other (a mass
# close: thousands went idle within seconds), the ones due within this of
# the last close are closed together, up to this late, rather than one sweep
# each (a sweep and the next arming cost about 25 us, a close about 5 us).
# A close with none in the window before it is exact, as uvicorn's own.
KEEPALIVE_BATCH = 0.02
# ... and at most this many per sweep, a sweep that carries on a
# millisecond later (connlist.core.timer.CARRY_PACE): a closed connection's
# connection_lost runs at the next iteration, tens of microseconds each, so
# a window's whole batch at once would hold a request that is ready for
# milliseconds.  uvicorn's own timers close what fell due at each iteration,
# about 10 a millisecond when thousands went idle within a second; 16 a
# millisecond keeps up with that.
KEEPALIVE_PER_SWEEP = 16


@dataclass(frozen=True)
class Step:
    """One step of the enforcer's sweep, over one list of ``ConnectionsList``, for the kinds it cuts.

    ``run(enforcer, now, stop)`` cuts what is due, within the sweep's
    time (``stop``, a clock value), and says whether it finished (see
    ``drain``); ``due(enforcer, now)`` is the earliest clock value
    at which it can find anything (None: nothing in its list can be due).
    """

    run: Callable[[Enforcing, float, float], bool]
    due: Callable[[Enforcing, float], float | None]
    # The names of the rows of connlist.core.kinds it cuts (``_steps_agree``).
    kinds: tuple[str, ...] = ()


def reading_paused(conn: Connection) -> bool:
    """A body behind the rate is excused while the server, not the client, holds it up."""
    handle = conn.handle
    return handle is not None and handle.connlist_reading_paused()


def _run_keepalive(enforcer: Enforcing, now: float, stop: float) -> bool:
    """Keep-alive connections idle for the keep-alive time (shortened under pressure), closed.

    At most ``KEEPALIVE_PER_SWEEP`` per sweep; the rest when the sweep
    carries on (False: not finished; ``connlist.core.timer``).
    """
    idle_time = enforcer.idle_time_now
    if idle_time == _INF:
        return True
    batch = idle_expired(enforcer.connections, idle_time, now, KEEPALIVE_PER_SWEEP)
    if batch:
        enforcer.close_keepalive(batch, now)
    return len(batch) < KEEPALIVE_PER_SWEEP


def _due_keepalive(enforcer: Enforcing, now: float) -> float | None:
    # Not SLACK later: uvicorn's rule is not strict, a connection idle for
    # exactly the keep-alive time is closed (its timer, call_later, fires then).
    since = enforcer.connections.idle_queue.head_stamp()
    idle_time = enforcer.idle_time_now
    if since is None or idle_time == _INF:
        return None
    # A mass close goes in batches (KEEPALIVE_BATCH).
    return max(since + idle_time, enforcer.keepalive_closed_at + KEEPALIVE_BATCH)


def _run_active(enforcer: Enforcing, now: float, stop: float) -> bool:
    """Headers and request timeouts, one walk of ``active`` (Node's rule)."""
    settings = enforcer.settings
    headers_timeout = enforcer.headers_timeout_now
    if not (headers_timeout or settings.request_timeout):
        return True
    connections = enforcer.connections

    def cut(conn: Connection) -> None:
        headers = settings.headers_timeout and not conn.headers_completed
        enforcer.cut(conn, "headers" if headers else "request")

    return drain(
        enforcer.clock, lambda n: connections.expired(headers_timeout, settings.request_timeout, n), cut, stop
    )


def _due_active(enforcer: Enforcing, now: float) -> float | None:
    deadline = enforcer.connections.next_deadline(
        enforcer.headers_timeout_now, enforcer.settings.request_timeout
    )
    return None if deadline is None else deadline + SLACK


def _run_rate(enforcer: Enforcing, now: float, stop: float) -> bool:
    """Bodies behind the minimum rate, past their grace (``body``)."""
    settings = enforcer.settings
    if not settings.body_min_rate:
        return True
    connections = enforcer.connections

    def take(n: int) -> list[Connection]:
        batch, rate_next, grace_end = rate_expired(
            connections, settings.body_min_rate, settings.body_grace, now, n, reading_paused
        )
        enforcer.rate_walked(rate_next, grace_end)
        return batch

    return drain(enforcer.clock, take, lambda conn: enforcer.cut(conn, "rate"), stop)


def _due_rate(enforcer: Enforcing, now: float) -> float | None:
    # From the last sweep: the earliest rate deadline of the bodies it kept,
    # and the end of the next grace period.  Bodies begun since cannot be
    # due before ``Settings.shortest`` from now, which bounds every delay.
    if not enforcer.settings.body_min_rate:
        return None
    candidates = []
    if enforcer.rate_next is not None:
        candidates.append(max(enforcer.rate_next + SLACK, now + RATE_RESOLUTION))
    if enforcer.grace_end is not None:
        candidates.append(enforcer.grace_end + SLACK)
    return min(candidates) if candidates else None


def _run_send(enforcer: Enforcing, now: float, stop: float) -> bool:
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
        still = stall_sample(connections, conn, pending, now, acked)
        if still >= send_allowance(send_timeout, conn.out_step):
            connections.unstall(conn)
            enforcer.report(conn, "send")
            if handle is not None:
                enforcer.call(handle.connlist_abort)

    return drain(enforcer.clock, lambda n: stalled_due(connections, send_timeout / 4, now, n), sample, stop)


def _due_send(enforcer: Enforcing, now: float) -> float | None:
    # A stalled connection is sampled every send_timeout / 4.
    send_timeout = enforcer.settings.send_timeout
    sampled = enforcer.connections.stalled.head_stamp() if send_timeout else None
    return None if sampled is None else sampled + send_timeout / 4


def _run_linger(enforcer: Enforcing, now: float, stop: float) -> bool:
    """Closed connections that did not go within the linger, aborted."""
    connections = enforcer.connections

    # Read again: the steps before may have taken a while.
    now = enforcer.clock()

    def abort(conn: Connection) -> None:
        if conn.handle is not None:
            enforcer.call(conn.handle.connlist_abort)

    return drain(enforcer.clock, lambda n: lingered(connections, enforcer.linger, now, n), abort, stop)


def _due_linger(enforcer: Enforcing, now: float) -> float | None:
    since = enforcer.connections.closing.head_stamp()
    return None if since is None else since + enforcer.linger


# The sweep's steps, in order: each list once, the closing connections last
# (not a kind: what was cut, and did not go within the linger, is aborted).
STEPS = (
    Step(_run_keepalive, _due_keepalive, ("keepalive",)),
    Step(_run_active, _due_active, ("headers", "request")),
    Step(_run_rate, _due_rate, ("rate",)),
    Step(_run_send, _due_send, ("send",)),
    Step(_run_linger, _due_linger),
)


def _steps_agree() -> None:
    # Every timeout kind of the table is cut by exactly one step.
    cut_by = sorted(name for step in STEPS for name in step.kinds)
    if cut_by != sorted(kind.name for kind in TIMEOUT_KINDS):  # pragma: no cover - a kind without its step
        raise AssertionError(f"the sweep's steps cut {cut_by}, the table's timeout kinds are other")


_steps_agree()
