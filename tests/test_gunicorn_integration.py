"""gunicorn's ASGI integration in memory: its self-check, its start, its handle (servers.gunicorn).

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

from connlist.core import logs
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.servers import integration, seam
from connlist.servers.gunicorn import protocol as gunicorn_asgi
from connlist.servers.gunicorn import selfcheck as gunicorn_asgi_check
from connlist.servers.gunicorn import start as gunicorn_asgi_start
from connlist.servers.integration import Checked
from connlist.servers.selfcheck import CheckFailed, Result

GUNICORNS = gunicorn_protocol.ASGIProtocol


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, fresh_checks: None) -> Iterator[None]:
    """Each test with gunicorn's own class in the worker module, and the process's records untouched.

    The start routes connlist's lines to gunicorn's error log (``logs.follow_uvicorn_logger``):
    the logger it follows, and the ``connlist`` logger's handlers and level, are restored after.
    """
    monkeypatch.setattr(gasgi, "ASGIProtocol", GUNICORNS)
    monkeypatch.delenv(integration.REQUIRE_ENV, raising=False)
    monkeypatch.setattr(logs, "_uvicorn_logger_name", logs._uvicorn_logger_name)
    saved = (list(logs.logger.handlers), logs.logger.propagate, logs.logger.level)
    yield
    logs.logger.handlers, logs.logger.propagate, level = saved
    logs.logger.setLevel(level)  # (setLevel also clears the loggers' cached levels)


def failing(monkeypatch: pytest.MonkeyPatch, failure: str = "the check's made-up failure") -> None:
    """The build and check, as on a gunicorn connlist does not work with."""
    monkeypatch.setitem(
        integration._checked, gunicorn_asgi_start.KEY, Checked(None, GUNICORNS, Result(failure))
    )


def passing(monkeypatch: pytest.MonkeyPatch) -> type[Any]:
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is not None, result.failure
    monkeypatch.setitem(integration._checked, gunicorn_asgi_start.KEY, Checked(cls, base, result))
    return cls


def test_the_self_check_passes_on_the_installed_gunicorn(gunicorn_parser: str) -> None:
    cls = gunicorn_asgi.prepare(GUNICORNS)
    # A serving worker's enforcer, handed over: the check's protocols have a hand-over of their own.
    serving = HANDOVER.enforcer = Enforcer()
    result = gunicorn_asgi_check.run_in_thread(cls, gunicorn_parser)
    assert result.passed, result.failure
    assert HANDOVER.enforcer is serving and serving.fed_by is None and serving.totals.connections == 0
    assert "a headers timeout" in result.steps and "the keep-alive timeout" in result.steps
    assert result.seconds < 1.0


def test_the_self_check_names_a_missing_hook() -> None:
    stripped = type("Stripped", (), {"connection_made": lambda self, t: None})
    with pytest.raises(CheckFailed, match=r"Stripped has no `connection_lost`, `data_received`"):
        gunicorn_asgi_check.check_static(stripped, gunicorn_asgi_check.HOOKS)


def test_a_class_that_fails_its_conversation_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    class Silent(gunicorn_asgi.prepare(GUNICORNS)):  # type: ignore[misc]
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
    assert exited.value.code == integration.REFUSAL_STATUS
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


def test_a_worker_without_a_lifespan_state_takes_the_enforcer_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    HANDOVER.enforcer = Enforcer()
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    class Bare:
        cfg = Config()
        log = gunicorn_asgi_check._SilentLog()
        asgi = None
        nr_conns = 0

    async def main() -> None:
        worker = Bare()
        worker.loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
        protocol = cls(worker)
        protocol.connection_made(_Transport())
        assert not hasattr(worker, "state")
        assert protocol._connlist is HANDOVER.enforcer
        assert protocol.connlist_request() == (None, None)
        assert protocol.connlist_reading_paused() is False
        assert protocol._connlist_responding() is False
        _close(protocol, protocol._connlist)

    asyncio.run(main())


def test_a_protocol_lost_before_it_was_made_is_gunicorns_to_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    # As gunicorn's own tests lose one: connlist's setup is at connection_made, so nothing joined.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        enforcer = Enforcer()
        worker = _worker(Config(), _body_app, enforcer)
        worker.nr_conns = 1
        protocol = cls(worker)
        protocol.connection_lost(None)
        assert protocol._closed and worker.nr_conns == 0
        assert enforcer.connections.counts()["all"] == 0

    asyncio.run(main())


def test_closes_decided_by_connlist_end_gunicorns_connection_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        enforcer = Enforcer()
        worker = _worker(Config(), _body_app, enforcer)
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
        enforcer.cancel()

    asyncio.run(main())


def test_connlist_adds_nothing_to_gunicorns_instance_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    # connlist's attributes are slots: gunicorn's own attribute accesses stay as they were.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def attributes(protocol_class: type[Any]) -> set[str]:
        enforcer = Enforcer()
        worker = _worker(Config(), _body_app, enforcer)
        protocol = protocol_class(worker)
        protocol.connection_made(gunicorn_asgi_check._Transport())
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0)
        names = set(vars(protocol))
        protocol.connection_lost(None)
        enforcer.cancel()
        return names

    async def main() -> tuple[set[str], set[str]]:
        return await attributes(GUNICORNS), await attributes(cls)

    theirs, ours = asyncio.run(main())
    assert ours == theirs


# -- the protocol's paths that real clients reach rarely, in memory -------------------


async def _body_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    more = scope["type"] == "http"
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


async def _turns(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class _Transport(gunicorn_asgi_check._Transport):
    def abort(self) -> None:
        self.closing = True


def _connected(cls: type[Any], cfg: Any, app: Any = _body_app, **options: Any) -> tuple[Any, Any, Enforcer]:
    from connlist.core.kinds import resolve

    enforcer = Enforcer(resolve(**options)) if options else Enforcer()
    worker = _worker(cfg, app, enforcer)
    protocol = cls(worker)
    transport = _Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    return protocol, transport, enforcer


def _worker(cfg: Any, app: Any, enforcer: Enforcer) -> Any:
    """A worker as gunicorn's, on the running loop, with ``enforcer`` handed over (as the middleware does)."""
    HANDOVER.enforcer = enforcer
    return gunicorn_asgi_check._Worker(cfg, app, {}, asyncio.get_running_loop())


def _close(protocol: Any, enforcer: Enforcer) -> None:
    protocol.connection_lost(None)
    task = protocol._task
    if task is not None and not task.done():
        task.cancel()
    enforcer.cancel()


def test_what_is_not_http1_is_counted_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        # uWSGI: gunicorn reads it with a stream reader, not the HTTP/1 parser.
        cfg = Config()
        cfg.set("protocol", "uwsgi")
        protocol, _transport, enforcer = _connected(cls, cfg)
        record = protocol._connlist_record
        assert record.tracked and record.responding and not record.is_active
        assert enforcer.connections.counts()["writing"] == 1
        _close(protocol, enforcer)
        # h2c with prior knowledge: gunicorn sniffs for the preface before it knows the protocol.
        cfg = Config()
        cfg.set("http_protocols", "h1,h2")
        cfg.set("http2_cleartext", "prior-knowledge")
        protocol, _transport, enforcer = _connected(cls, cfg)
        assert protocol._callback_parser is None and protocol._connlist_record.responding
        _close(protocol, enforcer)

    asyncio.run(main())


def test_an_h2c_upgrade_is_served_on_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    upgraded: list[Any] = []

    async def h2c(self: Any, request: Any) -> None:
        # gunicorn's own would speak HTTP/2 from here on.
        upgraded.append(request)

    monkeypatch.setattr(GUNICORNS, "_handle_h2c_upgrade", h2c)

    async def main() -> None:
        cfg = Config()
        cfg.set("http_protocols", "h1,h2")
        cfg.set("http2_cleartext", "upgrade")
        protocol, _transport, enforcer = _connected(cls, cfg)
        record = protocol._connlist_record
        protocol.data_received(
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        await _turns()
        assert upgraded and record.tracked and record.responding and not record.is_active
        assert protocol._connlist_phase == gunicorn_asgi.UPGRADED
        _close(protocol, enforcer)

    asyncio.run(main())


def test_a_body_after_100_continue_is_timed_from_its_first_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        protocol, transport, enforcer = _connected(cls, Config(), body_min_rate=100)
        record = protocol._connlist_record
        protocol.data_received(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
        )
        await _turns()
        # gunicorn said 100 Continue at the app's first receive(); the body is not timed yet.
        assert bytes(transport.written) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert not record.receiving_body
        assert protocol._connlist_response_written(record) is False
        protocol.data_received(b"01234")
        assert record.receiving_body and record.body_received == 5
        protocol.data_received(b"56789")
        await _turns()
        assert bytes(transport.written).endswith(b"0123456789") and not record.receiving_body
        _close(protocol, enforcer)
        # Without a minimum rate, no body is timed.
        protocol, transport, enforcer = _connected(cls, Config(), body_min_rate=0)
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01")
        await _turns()
        assert not protocol._connlist_record.receiving_body
        _close(protocol, enforcer)

    asyncio.run(main())


def test_a_malformed_request_is_gunicorns_to_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        protocol, transport, enforcer = _connected(cls, Config())
        protocol.data_received(b"GET / HTTP/1.1\r\nHost x\r\n\r\n")
        await _turns()
        assert bytes(transport.written).startswith(b"HTTP/1.1 400 ") and transport.closing
        _close(protocol, enforcer)
        assert not protocol._connlist_record.tracked

    asyncio.run(main())


def test_a_cut_marks_every_request_of_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        protocol, transport, enforcer = _connected(cls, Config())
        record = protocol._connlist_record
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01")
        await _turns()
        receiver = protocol._body_receiver
        finishing = type("Receiver", (), {"signal_disconnect": lambda self: disconnected.append(self)})()
        disconnected: list[Any] = []
        protocol._finishing_calls = {"task": finishing, "other": None}
        protocol._flow_control.pause_writing()
        protocol.connlist_close_expired()
        assert bytes(transport.written).startswith(b"HTTP/1.1 408 ") and transport.closing
        assert protocol._closed and receiver._closed and disconnected == [finishing]
        assert not protocol._flow_control.write_paused  # a send waiting to drain goes on (and is dropped)
        assert isinstance(protocol.log, gunicorn_asgi._AfterCutLog)
        protocol._connlist_mark_cut()  # twice: nothing more
        protocol._finishing_calls = {}
        _close(protocol, enforcer)
        assert not record.tracked

    asyncio.run(main())


def test_the_keep_alive_falls_back_to_gunicorns_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        protocol, _transport, enforcer = _connected(cls, Config())
        enforcer.keep_alive_timed = False  # (a keep-alive setting connlist cannot read)
        protocol._arm_keepalive_timer()
        assert protocol._keepalive_handle is not None
        protocol._cancel_keepalive_timer()
        _close(protocol, enforcer)
        # A worker's keep-alive that is not a number: gunicorn's timer, not the list.
        cfg = Config()
        worker = _worker(cfg, _body_app, Enforcer())
        worker.cfg = type(
            "Cfg", (), {"keepalive": "2", "__getattr__": lambda self, name: getattr(cfg, name)}
        )()
        protocol = cls(worker)
        protocol.connection_made(_Transport())
        assert protocol._connlist.keep_alive_timed is False
        _close(protocol, protocol._connlist)

    asyncio.run(main())


def test_a_reused_enforcer_forgets_a_timer_of_another_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    enforcer = Enforcer()

    async def serve() -> None:
        worker = _worker(Config(), _body_app, enforcer)
        protocol = cls(worker)
        protocol.connection_made(gunicorn_asgi_check._Transport())
        assert enforcer.timer_at < float("inf")  # the new connection's headers clock

    asyncio.run(serve())  # its loop ends with the timer armed
    asyncio.run(serve())  # a new loop: the old timer is forgotten, a new one armed
    enforcer.cancel()


def test_closes_of_a_connection_being_served(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        protocol, transport, enforcer = _connected(cls, Config())
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01")
        await _turns()
        assert protocol.connlist_close_idle() is False and not transport.closing  # being served
        protocol.connlist_close()
        # Closed as gunicorn closes it: the app's sends are dropped from now on.
        assert transport.closing and protocol._closed
        _close(protocol, enforcer)
        # Closed already: nothing to do.
        protocol.connlist_close()

    asyncio.run(main())


async def _early_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/early begins its response before it reads the body, /fail raises before any; the rest echo."""
    if scope["path"] == "/fail":
        raise RuntimeError("no response")
    if scope["path"] != "/early":
        await _body_app(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.body", "body": b"last"})


def test_whether_a_response_began_for_the_request_being_served(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    post = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab"

    async def main() -> None:
        protocol, transport, enforcer = _connected(cls, Config(), _early_app)
        record = protocol._connlist_record
        # Waiting for a first request, then its head arriving: none is answered.
        await _turns()
        assert protocol._connlist_response_written(record) is False
        first = post % b"/"
        protocol.data_received(first[:9])
        assert protocol._connlist_response_written(record) is False
        # Its body arriving, the app waiting for it: not answered.
        protocol.data_received(first[9:])
        await _turns()
        assert protocol._connlist_response_written(record) is False
        protocol.data_received(b"cd")
        await _turns()
        assert bytes(transport.written).endswith(b"abcd")
        # The next request's response begun before its body: answered, and a cut writes no 408.
        protocol.data_received(post % b"/early")
        await _turns()
        assert b"first" in bytes(transport.written)
        assert protocol._connlist_response_written(record) is True
        protocol.data_received(b"cd")
        await _turns()
        assert bytes(transport.written).endswith(b"last\r\n0\r\n\r\n")
        # After it, the request being served is another: not answered.
        protocol.data_received(post % b"/")
        await _turns()
        assert protocol._connlist_response_written(record) is False
        protocol.connlist_close_expired()
        assert bytes(transport.written).endswith(
            b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )
        _close(protocol, enforcer)
        # A response begun before the body, then the cut: the close alone.
        protocol, transport, enforcer = _connected(cls, Config(), _early_app)
        protocol.data_received(post % b"/early")
        await _turns()
        written = bytes(transport.written)
        assert b"first" in written
        protocol.connlist_close_expired()
        assert transport.closing and bytes(transport.written) == written
        _close(protocol, enforcer)
        # gunicorn's own 500 for an app that raised before responding: answered too.
        protocol, transport, enforcer = _connected(cls, Config(), _early_app)
        record = protocol._connlist_record
        protocol.data_received(post % b"/fail")
        await _turns()
        assert bytes(transport.written).startswith(b"HTTP/1.1 500 ")
        assert protocol._connlist_response_written(record) is True
        _close(protocol, enforcer)

    asyncio.run(main())


def test_more_of_what_is_not_http1(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def h2c(self: Any, request: Any) -> None:
        pass

    monkeypatch.setattr(GUNICORNS, "_handle_h2c_upgrade", h2c)

    async def main() -> None:
        # Sniffing for h2c's preface, gunicorn finds HTTP/1 after all: served by gunicorn, untimed,
        # its keep-alive too: no list event would tell the next request, so the list's
        # keep-alive would close it mid-request.
        cfg = Config()
        cfg.set("http_protocols", "h1,h2")
        cfg.set("http2_cleartext", "both")
        protocol, transport, enforcer = _connected(cls, cfg)
        record = protocol._connlist_record
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert bytes(transport.written).startswith(b"HTTP/1.1 200 ")
        assert protocol._connlist_phase == gunicorn_asgi.UPGRADED and not record.is_active
        assert protocol._keepalive_handle is not None  # gunicorn's own timer
        assert record.responding and record._idle_entry is None
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert bytes(transport.written).count(b"HTTP/1.1 200 ") == 2 and not transport.closing
        assert record.responding and record._idle_entry is None
        _close(protocol, enforcer)
        # An h2c upgrade request whose body comes in two reads: untimed from its headers on.
        cfg.set("http2_cleartext", "upgrade")
        protocol, transport, enforcer = _connected(cls, cfg)
        record = protocol._connlist_record
        protocol.data_received(
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 4\r\n\r\nab"
        )
        assert protocol._connlist_phase == gunicorn_asgi.UPGRADED and not record.is_active
        _close(protocol, enforcer)
        # An idle connection that leaves HTTP/1: no request more is counted.
        protocol, transport, enforcer = _connected(cls, Config())
        record = protocol._connlist_record
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert record.requests == 1 and not record.responding
        protocol._connlist_untimed(record)
        assert record.requests == 1 and record.responding
        _close(protocol, enforcer)
        # A uWSGI connection cut (the send timeout applies to every protocol): no loop to wake.
        cfg = Config()
        cfg.set("protocol", "uwsgi")
        protocol, transport, enforcer = _connected(cls, cfg)
        protocol._flow_control = None  # (as on HTTP/2 over TLS)
        protocol.connlist_abort()
        assert protocol._closed and transport.closing
        protocol.connlist_close()
        _close(protocol, enforcer)

    asyncio.run(main())


def test_a_request_in_as_a_background_call_ends_is_not_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    # An app's call left running after its response (a background task):
    # gunicorn arms the keep-alive when it ends, if its loop still waits for
    # a request.  When the next request arrived in the same turn, before the
    # loop took it, that arming is not the connection going idle: gunicorn's
    # loop cancels its timer at once, and the list must not time the request
    # it is serving as an idle connection's keep-alive.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    async def main() -> None:
        loop = asyncio.get_running_loop()
        background = loop.create_future()
        slow = loop.create_future()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            if scope["path"] == "/slow":
                await slow  # a long-poll
            await send({"type": "http.response.body", "body": b"ok"})
            if scope["path"] == "/background":
                await background

        protocol, transport, enforcer = _connected(cls, Config(), app)
        record = protocol._connlist_record
        protocol.data_received(b"GET /background HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert protocol._finishing_calls and record.responding
        # The background call's end, then the next request, in one turn.
        background.set_result(None)
        loop.call_soon(protocol.data_received, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert not protocol._finishing_calls and protocol._keepalive_handle is None  # gunicorn's, cancelled
        assert record.responding and record._idle_entry is None
        assert record.requests == 2
        slow.set_result(None)
        await _turns()
        # Its end leaves it idle, timed by the list.
        assert not record.responding and record._idle_entry is not None
        assert protocol._keepalive_handle is None
        assert bytes(transport.written).count(b"HTTP/1.1 200 ") == 2 and not transport.closing
        _close(protocol, enforcer)

    asyncio.run(main())


def test_a_close_that_leaves_response_bytes_unsent_is_the_send_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # gunicorn's close waits for its transport's buffer to drain: bytes a
    # client never reads would hold the connection for good.  Every close of
    # gunicorn's (_close_transport: a response's end that closes, its
    # keep-alive handler) hands them to the send timeout, as a stall.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    class Holding(_Transport):
        held = 0

        def get_write_buffer_size(self) -> int:
            return self.held

    async def main() -> None:
        for close in (True, False):
            protocol, _, enforcer = _connected(cls, Config(), send_timeout=1)
            transport = Holding()
            transport.protocol = protocol
            protocol.transport = transport
            record = protocol._connlist_record
            transport.held = 30_000  # what the response leaves in the transport
            request = (
                b"GET / HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n"
            )
            protocol.data_received(request)
            await _turns()
            assert transport.closing == close and record.is_stalled == close
            if close:
                # Flow control resumes (under its low-water mark) while the close waits: still timed.
                protocol.resume_writing()
                assert record.is_stalled
                transport.held = 0
                protocol.resume_writing()
                assert not record.is_stalled
            else:
                assert not record.responding and not record.is_stalled
                protocol.connlist_close_keepalive()  # the list's keep-alive close
                assert transport.closing and record.is_stalled
            _close(protocol, enforcer)
        # A protocol closed before it was made (as gunicorn's own tests close one): nothing to time.
        unmade = cls(gunicorn_asgi_check._Worker(Config(), _body_app, {}, asyncio.get_running_loop()))
        unmade.transport = Holding()
        unmade.transport.held = 10
        unmade._close_transport()
        assert unmade._closed and unmade.transport.closing
        # Nothing unsent, or a transport that cannot say: no stall.
        protocol, transport, enforcer = _connected(cls, Config(), send_timeout=1)
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await _turns()
        assert transport.closing and not protocol._connlist_record.is_stalled
        _close(protocol, enforcer)

    asyncio.run(main())


def test_addresses_as_asgi_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    class Transport(_Transport):
        def __init__(self, peer: Any, own: Any) -> None:
            super().__init__()
            self.names = {"peername": peer, "sockname": own}
            self.asked: list[str] = []

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            self.asked.append(name)
            return self.names.get(name, default)

    async def main() -> None:
        enforcer = Enforcer()
        worker = _worker(Config(), _body_app, enforcer)
        for peer, own, client, server in [
            (("10.0.0.1", 5000), ("10.0.0.2", 8000), ("10.0.0.1", 5000), ("10.0.0.2", 8000)),
            (("::1", 5000, 0, 0), ["::1", 8000, 0, 0], ("::1", 5000), ("::1", 8000)),
            ("", "/run/app.sock", "", "/run/app.sock"),
            (None, b"\0abstract", None, None),
        ]:
            protocol = cls(worker)
            transport = Transport(peer, own)
            protocol.connection_made(transport)
            record = protocol._connlist_record
            # Read from the transport when asked, not at the connection's start.
            transport.names = {}
            assert (record.client, record.server) == (None, None)
            transport.names = {"peername": peer, "sockname": own}
            transport.asked.clear()
            assert record.client == client and transport.asked == ["peername"]  # one address, one question
            assert record.server == server and transport.asked == ["peername", "sockname"]
            kept = protocol._connlist_record
            kept.keep_from_handle()  # as for a record handed to on_timeout
            _close(protocol, enforcer)
            assert kept.handle is None and (kept.client, kept.server) == (client, server)
        # A record not kept has no addresses once its connection is gone; a transport that
        # cannot tell any more (uvloop asks a socket that may be closed) has none either.
        protocol = cls(worker)
        transport = Transport(("10.0.0.1", 5000), ("10.0.0.2", 8000))
        protocol.connection_made(transport)
        record = protocol._connlist_record

        def closed(name: str, default: Any = None) -> Any:
            raise OSError(9, "Bad file descriptor")

        transport.get_extra_info = closed  # type: ignore[method-assign]
        assert (record.client, record.server) == (None, None)
        _close(protocol, enforcer)
        assert record.handle is None and (record.client, record.server) == (None, None)

    asyncio.run(main())


def test_the_check_reports_what_stopped_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = gunicorn_asgi.prepare(GUNICORNS)

    class Broken(cls):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            raise RuntimeError("a gunicorn that changed")

    assert gunicorn_asgi_check.run_in_thread(Broken, "python").failure == (
        "the scripted conversation raised RuntimeError: a gunicorn that changed"
    )
    failure = gunicorn_asgi_check.run_in_thread(cls, "nonsense").failure
    assert failure is not None and failure.startswith("the scripted conversation raised ")

    # A conversation that does not end in time: stopped, and what it left on its loop cancelled.
    async def endless(self: Any) -> None:
        asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        await asyncio.sleep(3600)

    monkeypatch.setattr(gunicorn_asgi_check._Script, "run", endless)
    monkeypatch.setattr(gunicorn_asgi_check, "LIMIT", 0.05)
    failure = gunicorn_asgi_check.run_in_thread(cls, "python").failure
    assert failure is not None and failure.startswith("the scripted conversation did not finish")

    # One that cannot even begin.
    def unconfigurable(self: Any, cls: type, parser: str) -> None:
        raise ValueError("no such setting")

    monkeypatch.setattr(gunicorn_asgi_check._Script, "__init__", unconfigurable)
    assert gunicorn_asgi_check.run_in_thread(cls, "python").failure == (
        "the scripted conversation raised ValueError: no such setting"
    )


def test_the_start_where_gunicorn_is_not_as_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parser gunicorn takes, where gunicorn cannot be asked: the python one.
    module = gunicorn_asgi_start.PROTOCOL_MODULE
    monkeypatch.setattr(gunicorn_asgi_start, "PROTOCOL_MODULE", "gunicorn.asgi.nowhere")
    assert gunicorn_asgi_start.parser_name(type("Cfg", (), {"http_parser": "auto"})()) == "python"
    monkeypatch.setattr(gunicorn_asgi_start, "PROTOCOL_MODULE", module)

    # A class that cannot be built on gunicorn's: its class statement fails at its module's import.
    package = sys.modules["connlist.servers.gunicorn"]
    monkeypatch.delitem(sys.modules, gunicorn_asgi.__name__)
    monkeypatch.delattr(package, "protocol")
    monkeypatch.setattr(seam, "SLOTS", ("connlist_mode",))
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is None and base is GUNICORNS
    assert result.failure == (
        "connlist's class cannot be built on gunicorn's ASGIProtocol: "
        "'connlist_mode' in __slots__ conflicts with class variable"
    )
    monkeypatch.setitem(sys.modules, gunicorn_asgi.__name__, gunicorn_asgi)
    monkeypatch.setattr(package, "protocol", gunicorn_asgi, raising=False)
    monkeypatch.setattr(seam, "SLOTS", gunicorn_asgi.SLOTS)
    # gunicorn's module global replaced since connlist's class was built on it.
    other = type("Other", (GUNICORNS,), {})
    monkeypatch.setattr(gunicorn_protocol, "ASGIProtocol", other)
    cls, base, result = gunicorn_asgi_start._build()
    assert cls is None and base is other
    assert result.failure is not None
    assert result.failure.startswith(
        "connlist's class cannot be built on gunicorn's ASGIProtocol: connlist's class is built on "
        "gunicorn.asgi.protocol.ASGIProtocol, not"
    )
    monkeypatch.setattr(gunicorn_protocol, "ASGIProtocol", GUNICORNS)
    # No gunicorn class to fall back on: the name cannot be given at all.
    monkeypatch.setitem(integration._checked, gunicorn_asgi_start.KEY, Checked(None, None, Result("gone")))
    with pytest.raises(ImportError, match=r"gunicorn has no gunicorn\.asgi\.protocol\.ASGIProtocol: gone"):
        gunicorn_asgi_start.resolve()
    assert gunicorn_asgi_start.for_server(required=False) == (None, "gunicorn 27.0.1: ASGIProtocol: gone")
    # The worker cannot be found: no worker module, no worker class, no running loop.
    lifespan = type("Lifespan", (), {"state": {}})()
    monkeypatch.setitem(sys.modules, "gunicorn.workers.gasgi", None)
    assert gunicorn_asgi_start.server_config(object(), {}) is None
    monkeypatch.setitem(sys.modules, "gunicorn.workers.gasgi", type("Module", (), {"ASGIWorker": None})())
    assert gunicorn_asgi_start.server_config(object(), {}) is None
    monkeypatch.setitem(sys.modules, "gunicorn.workers.gasgi", gasgi)
    assert gunicorn_asgi_start.server_config(object(), lifespan.state) is None  # no running loop


def test_connlists_worker_class(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn.config import Config

    import connlist.gunicorn
    import connlist.servers.supervisor

    ours = passing(monkeypatch)
    booted: list[str] = []
    monkeypatch.setattr(gasgi.ASGIWorker, "init_process", lambda self: booted.append(self.cfg.asgi_lifespan))
    monkeypatch.setattr(connlist.servers.supervisor, "supervised_by", lambda ppid: None)
    for lifespan, runs in (("auto", "on"), ("off", "off"), ("on", "on")):
        worker = object.__new__(connlist.gunicorn.ASGIWorker)
        worker.cfg = Config()
        worker.cfg.set("asgi_lifespan", lifespan)
        worker.ppid = 1
        worker.init_process()
        assert gasgi.ASGIProtocol is ours and booted[-1] == runs
    # A package that is not installed: what to install, when the name is used.
    with pytest.raises(ImportError, match="needs gunicorn and uvicorn-worker"):
        connlist.servers.gunicorn.workers.__getattr__("UvicornWorker")
    with pytest.raises(ImportError, match="needs gunicorn 24 or newer"):
        connlist.servers.gunicorn.workers.__getattr__("ASGIWorker")


def test_one_warning_where_gunicorn_serves_http2_or_uwsgi(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passing(monkeypatch)
    caplog.set_level(logging.WARNING, logger="connlist")
    worker = Worker()
    assert gunicorn_asgi_start.turn_on(worker, "auto").mode == "gunicorn-python"
    assert not caplog.records  # HTTP/1 only: nothing to say
    worker.cfg.http_protocols = ["h1", "h2"]
    worker.cfg.protocol = "uwsgi"
    assert gunicorn_asgi_start.turn_on(worker, "auto").mode == "gunicorn-python"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("connlist: gunicorn serves HTTP/2 and uWSGI connections too: connlist counts them")
    assert "the headers, request, body-rate and keep-alive timeouts are HTTP/1's" in line


def test_the_build_and_check_run_once_and_are_recorded_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []
    build = gunicorn_asgi_start._build

    def counted() -> Checked:
        builds.append(1)
        return build()

    monkeypatch.setattr(gunicorn_asgi_start, "_build", counted)
    assert integration.checked() is None
    first = gunicorn_asgi_start.checked()
    assert first.cls is not None, first.result.failure
    assert gunicorn_asgi_start.checked() is first and gunicorn_asgi_start.resolve() is first.cls
    assert builds == [1]
    # What the view's integration_off reads: the class passed, in this process.
    assert integration._checked == {gunicorn_asgi_start.KEY: first} and integration.checked() is True


def test_a_read_held_behind_an_upgrade_request_goes_where_gunicorn_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A read that comes before gunicorn's loop takes a websocket upgrade request is held (the
    # parser holds a complete message); at the hand-over it goes to gunicorn's parser, after the
    # request, where bare gunicorn would have buffered it, and nothing stays held.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    seen: list[bytes] = []

    async def websocket(self: Any, request: Any, sockname: Any, peername: Any) -> None:
        seen.append(bytes(self._callback_parser.remaining()))

    monkeypatch.setattr(GUNICORNS, "_handle_websocket", websocket)

    async def main() -> None:
        protocol, _transport, enforcer = _connected(cls, Config())
        protocol.data_received(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        protocol.data_received(b"early")
        assert protocol._connlist_unread == b"early"
        await _turns()
        assert seen == [b"early"] and protocol._connlist_unread is None
        _close(protocol, enforcer)

    asyncio.run(main())


def test_a_long_read_with_an_h2c_upgrade_request_hands_the_rest_to_gunicorn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fed in parts (longer than a head may be): after the upgrade request, gunicorn hands the
    # connection to HTTP/2, and the rest of the read goes to it whole, as it would unparted.
    cls = passing(monkeypatch)
    from gunicorn.config import Config

    kept: list[int] = []

    async def h2c(self: Any, request: Any) -> None:
        kept.append(len(self.reader._buffer))  # what gunicorn's HTTP/2 side starts with

    monkeypatch.setattr(GUNICORNS, "_handle_h2c_upgrade", h2c)

    async def main() -> None:
        cfg = Config()
        cfg.set("http_protocols", "h1,h2")
        cfg.set("http2_cleartext", "upgrade")
        protocol, _transport, enforcer = _connected(cls, cfg)
        request = (
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        protocol.data_received(request + b"h" * 20_000)
        await _turns()
        assert kept == [20_000] and protocol._connlist_phase == gunicorn_asgi.UPGRADED
        _close(protocol, enforcer)

    asyncio.run(main())
