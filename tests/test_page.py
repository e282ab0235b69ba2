"""The debug endpoint's page: content negotiation, escaping, the CSP, and a real browser.

In process: which requests get the page and which keep the JSON (byte for
byte), the escaping of client-supplied values, the style allowed by its hash,
counts and totals rendered from whatever keys the data has.  In headless
Chromium (skipped where it is not installed): the page a browser gets from a
real uvicorn holding connections in known states, and ``workers=all`` from a
real ``uvicorn --workers 2``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from connlist import ConnectionsMiddleware
from connlist.observe import page
from connlist.observe.debug import snapshot
from tests.browser import Dom, chromium, dump_dom
from tests.servers import INTEGRATED, PLAIN, close_sockets, connect, echo_app, read_response, serve, wait_for
from tests.subprocesses import run_server
from tests.test_workers import all_workers, both_up, env_for, reachable, stop_master, uvicorn_command

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"
HOSTILE = "/<script>alert(1)</script>"
# As sent on the wire: uvicorn gives the app (and the list) the decoded path.
HOSTILE_TARGET = "/%3Cscript%3Ealert(1)%3C/script%3E"


def get(app: Any, url: str, **headers: str) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.get(url, headers=headers)

    return asyncio.run(run())


def head(app: Any, url: str, **headers: str) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.head(url, headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (None, False),
        ("*/*", False),  # curl
        ("application/json", False),
        ("text/html, application/json", False),  # a tie keeps JSON
        ("application/json;q=0.5, text/html", True),
        ("text/html;q=0", False),
        ("text/html;q=high, application/json;q=0.1", False),  # a q that is no number counts as 0
        (BROWSER_ACCEPT, True),  # Chromium's and Firefox's navigation
        ("application/xhtml+xml", True),
    ],
)
def test_accept_decides_unless_format_says(accept: str | None, html: bool) -> None:
    app = ConnectionsMiddleware(echo_app)
    headers = {} if accept is None else {"accept": accept}
    response = get(app, "/_connections", **headers)
    kind = "text/html; charset=utf-8" if html else "application/json"
    assert response.headers["content-type"] == kind
    assert get(app, "/_connections?format=json", **headers).headers["content-type"] == "application/json"
    forced = get(app, "/_connections?format=html", **headers)
    assert forced.headers["content-type"] == "text/html; charset=utf-8"


def test_the_json_is_unchanged_byte_for_byte() -> None:
    app = ConnectionsMiddleware(echo_app)
    plain = get(app, "/_connections")
    expected = json.dumps(snapshot(app.enforcer), separators=(",", ":")).encode()
    assert plain.content == expected
    assert list(plain.headers.items()) == [
        ("content-type", "application/json"),
        ("content-length", str(len(expected))),
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
    ]
    for url, accept in (("/_connections?format=json", BROWSER_ACCEPT), ("/_connections", "*/*")):
        response = get(app, url, accept=accept)
        assert response.content == plain.content
        assert list(response.headers.items()) == list(plain.headers.items())


def test_the_page_headers_and_head() -> None:
    app = ConnectionsMiddleware(echo_app)
    response = get(app, "/_connections", accept=BROWSER_ACCEPT)
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == page.CSP
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert int(response.headers["content-length"]) == len(response.content)
    empty = head(app, "/_connections", accept=BROWSER_ACCEPT)
    assert empty.content == b"" and empty.headers == response.headers
    # Errors stay JSON, for browsers too.
    bad = get(app, "/_connections?format=pdf", accept=BROWSER_ACCEPT)
    assert bad.status_code == 400 and "format" in bad.json()["error"]

    # The access rules are the JSON's: a remote browser gets the plain 404.
    async def remote() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.get("/_connections?workers=all&format=html")

    assert asyncio.run(remote()).status_code == 404


def connection(**fields: Any) -> dict[str, Any]:
    base = {
        "id": 1,
        "client": "127.0.0.1:5000",
        "server": "127.0.0.1:8000",
        "state": "handling",
        "age": 1.5,
        "duration": None,
        "timeout": None,
        "time_left": None,
        "headers_completed": True,
        "requests": 1,
        "method": "GET",
        "path": "/",
    }
    base.update(fields)
    return base


def test_everything_from_clients_is_escaped_and_no_script_is_sent() -> None:
    data = {
        "pid": 7,
        "mode": "uvicorn-httptools",
        "headers_timeout": 10.0,
        "request_timeout": 30.0,
        "counts": {"all": 1},
        "totals": {"connections": 1},
        "limit": 1000,
        "truncated": False,
        "all": [connection(path=HOSTILE, client='"><img src=x onerror=alert(2)>', method="G<E>T")],
    }
    body = page.render(data).decode()
    assert "<script" not in body and "<img" not in body and "<E>" not in body
    assert "/&lt;script&gt;alert(1)&lt;/script&gt;" in body
    dom = Dom(body)
    (row,) = dom.connection_rows()
    assert row == {
        "state": "handling",
        "client": '"><img src=x onerror=alert(2)>',
        "age": "1.500 s",
        "duration": "\u2013",
        "timeout": "\u2013",
        "time left": "\u2013",
        "method": "G<E>T",
        "path": HOSTILE,
    }
    assert "script" not in dom.tags and "img" not in dom.tags


def test_the_style_is_the_one_the_csp_allows() -> None:
    body = page.render({"pid": 1, "counts": {}, "totals": {}, "all": []}).decode()
    (style,) = re.findall(r"<style>(.*?)</style>", body, re.S)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in page.CSP
    for directive in ("default-src 'none'", "img-src 'none'", "frame-ancestors 'none'", "base-uri 'none'"):
        assert directive in page.CSP
    assert f'<meta http-equiv="refresh" content="{page.REFRESH}">' in body
    assert "style=" not in body  # no inline style attribute (the CSP would block it)


def test_counts_totals_and_states_come_from_the_data() -> None:
    """New states and totals (as another version may have) show without a change to the page."""
    worker = {
        "pid": 9,
        "counts": {"all": 2, "stalled": 1},
        "totals": {"requests": 3, "rate_timeouts": 2},
        "all": [connection(state="stalled"), connection(id=2, state="some_new_state", duration=0.25)],
    }
    answer = {
        "pid": 9,
        "counts": {"all": 2, "stalled": 1},
        "totals": {"requests": 3, "rate_timeouts": 2},
        "unreachable": 1,
        "workers": [worker, {"pid": 10, "unreachable": True, "error": "no answer within 0.5 s"}],
    }
    dom = Dom(page.render(answer).decode())
    assert [row["state"] for row in dom.connection_rows()] == ["stalled", "some_new_state"]
    assert dom.connection_rows()[1]["duration"] == "0.250 s"
    assert ["all", "stalled"] in [cells for _, cells in dom.rows]
    # The totals by group, each a table of its own: what is not a kind's counter in "totals".
    rows = [cells for _, cells in dom.rows]
    assert rows[rows.index(["requests"]) : rows.index(["requests"]) + 4] == [
        ["requests"],
        ["3"],
        ["rate_timeouts"],
        ["2"],
    ]
    assert "worker 10: unreachable (no answer within 0.5 s)" in dom.headings
    assert "worker 9" in dom.headings
    # The sums at the top, then each worker's own counts and totals.
    assert rows.count(["requests"]) == 2 and rows.count(["rate_timeouts"]) == 2


def test_a_worker_without_a_budget_says_so() -> None:
    # max_connections=0 turns the budget off: the page says it, with no pressure to show.
    markup = get(ConnectionsMiddleware(echo_app, max_connections=0), "/_connections?format=html").text
    assert "<p>no connection budget (max_connections 0)</p>" in markup
    assert "pressure" not in markup
    with_budget = get(ConnectionsMiddleware(echo_app, max_connections=10), "/_connections?format=html").text
    assert "budget 0 of 10 connections (pressure 0%)" in with_budget


def test_the_totals_are_grouped_so_that_no_table_is_wider_than_a_screen() -> None:
    totals = {
        "connections": 5,
        "requests": 7,
        "headers_timeouts": 1,
        "request_timeouts": 0,
        "rate_timeouts": 0,
        "send_timeouts": 0,
        "keepalive_timeouts": 3,
        "idle_evictions": 2,
        "headers_evictions": 0,
        "body_evictions": 0,
        "refused": 0,
        "accept_failures": 0,
        "upgrades": 0,
        "upgrades_refused": 0,
        "header_overflows": 6,
        "some_new_total": 4,
    }
    markup = page.render({"pid": 1, "counts": {}, "totals": totals, "all": []}).decode()
    dom = Dom(markup)
    rows = [cells for _, cells in dom.rows]
    # The kinds that neither time out nor make room (503 past max_upgraded, 431 past max_header_size).
    names = ["connections", "requests", "accept_failures", "upgrades", "upgrades_refused", "header_overflows"]
    assert [*names, "some_new_total"] in rows
    assert ["5", "7", "0", "0", "0", "6", "4"] in rows
    assert [
        "headers_timeouts",
        "request_timeouts",
        "rate_timeouts",
        "send_timeouts",
        "keepalive_timeouts",
    ] in rows
    assert ["idle_evictions", "headers_evictions", "body_evictions", "refused"] in rows
    for caption in ("totals", "timeouts", "made room"):
        assert f"<caption>{caption}</caption>" in markup


def test_each_connection_shows_its_timeout_and_the_time_left() -> None:
    rows = [
        connection(state="new", duration=7.5, timeout="headers", time_left=2.5),
        connection(id=2, state="reading_body", duration=1.0, timeout="rate", time_left=-0.004),
    ]
    dom = Dom(page.render({"pid": 1, "counts": {}, "totals": {}, "all": rows}).decode())
    assert [(r["timeout"], r["time left"], r["duration"]) for r in dom.connection_rows()] == [
        ("headers", "2.500 s", "7.500 s"),
        ("rate", "due", "1.000 s"),  # past its deadline, the sweep not yet run
    ]


@pytest.mark.parametrize(
    ("url", "links"),
    [
        (
            "/_connections",
            [("_connections?format=json", "JSON"), ("_connections?workers=all", "every worker")],
        ),
        (
            "/_connections?workers=all&limit=5&format=html",
            [
                ("_connections?limit=5&workers=all&format=json", "JSON"),
                ("_connections?limit=5", "one worker"),
            ],
        ),
    ],
)
def test_links_between_the_json_every_worker_and_one(url: str, links: list[tuple[str, str]]) -> None:
    app = ConnectionsMiddleware(echo_app)
    dom = Dom(get(app, url, accept=BROWSER_ACCEPT).text)
    assert dom.links == links
    for href, _ in links:  # each answers, as what it says
        response = get(app, f"/{href}", accept=BROWSER_ACCEPT)
        assert response.status_code == 200
        assert ("json" in response.headers["content-type"]) == ("format=json" in href)


def test_captions_are_aligned_with_their_tables() -> None:
    # Tables are left-aligned; a caption is centred by default.
    assert "caption{text-align:left" in page.STYLE


# -- in a real browser ---------------------------------------------------------------


async def held_app(scope: Any, receive: Any, send: Any) -> None:
    """echo_app, except that the hostile path is handled until the client leaves."""
    if scope["type"] == "http" and scope["path"] == HOSTILE:
        await receive()
        await receive()  # http.disconnect, when the test closes the socket
        return
    await echo_app(scope, receive, send)


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Content Security Policy" in line or "Refused" in line]


def test_chromium_shows_every_state_and_the_escaped_path(tmp_path: Path) -> None:
    chromium()
    app = ConnectionsMiddleware(held_app, headers_timeout=30, request_timeout=60)
    with serve(app, INTEGRATED["httptools"]) as running:
        port = running.port
        connect(port)  # new
        connect(port).sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # reading_headers
        connect(port).sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc")  # reading_body
        connect(port).sendall(f"GET {HOSTILE_TARGET} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # handling
        idle = connect(port)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(idle).startswith(b"HTTP/1.1 200")  # idle, kept alive
        wanted = {"new", "reading_headers", "reading_body", "handling", "idle"}
        assert wait_for(lambda: {c["state"] for c in running.call(app.snapshot)["all"]} >= wanted)

        started = time.monotonic()
        markup, log = dump_dom(f"http://127.0.0.1:{port}/_connections")
        elapsed = time.monotonic() - started
        close_sockets()

    dom = Dom(markup)
    rows = dom.connection_rows()
    states = [row["state"] for row in rows]
    assert set(states) >= wanted, rows
    # The browser's own request is in the view too, handling.
    assert any(row["path"] == "/_connections" and row["state"] == "handling" for row in rows), rows
    (hostile,) = [row for row in rows if row["path"] == HOSTILE]
    assert hostile["state"] == "handling" and hostile["method"] == "GET"
    assert "script" not in dom.tags and "<script" not in markup
    assert console_errors(log) == [], log
    assert "mode uvicorn-httptools (server_integration auto): the server integration is on" in paragraphs(
        markup
    )
    # Which timeout runs for each, and the time left: the headers timeout
    # (30 s) while the headers are incomplete; for the body, the minimum
    # rate's (10 s of grace, and 3 bytes at 500 bytes/s), before the request
    # timeout's 60 s; none for the others.
    for row in rows:
        expected = {
            "new": ("headers", 30),
            "reading_headers": ("headers", 30),
            "reading_body": ("rate", 10),
        }
        timeout, limit = expected.get(row["state"], ("\u2013", None))
        assert row["timeout"] == timeout, row
        if limit is None:
            assert row["time left"] == "\u2013", row
        else:
            left = float(row["time left"].removesuffix(" s"))
            # (A connection made as the view is taken, such as Chromium's spare
            # one, shows the whole limit to the millisecond the page prints.)
            assert limit - 10 < left <= limit, row
    assert dom.links == [("_connections?format=json", "JSON"), ("_connections?workers=all", "every worker")]
    # The counts at the top match the rows.
    ((_, names), (_, values)) = dom.rows[:2]
    counts = dict(zip(names, map(int, values), strict=True))
    assert counts["all"] == len(rows) and counts["reading"] == states.count("new") + states.count(
        "reading_headers"
    )
    print(f"chromium --dump-dom took {elapsed:.2f} s")


def test_chromium_shows_every_worker(tmp_dir: Path) -> None:
    chromium()
    env = env_for(TMPDIR=str(tmp_dir))
    with run_server(uvicorn_command, tmp_dir / "uvicorn.log", env=env, ready=both_up) as server:
        pids = sorted(reachable(all_workers(server.port, "&limit=0")))
        markup, log = dump_dom(f"http://127.0.0.1:{server.port}/_connections?workers=all")
        stop_master(server)
    dom = Dom(markup)
    assert [heading for heading in dom.headings if heading.startswith("worker ")] == [
        f"worker {pid}" for pid in pids
    ]
    assert dom.headings[0].startswith(f"connections of {len(pids)} workers ({len(pids)} answered)")
    # The browser's request is in exactly one worker's table.
    assert [row["state"] for row in dom.connection_rows() if row["path"] == "/_connections"] == ["handling"]
    assert console_errors(log) == [], log
    # The sums, then each worker's counts and totals: one totals row of names per worker, and the sums'.
    totals = [cells for _, cells in dom.rows if cells[:2] == ["connections", "requests"]]
    assert len(totals) == len(pids) + 1, dom.rows
    assert dom.links == [("_connections?workers=all&format=json", "JSON"), ("_connections", "one worker")]


def png_text(path: Path) -> dict[str, str]:
    """The ``tEXt`` chunks of a PNG, by keyword."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    found, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            found[key.decode("latin-1")] = text.decode("latin-1")
        at += 12 + length
    return found


def test_the_docs_screenshot_shows_the_pages_columns() -> None:
    # scripts/debug-page-screenshot records the headings it photographed:
    # a change of the columns needs a new screenshot (run that script).
    shot = Path(__file__).resolve().parent.parent / "docs" / "img" / "debug-page.png"
    headings = ", ".join(page.LABELS.get(name, name) for name in page.COLUMNS)
    assert png_text(shot).get("connlist-columns") == headings, "run scripts/debug-page-screenshot"


def settings_view(**fields: Any) -> dict[str, Any]:
    view = {
        "pid": 1,
        "mode": "uvicorn-httptools",
        "integration_off": None,
        "server_integration": "auto",
        "enforced": ["headers", "request", "rate", "send"],
        "headers_timeout": 10.0,
        "request_timeout": 30.0,
        "send_timeout": 60.0,
        "body_min_rate": 500.0,
        "counts": {},
        "totals": {},
        "all": [],
    }
    view.update(fields)
    return view


def paragraphs(body: str) -> list[str]:
    """The text of the page's paragraphs (tags dropped), with their class if any."""
    return [
        (f"[{cls}] " if cls else "") + html.unescape(re.sub(r"<[^>]+>", "", text))
        for cls, text in re.findall(r'<p(?: class="([^"]*)")?>(.*?)</p>', body, re.S)
    ]


def test_the_mode_says_whether_the_integration_is_on_and_what_is_not_enforced() -> None:
    on = paragraphs(page.render(settings_view()).decode())
    assert "mode uvicorn-httptools (server_integration auto): the server integration is on" in on
    assert (
        "headers timeout 10 s, request timeout 30 s, minimum body rate 500 bytes/s, send timeout 60 s" in on
    )
    assert not any("not enforced" in line for line in on)
    # Off: the mode, why (escaped: it names classes and attributes), and each
    # configured timeout its mode cannot enforce, marked where it is shown.
    reason = "uvicorn 0.55.0: HttpToolsProtocol: `cycle.scope` is not the protocol's <scope>"
    off = paragraphs(
        page.render(settings_view(mode="asgi", integration_off=reason, enforced=["request", "rate"])).decode()
    )
    assert (
        "[off] mode asgi (server_integration auto): the server integration is off: uvicorn 0.55.0: "
        "HttpToolsProtocol: "
        "`cycle.scope` is not the protocol's <scope>. Not enforced: headers timeout, send timeout"
    ) in off
    assert (
        "headers timeout 10 s (not enforced), request timeout 30 s, minimum body rate 500 bytes/s, "
        "send timeout 60 s (not enforced)"
    ) in off
    # A timeout turned off is not "not enforced"; a view without ``enforced`` claims nothing.
    off = paragraphs(
        page.render(
            settings_view(
                mode="asgi", integration_off="why", enforced=["request"], send_timeout=0, body_min_rate=0
            )
        ).decode()
    )
    assert (
        "[off] mode asgi (server_integration auto): the server integration is off: why. "
        "Not enforced: headers timeout"
    ) in off
    assert "minimum body rate off, send timeout off" in off[-1]
    old = paragraphs(
        page.render(
            settings_view(enforced=None, integration_off=None, mode=None, server_integration=None)
        ).decode()
    )
    assert "mode \u2013" in old and not any("not enforced" in line for line in old)


def test_asgi_only_mode_marks_the_budget_and_says_the_list_sees_requests() -> None:
    budget = {"max_connections": 832, "occupied": 0, "pressure": 0.0, "pressed": False}
    off = page.render(
        settings_view(
            mode="asgi",
            integration_off="why",
            server_integration="off",
            enforced=["request", "rate"],
            budget={**budget, "enforced": False},
        )
    ).decode()
    lines = paragraphs(off)
    assert (
        "[off] mode asgi (server_integration off): the server integration is off: why. "
        "Not enforced: headers timeout, send timeout, connection budget"
    ) in lines
    assert "budget 0 of 832 connections (pressure 0%) (not enforced)" in lines
    assert "in ASGI-only mode the list sees requests, not connections" in off
    # With the integration: the budget is enforced, and an empty list has no connections.
    on = page.render(settings_view(budget={**budget, "enforced": True})).decode()
    assert "budget 0 of 832 connections (pressure 0%)" in paragraphs(on)
    assert "not enforced" not in on and ">no connections<" in on


def test_each_worker_shows_its_head_limit_and_what_it_holds_unparsed() -> None:
    on = paragraphs(page.render(settings_view(max_header_size=16384, unread_bytes=1234)).decode())
    assert "max_header_size 16384 bytes, 1234 bytes held unparsed" in on
    assert not any("not enforced" in line for line in on)
    off = paragraphs(page.render(settings_view(max_header_size=0, unread_bytes=0)).decode())
    assert "max_header_size off, 0 bytes held unparsed" in off
    # ASGI-only mode sees a head once the server has parsed it: marked, and named in the mode line.
    asgi = paragraphs(
        page.render(
            settings_view(
                mode="asgi", integration_off="why", enforced=["request", "rate"], max_header_size=16384
            )
        ).decode()
    )
    assert "max_header_size 16384 bytes (not enforced), \u2013 bytes held unparsed" in asgi
    assert (
        "[off] mode asgi (server_integration auto): the server integration is off: why. "
        "Not enforced: headers timeout, send timeout, max_header_size"
    ) in asgi
    # A view without either (another version's) claims nothing.
    assert not any("max_header_size" in line for line in paragraphs(page.render(settings_view()).decode()))
    # With workers=all, each worker's own.
    workers = [settings_view(pid=pid, max_header_size=65536, unread_bytes=pid * 100) for pid in (1, 2)]
    every = paragraphs(page.render({"pid": 1, "counts": {}, "totals": {}, "workers": workers}).decode())
    assert [line for line in every if "held unparsed" in line] == [
        "max_header_size 65536 bytes, 100 bytes held unparsed",
        "max_header_size 65536 bytes, 200 bytes held unparsed",
    ]
    # The middleware's view: its default, nothing held.
    markup = get(ConnectionsMiddleware(echo_app), "/_connections?format=html").text
    assert any(line.startswith("max_header_size 16384 bytes") for line in paragraphs(markup))
    assert any(line.endswith(", 0 bytes held unparsed") for line in paragraphs(markup))


def test_chromium_shows_the_integration_off(tmp_path: Path) -> None:
    # uvicorn's own protocol: ASGI-only mode, and the view says why.
    chromium()
    app = ConnectionsMiddleware(
        echo_app, headers_timeout=30, request_timeout=60, send_timeout=90, server_integration="off"
    )
    with serve(app, PLAIN["h11"]) as running:
        view = running.call(app.snapshot)
        markup, log = dump_dom(f"http://127.0.0.1:{running.port}/_connections")
    assert view["mode"] == "asgi" and view["integration_off"], view
    assert console_errors(log) == [], log
    assert "<script" not in markup
    lines = paragraphs(markup)
    assert (
        "[off] mode asgi (server_integration off): the server integration is off: server_integration is "
        '"off". Not enforced: headers timeout, send timeout, connection budget, max_header_size'
    ) in lines, lines
    assert view["budget"]["enforced"] is False
    assert any(line.endswith("(max_upgraded) (not enforced)") for line in lines), lines
    marked = "headers timeout 30 s (not enforced), request timeout 60 s, minimum body rate "
    assert any(
        line.startswith(marked) and line.endswith(", send timeout 90 s (not enforced)") for line in lines
    ), lines
    assert "max_header_size 16384 bytes (not enforced), 0 bytes held unparsed" in lines, lines
    # The mark is styled (the CSP allows the page's one style element).
    assert markup.count('<span class="off">(not enforced)</span>') == 4, markup
    assert "in ASGI-only mode the list sees requests, not connections" in markup


def test_a_truncated_view_says_how_many_it_shows() -> None:
    data = {
        "pid": 1,
        "counts": {"all": 3},
        "totals": {},
        "limit": 1,
        "truncated": True,
        "all": [connection()],
    }
    body = page.render(data).decode()
    assert "<p>showing at most 1 connections per list (limit): 1 of 3</p>" in body
