"""gunicorn's ASGI worker at the lifespan startup: connlist's class put in place, found there, or off and why.

gunicorn reads ``gunicorn.workers.gasgi.ASGIProtocol`` per connection accepted, so ``turn_on`` puts
connlist's class there once it passed ``selfcheck``; any other class is left alone.  All of it is
gunicorn's private state, read defensively: where it is not as expected, connlist is ASGI-only.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Any

from connlist.core.logs import follow_uvicorn_logger, log, route_to_server
from connlist.core.version import __version__
from connlist.servers import integration
from connlist.servers.integration import FELL_BACK, OFF, Start, off

__all__ = [
    "TESTED_GUNICORN",
    "advice_without_lifespan",
    "for_server",
    "gunicorn_master",
    "resolve",
    "server_config",
    "turn_on",
    "unconfirmed",
]

TESTED_GUNICORN = "27.0.1"
PROTOCOL_MODULE = "gunicorn.asgi.protocol"
WORKER_MODULE = "gunicorn.workers.gasgi"
NAME = "ASGIProtocol"
KEY = "gunicorn"  # of ``integration.check_once``


def _gunicorn_version() -> str:
    return str(getattr(sys.modules.get("gunicorn"), "__version__", "?"))


def parser_name(cfg: Any) -> str:
    """The HTTP/1 parser gunicorn should take for ``cfg``: "python" or "fast" (gunicorn_h1c)."""
    setting = getattr(cfg, "http_parser", "auto")
    if setting in ("python", "fast"):
        return str(setting)
    try:
        base = importlib.import_module(PROTOCOL_MODULE).ASGIProtocol
        available = base._check_h1c_protocol_available() and base._h1c_has_limits
    except Exception:
        return "python"
    flags = [getattr(cfg, flag, False) for flag in getattr(base, "_FAST_PARSER_INCOMPATIBLE_FLAGS", ())]
    if available and not any(flags) and getattr(cfg, "proxy_protocol", "off") == "off":
        return "fast"
    return "python"


def _build() -> integration.Checked:
    from connlist.servers.gunicorn import selfcheck as gunicorn_asgi_check
    from connlist.servers.selfcheck import CheckFailed, Result

    base: type | None = None
    try:
        module = importlib.import_module(PROTOCOL_MODULE)
        base = getattr(module, NAME, None)
        if not isinstance(base, type):
            raise CheckFailed(f"{PROTOCOL_MODULE} has no class {NAME}")
        gunicorn_asgi_check.check_static(base, gunicorn_asgi_check.HOOKS)
        try:
            from connlist.servers.gunicorn import protocol as gunicorn_asgi

            cls = gunicorn_asgi.prepare(base)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CheckFailed(f"connlist's class cannot be built on gunicorn's {NAME}: {exc}") from None
    except CheckFailed as failed:
        return integration.Checked(None, base, Result(str(failed)))
    except ImportError as exc:
        return integration.Checked(None, base, Result(f"gunicorn has no {PROTOCOL_MODULE} ({exc})"))
    result = gunicorn_asgi_check.run_in_thread(cls, "python")
    if result.passed and parser_name(_FastConfig()) == "fast":
        result = gunicorn_asgi_check.run_in_thread(cls, "fast")
    return integration.Checked(cls if result.passed else None, base, result)


class _FastConfig:
    """A config that asks for the fast parser where it is installed."""

    http_parser = "auto"


def checked() -> integration.Checked:
    """``_build``'s outcome, once per process: the worker class and the lifespan share it."""
    return integration.check_once(KEY, _build)


def _failure_text(failure: str) -> tuple[str, str]:
    what = f"connlist {__version__} does not work with gunicorn {_gunicorn_version()} ({NAME}: {failure})"
    advice = (
        f"connlist is tested with gunicorn {TESTED_GUNICORN}: pin gunicorn to it (pip install "
        f"'gunicorn=={TESTED_GUNICORN}'), or upgrade connlist."
    )
    return what, advice


def _reason(failure: str) -> str:
    return f"gunicorn {_gunicorn_version()}: {NAME}: {failure}"


def _say_off(failure: str, refuse: str) -> None:
    what, advice = _failure_text(failure)
    _route()
    log.error(
        "the server integration is off: %s. gunicorn's ASGI worker keeps its own protocol and connlist runs "
        "in %s. %s %s",
        what,
        integration.asgi_only(),
        advice,
        refuse,
    )


def for_server(*, required: bool) -> tuple[type[Any] | None, str | None]:
    """connlist's class for gunicorn's worker, or why not (the ERROR line logged unless ``required``)."""
    cls, base, result = checked()
    if cls is not None:
        return cls, None
    failure = result.failure or ""
    if base is not None:
        integration.record_failure(base, _reason(failure))
    if required:
        what, advice = _failure_text(failure)
        return None, f"{what}. {advice}"
    _say_off(
        failure,
        f'Set server_integration="required" (or {integration.REQUIRE_ENV}=1) to refuse to start instead.',
    )
    return None, _reason(failure)


def resolve() -> type[Any]:
    """The class ``connlist.gunicorn.ASGIProtocol`` names: connlist's, or gunicorn's in its place."""
    integration.require_integration()  # a bad value stops the start here
    cls, base, result = checked()
    if cls is not None:
        return cls
    failure = result.failure or ""
    if integration.require_integration():
        _route()
        integration.refuse_to_start(*_failure_text(failure))
    if base is None:
        raise ImportError(f"gunicorn has no {PROTOCOL_MODULE}.{NAME}: {failure}")
    integration.record_failure(base, _reason(failure))
    _say_off(failure, f"Set {integration.REQUIRE_ENV}=1 to refuse to start instead.")
    return base


def _route() -> None:
    """connlist's lines go to gunicorn's error log."""
    follow_uvicorn_logger("gunicorn.error")
    route_to_server()


def server_config(receive: Any, state: object = None) -> Any:
    """The gunicorn ASGI worker whose lifespan is starting (its ``_serve`` task's ``self``), or None.

    ``state`` is the scope's where an app wrapped ``receive``, else its owner's (``LifespanManager``).
    """
    gasgi = sys.modules.get(WORKER_MODULE)
    if gasgi is None:
        return None
    owner = getattr(receive, "__self__", None)
    owner_state = getattr(owner, "state", None)
    if state is None:
        state = owner_state
    if state is None:
        return None
    worker_class = getattr(gasgi, "ASGIWorker", None)
    if not isinstance(worker_class, type):
        return None
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop
        return None
    for task in tasks:
        frame = getattr(task.get_coro(), "cr_frame", None)
        worker = None if frame is None else frame.f_locals.get("self")
        if isinstance(worker, worker_class) and getattr(worker, "state", None) is state:
            return worker
    return None


def gunicorn_master(config: Any) -> int | None:
    """The pid of the gunicorn master whose ASGI worker ``config`` is."""
    ppid = getattr(config, "ppid", None)
    return ppid if isinstance(ppid, int) else None


def turn_on(config: Any, policy: str) -> Start:
    """At the lifespan startup: put connlist's class in gunicorn's worker where allowed, or say why not."""
    _route()
    gasgi = sys.modules.get(WORKER_MODULE)
    current = getattr(gasgi, NAME, None)
    cfg = getattr(config, "cfg", None)
    parser = parser_name(cfg)
    mode = getattr(current, "connlist_mode", None)
    if isinstance(mode, str):
        log.info(
            "server integration on (gunicorn %s, asgi worker, %s parser, from the worker class)",
            _gunicorn_version(),
            parser,
        )
        _warn_untimed(cfg)
        return Start(f"gunicorn-{parser}")
    failure = integration.failure(current if isinstance(current, type) else None)
    if failure is not None:
        return off(policy, failure, FELL_BACK)
    if policy == "off":
        return Start(None, OFF, 'set server_integration="auto" (the default) to let connlist turn it on')
    own = getattr(sys.modules.get(PROTOCOL_MODULE), NAME, None)
    if current is None or current is not own:
        name = f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', current)}"
        reason = (
            f"gunicorn's ASGI worker serves with {name}, neither gunicorn's own ASGIProtocol nor "
            "connlist's, so connlist leaves it alone"
        )
        return off(policy, reason, "serve with gunicorn -k asgi and gunicorn's own protocol")
    ours, failure = for_server(required=policy == "required")
    if ours is None:
        assert failure is not None
        return off(policy, failure, FELL_BACK)
    setattr(gasgi, NAME, ours)
    log.info("server integration on (gunicorn %s, asgi worker, %s parser)", _gunicorn_version(), parser)
    _warn_untimed(cfg)
    return Start(f"gunicorn-{parser}")


def _warn_untimed(cfg: Any) -> None:
    """One WARNING where gunicorn serves HTTP/2 or uWSGI too, which connlist does not time."""
    others = []
    if "h2" in (getattr(cfg, "http_protocols", None) or ()):
        others.append("HTTP/2")
    if getattr(cfg, "protocol", "http") == "uwsgi":
        others.append("uWSGI")
    if others:
        log.warning(
            "gunicorn serves %s connections too: connlist counts them in the list and the connection budget "
            "(which never lets them go) and applies the send timeout, but the headers, request, body-rate "
            "and keep-alive timeouts are HTTP/1's; gunicorn's own limits apply to them",
            " and ".join(others),
        )


def advice_without_lifespan() -> str:
    """What to do when the first request came before any lifespan startup."""
    return (
        "add ConnectionsMiddleware to the app the server serves, not to a mounted one, and keep gunicorn's "
        "--asgi-lifespan auto or on (or serve with -k connlist.gunicorn.ASGIWorker)"
    )


def unconfirmed(mode: str) -> tuple[str, str]:
    """Why the first request did not come through the class the startup gave (``mode``), what to do."""
    reason = (
        f"gunicorn {_gunicorn_version()} served a request through another protocol than connlist's ({mode}), "
        f"which the lifespan startup put in {WORKER_MODULE}.{NAME}"
    )
    advice = (
        f"connlist is tested with gunicorn {TESTED_GUNICORN}: serve with -k connlist.gunicorn.ASGIWorker, "
        f"pin gunicorn to {TESTED_GUNICORN}, or upgrade connlist."
    )
    return reason, advice
