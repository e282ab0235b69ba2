"""The enforcer's one timer: when it is armed, where it runs, and how a long sweep yields to the loop.

Theory of operation.  Node.js checks its ConnectionsList every
``connectionsCheckingInterval`` (30 s by default), so its ``408`` can come up
to 30 s late.  connlist keeps one ``loop.call_later`` timer per worker
instead, armed at the earliest moment anything can be due (``_next_due``:
what that is, is the enforcer's, ``connlist.core.enforcer``).  When it
fires, the sweep (``_work``) cuts what is due, and the timer is armed again.

A sweep that the loop runs at or after the time its timer was armed for
takes that time as now: a deadline follows the loop's clock, as the
server's own timers would (``call_later`` may run a callback a little
before the monotonic clock reaches its time).  A keep-alive deadline is
armed for exactly its time (``wake_by``), so the connection is closed then,
as uvicorn's own timer closes it.

The timer is never armed further away than ``Settings.shortest``: anything
that starts a clock after the timer was armed (a connection, a request, a
body, a stall) cannot be due before that, so it never has to move the timer,
only to arm one if there is none (``watch``): while one is armed, an event
costs one test.  Nor does an event that leaves nothing due cancel it (a
connection per request would arm and cancel one each): the timer fires, the
sweep finds nothing, and arms none, so a worker with nothing to watch has no
timer after at most ``Settings.shortest``, and a loop with no timer of ours
in its heap does less at each iteration (asyncio's loop reads its clock at
every iteration while any timer is scheduled).  A clock started outside a
sweep that can be due sooner (a close's linger) brings the timer forward
(``bring_forward``).

At most one of the timer and the sweep carrying on is armed, and none
while a sweep runs: what a sweep's closes would arm (a linger brought
forward, a stall, a keep-alive close under pressure) is the sweep's to
arm at its end, which looks at everything due.  Else a timer armed
beside a carry would fire after the carry had forgotten its time, and
sweep with no floor to take as now.

Cutting a connection off costs tens of microseconds (the ``408``, the
transport, the callback), so a mass timeout is spread over loop iterations:
one sweep spends at most ``SWEEP_TIME`` seconds closing, and closes at most
``connlist.core.sweep.KEEPALIVE_PER_SWEEP`` idle keep-alive connections
(``_work`` says whether it finished), then yields to the loop and carries
on, so requests of other clients are served in between.  It carries on
``CARRY_PACE`` later, not at the next iteration: a request needs a few
iterations to be served (its bytes, the app's task, the response), and
a sweep at every iteration would put a batch of closes, or their
``connection_lost`` calls, which the loops run at the iteration after a
close, in front of each of them.  With the pause, the losses run at once,
the loop rests until the sweep carries on, and a request waits behind
one batch, as behind bare uvicorn's timers, which close at each
iteration what fell due since the last.  A sweep that carries on runs only the steps that did
not finish (a mass close: the keep-alive's), with every other step once
``CARRY_ON_WHOLE`` has passed since the last whole sweep: what else falls
due during a mass close of thousands, which takes seconds, is cut at most
that late, and each of its iterations costs the closes, not every step's
look at its list.

The timer runs on the loop the enforcer was given, else on the loop of the
server's protocols (``attached_loop``), else on the loop running when it is
armed; a server's loop that refuses it (closed: a server that stopped, and
the enforcer serves the next one) is forgotten for the running one.  A loop
is used through ``call_later`` and ``call_soon`` only; cancelling a handle of
a closed loop does nothing, on asyncio's and uvloop's.
"""

from __future__ import annotations

import asyncio
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from connlist.core.kinds import Settings

__all__ = ["CARRY_ON_WHOLE", "CARRY_PACE", "SWEEP_TIME", "Timer"]

# Seconds of cutting-off work per loop iteration (the sweep's time, not the
# connection budget).
SWEEP_TIME = 0.008
# While a sweep carries on over loop iterations, every step runs again at
# least this often (the others only run the steps left unfinished).
CARRY_ON_WHOLE = 0.02
# A sweep that did not finish carries on this much later: a millisecond,
# libuv's timers' resolution, at which uvicorn's own timers close what falls due.
CARRY_PACE = 0.001


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Sweeping:
    """What stands for the sweep carrying on while a sweep runs: arming waits for its end."""

    def cancel(self) -> None:
        pass


_SWEEPING = _Sweeping()


class Timer(ABC):
    """The one timer of an enforcer: its arming, cancelling and carrying on (module docstring).

    A subclass says what is due (``_next_due``, ``_anything_due``) and
    sweeps (``_work``).
    """

    clock: Callable[[], float]
    settings: Settings

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        # The loop given (``Enforcer(loop=...)``), and the server's (``attach``).
        self.loop = loop
        self.attached_loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        # When the armed timer fires (a clock value; inf: none is armed).
        self.timer_at = math.inf
        # Which arming the armed timer is: a timer that was replaced, yet
        # still fires (a loop that cannot cancel), does nothing.
        self._arming = 0
        # A sweep that ran out of its time carries on (``CARRY_PACE`` later):
        # while this is set, the timer is not armed; ``_SWEEPING`` while a
        # sweep runs.
        self._carry: _Cancellable | None = None

    @abstractmethod
    def _next_due(self, now: float) -> float | None:
        """The earliest clock value at which anything can be due, or None if nothing can."""

    @abstractmethod
    def _anything_due(self) -> bool:
        """Whether anything may become due without starting a clock of its own (a body begun, say)."""

    @abstractmethod
    def _work(self, floor: float, carrying: bool) -> bool:
        """One sweep, within ``SWEEP_TIME``: whether everything due was done.

        ``floor``: see ``_sweep``; ``carrying``: the last sweep did not finish.
        """

    def watch(self) -> None:
        """Arm the timer if none is armed; call after ``connect``, ``message_begin`` and ``stall``."""
        if self._timer is None and self._carry is None:
            self._arm()

    def cancel(self) -> None:
        """Forget the timer (and a sweep waiting to carry on): a server is starting, or nothing is due."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self.timer_at = math.inf
            self._arming += 1  # and were it to fire all the same, it does nothing
        if self._carry is not None:
            self._carry.cancel()
            self._carry = None

    def bring_forward(self, when: float) -> None:
        """Make sure the timer fires by ``when`` (a clock value): for clocks started outside a sweep."""
        if self._carry is not None or (self._timer is not None and self.timer_at <= when):
            return
        self.cancel()
        self._arm()

    def wake_by(self, when: float) -> None:
        """The timer fires at ``when`` at the latest: a connection idle under the keep-alive the list times.

        The server layer calls it where a response leaves a connection idle,
        only if the timer is armed for later (``timer_at``): in a busy worker
        it is not, since it fires for the connection idle longest.  Armed
        for exactly ``when``, so a loop that runs it has reached ``when``
        (see ``_sweep``), unless that is further away than
        ``Settings.shortest``, as no timer may be: then the sweep at that
        time arms the next, for ``when`` if nothing comes before.
        """
        if self._carry is not None or when >= self.timer_at:
            return
        self.cancel()
        now = self.clock()
        shortest = self.settings.shortest
        if shortest and when > now + shortest:
            # Never further away than that: a connection that arrives while
            # this timer is armed arms none of its own (``join``).
            when = now + shortest
        self._set_timer(now, when)

    def _arm(self) -> None:
        now = self.clock()
        due = self._next_due(now)
        shortest = self.settings.shortest
        if due is None:
            if not shortest or not self._anything_due():
                return  # nothing can be due until a connection is active, stalled or closing
            # A body that began since the last sweep (with no other timeout on).
            due = now + shortest
        elif shortest:
            # Never later: what starts a clock after this cannot be due earlier than that.
            due = min(due, now + shortest)
        self._set_timer(now, due)

    def _loop(self) -> asyncio.AbstractEventLoop:
        # The given loop, else the protocols' (``attach``), else the running one.
        return self.loop or self.attached_loop or asyncio.get_running_loop()

    def _set_timer(self, now: float, due: float) -> None:
        loop = self._loop()
        delay = max(due - now, 0.0)
        self._arming += 1
        try:
            self._timer = loop.call_later(delay, self._sweep, self._arming)
        except RuntimeError:
            if loop is not self.attached_loop:
                raise
            # The server's loop is closed (asyncio and uvloop refuse then).
            self.attached_loop = None
            self._timer = asyncio.get_running_loop().call_later(delay, self._sweep, self._arming)
        self.timer_at = now + delay

    def sweep_now(self) -> None:
        """A whole sweep now, as if the timer had fired: for a caller that moved the clock (self-checks)."""
        self.cancel()
        self._sweep()

    def _sweep(self, arming: int = 0) -> None:
        if arming and arming != self._arming:
            return  # a timer replaced since, which its loop still ran
        # The loop ran the timer: at least the time it was armed for has come.
        floor = self.timer_at if arming else 0.0
        carrying = self._carry is not None
        self._timer = None
        self.timer_at = math.inf
        self._carry = _SWEEPING
        try:
            finished = self._work(floor, carrying)
        finally:
            # Whatever was armed all the same (a cancel, then a watch): the
            # sweep arms what is due next, once.
            self.cancel()
        if finished:
            self._arm()
        else:
            # Out of time: carry on once the closes' losses and the requests
            # of other clients have been served (module docstring).
            self._carry = self._loop().call_later(CARRY_PACE, self._sweep)
