"""breaker: breaker.CircuitBreaker.before_call.        503 docket_breaker_open"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.guarded import record_changes
from docket.boundary.rules.base import Refusal, Rule, guard_refusal
from docket.guards import breaker as brk
from docket.ledger.limits import EvidenceLost

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

FACT: Fact[brk.Verdict] = Fact("breaker")


def check(verdict: brk.Verdict, f: CallFacts) -> Refusal | None:
    refused = verdict.refusal
    if refused is None:
        return None
    return guard_refusal(f, "resilience.breaker", "docket_breaker_open", refused)


async def learn(host: AdmissionHost, call: Admitting) -> None:
    assert call.hold is not None  # the deadline rule entered the guards
    verdict = call.facts[FACT] = call.hold.breaker()
    if verdict.events:  # open -> half-open, for a probe
        try:
            with trio.CancelScope(shield=True):
                await record_changes(host.recorder, verdict.events)
        except EvidenceLost:
            call.facts.evidence_lost = True


RULE = Rule("breaker", FACT, check, learn)
