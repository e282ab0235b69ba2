"""uvicorn's protocol ``__init__``, its own code, with two of its module's names bound to connlist's.

uvicorn makes a protocol object per connection, and its ``__init__`` looks
its two loggers up each time with ``logging.getLogger``: for a logger that
exists, a lock taken and released and four Python calls, to find the same
object in the logging manager's table (``Manager.loggerDict``) every time.
Its httptools ``__init__`` also makes the pipeline queue, ``deque()``, which
connlist's class replaced at once with its own (``_Pipeline``).

connlist's classes run uvicorn's ``__init__`` itself (its code object, not a
copy, so every statement is uvicorn's, whatever the release) as a function
whose globals are those of uvicorn's module but for:

* ``logging``: ``LOGGING``, whose ``getLogger`` returns what
  ``logging.getLogger`` would: the manager's entry when it is a logger
  (what ``Manager.getLogger`` returns for one, without its lock, which
  guards only the making of one), else ``logging.getLogger``'s answer;
  every other name is ``logging``'s;
* the names the class gives (httptools: ``deque``, bound to its queue).

A name is bound only where uvicorn's ``__init__`` reads it as a global; a
release that stops doing so keeps its own lookups (and connlist's class
replaces the queue after uvicorn's ``__init__``:
``connlist.servers.uvicorn.httptools_impl.constructor``).  The globals are
those of uvicorn's module when the class is built: a name uvicorn's module
rebinds later (a test's patch) is not seen.  docs/benchmarks.md has the
figures ("uvicorn's constructor, and the calls around uvicorn's methods").
"""

from __future__ import annotations

import dis
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LOGGING", "constructor"]


def _get_logger(name: str | None = None) -> logging.Logger:
    """``logging.getLogger(name)``, without its lock where the logger exists."""
    # The manager is read each time, as logging.getLogger does (it may be replaced).
    found = logging.Logger.manager.loggerDict.get(name)  # type: ignore[arg-type]
    if isinstance(found, logging.Logger):
        return found
    # Not made yet, a placeholder, the root logger, or no name: logging's own answer.
    return logging.getLogger(name)


def _logging_attribute(name: str) -> Any:
    return getattr(logging, name)


# ``logging`` as uvicorn's ``__init__`` sees it in connlist's classes.  A
# module, not an object of a class of ours: CPython reads a module's
# attribute, and calls a plain function, at the least cost.
LOGGING = types.ModuleType("logging", "logging, as connlist's protocols construct with it")
LOGGING.getLogger = _get_logger  # type: ignore[attr-defined]
LOGGING.__getattr__ = _logging_attribute  # type: ignore[method-assign]  # every other name: logging's


def _globals_read(code: types.CodeType) -> set[str]:
    """The names ``code`` reads as globals (nested code included)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def constructor(init: Any, names: Mapping[str, Any]) -> Callable[..., None] | None:
    """uvicorn's ``init`` run with ``logging`` and ``names`` bound to connlist's; None where none applies.

    None also where ``init`` is not a plain Python function (then the class
    keeps uvicorn's own).
    """
    if not isinstance(init, types.FunctionType):
        return None
    bound = {"logging": LOGGING, **names}
    read = _globals_read(init.__code__)
    mine = {name: value for name, value in bound.items() if name in read}
    if not mine:
        return None
    function = types.FunctionType(
        init.__code__, {**init.__globals__, **mine}, init.__name__, init.__defaults__, init.__closure__
    )
    function.__kwdefaults__ = init.__kwdefaults__
    function.__qualname__ = init.__qualname__
    function.__module__ = init.__module__
    function.__doc__ = init.__doc__
    function.__annotations__ = init.__annotations__
    function.__wrapped__ = init  # type: ignore[attr-defined]  # inspect.signature, and the reader
    return function
