"""Admission of one model call: which rule, if any, refuses it. Pure, no I/O.

The boundary (app.py) learns the facts of a call one at a time and, after each,
asks `admit(facts)` what comes next:

    Ask(rule)   learn the fact that rule needs (read the body, ask the caps guard...)
    Refusal     answer it and record it (one place: Boundary.answer_refusal)
    Admitted    forward the call

Each rule is one file in docket/boundary/rules/ (its fact, its pure check, its
learner) and one line in RULES below. The order is RULES, and it lives here alone: the shell cannot consult a guard
before the rules ahead of it have let the call through, so a refused call takes
no reservation, limiter token, breaker ticket or bulkhead slot it did not need.
Taking those (a side effect) is the shell's, when it learns a fact; the choice
is made here, from the guards' own pure decisions:

    auth        the run's token                         401 docket_unauthorized
    body        the body's size and framing             413/400 docket_bad_request
    request     the body parses as the provider's call  400 docket_bad_request
    endpoint    it is a model call this boundary records 400 docket_bad_request
    budget      x-docket-deadline-ms parses             400 docket_bad_request
    caps        caps.CapsGuard.reserve                  403 docket_policy_denied
                  (under "deny", a call that fits once calls in flight settle:
                   429 docket_caps_pending with Retry-After)
    fleet       fleet.lease.FleetLease.cover            503 docket_fleet_unavailable
    deadline    deadline.plan_attempt                   504 docket_upstream_timeout
    limiter     limiter.RateLimiter.admit               429 docket_rate_limited
    breaker     breaker.CircuitBreaker.before_call      503 docket_breaker_open
    bulkhead    bulkhead_trio.Bulkhead.enter            503 docket_load_shed
    attempt     plan_attempt after the wait for a slot  504 docket_upstream_timeout

`evidence_lost` (the ledger could not take the events a guard's decision made)
refuses ahead of everything once it is known. A Refusal carries all the shell
needs: the HTTP status (by error type), the message, the extra fields of the
error body, Retry-After, whether to close the connection, and the ledger event
with its fields (none for a refusal the ledger cannot take).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from docket.boundary.calls import UNKNOWN, CallFacts
from docket.boundary.providers import RequestFacts
from docket.boundary.rules import (
    attempt,
    auth,
    body,
    breaker,
    budget,
    bulkhead,
    caps,
    deadline,
    endpoint,
    fleet,
    limiter,
    request,
)
from docket.boundary.rules.base import Refusal, Rule
from docket.guards import caps as cp
from docket.guards.deadline import Attempt

# The rules, in the order a call is asked them: the one place a rule is registered.
RULES: Final[tuple[Rule[Any], ...]] = (
    auth.RULE,
    body.RULE,
    request.RULE,
    endpoint.RULE,
    budget.RULE,
    caps.RULE,
    fleet.RULE,
    deadline.RULE,
    limiter.RULE,
    breaker.RULE,
    bulkhead.RULE,
    attempt.RULE,
)
RULE_NAMES: Final = tuple(rule.name for rule in RULES)


# ---------------------------------------------------------------- answers


@dataclass(frozen=True)
class Ask:
    """Learn the fact `rule` needs, then ask again from `at` (its place in RULES: the
    rules before it have let the call through, and need not be walked again)."""

    rule: str
    at: int = 0


@dataclass(frozen=True)
class Admitted:
    """Every rule let the call through: forward it under `attempt`."""

    request: RequestFacts
    body: bytes
    reservation: cp.Reservation  # the caps' hold on the call's worst case
    attempt: Attempt


def admit(facts: CallFacts, start: int = 0) -> Ask | Refusal | Admitted:
    """The next step for a call with these facts: the first rule, in RULES order,
    whose fact is unknown (Ask) or that refuses (Refusal); Admitted when none does.

    `start`: begin at RULES[start], the rules before it being known to let the call
    through (the `at` of the last Ask: the shell resumes there, so one call's
    admission walks the rules once, not once per fact)."""
    if facts.evidence_lost:
        return evidence_lost(facts.provider, facts.model)
    for at in range(start, len(RULES)):
        rule = RULES[at]
        fact = facts[rule.fact]
        if fact is UNKNOWN:
            return _ASKS[at]
        refusal = rule.check(fact, facts)
        if refusal is not None:
            return refusal
    # Every fact is known and let the call through; the asserts narrow the types.
    parsed, data, decision = facts[request.FACT], facts[body.FACT], facts[caps.FACT]
    plan = facts[attempt.FACT]
    assert isinstance(parsed, RequestFacts) and isinstance(data, bytes)
    assert isinstance(decision, cp.Decision) and decision.reservation is not None
    assert isinstance(plan, Attempt)
    return Admitted(parsed, data, decision.reservation, plan)


_ASKS: Final = tuple(Ask(rule.name, at) for at, rule in enumerate(RULES))  # frozen: shared


# ---------------------------------------------------------------- outside the rules


def route_unknown(shown: str, configured: str, provider: str, *, body_complete: bool) -> Refusal:
    """No provider at the path's first segment (`shown`: its name, or a phrase when
    the name is not one to copy into the record)."""
    message = f"no provider {shown} at this boundary; configured: {configured}"
    return Refusal(
        rule="route",
        error_type="docket_bad_request",
        message=message,
        provider=provider,
        fields={"reason": message},
        close=not body_complete,
    )


def internal_error(provider: str, model: str | None, detail: str) -> Refusal:
    """The boundary failed on a call before its model.request (a bug, or a probe)."""
    message = "the boundary failed on this call (internal error); it was recorded"
    extra = {"detail": detail}
    return Refusal(
        rule="internal_error",
        error_type="docket_internal_error",
        message=message,
        provider=provider,
        model=model,
        fields={"reason": message, **extra},
        extra=extra,
        close=True,
    )


def evidence_lost(provider: str, model: str | None) -> Refusal:
    """The ledger could not be written under fail_fast_evidence: not recorded."""
    return Refusal(
        rule="ledger.fail_fast_evidence",
        error_type="docket_evidence_lost",
        message="the ledger could not be written and fail_fast_evidence is set: the run is stopping",
        provider=provider,
        model=model,
        event=None,
    )


def ledger_full(provider: str, model: str | None, reason: str, message: str) -> Refusal:
    """The ledger cannot hold the call's model.request: not recorded (no room)."""
    return Refusal(
        rule=f"ledger.{reason}",
        error_type="docket_ledger_full",
        message=message,
        provider=provider,
        model=model,
        event=None,
        extra={"code": reason},
    )
