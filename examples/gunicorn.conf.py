"""gunicorn settings for the examples, with connlist's worker class.

gunicorn's usual ``uvicorn_worker.UvicornWorker`` protects the same (the
middleware turns the server integration on in each worker); connlist's
class also runs the ASGI lifespan ``on``, so that a bad setting makes the
worker fail to boot instead of failing every request.

    gunicorn -c examples/gunicorn.conf.py examples.app:app
    gunicorn -c examples/gunicorn.conf.py examples.fastapi_app:app

Command-line options override these (``--bind``, ``-w``).  Each worker is a
uvicorn server with its own connections list, timer and debug endpoint; the
``pid`` in ``GET /_connections`` says which worker answered, and
``GET /_connections?workers=all`` shows every worker (each worker finds it
is one of this master's, under either worker class; no hook is needed).  The timeouts
are the app's (``ConnectionsMiddleware``), not gunicorn's.

For Prometheus with several workers (``examples/fastapi_app.py`` serves
``/metrics``), set ``PROMETHEUS_MULTIPROC_DIR`` to a directory: it is emptied
when gunicorn starts, and a dead worker's gauges are dropped (``child_exit``).
"""

from __future__ import annotations

import glob
import os
from typing import Any

# uvicorn with connlist's protocol (httptools when installed, else h11), lifespan
# "on": connlist.gunicorn.UvicornH11Worker forces h11; "uvicorn_worker.UvicornWorker"
# works too.  gunicorn wants a dotted path here, not uvicorn's "module:attribute".
worker_class = "connlist.gunicorn.UvicornWorker"

# Loopback only: put nginx (or another proxy) in front to serve the world.
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")

# One connlist list per worker process; twice the cores is a common start for async workers.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))

# Seconds an idle keep-alive connection stays open (uvicorn's timeout_keep_alive).
# Behind nginx, keep it above nginx's upstream keepalive_timeout.
keepalive = 5

# A worker that misses its heartbeat for this long is restarted; shutdown waits at most graceful_timeout.
timeout = 30
graceful_timeout = 10

# Trust X-Forwarded-For/-Proto only from this proxy address (uvicorn's --forwarded-allow-ips).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server: Any) -> None:
    """Start the Prometheus multiprocess directory empty: stale files would add old workers' values."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in glob.glob(os.path.join(path, "*.db")):
            os.remove(name)


def child_exit(server: Any, worker: Any) -> None:
    """A worker died: its connections must leave the "livesum" gauges (its counters stay counted)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
