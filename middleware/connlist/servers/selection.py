"""The servers connlist integrates with, in the order they are asked, and the one whose lifespan is starting.

Each is the start-up side of a server, a module that implements
``connlist.servers.integration.Server``.  They are named by string and
imported when the middleware's lifespan starts, so that a worker imports
only what its server needs.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from connlist.servers.integration import Server

__all__ = ["SERVERS", "find", "servers"]

# The modules of connlist's server integrations' start-up side (each a ``Server``),
# asked in this order; the first is the default, whose advice a server that tells nothing gets.
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
