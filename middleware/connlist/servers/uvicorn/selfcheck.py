"""The server integration's self-check: uvicorn's protocols driven through a scripted conversation in memory.

``connlist.servers.uvicorn.protocols`` leans on about twenty parts of uvicorn that are not
public API (the protocol's ``cycle``, ``scope``, ``pipeline``, ``flow``,
h11's ``conn``, the keep-alive armed with the protocol's ``loop``,
the class layout, ...).  A uvicorn release may change any of them, and
most changes would not fail loudly: the server would start and then reset
connections, or cut clients nobody should cut.  So before a protocol class
of connlist's is handed to uvicorn, this module checks it, once per process:

1. What can be read without running anything: the methods connlist's
   class overrides are there.
2. A conversation, with no socket: the protocol built as uvicorn builds it
   (a ``Config`` of its own, and a hand-over of its own, ``handed_over``,
   holding a private ``Enforcer`` on a clock of its own: the process's
   ``HANDOVER`` is a real server's), on a ``MemoryTransport``, through
   a whole request, one split over reads, a body in two reads (the bytes
   of the headers' read counted toward the rate), a response written
   before its body is read, two pipelined requests, two requests that
   expect ``100 Continue`` (the body's clock starts at the app's first
   ``receive()``, when uvicorn writes ``100 Continue``, or at its answer
   without reading; not before), a websocket upgrade (held as ``upgraded``
   by the websocket protocol uvicorn hands the transport to, and removed
   when that protocol loses the connection), a connection lost
   mid-request, and a headers timeout.  At the end of the first response,
   uvicorn's duties there (its count of requests, reading resumed) and the
   keep-alive: the list's, where uvicorn arms it with the protocol's
   ``loop`` (``connlist.servers.uvicorn.keepalive``); else uvicorn's timer
   stays, and the class says why (``connlist_keepalive_not``).  After each step the connection's
   record (state, requests, method and path, the body's clock) and what
   was written are compared with what must be; after the first request
   every attribute connlist reads (on the protocol, its cycle, its flow
   control, h11's connection) is looked at.

Any difference is a failure, described in one sentence; an exception
anywhere is one too.  ``connlist.servers.uvicorn.protocols`` then serves uvicorn's own class
instead (ASGI-only mode) and logs one ERROR line.

The conversation runs on an event loop of its own, in a short-lived thread:
uvicorn imports the ``--http`` class while its own loop is already running
in the main thread.  It writes nothing to uvicorn's logs (the check's
protocols get a silent logger, and no access log) and leaves no timer
behind.  It costs a few milliseconds, once per process (docs/deployment.md,
"When uvicorn changes"); nothing of it runs per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from connlist.core.enforcer import Enforcer
from connlist.core.handover import HandOver
from connlist.core.kinds import resolve
from connlist.core.records import Connection
from connlist.core.views import connection_state
from connlist.servers.selfcheck import CheckFailed, MemoryTransport, Result, handed_over, run_on_own_loop
from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST
from connlist.servers.uvicorn.websocket import Held

__all__ = [
    "CheckFailed",
    "MemoryTransport",
    "Result",
    "check_protocol",
    "check_static",
    "make_config",
    "run_in_thread",
]

# The check's own timeouts: long enough that nothing expires unless the
# script moves the clock past them.
HEADERS_TIMEOUT = 10.0
REQUEST_TIMEOUT = 30.0

# How long the conversation may take before it counts as failed (it takes milliseconds).
LIMIT = 10.0


class _StubWebSocket(asyncio.Protocol):
    """What the check's upgrade hands the connection to: the hand-over is what is checked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lost = False

    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


# The check's protocols write here: nothing reaches the server's log.
_silent = logging.getLogger("connlist.selfcheck")
_silent.addHandler(logging.NullHandler())
_silent.propagate = False
_silent.setLevel(logging.CRITICAL + 1)


class _Gate:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        # Set by the /wait request's app when it waits: what the script waits for.
        self.reached = False


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The check's application (HTTP only).

    It reads the body, then answers; /early answers without reading it;
    /hold waits for the script after reading, /wait before reading (and,
    with ``?answer``, answers without reading).
    """
    path = scope["path"]
    if path == "/wait":
        gate = scope["state"]["connlist.selfcheck.gate"]
        gate.reached = True
        await gate.event.wait()
    if path != "/early" and not (path == "/wait" and scope["query_string"] == b"answer"):
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            more = message.get("more_body", False)
    if path == "/hold":
        await scope["state"]["connlist.selfcheck.gate"].event.wait()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


GET = b"GET /a?x=1 HTTP/1.1\r\nHost: t\r\n\r\n"
POST = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
EARLY = b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
HOLD = b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"
# A client that waits for 100 Continue before it sends the body; the app
# works before it reads it (CONTINUE), or answers without reading (ANSWER).
EXPECT = b"Host: t\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
CONTINUE = b"POST /wait HTTP/1.1\r\n" + EXPECT
ANSWER = b"POST /wait?answer HTTP/1.1\r\n" + EXPECT
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def _has(obj: object, names: tuple[str, ...], what: str) -> None:
    missing = [name for name in names if not hasattr(obj, name)]
    if missing:
        raise CheckFailed(f"{what} has no {', '.join(f'`{name}`' for name in missing)}")


def check_static(base: type, hooks: tuple[str, ...], parser: str) -> None:
    """What can be checked without running the protocol: the methods connlist's class overrides."""
    missing = [name for name in hooks if not callable(getattr(base, name, None))]
    if missing:
        raise CheckFailed(
            f"{base.__module__}.{base.__qualname__} has no {', '.join(f'`{name}`' for name in missing)}"
        )
    if parser == "httptools" and not callable(getattr(base, "on_headers_complete", None)):
        raise CheckFailed(f"{base.__module__}.{base.__qualname__} has no `on_headers_complete`")


class _Script:
    """One protocol class's conversation, on the running loop."""

    def __init__(self, cls: type, base: type, parser: str, config: Any) -> None:
        # Imported here: a uvicorn that moved them fails the check, not the import.
        from uvicorn.server import ServerState

        self.cls = cls
        self.base = base
        self.parser = parser
        self.now = 1000.0
        self.enforcer = Enforcer(
            resolve(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT),
            clock=lambda: self.now,
        )
        # The check's protocols' own hand-over: never HANDOVER, which a real server may be using.
        self.made = handed_over(cls, HandOver(self.enforcer))
        self.gate = _Gate()
        self.state: dict[str, Any] = {"connlist.selfcheck.gate": self.gate}
        self.config = config
        self.server_state = ServerState()
        self.protocols: list[tuple[Any, MemoryTransport]] = []
        self.logger_name: str | None = None
        self.steps: list[str] = []

    def connect(self, cls: type | None = None) -> tuple[Any, MemoryTransport]:
        protocol = (cls or self.made)(
            config=self.config, server_state=self.server_state, app_state=self.state
        )
        if self.logger_name is None:
            self.logger_name = getattr(getattr(protocol, "logger", None), "name", None)
        # Nothing of the check reaches the server's logs.
        for name, value in (("logger", _silent), ("access_log", False)):
            with contextlib.suppress(AttributeError):  # not one of uvicorn's attributes any more
                setattr(protocol, name, value)
        transport = MemoryTransport()
        protocol.connection_made(transport)
        self.protocols.append((protocol, transport))
        return protocol, transport

    @staticmethod
    def record(protocol: Any) -> Connection:
        record = getattr(protocol, "_connlist_record", None)
        if record is None:
            raise CheckFailed("a connection made was not tracked")
        assert isinstance(record, Connection)
        return record

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def until(self, done: Any) -> None:
        """Let the app's task run until ``done()``, for as long as ``settle`` at most."""
        for _ in range(20):
            if done():
                return
            await asyncio.sleep(0)

    async def feed(self, protocol: Any, data: bytes) -> None:
        protocol.data_received(data)
        await self.settle()

    def expect(self, step: str, record: Connection, state: str, requests: int | None = None) -> None:
        """The record's state, and its count of requests fully received, after ``step``."""
        self.steps.append(step)
        got = connection_state(record)
        if got != state:
            raise CheckFailed(f"after {step}, the connection is {got}, where it must be {state}")
        if requests is not None and record.requests != requests:
            raise CheckFailed(
                f"after {step}, the connection counts {record.requests} requests, not {requests}"
            )

    @staticmethod
    def responses(transport: MemoryTransport) -> int:
        return bytes(transport.written).count(b"HTTP/1.1 200 ")

    def connection_attributes(self, protocol: Any) -> None:
        """What connlist reads of a connection before any request: there (uvicorn sets them up front)."""
        names: tuple[str, ...] = ("transport", "client", "server", "cycle", "flow")
        names += ("scope", "pipeline") if self.parser == "httptools" else ("conn",)
        _has(protocol, names, "uvicorn's protocol")

    def attributes(self, protocol: Any) -> None:
        """Every attribute connlist reads, after a request: there, and what connlist takes them for."""
        cycle = protocol.cycle
        if cycle is None:
            raise CheckFailed("uvicorn's protocol has no `cycle` after a request")
        names: tuple[str, ...] = ("scope", "response_started", "response_complete", "disconnected")
        names += ("message_event", "logger", "body", "waiting_for_100_continue", "receive", "send")
        _has(cycle, names, "uvicorn's request cycle (`cycle`)")
        # The body bytes a read brought (counted toward the rate), and whether
        # the client waits for 100 Continue (the body is not timed until then).
        if not isinstance(cycle.body, (bytes, bytearray)):
            raise CheckFailed(f"uvicorn's request cycle's `body` is a {type(cycle.body).__name__}, not bytes")
        if cycle.waiting_for_100_continue is not False:
            raise CheckFailed(
                "uvicorn's request cycle's `waiting_for_100_continue` is not False for a request without "
                f"`Expect: 100-continue` ({cycle.waiting_for_100_continue!r})"
            )
        if self.parser == "httptools":
            _has(cycle, ("more_body",), "uvicorn's request cycle (`cycle`)")
            _has(protocol, ("scope", "pipeline"), "uvicorn's protocol")
            if cycle.scope is not protocol.scope:
                raise CheckFailed("`cycle.scope` is not the protocol's scope")
        else:
            _has(protocol, ("conn",), "uvicorn's protocol")
            _has(protocol.conn, ("their_state", "trailing_data"), "h11's connection (`conn`)")
        flow = getattr(protocol, "flow", None)
        if flow is None or not isinstance(getattr(flow, "read_paused", None), bool):
            raise CheckFailed("uvicorn's protocol has no `flow` with a `read_paused` flag (its flow control)")
        method, path = cycle.scope.get("method"), cycle.scope.get("path")
        if (method, path) != ("GET", "/a"):
            raise CheckFailed(f"the request's method and path read {(method, path)!r} from `cycle.scope`")

    async def run(self) -> None:
        # What connlist reads, on uvicorn's own protocol (so that a missing
        # attribute is named, not met as an exception of connlist's code).
        plain, _ = self.connect(self.base)
        self.connection_attributes(plain)
        await self.feed(plain, GET)
        self.attributes(plain)
        plain.connection_lost(None)
        self.steps.append("uvicorn's own protocol, and what connlist reads of it")
        await self.requests()
        await self.expect_100_continue()
        await self.upgrade_and_loss()
        await self.headers_timeout()

    async def requests(self) -> None:
        """Whole, split and pipelined requests, bodies in parts and answered early, on one connection."""
        # A whole request, then one split over reads, then a body in two reads.
        protocol, transport = self.connect()
        record = self.record(protocol)
        self.expect("a connection", record, "new", 0)
        served = self.server_state.total_requests
        await self.feed(protocol, GET)
        self.expect("a whole request in one read", record, "idle", 1)
        self.keep_alive(protocol, record, served)
        await self.feed(protocol, GET[:10])
        self.expect("the first bytes of a request", record, "reading_headers", 1)
        await self.feed(protocol, GET[10:])
        self.expect("the rest of that request", record, "idle", 2)
        await self.feed(protocol, POST + b"0123")
        self.expect("headers and part of a body", record, "reading_body", 2)
        # The body bytes of the headers' read count toward the rate (the cycle's `body`).
        if not record.receiving_body or record.body_received != 4:
            raise CheckFailed(
                f"the body's clock counts {record.body_received} bytes of the 4 that came with the headers "
                "(the cycle's `body`)"
            )
        await self.feed(protocol, b"456789")
        self.expect("the rest of the body", record, "idle", 3)
        # A response written before the body is read.
        await self.feed(protocol, EARLY + b"012")
        self.expect("a response written before its body was read", record, "reading_body", 3)
        await self.feed(protocol, b"3456789")
        self.expect("the rest of a body already answered", record, "idle", 4)
        # Two pipelined requests in one read, the first held by the app.
        await self.feed(protocol, HOLD + GET)
        self.expect("two pipelined requests", record, "handling")
        if self.parser == "httptools":
            pipeline = protocol.pipeline
            running = protocol._connlist_running
            if len(pipeline) != 1 or running is None or running.scope.get("path") != "/hold":
                raise CheckFailed("a pipelined request was not queued behind the running one (`pipeline`)")
        self.gate.event.set()
        await self.settle()
        self.expect("both pipelined responses", record, "idle", 6)
        if self.responses(transport) != 6:
            raise CheckFailed(f"{self.responses(transport)} responses were written for 6 requests")

    async def upgrade_and_loss(self) -> None:
        """A websocket upgrade held and let go; a connection lost mid-request."""
        # A websocket upgrade: held as upgraded by the websocket protocol
        # uvicorn hands the transport to (connlist.servers.uvicorn.websocket), until it is lost.
        upgraded, upgraded_transport = self.connect()
        upgraded_record = self.record(upgraded)
        await self.feed(upgraded, UPGRADE)
        if connection_state(upgraded_record) != "upgraded" or upgraded_record.path != "/ws":
            raise CheckFailed("a websocket upgrade did not hold the connection as upgraded")
        websocket = upgraded_transport.protocol
        if not isinstance(websocket, Held) or not isinstance(websocket, _StubWebSocket):
            raise CheckFailed("a websocket upgrade handed the transport to another than `ws_protocol_class`")
        websocket.connection_lost(None)
        if upgraded_record.tracked or not websocket.lost:
            raise CheckFailed("a websocket's connection lost did not take it out of the list")
        # A connection lost mid-request.
        lost, _ = self.connect()
        lost_record = self.record(lost)
        await self.feed(lost, POST + b"0123")
        self.expect("a request whose body is incomplete", lost_record, "reading_body", 0)
        lost.connection_lost(None)
        await self.settle()
        if lost_record.tracked:
            raise CheckFailed("a connection lost mid-request stayed in the list")

    async def headers_timeout(self) -> None:
        """A headers timeout: only the silent connection expires, with a 408."""
        # A headers timeout: only the silent connection expires, with a 408.
        silent, silent_transport = self.connect()
        silent_record = self.record(silent)
        await self.feed(silent, GET[:10])
        self.now += HEADERS_TIMEOUT + 1
        expired = self.enforcer.connections.expired(HEADERS_TIMEOUT, REQUEST_TIMEOUT)
        if expired != [silent_record]:
            raise CheckFailed(
                f"a headers timeout found {len(expired)} connections expired, where only the silent one is"
            )
        # What the enforcer's cut does, without its count and its log line.
        silent.connlist_close_expired()
        await self.settle()
        if not bytes(silent_transport.written).startswith(b"HTTP/1.1 408 ") or not silent_transport.closing:
            raise CheckFailed("a connection past the headers timeout was not answered 408 and closed")
        self.steps.append("a headers timeout")

    def keep_alive(self, protocol: Any, record: Connection, served: int) -> None:
        """The end of a response on an idle connection: uvicorn's duties done, and the keep-alive timed.

        uvicorn's duties there must be done, and the list must have taken the
        keep-alive over (``connlist.servers.uvicorn.keepalive``); where
        uvicorn armed a timer of its own instead, the class keeps it and says
        why (``connlist_keepalive``).
        """
        if self.server_state.total_requests != served + 1:
            raise CheckFailed("a response did not count in uvicorn's `server_state.total_requests`")
        if protocol.flow.read_paused:
            raise CheckFailed("reading was not resumed at the end of a response (`flow.resume_reading`)")
        task = getattr(protocol, "timeout_keep_alive_task", None)
        if not callable(getattr(protocol, "timeout_keep_alive_handler", None)):
            raise CheckFailed("uvicorn's protocol has no `timeout_keep_alive_handler` (its keep-alive close)")
        if task is None:
            raise CheckFailed("the end of a response armed no keep-alive timer")
        if record.responded_at != self.now:
            raise CheckFailed("the end of a response did not start the connection's idle time in the list")
        if task is not TIMED_BY_LIST:
            # uvicorn armed its timer otherwise than with its loop's call_later: it keeps it.
            task.cancel()
            cls: Any = self.cls
            cls.connlist_keepalive = False
            cls.connlist_keepalive_not = (
                "its on_response_complete does not arm the keep-alive with "
                "`self.loop.call_later(..., self.timeout_keep_alive_handler)`"
            )
        elif self.enforcer.timer_at != self.now + protocol.timeout_keep_alive:
            raise CheckFailed("the end of a response did not wake the list's timer at the keep-alive time")
        self.steps.append("the keep-alive after a response")

    async def expect_100_continue(self) -> None:
        """Bodies behind ``Expect: 100-continue``: timed from the app's first receive(), or its answer.

        uvicorn writes ``100 Continue`` when the app first calls the cycle's
        ``receive``, and drops it when the app answers first (the cycle's
        ``send``): connlist's wrappers of both start the body's clock.  The
        script's clock moves while the app works, so a clock started at the
        headers is told from one started then.
        """
        await self.body_after_continue(
            CONTINUE, "the app's first receive(), when uvicorn sent `100 Continue`", "receive"
        )
        await self.body_after_continue(ANSWER, "the app's answer without reading the body", "send")

    async def body_after_continue(self, request: bytes, step: str, hook: str) -> None:
        """One of ``expect_100_continue``'s requests, on a connection of its own.

        The script waits only until what it waits for is there (``until``),
        not for ``settle``'s full round of the loop: that keeps the check's
        cost small.
        """
        protocol, transport = self.connect()
        record = self.record(protocol)
        gate = self.gate
        gate.event, gate.reached = asyncio.Event(), False
        protocol.data_received(request)
        await self.until(lambda: gate.reached)  # the app works before it reads the body
        self.expect("the headers of a request that expects `100 Continue`", record, "reading_body", 0)
        if protocol.cycle.waiting_for_100_continue is not True:
            raise CheckFailed(
                "uvicorn's request cycle's `waiting_for_100_continue` is not True for a request with "
                "`Expect: 100-continue`"
            )
        if record.receiving_body or b" 100 " in transport.written:
            raise CheckFailed("a body that waits for `100 Continue` was timed before the app asked for it")
        self.now += 1.0
        self.gate.event.set()
        await self.until(lambda: bool(transport.written))  # 100 Continue, or the answer
        continued = bytes(transport.written).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        if continued != (request is CONTINUE):
            raise CheckFailed(
                f"uvicorn {'did not write' if request is CONTINUE else 'wrote'} `100 Continue` at {step}"
            )
        if not record.receiving_body or record.body_started != self.now:
            raise CheckFailed(f"the body's clock did not start at {step} (the cycle's `{hook}`)")
        protocol.data_received(b"0123456789")
        await self.until(lambda: self.responses(transport) == 1 and connection_state(record) == "idle")
        self.expect(f"the body after {step}", record, "idle", 1)
        if self.responses(transport) != 1:
            raise CheckFailed(f"{self.responses(transport)} responses were written after {step}")
        protocol.connection_lost(None)

    async def close(self) -> None:
        """Lose every connection still in the list, and leave no timer behind."""
        self.enforcer.cancel()
        for protocol, _transport in self.protocols:
            record = getattr(protocol, "_connlist_record", None)
            if record is not None and record.tracked:
                protocol.connection_lost(None)
        await self.settle()
        self.enforcer.cancel()


def make_config(cls: type) -> Any:
    """The check's uvicorn ``Config``, loaded (in the caller's thread: loading may import modules).

    No logging configuration (``log_config=None``, ``log_level=None``): the
    server's stays as it is.
    """
    from uvicorn.config import Config

    config = Config(_app, http=cls, ws=_StubWebSocket, lifespan="off", log_config=None, log_level=None)
    config.load()
    return config


async def check_protocol(cls: type, base: type, parser: str, config: Any) -> Result:
    """Drive ``cls`` (connlist's class on uvicorn's ``base``) through the conversation, on this loop."""
    started = time.perf_counter()
    script: _Script | None = None
    try:
        script = _Script(cls, base, parser, config)
        await script.run()
    except CheckFailed as failed:
        result = Result(str(failed))
    except Exception as exc:  # anything uvicorn does differently may raise anything
        result = Result(f"the scripted conversation raised {type(exc).__name__}: {exc}")
    else:
        result = Result(None)
    if script is not None:
        try:
            await script.close()
        except Exception as exc:  # pragma: no cover - defensive
            if result.failure is None:
                result = Result(f"closing the scripted conversation raised {type(exc).__name__}: {exc}")
        result.logger_name = script.logger_name
        result.steps = script.steps
    result.seconds = time.perf_counter() - started
    return result


def run_in_thread(cls: type, base: type, parser: str) -> Result:
    """``check_protocol`` on a new event loop in a short-lived thread (the caller's loop may be running)."""
    try:
        config = make_config(cls)
    except Exception as exc:
        return Result(f"uvicorn's Config could not be loaded for the check: {type(exc).__name__}: {exc}")
    return run_on_own_loop(lambda: check_protocol(cls, base, parser, config), LIMIT, "connlist-selfcheck")
