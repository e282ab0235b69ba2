"""What a request costs a real uvicorn server besides instructions: cache misses and mispredicted branches.

Method.  For each setup of ``setups.py`` (default: ``bare``, ``connlist`` and
``padded``), one ``python -m uvicorn`` (the setup's app and ``--http``,
``--loop``) serves 127.0.0.1 under valgrind's callgrind with its cache and
branch simulation (``--cache-sim=yes --branch-sim=yes``), which counts, in
user space: the instructions executed (``Ir``), the misses of the first
level data cache on reads and on writes (``D1mr``, ``D1mw``) and of its
instruction cache (``I1mr``), and the mispredicted conditional and indirect
branches (``Bcm``, ``Bim``).  ``wrk`` loads it (``-cN``; ``--close``: every
request with ``Connection: close``, a connection per request) for a warm-up,
then the counts are zeroed (``callgrind_control -z``), ``wrk`` runs
``--duration`` seconds more, and the counts are dumped (``-d``): each event
per request is the dump's total over ``wrk``'s requests.  The servers run
one after the other: under valgrind a server is about fifty times slower,
but what it counts does not depend on the machine's load.

Why.  End to end (``e2e.py``) a request's CPU time does not follow its
instructions alone: a miss of the first level cache costs about ten cycles,
a mispredicted branch about fifteen, where an instruction costs a third of
one.  ``padded`` adds about connlist's own instruction count per connection
as a loop that misses nothing, so the two, side by side, tell what connlist's
code costs beyond its count (benchmarks/README.md, "CPU time end to end").
The simulated caches are one process's; on a CPU shared with other work the
misses are more.

Usage::

    python3 benchmarks/server_counts.py --close                # bare, connlist, padded; uvloop; c=50; 10 s
    python3 benchmarks/server_counts.py --setups bare connlist --loop asyncio --duration 5

Needs valgrind (``callgrind_control``), ``wrk`` and ``taskset``; sends its load to
127.0.0.1 only.  Exits 0, or 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e import BenchError, Server, finish_wrk, start_wrk  # noqa: E402
from setups import BASELINE, SETUP_BY_KEY, SETUPS, Setup  # noqa: E402

EVENTS = ("Ir", "D1mr", "D1mw", "I1mr", "Bcm", "Bim")
# Under valgrind a server starts and answers slowly.
READY_TIMEOUT = 300.0


def _dumped(directory: Path) -> dict[str, int]:
    """The totals of callgrind's one dump in ``directory`` (``events:`` and ``summary:`` lines)."""
    # callgrind_control returns once the dump is written.
    dumps = sorted(directory.glob("cg.out.*"))
    if len(dumps) != 1:
        raise BenchError(f"expected one dump of the counts, found {[d.name for d in dumps]}")
    text = dumps[0].read_text(errors="replace")
    names = re.search(r"^events: (.*)$", text, re.M)
    totals = re.search(r"^summary: (.*)$", text, re.M)
    if names is None or totals is None:
        raise BenchError(f"cannot read callgrind's dump {dumps[0]}")
    return dict(zip(names.group(1).split(), map(int, totals.group(1).split()), strict=True))


def _wrk(wrk: str, args: argparse.Namespace, seconds: int, port: int) -> int:
    """``e2e.py``'s ``wrk`` run on ``port`` for ``seconds``: the requests it completed."""
    process = start_wrk(wrk, args.client_cpu, args.conns, seconds, port, close=args.close)
    return int(finish_wrk(process, seconds)["requests"])


def measure(setup: Setup, args: argparse.Namespace, wrk: str) -> dict[str, float]:
    """One server of ``setup`` under callgrind: each event per request, over ``args.duration`` s of wrk."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        wrapper = (
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            "--branch-sim=yes",
            f"--callgrind-out-file={directory}/cg.out",
        )
        with Server(setup, loop=args.loop, cpu=args.server_cpu, wrapper=wrapper) as server:
            server.wait_ready(timeout=READY_TIMEOUT, request_timeout=30.0)
            pid = str(server.pid)  # taskset and valgrind run the interpreter in this process
            _wrk(wrk, args, 3, server.port)
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True, timeout=60)
            requests = _wrk(wrk, args, args.duration, server.port)
            subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True, timeout=60)
            totals = _dumped(directory)
            server.stop(timeout=60)
    if not requests:
        raise BenchError(f"{setup.key}: wrk completed no request")
    per_request = {name: totals.get(name, 0) / requests for name in EVENTS}
    per_request["requests"] = requests
    return per_request


def table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> list[str]:
    base = results.get(BASELINE)
    what = "a connection per request (Connection: close)" if args.close else "keep-alive"
    lines = [
        f"Per request, {what}, wrk -c{args.conns}, {args.duration} s, loop {args.loop}; "
        "callgrind's simulated caches and branch predictor (user space):",
        f"  {'setup':<12}" + "".join(f"{name:>18}" for name in EVENTS) + f"{'requests':>10}",
    ]
    for key, counts in results.items():
        cells = []
        for name in EVENTS:
            cell = f"{counts[name]:,.0f}"
            if base is not None and key != BASELINE and base[name]:
                cell += f" ({counts[name] / base[name]:.3f})"
            cells.append(f"{cell:>18}")
        lines.append(f"  {key:<12}" + "".join(cells) + f"{counts['requests']:>10,.0f}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    keys = [setup.key for setup in SETUPS]
    parser.add_argument("--setups", nargs="+", choices=keys, default=[BASELINE, "connlist", "padded"])
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--conns", type=int, default=50, help="wrk connections (default 50)")
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk counted (default 10)")
    parser.add_argument("--close", action="store_true", help="Connection: close, a connection per request")
    parser.add_argument("--server-cpu", type=int, default=0, help="CPU the server is pinned to (default 0)")
    parser.add_argument("--client-cpu", type=int, default=1, help="CPU wrk is pinned to (default 1)")
    args = parser.parse_args(argv)
    if args.conns < 1 or args.duration < 1:
        parser.error("--conns and --duration must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = shutil.which("wrk")
    tools = (
        ("wrk", wrk),
        ("valgrind", shutil.which("callgrind_control")),
        ("taskset", shutil.which("taskset")),
    )
    missing = [name for name, path in tools if not path]
    if missing or wrk is None:
        print(f"needs {' and '.join(missing)} (apt-get install wrk valgrind util-linux)", file=sys.stderr)
        return 2
    # The same hash seed for every server (the servers inherit this environment).
    os.environ["PYTHONHASHSEED"] = "0"
    results: dict[str, dict[str, float]] = {}
    try:
        for key in args.setups:
            print(f"{key}: serving under callgrind...", file=sys.stderr, flush=True)
            results[key] = measure(SETUP_BY_KEY[key], args, wrk)
    except (BenchError, subprocess.SubprocessError, OSError) as exc:
        print(f"server_counts.py: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(results, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
