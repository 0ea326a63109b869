"""deadline: deadline.plan_attempt on arrival.         504 docket_upstream_timeout

Also where the call enters the resilience guards (deadline, limiter, breaker,
bulkhead: docs/resilience.md): the Hold it is given is what the next rules ask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact, Unknown
from docket.boundary.rules import budget
from docket.boundary.rules.base import Refusal, Rule
from docket.guards.deadline import Attempt, Spent

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

FACT: Fact[Attempt | Spent] = Fact("deadline")


def spent(plan: Attempt | Spent, f: CallFacts) -> Refusal | None:
    """The deadline's check, and the attempt rule's: no time left for the attempt."""
    if not isinstance(plan, Spent):
        return None
    return Refusal(
        rule=plan.rule,
        error_type="docket_upstream_timeout",
        message=plan.reason,
        provider=f.provider,
        model=f.model,
        fields={"reason": plan.reason, **plan.fields()},
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    host.probe("guards.enter")
    asked = call.facts[budget.FACT]
    # Learned, and let through by the budget rule, before this one is asked.
    assert not isinstance(asked, budget.BadBudget | Unknown)
    call.hold = host.guards.hold(call.route.name, asked)
    call.facts[FACT] = call.hold.deadline()


RULE = Rule("deadline", FACT, spent, learn)
