"""uvicorn's keep-alive timed by connlist's list, not by a timer per response.

uvicorn arms ``loop.call_later(timeout_keep_alive, timeout_keep_alive_handler)`` at each response's
end that leaves a connection idle; the list already orders idle connections, and the worker's one
timer closes them with uvicorn's handler.  So uvicorn gets a ``loop`` that is the event loop but for
that call, which arms nothing.  A uvicorn that arms its keep-alive otherwise keeps its own timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from operator import attrgetter
from typing import Any

__all__ = ["TIMED_BY_LIST", "ListTimedLoop"]


class _TimedByList:
    """``timeout_keep_alive_task`` while the list times the keep-alive (``data_received`` drops it)."""

    __slots__ = ()

    def cancel(self) -> None:
        """Nothing to cancel: the next request ends the idle time in the list."""

    def __repr__(self) -> str:
        return "<keep-alive timed by connlist's list>"


TIMED_BY_LIST = _TimedByList()

# uvicorn's keep-alive close, the one callback the list times.
HANDLER = "timeout_keep_alive_handler"


class ListTimedLoop:
    """The event loop as a uvicorn protocol's ``loop``, but for the keep-alive's ``call_later``.

    One per loop and worker (``for_loop``).  The rest of the event loop's API is the loop's, with no
    ``__getattr__``, which would make every read, ``create_task``'s per request too, a lookup in Python.
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

    def __repr__(self) -> str:
        return f"<{self.loop!r}, keep-alive timed by connlist's list>"


# The rest of the event loop's API: the loop's own attributes, read in C.
for _name in dir(asyncio.AbstractEventLoop):
    if not _name.startswith("_") and _name not in ListTimedLoop.__dict__:
        setattr(ListTimedLoop, _name, property(attrgetter(f"loop.{_name}")))
del _name


class _AnyTimedLoop(ListTimedLoop):
    """For a loop that is no ``AbstractEventLoop`` (uvicorn's tests' ``MockLoop``): all of it goes to it."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)


# The stand-in made last: every connection of a worker's server shares it.
last: ListTimedLoop | None = None


def for_loop(loop: Any) -> ListTimedLoop:
    """A new stand-in for ``loop``, kept as ``last``."""
    global last
    last = ListTimedLoop(loop) if isinstance(loop, asyncio.AbstractEventLoop) else _AnyTimedLoop(loop)
    return last
