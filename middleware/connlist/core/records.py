"""The records the list holds: one ``Connection`` per connection, and the handle that closes it.

The list (``connlist.core.connections``) owns a record's links and the fields its
events and counts depend on (``last_message_start``, ``headers_completed``);
the feeders may write the record's own (the rule is the list's invariant,
"the feeder's own writes"); the views read them.  The server
layer attaches a ``ConnectionHandle`` through which the enforcer closes the
connection.  ``Received`` is ASGI-only mode's record of a request without a
body, made only when a view walks the list.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from connlist.core.queues import UNQUEUED, Link

__all__ = [
    "FROM_HANDLE",
    "NO_LINK",
    "OUT_CLOSING",
    "OUT_NONE",
    "OUT_STALLED",
    "OUT_UPGRADED",
    "Address",
    "Connection",
    "ConnectionHandle",
    "Received",
]


class ConnectionHandle(Protocol):
    """What the server layer gives the list so that a connection can be closed.

    The names are prefixed because the server layer's protocol objects are
    themselves the handles, and must not clash with their own methods.
    """

    def connlist_close_expired(self) -> None:
        """Answer ``408`` if no response byte was written for the current request, then close."""

    def connlist_close_idle(self) -> bool:
        """Close the connection if no response is in progress; return whether it was closed."""

    def connlist_close_keepalive(self) -> None:
        """The keep-alive timeout: close an idle connection as the server closes it (its own handler)."""

    def connlist_close(self) -> None:
        """Close the connection now, whatever it is doing."""

    def connlist_abort(self) -> None:
        """Abort the connection: drop what is unsent and close it at once."""

    def connlist_refuse(self) -> None:
        """Answer ``503`` with ``Connection: close`` to a new connection and close it (no room for it)."""

    def connlist_pending(self) -> int:
        """Bytes of the response the client has not taken yet (the transport's buffer and the kernel's)."""

    def connlist_acked(self) -> tuple[int, int] | None:
        """What the kernel says the client took: bytes acknowledged so far and its window now, or None.

        None where the transport has no such report (not Linux, not TCP).
        """

    def connlist_reading_paused(self) -> bool:
        """Whether the server itself stopped reading the request (the app has not consumed its body)."""

    def connlist_request(self) -> tuple[str | None, str | None]:
        """Method and path of the current or last request whose headers were received, if any.

        Read by ``Connection.method`` and ``.path`` when the server layer
        stored none: the server keeps them anyway, so the list need not
        copy them at every request.
        """

    def connlist_address(self, own: bool) -> Address:
        """The peer's address, or (``own``) the server's own, as ASGI has it (see ``Address``).

        Read by ``Connection.client`` and ``.server`` when the server layer
        stored ``FROM_HANDLE`` at connect: where the server does not keep
        them, asking the transport at every connection costs more than
        asking when a view or a cut needs one.
        """


# A peer or local address as the server layer has it: an ASGI ``(host, port)``
# pair (uvicorn's ``client`` and ``server``), a string, or None (unknown, or a
# unix socket); the debug view formats it.
Address = tuple[str, int | None] | str | None

# A record's ``client`` or ``server`` that its handle has (``connlist_address``), read when asked.
FROM_HANDLE: Any = type("FromHandle", (), {"__slots__": (), "__repr__": lambda self: "FROM_HANDLE"})()

# The links of a record the list does not hold (not yet connected, or
# removed): None, so that no record refers to itself once the list lets go
# of it (a reference cycle would wait for the cyclic collector).
NO_LINK: Any = None

# Connection.out_state: in none of ``stalled``, ``closing`` and ``upgraded``, or in one of them.
OUT_NONE = 0
OUT_STALLED = 1
OUT_CLOSING = 2
OUT_UPGRADED = 3


_ids = itertools.count(1)
# The id of a record not given one, unique in the process.  ASGI-only mode
# gives its records their request number instead (connlist.asgi.asgi_only says why).
next_id = _ids.__next__


class Connection:
    """One TCP connection (in ASGI-only mode: one request), as the list sees it.

    Links are private to the list; the other fields are read by the debug
    view and the enforcer, and written by the server layer.
    """

    # The fields every connection's events read or write, in slots: the
    # cheapest to read and write.  The fields only a body, a stalled
    # response or a view needs are the class's below: a record takes them
    # from the class until it writes its own, which go to its ``__dict__``,
    # made at its first such write.  So a connection that never needs
    # them pays no write for them.
    __slots__ = (
        "__dict__",
        "_active_next",
        "_active_prev",
        "_all_next",
        "_all_prev",
        "_begun",
        "_body_link",
        "_client",
        "_idle_entry",
        "_out_link",
        "_server",
        "connected_at",
        "evicted",
        "handle",
        "headers_completed",
        "id",
        "idle_since",
        "last_message_start",
        "out_state",
        "requests",
        "responded_at",
        "responding",
    )

    # Method and path (never the query string) of the current or last
    # request, when the server layer stores them (see ``method``).
    _method: str | None = None
    _path: str | None = None
    # The body being received (while in ``body``): when it began, and
    # how many bytes have arrived since (framing included).
    body_started: float = 0.0
    body_received: int = 0
    # Stalled (``out_state``): last progress, last sample, bytes unsent
    # then; closing: when the enforcer closed it; upgraded: when it left HTTP.
    out_since: float = 0.0
    out_sampled: float = 0.0
    out_pending: int = 0
    # Stalled: the bytes the client had acknowledged at the last sample
    # (-1: the transport cannot tell), and the largest step in which its
    # acknowledgements came (kept from one stall to the next).
    out_acked: int = -1
    out_step: int = 0

    def __init__(
        self,
        client: Address = None,
        server: Address = None,
        handle: ConnectionHandle | None = None,
        connected_at: float = 0.0,
        id: int | None = None,
    ) -> None:
        # Not the list's (not yet connected, or removed): no links.  The
        # list links it at ``connect``; while it holds it, a record in no
        # list of its is linked to itself (see connlist.core.connections).
        self._all_prev: Connection = NO_LINK
        self._all_next: Connection = NO_LINK
        self._active_prev: Connection = NO_LINK
        self._active_next: Connection = NO_LINK
        # Clock value at which the current message began; 0 when idle.
        self.last_message_start: float = 0.0
        self._fields(client, server, handle, connected_at, id)

    def _fields(
        self,
        client: Address,
        server: Address,
        handle: ConnectionHandle | None,
        connected_at: float,
        id: int | None,
    ) -> None:
        """Every field but the links and the start, which ``ConnectionsList.connect`` writes itself."""
        # Its places in the queues (connlist.core.queues): ``body``, ``stalled``
        # or ``closing``, and ``idle_queue`` (a heap's entry; None: not in it).
        self._body_link: Link[Connection] = UNQUEUED
        self._out_link: Link[Connection] = UNQUEUED
        self._idle_entry: list[Any] | None = None
        # Given by ASGI-only mode, which numbers its requests as it counts them.
        self.id: int = next_id() if id is None else id
        # The addresses (FROM_HANDLE: the handle's, see ``client``).
        self._client = client
        self._server = server
        self.handle = handle
        self.connected_at = connected_at
        self.headers_completed = False
        # Requests fully received on this connection.
        self.requests = 0
        # Whether a byte of a request ever arrived (``message_begin``): a
        # connection that has not is ``new``.
        self._begun = False
        # A response to a received request is unfinished: from
        # ``response_begin`` (``headers_complete`` with the request,
        # ``message``) to ``response_complete`` (``remove``).
        self.responding = False
        # ``stalled``, ``closing`` or ``upgraded`` (OUT_STALLED, OUT_CLOSING,
        # OUT_UPGRADED; OUT_NONE: in none; their fields are the class's above).
        self.out_state = OUT_NONE
        # While in ``idle_queue`` (see ``connlist.core.sweep``): its key there,
        # a clock value no later than the start of its idle time.
        self.idle_since = 0.0
        # When its last response ended (``response_complete``; the server
        # layer writes it itself on its fast path), or 0: not since its last
        # message ended.
        self.responded_at = 0.0
        # Closed or aborted to make room (``ConnectionsList.evict``): its
        # descriptor is on its way out, it no longer counts against the budget.
        self.evicted = False

    @property
    def method(self) -> str | None:
        """The current or last request's method: as stored, else as the handle has it."""
        if self._method is None and self.handle is not None:
            return self.handle.connlist_request()[0]
        return self._method

    @method.setter
    def method(self, value: str | None) -> None:
        self._method = value

    @property
    def path(self) -> str | None:
        """The current or last request's path (no query string): as stored, else as the handle has it."""
        if self._path is None and self.handle is not None:
            return self.handle.connlist_request()[1]
        return self._path

    @path.setter
    def path(self, value: str | None) -> None:
        self._path = value

    @property
    def client(self) -> Address:
        """The peer's address: as stored, else (``FROM_HANDLE``) the handle's, None once it is gone."""
        client = self._client
        return self._from_handle(False) if client is FROM_HANDLE else client

    @client.setter
    def client(self, value: Address) -> None:
        self._client = value

    @property
    def server(self) -> Address:
        """The server's own address: as stored, else as the handle has it (as ``client``)."""
        server = self._server
        return self._from_handle(True) if server is FROM_HANDLE else server

    @server.setter
    def server(self, value: Address) -> None:
        self._server = value

    def _from_handle(self, own: bool) -> Address:
        handle = self.handle
        return None if handle is None else handle.connlist_address(own)

    def keep_from_handle(self) -> None:
        """Store what the record reads from its handle now: it shows them once the handle is gone.

        The method and path, and the addresses where the server layer left
        them to the handle: for a record handed out (``on_timeout``), which
        its holder may read after the connection is removed and its handle
        dropped.
        """
        handle = self.handle
        if handle is None:
            return
        if self._method is None:
            self._method, self._path = handle.connlist_request()
        if self._client is FROM_HANDLE:
            self._client = handle.connlist_address(False)
        if self._server is FROM_HANDLE:
            self._server = handle.connlist_address(True)

    @property
    def tracked(self) -> bool:
        """Whether the list holds the connection (connected and not yet removed; upgraded ones too)."""
        return self._all_next is not None or self.out_state == OUT_UPGRADED

    @property
    def is_upgraded(self) -> bool:
        """Whether the connection left HTTP (a websocket) and is held in ``upgraded`` until it closes."""
        return self.out_state == OUT_UPGRADED

    @property
    def is_active(self) -> bool:
        """Whether the connection is in ``active`` (receiving a request)."""
        return self._active_next is not self and self._active_next is not None

    @property
    def receiving_body(self) -> bool:
        """Whether the connection is in ``body`` (its request's body is timed by the minimum rate)."""
        return self._body_link.next is not self._body_link

    @property
    def is_stalled(self) -> bool:
        """Whether the client stopped taking the response (the transport paused writing)."""
        return self.out_state == OUT_STALLED

    # -- the send timeout's samples (connlist.core.sweep.stall_sample) ---------------

    def first_sample(self, now: float, pending: int, acked: tuple[int, int] | None) -> None:
        """The stall began ``now`` with ``pending`` bytes unsent; ``acked`` as for ``sample``."""
        self.out_since = self.out_sampled = now
        self.out_pending = pending
        if acked is None:
            self.out_acked = -1
        else:
            # What it took before it stopped is a step of its own: on
            # loopback the window is already zero when the stall begins.
            self.out_acked = acked[0]
            step = acked[0] if acked[0] > acked[1] else acked[1]
            if step > self.out_step:
                self.out_step = step

    def sample(self, now: float, pending: int, acked: tuple[int, int] | None) -> None:
        """A sample of the stalled response: ``pending`` bytes unsent, and what the kernel reports.

        ``acked``: the bytes the client acknowledged so far and its window
        now (``TCP_INFO``), or None.  Progress is more bytes acknowledged
        than at the last sample, when the kernel reports them, else fewer
        bytes unsent; it moves ``out_since`` to ``now``.  The step, the
        progress (or the window, if larger), raises ``out_step``: see
        ``kinds.send_allowance``.
        """
        window = 0
        if acked is None or self.out_acked < 0:
            progress = self.out_pending - pending
        else:
            progress = acked[0] - self.out_acked
            window = acked[1]
        if acked is not None:
            self.out_acked = acked[0]
        if progress > 0:
            self.out_since = now
        step = progress if progress > window else window
        if step > self.out_step:
            self.out_step = step
        self.out_pending = pending
        self.out_sampled = now

    def __repr__(self) -> str:
        return (
            f"<Connection id={self.id} client={self.client!r} start={self.last_message_start!r} "
            f"headers_completed={self.headers_completed!r}>"
        )


class Received(Connection):
    """The record of one of ASGI-only mode's requests without a body, made when a view walks the list.

    Such a request arrives whole (its headers are all there is to receive),
    so nothing times it; it is handled from its arrival until the app
    returns.  Per request, the feeder (``connlist.asgi.asgi_only``) writes only an entry
    in ``ConnectionsList.received``, ``id -> (arrival, scope)``, and deletes
    it when the app returns: that is all a request costs.  The list counts
    the entries as idle connections whose response is unfinished, and
    ``iter_all`` hands each out as one of these records, in the handling
    state, after the linked records (in arrival order).  A record stays
    ``tracked`` while its entry is in the table.
    """

    __slots__ = ("_table",)

    def __init__(self, key: int, arrival: float, scope: Any, table: dict[int, tuple[float, Any]]) -> None:
        super().__init__(client=scope.get("client"), server=scope.get("server"), connected_at=arrival, id=key)
        self._table = table
        # Received whole, and handed to the app: idle, one request, responding.
        self.headers_completed = True
        self.requests = 1
        self._method = scope.get("method")
        self._path = scope.get("path")
        self.responding = True

    @property
    def tracked(self) -> bool:
        """Whether the request is still in the list (the app has not returned)."""
        return self.id in self._table
