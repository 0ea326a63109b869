"""The resilience guards at the boundary: rate limiter, breakers, bulkheads, deadlines.

The guards decide (docket/guards/, pure); admission.admit puts their decisions
in admission.RULES' order, after auth and caps, and turns a refusal into the
event and the answer in the provider's own shape; this module holds what a
call takes from them (Hold: a limiter token, a breaker ticket, a bulkhead slot)
and gives it back:

    rate limiter  (one per boundary)  429 docket_rate_limited  x-docket.rate-limited
    breaker       (one per upstream)  503 docket_breaker_open  x-docket.breaker-open
    bulkhead      (one per upstream)  503 docket_load_shed     load.shed
    deadline      (per attempt)       504 docket_upstream_timeout  policy.denied, rule deadline

Each refusal's event carries the guard's own fields plus the rule that refused
(a policy key: resilience.max_calls_per_second, resilience.breaker,
resilience.max_queue, or deadline), the provider, the model and the error type.
Every breaker transition is a breaker.state event.

One limiter for the whole boundary, because its limits are the agent's: a run
is one agent, and a limit of 5 calls a second should not become 10 when the
agent talks to two providers. Breakers and bulkheads are per upstream, because
what they protect (and protect against) is one dependency.

The guards read trio's clock (`trio.current_time`, monotonic, the one cancel
scopes and sleeps use), never the recorder's Clock: a deadline is a cancel
scope's deadline, so the bulkhead and the deadline must share its clock, and
the recorder's Clock is the one a chaos clock fault steps. Each pure guard also
takes a reading that steps back as the last one it saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

# through the module, so a game-day mutant can swap how a breaker is built
from docket.boundary import wiring
from docket.boundary.recorder import Recorder
from docket.guards import breaker as brk
from docket.guards.bulkhead import DEADLINE, RETRY_DISPLACED, UNKNOWN_RETRY_S, Shed
from docket.guards.bulkhead_trio import Bulkhead, Entered
from docket.guards.deadline import Attempt, Spent, plan_attempt
from docket.guards.limiter import Admit, Refuse
from docket.ledger.limits import LedgerFull

if TYPE_CHECKING:
    from docket.policy import ResiliencePolicy

# Kept back from a caller's budget for the boundary's own work once the upstream
# has answered: the closing event's write and fdatasync, then the relay. Larger
# than a typical fdatasync (about 1-5 ms on a local disk), so a call cut at its
# deadline still gets its answer recorded and sent in time.
CLOSE_RESERVE_S = 0.02

# How the closing event's reason counts for the breaker. Failures say the upstream
# is unwell: no answer in time, no connection, a cut connection or stream, bad
# HTTP, a 5xx, or an error event inside a stream. Neutral: the caller left, the
# run is stopping, or the boundary itself failed; the call says nothing about the
# upstream, so its ticket is abandoned. A 4xx is "ignored": an answer, but about
# the request, not the upstream's health.
FAILURE_REASONS = frozenset(
    {
        "timeout",
        "connect",
        "reset",
        "protocol",
        "pool_timeout",
        "stream_cut",
        "upstream_error_event",
    }
)
NEUTRAL_REASONS = frozenset({"client_abort", "cancelled", "internal_error"})


def breaker_outcome(reason: str | None, status: int | None) -> str | None:
    """The breaker outcome of a call that closed with `reason` (None: a model.response)
    and the upstream's status (None: no answer came): success, failure, ignored, or
    None when the call says nothing (abandon the ticket). An unknown reason is None:
    a reason added later must not open a breaker until someone decides it should."""
    if reason is None:
        return brk.SUCCESS
    if reason == "upstream_status":
        return brk.FAILURE if status is not None and status >= 500 else brk.IGNORED
    if reason in FAILURE_REASONS:
        return brk.FAILURE
    return None


@dataclass(frozen=True)
class Waited:
    """The bulkhead shed the call; `waited_s` is set when it was shed in the queue
    (the bulkhead rule's fact, as Hold.bulkhead hands it out)."""

    shed: Shed
    waited_s: float | None = None


@dataclass
class Passage:
    """One call that the guards let through: its breaker ticket, its bulkhead slot
    and the limits of its upstream attempt. `report` once, when the call closes.
    `forwarded` is the guards' clock when it was let through: the breaker's slow-call
    duration runs from there to the report (after any wait for a bulkhead slot)."""

    guards: Guards
    upstream: str
    ticket: brk.Permit
    attempt: Attempt
    entered: Entered | None = None
    forwarded: float | None = None
    reported: bool = field(default=False, init=False)

    def report(self, reason: str | None, status: int | None) -> tuple[brk.StateChange, ...]:
        """The call closed: count it for the breaker; returns the transitions to record."""
        if self.reported:
            raise ValueError(f"call to {self.upstream} reported twice")
        self.reported = True
        breaker = self.guards.breakers[self.upstream]
        outcome = breaker_outcome(reason, status)
        now = self.guards.now()
        if outcome is None:
            return breaker.abandon(self.ticket, now)
        duration = None if self.forwarded is None else max(0.0, now - self.forwarded)
        return breaker.record(self.ticket, outcome, now, duration)


class Guards:
    """The guards of one boundary: a limiter, and per upstream a breaker and a bulkhead."""

    def __init__(
        self,
        resilience: ResiliencePolicy,
        upstreams: Iterable[str],
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.now = clock
        limiter = wiring.limiter_for(resilience)
        self.limiter = limiter if limiter.enabled else None
        self.breakers: dict[str, brk.CircuitBreaker] = {}
        self.bulkheads: dict[str, Bulkhead] = {}
        for name in upstreams:
            self.breakers[name] = wiring.breaker_for(name, resilience)
            core = wiring.bulkhead_core_for(name, resilience)
            if core is not None:
                self.bulkheads[name] = Bulkhead(core, clock)
        self.pool_size: int | None = resilience.max_concurrent_upstream

    # ------------------------------------------------------------------ a call

    def hold(self, upstream: str, budget: tuple[int, float] | None) -> Hold:
        """What one call to `upstream` takes from the guards, learned one decision at a
        time (admission.RULES: deadline, limiter, breaker, bulkhead, attempt) and given
        back by leave()."""
        return Hold(self, upstream, budget)

    def _plan(self, now: float, budget: tuple[int, float] | None) -> Attempt | Spent:
        return plan_attempt(now, budget, reserve_s=CLOSE_RESERVE_S)

    async def _enter(
        self, bulkhead: Bulkhead, budget: tuple[int, float] | None, retry: bool
    ) -> tuple[Entered | Shed, float | None]:
        """A slot, or a shed: at once when the queue is full or the expected wait
        outlasts the deadline, or when the deadline passes while queued or a first
        attempt displaces this retry from the queue (then with the time it waited)."""
        arrived = self.now()
        if budget is None:
            return self._waited(await bulkhead.enter(None, retry=retry), arrived)
        deadline = budget[1]
        with trio.move_on_at(deadline):
            return self._waited(await bulkhead.enter(deadline, retry=retry), arrived)
        status = bulkhead.core.status()
        shed = Shed(
            upstream=bulkhead.core.upstream,
            reason=DEADLINE,
            retry_after_s=status.mean_duration_s or UNKNOWN_RETRY_S,
            queue=status.queued,
            in_flight=status.in_flight,
            expected_wait_s=None,  # the message says: the deadline passed, no slot came
        )
        return shed, self.now() - arrived

    def _waited(self, got: Entered | Shed, arrived: float) -> tuple[Entered | Shed, float | None]:
        if isinstance(got, Shed) and got.reason == RETRY_DISPLACED:
            return got, self.now() - arrived  # shed in the queue
        return got, None

    # ------------------------------------------------------------------ readings

    def ready_problems(self) -> list[str]:
        """Readiness: one line per breaker that is not closed."""
        now = self.now()
        return [
            reason
            for breaker in self.breakers.values()
            if (reason := breaker.status(now).ready_reason) is not None
        ]


class Hold:
    """What one call holds from the guards: its breaker ticket and bulkhead slot.

    Each method takes one guard's decision (and, when the guard lets the call
    through, what it hands out); the choice between them is admission.admit's.
    One reading of the clock serves the deadline, the limiter and the breaker, as
    one call's arrival at the guards. leave() gives everything back, once. A
    class with slots rather than a context manager: this is on every call's path.
    """

    __slots__ = ("guards", "upstream", "budget", "now", "ticket", "entered", "passage")

    def __init__(self, guards: Guards, upstream: str, budget: tuple[int, float] | None) -> None:
        self.guards = guards
        self.upstream = upstream
        self.budget = budget
        self.now = 0.0
        self.ticket: brk.Permit | None = None
        self.entered: Entered | None = None
        self.passage: Passage | None = None

    def deadline(self) -> Attempt | Spent:
        """A budget already spent is refused first, so a call that cannot be made
        takes no token, ticket or slot."""
        self.now = self.guards.now()
        return self.guards._plan(self.now, self.budget)

    def limiter(self) -> Admit | Refuse | None:
        """The limiter's decision (an admission takes a token); None without one."""
        limiter = self.guards.limiter
        return None if limiter is None else limiter.admit(self.now)

    def breaker(self) -> brk.Verdict:
        """The breaker's verdict; its ticket is held from here on. The caller records
        verdict.events (open -> half-open, for a probe)."""
        verdict = self.guards.breakers[self.upstream].before_call(self.now)
        self.ticket = verdict.ticket
        return verdict

    async def bulkhead(self, retry: bool = False) -> Entered | Waited | None:
        """A slot (held from here on), a shed (with the time queued, when shed in the
        queue), or None without a bulkhead. `retry`: the client says this is a retry
        (docket.guards.bulkhead, Priority)."""
        bulkhead = self.guards.bulkheads.get(self.upstream)
        if bulkhead is None:
            return None
        got, waited = await self.guards._enter(bulkhead, self.budget, retry)
        if isinstance(got, Shed):
            return Waited(got, waited)
        self.entered = got
        return got

    def attempt(self) -> Attempt | Spent:
        """The attempt's limit now: the wait for a slot used some of the budget."""
        return self.guards._plan(self.guards.now(), self.budget)

    def pass_through(self, attempt: Attempt) -> Passage:
        """The call is admitted: its Passage, to report how it ended."""
        assert self.ticket is not None  # admitted means the breaker gave a ticket
        self.passage = Passage(
            self.guards, self.upstream, self.ticket, attempt, self.entered, self.guards.now()
        )
        return self.passage

    def leave(self) -> None:
        """Abandon the ticket unless the call reported (never forwarded, or cancelled:
        the call says nothing about the upstream; abandon makes no transition, so
        there is nothing to record), and free the slot. Only the first call acts."""
        ticket, self.ticket = self.ticket, None
        if ticket is not None and (self.passage is None or not self.passage.reported):
            self.guards.breakers[self.upstream].abandon(ticket, self.guards.now())
        entered, self.entered = self.entered, None
        if entered is not None:
            self.guards.bulkheads[self.upstream].leave(entered)


async def record_changes(recorder: Recorder, changes: Iterable[brk.StateChange]) -> None:
    """Record breaker transitions. A full ledger ends them (the recorder has stopped
    the run, as for a cap event); EvidenceLost propagates, the stop already asked."""
    for change in changes:
        try:
            await recorder.record(change.type, **change.fields())
        except LedgerFull:
            return  # the recorder has stopped the run
