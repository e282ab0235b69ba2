"""Where the message being received on a connection stands: a server protocol's ``_connlist_phase``.

Theory of operation
-------------------

A server protocol of connlist's keeps one phase per connection, as h11 keeps
a state per party (``h11/_state.py``): named states, and the moves between
them as data (``MOVES``), so that a move the table does not hold is a bug
that ``move`` names at once.  The phase says which of the list's HTTP
events can still come, and so what a read must replay::

    BETWEEN     no message open: a new or idle connection
    HEADERS     a message begun, its headers incomplete
    BODY        its headers complete, the message not
    UPGRADED    handed to another protocol (a websocket, HTTP/2): no HTTP event follows
    REFUSED     an upgrade refused with 503 at max_upgraded: closing, no HTTP event follows
    OVERFLOWED  a head past max_header_size, answered 431: closing, no HTTP event follows

The first three are HTTP's; the other three are *final*: HTTP is over on
the connection, and nothing moves it back.  ``REFUSED`` and ``OVERFLOWED``
end it: no move leaves them.

The phases are ordered ints (``enum.IntEnum``) because the protocols'
read paths test them as ints, once or twice a read: ``BETWEEN`` is the one
false phase (``if phase:``, a message is open or HTTP is over), and
``phase >= UPGRADED`` (or ``< UPGRADED``) tells the final phases from
HTTP's.  An ``IntEnum`` member compares as its int, at an int's cost.

The moves, and who makes them (``MOVES`` is the table):

* After each read, or a finished response, the protocol replays the list's
  events and settles where the read left the message
  (``seam.Tracking._connlist_settle``): from any HTTP phase to any, itself
  included (a read inside a head, or a whole request at rest).
* An upgrade handed over (uvicorn's ``websocket.hand_over``, gunicorn's
  ``_handle_websocket`` and ``_connlist_untimed``) moves an HTTP phase to
  ``UPGRADED``; one refused, to ``REFUSED``.  The handshake can come at
  rest, in a head, or behind a body that ended in the same read.
* A head that passed ``max_header_size`` (``heads.HeadBound._connlist_overflow``)
  moves ``HEADERS`` to ``OVERFLOWED``: only a head can overflow.
* gunicorn's protocol marks a connection ``UPGRADED`` before its enforcer
  rules on the websocket, then ``REFUSED`` if it refuses, and marks one
  upgraded to HTTP/2 (h2c) twice, when the request is read and when it is
  handed over: ``UPGRADED`` moves to itself and to ``REFUSED``, never back
  to HTTP's.

A connection starts at ``BETWEEN`` (``Tracking._connlist_setup``): that is
no move.
"""

from __future__ import annotations

import enum

__all__ = [
    "BETWEEN",
    "BODY",
    "FINAL",
    "HEADERS",
    "MOVES",
    "OVERFLOWED",
    "REFUSED",
    "UPGRADED",
    "Phase",
    "PhaseError",
    "move",
]


class Phase(enum.IntEnum):
    """One connection's phase (module docstring); ordered, and false only for ``BETWEEN``."""

    BETWEEN = 0
    HEADERS = 1
    BODY = 2
    UPGRADED = 3
    REFUSED = 4
    OVERFLOWED = 5


# The members, by the names the protocols import; typed as the slot that holds them
# (``Tracking._connlist_phase: int``), which the protocols' helpers return.
BETWEEN: int = Phase.BETWEEN
HEADERS: int = Phase.HEADERS
BODY: int = Phase.BODY
UPGRADED: int = Phase.UPGRADED
REFUSED: int = Phase.REFUSED
OVERFLOWED: int = Phase.OVERFLOWED


_HTTP = frozenset({BETWEEN, HEADERS, BODY})
# HTTP is over: no move leads from these back to HTTP's phases.
FINAL = frozenset({UPGRADED, REFUSED, OVERFLOWED})

# Each phase, and the phases it may move to (the module docstring says who moves).
MOVES: dict[int, frozenset[int]] = {
    BETWEEN: _HTTP | {UPGRADED, REFUSED},
    HEADERS: _HTTP | {UPGRADED, REFUSED, OVERFLOWED},
    BODY: _HTTP | {UPGRADED, REFUSED},
    UPGRADED: frozenset({UPGRADED, REFUSED}),
    REFUSED: frozenset(),
    OVERFLOWED: frozenset(),
}


class PhaseError(RuntimeError):
    """A move between two phases that ``MOVES`` does not allow."""


def _name(phase: object) -> str:
    try:
        return Phase(phase).name  # type: ignore[arg-type]  # (what is not a phase is named as it is)
    except ValueError:
        return repr(phase)


def move(current: int, new: int) -> int:
    """``new``, if ``MOVES`` lets ``current`` move there; else ``PhaseError``, naming both."""
    allowed = MOVES.get(current)
    if allowed is None or new not in allowed:
        to = ", ".join(_name(phase) for phase in sorted(allowed)) if allowed else "nowhere"
        raise PhaseError(f"no move from {_name(current)} to {_name(new)} (from {_name(current)}: {to})")
    return new


def _check() -> None:
    """The table's own rules, at import: a row per phase, and HTTP never follows a final phase."""
    if set(MOVES) != set(Phase) or set(Phase) - _HTTP != FINAL:
        raise AssertionError("phases.MOVES needs one row per phase")
    for phase, allowed in MOVES.items():
        if phase in FINAL and allowed & _HTTP:
            raise AssertionError(f"phases.MOVES: {_name(phase)} is final, yet moves back to HTTP's phases")
    if MOVES[REFUSED] or MOVES[OVERFLOWED]:
        raise AssertionError("phases.MOVES: REFUSED and OVERFLOWED end HTTP and move nowhere")


_check()
