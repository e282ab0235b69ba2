"""The reads connlist's gunicorn protocol keeps from gunicorn's parser: long ones, those behind a response.

gunicorn's parser stops at a message's end and is fed what follows again after each response, so a
pipelining client could make a worker buffer and re-parse all it sends: a read behind a response is
held until the parser is reset, and a long read is fed a part at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import FEED_SLICE, Enforcer
from connlist.servers.phases import BETWEEN, BODY, HEADERS

__all__ = ["Held"]


class Held:
    """A base of ``connlist.servers.gunicorn.protocol.ASGIProtocol``: the reads it holds back."""

    if TYPE_CHECKING:
        # gunicorn's protocol's, and connlist's (``Tracking``, ``HeadBound``).
        transport: Any
        worker: Any
        reader: Any
        _callback_parser: Any
        _closed: bool
        _reading_paused: bool
        _connlist: Enforcer
        _connlist_phase: int
        _connlist_room: int
        _connlist_unread: bytes | None
        _feed_callback_parser: Callable[[Any], bool]
        _connlist_base_feed: Callable[[Any], bool]
        data_received: Callable[[Any], None]
        _connlist_hold: Callable[[bytes], None]
        _connlist_overflow: Callable[[], None]
    else:
        __slots__ = ()

    def _connlist_stop(self, data: Any) -> bool:
        """A read longer than its head's room, or behind a response: held (True) or fed in parts."""
        phase = self._connlist_phase
        if phase == BETWEEN and self._callback_parser.is_complete:
            self._connlist_hold(data)
            return True
        return self._connlist_feed_in_parts(data)

    def _connlist_feed_in_parts(self, data: Any) -> bool:
        """A read fed a part at a time, so that the parser keeps at most one part past a message's end.

        A part is no longer than a head may take at rest, the room left in a head, ``FEED_SLICE`` in a body.
        """
        start = 0
        while start < len(data):
            phase = self._connlist_phase
            if phase == BETWEEN:
                if self._callback_parser.is_complete:
                    self._connlist_hold(data[start:])
                    return True
                size = self._connlist.whole_read
            elif phase == HEADERS:
                size = self._connlist_room
                if size <= 0:
                    self._connlist_overflow()
                    return False
            elif phase == BODY:
                size = FEED_SLICE
            else:
                return self._feed_callback_parser(data[start:])
            if not self._feed_callback_parser(data[start : start + size]):
                if self.reader is not None and start + size < len(data):
                    # Handed over to HTTP/2 (h2c): the rest is its, as gunicorn would have fed it.
                    self.data_received(data[start + size :])
                return False
            start += size
        return True

    def _connlist_resume(self) -> bool:
        """Whether gunicorn's ``_resume_reading`` may resume the transport: not before a held read is fed.

        gunicorn's state says resumed; the held read is fed once its loop has reset the parser.
        """
        if self._connlist_unread is None:
            return True
        self._reading_paused = False
        self.worker.loop.call_soon(self._connlist_release)
        return False

    def _connlist_hand_over(self) -> None:
        """The connection leaves HTTP/1 (websocket, h2c): a held read goes to the parser's tail."""
        data = self._connlist_unread
        if data is None:
            return
        self._connlist_unread = None
        self._connlist_base_feed(data)
        if not self._reading_paused and not self._closed:
            self.transport.resume_reading()

    def _connlist_release(self) -> None:
        """Feeds the held read once the parser wants more, then resumes reading."""
        data = self._connlist_unread
        if data is None or self._closed or self._callback_parser is None or self._callback_parser.is_complete:
            return
        self._connlist_unread = None
        self.data_received(data)
        if self._connlist_unread is None and not self._reading_paused and not self._closed:
            self.transport.resume_reading()
