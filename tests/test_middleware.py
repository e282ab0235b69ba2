"""ConnectionsMiddleware's options, the hand-over to the protocol, on_timeout, and the hook checks."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import sys
import time
from typing import Any

import pytest
import uvicorn
from starlette.types import Message

from connlist import ConnectionsMiddleware
from connlist.core.checks import default_max_connections
from connlist.core.connections import Connection
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.core.kinds import Settings
from connlist.servers.selfcheck import CheckFailed
from connlist.servers.uvicorn.selfcheck import check_static
from tests.servers import (
    EARLY,
    INTEGRATED,
    LATE,
    PLAIN,
    connect,
    echo_app,
    is_408,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)

# -- options, validated as Node's http.createServer does ---------------------


async def _async_callback(conn: Connection, kind: str) -> None:
    """on_timeout is called from a timer callback: a coroutine would never run."""


def test_defaults_follow_node() -> None:
    mw = ConnectionsMiddleware(echo_app)
    assert (mw.settings.headers_timeout, mw.settings.request_timeout) == (60.0, 300.0)
    assert mw.debug_path == "/_connections"
    assert mw.mode == "asgi"


def test_max_connections_defaults_to_the_descriptor_limit_and_can_be_set() -> None:
    assert ConnectionsMiddleware(echo_app).settings.max_connections == default_max_connections()
    assert ConnectionsMiddleware(echo_app, max_connections=0).settings.max_connections == 0
    assert ConnectionsMiddleware(echo_app, max_connections=500).settings.max_connections == 500
    with pytest.raises(ValueError, match="max_connections"):
        ConnectionsMiddleware(echo_app, max_connections=-1)


def test_defaults_beyond_node_follow_nginx_and_apache() -> None:
    mw = ConnectionsMiddleware(echo_app)
    # nginx's send_timeout; Apache mod_reqtimeout's body=10,MinRate=500.
    s = mw.settings
    assert (s.send_timeout, s.body_min_rate, s.body_grace) == (60.0, 500.0, 10.0)
    assert mw.settings == Settings(60.0, 300.0, 60.0, 500.0, 10.0)
    mw = ConnectionsMiddleware(echo_app, send_timeout=5, body_min_rate=0, body_grace=0)
    assert (mw.settings.send_timeout, mw.settings.body_min_rate, mw.settings.body_grace) == (5.0, 0.0, 0.0)
    values = dataclasses.asdict(mw.settings)
    # The timeouts and the rate are floats; the budget, the websockets' share (half of it) and the
    # head's bound (Node's maxHeaderSize) are counts.
    assert type(values.pop("max_connections")) is int
    assert values.pop("max_upgraded") == mw.settings.max_connections // 2
    assert values.pop("max_header_size") == 16384
    assert all(type(value) is float for value in values.values())


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"request_timeout": 30}, (30.0, 30.0)),  # headers: min(60, request)
        ({"request_timeout": 120}, (60.0, 120.0)),
        ({"request_timeout": 0}, (60.0, 0.0)),  # request disabled: headers stays 60
        ({"headers_timeout": 0}, (0.0, 300.0)),
        ({"headers_timeout": 0, "request_timeout": 0}, (0.0, 0.0)),
        ({"headers_timeout": 5, "request_timeout": 5}, (5.0, 5.0)),
        ({"headers_timeout": 90, "request_timeout": 0}, (90.0, 0.0)),
    ],
)
def test_effective_timeouts(options: dict[str, Any], expected: tuple[float, float]) -> None:
    mw = ConnectionsMiddleware(echo_app, **options)
    assert (mw.settings.headers_timeout, mw.settings.request_timeout) == expected


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        (
            {"headers_timeout": 10, "request_timeout": 5},
            ValueError,
            "headers_timeout (10) must not be greater",
        ),
        ({"headers_timeout": -1}, ValueError, "headers_timeout"),
        ({"request_timeout": -0.5}, ValueError, "request_timeout"),
        ({"request_timeout": math.nan}, ValueError, "request_timeout"),
        ({"headers_timeout": math.inf}, ValueError, "headers_timeout"),
        ({"request_timeout": "30"}, TypeError, "request_timeout must be a number"),
        ({"headers_timeout": True}, TypeError, "headers_timeout must be a number"),
        ({"debug_path": "status"}, ValueError, "debug_path"),
        ({"debug_token": ""}, ValueError, "debug_token"),
        ({"on_timeout": 3}, TypeError, "on_timeout"),
        ({"on_timeout": _async_callback}, TypeError, "on_timeout must be a plain function"),
        ({"debug_path": 5}, TypeError, "debug_path must be None or a str"),
        ({"debug_token": b"secret"}, TypeError, "debug_token must be None or a str"),
        ({"send_timeout": -1}, ValueError, "send_timeout must be a finite number of seconds >= 0"),
        ({"send_timeout": math.inf}, ValueError, "send_timeout"),
        ({"send_timeout": "60"}, TypeError, "send_timeout must be a number of seconds"),
        ({"body_min_rate": -500}, ValueError, "body_min_rate must be a finite number of bytes per second"),
        ({"body_min_rate": math.nan}, ValueError, "body_min_rate"),
        ({"body_min_rate": False}, TypeError, "body_min_rate must be a number of bytes per second"),
        ({"body_grace": -1}, ValueError, "body_grace must be a finite number of seconds >= 0"),
        ({"body_grace": None}, TypeError, "body_grace must be a number of seconds"),
        ({"body_grace": 0}, ValueError, "body_grace must be greater than 0 while body_min_rate is enabled"),
        (
            {"server_integration": "on"},
            ValueError,
            "server_integration must be one of 'auto', 'required', 'off', got 'on'",
        ),
        (
            {"server_integration": True},
            TypeError,
            "server_integration must be one of 'auto', 'required', 'off', got bool",
        ),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error) as info:
        ConnectionsMiddleware(echo_app, **options)
    assert words in str(info.value)


def test_missing_hook_is_a_check_failure() -> None:
    class Moved:
        def connection_made(self) -> None: ...

    with pytest.raises(CheckFailed) as info:
        check_static(Moved, ("connection_made", "on_message_begin"), "h11")
    # What is missing (connlist.uvicorn adds the version, the loss and the advice).
    assert str(info.value).endswith("Moved has no `on_message_begin`")


# -- the hand-over to the server's protocol -----------------------------------


def test_protocol_without_middleware_enforces_defaults(parser: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    with serve(echo_app, INTEGRATED[parser]) as running:
        for _ in range(3):
            sock = connect(running.port)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"ok 0")
        enforcer = HANDOVER.enforcer  # the protocol's fallback, handed over for the worker
        assert isinstance(enforcer, Enforcer)
        assert (enforcer.headers_timeout, enforcer.request_timeout) == (60.0, 300.0)
        assert enforcer.mode == f"uvicorn-{parser}"
        assert running.call(lambda: len(enforcer.connections)) == 3
        # A silent client is timed: it is active, due at the headers deadline.
        connect(running.port)
        assert wait_for(lambda: running.call(lambda: enforcer.connections.active_count) == 1)
        deadline = running.call(lambda: enforcer.connections.next_deadline(60, 300))
        assert 59 < deadline - time.monotonic() <= 60
    warnings = [r.getMessage() for r in caplog.records if "no ConnectionsMiddleware" in r.getMessage()]
    assert len(warnings) == 1


def test_protocol_adds_nothing_to_uvicorns_instance_dict(parser: str) -> None:
    # CPython shares an instance dict's keys only up to 30 of them; uvicorn's
    # httptools protocol has 28 after a request, so connlist's fields must
    # live in slots, or every attribute access of uvicorn's code slows down.
    def instance_dict_keys(http: str) -> set[str]:
        with serve(echo_app, http) as running:
            sock = connect(running.port)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"ok 0")
            protocols = running.call(lambda: list(running.server.server_state.connections))
            assert len(protocols) == 1
            keys = set(vars(protocols[0]))
            sock.close()
        return keys

    integrated = instance_dict_keys(INTEGRATED[parser])
    assert integrated == instance_dict_keys(PLAIN[parser])
    assert len(integrated) < 30


def test_lifespan_off_middleware_adopts_the_protocols_list(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    mw = ConnectionsMiddleware(echo_app, headers_timeout=0.5, request_timeout=1.0)
    with serve(mw, INTEGRATED[parser], lifespan="off") as running:
        sock = connect(running.port)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"ok 0")
        # From the first request on, the middleware's settings rule the server's list.
        assert mw.mode == f"uvicorn-{parser}"
        assert (mw.settings.headers_timeout, mw.settings.request_timeout) == (0.5, 1.0)
        assert mw.enforcer is HANDOVER.enforcer
        assert mw.connections is mw.enforcer.connections
        started = time.monotonic()
        silent = connect(running.port)
        data, closed = read_until_closed(silent)
        assert is_408(data)
        assert 0.5 - EARLY <= closed - started <= 0.5 + LATE
    assert any("lifespan is off" in r.getMessage() for r in caplog.records)


# -- on_timeout ------------------------------------------------------------------


def test_on_timeout_is_called_before_closing(parser: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="connlist")
    calls: list[tuple[int, str, bool]] = []

    def on_timeout(conn: Connection, kind: str) -> None:
        # Called before the close: the connection is still in `all`.
        calls.append((conn.id, kind, conn.tracked))
        raise RuntimeError("a broken callback")

    mw = ConnectionsMiddleware(echo_app, headers_timeout=0.3, request_timeout=0.6, on_timeout=on_timeout)
    with serve(mw, INTEGRATED[parser]) as running:
        silent = connect(running.port)
        body = connect(running.port)
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc")
        for sock in (silent, body):
            data, _ = read_until_closed(sock)
            assert is_408(data), data  # still closed, with its 408, despite the failing callback
        assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0)
    assert sorted(kind for _, kind, _ in calls) == ["headers", "request"]
    assert all(tracked for _, _, tracked in calls)
    # The first failure is logged with its traceback, later ones only counted (no flood).
    failures = [r for r in caplog.records if "on_timeout callback failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    # ... and counted in the summary that holds the second timeout (the
    # last: one line per sweep, or both in one if a loaded machine made the
    # first sweep late).
    summaries = [r for r in caplog.records if r.levelno == logging.WARNING and "timed out" in r.getMessage()]
    raised = [r.getMessage() for r in summaries if "on_timeout raised" in r.getMessage()]
    assert len(raised) == 1 and raised[0] == summaries[-1].getMessage()
    assert raised[0].endswith("; on_timeout raised 1 time")
    # One DEBUG line per connection; the first sweep's summary at WARNING.
    logged = [r for r in caplog.records if "timeout:" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.DEBUG] * 2
    assert all(r.getMessage().startswith("127.0.0.1:") for r in logged)
    assert any("headers timeout" in r.getMessage() for r in logged)
    assert any("request timeout" in r.getMessage() for r in logged)
    assert [r.getMessage().split(";")[0] for r in summaries] in (
        ["connlist: 1 connection timed out (1 headers)", "connlist: 1 connection timed out (1 request)"],
        ["connlist: 2 connections timed out (1 headers, 1 request)"],
    )


def test_other_scopes_pass_through() -> None:
    import asyncio

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])
        assert send is fake_send
        if scope["type"] == "lifespan":
            # Wrapped, to write the pending log summary at shutdown; the messages are the server's.
            assert await receive() == {"type": "lifespan.shutdown"}
        else:
            assert receive is fake_receive

    async def fake_receive() -> Any:
        return {"type": "lifespan.shutdown"}

    async def fake_send(message: Any) -> None:
        return None

    mw = ConnectionsMiddleware(app)
    state: dict[str, Any] = {}
    asyncio.run(mw({"type": "websocket", "path": "/_connections"}, fake_receive, fake_send))
    asyncio.run(mw({"type": "lifespan", "state": state}, fake_receive, fake_send))
    assert seen == ["websocket", "lifespan"]
    # Handed over, and nothing written into the app's lifespan state.
    assert HANDOVER.enforcer is mw.enforcer and state == {}


def test_slow_on_timeout_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    # On a real loop and clock, once (the parser plays no part): the rule
    # itself is tested on a mock loop in tests/test_enforcer.py.
    caplog.set_level(logging.WARNING, logger="connlist")

    def on_timeout(conn: Connection, kind: str) -> None:
        time.sleep(0.02)  # blocks the event loop: longer than the 10 ms connlist tolerates

    mw = ConnectionsMiddleware(echo_app, headers_timeout=0.3, request_timeout=1, on_timeout=on_timeout)
    with serve(mw, INTEGRATED["h11"]) as running:
        socks = [connect(running.port) for _ in range(3)]
        for sock in socks:
            data, _ = read_until_closed(sock)
            assert is_408(data)
    slow = [r.getMessage() for r in caplog.records if "on_timeout took" in r.getMessage()]
    assert len(slow) == 1 and "keep it short" in slow[0]


def test_servers_take_the_middleware_for_asgi3_when_it_is_the_outermost_app() -> None:
    # __call__ is the mode's route: outermost, every server's ASGI 3 test
    # must say yes of each, or it would call it as ASGI 2.  (Inside another
    # app, which servers ask instead: test_inside_starlette_a_request_passes_...)
    import inspect

    from starlette._utils import is_async_callable

    def check_asgi3(mw: ConnectionsMiddleware) -> None:
        # uvicorn's rule (Config.load, interface "auto") and Starlette's:
        # asyncio's check before Python 3.14, inspect's from it.
        config = uvicorn.Config(mw, lifespan="off", ws="none")  # no websockets import: not the point here
        config.load()
        assert config.interface == "asgi3"
        assert is_async_callable(mw)
        if sys.version_info < (3, 14):  # deprecated from 3.14
            assert asyncio.iscoroutinefunction(mw.__call__)
        # hypercorn's rule (hypercorn.utils._is_asgi_2): inspect only.
        assert not inspect.isclass(mw) and inspect.iscoroutinefunction(mw.__call__)
        # The instance's signature is an ASGI app's, the class's the options'.
        assert list(inspect.signature(mw).parameters) == ["scope", "receive", "send"]
        assert "request_timeout" in inspect.signature(type(mw)).parameters

    mw = ConnectionsMiddleware(echo_app)
    check_asgi3(mw)

    async def lifespan() -> None:
        # A lifespan startup with no server integration announced; then the shutdown.
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

        async def receive() -> Message:
            return next(messages)

        async def send(message: Message) -> None:
            pass

        await mw({"type": "lifespan", "state": {}}, receive, send)

    # Called either way, it is an ASGI 3 app, in ASGI-only mode and with the integration.
    async def run() -> list[Message]:
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "state": {}}
        await mw(dict(scope), receive, send)
        await mw.__call__(dict(scope), receive, send)
        assert mw.__call__ == mw._asgi_only.__call__  # type: ignore[union-attr]
        check_asgi3(mw)
        # With the server integration (the mode its protocols announce,
        # which a lifespan startup takes), a request passes through to the app.
        await lifespan()
        mw.enforcer.mode = "uvicorn-httptools"
        for _ in range(2):
            await mw(dict(scope), receive, send)
            await mw.__call__(dict(scope), receive, send)
        return sent

    sent = asyncio.run(run())
    assert [m["type"] for m in sent].count("http.response.start") == 6
    # Still the middleware, and still ASGI 3 once it passes requests through,
    # for every check (uvicorn 0.36's is inspect's; later ones asyncio's).
    assert isinstance(mw, ConnectionsMiddleware) and mw.mode == "uvicorn-httptools"
    assert mw.__call__ == mw._passing
    check_asgi3(mw)
    asyncio.run(lifespan())
    assert mw.__call__ == mw._general
    check_asgi3(mw)


# -- a misspelled option -----------------------------------------------------------


def test_a_misspelled_option_names_the_nearest_and_the_signature_stays_explicit() -> None:
    with pytest.raises(TypeError) as info:
        ConnectionsMiddleware(echo_app, headers_timout=10)  # type: ignore[call-arg]
    assert str(info.value) == (
        "ConnectionsMiddleware() got an unexpected keyword argument 'headers_timout'; "
        "did you mean 'headers_timeout'?"
    )
    with pytest.raises(TypeError, match=r"'zzz'; the options are body_grace, body_min_rate, debug_path, "):
        ConnectionsMiddleware(echo_app, zzz=1)  # type: ignore[call-arg]
    # What type checkers and inspect read: the options themselves, not (*args, **kwargs).
    parameters = inspect.signature(ConnectionsMiddleware).parameters
    assert list(parameters)[:3] == ["app", "headers_timeout", "request_timeout"]
    assert ConnectionsMiddleware(app=echo_app, headers_timeout=1).settings.headers_timeout == 1.0

    class Mine(ConnectionsMiddleware):
        def __init__(self, app: Any, *, extra: int = 0, **options: Any) -> None:
            super().__init__(app, **options)
            self.extra = extra

    assert Mine(echo_app, extra=2, request_timeout=9).settings.request_timeout == 9.0
    with pytest.raises(
        TypeError, match=r"^Mine\(\) got an unexpected keyword argument 'request_timout'; did"
    ):
        Mine(echo_app, request_timout=9)


def _lifespan_startup(app: Any) -> tuple[list[Message], BaseException | None]:
    """Run ``app``'s lifespan startup as a server does: what it sent, and what it raised."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def run() -> BaseException | None:
        try:
            await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
        except Exception as exc:
            return exc
        return None

    return sent, asyncio.run(run())


def test_a_bad_option_fails_the_lifespan_startup_where_starlette_builds_the_middleware(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware

    class Mine(ConnectionsMiddleware):
        def __init__(self, app: Any, **options: Any) -> None:
            super().__init__(app, **options)

    expected = (
        "connlist: ConnectionsMiddleware cannot be built, so the app cannot run: ValueError: "
        "headers_timeout (100) must not be greater than request_timeout (30) when both are enabled"
    )
    caplog.set_level(logging.ERROR, logger="connlist")
    for cls in (ConnectionsMiddleware, Mine):
        # Starlette builds it at the lifespan: the startup fails with the error, which is then raised.
        app = Starlette(middleware=[Middleware(cls, headers_timeout=100, request_timeout=30)])
        sent, raised = _lifespan_startup(app)
        assert sent == [{"type": "lifespan.startup.failed", "message": expected}], sent
        assert isinstance(raised, ValueError), raised
        # Built directly, it raises where it is built, after the same line in the log.
        with pytest.raises(ValueError, match=r"^headers_timeout \(100\) must not be greater"):
            cls(echo_app, headers_timeout=100, request_timeout=30)
    assert [r.getMessage() for r in caplog.records] == [expected, expected]


def test_with_the_integration_a_request_passes_to_the_app_until_the_next_lifespan() -> None:
    # Once the integration feeds the list, a request goes to the app by the
    # pass-through route (connlist.asgi.middleware._pass); the endpoint, the
    # lifespan and, after a lifespan startup, the first request go the
    # general way again.
    made: list[Any] = []

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()

    def app(scope: Any, receive: Any, send: Any) -> Any:
        coroutine = served(scope, receive, send)
        made.append(coroutine)
        return coroutine

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    request = {"type": "http", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}

    async def scenario() -> None:
        mw = ConnectionsMiddleware(app, debug_path="/_connections")
        mw.enforcer.mode = "uvicorn-httptools"
        first = mw(request, receive, send)
        assert not made  # the general path: a coroutine of ours, which calls the app when awaited
        await first
        assert len(made) == 1
        assert mw.__call__ == mw._pass
        passed = mw(request, receive, send)
        assert len(made) == 1  # a coroutine of the route's, which calls the app when awaited
        await passed
        assert len(made) == 2
        await mw({"type": "lifespan", "state": {}}, receive, send)
        again = mw(request, receive, send)
        assert len(made) == 3  # the app's lifespan, not this request
        await again
        assert len(made) == 4

    asyncio.run(scenario())


def test_inside_starlette_a_request_passes_to_the_app_with_no_coroutine_of_the_middleware() -> None:
    # Starlette puts itself in scope["app"]: the server asks Starlette, not the
    # middleware, whether it is an ASGI 3 app, so the route can be a plain
    # function that returns the app's own awaitable.  The endpoint and the next
    # lifespan still go the general way; outermost, the route stays an async def.
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)], middleware=[Middleware(ConnectionsMiddleware)])
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        sent.append(message)

    def request(path: str) -> dict[str, Any]:
        return {
            "type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"",
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "scheme": "http",
        }  # fmt: skip

    async def scenario() -> ConnectionsMiddleware:
        await app({"type": "lifespan", "state": {}}, receive, send)
        mw = app.middleware_stack.app  # type: ignore[union-attr]  # ServerErrorMiddleware's app
        assert isinstance(mw, ConnectionsMiddleware)
        mw.enforcer.mode = "uvicorn-httptools"  # as the integration's protocols announce it
        for path in ("/", "/", "/_connections", "/"):
            await app(request(path), receive, send)
        assert mw.__call__ == mw._passing == mw._pass_nested
        assert not inspect.iscoroutinefunction(mw._pass_nested)
        await app({"type": "lifespan", "state": {}}, receive, send)
        assert mw.__call__ == mw._general
        return mw

    asyncio.run(scenario())
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[:2] == [b"hello", b"hello"] and b'"mode"' in bodies[2] and bodies[3] == b"hello"
    # Outermost, the server asks the middleware: the route stays an async def.
    outer = ConnectionsMiddleware(app)
    asyncio.run(outer({"type": "lifespan", "state": {}}, receive, send))
    assert outer._passing == outer._pass and inspect.iscoroutinefunction(outer._passing)


def test_a_subclass_with_a_call_of_its_own_reaches_the_route_through_super() -> None:
    # The route is the ``__call__`` slot, which the middleware sets through
    # its descriptor: under a subclass that defines ``__call__`` an
    # assignment would land in the instance's dict, and super() would find
    # the slot empty.
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    class Mine(ConnectionsMiddleware):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            seen.append("mine")
            await super().__call__(scope, receive, send)

    async def scenario() -> None:
        mw = Mine(app, debug_path="/_connections")
        mw.enforcer.mode = "uvicorn-httptools"
        request = {"type": "http", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}
        await mw(request, None, None)  # the general route, which sets the pass-through one
        await mw(request, None, None)
        assert "__call__" not in vars(mw)
        assert super(Mine, mw).__call__ == mw._passing

    asyncio.run(scenario())
    assert seen == ["mine", "/", "mine", "/"]


def test_the_pass_through_route_passes_through_and_says_asgi3() -> None:
    # The route is an async def: the request reaches the app, and every check says ASGI 3.
    import inspect

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    mw = ConnectionsMiddleware(app)
    route = mw._pass
    assert inspect.iscoroutinefunction(route) and asyncio.iscoroutinefunction(route)
    scope = {"type": "http", "path": "/x", "headers": [], "client": ("127.0.0.1", 1)}
    asyncio.run(route(scope, None, None))  # type: ignore[arg-type]
    assert seen == ["/x"]
    assert mw._passing == route
