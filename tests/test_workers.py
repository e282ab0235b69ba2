"""``GET /_connections?workers=all``: every worker of a server in one answer.

Real servers with two workers, found without configuration: ``uvicorn
--workers 2`` (its directory under the temp dir) and gunicorn with connlist's
worker class (under ``$XDG_RUNTIME_DIR``); then an operator's
``CONNLIST_WORKERS_DIR``.  Each holds a connection in a known state on every
worker (retrying until both pids hold one), reads one ``workers=all`` answer,
stops one worker (SIGSTOP: unreachable) and kills another (SIGKILL: gone, its
socket removed).  In process: a group of one, the timeout against a socket
that never answers, stale sockets, the directory checks and the sums.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from connlist import ConnectionsMiddleware
from connlist.observe import workers
from connlist.observe.workers import WorkerGroup, combine
from connlist.servers import supervisor
from tests.servers import INTEGRATED, close_sockets, connect, echo_app, serve
from tests.subprocesses import PYTHON, Process, get_json, gunicorn_command, run_server, server_env

# Long enough that the held connections outlive the test.
HEADERS_TIMEOUT = 20.0
REQUEST_TIMEOUT = 30.0
WORKERS = 2
# Connections opened before giving up on holding one on each worker.
MAX_HELD = 100
ALL = "/_connections?workers=all"


def answering(snapshot: dict[str, Any]) -> Any:
    """A WorkerGroup snapshotter that answers ``snapshot`` whatever the limit."""

    async def snapshot_of(limit: int) -> dict[str, Any]:
        return snapshot

    return snapshot_of


def all_workers(port: int, query: str = "") -> dict[str, Any]:
    answer: dict[str, Any] = get_json(port, ALL + query)
    return answer


def reachable(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {worker["pid"]: worker for worker in answer["workers"] if not worker.get("unreachable")}


def both_up(port: int) -> bool:
    return len(reachable(all_workers(port, "&limit=0"))) == WORKERS


def env_for(**extra: str) -> dict[str, str]:
    env = server_env(
        CONNLIST_HEADERS_TIMEOUT=str(HEADERS_TIMEOUT), CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT), **extra
    )
    for name in ("XDG_RUNTIME_DIR", workers.ENV_DIR):
        if name not in extra:
            env.pop(name, None)
    return env


def uvicorn_command(port: int) -> list[str]:
    return [
        PYTHON,
        "-m",
        "uvicorn",
        "examples.app:app",
        "--workers",
        str(WORKERS),
        "--port",
        str(port),
        "--http",
        INTEGRATED["httptools"],
        "--lifespan",
        "on",
        "--loop",
        "asyncio",
        "--no-access-log",
    ]


def hold_on_every_worker(port: int) -> tuple[dict[int, dict[str, Any]], dict[str, tuple[int, str]]]:
    """Open half-sent requests until every worker holds one in each state; the answer and who holds what.

    Returns the reachable workers of the last answer, and for each held
    connection's client address its worker and the state it must show.
    """
    held: dict[str, str] = {}  # client address -> expected state
    kinds = (
        (b"GET /held HTTP/1.1\r\nHost: x\r\n", "reading_headers"),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234", "reading_body"),
    )
    for attempt in range(MAX_HELD):
        data, state = kinds[attempt % 2]
        sock = connect(port)
        sock.sendall(data)
        host, client_port = sock.getsockname()[:2]
        held[f"{host}:{client_port}"] = state
        if attempt % 2 == 0:
            continue
        time.sleep(0.05)  # let the servers read what was sent
        answer = all_workers(port)
        workers_now = reachable(answer)
        where: dict[str, tuple[int, str]] = {}
        for pid, worker in workers_now.items():
            for conn in worker["all"]:
                if conn["client"] in held:
                    where[conn["client"]] = (pid, conn["state"])
        states_by_pid = {pid: {state for p, state in where.values() if p == pid} for pid in workers_now}
        # Every held connection is in the answer, in its worker, in its state
        # (a connection just opened may not have been read yet: ask again).
        shown = {client: state for client, (_, state) in where.items()}
        if (
            len(workers_now) == WORKERS
            and all(states >= {"reading_headers", "reading_body"} for states in states_by_pid.values())
            and shown == held
        ):
            counts = answer["counts"]
            assert counts == {
                name: sum(worker["counts"][name] for worker in workers_now.values()) for name in counts
            }
            assert counts["reading"] >= len(held) // 2 and counts["all"] >= len(held)
            assert answer["totals"]["connections"] == sum(
                w["totals"]["connections"] for w in workers_now.values()
            )
            return workers_now, where
    raise AssertionError(f"could not hold a connection in each state on each of {WORKERS} workers: {where}")


def check_stop_and_kill(server: Process, directory: Path, pids: list[int]) -> None:
    """SIGSTOP one worker: listed unreachable, on time.  SIGKILL it: gone, its socket removed.

    Returns once the master's replacement for it serves, with its socket: a
    master stopped while a worker boots can miss it (a signal that reaches
    the worker before its own handlers is lost, and the master kills it
    after the graceful timeout, socket and all).
    """
    port = server.port
    victim = pids[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answer = all_workers(server.port, "&limit=0")
        elapsed = time.monotonic() - started
        by_pid = {worker["pid"]: worker for worker in answer["workers"]}
        assert by_pid[victim] == {"pid": victim, "unreachable": True, "error": "no answer within 0.5 s"}
        assert answer["unreachable"] == 1
        assert workers.TIMEOUT <= elapsed < workers.TIMEOUT + 1.5, elapsed
        # The sums are the answering worker's alone.
        (alive,) = reachable(answer).values()
        assert answer["counts"] == alive["counts"]
    finally:
        os.kill(victim, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    # kill -9: the worker could not remove its socket; a sibling that finds
    # it refusing connections does (asking, or starting: the replacement).
    socket_path = directory / f"{victim}.sock"
    deadline = time.monotonic() + 10
    while True:
        answer = all_workers(port, "&limit=0")
        pids_now = {worker["pid"] for worker in answer["workers"]}
        # The dead worker is not listed, or listed unreachable; never answering.
        assert victim not in reachable(answer)
        if victim not in pids_now and not socket_path.exists():
            break  # its stale socket was found refusing connections, and removed
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)
    assert len(reachable(answer)) >= 1
    # The master replaces it: every worker serves again, each with its socket.
    deadline = time.monotonic() + 20
    while True:
        alive = reachable(all_workers(port, "&limit=0"))
        if len(alive) == WORKERS and socket_files(directory) == dict.fromkeys(alive, 0o600):
            break
        assert time.monotonic() < deadline, (alive, socket_files(directory))
        time.sleep(0.1)
    assert victim not in alive


def stop_master(server: Process) -> None:
    """A graceful stop: SIGTERM to the master alone, which stops its workers.

    (``stop()``'s SIGINT to the whole group makes uvicorn's supervisor restart
    workers that exit before it does, and gunicorn's quick shutdown SIGKILLs
    workers still busy after its graceful timeout.)
    """
    close_sockets()  # or the workers wait for the held requests
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(15)


def socket_files(directory: Path) -> dict[int, int]:
    """pid -> mode of each worker socket in ``directory``."""
    return {
        int(path.name.removesuffix(".sock")): stat.S_IMODE(path.lstat().st_mode)
        for path in directory.glob("*.sock")
        if stat.S_ISSOCK(path.lstat().st_mode)
    }


def group_directory(base: Path, master: int) -> Path:
    (found,) = [path for path in base.iterdir() if path.name.split("-")[0] == str(master)]
    return found


@pytest.fixture
def master_directory(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path) -> Path:
    """This process as a worker of its parent (as connlist.gunicorn's workers declare), under ``tmp_dir``.

    The master's directory, not made yet.
    """
    if os.getppid() <= 1:
        pytest.skip("this process has no parent to play the master")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_dir))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv(workers.ENV_DIR, raising=False)
    monkeypatch.setattr(supervisor, "_master_pid", os.getppid())
    return workers.default_directory(os.getppid())


# -- real servers ----------------------------------------------------------------


def test_uvicorn_workers_found_in_the_temp_dir_held_stopped_and_killed(tmp_dir: Path) -> None:
    env = env_for(TMPDIR=str(tmp_dir))
    with run_server(uvicorn_command, tmp_dir / "uvicorn.log", env=env, ready=both_up) as server:
        base = tmp_dir / f"connlist-{os.getuid()}"
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        directory = group_directory(base, server.proc.pid)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        workers_now, _ = hold_on_every_worker(server.port)
        assert server.proc.pid not in workers_now  # the workers answer, not the master
        assert socket_files(directory) == dict.fromkeys(workers_now, 0o600)
        check_stop_and_kill(server, directory, sorted(workers_now))
        stop_master(server)
    # Stopped cleanly: every socket and the directory removed.
    assert not directory.exists(), list(directory.iterdir())


def test_gunicorn_workers_found_in_the_runtime_dir_held_stopped_and_killed(tmp_dir: Path) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    runtime = tmp_dir / "run"
    runtime.mkdir(mode=0o700)
    env = env_for(XDG_RUNTIME_DIR=str(runtime))
    with run_server(
        lambda port: gunicorn_command(
            port, "examples.app:app", "-k", "connlist.gunicorn.UvicornWorker", workers=WORKERS
        ),
        tmp_dir / "gunicorn.log",
        env=env,
        ready=both_up,
    ) as server:
        directory = group_directory(runtime / "connlist", server.proc.pid)
        workers_now, _ = hold_on_every_worker(server.port)
        assert server.proc.pid not in workers_now
        assert socket_files(directory) == dict.fromkeys(workers_now, 0o600)
        check_stop_and_kill(server, directory, sorted(workers_now))
        stop_master(server)
    assert not directory.exists(), list(directory.iterdir())


def test_operator_directory(tmp_dir: Path) -> None:
    directory = tmp_dir / "workers"
    env = env_for(**{workers.ENV_DIR: str(directory)})
    with run_server(uvicorn_command, tmp_dir / "uvicorn.log", env=env, ready=both_up) as server:
        answer = all_workers(server.port, "&limit=0")
        pids = sorted(reachable(answer))
        assert [worker["pid"] for worker in answer["workers"]] == pids
        assert socket_files(directory) == dict.fromkeys(pids, 0o600)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # created private
        # Nothing under the default places.
        assert not (Path(tempfile.gettempdir()) / f"connlist-{os.getuid()}" / str(server.proc.pid)).exists()
        stop_master(server)
    # The operator's directory stays; the sockets go.
    assert directory.is_dir() and socket_files(directory) == {}


# -- one process -----------------------------------------------------------------


def test_a_single_worker_is_a_group_of_one(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_dir))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv(workers.ENV_DIR, raising=False)
    assert supervisor.supervisor_pid() is None  # pytest is nobody's worker
    app = ConnectionsMiddleware(echo_app, headers_timeout=5, request_timeout=10)
    with serve(app, INTEGRATED["h11"]) as running:
        answer = all_workers(running.port)
        (only,) = answer["workers"]
        assert only["pid"] == answer["pid"] == os.getpid()
        assert only["mode"] == "uvicorn-h11"
        assert answer["counts"] == only["counts"] and answer["totals"] == only["totals"]
        assert answer["unreachable"] == 0
        # The plain view is unchanged, and differs: one worker's, no "workers".
        plain = get_json(running.port, "/_connections")
        assert "workers" not in plain and plain["pid"] == os.getpid()
    assert list(tmp_dir.iterdir()) == []  # no directory, no socket


def test_query_parameters() -> None:
    app = ConnectionsMiddleware(echo_app)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            for query, word in (
                ("workers=some", "workers"),
                ("workers=", "workers"),
                ("format=xml", "format"),
                ("limt=1", "limit"),
                ("workers=all&limit=-1", "limit"),
            ):
                response = await client.get(f"/_connections?{query}")
                assert response.status_code == 400, query
                assert word in response.json()["error"], (query, response.json())
            answer = (await client.get("/_connections?workers=all&limit=0")).json()
            assert answer["limit"] == 0 and answer["workers"][0]["all"] == []

    asyncio.run(run())


def test_combine_sums_whatever_counts_and_totals_the_workers_have() -> None:
    one = {"pid": 2, "counts": {"all": 2, "stalled": 1}, "totals": {"requests": 5}, "truncated": False}
    two = {"pid": 1, "counts": {"all": 3, "stalled": 0}, "totals": {"requests": 1, "rate_timeouts": 4}}
    gone = {"pid": 3, "unreachable": True, "error": "no answer within 0.5 s"}
    answer = combine([one, gone, two], limit=7)
    assert answer["counts"] == {"all": 5, "stalled": 1}
    assert answer["totals"] == {"requests": 6, "rate_timeouts": 4}
    assert [worker["pid"] for worker in answer["workers"]] == [1, 2, 3]
    assert answer["unreachable"] == 1 and answer["limit"] == 7 and answer["truncated"] is False


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_silent_refusing_and_stale_sockets(tmp_dir: Path) -> None:
    """A socket that never answers: unreachable after the timeout.  A dead pid's: removed, not listed."""
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stale_pid = dead_pid()
    try:
        # Listening, never accepting: the connection succeeds, no answer ever comes.
        silent = socket.socket(socket.AF_UNIX)
        silent.bind(str(tmp_dir / f"{asleep.pid}.sock"))
        silent.listen()
        # Bound, closed, not removed: what a worker killed with SIGKILL leaves.
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(tmp_dir / f"{stale_pid}.sock"))
        stale.close()
        (tmp_dir / "notes.txt").write_text("not a worker")

        async def run() -> tuple[dict[str, Any], float]:
            group = WorkerGroup(answering({"pid": os.getpid(), "counts": {"all": 1}}), directory=tmp_dir)
            await group.start()
            try:
                assert group.serving
                started = time.monotonic()
                answer = await group.gather(5)
                return answer, time.monotonic() - started
            finally:
                group.stop()

        answer, elapsed = asyncio.run(run())
        silent.close()
        assert answer["workers"] == sorted(
            [
                {"pid": asleep.pid, "unreachable": True, "error": "no answer within 0.5 s"},
                {"pid": os.getpid(), "counts": {"all": 1}},
            ],
            key=lambda worker: worker["pid"],
        )
        assert workers.TIMEOUT <= elapsed < workers.TIMEOUT + 0.5
        assert not (tmp_dir / f"{stale_pid}.sock").exists()
        assert not (tmp_dir / f"{os.getpid()}.sock").exists()  # stop() removed its own
        assert (tmp_dir / "notes.txt").exists()
    finally:
        asleep.kill()
        asleep.wait()


def test_a_refusing_socket_of_a_live_process_is_listed_unreachable(tmp_dir: Path) -> None:
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        refusing = socket.socket(socket.AF_UNIX)
        refusing.bind(str(tmp_dir / f"{asleep.pid}.sock"))
        refusing.close()

        async def run() -> dict[str, Any]:
            group = WorkerGroup(answering({"pid": os.getpid()}), directory=tmp_dir)
            await group.start()
            try:
                return await group.gather(0)
            finally:
                group.stop()

        answer = asyncio.run(run())
        assert {"pid": asleep.pid, "unreachable": True, "error": "connection refused"} in answer["workers"]
        assert (tmp_dir / f"{asleep.pid}.sock").exists()  # a live process's: not removed
    finally:
        asleep.kill()
        asleep.wait()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write_is_refused(
    tmp_dir: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_dir / "shared"
    directory.mkdir()
    directory.chmod(mode)

    async def run() -> bool:
        group = WorkerGroup(answering({"pid": os.getpid()}), directory=directory)
        await group.start()
        try:
            return group.serving
        finally:
            group.stop()

    assert asyncio.run(run()) is False
    assert "other users must not write to it" in caplog.text
    assert list(directory.iterdir()) == []


def test_a_symlink_is_refused(tmp_dir: Path) -> None:
    target = tmp_dir / "target"
    target.mkdir(mode=0o700)
    link = tmp_dir / "link"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symlink"):
        workers._private_dir(link, strict=True)
    with pytest.raises(OSError, match="mode 0755"):
        target.chmod(0o755)
        workers._private_dir(target, strict=True)
    workers._private_dir(target, strict=False)  # an operator's 0755 directory is fine


def test_the_default_directory_is_the_masters(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_dir))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    ppid = os.getppid()
    path = workers.default_directory(ppid)
    assert path.parent == tmp_dir / f"connlist-{os.getuid()}"
    if Path("/proc").is_dir():
        # The master's start time keeps a reused pid out of an old group.
        assert path.name.startswith(f"{ppid}-") and path.name != f"{ppid}-"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_dir))
    assert workers.default_directory(ppid).parent == tmp_dir / "connlist"
    # gunicorn's worker classes declare the master; only the real parent counts.
    monkeypatch.setattr(supervisor, "_master_pid", ppid)
    assert supervisor.supervisor_pid() == ppid
    monkeypatch.setattr(supervisor, "_master_pid", ppid + 1)
    assert supervisor.supervisor_pid() is None


def test_a_worker_removes_what_dead_masters_left_and_its_own_at_stop(
    master_directory: Path, tmp_dir: Path
) -> None:
    base = tmp_dir / f"connlist-{os.getuid()}"
    assert master_directory.parent == base
    base.mkdir(mode=0o700)
    gone = base / f"{dead_pid()}-1"  # a master killed with its workers
    gone.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(gone / "4242.sock"))
    stale.close()
    elsewhere = base / f"{dead_pid()}-2"  # looks gone, but a worker listens (another pid namespace)
    elsewhere.mkdir(mode=0o700)
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(elsewhere / "4243.sock"))
    live.listen()

    async def run() -> Path | None:
        group = WorkerGroup(answering({"pid": os.getpid()}))
        await group.start()
        try:
            assert group.serving and group.master == os.getppid()
            directory = group.directory
            assert directory is not None and directory.parent == base
            assert socket_files(directory) == {os.getpid(): 0o600}
            await group.start()  # once per server: a second call changes nothing
            return directory
        finally:
            group.stop()

    try:
        directory = asyncio.run(run())
    finally:
        live.close()
    assert not gone.exists()
    assert (elsewhere / "4243.sock").exists()
    assert directory is not None and not directory.exists()  # the last worker removed the group's directory


def test_the_last_worker_to_leave_removes_its_killed_siblings_sockets_and_the_directory(
    master_directory: Path,
) -> None:
    # A sibling killed before this worker started, and one killed while it
    # ran (kill -9, or by the master after its graceful timeout): their
    # sockets refuse connections and their pids are gone.  Nobody asks for
    # workers=all in between, yet start() removes the first, stop() the
    # second and then the master's directory.
    directory = master_directory
    directory.parent.mkdir(mode=0o700)
    directory.mkdir(mode=0o700)

    def killed_sibling() -> Path:
        path = directory / f"{dead_pid()}.sock"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))  # bound, closed, not removed
        return path

    before = killed_sibling()

    async def run() -> Path:
        group = WorkerGroup(answering({"pid": os.getpid()}))
        await group.start()
        try:
            assert group.directory == directory
            assert not before.exists()
            assert socket_files(directory) == {os.getpid(): 0o600}
            return killed_sibling()
        finally:
            group.stop()

    during = asyncio.run(run())
    assert not during.exists()
    assert not directory.exists()


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b'{"pid": 1}', "ValueError: the answer is not worker {pid}'s"),
        (b"[1, 2]", "ValueError: the answer is not worker {pid}'s"),
        (b'{"pid": {pid}, "error": "bad request: limit"}', "ValueError: bad request: limit"),
        (
            b"{not json",
            "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (b'{"pid": {pid}, "padding": "' + b"x" * 100 + b'"}', "ValueError: answer larger than 64 bytes"),
    ],
)
def test_a_sibling_that_answers_wrongly_is_listed_unreachable_with_the_reason(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch, reply: bytes, error: str
) -> None:
    monkeypatch.setattr(workers, "_ANSWER_MAX", 64)
    sibling = os.getppid()  # any pid: the answer is checked against the socket's name
    reply = reply.replace(b"{pid}", str(sibling).encode())

    async def run() -> dict[str, Any]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            writer.write(reply)
            await writer.drain()
            writer.close()

        fake = await asyncio.start_unix_server(answer, str(tmp_dir / f"{sibling}.sock"))
        group = WorkerGroup(answering({"pid": os.getpid()}), directory=tmp_dir)
        await group.start()
        try:
            return await group.gather(3)
        finally:
            group.stop()
            fake.close()

    answer = asyncio.run(run())
    assert {"pid": sibling, "unreachable": True, "error": error.format(pid=sibling)} in answer["workers"]
    assert answer["unreachable"] == 1


def test_a_worker_answers_bad_requests_with_the_reason_and_drops_overlong_ones(tmp_dir: Path) -> None:
    async def ask(path: Path, request: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(request)
        try:
            return await asyncio.wait_for(reader.read(), 2)
        finally:
            writer.close()

    async def run() -> list[bytes]:
        group = WorkerGroup(answering({"pid": os.getpid(), "counts": {"all": 0}}), directory=tmp_dir)
        await group.start()
        try:
            path = tmp_dir / f"{os.getpid()}{workers.SUFFIX}"
            return [
                await ask(path, request)
                for request in (
                    b'{"limit": 2}\n',
                    b'{"limit": -1}\n',
                    b'{"limit": true}\n',
                    b"nonsense\n",
                    b"x" * (workers._REQUEST_MAX + 1),  # no newline, and too long: closed unanswered
                )
            ]
        finally:
            group.stop()

    good, negative, boolean, nonsense, overlong = asyncio.run(run())
    assert json.loads(good) == {"pid": os.getpid(), "counts": {"all": 0}}
    for body, reason in (
        (negative, "ValueError(-1)"),
        (boolean, "ValueError(True)"),
        (nonsense, "JSONDecodeError"),
    ):
        answer = json.loads(body)
        assert answer["pid"] == os.getpid() and answer["error"].startswith(f"bad request: {reason}"), answer
    assert overlong == b""


def test_an_orphaned_worker_joins_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    # The master died (the worker was reparented to init): no group to join,
    # even for a worker that was told its master's pid.
    monkeypatch.setattr(supervisor, "_master_pid", os.getppid())
    assert supervisor.supervisor_pid() == os.getppid()
    monkeypatch.setattr(workers.os, "getppid", lambda: 1)
    assert supervisor.supervisor_pid() is None


def test_a_directory_of_another_user_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_dir: Path) -> None:
    directory = tmp_dir / "theirs"
    directory.mkdir(mode=0o700)
    owner = directory.stat().st_uid
    monkeypatch.setattr(workers.os, "getuid", lambda: owner + 1)  # this process is someone else
    with pytest.raises(OSError, match=f"belongs to uid {owner}, not to this process's uid {owner + 1}"):
        workers._private_dir(directory, strict=False)


def test_a_refused_directory_is_told_once_per_process(
    tmp_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_dir / "shared"
    directory.mkdir()
    directory.chmod(0o777)

    async def run(group: WorkerGroup) -> bool:
        await group.start()
        try:
            return group.serving
        finally:
            group.stop()

    group = WorkerGroup(answering({"pid": os.getpid()}), directory=directory)
    # Two server runs in one process (a lifespan restart): one warning.
    assert asyncio.run(run(group)) is False
    assert asyncio.run(run(group)) is False
    warnings = [r for r in caplog.records if "workers=all will show this worker only" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].getMessage().endswith("has mode 0777; other users must not write to it")


def test_combine_sums_numbers_only() -> None:
    one = {"pid": 1, "counts": {"all": 2, "mode": "uvicorn-h11", "held": True}, "totals": {"requests": 1.5}}
    two = {"pid": 2, "counts": {"all": 1, "held": False}, "totals": {"requests": 2, "since": None}}
    answer = combine([one, two], limit=1)
    # A string, a flag or None is a worker's own, not a count: not summed, not made up.
    assert answer["counts"] == {"all": 3}
    assert answer["totals"] == {"requests": 3.5}


def test_a_busy_socket_of_a_gone_pid_is_left_and_foreign_entries_are_not_groups(
    master_directory: Path,
) -> None:
    # A socket that does not refuse (its backlog is full: someone serves it,
    # maybe from another pid namespace) is never removed, whatever its name
    # says; in the base directory, what is not a master's directory is not touched.
    directory = master_directory
    base = directory.parent
    base.mkdir(mode=0o700)
    directory.mkdir(mode=0o700)
    (base / "notes").write_text("an operator's")
    masterlike = base / f"{dead_pid()}"
    masterlike.write_text("a file named like a master, not a directory")
    busy_path = directory / f"{dead_pid()}.sock"
    busy = socket.socket(socket.AF_UNIX)
    busy.bind(str(busy_path))
    busy.listen(0)
    waiting: list[socket.socket] = []
    try:
        with contextlib.suppress(BlockingIOError):
            for _ in range(64):  # fill the backlog: the next connect would wait
                client = socket.socket(socket.AF_UNIX)
                waiting.append(client)
                client.setblocking(False)
                client.connect(str(busy_path))
        assert workers._listening(str(busy_path)) is True

        async def run() -> None:
            group = WorkerGroup(answering({"pid": os.getpid()}))
            await group.start()
            try:
                assert group.directory == directory and group.serving
            finally:
                group.stop()

        asyncio.run(run())
        assert busy_path.exists()  # neither start() nor stop() took it
        assert directory.is_dir()  # not empty: stop() left the directory
        assert sorted(base.iterdir()) == sorted([base / "notes", masterlike, directory])
    finally:
        for client in waiting:
            client.close()
        busy.close()


def test_a_listed_socket_that_is_gone_at_the_connection_is_left_out(tmp_dir: Path) -> None:
    # Listed, then gone before the connection (a worker that stopped in
    # between): neither a worker nor unreachable.  A dangling link is that moment held still.
    (tmp_dir / f"{os.getppid()}.sock").symlink_to(tmp_dir / "gone.sock")

    async def run() -> dict[str, Any]:
        group = WorkerGroup(answering({"pid": os.getpid()}), directory=tmp_dir)
        await group.start()
        try:
            return await group.gather(1)
        finally:
            group.stop()

    answer = asyncio.run(run())
    assert answer["workers"] == [{"pid": os.getpid()}] and answer["unreachable"] == 0


def test_a_directory_removed_under_a_running_worker_leaves_it_alone_in_the_answer(tmp_dir: Path) -> None:
    directory = tmp_dir / "workers"

    async def run() -> dict[str, Any]:
        group = WorkerGroup(answering({"pid": os.getpid(), "counts": {"all": 4}}), directory=directory)
        await group.start()
        try:
            assert group.serving
            for path in directory.iterdir():
                path.unlink()
            directory.rmdir()  # an operator's cleanup while the server runs
            assert group.siblings() == []
            return await group.gather(1)
        finally:
            group.stop()

    answer = asyncio.run(run())
    assert answer["workers"] == [{"pid": os.getpid(), "counts": {"all": 4}}]
    assert answer["counts"] == {"all": 4} and not directory.exists()


class _Transport:
    """What a sibling's connection looks like to the worker answering it."""

    def __init__(self) -> None:
        self.written = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def test_a_siblings_request_over_several_reads_is_answered_once_and_late_bytes_ignored() -> None:
    async def run() -> tuple[bytes, bytes]:
        server = workers._SnapshotServer(answering({"pid": os.getpid(), "counts": {"all": 1}}))
        transport = _Transport()
        server.connection_made(transport)  # type: ignore[arg-type]
        server.data_received(b'{"lim')
        server.data_received(b'it": 3}')
        await asyncio.sleep(0)
        assert transport.written == b""  # no newline yet: waits for the rest
        server.data_received(b"\n")
        for _ in range(10):
            await asyncio.sleep(0)
        answered = transport.written
        server.data_received(b'{"limit": 4}\n')  # after the answer and the close: ignored
        await asyncio.sleep(0)
        late = transport.written[len(answered) :]
        server.connection_lost(None)
        # A sibling gone while the snapshot was being made: nothing is written.
        gone = _Transport()
        other = workers._SnapshotServer(answering({"pid": os.getpid()}))
        other.connection_made(gone)  # type: ignore[arg-type]
        other.data_received(b'{"limit": 1}\n')
        gone.closing = True
        for _ in range(10):
            await asyncio.sleep(0)
        other.connection_lost(None)
        return answered, late + gone.written

    answered, nothing = asyncio.run(run())
    assert json.loads(answered) == {"pid": os.getpid(), "counts": {"all": 1}}
    assert nothing == b""


def test_a_connection_lost_before_it_was_made_is_nothing_to_clean_up() -> None:
    server = workers._SnapshotServer(answering({"pid": os.getpid()}))
    server.connection_lost(None)
    server.data_received(b'{"limit": 1}\n')  # no transport: nothing to answer on
    assert server._task is None
