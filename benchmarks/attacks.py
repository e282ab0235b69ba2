"""Slow clients: ``slowhttptest``'s three slow modes against uvicorn and gunicorn, bare and with connlist.

The modes (``slowhttptest``'s own flags, see ``man slowhttptest``):

``slowloris`` (``-H``)
    requests whose headers never end: a header line every ``-i`` seconds;
``slow-body`` (``-B``, R-U-Dead-Yet)
    POSTs announcing ``-s`` bytes, the body trickled a few bytes every ``-i``
    seconds (to ``POST /upload``, which awaits ``request.body()``);
``slow-read`` (``-X``)
    ``-k`` pipelined requests for a large response (``GET /large``, 2 MiB)
    on a socket with a receive window of ``-w``..``-y`` bytes, read ``-z``
    bytes every ``-n`` seconds.

The servers (``benchmarks/attack_apps.py`` serves the same Starlette app to each):

``uvicorn``
    bare uvicorn (``--http httptools``), the app alone;
``connlist``
    the app in ``ConnectionsMiddleware`` at its defaults, with
    ``--http connlist.uvicorn:HttpToolsProtocol``;
``connlist-short``
    the same with short timeouts: headers 5 s, request 30 s, send 5 s, body
    grace 5 s (only the options the installed connlist has are passed);
``gunicorn``
    gunicorn's own ASGI worker, bare: ``gunicorn -k asgi -w 1
    --http-parser python``, the app alone;
``gunicorn-connlist``
    the same command, the app in ``ConnectionsMiddleware`` at its defaults:
    no connlist flag, the middleware turns the integration on at the
    lifespan startup (mode ``gunicorn-python``);
``gunicorn-connlist-short``
    the same with ``connlist-short``'s timeouts;
``hypercorn``
    hypercorn at its defaults (``python3 -m hypercorn``), the app alone.

The gunicorn servers and hypercorn run only when asked for with
``--servers``, and only if they are installed.  ``benchmarks/gunicorn_asgi.py``
starts gunicorn (its parser named, its control socket off).

Each server is a subprocess on a free port of 127.0.0.1, with uvicorn's (or
hypercorn's, or gunicorn's) own defaults for the backlog and the concurrency
limit, and for gunicorn its other defaults too (``--keep-alive 2``,
``--timeout 30``).  For
each mode, the servers are attacked at the same time, each by its own
``slowhttptest``, the attacks started ``--stagger`` seconds apart (10 s) so
that their ramp-ups do not overlap: on two CPUs, four slow-read ramp-ups at
once (1,200 responses of 2 MiB) delayed the ordinary client past 3 s on
every server, where one alone delayed it by 40 ms.  While an attack runs
this script

- samples the server's established TCP connections every 0.5 s from
  ``/proc/net/tcp`` (what ``ss -tn state established '( sport = :PORT )'``
  shows), which gives each attack connection's lifetime on the server side
  to about 0.5 s: *held for* is the longest and the median of them, and a
  connection the server closed before the attack's end (``-l`` seconds
  after its start, or slowhttptest's exit when the server has closed every
  attack connection) is *cut*;
- runs an ordinary client: ``GET /`` on a fresh connection every 0.5 s,
  3 s timeout (like ``slowhttptest -p 3``), counting the answers, the
  failures and the slowest answer, until the attack's end (not while
  ``slowhttptest`` closes all its connections at once, after it);
- reads the server's peak RSS, ``VmHWM`` of ``/proc/PID/status``, summed
  over the server process and its children (hypercorn and gunicorn serve
  from a child: their master's memory is in the sum);
- samples the kernel memory held by the server's sockets on its port, in
  every state (``FIN-WAIT-1`` after a close too: the kernel keeps trying to
  deliver what is queued after the server let the socket go), as
  ``ss -tm state all '( sport = :PORT )'`` shows it: the ``skmem`` fields
  ``r`` (receive queue), ``w`` (send queue) and ``f`` (forward allocation)
  summed over the sockets; *kernel MB* is the largest sum, and the last
  one before the attack's end (what the cut connections still hold).

``slowhttptest``'s own statistics (``-g -o``, a CSV line per second: closed,
pending and connected attack sockets) and its exit status are kept in the
JSON report; its own probe is put off past the run's end (``-p``), so that
every connection the server sees is either an attack connection or this
script's ordinary client.  Connections seen in a single sample only are
not counted as attack connections: the one probe ``slowhttptest`` still
makes, at its start, is answered within milliseconds.

Usage::

    python3 benchmarks/attacks.py                  # 3 modes x 3 servers, 300 connections, 90 s: ~6 minutes
    python3 benchmarks/attacks.py --quick          # 100 connections, 20 s: ~1.5 minutes (smoke test)
    python3 benchmarks/attacks.py --modes slowloris --servers uvicorn connlist-short
    python3 benchmarks/attacks.py --servers uvicorn connlist connlist-short hypercorn --json attacks.json
    python3 benchmarks/attacks.py --servers gunicorn gunicorn-connlist  # gunicorn -k asgi, bare and connlist

Run it under ``nice`` on a shared machine (the servers and ``slowhttptest``
inherit it).  Needs ``slowhttptest`` (``apt-get install slowhttptest``);
attacks 127.0.0.1 only.  Exits 0 when every attack ran (whatever it showed),
2 when it cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import importlib.util
import io
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import gunicorn_asgi
from ports import free_port

HERE = Path(__file__).resolve().parent
HELLO = b"Hello, world!"
SLOWHTTPTEST_MISSING = (
    "slowhttptest not found: install it with `apt-get install slowhttptest` (Debian/Ubuntu), "
    "or from https://github.com/shekyan/slowhttptest"
)
# How often the server's connections, its memory and the ordinary client are sampled.
INTERVAL = 0.5
# The ordinary client's timeout, as slowhttptest's own probe with -p 3.
PROBE_TIMEOUT = 3.0
# A server's startup on a loaded two-core machine.
START_LIMIT = 30.0


class BenchError(Exception):
    """The benchmark cannot go on (a server did not start, slowhttptest failed, ...)."""


# -- what is run ------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    flag: str
    path: str
    # slowhttptest's options for this mode, besides -c, -r, -l, -u, -p, -g and -o.
    options: tuple[str, ...]


MODES = (
    Mode("slowloris", "slowloris (-H)", "-H", "/", ("-i", "10")),
    Mode("slow-body", "slow body (-B)", "-B", "/upload", ("-i", "10", "-s", "8192")),
    Mode(
        "slow-read",
        "slow read (-X)",
        "-X",
        "/large",
        ("-w", "512", "-y", "1024", "-n", "5", "-z", "32", "-k", "3"),
    ),
)
MODE_BY_KEY = {mode.key: mode for mode in MODES}

# The short timeouts: option -> value, passed through attack_apps' environment variables.
SHORT_TIMEOUTS = {"headers_timeout": 5.0, "request_timeout": 30.0, "send_timeout": 5.0, "body_grace": 5.0}


@dataclass(frozen=True)
class ServerSpec:
    key: str
    label: str
    kind: str  # "uvicorn", "gunicorn" or "hypercorn"
    app: str
    # uvicorn's --http.
    http: str = "httptools"
    # ConnectionsMiddleware options, passed as attack_apps' environment variables.
    options: tuple[tuple[str, float], ...] = ()
    # The connlist mode the debug endpoint must report (None: no connlist in the app).
    mode: str | None = None

    @property
    def connlist(self) -> bool:
        return self.mode is not None


SERVERS = (
    ServerSpec("uvicorn", "bare uvicorn", "uvicorn", "attack_apps:bare"),
    ServerSpec(
        "connlist",
        "connlist, defaults",
        "uvicorn",
        "attack_apps:with_connlist",
        "connlist.uvicorn:HttpToolsProtocol",
        mode="uvicorn-httptools",
    ),
    ServerSpec(
        "connlist-short",
        "connlist, short timeouts",
        "uvicorn",
        "attack_apps:with_connlist",
        "connlist.uvicorn:HttpToolsProtocol",
        tuple(SHORT_TIMEOUTS.items()),
        mode="uvicorn-httptools",
    ),
    ServerSpec("gunicorn", "bare gunicorn -k asgi", "gunicorn", "attack_apps:bare"),
    ServerSpec(
        "gunicorn-connlist",
        "gunicorn -k asgi + connlist, defaults",
        "gunicorn",
        "attack_apps:with_connlist",
        mode=gunicorn_asgi.MODE,
    ),
    ServerSpec(
        "gunicorn-connlist-short",
        "gunicorn -k asgi + connlist, short timeouts",
        "gunicorn",
        "attack_apps:with_connlist",
        options=tuple(SHORT_TIMEOUTS.items()),
        mode=gunicorn_asgi.MODE,
    ),
    ServerSpec("hypercorn", "hypercorn", "hypercorn", "attack_apps:bare"),
)
SERVER_BY_KEY = {spec.key: spec for spec in SERVERS}
DEFAULT_SERVERS = ("uvicorn", "connlist", "connlist-short")
# The servers that need a package beyond uvicorn: the module each imports.
NEEDS = {"gunicorn": gunicorn_asgi.MODULE, "hypercorn": "hypercorn"}


def middleware_options() -> set[str]:
    """The keyword options of the ConnectionsMiddleware the servers will import."""
    import inspect

    from connlist import ConnectionsMiddleware

    return set(inspect.signature(ConnectionsMiddleware).parameters)


# -- a server -----------------------------------------------------------------------


def get(port: int, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Server:
    """One server subprocess on a free port; ``stop()`` always ends it."""

    def __init__(self, spec: ServerSpec, known_options: set[str]) -> None:
        import attack_apps

        self.spec = spec
        self.port = free_port()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        env = dict(os.environ)
        for name in attack_apps.OPTION_ENV.values():
            env.pop(name, None)
        # An option this connlist does not have yet is left out (and reported), not failed on.
        self.options = {name: value for name, value in spec.options if name in known_options}
        self.skipped_options = [name for name, _ in spec.options if name not in known_options]
        for name, value in self.options.items():
            env[attack_apps.OPTION_ENV[name]] = repr(value)
        # The app module is found from the benchmarks folder (hypercorn has no --app-dir).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=HERE,
            env=env,
            start_new_session=True,
        )
        self.peak_kb: dict[int, int] = {}
        # Kernel memory of the server's sockets (see sample_kernel): the largest
        # sum seen, and the last one before the attack's end.
        self.peak_kernel = 0
        self.end_kernel: int | None = None
        self.start_kb = 0
        self.mode: str | None = None
        self.settings: dict[str, Any] = {}

    def command(self) -> list[str]:
        """The server's command line, as its users type it (``python3 -m``: the running interpreter's)."""
        spec = self.spec
        if spec.kind == "uvicorn":
            return [
                sys.executable,
                "-m",
                "uvicorn",
                spec.app,
                "--http",
                spec.http,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        if spec.kind == "gunicorn":
            return gunicorn_asgi.command(spec.app, self.port)
        return [
            sys.executable,
            "-m",
            "hypercorn",
            spec.app,
            "--bind",
            f"127.0.0.1:{self.port}",
            "--log-level",
            "warning",
        ]

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self, limit: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]

    def log_lines(self) -> int:
        self.log.seek(0)
        return sum(1 for _ in self.log)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_LIMIT
        while True:
            if self.process.poll() is not None:
                raise BenchError(
                    f"{self.spec.key}: the server exited with status {self.process.returncode}:\n"
                    f"{self.output()}"
                )
            try:
                status, body = get(self.port, "/", 2.0)
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.spec.key}: no answer within {START_LIMIT:g}s:\n{self.output()}"
                    ) from None
                time.sleep(0.1)
                continue
            if status != 200 or body != HELLO:
                raise BenchError(f"{self.spec.key}: GET / answered {status} {body[:80]!r}")
            break
        if self.spec.connlist:
            # The debug endpoint (loopback only) says whether the protocol feeds the list.
            report = self.debug_report()
            self.mode = report.get("mode")
            if self.mode != self.spec.mode:
                raise BenchError(
                    f"{self.spec.key}: connlist runs in mode {self.mode!r}, not {self.spec.mode}: "
                    f"{report.get('integration_off')}"
                )
            self.settings = {
                key: value
                for key, value in report.items()
                if key.endswith(("_timeout", "_rate", "_grace")) and isinstance(value, (int, float))
            }
        self.sample_memory()
        self.start_kb = sum(self.peak_kb.values())

    def debug_report(self) -> dict[str, Any]:
        status, body = get(self.port, "/_connections?limit=1", 5.0)
        if status != 200:
            raise BenchError(f"{self.spec.key}: GET /_connections answered {status}")
        report: dict[str, Any] = json.loads(body)
        return report

    def processes(self) -> list[int]:
        """The server's PID and its descendants' (hypercorn and gunicorn serve from a child process)."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # Field 4 (ppid) follows the command name, which may hold spaces and parentheses.
            parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree = [self.pid]
        for pid in tree:
            tree += [child for child, parent in parents.items() if parent == pid]
        return tree

    def sample_memory(self) -> None:
        for pid in self.processes():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), int(line.split()[1]))
                            break
            except OSError:
                pass

    def sample_kernel(self) -> int | None:
        """Kernel memory of the server's sockets on its port, any state, as ``ss -tm`` shows it (bytes)."""
        if self.ss is None:
            return None
        try:
            out = subprocess.run(
                [self.ss, "-tmnH", "state", "all", f"( sport = :{self.port} )"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        total = sum(int(value) for value in _SKMEM.findall(out))
        self.peak_kernel = max(self.peak_kernel, total)
        return total

    ss = shutil.which("ss")

    @property
    def peak_kernel_mb(self) -> float | None:
        return None if self.ss is None else self.peak_kernel / 1e6

    @property
    def peak_rss_mb(self) -> float:
        return sum(self.peak_kb.values()) / 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            # The server's whole session: hypercorn's and gunicorn's workers too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.log.close()


# ss -tm's socket memory: skmem:(r<rmem_alloc>,rb...,t<wmem_alloc>,tb...,f<fwd_alloc>,w<wmem_queued>,...)
_SKMEM = re.compile(r"[(,](?:r|f|w)(\d+)")


# -- the server's connections ---------------------------------------------------------

_ESTABLISHED = "01"


def established_peers(ports: set[int], tables: tuple[str, ...] = ("/proc/net/tcp",)) -> dict[int, set[int]]:
    """For each of ``ports``, the remote ports of the server's ESTABLISHED connections on it.

    ``/proc/net/tcp`` is what ``ss -tn`` reads: a line per socket with the
    local and remote ``ADDR:PORT`` in hex and the state (01: established).
    Only the server's ends match (local port = the server's); the clients'
    ends on the same machine have the server's port as their remote port.
    """
    peers: dict[int, set[int]] = {port: set() for port in ports}
    for table in tables:
        with open(table) as f:
            next(f)  # header
            for line in f:
                fields = line.split()
                if fields[3] != _ESTABLISHED:
                    continue
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port in peers:
                    peers[local_port].add(int(fields[2].rsplit(":", 1)[1], 16))
    return peers


# /proc/net/tcp is read a page at a time, and a socket that moves in the
# kernel's table between two reads can be left out of one sample: a
# connection missing from this many consecutive samples, then seen again, is
# the same connection (a remote port is not reused within a second or two).
GAP_SAMPLES = 2


@dataclass
class Lifetime:
    """One connection (a remote port on the server's port) on the server's side, from the samples."""

    port: int
    first_seen: float
    last_seen: float
    # The sample before the first that saw it.
    before: float
    # The first sample after ``last_seen`` that did not see it; None while it is seen.
    after: float | None = None
    samples: int = 1
    misses: int = 0
    # Missed by more than GAP_SAMPLES samples in a row: closed at ``after``.
    gone: bool = False

    @property
    def opened(self) -> float:
        return (self.before + self.first_seen) / 2

    @property
    def closed(self) -> float:
        """When it closed, to half a sample; the last sample that saw it if it never closed."""
        return self.last_seen if self.after is None else (self.last_seen + self.after) / 2


class ConnectionTracker:
    """Connection lifetimes from successive samples of the remote ports on one server port."""

    def __init__(self, started: float) -> None:
        self.open: dict[int, Lifetime] = {}
        self.done: list[Lifetime] = []
        self.last_sample = started

    def sample(self, now: float, peers: set[int]) -> None:
        for port, lifetime in list(self.open.items()):
            if port in peers:
                lifetime.last_seen = now
                lifetime.samples += 1
                lifetime.after = None
                lifetime.misses = 0
                continue
            if lifetime.after is None:
                lifetime.after = now
            lifetime.misses += 1
            if lifetime.misses > GAP_SAMPLES:
                lifetime.gone = True
                self.done.append(self.open.pop(port))
        for port in peers:
            if port not in self.open:
                self.open[port] = Lifetime(port, now, now, self.last_sample)
        self.last_sample = now

    def lifetimes(self) -> list[Lifetime]:
        """Every connection seen, closed (``gone``) or not (yet): missing from the last samples only."""
        return [*self.done, *self.open.values()]


# -- the ordinary client ------------------------------------------------------------


@dataclass
class ProbeResult:
    ok: int = 0
    failed: int = 0
    max_latency: float = 0.0
    # Seconds from the attack's start to the request that took max_latency.
    max_latency_at: float | None = None
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # (local port, connect time, end time) of every request, to tell its connections from the attack's.
    connections: list[tuple[int, float, float]] = field(default_factory=list)


class Probe(threading.Thread):
    """``GET /`` on a fresh connection every ``INTERVAL`` s until stopped: is the server still serving?"""

    def __init__(self, port: int, origin: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        # The attack's start, which the times in the result count from.
        self.origin = origin
        self.stopping = threading.Event()
        self.result = ProbeResult()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.once()
            next_at += INTERVAL
            # A slow answer delays the next request, it does not pile requests up.
            next_at = max(next_at, time.monotonic())
            self.stopping.wait(next_at - time.monotonic())

    def once(self) -> None:
        result = self.result
        started = time.monotonic()
        local_port = 0
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=PROBE_TIMEOUT) as sock:
                local_port = sock.getsockname()[1]
                sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                response = bytearray()
                deadline = started + PROBE_TIMEOUT
                while True:
                    sock.settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    response += chunk
            ok = response.startswith(b"HTTP/1.1 200 ") and response.endswith(HELLO)
            error = "" if ok else f"answered {bytes(response[:40])!r}"
        except OSError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        latency = time.monotonic() - started
        if local_port:
            result.connections.append((local_port, started, started + latency))
        at = started - self.origin
        # A failure's latency counts too: it is how long the client waited.
        if latency > result.max_latency:
            result.max_latency, result.max_latency_at = latency, at
        if ok:
            result.ok += 1
            result.latencies.append(latency)
        else:
            result.failed += 1
            if len(result.errors) < 5:
                result.errors.append(f"at {at:.1f}s, after {latency:.2f}s: {error}")


# -- slowhttptest --------------------------------------------------------------------


def slowhttptest_command(
    slowhttptest: str, mode: Mode, port: int, connections: int, rate: int, length: int, prefix: str
) -> list[str]:
    return [
        slowhttptest,
        mode.flag,
        "-c",
        str(connections),
        "-r",
        str(rate),
        "-l",
        str(length),
        *mode.options,
        # slowhttptest's own probe opens a connection every -p seconds: past the
        # end, only the one at its start is made (this script has its own probe).
        "-p",
        str(length + 60),
        "-g",
        "-o",
        prefix,
        "-u",
        f"http://127.0.0.1:{port}{mode.path}",
    ]


def parse_slowhttptest_csv(text: str) -> dict[str, Any]:
    """slowhttptest's ``-g -o PREFIX`` statistics (PREFIX.csv): one row per second of the test.

    Columns by name, since versions differ: 1.8 writes ``Seconds, Closed,
    Pending, Connected, Service Available`` (the last is the number of
    connections while its probe is answered, 0 while not), older ones
    ``Seconds, Error, Closed, Pending, Connected``.
    """
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        if not row.get("Seconds", "").strip():
            continue
        rows.append({key.strip().lower(): int(value) for key, value in row.items() if key and value})
    if not rows:
        raise BenchError(f"slowhttptest's CSV has no rows:\n{text[:500]}")
    connected = [row["connected"] for row in rows]
    peak = max(connected)
    peak_at = connected.index(peak)
    # The first second, after the peak, at which no attack connection was open any more.
    zero_at = next((row["seconds"] for row in rows[peak_at:] if row["connected"] == 0), None)
    last = rows[-1]
    summary: dict[str, Any] = {
        "seconds": last["seconds"],
        "connected_max": peak,
        "connected_end": last["connected"],
        "closed_end": last["closed"],
        "pending_end": last.get("pending", 0),
        # slowhttptest marks a socket closed when the server closed it (recv returned 0 or an error).
        "opened": max(row["connected"] + row["closed"] + row.get("error", 0) for row in rows),
        "all_closed_at": zero_at,
    }
    if "service available" in rows[0]:
        summary["unavailable_seconds"] = sum(1 for row in rows if row["service available"] == 0)
    summary["rows"] = rows
    return summary


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def slowhttptest_exit_status(output: str) -> str | None:
    match = re.search(r"Exit status:\s*(.+)", _ANSI.sub("", output))
    return match.group(1).strip() if match else None


# -- one mode: every server attacked at once -------------------------------------------


@dataclass
class Attack:
    mode: str
    server: str
    label: str
    port: int
    command: list[str]
    length: int
    started: float = 0.0
    ended: float = 0.0
    process: subprocess.Popen[bytes] | None = None
    output: Any = None
    tracker: ConnectionTracker | None = None
    probe: Probe | None = None


def analyse(attack: Attack, server: Server, csv_text: str | None, output: str) -> dict[str, Any]:
    assert attack.tracker is not None and attack.probe is not None
    probe = attack.probe.result
    # The ordinary client's connections, by port and time (a port may be reused later).
    probe_spans: dict[int, list[tuple[float, float]]] = {}
    for port, start, end in probe.connections:
        probe_spans.setdefault(port, []).append((start - INTERVAL, end + INTERVAL))

    def is_probe(lifetime: Lifetime) -> bool:
        return any(
            start <= lifetime.first_seen <= end or start <= lifetime.last_seen <= end
            for start, end in probe_spans.get(lifetime.port, ())
        )

    exit_status = slowhttptest_exit_status(output)
    # The attack's end: slowhttptest stops -l seconds after its start, or
    # earlier when the server closed every attack connection; what it closes
    # itself at the end is not cut.
    all_closed = exit_status is not None and exit_status.startswith("No open connections")
    end_of_attack = attack.ended if all_closed else attack.started + attack.length

    def was_cut(lifetime: Lifetime) -> bool:
        if lifetime.after is None or lifetime.after > end_of_attack:
            return False
        # Missing from the last samples only: a gap in the reading of
        # /proc/net/tcp just before the attack's end looks the same.
        return lifetime.gone or all_closed

    lifetimes = [lt for lt in attack.tracker.lifetimes() if not is_probe(lt)]
    attack_conns = [lt for lt in lifetimes if lt.samples >= 2]
    held = [lt.closed - lt.opened for lt in attack_conns]
    cut = [lt for lt in attack_conns if was_cut(lt)]
    result: dict[str, Any] = {
        "mode": attack.mode,
        "server": attack.server,
        "label": attack.label,
        "command": attack.command,
        "run_seconds": attack.ended - attack.started,
        "exit_status": exit_status,
        "attack_connections": len(attack_conns),
        "short_lived_ignored": len(lifetimes) - len(attack_conns),
        "cut": len(cut),
        "held_max": max(held) if held else None,
        "held_median": statistics.median(held) if held else None,
        "cut_at_min": min((lt.closed - lt.opened for lt in cut), default=None),
        "cut_at_max": max((lt.closed - lt.opened for lt in cut), default=None),
        "probe_ok": probe.ok,
        "probe_failed": probe.failed,
        "probe_max_latency": probe.max_latency,
        "probe_max_latency_at": probe.max_latency_at,
        "probe_median_latency": statistics.median(probe.latencies) if probe.latencies else None,
        "probe_errors": probe.errors,
        "peak_rss_mb": server.peak_rss_mb,
        "peak_kernel_mb": server.peak_kernel_mb,
        "end_kernel_mb": None if server.end_kernel is None else server.end_kernel / 1e6,
        "start_rss_mb": server.start_kb / 1024,
        "server_log_lines": server.log_lines(),
        # Its last lines: under bare uvicorn the exception of the last traceback.
        "server_log_tail": server.output(800),
        "connlist_options": server.options,
        "connlist_options_not_supported": server.skipped_options,
        "connlist_settings": server.settings,
    }
    if csv_text is not None:
        stats = parse_slowhttptest_csv(csv_text)
        stats.pop("rows")
        result["slowhttptest"] = stats
    return result


def run_mode(
    mode: Mode, specs: list[ServerSpec], args: argparse.Namespace, slowhttptest: str, tmp: Path
) -> list[dict[str, Any]]:
    known = middleware_options() if any(spec.connlist for spec in specs) else set()
    servers: list[Server] = []
    attacks: list[Attack] = []
    try:
        for spec in specs:
            servers.append(Server(spec, known))
        for server in servers:
            server.wait_ready()
        for server in servers:
            prefix = str(tmp / f"{mode.key}-{server.spec.key}")
            command = slowhttptest_command(
                slowhttptest, mode, server.port, args.connections, args.rate, args.length, prefix
            )
            spec = server.spec
            attacks.append(Attack(mode.key, spec.key, spec.label, server.port, command, args.length))
        # Attacks start --stagger seconds apart: a mode's servers are under
        # attack at the same time, but not ramped up at the same time (the
        # ramp-up of the slow read, 300 large responses at once, takes the CPUs).
        first = time.monotonic()
        start_at = [first + i * args.stagger for i in range(len(attacks))]
        hard_limit = start_at[-1] + args.length + 60
        waiting = list(zip(start_at, attacks, servers, strict=True))
        running: list[tuple[Attack, Server]] = []
        while waiting or running:
            now = time.monotonic()
            while waiting and waiting[0][0] <= now:
                _, attack, server = waiting.pop(0)
                attack.output = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
                attack.started = now
                attack.tracker = ConnectionTracker(now)
                attack.process = subprocess.Popen(
                    attack.command,
                    stdin=subprocess.DEVNULL,
                    stdout=attack.output,
                    stderr=subprocess.STDOUT,
                    cwd=tmp,
                )
                attack.probe = Probe(attack.port, now)
                attack.probe.start()
                running.append((attack, server))
            peers = established_peers({attack.port for attack, _ in running})
            still: list[tuple[Attack, Server]] = []
            for attack, server in running:
                assert attack.tracker is not None and attack.process is not None and attack.probe is not None
                attack.tracker.sample(now, peers[attack.port])
                server.sample_memory()
                kernel = server.sample_kernel()
                if now < attack.started + attack.length:
                    server.end_kernel = kernel
                if server.process.poll() is not None:
                    raise BenchError(
                        f"{server.spec.key}: the server died during the attack:\n{server.output()}"
                    )
                if now >= attack.started + attack.length:
                    # The attack is over; what follows, slowhttptest closing
                    # every connection at once, is not what is measured.
                    attack.probe.stopping.set()
                if attack.process.poll() is not None:
                    # One more look, after its exit: slowhttptest stops as soon
                    # as the server has closed its last connection, which may
                    # be after this tick's sample.
                    attack.ended = time.monotonic()
                    attack.tracker.sample(attack.ended, established_peers({attack.port})[attack.port])
                    attack.probe.stopping.set()
                elif now > hard_limit:
                    raise BenchError(f"slowhttptest did not end within {args.length + 60}s: {attack.command}")
                else:
                    still.append((attack, server))
            running = still
            time.sleep(max(0.0, now + INTERVAL - time.monotonic()))
        results = []
        for attack, server in zip(attacks, servers, strict=True):
            assert attack.probe is not None and attack.process is not None
            attack.probe.join(PROBE_TIMEOUT + 1)
            server.sample_memory()
            if server.spec.connlist:
                report = server.debug_report()
                totals = report.get("totals", {})
            else:
                totals = {}
            attack.output.seek(0)
            output = attack.output.read().decode(errors="replace")
            if attack.process.returncode != 0:
                raise BenchError(
                    f"slowhttptest exited with status {attack.process.returncode}: "
                    f"{' '.join(attack.command)}\n{_ANSI.sub('', output)[-2000:]}"
                )
            csv_path = Path(f"{attack.command[attack.command.index('-o') + 1]}.csv")
            csv_text = csv_path.read_text() if csv_path.exists() else None
            result = analyse(attack, server, csv_text, output)
            result["connlist_totals"] = totals
            results.append(result)
        return results
    finally:
        for attack in attacks:
            if attack.probe is not None:
                attack.probe.stopping.set()
            if attack.process is not None and attack.process.poll() is None:
                attack.process.kill()
                attack.process.wait()
            if attack.output is not None:
                attack.output.close()
        for server in servers:
            server.stop()


# -- the report ---------------------------------------------------------------------


def format_row(result: dict[str, Any]) -> list[str]:
    n = result["attack_connections"]
    held = "-"
    if result["held_max"] is not None:
        held = f"{result['held_max']:.1f} / {result['held_median']:.1f} s"
    cut = f"{result['cut']}/{n}"
    if result["cut"]:
        cut += f" (at {result['cut_at_min']:.1f}-{result['cut_at_max']:.1f} s)"
    probe = f"{result['probe_ok']}/{result['probe_failed']}, {result['probe_max_latency'] * 1000:.0f} ms"
    mode = MODE_BY_KEY[result["mode"]].label
    kernel = "-"
    if result.get("peak_kernel_mb") is not None:
        kernel = f"{result['peak_kernel_mb']:.0f} / {result.get('end_kernel_mb') or 0:.0f}"
    return [mode, result["label"], held, cut, probe, f"{result['peak_rss_mb']:.0f}", kernel]


TABLE_HEADER = [
    "mode",
    "server",
    "held for (max / median)",
    "attack connections cut",
    "ordinary client (ok/failed, max latency)",
    "peak RSS MB",
    "kernel MB (peak / at the end)",
]


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + " --- |" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(format_row(result)) + " |" for result in results]
    return "\n".join(lines)


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def slowhttptest_version(slowhttptest: str) -> str:
    done = subprocess.run([slowhttptest, "-h"], capture_output=True, text=True, timeout=10)
    match = re.search(r"version ([\w.]+)", done.stdout + done.stderr)
    return match.group(1) if match else "unknown"


def module_found(name: str) -> bool:
    """Whether ``name`` (dotted) can be imported: False too where a parent package is missing."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def connlist_path() -> str | None:
    """The folder of the connlist the servers import (the worktree's, with PYTHONPATH set)."""
    spec = importlib.util.find_spec("connlist")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent)


def raise_fd_limit(needed: int) -> None:
    """Let the servers (which inherit it) hold every attack connection: ``ulimit -n``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=list(MODE_BY_KEY), help="default: all three")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=list(SERVER_BY_KEY),
        help=f"default: {' '.join(DEFAULT_SERVERS)}",
    )
    parser.add_argument("--connections", type=int, help="attack connections per server (default 300)")
    parser.add_argument(
        "--rate", type=int, default=100, help="new attack connections per second (default 100)"
    )
    parser.add_argument("--length", type=int, help="seconds of each attack (default 90)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 100 connections, 20 s attacks (about 1.5 minutes)"
    )
    parser.add_argument(
        "--serial", action="store_true", help="attack one server at a time instead of all of a mode's at once"
    )
    parser.add_argument(
        "--stagger",
        type=float,
        help="seconds between the starts of the attacks on a mode's servers (default 10; 5 with --quick)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every result here")
    args = parser.parse_args(argv)
    defaults = (100, 20) if args.quick else (300, 90)
    args.connections = defaults[0] if args.connections is None else args.connections
    args.length = defaults[1] if args.length is None else args.length
    if args.stagger is None:
        args.stagger = 5.0 if args.quick else 10.0
    args.modes = list(dict.fromkeys(args.modes or MODE_BY_KEY))
    args.servers = list(dict.fromkeys(args.servers or DEFAULT_SERVERS))
    if args.connections < 1 or args.rate < 1 or args.length < 5 or args.stagger < 0:
        parser.error("--connections and --rate must be >= 1, --length >= 5, --stagger >= 0")
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Unwind (SystemExit), so that the servers and slowhttptest are stopped too.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    slowhttptest = shutil.which("slowhttptest")
    if slowhttptest is None:
        print(SLOWHTTPTEST_MISSING, file=sys.stderr)
        return 2
    if not Path("/proc/net/tcp").exists():
        print("needs Linux's /proc/net/tcp to follow the server's connections", file=sys.stderr)
        return 2
    server_kinds = {SERVER_BY_KEY[key].kind for key in args.servers}
    for kind in sorted(server_kinds & NEEDS.keys()):
        if not module_found(NEEDS[kind]):
            print(
                f"{kind} is not installed (no {NEEDS[kind]}): pip install {kind}, "
                "or leave it out of --servers",
                file=sys.stderr,
            )
            return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.path.insert(0, str(HERE))
    specs = [SERVER_BY_KEY[key] for key in args.servers]
    groups = [[spec] for spec in specs] if args.serial else [specs]
    raise_fd_limit(len(specs) * args.connections + 1024)
    info = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "uvicorn": version("uvicorn"),
        "starlette": version("starlette"),
        "httptools": version("httptools"),
        "hypercorn": version("hypercorn") if "hypercorn" in server_kinds else None,
        "gunicorn": version("gunicorn") if "gunicorn" in server_kinds else None,
        "connlist": version("connlist"),
        "connlist_path": connlist_path(),
        "slowhttptest": slowhttptest_version(slowhttptest),
    }
    print(
        f"slowhttptest {info['slowhttptest']}, Python {info['python']}, uvicorn {info['uvicorn']}, "
        + (f"gunicorn {info['gunicorn']}, " if info["gunicorn"] else "")
        + f"connlist from {info['connlist_path']}; {args.connections} connections at {args.rate}/s, "
        f"{args.length} s per attack, on 127.0.0.1",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="attacks-") as tmp:
            for mode in (MODE_BY_KEY[key] for key in args.modes):
                for group in groups:
                    names = ", ".join(spec.key for spec in group)
                    elapsed = time.monotonic() - started
                    print(f"[{elapsed:4.0f}s] {mode.label} against {names} ...", flush=True)
                    for result in run_mode(mode, group, args, slowhttptest, Path(tmp)):
                        results.append(result)
                        skipped = result["connlist_options_not_supported"]
                        note = f" (this connlist has no {', '.join(skipped)})" if skipped else ""
                        lines = result["server_log_lines"]
                        # connlist's own count of what it cut, by kind (headers_timeouts, send_timeouts, ...).
                        kinds = ", ".join(
                            f"{count} {kind}"
                            for kind, count in result["connlist_totals"].items()
                            if kind.endswith("_timeouts") and count
                        )
                        counted = f"; connlist counted {kinds}" if kinds else ""
                        print(
                            f"    {' | '.join(format_row(result))}; {lines} log lines{counted}{note}",
                            flush=True,
                        )
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    print()
    print(markdown_table(results))
    print()
    how = (
        "one server at a time"
        if args.serial
        else f"the servers of a mode attacked at once, started {args.stagger:g} s apart"
    )
    print(
        f"{args.connections} attack connections per server at {args.rate}/s, attacks of {args.length} s, "
        f"{how}; held for: the attack connections' lifetimes on the server (to about 0.5 s); "
        f"ordinary client: GET / on a fresh connection every {INTERVAL:g} s, {PROBE_TIMEOUT:g} s timeout, "
        "during the attack; peak RSS: VmHWM, server and children; peak kernel: ss -tm skmem r+w+f of the "
        "server's sockets on its port, any state."
    )
    if args.json:
        report = {
            "machine": info,
            "settings": {
                "connections": args.connections,
                "rate": args.rate,
                "length": args.length,
                "serial": args.serial,
                "stagger": args.stagger,
                "interval": INTERVAL,
                "probe_timeout": PROBE_TIMEOUT,
            },
            "servers": [asdict(spec) for spec in specs],
            "results": results,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
