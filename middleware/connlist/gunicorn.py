"""gunicorn worker classes that run uvicorn with connlist's protocols.

::

    gunicorn -k connlist.gunicorn.UvicornWorker -w 4 app:app
    gunicorn -k connlist.gunicorn.UvicornH11Worker -w 4 app:app   # pure-Python h11 parser

(gunicorn's ``-k`` takes a dotted path: ``module.Class``, not ``module:Class``.)

They are the ``uvicorn-worker`` package's workers (uvicorn's own
``uvicorn.workers`` is deprecated) with the ``http`` option set to
``connlist.uvicorn:AutoProtocol`` (httptools when installed, else h11) or
``connlist.uvicorn:H11Protocol``.  ``uvicorn_worker.UvicornWorker`` builds
its ``uvicorn.Config`` from gunicorn's settings and then applies the class
attribute ``CONFIG_KWARGS`` over them, so that attribute is the one place to
choose the protocol, and the lifespan: ``on``, not uvicorn's ``auto``, which
takes any exception raised while Starlette builds its middleware (a bad
connlist option among them) for an app without a lifespan and serves on,
with a 500 for every request.  With ``on`` the worker fails to boot, with the
option named in its log, and gunicorn's master stops.  Everything else
(keep-alive from gunicorn's ``--keep-alive``, ``--forwarded-allow-ips``,
signals) is ``uvicorn-worker``'s.

Each worker process has its own ``ConnectionsMiddleware``, list and timer;
the debug endpoint's ``pid`` says which worker answered, and
``?workers=all`` shows them all: these classes tell ``connlist.workers``
that the process is a worker of gunicorn's master (``init_process``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from connlist import workers

try:
    import uvicorn_worker  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "connlist.gunicorn needs gunicorn and uvicorn-worker: pip install 'connlist[gunicorn]'"
    ) from exc

__all__ = ["UvicornH11Worker", "UvicornWorker"]

AUTO_PROTOCOL = "connlist.uvicorn:AutoProtocol"
H11_PROTOCOL = "connlist.uvicorn:H11Protocol"


def _base_kwargs(cls: Any) -> dict[str, Any]:
    """The base class's CONFIG_KWARGS; fail at import, loudly, if uvicorn-worker dropped them."""
    kwargs = getattr(cls, "CONFIG_KWARGS", None)
    if not isinstance(kwargs, dict):
        raise ImportError(
            f"connlist cannot configure uvicorn-worker {getattr(uvicorn_worker, '__version__', '?')}: "
            f"{cls.__qualname__} has no CONFIG_KWARGS dict; connlist is tested with uvicorn-worker 0.4"
        )
    return dict(kwargs)


class _Sibling:
    """Tells connlist, in the worker, that it is one of the master's workers (for ``workers=all``)."""

    ppid: int

    def init_process(self) -> None:
        # Runs in the worker after the fork, before the app is loaded (and
        # before its lifespan starts the worker's socket for its siblings).
        workers.supervised_by(self.ppid)
        super().init_process()  # type: ignore[misc]


class UvicornWorker(_Sibling, uvicorn_worker.UvicornWorker):  # type: ignore[misc]
    """``uvicorn_worker.UvicornWorker`` serving through ``connlist.uvicorn:AutoProtocol``."""

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        **_base_kwargs(uvicorn_worker.UvicornWorker),
        "http": AUTO_PROTOCOL,
        "lifespan": "on",
    }


class UvicornH11Worker(_Sibling, uvicorn_worker.UvicornH11Worker):  # type: ignore[misc]
    """``uvicorn_worker.UvicornH11Worker`` (asyncio, h11) serving through ``connlist.uvicorn:H11Protocol``."""

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        **_base_kwargs(uvicorn_worker.UvicornH11Worker),
        "http": H11_PROTOCOL,
        "lifespan": "on",
    }
