"""uvicorn's ``connection_made`` and ``connection_lost`` and connlist's, joined into one function each.

connlist's mixin methods (``connlist.servers.uvicorn.httptools_impl``) call
uvicorn's: at ``connection_made`` uvicorn's first, then the list's join; at
``connection_lost`` the list's removal, then uvicorn's.  That call is one
Python call per connection more than bare uvicorn makes, twice
(docs/benchmarks.md, "uvicorn's constructor, and its connection's two
calls").  So the class statement joins the two into one function: uvicorn's
statements and then the mixin's (``connection_made``), or the mixin's and
then uvicorn's (``connection_lost``), without the mixin's call of uvicorn's
method.  Nothing is copied by hand: the statements are read from both
sources when the class is built, so every statement of uvicorn's is the
release's own.

A function is joined only where that is the same as the call:

* both sources can be read, and the mixin's method calls uvicorn's as its
  first statement (``connection_made``) or its last (``connection_lost``);
* uvicorn's statements that run before the mixin's have no ``return`` (the
  mixin's would not run);
* neither has ``yield``, ``await``, ``super`` or ``__class__``, nor reads
  a variable of an enclosing function (which a function built apart
  cannot have);
* every global name either reads means the same object in both modules (or
  exists in one only): each part reads its own.

Else the mixin's method stays, and calls uvicorn's: the same events, one
call more.  The joined function is compiled from its own text, which
tracebacks show (``linecache``).
"""

from __future__ import annotations

import ast
import itertools
import linecache
import types
from collections.abc import Callable
from typing import Any

from connlist.servers.forms import source_tree

__all__ = ["join"]

_FORBIDDEN = (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)
_numbers = itertools.count(1)
_BUILTIN = object()


def _body(node: ast.FunctionDef) -> list[ast.stmt]:
    """A function's statements, without its docstring."""
    body = node.body
    if body and isinstance(body[0], ast.Expr):
        first = body[0].value
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return body[1:]
    return body


def _nodes(statements: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``statements``, but those of functions and classes defined in them."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(statements)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _why_not(statements: list[ast.stmt], first: bool) -> str | None:
    for node in _nodes(statements):
        if isinstance(node, _FORBIDDEN) and (first or not isinstance(node, ast.Return)):
            return f"it has {type(node).__name__.lower()}"
        if isinstance(node, ast.Name) and node.id in ("super", "__class__"):
            return f"it names {node.id}"
    return None


def _globals(statements: list[ast.stmt]) -> set[str]:
    """The names ``statements`` read (the locals among them too)."""
    return {
        node.id
        for node in _nodes(statements)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def _stored(statements: list[ast.stmt]) -> set[str]:
    """The names ``statements`` bind: the function's locals."""
    return {
        node.id
        for node in _nodes(statements)
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)
    }


def join(theirs: Any, ours: Any, *, ours_first: bool) -> tuple[Callable[..., None] | None, str]:
    """uvicorn's method ``theirs`` and the mixin's ``ours`` as one function; or None, and why not.

    ``ours`` calls ``theirs`` as ``self._connlist_base_made(...)`` or
    ``self._connlist_base_lost(...)``: its last statement if ``ours_first``
    (``connection_lost``), else its first.
    """
    if not isinstance(theirs, types.FunctionType) or not isinstance(ours, types.FunctionType):
        return None, "one of the two is not a Python function"
    if theirs.__code__.co_freevars or ours.__code__.co_freevars:
        return None, "one of the two reads variables of an enclosing function"
    try:
        their_tree, our_tree = source_tree(theirs), source_tree(ours)
    except (OSError, TypeError, SyntaxError) as exc:
        return None, f"a source cannot be read ({exc.__class__.__name__}: {exc})"
    their_body, our_body = _body(their_tree), _body(our_tree)
    call = our_body[-1] if ours_first else our_body[0]
    if not (
        isinstance(call, ast.Expr)
        and isinstance(call.value, ast.Call)
        and ast.unparse(call.value.func) in ("self._connlist_base_made", "self._connlist_base_lost")
    ):
        return None, "connlist's method does not call uvicorn's where it should"
    our_body = our_body[:-1] if ours_first else our_body[1:]
    why = _why_not(their_body, first=not ours_first) or _why_not(our_body, first=ours_first)
    if why is not None:
        return None, why
    # The two parts' arguments are named alike (self, and uvicorn's argument).
    if [a.arg for a in their_tree.args.args] != [a.arg for a in our_tree.args.args]:
        return None, "the two take their arguments under other names"
    local = {a.arg for a in (*their_tree.args.args, *their_tree.args.kwonlyargs)} | _stored(
        [*their_body, *our_body]
    )
    namespace: dict[str, Any] = {}
    for part, function in ((their_body, theirs), (our_body, ours)):
        for name in _globals(part) - local:
            # A name a module does not define is a builtin there.
            value = function.__globals__.get(name, _BUILTIN)
            if namespace.setdefault(name, value) is not value:
                return None, f"the global name {name} means another object in each module"
    namespace = {name: value for name, value in namespace.items() if value is not _BUILTIN}
    namespace["__builtins__"] = theirs.__globals__.get("__builtins__", __builtins__)
    args = their_tree.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        arg.annotation = None
    node = ast.FunctionDef(
        name=theirs.__name__,
        args=args,
        body=[*our_body, *their_body] if ours_first else [*their_body, *our_body],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    text = ast.unparse(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])))
    filename = f"<connlist {next(_numbers)}: uvicorn's {theirs.__qualname__} joined with connlist's>"
    lines = [line + "\n" for line in text.splitlines()]
    linecache.cache[filename] = (len(text), None, lines, filename)
    exec(compile(text, filename, "exec"), namespace)
    function = namespace[theirs.__name__]
    function.__qualname__ = ours.__qualname__
    function.__module__ = ours.__module__
    function.__doc__ = ours.__doc__
    function.__defaults__ = theirs.__defaults__
    return function, ""


def methods(base: type, mixin: type) -> tuple[Callable[..., None], Callable[..., None]]:
    """The ``connection_made`` and ``connection_lost`` on uvicorn's ``base``: joined or the mixin's."""
    made, _ = join(getattr(base, "connection_made", None), mixin.connection_made, ours_first=False)  # type: ignore[attr-defined]
    lost, _ = join(getattr(base, "connection_lost", None), mixin.connection_lost, ours_first=True)  # type: ignore[attr-defined]
    return made or mixin.connection_made, lost or mixin.connection_lost  # type: ignore[attr-defined]
