"""The same scenario on every server connlist integrates with: uvicorn's two parsers and gunicorn's.

A test that takes ``target`` runs once per entry of ``SERVERS``, against
``tests.servers.echo_app`` behind ``ConnectionsMiddleware``: on uvicorn in a
thread of the test's process (``tests.servers.serve``: ``Target.mw`` is the
middleware, for what only the process can see), on gunicorn's own ASGI
worker (``gunicorn -k asgi``, one worker) in a process of its own.  Either
way the client is a raw socket, and what the server did is read from its
debug view (``Target.totals``, ``Target.counts``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import GUNICORN_PARSERS, INTEGRATED, PARSERS, Running, middleware, serve
from tests.subprocesses import get_json, gunicorn_command, run_server, server_env

SERVERS = [
    *(f"uvicorn-{parser}" for parser in PARSERS),
    *(f"gunicorn-{parser}" for parser in GUNICORN_PARSERS),
]
# gunicorn's keep-alive (whole seconds) where a test does not time it: longer than any idle gap here.
KEEP_ALIVE = 5


@dataclass
class Target:
    """A server under test: its name (``SERVERS``), its port, and on uvicorn the middleware and its thread."""

    name: str
    port: int
    mw: Any = None
    running: Running | None = None

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = get_json(self.port, "/_connections")
        assert view["mode"] == self.name, view  # the integration serves it
        return view

    def totals(self) -> dict[str, int]:
        """The worker's totals (its timeouts, by kind), from its debug view."""
        totals: dict[str, int] = self.view()["totals"]
        return totals

    def counts(self) -> dict[str, int]:
        """The worker's list's counts, the view's own connection (active) included."""
        counts: dict[str, int] = self.view()["counts"]
        return counts


@contextlib.contextmanager
def serving(name: str, log: Path, keep_alive: int = KEEP_ALIVE, **options: Any) -> Iterator[Target]:
    """The server ``name`` serving ``echo_app`` behind the middleware with ``options``, for the block."""
    server, _, parser = name.partition("-")
    if server == "uvicorn":
        mw = middleware(**options)
        with serve(mw, INTEGRATED[parser]) as running:
            yield Target(name, running.port, mw, running)
        return
    assert server == "gunicorn", name

    def command(port: int) -> list[str]:
        return gunicorn_command(
            port, "tests.gunicorn_asgi_app:echo", "-k", "asgi", "--http-parser", parser,
            "--keep-alive", str(keep_alive), "--asgi-loop", "asyncio", workers=1,
        )  # fmt: skip

    # (On asyncio's loop, as uvicorn's thread: the send timeout's reset depends on the loop's transports.)
    env = server_env(CONNLIST_OPTIONS=json.dumps({"headers_timeout": 0.5, "request_timeout": 1.0, **options}))
    with run_server(command, log, env=env) as process:
        yield Target(name, process.port)
