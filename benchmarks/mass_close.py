"""Instructions per connection of a mass close, in one process: bare uvicorn's timers, connlist's sweep.

``benchmarks/scale.py`` measures the mass close on real sockets, in seconds of
CPU, which move by 10% or more from run to run on a shared machine; this
script counts what the server runs for it, as ``per_request.py`` counts a
request, so that a change to the sweep can be judged before it is measured
end to end.

Method.  For each setup (``bare`` and ``connlist`` of ``benchmarks/setups.py``)
and each loop, a child process runs the ASGI lifespan and opens N in-memory
connections (``per_request.py``'s, whose ``close`` the loop follows with
``connection_lost`` at its next iteration, as a socket's transport does).
Each sends one ``GET /`` and reads the answer, and stays open: an idle
keep-alive connection.  Then the child either

``close``
    waits until the server has closed all N at its keep-alive time
    (``--timeout-keep-alive``, 1 s) and every ``connection_lost`` has run, or
``idle``
    stops at once,

and exits with ``os._exit`` (no shutdown to count).  The child runs under
valgrind's callgrind; the instructions of the mass close are those of
``close`` minus those of ``idle``, and per connection the difference of
that between N = 3,000 and N = 1,000, / 2,000: what is left is one
connection's keep-alive timeout, its close and its ``connection_lost``,
and the loop's and the sweep's share of them.

The clock.  Under valgrind the child runs about 50 times slower, so on the
real clock its connections would go idle 50 times further apart than on a
server, and reach their keep-alive time one by one rather than together.
libfaketime (``faketime``) slows the child's clock by ``--rate`` (0.05 by
default, about valgrind's slowdown): the connections go idle about as close
together as on a real server (the report gives how close, on the child's
clock: ``scale.py`` reads about 0.1 ms apart), and the mass close batches as
it would there.  Bare uvicorn closes each connection with its own timer,
whatever the spacing; connlist's sweep closes the connections due within 20
ms together, at most 16 a sweep, a sweep a millisecond.

What it leaves out: the kernel (the sockets' close, the same for both), the
probe's requests of ``scale.py``, and where the memory lands (``--layouts``
of ``per_request.py``: a few hundred instructions).

Usage::

    python3 benchmarks/mass_close.py                     # bare and connlist, both loops
    python3 benchmarks/mass_close.py --loops uvloop --layouts 1

Needs valgrind and faketime (``apt-get install valgrind faketime``) and, for
``--loops uvloop``, uvloop.  Exits 0, or 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import per_request  # noqa: E402
from per_request import REQUEST, MemoryTransport, ballast, check_mode, load, under_callgrind  # noqa: E402

SMALL, LARGE = 1000, 3000
KEEP_ALIVE = 1.0
RATE = 0.05
SETUP_KEYS = ("bare", "connlist")
PHASES = ("close", "idle")
LOOPS = per_request.LOOPS


class ClosingTransport(MemoryTransport):
    """``per_request``'s transport; the loop follows its ``close`` with ``connection_lost``, as a socket's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, closed: Closed) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: Any = None
        self.closed = closed

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self._lost)

    def _lost(self) -> None:
        self.protocol.connection_lost(None)
        self.closed.one()


class Closed:
    """How many connections were lost, when the first and the last were, and a future for all of them."""

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.count = count
        self.lost = 0
        self.first = self.last = 0.0
        self.all = loop.create_future()

    def one(self) -> None:
        self.lost += 1
        self.last = time.monotonic()
        if self.lost == 1:
            self.first = self.last
        if self.lost == self.count and not self.all.done():
            self.all.set_result(None)


async def drive(
    app_spec: str, http: str, count: int, phase: str, keep_alive: float = KEEP_ALIVE
) -> dict[str, Any]:
    """Open ``count`` idle keep-alive connections; in phase ``close``, wait until the server closed them.

    Returns what the run saw, on the child's clock: how far apart the
    connections went idle (``spacing``), how long the closes took, how many
    the server closed and connlist's enforcer, if any.
    """
    from uvicorn.config import Config
    from uvicorn.lifespan.on import LifespanOn
    from uvicorn.server import ServerState

    from connlist.core.handover import HANDOVER

    loop = asyncio.get_running_loop()
    config = Config(
        load(app_spec),
        http=http,
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]  # uvicorn takes a number of seconds
    )
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    server_state = ServerState()
    closed = Closed(count, loop)
    transports: list[ClosingTransport] = []
    started = time.monotonic()
    for _ in range(count):
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state=lifespan.state
        )
        transport = ClosingTransport(loop, closed)
        transport.protocol = protocol
        protocol.connection_made(transport)
        transports.append(transport)
        protocol.data_received(REQUEST)
        while not protocol.cycle.response_complete:
            await asyncio.sleep(0)
        if not transport.writes or not transport.writes[0].startswith(b"HTTP/1.1 200 "):
            raise SystemExit(f"{app_spec} with {http}: unexpected answer {transport.writes[:1]!r}")
    idle = time.monotonic()
    if closed.lost or any(transport.closing for transport in transports):
        raise SystemExit(f"{app_spec} with {http}: a connection closed before all {count} were idle")
    if phase == "close":
        try:
            # On the child's clock: its keep-alive, and the time they took to go idle, with room.
            await asyncio.wait_for(closed.all, keep_alive * 3 + (idle - started) * 2)
        except asyncio.TimeoutError:
            raise SystemExit(f"{app_spec} with {http}: {closed.lost} of {count} closed in time") from None
    return {
        "spacing": (idle - started) / count,
        "closing": closed.last - closed.first,
        "closed": closed.lost,
        "enforcer": HANDOVER.enforcer,
    }


# The layout's ballast, kept to the end.
_kept: list[bytes] = []


def child(app_spec: str, http: str, count: int, loop: str, layout: int, phase: str) -> None:
    _kept[:] = ballast(layout)  # before anything is imported, as per_request's

    async def run() -> None:
        seen = await drive(app_spec, http, count, phase)
        enforcer = seen["enforcer"]
        check_mode(app_spec, http, enforcer)
        if phase == "close" and enforcer is not None and enforcer.totals.keepalive_timeouts != count:
            raise SystemExit(f"{app_spec}: connlist closed {enforcer.totals.keepalive_timeouts} of {count}")
        print(f"spacing {seen['spacing']:.9f} closing {seen['closing']:.6f}", file=sys.stderr, flush=True)
        # Now, on the loop: no shutdown, nor the loop's end, to count.
        os._exit(0)

    if loop == "uvloop":
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


def instructions(
    app_spec: str, http: str, count: int, loop: str, layout: int, phase: str, rate: float
) -> tuple[int, float]:
    """The child's instructions under callgrind, and how far apart its connections went idle (its clock)."""
    args = [app_spec, http, str(count), loop, str(layout), phase]
    what = f"{app_spec}, {http}, {loop}, N={count}, {phase}"
    total, stderr = under_callgrind(
        Path(__file__).resolve(),
        args,
        layout,
        what,
        prefix=("faketime", "-m", "-f", f"+0 x{rate}"),
        timeout=1800,
    )
    spacing = re.search(r"spacing ([\d.]+)", stderr)
    if spacing is None:
        raise SystemExit(
            f"the child did not say how far apart its connections went idle ({what}):\n{stderr[-3000:]}"
        )
    return total, float(spacing.group(1))


def per_close(app_spec: str, http: str, loop: str, layout: int, rate: float) -> tuple[int, float]:
    """Instructions per connection closed (see the docstring), and the spacing of the large run."""
    totals: dict[tuple[int, str], int] = {}
    spacing = 0.0
    for count in (SMALL, LARGE):
        for phase in PHASES:
            totals[count, phase], seen = instructions(app_spec, http, count, loop, layout, phase, rate)
            if count == LARGE and phase == "close":
                spacing = seen
    small = totals[SMALL, "close"] - totals[SMALL, "idle"]
    large = totals[LARGE, "close"] - totals[LARGE, "idle"]
    return round((large - small) / (LARGE - SMALL)), spacing


def table(
    loops: list[str], results: dict[tuple[str, str], list[tuple[int, float]]], labels: dict[str, str]
) -> list[str]:
    count = len(next(iter(results.values())))
    lines = [
        f"User-space instructions per connection of a mass close (keep-alive {KEEP_ALIVE:g} s), in process "
        f"(N = {LARGE:,} minus N = {SMALL:,}), median of {count} memory layout{'s' if count > 1 else ''} "
        "[range]:",
        (f"  {'setup':<38s}" + "".join(f"  {loop + ' (vs bare)':<40s}" for loop in loops)).rstrip(),
    ]
    for key in SETUP_KEYS:
        cells = []
        for loop in loops:
            values = [value for value, _ in results[key, loop]]
            bare = round(statistics.median(value for value, _ in results["bare", loop]))
            value = round(statistics.median(values))
            cells.append(f"  {value:>7,d} {value / bare:>6.2f}x [{min(values):,}..{max(values):,}]".ljust(42))
        lines.append(f"  {labels[key]:<38s}" + "".join(cells).rstrip())
    spacings = [spacing for runs in results.values() for _, spacing in runs]
    lines.append(
        f"  (the connections went idle {min(spacings) * 1e6:.0f} to {max(spacings) * 1e6:.0f} us apart "
        "on the child's clock)"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    from setups import SETUP_BY_KEY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="event loops")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs at a time")
    parser.add_argument(
        "--layouts",
        type=per_request.layouts_count,
        default=3,
        help="memory layouts each setup is measured in",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=RATE,
        help=f"how fast the child's clock runs (default {RATE}; see the docstring)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.rate <= 1:
        parser.error(f"--rate must be above 0 and at most 1, got {args.rate}")
    for tool in ("valgrind", "faketime"):
        if shutil.which(tool) is None:
            print(
                f"{tool} not found: install it with `apt-get install {tool}` (Debian/Ubuntu)", file=sys.stderr
            )
            return 2
    loops = [loop for loop in LOOPS if loop in args.loops]
    if "uvloop" in loops and importlib.util.find_spec("uvloop") is None:
        print("uvloop not found: pip install 'connlist[bench]' (or pass --loops asyncio)", file=sys.stderr)
        return 2
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {
            (key, loop, layout): pool.submit(
                per_close, SETUP_BY_KEY[key].app, SETUP_BY_KEY[key].http, loop, layout, args.rate
            )
            for layout in range(args.layouts)
            for key in SETUP_KEYS
            for loop in loops
        }
        results: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for (key, loop, _), future in futures.items():
            results.setdefault((key, loop), []).append(future.result())
    print("\n".join(table(loops, results, {key: SETUP_BY_KEY[key].label for key in SETUP_KEYS})))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7])
    else:
        sys.exit(main())
