"""The observing protocols against a reference fed by the parser's own callbacks, step by step.

``connlist.uvicorn`` tells the list's events from uvicorn's state after each
read.  The references here are the straightforward design: the events of
``connlist.core.connections``'s theory, called from each parser callback as it
happens (httptools' ``on_message_begin``, ``on_headers_complete``,
``on_message_complete``; h11's ``Request`` and ``EndOfMessage`` events and the
first byte of a message).  Both are driven through the same byte streams, on
in-memory transports and one event loop, with the same fake clock, and after
every step the records, counts, totals and the body-rate hook calls must be
the same.  The streams cover whole requests, every split of a request into
small reads, chunked bodies, pipelining, a read that ends one request and
begins the next, a websocket upgrade, an expiry in each phase, a bad request,
and an app that responds before the body is in.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import h11
import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.server import ServerState

from connlist.core.connections import Connection, connection_state
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.core.kinds import resolve
from connlist.servers.uvicorn.cycle import UvicornCycle
from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST
from connlist.servers.uvicorn.selfcheck import MemoryTransport
from connlist.uvicorn import H11Protocol, HttpToolsProtocol
from tests.fakes import FakeClock

HEADERS_TIMEOUT, REQUEST_TIMEOUT = 10.0, 30.0


# -- the app: behaviour by path ------------------------------------------------


class Gate:
    """Requests to /hold wait for the next ``release`` step."""

    event: asyncio.Event | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.close"})
        return
    path = scope["path"]
    if path.startswith("/early"):
        pass  # respond before reading the body
    else:
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            more = message.get("more_body", False)
    if path.startswith("/hold"):
        assert Gate.event is not None
        await Gate.event.wait()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


# -- the references --------------------------------------------------------------


class BodyHooks:
    """Counts of the body-rate hook calls, per request (by the request count when called)."""

    def __init__(self) -> None:
        self.begins: list[int] = []
        self.bytes: list[tuple[int, int]] = []


class _Counting:
    _hooks: BodyHooks

    def _connlist_body_begin(self, conn: Connection) -> None:
        self._hooks.begins.append(conn.requests)

    def _connlist_body_bytes(self, conn: Connection, n: int) -> None:
        self._hooks.bytes.append((conn.requests, n))


class ObservedHttpTools(_Counting, HttpToolsProtocol):
    pass


class ObservedH11(_Counting, H11Protocol):
    pass


_BETWEEN, _HEADERS, _BODY = 0, 1, 2


class _ReferenceBody(_Counting, UvicornCycle):
    """Body hooks from the parser-level phase: the phase a read began in and the one it ended in.

    What connlist's protocols read of uvicorn's cycle, it reads as they do (``UvicornCycle``).
    """

    _ref_phase: int
    _ref_entered_body: bool
    _connlist_record: Connection | None

    def _ref_read(self, data: bytes, read: Callable[[bytes], None]) -> None:
        conn = self._connlist_record
        assert conn is not None
        self._ref_entered_body = False
        if self._ref_phase == _BODY:
            self._connlist_body_bytes(conn, len(data))
        read(data)
        if self._ref_phase == _BODY and self._ref_entered_body:
            self._connlist_body_begin(conn)


class ReferenceHttpTools(_ReferenceBody, httptools_impl.HttpToolsProtocol):
    """uvicorn's httptools protocol with the list events called from the parser callbacks.

    Pipelining read no faster than it is answered, the plain way: while a
    response is under way, a read that would begin a request is held, a head
    is parsed a byte at a time to its end and what follows held, and the body
    of a request queued behind the response is held; each response's end
    offers what is held again.
    """

    connlist_mode = "uvicorn-httptools"
    _connlist_base_made = httptools_impl.HttpToolsProtocol.connection_made
    _connlist_base_lost = httptools_impl.HttpToolsProtocol.connection_lost

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connlist_setup(self.loop, self.timeout_keep_alive)
        self._ref_phase = _BETWEEN
        self._ref_entered_body = False
        self._ref_unread = b""

    def data_received(self, data: bytes) -> None:
        responding = self._connlist_responding()
        if (
            self._ref_unread
            or (self._ref_phase == _BETWEEN and responding)
            or (self._ref_phase == _BODY and self.pipeline)
        ):
            self._ref_unread += data
            return
        if self._ref_phase == _HEADERS and responding:
            for at in range(len(data)):
                self._ref_read(data[at : at + 1], super().data_received)
                if self._ref_phase != _HEADERS:
                    self._ref_unread = data[at + 1 :]
                    return
            return
        self._ref_read(data, super().data_received)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        assert self._connlist_record is not None
        self._connlist.connections.message_begin(self._connlist_record)
        self._ref_phase = _HEADERS

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        scope = self.scope
        assert self._connlist_record is not None
        self._connlist.connections.headers_complete(self._connlist_record, scope["method"], scope.get("path"))
        self._connlist.totals.requests += 1
        self._ref_phase = _BODY
        self._ref_entered_body = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        assert self._connlist_record is not None
        self._connlist.connections.message_complete(self._connlist_record)
        self._ref_phase = _BETWEEN

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and self.cycle.response_complete:
            assert self._connlist_record is not None
            self._connlist.connections.response_complete(self._connlist_record)
        unread, self._ref_unread = self._ref_unread, b""
        if unread and not self.transport.is_closing():
            self.data_received(unread)

    def handle_websocket_upgrade(self) -> None:
        assert self._connlist_record is not None
        path = self.url.partition(b"?")[0].decode()
        self._connlist.upgrade(self._connlist_record, self.scope["method"], path)
        super().handle_websocket_upgrade()

    def _connlist_response_written(self, conn: Connection) -> bool:
        return bool(self.pipeline) or UvicornCycle._connlist_response_written(self, conn)

    def _connlist_responding(self) -> bool:
        return bool(self.pipeline) or UvicornCycle._connlist_responding(self)


class ReferenceH11(_ReferenceBody, h11_impl.H11Protocol):
    """uvicorn's h11 protocol with the list events called from each h11 event as uvicorn takes it.

    A message begins at its first byte that h11 reads while no request is
    open (h11 holds a pipelined request unread until the previous response is
    done), or when h11 produces a ``Request`` that had not begun.
    """

    connlist_mode = "uvicorn-h11"
    _connlist_base_made = h11_impl.H11Protocol.connection_made
    _connlist_base_lost = h11_impl.H11Protocol.connection_lost

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connlist_setup(self.loop, self.timeout_keep_alive)
        self._ref_phase = _BETWEEN
        self._ref_entered_body = False
        self._ref_upgraded = False
        next_event = self.conn.next_event

        def observed_next_event() -> Any:
            event = next_event()
            conn = self._connlist_record
            assert conn is not None
            connections = self._connlist.connections
            if isinstance(event, h11.Request) and not self._ref_is_upgrade(event):
                if self._ref_phase != _HEADERS:
                    connections.message_begin(conn)
                connections.headers_complete(
                    conn, event.method.decode(), event.target.partition(b"?")[0].decode()
                )
                self._connlist.totals.requests += 1
                self._ref_phase = _BODY
                self._ref_entered_body = True
            elif isinstance(event, h11.EndOfMessage) and self._ref_phase == _BODY:
                connections.message_complete(conn)
                self._ref_phase = _BETWEEN
            return event

        self.conn.next_event = observed_next_event  # type: ignore[method-assign]

    def _ref_is_upgrade(self, event: h11.Request) -> bool:
        headers = {name.lower(): value.lower() for name, value in event.headers}
        return headers.get(b"upgrade") == b"websocket" and b"upgrade" in headers.get(b"connection", b"")

    def _ref_first_byte(self) -> None:
        conn = self._connlist_record
        if self._ref_upgraded or conn is None:
            return
        if self._ref_phase == _BETWEEN and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._connlist.connections.message_begin(conn)
            self._ref_phase = _HEADERS

    def data_received(self, data: bytes) -> None:
        def read(data: bytes) -> None:
            super(ReferenceH11, self).data_received(data)
            self._ref_first_byte()

        self._ref_read(data, read)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._ref_first_byte()
        if self._connlist_record is not None and not self._connlist_responding():
            self._connlist.connections.response_complete(self._connlist_record)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._ref_upgraded = True
        assert self._connlist_record is not None
        path = event.target.partition(b"?")[0].decode()
        self._connlist.upgrade(self._connlist_record, event.method.decode(), path)
        super().handle_websocket_upgrade(event)


PROTOCOLS = {
    "httptools": (ObservedHttpTools, ReferenceHttpTools),
    "h11": (ObservedH11, ReferenceH11),
}


# -- the driver --------------------------------------------------------------------


@dataclasses.dataclass
class Side:
    name: str
    protocol: Any
    transport: MemoryTransport
    enforcer: Enforcer
    hooks: BodyHooks

    @property
    def conn(self) -> Connection:
        conn = self.protocol._connlist_record
        assert conn is not None
        return conn


def make_side(name: str, cls: type, clock: FakeClock) -> Side:
    config = Config(app, http=cls, ws="websockets-sansio", lifespan="off", log_level="critical")
    config.load()
    enforcer = Enforcer(
        resolve(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT), clock=clock
    )
    # Each side's own enforcer, handed over as the middleware's lifespan does: the side's protocol
    # takes it at its setup, here (the reference's __init__, connlist's connection_made).
    HANDOVER.enforcer = enforcer
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    hooks = BodyHooks()
    protocol._hooks = hooks
    transport = MemoryTransport()
    protocol.connection_made(transport)
    return Side(name, protocol, transport, enforcer, hooks)


def observe(side: Side) -> dict[str, Any]:
    conn = side.conn
    connections = side.enforcer.connections
    record: dict[str, Any] = {"tracked": conn.tracked}
    if conn.tracked:
        record.update(
            state=connection_state(conn),
            start=conn.last_message_start,
            headers_completed=conn.headers_completed,
            requests=conn.requests,
            method=conn.method,
            path=conn.path,
            responding=conn.responding,
        )
    return {
        "record": record,
        "counts": (
            len(connections),
            connections.active_count,
            connections.idle_count,
            connections.timed_out_count,
            connections.headers_pending_count,
            connections.idle_responding_count,
            connections.upgraded_count,
        ),
        "next_deadline": connections.next_deadline(HEADERS_TIMEOUT, REQUEST_TIMEOUT),
        "totals": dataclasses.asdict(side.enforcer.totals),
        "body_begins": list(side.hooks.begins),
        "body_bytes": list(side.hooks.bytes),
        "written": bytes(side.transport.written),
        "closing": side.transport.closing,
    }


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


Step = tuple[Any, ...]


async def run_steps(parser: str, steps: list[Step]) -> list[dict[str, Any]]:
    """Run both sides through ``steps``; return the observed side's states (checked equal)."""
    clock = FakeClock()
    Gate.event = asyncio.Event()
    observed_cls, reference_cls = PROTOCOLS[parser]
    sides = [make_side("observed", observed_cls, clock), make_side("reference", reference_cls, clock)]
    clock.now += 0.5  # a first byte is later than the connection
    states = []
    for number, step in enumerate(steps):
        kind = step[0]
        for side in sides:
            if kind == "feed":
                if not side.transport.closing:
                    side.protocol.data_received(step[1])
            elif kind == "advance":
                clock.now += step[1]
                for conn in side.enforcer.connections.expired(HEADERS_TIMEOUT, REQUEST_TIMEOUT):
                    side.enforcer.cut(conn, "request" if conn.headers_completed else "headers")
            elif kind == "release":
                pass
            elif kind == "lost":
                side.protocol.connection_lost(None)
            else:  # pragma: no cover
                raise AssertionError(step)
        if kind == "release":
            Gate.event.set()
            Gate.event = asyncio.Event()
        clock.now += 0.5
        await settle()
        observed, reference = (observe(side) for side in sides)
        assert observed == reference, f"after step {number} {step!r}"
        states.append(observed)
    for side in sides:
        side.enforcer.cancel()
        if side.conn.tracked:
            side.protocol.connection_lost(None)
    await settle()
    return states


def check(parser: str, steps: list[Step]) -> list[dict[str, Any]]:
    return asyncio.run(run_steps(parser, steps))


def feeds(*chunks: bytes) -> list[Step]:
    return [("feed", chunk) for chunk in chunks]


def split(data: bytes, size: int) -> list[Step]:
    return feeds(*(data[i : i + size] for i in range(0, len(data), size)))


GET = b"GET /items?x=1 HTTP/1.1\r\nHost: t\r\n\r\n"
GET2 = b"GET /second HTTP/1.1\r\nHost: t\r\n\r\n"
POST = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n0123456789"
CHUNKED = (
    b"POST /chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"4\r\nabcd\r\n6\r\nefghij\r\n0\r\n\r\n"
)
EARLY = b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
EARLY_CHUNKED = b"POST /early-chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
HOLD = b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def test_whole_requests_one_read_each(parser: str) -> None:
    states = check(parser, feeds(GET, GET2, POST, CHUNKED, GET))
    assert states[-1]["record"]["requests"] == 5
    assert states[-1]["totals"]["requests"] == 5
    # Whole in one read each: no body phase ever spanned a read.
    assert states[-1]["body_begins"] == [] and states[-1]["body_bytes"] == []


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16])
def test_every_request_split_into_small_reads(parser: str, size: int) -> None:
    stream = GET + POST + CHUNKED + GET2
    states = check(parser, split(stream, size))
    last = states[-1]
    assert last["record"]["requests"] == 4 and last["record"]["state"] == "idle"
    # The two requests with a body each had one body phase, counted once.
    assert last["body_begins"] == [1, 2]
    assert {requests for requests, _ in last["body_bytes"]} == {1, 2}
    assert sum(n for _, n in last["body_bytes"]) > 0


def test_headers_then_body_in_reads(parser: str) -> None:
    head, body = POST.split(b"\r\n\r\n")
    states = check(parser, feeds(head[:10], head[10:] + b"\r\n\r\n", body[:4], body[4:], GET))
    assert [s["record"]["state"] for s in states] == [
        "reading_headers",
        "reading_body",
        "reading_body",
        "idle",
        "idle",
    ]
    assert states[-1]["body_begins"] == [0]
    assert states[-1]["body_bytes"] == [(0, 4), (0, 6)]


def test_pipelined_requests_in_one_read(parser: str) -> None:
    states = check(
        parser,
        [
            *feeds(HOLD + GET + POST + GET2 + b"GET /par"),
            ("release",),
            *feeds(b"tial HTTP/1.1\r\nHost: t\r\n\r\n"),
        ],
    )
    assert states[-1]["record"]["requests"] == 5


def test_a_read_that_ends_one_request_and_begins_the_next(parser: str) -> None:
    stream = POST + GET
    cut = len(POST) + 5
    states = check(parser, feeds(stream[:30], stream[30:cut], stream[cut:]))
    assert states[1]["record"]["state"] == "reading_headers"
    assert states[-1]["record"]["requests"] == 2


def test_pipelined_behind_an_unfinished_response(parser: str) -> None:
    check(
        parser, [*feeds(HOLD, GET[:10], GET[10:] + POST[:40]), ("release",), *feeds(POST[40:]), ("release",)]
    )


def test_websocket_upgrade(parser: str) -> None:
    states = check(parser, feeds(GET, UPGRADE))
    assert states[-1]["record"]["state"] == "upgraded"
    assert states[-1]["counts"][-1] == 1  # upgraded_count


def test_websocket_upgrade_split(parser: str) -> None:
    states = check(parser, [*feeds(GET), *split(UPGRADE, 40)])
    assert states[-1]["record"]["state"] == "upgraded"


@pytest.mark.parametrize(
    "phase",
    ["new", "reading_headers", "reading_body", "reading_body_chunked", "between_requests_partial"],
)
def test_expiry_in_each_phase(parser: str, phase: str) -> None:
    before = {
        "new": [],
        "reading_headers": feeds(GET[:12]),
        "reading_body": feeds(POST[:-4]),
        "reading_body_chunked": feeds(CHUNKED[:-12]),
        "between_requests_partial": feeds(GET, GET2[:5]),
    }[phase]
    wait = (
        HEADERS_TIMEOUT
        if phase in ("new", "reading_headers", "between_requests_partial")
        else REQUEST_TIMEOUT
    )
    states = check(parser, [*before, ("advance", wait), ("lost",)])
    expired = states[-2]
    assert expired["record"]["state"] == "timed_out" and expired["closing"]
    assert expired["counts"][3] == 1


def test_expired_then_the_rest_arrives(parser: str) -> None:
    # A real transport stops reading once closed; this one keeps going, to
    # compare the events on an expired record too.
    clock_steps: list[Step] = [*feeds(POST[:-4]), ("advance", REQUEST_TIMEOUT)]
    sides_states = check(parser, clock_steps)
    assert sides_states[-1]["record"]["state"] == "timed_out"


@pytest.mark.parametrize("bad", [b"BAD\x01 / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost t\r\n\r\n"])
def test_bad_request(parser: str, bad: bytes) -> None:
    states = check(parser, [*feeds(GET, bad), ("lost",)])
    assert b"400" in states[-2]["written"]


def test_bad_request_after_a_partial_one(parser: str) -> None:
    check(parser, [*feeds(GET[:10], b"\x00\x01garbage\r\n\r\n"), ("lost",)])


@pytest.mark.parametrize("rest_with_next", [False, True])
def test_app_responds_before_the_body_is_in(parser: str, rest_with_next: bool) -> None:
    rest = b"3456789" + (GET if rest_with_next else b"")
    states = check(parser, feeds(EARLY + b"012", rest, GET2))
    responded = states[0]
    assert b"200" in responded["written"] and responded["record"]["state"] == "reading_body"
    # The rest of the body completes the message: the record leaves active.
    assert states[1]["record"]["state"] in ("idle", "handling")
    assert states[1]["counts"][1] == 0
    assert states[-1]["record"]["requests"] == (3 if rest_with_next else 2)


def test_app_responds_before_a_chunked_body_is_in(parser: str) -> None:
    states = check(parser, feeds(EARLY_CHUNKED + b"4\r\nab", b"cd\r\n", b"0\r\n\r\n" + GET[:9], GET[9:]))
    assert states[1]["record"]["state"] == "reading_body"
    assert states[2]["record"]["state"] == "reading_headers"
    assert states[-1]["record"]["requests"] == 2


def test_response_complete_and_idle_responding(parser: str) -> None:
    states = check(parser, [*feeds(HOLD), *feeds(GET[:5]), ("release",), *feeds(GET[5:]), ("release",)])
    assert states[0]["record"]["state"] == "handling"
    assert states[0]["counts"][5] == 1
    assert states[-1]["counts"][5] == 0


def test_a_pipelined_request_started_when_the_previous_response_ends(parser: str) -> None:
    # The second request is still handled after the first response ends: the
    # connection stays responding until its own response ends.
    states = check(parser, [*feeds(HOLD + HOLD), ("release",), ("release",)])
    assert [s["record"]["state"] for s in states] == ["handling", "handling", "idle"]
    assert [s["counts"][5] for s in states] == [1, 1, 0]


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_the_lists_keep_alive_close_is_uvicorns_handler(parser: str) -> None:
    """The list times the keep-alive (no timer of uvicorn's armed), and closes with uvicorn's handler."""

    async def run() -> None:
        side = make_side("observed", PROTOCOLS[parser][0], FakeClock())
        side.protocol.data_received(GET)
        await settle()
        conn = side.conn
        assert side.protocol.timeout_keep_alive_task is TIMED_BY_LIST and conn.handle is not None
        conn.handle.connlist_close_keepalive()
        assert side.transport.closing
        side.protocol.connection_lost(None)
        assert not conn.tracked
        side.enforcer.cancel()

    asyncio.run(run())
