"""The enforcer's one timer (``connlist.core.timer``) against its rules, driven at random by hypothesis.

A ``Timer`` whose sweep does what a real sweep's closes may do (arm the
timer from within, by ``watch``, ``bring_forward`` or ``wake_by``), and
finishes or not (carries on), on a ``MockLoop``.  After every step: at
most one of the timer and the carry is armed; the timer, if armed, is for
``timer_at`` and never further than ``Settings.shortest``; and every sweep
takes a finite now, no earlier than the time its timer was armed for.
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from connlist.core.kinds import Settings, resolve
from connlist.core.timer import CARRY_PACE, Timer
from tests.fakes import T0, FakeClock, MockLoop

SHORTEST = 2.0
# What a sweep's closes may do to the timer before the sweep ends.
ARMINGS = ("watch", "bring_forward", "wake_by", "cancel")


class ScriptedTimer(Timer):
    """A timer whose sweeps follow a script: what each arms from within, and whether it finishes."""

    def __init__(self, clock: FakeClock, loop: MockLoop) -> None:
        super().__init__(loop)  # type: ignore[arg-type]
        self.clock = clock
        self.settings: Settings = resolve(headers_timeout=SHORTEST, request_timeout=SHORTEST * 2)
        self.due_in: float | None = 1.0
        self.script: list[tuple[tuple[str, ...], bool]] = []
        # The sweeps' floors, and the clock when each ran.
        self.sweeps: list[tuple[float, float]] = []

    def _next_due(self, now: float) -> float | None:
        return None if self.due_in is None else now + self.due_in

    def _anything_due(self) -> bool:
        return self.due_in is not None

    def _work(self, floor: float, carrying: bool) -> bool:
        self.sweeps.append((floor, self.clock.now))
        armings, finished = self.script.pop(0) if self.script else ((), True)
        for arming in armings:
            if arming == "watch":
                self.watch()
            elif arming == "bring_forward":
                self.bring_forward(self.clock.now + 0.5)
            elif arming == "wake_by":
                self.wake_by(self.clock.now + 0.25)
            else:
                self.cancel()
        return finished


class TimerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.loop = MockLoop(self.clock)
        self.timer = ScriptedTimer(self.clock, self.loop)

    @rule(due_in=st.one_of(st.none(), st.sampled_from([0.2, 1.0, 5.0])))
    def next_due(self, due_in: float | None) -> None:
        self.timer.due_in = due_in

    @rule(armings=st.lists(st.sampled_from(ARMINGS), max_size=3), finished=st.booleans())
    def next_sweep(self, armings: list[str], finished: bool) -> None:
        self.timer.script.append((tuple(armings), finished))

    @rule()
    def watch(self) -> None:
        self.timer.watch()

    @rule(ahead=st.sampled_from([0.0, 0.1, 3.0]))
    def bring_forward(self, ahead: float) -> None:
        self.timer.bring_forward(self.clock.now + ahead)

    @rule(ahead=st.sampled_from([0.0, 0.1, 3.0]))
    def wake_by(self, ahead: float) -> None:
        self.timer.wake_by(self.clock.now + ahead)

    @rule()
    def cancel(self) -> None:
        self.timer.cancel()

    @rule()
    def sweep_now(self) -> None:
        self.timer.sweep_now()

    @precondition(lambda self: bool(self.loop.armed))
    @rule()
    def fire(self) -> None:
        self.loop.run_until(self.loop.armed[0])

    @rule(seconds=st.sampled_from([CARRY_PACE / 2, 0.3, 1.0]))
    def advance(self, seconds: float) -> None:
        self.loop.run_until(self.clock.now + seconds)

    @invariant()
    def one_timer_or_one_carry_armed_for_its_time(self) -> None:
        armed = self.loop.armed
        assert len(armed) <= 1, armed
        timer = self.timer
        if timer.timer_at != math.inf:
            assert armed == [timer.timer_at]
            assert timer.timer_at <= self.clock.now + SHORTEST
        elif armed:
            assert armed[0] <= self.clock.now + CARRY_PACE  # the carry

    @invariant()
    def every_sweep_took_a_finite_now_no_earlier_than_its_time(self) -> None:
        for floor, at in self.timer.sweeps:
            assert math.isfinite(floor) and floor <= at


TimerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_timer_keeps_its_rules = TimerMachine.TestCase


def test_the_scripted_timer_arms_sweeps_and_carries_on() -> None:
    # The machine's stand-in does what it says: a sweep that does not
    # finish carries on CARRY_PACE later, one that finishes arms the timer.
    clock = FakeClock()
    loop = MockLoop(clock)
    timer = ScriptedTimer(clock, loop)
    timer.watch()
    assert loop.armed == [T0 + 1.0] == [timer.timer_at]
    timer.script.append((("watch",), False))
    loop.run_until(T0 + 1.0)
    assert loop.armed == [T0 + 1.0 + CARRY_PACE] and timer.timer_at == math.inf
    loop.run_until(T0 + 1.0 + CARRY_PACE)
    assert loop.armed == [T0 + 2.0 + CARRY_PACE] == [timer.timer_at]
    assert timer.sweeps == [(T0 + 1.0, T0 + 1.0), (0.0, T0 + 1.0 + CARRY_PACE)]
