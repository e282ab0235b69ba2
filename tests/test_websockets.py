"""Websockets in the list (issue #36): seen, counted and bounded, never cut, on real servers.

The servers are real processes started as users start them (``uvicorn`` with
each parser, ``gunicorn -k asgi``), serving ``tests/websocket_app.py`` (an
echo route at ``/ws``), under ``ulimit -n 256``: the default budget is then
160 connections and the websockets' share (``max_upgraded``) 80.  The client
is a raw-socket websocket client (``tests/ws_client.py``).  In-process
servers (``tests/servers.py``) check the hand-over on each of uvicorn's
websocket implementations, and the reset-leak proof.
"""

from __future__ import annotations

import gc
import json
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol as PlainH11
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as PlainHttpTools

from connlist import ConnectionsMiddleware
from connlist.core.checks import default_max_connections, default_max_upgraded
from tests.servers import INTEGRATED, PARSERS, PLAIN, connect, echo_app, serve, wait_for
from tests.subprocesses import PYTHON, Process, get, get_json, gunicorn_command, run_server, server_env
from tests.test_budget import Prober, closed
from tests.ws_client import WebSocket, upgrade

LIMIT = 256
# The flood: 300 upgrades held, at ulimit -n 256.
FLOOD = 300
# Open and closed one after the other: the count must come back to 0.
SEQUENCE = 10_000

# Set the descriptor limit, then become the server (``-m uvicorn`` or ``-m gunicorn``).
LAUNCH = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)
SERVERS = [*PARSERS, "gunicorn"]
MODES = {"httptools": "uvicorn-httptools", "h11": "uvicorn-h11", "gunicorn": "gunicorn-"}


@contextmanager
def ws_server(name: str, tmp_path: Path, *, limit: int = LIMIT, **options: Any) -> Iterator[Process]:
    """``name``'s server of ``tests.websocket_app`` under ``ulimit -n limit``, with these ``options``."""

    def args(port: int) -> list[str]:
        if name == "gunicorn":
            pytest.importorskip("gunicorn.asgi")
            command = gunicorn_command(port, "tests.websocket_app:app", "-k", "asgi", workers=1)[1:]
        else:
            command = [
                "-m", "uvicorn", "tests.websocket_app:app", "--http", INTEGRATED[name], "--port", str(port),
                "--log-level", "warning", "--timeout-keep-alive", str(options.pop("keep_alive", 5)),
            ]  # fmt: skip
        return [PYTHON, "-c", LAUNCH, str(limit), *command]

    env = server_env(CONNLIST_OPTIONS=json.dumps(options))
    with run_server(args, tmp_path / f"server-{name}.log", env=env) as server:
        view = get_json(server.port, "/_connections?limit=0")
        assert view["mode"].startswith(MODES[name]), view["mode"]
        yield server


def counts(port: int) -> dict[str, int]:
    view: dict[str, Any] = get_json(port, "/_connections?limit=0")
    return view["counts"]  # type: ignore[no-any-return]


def handled(port: int) -> int:
    status, body = get(port, "/ws-handled")
    assert status == 200
    return int(body)


@pytest.mark.parametrize("name", SERVERS)
def test_a_websocket_flood_past_the_share_gets_503_and_ordinary_requests_are_served(
    name: str, tmp_path: Path
) -> None:
    share = default_max_upgraded(default_max_connections(LIMIT))
    assert share == 80
    with ws_server(name, tmp_path) as server, Prober(server.port) as prober:
        with ExitStack() as held:
            statuses: dict[int, int] = {}
            for _ in range(FLOOD):
                ws = upgrade(server.port)
                statuses[ws.status] = statuses.get(ws.status, 0) + 1
                if ws.status == 101:
                    held.callback(ws.close)
                else:
                    ws.sock.close()
            # The share opened, the excess refused before the handshake: the app never saw it.
            assert statuses == {101: share, 503: FLOOD - share}, statuses
            assert handled(server.port) == share
            view = get_json(server.port, "/_connections?limit=1000")
            assert view["counts"]["upgraded"] == share
            assert view["budget"]["upgraded"] == share and view["budget"]["max_upgraded"] == share
            assert view["totals"]["upgrades"] == share
            assert view["totals"]["upgrades_refused"] == FLOOD - share
            upgraded = [entry for entry in view["all"] if entry["state"] == "upgraded"]
            assert len(upgraded) == share and {entry["path"] for entry in upgraded} == {"/ws"}
            assert all(entry["timeout"] is None for entry in upgraded)
            # Ordinary requests are served while the websockets are held.
            before = len(prober.answers)
            assert wait_for(lambda: len(prober.answers) >= before + 10, limit=10)
        # Every websocket closed: none is left in the list.
        assert wait_for(lambda: counts(server.port)["upgraded"] == 0, limit=10), counts(server.port)
    served, failed = len(prober.answers), len(prober.failures)
    assert served >= 10 and failed <= 0.01 * (served + failed), prober.failures[:5]


@pytest.mark.parametrize("name", SERVERS)
def test_upgraded_count_returns_to_zero_after_websockets_close(name: str, tmp_path: Path) -> None:
    with ws_server(name, tmp_path, max_upgraded=3) as server:
        sockets = [upgrade(server.port) for _ in range(4)]
        assert [ws.status for ws in sockets] == [101, 101, 101, 503]
        assert counts(server.port)["upgraded"] == 3
        # A closing handshake, a plain close, a reset: each leaves the list.
        sockets[0].close()
        sockets[1].sock.close()
        sockets[2].sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sockets[2].sock.close()
        sockets[3].sock.close()
        assert wait_for(lambda: counts(server.port)["upgraded"] == 0, limit=10), counts(server.port)
        assert counts(server.port)["all"] == 1  # the view's own
        # And the share is free again.
        ws = upgrade(server.port)
        assert ws.status == 101 and ws.echo("again")
        ws.close()


def test_ten_thousand_websockets_in_sequence_leave_none_behind(
    parser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server is not under coverage.py (scripts/test measures the subprocesses through this
    # variable): the other tests here run the same paths measured, and ten thousand times
    # measured would be most of this module's time.
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
    with ws_server(parser, tmp_path) as server:
        for i in range(SEQUENCE):
            ws = upgrade(server.port)
            assert ws.status == 101, i
            if i % 1000 == 0:
                assert ws.echo(str(i))
            ws.close()
        assert wait_for(lambda: counts(server.port)["upgraded"] == 0, limit=10), counts(server.port)
        view = get_json(server.port, "/_connections?limit=0")
        assert view["totals"]["upgrades"] == SEQUENCE
        assert view["budget"]["occupied"] == 1
        assert handled(server.port) == SEQUENCE


class Talker:
    """A busy websocket: a message every 20 ms, each echoed, in a thread, until stopped."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.echoed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.ws.echo(f"message {self.echoed}"):
                    raise AssertionError(f"message {self.echoed} not echoed")
                self.echoed += 1
                self._stop.wait(0.02)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Talker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("name", SERVERS)
def test_websockets_busy_or_quiet_are_never_cut(name: str, tmp_path: Path) -> None:
    # Every timeout short, and a budget of a few connections under pressure:
    # what cuts an HTTP connection leaves a websocket alone.
    options = {
        "headers_timeout": 1,
        "request_timeout": 1,
        "send_timeout": 1,
        "body_grace": 1,
        "max_connections": 8,
        "max_upgraded": 4,
    }
    with ws_server(name, tmp_path, **options) as server:
        busy, quiet = upgrade(server.port), upgrade(server.port)
        assert busy.status == quiet.status == 101
        with Talker(busy) as talker:
            # A silent HTTP connection is cut at the headers timeout: the sweep ran past it.
            silent = connect(server.port)
            assert closed(silent, 5) is not None
            # Over the budget: silent connections are let go, none of the websockets.
            flood = [connect(server.port) for _ in range(12)]
            assert wait_for(lambda: all(closed(sock, 0.05) is not None for sock in flood), limit=10)
            view = get_json(server.port, "/_connections?limit=0")
            assert view["totals"]["headers_evictions"] + view["totals"]["headers_timeouts"] >= 12
            assert wait_for(lambda: talker.echoed >= 100, limit=20), talker.error
        assert talker.error is None, talker.error
        assert quiet.echo("still here") and busy.echo("still here")
        assert counts(server.port)["upgraded"] == 2
        busy.close()
        quiet.close()


# -- in-process: every websocket implementation of uvicorn's ----------------------


@pytest.mark.parametrize(
    "ws",
    [
        # uvicorn's implementation on websockets' legacy API: both warn that it is deprecated.
        pytest.param(
            "websockets",
            marks=[
                pytest.mark.filterwarnings("ignore::DeprecationWarning"),
                pytest.mark.filterwarnings("ignore:The `websockets` implementation is deprecated"),
            ],
        ),
        "websockets-sansio",
        "wsproto",
    ],
)
def test_each_websocket_implementation_holds_and_releases_the_record(parser: str, ws: str) -> None:
    app = ConnectionsMiddleware(echo_app, max_upgraded=2)
    with serve(app, INTEGRATED[parser], ws=ws) as running:
        enforcer = app.enforcer
        sockets = [upgrade(running.port) for _ in range(3)]
        assert [s.status for s in sockets] == [101, 101, 503]
        assert sockets[0].echo("hello")
        records = running.call(lambda: [c for c in enforcer.connections.all() if c.is_upgraded])
        assert len(records) == 2 and all(r.handle is None and r.path == "/ws" for r in records)
        for s in sockets:
            s.close()
        assert wait_for(lambda: running.call(lambda: len(enforcer.connections)) == 0)
        assert running.call(lambda: enforcer.connections.occupied) == 0


# -- the reset leak: uvicorn's keep-alive timer after a reset -----------------------

RESETS = 50


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await echo_app(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def alive(cls: type, server_state: object) -> int:
    """Protocols of ``cls`` of the server with ``server_state`` still referenced after a full collection."""
    gc.collect()
    mine = [obj for obj in gc.get_objects() if isinstance(obj, cls)]
    return sum(1 for obj in mine if getattr(obj, "server_state", None) is server_state)


def reset_after_response(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        data += sock.recv(4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, not a FIN


@pytest.mark.parametrize("integrated", [True, False], ids=["connlist", "bare"])
def test_connections_reset_after_a_response_are_freed_at_once(parser: str, integrated: bool) -> None:
    """uvicorn's ``connection_lost`` cancels its keep-alive timer only when ``exc is None``.

    After a reset the timer (and the protocol it refers to) stays until it
    fires: ``--timeout-keep-alive`` later.  connlist's protocol arms no such
    timer (the list times the keep-alive), so the protocol goes at once.
    """
    plain = {"httptools": PlainHttpTools, "h11": PlainH11}[parser]
    app: Any = ConnectionsMiddleware(hello) if integrated else hello
    http = INTEGRATED[parser] if integrated else PLAIN[parser]
    with serve(app, http, timeout_keep_alive=600) as running:
        for _ in range(RESETS):
            reset_after_response(running.port)
        state = running.server.server_state
        assert wait_for(lambda: not running.call(lambda: len(state.connections)), limit=10)
        held = alive(plain, state)
        if integrated:
            assert held == 0
            assert running.call(lambda: len(app.enforcer.connections)) == 0
        else:
            # The reference: every protocol is still held by its keep-alive timer.
            assert held == RESETS
        print(f"\n{parser} {'connlist' if integrated else 'bare'}: {held} of {RESETS} reset protocols held")
