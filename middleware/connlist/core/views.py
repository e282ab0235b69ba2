"""What the list shows: its connections' states, its counts as the view has them, and the closes.

``ConnectionsList`` is a ``ListViews``: these present what the list keeps,
asking the list for its counts and walks (``connlist.core.connections``, the
one module that reads its links and counts), and change nothing of it but
for ``close_idle`` and ``close_all``, which close connections through the
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

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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
    if conn.is_active:
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
    received: dict[int, tuple[float, Any]]
    stalled: Queue[Connection]
    upgraded: Queue[Connection]

    # The counts and walks are the list's own (they read its links and counts).
    if TYPE_CHECKING:

        def __len__(self) -> int: ...
        @property
        def active_count(self) -> int: ...
        @property
        def idle_count(self) -> int: ...
        @property
        def timed_out_count(self) -> int: ...
        @property
        def headers_pending_count(self) -> int: ...
        @property
        def idle_responding_count(self) -> int: ...
        def iter_all(self) -> Iterator[Connection]: ...
        def iter_active(self) -> Iterator[Connection]: ...

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
        n_active = self.active_count
        n_idle = self.idle_count
        reading = self.headers_pending_count
        handling = self.idle_responding_count
        return {
            "all": len(self),
            "idle": n_idle,
            "active": n_active,
            "reading": reading,
            "writing": n_active - reading + handling,
            "waiting": n_idle - handling,
            "timed_out": self.timed_out_count,
            "upgraded": len(self.upgraded),
            "stalled": len(self.stalled),
        }

    def _iter_received(self) -> Iterator[Connection]:
        """ASGI-only mode's requests without a body, in arrival order, as records (see Received)."""
        table = self.received
        # A copy: the table changes while the caller has the loop.
        for key, (arrival, scope) in list(table.items()):
            if key in table:
                yield Received(key, arrival, scope, table)

    def all(self) -> list[Connection]:
        return list(self.iter_all())

    def active(self) -> list[Connection]:
        return list(self.iter_active())

    def idle(self) -> list[Connection]:
        return [conn for conn in self.iter_all() if conn.last_message_start == 0]

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
