"""The server integration at the server's start, for any server: the policy, and what the server says.

``server_integration`` decides, unless ``CONNLIST_REQUIRE_INTEGRATION`` overrides it; the self-checks'
outcomes are recorded here, for a server that does not tell its protocol.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, Protocol

from connlist.core.kinds import TIMEOUT_KINDS
from connlist.core.logs import log
from connlist.servers.selfcheck import Result

__all__ = [
    "FELL_BACK",
    "NO_LIFESPAN",
    "OFF",
    "POLICIES",
    "REFUSAL_STATUS",
    "REQUIRE_ENV",
    "Checked",
    "Server",
    "Start",
    "asgi_only",
    "asgi_only_kept",
    "asgi_only_lost",
    "check_once",
    "check_policy",
    "checked",
    "effective_policy",
    "failure",
    "off",
    "record_failure",
    "record_pass",
    "refuse_to_start",
    "require_integration",
]

REQUIRE_ENV = "CONNLIST_REQUIRE_INTEGRATION"
POLICIES = ("auto", "required", "off")

# What failed, by the class the server was given instead (its own).
_failures: dict[type, str] = {}
_passed: set[type] = set()
_checked: dict[str, Checked] = {}
_lock = threading.RLock()


class Checked(NamedTuple):
    """A server's build and check of connlist's class: the class if it passed, the server's, the result."""

    cls: type[Any] | None
    base: type | None
    result: Result


def check_once(key: str, build: Callable[[], Checked]) -> Checked:
    """``build()``'s outcome for the server ``key``, once per process (a class that passed is recorded)."""
    with _lock:
        found = _checked.get(key)
        if found is None:
            found = _checked[key] = build()
            if found.cls is not None:
                record_pass(found.cls)
        return found


def _required_by_env() -> bool | None:
    """``$CONNLIST_REQUIRE_INTEGRATION``: True for ``1``, False for ``0``, None when unset or empty."""
    value = os.environ.get(REQUIRE_ENV, "").strip()
    if value == "":
        return None
    if value in ("0", "1"):
        return value == "1"
    raise ValueError(f"{REQUIRE_ENV} must be 1 (refuse to start without the integration) or 0, got {value!r}")


def require_integration() -> bool:
    """``$CONNLIST_REQUIRE_INTEGRATION``: ``1`` refuses to start without the integration; ``0``: fall back."""
    return _required_by_env() is True


# uvicorn's exit status for a failed startup, and gunicorn's for a worker that failed to boot.
REFUSAL_STATUS = 3


def refuse_to_start(what: str, advice: str) -> NoReturn:
    """``CONNLIST_REQUIRE_INTEGRATION=1`` and the integration off: one ERROR line, no traceback, and exit."""
    log.error(
        "refusing to start (%s=1): the server integration would be off: %s. %s", REQUIRE_ENV, what, advice
    )
    raise SystemExit(REFUSAL_STATUS)


def check_policy(value: object) -> str:
    """The ``server_integration`` option, checked."""
    choices = ", ".join(map(repr, POLICIES))
    if not isinstance(value, str):
        raise TypeError(f"server_integration must be one of {choices}, got {type(value).__name__}")
    if value not in POLICIES:
        raise ValueError(f"server_integration must be one of {choices}, got {value!r}")
    return value


def effective_policy(option: str) -> str:
    """The option as the operator's environment leaves it (the variable wins when set)."""
    required = _required_by_env()
    if required:
        return "required"
    if required is False and option == "required":
        return "auto"
    return option


def record_failure(stand_in: type, reason: str) -> None:
    """The server was given ``stand_in`` (its own class) because connlist's failed its check: ``reason``."""
    _failures[stand_in] = reason


def record_pass(cls: type) -> None:
    """connlist's protocol class ``cls`` passed its check in this process."""
    _passed.add(cls)


def failure(cls: type | None) -> str | None:
    """Why ``cls`` stands in for connlist's protocol whose check failed; None if it does not."""
    return None if cls is None else _failures.get(cls)


def checked() -> bool | str | None:
    """What the checks in this process say: True if a class passed, else the first failure, else None."""
    if _passed:
        return True
    if _failures:
        return next(iter(_failures.values()))
    return None


FELL_BACK = "connlist's protocol fell back to uvicorn's (see connlist's ERROR line)"
OFF = 'server_integration is "off"'
NO_LIFESPAN = (
    "the ASGI lifespan did not reach this middleware before its first request (the lifespan is off, or "
    "the middleware is on a mounted app), and connlist turns the integration on at the lifespan's startup"
)
BUDGET = "connection budget"


def asgi_only_kept() -> list[str]:
    """The timeouts ASGI-only mode still enforces (it sees a request once its headers are in)."""
    return [kind.label for kind in TIMEOUT_KINDS if kind.asgi]


def asgi_only_lost() -> list[str]:
    """What only the server integration enforces; the keep-alive is left out, as the server then times it."""
    return [kind.label for kind in TIMEOUT_KINDS if not kind.asgi and kind.setting is not None] + [BUDGET]


SERVERS_HEAD = (
    "a request head is bounded by the server's own limits alone, not max_header_size "
    "(uvicorn's httptools: none; h11: 16 KiB, answered 400; gunicorn: its --limit-request-* options)"
)


def asgi_only() -> str:
    """ASGI-only mode in one clause, for every line that says the integration is off: what stays, what not."""
    lost = [f"the {label}" for label in asgi_only_lost()]
    return (
        f"ASGI-only mode: request bodies are still timed ({', '.join(asgi_only_kept())}), but "
        f"{', '.join(lost[:-1])} and {lost[-1]} are not enforced, and {SERVERS_HEAD}"
    )


class Start(NamedTuple):
    """What ``Server.turn_on`` found: the mode if the integration is on, else why not and what to do."""

    mode: str | None
    reason: str | None = None
    advice: str | None = None
    refusal: str | None = None


def off(policy: str, reason: str, advice: str) -> Start:
    """The integration is off for ``reason``: a refusal where the ``policy`` is "required"."""
    refusal = None
    if policy == "required":
        refusal = (
            f"the server integration is off and it is required, so the server refuses to start: {reason}"
        )
    return Start(None, reason, advice, refusal)


class Server(Protocol):
    """A server integration's start-up side: a module of ``selection.SERVERS`` (``uvicorn.start``)."""

    def server_config(self, receive: Any, state: object = None) -> Any:
        """The config of the server whose lifespan is starting (found from its ``receive``), or None."""

    def gunicorn_master(self, config: Any) -> int | None:
        """The pid of the gunicorn master whose worker runs the server, or None."""

    def turn_on(self, config: Any, policy: str) -> Start:
        """Turn the integration on where the server allows (``config`` may be None), or say why not."""

    def advice_without_lifespan(self) -> str:
        """What to do when the first request came before any lifespan startup."""

    def unconfirmed(self, mode: str) -> tuple[str, str]:
        """Why the first request did not come through the protocol the startup gave (``mode``), what to do."""
