"""connlist's uvicorn protocol classes: one ``class`` statement per parser, on uvicorn's class.

Each class names where its methods come from: the parser's mixin
(``connlist.servers.uvicorn.httptools_impl.HttpToolsTracking``,
``connlist.servers.uvicorn.h11_impl.H11Tracking``; both are
``connlist.servers.uvicorn.cycle.UvicornCycle``, which is
``connlist.servers.seam.Tracking``), then uvicorn's class; and, in its
body, connlist's slots, uvicorn's ``connection_made`` and
``connection_lost`` for the mixin to call, and the keep-alive form chosen
by ``connlist.servers.uvicorn.keepalive.form``; after it, uvicorn's
``__init__`` with connlist's names (``connlist.servers.uvicorn.construct``).

The statements run in functions, on the uvicorn class they are given:
``connlist.servers.uvicorn.protocols`` looks uvicorn's class up, checks
what can be checked without running it, calls the function, and checks the
class in memory before uvicorn gets it.  So a uvicorn that moved its class,
or gave it a layout connlist's slots cannot join, fails the check, not the
import of ``connlist.uvicorn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from connlist.servers.seam import SLOTS
from connlist.servers.uvicorn import construct, joined, keepalive
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking
from connlist.servers.uvicorn.httptools_impl import constructor as httptools_constructor

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol as UvicornH11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpTools

__all__ = ["HOOKS", "PARSERS", "Parser", "h11_protocol", "httptools_protocol"]

# The methods of uvicorn's protocols that connlist overrides (the self-check
# looks for them before a class is built on them).
HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "handle_websocket_upgrade",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
)


def httptools_protocol(base: type[UvicornHttpTools]) -> type[HttpToolsTracking]:
    """connlist's httptools protocol on uvicorn's ``base`` (TypeError: a layout connlist cannot join)."""
    init = httptools_constructor(base)

    class HttpToolsProtocol(HttpToolsTracking, base):  # type: ignore[valid-type, misc]  # uvicorn's, as given
        __doc__ = HttpToolsTracking.__doc__
        # Its name where it is found (connlist.servers.uvicorn.protocols sets the module), not the function's.
        __qualname__ = "HttpToolsProtocol"
        # Declared here, on the one class with uvicorn's as a base, so that a
        # uvicorn protocol with ``__slots__`` of its own is no layout conflict
        # (connlist.servers.seam.Tracking says why slots).
        __slots__ = SLOTS
        # uvicorn's, for the mixin's connection_made and connection_lost to
        # call: a method of the class, not ``super()``, which costs a
        # connection more (docs/benchmarks.md, "A connection per request").
        _connlist_base_made = base.connection_made
        _connlist_base_lost = base.connection_lost
        # The end of a response: uvicorn's method less its keep-alive timer,
        # or uvicorn's then the list's event (the mixin's).
        on_response_complete, connlist_keepalive, connlist_keepalive_not = keepalive.form(
            "httptools", base, HttpToolsTracking.on_response_complete
        )

    # uvicorn's __init__, run with connlist's names where it reads them
    # (connlist.servers.uvicorn.construct), its pipeline queue connlist's.
    HttpToolsProtocol.__init__ = init  # type: ignore[method-assign]
    # The mixin's methods that call uvicorn's, joined with them where that is the same.
    # The keep-alive form's call of uvicorn's _unset_keepalive_if_required too (not uvicorn's own
    # method), and the list's keep-alive close's of its handler (a mass close makes thousands).
    HttpToolsProtocol.connlist_not_joined = joined.install(
        HttpToolsProtocol,
        HttpToolsTracking.connlist_joins,
        HttpToolsTracking.connlist_inlines,
        ("on_response_complete", "connlist_close_keepalive") if HttpToolsProtocol.connlist_keepalive else (),
    )
    return HttpToolsProtocol


def h11_protocol(base: type[UvicornH11]) -> type[H11Tracking]:
    """connlist's h11 protocol on uvicorn's ``base`` (TypeError: a layout connlist cannot join)."""
    # (connlist's ``logging`` only: h11's protocol has no pipeline queue.)
    init = construct.constructor(base.__init__, {}) or base.__init__

    class H11Protocol(H11Tracking, base):  # type: ignore[valid-type, misc]  # uvicorn's, as given
        __doc__ = H11Tracking.__doc__
        __qualname__ = "H11Protocol"
        # As HttpToolsProtocol's.
        __slots__ = SLOTS
        _connlist_base_made = base.connection_made
        _connlist_base_lost = base.connection_lost
        # What the mixin's on_response_complete runs first: uvicorn's method
        # less its keep-alive timer, or uvicorn's own.
        _connlist_response_end, connlist_keepalive, connlist_keepalive_not = keepalive.form("h11", base)

    H11Protocol.__init__ = init  # type: ignore[method-assign]  # as HttpToolsProtocol's
    H11Protocol.connlist_not_joined = joined.install(
        H11Protocol,
        H11Tracking.connlist_joins,
        H11Tracking.connlist_inlines,
        ("_connlist_response_end",) if H11Protocol.connlist_keepalive else (),
    )
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
