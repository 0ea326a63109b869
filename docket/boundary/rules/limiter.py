"""limiter: limiter.RateLimiter.admit.                 429 docket_rate_limited"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.rules.base import Refusal, Rule, guard_refusal
from docket.guards.limiter import Admit, Refuse

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

FACT: Fact[Admit | Refuse | None] = Fact("limiter")  # None: no limiter


def check(limited: Admit | Refuse | None, f: CallFacts) -> Refusal | None:
    if not isinstance(limited, Refuse):
        return None
    return guard_refusal(f, f"resilience.{limited.limit}", "docket_rate_limited", limited)


async def learn(host: AdmissionHost, call: Admitting) -> None:
    assert call.hold is not None  # the deadline rule entered the guards
    call.facts[FACT] = call.hold.limiter()


RULE = Rule("limiter", FACT, check, learn)
