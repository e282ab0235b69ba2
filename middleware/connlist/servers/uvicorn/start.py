"""uvicorn's ``Server`` (``connlist.servers.integration``): the integration turned on at the lifespan startup.

The lifespan's ``receive`` belongs to the ``LifespanOn`` holding uvicorn's ``Config``: at the startup,
uvicorn's own ``http_protocol_class`` gives way to connlist's for the same parser; any other is left
alone.  None of it is public API: the middleware's first request confirms what happened.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from connlist.core.logs import log
from connlist.servers import integration
from connlist.servers.integration import FELL_BACK, OFF, Start, off
from connlist.servers.uvicorn.tested import TESTED_RANGE, TESTED_UVICORN

__all__ = ["advice_without_lifespan", "gunicorn_master", "server_config", "turn_on"]

NOT_UVICORN = (
    "the server is neither uvicorn nor gunicorn's ASGI worker (or does not tell which HTTP protocol it runs)"
)


def server_config(receive: Any, state: object = None) -> Any:
    """The uvicorn ``Config`` of the server whose lifespan is starting, or None.

    An app between the server and the middleware may wrap ``receive`` (FastAPI's telemetry does); then
    the running task is ``LifespanOn.main()``, this lifespan's only if its ``state`` is the scope's.
    """
    owners = [getattr(receive, "__self__", None)]
    if state is not None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
        frame = getattr(None if task is None else task.get_coro(), "cr_frame", None)
        owner = None if frame is None else frame.f_locals.get("self")
        if getattr(owner, "state", None) is state:
            owners.append(owner)
    for owner in owners:
        config = getattr(owner, "config", None)
        if isinstance(getattr(config, "http_protocol_class", None), type):
            return config
    return None


def _status_without_config() -> str | None:
    """The server does not tell its protocol: why the integration is off, or None (a connection tells)."""
    checked = integration.checked()
    if checked is True:
        return None
    if isinstance(checked, str):
        return checked
    return NOT_UVICORN


def gunicorn_master(config: Any) -> int | None:
    """The pid of the gunicorn master whose worker (owner of ``config.callback_notify``) runs it, or None."""
    worker = getattr(getattr(config, "callback_notify", None), "__self__", None)
    base = sys.modules.get("gunicorn.workers.base")
    if base is None or not isinstance(worker, base.Worker):
        return None
    ppid = worker.ppid
    return ppid if isinstance(ppid, int) else None


def turn_on(config: Any, policy: str) -> Start:
    """At the lifespan startup: turn the integration on where the server allows, or say why not."""
    cls = None if config is None else config.http_protocol_class
    mode = getattr(cls, "connlist_mode", None)
    if isinstance(mode, str):
        # Given connlist's class: on whatever the policy.
        log.info(
            "server integration on (uvicorn %s, %s, from the server's protocol setting)",
            _uvicorn_version(),
            mode.partition("-")[2],
        )
        return Start(mode)
    failure = integration.failure(cls)
    if failure is not None:
        return off(policy, failure, FELL_BACK)
    if policy == "off":
        return Start(None, OFF, 'set server_integration="auto" (the default) to let connlist turn it on')
    if cls is None:
        reason = _status_without_config()
        if reason is None:
            return Start(None)  # not known yet: a connection of connlist's protocol tells
        return off(policy, reason, _advice_not_uvicorn())
    assert config is not None
    # Here only: every server's lifespan imports this module, and only uvicorn needs uvicorn.
    from connlist.servers.uvicorn import protocols

    parser = protocols.parser_of(cls)
    if parser is None:
        name = f"{cls.__module__}.{cls.__qualname__}"
        reason = (
            f"the server's HTTP protocol is {name}, neither uvicorn's own httptools or h11 protocol "
            "nor one of connlist.uvicorn's, so connlist leaves it alone"
        )
        return off(policy, reason, _advice_foreign())
    ours, failure = protocols.for_server(parser, required=policy == "required")
    if ours is None:
        assert failure is not None
        return off(policy, failure, FELL_BACK)
    config.http_protocol_class = ours
    log.info("server integration on (uvicorn %s, %s)", _uvicorn_version(), parser)
    return Start(ours.connlist_mode)


def _uvicorn_version() -> str:
    return str(getattr(sys.modules.get("uvicorn"), "__version__", "?"))


def launcher() -> str:
    """What started this process, for advice: "gunicorn", "fastapi" (its CLI) or "uvicorn"."""
    if "gunicorn.arbiter" in sys.modules:
        return "gunicorn"
    if "fastapi_cli" in sys.modules:
        return "fastapi"
    return "uvicorn"


_UVICORN_WORKERS = "-k uvicorn_worker.UvicornWorker (or -k connlist.gunicorn.UvicornWorker)"
_ASGI_WORKER = "gunicorn's own -k asgi (or -k connlist.gunicorn.ASGIWorker)"


def _advice_not_uvicorn() -> str:
    if launcher() == "gunicorn":
        return (
            f"serve with gunicorn {_UVICORN_WORKERS}, which run uvicorn, or with {_ASGI_WORKER}, "
            "in place of this worker class"
        )
    return (
        f"serve the app with uvicorn: `uvicorn app:app`, `fastapi run`, or gunicorn {_UVICORN_WORKERS}; "
        f"or with {_ASGI_WORKER}"
    )


def _advice_foreign() -> str:
    if launcher() == "gunicorn":
        return f"serve with gunicorn {_UVICORN_WORKERS}, or with {_ASGI_WORKER}"
    return (
        "serve with uvicorn's own protocol (--http auto, httptools or h11), or base your protocol "
        "on connlist.uvicorn's HttpToolsProtocol or H11Protocol"
    )


def advice_without_lifespan() -> str:
    """What to do when the first request came before any lifespan startup."""
    where = "add ConnectionsMiddleware to the app the server serves, not to a mounted one"
    launched = launcher()
    if launched == "gunicorn":
        return (
            f"{where}, and serve with gunicorn {_UVICORN_WORKERS}, or with {_ASGI_WORKER}, "
            "which run the lifespan"
        )
    if launched == "fastapi":
        return f"{where} (`app.add_middleware(ConnectionsMiddleware, ...)` on the app `fastapi run` serves)"
    return f"{where}, and keep the lifespan on (uvicorn's --lifespan on or auto, not off)"


def unconfirmed(mode: str) -> tuple[str, str]:
    """Why the first request did not come through the protocol the startup gave (``mode``), what to do."""
    reason = (
        f"uvicorn {_uvicorn_version()} served a request through another protocol than connlist's "
        f"({mode}), which the lifespan startup put in its config"
    )
    advice = (
        f"connlist is tested with uvicorn {TESTED_RANGE}: serve with `--http "
        "connlist.uvicorn:HttpToolsProtocol` (or H11Protocol), pin uvicorn to that range (pip install "
        f"'uvicorn>={TESTED_UVICORN[0]},<={TESTED_UVICORN[1]}'), or upgrade connlist."
    )
    return reason, advice
