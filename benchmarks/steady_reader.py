"""Steady slow readers of a large response: are they served, or cut by the send timeout?

A reader asks for ``GET /large`` and reads the response at a steady rate
(``--rate`` bytes per second, in reads of a tenth of a second's worth),
optionally after a fast start (``--fast-start`` bytes read at full speed,
which lets Linux grow the receive buffer), with an optional receive buffer
(``--rcvbuf``, ``SO_RCVBUF`` before connecting) and segment size
(``--mss``, ``TCP_MAXSEG`` before connecting: loopback's own MSS is about
64 KiB, a path on the internet has 1460).  Several readers run at once,
one thread each.  A reader is *kept* if it read for ``--duration`` seconds
(or the whole response) without an error, *cut* if the server reset or
closed the connection first (with the time it happened).

While they read, the server's side of each connection is sampled every
second with ``ss -tin`` (iproute2): ``bytes_acked`` and ``snd_wnd`` show
when, and in what steps, the client's kernel acknowledged the response,
and ``--trace`` prints each step (the time since the previous one, and its
size).

Usage (against a server started by the script, connlist at its defaults)::

    python3 benchmarks/steady_reader.py --serve --rate 1024 2048 10240 --duration 400
    python3 benchmarks/steady_reader.py --serve --rate 1024 2048 10240 --mss 1460 --fast-start 4000000
    python3 benchmarks/steady_reader.py --port 8000 --rate 1024 --trace   # a server of yours

``--serve`` runs ``benchmarks/attack_apps.py``'s app (``with_connlist``, or
``bare`` with ``--bare``) under uvicorn with connlist's httptools protocol,
on a free port of 127.0.0.1, with a ``/large`` of ``--size`` bytes.
Exits 0 when every reader was kept, 1 when one was cut.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass
class Reader:
    rate: int
    rcvbuf: int | None
    mss: int | None
    fast_start: int
    local_port: int = 0
    received: int = 0
    outcome: str = "running"  # kept, complete, reset, closed, error
    at: float = 0.0  # seconds since the reader's start
    # (seconds since start, bytes_acked, snd_wnd) whenever bytes_acked moved.
    steps: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def label(self) -> str:
        parts = [f"{self.rate} B/s"]
        if self.rcvbuf:
            parts.append(f"rcvbuf {self.rcvbuf}")
        if self.mss:
            parts.append(f"mss {self.mss}")
        if self.fast_start:
            parts.append(f"fast start {self.fast_start}")
        return ", ".join(parts)


def read(reader: Reader, port: int, path: str, duration: float, ready: threading.Event) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reader.rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, reader.rcvbuf)
    if reader.mss:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, reader.mss)
    sock.settimeout(duration + 60)
    started = time.monotonic()
    try:
        sock.connect(("127.0.0.1", port))
        reader.local_port = sock.getsockname()[1]
        ready.set()
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        while reader.received < reader.fast_start:
            data = sock.recv(65536)
            if not data:
                reader.outcome = "closed"
                return
            reader.received += len(data)
        tick = 0.1
        chunk = max(1, int(reader.rate * tick))
        next_read = time.monotonic()
        while time.monotonic() - started < duration:
            want = chunk
            while want > 0:
                data = sock.recv(want)
                if not data:
                    reader.outcome = "complete" if reader.received else "closed"
                    return
                reader.received += len(data)
                want -= len(data)
            next_read += tick
            time.sleep(max(0.0, next_read - time.monotonic()))
        reader.outcome = "kept"
    except ConnectionResetError:
        reader.outcome = "reset"
    except OSError as exc:
        reader.outcome = f"error: {exc}"
    finally:
        reader.at = time.monotonic() - started
        ready.set()
        sock.close()


_SS_FIELD = re.compile(r"\b(bytes_acked|snd_wnd):(\d+)")


def sample_server_side(port: int, readers: list[Reader], started: float, stop: threading.Event) -> None:
    """Every second, the server's end of each reader's connection as ``ss -tin`` shows it."""
    last: dict[int, int] = {}
    while not stop.wait(1.0):
        try:
            out = subprocess.run(
                ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        now = time.monotonic() - started
        # A socket's line, then its details on indented lines.
        sockets: list[list[str]] = []
        for line in out.splitlines():
            if line[:1].isspace() and sockets:
                sockets[-1].append(line)
            else:
                sockets.append([line])
        by_peer = {reader.local_port: reader for reader in readers}
        for head, *rest in sockets:
            details = " ".join(rest)
            fields = head.split()
            if len(fields) < 4:
                continue
            reader = by_peer.get(int(fields[3].rsplit(":", 1)[1]) if ":" in fields[3] else -1)
            if reader is None:
                continue
            values = {name: int(value) for name, value in _SS_FIELD.findall(details)}
            acked = values.get("bytes_acked", 0)
            if acked != last.get(reader.local_port):
                last[reader.local_port] = acked
                reader.steps.append((round(now, 1), acked, values.get("snd_wnd", -1)))


@contextlib.contextmanager
def server(size: int, bare: bool) -> Any:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, CONNLIST_ATTACK_LARGE=str(size))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "uvicorn", "attack_apps:bare" if bare else "attack_apps:with_connlist"]
    command += ["--http", "httptools" if bare else "connlist.uvicorn:HttpToolsProtocol"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    process = subprocess.Popen(command, cwd=HERE, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, help="a server already listening on 127.0.0.1")
    parser.add_argument("--serve", action="store_true", help="start attack_apps' app under uvicorn")
    parser.add_argument("--bare", action="store_true", help="with --serve: the app alone, no connlist")
    parser.add_argument("--size", type=int, default=16 * 1024 * 1024, help="with --serve: /large's size")
    parser.add_argument("--path", default="/large")
    parser.add_argument("--rate", type=int, nargs="+", default=[1024, 2048, 10240], help="bytes/s")
    parser.add_argument("--rcvbuf", type=int, help="SO_RCVBUF of each reader (default: the kernel's)")
    parser.add_argument("--mss", type=int, help="TCP_MAXSEG of each reader")
    parser.add_argument("--fast-start", type=int, default=0, help="bytes read at full speed first")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds each reader reads")
    parser.add_argument("--trace", action="store_true", help="print each acknowledgement step")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if not args.serve and not args.port:
        parser.error("give --port, or --serve")
    readers = [Reader(rate, args.rcvbuf, args.mss, args.fast_start) for rate in args.rate]
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(server(args.size, args.bare)) if args.serve else args.port
        started = time.monotonic()
        threads = []
        for reader in readers:
            ready = threading.Event()
            thread = threading.Thread(target=read, args=(reader, port, args.path, args.duration, ready))
            thread.start()
            ready.wait(10)
            threads.append(thread)
        stop = threading.Event()
        sampler = threading.Thread(target=sample_server_side, args=(port, readers, started, stop))
        sampler.start()
        for thread in threads:
            thread.join()
        stop.set()
        sampler.join()
    cut = False
    for reader in readers:
        gaps = [b[0] - a[0] for a, b in zip(reader.steps, reader.steps[1:], strict=False)]
        longest = max(gaps, default=0.0)
        print(
            f"{reader.label}: {reader.outcome} at {reader.at:.1f}s, {reader.received} bytes read; "
            f"{len(reader.steps)} acknowledgement steps, longest gap {longest:.0f}s"
        )
        if args.trace:
            for a, b in zip(reader.steps, reader.steps[1:], strict=False):
                print(f"    +{b[0] - a[0]:6.1f}s  {b[1] - a[1]:9d} bytes  (t={b[0]:.0f}s, snd_wnd {b[2]})")
        cut = cut or reader.outcome not in ("kept", "complete")
    if args.json:
        args.json.write_text(json.dumps([asdict(reader) for reader in readers], indent=1))
    return 1 if cut else 0


if __name__ == "__main__":
    sys.exit(main())
