"""Instructions per request and per connection on gunicorn's own ASGI worker: bare, and with connlist.

``per_request.py``'s method (valgrind's callgrind, N = 1,500 minus N = 500,
the same memory layouts, both loops), for gunicorn's ASGI protocol
(``gunicorn -k asgi``): a child process builds a stand-in of gunicorn's
worker (gunicorn's own ``Config``: ``--keep-alive 2``, the python parser),
runs the ASGI lifespan with gunicorn's ``LifespanManager``, connects one
protocol (gunicorn's, or ``connlist.gunicorn.ASGIProtocol`` with the
middleware's enforcer) to an in-memory transport and feeds it N keep-alive
``GET /`` requests, each once the connection loop waits for the next
(gunicorn's keep-alive armed).  ``--per-connection`` serves N connections of
one ``Connection: close`` request each instead (N = 300 minus N = 100).

The apps are ``e2e_apps.bare`` and ``e2e_apps.with_connlist``.  The fast
parser (gunicorn_h1c) is left out: valgrind cannot run its SSE 4.2 code.

Usage::

    python3 benchmarks/per_request_gunicorn.py                       # both loops, 5 layouts
    python3 benchmarks/per_request_gunicorn.py --loops asyncio --layouts 1
    python3 benchmarks/per_request_gunicorn.py --per-connection

Needs valgrind and gunicorn (and uvloop for its runs).  Exits 0, or 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from per_request import LAYOUTS, LOOPS, MemoryTransport, _ballast, ballast, under_callgrind  # noqa: E402

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: per_request\r\n\r\n"
CLOSE = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: per_request\r\nConnection: close\r\n\r\n"
SETUPS = {"bare": "bare gunicorn -k asgi", "connlist": "connlist on gunicorn -k asgi"}
COUNTS = {False: (500, 1500), True: (100, 300)}


class Transport(MemoryTransport):
    """``per_request``'s transport, with what gunicorn's protocol asks of a socket's."""

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def can_write_eof(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class Log:
    """gunicorn's logger, silent, with no access log (as by default)."""

    access_log_enabled = False

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        pass

    debug = info = warning = error = exception = critical = access = _nothing


class Worker:
    """What gunicorn's ASGI protocol reads of ``gunicorn.workers.gasgi.ASGIWorker``."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        from gunicorn.config import Config

        self.cfg = Config()
        self.cfg.set("keepalive", 2)
        self.cfg.set("http_parser", "python")
        self.log = Log()
        self.asgi = app
        self.loop = loop
        self.state: dict[str, Any] = {}
        self.nr_conns = 0
        self.nr = 0
        self.max_requests = sys.maxsize
        self.alive = True


def protocol_class(setup: str) -> type[Any]:
    if setup == "bare":
        from gunicorn.asgi.protocol import ASGIProtocol

        return ASGIProtocol  # type: ignore[no-any-return]
    import connlist.gunicorn

    cls = connlist.gunicorn.ASGIProtocol
    if not isinstance(getattr(cls, "connlist_mode", None), str):
        raise SystemExit("connlist's gunicorn class did not pass its self-check")
    return cls


async def drive(
    setup: str, requests: int, per_connection: bool, report: dict[str, Any] | None = None
) -> None:
    """Serve ``requests`` requests: keep-alive on one connection, or one per connection."""
    from gunicorn.asgi.lifespan import LifespanManager

    import e2e_apps

    app = e2e_apps.bare if setup == "bare" else e2e_apps.with_connlist
    worker = Worker(app, asyncio.get_running_loop())
    lifespan = LifespanManager(app, worker.log, worker.state)
    await lifespan.startup()
    cls = protocol_class(setup)
    served = 0
    if per_connection:
        for _ in range(requests):
            protocol = cls(worker)
            transport = Transport()
            protocol.connection_made(transport)
            protocol.data_received(CLOSE)
            while not transport.closing:
                await asyncio.sleep(0)
            protocol.connection_lost(None)
            served += 1
    else:
        protocol = cls(worker)
        transport = Transport()
        protocol.connection_made(transport)
        for _ in range(requests):
            protocol.data_received(REQUEST)
            await asyncio.sleep(0)
            while not protocol._awaiting_request:
                await asyncio.sleep(0)
            served += 1
        protocol.connection_lost(None)
    if not transport.writes or not transport.writes[0].startswith(b"HTTP/1.1 200 "):
        raise SystemExit(f"{setup}: unexpected answer {transport.writes[:1]!r}")
    if report is not None:
        from connlist.core.handover import HANDOVER

        report["responses"] = served
        report["enforcer"] = HANDOVER.enforcer
    await lifespan.shutdown()


def child(setup: str, requests: int, loop: str, layout: int, per_connection: bool) -> None:
    _ballast[:] = ballast(layout)
    from connlist.servers.gunicorn import start as gunicorn_asgi_start

    # connlist's class checked on the python parser only: valgrind cannot run gunicorn_h1c's.
    gunicorn_asgi_start._FastConfig.http_parser = "python"
    if loop == "uvloop":
        import uvloop

        uvloop.run(drive(setup, requests, per_connection))
    else:
        asyncio.run(drive(setup, requests, per_connection))


def instructions(setup: str, requests: int, loop: str, layout: int, per_connection: bool) -> int:
    args = [setup, str(requests), loop, str(layout), str(int(per_connection))]
    what = f"{setup}, {loop}, layout {layout}"
    return under_callgrind(Path(__file__).resolve(), args, layout, what, timeout=1800)[0]


def per_unit(setup: str, loop: str, layout: int, per_connection: bool) -> int:
    small, large = COUNTS[per_connection]
    first = instructions(setup, small, loop, layout, per_connection)
    second = instructions(setup, large, loop, layout, per_connection)
    return round((second - first) / (large - small))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    parser.add_argument("--layouts", type=int, default=LAYOUTS)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--per-connection", action="store_true", help="one Connection: close request each")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found: install it with `apt-get install valgrind`", file=sys.stderr)
        return 2
    if importlib.util.find_spec("gunicorn") is None:
        print("gunicorn not found: pip install 'connlist[gunicorn]'", file=sys.stderr)
        return 2
    loops = [loop for loop in LOOPS if loop in args.loops]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {
            (setup, loop, layout): pool.submit(per_unit, setup, loop, layout, args.per_connection)
            for layout in range(max(1, args.layouts))
            for setup in SETUPS
            for loop in loops
        }
        results: dict[tuple[str, str], list[int]] = {}
        for (setup, loop, _), future in futures.items():
            results.setdefault((setup, loop), []).append(future.result())
    unit = "connection (one Connection: close request)" if args.per_connection else "keep-alive request"
    print(f"User-space instructions per {unit}, median of {max(1, args.layouts)} layouts [range]:")
    for loop in loops:
        bare = statistics.median(results["bare", loop])
        for setup, label in SETUPS.items():
            values = results[setup, loop]
            value = statistics.median(values)
            print(
                f"  {loop:<8s} {label:<30s} {value:>10,.0f} {(value / bare - 1) * 100:>+6.2f}%"
                f" [{min(values):,}..{max(values):,}]"
            )
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1")
    else:
        sys.exit(main())
