"""The per-worker list of connections, after Node.js's ConnectionsList.

Theory of operation
-------------------

Node.js (``src/node_http_parser.cc``, ``lib/_http_server.js``) keeps, per server, every
connection in a list ``all`` and every connection receiving a request in a list ``active``.  A
periodic check asks the list which active connections are *expired*, answers them with ``408``
and closes them.  This module is that list: its lists, events, counts and walks, and the only
module that reads or writes a record's links or the list's counts (records are
``connlist.core.records``'; ``connlist.core.views`` presents what the list tells it).  The
server layer and the middleware feed it; ``connlist.core.sweep`` and ``connlist.core.budget``
walk it; the enforcer acts on what they find, through the handles the server layer attached.

A connection moves through these events (the clock is monotonic)::

    connect            joins all and active; clock started, headers incomplete
                       (a client that connects and sends nothing is timed)
    message_begin      first byte of a request: clock restarted, headers
                       incomplete, moved to the tail of active
    headers_complete   headers_completed = True
    message_complete   request fully received: leaves active, clock reset to 0
                       (idle until the next message_begin)
    message            the three above at one instant (a whole request in one
                       read): on an idle connection nothing moves, no clock read
    response_begin     a received request went to the app: responding
    response_complete  no response unfinished: not responding
    upgrade            left HTTP (a websocket accepted for its handshake):
                       leaves ``all``'s ring and every HTTP list, joins
                       ``upgraded``; it still counts in ``occupied``
    remove             closed: leaves every list it is in

A connection is *expired* when it is in ``active`` and its message started more than
``headers_timeout`` ago with its headers incomplete, or more than ``request_timeout`` ago.
Expired ones leave ``active`` (each is reported once) and stay in ``all`` until removed.

Five more lists serve what Node does not do, each ordered by the time that matters to it
(``connlist.core.queues``); a request that arrives whole touches none::

    body        requests receiving a body, by when it began (``body_begin``;
                ``connlist.core.sweep`` times the minimum rate)
    stalled     responses the client stopped taking (``stall``, ``unstall``),
                by when they were last sampled (``connlist.core.sweep``)
    closing     connections the enforcer closed (``linger``), by when
    upgraded    connections that left HTTP (websockets), by when (``upgrade``);
                until they close, for the view and the budget (Node drops them)
    idle_queue  idle connections by when their idle time began, for the
                keep-alive and the budget's choice of what to close (``idle()``
                is Node's view): a heap, whose keys the sweep corrects late;
                a response's end that queues one tells the owner (``idle_joined``)

A record is in at most one of ``stalled``, ``closing`` and ``upgraded`` (one link, ``out_state``
says which).  One closed to make room (``evict``) leaves ``active``, ``body`` and the idle
queue, counts as timed out until removed, and no longer counts in ``occupied``.

``all`` and ``active`` are intrusive, circular and doubly linked, like CPython's pure-Python
``OrderedDict``: each ``Connection`` carries its own links, each list has a sentinel root.

Invariants:

* A record the list holds (connected, not yet removed) in no list but ``all`` is linked to
  itself in ``active``, as are the roots of empty lists: unlinking is idempotent, "is it
  linked?" one identity test.  A record it does not hold (not yet connected, or removed) has no
  links (``NO_LINK``): "is it in ``all``?" is ``_all_next is not None``, and no record refers to
  itself once the list lets go of it.
* ``message_begin`` stamps the clock and moves the node to the tail, and the clock never goes
  back, so ``active`` is ordered by ``last_message_start``, oldest first: ``expired()`` stops at
  the first connection too young to expire, and the earliest deadline is near the head
  (``next_deadline``): one timer per worker is enough.
* ``last_message_start == 0`` exactly when the connection is idle; an expired connection keeps
  its start, so it is neither idle nor active.  The clock must never return 0 (``time.monotonic``
  does not).
* An upgraded record is out of ``all``'s ring and has no links (as a removed one), so every HTTP
  event is a no-op on it at no cost: it is held by ``upgraded`` alone, which ``all()`` and the
  counts add, until ``remove``.
* The counts are kept as the nodes move, so each is O(1): ``occupied``, ``active``, expired
  connections not yet closed (``timed_out``), active connections whose headers are incomplete,
  and those evicted.  ``all`` is ``occupied`` less the upgraded plus the evicted (a join or a
  removal updates one count), and idle is ``all - active - timed_out`` (a request updates one
  count).  ``headers_completed`` and ``last_message_start`` therefore change only through the
  list's events.
* No count and no link depends on ``responding``, ``requests`` and ``body_received``: the idle
  connections still responding are counted when the view asks (``idle_responding_count``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from connlist.core.kinds import effective_timeouts
from connlist.core.queues import UNQUEUED, Heap, Queue
from connlist.core.records import (
    NO_LINK,
    OUT_CLOSING,
    OUT_NONE,
    OUT_STALLED,
    OUT_UPGRADED,
    Address,
    Connection,
    ConnectionHandle,
)

# The views' states and phases, re-exported (the debug endpoint's docs name connection_state here).
from connlist.core.views import PHASES, STATES, ListViews, connection_state

__all__ = ["PHASES", "STATES", "Connection", "ConnectionHandle", "ConnectionsList", "connection_state"]

# ``connect`` makes its record with these, not ``Connection(...)``, whose ``__init__`` runs called
# from C, not inline; and it
# writes the links and the start itself, once.
_new = object.__new__
_fields = Connection._fields


def _nothing(conn: Connection) -> None:
    """``idle_joined`` of a list whose owner times nothing."""


class ListState(ListViews):
    """The list's roots, counts and queues, and what reads them: its counts and walks, which the views ask."""

    __slots__ = (
        "_active_root",
        "_all_root",
        "_clock",
        "_n_active",
        "_n_evicted",
        "_n_headers_pending",
        "_n_timed_out",
        "body",
        "closing",
        "idle_joined",
        "idle_queue",
        "occupied",
        "received",
        "stalled",
        "upgraded",
    )

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        idle_joined: Callable[[Connection], None] | None = None,
    ) -> None:
        self._clock = clock
        self.idle_joined = idle_joined or _nothing  # the owner's: see idle_queue in the module docstring
        # Sentinels: an empty list is a root linked to itself.
        self._all_root = root = Connection()
        root._all_prev = root._all_next = root
        self._active_root = root = Connection()
        root._active_prev = root._active_next = root
        # The counts (see the invariants; ``all``'s is ``_n_all``).
        self._n_evicted = self._n_active = self._n_timed_out = self._n_headers_pending = 0
        self.occupied = 0  # in ``all``, not evicted: the budget's count (read-only outside the list)
        self.body: Queue[Connection] = Queue("_body_link", "body_started")
        self.stalled: Queue[Connection] = Queue("_out_link", "out_sampled")
        self.closing: Queue[Connection] = Queue("_out_link", "out_since")
        self.upgraded: Queue[Connection] = Queue("_out_link", "out_since")
        self.idle_queue: Heap[Connection] = Heap("_idle_entry", "idle_since")  # keep-alive, budget
        # ASGI-only mode's requests without a body (see Received).
        self.received: dict[int, tuple[float, Any]] = {}

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def next_deadline(self, headers_timeout: float, request_timeout: float) -> float | None:
        """The earliest clock value at which some active connection can expire, or None.

        The timeouts are taken as ``expired`` takes them.  The walk stops
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

    @property
    def _n_all(self) -> int:  # occupied, less the upgraded, plus the evicted (see the invariants)
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
        """``all``: the ring in connection order, then the upgraded, then ``Received``; the current may go.

        A node removed during the yield has no links: the walk carries on
        from its old successor, unless that was removed too (it ends).
        """
        root = self._all_root
        node = root._all_next
        while node is not root and node._all_next is not None:
            nxt = node._all_next
            yield node
            node = nxt if node._all_next is None else node._all_next
        if node is root:
            yield from self.upgraded
            yield from self._iter_received()

    def iter_active(self) -> Iterator[Connection]:
        """``active`` by message start, oldest first; unlinking the current node is safe.

        A node unlinked during the yield is linked to itself, or has no links if it was removed: the
        walk carries on from its old successor.
        """
        root = self._active_root
        node = root._active_next
        while node is not root and node._active_next is not node and node._active_next is not None:
            nxt = node._active_next
            yield node
            after = node._active_next
            node = nxt if after is node or after is None else after


class ConnectionsList(ListState):
    """Every connection of one worker: Node's ``all`` and ``active``, and the queues (module docstring)."""

    __slots__ = ()

    @staticmethod
    def _active_unlink(conn: Connection) -> None:
        prev = conn._active_prev
        nxt = conn._active_next
        prev._active_next = nxt
        nxt._active_prev = prev
        conn._active_prev = conn._active_next = conn

    def out_leave(self, conn: Connection) -> None:
        """Out of ``stalled`` or ``closing`` (never ``upgraded``: ``remove``), its state with it."""
        (self.stalled if conn.out_state == OUT_STALLED else self.closing).unlink(conn)
        conn.out_state = OUT_NONE

    # -- events --------------------------------------------------------------

    def connect(
        self,
        client: Address = None,
        server: Address = None,
        handle: ConnectionHandle | None = None,
        id: int | None = None,
    ) -> Connection:
        """A new connection: joins ``all`` and ``active``; its clock starts now."""
        now = self._clock()
        conn = _new(Connection)  # Connection(...), without the class's call (see _fields)
        _fields(conn, client, server, handle, now, id)
        conn.last_message_start = now
        root = self._all_root  # appended to all, then to active
        last = root._all_prev
        conn._all_prev = last
        conn._all_next = root
        last._all_next = conn
        root._all_prev = conn
        root = self._active_root
        last = root._active_prev
        conn._active_prev = last
        conn._active_next = root
        last._active_next = conn
        root._active_prev = conn
        self.occupied += 1
        self._n_active += 1
        self._n_headers_pending += 1
        return conn

    def message_begin(self, conn: Connection) -> None:
        """The first byte of a request: clock restarted, moved to the tail of ``active``."""
        if conn._all_next is None:
            return  # removed (closed or upgraded), or never connected: never rejoin
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
        """The request's headers are all in; with its ``method`` and ``path``, it goes to the app too."""
        if not conn.headers_completed and conn._active_next is not conn and conn._active_next is not None:
            self._n_headers_pending -= 1
        conn.headers_completed = True
        if method is not None:
            conn._method = method
            conn._path = path
            self.response_begin(conn)

    def message(self, conn: Connection) -> None:
        """A whole request at one instant, handed to the app: four events in one, no clock read.

        On an idle connection nothing moves; a new one (its first request whole in its first read)
        leaves ``active``, and ``response_complete`` queues it idle.
        """
        if conn.last_message_start == 0.0 and conn._all_next is not None:
            conn.headers_completed = True
            conn.requests += 1
            conn.responding = True
            return
        nxt = conn._active_next
        if nxt is conn or nxt is None or conn._begun or conn.headers_completed:
            # Expired, removed, or not new: the events one by one.
            self.message_begin(conn)
            self.headers_complete(conn)
            self.message_complete(conn)
            self.response_begin(conn)
            return
        prev = conn._active_prev
        prev._active_next = nxt
        nxt._active_prev = prev
        conn._active_prev = conn._active_next = conn
        self._n_active -= 1
        self._n_headers_pending -= 1
        conn.last_message_start = 0.0
        conn._begun = True
        conn.headers_completed = True
        conn.requests += 1
        conn.responding = True

    @staticmethod
    def response_begin(conn: Connection) -> None:
        """A received request went to the app: ``responding`` until ``response_complete``."""
        if conn._all_next is not None:
            conn.responding = True

    def response_complete(self, conn: Connection) -> None:
        """No response is unfinished any more: not ``responding``; an idle one joins the idle queue, now."""
        conn.responding = False
        conn.responded_at = now = self._clock()
        if conn._idle_entry is None and conn.last_message_start == 0.0 and conn._all_next is not None:
            self.idle_queue.push(conn, now)
            self.idle_joined(conn)

    def message_complete(self, conn: Connection) -> None:
        """The request is fully received: the connection leaves ``active`` and is idle."""
        if conn._all_next is None:
            return
        started = conn.last_message_start
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
        # Its idle time begins when its response ends (0: not yet, or it ended before this message).
        conn.responded_at = 0.0
        if conn._idle_entry is None and not conn.responding:
            # Its response ended first: keyed by the message's start, as no idle time began
            # before it.  One still responding joins at response_complete; one queued stays,
            # keyed as early (connlist.core.sweep, "The idle order").
            self.idle_queue.push(conn, started)

    def remove(self, conn: Connection) -> None:
        """Closed: leaves every list it is in, for good, and lets go of its handle.  Idempotent.

        Its links (``NO_LINK``) and handle (which holds the record) are cleared: no cycle is left
        for the cyclic collector, and the record goes with its last reference.
        """
        conn.handle = None
        last = conn._all_next
        if last is None:
            if conn.out_state == OUT_UPGRADED:
                # An upgraded connection closed (its ring links are gone already).
                self.upgraded.unlink(conn)
                conn.out_state = OUT_NONE
                self.occupied -= 1
                conn._out_link.release()
            return
        prev = conn._all_prev
        prev._all_next = last
        last._all_prev = prev
        nxt = conn._active_next
        if nxt is not conn:
            prev = conn._active_prev
            prev._active_next = nxt
            nxt._active_prev = prev
            self._n_active -= 1
            if not conn.headers_completed:
                self._n_headers_pending -= 1
        elif conn.last_message_start != 0.0:
            self._n_timed_out -= 1
        conn._all_prev = conn._all_next = conn._active_prev = conn._active_next = NO_LINK
        if conn.evicted:
            self._n_evicted -= 1
        else:
            self.occupied -= 1
        conn.responding = False  # nothing is left to finish on a removed record
        # The queues beyond Node's, which a connection per request never joins.
        if conn._idle_entry is not None:
            self.idle_queue.unlink(conn)
        body = conn._body_link
        if body is not UNQUEUED:  # its own: it was in ``body`` once
            self.body.unlink(conn)
            body.release()
        if conn.out_state:
            self.out_leave(conn)
        out = conn._out_link
        if out is not UNQUEUED:
            out.release()

    def upgrade(self, conn: Connection, method: str | None = None, path: str | None = None) -> None:
        """Left HTTP (a websocket the server hands its handshake to): held in ``upgraded`` until removed.

        It leaves ``all``'s ring and every HTTP list as at ``remove`` (no timeout applies, no
        HTTP event moves it), and joins the tail of ``upgraded``, stamped now (its
        ``last_message_start`` too: not idle, the view's ``duration`` is the websocket's);
        it still counts in ``occupied``.  ``method`` and ``path`` are kept if given.  Only a
        record in the ring, not let go to make room, is upgraded.
        """
        if conn._all_next is None or conn.evicted:
            return
        self.remove(conn)
        self.occupied += 1
        conn.out_state = OUT_UPGRADED
        conn.out_since = conn.last_message_start = self._clock()
        conn.headers_completed = True  # the upgrade request's, whole
        if path is not None:
            conn._method = method
            conn._path = path
        self.upgraded.append(conn)

    # -- the connection budget ---------------------------------------------------

    def evict(self, conn: Connection) -> None:
        """Closed to make room: out of ``occupied``, and timed out (``time_out``) until removed."""
        if conn._all_next is not None and not conn.evicted:
            conn.evicted = True
            self.occupied -= 1
            self._n_evicted += 1
            self.time_out(conn)
            self.idle_queue.unlink(conn)

    # -- the queues' events ---------------------------------------------------

    def body_begin(self, conn: Connection, received: int = 0) -> None:
        """The body's clock starts now, ``received`` bytes in (after ``100 Continue``): joins ``body``.

        Only a request being received (active, headers complete) joins, once.
        """
        active = conn._active_next is not conn and conn._active_next is not None
        if active and conn.headers_completed and not conn.receiving_body:
            conn.body_started = self._clock()
            conn.body_received = received
            self.body.append(conn)

    def time_out(self, conn: Connection) -> None:
        """Cut outside ``expired``'s walk: out of ``active`` and ``body`` (an idle one stamped), timed out."""
        if conn._all_next is None:
            return  # removed
        if conn._active_next is not conn:
            self._active_unlink(conn)
            self._n_active -= 1
            if not conn.headers_completed:
                self._n_headers_pending -= 1
            self.body.unlink(conn)
        elif conn.last_message_start == 0.0:
            # (Never one that is responding: connlist.core.budget hands out none.)
            conn.last_message_start = self._clock()
        else:
            return
        self._n_timed_out += 1

    def stall(self, conn: Connection, pending: int, acked: tuple[int, int] | None = None) -> None:
        """The client stopped taking the response (``pending`` bytes unsent): joins ``stalled``.

        ``acked`` as for ``Connection.sample``.  Not one closing, stalled already, or not tracked.
        """
        if conn.out_state == OUT_NONE and conn._all_next is not None:
            conn.out_state = OUT_STALLED
            conn.first_sample(self._clock(), pending, acked)
            self.stalled.append(conn)

    def unstall(self, conn: Connection) -> None:
        """The response is flowing again: leaves ``stalled`` (nothing happens if it was not in it)."""
        if conn.out_state == OUT_STALLED:
            self.out_leave(conn)

    def linger(self, conn: Connection) -> None:
        """The enforcer closed the connection: it joins the tail of ``closing`` (leaving ``stalled``)."""
        if conn._all_next is None or conn.out_state == OUT_CLOSING:
            return
        if conn.out_state == OUT_STALLED:
            self.out_leave(conn)
        conn.out_state = OUT_CLOSING
        conn.out_since = self._clock()
        self.closing.append(conn)

    # -- timeouts ------------------------------------------------------------

    def expired(self, headers_timeout: float, request_timeout: float, limit: int = -1) -> list[Connection]:
        """Unlink and return up to ``limit`` (-1: all) active connections that ran out of time (Node's rule).

        0 disables a timeout; the pair is taken as Node's list takes it (``kinds.effective_timeouts``).
        The cost is that of the connections older than the shorter timeout, not of all active ones.
        """
        headers_timeout, request_timeout = effective_timeouts(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        # headers_timeout <= request_timeout: from here on, nothing can be expired.
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
