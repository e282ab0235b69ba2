"""connlist's uvicorn httptools protocol: the list's events from what each read changed in uvicorn's state.

uvicorn makes a ``scope`` when a message begins, a cycle when its headers are in (queued in
``pipeline`` behind an unfinished response), and sets ``more_body`` False at the message's end:
comparing them before and after ``data_received`` tells the read's events, replayed in order.
``on_headers_complete`` notes a request running ahead of a queued one, so that a cut marks it too.
A body answered before it was read is fed to a stand-in cycle (``_BodyTail``) that drops it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import Enforcer
from connlist.core.records import Connection
from connlist.servers.heads import head_end as _head_end
from connlist.servers.seam import BETWEEN, BODY, HEADERS, REFUSED, UPGRADED
from connlist.servers.uvicorn import websocket as _websocket
from connlist.servers.uvicorn.cycle import UvicornCycle
from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST

try:
    from uvicorn.protocols.http import httptools_impl
except ImportError:  # httptools is not installed
    httptools_impl = None  # type: ignore[assignment]

__all__ = ["HttpToolsTracking"]


def _end_open_message(
    record: Connection,
    enforcer: Enforcer,
    phase0: int,
    got_headers: bool,
    begun: int,
    upgraded: bool,
    cycle: Any,
) -> int:
    """The events of the message open when a read began (``phase0``); where it stands after.

    ``got_headers``: its headers came in; ``begun``: messages begun after it in the read.
    """
    # Its headers came in: a new cycle, or the upgrade (which makes none).
    if got_headers or (upgraded and not begun and phase0 == HEADERS):
        enforcer.request_received(record)
        phase0 = BODY
    # It ended if a later message began, or (as the last) if its body is in.
    if begun or (phase0 == BODY and (upgraded or not cycle.more_body)):
        enforcer.connections.message_complete(record)
        return BETWEEN
    return phase0


def _begun_messages(
    record: Connection,
    enforcer: Enforcer,
    with_headers: int,
    begun: int,
    upgraded: bool,
    cycle: Any,
    last: int,
) -> int:
    """The events of the ``begun`` messages of a read; where the last stands after (``last``: before).

    The first ``with_headers`` got their headers; the one after, if any, is still reading its head,
    or, after an upgrade, is the upgrade request (whole, with no cycle).
    """
    connections = enforcer.connections
    for i in range(begun):
        connections.message_begin(record)
        if i < with_headers:
            enforcer.request_received(record)
            if i < begun - 1 or not cycle.more_body:
                connections.message_complete(record)
                last = BETWEEN
            else:
                last = BODY
        elif upgraded:
            enforcer.request_received(record)
            connections.message_complete(record)
        else:
            last = HEADERS
    return last


class _Discard:
    """A body that keeps nothing: ``+=`` drops the bytes and the length stays 0."""

    __slots__ = ()

    def __iadd__(self, data: bytes) -> _Discard:
        return self

    def __len__(self) -> int:
        return 0


class _NoEvent:
    __slots__ = ()

    def set(self) -> None:
        pass


_DISCARD = _Discard()
_NO_EVENT = _NoEvent()


class _BodyTail:
    """uvicorn's ``cycle`` during a read of a body whose response is complete: it drops the body.

    Complete once the message is, so a request that follows in the same read starts, not queued.
    """

    __slots__ = ("body", "more_body")
    message_event = _NO_EVENT

    def __init__(self) -> None:
        self.body = _DISCARD
        self.more_body = True

    @property
    def response_complete(self) -> bool:
        return not self.more_body


# mypy checks the mixin against uvicorn's class; at run time the class statement adds it.
if TYPE_CHECKING:
    _HttpToolsBase = httptools_impl.HttpToolsProtocol
else:
    _HttpToolsBase = object


if httptools_impl is not None:

    class HttpToolsTracking(UvicornCycle, _HttpToolsBase):
        """uvicorn's httptools protocol, feeding connlist from what each read changed (see above)."""

        __slots__ = ()

        connlist_mode = "uvicorn-httptools"

        _connlist_base_headers: Any

        def on_headers_complete(self) -> None:
            running = self.cycle
            self._connlist_base_headers()
            pipeline = self.pipeline
            # The first request queued: the one it waits for is referenced by nobody but its task.
            if pipeline and len(pipeline) == 1 and pipeline[0][0] is self.cycle:
                self._connlist_running = running

        def _connlist_cycles(self) -> list[Any]:
            # The queued ones, the one running ahead of them, the newest.
            cycles = [cycle for cycle, _ in self.pipeline]
            for cycle in (self._connlist_running, self.cycle):
                if cycle is not None:
                    cycles.append(cycle)
            return cycles

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._connlist_phase:
                self._connlist_read(data, self.scope, cycle)
                return
            if (
                len(data) > self._connlist_room or (cycle is not None and not cycle.response_complete)
            ) and self._connlist_stopped(data):
                return
            if self.timeout_keep_alive_task is TIMED_BY_LIST:
                self.timeout_keep_alive_task = None  # the read ends the idle time (keepalive.TIMED_BY_LIST)
            self._connlist_base_read(data)
            # The common case: one request began and completed in this read, none queued.
            new = self.cycle
            if new is not cycle and not new.more_body and new.scope is self.scope and not self.pipeline:
                # (Set by connection_made; no read comes after connection_lost or an upgrade.)
                record: Connection = self._connlist_record  # type: ignore[assignment]
                if record.last_message_start == 0.0 or cycle is None:
                    # An idle connection's, or a new one's first read.
                    enforcer = self._connlist
                    enforcer.connections.message(record)
                    enforcer.totals.requests += 1
                    return
            # Between messages, the last scope is the last cycle's.
            self._connlist_events(BETWEEN, None if cycle is None else cycle.scope, cycle, len(data))

        def _connlist_head_first(self, data: bytes) -> bool:
            """A head's read behind a response: parsed to the head's end, the rest offered again; else False.

            What follows the head waits unparsed, as a read at rest behind a response does.
            """
            end = _head_end(data, len(data), True)
            if not 0 <= end < len(data):
                return False
            self._connlist_read(data[:end], self.scope, self.cycle)
            if self._connlist_phase < UPGRADED and not self.transport.is_closing():
                self.data_received(data[end:])
            return True

        def _connlist_read(self, data: bytes, scope: Any, cycle: Any) -> None:
            """A read while a message is open (or after an upgrade)."""
            phase = self._connlist_phase
            if phase == HEADERS:
                if len(data) > self._connlist_room:
                    self._connlist_feed_in_parts(data)
                    return
                if self._connlist_responding() and self._connlist_head_first(data):
                    return
            elif phase == BODY and self.pipeline:
                # A body of a request queued behind a response waits, unparsed, until the request starts.
                self._connlist_hold(data)
                return
            if phase == BODY:
                record = self._connlist_record
                if record is not None:
                    self._connlist_body_bytes(record, len(data))
                if cycle.response_complete and cycle.more_body:
                    # The app responded before the body was in: see _BodyTail.
                    tail: Any = _BodyTail()
                    self.cycle = tail
                    try:
                        self._connlist_base_read(data)
                    finally:
                        if self.cycle is tail:
                            self.cycle = cycle
                    if not tail.more_body:
                        cycle.more_body = False
                    self._connlist_events(phase, scope, cycle, len(data))
                    return
            self._connlist_base_read(data)
            if phase < UPGRADED:
                self._connlist_events(phase, scope, cycle, len(data))

        def _connlist_events(self, phase0: int, scope0: Any, cycle0: Any, n: int) -> None:
            """Replay the read's list events, from uvicorn's state before (``phase0``, ...) and after.

            The message open at the read's start, then those begun in it, then where the read left the
            connection.  ``n``: the read's length, which a head takes from its room.
            """
            record = self._connlist_record
            if record is None or self._connlist_phase == REFUSED:
                return  # (refused: let go and closing, its events are over)
            enforcer = self._connlist
            upgraded = self._connlist_phase == UPGRADED
            scope = self.scope
            cycle = self.cycle
            new_cycles = self._connlist_new_cycles(cycle0, cycle)
            # The open message's headers came in: the first new cycle is its.
            open_got_headers = phase0 == HEADERS and new_cycles > 0
            begun_with_headers = new_cycles - open_got_headers
            # A message begun here and still reading its headers (or upgraded: no cycle).
            partial = scope is not scope0 and (cycle is None or cycle.scope is not scope)
            begun = begun_with_headers + partial
            last = BETWEEN
            if phase0 != BETWEEN:
                last = _end_open_message(record, enforcer, phase0, open_got_headers, begun, upgraded, cycle)
            last = _begun_messages(record, enforcer, begun_with_headers, begun, upgraded, cycle, last)
            if upgraded:
                # The upgrade request's events are in: held as upgraded until
                # its websocket, which holds the record, closes.
                enforcer.hold_upgraded(record, self.scope.get("method"), _websocket.request_path(self.url))
                return
            self._connlist_counted(bool(new_cycles) or phase0 == BODY, last == HEADERS, phase0 == BETWEEN, n)
            # A body began in this read: a message begun here, or the open
            # one's, if its headers came in (it was not in its body before).
            body_begins = last == BODY and bool(begun or phase0 != BODY or open_got_headers)
            self._connlist_settle(record, last, body_begins)

        def _connlist_new_cycles(self, cycle0: Any, cycle: Any) -> int:
            """How many cycles the read made, from the newest before it (``cycle0``) and after (``cycle``).

            The queued ones newer than cycle0, and the one started directly
            if cycle0 was complete (then nothing was queued before the read).
            """
            if cycle is cycle0:
                return 0
            n = 0
            for queued, _app in self.pipeline:  # newest first
                if queued is cycle0:
                    return n
                n += 1
            if cycle0 is None or cycle0.response_complete:
                n += 1
            return n

        def on_response_complete(self) -> None:
            pipeline = self.pipeline
            queued = pipeline[-1][0] if pipeline else None
            self._connlist_base_responded()
            # uvicorn left it idle, its keep-alive timed by the list: not closing, nothing queued.
            idle = self.timeout_keep_alive_task is TIMED_BY_LIST
            if not idle:
                if self.transport.is_closing():
                    self._connlist_record.responding = False  # type: ignore[union-attr]  # made: nothing unfinished
                    self._connlist_closed(self._connlist_record)  # the response's end closes
                    return
                if queued is not None and not (pipeline and pipeline[-1][0] is queued):
                    self._connlist_running = queued  # uvicorn started it
            # self.cycle is the newest request's: if uvicorn has just
            # started a pipelined one, or any is still queued, it is not complete.
            if idle or self.cycle.response_complete:
                self._connlist.connections.response_complete(self._connlist_record)  # type: ignore[arg-type]  # made
            if self._connlist_unread is not None:
                self._connlist_release()  # the read held behind the response

        def handle_websocket_upgrade(self) -> None:
            # Handed over, or refused with 503 (connlist.servers.uvicorn.websocket); held
            # as upgraded once the read's events are replayed (_connlist_events).
            hand = super().handle_websocket_upgrade
            _websocket.hand_over(self, hand, None, None, hold=False)

        def _connlist_response_written(self, record: Connection) -> bool:
            # With requests queued behind it, the running request is an
            # earlier one, whose response may be on the wire: never a 408.
            return bool(self.pipeline) or UvicornCycle._connlist_response_written(self, record)

        def _connlist_responding(self) -> bool:
            return bool(self.pipeline) or UvicornCycle._connlist_responding(self)

else:  # pragma: no cover - httptools missing
    HttpToolsTracking = None  # type: ignore[misc]
