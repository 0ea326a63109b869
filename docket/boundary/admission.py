"""Admission of one model call: which rule, if any, refuses it. Pure, no I/O.

The boundary (app.py) learns the facts of a call one at a time and, after each,
asks `admit(facts)` what comes next:

    Ask(rule)   learn the fact that rule needs (read the body, ask the caps guard...)
    Refusal     answer it and record it (one place: Boundary.answer_refusal)
    Admitted    forward the call

The order is RULES, and it lives here alone: the shell cannot consult a guard
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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from docket.boundary.providers import RequestFacts
from docket.guards import breaker as brk
from docket.guards import caps as cp
from docket.guards.bulkhead import DEADLINE, Shed
from docket.guards.bulkhead_trio import Entered
from docket.guards.deadline import Attempt, Spent
from docket.guards.limiter import Admit, Refuse

RULES: Final = (
    "auth",
    "body",
    "request",
    "endpoint",
    "budget",
    "caps",
    "deadline",
    "limiter",
    "breaker",
    "bulkhead",
    "attempt",
)
# Which fact each rule reads (endpoint reads the parsed request: no fact of its own).
FACT_OF: Final = {rule: rule for rule in RULES} | {"endpoint": "request"}

# A caps refusal that a retry lifts once the calls in flight settle: when they will
# is not known (the caps guard has no clock), so the agent is told to come back
# shortly, as the breaker tells a caller while its probe is in flight.
CAPS_PENDING_RETRY_S = brk.PROBE_PENDING_RETRY_S


class _Unknown:
    """A fact not learned yet (None is a fact: no deadline header, no limiter)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()


# ---------------------------------------------------------------- facts


@dataclass(frozen=True)
class BodyProblem:
    """The body could not be read: over the size limit, or broken framing."""

    too_large: bool
    message: str
    code: str  # the HTTP layer's name for the fault (body_too_large, bad_chunk...)
    status: int  # the HTTP layer's status for it (413, 400, 408)


@dataclass(frozen=True)
class Unparsed:
    """The body is not the provider's request (providers.BadRequest), texts scrubbed."""

    message: str
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class BadBudget:
    """x-docket-deadline-ms is malformed (deadline.BadDeadline's message)."""

    message: str


@dataclass(frozen=True)
class Waited:
    """The bulkhead shed the call; `waited_s` is set when it was shed in the queue."""

    shed: Shed
    waited_s: float | None = None


@dataclass(slots=True)
class CallFacts:
    """What the boundary has learned about one call, rule by rule. Filled by the
    shell, read (never changed) by admit()."""

    provider: str  # the route's name
    method: str
    path: str  # what follows the provider prefix, for the endpoint refusal
    body_complete: bool  # False: the body is unread, the connection cannot be reused
    auth: bool | _Unknown = UNKNOWN  # the run's token was presented
    body: bytes | BodyProblem | _Unknown = UNKNOWN
    request: RequestFacts | Unparsed | _Unknown = UNKNOWN
    budget: tuple[int, float] | None | BadBudget | _Unknown = UNKNOWN
    caps: cp.Decision | _Unknown = UNKNOWN
    deadline: Attempt | Spent | _Unknown = UNKNOWN
    limiter: Admit | Refuse | None | _Unknown = UNKNOWN  # None: no limiter
    breaker: brk.Verdict | _Unknown = UNKNOWN
    bulkhead: Entered | Waited | None | _Unknown = UNKNOWN  # None: no bulkhead
    attempt: Attempt | Spent | _Unknown = UNKNOWN
    evidence_lost: bool = False  # the ledger could not take a guard's events

    @property
    def model(self) -> str | None:
        request = self.request
        return request.model if isinstance(request, RequestFacts) else None


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


@dataclass(frozen=True)
class Refusal:
    """A docket_* refusal: what to answer, and what to record.

    `event` is the ledger event's type (None: not recorded, the ledger being what
    failed); its fields are rule, provider, model, error_type, then `fields`."""

    rule: str
    error_type: str
    message: str
    provider: str
    model: str | None = None
    event: str | None = "policy.denied"
    fields: Mapping[str, object] = field(default_factory=dict)
    extra: Mapping[str, object] | None = None  # into the error body ({"cap": ...})
    retry_after_s: float | None = None
    status: int | None = None  # when not the error type's own (413, 408...)
    close: bool = False  # the body is unread: the connection carries no other request
    shed: bool = False  # a bulkhead shed (counted in docket_load_shed)


def admit(facts: CallFacts, start: int = 0) -> Ask | Refusal | Admitted:
    """The next step for a call with these facts: the first rule, in RULES order,
    whose fact is unknown (Ask) or that refuses (Refusal); Admitted when none does.

    `start`: begin at RULES[start], the rules before it being known to let the call
    through (the `at` of the last Ask: the shell resumes there, so one call's
    admission walks the rules once, not once per fact)."""
    if facts.evidence_lost:
        return evidence_lost(facts.provider, facts.model)
    for at in range(start, len(_STEPS)):
        name, check = _STEPS[at]
        fact = getattr(facts, name)
        if fact is UNKNOWN:
            return _ASKS[at]
        refusal = check(fact, facts)
        if refusal is not None:
            return refusal
    # Every fact is known and let the call through; the asserts narrow the types.
    assert isinstance(facts.request, RequestFacts) and isinstance(facts.body, bytes)
    assert isinstance(facts.caps, cp.Decision) and facts.caps.reservation is not None
    assert isinstance(facts.attempt, Attempt)
    return Admitted(facts.request, facts.body, facts.caps.reservation, facts.attempt)


# ---------------------------------------------------------------- one check per rule


def _auth(ok: bool, f: CallFacts) -> Refusal | None:
    if ok:
        return None
    return _denied(
        f,
        "auth",
        "docket_unauthorized",
        "this boundary needs the run's token (DOCKET_RUN_TOKEN), sent as the API key",
        own_model=False,
        close=not f.body_complete,
    )


def _body(body: bytes | BodyProblem, f: CallFacts) -> Refusal | None:
    if not isinstance(body, BodyProblem):
        return None
    if body.too_large:
        return _denied(f, "max_request_bytes", "docket_bad_request", body.message, close=True)
    # A body that breaks HTTP's framing or stops arriving: the client's fault, refused
    # like any bad request (never an internal error).
    return _denied(
        f,
        "bad_request",
        "docket_bad_request",
        body.message,
        extra={"code": body.code},
        close=True,
        status=body.status,
    )


def _request(request: RequestFacts | Unparsed, f: CallFacts) -> Refusal | None:
    if not isinstance(request, Unparsed):
        return None
    extra = {k: v for k, v in (("param", request.param), ("code", request.code)) if v is not None}
    return _denied(f, "bad_request", "docket_bad_request", request.message, extra=extra or None)


def _endpoint(request: RequestFacts, f: CallFacts) -> Refusal | None:
    if request.endpoint != "other" and request.model is not None:
        return None
    message = f"{f.method} /{f.path} is not a model call this boundary records"
    return _denied(f, "endpoint", "docket_bad_request", message, own_model=False)


def _budget(budget: object, f: CallFacts) -> Refusal | None:
    if not isinstance(budget, BadBudget):
        return None
    return _denied(
        f,
        "bad_request",
        "docket_bad_request",
        budget.message,
        extra={"param": "x-docket-deadline-ms"},
    )


def _caps(decision: cp.Decision, f: CallFacts) -> Refusal | None:
    refusal = decision.refusal
    if decision.allowed or refusal is None:
        return None
    extra: dict[str, object] = {"cap": refusal.cap}
    if refusal.would_fit_after_settle is not None:
        extra["would_fit_after_settle"] = refusal.would_fit_after_settle
    if refusal.deferred:
        return _denied(
            f,
            refusal.rule,
            "docket_caps_pending",
            refusal.reason,
            extra=extra,
            retry_after_s=CAPS_PENDING_RETRY_S,
        )
    return _denied(f, refusal.rule, "docket_policy_denied", refusal.reason, extra=extra)


def _spent(plan: Attempt | Spent, f: CallFacts) -> Refusal | None:
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


def _limiter(limited: Admit | Refuse | None, f: CallFacts) -> Refusal | None:
    if not isinstance(limited, Refuse):
        return None
    return Refusal(
        rule=f"resilience.{limited.limit}",
        error_type="docket_rate_limited",
        message=limited.reason,
        provider=f.provider,
        model=f.model,
        event=limited.type,
        fields=limited.fields(),
        retry_after_s=limited.retry_after_s,
    )


def _breaker(verdict: brk.Verdict, f: CallFacts) -> Refusal | None:
    refused = verdict.refusal
    if refused is None:
        return None
    return Refusal(
        rule="resilience.breaker",
        error_type="docket_breaker_open",
        message=refused.reason,
        provider=f.provider,
        model=f.model,
        event=refused.type,
        fields=refused.fields(),
        retry_after_s=refused.retry_after_s,
    )


def _bulkhead(slot: Entered | Waited | None, f: CallFacts) -> Refusal | None:
    if not isinstance(slot, Waited):
        return None
    shed = slot.shed
    fields = shed.fields()
    if slot.waited_s is not None:
        fields["waited_s"] = round(slot.waited_s, 6)  # shed in the queue, not on arrival
    return Refusal(
        rule="deadline" if shed.reason == DEADLINE else "resilience.max_queue",
        error_type="docket_load_shed",
        message=shed.message,
        provider=f.provider,
        model=f.model,
        event=shed.type,
        fields=fields,
        retry_after_s=shed.retry_after_s,
        shed=True,
    )


_CHECKS: Final[Mapping[str, Callable[..., Refusal | None]]] = {
    "auth": _auth,
    "body": _body,
    "request": _request,
    "endpoint": _endpoint,
    "budget": _budget,
    "caps": _caps,
    "deadline": _spent,
    "limiter": _limiter,
    "breaker": _breaker,
    "bulkhead": _bulkhead,
    "attempt": _spent,
}
# Per place in RULES: the fact's name and its check; and the Ask for it (frozen: shared).
_STEPS: Final = tuple((FACT_OF[rule], _CHECKS[rule]) for rule in RULES)
_ASKS: Final = tuple(Ask(rule, at) for at, rule in enumerate(RULES))


def _denied(
    f: CallFacts,
    rule: str,
    error_type: str,
    message: str,
    *,
    own_model: bool = True,
    extra: Mapping[str, object] | None = None,
    retry_after_s: float | None = None,
    close: bool = False,
    status: int | None = None,
) -> Refusal:
    """A refusal recorded as policy.denied: reason, then the error body's extra fields.
    `own_model`: name the model the call asks for, when known."""
    return Refusal(
        rule=rule,
        error_type=error_type,
        message=message,
        provider=f.provider,
        model=f.model if own_model else None,
        fields={"reason": message, **(extra or {})},
        extra=extra,
        retry_after_s=retry_after_s,
        close=close,
        status=status,
    )


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
