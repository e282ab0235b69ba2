"""The connection budget's choice of what to close: which connection goes to make room.

Theory of operation.  Over ``max_connections`` the enforcer lets one
connection go (``Enforcer.admit``), the first that exists of: the
longest-idle keep-alive connection (``idle_oldest``), the oldest connection
still sending its headers (``headers_oldest``), the body furthest behind the
minimum rate (``body_slowest``).  Under pressure the sweep also closes the
connections idle longer than a shrunk keep-alive time (``idle_expired``).
Each is found from the head of one of the list's ordered lists, and the list
lets it go (``ConnectionsList.evict``).

The idle order.  ``ConnectionsList.idle_queue`` holds connections in the
order they became idle: a record joins its tail at ``message_complete``,
unstamped.  A whole request on an idle connection (``message``, the common
case) neither moves it nor reads a clock, so the head may have served
requests since it joined.  ``_look`` therefore gives it a second chance, as
the CLOCK page-replacement algorithm does: a head whose ``requests`` differ
from its ``idle_requests``, or that is responding, or whose client is taking
a response (stalled), goes back to the tail with its count taken again; one
that is no longer idle (a request began, it expired, it is closing, it was
let go) leaves the queue, to join again at its next ``message_complete``.
A request being served is never let go.

``idle_expired`` stamps the unstamped records (``idle_since``) from the tail
back to the first stamped one before it walks, so the queue stays ordered by
that stamp and an idle time counts from the first sweep that saw it.
"""

from __future__ import annotations

from collections.abc import Callable

from connlist.connections import ConnectionsList
from connlist.records import OUT_CLOSING, OUT_STALLED, Connection

__all__ = ["body_slowest", "headers_oldest", "idle_expired", "idle_head_since", "idle_oldest"]

# _look's verdicts on the head of idle_queue.
_DROP = 0
_AGAIN = 1
_FREE = 2


def _look(connections: ConnectionsList, node: Connection, stamp: float) -> int:
    """Take ``node`` off the idle queue: _DROP, _AGAIN (put back at the tail, stamped ``stamp``) or _FREE."""
    queue = connections.idle_queue
    queue.unlink(node)
    if node.last_message_start != 0.0 or node.evicted or node.out_state == OUT_CLOSING:
        return _DROP
    if node.requests != node.idle_requests or node.responding or node.out_state == OUT_STALLED:
        node.idle_requests = node.requests
        node.idle_since = stamp
        queue.append(node)
        return _AGAIN
    return _FREE


def idle_oldest(connections: ConnectionsList) -> Connection | None:
    """Unlink and return the longest-idle keep-alive connection that can be closed, or None.

    O(1) amortised over the requests, plus one step per connection
    responding now that is older in the queue than the one returned.  The
    walk stops when it meets a record it put back: it went round.
    """
    first: Connection | None = None
    for node in connections.idle_queue:
        if node is first:
            break
        verdict = _look(connections, node, 0.0)
        if verdict == _FREE:
            return node
        if verdict == _AGAIN and first is None:
            first = node
    return None


def idle_expired(connections: ConnectionsList, idle_time: float, now: float, limit: int) -> list[Connection]:
    """Unlink and return up to ``limit`` connections idle (and closable) for at least ``idle_time``."""
    queue = connections.idle_queue
    for node in reversed(queue):
        if node.idle_since != 0.0:
            break
        node.idle_since = now
    bound = now - idle_time
    due: list[Connection] = []
    for node in queue:
        if node.idle_since > bound or len(due) >= limit:
            break
        if _look(connections, node, now) == _FREE:
            due.append(node)
    return due


def idle_head_since(connections: ConnectionsList) -> float | None:
    """When the head of the idle queue was stamped, or None (empty, or not stamped yet)."""
    since = connections.idle_queue.head_stamp()
    return since or None


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
