"""Scale benchmark: thousands of idle keep-alive connections, their mass close, bare uvicorn against connlist.

Method.  For each setup (``bare`` and ``connlist`` of ``benchmarks/setups.py``),
each event loop and each count N, a fresh ``python -m uvicorn`` (the setup's
app and ``--http``, ``--timeout-keep-alive 5``, ``--log-level warning``) is
served on a free port of 127.0.0.1, pinned to CPU 0 (``taskset``), and asked
which connlist mode it runs in where connlist is in it.  This process, the
load side, is pinned to CPU 1:

1. warm-up: 100 connections (at most N) each send ``GET /`` and read the
   answer, then close; once the server holds no more descriptors than before
   them, its RSS (``VmRSS`` of ``/proc/PID/status``) is the baseline;
2. load: N connections are opened, at most 100 at a time (asyncio, raw
   sockets), each sends one ``GET / HTTP/1.1`` and reads the whole answer, and
   stays open: an idle keep-alive connection.  They go idle one after the
   other over the time this takes, as on a real server, so their keep-alive
   deadlines are spread alike;
3. once all N are idle (none closed yet, or the run fails): memory per idle
   connection = (RSS now - baseline) / N; the server's CPU time (schedstat,
   or utime + stime of ``/proc/PID/stat`` where the kernel has no schedstat)
   is read and the probe starts;
4. the probe, a process of its own on CPU 1, sends ``GET /`` every 10 ms on
   one keep-alive connection and records how long each whole answer took.
   One connection, not one per request: a request every 10 ms keeps it from
   ever idling 5 s, and what it measures is how long the loop leaves a ready
   request waiting (the stalls), not the price of accepting a connection,
   which the instruction counts of ``per_request.py`` measure.  It shares CPU 1
   with the load side, which only does one ``recv`` per connection closed,
   but all at once when the server closes many at once: the probe runs at
   a higher priority (nice ``PROBE_NICE``) where this process may give it
   one (root, or CAP_SYS_NICE), so that it does not wait for them, and the
   report says when it could not;
5. the load side waits (epoll, bounded) until the server has closed every one
   of the N (EOF or reset); at the last the server's CPU time is read again
   and the probe stops.  CPU = the difference: the idle time, the probe's
   requests (about 100 a second, the same for both setups) and the mass
   close at the keep-alive deadline.  The time to close all N is from the
   first EOF to the last; "late" is how long after the last connection's
   own deadline (when it went idle + the keep-alive) it was closed.  "In
   the close" is the worst latency of the probe's requests sent from the
   last before the first EOF to the last EOF: the stall the mass
   close makes, without the machine's own over the idle time (the probe
   and the load side read the same monotonic clock);
6. all along, the server has recorded how long its loop worked between two
   polls of its sockets, each time it did so for 20 us or more
   (``loop_busy.c``, loaded into it), and whether the kernel gave its CPU
   to another task meanwhile.  Of those that ended from 50 ms before the
   first EOF to 50 ms after the last, and that the kernel did not
   interrupt so (those are the machine's stalls as much as the server's),
   "busy" is the longest, the loop's longest stall in the close measured
   where it happens, without the probe's own time on the network, on CPU 1
   and in the client; "busy p99" is their 99th percentile, which the
   machine's rare hiccups move less.

Rounds interleave the setups (the order turns every measurement); the report
gives, per loop, N and setup, the medians over the rounds, and connlist's
ratio to bare for CPU, for the worst latency, for the worst in the close
and for the loop's longest stall in the close (the median of the ratios
within each round), and from 6 rounds on an interval that holds the
median ratio with 95% confidence, whatever the
rounds' noise (``intervals.median_interval``): where it holds 1, the rounds cannot
tell the setups apart.  Targets (issue #34): at 5,000 idle connections and
more, connlist's CPU, its worst latency (over the whole time, and in the
close) and its loop's longest stall in the close are no more than bare's,
and its memory per idle connection is within 1 KiB of bare's.

Descriptors: the server and this process each need N plus a margin.  The
soft limit (RLIMIT_NOFILE) is raised up to the hard limit, which children
inherit; an N above the hard limit is skipped with a message (raise the hard
limit, e.g. ``ulimit -Hn`` as root or systemd's ``LimitNOFILE``).  connlist
derives its default connection budget from that limit; an N above 80% of
it runs connlist pressed (a shorter keep-alive), which the script says.
Where the hard limit cannot be raised, ``--budget off`` serves connlist
with no budget (``max_connections=0``, the ``connlist-no-budget`` setup):
the list alone, as a default budget far above N would leave it, up to N =
the hard limit less the margin.

Usage::

    python3 benchmarks/scale.py                             # 1,000 5,000 20,000; both loops; 3 rounds
    python3 benchmarks/scale.py --counts 1000 5000 --loops asyncio --rounds 1
    python3 benchmarks/scale.py --json scale.json
    python3 benchmarks/scale.py --counts 19800 --budget off   # near 20,000 under a hard limit of 20,000

Leaves out: other servers and parsers (httptools only), requests with a
body, clients that are slow or never send (``mass_timeout.py``, ``attacks.py``),
and the kernel's memory per socket (RSS is the process's own).  One worker;
the load side and the probe share a CPU.

Needs ``taskset`` (util-linux), a C compiler (``cc``, for ``loop_busy.c``),
two CPUs and, for ``--loops uvloop``, uvloop.  Loopback only; bounded in
connections and in time (about 15 s per measurement at 20,000).  Exits 0
when every target is met, 1 when one is missed, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import math
import os
import resource
import select
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import loop_busy
from e2e import CLK_TCK, BenchError, Server, cpu_ns, cpu_ticks, cpus_problem, exit_on_sigterm, version
from intervals import FEWEST_ROUNDS, median_interval, tells, worded
from mass_timeout import _raise_fd_limit as raise_fd_limit
from mass_timeout import _request as request_on
from setups import BASELINE, SETUP_BY_KEY, Setup

HERE = Path(__file__).resolve().parent
COMPARED = (BASELINE, "connlist")
# connlist with no budget, for --budget off (this script's alone: not in the others' defaults).
NO_BUDGET = Setup(
    "connlist-no-budget",
    "connlist, no connection budget",
    "e2e_apps:with_connlist_no_budget",
    "connlist.uvicorn:HttpToolsProtocol",
    mode="uvicorn-httptools",
)
SETUPS = {**SETUP_BY_KEY, NO_BUDGET.key: NO_BUDGET}
# connlist's setup by --budget: its default budget, or none.
CONNLIST_BY_BUDGET = {"default": "connlist", "off": NO_BUDGET.key}
COUNTS = (1000, 5000, 20000)
LOOPS = ("uvloop", "asyncio")
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
# Descriptors beyond the N, in the server and here (listening socket, epoll, pipes, the probe, imports).
FD_MARGIN = 128
WARMUP = 100
# Connections being opened at once (below uvicorn's default backlog of 2048).
BATCH = 100
PROBE_INTERVAL = 0.010
# The probe stops by itself after this long, whatever happens here.
PROBE_LIMIT = 300.0
# The probe's niceness, where it may be raised (the load side's is 0).
PROBE_NICE = -10
# At or above this N, the targets are judged (the 5,000 and 20,000).
TARGET_FROM = 5000
# The loop's stall in the close: its stretches without a poll that ended from
# this long before the first EOF the load side saw to this long after the
# last (a sweep goes on after its first close; the losses follow the last).
CLOSE_MARGIN = 0.05
MEMORY_SLACK_KIB = 1.0


@dataclass
class Result:
    round: int
    loop: str
    setup: str
    n: int
    kib_per_conn: float
    rss_base_kib: int
    rss_idle_kib: int
    # Server CPU seconds from all N idle until the last was closed.
    cpu_s: float
    probe_requests: int
    probe_errors: int
    # The probe's niceness (PROBE_NICE, or 0 where it could not be raised).
    probe_nice: int
    probe_median_ms: float
    probe_p99_ms: float
    probe_worst_ms: float
    # The worst of the probe's requests sent from the last before the first
    # close to the last close (the mass close's stalls, without the idle
    # time's: ``close_latencies``), and how many there were.
    close_worst_ms: float
    close_probes: int
    # The longest the server's loop worked without polling, in the close
    # (``loop_busy``; from CLOSE_MARGIN before the first close to as long after
    # the last), and the 99th percentile, of the stretches the kernel did not
    # preempt; how many it did.
    close_busy_ms: float
    close_busy_p99_ms: float
    close_preempted: int
    # Seconds the N took to open (first idle to last idle).
    open_s: float
    # Seconds from the first EOF to the last.
    close_s: float
    # Milliseconds from the last connection's own deadline to its close.
    late_ms: float
    # Of the N, how many the server closed within the bound.
    closed: int


# -- the server's process ------------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchError(f"no VmRSS in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    ns = cpu_ns(pid)
    if ns is not None:
        return ns / 1e9
    user, system = cpu_ticks(pid)
    return (user + system) / CLK_TCK


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit_problem(n: int) -> str | None:
    """Raise the soft descriptor limit to the hard one; what is wrong if that is too low for N connections.

    The soft limit goes all the way up, as on a server set up for many
    connections: connlist derives its default connection budget from it.
    """
    need = n + FD_MARGIN
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        return (
            f"skipping N={n}: it needs {need} descriptors in the server and here, the hard limit "
            f"(RLIMIT_NOFILE) is {hard}; raise it (ulimit -Hn as root, systemd's LimitNOFILE) "
            f"or pass --counts at most {hard - FD_MARGIN}"
        )
    raise_fd_limit(hard if hard != resource.RLIM_INFINITY else need)
    return None


def pressure_note(n: int) -> str | None:
    """Whether connlist's default budget, derived from the soft limit, would run pressed with N connections.

    Pressed, it shortens the keep-alive (and wakes every ``PRESSURE_TICK``):
    a measurement of its budget, not of the list.
    """
    from connlist.core.checks import default_max_connections
    from connlist.core.enforcer import PRESSURE_WATERMARK

    budget = default_max_connections()
    if budget and n > PRESSURE_WATERMARK * budget:
        return (
            f"note: N={n} is above {PRESSURE_WATERMARK:.0%} of connlist's default budget ({budget}, from "
            f"the soft descriptor limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}): connlist runs "
            "pressed there and shortens the keep-alive; raise the hard limit to measure the list alone"
        )
    return None


# -- the load side -------------------------------------------------------------------


async def _open_idle_one(port: int) -> socket.socket:
    """One connection that sent ``GET /`` and read the whole answer: idle from now on."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, REQUEST)
        data = b""
        while True:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                raise BenchError(f"a load connection was closed before its answer: {data[:80]!r}")
            data += chunk
            end = data.find(b"\r\n\r\n")
            if end < 0:
                continue
            head = data[:end].split(b"\r\n")
            if not head[0].startswith(b"HTTP/1.1 200 "):
                raise BenchError(f"GET / answered {head[0]!r}")
            length = next(
                int(line.split(b":", 1)[1]) for line in head if line.lower().startswith(b"content-length:")
            )
            if len(data) >= end + 4 + length:
                return sock
    except BaseException:
        sock.close()
        raise


async def _open_idle(port: int, n: int, timeout: float) -> list[tuple[socket.socket, float]]:
    gate = asyncio.Semaphore(BATCH)

    async def one() -> tuple[socket.socket, float]:
        async with gate:
            sock = await asyncio.wait_for(_open_idle_one(port), 10)
            return sock, time.monotonic()

    tasks = [asyncio.ensure_future(one()) for _ in range(n)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is None:
                task.result()[0].close()
        raise
    return [task.result() for task in tasks]


def open_idle(port: int, n: int) -> list[tuple[socket.socket, float]]:
    """N idle keep-alive connections, each with the time it went idle (bounded: 30 s + 1 ms each)."""
    try:
        return asyncio.run(_open_idle(port, n, 30 + n / 1000))
    except (OSError, asyncio.TimeoutError) as error:
        raise BenchError(f"opening {n} connections failed: {error!r}") from None


class Closes:
    """The load side's sockets, watched (epoll) for the server's close: an EOF or a reset."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.selector = selectors.DefaultSelector()
        for sock in socks:
            self.selector.register(sock, selectors.EVENT_READ)
        self.left = len(socks)
        self.times: list[float] = []

    def wait(self, deadline: float) -> None:
        """Record the closes until none is left or ``deadline`` (looks at least once)."""
        while self.left:
            remaining = deadline - time.monotonic()
            for key, _ in self.selector.select(min(max(remaining, 0.0), 1.0)):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:  # a reset is a close too
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    self.times.append(time.monotonic())
                    self.left -= 1
            if remaining <= 0:
                return

    def close(self) -> None:
        self.selector.close()


def warm_up(server: Server, n: int) -> None:
    """A few connections served and closed; return once the server has let go of their descriptors."""
    before = open_fds(server.pid)
    for sock, _ in open_idle(server.port, n):
        sock.close()
    deadline = time.monotonic() + 10
    while open_fds(server.pid) > before:
        if time.monotonic() > deadline:
            raise BenchError("the server kept the warm-up's connections open for 10 s")
        time.sleep(0.01)


# -- the probe (a process of its own) ------------------------------------------------


def probe(port: int) -> None:
    """Say ``ready``, wait for a line on stdin, then ``GET /`` every 10 ms until the next; print latencies.

    Requests go out on a fixed 10 ms schedule; after a stall the next goes
    at once and the schedule restarts from there (no burst of catch-up).
    """
    stdin = sys.stdin.fileno()
    print("ready", flush=True)  # started: what probe_process waits for
    if not os.read(stdin, 64):
        return
    latencies: list[float] = []
    sent_at: list[float] = []
    errors = 0
    sock: socket.socket | None = None
    started = next_at = time.monotonic()
    try:
        while time.monotonic() - started < PROBE_LIMIT:
            ready, _, _ = select.select([stdin], [], [], max(0.0, next_at - time.monotonic()))
            if ready:
                break
            next_at = max(next_at + PROBE_INTERVAL, time.monotonic())
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sent = time.perf_counter()
                # On the clock the load side stamps the closes with.
                at = time.monotonic()
                request_on(sock, "/")
                latencies.append(time.perf_counter() - sent)
                sent_at.append(at)
            except OSError:
                errors += 1
                if sock is not None:
                    sock.close()
                sock = None
    finally:
        if sock is not None:
            sock.close()
    print(json.dumps({"latencies": latencies, "sent_at": sent_at, "errors": errors}), flush=True)


@contextlib.contextmanager
def probe_process(port: int) -> Iterator[subprocess.Popen[str]]:
    """The probe, started (Python's start-up out of the way) but not yet sending; always stopped."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--probe-port", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=HERE,
    )
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, process.pid, PROBE_NICE)
    try:
        # Its start-up (seconds on a busy machine) must not eat into the time it measures.
        assert process.stdout is not None
        if process.stdout.readline() != "ready\n":
            raise BenchError("the probe did not start")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def close_latencies(sent_at: list[float], latencies: list[float], ends: list[float]) -> list[float]:
    """The latencies of the probe's requests sent during the mass close (``ends``: the closes' times).

    From the last request sent before the first close (the close may have
    held it up), or the first one if none was, to the last close: at least
    one, however quickly the closes come, as long as the probe sent any by then.
    """
    if not ends:
        return []
    first = max(bisect.bisect_right(sent_at, ends[0]) - 1, 0)
    last = bisect.bisect_right(sent_at, ends[-1])
    return latencies[first:last]


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


# -- one measurement -----------------------------------------------------------------


def measure(
    setup_key: str,
    loop: str,
    n: int,
    library: Path,
    *,
    keep_alive: int = 5,
    cpu: int = 0,
    round_no: int = 1,
) -> Result:
    """One fresh server, N idle keep-alive connections, their mass close; the server stopped at the end.

    ``library``: ``loop_busy.build``'s, loaded into the server.
    """
    setup = SETUPS[setup_key]
    extra = ("--timeout-keep-alive", str(keep_alive))
    socks: list[socket.socket] = []
    busy_out = library.parent / f"busy-{os.getpid()}-{setup_key}-{loop}-{n}-{round_no}.bin"
    busy_out.unlink(missing_ok=True)
    wrapper = loop_busy.wrapper(library, busy_out)
    with Server(setup, loop=loop, cpu=cpu, extra=extra, wrapper=wrapper) as server:
        try:
            server.wait_ready()
            warm_up(server, min(WARMUP, n))
            rss_base = rss_kib(server.pid)
            with probe_process(server.port) as prober:
                probe_nice = os.getpriority(os.PRIO_PROCESS, prober.pid)
                opened = open_idle(server.port, n)
                socks = [sock for sock, _ in opened]
                rss_idle = rss_kib(server.pid)
                first_idle = min(at for _, at in opened)
                last_idle = max(at for _, at in opened)
                closes = Closes(socks)
                try:
                    closes.wait(time.monotonic())
                    if closes.times:
                        raise BenchError(
                            f"{len(closes.times)} of the {n} connections were closed before the last was "
                            f"open (opening took {last_idle - first_idle:.1f} s): pass a longer --keep-alive"
                        )
                    cpu_before = cpu_seconds(server.pid)
                    assert prober.stdin is not None
                    prober.stdin.write("go\n")
                    prober.stdin.flush()
                    closes.wait(last_idle + keep_alive + max(10.0, 2.0 * keep_alive))
                    cpu_after = cpu_seconds(server.pid)
                finally:
                    closes.close()
                prober.stdin.write("stop\n")
                prober.stdin.flush()
                try:
                    out, _ = prober.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    raise BenchError("the probe did not stop within 30 s") from None
            if server.process.poll() is not None:
                raise BenchError(f"{setup.key}: uvicorn died during the run:\n{server.output()}")
        finally:
            for sock in socks:
                sock.close()
    try:
        report = json.loads(out)
    except ValueError:
        raise BenchError(f"the probe printed {out[:200]!r}") from None
    latencies = sorted(report["latencies"])
    ends = closes.times
    if not latencies:
        raise BenchError("the probe got no answer")
    in_close = close_latencies(report["sent_at"], report["latencies"], ends)
    try:
        stretches, dropped = loop_busy.read(busy_out)
    except ValueError as error:
        raise BenchError(f"{setup.key}: the loop's stalls: {error}") from None
    finally:
        busy_out.unlink(missing_ok=True)
    if dropped:
        raise BenchError(f"{setup.key}: the server had no room for {dropped} of its loop's stalls")
    in_window = loop_busy.within(stretches, ends[0] - CLOSE_MARGIN, ends[-1] + CLOSE_MARGIN) if ends else []
    own = sorted(s.length for s in in_window if not s.preempted)
    return Result(
        round=round_no,
        loop=loop,
        setup=setup.key,
        n=n,
        kib_per_conn=(rss_idle - rss_base) / n,
        rss_base_kib=rss_base,
        rss_idle_kib=rss_idle,
        cpu_s=cpu_after - cpu_before,
        probe_requests=len(latencies),
        probe_errors=report["errors"],
        probe_nice=probe_nice,
        probe_median_ms=statistics.median(latencies) * 1000,
        probe_p99_ms=_percentile(latencies, 0.99) * 1000,
        probe_worst_ms=latencies[-1] * 1000,
        close_worst_ms=max(in_close) * 1000 if in_close else float("nan"),
        close_probes=len(in_close),
        close_busy_ms=own[-1] * 1000 if own else math.nan,
        close_busy_p99_ms=_percentile(own, 0.99) * 1000 if own else math.nan,
        close_preempted=sum(1 for s in in_window if s.preempted),
        open_s=last_idle - first_idle,
        close_s=(ends[-1] - ends[0]) if ends else float("nan"),
        late_ms=(ends[-1] - last_idle - keep_alive) * 1000 if ends else float("nan"),
        closed=len(ends),
    )


# -- the rounds and the report -------------------------------------------------------


def progress(r: Result) -> str:
    """One measurement, as the rounds go."""
    return (
        f"round {r.round} {r.loop:<7s} N={r.n:<6d} {r.setup:<18s} "
        f"{r.kib_per_conn:5.2f} KiB/conn  CPU {r.cpu_s:5.2f} s  probe median "
        f"{r.probe_median_ms:5.2f} p99 {r.probe_p99_ms:6.2f} "
        f"worst {r.probe_worst_ms:6.2f} ms, in the close {r.close_worst_ms:6.2f} ms "
        f"of {r.close_probes}, loop busy {r.close_busy_ms:5.2f} ms, p99 {r.close_busy_p99_ms:5.2f} ms "
        f"({r.close_preempted} preempted)  "
        f"opened in {r.open_s:4.1f} s, closed {r.closed}/{r.n} in {r.close_s:4.1f} s "
        f"(late {r.late_ms:4.0f} ms)"
    )


def run_rounds(
    rounds: int,
    loops: list[str],
    counts: list[int],
    keep_alive: int,
    cpu: int,
    quiet: bool = False,
    compared: tuple[str, str] = COMPARED,
) -> list[Result]:
    results: list[Result] = []
    order = list(compared)
    total = rounds * len(loops) * len(counts) * len(order)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scale-") as directory:
        try:
            library = loop_busy.build(Path(directory))
        except loop_busy.Unavailable as error:
            raise BenchError(f"the loop's stalls cannot be measured: {error}") from None
        for round_no, loop, n in itertools.product(range(1, rounds + 1), loops, counts):
            for key in order:
                r = measure(key, loop, n, library, keep_alive=keep_alive, cpu=cpu, round_no=round_no)
                results.append(r)
                if not quiet:
                    print(
                        f"[{len(results):2d}/{total}] {progress(r)}  [{time.monotonic() - started:.0f}s]",
                        flush=True,
                    )
            # Interleave: the other setup goes first next time.
            order.reverse()
    return results


FIELDS = (
    "kib_per_conn",
    "cpu_s",
    "probe_median_ms",
    "probe_p99_ms",
    "probe_worst_ms",
    "close_worst_ms",
    "close_busy_ms",
    "close_busy_p99_ms",
    "close_s",
    "late_ms",
)
# The figures compared round by round, connlist's over bare's: the field,
# its key in the report's rows (``KEY_ratio``, ``KEY_interval``), and its
# target (None: reported, not judged).
RATIOS = (
    ("cpu_s", "cpu", "CPU vs bare <= 1"),
    ("probe_worst_ms", "worst", "worst latency vs bare <= 1"),
    ("close_worst_ms", "close_worst", "worst in the close vs bare <= 1"),
    ("close_busy_ms", "close_busy", "loop's longest stall in the close vs bare <= 1"),
    ("close_busy_p99_ms", "close_busy_p99", None),
)


def summarize(results: list[Result]) -> dict[str, Any]:
    table: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    keys = sorted({(r.loop, r.n) for r in results}, key=lambda k: (LOOPS.index(k[0]), k[1]))
    # bare, and whichever connlist setup ran (--budget).
    connlist = next(r.setup for r in results if r.setup != BASELINE)
    for loop, n in keys:
        medians: dict[str, dict[str, float]] = {}
        for setup in (BASELINE, connlist):
            rs = [r for r in results if (r.loop, r.n, r.setup) == (loop, n, setup)]
            medians[setup] = {name: statistics.median(getattr(r, name) for r in rs) for name in FIELDS}
            table.append(
                {
                    "loop": loop,
                    "n": n,
                    "setup": setup,
                    "rounds": len(rs),
                    "closed_all": all(r.closed == n for r in rs),
                    "probe_errors": sum(r.probe_errors for r in rs),
                    **medians[setup],
                }
            )
        by_round = {(r.round, r.setup): r for r in results if (r.loop, r.n) == (loop, n)}
        rounds = sorted({r for r, _ in by_round})
        judged: list[tuple[str, float, tuple[float, float] | None, float]] = []
        for field, key, target in RATIOS:
            per_round = [
                getattr(by_round[r, connlist], field) / getattr(by_round[r, BASELINE], field) for r in rounds
            ]
            ratio, interval = statistics.median(per_round), median_interval(per_round)
            table[-1][f"{key}_ratio"] = ratio
            table[-1][f"{key}_interval"] = interval
            if target is not None:
                judged.append((target, ratio, interval, 1.0))
        if n >= TARGET_FROM:
            memory = medians[connlist]["kib_per_conn"] - medians[BASELINE]["kib_per_conn"]
            judged.append(
                (f"memory/conn - bare's <= {MEMORY_SLACK_KIB:g} KiB", memory, None, MEMORY_SLACK_KIB)
            )
            for name, value, interval, ceiling in judged:
                targets.append(
                    {
                        "loop": loop,
                        "n": n,
                        "target": name,
                        "value": value,
                        "met": value <= ceiling,
                        "interval": interval,
                        "told": tells(interval, ceiling),
                    }
                )
    return {
        "table": table,
        "targets": targets,
        "probe_prioritized": all(r.probe_nice == PROBE_NICE for r in results),
    }


def print_summary(summary: dict[str, Any], rounds: int, keep_alive: int) -> None:
    print()
    print(
        f"Medians of {rounds} round(s); --timeout-keep-alive {keep_alive}; CPU: the server's, from all N "
        "idle to the last closed; probe: GET / every 10 ms over that time; in close: the worst of the "
        "probes sent during the mass close; busy: the server loop's longest stall in the close (p99: "
        "the 99th percentile of its stalls there); "
        "closed in: first close to last"
    )
    header = (
        f"{'loop':<7s} {'N':>6s} {'setup':<18s} {'KiB/conn':>8s} {'CPU s':>6s} {'median':>7s} {'p99':>7s} "
        f"{'worst':>7s} {'in close':>8s} {'busy':>7s} {'p99':>7s} {'closed in':>9s} {'late':>7s}  "
        f"{'vs bare: CPU, worst, in close, busy, p99':<42s}"
    )
    print(header)
    print("-" * len(header))
    for row in summary["table"]:
        ratio = ", ".join(f"{row[f'{key}_ratio']:.2f}x" for _, key, _ in RATIOS) if "cpu_ratio" in row else ""
        flags = "" if row["closed_all"] else "  NOT ALL CLOSED"
        if row["probe_errors"]:
            flags += f"  {row['probe_errors']} probe errors"
        print(
            f"{row['loop']:<7s} {row['n']:>6d} {row['setup']:<18s} {row['kib_per_conn']:>8.2f} "
            f"{row['cpu_s']:>6.2f} {row['probe_median_ms']:>5.2f}ms {row['probe_p99_ms']:>5.2f}ms "
            f"{row['probe_worst_ms']:>5.1f}ms {row['close_worst_ms']:>6.1f}ms {row['close_busy_ms']:>5.2f}ms "
            f"{row['close_busy_p99_ms']:>5.2f}ms {row['close_s']:>8.2f}s {row['late_ms']:>5.0f}ms  "
            f"{ratio:<42s}{flags}"
        )
    print("(ratios: the median over rounds of connlist's figure over bare's in the same round)")
    if not summary["probe_prioritized"]:
        print(
            f"(the probe could not be given nice {PROBE_NICE}, which needs root or CAP_SYS_NICE: it shared "
            "CPU 1 with the load side at the same priority, and waited for it during the closes)"
        )
    for row in summary["table"]:
        for _, key, target in RATIOS:
            interval = row.get(f"{key}_interval")
            if target is None and interval is not None:
                print(
                    f"  {row['loop']:<7s} N={row['n']:<6d} {key} vs bare (reported, not a target): "
                    f"{row[f'{key}_ratio']:.3f} {worded(interval, 3)}"
                )
    if summary["targets"]:
        print()
        print("Targets (issue #34):")
        for t in summary["targets"]:
            verdict = "met" if t["met"] else "MISSED"
            interval = t["interval"]
            if interval is not None:
                verdict += "  " + worded(interval, 3, t["told"])
            print(f"  {t['loop']:<7s} N={t['n']:<6d} {t['target']:<34s} {t['value']:7.3f}  {verdict}")
        if rounds < 3:
            print(f"  (only {rounds} round(s): indicative)")
        elif rounds < FEWEST_ROUNDS:
            print(f"  (an interval of the median ratio needs {FEWEST_ROUNDS} rounds or more; {rounds} ran)")


# -- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--counts",
        type=int,
        nargs="+",
        default=list(COUNTS),
        help="idle connections (default 1000 5000 20000)",
    )
    parser.add_argument(
        "--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="event loops (default both)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--keep-alive", type=int, default=5, help="uvicorn's --timeout-keep-alive, whole seconds (default 5)"
    )
    parser.add_argument("--server-cpu", type=int, default=0, help="CPU the server is pinned to (default 0)")
    parser.add_argument(
        "--client-cpu", type=int, default=1, help="CPU the load side and the probe are pinned to (default 1)"
    )
    parser.add_argument(
        "--budget",
        choices=sorted(CONNLIST_BY_BUDGET),
        default="default",
        help="connlist's connection budget: its default, from the descriptor limit, or none "
        "(max_connections=0: the list alone where the hard limit cannot be raised; default: default)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every measurement and the summary here")
    parser.add_argument("--probe-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.counts = list(dict.fromkeys(args.counts))
    args.loops = list(dict.fromkeys(args.loops))
    if args.rounds < 1 or args.keep_alive < 1 or min(args.counts) < 1:
        parser.error("--rounds, --keep-alive and every --counts must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe_port is not None:
        probe(args.probe_port)
        return 0
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    problem = cpus_problem(args.server_cpu, args.client_cpu, "the load")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    if "uvloop" in args.loops and version("uvloop") is None:
        print("uvloop is not installed: pip install uvloop, or pass --loops asyncio", file=sys.stderr)
        return 2
    counts = []
    for n in args.counts:
        problem = fd_limit_problem(n)
        if problem is None:
            counts.append(n)
        else:
            print(problem, file=sys.stderr)
    if args.budget == "default":  # with none, nothing presses
        for n in counts:
            note = pressure_note(n)
            if note is not None:
                print(note, file=sys.stderr)
    if not counts:
        print("no count can run under this descriptor limit", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {args.client_cpu})
    print(
        f"Python {sys.version.split()[0]}, uvicorn {version('uvicorn')}, uvloop {version('uvloop')}; "
        f"server on CPU {args.server_cpu}, load and probe on CPU {args.client_cpu}; "
        f"descriptor limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}",
        flush=True,
    )
    try:
        compared = (BASELINE, CONNLIST_BY_BUDGET[args.budget])
        results = run_rounds(
            args.rounds, args.loops, counts, args.keep_alive, args.server_cpu, compared=compared
        )
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    summary = summarize(results)
    print_summary(summary, args.rounds, args.keep_alive)
    if args.json:
        report = {
            "settings": {
                "rounds": args.rounds,
                "loops": args.loops,
                "counts": counts,
                "keep_alive": args.keep_alive,
                "budget": args.budget,
                "server_cpu": args.server_cpu,
                "client_cpu": args.client_cpu,
            },
            "results": [asdict(r) for r in results],
            **summary,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(t["met"] for t in summary["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
