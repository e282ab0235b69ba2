"""The request head's bound, and a read held behind a response: what a protocol does before its parser.

The rules are in docs/how-it-works.md, "The request head and pipelining".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connlist.core.enforcer import Enforcer
from connlist.core.records import Connection
from connlist.servers.phases import OVERFLOWED, move

__all__ = ["HeadBound", "head_end"]


def head_end(data: bytes, room: int, continuing: bool) -> int:
    """Where the head at ``data``'s start can end within its first ``room`` bytes: the index after; or -1.

    The end is the first blank line (CRLF or a bare LF, as the parsers accept); whether
    it did end is the parser's to say.  Blank lines before a request (RFC 9112, 2.2)
    are not its; a head already open (``continuing``) may end at the read's start.
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
    """The head's cut and the held read, on a server protocol (through ``Tracking``)."""

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
        """The head being received has no room left, before the parser saw a byte past it: 431 and close."""
        record = self._connlist_record
        self._connlist_phase = move(self._connlist_phase, OVERFLOWED)
        if record is not None:
            self._connlist.overflow(record, self.connlist_close_overflow)

    def _connlist_counted(self, head_ended: bool, head_open: bool, at_rest: bool, n: int) -> None:
        """The room the head has left after a read of ``n`` bytes (never below 0: longer reads go in parts).

        After a head ended (or a read begun in a body) the next starts afresh; a head still open is
        charged the whole read, from the limit if the read began ``at_rest``, else from what was left.
        """
        enforcer = self._connlist
        if head_ended:
            self._connlist_room = enforcer.whole_read
        elif head_open:
            self._connlist_room = (enforcer.head_limit if at_rest else self._connlist_room) - n

    def _connlist_hold(self, data: bytes) -> None:
        """A read behind a response under way: held unparsed (with any held before), reading paused."""
        unread = self._connlist_unread
        self._connlist_unread = data if unread is None else unread + data
        self.transport.pause_reading()
