"""Other processes of this host, as the worker group and the metrics ask about them.

Both ask the same question of a pid found in a file name (a worker's socket,
a worker's gauge file): is that process still there?  ``process_info``
answers it, once, for both:

* **Gone** (None): ``os.kill(pid, 0)`` finds no such process, or ``/proc``
  says it is a zombie or dead (killed, not yet reaped by its parent: it
  runs no code any more, and its pid is not free yet).
* **There**: anything else, another user's process too (``os.kill`` raises
  ``PermissionError``: it exists, this process may not signal it).  What
  ``/proc/<pid>/stat`` says of it is read along, when it can be: its state,
  its parent and its start time; ``mine`` says whether it may be signalled.

What a caller makes of a process that is there is its own rule:
``connlist.observe.workers`` counts only its own user's children of the master as
siblings, ``connlist.prometheus`` keeps the gauges of any process that is
there.  Without ``/proc`` (not Linux), only ``os.kill`` answers.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["ProcessInfo", "process_info"]


class ProcessInfo(NamedTuple):
    """A process that is there: whether this process may signal it, and what ``/proc`` says of it."""

    # False for another user's process (os.kill raised PermissionError).
    mine: bool
    # /proc/<pid>/stat's state letter, parent pid and start time (clock
    # ticks since boot, as text); None where /proc could not be read.
    state: str | None = None
    ppid: int | None = None
    start: str | None = None


def process_info(pid: int) -> ProcessInfo | None:
    """Process ``pid`` if it is there, None if it is gone or a zombie (see the module docstring)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        mine = False
    else:
        mine = True
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read().decode("ascii", "replace")
    except OSError:
        return ProcessInfo(mine)  # no /proc, or gone since os.kill: os.kill's answer stands
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
    fields = data[data.rfind(")") + 2 :].split()
    try:
        state, ppid, start = fields[0], int(fields[1]), fields[19]
    except (IndexError, ValueError):
        return ProcessInfo(mine)
    if state in ("Z", "X"):
        return None
    return ProcessInfo(mine, state, ppid, start)
