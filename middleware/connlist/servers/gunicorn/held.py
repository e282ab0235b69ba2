"""What connlist's gunicorn protocol holds back from gunicorn's parser: long reads, reads behind a response.

gunicorn's HTTP/1 parser stops at a message's end and keeps what follows
in its buffer; gunicorn's connection loop feeds that tail again after the
response, and reads on meanwhile.  A pipelining client could so make a
worker keep and re-feed all it sends, and the fast parser (gunicorn_h1c)
keeps no more than 64 KiB of it: past that gunicorn closes the connection
after the response, the rest unanswered.  ``Held`` is the part of
``connlist.servers.gunicorn.protocol.ASGIProtocol`` that prevents both: a
read that comes while a response is under way is held (``_connlist_stop``),
a long read is fed ``FEED_SLICE`` bytes at a time (``_connlist_feed_slices``),
and the held read is fed when the parser wants more (``_connlist_release``:
gunicorn's loop waits for the next request, or a tail it fed again left a
message open).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import FEED_SLICE, Enforcer
from connlist.servers.heads import head_ends
from connlist.servers.phases import BETWEEN, BODY, HEADERS, UPGRADED

__all__ = ["Held"]


class Held:
    """A base of connlist's gunicorn protocol: its reads held back from gunicorn's parser (see the module)."""

    if not TYPE_CHECKING:
        __slots__ = ()
    else:
        # gunicorn's protocol's, and connlist's (``Tracking``, ``HeadBound``).
        transport: Any
        _callback_parser: Any
        _closed: bool
        _reading_paused: bool
        _connlist: Enforcer
        _connlist_phase: int
        _connlist_room: int
        _connlist_unread: bytes | None

        _feed_callback_parser: Callable[[Any], bool]
        data_received: Callable[[Any], None]
        _connlist_hold: Callable[[bytes], None]
        _connlist_overflow: Callable[[], None]

    def _connlist_stop(self, data: Any) -> bool | None:
        """A read not fed as it is: held or sliced (True), or a head too long (False); None: fed as it is.

        Called only where the read is longer than the room its head has
        left (at rest, or in a body, the enforcer's ``whole_read``), or, at
        rest, comes while the parser holds a complete message whose response
        is under way: then it is held (``HeadBound._connlist_hold``), where
        gunicorn would buffer it in its parser and feed its whole buffer
        again after each response, until the parser wants more
        (``_connlist_release``).
        """
        phase = self._connlist_phase
        if phase == BETWEEN and self._callback_parser.is_complete:
            self._connlist_hold(data)
            return True
        if phase != BODY:
            allowance = self._connlist_room if phase == HEADERS else self._connlist.head_limit
            if len(data) > allowance and not head_ends(data, allowance, phase == HEADERS):
                self._connlist_overflow()
                return False
        if len(data) > FEED_SLICE:
            return self._connlist_feed_slices(data)
        return None

    def _connlist_feed_slices(self, data: Any) -> bool:
        """A long read fed ``FEED_SLICE`` bytes at a time; the rest held once a message in it is complete.

        gunicorn's parser stops at a message's end and keeps what follows
        (the fast one, 64 KiB of it: past that gunicorn closes the
        connection after the response, a pipelined burst unanswered).  Fed
        in slices, it keeps at most one slice; the rest waits, unparsed, for
        the response (``_connlist_hold``).  What ``_feed_callback_parser`` returns.
        """
        parser = self._callback_parser
        for start in range(0, len(data), FEED_SLICE):
            end = start + FEED_SLICE
            if not self._feed_callback_parser(data[start:end]):
                return False
            if end < len(data) and (parser.is_complete or self._connlist_phase >= UPGRADED):
                if self._connlist_phase < UPGRADED:
                    self._connlist_hold(data[end:])
                else:
                    # Handed over (an upgrade): the rest is the new protocol's.
                    return self._feed_callback_parser(data[end:])
                return True
        return True

    def _connlist_release(self) -> None:
        """The parser wants more (gunicorn's loop waits for a request, or a tail it fed again is cut short).

        The read held behind the last response is fed, and reading resumes
        unless gunicorn paused it.
        """
        data = self._connlist_unread
        self._connlist_unread = None
        if self._closed:
            return
        self.data_received(data)
        if self._connlist_unread is None and not self._reading_paused and not self._closed:
            self.transport.resume_reading()
