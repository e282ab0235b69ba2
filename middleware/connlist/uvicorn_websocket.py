"""uvicorn's websocket hand-over: an upgraded connection stays in the list until its websocket closes.

uvicorn's HTTP protocols (httptools and h11 alike) hand a complete upgrade
request to a websocket protocol of their ``ws_protocol_class`` (``--ws``:
websockets, websockets-sansio, wsproto, or a class of the user's): in
``handle_websocket_upgrade`` they make one, call its ``connection_made``
with the transport, ``transport.set_protocol`` it, and feed it the request.
From then on the transport reports to that protocol: the HTTP protocol's
``connection_lost`` is never called, so the HTTP protocol cannot remove the
record when the websocket closes.

So, for the hand-over only, connlist lends uvicorn a subclass of that class
(``holding``: made once per class, ``Held`` before it) and puts the class
back at once; once uvicorn returns, the protocol the transport reports to
holds the list and the record, and its ``connection_lost`` removes the
record before the class's own runs.  Nothing else of the websocket protocol
changes: its handshake, its ping and pong (which find dead peers), its
shutdown stay uvicorn's.  asyncio and uvloop report a lost connection from
the loop (``call_soon``), never inside ``handle_websocket_upgrade``, so the
record is in place before the loss can be reported.

Before the hand-over the enforcer decides (``Enforcer.upgrade``): within
``max_upgraded`` the record is held as ``upgraded``; past it the request is
answered ``503`` and closed, and nothing is handed over (the app never sees
it).  Were the transport's protocol not the one lent after the hand-over (a
uvicorn that hands over otherwise), the record leaves the list at once, as
before connlist counted websockets, and one ``WARNING`` says so; the
self-check (``connlist.uvicorn_selfcheck``) fails on such a uvicorn first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connlist.connections import Connection, ConnectionsList
from connlist.logs import log
from connlist.server import UPGRADE_REFUSED, UPGRADED

__all__ = ["Held", "hand_over", "holding", "request_path"]


class Held:
    """Mixed in before a server's websocket protocol class: the connection leaves the list when lost."""

    # The list and the record, from the hand-over until the loss (None: not held).
    _connlist_held: tuple[ConnectionsList, Connection] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        held = self._connlist_held
        if held is not None:
            self._connlist_held = None
            held[0].remove(held[1])
        super().connection_lost(exc)  # type: ignore[misc]


# The classes ``holding`` made, by the class they extend.
_HOLDING: dict[type, type] = {}
_warned = False


def holding(cls: type) -> type:
    """``cls`` with ``Held`` before it (one per class, kept): what uvicorn makes for the hand-over."""
    made = _HOLDING.get(cls)
    if made is None:
        made = _HOLDING[cls] = type(
            cls.__name__, (Held, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
    return made


def request_path(target: bytes) -> str:
    """The path of a request target as the view shows it (no query string)."""
    return target.split(b"?", 1)[0].decode("latin-1")


def hand_over(protocol: Any, hand: Callable[[], None], method: str | None, path: str | None) -> None:
    """The upgrade request is complete: ``hand`` (uvicorn's own hand-over) runs if the enforcer lets it.

    ``protocol`` is connlist's uvicorn HTTP protocol in its
    ``handle_websocket_upgrade``; its phase becomes ``UPGRADED``, or
    ``UPGRADE_REFUSED`` (the enforcer answered ``503``): no HTTP event of
    the connection follows either.
    """
    record: Connection | None = protocol._connlist_record
    if record is None:  # pragma: no cover - set at connection_made, before any read
        hand()
        return
    enforcer = protocol._connlist
    if not enforcer.upgrade(record, method, path):
        protocol._connlist_phase = UPGRADE_REFUSED
        return
    protocol._connlist_phase = UPGRADED
    cls = protocol.ws_protocol_class
    protocol.ws_protocol_class = holding(cls)
    try:
        hand()
    finally:
        protocol.ws_protocol_class = cls
    transport = protocol.transport
    taken = None if transport is None else transport.get_protocol()
    if isinstance(taken, Held) and taken is not protocol:
        taken._connlist_held = (enforcer.connections, record)
    else:
        enforcer.connections.remove(record)
        _warn_once(taken)


def _warn_once(taken: object) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "uvicorn did not hand the upgraded connection to the websocket protocol connlist lent it "
            "(the transport reports to %s): websockets leave the list at their upgrade, uncounted by "
            "max_connections and max_upgraded. Report it with your uvicorn version.",
            type(taken).__name__,
        )
