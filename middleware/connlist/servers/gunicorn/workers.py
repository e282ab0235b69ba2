"""gunicorn worker classes that run connlist's protocols: gunicorn's own ASGI worker's, or uvicorn's.

::

    gunicorn -k connlist.gunicorn.ASGIWorker -w 4 app:app          # gunicorn's own ASGI worker
    gunicorn -k connlist.gunicorn.UvicornWorker -w 4 app:app
    gunicorn -k connlist.gunicorn.UvicornH11Worker -w 4 app:app   # pure-Python h11 parser

(gunicorn's ``-k`` takes a dotted path: ``module.Class``, not ``module:Class``.)

``gunicorn -k asgi`` itself gets connlist's protocol at the lifespan
startup (``connlist.servers.gunicorn.start``); ``ASGIWorker`` puts it in place
before the worker serves, so that it is there with ``--asgi-lifespan off``
too, and runs gunicorn's default lifespan, ``auto``, ``on``.  ``ASGIProtocol`` is that class: gunicorn's
``gunicorn.asgi.protocol.ASGIProtocol`` feeding the worker's list
(``connlist.servers.gunicorn.protocol``), checked when first looked up; where the check
fails, the name is gunicorn's own class, with one ERROR line
(``CONNLIST_REQUIRE_INTEGRATION=1``: the worker refuses to start instead).

``uvicorn_worker.UvicornWorker`` itself gets the same protection (the
middleware turns the integration on at the lifespan startup), and a bad
connlist setting stops gunicorn at start under either (the middleware fails
the lifespan startup).  These name connlist's protocol outright, and run the
lifespan ``on``: then any exception at the startup stops gunicorn, also one
raised while Starlette builds another middleware, which uvicorn's ``auto``
takes for an app without a lifespan.

They are the ``uvicorn-worker`` package's workers (uvicorn's own
``uvicorn.workers`` is deprecated) with the ``http`` option set to
``connlist.uvicorn:AutoProtocol`` (httptools when installed, else h11) or
``connlist.uvicorn:H11Protocol``.  ``uvicorn_worker.UvicornWorker`` builds
its ``uvicorn.Config`` from gunicorn's settings and then applies the class
attribute ``CONFIG_KWARGS`` over them, so that attribute is the one place to
choose the protocol, and the lifespan.  Everything else
(keep-alive from gunicorn's ``--keep-alive``, ``--forwarded-allow-ips``,
signals) is ``uvicorn-worker``'s.

The same rule as ``connlist.servers.uvicorn.protocols``'s holds when ``uvicorn-worker``
changes: a base class without its ``CONFIG_KWARGS`` dict cannot be told
which protocol to use, so the worker class is then ``uvicorn-worker``'s own
(uvicorn's protocol, ASGI-only mode), with one ERROR line saying so, instead
of an import error that stops gunicorn; ``CONNLIST_REQUIRE_INTEGRATION=1``
makes it the import error again.  A protocol class whose self-check fails is
replaced by uvicorn's in each worker (``connlist.servers.uvicorn.protocols``), and the ERROR
line and the view say so per worker.

Each worker process has its own ``ConnectionsMiddleware``, list and timer;
the debug endpoint's ``pid`` says which worker answered, and
``?workers=all`` shows them all: these classes tell ``connlist.observe.workers``
that the process is a worker of gunicorn's master (``init_process``).
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
        # The lifespan on: see above.
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
    # gunicorn's master imports the worker class once its error log is set up:
    # the line goes there, in gunicorn's format.
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
        # Runs in the worker after the fork, before the app is loaded (and
        # before its lifespan starts the worker's socket for its siblings).
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
            # In the worker, before it serves: the module global its _serve
            # reads for each connection (connlist.servers.gunicorn.start).
            from connlist.servers.gunicorn import start as gunicorn_asgi_start

            setattr(gasgi, gunicorn_asgi_start.NAME, gunicorn_asgi_start.resolve())
            if getattr(self.cfg, "asgi_lifespan", None) == "auto":
                # The lifespan on, as connlist's uvicorn workers run it: a bad
                # setting fails the worker's boot instead of every request.
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
