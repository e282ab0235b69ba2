"""The per-worker list of connections, after Node.js's ConnectionsList.

Theory of operation
-------------------

Node.js (``src/node_http_parser.cc``, ``lib/_http_server.js``) keeps, per
server, every connection in a list ``all`` and every connection that is in the
middle of receiving a request in a list ``active``.  A periodic check asks the
list which active connections are *expired*, answers them with ``408`` and
closes them.  This module is that list: its lists, its events and its
counts.  The server layer (``connlist.uvicorn``) and the middleware feed it;
``connlist.sweep`` and ``connlist.budget`` walk it; the enforcer acts on what
they find, through the handles the server layer attached.

A connection moves through these events (the clock is monotonic)::

    connect            joins all and active; clock started, headers incomplete
                       (a client that connects and sends nothing is timed)
    message_begin      first byte of a request: clock restarted, headers
                       incomplete, moved to the tail of active
    headers_complete   headers_completed = True
    message_complete   request fully received: leaves active, clock reset to 0
                       (the connection is idle until the next message_begin)
    message            message_begin, headers_complete and message_complete at
                       one instant, on an idle connection: a whole request in
                       one read.  Nothing moves and no clock is read; the
                       connection stays idle, one request more, responding
    response_begin     a received request went to the app: responding
    response_complete  no response unfinished: not responding
    remove             closed or upgraded: leaves every list it is in

A connection is *expired* when it is in ``active`` and either its headers are
incomplete and its message started more than ``headers_timeout`` ago, or its
message started more than ``request_timeout`` ago.  Expired connections leave
``active`` (so each is reported once) and stay in ``all`` until removed.

Four more lists serve what Node does not do, each a ``connlist.queues.Queue``
ordered by the time that matters to it; none is touched by a request that
arrives whole::

    body      requests receiving a body, by when it began (``body_begin``;
              ``connlist.sweep`` times the minimum rate)
    stalled   responses the client stopped taking (``stall``, ``unstall``),
              by when they were last sampled (``connlist.sweep``)
    closing   connections the enforcer closed (``linger``), by when
    idle      connections in the order they became idle, for the
              connection budget's choice of what to close
              (``connlist.budget``)

A record is in at most one of ``stalled`` and ``closing`` (one link,
``out_state`` says which).  A connection closed to make room (``let_go``)
leaves ``active``, ``body`` and ``idle``, counts as timed out until removed,
and no longer counts in ``occupied``.

``all`` and ``active`` are intrusive, circular and doubly linked, like the
pure-Python ``OrderedDict`` in CPython: each ``Connection`` carries its own
links, and each list has a sentinel root.  Their links are written out in
the events a request runs (docs/benchmarks.md, "Where the remaining
instructions go").

Invariants:

* A node that is in no list is linked to itself, so unlinking is idempotent
  and always safe, and "is it linked?" is one identity test.
* ``message_begin`` stamps the current clock and moves the node to the tail,
  and the clock never goes back, so ``active`` is always ordered by
  ``last_message_start``, oldest first.  ``expired()`` therefore stops at the
  first connection too young to expire, and the earliest deadline of all is
  found near the head: one timer per worker is enough.
* ``last_message_start == 0`` exactly when the connection is idle (between
  requests); an expired connection keeps its start, so it is neither idle
  nor active.  The clock must therefore never return 0 (``time.monotonic``
  does not).
* The counts are kept as the nodes move, so each is O(1): ``all``,
  ``active``, expired connections not yet closed (``timed_out``), and active
  connections whose headers are incomplete; idle is what remains (``all -
  active - timed_out``), so a request updates one count, not two.
  ``headers_completed`` and ``last_message_start`` must therefore change
  only through the list's events.
* The feeder's own writes: ``responding``, ``requests`` and
  ``body_received`` are the record's own, no count and no link depends on
  them, so a feeder's hot path may write them itself (``message`` says
  which).  The view's count of idle connections that are responding is
  taken when it asks, by a walk of ``all`` (``idle_responding_count``).

States
------

All state logic is here, beside the events that change the fields: a
connection's state is derived from its fields (``connection_state``), and
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
    closed           no longer in the list (the view never shows one)

The counts add nginx ``stub_status``-style phases (``PHASES``): ``reading``
(new + reading_headers), ``writing`` (reading_body + handling), ``waiting``
(idle) and ``timed_out``; they add up to ``all``.  A stalled connection keeps
the phase of what it does otherwise.  Which timeout runs for a connection,
and when it is due (the view's ``timeout`` and ``time_left``), is
``connlist.kinds.deadline``'s.  ``docs/debug-endpoint.md`` is the reference.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from connlist.kinds import effective_timeouts
from connlist.queues import UNQUEUED, Link, Queue

__all__ = [
    "PHASES",
    "STATES",
    "Connection",
    "ConnectionHandle",
    "ConnectionsList",
    "connection_state",
]

# What ``connection_state`` answers for a tracked connection (see "States").
STATES = ("new", "reading_headers", "reading_body", "handling", "stalled", "idle", "timed_out")
# The phases of ``ConnectionsList.counts``; they add up to ``all``.
PHASES = ("reading", "writing", "waiting", "timed_out")


class ConnectionHandle(Protocol):
    """What the server layer gives the list so that a connection can be closed.

    The names are prefixed because the server layer's protocol objects are
    themselves the handles, and must not clash with their own methods.
    """

    def connlist_close_expired(self) -> None:
        """Answer ``408`` if no response byte was written for the current request, then close."""

    def connlist_close_idle(self) -> bool:
        """Close the connection if no response is in progress; return whether it was closed."""

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


# A peer or local address as the server layer has it: an ASGI ``(host, port)``
# pair (uvicorn's ``client`` and ``server``), a string, or None (unknown, or a
# unix socket); the debug view formats it.
Address = tuple[str, int | None] | str | None

# Connection.out_state: in neither ``stalled`` nor ``closing``, or in one of them.
OUT_NONE = 0
OUT_STALLED = 1
OUT_CLOSING = 2


_ids = itertools.count(1)
# The id of a record not given one, unique in the process.  ASGI-only mode
# gives its records their request number instead (connlist.asgi says why).
next_id = _ids.__next__
_INF = math.inf


class Connection:
    """One TCP connection (in ASGI-only mode: one request), as the list sees it.

    Links are private to the list; the other fields are read by the debug
    view and the enforcer, and written by the server layer.
    """

    __slots__ = (
        "_active_next",
        "_active_prev",
        "_all_next",
        "_all_prev",
        "_begun",
        "_body_link",
        "_idle_link",
        "_method",
        "_out_link",
        "_path",
        "body_received",
        "body_started",
        "client",
        "connected_at",
        "gone",
        "handle",
        "headers_completed",
        "id",
        "idle_requests",
        "idle_since",
        "last_message_start",
        "out_acked",
        "out_pending",
        "out_sampled",
        "out_since",
        "out_state",
        "out_step",
        "requests",
        "responding",
        "server",
    )

    def __init__(
        self,
        *,
        client: Address = None,
        server: Address = None,
        handle: ConnectionHandle | None = None,
        connected_at: float = 0.0,
        id: int | None = None,
    ) -> None:
        # Linked to itself: in no list.
        self._all_prev: Connection = self
        self._all_next: Connection = self
        self._active_prev: Connection = self
        self._active_next: Connection = self
        # Its places in the queues (connlist.queues): ``body``, ``stalled``
        # or ``closing``, and ``idle``.
        self._body_link: Link[Connection] = UNQUEUED
        self._out_link: Link[Connection] = UNQUEUED
        self._idle_link: Link[Connection] = UNQUEUED
        # Given by ASGI-only mode, which numbers its requests as it counts them.
        self.id: int = next_id() if id is None else id
        self.client = client
        self.server = server
        self.handle = handle
        self.connected_at = connected_at
        # Clock value at which the current message began; 0 when idle.
        self.last_message_start: float = 0.0
        self.headers_completed = False
        # Requests fully received on this connection.
        self.requests = 0
        # Method and path (never the query string) of the current or last
        # request, when the server layer stores them (see ``method``).
        self._method: str | None = None
        self._path: str | None = None
        # Whether a byte of a request ever arrived (``message_begin``): a
        # connection that has not is ``new``.
        self._begun = False
        # A response to a received request is unfinished: from
        # ``response_begin`` (``headers_complete`` with the request,
        # ``message``) to ``response_complete`` (``remove``).  The feeder's to
        # write, through those events or directly (see the module docstring).
        self.responding = False
        # The body being received (while in ``body``): when it began, and
        # how many bytes have arrived since (framing included).
        self.body_started = 0.0
        self.body_received = 0
        # ``stalled`` or ``closing`` (OUT_STALLED, OUT_CLOSING; OUT_NONE: in
        # neither).  Stalled: last progress, last sample, bytes unsent then;
        # closing: when the enforcer closed it.
        self.out_state = OUT_NONE
        self.out_since = 0.0
        self.out_sampled = 0.0
        self.out_pending = 0
        # Stalled: the bytes the client had acknowledged at the last sample
        # (-1: the transport cannot tell), and the largest step in which its
        # acknowledgements came (kept from one stall to the next).
        self.out_acked = -1
        self.out_step = 0
        # While in ``idle_queue`` (see ``connlist.budget``): ``requests``
        # when it joined or was last looked at there, and when that was
        # (0: not stamped yet; the timer stamps it).
        self.idle_requests = 0
        self.idle_since = 0.0
        # Closed or aborted to make room (``ConnectionsList.let_go``): its
        # descriptor is on its way out, it no longer counts against the budget.
        self.gone = False

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
    def tracked(self) -> bool:
        """Whether the connection is in ``all`` (connected and not yet removed)."""
        return self._all_next is not self

    @property
    def is_active(self) -> bool:
        """Whether the connection is in ``active`` (receiving a request)."""
        return self._active_next is not self

    @property
    def receiving_body(self) -> bool:
        """Whether the connection is in ``body`` (its request's body is timed by the minimum rate)."""
        return self._body_link.next is not self._body_link

    @property
    def stalled(self) -> bool:
        """Whether the client stopped taking the response (the transport paused writing)."""
        return self.out_state == OUT_STALLED

    def __repr__(self) -> str:
        return (
            f"<Connection id={self.id} client={self.client!r} start={self.last_message_start!r} "
            f"headers_completed={self.headers_completed!r}>"
        )


def connection_state(conn: Connection) -> str:
    """One of ``STATES``, or ``"closed"`` for a connection no longer in the list."""
    if conn._active_next is not conn:
        if conn.headers_completed:
            return "reading_body"
        return "reading_headers" if conn._begun else "new"
    if not conn.tracked:  # a property: a ``Received`` record is in the list's table, not linked
        return "closed"
    if conn.last_message_start != 0.0:
        return "timed_out"  # left active without completing its message: expired
    if conn.out_state == OUT_STALLED:
        return "stalled"
    return "handling" if conn.responding else "idle"


class Received(Connection):
    """The record of one of ASGI-only mode's requests without a body, made when a view walks the list.

    Such a request arrives whole (its headers are all there is to receive),
    so nothing times it; it is handled from its arrival until the app
    returns.  Per request, the feeder (``connlist.asgi``) writes only an entry
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


class ConnectionsList:
    """Every connection of one worker: Node's ``all`` and ``active``, and the queues (module docstring)."""

    __slots__ = (
        "_active_root",
        "_all_root",
        "_clock",
        "_n_active",
        "_n_all",
        "_n_gone",
        "_n_headers_pending",
        "_n_timed_out",
        "body",
        "closing",
        "idle_queue",
        "received",
        "stalled",
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Sentinels: an empty list is a root linked to itself.
        self._all_root = Connection()
        self._active_root = Connection()
        self._n_all = 0
        self._n_active = 0
        # Expired connections not yet closed (neither active nor idle).
        self._n_timed_out = 0
        # Active connections whose headers are incomplete.
        self._n_headers_pending = 0
        # Connections let go to make room, not yet removed.
        self._n_gone = 0
        self.body: Queue[Connection] = Queue("_body_link", "body_started")
        self.stalled: Queue[Connection] = Queue("_out_link", "out_sampled")
        self.closing: Queue[Connection] = Queue("_out_link", "out_since")
        # ``idle()`` is Node's view; this is the budget's queue (connlist.budget).
        self.idle_queue: Queue[Connection] = Queue("_idle_link", "idle_since")
        # ASGI-only mode's requests without a body (see Received).
        self.received: dict[int, tuple[float, Any]] = {}

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    # -- the links of all and active ----------------------------------------
    #
    # message_begin and message_complete write theirs out: a method call costs
    # as much as the link it makes (docs/benchmarks.md, "Where the remaining
    # instructions go").

    def _all_append(self, conn: Connection) -> None:
        root = self._all_root
        last = root._all_prev
        conn._all_prev = last
        conn._all_next = root
        last._all_next = conn
        root._all_prev = conn

    @staticmethod
    def _all_unlink(conn: Connection) -> None:
        prev = conn._all_prev
        nxt = conn._all_next
        prev._all_next = nxt
        nxt._all_prev = prev
        conn._all_prev = conn._all_next = conn

    def _active_append(self, conn: Connection) -> None:
        root = self._active_root
        last = root._active_prev
        conn._active_prev = last
        conn._active_next = root
        last._active_next = conn
        root._active_prev = conn

    @staticmethod
    def _active_unlink(conn: Connection) -> None:
        prev = conn._active_prev
        nxt = conn._active_next
        prev._active_next = nxt
        nxt._active_prev = prev
        conn._active_prev = conn._active_next = conn

    def _out_leave(self, conn: Connection) -> None:
        """Out of ``stalled`` or ``closing``, and its state with it."""
        if conn.out_state == OUT_STALLED:
            self.stalled.unlink(conn)
        elif conn.out_state == OUT_CLOSING:
            self.closing.unlink(conn)
        conn.out_state = OUT_NONE

    # -- events --------------------------------------------------------------

    def connect(self, **details: Any) -> Connection:
        """A new connection: joins ``all`` and ``active``; its clock starts now."""
        now = self._clock()
        conn = Connection(connected_at=now, **details)
        self._all_append(conn)
        self._n_all += 1
        conn.last_message_start = now
        self._active_append(conn)
        self._n_active += 1
        self._n_headers_pending += 1
        return conn

    def message_begin(self, conn: Connection) -> None:
        """The first byte of a request: clock restarted, moved to the tail of ``active``."""
        if conn._all_next is conn:
            return  # removed (closed or upgraded): never rejoin
        nxt = conn._active_next
        if nxt is not conn:
            prev = conn._active_prev
            prev._active_next = nxt
            nxt._active_prev = prev
            if conn.headers_completed:
                self._n_headers_pending += 1
                # A new message while a body was being received: that body is over.
                self.body.unlink(conn)
        else:
            self._n_active += 1
            self._n_headers_pending += 1
            if conn.last_message_start != 0.0:
                self._n_timed_out -= 1
        conn.last_message_start = self._clock()
        conn.headers_completed = False
        conn._begun = True
        root = self._active_root
        last = root._active_prev
        conn._active_prev = last
        conn._active_next = root
        last._active_next = conn
        root._active_prev = conn

    def headers_complete(self, conn: Connection, method: str | None = None, path: str | None = None) -> None:
        """The request's headers are all in: only the request timeout applies from now on.

        The server layer passes the request's ``method`` and ``path``: the
        request is then handed to the app, so the connection is
        ``responding`` (``response_begin``) until ``response_complete``.
        (One call of the server layer's instead of three: this runs once per
        request.)
        """
        if not conn.headers_completed and conn._active_next is not conn:
            self._n_headers_pending -= 1
        conn.headers_completed = True
        if method is not None:
            conn._method = method
            conn._path = path
            self.response_begin(conn)

    def message(self, conn: Connection) -> None:
        """A whole request begun and fully received at one instant: the three events at once.

        On an idle connection (the server's common case: a request in one
        read between two responses) ``message_begin`` would link it into
        ``active`` and read the clock, and ``message_complete`` would unlink
        it and reset the clock: nothing of that remains, so nothing is done.
        The connection has one request more, and is responding (the request
        goes to the app): a feeder's hot path writes these two itself (see
        the module docstring), since its record's headers were completed (a
        record becomes idle only through ``message_complete``, which a feeder
        sends only after ``headers_complete``).  In any other state, the
        events one by one.
        """
        if conn.last_message_start != 0.0 or conn._all_next is conn:
            self.message_begin(conn)
            self.headers_complete(conn)
            self.message_complete(conn)
            self.response_begin(conn)
            return
        conn.headers_completed = True
        conn.requests += 1
        conn.responding = True

    @staticmethod
    def response_begin(conn: Connection) -> None:
        """A received request went to the app: ``responding`` until ``response_complete``."""
        if conn._all_next is not conn:
            conn.responding = True

    @staticmethod
    def response_complete(conn: Connection) -> None:
        """No response is unfinished on the connection any more (``responding`` is false)."""
        conn.responding = False

    def message_complete(self, conn: Connection) -> None:
        """The request is fully received: the connection leaves ``active`` and is idle."""
        if conn._all_next is conn:
            return
        nxt = conn._active_next
        if nxt is not conn:
            prev = conn._active_prev
            prev._active_next = nxt
            nxt._active_prev = prev
            conn._active_prev = conn._active_next = conn
            self._n_active -= 1
            if not conn.headers_completed:
                self._n_headers_pending -= 1
            else:
                body = conn._body_link
                if body.next is not body:
                    self.body.unlink(conn)
        elif conn.last_message_start != 0.0:
            # Expired and not yet closed: its request is fully received after all.
            self._n_timed_out -= 1
        else:
            return  # idle already: a second call for the same request counts nothing
        conn.last_message_start = 0.0
        conn.requests += 1
        idle = conn._idle_link
        if idle.next is idle:
            # Joins the tail of ``idle``, unstamped; a record still in it
            # stays where it is (connlist.budget sees it was used).
            conn.idle_requests = conn.requests
            conn.idle_since = 0.0
            self.idle_queue.append(conn)

    def remove(self, conn: Connection) -> None:
        """Closed or upgraded: leaves every list it is in.  Idempotent, safe in any state."""
        if conn._all_next is not conn:
            # Only a tracked connection can be in ``active``.
            if conn._active_next is not conn:
                self._active_unlink(conn)
                self._n_active -= 1
                if not conn.headers_completed:
                    self._n_headers_pending -= 1
            elif conn.last_message_start != 0.0:
                self._n_timed_out -= 1
            # Nothing is left to finish on a removed record.
            conn.responding = False
            if conn._body_link.next is not conn._body_link:
                self.body.unlink(conn)
            if conn.out_state:
                self._out_leave(conn)
            if conn._idle_link.next is not conn._idle_link:
                self.idle_queue.unlink(conn)
            if conn.gone:
                self._n_gone -= 1
            self._all_unlink(conn)
            self._n_all -= 1

    # -- the connection budget, and the queues' events ---------------------------

    def let_go(self, conn: Connection) -> None:
        """The connection is being closed to make room: it stops counting against the budget.

        It leaves ``active``, ``body`` and ``idle`` and counts as timed out
        (closed by connlist, not yet gone) until it is removed; ``occupied``
        no longer counts it.
        """
        if conn._all_next is conn or conn.gone:
            return
        conn.gone = True
        self._n_gone += 1
        if conn._active_next is not conn:
            self._active_unlink(conn)
            self._n_active -= 1
            if not conn.headers_completed:
                self._n_headers_pending -= 1
            else:
                self.body.unlink(conn)
            self._n_timed_out += 1
        elif conn.last_message_start == 0.0:
            # (Never one that is responding: connlist.budget hands out none
            # from idle_queue, and the others are active.)
            conn.last_message_start = self._clock()
            self._n_timed_out += 1
        self.idle_queue.unlink(conn)

    @property
    def occupied(self) -> int:
        """Connections that count against the budget: those in ``all`` not let go."""
        return self._n_all - self._n_gone

    # -- the body, the stalled and the closing lists ---------------------------

    def body_begin(self, conn: Connection, received: int = 0) -> None:
        """The body's clock starts: it joins the tail of ``body``, timed from now, ``received`` bytes in.

        The server layer calls it once the request's headers are in and a
        body follows, or, while the client waits for ``100 Continue``, once
        the server lets the body come (``received``: the bytes that arrived
        before, which count like any other).  Only a request that is being
        received (in ``active``, headers complete) can join; a second call
        for the same body does nothing.
        """
        if not conn.receiving_body and conn._active_next is not conn and conn.headers_completed:
            conn.body_started = self._clock()
            conn.body_received = received
            self.body.append(conn)

    def body_bytes(self, conn: Connection, nbytes: int) -> None:
        """``nbytes`` more of the body arrived (the server layer may add to ``body_received`` itself)."""
        conn.body_received += nbytes

    def expire(self, conn: Connection) -> None:
        """The connection ran out of time (outside ``expired``'s walk): it leaves ``active`` and ``body``.

        It counts as timed out, like those ``expired`` returns, until it is removed.
        """
        if conn._active_next is not conn:
            self._active_unlink(conn)
            self._n_active -= 1
            self._n_timed_out += 1
            if not conn.headers_completed:
                self._n_headers_pending -= 1
        self.body.unlink(conn)

    def stall(self, conn: Connection, pending: int, acked: tuple[int, int] | None = None) -> None:
        """The client stopped taking the response (``pending`` bytes unsent): joins the tail of ``stalled``.

        ``acked`` is what the kernel reports, if it does (``TCP_INFO``): the
        bytes the client acknowledged so far, and its window now; the larger
        of the two is a step (see ``kinds.send_allowance``).  Does nothing for a
        connection that is closing, already stalled, or not tracked.
        """
        if conn.out_state == OUT_NONE and conn._all_next is not conn:
            now = self._clock()
            conn.out_state = OUT_STALLED
            conn.out_since = conn.out_sampled = now
            conn.out_pending = pending
            if acked is None:
                conn.out_acked = -1
            else:
                # What the client took before it stopped taking more is a
                # step of its own: on loopback its kernel acknowledges the
                # fill of its buffer before the server's write returns, so
                # the window is already zero when the stall begins.
                conn.out_acked = acked[0]
                step = acked[0] if acked[0] > acked[1] else acked[1]
                if step > conn.out_step:
                    conn.out_step = step
            self.stalled.append(conn)

    def unstall(self, conn: Connection) -> None:
        """The response is flowing again: leaves ``stalled`` (nothing happens if it was not in it)."""
        if conn.out_state == OUT_STALLED:
            self._out_leave(conn)

    def linger(self, conn: Connection) -> None:
        """The enforcer closed the connection: it joins the tail of ``closing`` (leaving ``stalled``)."""
        if conn._all_next is conn or conn.out_state == OUT_CLOSING:
            return
        if conn.out_state == OUT_STALLED:
            self._out_leave(conn)
        conn.out_state = OUT_CLOSING
        conn.out_since = self._clock()
        self.closing.append(conn)

    # -- views ---------------------------------------------------------------

    def __len__(self) -> int:
        return self._n_all + len(self.received)

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
    def idle_responding_count(self) -> int:
        """Idle connections (no request being received) whose response is unfinished: O(n).

        Counted now, by a walk of ``all``, rather than kept as requests come
        and go: that would take a write of the list's own at every request,
        which a feeder's hot path does not make (see ``responding``).
        """
        n = len(self.received)
        root = self._all_root
        node = root._all_next
        while node is not root:
            if node.responding and node.last_message_start == 0.0:
                n += 1
            node = node._all_next
        return n

    @property
    def stalled_count(self) -> int:
        """Connections in ``stalled``: the client stopped taking the response."""
        return len(self.stalled)

    def counts(self) -> dict[str, int]:
        """The view's exact counts: ``all``, ``idle``, ``active``, the ``PHASES`` and ``stalled``.

        O(1) but for ``writing`` and ``waiting``, which take the walk of
        ``idle_responding_count`` (O(n)).

        ``stalled`` is not a phase: a stalled connection keeps the phase of
        what it does otherwise (``writing`` while its app responds,
        ``waiting`` once the app has handed over the whole response).
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
            "stalled": len(self.stalled),
        }

    def iter_all(self) -> Iterator[Connection]:
        """``all`` in connection order; the current node may be removed while iterating."""
        root = self._all_root
        node = root._all_next
        # A node removed during the yield is linked to itself: carry on from
        # its old successor.  (A linked node is never linked to itself, so a
        # successor that was removed too ends the walk instead of looping.)
        while node is not root and node._all_next is not node:
            nxt = node._all_next
            yield node
            node = nxt if node._all_next is node else node._all_next
        if node is root:
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
        while node is not root and node._active_next is not node:
            nxt = node._active_next
            yield node
            node = nxt if node._active_next is node else node._active_next

    def all(self) -> list[Connection]:
        return list(self.iter_all())

    def active(self) -> list[Connection]:
        return list(self.iter_active())

    def idle(self) -> list[Connection]:
        return [conn for conn in self.iter_all() if conn.last_message_start == 0]

    # -- closing (through the handles the server layer attached) -------------

    def close_idle(self) -> int:
        """Close idle connections, skipping any whose response is unfinished (Node's closeIdleConnections).

        Returns how many were closed.
        """
        closed = 0
        for conn in self.idle():
            if conn.handle is not None and conn.handle.connlist_close_idle():
                closed += 1
        return closed

    def close_all(self) -> int:
        """Close every connection (Node's closeAllConnections); returns how many."""
        conns = [conn for conn in self.iter_all() if conn.handle is not None]
        for conn in conns:
            conn.handle.connlist_close()  # type: ignore[union-attr]
        return len(conns)

    # -- timeouts ------------------------------------------------------------

    def expired(self, headers_timeout: float, request_timeout: float, limit: int = -1) -> list[Connection]:
        """Unlink and return the active connections that ran out of time (Node's rule).

        0 disables a timeout; the two are taken as Node's list takes them
        (``kinds.effective_timeouts``: checked, and swapped if the headers
        timeout is the longer).  The cost is proportional to the
        connections older than the shorter timeout, not to all active ones.
        At most ``limit`` are returned (``-1``: no limit); the rest stay for
        the next call.
        """
        headers_timeout, request_timeout = effective_timeouts(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        # headers_timeout <= request_timeout, so a connection that started at
        # or after this bound is safe under both rules, and so is every
        # connection after it in ``active``.
        young = headers_deadline if headers_timeout else request_deadline
        expired: list[Connection] = []
        root = self._active_root
        node = root._active_next
        while node is not root:
            start = node.last_message_start
            if start >= young:
                break
            nxt = node._active_next
            if start < request_deadline or (not node.headers_completed and start < headers_deadline):
                if len(expired) == limit:
                    break
                self._active_unlink(node)
                if not node.headers_completed:
                    self._n_headers_pending -= 1
                else:
                    self.body.unlink(node)
                expired.append(node)
            node = nxt
        self._n_active -= len(expired)
        self._n_timed_out += len(expired)
        return expired

    def next_deadline(self, headers_timeout: float, request_timeout: float) -> float | None:
        """The earliest clock value at which some active connection can expire, or None.

        The timeouts are taken as ``expired`` takes them (checked, and
        swapped if the headers timeout is the longer).

        Walks from the head only as far as a later connection could still
        have an earlier deadline: at most the connections whose headers are
        complete and that started before the first one whose are not.
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
            # Every later node started at or after ``start``, so none can
            # expire before ``start + shortest``.
            if start + shortest >= best:
                break
            if headers_timeout and not node.headers_completed:
                best = start + headers_timeout
                break
            if request_timeout:
                best = min(best, start + request_timeout)
            node = node._active_next
        return None if best == math.inf else best
