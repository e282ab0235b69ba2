"""The app the other ASGI servers serve in tests/test_other_servers.py: echo_app under the middleware alone.

ASGI-only mode (no server integration), request timeout from
``CONNLIST_REQUEST_TIMEOUT`` (default 1 s).
"""

from __future__ import annotations

import os

from connlist import ConnectionsMiddleware
from tests.servers import echo_app

REQUEST_TIMEOUT = float(os.environ.get("CONNLIST_REQUEST_TIMEOUT", "1"))

app = ConnectionsMiddleware(
    echo_app, headers_timeout=min(0.5, REQUEST_TIMEOUT), request_timeout=REQUEST_TIMEOUT
)
