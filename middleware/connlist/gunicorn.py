"""connlist's gunicorn worker classes and protocol, by their public names.

    gunicorn -k connlist.gunicorn.ASGIWorker -w 4 app:app          # gunicorn's own ASGI worker
    gunicorn -k connlist.gunicorn.UvicornWorker -w 4 app:app
    gunicorn -k connlist.gunicorn.UvicornH11Worker -w 4 app:app   # pure-Python h11 parser

``connlist.servers.gunicorn.workers`` builds them, each when first looked up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connlist.servers.gunicorn import workers as _workers

__all__ = ["ASGIProtocol", "ASGIWorker", "UvicornH11Worker", "UvicornWorker"]

if TYPE_CHECKING:
    from connlist.servers.gunicorn.workers import ASGIProtocol, ASGIWorker, UvicornH11Worker, UvicornWorker
else:

    def __getattr__(name: str) -> Any:
        if name in __all__:
            return getattr(_workers, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
