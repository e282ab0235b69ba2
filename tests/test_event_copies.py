"""The list's events where a feeder writes them out for speed: statement by statement, the definition's.

``connlist.core.connections.ConnectionsList`` defines each event once.  The
uvicorn feeders' hot path, a whole request in one read on an idle
connection, writes ``message`` out (a call there costs more than the event:
docs/benchmarks.md, "The request path's tricks, each measured").  This test
reads both syntax trees, as ``connlist.servers.uvicorn.keepalive`` reads
uvicorn's methods, so that a change to the event cannot miss its copies.
The other events the feeders run call their definitions (the keep-alive
forms: ``UvicornCycle._connlist_idle`` calls ``response_complete``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

from connlist.core.connections import ConnectionsList
from connlist.servers.uvicorn import keepalive
from connlist.servers.uvicorn.cycle import UvicornCycle
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking

FEEDERS = {"httptools": HttpToolsTracking, "h11": H11Tracking}


def _function(function: Any) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _dump(statements: list[ast.stmt]) -> list[str]:
    return [ast.unparse(statement) for statement in statements]


class _Rename(ast.NodeTransformer):
    """The feeder's name of the record (``record``) as the definition's (``conn``)."""

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name("conn", node.ctx) if node.id == "record" else node


def _on_idle(function: ast.FunctionDef, test: str) -> ast.If:
    """The one ``if`` of ``function`` whose condition (renamed) includes ``test``."""
    found = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.If) and test in ast.unparse(_Rename().visit(node.test))
    ]
    assert len(found) == 1, [ast.unparse(node.test) for node in found]
    return found[0]


IDLE = "conn.last_message_start == 0.0"


def _definition() -> ast.If:
    """``message``'s branch for an idle record (its first statement after the docstring)."""
    function = _function(ConnectionsList.message)
    branch = function.body[1]
    assert isinstance(branch, ast.If)
    assert ast.unparse(branch.test) == f"{IDLE} and conn._all_next is not None"
    return branch


@pytest.mark.parametrize("parser", list(FEEDERS))
def test_the_hot_path_writes_message_as_the_list_defines_it(parser: str) -> None:
    definition = _dump(_definition().body)
    copy = _on_idle(_function(FEEDERS[parser].data_received), IDLE)
    written = [
        statement
        for statement in copy.body
        if not (isinstance(statement, ast.AugAssign) and "totals" in ast.unparse(statement.target))
    ]
    # The copy is the definition's statements in the definition's order, but one: the feeders
    # complete a message only after its headers (each of their message_complete follows
    # headers_complete), so an idle record's headers_completed is True already.  Its test
    # leaves out ``_all_next``: a read never comes after connection_lost or an upgrade.
    assert _dump([_Rename().visit(statement) for statement in written]) == [
        line for line in definition if line != "conn.headers_completed = True"
    ]
    assert "conn.headers_completed = True" in definition
    # What the feeder counts besides, once per request whose headers are complete (seam.Feeder).
    assert [ast.unparse(s) for s in copy.body if s not in written] == ["self._connlist.totals.requests += 1"]


def test_the_keep_alive_forms_call_the_event() -> None:
    """``response_complete`` is not written out: the forms call ``_connlist_idle``, which calls it."""
    idle = _function(UvicornCycle._connlist_idle)
    calls = [ast.unparse(node.func) for node in ast.walk(idle) if isinstance(node, ast.Call)]
    assert "enforcer.connections.response_complete" in calls
    for where in (HttpToolsTracking, H11Tracking, UvicornCycle, keepalive):
        source = inspect.getsource(where)
        assert "idle_queue" not in source and "_idle_entry" not in source, where
    for forms in keepalive.FORMS.values():
        for form in forms:
            assert "self._connlist_idle()" in inspect.getsource(form), form
