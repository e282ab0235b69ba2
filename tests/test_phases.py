"""The phases of a connection's message as named states, and the table of their moves (servers.phases)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connlist.servers import phases
from connlist.servers.phases import (
    BETWEEN,
    BODY,
    FINAL,
    HEADERS,
    MOVES,
    OVERFLOWED,
    REFUSED,
    UPGRADED,
    Phase,
    PhaseError,
    move,
)

ALLOWED = sorted((current, new) for current, allowed in MOVES.items() for new in allowed)
REFUSED_MOVES = sorted(set(itertools.product(Phase, repeat=2)) - set(ALLOWED))


def test_the_phases_are_named_and_compare_as_the_protocols_compare_them() -> None:
    # The protocols test ``if phase:``, ``phase < UPGRADED``, ``phase >= UPGRADED`` and ``phase != BETWEEN``.
    assert list(Phase) == [BETWEEN, HEADERS, BODY, UPGRADED, REFUSED, OVERFLOWED] == list(range(6))
    assert [phase for phase in Phase if not phase] == [BETWEEN]
    assert {phase for phase in Phase if phase >= UPGRADED} == FINAL
    assert repr(HEADERS) == "<Phase.HEADERS: 1>"
    # One name per meaning; the old one is an alias while code still imports it.
    assert REFUSED.name == "REFUSED"


@pytest.mark.parametrize(("current", "new"), ALLOWED)
def test_every_move_the_table_holds_is_accepted(current: Phase, new: Phase) -> None:
    assert move(current, new) is new


@pytest.mark.parametrize(("current", "new"), REFUSED_MOVES)
def test_every_other_move_raises_naming_both_phases(current: Phase, new: Phase) -> None:
    with pytest.raises(PhaseError, match=f"no move from {current.name} to {new.name} "):
        move(current, new)


def test_the_table_holds_the_moves_the_protocols_make() -> None:
    http = {BETWEEN, HEADERS, BODY}
    # The read path settles anywhere in HTTP, itself included, and an upgrade is handed over or refused
    # from any of them; only a head overflows.
    for phase in http:
        assert http | {UPGRADED, REFUSED} <= MOVES[phase]
    assert [phase for phase in Phase if OVERFLOWED in MOVES[phase]] == [HEADERS]
    # gunicorn's: marked upgraded before the enforcer rules (then maybe refused), and h2c marked twice.
    assert MOVES[UPGRADED] == {UPGRADED, REFUSED}


def test_the_final_phases_never_move_back_to_http_and_the_ends_move_nowhere() -> None:
    for phase in FINAL:
        assert not MOVES[phase] & {BETWEEN, HEADERS, BODY}, phase
    for phase in (REFUSED, OVERFLOWED):
        assert MOVES[phase] == frozenset()
        with pytest.raises(PhaseError, match=f"from {phase.name}: nowhere"):
            move(phase, phase)


def test_what_is_not_a_phase_is_named_as_it_is() -> None:
    with pytest.raises(PhaseError, match="no move from 7 to BETWEEN"):
        move(7, BETWEEN)
    with pytest.raises(PhaseError, match="no move from BETWEEN to 'body'"):
        move(BETWEEN, "body")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "rows", "message"),
    [
        (OVERFLOWED, None, "one row per phase"),
        (UPGRADED, frozenset({BETWEEN}), "UPGRADED is final, yet moves back"),
        (REFUSED, frozenset({REFUSED}), "REFUSED and OVERFLOWED end HTTP"),
    ],
)
def test_the_import_check_refuses_a_bad_table(
    monkeypatch: pytest.MonkeyPatch, row: Phase, rows: frozenset[int] | None, message: str
) -> None:
    table = dict(MOVES)
    if rows is None:
        del table[row]
    else:
        table[row] = rows
    monkeypatch.setattr(phases, "MOVES", table)
    with pytest.raises(AssertionError, match=message):
        phases._check()


@given(st.lists(st.sampled_from(list(Phase)), max_size=40))
def test_random_walks_through_the_table_keep_its_invariants(steps: list[Phase]) -> None:
    # A connection starts at BETWEEN (no move); each step is tried, and taken only if the table allows it.
    current: int = BETWEEN
    ended = False
    for new in steps:
        if new in MOVES[current]:
            previous, current = current, move(current, new)
            if current == OVERFLOWED:
                assert previous == HEADERS  # only a head overflows
        else:
            with pytest.raises(PhaseError):
                move(current, new)
        # Once HTTP is over, it stays over; the ends admit nothing more.
        if ended:
            assert current in FINAL
        ended = current in FINAL
        assert (current >= UPGRADED) == ended and bool(current) == (current != BETWEEN)
        if current in (REFUSED, OVERFLOWED):
            assert not MOVES[current]
