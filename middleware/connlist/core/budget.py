"""The connection budget's choice of what to close: which connection goes to make room.

Theory of operation.  Over ``max_connections`` the enforcer lets one
connection go (``Enforcer.admit``), the first that exists of: the
longest-idle keep-alive connection (``idle_oldest``), the oldest connection
still sending its headers (``headers_oldest``), the body furthest behind the
minimum rate (``body_slowest``).  (Under pressure the sweep's keep-alive
step also closes the connections idle longer than a shrunk keep-alive time:
``connlist.core.sweep.idle_expired``.)  Each is found from the head of one
of the list's ordered lists, and the list lets it go
(``ConnectionsList.evict``).

The longest-idle connection is found as the keep-alive step finds the ones
due: from the top of ``ConnectionsList.idle_queue``, each record given a
second chance (``connlist.core.sweep.idle_look``: "The idle order" there).
A request being served is never let go.
"""

from __future__ import annotations

from collections.abc import Callable

from connlist.core.connections import ConnectionsList
from connlist.core.records import Connection
from connlist.core.sweep import idle_look

__all__ = ["body_slowest", "headers_oldest", "idle_oldest"]


def idle_oldest(connections: ConnectionsList, now: float) -> Connection | None:
    """Take out and return the longest-idle keep-alive connection that can be closed, or None.

    Each record looked at is taken off the top; one not free goes back
    (``idle_look``), keyed again.  An idle one keyed late comes back keyed by
    when its idle time began, and is free at its next look, so the walk
    ends after at most two looks per record.
    """
    queue = connections.idle_queue
    for _ in range(2 * len(queue)):
        node = queue.pop()
        if node is None:
            break
        if idle_look(connections, node, now):
            return node
    return None


def headers_oldest(connections: ConnectionsList, skip: Connection | None = None) -> Connection | None:
    """The oldest connection still sending its headers (or connected and silent), other than ``skip``.

    ``active`` is ordered by message start, so it is at its head, behind
    only the requests older than it that are receiving a body (or whose
    connection is responding to an earlier, pipelined, request).
    """
    for node in connections.iter_active():
        # (A pipelined request's head arriving behind a response being served is not taken.)
        if not node.headers_completed and not node.responding and node is not skip:
            return node
    return None


def body_slowest(
    connections: ConnectionsList,
    min_rate: float,
    now: float,
    look: int,
    excused: Callable[[Connection], bool] | None = None,
) -> Connection | None:
    """Of the ``look`` oldest bodies, the one furthest behind ``min_rate`` since it began, or None.

    Grace is not granted here (this chooses what goes when there is no
    room, it does not time anything out): a body is behind if fewer than
    ``min_rate`` bytes per second have arrived since it began.  A body for
    which ``excused(conn)`` is true (the server itself stopped reading it)
    is not behind.
    """
    worst: Connection | None = None
    worst_lag = 0.0
    for node in connections.body:
        if look <= 0:
            break
        lag = (now - node.body_started) * min_rate - node.body_received
        if lag > worst_lag and not (excused is not None and excused(node)):
            worst, worst_lag = node, lag
        look -= 1
    return worst
