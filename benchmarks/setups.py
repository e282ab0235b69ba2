"""The setups that ``e2e.py`` (real servers, under wrk) and ``per_request.py`` (instructions) compare.

Each is an app of ``e2e_apps.py`` and uvicorn's ``--http`` value; both
scripts import this table, and neither imports the other for it.  The apps
themselves are imported only where a setup is served (``e2e_apps``), so this
module stays cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setup:
    key: str
    label: str
    app: str
    http: str
    # The connlist mode the debug endpoint must report, for the setups that have it.
    mode: str | None = None


SETUPS = (
    Setup("bare", "bare uvicorn", "e2e_apps:bare", "httptools"),
    Setup(
        "no-keepalive-timer",
        "bare uvicorn without its keep-alive timer",
        "e2e_apps:bare",
        "e2e_apps:NoKeepAliveTimerProtocol",
    ),
    Setup(
        "connlist",
        "connlist (integration + middleware)",
        "e2e_apps:with_connlist",
        "connlist.uvicorn:HttpToolsProtocol",
        mode="uvicorn-httptools",
    ),
    Setup(
        "as-usual",
        "connlist, no flag (integration turned on at the lifespan)",
        "e2e_apps:with_connlist",
        "httptools",
        mode="uvicorn-httptools",
    ),
    Setup("asgi-only", "connlist, ASGI-only mode", "e2e_apps:with_connlist_off", "httptools", mode="asgi"),
    Setup("asyncio.timeout", "asyncio.timeout middleware", "e2e_apps:with_asyncio_timeout", "httptools"),
    Setup("call_later", "per-connection call_later protocol", "e2e_apps:bare", "e2e_apps:CallLaterProtocol"),
    Setup(
        "padded",
        "bare uvicorn + padding (a control)",
        "e2e_apps:bare",
        "e2e_apps:PaddedProtocol",
    ),
)
# The setup every other is measured against.
BASELINE = "bare"
SETUP_BY_KEY = {setup.key: setup for setup in SETUPS}
