"""What the list shows: its connections' states, its counts, its walks, and the closes through the handles.

``ConnectionsList`` is a ``ListViews``: these read what the list keeps (its
links and counts, ``connlist.core.connections``) and change nothing of it but for
``close_idle`` and ``close_all``, which close connections through the
handles the server layer attached (Node's ``closeIdleConnections`` and
``closeAllConnections``, which are its server's): the server then removes
them from the list.

States
------

A connection's state is derived from its fields (``connection_state``), and
the view's counts from the list's counts (``ConnectionsList.counts``), so the
debug view and the metrics only present them::

    new              connected, no byte of a request yet (timed by the headers timeout)
    reading_headers  a request began, its headers are incomplete
    reading_body     headers in, body still arriving
    handling         request received, response not finished
    stalled          handling, and the client stopped taking the response
    idle             keep-alive, waiting for the next request
    timed_out        expired and closed by the enforcer: it leaves ``all``
                     when the server reports the connection lost
    upgraded         left HTTP (a websocket): no timeout applies; it leaves
                     when the server reports the connection lost
    closed           no longer in the list (the view never shows one)

The counts add nginx ``stub_status``-style phases (``PHASES``): ``reading``
(new + reading_headers), ``writing`` (reading_body + handling), ``waiting``
(idle), ``timed_out`` and ``upgraded``; they add up to ``all``.  A stalled
connection keeps the phase of what it does otherwise.  Which timeout runs for a connection,
and when it is due (the view's ``timeout`` and ``time_left``), is
``connlist.core.kinds.deadline``'s.  ``docs/debug-endpoint.md`` is the reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from connlist.core.kinds import effective_timeouts
from connlist.core.queues import Queue
from connlist.core.records import OUT_STALLED, OUT_UPGRADED, Connection, Received

__all__ = ["PHASES", "STATES", "ListViews", "connection_state"]

# What ``connection_state`` answers for a tracked connection (see "States").
STATES = ("new", "reading_headers", "reading_body", "handling", "stalled", "idle", "timed_out", "upgraded")
# The phases of ``ConnectionsList.counts``; they add up to ``all``.
PHASES = ("reading", "writing", "waiting", "timed_out", "upgraded")


def connection_state(conn: Connection) -> str:
    """One of ``STATES``, or ``"closed"`` for a connection no longer in the list."""
    if conn.out_state == OUT_UPGRADED:
        return "upgraded"
    if not conn.tracked:  # a property: a ``Received`` record is in the list's table, not linked
        return "closed"
    if conn._active_next is not conn and conn._active_next is not None:
        if conn.headers_completed:
            return "reading_body"
        return "reading_headers" if conn._begun else "new"
    if conn.last_message_start != 0.0:
        return "timed_out"  # left active without completing its message: expired
    if conn.out_state == OUT_STALLED:
        return "stalled"
    return "handling" if conn.responding else "idle"


class ListViews:
    """The read side of ``connlist.core.connections.ConnectionsList`` (see the module docstring)."""

    __slots__ = ()

    # Kept by ConnectionsList.
    _all_root: Connection
    _active_root: Connection
    occupied: int
    _n_evicted: int
    _n_active: int
    _n_timed_out: int
    _n_headers_pending: int
    received: dict[int, tuple[float, Any]]
    stalled: Queue[Connection]
    upgraded: Queue[Connection]

    # -- counts --------------------------------------------------------------

    @property
    def _n_all(self) -> int:
        """The records in ``all``: not counted (no write per connection), but known from three counts.

        ``occupied`` counts them, less those evicted (``_n_evicted``), and
        with the upgraded, which left ``all`` but still count.
        """
        return self.occupied - len(self.upgraded) + self._n_evicted

    def __len__(self) -> int:
        return self._n_all + len(self.received) + len(self.upgraded)

    @property
    def active_count(self) -> int:
        return self._n_active

    @property
    def idle_count(self) -> int:
        return self._n_all + len(self.received) - self._n_active - self._n_timed_out

    @property
    def timed_out_count(self) -> int:
        """Expired connections not yet closed: in ``all``, neither active nor idle."""
        return self._n_timed_out

    @property
    def headers_pending_count(self) -> int:
        """Active connections whose headers are incomplete (new, or reading a request head)."""
        return self._n_headers_pending

    @property
    def upgraded_count(self) -> int:
        """Connections in ``upgraded``: websockets, from the handshake to the close."""
        return len(self.upgraded)

    @property
    def stalled_count(self) -> int:
        """Connections in ``stalled``: the client stopped taking the response."""
        return len(self.stalled)

    def counts(self) -> dict[str, int]:
        """The view's exact counts: ``all``, ``idle``, ``active``, the ``PHASES`` and ``stalled``.

        ``idle`` and ``active`` are Node's, of HTTP connections: an upgraded
        one is neither (it is ``upgraded``, a phase).

        O(1) but for ``writing`` and ``waiting`` (``idle_responding_count``).
        ``stalled`` is not a phase (see "States").
        """
        n_active = self._n_active
        n_idle = self.idle_count
        reading = self._n_headers_pending
        handling = self.idle_responding_count
        return {
            "all": len(self),
            "idle": n_idle,
            "active": n_active,
            "reading": reading,
            "writing": n_active - reading + handling,
            "waiting": n_idle - handling,
            "timed_out": self._n_timed_out,
            "upgraded": len(self.upgraded),
            "stalled": len(self.stalled),
        }

    @property
    def idle_responding_count(self) -> int:
        """Idle connections whose response is unfinished: a walk of ``all``, O(n) (see the invariants)."""
        n = len(self.received)
        root = self._all_root
        node = root._all_next
        while node is not root:
            if node.responding and node.last_message_start == 0.0:
                n += 1
            node = node._all_next
        return n

    def iter_all(self) -> Iterator[Connection]:
        """``all``: the ring in connection order, then the upgraded ones; the current node may be removed.

        (Then ASGI-only mode's requests, ``Received``.)
        """
        root = self._all_root
        node = root._all_next
        # A node removed during the yield has no links: carry on from its
        # old successor, unless that was removed too (the walk ends).
        while node is not root and node._all_next is not None:
            nxt = node._all_next
            yield node
            node = nxt if node._all_next is None else node._all_next
        if node is root:
            yield from self.upgraded
            yield from self._iter_received()

    def _iter_received(self) -> Iterator[Connection]:
        """ASGI-only mode's requests without a body, in arrival order, as records (see Received)."""
        table = self.received
        # A copy: the table changes while the caller has the loop.
        for key, (arrival, scope) in list(table.items()):
            if key in table:
                yield Received(key, arrival, scope, table)

    def iter_active(self) -> Iterator[Connection]:
        """``active`` by message start, oldest first; unlinking the current node is safe."""
        root = self._active_root
        node = root._active_next
        # A node unlinked during the yield is linked to itself, or has no
        # links if it was removed: carry on from its old successor.
        while node is not root and node._active_next is not node and node._active_next is not None:
            nxt = node._active_next
            yield node
            after = node._active_next
            node = nxt if after is node or after is None else after

    def all(self) -> list[Connection]:
        return list(self.iter_all())

    def active(self) -> list[Connection]:
        return list(self.iter_active())

    def idle(self) -> list[Connection]:
        return [conn for conn in self.iter_all() if conn.last_message_start == 0]

    def next_deadline(self, headers_timeout: float, request_timeout: float) -> float | None:
        """The earliest clock value at which some active connection can expire, or None.

        The timeouts are taken as ``ConnectionsList.expired`` takes them.  The walk stops
        where no later connection can have an earlier deadline.
        """
        headers_timeout, request_timeout = effective_timeouts(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return None
        shortest = headers_timeout or request_timeout
        best = math.inf
        root = self._active_root
        node = root._active_next
        while node is not root:
            start = node.last_message_start
            # No later node can expire before ``start + shortest``.
            if start + shortest >= best:
                break
            if headers_timeout and not node.headers_completed:
                best = start + headers_timeout
                break
            if request_timeout:
                best = min(best, start + request_timeout)
            node = node._active_next
        return None if best == math.inf else best

    # -- closing (through the handles the server layer attached) -------------

    def close_idle(self) -> int:
        """Close the idle connections whose response is finished (Node's closeIdleConnections); how many."""
        closed = 0
        for conn in self.idle():
            if conn.handle is not None and conn.handle.connlist_close_idle():
                closed += 1
        return closed

    def close_all(self) -> int:
        """Close every connection (Node's closeAllConnections); returns how many.

        An upgraded connection has no handle (its server protocol let it go
        at the upgrade): the server closes its websockets itself.
        """
        conns = [conn for conn in self.iter_all() if conn.handle is not None]
        for conn in conns:
            conn.handle.connlist_close()  # type: ignore[union-attr]
        return len(conns)
