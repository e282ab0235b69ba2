"""Instructions per request of each end-to-end setup, in one process, to the hundred.

``benchmarks/e2e.py`` measures real servers under ``wrk``; this script isolates
what a setup adds to one request, with nothing else moving, so that a change to
a hook can be judged before it is measured end to end.

Method.  For each setup of ``benchmarks/e2e_apps.py`` (the same five as
``e2e.py``), a child process builds uvicorn's ``Config`` for the setup's app and
``--http`` protocol, runs the ASGI lifespan, connects one protocol instance to
an in-memory transport (it records what uvicorn writes, and is never slow), and
runs N iterations of a workload (``--workloads``) on the event loop, waiting
for each response to complete:

``keep-alive``
    N ``GET /`` requests one after the other on one connection;
``close``
    N connections, each a new protocol instance, ``connection_made``, one
    ``GET /`` with ``Connection: close``, the response (uvicorn closes the
    transport) and ``connection_lost``, while ``OTHERS`` (10) connections stay
    idle after a request each, as on a server in use: what a proxy that
    opens a connection per request (nginx's default ``proxy_pass``), HTTP/1.0
    clients and health checks cost;
``close-alone``
    the same with no other connection open.

Every setup runs on both loops: uvloop
(what ``uvicorn[standard]`` installs, and what production servers run) and
asyncio's own.  The child runs under
valgrind's callgrind with ``PYTHONHASHSEED=0``, once with N = 500 and once with
N = 1,500; instructions per request = the difference of the two totals / 1,000,
so that start-up, imports and the lifespan cancel out: what is left is
per request (``keep-alive``) or per connection (the others).

Memory layouts.  Two runs of the same child agree to within a few
instructions, but where objects land in memory moves a setup's count by a
few hundred, sometimes a thousand: which of obmalloc's pools a request
empties and refills, which attribute names collide in CPython's type cache.
A change elsewhere in the code, a longer ``sys.path`` or another environment
moves them too, so one layout's difference of a few hundred between two
setups can be luck (measured: bare uvicorn read 179,044 to 179,716 over eight
layouts, ASGI-only mode 185,319 to 186,371).  So each child first allocates a
ballast of its layout's size, before anything else is imported (layout 0 has
none) and runs with an environment variable of its layout's length, each
setup is measured in ``--layouts`` layouts (5 by default), and the table
gives each setup's median, with the range; the percentages compare medians.
pyperf spreads its runs over processes for the same reason.  Even so, two
series of medians can differ by a few hundred (the integration on asyncio's
loop read +2.09% and +2.42% under two parents' environments), so a
difference of a few tenths of a percent is within the noise.

What it leaves out: the kernel (socket reads and writes, about 30% of a real
server's CPU, the same for every setup), and the batching of many
connections' requests per event-loop turn.  What it keeps: every instruction
of uvicorn, httptools, Starlette and connlist for one request.

Usage::

    python3 benchmarks/per_request.py                   # every setup, both loops, keep-alive and close
    python3 benchmarks/per_request.py --workloads close close-alone --setups connlist
    python3 benchmarks/per_request.py --setups bare connlist --loops uvloop
    python3 benchmarks/per_request.py --layouts 1       # one layout: a quick look, within a few hundred

Needs valgrind (``apt-get install valgrind``) and, for the uvloop runs, uvloop
(``pip install 'connlist[bench]'``).  Exits 0, or 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SMALL, LARGE = 500, 1500
LAYOUTS = 5
# The ballast of layout k: k * BALLAST_STEP bytes objects of assorted lengths
# (0 to 480), so that the pools of obmalloc's size classes (it serves objects
# of up to 512 bytes) shift.
BALLAST_STEP = 64
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: per_request\r\n\r\n"
CLOSE_REQUEST = REQUEST[:-2] + b"Connection: close\r\n\r\n"
# The workloads: N requests on one reused connection; N connections of one
# ``Connection: close`` request each, with OTHERS connections idle beside them
# (a server in use), or alone.
WORKLOADS = ("keep-alive", "close", "close-alone")
OTHERS = 10


class MemoryTransport(asyncio.Transport):
    """What uvicorn's protocol needs of a transport; it keeps a count of what was written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(self.writes) < 4:
            self.writes.append(bytes(data))
        else:
            self.writes[-1] = b""  # keep the count bounded: only the first writes are checked

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        # As a socket's transport says (asyncio's, a Python method: len of its
        # buffer), for a client that takes every byte at once.
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


async def drive(
    app_spec: str,
    http: str,
    requests: int,
    report: dict[str, Any] | None = None,
    workload: str = "keep-alive",
) -> None:
    """Serve ``requests`` requests of ``workload`` (see ``WORKLOADS``) on in-memory connections.

    ``report`` (for the tests) receives the number of responses, the
    connlist enforcer the lifespan handed over (``HANDOVER``), if any, and the number of
    connections made.
    """
    from uvicorn.config import Config
    from uvicorn.lifespan.on import LifespanOn
    from uvicorn.server import ServerState

    config = Config(load(app_spec), http=http, lifespan="on", log_level="warning", access_log=False)
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    server_state = ServerState()
    made = 0

    def connect() -> tuple[Any, MemoryTransport]:
        nonlocal made
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state=lifespan.state
        )
        transport = MemoryTransport()
        protocol.connection_made(transport)
        made += 1
        return protocol, transport

    async def serve(protocol: Any, transport: MemoryTransport, request: bytes) -> None:
        protocol.data_received(request)
        while not protocol.cycle.response_complete:
            await asyncio.sleep(0)
        if not transport.writes or not transport.writes[0].startswith(b"HTTP/1.1 200 "):
            raise SystemExit(f"{app_spec} with {http}: unexpected answer {transport.writes[:1]!r}")

    responses = 0
    idle: list[Any] = []
    if workload == "keep-alive":
        protocol, transport = connect()
        for _ in range(requests):
            await serve(protocol, transport, REQUEST)
            responses += 1
        idle.append(protocol)
    else:
        # Connections idle after one request each, as on a server in use.
        for _ in range(OTHERS if workload == "close" else 0):
            protocol, transport = connect()
            await serve(protocol, transport, REQUEST)
            idle.append(protocol)
        for _ in range(requests):
            protocol, transport = connect()
            await serve(protocol, transport, CLOSE_REQUEST)
            if not transport.closing:
                raise SystemExit(f"{app_spec} with {http}: the server did not close after Connection: close")
            # What the loop does once the transport it was told to close is gone.
            protocol.connection_lost(None)
            responses += 1
    if report is not None:
        from connlist.core.handover import HANDOVER

        report["responses"] = responses
        report["connections"] = made
        report["enforcer"] = HANDOVER.enforcer
    for protocol in idle:
        protocol.connection_lost(None)
    await lifespan.shutdown()


LOOPS = ("uvloop", "asyncio")


def ballast(layout: int) -> list[bytes]:
    """What the child of memory layout ``layout`` allocates and keeps before importing anything."""
    return [bytes(i * 7919 % 481) for i in range(layout * BALLAST_STEP)]


_ballast: list[bytes] = []


def child(app_spec: str, http: str, requests: int, loop: str, layout: int, workload: str) -> None:
    # Kept to the end: freed, it would leave holes that the imports fill.
    _ballast[:] = ballast(layout)
    sys.path.insert(0, str(HERE))
    report: dict[str, Any] = {}
    if loop == "uvloop":
        import uvloop

        uvloop.run(drive(app_spec, http, requests, report, workload=workload))
    else:
        asyncio.run(drive(app_spec, http, requests, report, workload=workload))
    check_mode(app_spec, http, report["enforcer"])


def check_mode(app_spec: str, http: str, enforcer: Any) -> None:
    """Exit if connlist ran in another mode than the setup's: a class that failed its self-check, say.

    Its protocol then falls back to uvicorn's and the middleware to
    ASGI-only mode, which would be measured under the setup's name.  (Read
    after the run: the same for both children of a pair, it cancels out.)
    """
    from setups import SETUPS

    expected = {(setup.app, setup.http): setup.mode for setup in SETUPS}.get((app_spec, http))
    mode = None if enforcer is None else enforcer.mode
    if mode != expected:
        raise SystemExit(
            f"{app_spec} with {http}: connlist ran in mode {mode!r}, not the setup's {expected!r}"
        )


def child_env(layout: int) -> dict[str, str]:
    """The environment of a child of memory layout ``layout``."""
    return dict(
        os.environ,
        PYTHONHASHSEED="0",
        # Both children of a pair must start alike: one that writes the .pyc
        # files the other then reads would not cancel out (a first run after
        # a change read 14,600 instructions per request too many so).
        PYTHONDONTWRITEBYTECODE="1",
        # The layout also shifts what the interpreter allocates before any
        # code of ours runs: the environment is copied into os.environ at
        # start-up (a longer environment alone moved a setup by up to 800).
        CONNLIST_BENCH_LAYOUT="-" * (layout * 41),
    )


def under_callgrind(
    script: Path, args: list[str], layout: int, what: str, prefix: tuple[str, ...] = (), timeout: float = 900
) -> tuple[int, str]:
    """``script --child args`` under callgrind, in layout ``layout``'s environment: instructions, stderr.

    ``prefix``: a command the run goes through (``faketime``, say); ``what``
    names the run in the error that a failed one raises.
    """
    command = [
        *prefix,
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(script),
        "--child",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(layout), timeout=timeout)
    match = re.search(r"(?:Collected|refs):\s*([\d,]+)", done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"valgrind run failed ({what}):\n{done.stdout}{done.stderr[-3000:]}")
    return int(match.group(1).replace(",", "")), done.stderr


def instructions(app_spec: str, http: str, requests: int, loop: str, layout: int, workload: str) -> int:
    args = [app_spec, http, str(requests), loop, str(layout), workload]
    what = f"{app_spec}, {http}, {loop}, layout {layout}, {workload}"
    return under_callgrind(Path(__file__).resolve(), args, layout, what)[0]


def per_request(app_spec: str, http: str, loop: str, layout: int, workload: str) -> int:
    small = instructions(app_spec, http, SMALL, loop, layout, workload)
    large = instructions(app_spec, http, LARGE, loop, layout, workload)
    return round((large - small) / (LARGE - SMALL))


def layouts_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--layouts must be a whole number of at least 1, got {text!r}")
    return value


# What each workload's table counts per iteration.
UNITS = {
    "keep-alive": "per request on a reused connection",
    "close": f"per connection (one request, Connection: close; {OTHERS} other connections idle)",
    "close-alone": "per connection (one request, Connection: close; no other connection)",
}


def table(
    setups: list[Any],
    loops: list[str],
    results: dict[tuple[str, str], list[int]],
    baseline: str,
    workload: str = "keep-alive",
) -> list[str]:
    """The report: each setup's median over the layouts, against the baseline's median, and the range."""
    count = len(next(iter(results.values())))
    lines = [
        f"User-space instructions {UNITS[workload]}, in process (N = {LARGE:,} minus N = {SMALL:,}), "
        f"median of {count} memory layout{'s' if count > 1 else ''} [range]:",
        (f"  {'setup':<38s}" + "".join(f"  {loop + ' (vs bare)':<44s}" for loop in loops)).rstrip(),
    ]
    for setup in setups:
        cells = []
        for loop in loops:
            values, bare = results[setup.key, loop], round(statistics.median(results[baseline, loop]))
            value = round(statistics.median(values))
            cells.append(
                f"  {value:>9,d} {value - bare:>+8,d} {(value / bare - 1) * 100:>+6.2f}%"
                f" [{min(values):,}..{max(values):,}]".ljust(46)
            )
        lines.append(f"  {setup.label:<38s}" + "".join(cells).rstrip())
    return lines


def main(argv: list[str] | None = None) -> int:
    # Here, not at the top: a child imports nothing it does not run.
    sys.path.insert(0, str(HERE))
    from setups import BASELINE, SETUP_BY_KEY, SETUPS

    keys = [setup.key for setup in SETUPS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", choices=keys, default=keys, help="setups to measure")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="event loops")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs at a time")
    parser.add_argument(
        "--layouts",
        type=layouts_count,
        default=LAYOUTS,
        help=f"memory layouts each setup is measured in (default {LAYOUTS}; see the docstring)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=["keep-alive", "close"],
        help="requests on a reused connection, a connection per request beside idle ones, or alone",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print(
            "valgrind not found: install it with `apt-get install valgrind` (Debian/Ubuntu)", file=sys.stderr
        )
        return 2
    loops = [loop for loop in LOOPS if loop in args.loops]
    if "uvloop" in loops and importlib.util.find_spec("uvloop") is None:
        print("uvloop not found: pip install 'connlist[bench]' (or pass --loops asyncio)", file=sys.stderr)
        return 2
    setups = [setup for setup in SETUPS if setup.key in args.setups]
    if BASELINE not in args.setups:
        setups.insert(0, SETUP_BY_KEY[BASELINE])
    workloads = [workload for workload in WORKLOADS if workload in args.workloads]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {
            (workload, setup.key, loop, layout): pool.submit(
                per_request, setup.app, setup.http, loop, layout, workload
            )
            for workload in workloads
            for layout in range(args.layouts)
            for setup in setups
            for loop in loops
        }
        results: dict[str, dict[tuple[str, str], list[int]]] = {workload: {} for workload in workloads}
        for (workload, key, loop, _), future in futures.items():
            results[workload].setdefault((key, loop), []).append(future.result())
    print("\n\n".join("\n".join(table(setups, loops, results[w], BASELINE, w)) for w in workloads))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7])
    else:
        sys.exit(main())
