"""connlist: Node.js-style connection tracking and slow-client timeouts for uvicorn and Starlette.

- ``ConnectionsList`` (``connlist.connections``): the per-worker intrusive list.
- ``ConnectionsMiddleware`` (``connlist.middleware``): owns the list, enforces
  the timeouts, serves the debug endpoint.
- ``connlist.uvicorn``: the uvicorn protocols that feed the list; the
  middleware puts them in uvicorn's place at the lifespan startup
  (``connlist.uvicorn_start``), or ``--http connlist.uvicorn:HttpToolsProtocol``
  names them outright.
"""

from connlist.connections import Connection, ConnectionsList
from connlist.middleware import ConnectionsMiddleware

__version__ = "0.1.0"

__all__ = ["Connection", "ConnectionsList", "ConnectionsMiddleware", "__version__"]
