"""The walks of the enforcer's sweep over the queues: slow bodies, stalled responses, lingering closes.

Each walks one queue of ``ConnectionsList`` from its head and stops at the
first record too young to be due, so its cost is that of what it finds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from connlist.connections import OUT_NONE, OUT_STALLED, Connection, ConnectionsList

__all__ = ["lingered", "rate_expired", "stall_sample", "stalled_due"]

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
    """Record a sample of a stalled connection; return how long it made no progress.

    Progress is more bytes acknowledged by the client than at the last
    sample, when the kernel reports them (``acked``: bytes acknowledged
    and the client's window, as for ``ConnectionsList.stall``), else fewer
    bytes unsent.  The step, the progress since the last sample (or the
    window, if larger), raises ``out_step``: see ``send_allowance``.  The
    record moves to the tail of ``stalled``, stamped ``now`` (``now`` must
    not be older than any stamp in the queue).
    """
    if conn.out_state != OUT_STALLED:
        return 0.0
    window = 0
    if acked is None or conn.out_acked < 0:
        progress = conn.out_pending - pending
    else:
        progress = acked[0] - conn.out_acked
        window = acked[1]
    if acked is not None:
        conn.out_acked = acked[0]
    if progress > 0:
        conn.out_since = now
    step = progress if progress > window else window
    if step > conn.out_step:
        conn.out_step = step
    conn.out_pending = pending
    conn.out_sampled = now
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
