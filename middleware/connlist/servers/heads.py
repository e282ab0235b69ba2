"""The request head's bound, and a read held behind a response: what a protocol does before its parser.

docs/how-it-works.md, "The request head and pipelining", has the rules.
``HeadBound``, a base of
``connlist.servers.seam.Tracking``, counts what a read leaves a head
(``_connlist_counted``), cuts a head past ``max_header_size``
(``_connlist_overflow``: ``431``, ``Enforcer.overflow``) and holds a read
that came behind a response still under way (``_connlist_hold``).  When the
held read is fed again is each server's (its ``_connlist_release``): the
end of a response, in its own terms.  ``head_end`` finds where a head may
end in a read (the first blank line), for a server that must stop its
parser there; whether it did end is the parser's to say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import Enforcer
from connlist.core.records import Connection
from connlist.servers.phases import OVERFLOWED, move

__all__ = ["HeadBound", "head_end"]


def head_end(data: bytes, room: int, continuing: bool) -> int:
    """Where the head at ``data``'s start can end within its first ``room`` bytes: the index after; or -1.

    The head is the request line and the header lines, through the blank
    line that ends them (CRLF or a bare LF, as the parsers accept).  A read
    at rest begins a head (``continuing`` False): the blank lines a client
    may send before a request (RFC 9112, 2.2) are not its.  A read of a head
    already open (``continuing``) may begin with the rest of its end: then
    that is where it may end, and the parser tells (the count after the
    read, ``room``, decides).
    """
    start = 0
    if continuing:
        if data[:1] == b"\n":
            return 1
        if data[:2] == b"\r\n":
            return 2
    elif data[:1] in (b"\r", b"\n"):
        start = len(data) - len(data.lstrip(b"\r\n"))
    end = start + room
    crlf = data.find(b"\n\r\n", start, end)
    lf = data.find(b"\n\n", start, end if crlf < 0 else crlf + 2)
    if lf >= 0:
        return lf + 2
    return -1 if crlf < 0 else crlf + 3


class HeadBound:
    """The head's cut and the held read, on a server protocol (through ``Tracking``).

    The protocol provides ``transport``, ``_connlist``, ``_connlist_record``,
    ``_connlist_phase``, ``_connlist_unread`` (``Tracking``'s slots) and
    ``connlist_close_overflow`` (``TransportHandle``'s).
    """

    if TYPE_CHECKING:
        transport: Any
        _connlist: Enforcer
        _connlist_record: Connection | None
        _connlist_phase: int
        _connlist_room: int
        _connlist_unread: bytes | None

        def connlist_close_overflow(self) -> None: ...
    else:
        __slots__ = ()

    def _connlist_overflow(self) -> None:
        """The head being received passed ``max_header_size`` (``head_end``): 431 and close.

        Called from the read of a head that has no room left, before the
        parser has seen a byte past the limit.
        """
        record = self._connlist_record
        self._connlist_phase = move(self._connlist_phase, OVERFLOWED)
        if record is not None:
            self._connlist.overflow(record, self.connlist_close_overflow)

    def _connlist_counted(self, head_ended: bool, head_open: bool, at_rest: bool, n: int) -> None:
        """The room the head has left after a read of ``n`` bytes (never below 0: longer reads go in parts).

        ``head_ended``: a head ended in the read, or the read began in a body:
        the next head is counted from the next read (one begun after another
        message in the same read, from there).  Else, with a head ``head_open``
        after the read, the read is all its: from the whole limit if the read
        began ``at_rest``, from what was left if the head was open before.
        """
        enforcer = self._connlist
        if head_ended:
            self._connlist_room = enforcer.whole_read
        elif head_open:
            self._connlist_room = (enforcer.head_limit if at_rest else self._connlist_room) - n

    def _connlist_hold(self, data: bytes) -> None:
        """A read that came behind a response still under way: held unparsed, reading paused, until it ends.

        So pipelined requests are read no faster than they are answered.
        Reading resumes only when the server says the response is over
        (its ``_connlist_release``); a read that comes meanwhile (the server
        resumed reading for its own reasons) joins the held one.
        """
        unread = self._connlist_unread
        self._connlist_unread = data if unread is None else unread + data
        self.transport.pause_reading()
