"""uvicorn's websocket hand-over: an upgraded connection stays in the list until its websocket closes.

The transport reports to the websocket protocol once uvicorn hands the upgrade over, so for the
hand-over connlist lends uvicorn a subclass (``holding``) whose ``connection_lost`` removes the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connlist.core.connections import ConnectionsList
from connlist.core.logs import log
from connlist.core.records import Connection
from connlist.servers.phases import REFUSED, UPGRADED, move

__all__ = ["Held", "hand_over", "holding", "request_path"]


class Held:
    """Mixed in before a server's websocket protocol class: the connection leaves the list when lost."""

    _connlist_held: tuple[ConnectionsList, Connection] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        held = self._connlist_held
        if held is not None:
            self._connlist_held = None
            held[0].remove(held[1])
        super().connection_lost(exc)  # type: ignore[misc]


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


def hand_over(
    protocol: Any, hand: Callable[[], None], method: str | None, path: str | None, *, hold: bool = True
) -> None:
    """The upgrade request is complete: ``hand`` (uvicorn's own hand-over) runs if the enforcer lets it.

    Past ``max_upgraded`` the enforcer answers ``503`` and nothing is handed over. With ``hold`` False
    the caller holds the record once it has replayed the read's events (httptools' protocol). A uvicorn
    that hands over otherwise loses the record at once, with one WARNING.
    """
    record: Connection | None = protocol._connlist_record
    if record is None:  # pragma: no cover - set at connection_made, before any read
        hand()
        return
    enforcer = protocol._connlist
    if not enforcer.admit_upgrade(record):
        protocol._connlist_phase = move(protocol._connlist_phase, REFUSED)
        return
    protocol._connlist_phase = move(protocol._connlist_phase, UPGRADED)
    cls = protocol.ws_protocol_class
    held_class = holding(cls)
    held = (enforcer.connections, record)
    made: list[Held] = []

    def make(*args: Any, **kwargs: Any) -> Held:
        websocket: Held = held_class(*args, **kwargs)
        websocket._connlist_held = held
        made.append(websocket)
        return websocket

    protocol.ws_protocol_class = make
    try:
        hand()
    finally:
        protocol.ws_protocol_class = cls
    if hold:
        enforcer.hold_upgraded(record, method, path)
    websocket = made[-1] if made else None
    # A transport that cannot tell its protocol (uvicorn's tests' mock) is taken at its word.
    get_protocol = getattr(protocol.transport, "get_protocol", None)
    taken = websocket if get_protocol is None else get_protocol()
    if websocket is None or taken is not websocket:
        for other in made:
            other._connlist_held = None
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
