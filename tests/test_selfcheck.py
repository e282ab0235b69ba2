"""uvicorn's self-check in process: the conversation passes on the installed uvicorn, fails on a change.

The changes on real servers are tests/test_uvicorn_drift.py's; here the
check itself: what it passes, what it reports, that it writes nothing to
uvicorn's logs and leaves nothing behind, what it costs, and how the start
is told (connlist.servers.uvicorn.start).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http import h11_impl, httptools_impl

from connlist import __version__
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.servers import integration
from connlist.servers.seam import UPGRADED
from connlist.servers.uvicorn import classes as uvicorn_classes
from connlist.servers.uvicorn import protocols as connlist_uvicorn
from connlist.servers.uvicorn import selfcheck as uvicorn_selfcheck
from connlist.servers.uvicorn import start as uvicorn_start

BASES = {"httptools": httptools_impl.HttpToolsProtocol, "h11": h11_impl.H11Protocol}


def built(parser: str, base: type) -> type:
    """connlist's class for ``parser``, its class statement run on ``base``."""
    return uvicorn_classes.PARSERS[parser].build(base)


def test_the_installed_uvicorn_passes_quietly(parser: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # A serving worker's enforcer, handed over: the check's protocols have a hand-over of their own.
    serving = HANDOVER.enforcer = Enforcer()
    started = time.perf_counter()
    result = uvicorn_selfcheck.run_in_thread(built(parser, BASES[parser]), BASES[parser], parser)
    elapsed = time.perf_counter() - started
    assert result.passed, result
    assert result.logger_name == "uvicorn.error"
    assert result.steps[0] == "uvicorn's own protocol, and what connlist reads of it"
    assert result.steps[-1] == "a headers timeout" and len(result.steps) == 18
    assert "the keep-alive after a response" in result.steps
    # Nothing reached uvicorn's loggers (its error log, its access log) or connlist's.
    assert [r for r in caplog.records if r.name.startswith(("uvicorn", "connlist"))] == []
    # Milliseconds, once per process (docs/deployment.md states the cost).
    assert elapsed < 1.0
    # The worker's hand-over untouched, its enforcer fed nothing.
    assert HANDOVER.enforcer is serving and serving.fed_by is None and serving.totals.connections == 0


def test_the_names_give_checked_classes() -> None:
    for parser, name in (("httptools", "HttpToolsProtocol"), ("h11", "H11Protocol")):
        cls = getattr(connlist_uvicorn, name)
        assert cls.connlist_mode == f"uvicorn-{parser}" and cls.__module__ == connlist_uvicorn.__name__
        assert connlist_uvicorn.outcome(parser).result.passed
        # Looked up again: the same class, no second check.
        assert getattr(connlist_uvicorn, name) is cls
    assert connlist_uvicorn.AutoProtocol is connlist_uvicorn.HttpToolsProtocol
    with pytest.raises(AttributeError):
        connlist_uvicorn.NoSuchProtocol  # noqa: B018


class _CopiesTheScope(httptools_impl.HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.scope = dict(self.cycle.scope)


class _NoFlow(h11_impl.H11Protocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        del self.flow


@pytest.mark.parametrize(
    ("parser", "base", "words"),
    [
        ("httptools", _CopiesTheScope, "`cycle.scope` is not the protocol's scope"),
        ("h11", _NoFlow, "uvicorn's protocol has no `flow`"),
    ],
)
def test_a_change_is_named(parser: str, base: type, words: str) -> None:
    result = uvicorn_selfcheck.run_in_thread(built(parser, base), base, parser)
    assert result.failure == words


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_keepalive_armed_otherwise_stays_uvicorns_and_is_said_once(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    class ArmsWithItsOwnLoop(BASES[parser]):  # type: ignore[misc, valid-type]
        def on_response_complete(self) -> None:
            given = self.loop
            self.loop = getattr(given, "loop", given)  # the event loop, not connlist's stand-in
            try:
                super().on_response_complete()
            finally:
                self.loop = given

    cls = built(parser, ArmsWithItsOwnLoop)
    result = uvicorn_selfcheck.run_in_thread(cls, ArmsWithItsOwnLoop, parser)
    assert result.passed, result
    assert cls.connlist_keepalive is False
    assert "does not arm the keep-alive with `self.loop.call_later" in cls.connlist_keepalive_not
    # Another class built on uvicorn's own keeps the list's keep-alive.
    assert built(parser, BASES[parser]).connlist_keepalive is True
    caplog.set_level(logging.WARNING)
    connlist_uvicorn._warn_keepalive(cls, parser)
    assert [r.getMessage() for r in caplog.records if "times its keep-alive itself" in r.getMessage()]


def test_an_exception_is_a_failure_too() -> None:
    class Raises(h11_impl.H11Protocol):
        def data_received(self, data: bytes) -> None:
            raise KeyError("moved")

    result = uvicorn_selfcheck.run_in_thread(built("h11", Raises), Raises, "h11")
    assert result.failure == "the scripted conversation raised KeyError: 'moved'"


def _config_of(cls: Any) -> Any:
    """A uvicorn Config as far as connlist reads it: its protocol class."""
    return SimpleNamespace(http_protocol_class=cls)


def test_the_start_is_told_from_the_servers_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    connlist_cls = connlist_uvicorn.H11Protocol
    for policy in integration.POLICIES:
        # connlist's class, given by a flag: on whatever the option says, nothing touched.
        config = _config_of(connlist_cls)
        assert uvicorn_start.turn_on(config, policy) == ("uvicorn-h11", None, None, None)
        assert config.http_protocol_class is connlist_cls
    # uvicorn's own class: connlist's in its place, unless the option is "off".
    config = _config_of(h11_impl.H11Protocol)
    assert uvicorn_start.turn_on(config, "off") == (
        None,
        'server_integration is "off"',
        'set server_integration="auto" (the default) to let connlist turn it on',
        None,
    )
    assert config.http_protocol_class is h11_impl.H11Protocol
    assert uvicorn_start.turn_on(config, "auto") == ("uvicorn-h11", None, None, None)
    assert config.http_protocol_class is connlist_cls
    # A stand-in for a class whose check failed: the failure, and nothing touched.
    monkeypatch.setitem(integration._failures, httptools_impl.HttpToolsProtocol, "uvicorn 9: it moved")
    config = _config_of(httptools_impl.HttpToolsProtocol)
    assert uvicorn_start.turn_on(config, "auto") == (None, "uvicorn 9: it moved", integration.FELL_BACK, None)
    assert uvicorn_start.turn_on(config, "required").refusal == (
        "the server integration is off and it is required, so the server refuses to start: "
        "uvicorn 9: it moved"
    )
    assert config.http_protocol_class is httptools_impl.HttpToolsProtocol
    # A server that does not say: a passed check waits for the first connection.
    assert uvicorn_start.turn_on(None, "auto") == (None, None, None, None)


def test_the_lifespan_receive_or_task_leads_to_the_servers_config() -> None:
    config = _config_of(h11_impl.H11Protocol)
    owner = SimpleNamespace(config=config, state={})
    owner.receive = lambda: None
    # uvicorn's own receive: a method of the object holding the config.
    assert uvicorn_start.server_config(SimpleNamespace(__self__=owner)) is config
    # Wrapped (FastAPI's telemetry does): found through the lifespan's task, whose ``self`` holds the
    # scope's state, and only then.
    wrapped = SimpleNamespace()

    class LifespanOn:
        def __init__(self, state: dict[str, object]) -> None:
            self.config = config
            self.state = state

        async def main(self, state: object) -> Any:
            return uvicorn_start.server_config(wrapped, state)

    state: dict[str, object] = {}
    assert asyncio.run(LifespanOn(state).main(state)) is config
    assert asyncio.run(LifespanOn({}).main(state)) is None
    assert uvicorn_start.server_config(wrapped, state) is None  # no running task
    assert uvicorn_start.server_config(SimpleNamespace(__self__=SimpleNamespace(config=object()))) is None


@pytest.mark.parametrize(("value", "required"), [("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_require_integration_values(monkeypatch: pytest.MonkeyPatch, value: str, required: bool) -> None:
    monkeypatch.setenv("CONNLIST_REQUIRE_INTEGRATION", value)
    assert integration.require_integration() is required


def test_require_integration_rejects_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNLIST_REQUIRE_INTEGRATION", "true")
    with pytest.raises(ValueError, match=r"CONNLIST_REQUIRE_INTEGRATION must be 1 .* or 0, got 'true'"):
        integration.require_integration()


# -- connlist.uvicorn's fallback, in process ---------------------------------------------


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """connlist.uvicorn's records of checks and failures, emptied for the test (and restored after)."""
    monkeypatch.setattr(connlist_uvicorn, "_outcomes", {})
    monkeypatch.setattr(integration, "_failures", {})
    monkeypatch.setattr(integration, "_passed", set())


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (("uvicorn.protocols.http.moved", "H11Protocol"), "uvicorn has no uvicorn.protocols.http.moved"),
        (
            ("uvicorn.protocols.http.h11_impl", "Renamed"),
            "uvicorn.protocols.http.h11_impl has no class Renamed",
        ),
    ],
)
def test_a_moved_protocol_falls_back_to_uvicorns_own_name_for_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, entry: tuple[str, str], words: str
) -> None:
    caplog.set_level(logging.ERROR, logger="connlist")
    monkeypatch.setitem(
        uvicorn_classes.PARSERS,
        "h11",
        uvicorn_classes.Parser(*entry, uvicorn_classes.h11_protocol, "H11Protocol"),
    )
    # uvicorn's own "--http h11" class stands in.
    assert connlist_uvicorn._integrate("h11") is h11_impl.H11Protocol
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"connlist: the server integration is off: connlist {__version__}")
    assert words in line and "Set CONNLIST_REQUIRE_INTEGRATION=1 to refuse to start instead." in line
    (reason,) = integration._failures.values()
    assert list(integration._failures) == [h11_impl.H11Protocol]
    assert reason.startswith(f"uvicorn {uvicorn.__version__}: H11Protocol: {words}")


@pytest.mark.usefixtures("fresh")
def test_a_layout_conflict_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # A base connlist's slots cannot be added to (here: int) is the same as a __slots__ conflict.
    # A base connlist's slots cannot be added to (here: an int too) is the same as a __slots__ conflict.
    class OnInt(h11_impl.H11Protocol, int):
        pass

    with pytest.raises(TypeError):
        uvicorn_classes.h11_protocol(OnInt)

    def conflict(base: type) -> type:
        raise TypeError("multiple bases have instance lay-out conflict")

    where = uvicorn_classes.PARSERS["h11"]
    monkeypatch.setitem(uvicorn_classes.PARSERS, "h11", where._replace(build=conflict))
    assert connlist_uvicorn._integrate("h11") is h11_impl.H11Protocol
    expected = "connlist's class cannot be built on uvicorn's H11Protocol: "
    assert (
        connlist_uvicorn.outcome("h11").result.failure
        == expected + "multiple bases have instance lay-out conflict"
    )


@pytest.mark.usefixtures("fresh")
def test_the_refusal_is_one_error_line_and_the_start_failure_status(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="connlist")
    monkeypatch.setenv("CONNLIST_REQUIRE_INTEGRATION", "1")
    moved = uvicorn_classes.PARSERS["h11"]._replace(module="uvicorn.protocols.http.moved")
    monkeypatch.setitem(uvicorn_classes.PARSERS, "h11", moved)
    with pytest.raises(SystemExit) as info:
        connlist_uvicorn._integrate("h11")
    # uvicorn's status for a failed startup, gunicorn's for a worker that failed to boot.
    assert info.value.code == 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "connlist: refusing to start (CONNLIST_REQUIRE_INTEGRATION=1): the server integration "
    )
    assert "uvicorn has no uvicorn.protocols.http.moved" in line and line.endswith("or upgrade connlist.")
    assert integration._failures == {}


@pytest.mark.usefixtures("fresh")
def test_a_newer_uvicorn_that_passes_is_warned_about_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    monkeypatch.setattr(connlist_uvicorn.uvicorn, "__version__", "0.56.0rc1")
    for parser in ("h11", "httptools"):
        cls = connlist_uvicorn._integrate(parser)
        assert cls.connlist_mode == f"uvicorn-{parser}"
    assert [r.getMessage() for r in caplog.records] == [
        f"connlist {__version__} is tested with uvicorn 0.36.0 to 0.55.0; "
        "this is 0.56.0rc1; the self-check passed"
    ]
    assert connlist_uvicorn._version("0.56.0rc1") == (0, 56, 0) > connlist_uvicorn._version("0.55.0")


# -- every step of the conversation can fail: connlist's class broken one way at a time ------


def _untracked(cls: type) -> type:
    def made(self: Any, transport: Any) -> None:
        cls.connection_made(self, transport)
        self._connlist.connections.remove(self._connlist_record)
        self._connlist_record = None

    return type("Broken", (cls,), {"connection_made": made})


def _events_skipped(cls: type) -> type:
    base = cls.__mro__[-4]  # uvicorn's class (then asyncio.Protocol, BaseProtocol, object)
    return type("Broken", (cls,), {"data_received": lambda self, data: base.data_received(self, data)})


def _counted_twice(cls: type) -> type:
    def data_received(self: Any, data: bytes) -> None:
        cls.data_received(self, data)
        if self._connlist_record.requests:
            self._connlist_record.requests += 1

    return type("Broken", (cls,), {"data_received": data_received})


def _upgrade_kept(cls: type) -> type:
    base = cls.__mro__[-4]
    return type(
        "Broken",
        (cls,),
        {"handle_websocket_upgrade": lambda self, *event: base.handle_websocket_upgrade(self, *event)},
    )


def _upgrade_unheld(cls: type) -> type:
    # Held as upgraded, but handed to uvicorn's websocket class as it is: nothing would remove it.
    base = cls.__mro__[-4]

    def handle_websocket_upgrade(self: Any, *event: Any) -> None:
        self._connlist.upgrade(self._connlist_record, "GET", "/ws")
        self._connlist_phase = UPGRADED
        base.handle_websocket_upgrade(self, *event)

    return type("Broken", (cls,), {"handle_websocket_upgrade": handle_websocket_upgrade})


def _loss_ignored(cls: type) -> type:
    base = cls.__mro__[-4]
    return type("Broken", (cls,), {"connection_lost": lambda self, exc: base.connection_lost(self, exc)})


def _no_408(cls: type) -> type:
    return type("Broken", (cls,), {"connlist_close_expired": lambda self: None})


def _own_pipeline(cls: type) -> type:
    def headers(self: Any) -> None:
        cls.on_headers_complete(self)
        self._connlist_running = None  # the request running ahead of the queued one, not found

    return type("Broken", (cls,), {"on_headers_complete": headers})


def _body_not_credited(cls: type) -> type:
    def body_begin(self: Any, record: Any) -> None:
        cls._connlist_body_begin(self, record)
        record.body_received = 0

    return type("Broken", (cls,), {"_connlist_body_begin": body_begin})


def _timed_at_the_headers(cls: type) -> type:
    """The body's clock as before issue 20: from the headers, 100 Continue or not."""

    def body_begin(self: Any, record: Any) -> None:
        self._connlist.connections.body_begin(record, len(self.cycle.body))

    return type("Broken", (cls,), {"_connlist_body_begin": body_begin})


def _receive_not_wrapped(cls: type) -> type:
    """uvicorn calls the app with a receive of its own (the cycle's is not looked up then)."""

    def after_continue(self: Any, record: Any, cycle: Any) -> None:
        send = cycle.send
        cls._connlist_after_continue(self, record, cycle)
        cycle.receive = type(cycle).receive.__get__(cycle)
        del send

    return type("Broken", (cls,), {"_connlist_after_continue": after_continue})


def _send_not_wrapped(cls: type) -> type:
    def after_continue(self: Any, record: Any, cycle: Any) -> None:
        cls._connlist_after_continue(self, record, cycle)
        cycle.send = type(cycle).send.__get__(cycle)

    return type("Broken", (cls,), {"_connlist_after_continue": after_continue})


@pytest.mark.parametrize(
    ("parser", "breakage", "words"),
    [
        (
            "httptools",
            _body_not_credited,
            "the body's clock counts 0 bytes of the 4 that came with the headers (the cycle's `body`)",
        ),
        (
            "h11",
            _timed_at_the_headers,
            "a body that waits for `100 Continue` was timed before the app asked for it",
        ),
        (
            "h11",
            _receive_not_wrapped,
            "the body's clock did not start at the app's first receive(), when uvicorn sent "
            "`100 Continue` (the cycle's `receive`)",
        ),
        (
            "httptools",
            _send_not_wrapped,
            "the body's clock did not start at the app's answer without reading the body "
            "(the cycle's `send`)",
        ),
        ("h11", _untracked, "a connection made was not tracked"),
        (
            "h11",
            _events_skipped,
            "after a whole request in one read, the connection is new, where it must be idle",
        ),
        (
            "httptools",
            _counted_twice,
            "after a whole request in one read, the connection counts 2 requests, not 1",
        ),
        ("httptools", _upgrade_kept, "a websocket upgrade did not hold the connection as upgraded"),
        (
            "h11",
            _upgrade_unheld,
            "a websocket upgrade handed the transport to another than `ws_protocol_class`",
        ),
        ("h11", _loss_ignored, "a connection lost mid-request stayed in the list"),
        ("h11", _no_408, "a connection past the headers timeout was not answered 408 and closed"),
        (
            "httptools",
            _own_pipeline,
            "a pipelined request was not queued behind the running one (`pipeline`)",
        ),
    ],
)
def test_each_step_can_fail(parser: str, breakage: Callable[[type], type], words: str) -> None:
    broken = breakage(built(parser, BASES[parser]))
    result = uvicorn_selfcheck.run_in_thread(broken, BASES[parser], parser)
    assert result.failure == words


class _LosesItsCycle(h11_impl.H11Protocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.cycle = None  # type: ignore[assignment]


class _RewritesThePath(httptools_impl.HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.scope["path"] = "/elsewhere"


class _ContinuesAtOnce(h11_impl.H11Protocol):
    """A uvicorn that sends 100 Continue with the headers (so the body's clock may start then)."""

    def handle_events(self) -> None:
        super().handle_events()
        cycle: Any = self.cycle
        if cycle is not None and cycle.waiting_for_100_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False


class _BodyInChunks(httptools_impl.HttpToolsProtocol):
    """A uvicorn that keeps a request's body as a list of chunks (connlist counts its bytes)."""

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None:
            self.cycle.body = []  # type: ignore[assignment]


class _ContinueUnknown(h11_impl.H11Protocol):
    """A uvicorn whose cycle no longer says False for a request that does not wait for 100 Continue."""

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None:
            self.cycle.waiting_for_100_continue = None  # type: ignore[assignment]


class _FlowWithoutFlag(h11_impl.H11Protocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow.read_paused = 0  # type: ignore[assignment]


def _writes(base: type, rewrite: Callable[[bytes], list[bytes]]) -> type:
    """``base`` on a transport each of whose writes goes out as ``rewrite(data)`` says."""

    def connection_made(self: Any, transport: Any) -> None:
        base.connection_made(self, transport)
        write = transport.write

        def rewritten(data: bytes) -> None:
            for part in rewrite(bytes(data)):
                write(part)

        transport.write = rewritten

    return type(f"Rewriting{base.__name__}", (base,), {"connection_made": connection_made})


# A uvicorn that never writes 100 Continue; one that writes each response twice.
_NoContinue = _writes(h11_impl.H11Protocol, lambda data: [] if data.startswith(b"HTTP/1.1 100 ") else [data])
_Twice = _writes(
    httptools_impl.HttpToolsProtocol,
    lambda data: [data, data] if data.startswith(b"HTTP/1.1 200 ") else [data],
)


@pytest.mark.parametrize(
    ("parser", "base", "words"),
    [
        ("httptools", _BodyInChunks, "uvicorn's request cycle's `body` is a list, not bytes"),
        (
            "h11",
            _ContinueUnknown,
            "uvicorn's request cycle's `waiting_for_100_continue` is not False for a request without "
            "`Expect: 100-continue` (None)",
        ),
        (
            "h11",
            _FlowWithoutFlag,
            "uvicorn's protocol has no `flow` with a `read_paused` flag (its flow control)",
        ),
        (
            "h11",
            _NoContinue,
            "uvicorn did not write `100 Continue` at the app's first receive(), when uvicorn sent "
            "`100 Continue`",
        ),
        ("httptools", _Twice, "12 responses were written for 6 requests"),
        (
            "h11",
            _ContinuesAtOnce,
            "uvicorn's request cycle's `waiting_for_100_continue` is not True for a request with "
            "`Expect: 100-continue`",
        ),
        ("h11", _LosesItsCycle, "uvicorn's protocol has no `cycle` after a request"),
        (
            "httptools",
            _RewritesThePath,
            "the request's method and path read ('GET', '/elsewhere') from `cycle.scope`",
        ),
    ],
)
def test_what_uvicorns_protocol_must_hold(parser: str, base: type, words: str) -> None:
    assert uvicorn_selfcheck.run_in_thread(built(parser, base), base, parser).failure == words


def test_a_check_that_hangs_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    class Slow(h11_impl.H11Protocol):
        def data_received(self, data: bytes) -> None:
            time.sleep(0.05)  # the loop's timeout comes at the next await
            super().data_received(data)

    monkeypatch.setattr(uvicorn_selfcheck, "LIMIT", 0.01)
    result = uvicorn_selfcheck.run_in_thread(built("h11", Slow), Slow, "h11")
    assert result.failure is not None and result.failure.startswith(
        "the scripted conversation did not finish"
    )


def test_a_config_uvicorn_cannot_load_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def moved(cls: type) -> Any:
        raise AttributeError("Config has no load")

    monkeypatch.setattr(uvicorn_selfcheck, "make_config", moved)
    result = uvicorn_selfcheck.run_in_thread(built("h11", BASES["h11"]), BASES["h11"], "h11")
    assert (
        result.failure
        == "uvicorn's Config could not be loaded for the check: AttributeError: Config has no load"
    )


@pytest.mark.usefixtures("fresh")
def test_a_server_that_does_not_say_is_told_from_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing checked: ASGI-only mode from the start.  The advice depends on what started the
    # process (gunicorn is imported by other tests of this one): each launcher's.
    monkeypatch.setattr(uvicorn_start, "launcher", lambda: "uvicorn")
    start = uvicorn_start.turn_on(None, "auto")
    assert (start.mode, start.reason) == (None, uvicorn_start.NOT_UVICORN)
    assert start.advice == (
        "serve the app with uvicorn: `uvicorn app:app`, `fastapi run`, or gunicorn "
        "-k uvicorn_worker.UvicornWorker (or -k connlist.gunicorn.UvicornWorker); "
        "or with gunicorn's own -k asgi (or -k connlist.gunicorn.ASGIWorker)"
    )
    monkeypatch.setattr(uvicorn_start, "launcher", lambda: "gunicorn")
    assert uvicorn_start.turn_on(None, "auto").advice == (
        "serve with gunicorn -k uvicorn_worker.UvicornWorker (or -k connlist.gunicorn.UvicornWorker), "
        "which run uvicorn, or with gunicorn's own -k asgi (or -k connlist.gunicorn.ASGIWorker), "
        "in place of this worker class"
    )
    # Only failures: the first one.
    monkeypatch.setitem(integration._failures, h11_impl.H11Protocol, "uvicorn 9: H11Protocol: it moved")
    assert uvicorn_start.turn_on(None, "auto").reason == "uvicorn 9: H11Protocol: it moved"


def test_a_uvicorn_without_what_the_script_imports_fails_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn.server

    monkeypatch.delattr(uvicorn.server, "ServerState")
    result = uvicorn_selfcheck.run_in_thread(built("h11", BASES["h11"]), BASES["h11"], "h11")
    assert result.failure is not None and result.failure.startswith(
        "the scripted conversation raised ImportError: cannot import name 'ServerState' from 'uvicorn.server'"
    )
    assert result.steps == [] and result.logger_name is None


def test_the_policy_is_checked_and_the_advice_fits_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="must be one of 'auto', 'required', 'off', got int"):
        integration.check_policy(1)
    with pytest.raises(ValueError, match="got 'on'"):
        integration.check_policy("on")
    assert integration.check_policy("off") == "off"
    reason, advice = uvicorn_start.unconfirmed("uvicorn-h11")
    assert reason.startswith(f"uvicorn {uvicorn.__version__} served a request through another protocol")
    assert advice.endswith("), or upgrade connlist.") and uvicorn_start.TESTED_RANGE in advice
    monkeypatch.delitem(sys.modules, "gunicorn.arbiter", raising=False)
    monkeypatch.delitem(sys.modules, "fastapi_cli", raising=False)
    assert "--lifespan on or auto" in uvicorn_start.advice_without_lifespan()
    monkeypatch.setitem(sys.modules, "fastapi_cli", ModuleType("fastapi_cli"))
    assert uvicorn_start.launcher() == "fastapi"
    assert "the app `fastapi run` serves" in uvicorn_start.advice_without_lifespan()
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", ModuleType("gunicorn.arbiter"))
    assert uvicorn_start.launcher() == "gunicorn"
    assert uvicorn_start.advice_without_lifespan().endswith("which run the lifespan")
    assert uvicorn_start._advice_foreign().startswith("serve with gunicorn -k uvicorn_worker.UvicornWorker")
