"""The harness's real servers (``tests/subprocesses.py``): a port each, and their own process's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests import subprocesses
from tests.subprocesses import PYTHON, answered_by, free_port, run_server


class _Socket:
    """A socket whose bind to port 0 gets the next of ``ports``."""

    ports: ClassVar[list[int]] = []

    def __init__(self, *args: Any) -> None:
        self.port = 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.port = self.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_never_gives_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may give a port free again before the server it went to binds it.
    monkeypatch.setattr(subprocesses.socket, "socket", _Socket)
    monkeypatch.setattr(subprocesses, "_given", {1001})
    _Socket.ports = [1001, 1002, 1002, 1001, 1003]
    assert [free_port(), free_port()] == [1002, 1003]
    assert _Socket.ports == []


def test_a_server_answered_for_by_another_process_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the port another server listens on, a process that never binds it is not taken for
    # ready: the other's debug view says its pid, not of the group started.
    serve = [PYTHON, "-m", "uvicorn", "tests.drift_app:app", "--http", "h11", "--log-level", "warning"]
    with run_server(lambda port: [*serve, "--port", str(port)], tmp_path / "first.log") as first:
        monkeypatch.setattr(subprocesses, "free_port", lambda: first.port)
        idle = [PYTHON, "-c", "import time; time.sleep(60)"]
        with (
            pytest.raises(AssertionError, match=f"another process answered on port {first.port}"),
            run_server(lambda port: idle, tmp_path / "second.log"),
        ):
            pass
        # The readiness answer of the server started, as it said it.
        assert answered_by(first.proc, b'{"pid": %d}' % first.proc.pid)
    assert answered_by(first.proc, b"Hello") and answered_by(first.proc, b'{"mode": "asgi"}')
