"""Thousands of connections expiring at the same moment: is the worker still responsive?

Method.  A real uvicorn process (connlist's server integration, the parser
given) serves a small app.  One ordinary keep-alive client makes a request,
then N clients connect and send nothing.  Once the server lists all of them,
it is stopped with SIGSTOP until every one of their headers deadlines has
passed, then continued with SIGCONT: all N expire in the same instant.  At
that moment the ordinary client sends a request; the script reports how long
its answer took, and when each of the N got its 408 and was closed (after
SIGCONT).  connlist spreads the cut-offs over loop iterations, so the answer
should come within a few of them.

Usage::

    python3 benchmarks/mass_timeout.py                      # 9,000 connections, both parsers
    python3 benchmarks/mass_timeout.py -n 2000 --parser h11

Loopback only; bounded in connections and time (about 10 s a parser).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ports import free_port

HERE = Path(__file__).resolve().parent
PROTOCOLS = {"httptools": "connlist.uvicorn:HttpToolsProtocol", "h11": "connlist.uvicorn:H11Protocol"}


def _app() -> Any:
    """The served app (built when uvicorn imports this module as ``mass_timeout:app``)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from connlist import ConnectionsMiddleware

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    headers_timeout = float(os.environ["CONNLIST_MASS_TIMEOUT_HEADERS"])
    return Starlette(
        routes=[Route("/", hello)],
        middleware=[
            Middleware(
                ConnectionsMiddleware, headers_timeout=headers_timeout, request_timeout=2 * headers_timeout
            )
        ],
    )


if os.environ.get("CONNLIST_MASS_TIMEOUT_APP") == "1":
    app = _app()


@dataclass
class Result:
    parser: str
    connections: int
    # The ordinary request sent at SIGCONT: seconds until its whole answer.
    latency: float
    # Of the N: how many got a 408, how many were closed, and when the server
    # listed none of them any more (seconds after SIGCONT).
    got_408: int
    closed: int
    all_closed: float
    # WARNING lines the server wrote about the timeouts.
    warning_lines: int


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


def _request(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return body


@contextlib.contextmanager
def _server(parser: str, port: int, headers_timeout: float, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, CONNLIST_MASS_TIMEOUT_APP="1", CONNLIST_MASS_TIMEOUT_HEADERS=str(headers_timeout))
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "mass_timeout:app",
        "--app-dir",
        str(HERE),
        "--http",
        PROTOCOLS[parser],
        "--port",
        str(port),
        "--lifespan",
        "on",
        "--no-access-log",
        # The ordinary client waits, idle, while the others connect.
        "--timeout-keep-alive",
        "120",
        "--backlog",
        "16384",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                    _request(probe, "/")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start:\n{log.read_text()}") from None
                time.sleep(0.05)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def measure(parser: str, n: int, log: Path, headers_timeout: float = 5.0) -> Result:
    """One run: N silent connections expiring at once, and one ordinary request at that moment.

    ``headers_timeout`` must be longer than connecting the N takes.
    """
    _raise_fd_limit(n + 256)
    port = free_port()
    with _server(parser, port, headers_timeout, log) as proc:
        ordinary = socket.create_connection(("127.0.0.1", port), timeout=5)
        ordinary.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks: list[socket.socket] = []
        try:
            assert _request(ordinary, "/") == b"ok"
            first_connected = time.monotonic()
            for _ in range(n):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            last_connected = time.monotonic()
            # Until the server lists them all (the debug request's own connection included).
            deadline = time.monotonic() + 20
            while True:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as debug:
                    counts = json.loads(_request(debug, "/_connections?limit=0"))["counts"]
                if counts["all"] >= n + 2:
                    break
                if (
                    time.monotonic() > deadline
                    or counts["timed_out"]
                    or time.monotonic() - first_connected > headers_timeout
                ):
                    raise RuntimeError(f"the server lists {counts['all']} of {n + 2} connections")
                time.sleep(0.05)
            proc.send_signal(signal.SIGSTOP)
            if time.monotonic() - first_connected > headers_timeout:
                raise RuntimeError(
                    f"connecting took longer than the headers timeout ({headers_timeout}s): raise it"
                )
            # Until every one of the N is past its deadline.
            time.sleep(max(0.0, last_connected + headers_timeout + 0.3 - time.monotonic()))
            proc.send_signal(signal.SIGCONT)
            continued = time.monotonic()
            # The ordinary client asks the server, again and again, how many
            # connections it still has: the first answer is the latency, the
            # answer without the N is when the server had closed them all.
            latency = all_closed = float("nan")
            with contextlib.suppress(OSError):
                while time.monotonic() - continued < 10:
                    counts = json.loads(_request(ordinary, "/_connections?limit=0"))["counts"]
                    if latency != latency:  # nan: the first answer
                        latency = time.monotonic() - continued
                    if counts["all"] == 1:
                        all_closed = time.monotonic() - continued
                        break
            # Then what each of the N received (nothing is in a hurry now).
            received: dict[socket.socket, bytes] = {}
            closed = 0
            for sock in socks:
                sock.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := sock.recv(65536):
                        data += chunk
                    closed += 1
                received[sock] = data
        finally:
            ordinary.close()
            for sock in socks:
                sock.close()
    lines = log.read_text(errors="replace").splitlines()
    return Result(
        parser=parser,
        connections=n,
        latency=latency,
        got_408=sum(data.startswith(b"HTTP/1.1 408 ") for data in received.values()),
        closed=closed,
        all_closed=all_closed,
        warning_lines=sum(line.startswith("WARNING") and "timed out" in line for line in lines),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=9000, help="connections expiring at once (default 9000)")
    parser.add_argument("--parser", choices=[*PROTOCOLS, "both"], default="both")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    parsers = list(PROTOCOLS) if args.parser == "both" else [args.parser]
    results = []
    for name in parsers:
        log = Path(f"/tmp/connlist-mass-timeout-{name}-{os.getpid()}.log")
        results.append(measure(name, args.n, log))
        log.unlink()
    if args.json:
        print(json.dumps([asdict(result) for result in results], indent=2))
        return
    print("| parser | connections | answered in | 408s | closed | all closed after | WARNING lines |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r.parser} | {r.connections} | {r.latency * 1000:.0f} ms | {r.got_408} | {r.closed} "
            f"| {r.all_closed:.3f} s | {r.warning_lines} |"
        )


if __name__ == "__main__":
    main()
