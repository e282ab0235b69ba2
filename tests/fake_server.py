"""A made-up server's integration: what a second server's would be, one module on ``connlist.servers.seam``.

The "server" reads HTTP/1.1 requests of its own (a request line and headers
up to a blank line, then ``Content-Length`` bytes of body) and answers each
when told to (``respond``).  Its integration is the two halves any server's
is, and nothing else of connlist's is changed for it:

* the protocol, ``FakeServerProtocol``: ``connlist.servers.seam.Tracking`` under
  the server's own protocol, telling the list's events from what each read
  did to its own state, and answering the handle's three questions from it;
* the start-up side, this module's functions (``connlist.servers.integration.Server``):
  the server's config found from the lifespan's ``receive``, and the
  integration turned on by putting the protocol class in it.  It is found
  when its name is in ``connlist.servers.selection.SERVERS``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connlist.core.connections import Connection
from connlist.servers import integration
from connlist.servers.integration import Start
from connlist.servers.seam import BETWEEN, BODY, HEADERS, SLOTS, Tracking

MODE = "fake-server"


class FakeConfig:
    """The made-up server's config: the protocol class it makes each connection's protocol from."""

    def __init__(self) -> None:
        self.protocol_class: type[asyncio.Protocol] = asyncio.Protocol


class FakeLifespan:
    """The made-up server's lifespan: its ``receive`` is a method, so its owner (and config) can be found."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config

    async def receive(self) -> dict[str, Any]:
        return {"type": "lifespan.startup"}


# -- the start-up side (connlist.servers.integration.Server) ---------------------------


def server_config(receive: Any, state: object = None) -> Any:
    owner = getattr(receive, "__self__", None)
    return owner.config if isinstance(owner, FakeLifespan) else None


def gunicorn_master(config: Any) -> int | None:
    return None


def turn_on(config: Any, policy: str) -> Start:
    if config is None:
        return integration.off(policy, "the server is not the made-up one", "serve with it")
    if policy == "off":
        return Start(None, integration.OFF, "set server_integration to auto")
    config.protocol_class = FakeServerProtocol
    return Start(MODE)


def advice_without_lifespan() -> str:
    return "keep the made-up server's lifespan on"


def unconfirmed(mode: str) -> tuple[str, str]:
    return f"the made-up server did not serve through {mode}", "give the made-up server connlist's protocol"


# -- the protocol (connlist.servers.seam.Feeder) ---------------------------------------


class FakeServerProtocol(Tracking, asyncio.Protocol):
    """The made-up server's protocol, feeding connlist's list as any server's does."""

    __slots__ = (
        *SLOTS,
        "body_left",
        "body_seen",
        "buffer",
        "client",
        "cut",
        "method",
        "path",
        "responding",
        "response_started",
        "server",
        "transport",
    )

    connlist_mode = MODE
    _connlist_base_lost = asyncio.Protocol.connection_lost

    def __init__(self, loop: Any = None) -> None:
        self.transport = None
        self.client = ("203.0.113.7", 50000)
        self.server = ("127.0.0.1", 8000)
        self.buffer = b""
        self.method: str | None = None
        self.path: str | None = None
        self.body_left = self.body_seen = 0
        self.responding = self.response_started = self.cut = False
        self._connlist_setup(loop, None)  # the enforcer handed over (HANDOVER), or a fallback

    # -- the server's own work, and the list's events it tells from it ----------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        super().connection_made(transport)  # Tracking's: the connection joins the list

    def data_received(self, data: bytes) -> None:
        record = self._connlist_record
        assert record is not None
        enforcer = self._connlist
        connections = enforcer.connections
        phase = self._connlist_phase
        if phase == BODY:
            self._connlist_body_bytes(record, len(data))
        self.buffer += data
        body_begins = False
        while True:
            if phase == BETWEEN:
                if not self.buffer:
                    break
                connections.message_begin(record)  # the request's first byte
                phase = HEADERS
            if phase == HEADERS:
                head, blank, rest = self.buffer.partition(b"\r\n\r\n")
                if not blank:
                    break
                self.buffer = rest
                self._parse(head)
                enforcer.request_received(record)
                self.responding, self.response_started = True, False
                phase, body_begins = BODY, True
            taken = min(len(self.buffer), self.body_left)
            self.buffer = self.buffer[taken:]
            self.body_left -= taken
            self.body_seen += taken
            if self.body_left:
                break
            connections.message_complete(record)
            phase, body_begins = BETWEEN, False
        self._connlist_settle(record, phase, body_begins)

    def _parse(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.method, self.path, _ = lines[0].split(" ")
        fields = dict(line.lower().split(": ", 1) for line in lines[1:])
        self.body_left = int(fields.get("content-length", "0"))
        self.body_seen = 0

    def respond(self) -> None:
        """The app's whole response to the request received last."""
        assert self.transport is not None
        self.response_started = True
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.responding = False
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.response_complete(record)

    # -- what only the server can answer ---------------------------------------

    def _connlist_body_begin(self, record: Connection) -> None:
        enforcer = self._connlist
        if enforcer.settings.body_min_rate:
            record.body_received = self.body_seen
            enforcer.connections.body_begin(record, record.body_received)

    def connlist_request(self) -> tuple[str | None, str | None]:
        return self.method, self.path

    def connlist_reading_paused(self) -> bool:
        return False

    def _connlist_response_written(self, record: Connection) -> bool:
        return self.response_started

    def _connlist_responding(self) -> bool:
        return self.responding

    def _connlist_mark_cut(self) -> None:
        self.cut = True
