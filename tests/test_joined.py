"""uvicorn's ``connection_made`` and ``connection_lost`` joined with connlist's (``servers.uvicorn.joined``).

On the installed uvicorn both parsers' classes run one function each: its
statements are uvicorn's and the mixin's, in the mixin's order.  Where
joining would not be the same as the call (an early ``return``, ``super``,
a global name that means two things, arguments named otherwise, no
source), the class keeps the mixin's method, and the self-check passes on
it.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from typing import Any

import pytest
from uvicorn.protocols.http import h11_impl, httptools_impl

from connlist.servers.uvicorn import classes as uvicorn_classes
from connlist.servers.uvicorn import joined
from connlist.servers.uvicorn import selfcheck as uvicorn_selfcheck
from connlist.servers.uvicorn.h11_impl import H11Tracking
from connlist.servers.uvicorn.httptools_impl import HttpToolsTracking

BASES = {"httptools": httptools_impl.HttpToolsProtocol, "h11": h11_impl.H11Protocol}
MIXINS = {"httptools": HttpToolsTracking, "h11": H11Tracking}


def _statements(function: Any) -> list[str]:
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(node, ast.FunctionDef)
    return [ast.unparse(statement) for statement in joined._body(node)]


def _joined_statements(function: Any) -> list[str]:
    text = "".join(linecache.getlines(function.__code__.co_filename))
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.FunctionDef)
    return [ast.unparse(statement) for statement in node.body]


@pytest.mark.parametrize("parser", list(BASES))
def test_the_installed_uvicorns_methods_are_joined(parser: str) -> None:
    base, mixin = BASES[parser], MIXINS[parser]
    cls = uvicorn_classes.PARSERS[parser].build(base)
    made, lost = cls.connection_made, cls.connection_lost
    assert made is not mixin.connection_made and lost is not mixin.connection_lost
    assert made.__code__.co_filename.startswith("<connlist ")
    # uvicorn's statements, then the mixin's less its call of uvicorn's; the other way round at the loss.
    assert (
        _joined_statements(made) == _statements(base.connection_made) + _statements(mixin.connection_made)[1:]
    )
    assert _joined_statements(lost) == _statements(mixin.connection_lost)[:-1] + _statements(
        base.connection_lost
    )
    assert made.__qualname__ == mixin.connection_made.__qualname__
    assert uvicorn_selfcheck.run_in_thread(cls, base, parser).passed


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
_Pipeline = list


class _Conflicting(httptools_impl.HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        httptools_impl.HttpToolsProtocol.connection_made(self, transport)
        assert _Pipeline is list


@pytest.mark.parametrize(
    ("base", "why"),
    [
        (_Returns, "it has return"),
        (_Super, "one of the two reads variables of an enclosing function"),  # (its __class__ cell)
        (_Renamed, "the two take their arguments under other names"),
        (_Conflicting, "the global name _Pipeline means another object in each module"),
    ],
)
def test_where_joining_is_not_the_call_the_mixins_method_stays(base: type, why: str) -> None:
    function, reason = joined.join(base.connection_made, HttpToolsTracking.connection_made, ours_first=False)
    assert (function, reason) == (None, why)
    cls = uvicorn_classes.PARSERS["httptools"].build(base)
    assert cls.connection_made is HttpToolsTracking.connection_made
    # The lost side is still uvicorn's own method, joined.
    assert cls.connection_lost.__code__.co_filename.startswith("<connlist ")
    assert uvicorn_selfcheck.run_in_thread(cls, base, "httptools").passed


def test_a_return_after_connlists_statements_is_joined() -> None:
    class LostReturns(httptools_impl.HttpToolsProtocol):
        def connection_lost(self, exc: Exception | None) -> None:
            if exc is not None:
                return
            httptools_impl.HttpToolsProtocol.connection_lost(self, exc)

    function, why = joined.join(
        LostReturns.connection_lost, HttpToolsTracking.connection_lost, ours_first=True
    )
    assert function is not None and why == ""


def _names_super(self: Any, transport: Any) -> None:
    # (Outside a class: no __class__ cell, the name alone.)
    super(httptools_impl.HttpToolsProtocol, self).connection_made(transport)  # type: ignore[misc]


def test_a_function_naming_super_is_not_joined() -> None:
    assert joined.join(_names_super, HttpToolsTracking.connection_made, ours_first=False) == (
        None,
        "it names super",
    )


def test_a_closure_is_not_joined() -> None:
    base = httptools_impl.HttpToolsProtocol

    def connection_made(self: Any, transport: Any) -> None:
        base.connection_made(self, transport)

    assert joined.join(connection_made, HttpToolsTracking.connection_made, ours_first=False) == (
        None,
        "one of the two reads variables of an enclosing function",
    )


def test_no_source_or_no_function_is_not_joined() -> None:
    no_source = eval("lambda self, transport: None")
    assert joined.join(no_source, HttpToolsTracking.connection_made, ours_first=False)[0] is None
    assert joined.join(len, HttpToolsTracking.connection_made, ours_first=False) == (
        None,
        "one of the two is not a Python function",
    )

    def no_call(self: Any, transport: Any) -> None:
        self.x = transport

    assert joined.join(httptools_impl.HttpToolsProtocol.connection_made, no_call, ours_first=False) == (
        None,
        "connlist's method does not call uvicorn's where it should",
    )
