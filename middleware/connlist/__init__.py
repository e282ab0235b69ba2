"""connlist: Node.js-style connection tracking and slow-client timeouts for uvicorn and Starlette."""

from connlist.connections import Connection, ConnectionsList

__version__ = "0.1.0"

__all__ = ["Connection", "ConnectionsList", "__version__"]
