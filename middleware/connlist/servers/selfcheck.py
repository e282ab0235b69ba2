"""What every server's self-check is made of: its failure, its result, a memory transport, its own loop.

A server's self-check drives connlist's protocol class through a conversation in memory, once per
process, before the server gets it. What the checks share is here, and knows no server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from connlist.core.handover import HandOver

__all__ = ["CheckFailed", "MemoryTransport", "Result", "handed_over", "run_on_own_loop"]


class CheckFailed(Exception):
    """One thing the server does differently from what connlist relies on (the message says what)."""


@dataclass
class Result:
    """The outcome of one protocol class's check."""

    failure: str | None  # None if the check passed
    logger_name: str | None = None  # what the server's protocol logs to, if the check got that far
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failure is None


def handed_over(cls: type, handover: HandOver) -> type:
    """A subclass of ``cls`` whose protocols read ``handover``, not the worker's (a real server's).

    A class attribute, as a protocol with ``__slots__`` has no ``__dict__``.
    """
    return type(
        cls.__name__, (cls,), {"__slots__": (), "__module__": cls.__module__, "connlist_handover": handover}
    )


class MemoryTransport(asyncio.Transport):
    """A transport that keeps what is written and tells the peer's address: no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


def run_on_own_loop(check: Callable[[], Awaitable[Result]], limit: float, name: str) -> Result:
    """``check()`` within ``limit`` seconds, on a loop of its own: the server's may be running here."""
    results: list[Result] = []
    started = time.perf_counter()

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            results.append(loop.run_until_complete(asyncio.wait_for(check(), limit)))
        except BaseException as exc:  # a timeout, or worse: the check failed
            results.append(Result(f"the scripted conversation did not finish: {type(exc).__name__} {exc}"))
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            finally:
                loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(limit + 5)
    if not results:  # pragma: no cover - the loop's own timeout ends it first
        return Result(
            "the scripted conversation did not finish in time", seconds=time.perf_counter() - started
        )
    result = results[0]
    result.seconds = time.perf_counter() - started
    return result
