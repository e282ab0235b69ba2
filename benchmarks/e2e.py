"""End-to-end benchmark: what connlist costs a hello-world Starlette app under uvicorn.

Six setups (apps and protocols in ``benchmarks/e2e_apps.py``), all served by
uvicorn with httptools and the same event loop (uvloop by default, ``--loop``):

A. ``bare``             -- uvicorn, the hello world;
B. ``connlist``         -- ``ConnectionsMiddleware`` (defaults) with
                           ``--http connlist.uvicorn:HttpToolsProtocol``;
C. ``asgi-only``        -- the same middleware with plain ``--http httptools``;
D. ``asyncio.timeout``  -- a pure-ASGI middleware running each request under
                           ``asyncio.timeout(300)``, plain httptools;
E. ``call_later``       -- a protocol subclass with a per-connection
                           ``loop.call_later(60, close)`` deadline, the bare app.

Method: concurrent A/B pairs.  Every setup but bare is measured beside a bare
uvicorn of its own: both servers run at the same time as ``taskset -c 0
python3 -m uvicorn ...``, each loaded by its own ``taskset -c 1 wrk -t1 -cN
-dDs``.  For each pair both servers are started on free ports, waited for
(and asked, where connlist is in it, which mode it runs in), warmed up with
short ``wrk`` runs, then measured together: each server's CPU time is read
from ``/proc/PID/task/*/schedstat`` (nanoseconds; ``/proc/PID/stat`` ticks
where the kernel has no schedstat) just before and just after the ``wrk``
runs, and its requests from its ``wrk``'s output.  CPU per request = delta
CPU / requests; the pair's ratio = the setup's CPU per request over its bare
partner's.  Both servers are then stopped (terminate, wait, kill).  Each round
runs, for each connection count, one pair per setup, in an order rotated by
one every time, with fresh processes.

Why pairs: on a shared VM the CPU's speed moves by 10-30% within seconds, so
setups measured one after the other (even in interleaved one-second windows)
differ by more than the targets.  Two servers sharing one CPU at the same
moments are slowed alike: a bare/bare pair reads 0.99-1.01 here.  Sharing
the CPU adds context switches and cache refills to both, which weigh on a
setup's extra code: the ratios come out within about 2% of a request of
the instruction counts of ``benchmarks/per_request.py`` (above them for
connlist, 5% above for the ``asyncio.timeout`` middleware).

F. ``no-keepalive-timer`` -- uvicorn's protocol without its keep-alive timer
                           (a reference: it never closes an idle connection).

``--server gunicorn`` runs the pairs on gunicorn's own ASGI worker instead
(``gunicorn -k asgi``, one worker, started as ``gunicorn_asgi.py`` says): bare
gunicorn beside each of the setups that are an app alone (``connlist``, with
no flag, the integration turned on at the lifespan; ``asgi-only``;
``asyncio.timeout``), the CPU read over the master and its worker.  The
targets are the same.

Targets (from the issues): connlist (B) costs no more server CPU per
request than bare uvicorn (it times uvicorn's keep-alive in its list, so
no request arms a timer), ASGI-only mode (C) at most 5% more, and both are
cheaper than each of the two alternatives (D, E): the median across rounds
of the per-round ratio of their ratios to bare, B/D (C/D, B/E, C/E), is
below 1.  From 6 rounds on, each target's median comes with an interval
that holds it with 95% confidence, whatever the rounds' noise
(``intervals.median_interval``, as ``scale.py``'s): where it holds the
target's bound, the rounds cannot tell, whichever side the median fell on.

Usage::

    python3 benchmarks/e2e.py                 # 5 rounds x 3 s, about 4 minutes
    python3 benchmarks/e2e.py --quick         # 3 rounds x 1 s, no warm-up, about 1 minute (smoke test)
    python3 benchmarks/e2e.py --rounds 7 --duration 5 --json e2e.json
    python3 benchmarks/e2e.py --setups connlist no-keepalive-timer --loop asyncio
    python3 benchmarks/e2e.py --close --setups connlist   # a connection per request (Connection: close)
    python3 benchmarks/e2e.py --server gunicorn --setups connlist   # on gunicorn -k asgi
    python3 benchmarks/e2e.py --callgrind     # = python3 benchmarks/per_request.py --loops uvloop

On a shared machine CPU time per request moves by 10-30% from one server
process to the next, more than the targets; the instructions each setup
executes per request do not.  ``benchmarks/per_request.py`` counts them (in
process, under valgrind's callgrind); ``--callgrind`` runs it for every setup
on ``--loop``, and exits as it does (0, or 2 without valgrind).

Needs ``wrk`` (``apt-get install wrk``) and ``taskset`` (util-linux) and two
CPUs; sends its load to 127.0.0.1 only.  Exits 0 when every target is met, 1
when one is missed, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import gunicorn_asgi
from intervals import FEWEST_ROUNDS, median_interval, tells, worded
from ports import free_port
from setups import BASELINE, SETUPS, Setup

HERE = Path(__file__).resolve().parent
HELLO = b"Hello, world!"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRK_MISSING = "wrk not found: install it with `apt-get install wrk` (Debian/Ubuntu)"


# The servers a pair runs on; every setup is measured beside the same server serving the bare app.
SERVERS = ("uvicorn", "gunicorn")
# The setups gunicorn's own ASGI worker serves (``gunicorn -k asgi``, started as
# ``gunicorn_asgi.py`` says): the ones that are an app alone.  The others name
# a uvicorn protocol (``--http``); on gunicorn connlist is given no flag, as
# ``as-usual`` on uvicorn, and turns its integration on at the lifespan.
GUNICORN_SETUPS = (
    Setup("bare", "bare gunicorn -k asgi", "e2e_apps:bare", ""),
    Setup(
        "connlist",
        "connlist on gunicorn -k asgi (no flag)",
        "e2e_apps:with_connlist",
        "",
        mode=gunicorn_asgi.MODE,
    ),
    Setup("asgi-only", "connlist, ASGI-only mode", "e2e_apps:with_connlist_off", "", mode="asgi"),
    Setup("asyncio.timeout", "asyncio.timeout middleware", "e2e_apps:with_asyncio_timeout", ""),
)


def setups_for(server: str) -> tuple[Setup, ...]:
    """The setups ``server`` can serve, the baseline first."""
    return GUNICORN_SETUPS if server == "gunicorn" else SETUPS


# setup -> the largest allowed median ratio of its CPU per request to bare uvicorn's
# (connlist, which times uvicorn's keep-alive in its list: at or below bare).
CEILINGS = {"connlist": 1.00, "asgi-only": 1.05}
# With a connection per request (--close): what a connection costs (issue #34's target for connlist).
CEILINGS_CLOSE = {"connlist": 1.05, "asgi-only": 1.05}
ALTERNATIVES = ("asyncio.timeout", "call_later")


class BenchError(Exception):
    """The benchmark cannot go on (a server did not start, wrk failed, ...)."""


@dataclass
class Measurement:
    round: int
    conns: int
    setup: str
    # The setup served at the same time, on the same CPU (bare uvicorn, or the setup bare was paired with).
    partner: str
    position: int
    requests: int
    seconds: float
    req_per_s: float
    cpu_s: float
    # utime / (utime + stime): the share of the server's CPU spent outside the kernel.
    user_share: float
    cpu_us_per_req: float
    server_cpu_util: float
    # CPU used on the two CPUs by anything but the server and wrk, in CPUs (1.0 = one whole CPU).
    other_load: float
    # How many earlier attempts at this measurement were thrown away for other load.
    retries: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)
    non_2xx: int = 0


# -- the server ------------------------------------------------------------------


def cpu_ticks(pid: int) -> tuple[int, int]:
    """utime and stime of the process (all its threads), in clock ticks, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(fields[11]), int(fields[12])


def cpu_ns(pid: int) -> int | None:
    """Nanoseconds the process (all its threads) ran on a CPU, from /proc/PID/task/*/schedstat.

    None where the kernel does not provide schedstat; ``cpu_ticks`` (10 ms
    resolution) is used then.
    """
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def tree_cpu(pids: tuple[int, ...]) -> tuple[int | None, tuple[int, int]]:
    """``cpu_ns`` and ``cpu_ticks`` summed over a server's processes (None: no schedstat for one)."""
    ns: int | None = 0
    utime = stime = 0
    for pid in pids:
        one = cpu_ns(pid)
        ns = None if ns is None or one is None else ns + one
        user, system = cpu_ticks(pid)
        utime += user
        stime += system
    return ns, (utime, stime)


def busy_ticks(cpus: tuple[int, ...]) -> int:
    """Non-idle ticks of these CPUs (user, nice, system, irq, softirq, steal), from /proc/stat."""
    total = 0
    names = {f"cpu{cpu}" for cpu in cpus}
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in names:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
                total += user + nice + system + irq + softirq + steal
    return total


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the wrk runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (gunicorn's worker), from /proc/PID/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(child) for child in f.read().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


class Server:
    """One server (uvicorn, or gunicorn with one worker) pinned to a CPU; a context manager that stops it."""

    def __init__(
        self,
        setup: Setup,
        *,
        loop: str,
        cpu: int,
        extra: tuple[str, ...] = (),
        wrapper: tuple[str, ...] = (),
        server: str = "uvicorn",
    ) -> None:
        self.setup = setup
        self.server = server
        self.port = free_port()
        # The server's output, shown if it fails; closed in stop().
        self.log = tempfile.TemporaryFile()  # noqa: SIM115
        if server == "gunicorn":
            serve = gunicorn_asgi.command(setup.app, self.port, "--asgi-loop", loop, *extra)
        else:
            serve = [
                sys.executable,
                "-m",
                "uvicorn",
                setup.app,
                "--app-dir",
                str(HERE),
                "--http",
                setup.http,
                "--loop",
                loop,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--no-access-log",
                # More of uvicorn's options (scale.py's --timeout-keep-alive).
                *extra,
            ]
        # A program that runs the interpreter in this process (server_counts.py's valgrind).
        command = ["taskset", "-c", str(cpu), *wrapper, *serve]
        # taskset execs the interpreter, so this PID is the server's own (gunicorn's master:
        # its worker inherits the CPU).
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd=HERE
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> tuple[int, ...]:
        """The server's processes: uvicorn's one, or gunicorn's master and its worker."""
        return (self.pid, *descendants(self.pid))

    def check_same(self, pids: tuple[int, ...]) -> None:
        """Raise ``BenchError`` unless the server still runs as ``pids`` (a replaced worker's CPU is lost)."""
        if self.process.poll() is not None or self.pids() != pids:
            raise BenchError(
                f"{self.setup.key}: {self.server} (or its worker) died during the run:\n{self.output()}"
            )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 20.0, request_timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                status = self.process.returncode
                raise BenchError(
                    f"{self.setup.key}: {self.server} exited with status {status}:\n{self.output()}"
                )
            try:
                status, body = get(self.port, "/", request_timeout)
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.setup.key}: {self.server} did not answer within {timeout:g}s:\n"
                        f"{self.output()}"
                    ) from None
                time.sleep(0.05)
                continue
            if status != 200 or body != HELLO:
                raise BenchError(f"{self.setup.key}: GET / answered {status} {body[:80]!r}")
            break
        if self.setup.mode is not None:
            # The debug endpoint (loopback only) says whether the protocol feeds the list.
            status, body = get(self.port, "/_connections", request_timeout)
            mode = json.loads(body).get("mode") if status == 200 else None
            if mode != self.setup.mode:
                raise BenchError(
                    f"{self.setup.key}: connlist runs in mode {mode!r} (status {status}), "
                    f"expected {self.setup.mode!r}"
                )

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            workers = descendants(self.pid)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
                # Its workers, which a killed master leaves behind.
                for pid in workers:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
        self.log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- wrk ---------------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_wrk(output: str) -> dict[str, Any]:
    match = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h),", output)
    if match is None:
        raise BenchError(f"cannot read wrk's output:\n{output}")
    result: dict[str, Any] = {
        "requests": int(match.group(1)),
        "seconds": float(match.group(2)) * _UNITS[match.group(3)],
        "socket_errors": {},
        "non_2xx": 0,
    }
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if errors is not None:
        names = ("connect", "read", "write", "timeout")
        result["socket_errors"] = {
            name: int(value) for name, value in zip(names, errors.groups(), strict=True) if int(value)
        }
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if non_2xx is not None:
        result["non_2xx"] = int(non_2xx.group(1))
    return result


def start_wrk(
    wrk: str, cpu: int, conns: int, seconds: int, port: int, close: bool = False
) -> subprocess.Popen[str]:
    """``wrk`` pinned to ``cpu``, loading ``port`` for ``seconds``; collect it with ``finish_wrk``.

    ``close``: every request with ``Connection: close``, so each is a connection of its own.
    """
    command = ["taskset", "-c", str(cpu), wrk, "-t1", f"-c{conns}", f"-d{seconds}s"]
    if close:
        command += ["-H", "Connection: close"]
    command.append(f"http://127.0.0.1:{port}/")
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish_wrk(process: subprocess.Popen[str], seconds: int) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise BenchError(f"wrk did not finish within {seconds + 30:g}s") from None
    if process.returncode != 0:
        raise BenchError(f"wrk failed with status {process.returncode}:\n{out}{err}")
    return parse_wrk(out)


# -- one measurement, the rounds, the summary --------------------------------------


def measure_pair(
    setup: Setup, conns: int, args: argparse.Namespace, wrk: str, round_no: int, position: int
) -> tuple[Measurement, Measurement]:
    """Bare uvicorn and ``setup`` served at the same time on the server CPU, each loaded by its own wrk.

    Both servers share the same CPU at the same moments, so whatever slows
    the machine down (other tenants, frequency, interrupts) slows both alike.
    """
    cpus = (args.server_cpu, args.client_cpu)
    baseline = setups_for(args.server)[0]
    with (
        Server(baseline, loop=args.loop, cpu=args.server_cpu, server=args.server) as bare,
        Server(setup, loop=args.loop, cpu=args.server_cpu, server=args.server) as other,
    ):
        servers = (bare, other)
        for server in servers:
            server.wait_ready()
        # gunicorn's CPU is its master's and its worker's (one worker, started by now: it answered).
        processes = [server.pids() for server in servers]
        if args.warmup > 0:
            warming = [
                start_wrk(wrk, args.client_cpu, conns, args.warmup, s.port, args.close) for s in servers
            ]
            for process in warming:
                finish_wrk(process, args.warmup)
        busy_before, wrk_before = busy_ticks(cpus), children_cpu()
        before = [tree_cpu(pids) for pids in processes]
        running = [start_wrk(wrk, args.client_cpu, conns, args.duration, s.port, args.close) for s in servers]
        results = [finish_wrk(process, args.duration) for process in running]
        # Before the CPU is read again: a process that is gone has none to read.
        for server, pids in zip(servers, processes, strict=True):
            server.check_same(pids)
        after = [tree_cpu(pids) for pids in processes]
        busy_after, wrk_after = busy_ticks(cpus), children_cpu()
    servers_cpu = 0.0
    pair: list[Measurement] = []
    for server, result, (ns0, ticks0), (ns1, ticks1) in zip(servers, results, before, after, strict=True):
        requests = result["requests"]
        if requests == 0:
            raise BenchError(f"{server.setup.key}: wrk completed no request")
        ticks = (ticks1[0] - ticks0[0]) + (ticks1[1] - ticks0[1])
        cpu_s = (ns1 - ns0) / 1e9 if ns0 is not None and ns1 is not None else ticks / CLK_TCK
        servers_cpu += cpu_s
        pair.append(
            Measurement(
                round=round_no,
                conns=conns,
                setup=server.setup.key,
                partner=(other if server is bare else bare).setup.key,
                position=position,
                requests=requests,
                seconds=result["seconds"],
                req_per_s=requests / result["seconds"],
                cpu_s=cpu_s,
                user_share=(ticks1[0] - ticks0[0]) / ticks if ticks else 0.0,
                cpu_us_per_req=cpu_s / requests * 1e6,
                server_cpu_util=cpu_s / result["seconds"],
                other_load=0.0,
                socket_errors=result["socket_errors"],
                non_2xx=result["non_2xx"],
            )
        )
    seconds = max(m.seconds for m in pair)
    other_s = (busy_after - busy_before) / CLK_TCK - servers_cpu - (wrk_after - wrk_before)
    for m in pair:
        m.other_load = max(0.0, other_s / seconds)
    return pair[0], pair[1]


def measure(
    setup: Setup, conns: int, args: argparse.Namespace, wrk: str, round_no: int, position: int
) -> tuple[Measurement, Measurement]:
    """One pair, redone (up to ``--retries`` times) while other processes loaded the CPUs."""
    for attempt in range(args.retries + 1):
        pair = measure_pair(setup, conns, args, wrk, round_no, position)
        for m in pair:
            m.retries = attempt
        if pair[0].other_load <= args.max_other_load:
            break
    return pair


def run_rounds(args: argparse.Namespace, wrk: str) -> list[Measurement]:
    measurements: list[Measurement] = []
    others = [
        setup for setup in setups_for(args.server) if setup.key != BASELINE and setup.key in args.setups
    ]
    total = args.rounds * len(args.conns) * len(others)
    rotation = 0
    done = 0
    started = time.monotonic()
    for round_no in range(1, args.rounds + 1):
        for conns in args.conns:
            order = others[rotation % len(others) :] + others[: rotation % len(others)]
            rotation += 1
            for position, setup in enumerate(order):
                bare, m = measure(setup, conns, args, wrk, round_no, position)
                measurements += [bare, m]
                done += 1
                problems = ""
                errors = {
                    key: bare.socket_errors.get(key, 0) + m.socket_errors.get(key, 0)
                    for key in {*bare.socket_errors, *m.socket_errors}
                }
                if errors or bare.non_2xx or m.non_2xx:
                    problems = f"  socket errors {errors} non-2xx {bare.non_2xx + m.non_2xx}"
                redone = f" (after {m.retries} busy)" if m.retries else ""
                print(
                    f"[{done:3d}/{total}] round {round_no} c={conns:<4d} {setup.key:<16s}"
                    f"{m.cpu_us_per_req:8.2f} us/req vs bare {bare.cpu_us_per_req:8.2f}: "
                    f"{m.cpu_us_per_req / bare.cpu_us_per_req:6.3f}  "
                    f"({m.req_per_s:6.0f} + {bare.req_per_s:6.0f} req/s) other {m.other_load:4.0%}{redone}"
                    f"  [{time.monotonic() - started:.0f}s]{problems}",
                    flush=True,
                )
    return measurements


def summarize(
    measurements: list[Measurement],
    rounds: int,
    conns_list: list[int],
    close: bool = False,
    setups: tuple[Setup, ...] = SETUPS,
) -> dict[str, Any]:
    measured = {m.setup for m in measurements}
    # (round, conns, setup, partner) -> measurement; each non-baseline setup ran once per round,
    # beside a bare uvicorn of its own.
    by_key = {(m.round, m.conns, m.setup, m.partner): m for m in measurements}
    table: list[dict[str, Any]] = []
    ratios: dict[tuple[int, str], list[float]] = {}
    for conns in conns_list:
        for setup in setups:
            if setup.key not in measured:
                continue
            if setup.key == BASELINE:
                ms = [m for m in measurements if m.conns == conns and m.setup == BASELINE]
                per_round = [1.0] * rounds
            else:
                ms = [by_key[r, conns, setup.key, BASELINE] for r in range(1, rounds + 1)]
                per_round = [
                    m.cpu_us_per_req / by_key[m.round, conns, BASELINE, setup.key].cpu_us_per_req for m in ms
                ]
            ratios[conns, setup.key] = per_round
            table.append(
                {
                    "setup": setup.key,
                    "label": setup.label,
                    "conns": conns,
                    "req_per_s": statistics.median(m.req_per_s for m in ms),
                    "cpu_us_per_req": statistics.median(m.cpu_us_per_req for m in ms),
                    "cpu_ratio": statistics.median(per_round),
                    "cpu_ratio_min": min(per_round),
                    "cpu_ratio_max": max(per_round),
                    "server_cpu_util": statistics.median(m.server_cpu_util for m in ms),
                    "other_load": statistics.median(m.other_load for m in ms),
                    "user_share": statistics.median(m.user_share for m in ms),
                }
            )
    targets: list[dict[str, Any]] = []
    for conns in conns_list:
        for key, ceiling in (CEILINGS_CLOSE if close else CEILINGS).items():
            if key not in measured:
                continue
            value, interval = statistics.median(ratios[conns, key]), median_interval(ratios[conns, key])
            targets.append(
                {
                    "conns": conns,
                    "target": f"{key} CPU/request vs bare <= {ceiling:.2f}",
                    "value": value,
                    "met": value <= ceiling,
                    "interval": interval,
                    "told": tells(interval, ceiling),
                }
            )
        for key in CEILINGS:
            for alternative in ALTERNATIVES:
                if key not in measured or alternative not in measured:
                    continue
                # Each ratio is to the bare uvicorn measured beside it, in the same round.
                paired = [a / b for a, b in zip(ratios[conns, key], ratios[conns, alternative], strict=True)]
                value, interval = statistics.median(paired), median_interval(paired)
                targets.append(
                    {
                        "conns": conns,
                        "target": f"{key} CPU/request vs {alternative} < 1",
                        "value": value,
                        "met": value < 1.0,
                        "interval": interval,
                        "told": tells(interval, 1.0),
                    }
                )
    return {"table": table, "targets": targets}


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    print(
        f"Medians of {args.rounds} round(s), {args.duration:g} s per run, loop {args.loop}, "
        f"{'a connection per request (Connection: close)' if args.close else 'keep-alive'}; "
        f"on {args.server}; ratio = CPU/request over the bare app's in the same round, median [min..max]"
    )
    header = (
        f"{'setup':<38s} {'conns':>5s} {'req/s':>8s} {'CPU us/req':>10s}  {'ratio vs bare':<22s} "
        f"{'server':>6s} {'other':>6s}"
    )
    print(header)
    print("-" * len(header))
    for row in summary["table"]:
        spread = f"{row['cpu_ratio']:.3f} [{row['cpu_ratio_min']:.3f}..{row['cpu_ratio_max']:.3f}]"
        print(
            f"{row['label']:<38s} {row['conns']:>5d} {row['req_per_s']:>8.0f} "
            f"{row['cpu_us_per_req']:>10.2f}  {spread:<22s} {row['server_cpu_util']:>6.0%} "
            f"{row['other_load']:>6.0%}"
        )
    print(
        "server: the server's CPU use during the runs (1 CPU = 100%); other: CPU used on the two CPUs "
        "by other processes"
    )
    print()
    print("Targets (median across rounds):")
    for target in summary["targets"]:
        verdict = "met" if target["met"] else "MISSED"
        interval = target["interval"]
        if interval is not None:
            verdict += "  " + worded(interval, 4, target["told"])
        print(f"  c={target['conns']:<4d} {target['target']:<48s} {target['value']:.4f}  {verdict}")
    if args.quick:
        print("  (--quick is a smoke test: 1 s runs without warm-up are too noisy to judge the targets)")
    elif args.rounds < 5:
        print(f"  (only {args.rounds} rounds: indicative; the issue asks for at least 5)")
    elif args.rounds < FEWEST_ROUNDS:
        print(f"  (an interval of the median ratio needs {FEWEST_ROUNDS} rounds or more; {args.rounds} ran)")


# -- the machine ---------------------------------------------------------------------


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def wrk_version(wrk: str) -> str:
    done = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0] if first else "unknown"


def source_digest(folder: Path) -> str:
    """A digest of every Python file in ``folder`` and its subfolders, with their paths."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def connlist_source() -> dict[str, Any]:
    """Which connlist code the servers ran: its folder, the commit, uncommitted changes, a digest."""
    spec = importlib.util.find_spec("connlist")
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(next(iter(spec.submodule_search_locations)))
    info: dict[str, Any] = {"path": str(folder), "sha256": source_digest(folder)}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "."],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return info
    if commit.returncode == 0:
        info["commit"] = commit.stdout.strip()
        info["uncommitted"] = [line[3:] for line in status.stdout.splitlines()]
    return info


def machine(wrk: str) -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvicorn": version("uvicorn"),
        "gunicorn": version("gunicorn"),
        "starlette": version("starlette"),
        "httptools": version("httptools"),
        "uvloop": version("uvloop"),
        "connlist": version("connlist"),
        "wrk": wrk_version(wrk),
        "connlist_source": connlist_source(),
    }


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5)")
    # wrk takes whole seconds.
    parser.add_argument("--duration", type=int, help="seconds per wrk run (default 3)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="seconds of wrk before each measured run (default 1; 0: none)"
    )
    parser.add_argument("--conns", type=int, nargs="+", help="wrk connection counts (default 50 500)")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop of every server"
    )
    parser.add_argument("--server-cpu", type=int, default=0, help="CPU the server is pinned to (default 0)")
    parser.add_argument("--client-cpu", type=int, default=1, help="CPU wrk is pinned to (default 1)")
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.5,
        help="redo a pair during which other processes used more than this many CPUs (default 0.5; "
        "a pair is slowed alike, but a busy machine shares its caches)",
    )
    parser.add_argument(
        "--retries", type=int, default=1, help="times a run is redone for other load (default 1)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 3 rounds of 1 s runs, no warm-up (about a minute)"
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count instructions per request instead: runs benchmarks/per_request.py (in process, "
        "under valgrind's callgrind) for every setup on --loop",
    )
    parser.add_argument(
        "--setups",
        nargs="+",
        choices=[setup.key for setup in SETUPS if setup.key != BASELINE],
        help="the setups measured, each beside a bare server of its own (default: all that --server serves)",
    )
    parser.add_argument(
        "--server",
        choices=SERVERS,
        default="uvicorn",
        help="the server of every setup and of its bare partner (default uvicorn; gunicorn: gunicorn's own "
        "ASGI worker, gunicorn -k asgi, one worker)",
    )
    parser.add_argument(
        "--close",
        action="store_true",
        help="every request with Connection: close (a connection per request, as nginx's default "
        "proxy_pass sends); the targets are then per connection",
    )
    parser.add_argument("--json", metavar="PATH", help="write every measurement and the summary here")
    args = parser.parse_args(argv)
    if args.quick:
        defaults = (3, 1, [50, 500])
        args.warmup = 0
    else:
        defaults = (5, 3, [50, 500])
    args.rounds = defaults[0] if args.rounds is None else args.rounds
    args.duration = defaults[1] if args.duration is None else args.duration
    args.conns = list(dict.fromkeys(defaults[2] if args.conns is None else args.conns))
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0 or args.retries < 0:
        parser.error("--rounds must be >= 1, --duration > 0, --warmup >= 0 and --retries >= 0")
    served = [setup.key for setup in setups_for(args.server) if setup.key != BASELINE]
    if args.setups is None:
        args.setups = served
    elif unserved := [key for key in args.setups if key not in served]:
        parser.error(
            f"--server {args.server} cannot serve --setups {' '.join(unserved)} (each names a uvicorn "
            f"protocol); it serves: {' '.join(served)}"
        )
    return args


def cpus_problem(server_cpu: int, client_cpu: int, client: str) -> str | None:
    """Why the server and its ``client`` cannot be pinned to CPUs of their own, or None."""
    if shutil.which("taskset") is None:
        return "taskset not found: install it with `apt-get install util-linux`"
    allowed = os.sched_getaffinity(0)
    if server_cpu == client_cpu or not {server_cpu, client_cpu} <= allowed:
        return (
            f"needs two distinct CPUs for the server ({server_cpu}) and {client} ({client_cpu}); "
            f"this process may use {sorted(allowed)}"
        )
    return None


def exit_on_sigterm(signum: int, frame: object) -> None:
    """A SIGTERM handler that unwinds (SystemExit): the running servers and clients are stopped too."""
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.callgrind:
        import per_request

        return per_request.main(["--loops", args.loop])
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    wrk = shutil.which("wrk")
    if wrk is None:
        print(WRK_MISSING, file=sys.stderr)
        return 2
    problem = cpus_problem(args.server_cpu, args.client_cpu, "wrk")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    if args.loop == "uvloop" and version("uvloop") is None:
        print("uvloop is not installed: pip install uvloop, or pass --loop asyncio", file=sys.stderr)
        return 2
    if args.server == "gunicorn" and not gunicorn_asgi.installed():
        print(
            f"--server gunicorn needs gunicorn's ASGI worker ({gunicorn_asgi.MODULE}): "
            "pip install 'gunicorn>=25.1'",
            file=sys.stderr,
        )
        return 2
    info = machine(wrk)
    print(
        f"{info['nproc']} CPUs ({info['cpu_model']}), Python {info['python']}, uvicorn {info['uvicorn']}, "
        f"gunicorn {info['gunicorn']}, "
        f"{info['wrk']}; server on CPU {args.server_cpu}, wrk on CPU {args.client_cpu}, loop {args.loop}"
    )
    source = info["connlist_source"]
    if source:
        changed = ", ".join(source.get("uncommitted", [])) or "none"
        print(
            f"connlist from {source['path']} at {source.get('commit', '?')} "
            f"(uncommitted changes: {changed}; sha256 {source['sha256']})"
        )
    try:
        measurements = run_rounds(args, wrk)
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    summary = summarize(measurements, args.rounds, args.conns, args.close, setups_for(args.server))
    print_summary(summary, args)
    source_end = connlist_source()
    if source_end.get("sha256") != source.get("sha256"):
        print(
            "WARNING: connlist's source changed during the benchmark "
            f"({source.get('sha256')} -> {source_end.get('sha256')}): rounds measured different code"
        )
    if args.json:
        report = {
            "machine": info,
            "connlist_source_end": source_end,
            "settings": {
                "rounds": args.rounds,
                "duration": args.duration,
                "warmup": args.warmup,
                "conns": args.conns,
                "loop": args.loop,
                "server": args.server,
                "close": args.close,
                "server_cpu": args.server_cpu,
                "client_cpu": args.client_cpu,
                "clk_tck": CLK_TCK,
                "max_other_load": args.max_other_load,
                "retries": args.retries,
            },
            "setups": [asdict(setup) for setup in setups_for(args.server)],
            "measurements": [asdict(m) for m in measurements],
            **summary,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(target["met"] for target in summary["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
