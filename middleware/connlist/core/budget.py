"""The connection budget's choice of what to close: which connection goes to make room.

Theory of operation.  Over ``max_connections`` the enforcer lets one
connection go (``Enforcer.admit``), the first that exists of: the
longest-idle keep-alive connection (``idle_oldest``), the oldest connection
still sending its headers (``headers_oldest``), the body furthest behind the
minimum rate (``body_slowest``).  Under pressure the sweep also closes the
connections idle longer than a shrunk keep-alive time (``idle_expired``).
Each is found from the head of one of the list's ordered lists, and the list
lets it go (``ConnectionsList.evict``).

The idle order.  ``ConnectionsList.idle_queue`` is a heap of idle
connections keyed by a clock value no later than the start of their idle
time: a record joins at ``message_complete``, keyed by its message's start
(no clock is read there).  A whole request on an idle connection
(``message``, the common case) neither moves it nor reads a clock, so when
the sweep finds a record at the top, its key may be behind.  ``_look`` therefore gives it a second chance, as
the CLOCK page-replacement algorithm does, and corrects its key on the way:

* a record serving a request (``responding``), or whose client is taking a
  response (stalled), goes back keyed now: its idle time starts later;
* a record whose last response ended after its key (``idle_at``: the
  server layer writes it at each response's end) goes back keyed by that
  time, exactly;
* one with no response ended since its message did (the response ended
  before the request's body, or the feeder does not say) goes back keyed
  now: its idle time counts from the first look;
* one that is no longer idle (a request began, it expired, it is closing,
  it was let go) leaves the heap, to join again at its next
  ``message_complete``;
* the rest is idle since its key: the keep-alive timeout (the sweep's
  ``keepalive`` step) closes it once that is ``keep_alive`` ago, and the
  budget may let it go.

A record goes back at most once per idle time begun, so a connection is
looked at about once per keep-alive period, however many requests it
serves.  A request being served is never let go.
"""

from __future__ import annotations

from collections.abc import Callable

from connlist.core.connections import ConnectionsList
from connlist.core.records import OUT_CLOSING, OUT_STALLED, Connection

__all__ = ["body_slowest", "headers_oldest", "idle_expired", "idle_head_since", "idle_oldest"]

# _look's verdicts on the record at the top of idle_queue.
_DROP = 0
_AGAIN = 1
_FREE = 2


def _look(connections: ConnectionsList, node: Connection, now: float) -> int:
    """``node``, just taken off the idle queue: _DROP, _AGAIN (pushed back, keyed anew) or _FREE.

    _FREE: idle since its key.
    """
    queue = connections.idle_queue
    if node.last_message_start != 0.0 or node.evicted or node.out_state == OUT_CLOSING:
        return _DROP
    if node.responding or node.out_state == OUT_STALLED:
        queue.push(node, now)
    elif node.idle_at > node.idle_since:
        queue.push(node, node.idle_at)
    elif node.idle_at == 0.0:
        # No response ended since its message did (it ended first, or the
        # feeder does not say): idle from the first look on.
        node.idle_at = now
        queue.push(node, now)
    else:
        return _FREE
    return _AGAIN


def idle_oldest(connections: ConnectionsList, now: float) -> Connection | None:
    """Take out and return the longest-idle keep-alive connection that can be closed, or None.

    Each record looked at is taken off the top; one not free goes back
    (``_look``), keyed again.  An idle one keyed late comes back keyed by
    when its idle time began, and is free at its next look, so the walk
    ends after at most two looks per record.
    """
    queue = connections.idle_queue
    for _ in range(2 * len(queue)):
        node = queue.pop()
        if node is None:
            break
        if _look(connections, node, now) == _FREE:
            return node
    return None


def idle_expired(connections: ConnectionsList, idle_time: float, now: float, limit: int) -> list[Connection]:
    """Take out and return up to ``limit`` connections idle (and closable) for ``idle_time`` or more."""
    queue = connections.idle_queue
    bound = now - idle_time
    due: list[Connection] = []
    while len(due) < limit:
        since = queue.head_stamp()
        if since is None or since > bound:
            break
        node: Connection = queue.pop()  # type: ignore[assignment]  # the head just seen
        if _look(connections, node, now) == _FREE:
            due.append(node)
    return due


def idle_head_since(connections: ConnectionsList) -> float | None:
    """The smallest key of the idle queue (no idle time began before it), or None if it is empty."""
    return connections.idle_queue.head_stamp()


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
