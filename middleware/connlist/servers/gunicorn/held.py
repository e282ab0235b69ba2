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
and the held read is fed once gunicorn's loop has reset its parser (``_resume_reading``,
``_connlist_release``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import FEED_SLICE, Enforcer
from connlist.servers.phases import BETWEEN, BODY, HEADERS

__all__ = ["Held"]


class Held:
    """A base of connlist's gunicorn protocol: its reads held back from gunicorn's parser (see the module)."""

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

    def _connlist_stop(self, data: Any) -> bool | None:
        """A read not fed as it is: held or fed in parts (what the feed returns); None: fed as it is.

        Called only where the read is longer than the room its head has
        left (at rest, or in a body, the enforcer's ``whole_read``), or, at
        rest, comes while the parser holds a complete message whose response
        is under way: then it is held (``HeadBound._connlist_hold``), where
        gunicorn would buffer it in its parser and feed its whole buffer
        again after each response, until gunicorn's loop has reset its
        parser (``_resume_reading``, ``_connlist_release``).
        """
        phase = self._connlist_phase
        if phase == BETWEEN and self._callback_parser.is_complete:
            self._connlist_hold(data)
            return True
        return self._connlist_feed_in_parts(data)

    def _connlist_feed_in_parts(self, data: Any) -> bool:
        """A read fed a part at a time, no part longer than its rule; what ``_feed_callback_parser`` returns.

        At rest, ``whole_read`` bytes: no more than a head may take, so the
        parser says whether a head ended within them; in a head, the room
        it has left (none left and more to come: past ``max_header_size``,
        431); in a body, ``FEED_SLICE`` bytes.  gunicorn's parser stops at a
        message's end and keeps what follows (the fast one, 64 KiB of it:
        past that gunicorn closes the connection after the response, a
        pipelined burst unanswered); fed in parts, it keeps at most one, and
        once a message is complete the rest waits, unparsed, for its
        response (``_connlist_hold``).
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
        """gunicorn resumes reading (``_resume_reading``): False while a read is held, which keeps it paused.

        gunicorn resumes after each response, where it paused itself for a
        body the app did not take: reading then would let a read in behind
        the held one.  So gunicorn's own state says resumed, the transport
        stays paused, and the held read is fed at the loop's next turn, once
        gunicorn has reset its parser and fed it what it kept
        (``_connlist_release``): it then resumes reading.
        """
        if self._connlist_unread is None:
            return True
        self._reading_paused = False
        self.worker.loop.call_soon(self._connlist_release)
        return False

    def _connlist_hand_over(self) -> None:
        """The connection leaves HTTP/1 (a websocket, h2c): a held read goes where gunicorn keeps the rest.

        That is its parser's tail, after the upgrade request, where gunicorn
        would have buffered it; reading resumes, as gunicorn's would.
        """
        data = self._connlist_unread
        if data is None:
            return
        self._connlist_unread = None
        self._connlist_base_feed(data)
        if not self._reading_paused and not self._closed:
            self.transport.resume_reading()

    def _connlist_release(self) -> None:
        """The read held behind the last response is fed, if the parser wants more; then reading resumes.

        A parser still complete (what gunicorn kept held a whole request)
        waits for that request's response, and its ``_resume_reading``.
        """
        data = self._connlist_unread
        if data is None or self._closed or self._callback_parser is None or self._callback_parser.is_complete:
            return
        self._connlist_unread = None
        self.data_received(data)
        if self._connlist_unread is None and not self._reading_paused and not self._closed:
            self.transport.resume_reading()
