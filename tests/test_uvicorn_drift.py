"""uvicorn changes of the kind its releases make, on real servers: connlist serves, exact or ASGI-only.

Each variant is a copy of the installed uvicorn with one change to its
source (the table of docs/deployment.md, "When uvicorn changes"), put first
on the server's ``PYTHONPATH``.  Every variant is served the way users serve
now, with uvicorn's own protocol, which the middleware replaces by connlist's
at the lifespan startup (the automatic path); a few are also served with the
explicit ``--http connlist.uvicorn:...`` flag.  On each, with both parsers,
the rule is:

* ordinary requests (keep-alive, a body, two pipelined) get 200;
* either the integration is on and exact: a client that sends nothing gets
  its 408 at the headers timeout, and an idle keep-alive connection and a
  handler that works before reading its body are not cut; or it is off,
  with exactly one ERROR line naming the uvicorn version, what failed, what
  is lost and what to do, the view's ``mode`` ``"asgi"`` with the reason,
  and ASGI-only mode still cuts a trickled body at the request timeout;
* no traceback in the log.

Which of the two each change gives is pinned (``EXPECTED``): the self-check
must catch what it can catch, and must not turn off what still works.  The
copies are made once per session, the servers run 1 s timeouts, a few at
a time in threads.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from connlist.servers import integration
from connlist.servers.uvicorn import protocols as connlist_uvicorn
from connlist.servers.uvicorn.protocols import TESTED_UVICORN
from tests.drift_app import HEADERS_TIMEOUT, REQUEST_TIMEOUT
from tests.servers import EARLY, LATE, is_408, read_response
from tests.subprocesses import (
    PYTHON,
    ROOT,
    START_LIMIT,
    free_port,
    get,
    get_json,
    gunicorn_command,
    run_server,
    server_env,
    stop,
)

pytest.importorskip("httptools")

UVICORN_DIR = Path(uvicorn.__file__).parent
HTTP = "protocols/http"
PROTOCOLS = {"httptools": f"{HTTP}/httptools_impl.py", "h11": f"{HTTP}/h11_impl.py"}
BOTH = tuple(PROTOCOLS.values())

# Servers started at once: enough to keep the suite short, few enough that
# the timing assertions hold on a loaded 2-core machine.
PARALLEL = 3

Edit = Callable[[Path], int]


def replace(files: tuple[str, ...], pattern: str, replacement: str) -> Edit:
    """An edit: ``re.sub`` in each file of the copy; how many replacements it made."""

    def edit(root: Path) -> int:
        made = 0
        for name in files:
            path = root / name
            text, n = re.subn(pattern, replacement, path.read_text())
            path.write_text(text)
            made += n
        return made

    return edit


def everywhere(pattern: str, replacement: str) -> Edit:
    def edit(root: Path) -> int:
        files = tuple(str(path.relative_to(root)) for path in root.rglob("*.py"))
        return replace(files, pattern, replacement)(root)

    return edit


def slots(root: Path) -> int:
    """``__slots__`` on both protocol classes: every attribute their methods set (uvicorn #2697, #2856)."""
    made = 0
    for name, cls in (("httptools_impl.py", "HttpToolsProtocol"), ("h11_impl.py", "H11Protocol")):
        path = root / HTTP / name
        text = path.read_text()
        start = text.index(f"class {cls}(asyncio.Protocol):\n")
        end = text.index("\nclass ", start + 1)
        names = sorted(set(re.findall(r"self\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)", text[start:end])))
        header = f"class {cls}(asyncio.Protocol):\n"
        text = text.replace(header, f"{header}    __slots__ = {tuple(names)!r}\n\n", 1)
        path.write_text(text)
        made += 1
    return made


# The changes tried: the table, and the others found reading what connlist relies on.
VARIANTS: dict[str, list[Edit]] = {
    "unchanged": [],
    "slots": [slots],
    "cycle renamed": [replace(BOTH, r"\bself\.cycle\b", "self.current_cycle")],
    "scope copied": [replace(BOTH, r"scope=self\.scope,", "scope=dict(self.scope),")],
    "flow renamed": [replace(BOTH, r"\bself\.flow\b", "self.flow_control")],
    "conn renamed": [replace((PROTOCOLS["h11"],), r"\bself\.conn\b", "self.h11_conn")],
    "hook renamed": [replace(BOTH, r"\bon_response_complete\b", "on_response_done")],
    # The keep-alive armed on another loop object than the protocol's: uvicorn keeps
    # its timer (connlist.servers.uvicorn.keepalive), all else on.
    "keep-alive armed otherwise": [
        replace(BOTH, r"self\.loop\.call_later\(", "asyncio.get_running_loop().call_later(")
    ],
    "logger renamed": [everywhere(r'"uvicorn\.error"', '"uvicorn.server"')],
    "pipeline renamed": [replace((PROTOCOLS["httptools"],), r"\bself\.pipeline\b", "self.queue")],
    "more_body renamed": [replace((PROTOCOLS["httptools"],), r"\.more_body\b", ".body_pending")],
    # (uvicorn 0.55 moved its version to _version.py: wherever it is written.)
    "newer version": [
        everywhere(r"""__version__ = (VERSION = )?["'][^"']+["']""", r'__version__ = \1"0.99.0"')
    ],
    # What the body's clock reads (issue 20's fixes: a default would silently
    # bring back the bugs): whether the client waits for 100 Continue, the
    # body bytes of the headers' read, and the cycle's receive and send,
    # looked up when the app is called (connlist's wrappers start the clock).
    "waiting_for_100_continue renamed": [
        replace(BOTH, r"\bwaiting_for_100_continue\b", "expecting_100_continue")
    ],
    "cycle's body renamed": [replace(BOTH, r"\b(self|self\.cycle)\.body\b", r"\1.body_buffer")],
    "receive bound on the class": [
        replace(
            BOTH,
            r"self\.scope, self\.receive, self\.send",
            "self.scope, RequestResponseCycle.receive.__get__(self), RequestResponseCycle.send.__get__(self)",
        )
    ],
    # The automatic path's own dependency: a uvicorn that takes its protocol class before the
    # lifespan startup would never serve the class the middleware put in its config.
    "protocol class read before the lifespan": [
        replace(
            ("server.py",),
            r"( +)await self\.lifespan\.startup\(\)\n",
            r"\1protocol_class = self.config.http_protocol_class\n\1await self.lifespan.startup()\n",
        ),
        replace(("server.py",), r"return config\.http_protocol_class\(", "return protocol_class("),
    ],
}

# "on": the integration stays on, exact; "off": ASGI-only mode with the ERROR line.
EXPECTED: dict[str, dict[str, str]] = {
    "unchanged": {"httptools": "on", "h11": "on"},
    "slots": {"httptools": "on", "h11": "on"},
    "cycle renamed": {"httptools": "off", "h11": "off"},
    # The h11 protocol does not compare scopes: a copy changes nothing for it.
    "scope copied": {"httptools": "off", "h11": "on"},
    "flow renamed": {"httptools": "off", "h11": "off"},
    "conn renamed": {"httptools": "on", "h11": "off"},
    "hook renamed": {"httptools": "off", "h11": "off"},
    "keep-alive armed otherwise": {"httptools": "on", "h11": "on"},
    "logger renamed": {"httptools": "on", "h11": "on"},
    "pipeline renamed": {"httptools": "off", "h11": "on"},
    "more_body renamed": {"httptools": "off", "h11": "on"},
    "newer version": {"httptools": "on", "h11": "on"},
    "waiting_for_100_continue renamed": {"httptools": "off", "h11": "off"},
    "cycle's body renamed": {"httptools": "off", "h11": "off"},
    "receive bound on the class": {"httptools": "off", "h11": "off"},
    # Caught at the first request, not by the self-check (the flag would still work there).
    "protocol class read before the lifespan": {"httptools": "off", "h11": "off"},
}

# What the ERROR line must say about each failure (the check's own words).
FAILURE_WORDS = {
    "cycle renamed": "`cycle`",
    "scope copied": "`cycle.scope` is not the protocol's scope",
    "flow renamed": "`flow`",
    "conn renamed": "`conn`",
    "hook renamed": "`on_response_complete`",
    "pipeline renamed": "`pipeline`",
    "more_body renamed": "`more_body`",
    "waiting_for_100_continue renamed": "has no `waiting_for_100_continue`",
    "cycle's body renamed": "has no `body`",
    "receive bound on the class": "(the cycle's `receive`)",
    "protocol class read before the lifespan": "served a request through another protocol than connlist's",
}
# Where the integration is on but uvicorn keeps timing its keep-alive itself (one WARNING line says so).
KEEP_ALIVE_BY_UVICORN = {"keep-alive armed otherwise"}
# Failures the server's start cannot see: the first request tells, with the ERROR line alone.
AT_FIRST_REQUEST = {"protocol class read before the lifespan"}


@pytest.fixture(scope="session")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | None]:
    """Each variant's directory, holding its changed copy of uvicorn (made once per session).

    None for a variant whose change finds nothing to change in this uvicorn:
    its tests skip, and only they (``copy_of``).
    """
    made: dict[str, Path | None] = {}
    for name, edits in VARIANTS.items():
        root = tmp_path_factory.mktemp("uvicorn-" + re.sub(r"\W", "-", name))
        shutil.copytree(UVICORN_DIR, root / "uvicorn", ignore=shutil.ignore_patterns("__pycache__"))
        made[name] = root if all([edit(root / "uvicorn") for edit in edits]) else None
    return made


def copy_of(copies: dict[str, Path | None], variant: str) -> Path:
    root = copies[variant]
    if root is None:
        pytest.skip(f"uvicorn {uvicorn.__version__} has nothing to change for {variant!r}")
    return root


@dataclass
class Outcome:
    log: str = ""
    view: dict[str, Any] = field(default_factory=dict)
    served_by: str = ""
    keep_alive: list[bytes] = field(default_factory=list)
    pipelined: list[bytes] = field(default_factory=list)
    silent: tuple[bytes, float] | None = None
    idle_then: bytes = b""
    busy: bytes = b""
    trickled: tuple[bytes, float] | None = None
    error: str = ""


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789"
PIN = f"uvicorn>={TESTED_UVICORN[0]},<={TESTED_UVICORN[1]}"


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def until_closed(socks: list[socket.socket], limit: float) -> dict[socket.socket, tuple[bytes, float]]:
    """What each socket received until the server closed it, and when it closed (monotonic), read at once."""
    received = {sock: b"" for sock in socks}
    closed: dict[socket.socket, tuple[bytes, float]] = {}
    deadline = time.monotonic() + limit
    while len(closed) < len(socks) and time.monotonic() < deadline:
        open_ = [sock for sock in socks if sock not in closed]
        readable, _, _ = select.select(open_, [], [], max(0.0, deadline - time.monotonic()))
        for sock in readable:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
            else:
                closed[sock] = (received[sock], time.monotonic())
    for sock in socks:
        closed.setdefault(sock, (received[sock], float("inf")))
    return closed


def exercise(port: int, outcome: Outcome) -> None:
    """What a user's clients do, and what the test needs to see of it."""
    outcome.view = get_json(port, "/_connections")
    outcome.served_by = get(port, "/uvicorn")[1].decode()
    mode = outcome.view["mode"]
    sockets: list[socket.socket] = []
    try:
        # Keep-alive requests, one with a body, then two pipelined.
        sock = _connect(port)
        sockets.append(sock)
        for request in (GET, POST):
            sock.sendall(request)
            outcome.keep_alive.append(read_response(sock))
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        outcome.pipelined = [read_response(sock), read_response(sock)]
        # Now idle on a keep-alive connection; and, at once, a silent client,
        # a handler that works before reading its body, a trickled body.
        started = time.monotonic()
        silent = _connect(port)
        sockets.append(silent)
        busy = _connect(port)
        sockets.append(busy)
        busy.sendall(b"POST /busy HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
        trickle = _connect(port)
        sockets.append(trickle)
        trickle.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        trickle_started = time.monotonic()
        # A byte every 0.2 s, stopping well before the request timeout (a
        # byte sent after the server closed would reset the connection and
        # could take the 408 with it).
        for _ in range(4):
            time.sleep(0.2)
            trickle.sendall(b"x")
        # ASGI-only mode does not cut the silent one: watched for the trickled one's 408 only.
        watched = [trickle] if mode == "asgi" else [trickle, silent]
        closed = until_closed(watched, limit=REQUEST_TIMEOUT + 3)
        outcome.trickled = (closed[trickle][0], closed[trickle][1] - trickle_started)
        if mode != "asgi":
            outcome.silent = (closed[silent][0], closed[silent][1] - started)
        outcome.busy = read_response(busy, limit=5)
        # Past the headers timeout: the idle connection still serves.
        time.sleep(max(0.0, started + HEADERS_TIMEOUT + LATE + 0.2 - time.monotonic()))
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        outcome.idle_then = read_response(sock)
    finally:
        for each in sockets:
            each.close()


# How the protocol reaches uvicorn: the automatic path (uvicorn's own class,
# what --http auto, httptools and h11 give), or connlist's by the flag.
FLAGS = {
    "auto": {"httptools": "httptools", "h11": "h11"},
    "flag": {"httptools": "connlist.uvicorn:HttpToolsProtocol", "h11": "connlist.uvicorn:H11Protocol"},
}


def run_variant(root: Path, parser: str, loop: str, how: str, log_dir: Path) -> Outcome:
    path = server_env().get("PYTHONPATH", "")
    extra = {"PYTHONPATH": f"{root}:{path}" if path else str(root)}
    http = FLAGS[how][parser]
    outcome = Outcome()
    log = log_dir / f"{root.name}-{parser}-{loop}-{how}.log"
    command = [PYTHON, "-m", "uvicorn", "tests.drift_app:app", "--http", http, "--ws", "none", "--loop", loop]
    try:
        with run_server(
            lambda port: [*command, "--port", str(port), "--log-level", "debug"],
            log,
            env=server_env(**extra),
        ) as server:
            exercise(server.port, outcome)
    except Exception as exc:  # reported by the test, with the log
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.log = log.read_text(errors="replace") if log.exists() else ""
    return outcome


# uvicorn's default loop (uvloop, installed by the test extra, as uvicorn[standard]
# does) for every variant; asyncio's too for the change whose breakage differed
# between the two (the issue: resets on asyncio, a dead listener on uvloop).
CASES = [(variant, parser, "auto", "auto") for variant in VARIANTS for parser in PROTOCOLS]
CASES += [
    (variant, parser, "asyncio", "auto") for variant in ("unchanged", "cycle renamed") for parser in PROTOCOLS
]
# The explicit flag: a change both parsers survive, one both fall back on, one that splits them.
CASES += [
    (variant, parser, "auto", "flag")
    for variant in ("unchanged", "cycle renamed", "conn renamed")
    for parser in PROTOCOLS
]
# CONNLIST_DRIFT=name,name runs those variants only (while working on one).
ONLY = [name for name in os.environ.get("CONNLIST_DRIFT", "").split(",") if name]
if ONLY:
    CASES = [case for case in CASES if case[0] in ONLY]


@pytest.fixture(scope="session")
def outcomes(
    copies: dict[str, Path | None], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str, str, str], Outcome]:
    log_dir = tmp_path_factory.mktemp("drift-logs")
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            case: pool.submit(run_variant, root, case[1], case[2], case[3], log_dir)
            for case in CASES
            if (root := copies[case[0]]) is not None
        }
        return {case: future.result() for case, future in futures.items()}


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("ERROR:")]


@pytest.mark.parametrize(("variant", "parser", "loop", "how"), CASES)
def test_serves_exact_or_in_asgi_only_mode(
    copies: dict[str, Path | None],
    outcomes: dict[tuple[str, str, str, str], Outcome],
    variant: str,
    parser: str,
    loop: str,
    how: str,
) -> None:
    root = copy_of(copies, variant)
    outcome = outcomes[(variant, parser, loop, how)]
    log = outcome.log
    assert not outcome.error, f"{outcome.error}\n{log}"
    # The changed copy is the uvicorn the server runs.
    version, _, served_file = outcome.served_by.partition(" ")
    assert served_file == str(root / "uvicorn" / "__init__.py"), served_file
    # Ordinary requests are served, whatever the mode.
    assert [r.split(b"\r\n", 1)[0] for r in outcome.keep_alive] == [b"HTTP/1.1 200 OK"] * 2
    assert outcome.keep_alive[1].endswith(b"ok 10")
    assert [r.split(b"\r\n", 1)[0] for r in outcome.pipelined] == [b"HTTP/1.1 200 OK"] * 2
    assert outcome.idle_then.startswith(b"HTTP/1.1 200 OK"), "an idle keep-alive connection was cut"
    assert "Traceback" not in log, log
    view = outcome.view
    errors = error_lines(log)
    if EXPECTED[variant][parser] == "on":
        assert view["mode"] == f"uvicorn-{parser}", log
        assert view["integration_off"] is None
        by_uvicorn = variant in KEEP_ALIVE_BY_UVICORN
        assert view["keep_alive_by"] == ("server" if by_uvicorn else "connlist"), view
        assert view["enforced"] == [
            "headers",
            "request",
            "rate",
            "send",
            *([] if by_uvicorn else ["keepalive"]),
        ]
        said = [line for line in log.splitlines() if "so uvicorn times its keep-alive itself" in line]
        assert len(said) == by_uvicorn, log
        assert errors == [], log
        # The INFO line says so, and how it came on.
        given = ", from the server's protocol setting" if how == "flag" else ""
        assert f"connlist: server integration on (uvicorn {version}, {parser}{given})" in log, log
        # Exact: the silent client's 408 at the headers timeout.
        assert outcome.silent is not None
        data, elapsed = outcome.silent
        assert is_408(data), data
        assert HEADERS_TIMEOUT - EARLY <= elapsed <= HEADERS_TIMEOUT + LATE, elapsed
        # A handler that works (1.5 s) before reading a body that arrived whole is not cut.
        # (In ASGI-only mode it is: the request timeout bounds the body until the app
        # has read it, docs/how-it-works.md.)
        assert outcome.busy.startswith(b"HTTP/1.1 200 OK") and outcome.busy.endswith(b"ok 4"), outcome.busy
    else:
        assert view["mode"] == "asgi", log
        assert view["keep_alive_by"] == "server"
        assert view["enforced"] == ["request", "rate"]
        assert FAILURE_WORDS[variant] in view["integration_off"], view["integration_off"]
        # One ERROR line: the version, what failed, what is lost, what to do.
        assert len(errors) == 1, log
        (line,) = errors
        assert f"uvicorn {version}" in line and FAILURE_WORDS[variant] in line, line
        assert integration.asgi_only() in line
        assert f"pin uvicorn to that range (pip install '{PIN}'), or upgrade connlist" in line
        if variant in AT_FIRST_REQUEST:
            # Turned on at the start, found off at the first request (the view's own).
            assert f"connlist: server integration on (uvicorn {version}, {parser})" in log, log
            assert "connlist: ASGI-only mode:" not in log, log
        else:
            assert "server integration on" not in log
            # Told at the start too: ASGI-only mode, once.
            assert log.count("connlist: ASGI-only mode:") == 1, log
            assert "connlist's protocol fell back to uvicorn's (see connlist's ERROR line)" in log
    # Bodies are timed in either mode: the trickled body's 408 at the request timeout.
    assert outcome.trickled is not None
    data, elapsed = outcome.trickled
    assert is_408(data), data
    assert REQUEST_TIMEOUT - EARLY <= elapsed <= REQUEST_TIMEOUT + LATE + 0.1, elapsed


def needs(copies: dict[str, Path | None], variant: str) -> None:
    if ONLY and variant not in ONLY:
        pytest.skip(f"CONNLIST_DRIFT leaves out {variant!r}")
    copy_of(copies, variant)


def test_a_newer_uvicorn_is_warned_about_once(
    copies: dict[str, Path | None], outcomes: dict[tuple[str, str, str, str], Outcome]
) -> None:
    needs(copies, "newer version")
    for parser in PROTOCOLS:
        log = outcomes[("newer version", parser, "auto", "auto")].log
        warnings = [line for line in log.splitlines() if "is tested with uvicorn" in line]
        assert len(warnings) == 1, log
        assert warnings[0].startswith("WARNING:")
        assert re.search(
            rf"connlist \S+ is tested with uvicorn {re.escape(TESTED_UVICORN[0])} to "
            rf"{re.escape(TESTED_UVICORN[1])}; this is 0\.99\.0; the self-check passed",
            warnings[0],
        ), warnings[0]
    # Within the tested range: no such line.
    if connlist_uvicorn._version(uvicorn.__version__) <= connlist_uvicorn._version(TESTED_UVICORN[1]):
        assert "is tested with uvicorn" not in outcomes[("unchanged", "httptools", "auto", "auto")].log


def test_connlist_follows_a_renamed_uvicorn_logger(
    copies: dict[str, Path | None], outcomes: dict[tuple[str, str, str, str], Outcome]
) -> None:
    needs(copies, "logger renamed")
    # --log-level debug: uvicorn's renamed logger is at DEBUG, and connlist's
    # DEBUG line for the silent client's timeout reaches uvicorn's handler,
    # in uvicorn's format (the old name would be at uvicorn's default, INFO).
    for parser in PROTOCOLS:
        log = outcomes[("logger renamed", parser, "auto", "auto")].log
        assert re.search(r"^DEBUG: +127\.0\.0\.1:\d+ - headers timeout: ", log, re.M), log


# -- the refusal to start (CONNLIST_REQUIRE_INTEGRATION=1) ----------------------------


def start_and_exit(root: Path | None, http: str, log: Path, **env: str) -> tuple[int | None, str]:
    """Start a server that must refuse to start: its exit code (None: still running at the limit), its log."""
    path = server_env().get("PYTHONPATH", "")
    pythonpath = f"{root}:{path}" if root is not None else path
    command = [PYTHON, "-m", "uvicorn", "tests.drift_app:app", "--http", http, "--ws", "none", "--port", "0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=server_env(PYTHONPATH=pythonpath, **env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code: int | None = proc.wait(START_LIMIT)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop(proc)
    return code, log.read_text(errors="replace")


@pytest.mark.parametrize("parser", list(PROTOCOLS))
def test_refuses_to_start_when_the_check_fails(
    copies: dict[str, Path | None], tmp_path: Path, parser: str
) -> None:
    http = f"connlist.uvicorn:{'HttpToolsProtocol' if parser == 'httptools' else 'H11Protocol'}"
    code, log = start_and_exit(
        copy_of(copies, "cycle renamed"), http, tmp_path / "log", CONNLIST_REQUIRE_INTEGRATION="1"
    )
    # uvicorn's status for a failed start, one ERROR line, no traceback.
    assert code == 3, log
    errors = error_lines(log)
    assert len(errors) == 1 and "uvicorn's protocol has no `cycle`" in errors[0], log
    assert errors[0].startswith("ERROR:    connlist: refusing to start (CONNLIST_REQUIRE_INTEGRATION=1)")
    assert "Traceback" not in log and "Uvicorn running on" not in log


@pytest.mark.parametrize("parser", list(PROTOCOLS))
@pytest.mark.parametrize("required", ["option", "environment"])
def test_the_automatic_path_refuses_to_start_when_the_check_fails(
    copies: dict[str, Path | None], tmp_path: Path, parser: str, required: str
) -> None:
    # uvicorn's own class, a uvicorn connlist's check fails on, and the integration required:
    # the lifespan startup fails (uvicorn exits 3) with connlist's one line, why and what to do.
    env = (
        {"CONNLIST_TEST_OPTIONS": json.dumps({"server_integration": "required"})}
        if required == "option"
        else {"CONNLIST_REQUIRE_INTEGRATION": "1"}
    )
    code, log = start_and_exit(
        copy_of(copies, "cycle renamed"), FLAGS["auto"][parser], tmp_path / "log", **env
    )
    assert code == 3, log
    (line,) = [line for line in error_lines(log) if "connlist" in line]
    assert "the server integration is off and it is required, so the server refuses to start: " in line
    assert "uvicorn's protocol has no `cycle`" in line and line.endswith("or upgrade connlist."), line
    assert "Application startup failed" in log and "Uvicorn running on" not in log
    assert "Traceback" not in log, log


def test_a_bad_require_value_refuses_to_start(tmp_path: Path) -> None:
    code, log = start_and_exit(None, "h11", tmp_path / "log", CONNLIST_REQUIRE_INTEGRATION="yes")
    assert code == 3, log
    assert (
        "CONNLIST_REQUIRE_INTEGRATION must be 1 (refuse to start without the integration) or 0, got 'yes'"
        in log
    )


@pytest.mark.parametrize("http", ["connlist.uvicorn:H11Protocol", "h11"])
def test_the_integration_on_satisfies_the_requirement(tmp_path: Path, http: str) -> None:
    # connlist's class by the flag, or uvicorn's own, which the lifespan replaces.
    command = [PYTHON, "-m", "uvicorn", "tests.drift_app:app", "--http", http, "--ws", "none", "--port"]
    with run_server(
        lambda port: [*command, str(port)],
        tmp_path / "log",
        env=server_env(CONNLIST_REQUIRE_INTEGRATION="1"),
    ) as server:
        view = get_json(server.port, "/_connections")
    assert view["mode"] == "uvicorn-h11" and view["integration_off"] is None
    assert view["server_integration"] == "required"


# -- gunicorn's uvicorn worker ---------------------------------------------------------


# gunicorn's usual worker (the automatic path) and connlist's (the flag).
GUNICORN_WORKERS = ["uvicorn_worker.UvicornWorker", "connlist.gunicorn.UvicornWorker"]


@pytest.mark.parametrize("worker", GUNICORN_WORKERS)
def test_gunicorn_workers_fall_back_too(copies: dict[str, Path | None], tmp_path: Path, worker: str) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    path = server_env().get("PYTHONPATH", "")
    env = server_env(PYTHONPATH=f"{copy_of(copies, 'cycle renamed')}:{path}")
    with run_server(
        lambda port: gunicorn_command(port, "tests.drift_app:app", "-k", worker, workers=1),
        tmp_path / "log",
        env=env,
    ) as server:
        view = get_json(server.port, "/_connections")
        assert get(server.port, "/")[0] == 200
        log = server.log()
    assert view["mode"] == "asgi" and "uvicorn's protocol has no `cycle`" in view["integration_off"]
    errors = [line for line in log.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "the server integration is off" in errors[0], log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("worker", GUNICORN_WORKERS)
def test_gunicorn_refuses_to_start_too(copies: dict[str, Path | None], tmp_path: Path, worker: str) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    path = server_env().get("PYTHONPATH", "")
    env = server_env(
        PYTHONPATH=f"{copy_of(copies, 'cycle renamed')}:{path}", CONNLIST_REQUIRE_INTEGRATION="1"
    )
    command = gunicorn_command(free_port(), "tests.drift_app:app", "-k", worker, workers=1)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=START_LIMIT)
    finally:
        stop(proc)
    log = out.decode(errors="replace")
    # The worker's one line, then gunicorn's master stops: the worker failed to boot.
    assert proc.returncode == 3, log
    # (connlist's worker refuses as it imports the class, gunicorn's usual one at the lifespan startup.)
    (refusal,) = [line for line in log.splitlines() if re.search("refus(ing|es) to start", line)]
    assert "uvicorn's protocol has no `cycle`" in refusal, log
    assert "Reason: Worker failed to boot." in log and "Traceback" not in log
