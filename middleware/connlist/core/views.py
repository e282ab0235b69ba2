"""What the list shows by walking it: its connections in order, and the closes through the handles.

``ConnectionsList`` is a ``ListViews``: these read what the list keeps (its
links and counts, ``connlist.core.connections``) and change nothing of it but for
``close_idle`` and ``close_all``, which close connections through the
handles the server layer attached (Node's ``closeIdleConnections`` and
``closeAllConnections``, which are its server's): the server then removes
them from the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from connlist.core.queues import Queue
from connlist.core.records import Connection, Received

__all__ = ["ListViews"]


class ListViews:
    """The read side of ``connlist.core.connections.ConnectionsList`` (see the module docstring)."""

    __slots__ = ()

    # Kept by ConnectionsList.
    _all_root: Connection
    _active_root: Connection
    received: dict[int, tuple[float, Any]]
    upgraded: Queue[Connection]

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
