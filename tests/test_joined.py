"""uvicorn's methods joined with connlist's, and calls written in place (``servers.uvicorn.joined``).

On the installed uvicorn both parsers' classes run one function each: its
statements are uvicorn's and the mixin's, in the mixin's order.  Where
joining would not be the same as the call (an early ``return``, ``super``,
a global name that means two things, arguments named otherwise, no
source), the class keeps the mixin's method, and the self-check passes on
it.  uvicorn's calls of ``_unset_keepalive_if_required`` have its
statements in place, but in a subclass that defines it again.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import logging
import textwrap
import types
from typing import Any

import pytest
from uvicorn.protocols.http import h11_impl, httptools_impl

from connlist.servers.forms import statements
from connlist.servers.uvicorn import classes as uvicorn_classes
from connlist.servers.uvicorn import joined, keepalive
from connlist.servers.uvicorn import protocols as uvicorn_protocols
from connlist.servers.uvicorn import selfcheck as uvicorn_selfcheck
from connlist.servers.uvicorn.cycle import UvicornCycle
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking

BASES = {"httptools": httptools_impl.HttpToolsProtocol, "h11": h11_impl.H11Protocol}
MIXINS = {"httptools": HttpToolsTracking, "h11": H11Tracking}
MADE, LOST = "self._connlist_base_made", "self._connlist_base_lost"


def _statements(function: Any) -> list[str]:
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(node, ast.FunctionDef)
    return [ast.unparse(statement) for statement in statements(node)]


def _joined_statements(function: Any) -> list[str]:
    text = "".join(linecache.getlines(function.__code__.co_filename))
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.FunctionDef)
    return [ast.unparse(statement) for statement in node.body]


def _in_place(ours: list[str], callee: str, theirs: list[str]) -> list[str]:
    """``ours`` with its call of ``callee`` replaced by ``theirs``."""
    at = [i for i, line in enumerate(ours) if line.startswith(callee + "(")]
    assert len(at) == 1, ours
    return ours[: at[0]] + theirs + ours[at[0] + 1 :]


UNSET = "self._unset_keepalive_if_required()"


def _unset_written(statements: list[str], base: type) -> list[str]:
    """``statements`` with each line that is uvicorn's ``_unset_keepalive_if_required()`` call its body."""
    body = _statements(base._unset_keepalive_if_required)
    lines = "\n".join(statements).split("\n")
    assert any(line.strip() == UNSET for line in lines)
    out = []
    for line in lines:
        if line.strip() == UNSET:
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + written for written in "\n".join(body).split("\n"))
        else:
            out.append(line)
    return [ast.unparse(node) for node in ast.parse("\n".join(out)).body]


@pytest.mark.parametrize("parser", list(BASES))
def test_the_installed_uvicorns_methods_are_joined(parser: str) -> None:
    base, mixin = BASES[parser], MIXINS[parser]
    cls = uvicorn_classes.PARSERS[parser].build(base)
    assert cls.connlist_not_joined == {}
    assert set(mixin.connlist_joins) >= {"connection_made", "connection_lost"}
    for name, callee in mixin.connlist_joins.items():
        function, ours = getattr(cls, name), getattr(mixin, name)
        assert function is not ours and function.__code__.co_filename.startswith("<connlist "), name
        assert function.__qualname__ == ours.__qualname__
        theirs = _statements(getattr(base, name))
        if name == "data_received":
            # The parse error's return, last in its handler, is the end of uvicorn's statements.
            assert "\n    return\n" in theirs[1]
            theirs[1] = theirs[1].replace("\n    return\n", "\n")
        if name != "connection_made":
            # uvicorn's call of _unset_keepalive_if_required, its statements in place (connlist_inlines).
            theirs = _unset_written(theirs, base)
        assert _joined_statements(function) == _in_place(_statements(ours), callee, theirs), name
    assert uvicorn_selfcheck.run_in_thread(cls, base, parser).passed


@pytest.mark.parametrize(
    ("parser", "name"), [("httptools", "on_response_complete"), ("h11", "_connlist_response_end")]
)
def test_the_keepalive_form_has_uvicorns_call_in_place(parser: str, name: str) -> None:
    base = BASES[parser]
    cls = uvicorn_classes.PARSERS[parser].build(base)
    assert cls.connlist_keepalive
    form = keepalive.form(parser, base).method
    function = getattr(cls, name)
    assert function is not form and function.__code__.co_filename.startswith("<connlist ")
    assert _joined_statements(function) == _unset_written(_statements(form), base)


def test_the_lists_keepalive_close_has_uvicorns_handler_in_place_on_httptools() -> None:
    """A mass close makes thousands: on httptools no call between the list's close and uvicorn's handler."""
    base = BASES["httptools"]
    cls = uvicorn_classes.PARSERS["httptools"].build(base)
    assert cls.connlist_keepalive
    function = cls.connlist_close_keepalive
    ours = UvicornCycle.connlist_close_keepalive
    assert function is not ours and function.__code__.co_filename.startswith("<connlist ")
    assert function.__qualname__ == ours.__qualname__
    assert _joined_statements(function) == _in_place(
        _statements(ours), "self.timeout_keep_alive_handler", _statements(base.timeout_keep_alive_handler)
    )
    # h11's handler has a variable of its own: the call stays.
    assert uvicorn_classes.PARSERS["h11"].build(BASES["h11"]).connlist_close_keepalive is ours

    class Transport:
        closed = 0
        unsent = 0

        def is_closing(self) -> bool:
            return self.closed > 0

        def close(self) -> None:
            self.closed += 1

        def get_write_buffer_size(self) -> int:
            return self.unsent

    unsent: list[object] = []
    protocol = types.SimpleNamespace(
        timeout_keep_alive_task=keepalive.TIMED_BY_LIST,
        transport=Transport(),
        _connlist_closed_unsent=lambda: unsent.append(protocol.transport.unsent),
    )
    function(protocol)
    function(protocol)  # closing already: uvicorn's handler closes once
    assert protocol.timeout_keep_alive_task is None and protocol.transport.closed == 1
    # Bytes the client has not taken hold the close: handed to the send timeout.
    assert unsent == []
    protocol.transport.unsent = 100
    function(protocol)
    assert unsent == [100]

    # A subclass with a handler of its own: the close calls it.
    class Sub(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def timeout_keep_alive_handler(self) -> None:
            pass

    assert Sub.connlist_close_keepalive is ours


class _Counting:
    calls = 0

    def _unset_keepalive_if_required(self) -> None:
        _Counting.calls += 1
        super()._unset_keepalive_if_required()  # type: ignore[misc]


@pytest.mark.parametrize("parser", list(BASES))
def test_a_subclass_that_defines_a_method_written_in_place_again_gets_the_calls(parser: str) -> None:
    """A user's subclass of connlist's class, with its own ``_unset_keepalive_if_required``: it is called."""
    cls = uvicorn_classes.PARSERS[parser].build(BASES[parser])
    _, calling = cls._connlist_in_place
    assert "connection_lost" in calling

    class Sub(_Counting, cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

    class SubOwn(Sub):
        __slots__ = ()

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)

    for name, function in calling.items():
        assert getattr(Sub, name) is function, name
    assert SubOwn.__dict__["connection_lost"] is not calling["connection_lost"]
    _Counting.calls = 0
    assert uvicorn_selfcheck.run_in_thread(Sub, BASES[parser], parser).passed
    assert _Counting.calls > 0

    # A subclass that does not define one of them again keeps the functions with the calls in place.
    class Plain(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

    for name, function in calling.items():
        assert getattr(Plain, name) is getattr(cls, name) is not function, name


def _returns_early(self: Any) -> None:
    if self.x:
        return
    self.y = 1


def _with_a_local(self: Any) -> None:
    y = self.x
    self.y = y


def _with_an_argument(self: Any, x: Any) -> None:
    self.y = x


def _calls_them(self: Any) -> None:
    self._returns_early()
    self._with_a_local()
    self._with_an_argument()
    self._not_a_function()
    self._fine()
    self.other._fine()


def _fine(self: Any) -> None:
    self.y = 2


def _with_rest(self: Any, *rest: Any) -> None:
    self.y = rest


def _defines_one(self: Any) -> Any:
    self._fine()

    def later() -> None:
        self._fine()  # runs later, on what the name means then: left as a call

    return later


def _yields(self: Any) -> Any:
    self._fine()
    yield


def test_where_nothing_can_be_written_in_place_the_function_stays() -> None:
    assert joined.inline(_defines_one, {"_fine": _fine}) is not None
    assert _joined_statements(joined.inline(_defines_one, {"_fine": _fine})) == [
        "self.y = 2",
        "def later() -> None:\n    self._fine()",
        "return later",
    ]
    assert joined.inline(_calls_them, {"_fine": _with_rest}) is None  # *rest: not self alone
    assert joined.inline(eval("lambda self: self._fine()"), {"_fine": _fine}) is None  # no source
    assert joined.inline(_yields, {"_fine": _fine}) is None  # a generator
    assert joined.inline(_fine, {"_fine": _fine}) is None  # no call of it

    class Holder:
        def m(self) -> None:
            self.y = 1

    # A method named to be written in place of nothing: the class keeps it, and no function calls it.
    joined.install(Holder, {}, ("_fine",), ("m",))
    assert Holder.m.__code__.co_filename == __file__
    assert Holder._connlist_in_place == ({"_fine": None}, {})  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("methods", "written"),
    [
        ({"_returns_early": _returns_early}, False),
        ({"_with_a_local": _with_a_local}, False),
        ({"_with_an_argument": _with_an_argument}, False),
        ({"_not_a_function": len}, False),
        ({"_not_a_function": staticmethod(_fine)}, False),  # as the class has it: not a function of self
        ({"_not_a_function": eval("lambda self: None")}, False),  # no source to read
        ({"_fine": _fine}, True),
    ],
)
def test_only_a_method_of_self_alone_with_no_return_or_local_is_written_in_place(
    methods: dict[str, Any], written: bool
) -> None:
    function = joined.inline(_calls_them, methods)
    assert joined.inline(len, methods) is None
    if not written:
        assert function is None
        return
    assert function is not None
    assert _joined_statements(function) == [
        "self._returns_early()",
        "self._with_a_local()",
        "self._with_an_argument()",
        "self._not_a_function()",
        "self.y = 2",
        "self.other._fine()",  # another object's: not self's method
    ]


class _Returns(httptools_impl.HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        if transport is None:
            return
        httptools_impl.HttpToolsProtocol.connection_made(self, transport)


class _Super(httptools_impl.HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)


class _Renamed(httptools_impl.HttpToolsProtocol):
    def connection_made(self, tr: Any) -> None:  # type: ignore[override]
        httptools_impl.HttpToolsProtocol.connection_made(self, tr)


# A global of this module that connlist's mixin also reads, as another object.
_STATE_KEY = "another key"


class _Conflicting(httptools_impl.HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        httptools_impl.HttpToolsProtocol.connection_made(self, transport)
        assert _STATE_KEY == "another key"


@pytest.mark.parametrize(
    ("base", "why"),
    [
        (_Returns, "it has return"),
        (_Super, "one of the two reads variables of an enclosing function"),  # (its __class__ cell)
        (_Renamed, "the two take their arguments under other names"),
        (_Conflicting, "the global name _STATE_KEY means another object in each module"),
    ],
)
def test_where_joining_is_not_the_call_the_mixins_method_stays(
    base: type, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    function, reason = joined.join(base.connection_made, HttpToolsTracking.connection_made, MADE)
    assert (function, reason) == (None, why)
    cls = uvicorn_classes.PARSERS["httptools"].build(base)
    assert cls.connection_made is HttpToolsTracking.connection_made
    # Said, once per method, where the class is checked (connlist.servers.uvicorn.protocols).
    assert cls.connlist_not_joined == {"connection_made": why}
    caplog.set_level(logging.INFO, logger="connlist")
    uvicorn_protocols._say_not_joined(cls, "httptools")
    said = [r.getMessage() for r in caplog.records if r.name.startswith("connlist")]
    assert (
        len(said) == 1
        and f"HttpToolsProtocol.connection_made is not joined with connlist's: {why};" in said[0]
    )
    # The lost side is still uvicorn's own method, joined.
    assert cls.connection_lost.__code__.co_filename.startswith("<connlist ")
    assert uvicorn_selfcheck.run_in_thread(cls, base, "httptools").passed


def test_a_return_after_connlists_statements_is_joined() -> None:
    class LostReturns(httptools_impl.HttpToolsProtocol):
        def connection_lost(self, exc: Exception | None) -> None:
            if exc is not None:
                return
            httptools_impl.HttpToolsProtocol.connection_lost(self, exc)

    function, why = joined.join(LostReturns.connection_lost, HttpToolsTracking.connection_lost, LOST)
    assert function is not None and why == ""


def _names_super(self: Any, transport: Any) -> None:
    # (Outside a class: no __class__ cell, the name alone.)
    super(httptools_impl.HttpToolsProtocol, self).connection_made(transport)  # type: ignore[misc]


def test_a_function_naming_super_is_not_joined() -> None:
    assert joined.join(_names_super, HttpToolsTracking.connection_made, MADE) == (
        None,
        "it names super",
    )


_COUNT = 0


def _writes_a_global(self: Any, transport: Any) -> None:
    global _COUNT
    _COUNT += 1


def test_a_global_statement_is_not_joined() -> None:
    assert joined.join(_writes_a_global, HttpToolsTracking.connection_made, MADE) == (None, "it has global")


def test_a_closure_is_not_joined() -> None:
    base = httptools_impl.HttpToolsProtocol

    def connection_made(self: Any, transport: Any) -> None:
        base.connection_made(self, transport)

    assert joined.join(connection_made, HttpToolsTracking.connection_made, MADE) == (
        None,
        "one of the two reads variables of an enclosing function",
    )


def test_no_source_or_no_function_is_not_joined() -> None:
    no_source = eval("lambda self, transport: None")
    assert joined.join(no_source, HttpToolsTracking.connection_made, MADE)[0] is None
    assert joined.join(len, HttpToolsTracking.connection_made, MADE) == (
        None,
        "one of the two is not a Python function",
    )

    def no_call(self: Any, transport: Any) -> None:
        self.x = transport

    assert joined.join(httptools_impl.HttpToolsProtocol.connection_made, no_call, MADE) == (
        None,
        "connlist's method does not call uvicorn's where it should",
    )


def _ending(source: str) -> str | None:
    node = ast.parse(textwrap.dedent(source))
    ending = joined._ending(node.body)
    return None if ending is None else ast.unparse(ast.Module(body=ending, type_ignores=[]))


@pytest.mark.parametrize(
    ("source", "ending"),
    [
        ("a()\nreturn", "a()"),
        ("a()\nreturn None", "a()"),
        ("if x:\n    return\nelse:\n    b()", "if x:\n    pass\nelse:\n    b()"),
        ("try:\n    a()\nexcept E:\n    b()\n    return", "try:\n    a()\nexcept E:\n    b()"),
        ("with c:\n    a()\n    return", "with c:\n    a()"),
        (
            "try:\n    a()\nexcept E:\n    pass\nelse:\n    return",
            "try:\n    a()\nexcept E:\n    pass\nelse:\n    pass",
        ),
        ("def f():\n    return 1", "def f():\n    return 1"),  # a function of its own: its return is its
        ("return 1", None),  # a value
        ("if x:\n    return\nb()", None),  # not last
        ("for i in x:\n    return", None),  # in a loop
        ("try:\n    a()\nfinally:\n    return", None),
        ("try:\n    return\nexcept E:\n    pass\nelse:\n    b()", None),  # before the else
        ("if x:\n    return 1", None),  # a value, in a branch
        ("with c:\n    return 1", None),
        ("try:\n    return 1\nexcept E:\n    pass", None),
        ("try:\n    a()\nexcept E:\n    return 1", None),
    ],
)
def test_only_a_return_that_ends_uvicorns_statements_is_taken_out(source: str, ending: str | None) -> None:
    assert _ending(source) == ending


def test_a_docstring_is_not_a_statement() -> None:
    def documented(self: Any, transport: Any) -> None:
        """Said once."""
        self.transport = transport

    assert _statements(documented) == ["self.transport = transport"]


@pytest.mark.parametrize("parser", list(BASES))
def test_the_mixins_own_methods_pass_the_self_check_too(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What runs where joining is refused: the mixin's methods, which call uvicorn's."""
    mixin = MIXINS[parser]
    monkeypatch.setattr(mixin, "connlist_joins", {})
    cls = uvicorn_classes.PARSERS[parser].build(BASES[parser])
    for name in ("connection_made", "connection_lost", "data_received"):
        assert getattr(cls, name) is getattr(mixin, name)
    assert uvicorn_selfcheck.run_in_thread(cls, BASES[parser], parser).passed
