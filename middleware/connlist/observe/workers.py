"""Every worker of a server in one answer: each worker serves its own view on a unix socket.

Theory of operation
-------------------

A server with several worker processes (``uvicorn --workers N``, gunicorn with
connlist's worker classes) has one list per worker and no shared memory.  So
each worker serves its snapshot to its siblings, and the worker that receives
``GET /_connections?workers=all`` asks every other one::

    <directory>/              mode 0700, owned by the server's user
        4242.sock             worker 4242's snapshot, mode 0600
        4243.sock

* **Which directory.**  ``$CONNLIST_WORKERS_DIR`` when the operator sets it
  (one directory per server, as ``PROMETHEUS_MULTIPROC_DIR``): every process
  that has it is in the group.  Otherwise the group is found without
  configuration, only when this process is a worker of a server master: a
  child that uvicorn's supervisor spawned (``multiprocessing.parent_process()``
  is the parent process), or a gunicorn worker of connlist's classes (which
  call ``connlist.servers.supervisor.supervised_by(master pid)``).  The directory is then private to the
  master: ``<base>/<master pid>-<master start time>``, where ``<base>`` is
  ``$XDG_RUNTIME_DIR/connlist`` or ``<temp dir>/connlist-<uid>`` (the start
  time, from ``/proc``, keeps a reused master pid from joining an old group).
  A process that is neither (plain ``uvicorn app:app``) is a group of one: no
  socket, and ``workers=all`` shows it alone.
* **When.**  ``start()`` runs once per server, at the ASGI lifespan startup
  (or at the first request when the lifespan is off), on the worker's own
  event loop: ``loop.create_unix_server`` on ``<pid>.sock``.  It serves in the
  loop like any connection; nothing runs until a sibling connects.
  ``stop()`` (lifespan shutdown, or at exit) closes and removes it.  A
  worker killed (``kill -9``, or by its master after the graceful timeout)
  cannot remove its own: every worker removes the sockets of siblings that
  are gone (the rule below) when it starts and when it stops, so the last
  one to leave takes them, and the master's directory with them.
* **Asking.**  ``gather()`` lists the directory, connects to every other
  socket at once, sends one line ``{"limit": N}`` and reads one JSON snapshot
  until the sibling closes, all within ``TIMEOUT`` (0.5 s).  A sibling that
  does not answer in time is listed as unreachable.  A socket that refuses
  connections, of a process that is gone (or a zombie, or no longer the
  master's child), is a crashed worker's: it is removed and not listed.
* **Who may ask.**  Only the server's user: the directory is 0700 and every
  socket 0600, checked (owner, no symlink) before use.  Nothing listens on the
  network.  The public endpoint keeps its own rules (loopback or token).

A directory that fails the checks, or a socket path too long for ``AF_UNIX``,
turns the group off with one warning: ``workers=all`` then shows this worker.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from connlist.core.logs import log
from connlist.observe.processes import process_info
from connlist.observe.slices import json_cooperatively
from connlist.servers.supervisor import supervisor_pid

__all__ = [
    "ENV_DIR",
    "TIMEOUT",
    "WorkerGroup",
    "combine",
    "default_directory",
]

ENV_DIR = "CONNLIST_WORKERS_DIR"
# How long the answering worker waits for all its siblings together.
TIMEOUT = 0.5
SUFFIX = ".sock"
# A request line is a few bytes; a sibling that sends more, or nothing for
# this long, is cut off (the socket is the same user's, but stays bounded).
_REQUEST_MAX = 1024
_REQUEST_TIMEOUT = 2.0
# Whatever limit is asked, an answer stays below this.
_ANSWER_MAX = 256 * 1024 * 1024

# This worker's snapshot for a limit: awaited, so that a large one is built in
# slices between which the worker's loop serves its clients.
Snapshotter = Callable[[int], Awaitable[dict[str, Any]]]


def _master_key(master: int) -> str:
    found = process_info(master)
    return str(master) if found is None or found.start is None else f"{master}-{found.start}"


def _private_dir(path: Path, *, strict: bool) -> Path:
    """Create ``path`` (0700) if missing; check it is a real directory of ours that no other user may write.

    ``strict``: no access at all for group and others (connlist's own
    directories); otherwise only no write access (an operator's directory).
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is not a directory (or is a symlink)")
    if info.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {info.st_uid}, not to this process's uid {os.getuid()}")
    forbidden = 0o077 if strict else 0o022
    if info.st_mode & forbidden:
        raise OSError(f"{path} has mode {stat.S_IMODE(info.st_mode):04o}; other users must not write to it")
    return path


def _base_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    # Only the user's own runtime directory (not one inherited through sudo, say).
    with contextlib.suppress(OSError):
        if runtime and os.stat(runtime).st_uid == os.getuid():
            return Path(runtime) / "connlist"
    return Path(tempfile.gettempdir()) / f"connlist-{os.getuid()}"


def default_directory(master: int) -> Path:
    """Where the workers of master ``master`` meet, when ``$CONNLIST_WORKERS_DIR`` is not set."""
    return _base_dir() / _master_key(master)


def _pid_of(name: str) -> int | None:
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
    return int(stem) if stem.isascii() and stem.isdigit() else None


def _listening(path: str) -> bool:
    """Whether something accepts connections on the unix socket ``path`` (a refusal is definite)."""
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(0.1)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # busy (a full backlog), or not ours to judge: leave it
        return True


def _remove_stale_groups(base: Path) -> None:
    """Remove the directories of masters that are gone (their workers could not clean up: kill -9).

    Only sockets that refuse connections go: a master that looks gone from
    here may be alive in another pid namespace sharing this directory.
    """
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        master, _, _ = entry.name.partition("-")
        if not (master.isascii() and master.isdigit()) or not entry.is_dir(follow_symlinks=False):
            continue
        if _master_key(int(master)) == entry.name:
            continue  # that master still runs
        with contextlib.suppress(OSError):
            for name in os.listdir(entry.path):
                path = os.path.join(entry.path, name)
                if _pid_of(name) is not None and not _listening(path):
                    os.unlink(path)
            os.rmdir(entry.path)  # fails, as it should, if anything is left


def combine(workers: list[dict[str, Any]], *, limit: int) -> dict[str, Any]:
    """The ``workers=all`` answer: each worker's entry, and the sums of the reachable ones' numbers.

    Counts and totals are summed key by key, whatever keys the workers have.
    """
    counts: dict[str, Any] = {}
    totals: dict[str, Any] = {}
    reachable = [worker for worker in workers if not worker.get("unreachable")]
    for worker in reachable:
        for into, key in ((counts, "counts"), (totals, "totals")):
            for name, value in worker.get(key, {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    into[name] = into.get(name, 0) + value
    return {
        "pid": os.getpid(),
        "limit": limit,
        "counts": counts,
        "totals": totals,
        "truncated": any(worker.get("truncated") for worker in reachable),
        "unreachable": len(workers) - len(reachable),
        "workers": sorted(workers, key=lambda worker: int(worker.get("pid", 0))),
    }


class _SnapshotServer(asyncio.Protocol):
    """One sibling's request: a line ``{"limit": N}``, answered with this worker's snapshot, then closed."""

    def __init__(self, snapshot_of: Snapshotter) -> None:
        self._snapshot_of = snapshot_of
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, only alike.)
        self._transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(_REQUEST_TIMEOUT, self._transport.close)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._buffer += data
        line, newline, _ = self._buffer.partition(b"\n")
        if not newline:
            if len(self._buffer) > _REQUEST_MAX:
                transport.close()
            return
        self._buffer.clear()
        self._task = asyncio.get_running_loop().create_task(self._answer(transport, bytes(line)))

    async def _answer(self, transport: asyncio.Transport, line: bytes) -> None:
        try:
            request = json.loads(line)
            limit = request["limit"]
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise ValueError(limit)
            body = await json_cooperatively(await self._snapshot_of(limit))
        except Exception as exc:  # a bad request from a sibling: say why, never crash the loop
            body = json.dumps({"pid": os.getpid(), "error": f"bad request: {exc!r}"[:200]}).encode()
        if not transport.is_closing():
            transport.write(body)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None


class WorkerGroup:
    """This worker's place among its server's workers: its socket, and how it asks the others.

    ``snapshot_of(limit)`` returns this worker's snapshot (called on its event
    loop).  ``directory=None`` finds it as the module docstring says.
    """

    def __init__(self, snapshot_of: Snapshotter, *, directory: str | os.PathLike[str] | None = None) -> None:
        self._snapshot_of = snapshot_of
        self._directory_option = None if directory is None else Path(directory)
        self.directory: Path | None = None
        self.master: int | None = None
        self._path: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._pid = 0
        # The pid that last ran start(): it runs once per server run, not per request.
        self._started: int | None = None
        self._warned = False

    @property
    def serving(self) -> bool:
        """Whether this worker's socket is open."""
        return self._server is not None

    @property
    def started(self) -> bool:
        """Whether ``start()`` ran in this process since the last ``stop()``."""
        return self._started == os.getpid()

    def _resolve(self) -> Path | None:
        """This process's group directory (created and checked), or None for a group of one."""
        option = self._directory_option
        if option is None and os.environ.get(ENV_DIR):
            option = Path(os.environ[ENV_DIR])
        if option is not None:
            self.master = None
            return _private_dir(option, strict=False)
        master = supervisor_pid()
        self.master = master
        if master is None:
            return None
        base = _private_dir(_base_dir(), strict=True)
        _remove_stale_groups(base)
        return _private_dir(base / _master_key(master), strict=True)

    async def start(self) -> None:
        """Listen on ``<dir>/<pid>.sock`` on the running loop (once per server; again after a fork)."""
        if self._started == os.getpid():
            return
        self._started = os.getpid()
        self._server = None  # after a fork: the parent's
        try:
            directory = self._resolve()
            if directory is None:
                return
            self._pid = os.getpid()
            path = directory / f"{self._pid}{SUFFIX}"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a dead process with this pid left it
            loop = asyncio.get_running_loop()
            server = await loop.create_unix_server(lambda: _SnapshotServer(self._snapshot_of), str(path))
            # The directory already keeps other users out; the socket's own mode says so too.
            os.chmod(path, 0o600)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("workers=all will show this worker only: %s", exc)
            return
        self.directory, self._path, self._server = directory, path, server
        atexit.register(self._remove)
        self._remove_dead_siblings(directory)

    def stop(self) -> None:
        """Stop serving and remove the socket (and the master's directory once it is empty)."""
        self._started = None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        atexit.unregister(self._remove)
        self._remove()

    def _remove(self) -> None:
        path, self._path = self._path, None
        if path is None or self._pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            path.unlink()
        # A sibling killed (kill -9, or by the master after its graceful
        # timeout) could not remove its socket: the last worker to leave
        # takes it, and then the master's directory.
        self._remove_dead_siblings(path.parent)
        if self.master is not None:
            with contextlib.suppress(OSError):  # not empty: a sibling still runs
                path.parent.rmdir()

    def _remove_dead_siblings(self, directory: Path) -> None:
        """Remove the sockets in ``directory`` of workers that are gone (``_ask``'s rule, without asking).

        A socket goes only if its pid is no live sibling and nothing
        listens on it: a live worker's socket, or one still being set up,
        is never touched.  Runs at ``start()`` and ``stop()``, once each.
        """
        try:
            names = os.listdir(directory)
        except OSError:
            return
        own = os.getpid()
        for name in names:
            pid = _pid_of(name)
            if pid is None or pid == own or self._is_sibling(pid):
                continue
            path = os.path.join(directory, name)
            if not _listening(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    # -- asking the siblings ----------------------------------------------------

    def siblings(self) -> list[tuple[int, Path]]:
        """``(pid, socket path)`` of every other worker in the directory."""
        directory = self.directory
        if directory is None or self._server is None:
            return []
        try:
            names = os.listdir(directory)
        except OSError:
            return []
        own = os.getpid()
        found = []
        for name in names:
            pid = _pid_of(name)
            if pid is not None and pid != own:
                found.append((pid, directory / name))
        return found

    def _is_sibling(self, pid: int) -> bool:
        """Whether ``pid`` is a live process that may be one of this server's workers.

        Gone or a zombie (killed, not yet reaped by the master): no.  There
        but another user's: no, not a worker of ours.  Else, with a master,
        only its child (where ``/proc`` says who the parent is).
        """
        found = process_info(pid)
        if found is None or not found.mine:
            return False
        return self.master is None or found.ppid is None or found.ppid == self.master

    async def _ask(self, pid: int, path: Path, limit: int) -> dict[str, Any] | None:
        """A sibling's snapshot, an unreachable entry, or None if it is gone (its stale socket removed)."""
        try:
            return await asyncio.wait_for(self._exchange(pid, path, limit), TIMEOUT)
        except asyncio.TimeoutError:
            error = f"no answer within {TIMEOUT:g} s"
        except FileNotFoundError:
            return None  # it stopped between the listing and the connection
        except ConnectionRefusedError:
            if not self._is_sibling(pid):
                with contextlib.suppress(OSError):
                    path.unlink()
                return None
            error = "connection refused"
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        return {"pid": pid, "unreachable": True, "error": error}

    async def _exchange(self, pid: int, path: Path, limit: int) -> dict[str, Any]:
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            writer.write(json.dumps({"limit": limit}).encode() + b"\n")
            chunks = []
            size = 0
            while chunk := await reader.read(65536):
                size += len(chunk)
                if size > _ANSWER_MAX:
                    raise ValueError(f"answer larger than {_ANSWER_MAX} bytes")
                chunks.append(chunk)
        finally:
            writer.close()
        answer = json.loads(b"".join(chunks))
        if not isinstance(answer, dict) or answer.get("pid") != pid:
            raise ValueError(f"the answer is not worker {pid}'s")
        if "error" in answer:
            raise ValueError(str(answer["error"]))
        return answer

    async def gather(self, limit: int) -> dict[str, Any]:
        """The ``workers=all`` answer: this worker's snapshot and every reachable sibling's, combined."""
        siblings = self.siblings()
        answers = await asyncio.gather(*(self._ask(pid, path, limit) for pid, path in siblings))
        # This worker's own view is taken last, when the answer is complete.
        workers = [answer for answer in answers if answer is not None]
        workers.append(await self._snapshot_of(limit))
        return combine(workers, limit=limit)
