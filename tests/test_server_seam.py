"""A second server's integration is one module: a made-up server (tests/fake_server.py) on the seam.

It feeds a real ``Enforcer`` and ``ConnectionsList`` (on a fake clock and
loop) through ``connlist.servers.seam.Tracking``, and the middleware turns it on
at the lifespan startup through ``connlist.servers.integration``, with nothing of
connlist's changed for it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest

from connlist.asgi.middleware import ConnectionsMiddleware
from connlist.core import logs
from connlist.core.connections import Connection
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER, HandOver
from connlist.core.kinds import resolve
from connlist.servers import integration, selection
from connlist.servers import seam as server
from tests import fake_server
from tests.fake_server import FakeConfig, FakeLifespan, FakeServerProtocol
from tests.fakes import FakeClock, MemoryTransport, MockLoop

HEADERS_TIMEOUT, REQUEST_TIMEOUT = 5.0, 30.0


class Transport(MemoryTransport):
    """``MemoryTransport`` with no socket: the handle's abort and samples find none."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@pytest.fixture
def loop(clock: FakeClock) -> MockLoop:
    return MockLoop(clock)


@pytest.fixture
def enforcer(clock: FakeClock, loop: MockLoop) -> Enforcer:
    settings = resolve(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT, body_min_rate=0)
    return Enforcer(settings, clock=clock, loop=loop, linger=2.0)  # type: ignore[arg-type]


def connect(enforcer: Enforcer) -> FakeServerProtocol:
    HANDOVER.enforcer = enforcer  # as the middleware's lifespan hands it over
    protocol = FakeServerProtocol()
    protocol.connection_made(Transport())
    return protocol


def record(protocol: FakeServerProtocol) -> Connection:
    assert protocol._connlist_record is not None
    return protocol._connlist_record


def test_the_made_up_server_feeds_the_list_through_the_seam(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    connections = enforcer.connections
    # Made: the mode is the server's; a new connection is active (its headers are timed).
    fast = connect(enforcer)
    assert enforcer.mode == "fake-server"
    assert connections.all() == [record(fast)] and connections.active() == [record(fast)]
    assert enforcer.totals.connections == 1
    # A whole request in one read: begun, headers complete, complete; responding until answered.
    clock.advance(0.1)
    fast.data_received(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
    assert connections.active() == [] and connections.idle() == [record(fast)]
    assert record(fast).responding and enforcer.totals.requests == 1
    assert connections.counts()["writing"] == 1
    fast.respond()
    assert not record(fast).responding and connections.counts()["waiting"] == 1
    # Headers that never end, and a body half sent.
    slow = connect(enforcer)
    slow.data_received(b"GET /slow HTTP/1.1\r\nHost: t\r\n")
    upload = connect(enforcer)
    upload.data_received(b"POST /up HTTP/1.1\r\nContent-Length: 6\r\n\r\nabc")
    assert connections.active() == [record(slow), record(upload)]
    assert connections.idle() == [record(fast)]
    counts = connections.counts()
    assert (counts["all"], counts["active"], counts["idle"], counts["reading"]) == (3, 2, 1, 1)
    assert record(upload).headers_completed and upload.connlist_request() == ("POST", "/up")
    # The body ends: the upload leaves active; answered, it is idle.
    clock.advance(1.0)
    upload.data_received(b"def")
    upload.respond()
    assert connections.active() == [record(slow)]
    # The headers timeout cuts the slow one: a 408, closed, marked cut; the others stay.
    loop.run_until(clock.now + HEADERS_TIMEOUT)
    transport = slow.transport
    assert isinstance(transport, Transport)
    assert transport.buffer == server.RESPONSE_408 and transport.closed and slow.cut
    assert enforcer.totals.headers_timeouts == 1
    assert record(slow) not in connections.active() and connections.timed_out_count == 1
    assert not fast.cut and not upload.cut
    # It never lets go: aborted after the linger.
    loop.run_until(clock.now + enforcer.linger + 1.0)
    assert transport.aborted
    # Lost: out of the list, letting go of the protocol (what a callback held keeps its request).
    gone = record(fast)
    assert (gone.method, gone.path) == ("GET", "/fast")
    for protocol in (fast, slow, upload):
        protocol.connection_lost(None)
    assert connections.all() == [] and len(connections) == 0
    assert (gone.requests, gone.handle, gone.tracked) == (1, None, False)
    # (The slow one never got its headers in: not a request.)
    assert enforcer.totals.connections == 3 and enforcer.totals.requests == 2


def test_the_made_up_server_without_a_middleware_gets_a_fallback_enforcer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert HANDOVER.enforcer is None  # nothing handed over
    protocol = FakeServerProtocol()
    assert isinstance(HANDOVER.enforcer, Enforcer) and protocol._connlist is HANDOVER.enforcer
    assert "no ConnectionsMiddleware started in the ASGI lifespan" in caplog.text
    # The next connection of the worker takes it, silently.
    caplog.clear()
    assert FakeServerProtocol()._connlist is protocol._connlist and caplog.text == ""


def test_the_middleware_turns_the_made_up_server_on_at_the_lifespan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "SERVERS", ["tests.fake_server", *selection.SERVERS])
    config = FakeConfig()
    middleware = ConnectionsMiddleware(_app)
    assert middleware._integration_at_start(FakeLifespan(config).receive, {}) is None
    assert config.protocol_class is FakeServerProtocol
    assert middleware._enforcer.mode == "fake-server" and middleware._enforcer.integration_off is None
    # Another server's lifespan: no integration finds its config; the first listed is the default.
    assert selection.find(object()) == (fake_server, None)
    # Off: the made-up server is left alone.
    untouched = FakeConfig()
    off = ConnectionsMiddleware(_app, server_integration="off")
    off._integration_at_start(FakeLifespan(untouched).receive, {})
    assert untouched.protocol_class is asyncio.Protocol and off._enforcer.mode == "asgi"


def test_tracking_requires_what_only_the_server_can_answer(enforcer: Enforcer) -> None:
    class Incomplete(server.Tracking):
        """A protocol that implements none of the server's part (its addresses unknown)."""

        connlist_mode = "incomplete"
        client = None
        server = None

    protocol = Incomplete()
    protocol.connlist_handover = HandOver(enforcer)  # a hand-over of its own, as a self-check's protocols
    protocol._connlist_setup(None, None)
    assert HANDOVER.enforcer is None  # the worker's untouched
    record = protocol._connlist_record = enforcer.join(handle=protocol)
    with pytest.raises(NotImplementedError):
        protocol._connlist_settle(record, server.BODY, True)  # asks _connlist_body_begin
    with pytest.raises(NotImplementedError):
        record.keep_from_handle()  # asks connlist_request, for a record handed to on_timeout


async def _app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    pass


# -- what every line that says the integration is off says is lost ----------------


def _said(line: str) -> tuple[list[str], list[str]]:
    """What a line says ASGI-only mode still enforces, and what it does not."""
    kept = re.search(r"request bodies are still timed \(([^)]*)\)", line)
    lost = re.search(r", but (.+?) are not enforced", line)
    assert kept is not None and lost is not None, line
    return kept.group(1).split(", "), [
        name.removeprefix("the ") for name in re.split(r", | and ", lost.group(1))
    ]


def test_every_line_of_asgi_only_mode_says_the_same(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("gunicorn.workers.gasgi")
    pytest.importorskip("uvicorn_worker")
    from connlist.servers.gunicorn import start as gunicorn_start
    from connlist.servers.gunicorn import workers as gunicorn_workers
    from connlist.servers.uvicorn import protocols as uvicorn_protocols

    caplog.set_level(logging.WARNING, logger="connlist")
    # (gunicorn's start routes connlist's lines to gunicorn's logger: restored after.)
    monkeypatch.setattr(logs, "_uvicorn_logger_name", logs._uvicorn_logger_name)
    # A failed check of uvicorn's, and of gunicorn's.
    uvicorn_protocols._say_off("h11", "a made-up failure", "runs", "refuse")
    gunicorn_start._say_off("a made-up failure", "refuse")
    # uvicorn-worker without CONFIG_KWARGS.
    gunicorn_workers._worker("W", type("Bare", (), {}), gunicorn_workers.AUTO_PROTOCOL, "doc")

    # The middleware's WARNING at the start, and its ERROR where the first request says otherwise.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    middleware = ConnectionsMiddleware(app)
    middleware._enforcer.integration_off = "a made-up reason"
    middleware._tell_asgi_only(None)
    middleware._enforcer.mode = "made-up"
    made_up = type("MadeUp", (), {"unconfirmed": staticmethod(lambda mode: ("a made-up reason", "advice"))})
    middleware._unconfirmed = ("made-up", middleware._enforcer.totals.connections, made_up)
    middleware._confirm()
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("connlist")]
    assert len(lines) == 5, lines
    expected = (integration.asgi_only_kept(), integration.asgi_only_lost())
    assert expected == (
        ["request timeout", "minimum body rate"],
        ["headers timeout", "send timeout", "connection budget"],
    )
    assert [_said(line) for line in lines] == [expected] * 5
    assert sum(integration.asgi_only() in line for line in lines) == 5
