"""gunicorn worker classes serving through connlist's protocols: gunicorn's own ASGI worker's, or uvicorn's.

::

    gunicorn -k connlist.gunicorn.ASGIWorker -w 4 app:app
    gunicorn -k connlist.gunicorn.UvicornWorker -w 4 app:app
    gunicorn -k connlist.gunicorn.UvicornH11Worker -w 4 app:app

They run the lifespan ``on``, so an error at the startup stops gunicorn.  The uvicorn ones set
``uvicorn-worker``'s ``CONFIG_KWARGS``; a base without them keeps its own protocol, with one ERROR.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from connlist.core.logs import PREFIX, logger
from connlist.servers import integration, supervisor

try:
    import uvicorn_worker  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the installed extras
    uvicorn_worker = None
try:
    from gunicorn.workers import gasgi  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - a gunicorn without its ASGI worker (before 24.0), or none
    gasgi = None

__all__ = ["ASGIProtocol", "ASGIWorker", "UvicornH11Worker", "UvicornWorker"]

AUTO_PROTOCOL = "connlist.servers.uvicorn.protocols:AutoProtocol"
H11_PROTOCOL = "connlist.servers.uvicorn.protocols:H11Protocol"


def _base_kwargs(cls: Any, http: str) -> dict[str, Any] | None:
    """The base class's CONFIG_KWARGS with connlist's protocol; None (and the ERROR line) without them."""
    kwargs = getattr(cls, "CONFIG_KWARGS", None)
    if isinstance(kwargs, dict):
        return {**kwargs, "http": http, "lifespan": "on"}
    version = getattr(uvicorn_worker, "__version__", "?")
    message = (
        f"{PREFIX}the server integration is off: connlist cannot configure uvicorn-worker {version}: "
        f"{cls.__qualname__} has no CONFIG_KWARGS dict (connlist is tested with uvicorn-worker 0.4). The "
        f"workers run uvicorn-worker's own protocol and connlist runs in {integration.asgi_only()}. "
        "Pin uvicorn-worker to 0.4, or upgrade connlist."
    )
    if integration.require_integration():
        raise ImportError(f"{message} {integration.REQUIRE_ENV}=1: refusing to start.")
    # gunicorn's master imports the worker class once its error log is set up.
    gunicorn_log = logging.getLogger("gunicorn.error")
    target = gunicorn_log if gunicorn_log.handlers else logger
    target.error("%s Set %s=1 to refuse to start instead.", message, integration.REQUIRE_ENV)
    return None


def _worker(name: str, base: Any, http: str, doc: str) -> Any:
    """``base`` with ``_Sibling``, and ``CONFIG_KWARGS`` choosing connlist's protocol if the base has them."""
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": name, "__doc__": doc}
    kwargs = _base_kwargs(base, http)
    if kwargs is not None:
        namespace["CONFIG_KWARGS"] = kwargs
    return type(name, (_Sibling, base), namespace)


class _Sibling:
    """Tells connlist, in the worker, that it is one of the master's workers (for ``workers=all``)."""

    ppid: int

    def init_process(self) -> None:
        # Before the app's lifespan starts the worker's socket for its siblings.
        supervisor.supervised_by(self.ppid)
        super().init_process()  # type: ignore[misc]


if uvicorn_worker is not None:  # pragma: no branch - without uvicorn-worker: see __getattr__
    UvicornWorker = _worker(
        "UvicornWorker",
        uvicorn_worker.UvicornWorker,
        AUTO_PROTOCOL,
        "``uvicorn_worker.UvicornWorker`` serving through ``connlist.uvicorn:AutoProtocol``.",
    )
    UvicornH11Worker = _worker(
        "UvicornH11Worker",
        uvicorn_worker.UvicornH11Worker,
        H11_PROTOCOL,
        "``uvicorn_worker.UvicornH11Worker`` (asyncio, h11) serving through "
        "``connlist.uvicorn:H11Protocol``.",
    )

if gasgi is not None:  # pragma: no branch - a gunicorn without its ASGI worker: see __getattr__

    class ASGIWorker(_Sibling, gasgi.ASGIWorker):  # type: ignore[misc]
        """``gunicorn -k asgi``'s worker, with ``connlist.gunicorn.ASGIProtocol`` from its start."""

        def init_process(self) -> None:
            # Before it serves, so that ``--asgi-lifespan off`` gets connlist's protocol too.
            from connlist.servers.gunicorn import start as gunicorn_asgi_start

            setattr(gasgi, gunicorn_asgi_start.NAME, gunicorn_asgi_start.resolve())
            if getattr(self.cfg, "asgi_lifespan", None) == "auto":
                # A bad setting fails the worker's boot, not every request.
                self.cfg.set("asgi_lifespan", "on")
            super().init_process()


if TYPE_CHECKING:
    ASGIProtocol: type[Any]
else:

    def __getattr__(name: str) -> Any:
        """``ASGIProtocol``: checked when first looked up; a worker whose package is missing: why."""
        if name == "ASGIProtocol":
            from connlist.servers.gunicorn import start as gunicorn_asgi_start

            return gunicorn_asgi_start.resolve()
        if name in ("UvicornWorker", "UvicornH11Worker"):
            raise ImportError(
                f"connlist.gunicorn.{name} needs gunicorn and uvicorn-worker: "
                "pip install 'connlist[gunicorn]'"
            )
        if name == "ASGIWorker":
            raise ImportError("connlist.gunicorn.ASGIWorker needs gunicorn 24 or newer (its ASGI worker)")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
