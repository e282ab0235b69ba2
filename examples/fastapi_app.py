"""The example as a FastAPI app: connlist's middleware, and Prometheus metrics when installed.

Serve it as usual: the middleware turns the server integration (which the
headers timeout needs) on at the lifespan startup, no flag needed::

    pip install -e '.[httptools,prometheus]' fastapi   # from a clone of connlist
    fastapi run examples/fastapi_app.py
    # or: uvicorn examples.fastapi_app:app
    # several workers: gunicorn -c examples/gunicorn.conf.py examples.fastapi_app:app

``GET /``, ``POST /echo``, ``GET /_connections`` (debug endpoint, from
127.0.0.1) and ``GET /metrics`` (Prometheus; with ``PROMETHEUS_MULTIPROC_DIR``
set, the sum over all worker processes).  Settings from the environment:
``CONNLIST_HEADERS_TIMEOUT`` (default 10 s), ``CONNLIST_REQUEST_TIMEOUT``
(30 s), ``CONNLIST_METRICS_INTERVAL`` (1 s).
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request

from connlist import ConnectionsMiddleware

app = FastAPI(title="connlist example")


@app.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "from connlist"}


@app.post("/echo")
async def echo(request: Request) -> dict[str, int]:
    body = await request.body()
    return {"received": len(body)}


try:
    from connlist.prometheus import MetricsMiddleware
except ImportError:  # prometheus_client is not installed: no /metrics
    pass
else:
    app.add_middleware(
        MetricsMiddleware,
        path="/metrics",
        interval=float(os.environ.get("CONNLIST_METRICS_INTERVAL", "1")),
    )

# Added last, so outermost: the debug endpoint answers before anything else runs.
app.add_middleware(
    ConnectionsMiddleware,
    headers_timeout=float(os.environ.get("CONNLIST_HEADERS_TIMEOUT", "10")),
    request_timeout=float(os.environ.get("CONNLIST_REQUEST_TIMEOUT", "30")),
    debug_path="/_connections",
)
