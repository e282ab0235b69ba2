"""Stand-ins for time, the event loop and a server's connections, to test timing logic deterministically.

As uvicorn tests its protocols' timers (``tests/protocols/test_http.py``):
``MockLoop`` keeps the callbacks it is given instead of running them, and a
test runs them when it says so, moving a ``FakeClock`` by hand to each
timer's time.  ``MemoryHandle`` is a connection's handle (what the enforcer
closes through) over a ``MemoryTransport``: what was written, what the client
has not taken, whether the server stopped reading, closed or aborted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

T0 = 1000.0


class FakeClock:
    """A monotonic clock that only moves when told to, and never returns 0."""

    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class MockHandle:
    """What ``call_soon`` and ``call_later`` return: a callback, when it is due, whether cancelled."""

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self) -> None:
        self.callback(*self.args)


class MockLoop:
    """The part of an event loop a timer uses: ``call_later``, ``call_soon``, ``is_closed``.

    Closed (``closed``), it refuses callbacks as asyncio's loop does.

    Nothing runs by itself.  ``run_soon`` is one loop iteration: it runs
    what was queued with ``call_soon`` before it began.  ``run_until`` runs
    the timers due by a clock value, earliest first, each with the clock
    moved to its time, and leaves the clock there.
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.later: list[MockHandle] = []
        self.soon: list[MockHandle] = []
        self.closed = False

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> MockHandle:
        assert delay >= 0, delay
        self._check_closed()
        handle = MockHandle(self.clock.now + delay, callback, args)
        self.later.append(handle)
        return handle

    def call_soon(self, callback: Callable[..., object], *args: Any) -> MockHandle:
        self._check_closed()
        handle = MockHandle(self.clock.now, callback, args)
        self.soon.append(handle)
        return handle

    def is_closed(self) -> bool:
        return self.closed

    def _check_closed(self) -> None:
        # As asyncio's and uvloop's loops refuse a callback once closed.
        if self.closed:
            raise RuntimeError("Event loop is closed")

    @property
    def armed(self) -> list[float]:
        """When the timers neither cancelled nor run are due, earliest first."""
        return sorted(h.when for h in self.later if not h.cancelled)

    @property
    def queued(self) -> int:
        """Callbacks waiting for the next iteration (not cancelled)."""
        return sum(not h.cancelled for h in self.soon)

    def run_soon(self) -> int:
        """One loop iteration: run the callbacks queued so far; how many ran."""
        ready, self.soon = [h for h in self.soon if not h.cancelled], []
        for handle in ready:
            handle.run()
        return len(ready)

    def run_until(self, until: float, limit: int = 1000) -> int:
        """Run the timers due by ``until`` in order, the clock moved to each; how many ran.

        More than ``limit`` of them is taken for a timer re-armed without end
        (a real loop would spin), and fails.
        """
        ran = 0
        while True:
            assert ran <= limit, f"more than {limit} timers by {until}: re-armed without end?"
            due = [h for h in self.later if not h.cancelled and h.when <= until]
            if not due:
                break
            handle = min(due, key=lambda h: h.when)
            self.later.remove(handle)
            self.clock.now = max(self.clock.now, handle.when)
            handle.run()
            ran += 1
        self.clock.now = max(self.clock.now, until)
        return ran


class MemoryTransport:
    """A transport in memory, after uvicorn's tests' ``MockTransport``.

    ``unsent`` is what the client has not taken of what was written (the
    test sets it, as a slow reader would leave it).
    """

    def __init__(self) -> None:
        self.buffer = b""
        self.unsent = 0
        self.read_paused = False
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.buffer += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.unsent


RESPONSE_408 = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)
RESPONSE_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class MemoryHandle:
    """A connection's handle (``connlist.core.connections.ConnectionHandle``) over a ``MemoryTransport``.

    Closes as the server layer does: a ``408`` (or ``431``) only if no
    response byte was written for the request, then close; an abort drops
    what is unsent.
    """

    def __init__(self, method: str | None = None, path: str | None = None) -> None:
        self.transport = MemoryTransport()
        self.request = (method, path)
        self.responding = False
        # Closed by the keep-alive timeout (connlist_close_keepalive).
        self.closed_keepalive = False

    def connlist_close_expired(self) -> None:
        if not self.responding and not self.transport.closed:
            self.transport.write(RESPONSE_408)
        self.transport.close()

    def connlist_close_overflow(self) -> None:
        if not self.responding and not self.transport.closed:
            self.transport.write(RESPONSE_431)
        self.transport.close()

    def connlist_close_idle(self) -> bool:
        if self.responding or self.transport.is_closing():
            return False
        self.transport.close()
        return True

    def connlist_close_keepalive(self) -> None:
        self.closed_keepalive = True
        self.transport.close()

    def connlist_close(self) -> None:
        self.transport.close()

    def connlist_abort(self) -> None:
        self.transport.abort()

    def connlist_refuse(self) -> None:
        self.transport.write(RESPONSE_503)
        self.transport.close()

    def connlist_pending(self) -> int:
        return self.transport.get_write_buffer_size()

    def connlist_acked(self) -> tuple[int, int] | None:
        return None  # a memory transport: progress is the buffer going down

    def connlist_reading_paused(self) -> bool:
        return self.transport.read_paused

    def connlist_request(self) -> tuple[str | None, str | None]:
        return self.request


class LingeringHandle(MemoryHandle):
    """A ``MemoryHandle`` whose closes linger as the server layer's do (``connlist.servers.seam``).

    A close decided outside the sweep's own linger (the budget's, an
    expired connection's) puts the record in ``closing`` and brings the
    enforcer's timer forward to the linger's end: the closes that arm the
    timer from within a sweep.
    """

    def __init__(self, enforcer: Any, clock: FakeClock) -> None:
        super().__init__()
        self.enforcer = enforcer
        self.clock = clock
        self.record: Any = None

    def _linger(self) -> None:
        enforcer = self.enforcer
        enforcer.connections.linger(self.record)
        enforcer.bring_forward(self.clock.now + enforcer.linger)

    def connlist_close_idle(self) -> bool:
        if not super().connlist_close_idle():
            return False
        self._linger()
        return True

    def connlist_close(self) -> None:
        super().connlist_close()
        self._linger()
