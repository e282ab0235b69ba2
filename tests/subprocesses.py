"""Servers run as real subprocesses (uvicorn, gunicorn, the example scripts) on 127.0.0.1.

Each server is bounded: it gets a free port, readiness is polled with a
deadline, and it is stopped in a ``finally`` (SIGINT to its process group,
then SIGKILL), so no worker outlives the test.

Servers started at the same time (``test_uvicorn_drift.py`` runs several)
must not be given the same port: a port is free between ``free_port`` and
the server's bind, and the kernel may hand it out again meanwhile.  Then
one server fails to bind while the other answers for it.  So ``free_port``
is the benchmarks' (``benchmarks/ports.py``), which never gives a port
twice in a run, one registry for the harness's servers and for those of
the benchmark scripts the tests run in process; and ``run_server`` checks
that what answers is its own process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable

# The benchmark scripts import each other by their names, and so do the tests that run them.
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from ports import free_port  # noqa: E402

# Process startup on a loaded 2-core machine.
START_LIMIT = 30.0


def answered_by(proc: subprocess.Popen[bytes], body: bytes) -> bool:
    """Whether a readiness answer came from ``proc``'s process group, where it says its ``pid``.

    connlist's debug view does (the worker that answered); another answer
    cannot tell, and counts as ``proc``'s.
    """
    try:
        pid = json.loads(body).get("pid")
    except (ValueError, AttributeError):
        return True
    if not isinstance(pid, int):
        return True
    try:
        return os.getpgid(pid) == proc.pid
    except ProcessLookupError:
        return False


def gunicorn_command(port: int, app: str, *options: str, workers: int) -> list[str]:
    """gunicorn with the example config and ``workers`` workers on 127.0.0.1:``port``, serving ``app``."""
    import gunicorn.config  # the callers skip their tests without gunicorn

    command = [
        PYTHON,
        "-m",
        "gunicorn",
        "-c",
        str(EXAMPLES / "gunicorn.conf.py"),
        "-w",
        str(workers),
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "2",
        *options,
    ]
    if "control_socket_disable" in gunicorn.config.make_settings():
        # gunicorn >= 25.1 opens a control socket under $HOME by default.
        command.append("--no-control-socket")
    return [*command, app]


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(extra)
    return env


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on a fresh connection (``Connection: close``); status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_json(port: int, path: str, timeout: float = 5.0) -> Any:
    status, body = get(port, path, timeout)
    assert status == 200, (status, body)
    return json.loads(body)


def exits_at_start(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a server that must fail to start; its exit code and output (it fails the test if it serves on)."""
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=START_LIMIT,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:  # it started serving: the very failure tested
        raise AssertionError(f"the server did not stop at start:\n{exc.output!r}") from None
    return done.returncode, done.stdout.decode(errors="replace")


@dataclass
class Process:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def run_server(
    make_args: Callable[[int], list[str]],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    ready_path: str = "/_connections",
    ready: Callable[[int], bool] | None = None,
) -> Iterator[Process]:
    """Start ``make_args(port)`` in its own process group and wait until ``GET ready_path`` answers 200."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            make_args(port),
            cwd=ROOT,
            env=env if env is not None else server_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Process(port, proc, log_path)
    try:
        deadline = time.monotonic() + START_LIMIT
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n{running.log()}")
            try:
                status, body = get(port, ready_path, timeout=2)
                if status == 200 and (ready is None or ready(port)):
                    if not answered_by(proc, body):
                        raise AssertionError(f"another process answered on port {port}:\n{running.log()}")
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready after {START_LIMIT}s:\n{running.log()}")
            time.sleep(0.05)
        yield running
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the process group (quick shutdown for gunicorn and uvicorn), then SIGKILL what stays.

    The leader's exit is not the group's: ``uvicorn --workers`` leaves
    multiprocessing's resource tracker, which exits once the master has
    (its pipe closes), and under coverage writes its data file then.
    Killed at once, it left that file half written (coverage's "isn't a
    coverage data file" at ``combine``).  So the group gets time to go.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    wait_for_group(proc.pid, GROUP_LIMIT)
    # Whatever is left of the group (workers of a master that died), then reap.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


# How long the rest of a group may take to exit once its leader has.
GROUP_LIMIT = 5.0


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: nothing may reap it soon)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def wait_for_group(pgid: int, limit: float) -> bool:
    """Wait until no process of group ``pgid`` runs, at most ``limit`` seconds; whether none does."""
    deadline = time.monotonic() + limit
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
