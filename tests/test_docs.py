"""The docs site: it builds with ``mkdocs build --strict``, and it matches the code.

mkdocs runs in a subprocess (imported in-process it may emit warnings, which
pytest turns into errors here).  The quickstart's Python examples that define
an ``app`` must compile and build that app, and every option of
``ConnectionsMiddleware`` must be documented in docs/settings.md with its
default.
"""

from __future__ import annotations

import ast
import functools
import http.server
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from connlist import ConnectionsMiddleware

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

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
    """The site, built once for this module's tests with ``mkdocs build --strict``; and the build's result."""
    pytest.importorskip("mkdocs")
    if importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (pip install -e '.[docs]')")
    site = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # mkdocs runs no connlist code: not under coverage.py (scripts/test measures
    # the subprocesses through this variable), which makes the build twice as slow.
    env.pop("COVERAGE_PROCESS_CONFIG", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            "mkdocs.yml",
            "--site-dir",
            site,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return site, result


def test_site_builds_strict(built_site: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    site, result = built_site
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    # Every page of docs/ was built (strict mode also fails on a page left out of the nav).
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


def test_readme_links_are_absolute_and_lead_to_the_site(
    built_site: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    # PyPI shows the README without the repository: a relative link breaks there.
    site, _ = built_site
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    assert targets, "no links in the README"
    relative = [target for target in targets if not target.startswith("https://")]
    assert relative == [], relative
    docs = "https://connlist.github.io/connlist/"
    assert f"site_url: {docs}" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for target in targets:
        if not target.startswith(docs):
            continue
        page, _, anchor = target.removeprefix(docs).partition("#")
        built = site / page / "index.html"
        assert built.is_file(), f"README links to {target}, which the site does not have"
        if anchor:
            assert f'id="{anchor}"' in built.read_text(encoding="utf-8"), f"no #{anchor} in {page}"


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
