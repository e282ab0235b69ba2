"""gunicorn's ``data_received``, with the read's hook written into it, for the gunicorn it was copied from.

gunicorn's protocol hands every read of an HTTP/1 connection to its callback
parser through ``_feed_callback_parser``, called from ``data_received``.
connlist's class overrides ``_feed_callback_parser`` (the read's hook: the
list's events from what the feed changed), which works whatever
``data_received`` looks like.  On the path every keep-alive request takes,
that override is one Python call more per read than gunicorn's.  So where
gunicorn's ``data_received`` is the one below, statement for statement
(``connlist.servers.forms``), connlist's class runs its own
``data_received``, which is gunicorn's HTTP/1 branch with the hook's
between-messages path in place of the call (docs/benchmarks.md,
"Instructions per request on gunicorn's own ASGI worker").  Any other
gunicorn keeps its own ``data_received``, which calls the hook: the same
events, one call more per read.  ``known`` is that rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connlist.servers.forms import canonical, source_tree

__all__ = ["known"]


# pylint: disable=protected-access
def _gunicorn_27(self: Any, data: Any) -> None:  # pragma: no cover - compared, never run
    """gunicorn 27.0.1's ``ASGIProtocol.data_received``, as it is written there."""
    if self._websocket:
        # WebSocket path - forward to WebSocket protocol
        self._websocket.feed_data(data)
        return
    if self._h2c_buffer is not None:
        self._h2c_feed(data)
        return
    if self.reader:
        # HTTP/2 path - use StreamReader
        self.reader.feed_data(data)
    elif self._callback_parser:
        # HTTP/1.x path - feed directly to callback parser
        if not self._feed_callback_parser(data):
            return
        # Backpressure: pause reading if buffer is too large
        if (
            not self._reading_paused
            and self._callback_parser is not None
            and self._http1_buffered() > self._max_buffer_size
        ):
            self._pause_reading()
        return

    # Backpressure: pause reading if buffer is too large
    if not self._reading_paused and self._is_buffer_full():
        self._pause_reading()


# The forms connlist's ``data_received`` was written for, newest first.
FORMS = (_gunicorn_27,)


def known(method: Callable[..., Any] | None) -> bool:
    """Whether gunicorn's ``data_received`` (``method``) is one of the forms connlist's is written for."""
    if method is None:
        return False
    try:
        theirs = canonical(source_tree(method))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(canonical(source_tree(form)) == theirs for form in FORMS)
