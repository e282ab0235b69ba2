"""connlist's uvicorn protocol classes: one ``class`` statement per parser, on the uvicorn class given.

Built and checked in memory (``protocols``) before uvicorn gets them: a layout connlist's slots
cannot join fails the check, not the import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from connlist.servers.seam import SLOTS
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol as UvicornH11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpTools

__all__ = ["HOOKS", "PARSERS", "Parser", "h11_protocol", "httptools_protocol"]

# The slots connlist's uvicorn classes add: the seam's, and UvicornCycle's own.
UVICORN_SLOTS = (*SLOTS, "_connlist_running")

# uvicorn's methods that connlist's classes override (the self-check looks for them first).
HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "handle_websocket_upgrade",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "timeout_keep_alive_handler",
)


def httptools_protocol(base: type[UvicornHttpTools]) -> type[HttpToolsTracking]:
    """connlist's httptools protocol on uvicorn's ``base`` (TypeError: a layout connlist cannot join)."""

    class HttpToolsProtocol(HttpToolsTracking, base):  # type: ignore[valid-type, misc]  # uvicorn's, as given
        __doc__ = HttpToolsTracking.__doc__
        __qualname__ = "HttpToolsProtocol"  # where connlist.servers.uvicorn.protocols puts it
        # Here, on the one class with uvicorn's as a base: a uvicorn class with slots is no conflict.
        __slots__ = UVICORN_SLOTS
        _connlist_base_made = base.connection_made
        _connlist_base_lost = base.connection_lost
        _connlist_base_read = base.data_received
        _connlist_base_headers = base.on_headers_complete
        _connlist_base_responded = base.on_response_complete

    return HttpToolsProtocol


def h11_protocol(base: type[UvicornH11]) -> type[H11Tracking]:
    """connlist's h11 protocol on uvicorn's ``base`` (TypeError: a layout connlist cannot join)."""

    class H11Protocol(H11Tracking, base):  # type: ignore[valid-type, misc]  # uvicorn's, as given
        __doc__ = H11Tracking.__doc__
        __qualname__ = "H11Protocol"
        __slots__ = UVICORN_SLOTS
        _connlist_base_made = base.connection_made
        _connlist_base_lost = base.connection_lost
        _connlist_base_read = base.data_received
        _connlist_base_responded = base.on_response_complete

    return H11Protocol


class Parser(NamedTuple):
    """Where uvicorn has a parser's protocol class, and the statement of connlist's on it."""

    module: str  # uvicorn's module
    uvicorn_name: str  # uvicorn's class in it
    build: Callable[[Any], type[Any]]
    name: str  # connlist's class's public name (``connlist.uvicorn``)


PARSERS = {
    "httptools": Parser(
        "uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol", httptools_protocol, "HttpToolsProtocol"
    ),
    "h11": Parser("uvicorn.protocols.http.h11_impl", "H11Protocol", h11_protocol, "H11Protocol"),
}
