"""The resilience guards at the boundary: rate limiter, breakers, bulkheads, deadlines.

The guards decide (docket/guards/, pure); this module puts them in the order of
DESIGN.md §5, after auth, egress and caps, and turns each decision into an
event and, for a refusal, an answer in the provider's own shape:

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

import trio

# through the module, so a game-day mutant can swap how a breaker is built
from docket.boundary import wiring
from docket.guards import breaker as brk
from docket.guards.bulkhead import DEADLINE, UNKNOWN_RETRY_S, Shed
from docket.guards.bulkhead_trio import Bulkhead, Entered
from docket.guards.deadline import Attempt, Spent, plan_attempt
from docket.guards.limiter import Refuse
from docket.ledger.limits import EvidenceLost, LedgerFull

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


@dataclass
class Passage:
    """One call that the guards let through: its breaker ticket, its bulkhead slot
    and the limits of its upstream attempt. `report` once, when the call closes."""

    guards: Guards
    upstream: str
    ticket: brk.Ticket
    attempt: Attempt
    entered: Entered | None = None
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
        return breaker.record(self.ticket, outcome, now)


class Guards:
    """The guards of one boundary: a limiter, and per upstream a breaker and a bulkhead."""

    def __init__(
        self,
        resilience,
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

    def passage(
        self, b, route, respond, *, model: str, budget: tuple[int, float] | None
    ) -> Admission:
        """Take the call through the limiter, the breaker and the bulkhead, in that
        order: `async with guards.passage(...) as passage:` gives a Passage, or None
        once the call has been refused (answered and recorded). On leaving, an
        unreported ticket is abandoned and the slot freed.

        A budget already spent is refused first, so a call that cannot be made
        takes no token, ticket or slot. EvidenceLost from recording a transition
        propagates (the boundary has asked the run to stop).
        """
        return Admission(self, b, route, respond, model, budget)

    def _plan(self, now: float, budget) -> Attempt | Spent:
        return plan_attempt(now, budget, reserve_s=CLOSE_RESERVE_S)

    async def _enter(self, bulkhead: Bulkhead, budget) -> tuple[Entered | Shed, float | None]:
        """A slot, or a shed: at once when the queue is full or the expected wait
        outlasts the deadline, or when the deadline passes while queued (then with
        the time it waited)."""
        if budget is None:
            return await bulkhead.enter(None), None
        deadline = budget[1]
        arrived = self.now()
        with trio.move_on_at(deadline):
            return await bulkhead.enter(deadline), None
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

    # ------------------------------------------------------------------ readings

    def ready_problems(self) -> list[str]:
        """Readiness: one line per breaker that is not closed."""
        now = self.now()
        return [
            reason
            for breaker in self.breakers.values()
            if (reason := breaker.status(now).ready_reason) is not None
        ]


class Admission:
    """Guards.passage(...): enter() / leave(), or `async with`. A class rather than an
    @asynccontextmanager: this is on every call's path, and the generator machinery
    (with the AsyncExitStack it needed) cost more than the guards' own decisions."""

    __slots__ = (
        "guards",
        "b",
        "route",
        "respond",
        "model",
        "budget",
        "breaker",
        "ticket",
        "bulkhead",
        "entered",
        "passage",
    )

    def __init__(self, guards: Guards, b, route, respond, model: str, budget) -> None:
        self.guards = guards
        self.b = b
        self.route = route
        self.respond = respond
        self.model = model
        self.budget = budget
        self.breaker: brk.CircuitBreaker | None = None
        self.ticket: brk.Ticket | None = None
        self.bulkhead: Bulkhead | None = None
        self.entered: Entered | None = None
        self.passage: Passage | None = None

    async def __aenter__(self) -> Passage | None:
        return await self.enter()

    async def __aexit__(self, *exc_info: object) -> None:
        self.leave()

    async def enter(self) -> Passage | None:
        """The Passage, or None once the call has been refused; call leave() after
        either (not if this raises: it has left by then)."""
        guards, budget = self.guards, self.budget
        now = guards.now()
        spent = guards._plan(now, budget)
        if isinstance(spent, Spent):
            await self._refuser().spent(spent)
            return None
        if guards.limiter is not None:
            admitted = guards.limiter.admit(now)
            if isinstance(admitted, Refuse):
                await self._refuser().rate_limited(admitted)
                return None
        breaker = self.breaker = guards.breakers[self.route.name]
        verdict = breaker.before_call(now)
        if verdict.refusal is not None:
            await self._refuser().breaker_open(verdict.refusal)
            return None
        self.ticket = verdict.ticket
        try:
            if verdict.events:  # open -> half-open, for a probe
                with trio.CancelScope(shield=True):
                    await record_changes(self.b, verdict.events)
            bulkhead = self.bulkhead = guards.bulkheads.get(self.route.name)
            if bulkhead is not None:
                got, waited = await guards._enter(bulkhead, budget)
                if isinstance(got, Shed):
                    await self._refuser().shed(got, waited)
                    return None
                self.entered = got
            attempt = guards._plan(guards.now(), budget)  # the wait for a slot used some budget
            if isinstance(attempt, Spent):
                await self._refuser().spent(attempt)
                return None
            self.passage = Passage(guards, self.route.name, self.ticket, attempt, self.entered)
            return self.passage
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """Abandon the ticket unless the call reported (never forwarded, or cancelled:
        the call says nothing about the upstream; abandon makes no transition, so
        there is nothing to record), and free the slot. Only the first call acts."""
        ticket, self.ticket = self.ticket, None
        if ticket is not None and (self.passage is None or not self.passage.reported):
            self.breaker.abandon(ticket, self.guards.now())
        entered, self.entered = self.entered, None
        if entered is not None:
            self.bulkhead.leave(entered)

    def _refuser(self) -> _Refuser:
        return _Refuser(self.b, self.route, self.respond, self.model)


async def record_changes(b, changes: Iterable[brk.StateChange]) -> None:
    """Record breaker transitions. A full ledger stops the run (as a cap event
    would); EvidenceLost propagates, the stop already asked by b.record."""
    for change in changes:
        try:
            await b.record(change.type, **change.fields())
        except LedgerFull as full:
            b.stop(f"ledger full ({full.reason})", full.reason)
            return


class _Refuser:
    """Answer a guard's refusal in the provider's shape and record the guard's event."""

    def __init__(self, b, route, respond, model: str) -> None:
        self.b = b
        self.route = route
        self.respond = respond
        self.model = model

    async def rate_limited(self, refusal: Refuse) -> None:
        await self._refuse(
            "docket_rate_limited",
            refusal.reason,
            rule=f"resilience.{refusal.limit}",
            event=(refusal.type, refusal.fields()),
            retry_after_s=refusal.retry_after_s,
        )

    async def breaker_open(self, refusal: brk.BreakerRefusal) -> None:
        await self._refuse(
            "docket_breaker_open",
            refusal.reason,
            rule="resilience.breaker",
            event=(refusal.type, refusal.fields()),
            retry_after_s=refusal.retry_after_s,
        )

    async def shed(self, shed: Shed, waited_s: float | None) -> None:
        self.b.metrics.load_shed(self.route.name)
        rule = "deadline" if shed.reason == DEADLINE else "resilience.max_queue"
        fields = shed.fields()
        if waited_s is not None:
            fields["waited_s"] = round(waited_s, 6)  # shed in the queue, not on arrival
        await self._refuse(
            "docket_load_shed",
            shed.message,
            rule=rule,
            event=(shed.type, fields),
            retry_after_s=shed.retry_after_s,
        )

    async def spent(self, spent: Spent) -> None:
        await self._refuse(
            "docket_upstream_timeout",
            spent.reason,
            rule=spent.rule,
            event=("policy.denied", {"reason": spent.reason, **spent.fields()}),
            retry_after_s=None,
        )

    async def _refuse(
        self, error_type: str, message: str, *, rule: str, event, retry_after_s
    ) -> None:
        type, fields = event
        try:
            await self.b.record(
                type,
                rule=rule,
                provider=self.route.name,
                model=self.model,
                error_type=error_type,
                **fields,
            )
        except (LedgerFull, EvidenceLost):
            # Said in the answer; a full ledger is also on readiness and in the receipt.
            message = f"{message} (the refusal itself could not be recorded)"
        await self.b.refuse(
            self.respond,
            self.route.kind,
            error_type,
            message,
            rule=rule,
            provider=self.route.name,
            model=self.model,
            retry_after_s=retry_after_s,
            record=False,
        )
