"""attempt: plan_attempt after the wait for a slot.    504 docket_upstream_timeout"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docket.boundary.calls import Fact
from docket.boundary.rules.base import Rule
from docket.boundary.rules.deadline import spent
from docket.guards.deadline import Attempt, Spent

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

FACT: Fact[Attempt | Spent] = Fact("attempt")


async def learn(host: AdmissionHost, call: Admitting) -> None:
    assert call.hold is not None  # the deadline rule entered the guards
    call.facts[FACT] = call.hold.attempt()


RULE = Rule("attempt", FACT, spent, learn)
