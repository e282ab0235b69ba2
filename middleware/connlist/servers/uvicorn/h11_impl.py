"""connlist's uvicorn h11 protocol: the list's events from h11's state machine, after each read.

A new cycle is a ``Request`` (headers complete); ``their_state`` leaving ``SEND_BODY`` ends the
message; a message begins at its first byte, read at rest or buffered by h11 (``trailing_data``)
once a request ends.  h11 holds a pipelined request unread until the response before it is done,
so it is timed from the moment the server reads it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import h11

from connlist.servers.seam import BETWEEN, BODY, HEADERS, UPGRADED
from connlist.servers.uvicorn import websocket as _websocket
from connlist.servers.uvicorn.cycle import UvicornCycle
from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST

try:
    from uvicorn.protocols.http import h11_impl
except ImportError:  # pragma: no cover - a uvicorn that moved it: the self-check reports it
    h11_impl = None  # type: ignore[assignment]

__all__ = ["H11Tracking"]

# mypy checks the mixin against uvicorn's class; at run time the class statement adds it.
if TYPE_CHECKING:
    _H11Base = h11_impl.H11Protocol
else:
    _H11Base = object

# h11's own bound on an incomplete event (a head), where uvicorn's config sets none.
_H11_DEFAULT_LIMIT: int = inspect.signature(h11.Connection).parameters["max_incomplete_event_size"].default


class H11Tracking(UvicornCycle, _H11Base):
    """uvicorn's h11 protocol, feeding connlist from h11's state machine (see above)."""

    __slots__ = ()

    connlist_mode = "uvicorn-h11"

    def data_received(self, data: bytes) -> None:
        phase = self._connlist_phase
        cycle = self.cycle
        if phase:
            self._connlist_read(data, phase, cycle)
            return
        if (len(data) > self._connlist_room or (cycle is not None and not cycle.response_complete)) and (
            self._connlist_stopped(data)
        ):
            return
        if self.timeout_keep_alive_task is TIMED_BY_LIST:
            self.timeout_keep_alive_task = None  # the read ends the idle time (keepalive.TIMED_BY_LIST)
        self._connlist_base_read(data)
        # The common case: a whole request in this read, nothing after it.
        if self.cycle is not cycle:
            h11_conn = self.conn
            if h11_conn.their_state is h11.DONE and not h11_conn.trailing_data[0]:
                record = self._connlist_record
                if record is not None and (record.last_message_start == 0.0 or cycle is None):
                    # An idle connection's, or a new one's first read (as httptools').
                    enforcer = self._connlist
                    enforcer.connections.message(record)
                    enforcer.totals.requests += 1
                    return
        self._connlist_events(BETWEEN, cycle, len(data))

    def _connlist_read(self, data: bytes, phase: int, cycle: Any) -> None:
        """A read while a message is open (or after an upgrade)."""
        if phase == HEADERS and len(data) > self._connlist_room:
            self._connlist_feed_in_parts(data)
            return
        record = self._connlist_record
        if phase == BODY and record is not None:
            self._connlist_body_bytes(record, len(data))
        self._connlist_base_read(data)
        self._connlist_events(phase, cycle, len(data))

    def _connlist_tell(self, loop: Any, keep_alive: float | None) -> Any:
        """``Tracking._connlist_tell``, and h11's own bound on a head raised to a larger ``max_header_size``.

        h11 answers a head past ``max_incomplete_event_size`` with 400; a lower limit of connlist's
        comes first anyway.
        """
        enforcer = UvicornCycle._connlist_tell(self, loop, keep_alive)
        limit = enforcer.settings.max_header_size
        config = self.config
        if limit > (config.h11_max_incomplete_event_size or _H11_DEFAULT_LIMIT):
            config.h11_max_incomplete_event_size = limit
            if isinstance(getattr(self.conn, "_max_incomplete_event_size", None), int):
                self.conn._max_incomplete_event_size = limit
        return enforcer

    def _connlist_events(self, phase0: int, cycle0: Any, n: int = 0) -> None:
        """The list events of what h11 just processed (a read of ``n`` bytes, or what a response let in)."""
        record = self._connlist_record
        phase = self._connlist_phase
        if record is None or phase >= UPGRADED:
            return  # upgraded (the record is held until the websocket closes), or refused
        enforcer = self._connlist
        connections = enforcer.connections
        their_state = self.conn.their_state
        new_request = self.cycle is not cycle0
        if new_request:
            # One at most per call: h11 pauses at each request's end until its response is done.
            if phase == BODY:
                connections.message_complete(record)
                phase = BETWEEN
            if phase != HEADERS:
                # Held by h11 (pipelining), or begun in the same call as the last one ended.
                connections.message_begin(record)
            enforcer.request_received(record)
            phase = BODY
        if phase == BODY and their_state is not h11.SEND_BODY:
            connections.message_complete(record)
            phase = BETWEEN
        if phase == BETWEEN and their_state is h11.IDLE and self.conn.trailing_data[0]:
            # The next request's first bytes are buffered: it has begun.
            connections.message_begin(record)
            phase = HEADERS
        self._connlist_counted(new_request or phase0 == BODY, phase == HEADERS, phase0 == BETWEEN, n)
        self._connlist_settle(record, phase, phase == BODY and (new_request or phase0 != BODY))

    def on_response_complete(self) -> None:
        phase = self._connlist_phase
        cycle = self.cycle
        self._connlist_base_responded()
        if self.transport.is_closing():
            self._connlist_record.responding = False  # type: ignore[union-attr]  # made: nothing unfinished
            self._connlist_closed(self._connlist_record)  # the response's end closes
            return
        # A finished response lets h11 go on to what it held.
        self._connlist_events(phase, cycle)
        if not self._connlist_responding():
            self._connlist.connections.response_complete(self._connlist_record)  # type: ignore[arg-type]  # made
        if self._connlist_unread is not None:
            self._connlist_release()  # the read held behind the response

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # Held as upgraded until the websocket closes, or refused with 503 (uvicorn.websocket).
        hand = super().handle_websocket_upgrade
        _websocket.hand_over(
            self,
            lambda: hand(event),
            event.method.decode("ascii", "replace"),
            _websocket.request_path(event.target),
        )
