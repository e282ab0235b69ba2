"""Instructions per request of each end-to-end setup, in one process, to the hundred.

``benchmarks/e2e.py`` measures real servers under ``wrk``; this script isolates
what a setup adds to one request, with nothing else moving, so that a change to
a hook can be judged before it is measured end to end.

Method.  For each setup of ``benchmarks/e2e_apps.py`` (the same five as
``e2e.py``), a child process builds uvicorn's ``Config`` for the setup's app and
``--http`` protocol, runs the ASGI lifespan, connects one protocol instance to
an in-memory transport (it records what uvicorn writes, and is never slow), and
feeds it N keep-alive ``GET /`` requests one after the other on the event loop,
waiting for each response to complete.  Every setup runs on both loops: uvloop
(what ``uvicorn[standard]`` installs, and what production servers run) and
asyncio's own.  The child runs under
valgrind's callgrind with ``PYTHONHASHSEED=0``, once with N = 1,000 and once with
N = 3,000; instructions per request = the difference of the two totals / 2,000,
so that start-up, imports and the lifespan cancel out.  Two runs of the same
setup agree to within a few instructions.

What it leaves out: the kernel (socket reads and writes, about 30% of a real
server's CPU, the same for every setup), and the batching of many
connections' requests per event-loop turn.  What it keeps: every instruction
of uvicorn, httptools, Starlette and connlist for one request.

Usage::

    python3 benchmarks/per_request.py                   # all five setups, both loops: 6 minutes on 2 CPUs
    python3 benchmarks/per_request.py --setups bare connlist --loops uvloop

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
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SMALL, LARGE = 1000, 3000
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: per_request\r\n\r\n"


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

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


async def drive(app_spec: str, http: str, requests: int, report: dict[str, Any] | None = None) -> None:
    """Serve ``requests`` keep-alive requests on one in-memory connection.

    ``report`` (for the tests) receives the number of responses and the
    connlist enforcer the lifespan handed over, if any.
    """
    from uvicorn.config import Config
    from uvicorn.lifespan.on import LifespanOn
    from uvicorn.server import ServerState

    config = Config(load(app_spec), http=http, lifespan="on", log_level="warning", access_log=False)
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state=lifespan.state
    )
    transport = MemoryTransport()
    protocol.connection_made(transport)
    responses = 0
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while not protocol.cycle.response_complete:
            await asyncio.sleep(0)
        responses += 1
    if not transport.writes or not transport.writes[0].startswith(b"HTTP/1.1 200 "):
        raise SystemExit(f"{app_spec} with {http}: unexpected answer {transport.writes[:1]!r}")
    if report is not None:
        from connlist.enforcer import STATE_KEY

        report["responses"] = responses
        report["enforcer"] = lifespan.state.get(STATE_KEY)
    protocol.connection_lost(None)
    await lifespan.shutdown()


LOOPS = ("uvloop", "asyncio")


def child(app_spec: str, http: str, requests: int, loop: str) -> None:
    sys.path.insert(0, str(HERE))
    if loop == "uvloop":
        import uvloop

        uvloop.run(drive(app_spec, http, requests))
    else:
        asyncio.run(drive(app_spec, http, requests))


def instructions(app_spec: str, http: str, requests: int, loop: str) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        app_spec,
        http,
        str(requests),
        loop,
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    match = re.search(r"(?:Collected|refs):\s*([\d,]+)", done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(
            f"valgrind run failed ({app_spec}, {http}, {loop}):\n{done.stdout}{done.stderr[-3000:]}"
        )
    return int(match.group(1).replace(",", ""))


def per_request(app_spec: str, http: str, loop: str) -> int:
    small = instructions(app_spec, http, SMALL, loop)
    large = instructions(app_spec, http, LARGE, loop)
    return round((large - small) / (LARGE - SMALL))


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    import e2e

    keys = [setup.key for setup in e2e.SETUPS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", choices=keys, default=keys, help="setups to measure")
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS), help="event loops")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs at a time")
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
    setups = [setup for setup in e2e.SETUPS if setup.key in args.setups]
    if e2e.BASELINE not in args.setups:
        setups.insert(0, e2e.SETUP_BY_KEY[e2e.BASELINE])
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {
            (setup.key, loop): pool.submit(per_request, setup.app, setup.http, loop)
            for setup in setups
            for loop in loops
        }
        results = {key: future.result() for key, future in futures.items()}
    print(f"User-space instructions per request, in process (N = {LARGE:,} minus N = {SMALL:,}):")
    print(f"  {'setup':<38s}" + "".join(f"  {loop + ' (vs bare)':>32s}" for loop in loops))
    for setup in setups:
        cells = []
        for loop in loops:
            value, bare = results[setup.key, loop], results[e2e.BASELINE, loop]
            cells.append(
                f"  {value:>9,d} {value - bare:>+9,d} {(value / bare - 1) * 100:>+7.2f}% {value / bare:.4f}"
            )
        print(f"  {setup.label:<38s}" + "".join(cells))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(main())
