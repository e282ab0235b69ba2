"""One client against a worker's memory: the worker's RSS, bare against connlist, on each server.

A timeout bounds how long a client may take; it does not bound how much
it may make a worker hold.  This script serves ``benchmarks/memory_apps.py``'s
app (``GET /`` answers ``Hello, world!``, ``POST /slow`` sleeps 50 ms and
answers) on 127.0.0.1, started as a user starts it, and attacks it from one
client on loopback.  The servers (``--servers``):

``httptools``  ``python -m uvicorn memory_apps:APP --http httptools`` (what ``uvicorn[standard]`` runs);
``h11``        the same with ``--http h11``;
``gunicorn``   gunicorn's own ASGI worker, one worker: ``python -m gunicorn -k asgi -w 1 memory_apps:APP``
               (``benchmarks/gunicorn_asgi.py``: its parser named, ``python``, its control socket off);
``gunicorn-fast``  the same with ``--http-parser fast`` (gunicorn_h1c, what ``auto`` picks where it
               is installed).

The setups (``--setups``): ``bare``, the app alone, and ``connlist``, the
app in ``ConnectionsMiddleware()`` with its defaults and no flag (the
middleware turns the server integration on at the lifespan startup; the
mode its debug view reports is checked before the attack).

The attacks (``--attacks``), each on a fresh server, each bounded in bytes
and in time (``--seconds``, default 15):

``head-lines``
    ``GET / HTTP/1.1`` and a head of 8-byte header lines (``X: aaa\\r\\n``)
    sent as fast as the server takes them, never ended;
``huge-header``
    one header whose value never ends;
``endless-url``
    ``GET /`` followed by a URL that never ends;
``pipelining``
    pipelined ``POST /slow`` requests (a 5-byte body) sent as fast as the
    server takes them for ``--seconds``, while a reader thread counts the
    responses;
``many-heads``
    100 clients, each on its own connection, pushing 2 MiB of header lines
    at once, while an ordinary client asks ``GET /`` on a fresh connection
    every 0.2 s (3 s timeout).

A head attack sends at most 32 MiB (what the kernel's buffers take counts as
sent); then it sends no more but keeps the connection open, as an attacker
would, until the time is up or the server closes it.  The worker's RSS
(uvicorn's process; gunicorn's worker, not its arbiter) is sampled every
0.25 s; the peak is the largest sample, or the worker's ``VmHWM`` when that
grew during the attack.  For each server, setup and attack the report gives
the RSS at the start, the peak and the growth, what the client got to send
before the server closed or reset the connection, the first status line it
received, and when the server closed; the responses answered for
``pipelining``, the ordinary client's answers and slowest answer for
``many-heads``.  uvicorn and gunicorn run on their default loop (uvloop
where it is installed).

Usage::

    python3 benchmarks/memory.py                                   # the whole matrix (about 4.5 minutes)
    python3 benchmarks/memory.py --seconds 5                       # shorter attacks (about 2 minutes)
    python3 benchmarks/memory.py --servers httptools --attacks head-lines,pipelining --json memory.json

Leave 5 GB of memory free: bare uvicorn with httptools held about 4 GB
for ``many-heads`` here, 1.6 GB for 15 s of ``pipelining``.  Loopback only;
no kernel setting is changed.  Every socket has a timeout,
every attack a deadline, and every server is stopped (its whole process
group) when its attack ends.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

import gunicorn_asgi
from attacks import version
from flood import debug_view
from ports import free_port

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
MIB = 1024 * 1024

SERVERS = {
    "httptools": "uvicorn (httptools)",
    "h11": "uvicorn (h11)",
    "gunicorn": "gunicorn -k asgi",
    "gunicorn-fast": "gunicorn -k asgi (fast parser)",
}
SETUPS = {"bare": "memory_apps:bare", "connlist": "memory_apps:with_connlist"}
# The mode connlist's debug view must report on each server.
MODES = {
    "httptools": "uvicorn-httptools",
    "h11": "uvicorn-h11",
    "gunicorn": gunicorn_asgi.MODE,
    "gunicorn-fast": "gunicorn-fast",
}
ATTACKS = ("head-lines", "huge-header", "endless-url", "pipelining", "many-heads")

# The head attacks: what is sent first, then the piece repeated after it.
LINE = b"X: aaa\r\n"  # one 8-byte header line
PIECE = 64 * 1024
HEADS = {
    "head-lines": (b"GET / HTTP/1.1\r\nHost: memory\r\n", LINE * (PIECE // len(LINE))),
    "huge-header": (b"GET / HTTP/1.1\r\nHost: memory\r\nX-Huge: ", b"a" * PIECE),
    "endless-url": (b"GET /", b"a" * PIECE),
}
# What one head attack may send, counting what the kernel's buffers take.
HEAD_LIMIT = 32 * MIB
PIPELINED = b"POST /slow HTTP/1.1\r\nHost: memory\r\nContent-Length: 5\r\n\r\nhello"
# Requests per send of the pipelining client, and the most it sends in all.
PIPELINE_BATCH = 1000
PIPELINE_MAX = 2_000_000
MANY = 100
MANY_BYTES = 2 * MIB
PROBE_INTERVAL = 0.2
PROBE_TIMEOUT = 3.0
SAMPLE_INTERVAL = 0.25
# A blocking socket call waits no longer than this; connecting, a little more.
SOCKET_TIMEOUT = 0.25
CONNECT_TIMEOUT = 5.0
# A server's startup on a loaded two-core machine, and its stop before SIGKILL.
START_LIMIT = 30.0
STOP_LIMIT = 3.0
HELLO = b"Hello, world!"


class BenchError(Exception):
    """A case cannot run (the server did not start, connlist is not in the mode it is run for, ...)."""


# -- the server ----------------------------------------------------------------------


class Server:
    """One server subprocess on a free port, in a process group of its own; ``stop()`` always ends it."""

    def __init__(self, server: str, setup: str) -> None:
        self.server = server
        self.setup = setup
        self.port = free_port()
        app = SETUPS[setup]
        if server == "gunicorn":
            command = gunicorn_asgi.command(app, self.port)
        elif server == "gunicorn-fast":
            command = gunicorn_asgi.command(app, self.port, parser="fast")
        else:
            command = [
                PYTHON, "-m", "uvicorn", app, "--http", server,
                "--host", "127.0.0.1", "--port", str(self.port),
            ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=HERE,
            env=env,
            start_new_session=True,
        )
        self.worker = self.process.pid
        self.view: dict[str, Any] = {}

    def output(self, limit: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_LIMIT
        while not probe_once(self.port, 2.0)[0]:
            if self.process.poll() is not None:
                raise BenchError(f"the server exited with status {self.process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise BenchError(f"no answer within {START_LIMIT:g} s:\n{self.output()}")
            time.sleep(0.1)
        # One request to /slow too, so that what its first call loads is not counted as the attack's.
        status = request(self.port, b"POST /slow HTTP/1.1\r\nHost: memory\r\nContent-Length: 2\r\n\r\nhi")
        if not status.startswith("HTTP/1.1 200"):
            raise BenchError(f"POST /slow answered {status!r}")
        if self.server.startswith("gunicorn"):
            children = psutil.Process(self.process.pid).children()
            if len(children) != 1:
                raise BenchError(f"gunicorn's arbiter has {len(children)} children, not one worker")
            self.worker = children[0].pid
        if self.setup == "connlist":
            self.view = debug_view(self.port) or {}
            mode = self.view.get("mode")
            if mode != MODES[self.server]:
                off = self.view.get("integration_off")
                raise BenchError(f"connlist runs in mode {mode!r}, not {MODES[self.server]}: {off}")

    def worker_pid(self) -> int | None:
        """The worker's pid now (gunicorn's arbiter may have replaced it), None if there is none."""
        if not self.server.startswith("gunicorn"):
            return self.process.pid if self.process.poll() is None else None
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return None
        return children[0].pid if children else None

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_LIMIT)
        # The whole group: gunicorn's worker too, and a uvicorn still busy with what it buffered.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_LIMIT)
        self.log.close()


@contextlib.contextmanager
def serve(server: str, setup: str) -> Iterator[Server]:
    running = Server(server, setup)
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def request(port: int, data: bytes, timeout: float = PROBE_TIMEOUT) -> str:
    """Send ``data`` on a fresh connection; the status line of the answer ("" if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n" not in received and len(received) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    return status_line(received) or ""


def probe_once(port: int, timeout: float) -> tuple[bool, float]:
    """``GET /`` on a fresh connection: whether ``Hello, world!`` came back within ``timeout``, and when."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while HELLO not in data:
                sock.settimeout(max(timeout - (time.monotonic() - started), 0.01))
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            ok = data.startswith(b"HTTP/1.1 200") and HELLO in data
    except OSError:
        ok = False
    return ok, time.monotonic() - started


def status_line(data: bytes) -> str | None:
    if not data:
        return None
    return data.split(b"\r\n", 1)[0][:80].decode("latin-1")


# -- the worker's memory ---------------------------------------------------------------


def vm_hwm(pid: int) -> int | None:
    """The process's peak RSS so far (``VmHWM``), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Sampler:
    """The worker's RSS every ``SAMPLE_INTERVAL`` seconds, in a thread, from the attack's start."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.first = server.worker
        self.started = time.monotonic()
        self.samples: list[tuple[float, float]] = []
        self.workers: set[int] = {server.worker}
        self.start_rss = self.rss() or 0
        self.start_hwm = vm_hwm(self.first) or 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def rss(self) -> int | None:
        pid = self.server.worker_pid()
        if pid is None:
            return None
        self.workers.add(pid)
        try:
            rss: int = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None
        self.samples.append((round(time.monotonic() - self.started, 2), round(rss / MIB, 1)))
        return rss

    def run(self) -> None:
        while not self.stopping.wait(SAMPLE_INTERVAL):
            self.rss()

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(2)
        self.rss()

    def peak_mb(self) -> float:
        peak = max((mb for _, mb in self.samples), default=self.start_rss / MIB)
        hwm = vm_hwm(self.first)
        if hwm is not None and hwm > self.start_hwm:
            # The kernel's own peak: it misses nothing between two samples.
            peak = max(peak, hwm / MIB)
        return peak


# -- the attacks -------------------------------------------------------------------------


@dataclass
class Push:
    """What one connection sent, and what it saw of the server."""

    sent: int = 0
    status: str | None = None
    ended: str | None = None  # "closed" (the server's FIN), "reset", or None: open at the deadline
    ended_after: float | None = None


def push(
    sock: socket.socket, prefix: bytes, piece: bytes, limit: int, started: float, deadline: float
) -> Push:
    """Send ``prefix`` then ``piece`` again and again, up to ``limit`` bytes, reading whatever comes back.

    Returns when the server closes or resets the connection, or at
    ``deadline``: after ``limit`` bytes the connection is kept open, silent.
    """
    sock.setblocking(False)
    result = Push()
    received = b""
    pending = memoryview(prefix)
    whole = memoryview(piece)
    while (left := deadline - time.monotonic()) > 0:
        sending = result.sent < limit
        readable, writable, _ = select.select([sock], [sock] if sending else [], [], min(left, 0.1))
        if readable:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                result.ended = "reset"
                break
            if data == b"":
                result.ended = "closed"
                break
            if data and len(received) < 4096:
                received += data
        if writable and sending:
            if not pending:
                pending = whole[: limit - result.sent]
            try:
                sent = sock.send(pending)
            except BlockingIOError:
                sent = 0
            except OSError:
                # The reset came after what the server answered, maybe still unread.
                received += drain(sock)
                result.ended = "reset"
                break
            result.sent += sent
            pending = pending[sent:]
    if result.ended is not None:
        result.ended_after = time.monotonic() - started
    result.status = status_line(received)
    return result


def drain(sock: socket.socket) -> bytes:
    """What a non-blocking socket still has to read, up to 4 KiB."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < 4096 and (chunk := sock.recv(4096)):
            data += chunk
    return data


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)


@dataclass
class Probe:
    ok: int = 0
    failed: int = 0
    slowest: float = 0.0  # the slowest answer (failures not counted: each took PROBE_TIMEOUT or failed)


def run_probe(port: int, stopping: threading.Event, result: Probe) -> None:
    next_at = time.monotonic()
    while not stopping.is_set():
        ok, took = probe_once(port, PROBE_TIMEOUT)
        if ok:
            result.ok += 1
            result.slowest = max(result.slowest, took)
        else:
            result.failed += 1
        next_at += PROBE_INTERVAL
        stopping.wait(max(next_at - time.monotonic(), 0))


@dataclass
class Result:
    server: str
    setup: str
    attack: str
    mode: str | None = None
    # The head limit connlist's view reports, where it has one.
    max_header_size: int | None = None
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_end_mb: float = 0.0
    growth_mb: float = 0.0
    sent_bytes: int = 0
    status: str | None = None
    ended: str | None = None
    ended_after: float | None = None
    # pipelining
    requests_sent: int | None = None
    answered: int | None = None
    # many-heads: the clients' first status lines (counted), how many the server closed or reset,
    # the last of those closes, and the ordinary client
    statuses: dict[str, int] | None = None
    clients_ended: int | None = None
    probe: Probe | None = None
    # gunicorn's arbiter replaced its worker during the attack
    workers_seen: int = 1
    totals: dict[str, int] | None = None
    samples: list[tuple[float, float]] = field(default_factory=list)
    error: str | None = None


def head_attack(port: int, attack: str, seconds: float, result: Result) -> None:
    prefix, piece = HEADS[attack]
    started = time.monotonic()
    with connect(port) as sock:
        pushed = push(sock, prefix, piece, HEAD_LIMIT, started, started + seconds)
    result.sent_bytes = pushed.sent
    result.status = pushed.status
    result.ended = pushed.ended
    result.ended_after = pushed.ended_after


def pipelining(port: int, seconds: float, result: Result) -> None:
    started = time.monotonic()
    deadline = started + seconds
    stopping = threading.Event()
    seen: dict[str, Any] = {"answered": 0, "first": b"", "ended": None, "after": None}

    def read(sock: socket.socket) -> None:
        tail = b""
        while not stopping.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                seen["ended"], seen["after"] = "reset", time.monotonic() - started
                return
            if not data:
                seen["ended"], seen["after"] = "closed", time.monotonic() - started
                return
            if len(seen["first"]) < 4096:
                seen["first"] += data
            # A status line split between two reads is counted once: the tail is shorter than it.
            both = tail + data
            seen["answered"] += both.count(b"HTTP/1.1 ")
            tail = both[-8:]

    batch = memoryview(PIPELINED * PIPELINE_BATCH)
    sent = 0
    with connect(port) as sock:
        sock.settimeout(SOCKET_TIMEOUT)
        reader = threading.Thread(target=read, args=(sock,), daemon=True)
        reader.start()
        try:
            pending = batch[:0]
            while (
                time.monotonic() < deadline and seen["ended"] is None and sent < PIPELINE_MAX * len(PIPELINED)
            ):
                if not pending:
                    pending = batch
                try:
                    count = sock.send(pending)
                except TimeoutError:
                    continue
                except OSError:
                    break
                sent += count
                pending = pending[count:]
            # The reader counts until the deadline, also after a send failed (answers on their way).
            while time.monotonic() < deadline and seen["ended"] is None:
                time.sleep(0.05)
        finally:
            stopping.set()
            reader.join(SOCKET_TIMEOUT + 1)
    result.sent_bytes = sent
    result.requests_sent = sent // len(PIPELINED)
    result.answered = seen["answered"]
    result.status = status_line(seen["first"])
    result.ended = seen["ended"]
    result.ended_after = seen["after"]


def many_heads(port: int, seconds: float, result: Result) -> None:
    prefix, piece = HEADS["head-lines"]
    pushes: list[Push] = []
    lock = threading.Lock()
    timing: dict[str, float] = {}

    def go() -> None:
        # Run once, when every client has connected (or given up): the clock starts as they push.
        timing["started"] = time.monotonic()
        timing["deadline"] = timing["started"] + seconds

    gate = threading.Barrier(MANY + 1, action=go, timeout=CONNECT_TIMEOUT * 2)

    def client() -> None:
        sock = None
        with contextlib.suppress(OSError):
            sock = connect(port)
        try:
            # Connected, all of them: then every client pushes at once.
            gate.wait()
        except threading.BrokenBarrierError:
            while "deadline" not in timing:
                time.sleep(0.01)
        if sock is None:
            return
        with sock:
            pushed = push(sock, prefix, piece, MANY_BYTES, timing["started"], timing["deadline"])
        with lock:
            pushes.append(pushed)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(MANY)]
    for thread in clients:
        thread.start()
    probe = Probe()
    stopping = threading.Event()
    prober = threading.Thread(target=run_probe, args=(port, stopping, probe), daemon=True)
    try:
        gate.wait()
    except threading.BrokenBarrierError:
        go()
    prober.start()
    for thread in clients:
        thread.join(max(timing["deadline"] - time.monotonic(), 0) + 2)
    # The ordinary client asks until the time is up, also when the server has closed every attacker.
    stopping.wait(max(timing["deadline"] - time.monotonic(), 0))
    stopping.set()
    prober.join(PROBE_TIMEOUT + 1)
    ended = [pushed for pushed in pushes if pushed.ended is not None]
    result.sent_bytes = sum(pushed.sent for pushed in pushes)
    result.statuses = dict(
        Counter(pushed.status.split(" ", 2)[1] if pushed.status else "none" for pushed in pushes)
    )
    result.status = next((pushed.status for pushed in pushes if pushed.status), None)
    result.clients_ended = len(ended)
    result.ended_after = max((pushed.ended_after or 0.0 for pushed in ended), default=None)
    result.probe = probe


def run_case(server: str, setup: str, attack: str, seconds: float) -> Result:
    result = Result(server, setup, attack)
    try:
        with serve(server, setup) as running:
            result.mode = running.view.get("mode")
            result.max_header_size = running.view.get("max_header_size")
            with Sampler(running) as sampler:
                if attack in HEADS:
                    head_attack(running.port, attack, seconds, result)
                elif attack == "pipelining":
                    pipelining(running.port, seconds, result)
                else:
                    many_heads(running.port, seconds, result)
            result.rss_start_mb = sampler.start_rss / MIB
            result.rss_peak_mb = sampler.peak_mb()
            result.rss_end_mb = sampler.samples[-1][1] if sampler.samples else 0.0
            result.growth_mb = result.rss_peak_mb - result.rss_start_mb
            result.samples = sampler.samples
            result.workers_seen = len(sampler.workers)
            if setup == "connlist":
                view = debug_view(running.port)
                result.totals = None if view is None else view.get("totals")
    except (BenchError, OSError, psutil.Error) as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


# -- the report --------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def row(result: Result) -> list[str]:
    label = [SERVERS[result.server], result.setup]
    if result.error is not None:
        return [*label, f"error: {result.error.splitlines()[0][:100]}"]
    cells = [
        *label,
        f"{result.rss_start_mb:.0f}",
        f"{result.rss_peak_mb:.0f}",
        f"{result.growth_mb:+.0f}",
        f"{result.sent_bytes / MIB:.1f}",
    ]
    if result.attack == "many-heads":
        statuses = ", ".join(f"{code} x{count}" for code, count in sorted((result.statuses or {}).items()))
        probe = result.probe or Probe()
        cells += [
            statuses or "-",
            f"{result.clients_ended}/{MANY}, last {_s(result.ended_after)}",
            f"{probe.ok}/{probe.ok + probe.failed}",
            f"{probe.slowest * 1000:.0f} ms" if probe.ok else "-",
        ]
    else:
        ended = "open" if result.ended is None else f"{result.ended}, {_s(result.ended_after)}"
        cells += [result.status or "none", ended]
        if result.attack == "pipelining":
            cells += [f"{result.requests_sent:,}", f"{result.answered:,}"]
    if result.workers_seen > 1:
        cells[0] += f" (worker replaced: {result.workers_seen} seen)"
    return cells


def table(attack: str, results: list[Result]) -> str:
    header = ["server", "setup", "RSS start MB", "peak MB", "growth MB", "sent MiB"]
    if attack == "many-heads":
        header += ["attackers' first status", "closed or reset", "ordinary client answered", "slowest answer"]
    else:
        header += ["first status received", "server ended it"]
        if attack == "pipelining":
            header += ["requests sent", "answered"]
    lines = [f"### {attack}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for result in results:
        cells = row(result)
        cells += [""] * (len(header) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def names(value: str, known: Any, option: str) -> list[str]:
    chosen = [name for name in value.split(",") if name]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        sys.exit(f"{option}: {', '.join(unknown) or 'none given'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(chosen))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Unwind (SystemExit), so that the running server is stopped too.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help="comma-separated, of: " + ", ".join(SERVERS)
    )
    parser.add_argument(
        "--setups", default=",".join(SETUPS), help="comma-separated, of: " + ", ".join(SETUPS)
    )
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help="comma-separated, of: " + ", ".join(ATTACKS)
    )
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="the time bound of each attack (default 15)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every result here")
    args = parser.parse_args(argv)
    servers = names(args.servers, SERVERS, "--servers")
    setups = names(args.setups, SETUPS, "--setups")
    attacks = names(args.attacks, ATTACKS, "--attacks")
    if not 1 <= args.seconds <= 600:
        parser.error("--seconds must be between 1 and 600")
    if not gunicorn_asgi.installed():
        for name in [name for name in servers if name.startswith("gunicorn")]:
            print(f"gunicorn's ASGI worker is not installed: {name} left out", file=sys.stderr)
            servers.remove(name)
    if "gunicorn-fast" in servers and importlib.util.find_spec("gunicorn_h1c") is None:
        print("gunicorn_h1c is not installed: gunicorn-fast left out", file=sys.stderr)
        servers.remove("gunicorn-fast")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    info = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        **{
            name: version(name) for name in ("uvicorn", "httptools", "h11", "uvloop", "gunicorn", "starlette")
        },
        "connlist": version("connlist"),
    }
    print(
        ", ".join(f"{name} {value}" for name, value in info.items() if value is not None)
        + f"; attacks of {args.seconds:g} s on 127.0.0.1",
        flush=True,
    )
    results: list[Result] = []
    started = time.monotonic()
    for attack in attacks:
        for server in servers:
            for setup in setups:
                result = run_case(server, setup, attack, args.seconds)
                results.append(result)
                print(
                    f"[{time.monotonic() - started:4.0f}s] {attack} | " + " | ".join(row(result)),
                    flush=True,
                )
    print()
    for attack in attacks:
        print(table(attack, [result for result in results if result.attack == attack]))
        print()
    print(
        f"One client on 127.0.0.1, a fresh server per attack; RSS of the worker process sampled every "
        f"{SAMPLE_INTERVAL:g} s (peak: the largest sample, or VmHWM when it grew); a head attack sends "
        f"at most {HEAD_LIMIT // MIB} MiB, then holds the connection until {args.seconds:g} s or the "
        f"server's close; many-heads: {MANY} clients x {MANY_BYTES // MIB} MiB of head, the ordinary "
        f"client GET / every {PROBE_INTERVAL:g} s ({PROBE_TIMEOUT:g} s timeout)."
    )
    if args.json:
        report = {
            "machine": info,
            "settings": {
                "seconds": args.seconds,
                "head_limit": HEAD_LIMIT,
                "many": MANY,
                "many_bytes": MANY_BYTES,
                "sample_interval": SAMPLE_INTERVAL,
            },
            "results": [asdict(result) for result in results],
        }
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
