"""The debug endpoint's page, for a browser: the snapshot as HTML, self-contained and script-free.

``render(data)`` takes what the JSON would be (one worker's snapshot, or the
``workers=all`` answer) and returns the page: links to the other views (the
JSON, every worker, one worker), the counts and totals at the top, then per
worker (with ``workers=all``) its own counts and totals, its mode line (with
the integration off: why, and the timeouts it leaves unenforced, which its
settings line marks too) and settings line, its budget, its head limit
and the bytes it holds unparsed, and one table of its connections
(``COLUMNS``, from the worker's ``all`` list).  Counts, totals and their
names are rendered from the data, key by key, so a new state or total shows
up without a change here.  The page only presents: what a
connection's state is, which timeout runs for it and when, and which
timeouts the worker enforces come with the data (``connlist.observe.debug``, from
the list and the enforcer).  Each part of the page is one function
returning its markup (``_links``, ``_numbers_table``, ``_settings`` with its
``_mode`` line, ``_budget``, ``_heads``, ``_connections_table``), and ``_summary`` /
``_worker_section`` list the parts in order: a new line goes into one of
those lists.

* **No script at all.**  The page refreshes itself with ``<meta
  http-equiv="refresh">``, which a browser honours without JavaScript.
* **Nothing external.**  One ``<style>`` element, allowed by its SHA-256 in
  the ``Content-Security-Policy`` the page is sent with (``HEADERS``);
  everything else (scripts, images, fonts, frames, forms, ``<base>``) is
  refused by that policy.  The links are relative (the endpoint's own name
  and a query), so they work behind a proxy that serves it under a prefix.
* **Everything escaped.**  Every value goes through ``html.escape``: paths and
  addresses come from clients (``/<script>alert(1)</script>`` shows as text).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from connlist.core.kinds import HEADER_OVERFLOW, ROOM_KINDS, TIMEOUT_KINDS

__all__ = ["COLUMNS", "CSP", "HEADERS", "LABELS", "REFRESH", "STYLE", "render"]

# Seconds between two reloads of the page.
REFRESH = 3

# The columns of a connection row: keys of the JSON's connection objects.
COLUMNS = ("state", "client", "age", "duration", "timeout", "time_left", "method", "path")
# A column's heading, where it is not the key itself.
LABELS = {"time_left": "time left"}
# Columns in seconds: shown with their unit.
_SECONDS = frozenset({"age", "duration", "time_left"})

STYLE = (
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}"
    "h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.5em 0 .3em}"
    "p{margin:.3em 0;color:#555}"
    "nav{margin:.3em 0 .8em}nav a{margin-right:1em}"
    "table{border-collapse:collapse;margin:.4em 0}"
    "caption{text-align:left;font-weight:600;padding:0 0 .2em}"
    "th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0;font-weight:600}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "td.path,td.client{font-family:ui-monospace,monospace;word-break:break-all}"
    ".unreachable{color:#a00}"
    ".off{color:#a00;font-weight:600}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()

CSP = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'none'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

# Sent with the page, besides its content type and length.
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _text(value: object) -> str:
    """A value as escaped text: None as a dash."""
    if value is None:
        return "&ndash;"
    return html.escape(str(value), quote=True)


def _seconds(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g} s" if value else "off"
    return _text(value)


def _duration(value: object) -> str:
    """Seconds, with their unit (milliseconds shown); a deadline already passed is due."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "due" if value < 0 else f"{value:.3f} s"
    return _text(value)


def _numbers_table(caption: str, numbers: dict[str, Any]) -> str:
    """A two-row table: the names, then the values (in the data's order)."""
    names = "".join(f"<th>{_text(name)}</th>" for name in numbers)
    values = "".join(f'<td class="n">{_text(value)}</td>' for value in numbers.values())
    return f"<table><caption>{_text(caption)}</caption><tr>{names}</tr><tr>{values}</tr></table>"


# The totals' groups, each a table of its own so that none is wider than a
# screen: the timeouts' and the budget's counters (the rows of the table of
# kinds), and everything else (connections, requests, and any total a newer
# version adds) as "totals".
_TOTALS_GROUPS = (
    ("timeouts", frozenset(kind.counter for kind in TIMEOUT_KINDS)),
    ("made room", frozenset(kind.counter for kind in ROOM_KINDS)),
)


def _totals_tables(totals: dict[str, Any]) -> str:
    grouped = frozenset().union(*(names for _, names in _TOTALS_GROUPS))
    groups = [("totals", {n: v for n, v in totals.items() if n not in grouped})]
    for caption, names in _TOTALS_GROUPS:
        groups.append((caption, {n: v for n, v in totals.items() if n in names}))
    return "".join(_numbers_table(caption, numbers) for caption, numbers in groups if numbers)


def _connections_table(connections: Iterable[dict[str, Any]], empty: str = "no connections") -> str:
    head = "".join(f"<th>{LABELS.get(name, name)}</th>" for name in COLUMNS)
    rows = []
    for conn in connections:
        cells = []
        for name in COLUMNS:
            value = conn.get(name)
            if name in _SECONDS:
                cells.append(f'<td class="n">{_duration(value)}</td>')
            else:
                cells.append(f'<td class="{name}">{_text(value)}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(COLUMNS)}">{_text(empty)}</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _settings(worker: dict[str, Any]) -> str:
    """The mode line (``_mode``), then every timeout's setting (the rows of ``TIMEOUT_KINDS``).

    Each setting that is configured but not enforced in the worker's mode is marked.
    """
    unenforced = _unenforced(worker)
    marked = (
        f"{kind.label} {_setting(kind.unit, worker.get(kind.setting))}"
        + (' <span class="off">(not enforced)</span>' if kind.name in unenforced else "")
        for kind in TIMEOUT_KINDS
        if kind.setting is not None
    )
    return f"{_mode(worker, unenforced)}<p>{', '.join(marked)}</p>"


def _setting(unit: str, value: object) -> str:
    return _seconds(value) if unit == "s" else _amount(value, unit)


def _unenforced(worker: dict[str, Any]) -> list[str]:
    """The timeouts configured (not 0) that this worker does not enforce (its mode cannot), by kind name."""
    enforced = worker.get("enforced")
    if not isinstance(enforced, list):  # a view without it claims nothing
        return []
    return [
        kind.name
        for kind in TIMEOUT_KINDS
        if kind.setting is not None and worker.get(kind.setting) and kind.name not in enforced
    ]


def _mode(worker: dict[str, Any], unenforced: list[str]) -> str:
    """The worker's mode; with the integration off, why, and what is then not enforced."""
    mode = worker.get("mode")
    reason = worker.get("integration_off")
    setting = worker.get("server_integration")
    told = "" if setting is None else f" (server_integration {_text(setting)})"
    if reason is None:
        on = isinstance(mode, str) and mode != "asgi"
        return f"<p>mode {_text(mode)}{told}{': the server integration is on' if on else ''}</p>"
    lost = [kind.label for kind in TIMEOUT_KINDS if kind.name in unenforced]
    budget = worker.get("budget")
    if isinstance(budget, dict) and budget.get("max_connections") and budget.get("enforced") is False:
        lost.append("connection budget")
    if _head_unenforced(worker):
        lost.append(HEADER_OVERFLOW.label)
    return (
        f'<p class="off">mode {_text(mode)}{told}: the server integration is off: {_text(reason)}. '
        f"Not enforced: {', '.join(lost) if lost else 'none of the configured timeouts'}</p>"
    )


def _amount(value: object, unit: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g} {unit}" if value else "off"
    return _text(value)


def _truncated(worker: dict[str, Any]) -> str:
    if not worker.get("truncated"):
        return ""
    return (
        f"<p>showing at most {_text(worker.get('limit'))} connections per list (limit): "
        f"{len(worker.get('all', []))} of {_text(worker.get('counts', {}).get('all'))}</p>"
    )


def _budget(worker: dict[str, Any]) -> str:
    budget = worker.get("budget")
    return f"<p>{_budget_line(budget)}</p>" if isinstance(budget, dict) else ""


def _budget_line(budget: dict[str, Any]) -> str:
    """The connection budget and its pressure, and the timeouts it shortened."""
    if not budget.get("max_connections"):
        return "no connection budget (max_connections 0)"
    pressure = budget.get("pressure")
    share = f"{pressure * 100:.0f}%" if isinstance(pressure, (int, float)) else _text(pressure)
    line = (
        f"budget {_text(budget.get('occupied'))} of {_text(budget.get('max_connections'))} connections "
        f"(pressure {share})"
    )
    if budget.get("max_upgraded"):
        upgraded, share = _text(budget.get("upgraded")), _text(budget.get("max_upgraded"))
        line += f", websockets {upgraded} of {share} (max_upgraded)"

    if budget.get("pressed"):
        line += (
            f", under pressure: headers timeout now {_seconds(budget.get('headers_timeout_now'))}, "
            f"keep-alive {_seconds(budget.get('keep_alive_now'))}"
        )
    if budget.get("enforced") is False:
        line += ' <span class="off">(not enforced)</span>'
    return line


# The view's field of the head limit: the option of the HEADER_OVERFLOW row.
_HEAD_LIMIT = "max_header_size"


def _heads(worker: dict[str, Any]) -> str:
    """The limit on a request's head (max_header_size) and the bytes the worker holds unparsed."""
    if _HEAD_LIMIT not in worker and "unread_bytes" not in worker:
        return ""  # a view without them claims nothing
    limit = f"{HEADER_OVERFLOW.label} {_setting(HEADER_OVERFLOW.unit, worker.get(_HEAD_LIMIT))}"
    if _head_unenforced(worker):
        limit += ' <span class="off">(not enforced)</span>'
    return f"<p>{limit}, {_text(worker.get('unread_bytes'))} bytes held unparsed</p>"


def _head_unenforced(worker: dict[str, Any]) -> bool:
    """A head limit configured where the worker cannot apply it: ASGI-only mode sees a head once parsed."""
    return bool(worker.get(_HEAD_LIMIT)) and not HEADER_OVERFLOW.asgi and worker.get("mode") == "asgi"


def _worker_section(worker: dict[str, Any], *, heading: bool) -> str:
    pid = _text(worker.get("pid"))
    if worker.get("unreachable"):
        return f'<h2 class="unreachable">worker {pid}: unreachable ({_text(worker.get("error"))})</h2>'
    parts = []
    if heading:
        parts += [
            f"<h2>worker {pid}</h2>",
            _numbers_table("counts", worker.get("counts", {})),
            _totals_tables(worker.get("totals", {})),
        ]
    parts += [
        _settings(worker),
        _budget(worker),
        _heads(worker),
        _truncated(worker),
        _connections_table(worker.get("all", []), _empty(worker)),
    ]
    return "".join(parts)


def _empty(worker: dict[str, Any]) -> str:
    """What an empty table says: in ASGI-only mode the list holds requests being received, not connections."""
    if worker.get("mode") == "asgi":
        return (
            "no request being received: in ASGI-only mode the list sees requests, not connections "
            "(a client that is connected but has not sent its headers is not shown)"
        )
    return "no connections"


def _links(endpoint: str, query: dict[str, str], every_worker: bool) -> str:
    """Links to this view's JSON and to the other view (every worker, or one)."""

    def href(**changes: str | None) -> str:
        params = {**query, **changes}
        encoded = urlencode({name: value for name, value in params.items() if value is not None})
        return html.escape(f"{endpoint}?{encoded}" if encoded else endpoint, quote=True)

    other = (
        f'<a href="{href(workers=None)}">one worker</a>'
        if every_worker
        else f'<a href="{href(workers="all")}">every worker</a>'
    )
    return f'<nav><a href="{href(format="json")}">JSON</a>{other}</nav>'


def _summary(data: dict[str, Any], endpoint: str, query: dict[str, str], every_worker: bool) -> list[str]:
    """What the page shows above the workers' sections, in order."""
    return [
        _links(endpoint, query, every_worker),
        _numbers_table("counts", data.get("counts", {})),
        _totals_tables(data.get("totals", {})),
    ]


def render(
    data: dict[str, Any],
    *,
    refresh: int = REFRESH,
    endpoint: str = "_connections",
    query: dict[str, str] | None = None,
) -> bytes:
    """The page for one worker's snapshot, or for a ``workers=all`` answer (it has ``workers``).

    ``endpoint`` is the last segment of the endpoint's path and ``query`` the
    request's own parameters (``limit``, ``workers``): the links keep them.
    """
    query = {name: value for name, value in (query or {}).items() if name != "format"}
    workers: list[dict[str, Any]] | None = data.get("workers")
    if workers is None:
        title = f"connections of worker {_text(data.get('pid'))}"
        sections = [_worker_section(data, heading=False)]
    else:
        reached = len(workers) - int(data.get("unreachable", 0))
        title = (
            f"connections of {len(workers)} workers ({reached} answered), via worker {_text(data.get('pid'))}"
        )
        sections = [_worker_section(worker, heading=True) for worker in workers]
    page = (
        "<!DOCTYPE html>"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{int(refresh)}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{title}</title><style>{STYLE}</style></head><body>"
        f"<h1>{title}</h1>"
        f"<p>refreshes every {int(refresh)} s</p>"
        f"{''.join(_summary(data, endpoint, query, workers is not None))}"
        f"{''.join(sections)}"
        "</body></html>"
    )
    return page.encode()
