"""uvicorn's self-check: connlist's protocol class driven through a scripted conversation in memory.

connlist leans on parts of uvicorn that are not public API, whose changes would not fail loudly, so
each class is checked once per process: requests whole, split, pipelined and with ``100 Continue``,
an upgrade, a loss and a headers timeout.  Any difference or exception is a failure, in one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from connlist.core.records import Connection
from connlist.core.views import connection_state
from connlist.servers import selfcheck
from connlist.servers.selfcheck import CheckFailed, MemoryTransport, Result, Script, require, run_on_own_loop
from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST
from connlist.servers.uvicorn.websocket import Held

__all__ = ["CheckFailed", "MemoryTransport", "Result", "check_static", "make_config", "run_in_thread"]

LIMIT = 10.0  # the whole conversation's, in seconds


class _StubWebSocket(asyncio.Protocol):
    """What the check's upgrade hands the connection to: the hand-over is what is checked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lost = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


_silent = logging.getLogger("connlist.selfcheck")
_silent.addHandler(logging.NullHandler())
_silent.propagate = False
_silent.setLevel(logging.CRITICAL + 1)


class _Gate:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reached = False  # the /wait app is waiting


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body and answers; /early does not read; /hold waits after reading, /wait (?answer) before."""
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


def _has(obj: object, names: tuple[str, ...], what: str) -> None:
    missing = [name for name in names if not hasattr(obj, name)]
    if missing:
        raise CheckFailed(f"{what} has no {', '.join(f'`{name}`' for name in missing)}")


def check_static(base: type, hooks: tuple[str, ...], parser: str) -> None:
    """What can be checked without running the protocol: the methods connlist's class overrides."""
    selfcheck.check_static(base, hooks)
    if parser == "httptools":
        selfcheck.check_static(base, ("on_headers_complete",))


class _Script(Script):
    HOLD = b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"
    EXPECT = b"Host: t\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    CONTINUE = b"POST /wait HTTP/1.1\r\n" + EXPECT
    ANSWER = b"POST /wait?answer HTTP/1.1\r\n" + EXPECT

    def __init__(self, cls: type, base: type, parser: str, config: Any) -> None:
        # Here: a uvicorn that moved it fails the check, not the import.
        from uvicorn.server import ServerState

        super().__init__(cls)
        self.cls = cls
        self.base = base
        self.parser = parser
        self.gate = _Gate()
        self.state: dict[str, Any] = {"connlist.selfcheck.gate": self.gate}
        self.config = config
        self.server_state = ServerState()

    def connect(self, cls: type | None = None) -> tuple[Any, MemoryTransport]:
        protocol = (cls or self.made)(
            config=self.config, server_state=self.server_state, app_state=self.state
        )
        if self.logger_name is None:
            self.logger_name = getattr(getattr(protocol, "logger", None), "name", None)
        for name, value in (("logger", _silent), ("access_log", False)):
            with contextlib.suppress(AttributeError):  # not one of uvicorn's attributes any more
                setattr(protocol, name, value)
        transport = MemoryTransport()
        protocol.connection_made(transport)
        self.protocols.append((protocol, transport))
        return protocol, transport

    def connection_attributes(self, protocol: Any) -> None:
        """What connlist reads of a connection before any request (uvicorn sets them up front)."""
        names: tuple[str, ...] = ("transport", "client", "server", "cycle", "flow")
        names += ("scope", "pipeline") if self.parser == "httptools" else ("conn",)
        _has(protocol, names, "uvicorn's protocol")

    def attributes(self, protocol: Any) -> None:
        """Every attribute connlist reads after a request: there, and what connlist takes it for."""
        cycle = protocol.cycle
        require(cycle is not None, "uvicorn's protocol has no `cycle` after a request")
        names: tuple[str, ...] = ("scope", "response_started", "response_complete", "disconnected")
        names += ("message_event", "logger", "body", "waiting_for_100_continue", "receive", "send")
        _has(cycle, names, "uvicorn's request cycle (`cycle`)")
        if not isinstance(cycle.body, (bytes, bytearray)):
            raise CheckFailed(f"uvicorn's request cycle's `body` is a {type(cycle.body).__name__}, not bytes")
        if cycle.waiting_for_100_continue is not False:
            raise CheckFailed(
                "uvicorn's request cycle's `waiting_for_100_continue` is not False for a request without "
                f"`Expect: 100-continue` ({cycle.waiting_for_100_continue!r})"
            )
        if self.parser == "httptools":
            _has(cycle, ("more_body",), "uvicorn's request cycle (`cycle`)")
            require(cycle.scope is protocol.scope, "`cycle.scope` is not the protocol's scope")
        else:
            _has(protocol.conn, ("their_state", "trailing_data"), "h11's connection (`conn`)")
        flow = getattr(protocol, "flow", None)
        if flow is None or not isinstance(getattr(flow, "read_paused", None), bool):
            raise CheckFailed("uvicorn's protocol has no `flow` with a `read_paused` flag (its flow control)")
        method, path = cycle.scope.get("method"), cycle.scope.get("path")
        if (method, path) != ("GET", "/a"):
            raise CheckFailed(f"the request's method and path read {(method, path)!r} from `cycle.scope`")

    async def run(self) -> None:
        # On uvicorn's own protocol, a missing attribute is named, not met as an exception of connlist's.
        plain, _ = self.connect(self.base)
        self.connection_attributes(plain)
        await self.feed(plain, self.GET)
        self.attributes(plain)
        plain.connection_lost(None)
        self.steps.append("uvicorn's own protocol, and what connlist reads of it")
        await self.requests()
        await self.expect_100_continue()
        await self.upgrade_and_loss()
        await self.headers_timeout()

    async def requests(self) -> None:
        """Whole, split and pipelined requests, bodies in parts and answered early, on one connection."""
        protocol, transport, record = self.tracked()
        self.expect("a connection", record, "new", 0)
        served = self.server_state.total_requests
        await self.feed(protocol, self.GET)
        self.expect("a whole request in one read", record, "idle", 1)
        self.keep_alive(protocol, record, served)
        await self.feed(protocol, self.GET[:10])
        self.expect("the first bytes of a request", record, "reading_headers", 1)
        await self.feed(protocol, self.GET[10:])
        self.expect("the rest of that request", record, "idle", 2)
        await self.feed(protocol, self.POST + b"0123")
        self.expect("headers and part of a body", record, "reading_body", 2)
        if not record.receiving_body or record.body_received != 4:
            raise CheckFailed(
                f"the body's clock counts {record.body_received} bytes of the 4 that came with the headers "
                "(the cycle's `body`)"
            )
        await self.feed(protocol, b"456789")
        self.expect("the rest of the body", record, "idle", 3)
        await self.feed(protocol, self.EARLY + b"012")
        self.expect("a response written before its body was read", record, "reading_body", 3)
        await self.feed(protocol, b"3456789")
        self.expect("the rest of a body already answered", record, "idle", 4)
        await self.feed(protocol, self.HOLD + self.GET)
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
        upgraded, upgraded_transport, upgraded_record = self.tracked()
        await self.feed(upgraded, self.UPGRADE)
        if connection_state(upgraded_record) != "upgraded" or upgraded_record.path != "/ws":
            raise CheckFailed("a websocket upgrade did not hold the connection as upgraded")
        websocket = upgraded_transport.protocol
        if not isinstance(websocket, Held) or not isinstance(websocket, _StubWebSocket):
            raise CheckFailed("a websocket upgrade handed the transport to another than `ws_protocol_class`")
        websocket.connection_lost(None)
        if upgraded_record.tracked or not websocket.lost:
            raise CheckFailed("a websocket's connection lost did not take it out of the list")
        lost, _, lost_record = self.tracked()
        await self.feed(lost, self.POST + b"0123")
        self.expect("a request whose body is incomplete", lost_record, "reading_body", 0)
        lost.connection_lost(None)
        await self.settle()
        require(not lost_record.tracked, "a connection lost mid-request stayed in the list")

    async def headers_timeout(self) -> None:
        silent, silent_transport, silent_record = self.tracked()
        await self.feed(silent, self.GET[:10])
        expired = self.past_headers_timeout()
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
        """uvicorn's duties at the end of a response done; the keep-alive the list's, or uvicorn's and why."""
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
        """Bodies behind ``Expect: 100-continue``: timed from the app's first receive(), or its answer."""
        await self.body_after_continue(
            self.CONTINUE, "the app's first receive(), when uvicorn sent `100 Continue`", "receive"
        )
        await self.body_after_continue(self.ANSWER, "the app's answer without reading the body", "send")

    async def body_after_continue(self, request: bytes, step: str, hook: str) -> None:
        protocol, transport, record = self.tracked()
        gate = self.gate
        gate.event, gate.reached = asyncio.Event(), False
        await self.feed(protocol, request, lambda: gate.reached)  # the app works before it reads the body
        self.expect("the headers of a request that expects `100 Continue`", record, "reading_body", 0)
        if protocol.cycle.waiting_for_100_continue is not True:
            raise CheckFailed(
                "uvicorn's request cycle's `waiting_for_100_continue` is not True for a request with "
                "`Expect: 100-continue`"
            )
        if record.receiving_body or b" 100 " in transport.written:
            raise CheckFailed("a body that waits for `100 Continue` was timed before the app asked for it")
        self.now += 1.0  # a clock started at the headers is told apart
        self.gate.event.set()
        await self.until(lambda: bool(transport.written))  # 100 Continue, or the answer
        continued = bytes(transport.written).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        if continued != (request is self.CONTINUE):
            raise CheckFailed(
                f"uvicorn {'did not write' if request is self.CONTINUE else 'wrote'} `100 Continue` at {step}"
            )
        if not record.receiving_body or record.body_started != self.now:
            raise CheckFailed(f"the body's clock did not start at {step} (the cycle's `{hook}`)")
        protocol.data_received(b"0123456789")
        await self.until(lambda: self.responses(transport) == 1 and connection_state(record) == "idle")
        self.expect(f"the body after {step}", record, "idle", 1)
        if self.responses(transport) != 1:
            raise CheckFailed(f"{self.responses(transport)} responses were written after {step}")
        protocol.connection_lost(None)


def make_config(cls: type) -> Any:
    """The check's uvicorn ``Config``, loaded in the caller's thread (loading may import modules)."""
    from uvicorn.config import Config

    # No logging configuration: the server's stays as it is.
    config = Config(_app, http=cls, ws=_StubWebSocket, lifespan="off", log_config=None, log_level=None)
    config.load()
    return config


def run_in_thread(cls: type, base: type, parser: str) -> Result:
    """The conversation on a new event loop in a short-lived thread (the caller's loop may be running)."""
    try:
        config = make_config(cls)
    except Exception as exc:
        return Result(f"uvicorn's Config could not be loaded for the check: {type(exc).__name__}: {exc}")
    return run_on_own_loop(lambda: _Script(cls, base, parser, config), LIMIT, "connlist-selfcheck")
