"""The servers connlist integrates with, in the order asked, and the one whose lifespan is starting."""

from __future__ import annotations

import importlib
from typing import Any, cast

from connlist.servers.integration import Server

__all__ = ["SERVERS", "find", "servers"]

# Each a ``Server``, named by string so that a worker imports only its own; the first is the default.
SERVERS = ["connlist.servers.uvicorn.start", "connlist.servers.gunicorn.start"]


def servers() -> list[Server]:
    """The modules of ``SERVERS``, imported."""
    return [cast("Server", importlib.import_module(name)) for name in SERVERS]


def find(receive: Any, state: object = None) -> tuple[Server, Any]:
    """The integration whose server's lifespan is starting, and its config; else the default, and None."""
    found = servers()
    for server in found:
        config = server.server_config(receive, state)
        if config is not None:
            return server, config
    return found[0], None
