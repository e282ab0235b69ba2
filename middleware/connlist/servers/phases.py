"""Where the message being received on a connection stands: a server protocol's ``_connlist_phase``.

Theory of operation, after h11's ``_state.py``: named phases, and the moves between
them as data (``MOVES``), so that a move the table does not hold is a bug ``move`` names::

    BETWEEN     no message open: a new or idle connection
    HEADERS     a message begun, its headers incomplete
    BODY        its headers complete, the message not
    UPGRADED    handed to another protocol (a websocket, HTTP/2)
    REFUSED     an upgrade refused with 503 at max_upgraded: closing
    OVERFLOWED  a head past max_header_size, answered 431: closing

The last three are final: HTTP is over, and nothing moves back.  A read (or a finished
response) settles anywhere in HTTP, an upgrade leaves from any of its phases, only a head
overflows; gunicorn marks an upgrade before its enforcer rules on it, and h2c twice, so
``UPGRADED`` moves to itself and to ``REFUSED``.  ``Phase`` is an ``IntEnum`` as the read
paths test phases as ints: only ``BETWEEN`` is false, and ``>= UPGRADED`` is final.
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


# Typed as the slot that holds them (``Tracking._connlist_phase: int``).
BETWEEN: int = Phase.BETWEEN
HEADERS: int = Phase.HEADERS
BODY: int = Phase.BODY
UPGRADED: int = Phase.UPGRADED
REFUSED: int = Phase.REFUSED
OVERFLOWED: int = Phase.OVERFLOWED

_HTTP = frozenset({BETWEEN, HEADERS, BODY})
FINAL = frozenset({UPGRADED, REFUSED, OVERFLOWED})
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
