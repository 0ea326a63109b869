"""budget: x-docket-deadline-ms parses.                400 docket_bad_request"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.rules.base import Refusal, Rule, denied
from docket.guards.deadline import BadDeadline, caller_budget

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost


@dataclass(frozen=True)
class BadBudget:
    """x-docket-deadline-ms is malformed (deadline.BadDeadline's message)."""

    message: str


# (milliseconds asked, the monotonic reading it counts from), None: no header
FACT: Fact[tuple[int, float] | None | BadBudget] = Fact("budget")


def check(budget: tuple[int, float] | None | BadBudget, f: CallFacts) -> Refusal | None:
    if not isinstance(budget, BadBudget):
        return None
    return denied(
        f,
        "bad_request",
        "docket_bad_request",
        budget.message,
        extra={"param": "x-docket-deadline-ms"},
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    try:
        call.facts[FACT] = caller_budget(call.request.headers, call.arrived)
    except BadDeadline as exc:
        call.facts[FACT] = BadBudget(str(exc))


RULE = Rule("budget", FACT, check, learn)
