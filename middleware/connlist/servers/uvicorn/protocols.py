"""uvicorn protocols that feed the worker's ConnectionsList, as Node.js's HTTP server does.

They subclass uvicorn's and observe it: connlist reads uvicorn's state after each ``data_received``,
and overrides one parser callback, httptools' ``on_headers_complete``, to note a request running
ahead of queued ones.  This module decides which class each name and server gets, once per parser
and process (``Outcome``): connlist's, built on uvicorn's and checked in memory
(``connlist.servers.uvicorn.selfcheck``), or uvicorn's own and one ERROR line (ASGI-only mode).
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn

from connlist.core.logs import follow_uvicorn_logger, log, logger, route_to_server
from connlist.core.version import __version__
from connlist.servers import integration
from connlist.servers.uvicorn import selfcheck as uvicorn_selfcheck
from connlist.servers.uvicorn.classes import HOOKS, PARSERS
from connlist.servers.uvicorn.tested import TESTED_RANGE, TESTED_UVICORN

try:
    from uvicorn.protocols.http import httptools_impl
except ImportError:  # httptools is not installed
    httptools_impl = None  # type: ignore[assignment]

__all__ = [
    "TESTED_RANGE",
    "TESTED_UVICORN",
    "AutoProtocol",
    "H11Protocol",
    "HttpToolsProtocol",
    "Outcome",
    "for_server",
    "outcome",
    "parser_of",
]


@dataclass
class Outcome:
    """One parser's build and check, once per process: the one record of the decision."""

    cls: type[Any] | None  # connlist's, if it passed
    base: type | None  # uvicorn's, if found
    result: uvicorn_selfcheck.Result
    flag: type[Any] | None = None  # what a ``--http connlist.uvicorn:...`` flag gets, once asked


_outcomes: dict[str, Outcome] = {}
_lock = threading.RLock()


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: "0.55.0rc1" -> (0, 55, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def parser_of(cls: type) -> str | None:
    """Which parser ``cls`` is uvicorn's own protocol for ("httptools", "h11"), or None."""
    for parser, where in PARSERS.items():
        module = sys.modules.get(where.module)
        if module is not None and getattr(module, where.uvicorn_name, None) is cls:
            return parser
    return None


def _build(parser: str) -> Outcome:
    """connlist's class for ``parser`` built on uvicorn's and checked."""
    where = PARSERS[parser]
    base: type | None = None
    cls: type[Any] | None = None
    try:
        module = importlib.import_module(where.module)
        base = getattr(module, where.uvicorn_name, None)
        if not isinstance(base, type):
            raise uvicorn_selfcheck.CheckFailed(f"{where.module} has no class {where.uvicorn_name}")
        uvicorn_selfcheck.check_static(base, HOOKS, parser)
        try:
            cls = where.build(base)
        except TypeError as exc:
            raise uvicorn_selfcheck.CheckFailed(
                f"connlist's class cannot be built on uvicorn's {where.uvicorn_name}: {exc}"
            ) from None
        # Where its name gives it: its repr says so, and pickle finds it there.
        cls.__module__ = __name__
    except uvicorn_selfcheck.CheckFailed as failed:
        result = uvicorn_selfcheck.Result(str(failed))
    except ImportError as exc:
        result = uvicorn_selfcheck.Result(f"uvicorn has no {where.module} ({exc})")
    else:
        result = uvicorn_selfcheck.run_in_thread(cls, base, parser)
    if result.logger_name:
        # connlist's lines go wherever uvicorn's protocols write theirs.
        follow_uvicorn_logger(result.logger_name)
    if not result.passed:
        return Outcome(None, base, result)
    assert cls is not None
    first = not any(done.cls is not None for done in _outcomes.values())
    integration.record_pass(cls)
    if first:
        _warn_if_newer()
    _warn_keepalive(cls, parser)
    return Outcome(cls, base, result)


def outcome(parser: str) -> Outcome:
    """``parser``'s build and check, made once per process (the flag and the automatic path share it)."""
    with _lock:
        done = _outcomes.get(parser)
        if done is None:
            done = _outcomes[parser] = _build(parser)
        return done


def _integrate(parser: str) -> type[Any]:
    """The class a ``--http connlist.uvicorn:...`` flag names: connlist's, or uvicorn's in its place."""
    integration.require_integration()  # a bad value stops the start here, naming the variable
    with _lock:
        done = outcome(parser)
        if done.flag is None:
            done.flag = done.cls or _fall_back(parser, done.base, done.result.failure or "")
        return done.flag


def for_server(parser: str, *, required: bool) -> tuple[type[Any] | None, str | None]:
    """The automatic path: connlist's class for the server's own ``parser`` protocol, or why not.

    On a failed check the ERROR line is logged unless ``required``: the refusal to start says it then.
    """
    done = outcome(parser)
    if done.cls is not None:
        return done.cls, None
    failure = done.result.failure or ""
    reason = _reason(parser, failure)
    if done.base is not None:
        integration.record_failure(done.base, reason)
    if required:
        what, advice = _failure_text(parser, failure)
        return None, f"{what}. {advice}"
    _say_off(
        parser,
        failure,
        "keeps",
        f'Set server_integration="required" (or {integration.REQUIRE_ENV}=1) to refuse to start instead.',
    )
    return None, reason


def _warn_if_newer() -> None:
    """One WARNING, at the first check that passes, where uvicorn is newer than the newest tested."""
    if _version(uvicorn.__version__) <= _version(TESTED_UVICORN[1]):
        return
    route_to_server()
    logger.warning(
        "connlist %s is tested with uvicorn %s; this is %s; the self-check passed",
        __version__,
        TESTED_RANGE,
        uvicorn.__version__,
    )


def _warn_keepalive(cls: type[Any], parser: str) -> None:
    """One WARNING where the self-check found uvicorn arms its keep-alive otherwise, so keeps its timer."""
    if getattr(cls, "connlist_keepalive", False):
        return
    route_to_server()
    logger.warning(
        "uvicorn %s's %s: %s, so uvicorn times its keep-alive itself "
        "(a timer per response, as without connlist); connlist's other protections are on. "
        "connlist %s is tested with uvicorn %s",
        uvicorn.__version__,
        PARSERS[parser].name,
        getattr(cls, "connlist_keepalive_not", ""),
        __version__,
        TESTED_RANGE,
    )


def _failure_text(parser: str, failure: str) -> tuple[str, str]:
    """What failed, and what to do: the ERROR line's and the refusal's words."""
    what = (
        f"connlist {__version__} does not work with uvicorn {uvicorn.__version__} "
        f"({PARSERS[parser].name}: {failure})"
    )
    advice = (
        f"connlist is tested with uvicorn {TESTED_RANGE}: pin uvicorn to that range (pip install "
        f"'uvicorn>={TESTED_UVICORN[0]},<={TESTED_UVICORN[1]}'), or upgrade connlist."
    )
    return what, advice


def _fall_back(parser: str, base: type | None, failure: str) -> type[Any]:
    """uvicorn's own class instead of connlist's, and the one ERROR line (or the refusal to start)."""
    if integration.require_integration():
        route_to_server()
        integration.refuse_to_start(*_failure_text(parser, failure))
    if base is None:
        # uvicorn moved its protocol: its own name for it is the stand-in.
        from uvicorn.config import HTTP_PROTOCOLS
        from uvicorn.importer import import_from_string

        base = import_from_string(HTTP_PROTOCOLS[parser])
    assert base is not None
    integration.record_failure(base, _reason(parser, failure))
    _say_off(parser, failure, "runs", f"Set {integration.REQUIRE_ENV}=1 to refuse to start instead.")
    return base


def _reason(parser: str, failure: str) -> str:
    """Why the integration is off after a failed check, as the view and the page show it."""
    return f"uvicorn {uvicorn.__version__}: {PARSERS[parser].name}: {failure}"


def _say_off(parser: str, failure: str, verb: str, refuse: str) -> None:
    """The one ERROR line of a failed check: what failed, what is lost, what to do, how to stop instead."""
    what, advice = _failure_text(parser, failure)
    route_to_server()
    log.error(
        "the server integration is off: %s. The server %s uvicorn's own %s protocol and connlist runs in "
        "%s. %s %s",
        what,
        verb,
        parser,
        integration.asgi_only(),
        advice,
        refuse,
    )


def _needs_httptools(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - httptools missing
    raise RuntimeError(
        "connlist.uvicorn:HttpToolsProtocol needs httptools: pip install 'connlist[httptools]', "
        "or use connlist.uvicorn:H11Protocol"
    )


if TYPE_CHECKING:
    # What the names give when the check passes: the parser's mixin, which mypy checks on uvicorn's class.
    from connlist.servers.uvicorn.h11_impl import H11Tracking as H11Protocol
    from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking as HttpToolsProtocol

    AutoProtocol: type[Any]
else:

    def __getattr__(name: str) -> Any:
        """``HttpToolsProtocol``, ``H11Protocol``, ``AutoProtocol``: checked when first looked up."""
        if name == "HttpToolsProtocol":
            return _needs_httptools if httptools_impl is None else _integrate("httptools")
        if name == "H11Protocol":
            return _integrate("h11")
        if name == "AutoProtocol":
            # As uvicorn's ``--http auto``.
            return _integrate("h11" if httptools_impl is None else "httptools")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
