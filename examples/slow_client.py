"""Play a slowloris client against the example server and watch connlist cut it off.

    python3 examples/serve.py &                 # the example app, headers timeout 10 s
    python3 examples/slow_client.py [--host 127.0.0.1] [--port 8000]

It shows the debug endpoint, then opens a connection that sends a request's
headers one line at a time and never finishes them, prints when the
``408 Request Timeout`` arrives and how long after the first byte, and shows
the debug endpoint again.  It asks for every worker
(``/_connections?workers=all``), so under ``--workers N`` or gunicorn the
slow client shows whichever worker accepted it, and the totals are the
server's.  Stdlib only; everything is bounded in time (``--limit``).  Exit
status 0 when the 408 came, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import socket
import sys
import time
from typing import Any


def get_debug(host: str, port: int, path: str) -> dict[str, Any] | None:
    """The debug endpoint's answer, or None (printing why) if there is none."""
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read()
    except OSError as exc:
        print(f"  (no debug endpoint: {exc})")
        return None
    finally:
        conn.close()
    if response.status != 200:
        print(f"  (no debug endpoint: {response.status} {response.reason} for {path})")
        return None
    answer: dict[str, Any] = json.loads(body)
    return answer


def show_debug(title: str, answer: dict[str, Any] | None) -> None:
    """A ``workers=all`` answer: the sums, and every worker's active connections."""
    if answer is None:
        return
    workers = answer.get("workers") or [answer]  # (an endpoint without workers=all: one worker)
    reached = [worker for worker in workers if not worker.get("unreachable")]
    first = reached[0] if reached else {}
    print(
        f"{title}: {len(workers)} worker(s), pid {', '.join(str(w.get('pid')) for w in workers)}, "
        f"mode {first.get('mode')}, headers timeout {first.get('headers_timeout')}s, "
        f"request timeout {first.get('request_timeout')}s"
    )
    counts = answer.get("counts") or {}
    print("  counts: " + " ".join(f"{name}={value}" for name, value in counts.items()))
    totals = answer.get("totals") or {}
    print("  totals: " + " ".join(f"{name}={value}" for name, value in totals.items()))
    active = [(worker.get("pid"), entry) for worker in reached for entry in worker.get("active") or []]
    if not active:
        print("  active: none")
    for pid, entry in active:
        duration = entry.get("duration")
        took = "" if duration is None else f" for {duration:.2f}s"
        left = entry.get("time_left")
        due = "" if left is None else f", {entry.get('timeout')} timeout in {max(left, 0):.2f}s"
        where = f"{entry.get('client')} {entry.get('state')}{took}{due}"
        print(f"  active: #{entry.get('id')} {where} (worker {pid})")


def slowloris(host: str, port: int, interval: float, limit: float, debug: Any) -> bool:
    """Trickle header lines until the server answers or closes; True if it answered 408."""
    sock = socket.create_connection((host, port), timeout=5)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = "{}:{}".format(*sock.getsockname()[:2])
        print(
            f"slow client {local}: a header line every {interval:.2f}s, never the blank line that ends them"
        )
        sock.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n")
        first_byte = time.monotonic()
        print("  +0.00s sent 'GET / HTTP/1.1' and 'Host'")
        received = b""
        lines = 0
        shown = False
        while time.monotonic() - first_byte < limit:
            readable, _, _ = select.select([sock], [], [], interval)
            elapsed = time.monotonic() - first_byte
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    break  # closed
                received += data
                continue
            if not shown and lines >= 2:
                # Meanwhile, the server's view (another connection, which
                # may reach another worker: it asks for every worker).
                show_debug("debug endpoint while the slow client trickles", debug())
                shown = True
            lines += 1
            try:
                sock.sendall(b"X-Slow-%d: 1\r\n" % lines)
            except (BrokenPipeError, ConnectionResetError):
                break
            print(f"  +{elapsed:.2f}s sent 'X-Slow-{lines}: 1'")
        else:
            print(f"no answer within {limit:g}s: is this connlist's server integration?")
            return False
        took = time.monotonic() - first_byte
    finally:
        sock.close()
    status = received.split(b"\r\n", 1)[0].decode("latin-1")
    if status.startswith("HTTP/1.1 408"):
        print(f"408 arrived after {took:.3f}s (since the first byte): {status!r}, then the connection closed")
        return True
    print(f"the server closed the connection after {took:.3f}s with {status or 'nothing'!r}")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--debug-path", default="/_connections?workers=all")
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between header lines (default: a fifth of the server's headers timeout, at most 1)",
    )
    parser.add_argument("--limit", type=float, default=120.0, help="give up after this many seconds")
    args = parser.parse_args()

    print(f"server http://{args.host}:{args.port}")
    before = get_debug(args.host, args.port, args.debug_path)
    show_debug("debug endpoint before", before)
    interval = args.interval
    if interval is None:
        workers = (before or {}).get("workers") or [before or {}]
        headers_timeout = workers[0].get("headers_timeout") or 5.0
        interval = min(max(headers_timeout / 5, 0.05), 1.0)

    cut_off = slowloris(
        args.host,
        args.port,
        interval,
        args.limit,
        lambda: get_debug(args.host, args.port, args.debug_path),
    )
    show_debug("debug endpoint after", get_debug(args.host, args.port, args.debug_path))
    return 0 if cut_off else 1


if __name__ == "__main__":
    sys.exit(main())
