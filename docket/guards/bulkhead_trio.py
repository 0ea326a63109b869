"""The bulkhead on trio: the pure core decides, this layer only waits and wakes.

    bulkhead = Bulkhead(BulkheadCore("openai", slots=8, max_queue=32))
    async with bulkhead.occupy(deadline) as got:
        if isinstance(got, Shed):
            ...  # answer 503 + Retry-After, record load.shed from got.fields()
        else:
            ...  # the upstream call; leaving the block gives the slot back

Each waiter waits on its own trio.Event, set when the core grants it a slot,
so waiters are woken in the core's FIFO order. A shed is decided before the
first await. A queued retry displaced by a first attempt (the core's
Priority) is woken with its Shed. A waiter whose task is cancelled (the caller's deadline is a
cancel scope around the call) leaves the queue; if the core had already
granted it a slot, the slot goes straight to the next waiter.

Deadlines and durations are on `clock`, trio's clock by default, so a deadline
is the same number a trio cancel scope uses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from docket.guards.bulkhead import BulkheadCore, Enter, Shed, Ticket, Wait


@dataclass(frozen=True)
class Entered:
    ticket: Ticket
    started: float  # clock reading when the slot was taken
    waited_s: float  # time spent queued (0 when entered at once)
    position: int  # queue position on arrival (0 when entered at once)


class Bulkhead:
    def __init__(self, core: BulkheadCore, clock: Callable[[], float] = trio.current_time) -> None:
        self.core = core
        self._clock = clock
        self._waiters: dict[int, trio.Event] = {}
        self._displaced: dict[int, Shed] = {}  # woken waiters shed for a first attempt

    async def enter(self, deadline: float | None = None, *, retry: bool = False) -> Entered | Shed:
        """A slot (after queueing if need be), or a shed: decided without waiting, or,
        for a retry, when a first attempt takes its place in the queue.

        The caller must hand an Entered back to leave(); occupy() does it.
        """
        arrived = self._clock()
        decision = self.core.try_enter(arrived, deadline, retry=retry)
        if isinstance(decision, Shed):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return decision
        if isinstance(decision, Enter):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return Entered(decision.ticket, started=arrived, waited_s=0.0, position=0)
        assert isinstance(decision, Wait)
        if decision.displaced is not None:
            gone = decision.displaced
            self._displaced[gone.ticket.id] = gone.shed
            self._waiters.pop(gone.ticket.id).set()
        ticket = decision.ticket
        granted = trio.Event()
        self._waiters[ticket.id] = granted
        try:
            await granted.wait()
        except BaseException:
            # Cancelled while queued: leave the queue, or pass on a slot granted
            # in the same instant, then let the cancellation go on. A waiter shed
            # in the same instant holds nothing: the core has already let it go.
            self._waiters.pop(ticket.id, None)
            if self._displaced.pop(ticket.id, None) is None:
                self._wake(self.core.cancel(ticket, self._clock()))
            raise
        shed = self._displaced.pop(ticket.id, None)
        if shed is not None:
            return shed
        started = self._clock()
        return Entered(
            ticket, started=started, waited_s=started - arrived, position=decision.position
        )

    def leave(self, entered: Entered) -> None:
        now = self._clock()
        self._wake(self.core.leave(entered.ticket, now, max(0.0, now - entered.started)))

    @asynccontextmanager
    async def occupy(
        self, deadline: float | None = None, *, retry: bool = False
    ) -> AsyncIterator[Entered | Shed]:
        got = await self.enter(deadline, retry=retry)
        try:
            yield got
        finally:
            if isinstance(got, Entered):
                self.leave(got)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _wake(self, ticket: Ticket | None) -> None:
        if ticket is not None:
            self._waiters.pop(ticket.id).set()
