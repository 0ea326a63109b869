"""The bulkhead: per upstream, at most `slots` calls in flight and a bounded FIFO queue.

Pure and clock-injected; `docket.guards.bulkhead_trio` puts it on trio. The
upstream's connection pool is the bulkhead: the boundary sizes the pool with
the same `max_concurrent_upstream`, and this object decides who may use it.

`try_enter(now, deadline)` answers at once:
- Enter: a slot is free and nobody is queued (a newcomer never overtakes a
  waiter);
- Shed("queue_full"): all slots are busy and `max_queue` callers already wait
  (see Priority for a first attempt meeting a full queue that holds a retry);
- Shed("deadline"): the caller's deadline (same clock as `now`) would pass
  before a slot is expected to come its way;
- Wait(position): queued; `leave()` or `cancel()` of another call later
  grants it the slot.

A freed slot is handed straight to the head of the queue (the count in flight
does not drop), so a waiter cannot lose its slot to a caller that arrives
between the grant and the waiter waking up.

Expected wait: position p behind `slots` busy slots, each call taking the
running estimate d (an EWMA of reported durations), gets a slot within
ceil(p / slots) * d: every slot frees within d of now and every d after. That
is the bound when every call in flight has just started, so with steady
durations a waiter that is let in does not outwait its deadline; it sheds some
callers that would have made it, which costs a fast 503 instead of a slow
timeout. Before any duration is known the wait is unknown and only a deadline
already passed is shed.

Priority: a caller says whether it is a retry (`retry=True`: the client's own
attempt number, x-stainless-retry-count, is above 0). When the queue is full, a
retry is shed; a first attempt takes the place of the queued retry that
arrived last (it has waited least), which is shed with reason
"retry_displaced" (Wait.displaced: the trio layer wakes it with its Shed), and
only when no retry waits is a first attempt shed. So under overload the calls
shed are retries before first attempts: a retry's caller has already been
answered once and is backing off, a first attempt's has not. Slots are still
granted in arrival order; priority decides only who is shed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

QUEUE_FULL = "queue_full"
DEADLINE = "deadline"
RETRY_DISPLACED = "retry_displaced"
EWMA_WEIGHT = 0.2  # weight of the newest duration: about the last ten calls count
UNKNOWN_RETRY_S = 1.0  # Retry-After when no call has finished yet to estimate from


@dataclass(frozen=True)
class Ticket:
    id: int


@dataclass(frozen=True)
class Enter:
    ticket: Ticket


@dataclass(frozen=True)
class Wait:
    ticket: Ticket
    position: int  # 1 = next to get a slot
    expected_wait_s: float | None  # None before any duration is known
    displaced: Displaced | None = None  # a queued retry this caller took the place of


@dataclass(frozen=True)
class Displaced:
    """A queued retry shed to make room for a first attempt."""

    ticket: Ticket
    shed: Shed


@dataclass(frozen=True)
class Shed:
    """A `load.shed` event value; the boundary answers 503 + Retry-After."""

    upstream: str
    reason: str  # queue_full | deadline | retry_displaced
    retry_after_s: float
    queue: int  # callers waiting when it was shed
    in_flight: int
    expected_wait_s: float | None  # what the deadline was measured against (deadline only)

    type = "load.shed"

    @property
    def message(self) -> str:
        if self.reason == RETRY_DISPLACED:
            return (
                f"{self.upstream}: this retry gave its place in the full queue to a first "
                f"attempt; retry in {self.retry_after_s:.3g} s"
            )
        if self.reason == QUEUE_FULL:
            return (
                f"{self.upstream}: all {self.in_flight} upstream slots are busy and "
                f"{self.queue} calls already wait; retry in {self.retry_after_s:.3g} s"
            )
        if self.expected_wait_s is None:
            return f"{self.upstream}: the caller's deadline has passed and no upstream slot is free"
        return (
            f"{self.upstream}: the expected wait for an upstream slot "
            f"({self.expected_wait_s:.3g} s) would outlast the caller's deadline"
        )

    def fields(self) -> dict:
        return {
            "upstream": self.upstream,
            "reason": self.reason,
            "queue": self.queue,
            "in_flight": self.in_flight,
            "retry_after_s": self.retry_after_s,
            "expected_wait_s": self.expected_wait_s,
        }


@dataclass(frozen=True)
class BulkheadStatus:
    upstream: str
    slots: int
    max_queue: int
    in_flight: int
    queued: int
    mean_duration_s: float | None
    entered: int  # calls that got a slot (at once or after waiting)
    shed_queue_full: int
    shed_deadline: int
    shed_retries_displaced: int  # queued retries shed for a first attempt
    cancelled_waiting: int  # waiters that gave up in the queue


class BulkheadCore:
    def __init__(self, upstream: str, slots: int, max_queue: int) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a whole number of at least 1, got {slots!r}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0:
            raise ValueError(f"max_queue must be a whole number of at least 0, got {max_queue!r}")
        self.upstream = upstream
        self.slots = slots
        self.max_queue = max_queue
        self._holding: set[int] = set()
        self._queue: OrderedDict[int, Ticket] = OrderedDict()
        self._retries: set[int] = set()  # ids of the queued callers that are retries
        self._mean: float | None = None
        self._next_id = 0
        self._last_now = -math.inf
        self._entered = 0
        self._shed = {QUEUE_FULL: 0, DEADLINE: 0, RETRY_DISPLACED: 0}
        self._cancelled_waiting = 0

    def try_enter(
        self, now: float, deadline: float | None = None, *, retry: bool = False
    ) -> Enter | Wait | Shed:
        now = self._clamp(now)
        if deadline is not None:
            deadline = _check_reading("deadline", deadline)
        if len(self._holding) < self.slots and not self._queue:
            return Enter(self._grant(self._issue()))
        full = len(self._queue) >= self.max_queue
        if full and (retry or not self._retries):
            return self._shed_now(QUEUE_FULL, self._expected_wait(1), None)
        # full here means a first attempt that will displace the last retry queued
        position = len(self._queue) + (0 if full else 1)
        expected = self._expected_wait(position)
        if deadline is not None:
            late = deadline <= now if expected is None else now + expected > deadline
            if late:
                return self._shed_now(DEADLINE, expected, expected)
        displaced = self._displace_last_retry() if full else None
        ticket = self._issue()
        self._queue[ticket.id] = ticket
        if retry:
            self._retries.add(ticket.id)
        return Wait(ticket, position, expected, displaced)

    def leave(self, ticket: Ticket, now: float, duration: float) -> Ticket | None:
        """A call that held a slot is done after `duration` seconds; returns the
        waiter now granted the slot, if any (the trio layer wakes it)."""
        self._clamp(now)
        duration = _check_reading("duration", duration)
        if duration < 0:
            raise ValueError(f"duration must be at least 0, got {duration!r}")
        self._release(ticket)
        d = self._mean
        self._mean = duration if d is None else d + EWMA_WEIGHT * (duration - d)
        return self._grant_next()

    def cancel(self, ticket: Ticket, now: float) -> Ticket | None:
        """The caller gave up: a waiter leaves the queue; a call granted a slot it
        will not use gives it back, without a duration. Returns the waiter granted
        the freed slot, if any."""
        self._clamp(now)
        if self._queue.pop(ticket.id, None) is not None:
            self._retries.discard(ticket.id)
            self._cancelled_waiting += 1
            return None
        self._release(ticket)
        return self._grant_next()

    def is_holding(self, ticket: Ticket) -> bool:
        return ticket.id in self._holding

    def status(self) -> BulkheadStatus:
        return BulkheadStatus(
            upstream=self.upstream,
            slots=self.slots,
            max_queue=self.max_queue,
            in_flight=len(self._holding),
            queued=len(self._queue),
            mean_duration_s=self._mean,
            entered=self._entered,
            shed_queue_full=self._shed[QUEUE_FULL],
            shed_deadline=self._shed[DEADLINE],
            shed_retries_displaced=self._shed[RETRY_DISPLACED],
            cancelled_waiting=self._cancelled_waiting,
        )

    # ------------------------------------------------------------ inside

    def _clamp(self, now: float) -> float:
        now = _check_reading("now", now)
        if now > self._last_now:
            self._last_now = now
        return self._last_now

    def _issue(self) -> Ticket:
        ticket = Ticket(self._next_id)
        self._next_id += 1
        return ticket

    def _grant(self, ticket: Ticket) -> Ticket:
        self._holding.add(ticket.id)
        self._entered += 1
        return ticket

    def _grant_next(self) -> Ticket | None:
        if not self._queue:
            return None
        _, ticket = self._queue.popitem(last=False)
        self._retries.discard(ticket.id)
        return self._grant(ticket)

    def _displace_last_retry(self) -> Displaced:
        last = next(i for i in reversed(self._queue) if i in self._retries)
        self._retries.remove(last)
        ticket = self._queue.pop(last)
        # It would have got a slot about when the queue's head moves on.
        return Displaced(ticket, self._shed_now(RETRY_DISPLACED, self._expected_wait(1), None))

    def _release(self, ticket: Ticket) -> None:
        if ticket.id not in self._holding:
            raise ValueError(f"bulkhead ticket {ticket.id} holds no slot (left twice?)")
        self._holding.remove(ticket.id)

    def _expected_wait(self, position: int) -> float | None:
        if self._mean is None:
            return None
        return math.ceil(position / self.slots) * self._mean

    def _shed_now(self, reason: str, wait: float | None, expected: float | None) -> Shed:
        self._shed[reason] += 1
        return Shed(
            upstream=self.upstream,
            reason=reason,
            # queue_full: about when the queue's head moves and a place frees;
            # deadline: about when the queue ahead of this caller has drained.
            retry_after_s=UNKNOWN_RETRY_S if wait is None else wait,
            queue=len(self._queue),
            in_flight=len(self._holding),
            expected_wait_s=expected,
        )


def _check_reading(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)
