"""The harness's real servers (``tests/subprocesses.py``): a port each, and their own process's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import subprocesses
from tests.subprocesses import PYTHON, answered_by, free_port, run_server


def test_the_harness_takes_the_benchmarks_free_port() -> None:
    # One rule and one registry (tests/test_benchmarks.py tests the rule): a port never given twice.
    import ports

    assert free_port is ports.free_port


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
