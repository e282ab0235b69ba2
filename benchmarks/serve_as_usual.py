"""The silent client against the FastAPI example, served every way its users serve it, with no flag.

For each serving command (``fastapi run``, ``uvicorn``, ``--workers 2``,
gunicorn's usual worker, ...), this starts ``examples/fastapi_app.py`` on
127.0.0.1 with the headers timeout ``--headers-timeout`` (5 s) and the request
timeout twice that, sends ``GET / HTTP/1.1\\r\\nHost: x\\r\\n`` on a fresh
connection and nothing more, and reports what happened: every worker's mode
(``/_connections?workers=all``), when the ``408`` and the close came, and
connlist's INFO line from the server's log.  Each server is stopped before
the next starts; a client is given up on at twice the headers timeout.

Usage::

    python3 benchmarks/serve_as_usual.py                      # every command, a Markdown table
    python3 benchmarks/serve_as_usual.py --only "fastapi run" --headers-timeout 1

Needs the test extra's ``fastapi-cli``, ``gunicorn`` and ``uvicorn-worker``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
APP = "examples.fastapi_app:app"
HALF = b"GET / HTTP/1.1\r\nHost: x\r\n"
START_LIMIT = 30.0
ON_LINE = re.compile(r"connlist: server integration on \([^)]*\)")


def _gunicorn(worker: str, *options: str) -> list[str]:
    return [PYTHON, "-m", "gunicorn", "-k", worker, "-w", "2", *options, "--bind", "127.0.0.1:{port}", APP]


# The serving commands, as users type them ({port} filled in).
COMMANDS: dict[str, list[str]] = {
    "fastapi run": [PYTHON, "-m", "fastapi", "run", "examples/fastapi_app.py", "--host", "127.0.0.1",
                    "--port", "{port}"],
    "fastapi dev": [PYTHON, "-m", "fastapi", "dev", "examples/fastapi_app.py", "--host", "127.0.0.1",
                    "--port", "{port}", "--reload-dir", "examples"],
    "uvicorn main:app": [PYTHON, "-m", "uvicorn", APP, "--port", "{port}"],
    "uvicorn main:app --http h11": [PYTHON, "-m", "uvicorn", APP, "--port", "{port}", "--http", "h11"],
    "uvicorn main:app --workers 2": [PYTHON, "-m", "uvicorn", APP, "--port", "{port}", "--workers", "2"],
    "uvicorn main:app --reload": [PYTHON, "-m", "uvicorn", APP, "--port", "{port}", "--reload",
                                  "--reload-dir", "examples"],
    "uvicorn.run(app)": [PYTHON, "-c", "import uvicorn; from examples.fastapi_app import app; "
                         "uvicorn.run(app, host='127.0.0.1', port={port})"],
    "gunicorn -k uvicorn_worker.UvicornWorker -w 2": _gunicorn("uvicorn_worker.UvicornWorker"),
    "gunicorn -k uvicorn_worker.UvicornH11Worker -w 2": _gunicorn("uvicorn_worker.UvicornH11Worker"),
    "uvicorn main:app --http connlist.uvicorn:HttpToolsProtocol --lifespan on": [
        PYTHON, "-m", "uvicorn", APP, "--port", "{port}", "--http", "connlist.uvicorn:HttpToolsProtocol",
        "--lifespan", "on",
    ],
    "gunicorn -k connlist.gunicorn.UvicornWorker -w 2": _gunicorn("connlist.gunicorn.UvicornWorker"),
    "gunicorn -k asgi -w 2": _gunicorn("asgi"),
    "gunicorn -k asgi --http-parser python -w 2": _gunicorn("asgi", "--http-parser", "python"),
    "gunicorn -k connlist.gunicorn.ASGIWorker -w 2": _gunicorn("connlist.gunicorn.ASGIWorker"),
}  # fmt: skip


def get_json(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        data: dict[str, object] = json.load(response)
        return data


def silent_client(port: int, headers_timeout: float) -> str:
    """Half a request, then nothing: what came back, and when."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sent = time.monotonic()
        sock.sendall(HALF)
        sock.settimeout(2 * headers_timeout)
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except TimeoutError:
            return f"still open at {time.monotonic() - sent:.2f} s"
        except ConnectionResetError:
            pass
        elapsed = time.monotonic() - sent
    status = data.split(b"\r\n", 1)[0].decode(errors="replace") or "nothing"
    return f"{status.removeprefix('HTTP/1.1 ')} at {elapsed:.2f} s, then closed"


def measure(name: str, headers_timeout: float, workdir: Path) -> tuple[str, str, str]:
    """(the workers' modes, what the silent client got, connlist's INFO line(s))."""
    port = free_port()
    command = [part.format(port=port) for part in COMMANDS[name]]
    env = dict(
        os.environ,
        CONNLIST_HEADERS_TIMEOUT=str(headers_timeout),
        CONNLIST_REQUEST_TIMEOUT=str(2 * headers_timeout),
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = workdir / (re.sub(r"\W+", "-", name) + ".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_LIMIT
        while True:
            with contextlib.suppress(OSError):
                workers = get_json(port, "/_connections?workers=all")["workers"]
                assert isinstance(workers, list)
                if len(workers) >= (2 if "2" in name.split() else 1):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                return "did not start", "-", log_path.read_text(errors="replace")[-300:]
            time.sleep(0.05)
        modes = sorted({str(worker["mode"]) for worker in workers})
        got = silent_client(port, headers_timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    lines = ON_LINE.findall(log_path.read_text(errors="replace"))
    told = f"{lines[0]} (x{len(lines)})" if len(lines) > 1 else (lines[0] if lines else "none")
    return ", ".join(f"{mode} (x{len(workers)})" for mode in modes), got, told


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headers-timeout", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--only", action="append", choices=list(COMMANDS), help="this command (repeatable)")
    args = parser.parse_args(argv)
    if args.headers_timeout <= 0:
        parser.error("--headers-timeout must be > 0")
    print(f"headers timeout {args.headers_timeout:g} s, request timeout {2 * args.headers_timeout:g} s\n")
    print("| how the app is served | mode | the silent client | connlist's log line |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.only or COMMANDS:
            mode, got, told = measure(name, args.headers_timeout, Path(workdir))
            print(f"| `{name}` | {mode} | {got} | {told} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
