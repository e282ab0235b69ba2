"""The self-check of connlist's gunicorn class: gunicorn's ASGI protocol driven through a conversation.

``protocol`` leans on gunicorn's private methods (``HOOKS``) and state, so once per process, before
``start`` installs the class, a conversation in memory checks them; any difference is a failure, in
one sentence, and ``start`` keeps gunicorn's class.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from connlist.core.records import Connection
from connlist.core.views import connection_state
from connlist.servers.selfcheck import MemoryTransport, Result, Script, check_static, require, run_on_own_loop

__all__ = ["HOOKS", "check_static", "run_in_thread"]

# The methods of gunicorn's protocol that connlist's class overrides or calls.
HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "pause_writing",
    "resume_writing",
    "_feed_callback_parser",
    "_arm_keepalive_timer",
    "_resume_reading",
    "_keepalive_timeout",
    "_close_transport",
    "_send_response_start",
    "_send_error_response",
    "_handle_websocket",
    "_handle_h2c_upgrade",
    "_check_h1c_protocol_available",
)

KEEP_ALIVE = 2
LIMIT = 10.0


class _SilentLog:
    """gunicorn's logger for the check's protocols: nothing reaches the server's log."""

    access_log_enabled = False

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        pass

    debug = info = warning = error = exception = critical = access = _nothing


class _Worker:
    """What gunicorn's ASGI protocol reads of its worker (``gunicorn.workers.gasgi.ASGIWorker``)."""

    def __init__(self, cfg: Any, app: Any, state: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.log = _SilentLog()
        self.asgi = app
        self.state = state
        self.loop = loop
        self.nr_conns = 0
        self.nr = 0
        self.max_requests = sys.maxsize
        self.alive = True


class _Transport(MemoryTransport):
    """The memory transport, with what gunicorn's protocol asks of a socket's transport."""

    def can_write_eof(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body and answers; /early answers without reading it."""
    if scope["type"] != "http":
        return
    if scope["path"] != "/early":
        more = True
        while more:  # (a disconnect has no more_body)
            more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _Script(Script):
    rounds = 50  # gunicorn answers from a task per connection, through a task per request

    def __init__(self, cls: type, parser: str) -> None:
        from gunicorn.config import Config  # type: ignore[import-untyped, import-not-found, unused-ignore]

        super().__init__(cls, body_min_rate=1.0)
        self.parser = parser
        cfg = Config()
        cfg.set("keepalive", KEEP_ALIVE)
        cfg.set("http_parser", parser)
        cfg.set("accesslog", None)
        self.worker = _Worker(cfg, _app, {}, asyncio.get_running_loop())

    def connect(self) -> tuple[Any, MemoryTransport]:
        protocol = self.made(self.worker)
        transport = _Transport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        self.protocols.append((protocol, transport))
        return protocol, transport

    def idle(self, record: Connection, transport: MemoryTransport, n: int) -> Any:
        return lambda: self.responses(transport) == n and not record.responding

    async def run(self) -> None:
        enforcer = self.enforcer
        protocol, transport, record = self.tracked()
        self.expect("a connection", record, "new", 0)
        require(
            enforcer.mode == f"gunicorn-{self.parser}",
            f"gunicorn's {self.parser} parser was taken for {enforcer.mode!r}",
        )
        require(
            enforcer.keep_alive == KEEP_ALIVE and enforcer.keep_alive_timed,
            "the list did not take gunicorn's keep-alive time (`_keepalive`) over",
        )
        await self.feed(protocol, self.GET[:12])
        self.expect("a request's first bytes", record, "reading_headers", 0)
        await self.feed(protocol, self.GET[12:], self.idle(record, transport, 1))
        self.expect("the rest of the request, and its response", record, "idle", 1)
        require(
            (record.method, record.path) == ("GET", "/a"),
            f"the request's method and path read {record.method!r} {record.path!r}",
        )
        require(
            getattr(protocol, "_keepalive_handle", None) is None,
            "gunicorn armed its own keep-alive timer at the end of a response",
        )
        require(
            record.responded_at == self.now and enforcer.timer_at == self.now + KEEP_ALIVE,
            "the end of a response did not leave the keep-alive to connlist's list",
        )
        await self.feed(protocol, self.GET, self.idle(record, transport, 2))
        self.expect("a whole request", record, "idle", 2)
        await self.feed(protocol, self.POST + b"0123")
        self.expect("a request whose body is incomplete", record, "reading_body", 2)
        require(
            record.receiving_body and record.body_received == 4,
            "a body that arrives over two reads was not timed by the minimum rate",
        )
        require(
            not protocol._connlist_response_written(record),
            "a request whose app waits for its body was taken for one being answered",
        )
        await self.feed(protocol, b"456789", self.idle(record, transport, 3))
        self.expect("the rest of the body", record, "idle", 3)
        await self.feed(protocol, self.GET + self.GET, self.idle(record, transport, 5))
        self.expect("two pipelined requests", record, "idle", 5)
        self.now += KEEP_ALIVE
        enforcer.sweep_now()
        require(
            transport.closing and protocol._closed,
            "the keep-alive timeout did not close the connection with gunicorn's handler",
        )
        self.steps.append("the keep-alive timeout")
        protocol.connection_lost(None)
        require(not record.tracked, "a connection lost stayed in the list")
        await self.early()
        await self.upgrade()
        await self.headers_timeout()

    async def early(self) -> None:
        """A response before the body: no 408 may follow it."""
        protocol, transport, record = self.tracked()
        await self.feed(protocol, self.EARLY + b"01", lambda: self.responses(transport) == 1)
        self.expect("a response before the request's body", record, "reading_body", 0)
        require(
            protocol._connlist_response_written(record),
            "a response begun before the body was not seen (`_send_response_start`)",
        )
        protocol.connection_lost(None)

    async def upgrade(self) -> None:
        protocol, transport, record = self.tracked()
        # Until gunicorn's websocket side answered: the app, which accepts none, ran.
        await self.feed(protocol, self.UPGRADE, lambda: bool(transport.written))
        upgraded = connection_state(record) == "upgraded"
        require(upgraded, "a websocket upgrade did not hold the connection as upgraded")
        self.steps.append("a websocket upgrade")
        protocol.connection_lost(None)
        require(not record.tracked, "a websocket's connection lost did not take it out of the list")

    async def headers_timeout(self) -> None:
        protocol, transport, record = self.tracked()
        await self.feed(protocol, self.GET[:10])
        self.expect("a request's first bytes", record, "reading_headers", 0)
        expired = self.past_headers_timeout()
        require(
            expired == [record],
            f"a headers timeout found {len(expired)} connections expired, not the one",
        )
        protocol.connlist_close_expired()
        task = protocol._task
        await self.until(lambda: task is None or task.done())
        require(
            bytes(transport.written).startswith(b"HTTP/1.1 408 ") and transport.closing,
            "a connection past the headers timeout was not answered 408 and closed",
        )
        require(
            task is None or task.done(),
            "the connection loop of a connection cut at the headers timeout did not end",
        )
        protocol.connection_lost(None)
        require(not record.tracked, "a connection cut at the headers timeout stayed in the list")
        self.steps.append("a headers timeout")

    async def wind_down(self) -> None:
        """The connections' tasks, cancelled."""
        for protocol, _transport in self.protocols:
            task = getattr(protocol, "_task", None)
            if task is not None and not task.done():
                task.cancel()
        await asyncio.sleep(0)


def run_in_thread(cls: type, parser: str) -> Result:
    """The conversation on a new event loop in a short-lived thread (the caller's loop may be running)."""
    return run_on_own_loop(lambda: _Script(cls, parser), LIMIT, "connlist-gunicorn-selfcheck")
