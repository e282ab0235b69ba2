"""Connection floods over the worker's file descriptor limit, and an ordinary client during them.

A timeout bounds how long a slow client is held, not how many are held at
once: a flood opens connections faster than any timeout frees them, and a
worker has ``ulimit -n`` descriptors.  This script starts each server under
a descriptor limit (``--limits``, default 1024 and 4096: the soft and hard
``RLIMIT_NOFILE`` of the server process), floods it on 127.0.0.1, and runs
an ordinary client meanwhile: ``GET /`` on a fresh connection every 0.5 s,
3 s timeout, counting the answers (``200``), the failures, and the slowest
answer.

The attacks (``--attacks``):

``slowloris``
    ``slowhttptest -H -c 3000 -r 500 -i 10``: 3,000 connections at 500 a
    second whose headers never end (a header line every 10 s); slowhttptest
    opens new ones as the server closes them, up to 3,000 in all;
``keepalive``
    3,000 clients at 500 a second that each make one request and keep the
    connection silently (this script, in a subprocess: ``--keepalive-client``);
    a client whose connection the server closes connects again, so the
    flood stays at 3,000;
``mix``
    under the limit: 300 slowloris connections (``-c 300 -r 100``) and 300
    keep-alive clients at once;
``websocket``
    3,000 clients at 500 a second that each ask to upgrade ``/ws`` to a
    websocket and hold what they get open, silent (this script, in a
    subprocess: ``--websocket-client``); a client answered otherwise than
    ``101`` (connlist's ``503`` past ``max_upgraded``), or whose websocket
    the server closes, asks again, so the flood stays at 3,000.  A websocket
    is never timed out, by uvicorn or by connlist: only a bound on how many
    there are keeps the worker serving.

The servers (``--servers``), each a subprocess on a free port serving
``benchmarks/attack_apps.py``'s app (``GET /`` answers ``Hello, world!``, ``/ws`` is a websocket echo):

``uvicorn``                bare uvicorn, httptools, the app alone;
``connlist``               ``--http connlist.uvicorn:HttpToolsProtocol``, ConnectionsMiddleware at its
                           defaults (``max_connections`` derived from the limit);
``connlist-h11``           the same with ``connlist.uvicorn:H11Protocol``;
``connlist-short``         httptools, ``headers_timeout=10``;
``gunicorn``               gunicorn's own ASGI worker (if installed), bare: ``gunicorn -k asgi -w 1``
                           (``benchmarks/gunicorn_asgi.py``), the app alone;
``gunicorn-connlist``      the same, the app in ConnectionsMiddleware at its defaults, no connlist
                           flag (the middleware turns the integration on at the lifespan startup);
``nginx``                  nginx (if installed) answering ``GET /`` itself, one worker,
                           ``worker_connections`` = the limit.

Every connlist server must report the mode it is run for (``uvicorn-httptools``,
``uvicorn-h11``, ``gunicorn-python``) before it is flooded.  uvicorn and
gunicorn run on their default loop (uvloop when installed; ``--loop asyncio``
to choose asyncio's: uvicorn's ``--loop``, gunicorn's ``--asgi-loop``).  Each
case runs ``--duration`` seconds (default 30) of attack; the attack stops by
itself (slowhttptest's ``-l``, the keep-alive client's own deadline) and the
server is stopped after it.  The report counts the server's log lines about
descriptors (asyncio's ``socket.accept() out of system resource``, nginx's
``Too many open files``, connlist's one line) and, for connlist, what the
debug view says went to make room.

Usage::

    python3 benchmarks/flood.py                               # every case (about 40 min)
    python3 benchmarks/flood.py --servers connlist,connlist-h11 --limits 1024 --attacks slowloris,keepalive
    python3 benchmarks/flood.py --servers gunicorn,gunicorn-connlist --limits 256   # gunicorn -k asgi
    python3 benchmarks/flood.py --markdown > table.md         # the table of docs/comparison.md

Loopback only, bounded in connections and time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gunicorn_asgi
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

SERVERS = ("uvicorn", "connlist", "connlist-h11", "connlist-short", "gunicorn", "gunicorn-connlist", "nginx")
# The servers with connlist, and the mode each must report.
CONNLIST_MODES = {
    "connlist": "uvicorn-httptools",
    "connlist-h11": "uvicorn-h11",
    "connlist-short": "uvicorn-httptools",
    "gunicorn-connlist": gunicorn_asgi.MODE,
}
ATTACKS = ("slowloris", "keepalive", "mix", "websocket")
LIMITS = (1024, 4096)

FLOOD = 3000
FLOOD_RATE = 500
MIX = 300
MIX_RATE = 100
# The ordinary client.
PROBE_INTERVAL = 0.5
PROBE_TIMEOUT = 3.0
# The Done-when line: every answer within this.
FAST = 0.200
START_LIMIT = 30.0


def limit_descriptors(limit: int) -> Any:
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def raise_own_limit() -> None:
    """This process and its attack children need more than the flood's descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections {limit}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_timeout 5s;
    server {{
        listen 127.0.0.1:{port} backlog=2048;
        location / {{ default_type text/plain; return 200 "Hello, world!"; }}
    }}
}}
"""


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    workdir: Path


@contextlib.contextmanager
def serve(name: str, limit: int, loop: str) -> Iterator[Server]:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="connlist-flood-"))
    log = workdir / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "middleware"), *filter(None, [env.get("PYTHONPATH")])]
    )
    if name == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        (workdir / "nginx.conf").write_text(NGINX_CONF.format(dir=workdir, limit=limit, port=port))
        command = [nginx, "-p", str(workdir), "-c", str(workdir / "nginx.conf")]
        log = workdir / "error.log"
    elif name.startswith("gunicorn"):
        app = "benchmarks.attack_apps:bare" if name == "gunicorn" else "benchmarks.attack_apps:with_connlist"
        command = gunicorn_asgi.command(app, port, "--asgi-loop", loop)
    else:
        app = "benchmarks.attack_apps:bare" if name == "uvicorn" else "benchmarks.attack_apps:with_connlist"
        http = {
            "uvicorn": "httptools",
            "connlist": "connlist.uvicorn:HttpToolsProtocol",
            "connlist-short": "connlist.uvicorn:HttpToolsProtocol",
            "connlist-h11": "connlist.uvicorn:H11Protocol",
        }[name]
        if name == "connlist-short":
            env["CONNLIST_HEADERS_TIMEOUT"] = "10"
        command = [
            PYTHON, "-m", "uvicorn", app, "--http", http, "--loop", loop,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_descriptors(limit),
        )
    try:
        deadline = time.monotonic() + START_LIMIT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
            if probe_once(port, 1.0)[0]:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{name} did not start within {START_LIMIT} s")
        if name in CONNLIST_MODES:
            view = debug_view(port)
            mode = None if view is None else view.get("mode")
            if mode != CONNLIST_MODES[name]:
                off = None if view is None else view.get("integration_off")
                raise RuntimeError(
                    f"{name}: connlist runs in mode {mode!r}, not {CONNLIST_MODES[name]}: {off}"
                )
        yield Server(name, port, process, log, workdir)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT if name != "nginx" else signal.SIGQUIT)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def probe_once(port: int, timeout: float) -> tuple[bool, float]:
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(max(timeout - (time.monotonic() - started), 0.01))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while b"Hello, world!" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            ok = data.startswith(b"HTTP/1.1 200") and b"Hello, world!" in data
    except OSError:
        ok = False
    return ok, time.monotonic() - started


@dataclass
class Probe:
    ok: int = 0
    failed: int = 0
    slowest: float = 0.0
    slow: int = 0  # answers slower than FAST
    statuses: dict[str, int] = field(default_factory=dict)


def run_probe(port: int, stop: threading.Event, result: Probe) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        ok, took = probe_once(port, PROBE_TIMEOUT)
        if ok:
            result.ok += 1
            result.slowest = max(result.slowest, took)
            result.slow += took > FAST
        else:
            result.failed += 1
        next_at += PROBE_INTERVAL
        stop.wait(max(next_at - time.monotonic(), 0))


# -- the keep-alive and websocket floods (each a subprocess of its own) ----------

# One visit of a flood's client: what it sends on a new connection, and what it
# counts of the answer; True: the connection is then held, silent.
Visit = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, int]], Awaitable[bool]]


async def _flood(
    port: int, count: int, rate: float, duration: float, stats: dict[str, int], attempts: str, visit: Visit
) -> dict[str, int]:
    """``count`` clients connecting to ``port`` at ``rate`` a second, each making ``visit`` again and again.

    Each attempt counts in ``stats[attempts]``.  A visit whose connection is
    held waits, silent, until the server closes it (``closed_by_server``) or
    the flood ends; one that is not, or that failed (``failed``), is followed
    by a pause of 50 ms.
    """
    deadline = time.monotonic() + duration
    stats.update(closed_by_server=0, failed=0)
    tokens = asyncio.Semaphore(0)

    async def refill() -> None:
        while time.monotonic() < deadline:
            tokens.release()
            await asyncio.sleep(1 / rate)

    async def client() -> None:
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(tokens.acquire(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                break
            writer = None
            try:
                stats[attempts] += 1
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                if not await visit(reader, writer, stats):
                    await asyncio.sleep(0.05)
                    continue
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(reader.read(), max(deadline - time.monotonic(), 0))
                    stats["closed_by_server"] += 1
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                stats["failed"] += 1
                await asyncio.sleep(0.05)
            finally:
                if writer is not None:
                    writer.close()

    filler = asyncio.ensure_future(refill())
    await asyncio.gather(*(client() for _ in range(count)))
    filler.cancel()
    return stats


async def keepalive_flood(port: int, count: int, rate: float, duration: float) -> dict[str, int]:
    """``count`` clients connecting at ``rate`` a second: one request each, then silent; again when closed."""

    async def visit(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]
    ) -> bool:
        writer.write(b"GET / HTTP/1.1\r\nHost: flood\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"Hello, world!"), 5)
        if head.startswith(b"HTTP/1.1 200"):
            stats["answered"] += 1
        return True

    return await _flood(port, count, rate, duration, {"connects": 0, "answered": 0}, "connects", visit)


def start_keepalive(port: int, count: int, rate: int, duration: float) -> subprocess.Popen[bytes]:
    command = [PYTHON, __file__, "--keepalive-client", str(port), str(count), str(rate), str(duration)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: flood\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def websocket_flood(port: int, count: int, rate: float, duration: float) -> dict[str, int]:
    """``count`` clients asking at ``rate`` a second for a websocket, each held silent; again if refused."""

    async def visit(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: dict[str, int]
    ) -> bool:
        writer.write(UPGRADE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        if not head.startswith(b"HTTP/1.1 101"):
            stats["refused_503" if head.startswith(b"HTTP/1.1 503") else "other"] += 1
            return False
        stats["opened"] += 1
        return True

    stats = {"asked": 0, "opened": 0, "refused_503": 0, "other": 0}
    return await _flood(port, count, rate, duration, stats, "asked", visit)


def start_websocket(port: int, count: int, rate: int, duration: float) -> subprocess.Popen[bytes]:
    command = [PYTHON, __file__, "--websocket-client", str(port), str(count), str(rate), str(duration)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def start_slowloris(
    port: int, count: int, rate: int, duration: float, workdir: Path
) -> subprocess.Popen[bytes]:
    command = [
        "slowhttptest", "-H", "-c", str(count), "-r", str(rate), "-i", "10", "-l", str(int(duration)),
        "-u", f"http://127.0.0.1:{port}/", "-p", str(int(duration) + 30), "-x", "24",
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- one case ----------------------------------------------------------------


@dataclass
class Case:
    server: str
    limit: int
    attack: str
    probe: Probe
    descriptor_lines: int = 0
    budget: dict[str, Any] | None = None
    totals: dict[str, int] | None = None
    flood: dict[str, int] | None = None


def descriptor_lines(log: Path) -> int:
    text = log.read_text(errors="replace") if log.exists() else ""
    return sum(
        1
        for line in text.splitlines()
        if "out of system resource" in line
        or "Too many open files" in line
        or "want of file descriptors" in line
    )


def debug_view(port: int) -> dict[str, Any] | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /_connections?limit=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        view: dict[str, Any] = json.loads(data.split(b"\r\n\r\n", 1)[1])
        return view
    except (OSError, ValueError, IndexError):
        return None


def run_case(server: str, limit: int, attack: str, duration: float, loop: str) -> Case:
    with serve(server, limit, loop) as running:
        probe = Probe()
        stop = threading.Event()
        attackers: list[subprocess.Popen[bytes]] = []
        keepalive: subprocess.Popen[bytes] | None = None
        try:
            if attack == "websocket":
                keepalive = start_websocket(running.port, FLOOD, FLOOD_RATE, duration)
                attackers.append(keepalive)
            if attack in ("slowloris", "mix"):
                count, rate = (FLOOD, FLOOD_RATE) if attack == "slowloris" else (MIX, MIX_RATE)
                attackers.append(start_slowloris(running.port, count, rate, duration, running.workdir))
            if attack in ("keepalive", "mix"):
                count, rate = (FLOOD, FLOOD_RATE) if attack == "keepalive" else (MIX, MIX_RATE)
                keepalive = start_keepalive(running.port, count, rate, duration)
                attackers.append(keepalive)
            prober = threading.Thread(target=run_probe, args=(running.port, stop, probe), daemon=True)
            prober.start()
            time.sleep(duration)
            stop.set()
            prober.join(PROBE_TIMEOUT + 1)
            view = debug_view(running.port) if server in CONNLIST_MODES else None
        finally:
            stop.set()
            for process in attackers:
                try:
                    process.wait(40)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        flood = None
        if keepalive is not None and keepalive.stdout is not None:
            with keepalive.stdout, contextlib.suppress(ValueError):
                flood = json.loads(keepalive.stdout.read() or b"null")
        case = Case(server, limit, attack, probe, descriptor_lines(running.log), flood=flood)
        if view is not None:
            case.budget = view.get("budget")
            totals = view.get("totals", {})
            case.totals = {
                key: value
                for key, value in totals.items()
                if key.endswith(("_evictions", "_timeouts"))
                or key in ("refused", "accept_failures", "upgrades", "upgrades_refused")
            }
        shutil.rmtree(running.workdir, ignore_errors=True)
        return case


def verdict(case: Case) -> str:
    total = case.probe.ok + case.probe.failed
    if not total:
        return "no probe"
    share = case.probe.ok / total
    return "yes" if share >= 0.99 and case.probe.slow == 0 and case.probe.ok else "no"


def markdown(cases: list[Case], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "| server | ulimit -n | attack | ordinary client ok / failed | slowest answer | answers > 200 ms | "
        "≥ 99% within 200 ms | descriptor errors logged | made room (idle / headers / keep-alive / 503) |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    websockets = any(case.attack == "websocket" for case in cases)
    if websockets:
        # The websocket flood's own count: websockets it opened, and upgrades answered 503.
        lines[2] += " websockets opened / 503 |"
        lines[3] += " ---: |"
    for case in cases:
        totals = case.totals or {}
        room = (
            "-"
            if case.totals is None
            else (
                f"{totals.get('idle_evictions', 0)} / {totals.get('headers_evictions', 0)} / "
                f"{totals.get('keepalive_timeouts', 0)} / {totals.get('refused', 0)}"
            )
        )
        lines.append(
            f"| {case.server} | {case.limit} | {case.attack} | {case.probe.ok} / {case.probe.failed} | "
            f"{case.probe.slowest * 1000:.0f} ms | {case.probe.slow} | {verdict(case)} | "
            f"{case.descriptor_lines} | {room} |"
        )
        if websockets:
            flood = case.flood or {}
            websocket = case.attack == "websocket" and case.flood
            opened = f"{flood.get('opened', 0)} / {flood.get('refused_503', 0)}" if websocket else "-"
            lines[-1] += f" {opened} |"
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--limits", default=",".join(map(str, LIMITS)))
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of attack per case")
    parser.add_argument("--loop", default="auto", choices=("auto", "asyncio", "uvloop"))
    parser.add_argument("--markdown", action="store_true", help="print the table only")
    parser.add_argument("--json", help="also write the cases to this file")
    parser.add_argument("--keepalive-client", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--websocket-client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    raise_own_limit()
    if args.keepalive_client:
        port, count, rate, duration = args.keepalive_client
        stats = asyncio.run(keepalive_flood(int(port), int(count), float(rate), float(duration)))
        print(json.dumps(stats))
        return
    if args.websocket_client:
        port, count, rate, duration = args.websocket_client
        stats = asyncio.run(websocket_flood(int(port), int(count), float(rate), float(duration)))
        print(json.dumps(stats))
        return
    servers = [name for name in args.servers.split(",") if name]
    if "nginx" in servers and not shutil.which("nginx") and not Path("/usr/sbin/nginx").exists():
        servers.remove("nginx")
    if not gunicorn_asgi.installed():
        servers = [name for name in servers if not name.startswith("gunicorn")]
    if not shutil.which("slowhttptest") and set(args.attacks.split(",")) & {"slowloris", "mix"}:
        sys.exit("flood.py needs slowhttptest (apt-get install slowhttptest)")
    cases: list[Case] = []
    for limit in (int(value) for value in args.limits.split(",")):
        for attack in args.attacks.split(","):
            for server in servers:
                case = run_case(server, limit, attack, args.duration, args.loop)
                cases.append(case)
                if not args.markdown:
                    print(json.dumps(asdict(case)), flush=True)
    command = "python3 benchmarks/flood.py " + " ".join(sys.argv[1:])
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(case) for case in cases], indent=1))
    print(markdown(cases, command.strip()))


if __name__ == "__main__":
    main()
