"""The docs site: it builds with ``zensical build --strict``, and it matches the code.

Zensical runs in a subprocess (imported in-process it may emit warnings, which
pytest turns into errors here).  The quickstart's Python examples that define
an ``app`` must compile and build that app, and every option of
``ConnectionsMiddleware`` must be documented in docs/settings.md with its
default, every metric in docs/metrics.md, and every field of the debug view
in docs/debug-endpoint.md.  The README's links lead to files of the
repository; no page links to a host the project does not have (no site is
published yet); every page explains the glossary's terms, or links to
them, where it first uses them; and the benchmarks' commands name scripts,
options and setups that exist.
"""

from __future__ import annotations

import ast
import functools
import http.server
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from connlist import ConnectionsMiddleware

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# ```python ... ``` fences, at any indentation (admonitions indent theirs).
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)


def code_blocks(path: Path, lang: str) -> list[str]:
    blocks = []
    for match in _FENCE.finditer(path.read_text(encoding="utf-8")):
        if match["lang"] == lang:
            indent = match["indent"]
            lines = match["body"].splitlines()
            blocks.append("\n".join(line.removeprefix(indent) for line in lines) + "\n")
    return blocks


def defines_app(tree: ast.Module) -> bool:
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(target, ast.Name) and target.id == "app" for target in targets):
            return True
    return False


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The site, built once for this module's tests with ``zensical build --strict``; and the build's result.

    Zensical builds where its config is (it keeps ``docs_dir`` and the site within that
    directory), so a copy of ``mkdocs.yml`` and ``docs/`` is built, not the checkout.
    """
    pytest.importorskip("zensical")
    project = tmp_path_factory.mktemp("docs")
    shutil.copy(ROOT / "mkdocs.yml", project)
    shutil.copytree(DOCS, project / "docs")
    env = dict(os.environ)
    # Zensical runs no connlist code: not under coverage.py (scripts/test measures
    # the subprocesses through this variable).
    env.pop("COVERAGE_PROCESS_CONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "zensical", "build", "--strict"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return project / "site", result


def test_site_builds_strict(built_site: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    site, result = built_site
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "warning" not in output.lower(), output
    # Every page of docs/ was built.
    for page in DOCS.glob("*.md"):
        built = site / "index.html" if page.stem == "index" else site / page.stem / "index.html"
        assert built.is_file(), f"{page.name} was not built"
    # The state diagram went through the mermaid fence, and Mermaid is in the site.
    assert '<pre class="mermaid">' in (site / "how-it-works" / "index.html").read_text(encoding="utf-8")
    assert (site / "vendor" / "mermaid" / "mermaid.min.js").stat().st_size > 1_000_000


def test_the_diagram_is_drawn_without_the_network(
    built_site: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """In Chromium, from a local server: the page draws its diagram with the Mermaid the site ships.

    The theme fetches Mermaid from a CDN unless one is loaded; that CDN is
    out of reach here (as for an offline reader), so a diagram drawn proves
    the shipped one drew it.  Drawn, the ``<pre class="mermaid">`` and its
    ``stateDiagram-v2`` text are gone: the theme puts the SVG in a closed
    shadow root of a ``<div class="mermaid">``.
    """
    from tests.browser import chromium, dump_dom

    chromium()
    site, result = built_site
    assert result.returncode == 0, result.stderr
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        server.RequestHandlerClass.log_message = lambda *args: None  # type: ignore[method-assign]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/how-it-works/"
            markup, log = dump_dom(url, scripts_time=15)
        finally:
            server.shutdown()
    assert "stateDiagram" not in markup, log
    assert '<pre class="mermaid"' not in markup
    assert '<div class="mermaid">' in markup, markup[:2000]


# -- links ---------------------------------------------------------------------------

# A Markdown link, [text](target), and an autolink, <https://...>.
_LINK = re.compile(r"\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)", re.S)
_AUTOLINK = re.compile(r"<(?P<target>https?://[^>\s]+)>")
_FENCE_LINE = re.compile(r"^[ \t]*(```|~~~)")

# The hosts the pages may link to: real public sites, checked by hand when one is added.  The
# project's own addresses (a docs site, a repository page, a package index page) are not among
# them until they are published: until then a link goes to the file in the repository.
PUBLIC_HOSTS = {
    "nodejs.org",
    "nginx.org",
    "httpd.apache.org",
    "pkg.go.dev",
    "pyperf.readthedocs.io",
    "hypercorn.readthedocs.io",
    "grafana.com",
    "github.com",  # other projects' repositories only (below)
}
# Addresses of the project that do not exist yet.
UNPUBLISHED = re.compile(
    r"^https?://(connlist\.github\.io|github\.com/connlist|pypi\.org/project/connlist)\b", re.I
)


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def without_code(text: str) -> str:
    """``text`` with fenced blocks and inline code blanked out (same length, same lines)."""
    lines, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE_LINE.match(line):
            fenced = not fenced
            lines.append(_blank(line))
        else:
            lines.append(_blank(line) if fenced else line)
    return re.sub(r"`[^`\n]*`", lambda m: _blank(m[0]), "".join(lines))


def links(path: Path) -> list[str]:
    """Every link target of a page's prose (not of its code)."""
    text = without_code(path.read_text(encoding="utf-8"))
    return [m["target"] for m in _LINK.finditer(text)] + [m["target"] for m in _AUTOLINK.finditer(text)]


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def leads_nowhere(target: str) -> bool:
    """Whether an external link goes to an unpublished address of the project, or to an unchecked host."""
    if not re.match(r"^[a-z]+://", target):
        return False  # a file of the repository (the README's test and zensical --strict check those)
    host = re.sub(r"^[a-z]+://([^/:]+).*", r"\1", target).lower()
    if host in ("127.0.0.1", "localhost"):
        return False  # the examples' own servers
    return bool(UNPUBLISHED.match(target)) or host not in PUBLIC_HOSTS


def test_no_link_to_a_host_the_project_does_not_have() -> None:
    assert leads_nowhere("https://connlist.github.io/connlist/#why")
    assert leads_nowhere("https://github.com/connlist/connlist/blob/main/LICENSE")
    assert leads_nowhere("https://example.invalid/x")
    assert not leads_nowhere("https://github.com/nodejs/node/pull/45778")
    assert not leads_nowhere("settings.md#the-server-integration")
    bad = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages()
        for target in links(page)
        if leads_nowhere(target)
    ]
    assert bad == [], "links to hosts the project does not have, or not checked yet:\n" + "\n".join(bad)


def test_readme_links_lead_to_files_of_the_repository(
    built_site: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    # Until a site is published the README links to the repository's files, relative to it (as
    # GitHub and a clone show them); a link to a docs page's anchor must find it in the built site.
    site, _ = built_site
    targets = links(README)
    assert targets, "no links in the README"
    for target in targets:
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {target}: no {path} in the repository"
        if anchor:
            assert path.startswith("docs/") and path.endswith(".md"), target
            page = Path(path).relative_to("docs").with_suffix("")
            built = site / ("" if page.name == "index" else page) / "index.html"
            assert f'id="{anchor}"' in built.read_text(encoding="utf-8"), f"no #{anchor} in {path}"


# -- terms before their explanation -------------------------------------------------------

# The glossary's terms (docs/glossary.md, by anchor): on every page, the first use of each in
# prose (not in code, not in a heading) is a link (to the glossary's entry, or to the page
# that explains it), or is in bold, where the page explains it.
TERMS = {
    "lifespan": r"(?:ASGI\s+)?lifespan",
    "server-integration": r"server\s+integration",
    "asgi-only-mode": r"ASGI-only\s+mode",
    "connection-budget": r"(?:connection\s+)?budget",
    "minimum-body-rate": r"(?:minimum\s+)?body\s+rate",
    "send-timeout": r"send\s+timeout",
}
# Pages that need not: the glossary itself, and the changelog (history, in the words of its day).
NOT_CHECKED = {"glossary.md", "changelog.md"}


def first_uses(text: str) -> dict[str, tuple[int, bool]]:
    """Each glossary term a page uses: where it first does, in prose, and whether it is explained there."""
    code_free = without_code(text)
    # Headings (and admonitions' titles), link targets and autolinks are not prose either.
    prose = re.sub(r"^[ \t]*(#|!!!|\?\?\?).*$", lambda m: _blank(m[0]), code_free, flags=re.M)
    prose = re.sub(r"(?<=\])\([^)\s]*\)", lambda m: _blank(m[0]), prose)
    prose = _AUTOLINK.sub(lambda m: _blank(m[0]), prose)
    explained = [(m.start("text"), m.end("text")) for m in _LINK.finditer(code_free)]
    explained += [m.span() for m in re.finditer(r"\*\*[^*]+?\*\*", code_free, re.S)]
    found = {}
    for anchor, pattern in TERMS.items():
        match = re.search(rf"(?<![\w-]){pattern}(?![\w-])", prose, re.I)
        if match:
            at = match.start()
            found[anchor] = (at, any(start <= at < end for start, end in explained))
    return found


def test_every_term_is_explained_or_linked_where_a_page_first_uses_it() -> None:
    glossary = (DOCS / "glossary.md").read_text(encoding="utf-8")
    headings = {
        re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-")
        for heading in re.findall(r"^## (.*)$", glossary, re.M)
    }
    assert set(TERMS) <= headings, f"docs/glossary.md has no entry for {set(TERMS) - headings}"
    unexplained = []
    for page in pages():
        if page.name in NOT_CHECKED:
            continue
        text = page.read_text(encoding="utf-8")
        for anchor, (at, explained) in first_uses(text).items():
            if not explained:
                line = text.count("\n", 0, at) + 1
                unexplained.append(f"{page.relative_to(ROOT)}:{line}: {anchor}")
    assert unexplained == [], "a term used before it is explained or linked:\n" + "\n".join(unexplained)


def test_the_term_check_catches_a_term_used_first_and_explained_later() -> None:
    later = (
        "The server integration is on.\n\nThe [server integration](glossary.md#server-integration) is...\n"
    )
    assert first_uses(later) == {"server-integration": (4, False)}
    linked = "A [server integration](how-it-works.md#the-server-integration), then the server integration.\n"
    assert first_uses(linked)["server-integration"][1] is True
    bold = "The **send timeout** bounds a response; the send timeout is 60 s.\n"
    assert first_uses(bold)["send-timeout"][1] is True
    # Code, headings and link targets are not prose.
    code = "## The lifespan\n\n`--lifespan on` and [x](settings.md#the-lifespan)\n```\nlifespan\n```\n"
    assert first_uses(code) == {}


def test_quickstart_apps_compile_and_build() -> None:
    blocks = [
        (block, ast.parse(block, filename="docs/quickstart.md"))
        for block in code_blocks(DOCS / "quickstart.md", "python")
    ]
    apps = [block for block, tree in blocks if defines_app(tree)]
    assert len(apps) >= 2, "the Starlette and FastAPI examples are gone from docs/quickstart.md"
    for block in apps:
        if "fastapi" in block:
            pytest.importorskip("fastapi")
        namespace: dict[str, Any] = {"__name__": "quickstart_example"}
        exec(compile(block, "docs/quickstart.md", "exec"), namespace)
        assert callable(namespace["app"]), block


def _documented_default(default: object) -> str:
    return f"`{json.dumps(default)}`" if isinstance(default, str) else f"`{default!r}`"


def test_settings_document_every_option() -> None:
    # The options table: from its "| option | default |" header to the first line that is not a row.
    table = re.search(
        r"^\| option \| default \|.*?(?=^[^|])", (DOCS / "settings.md").read_text("utf-8"), re.M | re.S
    )
    assert table is not None, "docs/settings.md has no '| option | default |' table"
    rows = {match[1]: match[0] for match in re.finditer(r"^\| `(\w+)` \|.*$", table[0], re.M)}
    parameters = inspect.signature(ConnectionsMiddleware).parameters
    assert set(parameters) >= {
        "headers_timeout",
        "request_timeout",
        "debug_path",
        "debug_token",
        "on_timeout",
    }
    for name, parameter in parameters.items():
        assert name in rows, f"ConnectionsMiddleware option {name!r} is not in docs/settings.md's table"
        if parameter.default is not inspect.Parameter.empty:
            expected = _documented_default(parameter.default)
            assert expected in rows[name], f"docs/settings.md: {name}'s default should read {expected}"


def _named_rows(text: str, heading: str) -> dict[str, str]:
    """The table under ``heading``: each name in backquotes in a row's first cell, to its row."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([\w.]+)`", line.split(" | ", 1)[0]):
                rows[name] = line
    return rows


class _RecordingMeter:
    """A meter provider and its meter in one: the names of the instruments created on it."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def get_meter(self, *args: Any, **kwargs: Any) -> _RecordingMeter:
        return self

    def _create(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.names.append(name)

    create_observable_counter = create_observable_up_down_counter = create_observable_gauge = _create


def test_every_metric_is_documented() -> None:
    # docs/metrics.md's tables: every series connlist.prometheus exports, every instrument of connlist.otel.
    pytest.importorskip("prometheus_client")
    pytest.importorskip("opentelemetry.metrics")
    from prometheus_client import CollectorRegistry

    from connlist.otel import Instruments
    from connlist.prometheus import ConnlistMetrics

    text = (DOCS / "metrics.md").read_text("utf-8")
    rows = _named_rows(text, "## Metrics")
    registry = CollectorRegistry()
    ConnlistMetrics(registry)
    series = {f"{f.name}_total" if f.type == "counter" else f.name for f in registry.collect()}
    assert "connlist_header_overflows_total" in series
    assert series - set(rows) == set(), "docs/metrics.md: series not in its table"
    meter = _RecordingMeter()
    Instruments(meter)  # type: ignore[arg-type]
    assert "connlist.header_overflows" in meter.names
    otel_rows = _named_rows(text, "## OpenTelemetry")
    assert set(meter.names) - set(otel_rows) == set(), "docs/metrics.md: instruments not in its table"


def test_every_field_of_the_view_is_documented() -> None:
    # docs/debug-endpoint.md's tables: the view's fields, its totals, a connection's fields.
    from connlist.core.enforcer import Enforcer
    from connlist.observe.debug import snapshot

    text = (DOCS / "debug-endpoint.md").read_text("utf-8")
    top, connection = _named_rows(text, "### Top level"), _named_rows(text, "### Connection objects")
    enforcer = Enforcer()
    enforcer.connections.connect()
    view = snapshot(enforcer)
    assert {"max_header_size", "unread_bytes"} <= set(view) and "header_overflows" in view["totals"]
    assert set(view) - set(top) == set(), "docs/debug-endpoint.md: fields not in the top level's table"
    totals = set(re.findall(r"`(\w+)`", top["totals"]))
    assert set(view["totals"]) - totals == set(), "docs/debug-endpoint.md: totals not in the totals row"
    (entry,) = view["all"]
    assert "unread" in entry
    assert set(entry) - set(connection) == set(), "docs/debug-endpoint.md: connection fields not in its table"


# -- the benchmarks' commands ----------------------------------------------------------

BENCHMARKS = ROOT / "benchmarks"
# pyperf.Runner's own options, which structures.py and list_micro.py take through it.
PYPERF_OPTIONS = {"--fast", "--rigorous", "--processes", "--append", "-o", "--output", "--values"}


def benchmark_commands(path: Path) -> list[tuple[str, list[str]]]:
    """Each ``benchmarks/NAME.py`` command of a page's ``sh`` blocks: the script and its arguments."""
    commands = []
    for block in code_blocks(path, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            match = re.search(r"benchmarks/(\w+)\.py((?:\s+[^\s#;]+)*)", line.split(" #", 1)[0])
            if match:
                commands.append((match[1], match[2].split()))
    return commands


def test_the_benchmark_commands_name_scripts_and_options_that_exist() -> None:
    # The benchmarks page gives the one command behind each table: it must still run as written.
    sources = "\n".join(p.read_text(encoding="utf-8") for p in BENCHMARKS.glob("*.py"))
    pages = [DOCS / "benchmarks.md", DOCS / "comparison.md", BENCHMARKS / "README.md"]
    commands = [(page, *command) for page in pages for command in benchmark_commands(page)]
    assert len(commands) >= 20, commands
    for page, script, args in commands:
        where = f"{page.relative_to(ROOT)}: benchmarks/{script}.py {' '.join(args)}"
        assert (BENCHMARKS / f"{script}.py").is_file(), where
        own = (BENCHMARKS / f"{script}.py").read_text(encoding="utf-8")
        option = None
        for arg in args:
            if arg.startswith("-"):
                option = arg
                if "pyperf.Runner" in own and arg in PYPERF_OPTIONS:
                    continue
                assert f'"{arg}"' in sources, f"{where}: no {arg}"
            elif option == "--setups":
                assert f'"{arg}"' in sources, f"{where}: no setup {arg}"
