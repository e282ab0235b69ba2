"""connlist: Node.js-style connection tracking and slow-client timeouts for uvicorn and Starlette.

The package has four parts, each a subpackage, and each imports only the
parts below it:

- ``core``: Node's list and its policy (records, queues, kinds, budget,
  sweep, enforcer, views, logs);
- ``servers``: the servers that feed the list, one subpackage each
  (``servers.uvicorn``, ``servers.gunicorn``), beside the neutral seam;
- ``observe``: what observes the list (the debug endpoint, its page, the
  workers' view, Prometheus, OpenTelemetry);
- ``asgi``: ``ConnectionsMiddleware``, which owns the list, and ASGI-only mode.

The public names sit above them: ``connlist.ConnectionsMiddleware``,
``connlist.uvicorn`` (``--http connlist.uvicorn:HttpToolsProtocol``),
``connlist.gunicorn`` (``-k connlist.gunicorn.ASGIWorker``),
``connlist.prometheus`` and ``connlist.otel``.
"""

from connlist.asgi.middleware import ConnectionsMiddleware
from connlist.core.connections import ConnectionsList
from connlist.core.records import Connection
from connlist.core.version import __version__

__all__ = ["Connection", "ConnectionsList", "ConnectionsMiddleware", "__version__"]
