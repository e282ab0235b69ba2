"""The list's events where a feeder writes them out for speed: statement by statement, the definition's.

``connlist.core.connections.ConnectionsList`` defines each event once.  The
uvicorn feeders' hot path, a whole request in one read on an idle
connection, writes ``message`` out, and gunicorn's does too (a call there costs more than the event:
docs/benchmarks.md, "The request path's tricks, each measured").  This test
reads both syntax trees, as ``connlist.servers.uvicorn.keepalive`` reads
uvicorn's methods, so that a change to the event cannot miss its copies.
The end of a response that leaves a connection idle is written out too, in
the keep-alive forms (``connlist.servers.uvicorn.keepalive``) and in
gunicorn's ``_arm_keepalive_timer``: its ``response_complete``.  gunicorn's
class also writes its read's hook, between messages, into its
``data_received`` (``connlist.servers.gunicorn.reads``).  The uvicorn
feeders' ``connection_made`` and ``connection_lost`` write out the seam's
setup and removal (``Tracking._connlist_setup``, ``_connlist_remove``).  A
connection's one call into the list, ``Enforcer.join``, writes ``connect`` out,
with the fields ``connect`` has ``Connection._fields`` write.  The other
events the feeders run call their definitions.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

from connlist.core.connections import Connection, ConnectionsList
from connlist.servers.uvicorn import keepalive
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking
from tests.fakes import FakeClock, MockLoop

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


@pytest.mark.parametrize("method", ["_feed_callback_parser", "_connlist_data_received"])
def test_gunicorns_hot_path_writes_message_as_the_list_defines_it(method: str) -> None:
    from connlist.servers.gunicorn.protocol import ASGIProtocol

    definition = _dump(_definition().body)
    copy = _on_idle(_function(getattr(ASGIProtocol, method)), IDLE)
    # As uvicorn's feeders (above); the request is counted before the test, for both branches,
    # and the branch's return is the one after them both.
    assert definition[-1] == "return"
    assert _dump([_Rename().visit(statement) for statement in copy.body]) == [
        line for line in definition[:-1] if line != "conn.headers_completed = True"
    ]


def test_gunicorns_data_received_writes_the_hooks_path_between_messages_as_it_is() -> None:
    from connlist.servers.gunicorn.protocol import ASGIProtocol

    hook = _function(ASGIProtocol._feed_callback_parser)
    written = _function(ASGIProtocol._connlist_data_received)
    # The hook's statements between messages (after its open-message branch, less its
    # ``return fed``) are the ``else`` of data_received's test of the phase, as they are.
    [phase_test] = [
        node
        for node in written.body
        if isinstance(node, ast.If) and "_connlist_phase" in ast.unparse(node.test)
    ]
    [open_branch] = [
        node for node in hook.body if isinstance(node, ast.If) and "phase" in ast.unparse(node.test)
    ]
    between = hook.body[hook.body.index(open_branch) + 1 :]
    assert ast.unparse(between[-1]) == "return fed"
    # Each begins with the same guard (a read held, sliced or cut: ``_connlist_stop``), which
    # returns as each returns: the hook what it says, data_received nothing.
    [guard, written_guard] = between[0], phase_test.orelse[0]
    assert isinstance(guard, ast.If) and isinstance(written_guard, ast.If)
    assert ast.unparse(guard.test.values[0]) == ast.unparse(written_guard.test.values[0])  # type: ignore[attr-defined]
    assert [ast.unparse(s) for s in guard.body] == ["return stopped"]
    assert [ast.unparse(s) for s in written_guard.body] == ["return"]
    assert _dump(phase_test.orelse[1:]) == _dump(between[1:-1])
    assert "self._connlist_base_feed(data)" in ast.unparse(phase_test.orelse[3])


def test_gunicorns_data_received_ends_as_the_form_it_was_copied_from() -> None:
    from connlist.servers.gunicorn import reads
    from connlist.servers.gunicorn.protocol import ASGIProtocol

    written = _function(ASGIProtocol._connlist_data_received)
    # The form's HTTP/1 branch (``elif self._callback_parser``): the feed, then the backpressure test.
    form = _function(reads.FORMS[0])
    [http1] = [
        node
        for node in ast.walk(form)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "self.reader"
    ]
    branch = http1.orelse[0]
    assert isinstance(branch, ast.If) and ast.unparse(branch.test) == "self._callback_parser"
    feed, backpressure, _return = branch.body
    assert ast.unparse(feed) == "if not self._feed_callback_parser(data):\n    return"
    # connlist's fed the parser itself (fed), then ends with the same test, as it is.
    assert _dump(written.body[-2:]) == ["if not fed:\n    return", ast.unparse(backpressure)]


class _AsTheList(ast.NodeTransformer):
    """A keep-alive form's names as ``ConnectionsList``'s: the record, the list, its clock, the time."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        text = ast.unparse(node)
        if text == "enforcer.connections":
            return ast.Name("self", node.ctx)
        if text == "enforcer.clock":  # the enforcer's clock is its list's (Enforcer.__init__)
            return ast.Attribute(ast.Name("self", ast.Load()), "_clock", node.ctx)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name({"record": "conn", "idle_at": "now"}.get(node.id, node.id), node.ctx)


def _written_out(form: Any) -> list[str]:
    """The statements of a keep-alive form between its record and its timer: the event, renamed."""
    branch = _on_idle(_function(form), "self.timeout_keep_alive > 0")
    names = _dump(branch.body)
    start = names.index("record = self._connlist_record") + 1
    end = next(i for i, line in enumerate(names) if "wake_by" in line)
    return _dump([_AsTheList().visit(statement) for statement in branch.body[start:end]])


def test_gunicorns_keep_alive_writes_response_complete_as_the_list_defines_it() -> None:
    from connlist.servers.gunicorn.protocol import ASGIProtocol

    definition = _dump(_function(ConnectionsList.response_complete).body[1:])  # (after the docstring)
    function = _function(ASGIProtocol._arm_keepalive_timer)
    names = _dump(function.body)
    start = names.index("record.responding = False")
    end = next(i for i, line in enumerate(names) if "wake_by" in line)
    assert _dump([_AsTheList().visit(statement) for statement in function.body[start:end]]) == definition


@pytest.mark.parametrize(
    "form", [form for forms in keepalive.FORMS.values() for form in forms], ids=lambda form: form.__name__
)
def test_the_keep_alive_forms_write_response_complete_as_the_list_defines_it(form: Any) -> None:
    definition = _dump(_function(ConnectionsList.response_complete).body[1:])  # (after the docstring)
    # ``responding`` is written where each form's protocol has it: the httptools forms before
    # (the response's end, pipelined or not), h11's caller after h11 let in what it held.
    assert definition[0] == "conn.responding = False"
    assert _written_out(form) == definition[1:]
    source = inspect.getsource(form)
    if form.__name__.startswith("_httptools"):
        assert "self._connlist_record.responding = False" in source
    else:
        assert "record.responding = False" in inspect.getsource(H11Tracking.on_response_complete)


def _contains_run(whole: list[str], run: list[str]) -> bool:
    """Whether ``run`` is in ``whole``, statement after statement."""
    return any(whole[i : i + len(run)] == run for i in range(len(whole) - len(run) + 1))


class _Unaliased(ast.NodeTransformer):
    """The seam's names as the feeders import them (``_STATE_KEY``, ``_BETWEEN``), as the seam writes them."""

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name({"_STATE_KEY": "STATE_KEY", "_BETWEEN": "BETWEEN"}.get(node.id, node.id), node.ctx)


@pytest.mark.parametrize("parser", list(FEEDERS))
def test_the_feeders_write_the_seams_setup_and_removal_as_it_defines_them(parser: str) -> None:
    from connlist.servers.seam import Tracking

    feeder = FEEDERS[parser]
    setup = _dump(_function(Tracking._connlist_setup).body[1:-1])  # (no docstring, no return)
    made = _dump([_Unaliased().visit(statement) for statement in _function(feeder.connection_made).body])
    # The setup's arguments, taken where uvicorn has them.
    assert "state, loop, keep_alive = (self.app_state, self.loop, self.timeout_keep_alive)" in made
    assert _contains_run(made, setup), made
    removal = _dump(_function(Tracking._connlist_remove).body)
    lost = _dump(_function(feeder.connection_lost).body)
    assert _contains_run(lost, removal), lost
    assert lost[-1] == "self._connlist_base_lost(exc)"


# -- the record's making: ``Enforcer.join`` writes ``ConnectionsList.connect`` out, with the
# fields ``connect`` has ``Connection._fields`` write (one call per connection into the list).


def _slots(record: Any) -> dict[str, Any]:
    """Every slot of a record that holds a value (an unwritten one holds none), by name."""
    missing = object()
    values = {name: getattr(record, name, missing) for name in Connection.__slots__ if name != "__dict__"}
    return {name: value for name, value in values.items() if value is not missing}


LINKS = ("_all_prev", "_all_next", "_active_prev", "_active_next")


class _AsJoinNames(ast.NodeTransformer):
    """``connect``'s and ``_fields``' names as ``join`` has them (the list, the record, the clock value)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.names.get(node.id, node.id), node.ctx)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt:
        # ``self.x: T = v`` writes what ``self.x = v`` does.
        assert node.value is not None
        return self.visit(ast.Assign([node.target], node.value, lineno=node.lineno))


def _fields_written() -> list[str]:
    """``Connection._fields``' statements (no docstring), as ``join`` writes them."""
    names = {"self": "record", "connected_at": "now"}
    return _dump(
        [_AsJoinNames(names).visit(statement) for statement in _function(Connection._fields).body[1:]]
    )


def test_join_writes_connect_as_the_list_defines_it() -> None:
    from connlist.core.enforcer import Enforcer

    statements = _function(ConnectionsList.connect).body[1:]  # (no docstring)
    assert ast.unparse(statements[-1]) == "return conn"
    connect = _dump(
        [_AsJoinNames({"self": "connections", "conn": "record"}).visit(s) for s in statements[:-1]]
    )
    # The record's fields, which connect has _fields write, written out in their place.
    call = "_fields(record, client, server, handle, now, id)"
    assert connect.count(call) == 1
    fields = _fields_written()
    # join is given no id: the class's numbering, as for a record given none.
    assert "record.id = next_id() if id is None else id" in fields
    fields = [line.replace("next_id() if id is None else id", "next_id()") for line in fields]
    at = connect.index(call)
    definition = connect[:at] + fields + connect[at + 1 :]
    join = _dump(_function(Enforcer.join).body[1:])
    assert join[0] == "connections = self.connections"
    assert join[1 : 1 + len(definition)] == definition
    # What join does besides, after the record is in the list.
    assert join[1 + len(definition)] == "self.totals.connections += 1"


def test_join_makes_the_record_connect_makes(clock: FakeClock, loop: MockLoop) -> None:
    from connlist.core.enforcer import Enforcer

    enforcer = Enforcer(clock=clock, loop=loop)  # type: ignore[arg-type]
    handle = object()
    joined = enforcer.join(("10.0.0.1", 5), ("10.0.0.2", 80), handle)  # type: ignore[arg-type]
    connections = ConnectionsList(clock=clock)
    made = connections.connect(("10.0.0.1", 5), ("10.0.0.2", 80), handle, id=joined.id)  # type: ignore[arg-type]
    fields, expected = _slots(joined), _slots(made)
    # The same slots written, with the same values, but the links (each list's own).
    assert set(fields) == set(expected)
    assert {name: fields[name] for name in fields if name not in LINKS} == {
        name: expected[name] for name in expected if name not in LINKS
    }
    assert joined.__dict__ == made.__dict__ == {}
    # In all and active, as connect's, and counted alike.
    assert list(enforcer.connections.iter_all()) == [joined] and list(connections.iter_all()) == [made]
    assert enforcer.connections.counts() == connections.counts()
    assert enforcer.totals.connections == 1
    # Numbered as the class numbers a record given no id.
    assert enforcer.join().id + 1 == Connection().id
