"""``observe.processes``: one answer to "is process ``pid`` still there?", for workers and metrics."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from connlist.observe import processes
from connlist.observe.processes import ProcessInfo, process_info
from connlist.observe.workers import WorkerGroup
from tests.servers import wait_for


def test_this_process_is_there_with_its_parent_and_start_time() -> None:
    found = process_info(os.getpid())
    assert found is not None and found.mine
    if Path("/proc").is_dir():
        assert found.ppid == os.getppid()
        assert found.state == "R"  # reading its own stat
        assert found.start is not None and found.start.isdigit()


def test_a_process_gone_or_a_zombie_is_gone() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # exited and reaped: no such process
    assert process_info(gone.pid) is None
    zombie = subprocess.Popen(["sleep", "30"])
    zombie.kill()  # killed, not reaped yet: it still has its pid
    try:
        if Path("/proc").is_dir():
            assert wait_for(lambda: process_info(zombie.pid) is None)
    finally:
        zombie.wait()


def test_another_users_process_is_there_for_both_callers_and_no_sibling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One answer (there, not mine); each caller's rule on top of it: the
    # metrics keep its gauges (tests/test_prometheus.py), the worker group
    # does not count it as a worker.
    def not_yours(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(processes.os, "kill", not_yours)
    found = process_info(os.getppid())
    assert found is not None and not found.mine

    async def snapshot_of(limit: int) -> dict[str, Any]:
        return {}

    group = WorkerGroup(snapshot_of)
    group.master = None
    assert group._is_sibling(os.getppid()) is False


def test_without_proc_only_os_kill_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    assert process_info(os.getpid()) == ProcessInfo(mine=True)


@pytest.mark.parametrize(
    "stat", [b"4242 (short) R", b"4242 (worker) R notapid 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18"]
)
def test_a_stat_line_that_cannot_be_read_leaves_os_kills_answer(
    monkeypatch: pytest.MonkeyPatch, stat: bytes
) -> None:
    # Another kernel's layout, or a line cut short: what os.kill said stands.
    real_open = open

    def other_kernel(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc/"):
            import io

            return io.BytesIO(stat)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", other_kernel)
    assert process_info(os.getpid()) == ProcessInfo(mine=True)
