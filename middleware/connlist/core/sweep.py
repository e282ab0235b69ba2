"""The enforcer's sweep: its steps, one per list, and the walks over the queues they take.

Theory of operation.  When the enforcer's timer fires, ``Enforcer._work``
runs the ``STEPS`` in order, each over one list of ``ConnectionsList``:
``run(enforcer, now, stop)`` cuts what is due, within the sweep's time
(``stop``, a clock value), and says whether it finished (see
``Enforcer.drain``); ``due(enforcer, now)`` is the earliest clock value at
which it can find anything (None: nothing in its list can be due), where the
timer is armed next.  Each walk starts at the head of its list and stops at
the first record too young to be due, so its cost is that of what it finds.
The steps use the enforcer's public methods (``drain``, ``cut``, ``record``,
``count``, ``call``); the pressure it applies (``headers_timeout_now``,
``idle_time_now``) is set before any step or due time is asked for.  The
rules are the table's (``connlist.core.kinds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from connlist.core.budget import idle_expired, idle_head_since
from connlist.core.connections import ConnectionsList
from connlist.core.kinds import TIMEOUT_BY_NAME, send_allowance
from connlist.core.records import OUT_NONE, OUT_STALLED, Connection

if TYPE_CHECKING:
    from connlist.core.enforcer import Enforcer

__all__ = ["STEPS", "Step", "lingered", "rate_expired", "reading_paused", "stall_sample", "stalled_due"]

_INF = math.inf


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
            connections.expire(node)
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
        connections.closing.unlink(conn)
        conn.out_state = OUT_NONE
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


@dataclass(frozen=True)
class Step:
    """One step of the enforcer's sweep, over one list of ``ConnectionsList``, for the kinds it cuts.

    ``run(enforcer, now, stop)`` cuts what is due, within the sweep's
    budget (``stop``, a clock value), and says whether it finished (see
    ``Enforcer.drain``); ``due(enforcer, now)`` is the earliest clock value
    at which it can find anything (None: nothing in its list can be due).
    """

    run: Callable[[Enforcer, float, float], bool]
    due: Callable[[Enforcer, float], float | None]
    # The names of the rows of connlist.core.kinds it counts.
    kinds: tuple[str, ...] = ()


def reading_paused(conn: Connection) -> bool:
    """A body behind the rate is excused while the server, not the client, holds it up."""
    handle = conn.handle
    return handle is not None and handle.connlist_reading_paused()


def _run_keepalive(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Keep-alive connections idle for the keep-alive time (shortened under pressure), closed."""
    idle_time = enforcer.idle_time_now
    if idle_time == _INF:
        return True
    connections = enforcer.connections
    kind = TIMEOUT_BY_NAME["keepalive"]
    shortened = idle_time < enforcer.keep_alive

    def close(conn: Connection) -> None:
        handle = conn.handle
        enforcer.keepalive_closed_at = now  # (KEEPALIVE_BATCH)
        if shortened:
            # Under pressure: counted and logged as the budget's cuts are,
            # closed, and aborted if it does not go within the linger.
            connections.evict(conn)
            enforcer.count(kind, conn)
            if handle is not None:
                enforcer.call(handle.connlist_close_idle)
        else:
            # uvicorn's own keep-alive: counted, closed as uvicorn closes it.
            enforcer.totals.keepalive_timeouts += 1
            if handle is not None:
                enforcer.call(handle.connlist_close_keepalive)

    return enforcer.drain(lambda n: idle_expired(connections, idle_time, now, n), close, stop)


def _due_keepalive(enforcer: Enforcer, now: float) -> float | None:
    # Not SLACK later: uvicorn's rule is not strict, a connection idle for
    # exactly the keep-alive time is closed (its timer, call_later, fires then).
    since = idle_head_since(enforcer.connections)
    idle_time = enforcer.idle_time_now
    if since is None or idle_time == _INF:
        return None
    # A mass close goes in batches (KEEPALIVE_BATCH).
    return max(since + idle_time, enforcer.keepalive_closed_at + KEEPALIVE_BATCH)


def _run_active(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Headers and request timeouts, one walk of ``active`` (Node's rule)."""
    settings = enforcer.settings
    headers_timeout = enforcer.headers_timeout_now
    if not (headers_timeout or settings.request_timeout):
        return True
    connections = enforcer.connections

    def cut(conn: Connection) -> None:
        headers = settings.headers_timeout and not conn.headers_completed
        enforcer.cut(conn, "headers" if headers else "request")

    return enforcer.drain(
        lambda n: connections.expired(headers_timeout, settings.request_timeout, n), cut, stop
    )


def _due_active(enforcer: Enforcer, now: float) -> float | None:
    deadline = enforcer.connections.next_deadline(
        enforcer.headers_timeout_now, enforcer.settings.request_timeout
    )
    return None if deadline is None else deadline + SLACK


def _run_rate(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Bodies behind the minimum rate, past their grace (``body``)."""
    settings = enforcer.settings
    if not settings.body_min_rate:
        return True
    connections = enforcer.connections

    def take(n: int) -> list[Connection]:
        batch, enforcer.rate_next, enforcer.grace_end = rate_expired(
            connections, settings.body_min_rate, settings.body_grace, now, n, reading_paused
        )
        return batch

    return enforcer.drain(take, lambda conn: enforcer.cut(conn, "rate"), stop)


def _due_rate(enforcer: Enforcer, now: float) -> float | None:
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


def _run_send(enforcer: Enforcer, now: float, stop: float) -> bool:
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
            enforcer.record(conn, "send")
            if handle is not None:
                enforcer.call(handle.connlist_abort)

    return enforcer.drain(lambda n: stalled_due(connections, send_timeout / 4, now, n), sample, stop)


def _due_send(enforcer: Enforcer, now: float) -> float | None:
    # A stalled connection is sampled every send_timeout / 4.
    send_timeout = enforcer.settings.send_timeout
    sampled = enforcer.connections.stalled.head_stamp() if send_timeout else None
    return None if sampled is None else sampled + send_timeout / 4


def _run_linger(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Closed connections that did not go within the linger, aborted."""
    connections = enforcer.connections

    # Read again: the steps before may have taken a while.
    now = enforcer.clock()

    def abort(conn: Connection) -> None:
        if conn.handle is not None:
            enforcer.call(conn.handle.connlist_abort)

    return enforcer.drain(lambda n: lingered(connections, enforcer.linger, now, n), abort, stop)


def _due_linger(enforcer: Enforcer, now: float) -> float | None:
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
