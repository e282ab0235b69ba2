"""Headless Chromium for the tests: the page as the browser rendered it, and screenshots.

Debian's ``chromium`` package (``.ci/run`` installs it).  Tests that need it
are skipped, saying why, where it is missing (they fail instead when
``CONNLIST_REQUIRE_CHROMIUM`` is set, as in CI).  Each call runs one browser with
a fresh profile and a deadline; its console (``--enable-logging=stderr``) is
returned too, so a test can look for Content-Security-Policy violations.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

# Browser start and one page load on a loaded 2-core machine.
DEADLINE = 60.0


def chromium() -> str:
    """The browser's path, or skip the test."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    reason = "chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)"
    if os.environ.get("CONNLIST_REQUIRE_CHROMIUM"):
        pytest.fail(f"{reason}, and CONNLIST_REQUIRE_CHROMIUM is set")
    pytest.skip(reason)


def _run(*args: str) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="connlist-chromium-") as profile:
        done = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--enable-logging=stderr",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            timeout=DEADLINE,
            check=False,
        )
    if done.returncode != 0:
        log = done.stderr.decode(errors="replace")
        raise AssertionError(f"chromium exited with {done.returncode}:\n{log}")
    return done.stdout.decode(), done.stderr.decode(errors="replace")


def dump_dom(url: str, *, scripts_time: float = 0) -> tuple[str, str]:
    """The page's DOM once loaded (serialized by the browser), and the browser's console log.

    ``scripts_time``: seconds of (virtual) time the page's scripts get to run
    after it loaded, for a page that draws itself (the docs' diagram).
    """
    budget = [f"--virtual-time-budget={int(scripts_time * 1000)}"] if scripts_time else []
    return _run(*budget, "--dump-dom", url)


def screenshot(url: str, path: Path, *, width: int = 900, height: int = 600) -> str:
    """Save a PNG of the page; return the console log."""
    return _run(f"--screenshot={path}", f"--window-size={width},{height}", "--hide-scrollbars", url)[1]


class Dom(HTMLParser):
    """What the tests look at in a serialized DOM: the tags, the text of headings, and table rows."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.headings: list[str] = []
        # (table number, cells) of every row.
        self.rows: list[tuple[int, list[str]]] = []
        # (href, text) of every link.
        self.links: list[tuple[str, str]] = []
        self._link: tuple[str, list[str]] | None = None
        self._tables = 0
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._heading: list[str] | None = None
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self._tables += 1
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag in ("h1", "h2"):
            self._heading = []
        elif tag == "a":
            self._link = (dict(attrs).get("href") or "", [])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append((self._tables, self._row))
            self._row = None
        elif tag in ("h1", "h2") and self._heading is not None:
            self.headings.append("".join(self._heading))
            self._heading = None
        elif tag == "a" and self._link is not None:
            self.links.append((self._link[0], "".join(self._link[1])))
            self._link = None

    def handle_data(self, data: str) -> None:
        for part in (self._cell, self._heading, None if self._link is None else self._link[1]):
            if part is not None:
                part.append(data)

    def connection_rows(self) -> list[dict[str, str]]:
        """The rows of the connection tables, as dicts keyed by the column names."""
        found = []
        headers: dict[int, list[str]] = {}
        for table, row in self.rows:
            header = headers.get(table)
            if header is None:
                headers[table] = row
            elif header[:1] == ["state"] and len(row) == len(header):
                found.append(dict(zip(header, row, strict=True)))
        return found
