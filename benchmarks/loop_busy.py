"""The server's loop, measured from inside: how long it works between two polls (``loop_busy.c``).

A benchmark builds the library once (``build``, with the C compiler ``cc``),
runs the server through ``wrapper(library, out)`` (``env LD_PRELOAD=...``,
which execs the server, so its PID stays the server's), and reads what it
recorded (``read``: at any time, and however it ended), then takes the
stretches within a time window (``within``).  The clock is the monotonic one of both
processes, so the window can be the load side's own times.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "loop_busy.c"
# Stretches shorter than this are not recorded (the library's default).
MIN_NS = 20_000
# The file's layout (loop_busy.c): the count recorded, then a record per stretch.
CAPACITY = 1 << 18
HEADER = struct.Struct("=Q")
RECORD = struct.Struct("=qqq")  # end, length (ns), preempted


class Unavailable(Exception):
    """The library cannot be built here (no C compiler, or it failed)."""


@dataclass(frozen=True)
class Stretch:
    # When the stretch ended and how long it was, in seconds on the monotonic clock.
    end: float
    length: float
    # How many times the kernel gave the CPU to another task within it.
    preempted: int


def build(directory: Path) -> Path:
    """Compile ``loop_busy.c`` into a shared library in ``directory``."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise Unavailable("no C compiler (cc): apt-get install gcc")
    target = directory / "loop_busy.so"
    done = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(target), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise Unavailable(f"{compiler} could not build {SOURCE.name}:\n{done.stderr[-2000:]}")
    return target


def wrapper(library: Path, out: Path, min_ns: int = MIN_NS) -> tuple[str, ...]:
    """The program that runs the server with the library loaded, recording into ``out`` as it runs."""
    return ("env", f"LD_PRELOAD={library}", f"LOOP_BUSY_OUT={out}", f"LOOP_BUSY_MIN_NS={min_ns}")


def read(out: Path) -> tuple[list[Stretch], int]:
    """The stretches the server recorded, in the order they ended, and how many it had no room for.

    Raises ``ValueError`` if the file is missing or is not the library's
    (the server did not load it).
    """
    try:
        data = out.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{out} was not written: did the server run with the library?") from None
    if len(data) != HEADER.size + CAPACITY * RECORD.size:
        raise ValueError(f"{out} holds {len(data)} bytes, not the library's record")
    (recorded,) = HEADER.unpack_from(data)
    kept = min(recorded, CAPACITY)
    stretches = [
        Stretch(end / 1e9, length / 1e9, preempted)
        for end, length, preempted in RECORD.iter_unpack(data[HEADER.size : HEADER.size + kept * RECORD.size])
        if end  # a slot taken but not written: the process ended between the two
    ]
    return stretches, recorded - kept


def within(stretches: list[Stretch], start: float, stop: float) -> list[Stretch]:
    """The stretches that ended from ``start`` to ``stop`` (seconds on the monotonic clock)."""
    return [s for s in stretches if start <= s.end <= stop]
