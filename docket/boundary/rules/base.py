"""What every admission rule is made of: a refusal, and the Rule shape.

A rule (one file in this package, registered once in admission.RULES) holds:

    FACT     the typed key of the fact it reads (Fact[T]), UNKNOWN until learned
    check    pure: the fact (and the call's request line) -> Refusal, or None to let
             the call through
    learn    the shell's side: the I/O, or the guard's take, that sets the fact

The shell that runs the learners (app.Boundary) is seen through `AdmissionHost`
(docket/boundary/ports.py), so a rule's reach is written down and checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from docket.boundary.calls import CallFacts, Fact

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

T = TypeVar("T")


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


def denied(
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


class GuardRefusal(Protocol):
    """What a resilience guard's own refusal value says (limiter.Refuse,
    breaker.BreakerRefusal): its reason, its ledger event and fields, its Retry-After."""

    @property
    def reason(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def retry_after_s(self) -> float | None: ...

    def fields(self) -> dict[str, Any]: ...


def guard_refusal(f: CallFacts, rule: str, error_type: str, refused: GuardRefusal) -> Refusal:
    """A guard's refusal as the call's, recorded as the guard's own event."""
    return Refusal(
        rule=rule,
        error_type=error_type,
        message=refused.reason,
        provider=f.provider,
        model=f.model,
        event=refused.type,
        fields=refused.fields(),
        retry_after_s=refused.retry_after_s,
    )


Check = Callable[[T, CallFacts], "Refusal | None"]
Learn = Callable[["AdmissionHost", "Admitting"], Awaitable[None]]


@dataclass(frozen=True)
class Rule(Generic[T]):
    """One admission rule: its name (the `rule` a refusal may carry), the fact it
    reads, its pure check, and the learner that sets the fact (None when the fact
    is another rule's, learned before it: endpoint reads the parsed request)."""

    name: str
    fact: Fact[T]
    check: Check[T]
    learn: Learn | None
