"""One model call in admission: the facts learned for it (CallFacts, read by the rules'
pure checks) and the call itself (Admitting, which their learners fill).

Admitting: one model call from its arrival until it is forwarded or refused.

The learners (docket/boundary/rules/) fill its facts and take what the guards hand
out; the shell (app.Boundary) reads how far it got when something fails: the
reservation it holds, and whether its model.request is written (the call is then
forward.ModelCall's to close)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Generic, TypeVar

if TYPE_CHECKING:
    from docket.boundary.guarded import Hold
    from docket.boundary.routes import Route
    from docket.guards.caps import Reservation
    from docket.http.server_exchange import Request

T = TypeVar("T")


class Unknown:
    """A fact not learned yet (None is a fact: no deadline header, no limiter)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = Unknown()


class Fact(Generic[T]):
    """The typed key of one rule's fact in CallFacts: `facts[BODY]` is a
    `bytes | BodyProblem` or UNKNOWN, and mypy knows it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Fact({self.name!r})"


class CallFacts:
    """What the boundary has learned about one call, fact by fact. Filled by the
    learners, read (never changed) by admit() and the checks."""

    __slots__ = ("provider", "method", "path", "body_complete", "model", "evidence_lost", "_known")

    def __init__(self, provider: str, method: str, path: str, body_complete: bool) -> None:
        self.provider = provider  # the route's name
        self.method = method
        self.path = path  # what follows the provider prefix, for the endpoint refusal
        self.body_complete = body_complete  # False: unread body, no reuse of the connection
        self.model: str | None = None  # the model the call asks for, once its body is parsed
        self.evidence_lost = False  # the ledger could not take a guard's events
        self._known: dict[str, object] = {}

    def __getitem__(self, fact: Fact[T]) -> T | Unknown:
        return self._known.get(fact.name, UNKNOWN)  # type: ignore[return-value]  # set typed

    def __setitem__(self, fact: Fact[T], value: T) -> None:
        self._known[fact.name] = value

    def known(self) -> dict[str, object]:
        """The facts learned so far, by name (a copy: for tests and reports)."""
        return dict(self._known)


class Admitting:
    __slots__ = ("route", "request", "facts", "arrived", "hold", "reservation", "opened")

    def __init__(self, route: Route, rest: str, request: Request, arrived: float) -> None:
        self.route = route
        self.request = request
        # `rest`: the path after the provider's prefix (v1/chat/completions)
        self.facts = CallFacts(route.name, request.method, rest, request.body_complete)
        self.arrived = arrived  # a caller's deadline counts from here
        self.hold: Hold | None = None  # the resilience guards' hold, once asked
        self.reservation: Reservation | None = None  # the caps' hold on its worst case
        self.opened = False  # its model.request is written
