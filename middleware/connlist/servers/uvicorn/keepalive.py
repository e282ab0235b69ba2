"""uvicorn's keep-alive timeout, timed by connlist's list instead of by a timer per response.

uvicorn's protocols arm a timer at the end of every response that leaves a
connection idle (``on_response_complete``: ``self.timeout_keep_alive_task =
self.loop.call_later(self.timeout_keep_alive,
self.timeout_keep_alive_handler)``), and cancel it at the next read
(``data_received``, through ``_unset_keepalive_if_required``).  So every
keep-alive request allocates a timer handle, pushes it on the loop's heap
and cancels it.  connlist's list already orders its idle connections, and
one timer per worker already sweeps them (``connlist.core.sweep``, its
``keepalive`` step), so connlist's protocols run uvicorn's
``on_response_complete`` with that one statement replaced:

* the list's ``response_complete``, written out (a call there costs more
  than the event), notes when the connection went idle (``responded_at``,
  a reading of the enforcer's clock), and the sweep closes it once it has
  been idle ``timeout_keep_alive`` seconds, through uvicorn's own
  ``timeout_keep_alive_handler``: the same close, at the same time;
* ``timeout_keep_alive_task`` holds ``TIMED_BY_LIST``, so what uvicorn reads
  there (armed or not) stays true, and its cancel, at the next read, costs
  nothing: a request that arrives ends the idle time by itself;
* with ``--timeout-keep-alive 0`` (close at the next loop iteration) uvicorn
  arms its timer as before: there is nothing to save.

The replacements below are uvicorn's methods as uvicorn writes them, one per
form its releases have had, with that statement in an ``if``.  The httptools
ones also write what connlist's protocol wrote after uvicorn's method (the
record no longer ``responding``), so that a response's end is one call, not
two (docs/benchmarks.md, "The keep-alive timer in the list"); and where the
response's end finds the transport closed with bytes unsent (uvicorn closes
it after a ``Connection: close`` response), all of them hand it to the send
timeout (``_connlist_closed_unsent``).  Those statements name ``_connlist``
attributes.  Each replacement is taken only
for a uvicorn whose method is the same but for these statements
(``replacement`` compares the two syntax trees); any other uvicorn keeps its
own method and its timer, and connlist says so in one WARNING line
(``connlist.servers.uvicorn.protocols``).  ``form`` is that rule; each class
statement of ``connlist.servers.uvicorn.classes`` names its outcome.  The
self-check then drives the class (``connlist.servers.uvicorn.selfcheck``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any, NamedTuple

from connlist.servers.forms import canonical, source_tree

try:
    import h11
except ImportError:  # pragma: no cover - uvicorn requires h11
    h11 = None  # type: ignore[assignment]

__all__ = ["FORMS", "TIMED_BY_LIST", "Form", "form", "replacement"]


class _TimedByList:
    """``timeout_keep_alive_task`` while the list times the connection's keep-alive."""

    __slots__ = ()

    def cancel(self) -> None:
        """Nothing to cancel: the list sees the next request end the idle time."""

    def __repr__(self) -> str:
        return "<keep-alive timed by connlist's list>"


TIMED_BY_LIST = _TimedByList()


# -- the replacements: uvicorn's methods, the keep-alive statement in an ``if`` ----------


def _httptools(self: Any) -> None:  # uvicorn 0.45 and later
    # Callback for pipelined HTTP requests to be started.
    self.server_state.total_requests += 1

    if self.transport.is_closing():
        self._connlist_record.responding = False
        self._connlist_closed_unsent()
        return

    self._unset_keepalive_if_required()

    # Unpause data reads if needed.
    self.flow.resume_reading()

    # Unblock any pipelined events. If there are none, arm the
    # Keep-Alive timeout instead.
    if self.pipeline:
        cycle, app = self.pipeline.pop()
        self._start_asgi_task(cycle, app)
        # The read held behind this response, if any, is offered again (a test, not a call, per response).
        self._connlist_unread is None or self._connlist_release()
    else:
        self._connlist_record.responding = False
        if self.timeout_keep_alive > 0:
            self.timeout_keep_alive_task = TIMED_BY_LIST
            enforcer = self._connlist
            record = self._connlist_record
            # ConnectionsList.response_complete, written out (its first
            # statement above); tests/test_event_copies.py holds it to it.
            record.responded_at = idle_at = enforcer.clock()
            if (
                record._idle_entry is None
                and record.last_message_start == 0.0
                and record._all_next is not None
            ):
                enforcer.connections.idle_queue.push(record, idle_at)
            if idle_at + self.timeout_keep_alive < enforcer.timer_at:
                enforcer.wake_by(idle_at + self.timeout_keep_alive)
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
        self._connlist_unread is None or self._connlist_release()


def _httptools_create_task(self: Any) -> None:  # uvicorn 0.36 to 0.44
    # Callback for pipelined HTTP requests to be started.
    self.server_state.total_requests += 1

    if self.transport.is_closing():
        self._connlist_record.responding = False
        self._connlist_closed_unsent()
        return

    self._unset_keepalive_if_required()

    # Unpause data reads if needed.
    self.flow.resume_reading()

    # Unblock any pipelined events. If there are none, arm the
    # Keep-Alive timeout instead.
    if self.pipeline:
        cycle, app = self.pipeline.pop()
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._connlist_unread is None or self._connlist_release()
    else:
        self._connlist_record.responding = False
        if self.timeout_keep_alive > 0:
            self.timeout_keep_alive_task = TIMED_BY_LIST
            enforcer = self._connlist
            record = self._connlist_record
            # ConnectionsList.response_complete, written out (its first
            # statement above); tests/test_event_copies.py holds it to it.
            record.responded_at = idle_at = enforcer.clock()
            if (
                record._idle_entry is None
                and record.last_message_start == 0.0
                and record._all_next is not None
            ):
                enforcer.connections.idle_queue.push(record, idle_at)
            if idle_at + self.timeout_keep_alive < enforcer.timer_at:
                enforcer.wake_by(idle_at + self.timeout_keep_alive)
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
        self._connlist_unread is None or self._connlist_release()


def _h11(self: Any) -> None:
    self.server_state.total_requests += 1

    if self.transport.is_closing():
        self._connlist_closed_unsent()
        return

    # Set a short Keep-Alive timeout.
    self._unset_keepalive_if_required()

    if self.timeout_keep_alive > 0:
        self.timeout_keep_alive_task = TIMED_BY_LIST
        enforcer = self._connlist
        record = self._connlist_record
        # ConnectionsList.response_complete, written out (less ``responding``:
        # the caller writes it, once h11 has let in what it held);
        # tests/test_event_copies.py holds it to the definition.
        record.responded_at = idle_at = enforcer.clock()
        if record._idle_entry is None and record.last_message_start == 0.0 and record._all_next is not None:
            enforcer.connections.idle_queue.push(record, idle_at)
        if idle_at + self.timeout_keep_alive < enforcer.timer_at:
            enforcer.wake_by(idle_at + self.timeout_keep_alive)
    else:
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    # Unpause data reads if needed.
    self.flow.resume_reading()

    # Unblock any pipelined events.
    if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
        self.conn.start_next_cycle()
        self.handle_events()


# Per parser, the forms connlist knows, newest first.
FORMS: dict[str, tuple[Callable[[Any], None], ...]] = {
    "httptools": (_httptools, _httptools_create_task),
    "h11": (_h11,),
}


def _ours(statement: ast.stmt) -> bool:
    """Whether a simple statement is connlist's own: it names a ``_connlist`` attribute or name."""
    return any(
        (isinstance(node, ast.Attribute) and node.attr.startswith("_connlist"))
        or (isinstance(node, ast.Name) and node.id.startswith("_connlist"))
        for node in ast.walk(statement)
    )


def _as_uvicorn(node: ast.FunctionDef) -> ast.FunctionDef:
    """A replacement's tree as uvicorn's would read.

    connlist's own statements (``_ours``) taken out, and the ``if`` around
    the keep-alive statement replaced by its ``else``.
    """

    class Back(ast.NodeTransformer):
        def visit_Assign(self, statement: ast.Assign) -> Any:
            return None if _ours(statement) else statement

        def visit_Expr(self, statement: ast.Expr) -> Any:
            return None if _ours(statement) else statement

        def visit_If(self, branch: ast.If) -> Any:
            self.generic_visit(branch)
            if (
                isinstance(branch.test, ast.Compare)
                and ast.unparse(branch.test) == "self.timeout_keep_alive > 0"
            ):
                return branch.orelse
            return branch

    tree = Back().visit(node)
    return ast.fix_missing_locations(tree)  # type: ignore[no-any-return]


class Form(NamedTuple):
    """What connlist's class runs at the end of a response, and whether the list times the keep-alive."""

    method: Callable[[Any], None]
    # The class's ``connlist_keepalive`` and ``connlist_keepalive_not`` (``connlist.servers.seam.Feeder``).
    timed_by_list: bool
    why_not: str


def form(parser: str, base: type, otherwise: Callable[[Any], None] | None = None) -> Form:
    """The keep-alive form a class built on uvicorn's ``base`` runs: the one rule of the choice.

    Where ``base``'s ``on_response_complete`` is one of the forms connlist
    knows (``replacement``), the replacement, and the list times the
    keep-alive; else ``otherwise`` (uvicorn's own method if None), and
    uvicorn keeps its timer, and why (the WARNING line says it).
    """
    theirs = getattr(base, "on_response_complete", None)
    known, why_not = replacement(parser, theirs)
    if known is not None:
        return Form(known, True, "")
    fallback = otherwise if otherwise is not None else theirs
    if fallback is None:
        raise TypeError(f"{base.__qualname__} has no on_response_complete")
    return Form(fallback, False, why_not)


def replacement(parser: str, method: Callable[..., Any] | None) -> tuple[Callable[[Any], None] | None, str]:
    """The replacement for uvicorn's ``on_response_complete`` (``method``), or None; and why not.

    A replacement is taken only where uvicorn's method is, statement for
    statement, the replacement without connlist's own statements and with
    the keep-alive statement back in place.
    """
    if method is None:
        return None, "uvicorn's protocol has no such method"
    try:
        theirs = canonical(source_tree(method))
    except (OSError, TypeError, SyntaxError) as exc:
        return None, f"its source cannot be read ({exc.__class__.__name__}: {exc})"
    for form in FORMS.get(parser, ()):
        if canonical(_as_uvicorn(source_tree(form))) == theirs:
            return form, ""
    return None, "it is not one of the forms connlist knows"
