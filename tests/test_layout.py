"""The package's shape: four parts, each importing only the parts below it, and the public names.

The import graph is read from the source, so that it counts every import:
at the top of a module, inside a function, under ``TYPE_CHECKING``, and by
string (``importlib.import_module("connlist....")``, or a ``"module:attr"``
a server is told to import).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import connlist

PACKAGE = pathlib.Path(connlist.__file__).parent

# The parts, lowest first.  A module may import its own part and the parts below.
PARTS = ["core", "servers", "observe", "asgi"]
# Inside ``servers``: the neutral seam, below each server, below the selection of servers.
NEUTRAL = {"connlist.servers.seam", "connlist.servers.integration", "connlist.servers.selfcheck"}
SERVERS = {"uvicorn", "gunicorn"}
PUBLIC = {"connlist", "connlist.uvicorn", "connlist.gunicorn", "connlist.prometheus", "connlist.otel"}
# A whole string naming a module of the package, with an attribute or not: an import by string
# ("connlist" alone is a name, the logger's).
BY_STRING = re.compile(r"^(connlist(?:\.\w+)+)(?::\w+)?$|^(connlist):\w+$")


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    """The package's module ``name`` is, or is inside of (``connlist.core.kinds.deadline`` -> its module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
    return ids


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports, in any of the ways above."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    docstrings = _docstrings(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_target(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # ``from connlist.servers import integration`` imports the submodule;
            # ``from connlist import __version__``, the package's ``__init__``.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else _target(base)
                for alias in node.names
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            match = BY_STRING.match(node.value)
            # Only a whole module's name: "connlist.selfcheck.gate" (a key of a check's state) names none.
            name = match and (match.group(1) or match.group(2))
            if name in MODULES:
                targets = [name]
        found.update(target for target in targets if target is not None and target != module)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def part(module: str) -> int:
    """The rank of the part ``module`` is in; the public names rank above every part."""
    if module in PUBLIC:
        return len(PARTS)
    return PARTS.index(module.split(".")[1])


def test_the_tree_is_four_parts_and_the_public_names():
    top = {path.name for path in PACKAGE.iterdir() if path.suffix == ".py"}
    assert top == {"__init__.py", "uvicorn.py", "gunicorn.py", "prometheus.py", "otel.py"}
    assert {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()} == set(PARTS)
    assert {
        path.name for path in (PACKAGE / "servers").iterdir() if (path / "__init__.py").exists()
    } == SERVERS


def test_the_graph_reads_every_kind_of_import():
    # The reader itself, on modules whose imports are known: a function's import,
    # a TYPE_CHECKING import, and an import by string.
    assert "connlist.observe.page" in GRAPH["connlist.observe.debug"]
    assert "connlist.servers.uvicorn.protocols" in GRAPH["connlist.uvicorn"]
    assert "connlist.servers.uvicorn.start" in GRAPH["connlist.servers.selection"]
    assert "connlist.servers.uvicorn.protocols" in GRAPH["connlist.servers.gunicorn.workers"]
    # The package's own __init__, imported from (it would import the middleware).
    assert "connlist.core.version" in GRAPH["connlist"] and "connlist" not in GRAPH["connlist.core.enforcer"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_part_imports_only_the_parts_below_it(module):
    higher = sorted(target for target in GRAPH[module] if part(target) > part(module))
    assert higher == [], f"{module} (part {part(module)}) imports higher parts: {higher}"


def _server(module: str) -> str | None:
    """The server whose subpackage ``module`` is in, or None."""
    names = module.split(".")
    return names[2] if len(names) > 2 and names[1] == "servers" and names[2] in SERVERS else None


def test_the_neutral_seam_imports_no_server():
    for module in NEUTRAL & set(MODULES):
        assert {_server(target) for target in GRAPH[module]} <= {None}, module
    # uvicorn's protocols are what connlist's gunicorn workers serve with; uvicorn knows nothing of gunicorn.
    for module in MODULES:
        if _server(module) == "uvicorn":
            assert "gunicorn" not in {_server(target) for target in GRAPH[module]}, module


def test_the_import_graph_has_no_circle():
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError("an import circle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(GRAPH[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(GRAPH):
        visit(module)


def test_the_public_import_paths():
    from gunicorn.util import load_class
    from uvicorn.importer import import_from_string

    import connlist.otel
    import connlist.prometheus
    from connlist import ConnectionsMiddleware
    from connlist.asgi.middleware import ConnectionsMiddleware as Defined

    assert ConnectionsMiddleware is Defined
    # As uvicorn's --http and gunicorn's -k load them.
    for name in ("HttpToolsProtocol", "H11Protocol", "AutoProtocol"):
        cls = import_from_string(f"connlist.uvicorn:{name}")
        assert isinstance(cls, type) and cls is getattr(importlib.import_module("connlist.uvicorn"), name)
    import uvicorn.protocols.http.h11_impl as h11_impl

    assert issubclass(import_from_string("connlist.uvicorn:H11Protocol"), h11_impl.H11Protocol)
    from gunicorn.asgi.protocol import ASGIProtocol
    from gunicorn.workers.gasgi import ASGIWorker

    assert issubclass(load_class("connlist.gunicorn.ASGIWorker"), ASGIWorker)
    assert issubclass(importlib.import_module("connlist.gunicorn").ASGIProtocol, ASGIProtocol)
    for name in ("UvicornWorker", "UvicornH11Worker"):
        assert load_class(f"connlist.gunicorn.{name}").__name__ == name
    for public, defined in (
        (connlist.prometheus, "connlist.observe.prometheus"),
        (connlist.otel, "connlist.observe.otel"),
    ):
        module = importlib.import_module(defined)
        assert public.__all__ == module.__all__
        assert all(getattr(public, name) is getattr(module, name) for name in public.__all__)
    with pytest.raises(AttributeError, match="no attribute '_resolve'"):
        importlib.import_module("connlist.uvicorn")._resolve  # noqa: B018 - the private names stay private


# A module's size is set by its one job; past these, it has more than one.
MODULE_LINES = 600
CLASS_LINES = 400
# The servers' layer observes the servers: what it reads and overrides of theirs, not copies of it.
SERVERS_LINES = 4000


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_or_class_is_too_long(module):
    source = MODULES[module].read_text()
    assert len(source.splitlines()) <= MODULE_LINES, module
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= CLASS_LINES, f"{module}.{node.name}"


def test_the_servers_layer_stays_small():
    servers = [path for name, path in MODULES.items() if (name + ".").startswith("connlist.servers.")]
    assert len(servers) > 10
    assert sum(len(path.read_text().splitlines()) for path in servers) <= SERVERS_LINES


def _defined(module: str) -> set[str]:
    """The names ``module`` defines at its top level (a def, a class, an assignment), not those it imports."""
    names: set[str] = set()
    statements = list(ast.parse(MODULES[module].read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(name.id for name in ast.walk(target) if isinstance(name, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            # Still the top level: a name defined only if an import succeeded (httptools_impl's class).
            statements += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            statements += [line for handler in getattr(node, "handlers", []) for line in handler.body]
    return names


def test_a_module_takes_each_name_from_its_owner():
    # The arrows lead to where a thing is defined.  A re-export is for the
    # public names and documented paths (``connlist.core.connections.Connection``),
    # not for the package's own modules; the seam's are its contract with a
    # server integration (its docstring).
    owners = set(MODULES) - PUBLIC - {"connlist.servers.seam"}
    borrowed = []
    for module in sorted(set(MODULES) - PUBLIC):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in owners:
                continue
            borrowed += [
                f"{module}: {alias.name} from {node.module}"
                for alias in node.names
                if f"{node.module}.{alias.name}" not in MODULES and alias.name not in _defined(node.module)
            ]
    assert borrowed == []


# A record's links and the list's roots and counts are the list's own (connlist.core.connections):
# the record declares its links (records, with its own properties over them, ``tracked`` and
# ``is_active``), and the queues keep their links and heap entries (queues).  Everything else asks
# the list.
LIST_OWN = (
    "_all_prev",
    "_all_next",
    "_active_prev",
    "_active_next",
    "_idle_entry",
    "_all_root",
    "_active_root",
    "_n_active",
    "_n_timed_out",
    "_n_headers_pending",
    "_n_evicted",
)
LIST_OWNERS = {"connlist.core.connections", "connlist.core.records", "connlist.core.queues"}
# Any mention in the source: an attribute, a string given to getattr, a comment.
_LIST_OWN = re.compile(r"\b(?:" + "|".join(LIST_OWN) + r")\b")


def _naming_list_own(module: str) -> list[str]:
    lines = MODULES[module].read_text().splitlines()
    return [
        f"{module}:{number}: {name}"
        for number, line in enumerate(lines, 1)
        for name in _LIST_OWN.findall(line)
    ]


def test_only_the_list_names_its_links_and_counts():
    # The search itself: the list names every one of them.
    own = {found.rpartition(" ")[2] for found in _naming_list_own("connlist.core.connections")}
    assert own == set(LIST_OWN)
    named = [found for module in sorted(set(MODULES) - LIST_OWNERS) for found in _naming_list_own(module)]
    assert named == []


# The most branches a function of the package may have (radon's cyclomatic complexity).
MOST_COMPLEX = 15


def test_no_function_is_more_complex_than_the_rule() -> None:
    from radon.complexity import cc_visit

    found = [
        f"{name}: {block.fullname} {block.complexity}"
        for name, path in MODULES.items()
        for block in cc_visit(path.read_text())
        if block.complexity > MOST_COMPLEX
    ]
    assert found == []
