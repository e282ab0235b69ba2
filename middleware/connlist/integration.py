"""Whether the server integration is on, told at the server's start rather than at its first request.

``connlist.uvicorn`` checks each protocol class before it hands it to
uvicorn (``connlist.selfcheck``) and records here what failed; a class that
failed is replaced by uvicorn's own.  uvicorn imports the ``--http`` class
(``Config.load``) before the ASGI lifespan starts, so at the lifespan
startup ``ConnectionsMiddleware`` can tell the mode (``startup_status``):

* the server's protocol class is one of connlist's: the integration is on
  (each connection confirms it: the protocol announces its mode);
* it is uvicorn's own class standing in for one of connlist's whose check
  failed: ASGI-only mode, and why;
* it is another class (``--http httptools``): ASGI-only mode;
* the server is not uvicorn, or hides its config: if ``connlist.uvicorn``
  checked a class and it passed, the first connection tells; otherwise
  ASGI-only mode.

The server's protocol class is read from uvicorn's lifespan (the lifespan's
``receive`` is a method of uvicorn's ``LifespanOn``, which holds the
``Config``): one more part of uvicorn that is not public API, read
defensively; without it the start is told from what ``connlist.uvicorn``
checked.

``CONNLIST_REQUIRE_INTEGRATION=1`` (``require_integration``) turns the
fallback into a refusal to start, under uvicorn and gunicorn alike.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "REQUIRE_ENV",
    "TESTED_UVICORN",
    "is_check_failure",
    "record_failure",
    "record_pass",
    "require_integration",
    "server_protocol",
    "startup_status",
]

# The uvicorn releases CI runs the integration's tests on: the oldest
# supported one (0.36.0, the first whose --http takes an import string) and
# the newest at the time.  pyproject.toml has no upper bound: the self-check
# decides, and a newer release gets a warning.
TESTED_UVICORN = ("0.36.0", "0.54.0")
TESTED_RANGE = f"{TESTED_UVICORN[0]} to {TESTED_UVICORN[1]}"

REQUIRE_ENV = "CONNLIST_REQUIRE_INTEGRATION"

# What failed, by the class uvicorn was given instead (uvicorn's own).
_failures: dict[type, str] = {}
# connlist's protocol classes that passed their check.
_passed: set[type] = set()


def require_integration() -> bool:
    """``$CONNLIST_REQUIRE_INTEGRATION``: ``1`` refuses to start without the integration; ``0``: fall back."""
    value = os.environ.get(REQUIRE_ENV, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{REQUIRE_ENV} must be 1 (refuse to start without the integration) or 0, got {value!r}")


def record_failure(stand_in: type, reason: str) -> None:
    _failures[stand_in] = reason


def record_pass(cls: type) -> None:
    _passed.add(cls)


def is_check_failure(reason: str | None) -> bool:
    """Whether ``reason`` is a failed self-check's: connlist's protocol was asked for, uvicorn's given."""
    return reason is not None and reason in _failures.values()


def server_protocol(receive: Any) -> type | None:
    """The HTTP protocol class of the uvicorn server whose lifespan ``receive`` belongs to, if it tells."""
    config = getattr(getattr(receive, "__self__", None), "config", None)
    cls = getattr(config, "http_protocol_class", None)
    return cls if isinstance(cls, type) else None


def startup_status(receive: Any) -> tuple[str | None, str | None]:
    """At the lifespan startup: (the integration's mode if on, why it is off); (None, None): not known yet."""
    cls = server_protocol(receive)
    if cls is not None:
        mode = getattr(cls, "connlist_mode", None)
        if isinstance(mode, str):
            return mode, None
        reason = _failures.get(cls)
        if reason is not None:
            return None, reason
        name = f"{cls.__module__}.{cls.__qualname__}"
        return None, f"the server's HTTP protocol is {name}, not one of connlist.uvicorn's"
    if _passed:
        return None, None  # the first connection tells
    if _failures:
        return None, next(iter(_failures.values()))
    return None, "the server does not serve through connlist.uvicorn's protocols"
