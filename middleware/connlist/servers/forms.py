"""A server's method as connlist compares it with the forms it knows: its syntax tree, without names.

Where connlist writes out a server's method (uvicorn's ``on_response_complete``,
``connlist.servers.uvicorn.keepalive``; gunicorn's ``data_received``,
``connlist.servers.gunicorn.reads``), it takes its copy only for a server
whose method is, statement for statement, the one the copy was made from.
Comments, docstrings, annotations and the function's name are not
statements: a release that changes only those keeps the copy.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["canonical", "source_tree", "statements"]


def source_tree(function: Callable[..., Any]) -> ast.FunctionDef:
    """The syntax tree of ``function``'s source (OSError: no source; TypeError: not a Python function)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    if not isinstance(node, ast.FunctionDef):  # pragma: no cover - a method is a def
        raise TypeError(f"{function!r} is not a function")
    return node


def canonical(node: ast.FunctionDef) -> str:
    """The function's body and arguments: no name, annotations, docstring or comments (ast drops them)."""
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
        arg.annotation = None
    return ast.dump(ast.Module(body=statements(node), type_ignores=[])) + ast.dump(node.args)


def statements(node: ast.FunctionDef) -> list[ast.stmt]:
    """A function's statements, without its docstring."""
    body = node.body
    if body and isinstance(body[0], ast.Expr):
        first = body[0].value
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return body[1:]
    return body
