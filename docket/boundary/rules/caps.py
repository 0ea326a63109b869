"""caps: caps.CapsGuard.reserve.                       403 docket_policy_denied

Under budget mode "deny", a call that fits once the calls in flight settle is
deferred instead: 429 docket_caps_pending with Retry-After."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.providers import RequestFacts
from docket.boundary.rules import body, request
from docket.boundary.rules.base import Refusal, Rule, denied
from docket.guards import breaker as brk
from docket.guards.caps import Decision
from docket.ledger.limits import EvidenceLost

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

# A caps refusal that a retry lifts once the calls in flight settle: when they will
# is not known (the caps guard has no clock), so the agent is told to come back
# shortly, as the breaker tells a caller while its probe is in flight.
CAPS_PENDING_RETRY_S = brk.PROBE_PENDING_RETRY_S

FACT: Fact[Decision] = Fact("caps")


def check(decision: Decision, f: CallFacts) -> Refusal | None:
    refusal = decision.refusal
    if decision.allowed or refusal is None:
        return None
    extra: dict[str, object] = {"cap": refusal.cap}
    if refusal.would_fit_after_settle is not None:
        extra["would_fit_after_settle"] = refusal.would_fit_after_settle
    if refusal.deferred:
        return denied(
            f,
            refusal.rule,
            "docket_caps_pending",
            refusal.reason,
            extra=extra,
            retry_after_s=CAPS_PENDING_RETRY_S,
        )
    return denied(f, refusal.rule, "docket_policy_denied", refusal.reason, extra=extra)


async def learn(host: AdmissionHost, call: Admitting) -> None:
    facts = call.facts
    parsed, data = facts[request.FACT], facts[body.FACT]
    assert isinstance(parsed, RequestFacts) and isinstance(data, bytes)
    decision = host.caps.reserve(
        model=parsed.model or "",
        request_bytes=len(data),
        max_output_tokens=parsed.output_tokens_bound,
    )
    facts[FACT], call.reservation = decision, decision.reservation
    # Shielded, like the model.request: once a reservation is held or an event is
    # on its way to disk, a stopping run must not leave it half done.
    try:
        host.probe("caps.record")
        if decision.events or decision.stop_run:  # else there is nothing to write
            with trio.CancelScope(shield=True):
                await host.cap_events(decision)
    except EvidenceLost:
        facts.evidence_lost = True


RULE = Rule("caps", FACT, check, learn)
