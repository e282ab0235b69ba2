"""gunicorn's ASGI integration in memory: its self-check, its start, its handle (connlist.gunicorn_asgi*).

The real processes are tests/test_gunicorn_asgi.py's; here each branch of
the start is driven with gunicorn's module global set as each case has it,
and what connlist says (the mode, the reason, the one line) is checked.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("gunicorn.workers.gasgi")

from gunicorn.asgi import protocol as gunicorn_protocol
from gunicorn.workers import gasgi
from starlette.requests import ClientDisconnect

from connlist import gunicorn_asgi, gunicorn_asgi_check, gunicorn_asgi_start, integration, logs
from connlist.enforcer import STATE_KEY, Enforcer
from connlist.uvicorn_selfcheck import CheckFailed, Result

GUNICORNS = gunicorn_protocol.ASGIProtocol


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test with gunicorn's own class in the worker module, and the process's records untouched.

    The start routes connlist's lines to gunicorn's error log (``logs.follow_uvicorn_logger``):
    the logger it follows, and the ``connlist`` logger's handlers and level, are restored after.
    """
    monkeypatch.setattr(gasgi, "ASGIProtocol", GUNICORNS)
    monkeypatch.setattr(integration, "_failures", {})
    monkeypatch.setattr(integration, "_passed", set())
    monkeypatch.delenv(integration.REQUIRE_ENV, raising=False)
    monkeypatch.setattr(logs, "_uvicorn_logger_name", logs._uvicorn_logger_name)
    saved = (list(logs.logger.handlers), logs.logger.propagate, logs.logger.level)
    yield
    logs.logger.handlers, logs.logger.propagate, level = saved
    logs.logger.setLevel(level)  # (setLevel also clears the loggers' cached levels)


def failing(monkeypatch: pytest.MonkeyPatch, failure: str = "the check's made-up failure") -> None:
    """The build and check, as on a gunicorn connlist does not work with."""
    monkeypatch.setattr(gunicorn_asgi_start, "_built", (None, GUNICORNS, Result(failure)))


def passing(monkeypatch: pytest.MonkeyPatch) -> type[Any]:
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is not None, result.failure
    monkeypatch.setattr(gunicorn_asgi_start, "_built", (cls, base, result))
    return cls


@pytest.mark.parametrize("parser", ["python", "fast"])
def test_the_self_check_passes_on_the_installed_gunicorn(parser: str) -> None:
    if parser == "fast":
        pytest.importorskip("gunicorn_h1c")
    cls = gunicorn_asgi.build(GUNICORNS)
    result = gunicorn_asgi_check.run_in_thread(cls, parser)
    assert result.passed, result.failure
    assert "a headers timeout" in result.steps and "the keep-alive timeout" in result.steps
    assert result.seconds < 1.0


def test_the_self_check_names_a_missing_hook() -> None:
    stripped = type("Stripped", (), {"connection_made": lambda self, t: None})
    with pytest.raises(CheckFailed, match=r"Stripped has no `connection_lost`, `data_received`"):
        gunicorn_asgi_check.check_static(stripped, gunicorn_asgi.HOOKS)


def test_a_class_that_fails_its_conversation_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    class Silent(gunicorn_asgi.build(GUNICORNS)):  # type: ignore[misc]
        # A gunicorn whose loop no longer arms the keep-alive where connlist hooks it.
        def _arm_keepalive_timer(self) -> None:
            pass

    result = gunicorn_asgi_check.run_in_thread(Silent, "python")
    assert result.failure == (
        "after the rest of the request, and its response, the connection is handling, where it must be idle"
    )


def test_the_build_fails_on_a_gunicorn_without_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gunicorn_asgi_start, "PROTOCOL_MODULE", "gunicorn.asgi.lifespan")
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is None and base is None
    assert result.failure == "gunicorn.asgi.lifespan has no class ASGIProtocol"
    monkeypatch.setattr(gunicorn_asgi_start, "PROTOCOL_MODULE", "gunicorn.asgi.nowhere")
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is None and result.failure is not None
    assert "gunicorn has no gunicorn.asgi.nowhere" in result.failure


def test_the_parser_gunicorn_takes() -> None:
    class Cfg:
        http_parser = "python"
        proxy_protocol = "off"

    assert gunicorn_asgi_start.parser_name(Cfg()) == "python"
    Cfg.http_parser = "fast"
    assert gunicorn_asgi_start.parser_name(Cfg()) == "fast"
    Cfg.http_parser = "auto"
    fast = "gunicorn_h1c" in sys.modules or GUNICORNS._check_h1c_protocol_available()
    assert gunicorn_asgi_start.parser_name(Cfg()) == ("fast" if fast else "python")
    Cfg.proxy_protocol = "v1"  # the fast parser cannot honour it
    assert gunicorn_asgi_start.parser_name(Cfg()) == "python"


class Worker(gasgi.ASGIWorker):  # type: ignore[misc]
    """gunicorn's ASGI worker, not booted: what the start reads of it (its state, cfg and master)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.ppid = 4242
        self.cfg = type("Cfg", (), {"http_parser": "python"})()


def test_the_worker_is_found_from_the_lifespan() -> None:
    worker = Worker()

    class Lifespan:
        state = worker.state

        async def receive(self) -> None:
            pass

    async def main() -> tuple[Any, Any, Any]:
        async def _serve(self: Worker, found: asyncio.Future[Any]) -> None:
            # As gunicorn's worker awaits the startup: ``self`` is the worker in the task's frame.
            await found

        found: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(_serve(worker, found))
        await asyncio.sleep(0)
        try:
            by_receive = gunicorn_asgi_start.server_config(Lifespan().receive)
            by_state = gunicorn_asgi_start.server_config(object(), worker.state)
            other = gunicorn_asgi_start.server_config(object(), {})
        finally:
            found.set_result(None)
            await task
        return by_receive, by_state, other

    by_receive, by_state, other = asyncio.run(main())
    assert by_receive is worker and by_state is worker and other is None
    assert gunicorn_asgi_start.server_config(object()) is None  # no state, no loop
    assert gunicorn_asgi_start.gunicorn_master(worker) == 4242
    assert gunicorn_asgi_start.gunicorn_master(None) is None


def test_turned_on_at_the_lifespan_startup(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ours = passing(monkeypatch)
    caplog.set_level(logging.INFO, logger="connlist")
    start = gunicorn_asgi_start.turn_on(Worker(), "auto")
    assert start.mode == "gunicorn-python" and start.reason is None
    assert gasgi.ASGIProtocol is ours
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("connlist: server integration on (gunicorn ") and line.endswith(
        ", asgi worker, python parser)"
    )
    # Found in place (the worker class put it there): on, whatever the policy.
    start = gunicorn_asgi_start.turn_on(Worker(), "off")
    assert start.mode == "gunicorn-python"
    assert caplog.records[-1].getMessage().endswith("python parser, from the worker class)")


def test_off_foreign_or_failed(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    start = gunicorn_asgi_start.turn_on(Worker(), "off")
    assert start.mode is None and start.reason == integration.OFF and gasgi.ASGIProtocol is GUNICORNS
    # An embedder's own class is left alone.
    own = type("Own", (GUNICORNS,), {})
    monkeypatch.setattr(gasgi, "ASGIProtocol", own)
    start = gunicorn_asgi_start.turn_on(Worker(), "required")
    assert start.mode is None and start.reason is not None and "Own" in start.reason
    assert start.refusal is not None and "it is required" in start.refusal
    monkeypatch.setattr(gasgi, "ASGIProtocol", GUNICORNS)
    # A failed check: gunicorn's class stays, one ERROR line; "required" refuses instead, with no line.
    failing(monkeypatch)
    caplog.set_level(logging.INFO, logger="connlist")
    start = gunicorn_asgi_start.turn_on(Worker(), "required")
    assert start.refusal is not None and "the check's made-up failure" in start.refusal
    assert not caplog.records
    monkeypatch.setattr(integration, "_failures", {})  # (a refusal ends the worker: a new one checks anew)
    start = gunicorn_asgi_start.turn_on(Worker(), "auto")
    assert start.mode is None and start.advice == integration.FELL_BACK
    assert start.reason is not None and start.reason.endswith("ASGIProtocol: the check's made-up failure")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "gunicorn's ASGI worker keeps its own protocol" in line
    assert gasgi.ASGIProtocol is GUNICORNS
    # From then on the stand-in is known: the reason, without a second check.
    start = gunicorn_asgi_start.turn_on(Worker(), "auto")
    assert start.mode is None and start.reason is not None


def test_the_named_class_falls_back_or_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import connlist.gunicorn

    ours = passing(monkeypatch)
    assert connlist.gunicorn.ASGIProtocol is ours
    failing(monkeypatch)
    caplog.set_level(logging.ERROR, logger="connlist")
    assert connlist.gunicorn.ASGIProtocol is GUNICORNS
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"Set {integration.REQUIRE_ENV}=1 to refuse to start instead." in line
    monkeypatch.setenv(integration.REQUIRE_ENV, "1")
    with pytest.raises(SystemExit) as exited:
        connlist.gunicorn.ASGIProtocol  # noqa: B018
    assert exited.value.code == gunicorn_asgi_start.REFUSAL_STATUS
    with pytest.raises(AttributeError):
        connlist.gunicorn.Nothing  # type: ignore[attr-defined]  # noqa: B018


def test_the_start_advice() -> None:
    assert "--asgi-lifespan" in gunicorn_asgi_start.advice_without_lifespan()
    reason, advice = gunicorn_asgi_start.unconfirmed("gunicorn-python")
    assert "gunicorn.workers.gasgi.ASGIProtocol" in reason and "connlist.gunicorn.ASGIWorker" in advice


def test_a_cut_request_leaves_its_client_disconnect_out_of_gunicorns_log() -> None:
    logged: list[str] = []

    class Log:
        def exception(self, msg: str, *args: object) -> None:
            logged.append(msg)

        def info(self, msg: str) -> None:
            logged.append(msg)

    log = gunicorn_asgi._AfterCutLog(Log())
    try:
        raise ClientDisconnect()
    except ClientDisconnect:
        log.exception("Error in ASGI application")
    try:
        raise ValueError("the app's own")
    except ValueError:
        log.exception("Error in ASGI application")
    log.info("kept")
    assert logged == ["Error in ASGI application", "kept"]


def test_a_worker_without_a_lifespan_state_keeps_its_enforcer_to_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gunicorn_asgi, "STATELESS", {STATE_KEY: Enforcer()})
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    class Bare:
        cfg = Config()
        log = gunicorn_asgi_check._SilentLog()
        asgi = None
        loop = None

    worker = Bare()
    protocol = cls(worker)
    assert not hasattr(worker, "state")
    assert protocol._connlist is gunicorn_asgi.STATELESS[STATE_KEY]
    assert protocol.connlist_request() == (None, None)
    assert protocol.connlist_reading_paused() is False
    assert protocol._connlist_responding() is False


def test_closes_decided_by_connlist_end_gunicorns_connection_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = gunicorn_asgi_check._Worker(Config(), app, {STATE_KEY: Enforcer()}, loop)
        # Refused at the budget: 503, and the loop waiting for a first request ends.
        refused = cls(worker)
        refused_transport = gunicorn_asgi_check._Transport()
        refused.connection_made(refused_transport)
        refused.connlist_refuse()
        # Let go while idle: closed, and the loop waiting for the next request ends.
        idle = cls(worker)
        idle_transport = gunicorn_asgi_check._Transport()
        idle.connection_made(idle_transport)
        idle.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0)
        assert idle.connlist_close_idle() is True
        for _ in range(10):
            await asyncio.sleep(0)
        assert bytes(refused_transport.written).startswith(b"HTTP/1.1 503 ")
        assert bytes(idle_transport.written).startswith(b"HTTP/1.1 200 ") and idle_transport.closing
        assert refused._task.done() and idle._task.done()
        for protocol in (refused, idle):
            protocol.connection_lost(None)
        worker.state[STATE_KEY].cancel()

    asyncio.run(main())


def test_connlist_adds_nothing_to_gunicorns_instance_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    # connlist's attributes are slots: gunicorn's own attribute accesses stay as they were.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def attributes(protocol_class: type[Any]) -> set[str]:
        loop = asyncio.get_running_loop()
        worker = gunicorn_asgi_check._Worker(Config(), app, {STATE_KEY: Enforcer()}, loop)
        protocol = protocol_class(worker)
        protocol.connection_made(gunicorn_asgi_check._Transport())
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0)
        names = set(vars(protocol))
        protocol.connection_lost(None)
        worker.state[STATE_KEY].cancel()
        return names

    async def main() -> tuple[set[str], set[str]]:
        return await attributes(GUNICORNS), await attributes(cls)

    theirs, ours = asyncio.run(main())
    assert ours == theirs
