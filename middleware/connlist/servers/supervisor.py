"""Which server master supervises this worker (for the workers' view): uvicorn's workers know their
parent (``multiprocessing``); gunicorn's, forked, declare it (``supervised_by``).
"""

from __future__ import annotations

import multiprocessing
import os

__all__ = ["supervised_by", "supervisor_pid"]

# Set in a gunicorn worker before the app loads.
_master_pid: int | None = None


def supervised_by(master_pid: int) -> None:
    """Declare this process a worker of the server master ``master_pid`` (connlist's gunicorn workers)."""
    global _master_pid
    _master_pid = master_pid


def supervisor_pid() -> int | None:
    """The pid of this worker's server master, or None if this process is not a worker of one."""
    ppid = os.getppid()
    if ppid <= 1:
        return None  # orphaned (the master died): no group to join
    if _master_pid is not None:
        return ppid if _master_pid == ppid else None
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == ppid:
        return ppid
    return None
