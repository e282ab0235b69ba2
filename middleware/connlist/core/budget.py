"""The connection budget: a new connection admitted or room made for it, and which connection goes.

Theory of operation.  Over ``max_connections`` the enforcer lets one
connection go (``Budget.admit``, a part of the enforcer), the first that
exists of: the longest-idle keep-alive connection (``idle_oldest``), the
oldest connection still sending its headers (``headers_oldest``), the body
furthest behind the minimum rate (``body_slowest``).  (Under pressure the
sweep's keep-alive step also closes the connections idle longer than a
shrunk keep-alive time: ``connlist.core.sweep.idle_expired``.)  Each is
found from the head of one of the list's ordered lists, and the list lets
it go (``ConnectionsList.evict``).

The longest-idle connection is found as the keep-alive step finds the ones
due: from the top of ``ConnectionsList.idle_queue``, each record given a
second chance (``connlist.core.sweep.idle_look``: "The idle order" there).
A request being served is never let go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from connlist.core.connections import ConnectionsList
from connlist.core.kinds import ROOM_BY_NAME, UPGRADE_REFUSED, Kind, RoomKind, Settings, Totals
from connlist.core.records import Connection
from connlist.core.sweep import idle_look, reading_paused

__all__ = ["BODY_LOOK", "PRESSURE_TICK", "Budget", "body_slowest", "headers_oldest", "idle_oldest"]

# While under pressure the timer fires at least this often, so that deadlines
# moved earlier by a rising pressure are met within it.
PRESSURE_TICK = 0.25
# Bodies looked at for the slowest one, when no idle or header-reading
# connection can make room.
BODY_LOOK = 32


def idle_oldest(connections: ConnectionsList, now: float) -> Connection | None:
    """Take out and return the longest-idle keep-alive connection that can be closed, or None.

    Each record looked at is taken off the top; one not free goes back
    (``idle_look``), keyed again.  An idle one keyed late comes back keyed by
    when its idle time began, and is free at its next look, so the walk
    ends after at most two looks per record.
    """
    queue = connections.idle_queue
    free: list[Connection] = []
    for _ in range(2 * len(queue)):
        node = queue.pop()
        if node is None:
            break
        idle_look(connections, [node], now, free)
        if free:
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


class Budget:
    """The enforcer's connection budget: a new connection admitted or room made, and the upgrades' share.

    A part of ``connlist.core.enforcer.Enforcer``, which counts, closes and
    watches for it (what it declares below); the choice of what goes is this
    module's functions above.
    """

    if TYPE_CHECKING:
        connections: ConnectionsList
        totals: Totals
        clock: Callable[[], float]
        pressed: bool
        _settings: Settings

        @property
        def settings(self) -> Settings: ...
        def count(self, kind: Kind, conn: Connection) -> None: ...
        def watch(self) -> None: ...
        def bring_forward(self, when: float) -> None: ...
        @staticmethod
        def call(method: Callable[[], object]) -> None: ...

    @property
    def pressure(self) -> float:
        """Connections counted against ``max_connections``, as a share of it (0 without a budget)."""
        budget = self.settings.max_connections
        return self.connections.occupied / budget if budget else 0.0

    def admit(self, record: Connection) -> None:
        """A new connection joined the list: make room if the worker is over its budget.

        Called by ``join``, once per connection, over ``PRESSURE_WATERMARK``.
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
        if self.connections.occupied > self._settings.max_connections:
            self._make_room(record)
        if not self.pressed:
            self.pressed = True
            self.bring_forward(self.clock() + PRESSURE_TICK)

    def _make_room(self, record: Connection) -> None:
        connections = self.connections
        settings = self.settings
        kind: RoomKind
        victim = idle_oldest(connections, self.clock())
        if victim is not None:
            kind = "idle"
        else:
            victim = headers_oldest(connections, record)
            if victim is not None:
                kind = "headers"
            elif settings.body_min_rate and (
                victim := body_slowest(
                    connections, settings.body_min_rate, self.clock(), BODY_LOOK, reading_paused
                )
            ):
                kind = "body"
            else:
                victim, kind = record, "refused"
        self.count(ROOM_BY_NAME[kind], victim)
        connections.evict(victim)
        handle = victim.handle
        if handle is not None:
            if kind == "idle":
                # Closed, never aborted: one that will not close now is already
                # closing, flushing its last response (``Connection: close``),
                # and an abort is a reset that would drop that response.
                self.call(handle.connlist_close_idle)
            elif kind == "refused":
                self.call(handle.connlist_refuse)
            else:
                # The 408 is written first: a client that sent a request head in time reads why.
                self.call(handle.connlist_close_expired)
                self.call(handle.connlist_abort)
        self.watch()

    def upgrade(self, record: Connection, method: str | None = None, path: str | None = None) -> bool:
        """An upgrade request (a websocket), complete, that the server is about to hand over: may it?

        Within ``max_upgraded`` (0: no share of their own) the record is held
        as ``upgraded`` (``ConnectionsList.upgrade``, with the request's
        ``method`` and ``path`` for the view), its handle is dropped (the
        enforcer can never cut a websocket: none is in a list it walks), and
        this answers True: the server hands it over, and its feeder removes
        the record when the connection is lost.  Past the share, the request
        is refused as ``admit`` refuses a connection (counted, let go, ``503``
        and closed, before the handshake) and this answers False: the server
        hands nothing over, and the app never sees it.  The budget already
        counted the connection at ``join``.  A rare event: its cost is here,
        not on a request's path.
        """
        if not self.admit_upgrade(record):
            return False
        self.hold_upgraded(record, method, path)
        return True

    def admit_upgrade(self, record: Connection) -> bool:
        """``upgrade``'s first half: whether the share has room; if not, the request is refused (False)."""
        connections = self.connections
        limit = self._settings.max_upgraded
        if limit and connections.upgraded_count >= limit:
            self.count(UPGRADE_REFUSED, record)
            connections.evict(record)
            handle = record.handle
            if handle is not None:
                self.call(handle.connlist_refuse)
            self.watch()
            return False
        return True

    def hold_upgraded(self, record: Connection, method: str | None = None, path: str | None = None) -> None:
        """``upgrade``'s second half, for a server layer that must finish the request's events first."""
        self.connections.upgrade(record, method, path)
        if record.is_upgraded:  # (one let go meanwhile is closing: it keeps its handle, for the linger)
            record.handle = None
            self.totals.upgrades += 1
