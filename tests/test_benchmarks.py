"""The end-to-end benchmark's setups serve requests, and connlist is really in the ones that name it."""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attacks  # noqa: E402
import e2e  # noqa: E402
import e2e_apps  # noqa: E402
import per_request  # noqa: E402


@pytest.mark.parametrize("setup", e2e.SETUPS, ids=lambda setup: setup.key)
def test_each_setup_serves_keep_alive_requests_in_process(setup: e2e.Setup) -> None:
    # Each benchmark server is a process of its own: give each setup fresh apps
    # (a middleware keeps the mode it last saw).
    importlib.reload(e2e_apps)
    state: dict[str, object] = {}

    async def run() -> None:
        await per_request.drive(setup.app, setup.http, 5, state)

    asyncio.run(run())
    assert state["responses"] == 5
    enforcer = state["enforcer"]
    if setup.mode is None:
        assert enforcer is None
    else:
        # The mode the e2e benchmark checks over HTTP, seen from inside.
        assert enforcer is not None and enforcer.mode == setup.mode  # type: ignore[attr-defined]
        assert enforcer.totals.requests == 5  # type: ignore[attr-defined]


# -- benchmarks/attacks.py: what can be checked without running an attack -------------------------

# slowhttptest 1.8.2's -g -o statistics, captured: `-H -c 50 -r 50 -i 5 -l 12` against
# connlist with headers_timeout=4 (it exits as the server closes the last connection,
# before writing another line), ...
CSV_CUT = """Seconds,Closed,Pending,Connected,Service Available
0,0,1,0,50
1,0,0,50,50
2,0,0,50,50
3,0,0,50,50
4,0,0,50,50
5,49,0,1,50
"""
# ... and `-H -c 20 -r 20 -i 2 -l 8 -p 1` against a server stopped (SIGSTOP) for 3 s.
CSV_STOPPED = """Seconds,Closed,Pending,Connected,Service Available
0,0,1,0,20
1,0,0,20,20
2,0,0,20,20
3,0,0,20,20
4,0,0,20,0
5,0,0,20,0
6,0,0,20,0
7,0,0,20,20
8,0,0,20,20
9,0,0,20,20
"""
# The end of the same run's output, colours and all.
OUTPUT_CUT = (
    "Test ended on 5th second\nExit status:\x1b[1;36m No open connections left\n"
    "\x1b[0m\x1b[0;36mCSV report saved to \x1b[1;36m/tmp/sht/h2.csv\n\x1b[0m"
)


def test_attacks_says_how_to_install_slowhttptest(tmp_path: Path) -> None:
    # A PATH without slowhttptest (an empty folder): the script must stop before any server starts.
    env = dict(os.environ, PATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "attacks.py"), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "slowhttptest not found" in done.stderr
    assert "apt-get install slowhttptest" in done.stderr
    assert done.stdout == ""


def test_attacks_reads_slowhttptest_csv() -> None:
    cut = attacks.parse_slowhttptest_csv(CSV_CUT)
    assert len(cut["rows"]) == 6
    assert cut["rows"][5] == {
        "seconds": 5,
        "closed": 49,
        "pending": 0,
        "connected": 1,
        "service available": 50,
    }
    assert (cut["seconds"], cut["connected_max"], cut["opened"]) == (5, 50, 50)
    assert (cut["closed_end"], cut["connected_end"], cut["all_closed_at"]) == (49, 1, None)
    assert cut["unavailable_seconds"] == 0

    stopped = attacks.parse_slowhttptest_csv(CSV_STOPPED)
    assert (stopped["seconds"], stopped["connected_max"], stopped["closed_end"]) == (9, 20, 0)
    assert stopped["unavailable_seconds"] == 3

    # The connected count back to 0 after its peak: the second it did.
    ended = attacks.parse_slowhttptest_csv(CSV_CUT + "6,50,0,0,50\n")
    assert ended["all_closed_at"] == 6

    # Older versions name the same columns in another order, with an Error column.
    old = attacks.parse_slowhttptest_csv("Seconds,Error,Closed,Pending,Connected\n0,0,0,5,0\n1,1,2,0,7\n")
    assert (old["connected_max"], old["closed_end"], old["opened"]) == (7, 2, 10)
    assert "unavailable_seconds" not in old

    with pytest.raises(attacks.BenchError):
        attacks.parse_slowhttptest_csv("Seconds,Closed,Pending,Connected,Service Available\n")


def test_attacks_reads_slowhttptest_exit_status() -> None:
    assert attacks.slowhttptest_exit_status(OUTPUT_CUT) == "No open connections left"
    assert attacks.slowhttptest_exit_status("Test ended on 91th second\n") is None


def test_attacks_sees_the_servers_established_connections() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            client_ports = {client.getsockname()[1] for client in clients}
            assert attacks.established_peers({port}) == {port: client_ports}
            # Closed by the server: no longer established on the server's side.
            accepted[0].close()
            assert attacks.established_peers({port}) == {port: client_ports - {clients[0].getsockname()[1]}}
        finally:
            for sock in accepted + clients:
                sock.close()


def test_attacks_connection_lifetimes_bridge_a_missed_sample() -> None:
    tracker = attacks.ConnectionTracker(0.0)
    samples = [
        (0.5, {1, 2}),
        (1.0, {1, 2}),
        (1.5, {2}),  # 1 left out of one reading of /proc/net/tcp ...
        (2.0, {1, 2}),  # ... and back: the same connection
        (2.5, {1}),  # 2 closed between 2.0 and 2.5
        (3.0, {1}),
        (3.5, {1}),
        (4.0, {1}),
    ]
    for now, peers in samples:
        tracker.sample(now, peers)
    by_port = {lifetime.port: lifetime for lifetime in tracker.lifetimes()}
    assert sorted(by_port) == [1, 2]
    one, two = by_port[1], by_port[2]
    assert (one.first_seen, one.last_seen, one.after, one.gone, one.samples) == (0.5, 4.0, None, False, 7)
    assert (two.last_seen, two.after, two.gone) == (2.0, 2.5, True)
    assert (two.opened, two.closed) == (0.25, 2.25)
