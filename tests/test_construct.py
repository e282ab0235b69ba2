"""uvicorn's ``__init__`` with connlist's names (``connlist.servers.uvicorn.construct``).

The loggers it finds are the ones ``logging.getLogger`` gives in every case
(made, not made yet, a placeholder, the root); only names uvicorn's
``__init__`` reads as globals are bound; the protocols connlist's classes
make have uvicorn's loggers and connlist's queue; and a real uvicorn with
connlist's class still writes its access log.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from connlist.servers.uvicorn import construct
from connlist.servers.uvicorn.httptools_impl import _Pipeline
from tests.subprocesses import PYTHON, get, run_server

pytest.importorskip("httptools")


def test_get_logger_gives_what_logging_gives() -> None:
    made = logging.getLogger("tests.construct.made")
    assert construct.LOGGING.getLogger("tests.construct.made") is made
    # Not made yet: logging makes it, and both then give the same.
    fresh = construct.LOGGING.getLogger("tests.construct.fresh")
    assert isinstance(fresh, logging.Logger)
    assert fresh is logging.getLogger("tests.construct.fresh")
    # A placeholder (a child was made first): logging's answer, a logger, the child's parent.
    child = logging.getLogger("tests.construct.parent.child")
    assert isinstance(logging.Logger.manager.loggerDict["tests.construct.parent"], logging.PlaceHolder)
    parent = construct.LOGGING.getLogger("tests.construct.parent")
    assert isinstance(parent, logging.Logger)
    assert child.parent is parent
    # The root logger, by no name and by its name.
    assert construct.LOGGING.getLogger() is logging.getLogger() is logging.root
    assert construct.LOGGING.getLogger("root") is logging.root
    # Every other name is logging's.
    assert construct.LOGGING.INFO == logging.INFO
    assert construct.LOGGING.Logger is logging.Logger


def _init(self: Any, config: Any, _loop: Any = None, *, level: int = 1) -> None:
    self.logger = logging.getLogger("tests.construct.made")
    self.queue = deque()
    self.level = level
    self.loop = _loop


def test_only_the_names_read_as_globals_are_bound() -> None:
    init = construct.constructor(_init, {"deque": _Pipeline, "unread": object()})
    assert init is not None
    assert init.__globals__["logging"] is construct.LOGGING
    assert init.__globals__["deque"] is _Pipeline
    assert "unread" not in init.__globals__
    # The rest is the function's own: name, defaults, keyword defaults, signature.
    assert (init.__name__, init.__qualname__, init.__defaults__, init.__kwdefaults__) == (
        _init.__name__,
        _init.__qualname__,
        (None,),
        {"level": 1},
    )
    made = types.SimpleNamespace()
    init(made, None, "loop")
    assert made.logger is logging.getLogger("tests.construct.made")
    assert type(made.queue) is _Pipeline
    assert (made.level, made.loop) == (1, "loop")
    # The function given is left as it was.
    plain = types.SimpleNamespace()
    _init(plain, None)
    assert type(plain.queue) is deque


def test_nothing_to_bind_or_no_python_function_is_none() -> None:
    def reads_neither(self: Any) -> None:
        self.x = 1

    assert construct.constructor(reads_neither, {"deque": _Pipeline}) is None
    assert construct.constructor(object.__init__, {}) is None


def _made(cls: type, parser: str) -> Any:
    """A protocol of ``cls`` as uvicorn makes one per connection (``parser``'s config, its own loop)."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
        pass

    config = Config(app, http=parser, ws="none")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        return cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    finally:
        loop.close()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_connlist_protocols_are_made_with_uvicorn_loggers(parser: str) -> None:

    import connlist.uvicorn

    cls = getattr(connlist.uvicorn, "HttpToolsProtocol" if parser == "httptools" else "H11Protocol")
    assert cls.__init__.__globals__["logging"] is construct.LOGGING

    protocol = _made(cls, parser)
    assert protocol.logger is logging.getLogger("uvicorn.error")
    assert protocol.access_logger is logging.getLogger("uvicorn.access")
    if parser == "httptools":
        assert type(protocol.pipeline) is _Pipeline


def test_the_access_log_is_written(tmp_path: Path) -> None:
    """uvicorn on connlist's class, its access log on: one line per request, as uvicorn writes it."""
    command = lambda port: [  # noqa: E731
        PYTHON, "-m", "uvicorn", "tests.keepalive_app:app", "--host", "127.0.0.1", "--port", str(port),
        "--http", "connlist.uvicorn:HttpToolsProtocol", "--log-level", "info", "--access-log",
    ]  # fmt: skip
    with run_server(command, tmp_path / "server.log") as server:
        assert get(server.port, "/construct-check")[0] == 404
        deadline = time.monotonic() + 10
        while '"GET /construct-check HTTP/1.1" 404' not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.02)


def test_a_uvicorn_that_makes_its_queue_otherwise_gets_connlists_queue_after() -> None:
    """Where uvicorn's ``__init__`` reads no ``deque`` global, the queue is replaced after it."""
    import collections

    from uvicorn.protocols.http import httptools_impl

    from connlist.servers.uvicorn import classes

    class OwnQueue(httptools_impl.HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            httptools_impl.HttpToolsProtocol.__init__(self, *args, **kwargs)
            self.pipeline = collections.deque()

    cls = classes.PARSERS["httptools"].build(OwnQueue)
    assert cls.__init__.__globals__.get("deque") is not _Pipeline

    protocol = _made(cls, "httptools")
    assert type(protocol.pipeline) is _Pipeline
    assert protocol.logger is logging.getLogger("uvicorn.error")


def test_a_name_read_in_a_nested_function_is_bound_too() -> None:
    def init(self: Any) -> None:
        self.make = lambda: deque()

    made = construct.constructor(init, {"deque": _Pipeline})
    assert made is not None
    holder = types.SimpleNamespace()
    made(holder)
    assert type(holder.make()) is _Pipeline
