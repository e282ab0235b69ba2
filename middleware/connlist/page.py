"""The debug endpoint's page, for a browser: the snapshot as HTML, self-contained and script-free.

``render(data)`` takes what the JSON would be (one worker's snapshot, or the
``workers=all`` answer) and returns the page: the counts and totals at the
top, then one table of connections per worker (state, client, age, duration,
method, path, from the worker's ``all`` list).  Counts, totals and their
names are rendered from the data, key by key, so a new state or total shows
up without a change here.

* **No script at all.**  The page refreshes itself with ``<meta
  http-equiv="refresh">``, which a browser honours without JavaScript.
* **Nothing external.**  One ``<style>`` element, allowed by its SHA-256 in
  the ``Content-Security-Policy`` the page is sent with (``HEADERS``);
  everything else (scripts, images, fonts, frames, forms, ``<base>``) is
  refused by that policy.
* **Everything escaped.**  Every value goes through ``html.escape``: paths and
  addresses come from clients (``/<script>alert(1)</script>`` shows as text).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Iterable
from typing import Any

__all__ = ["COLUMNS", "CSP", "HEADERS", "REFRESH", "STYLE", "render"]

# Seconds between two reloads of the page.
REFRESH = 3

# The columns of a connection row: keys of the JSON's connection objects.
COLUMNS = ("state", "client", "age", "duration", "method", "path")

STYLE = (
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}"
    "h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.5em 0 .3em}"
    "p{margin:.3em 0;color:#555}"
    "table{border-collapse:collapse;margin:.4em 0}"
    "th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0;font-weight:600}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "td.path,td.client{font-family:ui-monospace,monospace;word-break:break-all}"
    ".unreachable{color:#a00}"
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
    """A value as escaped text: None as a dash, a float with milliseconds."""
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value), quote=True)


def _seconds(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g} s" if value else "off"
    return _text(value)


def _numbers_table(caption: str, numbers: dict[str, Any]) -> str:
    """A two-row table: the names, then the values (in the data's order)."""
    names = "".join(f"<th>{_text(name)}</th>" for name in numbers)
    values = "".join(f'<td class="n">{_text(value)}</td>' for value in numbers.values())
    return f"<table><caption>{_text(caption)}</caption><tr>{names}</tr><tr>{values}</tr></table>"


def _connections_table(connections: Iterable[dict[str, Any]]) -> str:
    head = "".join(f"<th>{name}</th>" for name in COLUMNS)
    rows = []
    for conn in connections:
        cells = []
        for name in COLUMNS:
            value = conn.get(name)
            kind = "n" if isinstance(value, (int, float)) and not isinstance(value, bool) else name
            cells.append(f'<td class="{kind}">{_text(value)}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(COLUMNS)}">no connections</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


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
    if budget.get("pressed"):
        line += (
            f", under pressure: headers timeout now {_seconds(budget.get('headers_timeout_now'))}, "
            f"keep-alive {_seconds(budget.get('keep_alive_now'))}"
        )
    return line


def _worker_section(worker: dict[str, Any], *, heading: bool) -> str:
    parts = []
    pid = _text(worker.get("pid"))
    if worker.get("unreachable"):
        return f'<h2 class="unreachable">worker {pid}: unreachable ({_text(worker.get("error"))})</h2>'
    if heading:
        parts.append(f"<h2>worker {pid}</h2>")
        parts.append(_numbers_table("counts", worker.get("counts", {})))
    settings = (
        f"mode {_text(worker.get('mode'))}, headers timeout {_seconds(worker.get('headers_timeout'))}, "
        f"request timeout {_seconds(worker.get('request_timeout'))}"
    )
    parts.append(f"<p>{settings}</p>")
    budget = worker.get("budget")
    if isinstance(budget, dict):
        parts.append(f"<p>{_budget_line(budget)}</p>")
    connections = worker.get("all", [])
    if worker.get("truncated"):
        parts.append(
            f"<p>showing at most {_text(worker.get('limit'))} connections per list (limit): "
            f"{len(connections)} of {_text(worker.get('counts', {}).get('all'))}</p>"
        )
    parts.append(_connections_table(connections))
    return "".join(parts)


def render(data: dict[str, Any], *, refresh: int = REFRESH) -> bytes:
    """The page for one worker's snapshot, or for a ``workers=all`` answer (it has ``workers``)."""
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
        f"{_numbers_table('counts', data.get('counts', {}))}"
        f"{_numbers_table('totals', data.get('totals', {}))}"
        f"{''.join(sections)}"
        "</body></html>"
    )
    return page.encode()
