"""What every server's self-check is made of: the script's skeleton and words, its failure, its result.

A server's self-check drives connlist's protocol class through a conversation in memory, once per
process, before the server gets it, on a loop of its own. What the checks share is here, and knows
no server; each server's script says what its server must do.
"""

from __future__ import annotations

import abc
import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from connlist.core.enforcer import Enforcer
from connlist.core.handover import HandOver
from connlist.core.kinds import resolve
from connlist.core.records import Connection
from connlist.core.views import connection_state

__all__ = [
    "CheckFailed",
    "MemoryTransport",
    "Result",
    "Script",
    "check_static",
    "handed_over",
    "require",
    "run_on_own_loop",
]

# Nothing expires unless the script moves its clock past them.
HEADERS_TIMEOUT = 10.0
REQUEST_TIMEOUT = 30.0


class CheckFailed(Exception):
    """One thing the server does differently from what connlist relies on (the message says what)."""


def require(ok: object, failure: str) -> None:
    """One rule of the check: ``failure`` (one sentence) unless ``ok``."""
    if not ok:
        raise CheckFailed(failure)


def check_static(base: type, hooks: tuple[str, ...]) -> None:
    """The check without running the protocol: the methods in ``hooks`` are there."""
    missing = [name for name in hooks if not callable(getattr(base, name, None))]
    require(
        not missing,
        f"{base.__module__}.{base.__qualname__} has no {', '.join(f'`{name}`' for name in missing)}",
    )


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


class Script(abc.ABC):
    """One conversation, on the running loop, against an enforcer and a clock of its own."""

    # What both servers are sent; a server's script adds its own.
    GET = b"GET /a?x=1 HTTP/1.1\r\nHost: t\r\n\r\n"
    POST = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
    EARLY = b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n"
    UPGRADE = (
        b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )

    rounds = 20  # of the loop, at most, for what one read sets off

    def __init__(self, cls: type, **options: Any) -> None:
        self.now = 1000.0
        self.enforcer = Enforcer(
            resolve(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT, **options),
            clock=lambda: self.now,
        )
        # Never HANDOVER, which a real server may be using.
        self.made = handed_over(cls, HandOver(self.enforcer))
        self.protocols: list[tuple[Any, MemoryTransport]] = []
        self.logger_name: str | None = None
        self.steps: list[str] = []

    @abc.abstractmethod
    async def run(self) -> None:
        """The conversation, step by step: a ``CheckFailed`` at the first difference."""

    @abc.abstractmethod
    def connect(self) -> tuple[Any, MemoryTransport]:
        """A new protocol of the class checked, connected to a memory transport (kept for ``close``)."""

    def tracked(self) -> tuple[Any, MemoryTransport, Connection]:
        """``connect``, and the connection's record in the list."""
        protocol, transport = self.connect()
        record = getattr(protocol, "_connlist_record", None)
        require(isinstance(record, Connection), "a connection made was not tracked")
        return protocol, transport, cast("Connection", record)

    async def until(self, done: Callable[[], object]) -> None:
        """Let what a read set off run until ``done()``, for ``rounds`` rounds of the loop at most."""
        for _ in range(self.rounds):
            if done():
                return
            await asyncio.sleep(0)

    async def settle(self) -> None:
        await self.until(lambda: False)

    async def feed(self, protocol: Any, data: bytes, done: Callable[[], object] | None = None) -> None:
        protocol.data_received(data)
        await self.until(done or (lambda: False))

    def expect(self, step: str, record: Connection, state: str, requests: int | None = None) -> None:
        self.steps.append(step)
        got = connection_state(record)
        require(got == state, f"after {step}, the connection is {got}, where it must be {state}")
        require(
            requests is None or record.requests == requests,
            f"after {step}, the connection counts {record.requests} requests, not {requests}",
        )

    @staticmethod
    def responses(transport: MemoryTransport) -> int:
        return bytes(transport.written).count(b"HTTP/1.1 200 ")

    def past_headers_timeout(self) -> list[Connection]:
        """The clock moved past the headers timeout: the connections the list finds expired."""
        self.now += HEADERS_TIMEOUT + 1
        return self.enforcer.connections.expired(HEADERS_TIMEOUT, REQUEST_TIMEOUT)

    async def close(self) -> None:
        """No connection left in the list, and no timer."""
        self.enforcer.cancel()
        for protocol, _transport in self.protocols:
            record = getattr(protocol, "_connlist_record", None)
            if record is not None and record.tracked:
                protocol.connection_lost(None)
        await self.wind_down()
        self.enforcer.cancel()

    async def wind_down(self) -> None:
        """What the connections lost set off, run."""
        await self.settle()


async def _converse(make: Callable[[], Script]) -> Result:
    """The script ``make()`` gives, run and closed: its failure, or none."""
    script: Script | None = None
    result = Result(None)
    try:
        script = make()
        await script.run()
    except CheckFailed as failed:
        result = Result(str(failed))
    except Exception as exc:  # anything the server does differently may raise anything
        result = Result(f"the scripted conversation raised {type(exc).__name__}: {exc}")
    finally:
        if script is not None:
            try:
                await script.close()
            except Exception as exc:  # pragma: no cover - defensive
                if result.failure is None:
                    result = Result(f"closing the scripted conversation raised {type(exc).__name__}: {exc}")
            result.logger_name, result.steps = script.logger_name, script.steps
    return result


def run_on_own_loop(make: Callable[[], Script], limit: float, name: str) -> Result:
    """``make()``'s script run within ``limit`` seconds, on a loop of its own: the server's may be running."""
    results: list[Result] = []
    started = time.perf_counter()

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            results.append(loop.run_until_complete(asyncio.wait_for(_converse(make), limit)))
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
