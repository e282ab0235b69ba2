"""ASGI-only mode: the middleware on plain uvicorn (no connlist protocol), both parsers.

What this mode promises: the request timeout on request bodies (408 with
Connection: close when the response has not started, the app's pending
receive() returns http.disconnect, later messages dropped), a live view of
the requests in flight, nothing left behind; not the headers timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from connlist import ConnectionsMiddleware
from connlist.core.connections import Connection
from connlist.core.handover import HANDOVER
from tests.servers import (
    EARLY,
    INTEGRATED,
    LATE,
    PLAIN,
    connect,
    echo_app,
    is_408,
    middleware,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)

REQUEST_TIMEOUT = 1.0


class Recorder:
    """Wraps echo_app and records what the app received and whether its sends came back."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.late_send_returned = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/record":
            await echo_app(scope, receive, send)
            return
        while True:
            message = await receive()
            self.received.append(message["type"])
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                break
        # The app answers late, after the 408: its messages are dropped.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"too late"})
        self.late_send_returned = True


@pytest.fixture
def asgi_server(parser: str):  # type: ignore[no-untyped-def]
    recorder = Recorder()
    mw = ConnectionsMiddleware(
        recorder, headers_timeout=0.5, request_timeout=REQUEST_TIMEOUT, server_integration="off"
    )
    with serve(mw, PLAIN[parser]) as running:
        running.mw = mw  # type: ignore[attr-defined]
        running.recorder = recorder  # type: ignore[attr-defined]
        yield running
    assert len(mw.connections) == 0
    assert mw.connections.active_count == 0
    assert mw.connections.received == {}


def test_mode_is_asgi_and_logged_once(asgi_server, parser: str, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="connlist")
    sock = connect(asgi_server.port)
    for _ in range(3):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"ok 0")
    assert asgi_server.mw.mode == "asgi"
    records = caplog.get_records("setup") + caplog.get_records("call")
    messages = [r.getMessage() for r in records if "ASGI-only mode" in r.getMessage()]
    assert len(messages) == 1
    # Told at the server's start (the fixture), not at the first request, with why and what to do.
    assert [r.getMessage() for r in caplog.get_records("setup")] == messages
    assert messages[0].endswith(
        ' Why it is off: server_integration is "off". To turn it on: set server_integration="auto" '
        "(the default) to let connlist turn it on"
    )
    assert asgi_server.mw.enforcer.integration_off == 'server_integration is "off"'
    assert asgi_server.mw.snapshot()["server_integration"] == "off"
    # Requests without a body left nothing behind.
    assert asgi_server.call(lambda: len(asgi_server.mw.connections)) == 0


def test_body_stops_halfway(asgi_server) -> None:  # type: ignore[no-untyped-def]
    sock = connect(asgi_server.port)
    started = time.monotonic()
    sock.sendall(b"POST /record HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
    data, closed = read_until_closed(sock)
    assert is_408(data), data
    assert b"too late" not in data
    assert REQUEST_TIMEOUT - EARLY <= closed - started <= REQUEST_TIMEOUT + LATE
    recorder = asgi_server.recorder
    assert wait_for(lambda: recorder.late_send_returned)
    # The pending receive() returned http.disconnect.
    assert recorder.received == ["http.request", "http.disconnect"]
    assert asgi_server.mw.enforcer.totals.request_timeouts == 1


def test_timely_body_is_served(asgi_server) -> None:  # type: ignore[no-untyped-def]
    sock = connect(asgi_server.port)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
    time.sleep(0.3)
    # In flight, the request shows up with its body still arriving.
    active = asgi_server.call(
        lambda: [(c.method, c.path, c.headers_completed) for c in asgi_server.mw.connections.active()]
    )
    assert active == [("POST", "/", True)]
    sock.sendall(b"56789")
    assert read_response(sock).endswith(b"ok 10")
    assert wait_for(lambda: asgi_server.call(lambda: len(asgi_server.mw.connections)) == 0)


def test_headers_timeout_needs_the_integration(asgi_server) -> None:  # type: ignore[no-untyped-def]
    # Documented limit: a client that trickles its headers is not timed here.
    sock = connect(asgi_server.port)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    sock.settimeout(0.5 + LATE + 0.2)
    with pytest.raises(TimeoutError):
        sock.recv(100)
    sock.sendall(b"\r\n")
    assert read_response(sock).endswith(b"ok 0")


def test_unit_handle_without_server() -> None:
    # The 408 goes through the server's send; a failing send is only logged.
    async def scenario() -> list[Any]:
        sent: list[Any] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await receive()

        mw = ConnectionsMiddleware(app, headers_timeout=0.05, request_timeout=0.1, debug_path=None)
        messages = iter(
            [{"type": "http.request", "body": b"a", "more_body": True}],
        )
        gate = asyncio.Event()

        async def receive() -> Any:
            try:
                return next(messages)
            except StopIteration:
                await gate.wait()
                return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                gate.set()

        scope = body_scope((b"content-length", b"5"), path="/")
        await asyncio.wait_for(mw(scope, receive, send), 2)
        assert len(mw.connections) == 0
        return sent

    sent = asyncio.run(scenario())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]


def test_pending_receive_returns_when_the_server_never_answers() -> None:
    # granian's receive() stays pending until the client's next byte, and
    # the server keeps the connection open while it does: the handle cancels
    # that receive after the 408, the app gets http.disconnect, and the
    # cancel is taken back (the app's own asyncio.timeout still works).
    async def scenario() -> tuple[list[Any], list[Any]]:
        got: list[Any] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            got.append((await receive())["type"])
            got.append((await receive())["type"])
            task = asyncio.current_task()
            assert task is not None
            got.append(task.cancelling())
            async with asyncio.timeout(0.01):
                await asyncio.sleep(0)

        messages = [{"type": "http.request", "body": b"a", "more_body": True}]
        never = asyncio.Event()

        async def receive() -> Any:
            if messages:
                return messages.pop()
            await never.wait()

        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        mw = ConnectionsMiddleware(app, headers_timeout=0.05, request_timeout=0.1, debug_path=None)
        scope = body_scope((b"content-length", b"5"), path="/")
        await asyncio.wait_for(mw(scope, receive, send), 2)
        # Nothing left behind.
        assert len(mw.connections) == 0
        return got, sent

    got, sent = asyncio.run(scenario())
    assert got == ["http.request", "http.disconnect", 0]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 408


# -- in-process: the middleware called directly, cut off through the list -------


def body_scope(*headers: tuple[bytes, bytes], path: str = "/upload") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": list(headers),
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


# What a client is sent when its request is cut before its response began.
ANSWERED_408 = [("http.response.start", 408), ("http.response.body", None)]


class Client:
    """The server's side of one request: a receive that gives one chunk, then waits; a send that records."""

    def __init__(self, *, send_fails: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.send_fails = send_fails
        self._first = True
        self.disconnected = asyncio.Event()

    def answered(self) -> list[tuple[str, int | None]]:
        """What was sent, as (type, status)."""
        return [(m["type"], m.get("status")) for m in self.sent]

    async def receive(self) -> dict[str, Any]:
        if self._first:
            self._first = False
            return {"type": "http.request", "body": b"a", "more_body": True}
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.send_fails:
            raise OSError("the client is gone")
        self.sent.append(message)


def test_which_requests_get_a_record_in_asgi_only_mode() -> None:
    seen: list[tuple[int, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((mw.connections.active_count, len(mw.connections.received)))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = ConnectionsMiddleware(app, debug_path=None)
    for headers in (
        [(b"transfer-encoding", b"chunked")],  # a body of unknown length: timed
        [(b"content-length", b"5")],  # timed
        [(b"content-length", b"0")],  # no body: nothing to time, an entry of the list
        [(b"content-length", b" ")],
        [],
    ):
        client = Client()
        asyncio.run(mw(body_scope(*headers), client.receive, client.send))
    assert seen == [(1, 0), (1, 0), (0, 1), (0, 1), (0, 1)]
    assert len(mw.connections) == 0 and mw.connections.received == {}


def cut_while_receiving(app: Any, client: Client, *, close: str) -> ConnectionsMiddleware:
    """Run ``app`` behind the middleware; once it waits for the body's second chunk, ``close`` the list."""
    mw = ConnectionsMiddleware(app, debug_path=None)

    async def scenario() -> None:
        task = asyncio.create_task(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
        for _ in range(100):
            await asyncio.sleep(0)
            (conn,) = mw.connections.all()
            if conn.handle.receiving is not None:  # type: ignore[union-attr]
                break
        assert mw.connections.close_idle() == 0  # a request being received is never idle
        assert getattr(mw.connections, close)() == 1
        await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
    assert len(mw.connections) == 0
    return mw


def test_close_all_answers_a_request_being_received_408() -> None:
    got: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append((await receive())["type"])
        got.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 200, "headers": []})  # dropped: cut off

    client = Client()
    cut_while_receiving(app, client, close="close_all")
    assert got == ["http.request", "http.disconnect"]
    assert client.answered() == ANSWERED_408


def test_a_request_cut_after_its_response_started_gets_no_408() -> None:
    got: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        got.append((await receive())["type"])
        got.append((await receive())["type"])
        await send({"type": "http.response.body", "body": b"late"})  # dropped: cut off

    client = Client()
    cut_while_receiving(app, client, close="close_all")
    assert got == ["http.request", "http.disconnect"]
    assert client.answered() == [("http.response.start", 200)]


def test_a_408_the_client_cannot_take_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="connlist")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await receive()

    cut_while_receiving(app, Client(send_fails=True), close="close_all")
    failed = [r for r in caplog.records if r.getMessage() == "sending 408 failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None


def test_a_client_disconnect_that_is_not_a_cut_off_reaches_the_server() -> None:
    from starlette.requests import ClientDisconnect

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise ClientDisconnect()

    mw = ConnectionsMiddleware(app, debug_path=None)
    client = Client()
    with pytest.raises(ClientDisconnect):
        asyncio.run(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
    assert len(mw.connections) == 0


def test_close_idle_leaves_a_request_whose_body_is_in_alone() -> None:
    # Fully received, the record is idle while the app handles it: close_idle asks its handle, which says no.
    answered: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await receive()  # the last chunk: the record is idle now
        answered.append(mw.connections.close_idle())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = ConnectionsMiddleware(app, debug_path=None)
    chunks = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cde", "more_body": False},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(mw(body_scope((b"content-length", b"5")), receive, send))
    assert answered == [0]
    assert [(m["type"], m.get("status")) for m in sent] == [
        ("http.response.start", 200),
        ("http.response.body", None),
    ]


def test_unit_requests_in_flight_are_numbered_counted_and_listed() -> None:
    # In-process: a request without a body is listed as handling while the
    # app runs, with an id of its own (a request with a body takes one too,
    # from the same counter), and counted once as a connection and once as
    # a request; the
    # middleware's route is this mode's until the next lifespan startup.
    import inspect

    async def scenario() -> None:
        release = asyncio.Event()
        started = asyncio.Event()
        app_sees: list[Any] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            for look in app_sees:
                look()
            if scope["type"] == "lifespan":
                await receive()
                await send({"type": "lifespan.startup.complete"})
                return
            if scope["path"] == "/hold":
                started.set()
                await release.wait()
            else:
                await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        async def receive() -> Any:
            return {"type": "http.request", "body": b"12345", "more_body": False}

        async def send(message: Any) -> None:
            pass

        def scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
            return {
                "type": "http",
                "method": "GET",
                "path": path,
                "headers": headers,
                "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 2),
            }

        mw = ConnectionsMiddleware(app, debug_path="/_connections")
        assert mw.__call__ == mw._general
        await mw(scope("/", [(b"host", b"x")]), receive, send)
        assert mw.__call__ == mw._asgi_only.__call__
        # Still an ASGI 3 app (servers check the instance's __call__).
        assert inspect.iscoroutinefunction(mw.__call__)
        holding = asyncio.ensure_future(mw(scope("/hold", [(b"content-length", b"0")]), receive, send))
        await started.wait()
        await mw(scope("/upload", [(b"content-length", b"5")]), receive, send)
        data = mw.snapshot()
        assert [(e["state"], e["method"], e["path"]) for e in data["all"]] == [("handling", "GET", "/hold")]
        hold_id = data["all"][0]["id"]
        assert hold_id in mw.connections.received
        assert data["all"][0]["age"] >= 0 and data["all"][0]["client"] == "127.0.0.1:1"
        assert data["counts"]["all"] == data["counts"]["writing"] == 1
        assert data["totals"]["connections"] == data["totals"]["requests"] == 3
        release.set()
        await holding
        data = mw.snapshot()
        assert data["all"] == [] and data["counts"]["all"] == 0
        assert data["totals"]["connections"] == data["totals"]["requests"] == 3
        assert mw.connections.received == {}
        # A record with a body is numbered like the others: each id once,
        # from the counter every record's id comes from.
        ids: list[int] = []
        app_sees.append(lambda: ids.extend(conn.id for conn in mw.connections.iter_all()))
        await mw(scope("/upload", [(b"content-length", b"5")]), receive, send)
        await mw(scope("/", []), receive, send)
        assert len(ids) == 2 and hold_id < ids[0] < ids[1]
        assert Connection().id > ids[1]
        app_sees.clear()
        # The first framing header decides whether a body follows (a timed record, active).
        active: list[int] = []
        app_sees.append(lambda: active.append(mw.connections.active_count))
        for headers in (
            [(b"host", b"x"), (b"transfer-encoding", b"chunked")],
            [(b"content-length", b" 0 "), (b"transfer-encoding", b"chunked")],
            [(b"content-length", b"")],
            [(b"content-length", b"1")],
        ):
            await mw(scope("/", headers), receive, send)
        assert active == [1, 0, 0, 1]
        app_sees.clear()
        # A server starting: back to the general path (its protocols may
        # announce the integration), and to this mode's at the next request.
        messages = iter([{"type": "lifespan.startup"}])

        async def lifespan_receive() -> Any:
            return next(messages)

        await mw({"type": "lifespan", "state": {}}, lifespan_receive, send)
        assert mw.__call__ == mw._general
        await mw(scope("/", []), receive, send)
        assert mw.__call__ == mw._asgi_only.__call__
        assert mw.snapshot()["totals"]["requests"] == 10

    asyncio.run(scenario())


def test_totals_stay_exact_when_the_integration_takes_over(parser: str) -> None:
    # One middleware served in ASGI-only mode, then, at the next lifespan,
    # by the integration's protocols, with the same enforcer: each feeder
    # counts its own connections and requests, and neither doubles the
    # other's (ASGI-only mode once aliased requests to connections, so that
    # the integration's two increments moved one count by 2).
    # ASGI-only mode by the option; the flag's protocols then feed the list whatever it says.
    mw = middleware(server_integration="off")

    def serve_requests(port: int) -> None:
        # Two connections: three requests (one with a body), then one.
        sock = connect(port)
        for request in (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        ):
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.close()
        sock = connect(port)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_until_closed(sock)[0].startswith(b"HTTP/1.1 200 ")

    def totals() -> dict[str, int]:
        counted: dict[str, int] = mw.snapshot()["totals"]
        return counted

    with serve(mw, PLAIN[parser]) as running:
        serve_requests(running.port)
        assert mw.mode == "asgi"
    # Each request is a connection of its own in this mode.
    assert totals() == {**totals(), "connections": 4, "requests": 4}
    with serve(mw, INTEGRATED[parser]) as running:
        serve_requests(running.port)
        assert mw.mode == f"uvicorn-{parser}"
        assert HANDOVER.enforcer is mw.enforcer
    # The server stopped: every connection was counted, and is gone.
    assert totals() == {**totals(), "connections": 4 + 2, "requests": 4 + 4}
    assert sum(value for name, value in totals().items() if name.endswith("_timeouts")) == 0
    assert len(mw.connections) == 0 and mw.connections.received == {}


def test_the_apps_own_timeout_on_receive_is_not_taken_for_a_disconnect() -> None:
    # A cancel that is not the handle's (asyncio.wait_for, a task group)
    # reaches the app as a cancel: the app's timeout fires, the request goes on.
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["type"])
        try:
            await asyncio.wait_for(receive(), 0.01)
        except asyncio.TimeoutError:
            seen.append("timeout")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = ConnectionsMiddleware(app, debug_path=None)
    client = Client()
    asyncio.run(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
    assert seen == ["http.request", "timeout"]
    assert client.answered() == [
        ("http.response.start", 200),
        ("http.response.body", None),
    ]
    assert mw.enforcer.totals.request_timeouts == 0 and len(mw.connections) == 0


def test_a_client_gone_mid_body_stops_the_requests_clock() -> None:
    # The server's http.disconnect ends the body: nothing is left to time
    # while the app finishes, and nothing is cut.
    while_handling: list[tuple[int, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        assert (await receive())["type"] == "http.disconnect"
        (conn,) = mw.connections.all()
        while_handling.append((mw.connections.active_count, int(conn.receiving_body)))

    mw = ConnectionsMiddleware(app, debug_path=None)
    client = Client()
    client.disconnected.set()
    asyncio.run(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
    assert while_handling == [(0, 0)]
    assert client.sent == [] and mw.enforcer.totals.request_timeouts == 0


def test_a_body_behind_100_continue_is_timed_from_the_answer_if_the_app_answers_without_reading() -> None:
    # The client waits for 100 Continue, which never comes when the app
    # answers first: the rate times the body from the answer, not from the headers.
    timed: list[tuple[str, bool]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        (conn,) = mw.connections.all()
        timed.append(("before the answer", conn.receiving_body))
        await send({"type": "http.response.start", "status": 413, "headers": []})
        timed.append(("after the answer", conn.receiving_body))
        await send({"type": "http.response.body", "body": b""})

    mw = ConnectionsMiddleware(app, debug_path=None, body_min_rate=100)
    client = Client()
    scope = body_scope((b"content-length", b"5"), (b"expect", b"100-continue"))
    asyncio.run(mw(scope, client.receive, client.send))
    assert timed == [("before the answer", False), ("after the answer", True)]
    assert [m.get("status") for m in client.sent] == [413, None]


def test_an_app_that_raises_client_disconnect_after_the_cut_is_not_an_error() -> None:
    # Starlette's request.stream() raises ClientDisconnect on the
    # http.disconnect the cut gives: connlist's doing, swallowed.
    from starlette.requests import ClientDisconnect

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        raise ClientDisconnect()

    client = Client()
    cut_while_receiving(app, client, close="close_all")
    assert client.answered() == ANSWERED_408


def test_a_request_cut_twice_is_answered_once() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await receive()

    mw = ConnectionsMiddleware(app, debug_path=None)
    client = Client()

    async def scenario() -> None:
        task = asyncio.create_task(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
        for _ in range(100):
            await asyncio.sleep(0)
            (conn,) = mw.connections.all()
            if conn.handle.receiving is not None:  # type: ignore[union-attr]
                break
        handle = conn.handle
        assert handle is not None
        handle.connlist_close_expired()
        handle.connlist_close()  # the enforcer's close of the same request, later in the sweep
        await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
    assert client.answered() == ANSWERED_408


def test_a_request_handle_has_no_transport_to_abort_refuse_or_sample() -> None:
    # What the enforcer may ask of any record: here nothing happens, and
    # the request goes on (it ends when the app returns).
    from connlist.asgi.asgi_only import AsgiRequest

    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        (conn,) = mw.connections.all()
        handle = conn.handle
        assert isinstance(handle, AsgiRequest)
        handle.connlist_abort()
        handle.connlist_refuse()
        got.append((handle.connlist_pending(), handle.connlist_acked(), handle.connlist_request()))
        got.append(handle.connlist_close_idle())
        got.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = ConnectionsMiddleware(app, debug_path=None)
    client = Client()
    asyncio.run(mw(body_scope((b"content-length", b"5")), client.receive, client.send))
    assert got == [(0, None, (None, None)), False, "http.request"]
    assert [m.get("status") for m in client.sent] == [200, None]
    assert len(mw.connections) == 0 and mw.enforcer.totals.request_timeouts == 0
