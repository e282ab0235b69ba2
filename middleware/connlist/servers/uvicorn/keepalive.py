"""uvicorn's keep-alive timeout, timed by connlist's list instead of by a timer per response.

uvicorn's protocols arm a timer at the end of every response that leaves a
connection idle (``on_response_complete``: ``self.timeout_keep_alive_task =
self.loop.call_later(self.timeout_keep_alive,
self.timeout_keep_alive_handler)``) and cancel it at the next read.  So every
keep-alive request allocates a timer handle, pushes it on the loop's heap and
cancels it.  connlist's list already orders its idle connections, and one
timer per worker already sweeps them (``connlist.core.sweep``, its
``keepalive`` step), closing a connection idle for ``timeout_keep_alive``
seconds through uvicorn's own ``timeout_keep_alive_handler``: the same close,
at the same time.

So connlist's protocols give uvicorn's code a ``loop`` attribute that is the
event loop but for that one call: ``ListTimedLoop.call_later`` of the
keep-alive handler returns ``TIMED_BY_LIST`` and arms nothing (the list's
``response_complete`` event, which the protocol calls after uvicorn's
``on_response_complete``, starts the idle time).  Every other call is the
loop's.  uvicorn's method runs as uvicorn wrote it, whatever the release.
Where a uvicorn no longer arms its keep-alive that way, its own timer stays,
and the self-check says so (``connlist.servers.uvicorn.selfcheck``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TIMED_BY_LIST", "ListTimedLoop"]


class _TimedByList:
    """``timeout_keep_alive_task`` while the list times the connection's keep-alive.

    Not None, so that what uvicorn reads there (armed or not) stays true.  A
    read at rest drops it before uvicorn's own ``data_received`` would
    cancel it (the protocols' ``data_received``): the read ends the idle
    time by itself, and uvicorn's cancel is then a None test, not a call.
    """

    __slots__ = ()

    def cancel(self) -> None:
        """Nothing to cancel: the list sees the next request end the idle time."""

    def __repr__(self) -> str:
        return "<keep-alive timed by connlist's list>"


TIMED_BY_LIST = _TimedByList()

# The name of uvicorn's keep-alive close, the one callback the list times.
HANDLER = "timeout_keep_alive_handler"


class ListTimedLoop:
    """The event loop, as the ``loop`` of a uvicorn HTTP protocol whose keep-alive the list times.

    One per loop and worker (``for_loop``).  ``create_task`` is the loop's
    own bound method, kept here: uvicorn calls it for every request.
    """

    __slots__ = ("create_task", "loop")

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.create_task: Callable[..., Any] = loop.create_task

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        # The loop's own signature: a ``**kwargs`` would make a dict per call.
        if delay > 0 and not args and getattr(callback, "__name__", None) == HANDLER:
            return TIMED_BY_LIST
        return self.loop.call_later(delay, callback, *args, context=context)

    def __getattr__(self, name: str) -> Any:
        # What uvicorn may read of its loop besides: the loop's own.
        return getattr(self.loop, name)

    def __repr__(self) -> str:
        return f"<{self.loop!r}, keep-alive timed by connlist's list>"


# The stand-in made last: every connection of a worker's server shares it.
last: ListTimedLoop | None = None


def for_loop(loop: Any) -> ListTimedLoop:
    """A new stand-in for ``loop``, kept as ``last``: called where ``last`` is another loop's, or none."""
    global last
    last = ListTimedLoop(loop)
    return last
