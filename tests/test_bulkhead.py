"""The bulkhead: the pure core (slots, bounded FIFO queue, sheds), stateful; and the
trio adapter under 200 concurrent callers, cancellation and FIFO wake-up. Bounded in time."""

from __future__ import annotations

import math
import random

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from docket.boundary.wiring import bulkhead_core_for
from docket.guards.bulkhead import (
    DEADLINE,
    QUEUE_FULL,
    RETRY_DISPLACED,
    UNKNOWN_RETRY_S,
    BulkheadCore,
    Enter,
    Shed,
    Ticket,
    Wait,
)
from docket.guards.bulkhead_trio import Bulkhead, Entered
from docket.policy import ResiliencePolicy, policy_from_dict

T0 = 100.0
LIMIT = 10  # seconds: no trio test here may run longer


def test_slots_then_a_bounded_queue_then_shed():
    core = BulkheadCore("openai", slots=2, max_queue=2)
    a, b = core.try_enter(T0), core.try_enter(T0)
    assert isinstance(a, Enter) and isinstance(b, Enter)
    w1, w2 = core.try_enter(T0), core.try_enter(T0)
    assert (w1.position, w2.position) == (1, 2)
    assert w1.expected_wait_s is None  # nothing has finished yet to estimate from
    shed = core.try_enter(T0)
    assert isinstance(shed, Shed)
    assert shed.type == "load.shed"
    assert shed.fields() == {
        "upstream": "openai",
        "reason": "queue_full",
        "queue": 2,
        "in_flight": 2,
        "retry_after_s": UNKNOWN_RETRY_S,
        "expected_wait_s": None,
    }
    assert "all 2 upstream slots are busy" in shed.message
    # A freed slot goes straight to the head of the queue, in order.
    assert core.leave(a.ticket, T0 + 2, 2.0) == w1.ticket
    assert core.leave(b.ticket, T0 + 3, 4.0) == w2.ticket
    s = core.status()
    assert (s.in_flight, s.queued, s.entered, s.shed_queue_full) == (2, 0, 4, 1)
    assert s.mean_duration_s == pytest.approx(2.0 + 0.2 * (4.0 - 2.0))


def test_a_newcomer_never_overtakes_a_waiter():
    core = BulkheadCore("u", slots=1, max_queue=3)
    first = core.try_enter(T0)
    waiter = core.try_enter(T0)
    granted = core.leave(first.ticket, T0 + 1, 1.0)
    assert granted == waiter.ticket and core.is_holding(waiter.ticket)
    # The slot went to the waiter, so a caller arriving now waits behind nobody but it.
    late = core.try_enter(T0 + 1)
    assert isinstance(late, Wait) and late.position == 1


def test_shed_when_the_expected_wait_outlasts_the_deadline():
    core = BulkheadCore("u", slots=2, max_queue=10)
    first = core.try_enter(T0)
    core.try_enter(T0)
    core.leave(first.ticket, T0 + 3, 3.0)  # the estimate is now 3 s a call
    core.try_enter(T0 + 3)  # both slots busy again
    # Position 1 and 2 expect one round (3 s); position 3 and 4 two rounds (6 s).
    w1 = core.try_enter(T0 + 3, deadline=T0 + 6)
    assert isinstance(w1, Wait) and w1.expected_wait_s == 3.0
    w2 = core.try_enter(T0 + 3, deadline=T0 + 6)
    assert isinstance(w2, Wait) and w2.expected_wait_s == 3.0
    shed = core.try_enter(T0 + 3, deadline=T0 + 8.9)
    assert isinstance(shed, Shed) and shed.reason == DEADLINE
    assert (shed.expected_wait_s, shed.retry_after_s, shed.queue) == (6.0, 6.0, 2)
    assert "would outlast the caller's deadline" in shed.message
    w3 = core.try_enter(T0 + 3, deadline=T0 + 9)
    assert isinstance(w3, Wait) and w3.position == 3
    assert core.try_enter(T0 + 3).position == 4  # no deadline: no deadline shed
    assert core.status().shed_deadline == 1


def test_with_no_estimate_only_a_passed_deadline_is_shed():
    core = BulkheadCore("u", slots=1, max_queue=5)
    core.try_enter(T0)
    assert isinstance(core.try_enter(T0, deadline=T0 + 0.001), Wait)
    shed = core.try_enter(T0, deadline=T0)
    assert isinstance(shed, Shed) and shed.reason == DEADLINE and shed.expected_wait_s is None
    assert "deadline has passed" in shed.message
    # A free slot is taken whatever the deadline: the call's own timeout judges it.
    free = BulkheadCore("u", slots=1, max_queue=0)
    assert isinstance(free.try_enter(T0, deadline=T0 - 5), Enter)
    assert free.try_enter(T0).reason == QUEUE_FULL


def test_cancel_leaves_the_queue_or_passes_a_granted_slot_on():
    core = BulkheadCore("u", slots=1, max_queue=3)
    holder = core.try_enter(T0)
    w1, w2, w3 = (core.try_enter(T0) for _ in range(3))
    assert core.cancel(w2.ticket, T0) is None  # left the queue
    assert core.status().queued == 2 and core.status().cancelled_waiting == 1
    assert core.leave(holder.ticket, T0 + 1, 1.0) == w1.ticket
    # w1 was granted but gave up before using it: the slot goes on to w3.
    assert core.cancel(w1.ticket, T0 + 1) == w3.ticket
    s = core.status()
    assert (s.in_flight, s.queued, s.mean_duration_s) == (1, 0, 1.0)  # no duration from w1


def test_a_full_queue_sheds_retries_before_first_attempts():
    core = BulkheadCore("u", slots=1, max_queue=3)
    core.try_enter(T0)
    first = core.try_enter(T0)
    r1 = core.try_enter(T0, retry=True)
    r2 = core.try_enter(T0, retry=True)
    late_retry = core.try_enter(T0, retry=True)  # full: a retry is shed
    assert isinstance(late_retry, Shed) and late_retry.reason == QUEUE_FULL
    newcomer = core.try_enter(T0)  # full: a first attempt takes the last retry's place
    assert isinstance(newcomer, Wait) and newcomer.position == 3
    assert newcomer.displaced.ticket == r2.ticket
    shed = newcomer.displaced.shed
    assert (shed.reason, shed.queue) == (RETRY_DISPLACED, 2)
    assert "gave its place" in shed.message
    another = core.try_enter(T0)  # and then r1's
    assert another.displaced.ticket == r1.ticket
    third = core.try_enter(T0)  # no retry left queued: the first attempt is shed
    assert isinstance(third, Shed) and third.reason == QUEUE_FULL
    s = core.status()
    assert (s.queued, s.shed_queue_full, s.shed_retries_displaced) == (3, 2, 2)
    # Slots still go in arrival order among those queued.
    assert [first.ticket, newcomer.ticket, another.ticket] == [
        core.leave(t, T0 + 1, 1.0) for t in (Ticket(0), first.ticket, newcomer.ticket)
    ]


def test_misuse_is_an_error():
    core = BulkheadCore("u", slots=1, max_queue=1)
    entered = core.try_enter(T0)
    core.leave(entered.ticket, T0, 0.5)
    with pytest.raises(ValueError, match="holds no slot"):
        core.leave(entered.ticket, T0, 0.5)
    with pytest.raises(ValueError, match="holds no slot"):
        core.cancel(Ticket(42), T0)
    with pytest.raises(ValueError, match="duration"):
        core.leave(core.try_enter(T0).ticket, T0, -1.0)
    with pytest.raises(ValueError, match="now must be"):
        core.try_enter(math.nan)
    with pytest.raises(ValueError, match="deadline must be"):
        core.try_enter(T0, deadline=math.inf)
    for slots, queue in ((0, 1), (1, -1), (True, 1)):
        with pytest.raises(ValueError):
            BulkheadCore("u", slots=slots, max_queue=queue)


def test_from_policy():
    assert bulkhead_core_for("u", ResiliencePolicy()) is None
    only_slots = ResiliencePolicy(max_concurrent_upstream=6)
    core = bulkhead_core_for("u", only_slots)
    assert (core.slots, core.max_queue) == (6, 6)  # never unbounded
    policy = policy_from_dict(
        {"resilience": {"max_concurrent_upstream": 4, "max_queue": 0}}, "test"
    ).resilience
    core = bulkhead_core_for("anthropic", policy)
    assert (core.upstream, core.slots, core.max_queue) == ("anthropic", 4, 0)


# ---------------------------------------------------------------- stateful


class BulkheadMachine(RuleBasedStateMachine):
    """Random arrivals (some with deadlines), departures, cancellations and clock
    steps (backwards too) against a model of slots and a FIFO queue. A twin core
    fed the clamped readings must decide the same."""

    @initialize(slots=st.integers(1, 4), max_queue=st.integers(0, 5))
    def setup(self, slots, max_queue):
        self.core = BulkheadCore("u", slots, max_queue)
        self.twin = BulkheadCore("u", slots, max_queue)
        self.raw = T0
        self.clamped = -math.inf
        self.holding: list[Ticket] = []
        self.queue: list[Ticket] = []  # the model's FIFO
        self.retries: set[Ticket] = set()  # the queued callers that said they retry
        self.durations: list[float] = []

    def now(self) -> float:
        self.clamped = max(self.clamped, self.raw)
        return self.clamped

    def granted(self, a, b):
        assert a == b
        if a is not None:
            # Only ever the oldest waiter still queued.
            assert self.queue and a == self.queue.pop(0)
            self.retries.discard(a)
            self.holding.append(a)
        else:
            assert not self.queue

    @rule(dt=st.floats(-10, 10, allow_nan=False))
    def step(self, dt):
        self.raw += dt

    @rule(
        deadline_in=st.one_of(st.none(), st.floats(-1, 20, allow_nan=False)),
        retry=st.booleans(),
    )
    def arrive(self, deadline_in, retry):
        now = self.now()
        deadline = None if deadline_in is None else self.raw + deadline_in
        got = self.core.try_enter(self.raw, deadline, retry=retry)
        assert got == self.twin.try_enter(now, deadline, retry=retry)
        slots, max_queue = self.core.slots, self.core.max_queue
        mean = self.core.status().mean_duration_s
        full = len(self.queue) >= max_queue
        if isinstance(got, Enter):
            assert len(self.holding) < slots and not self.queue
            self.holding.append(got.ticket)
        elif isinstance(got, Wait):
            assert len(self.holding) == slots
            if full:
                # Priority: only a first attempt gets into a full queue, in the place of
                # the retry queued last, which is shed.
                assert not retry and self.retries and got.displaced is not None
                last_retry = [t for t in self.queue if t in self.retries][-1]
                assert got.displaced.ticket == last_retry
                assert got.displaced.shed.reason == RETRY_DISPLACED
                self.queue.remove(last_retry)
                self.retries.remove(last_retry)
            else:
                assert got.displaced is None
            self.queue.append(got.ticket)
            if retry:
                self.retries.add(got.ticket)
            assert got.position == len(self.queue)
            if mean is not None:
                assert got.expected_wait_s == math.ceil(got.position / slots) * mean
                if deadline is not None:
                    assert now + got.expected_wait_s <= deadline
        else:
            assert len(self.holding) == slots
            if got.reason == QUEUE_FULL:
                # a first attempt is shed from a full queue only when no retry waits
                assert full and (retry or not self.retries)
            else:
                assert got.reason == DEADLINE and deadline is not None
                assert not full or (not retry and self.retries)
                if mean is None:
                    assert deadline <= now
                else:
                    position = len(self.queue) + (0 if full else 1)
                    expected = math.ceil(position / slots) * mean
                    assert got.expected_wait_s == expected and now + expected > deadline
            assert got.retry_after_s >= 0

    @precondition(lambda self: self.holding)
    @rule(data=st.data(), duration=st.floats(0, 30, allow_nan=False))
    def depart(self, data, duration):
        ticket = data.draw(st.sampled_from(self.holding))
        self.holding.remove(ticket)
        self.durations.append(duration)
        self.granted(
            self.core.leave(ticket, self.raw, duration),
            self.twin.leave(ticket, self.now(), duration),
        )

    @precondition(lambda self: self.holding or self.queue)
    @rule(data=st.data())
    def give_up(self, data):
        ticket = data.draw(st.sampled_from(self.holding + self.queue))
        a = self.core.cancel(ticket, self.raw)
        b = self.twin.cancel(ticket, self.now())
        if ticket in self.queue:
            self.queue.remove(ticket)
            self.retries.discard(ticket)
            assert a is None and b is None
        else:
            self.holding.remove(ticket)
            self.granted(a, b)

    @invariant()
    def bounded(self):
        s = self.core.status()
        assert s == self.twin.status()
        assert s.in_flight == len(self.holding) <= s.slots
        assert s.queued == len(self.queue) <= s.max_queue
        assert self.retries <= set(self.queue)
        if s.queued:
            assert s.in_flight == s.slots  # nobody waits beside a free slot
        if self.durations:
            assert min(self.durations) <= s.mean_duration_s <= max(self.durations)


TestBulkheadMachine = BulkheadMachine.TestCase
TestBulkheadMachine.settings = settings(stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------- on trio


async def crowd(bulkhead: Bulkhead, callers: int, work: float, spread: float, seed: int,
                watch_lag: bool = False):  # fmt: skip
    """`callers` tasks arrive over `spread` seconds, some with tight deadlines;
    each enters (and works `work` seconds), is shed, or gives up in the queue
    when its deadline passes. Returns what happened. `watch_lag` (in real time only:
    a task that never sleeps stops a mock clock's autojump) also notes the scheduler's
    longest lag."""
    rng = random.Random(seed)
    log = {
        "entered": [],
        "shed": [],
        "shed_elapsed": [],
        "gave_up": [],  # waited in the queue past their deadline (cancelled there)
        "max_in_flight": 0,
        "max_queue": 0,
    }
    in_flight = 0
    waits: list[int] = []  # ticket ids in the order they were queued
    grants: list[int] = []  # ticket ids the core handed a freed slot, in that order
    queued_by: dict = {}  # task -> the ticket id it queued with
    given_up: set[int] = set()
    unestimated: set[int] = set()  # queued before any call had finished

    async def caller(i: int, arrive_after: float, patience: float | None):
        nonlocal in_flight
        await trio.sleep(arrive_after)
        start = trio.current_time()
        deadline = None if patience is None else start + patience
        with trio.move_on_at(math.inf if deadline is None else deadline) as scope:
            got = await bulkhead.enter(deadline)
        core = bulkhead.core.status()
        if scope.cancelled_caught:
            log["gave_up"].append(i)
            given_up.add(queued_by[trio.lowlevel.current_task()])
            return
        log["max_queue"] = max(log["max_queue"], core.queued)
        if isinstance(got, Shed):
            log["shed"].append(got)
            log["shed_elapsed"].append(trio.current_time() - start)
            return
        assert isinstance(got, Entered)
        try:
            in_flight += 1
            log["max_in_flight"] = max(log["max_in_flight"], in_flight)
            await trio.sleep(work)  # the upstream call
        finally:
            in_flight -= 1
            bulkhead.leave(got)
        log["entered"].append(i)

    original_try_enter = bulkhead.core.try_enter

    def recording_try_enter(now, deadline=None, *, retry=False):
        decision = original_try_enter(now, deadline, retry=retry)
        if isinstance(decision, Wait):
            waits.append(decision.ticket.id)
            queued_by[trio.lowlevel.current_task()] = decision.ticket.id
            if decision.expected_wait_s is None:
                unestimated.add(decision.ticket.id)
        return decision

    def recording(method):
        def granting(*args):
            granted = method(*args)
            if granted is not None:
                grants.append(granted.id)
            return granted

        return granting

    bulkhead.core.try_enter = recording_try_enter
    bulkhead.core.leave = recording(bulkhead.core.leave)
    bulkhead.core.cancel = recording(bulkhead.core.cancel)
    log["lag"] = 0.0

    async def canary(done: trio.Event) -> None:
        # Only yields, and notes the longest it waited to run again: the scheduler's lag.
        while not done.is_set():
            before = trio.current_time()
            await trio.lowlevel.checkpoint()
            log["lag"] = max(log["lag"], trio.current_time() - before)

    async with trio.open_nursery() as outer:
        done = trio.Event()
        if watch_lag:
            outer.start_soon(canary, done)
        async with trio.open_nursery() as nursery:
            for i in range(callers):
                patience = rng.choice([None, None, work * 0.5, work * 1.5, work * 3])
                nursery.start_soon(caller, i, rng.uniform(0, spread), patience)
        done.set()
    log["waits"], log["grants"] = waits, grants
    log["gave_up_tickets"], log["unestimated"] = given_up, unestimated
    return log


def check_crowd(log, bulkhead: Bulkhead, callers: int):
    s = bulkhead.core.status()
    outcomes = len(log["entered"]) + len(log["shed"]) + len(log["gave_up"])
    assert outcomes == callers
    assert s.cancelled_waiting == len(log["gave_up"])
    assert log["max_in_flight"] <= 4 and log["max_queue"] <= 8
    assert (s.in_flight, s.queued, bulkhead.waiting) == (0, 0, 0)  # nothing left behind
    assert s.entered == len(log["entered"])
    assert s.shed_queue_full + s.shed_deadline == len(log["shed"])
    # Slots were handed on in the order callers queued, none lost (bar those
    # that gave up while queued). Trio may run tasks woken together in any order.
    given_up = log["gave_up_tickets"]
    assert [t for t in log["grants"] if t not in given_up] == [
        t for t in log["waits"] if t not in given_up
    ]
    assert {shed.reason for shed in log["shed"]} <= {QUEUE_FULL, DEADLINE}
    assert all(shed.queue <= 8 and shed.in_flight == 4 for shed in log["shed"])


async def test_200_callers_against_4_slots_and_a_queue_of_8_virtual_time(autojump_clock):
    """Deterministic: trio's mock clock jumps whenever every task is blocked."""
    bulkhead = Bulkhead(BulkheadCore("stub", slots=4, max_queue=8))
    with trio.fail_after(LIMIT):
        log = await crowd(bulkhead, 200, work=0.01, spread=0.1, seed=7)
    check_crowd(log, bulkhead, 200)
    # With steady call durations the estimate is a true bound: a caller let into
    # the queue against its deadline never outwaits it. Only those queued before
    # any call had finished (no estimate yet) can give up there.
    assert log["gave_up_tickets"] <= log["unestimated"]
    # A shed is decided before any wait: not a tick of the clock passes.
    assert log["shed_elapsed"] and max(log["shed_elapsed"]) == 0.0
    s = bulkhead.core.status()
    assert s.shed_queue_full > 0 and s.shed_deadline > 0 and len(log["grants"]) > 0


async def test_200_callers_against_4_slots_and_a_queue_of_8_real_time():
    bulkhead = Bulkhead(BulkheadCore("stub", slots=4, max_queue=8))
    with trio.fail_after(LIMIT):
        log = await crowd(bulkhead, 200, work=0.05, spread=0.5, seed=11, watch_lag=True)
    check_crowd(log, bulkhead, 200)
    # Sheds are decided at once: far below one call's duration, but for what the
    # scheduler itself made every task wait meanwhile (log["lag"]: the longest a task
    # that only yields waited to run again, on a busy machine tens of milliseconds).
    assert max(log["shed_elapsed"]) < 0.025 + log["lag"]
    assert len(log["entered"]) >= 12 and len(log["grants"]) > 0
    assert bulkhead.core.status().shed_deadline > 0


async def test_a_queued_retry_is_woken_with_its_shed_when_a_first_attempt_takes_its_place():
    bulkhead = Bulkhead(BulkheadCore("u", slots=1, max_queue=1))
    results = {}
    with trio.fail_after(LIMIT):
        holder = await bulkhead.enter()
        async with trio.open_nursery() as nursery:

            async def caller(name, retry):
                async with bulkhead.occupy(retry=retry) as got:
                    results[name] = got

            nursery.start_soon(caller, "retry", True)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(caller, "first", False)
            await trio.testing.wait_all_tasks_blocked()
            assert isinstance(results["retry"], Shed)
            assert results["retry"].reason == RETRY_DISPLACED
            assert bulkhead.waiting == 1 and bulkhead.core.status().queued == 1
            bulkhead.leave(holder)
    assert isinstance(results["first"], Entered) and results["first"].position == 1
    s = bulkhead.core.status()
    assert (s.in_flight, s.queued, s.shed_retries_displaced) == (0, 0, 1)


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_gets_the_slot():
    bulkhead = Bulkhead(BulkheadCore("u", slots=1, max_queue=3))
    order = []
    with trio.fail_after(LIMIT):
        holder = await bulkhead.enter()
        async with trio.open_nursery() as nursery:
            scopes = {}

            async def wait_in_line(name, task_status=trio.TASK_STATUS_IGNORED):
                with trio.CancelScope() as scope:
                    scopes[name] = scope
                    task_status.started()
                    async with bulkhead.occupy() as got:
                        order.append(name)
                        assert isinstance(got, Entered) and got.position > 0

            for name in ("a", "b", "c"):
                await nursery.start(wait_in_line, name)
            await trio.testing.wait_all_tasks_blocked()
            assert bulkhead.core.status().queued == 3
            scopes["b"].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert bulkhead.core.status().queued == 2
            assert bulkhead.waiting == 2
            bulkhead.leave(holder)
        assert order == ["a", "c"]
    s = bulkhead.core.status()
    assert (s.in_flight, s.queued, s.cancelled_waiting) == (0, 0, 1)


async def test_a_waiter_cancelled_in_the_instant_it_is_granted_passes_the_slot_on():
    bulkhead = Bulkhead(BulkheadCore("u", slots=1, max_queue=2))
    got_in = []
    with trio.fail_after(LIMIT):
        holder = await bulkhead.enter()
        async with trio.open_nursery() as nursery:
            first_scope = trio.CancelScope()

            async def first():
                with first_scope:
                    await bulkhead.enter()
                    got_in.append("first")  # never: cancelled before it could run

            async def second():
                async with bulkhead.occupy() as got:
                    assert isinstance(got, Entered)
                    got_in.append("second")

            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            # Cancel first, then hand it the slot before it runs again.
            first_scope.cancel()
            bulkhead.leave(holder)
        assert got_in == ["second"]
    s = bulkhead.core.status()
    assert (s.in_flight, s.queued, bulkhead.waiting) == (0, 0, 0)
