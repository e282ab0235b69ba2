"""connlist's methods that call uvicorn's, joined with them into one function each.

connlist's mixin methods (``connlist.servers.uvicorn.httptools_impl``,
``h11_impl``) call uvicorn's: at ``connection_made`` uvicorn's first, then
the list's join; at ``connection_lost`` the list's removal, then uvicorn's;
httptools' ``data_received`` between the read's checks before and its
events after.  Each is one Python call more than bare uvicorn makes, per
connection or per read (docs/benchmarks.md, "uvicorn's constructor, and
the calls around uvicorn's methods").  So the class statement joins each
pair (the mixin's ``connlist_joins`` names them) into one function: the
mixin's statements with uvicorn's in place of the call.  Nothing is copied
by hand: the statements are read from both sources when the class is
built, so every statement of uvicorn's is the release's own.

A function is joined only where that is the same as the call:

* both sources can be read, and the mixin's method makes the call once, as
  a statement of its own, with its own parameters (named as uvicorn's);
* a ``return`` in uvicorn's statements, where the mixin's has statements
  after the call, only one that ends them (``_ending`` takes it out, so
  that the mixin's statements run next, as they ran after the call);
* neither has ``yield``, ``await``, ``global``, ``super`` or
  ``__class__``, nor reads a variable of an enclosing function (which a
  function built apart cannot have, or would have otherwise);
* every global name either reads means the same object in both modules (or
  exists in one only): each part reads its own.

Else the mixin's method stays, and calls uvicorn's: the same events, one
call more.  The joined function is compiled from its own text, which
tracebacks show (``linecache``).

uvicorn's statements call some of uvicorn's own methods, of no argument,
as statements of their own (``self._unset_keepalive_if_required()``, at
every read and every close): the mixin names them (``connlist_inlines``),
and the joined function has their statements in place of the call too, as
have connlist's keep-alive form of ``on_response_complete`` and, on
httptools, the list's keep-alive close, uvicorn's handler in place
(``inline``).
A method is written in place only where that is the same as the call: a
Python function of the class's, of ``self`` alone, with no ``return``, no
variable of its own and none of the constructs above.  A subclass that
defines one of them again gets the functions that call it
(``keep_overrides``, from ``__init_subclass__``).
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import linecache
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from connlist.servers.forms import source_tree, statements

__all__ = ["inline", "install", "join", "keep_overrides"]

_numbers = itertools.count(1)
_BUILTIN = object()


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


def _why_not(statements: list[ast.stmt]) -> str | None:
    for node in _nodes(statements):
        # (A global statement would write the joined function's globals, not its module's.)
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
            return f"it has {type(node).__name__.lower()}"
        if isinstance(node, ast.Name) and node.id in ("super", "__class__"):
            return f"it names {node.id}"
    return None


def _returns(statements: list[ast.stmt]) -> bool:
    return any(isinstance(node, ast.Return) for node in _nodes(statements))


def _ending(statements: list[ast.stmt]) -> list[ast.stmt] | None:  # noqa: C901 - one case per statement kind
    """``statements`` less the plain ``return`` that ends the function in them; None if another.

    A ``return`` with no value, last in the statements, or last in a branch
    that ends them (``if``, ``else``, ``with``, a ``try``'s handlers), is the
    end of the function there: taken out, what follows them runs next, as
    it ran after the call.  A ``return`` anywhere else (in a loop, before
    other statements, with a value, in ``finally``) cannot be taken out.
    """
    if not statements:
        return statements
    *head, last = statements
    if _returns(head):
        return None
    if isinstance(last, ast.Return):
        value = last.value
        return head if value is None or (isinstance(value, ast.Constant) and value.value is None) else None
    if isinstance(last, ast.If):
        body, orelse = _ending(last.body), _ending(last.orelse)
        if body is None or orelse is None:
            return None
        last.body, last.orelse = body or [ast.Pass()], orelse
    elif isinstance(last, ast.With):
        body = _ending(last.body)
        if body is None:
            return None
        last.body = body or [ast.Pass()]
    elif isinstance(last, ast.Try):
        if _returns(last.finalbody):
            return None
        if last.orelse:
            if _returns(last.body) or (orelse := _ending(last.orelse)) is None:
                return None
            last.orelse = orelse or [ast.Pass()]
        elif (body := _ending(last.body)) is None:
            return None
        else:
            last.body = body or [ast.Pass()]
        for handler in last.handlers:
            ending = _ending(handler.body)
            if ending is None:
                return None
            handler.body = ending or [ast.Pass()]
    elif _returns([last]):
        return None
    return [*head, last]


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


def _calls(statement: ast.stmt, callee: str, params: list[str]) -> bool:
    """Whether ``statement`` is ``callee(...)`` with the function's own parameters, in order."""
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return False
    call = statement.value
    if ast.unparse(call.func) != callee or call.keywords:
        return False
    names = [arg.id if isinstance(arg, ast.Name) else None for arg in call.args]
    return names in (params, params[1:])  # with self, or on self


class _InPlace(ast.NodeTransformer):
    """Each statement ``receiver.name()`` (``name`` in ``bodies``) replaced by that method's statements."""

    def __init__(self, receiver: str, bodies: Mapping[str, list[ast.stmt]]) -> None:
        self.receiver = receiver
        self.bodies = bodies
        self.written: set[str] = set()

    def visit_Expr(self, statement: ast.Expr) -> Any:
        call = statement.value
        if (
            isinstance(call, ast.Call)
            and not call.args
            and not call.keywords
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == self.receiver
            and call.func.attr in self.bodies
        ):
            self.written.add(call.func.attr)
            return copy.deepcopy(self.bodies[call.func.attr])
        return statement

    # A function defined in the statements runs later, on what its names mean then: left as it is.
    def _kept(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _kept


def _tree(function: Any) -> ast.FunctionDef | None:
    """``function``'s syntax tree, if it is a Python function with a source, no closure and no defaults."""
    if not isinstance(function, types.FunctionType) or function.__code__.co_freevars or function.__defaults__:
        return None
    try:
        return source_tree(function)
    except (OSError, TypeError, SyntaxError):
        return None


def _body(method: Any, receiver: str) -> list[ast.stmt] | None:
    """The statements of ``method`` to write in place of ``receiver.method()``; None where that differs."""
    tree = _tree(method)
    if tree is None:
        return None
    args = tree.args
    if [a.arg for a in args.args] != [receiver] or args.posonlyargs or args.kwonlyargs:
        return None
    if args.vararg or args.kwarg:
        return None
    body = statements(tree)
    # No return (the statements after the call run next), no local (it could be one of the caller's).
    if _why_not(body) is not None or _returns(body) or _stored(body):
        return None
    return body


def _in_place(
    body: list[ast.stmt], receiver: str, methods: Mapping[str, Any]
) -> tuple[list[ast.stmt], list[tuple[list[ast.stmt], Any]]]:
    """``body`` with the calls of ``methods`` that can be written in place written so; and their parts."""
    found = {name: _body(method, receiver) for name, method in methods.items()}
    bodies = {name: body for name, body in found.items() if body is not None}
    if not bodies:
        return body, []
    writer = _InPlace(receiver, bodies)
    module = writer.visit(ast.Module(body=copy.deepcopy(body), type_ignores=[]))
    return module.body, [(bodies[name], methods[name]) for name in sorted(writer.written)]


def _compiled(
    model: Any,
    args: ast.arguments,
    body: list[ast.stmt],
    parts: Iterable[tuple[list[ast.stmt], Any]],
    label: str,
    named: Any = None,
) -> tuple[Callable[..., None] | None, str]:
    """One function of ``body``, each part reading its own module's globals.

    Its name and builtins are ``model``'s; its qualified name, module and
    docstring ``named``'s (``model``'s if None).
    """
    local = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} | _stored(body)
    namespace: dict[str, Any] = {}
    for part, function in parts:
        for name in _globals(part) - local:
            # A name a module does not define is a builtin there.
            value = function.__globals__.get(name, _BUILTIN)
            if namespace.setdefault(name, value) is not value:
                return None, f"the global name {name} means another object in each module"
    namespace = {name: value for name, value in namespace.items() if value is not _BUILTIN}
    namespace["__builtins__"] = model.__globals__.get("__builtins__", __builtins__)
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        arg.annotation = None
    node = ast.FunctionDef(
        name=model.__name__, args=args, body=body, decorator_list=[], returns=None, type_comment=None
    )
    text = ast.unparse(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])))
    filename = f"<connlist {next(_numbers)}: {label}>"
    lines = [line + "\n" for line in text.splitlines()]
    linecache.cache[filename] = (len(text), None, lines, filename)
    exec(compile(text, filename, "exec"), namespace)
    made: Any = namespace[model.__name__]
    named = model if named is None else named
    made.__qualname__ = named.__qualname__
    made.__module__ = named.__module__
    made.__doc__ = named.__doc__
    return made, ""


def join(theirs: Any, ours: Any, callee: str) -> tuple[Callable[..., None] | None, str]:
    """uvicorn's method ``theirs`` in the mixin's ``ours`` in place of its call; or None, and why not.

    ``ours`` calls ``theirs`` as ``callee`` (``self._connlist_base_made``,
    say), once, as one of its own statements, with its own parameters.
    """
    if not isinstance(theirs, types.FunctionType) or not isinstance(ours, types.FunctionType):
        return None, "one of the two is not a Python function"
    if theirs.__code__.co_freevars or ours.__code__.co_freevars:
        return None, "one of the two reads variables of an enclosing function"
    try:
        their_tree, our_tree = source_tree(theirs), source_tree(ours)
    except (OSError, TypeError, SyntaxError) as exc:
        return None, f"a source cannot be read ({exc.__class__.__name__}: {exc})"
    params = [a.arg for a in our_tree.args.args]
    if [a.arg for a in their_tree.args.args] != params or their_tree.args.vararg or their_tree.args.kwarg:
        return None, "the two take their arguments under other names"
    their_body, our_body = statements(their_tree), statements(our_tree)
    at = [i for i, statement in enumerate(our_body) if _calls(statement, callee, params)]
    if len(at) != 1:
        return None, "connlist's method does not call uvicorn's where it should"
    before, after = our_body[: at[0]], our_body[at[0] + 1 :]
    why = _why_not(their_body) or _why_not(our_body)
    if why is not None:
        return None, why
    if after:
        # connlist's statements after the call must run wherever uvicorn's ended.
        ending = _ending(their_body)
        if ending is None:
            return None, "it has return"
        their_body = ending
    function, why = _compiled(
        theirs,
        their_tree.args,
        [*before, *their_body, *after],
        [(their_body, theirs), ([*before, *after], ours)],
        f"uvicorn's {theirs.__qualname__} joined with connlist's",
        named=ours,
    )
    if function is not None:
        function.__defaults__ = theirs.__defaults__
    return function, why


def inline(function: Any, methods: Mapping[str, Any]) -> Callable[..., None] | None:
    """``function`` with the calls of ``methods`` written in place (``_body``); None if none can be.

    ``function`` may be a joined one (its text is in ``linecache``).
    """
    tree = _tree(function)
    if tree is None:
        return None
    body = statements(tree)
    if _why_not(body) is not None or not tree.args.args:
        return None
    body, written = _in_place(body, tree.args.args[0].arg, methods)
    if not written:
        return None
    made_from = function.__code__.co_filename
    if made_from.startswith("<connlist "):
        what = made_from[made_from.index(": ") + 2 : -1]  # a joined function's own description
    else:
        what = f"connlist's {function.__qualname__}"
    label = f"{what}, calls in place"
    compiled, _ = _compiled(function, tree.args, body, [(body, function), *written], label)
    return compiled


def _named(callee: str, cls: type, ours: Any) -> Any:
    """The function ``callee`` names: a class attribute (``self.name``), else a global's attribute."""
    owner, _, name = callee.partition(".")
    holder = cls if owner == "self" else ours.__globals__.get(owner)
    return getattr(holder, name, None)


def install(
    cls: type, joins: Mapping[str, str], inlines: Iterable[str] = (), alone: Iterable[str] = ()
) -> dict[str, str]:
    """Join each method of ``cls`` that ``joins`` names with the one it calls; why not, for the others.

    Before: each name is the mixin's method, which calls uvicorn's as
    ``joins[name]`` says.  After: the joined function where ``join`` makes
    one, else still the mixin's.  In the joined functions, and in the
    methods ``alone`` names, the calls of the methods ``inlines`` names
    are written in place where they can be; the class keeps, for its
    subclasses, the functions that call them (``keep_overrides``).
    """
    # As the class has them: a staticmethod or a classmethod is not a function of ``self``.
    methods = {name: inspect.getattr_static(cls, name, None) for name in inlines}
    not_joined = {}
    for name, callee in joins.items():
        ours = getattr(cls, name)
        function, why = join(_named(callee, cls, ours), ours, callee)
        if function is None:
            not_joined[name] = why
        else:
            setattr(cls, name, function)
    calling: dict[str, Any] = {}
    for name in (*joins, *alone):
        plain = getattr(cls, name)
        function = inline(plain, methods)
        if function is not None:
            calling[name] = plain
            setattr(cls, name, function)
    cls._connlist_in_place = (methods, calling)  # type: ignore[attr-defined]
    return not_joined


def keep_overrides(cls: type) -> None:
    """A subclass that defines a method written in place again: the functions that call it, but its own."""
    methods, calling = getattr(cls, "_connlist_in_place", ({}, {}))
    if any(inspect.getattr_static(cls, name, None) is not method for name, method in methods.items()):
        for name, function in calling.items():
            if name not in cls.__dict__:
                setattr(cls, name, function)
