"""The enforcer's timer on a real event loop, with a clock the test moves."""

from __future__ import annotations

import asyncio

from connlist.enforcer import _BATCH, Enforcer
from connlist.settings import resolve


class TickingClock:
    """Moves by ``step`` at every reading: every look at the clock finds the budget spent."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_sweep_out_of_budget_carries_on_at_the_next_iteration_and_cancel_forgets_it() -> None:
    async def main() -> None:
        clock = TickingClock(step=0.0)
        enforcer = Enforcer(resolve(headers_timeout=1, request_timeout=2), clock=clock)
        connections = enforcer.connections
        for _ in range(3 * _BATCH):
            connections.connect()
        clock.now += 10  # every one of them is past its headers deadline
        clock.step = 1.0  # from now on, each batch uses up the budget
        enforcer._sweep()
        assert enforcer.totals.headers_timeouts == _BATCH and enforcer._continuing
        await asyncio.sleep(0)  # the next iteration: one more batch
        assert enforcer.totals.headers_timeouts == 2 * _BATCH and enforcer._continuing
        # A server starting (or nothing due) forgets the sweep waiting to carry on.
        enforcer.cancel()
        assert not enforcer._continuing
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert enforcer.totals.headers_timeouts == 2 * _BATCH
        # ... and a timer can be armed again at once.
        enforcer.watch()
        assert enforcer._timer is not None
        enforcer.cancel()

    asyncio.run(main())


def test_no_timer_while_nothing_can_be_due() -> None:
    async def main() -> None:
        clock = TickingClock(step=0.0)
        enforcer = Enforcer(resolve(headers_timeout=1, request_timeout=2), clock=clock)
        connections = enforcer.connections
        conn = connections.connect()
        enforcer.watch()
        assert enforcer._timer is not None  # a new connection is active: it can expire
        connections.message_begin(conn)
        connections.headers_complete(conn)
        connections.message_complete(conn)
        enforcer.unwatch()
        assert enforcer._timer is None  # idle: nothing can be due
        connections.stall(conn, 100)
        enforcer.watch()
        assert enforcer._timer is not None  # a stalled response is sampled
        connections.unstall(conn)
        enforcer.unwatch()
        assert enforcer._timer is None
        connections.linger(conn)
        enforcer.watch()
        assert enforcer._timer is not None  # a closed connection's linger ends
        enforcer.cancel()

    asyncio.run(main())
