"""Real uvicorn servers on 127.0.0.1 for the tests, and raw-socket clients.

A server runs in a thread with its own event loop, on a socket bound to port 0,
and stops when the ``with`` block ends.  The loop is asyncio's, or uvloop's
(which production ``uvicorn[standard]`` runs on) with
``CONNLIST_TEST_LOOP=uvloop``; ``.ci/run`` runs test_timeouts.py once so.  Timing assertions use
``time.monotonic`` on the client side.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from connlist import ConnectionsMiddleware

# --http values: the integration's protocols, and uvicorn's own for ASGI-only mode.
INTEGRATED = {
    "httptools": "connlist.uvicorn:HttpToolsProtocol",
    "h11": "connlist.uvicorn:H11Protocol",
}
PLAIN = {"httptools": "httptools", "h11": "h11"}
# uvicorn's two HTTP parsers (the keys above), and gunicorn's: its own, and
# gunicorn_h1c's where installed (``--http-parser fast``).
PARSERS = list(INTEGRATED)
GUNICORN_PARSERS = ["python"] + (["fast"] if importlib.util.find_spec("gunicorn_h1c") is not None else [])

# The size of echo_app's /large response: several MiB.
LARGE = 8 * 1024 * 1024

# "asyncio" (the default) or "uvloop": the event loop the servers run on.
LOOP = os.environ.get("CONNLIST_TEST_LOOP", "asyncio")
if LOOP not in ("asyncio", "uvloop"):
    raise RuntimeError(f"CONNLIST_TEST_LOOP must be asyncio or uvloop, got {LOOP!r}")


def new_event_loop() -> asyncio.AbstractEventLoop:
    if LOOP == "uvloop":
        import uvloop  # the test extra installs it; failing here beats silently testing asyncio

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


# How late a 408 may arrive after its deadline (the promise).
LATE = 0.25
# How early it may seem to arrive: the server's clock starts a little after
# the client's, never before.
EARLY = 0.02


@dataclass
class Running:
    port: int
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop

    def call(self, func: Any, *args: Any) -> Any:
        """Run ``func(*args)`` on the server's loop and return its result (the list is not thread-safe)."""

        async def run() -> Any:
            return func(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=5)

    @property
    def calls(self) -> list[str]:
        """The paths ``echo_app`` was asked for, in order (its lifespan state keeps them)."""
        calls: list[str] = self.server.lifespan.state[CALLS]
        return calls

    def release(self) -> None:
        """Answer the ``/hold`` requests ``echo_app`` holds, and those to come."""
        self.call(self.server.lifespan.state[RELEASE].set)


@contextlib.contextmanager
def serve(app: Any, http: str, sndbuf: int = 0, **config: Any) -> Iterator[Running]:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread; ``sndbuf``: its connections' kernel send buffer.

    (Linux gives an accepted socket the listening socket's ``SO_SNDBUF``.)
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "on", "ws": "websockets-sansio"}
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, http=http, **options))
    loops: list[asyncio.AbstractEventLoop] = []

    def run() -> None:
        loop = new_event_loop()
        loops.append(loop)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield Running(port, server, loops[0])
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# Client sockets opened by the current test; conftest closes them after it.
OPEN_SOCKETS: list[socket.socket] = []


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    OPEN_SOCKETS.append(sock)
    return sock


def close_sockets() -> None:
    _LEFTOVER.clear()
    while OPEN_SOCKETS:
        OPEN_SOCKETS.pop().close()


def read_until_closed(sock: socket.socket, limit: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and the monotonic time it closed."""
    sock.settimeout(limit)
    chunks = [_LEFTOVER.pop(sock, b"")]
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
    except ConnectionResetError:
        pass
    return b"".join(chunks), time.monotonic()


# Bytes received past the end of a response (pipelining), per socket.
_LEFTOVER: dict[socket.socket, bytes] = {}


def read_response(sock: socket.socket, limit: float = 5.0) -> bytes:
    """One complete response with a Content-Length body; keeps what follows it for the next call."""
    sock.settimeout(limit)
    data = _LEFTOVER.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data + body!r}")
        body += chunk
    if len(body) > length:
        _LEFTOVER[sock] = body[length:]
    return head + b"\r\n\r\n" + body[:length]


def is_408(data: bytes) -> bool:
    return data.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close" in data.lower()


# echo_app's lifespan state: the paths asked for, and the event ``/hold`` waits for
# (``Running.calls`` and ``Running.release`` read them from the test's thread).
CALLS = "tests.echo.calls"
RELEASE = "tests.echo.release"


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A small ASGI app: reads the whole body, answers ``ok <bytes>``; websockets echo.

    ``/hold`` reads the body, then waits for ``Running.release()`` before it answers.
    """
    state = scope.get("state")
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if state is not None:
                    state[CALLS] = []
                    state[RELEASE] = asyncio.Event()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": message.get("text") or ""})
    path = scope["path"]
    if state is not None and CALLS in state:
        state[CALLS].append(path)
    if path == "/stream":
        # Starts the response at once, without reading the body, and keeps it open.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"first chunk\n", "more_body": True})
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
    if path == "/large":
        # LARGE bytes in 256 KiB chunks (more than any socket buffers hold),
        # before reading the body, if any.
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/octet-stream"),
                    (b"content-length", b"%d" % LARGE),
                ],
            }
        )
        chunk = b"x" * (256 * 1024)
        for _ in range(LARGE // len(chunk)):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/tail":
        # ``?bytes=N`` in one send (64,000 by default): under the transport's
        # high-water mark (64 KiB), so it never pauses writing, whatever the
        # client takes.
        query = scope.get("query_string", b"")
        size = int(query[6:]) if query.startswith(b"bytes=") else 64_000
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % size)]}
        )
        await send({"type": "http.response.body", "body": b"t" * size})
        return
    if path == "/background":
        # Answers after 0.3 s, without reading the body, then keeps the app's call running (a
        # Starlette BackgroundTask's work), 1.5 s or ``?sleep=`` seconds.
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"bg"})
        query = scope.get("query_string", b"")
        await asyncio.sleep(float(query[6:]) if query.startswith(b"sleep=") else 1.5)
        return
    if path == "/busy":
        # Slow work before the body is read: the server, not the client, holds
        # the body up (1.5 s, or ``?sleep=`` seconds).
        query = scope.get("query_string", b"")
        await asyncio.sleep(float(query[6:]) if query.startswith(b"sleep=") else 1.5)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    if path == "/slow":
        await asyncio.sleep(0.3)
    elif path == "/hold":
        await state[RELEASE].wait()  # type: ignore[index]
    body = b"ok %d" % size
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def middleware(**options: Any) -> ConnectionsMiddleware:
    options.setdefault("headers_timeout", 0.5)
    options.setdefault("request_timeout", 1.0)
    return ConnectionsMiddleware(echo_app, **options)


def wait_for(predicate: Any, limit: float = 3.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
