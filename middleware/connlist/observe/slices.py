"""Work done on the event loop in slices, so that one large answer does not stall a worker.

The debug endpoint (and a worker answering its siblings) builds and encodes
views of up to ``MAX_LIMIT`` connections on the loop that serves them.  Each
step of that work is small; ``cooperatively`` runs the steps and yields the
loop whenever ``SLICE`` seconds have been used, so the other clients of the
worker wait at most about that long.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["SLICE", "STEP", "cooperatively", "json_cooperatively", "json_pieces"]

# Slices of at most SLICE seconds of loop time, the clock looked at every
# STEP connections (a few hundred microseconds of work).
SLICE = 0.010
STEP = 100


async def cooperatively(steps: Iterator[None]) -> None:
    """Run ``steps`` to the end, yielding the event loop whenever a slice of ``SLICE`` seconds is used."""
    clock = time.perf_counter
    until = clock() + SLICE
    for _ in steps:
        if clock() > until:
            await asyncio.sleep(0)
            until = clock() + SLICE


def json_pieces(data: dict[str, Any]) -> Iterator[str]:
    """The JSON text of a snapshot, in pieces of at most ``STEP`` connections (``"".join`` them)."""
    lists = [key for key, value in data.items() if isinstance(value, list)]
    head = {key: value for key, value in data.items() if key not in lists}
    text = json.dumps(head, separators=(",", ":"))
    yield text[:-1]
    for key in lists:
        items = data[key]
        yield f",{json.dumps(key)}:["
        for start in range(0, len(items), STEP):
            piece = json.dumps(items[start : start + STEP], separators=(",", ":"))[1:-1]
            yield piece if start == 0 else "," + piece
        yield "]"
    yield "}"


async def json_cooperatively(data: dict[str, Any]) -> bytes:
    """The JSON of a snapshot, encoded in slices between which the event loop runs."""
    pieces: list[str] = []

    def encode() -> Iterator[None]:
        for piece in json_pieces(data):
            pieces.append(piece)
            yield

    await cooperatively(encode())
    return "".join(pieces).encode()
