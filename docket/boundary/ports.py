"""What the boundary's parts use of the Boundary: small typed Protocols.

forward.ModelCall, guarded.record_changes, proxy.handle_proxy and metrics.render
are each given the Boundary, but each depends only on the Protocol named here,
so a reader (and mypy) sees what one part can reach, and a test can hand it a
small stand-in. app.Boundary satisfies all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from docket.clock import Clock
from docket.guards.caps import CapsGuard, Decision, Outcome, Totals
from docket.guards.redact import Redactor
from docket.http.client import UpstreamPool
from docket.ledger.pending import ClosingSlot
from docket.policy import Policy


class Recorder(Protocol):
    """The way to the ledger, and to stopping the run when it fails."""

    async def record(self, type: str, **fields: object) -> int | None: ...

    def stop(self, reason: str, cap: str | None, exit_status: int = ...) -> None: ...


class CallMetrics(Protocol):
    def call_finished(self, provider: str, outcome: str, seconds: float) -> None: ...


class Upstream(Protocol):
    """What a call uses of its route (app.Route): where it goes, and with which key."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def api_key(self) -> str: ...
    @property
    def host_header(self) -> str: ...
    @property
    def pool(self) -> UpstreamPool: ...


class CallHost(Recorder, Protocol):
    """What one forwarded call (forward.ModelCall) uses: the caps to settle, the
    clock to time it, the secrets to keep out of its record and its relay, and the
    ledger's closing events."""

    @property
    def policy(self) -> Policy: ...  # policy.ledger.record_bodies
    @property
    def clock(self) -> Clock: ...
    @property
    def caps(self) -> CapsGuard: ...
    @property
    def redactor(self) -> Redactor: ...
    @property
    def relay_keys(self) -> tuple[bytes, ...]: ...
    @property
    def metrics(self) -> CallMetrics: ...
    @property
    def call_probe(self) -> Callable[[str], object] | None: ...

    def scrub(self, text: str) -> str: ...

    async def cap_events(self, outcome: Outcome | Decision) -> None: ...

    async def record_closing(
        self, slot: ClosingSlot, type: str, *, optional: Iterable[str] = ..., **fields: object
    ) -> int | None: ...

    async def record_cache_problems(self) -> None: ...


class RoomCheck(Protocol):
    def check_room(
        self, type: str, body_bytes: int = ..., *, closing_bytes: int | None = ...
    ) -> None: ...


class ProxyHost(Recorder, Protocol):
    """What the forward proxy (proxy.handle_proxy) uses: the token it checks, the
    policy's egress rule and timeouts, the ledger's room for a net.connect."""

    @property
    def token(self) -> str: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def ledger(self) -> RoomCheck: ...

    def scrub(self, text: str) -> str: ...


class TotalsSource(Protocol):
    def totals(self) -> Totals: ...


class LedgerStats(Protocol):
    @property
    def unwritten_events(self) -> int: ...


class LedgerCounts(Protocol):
    @property
    def count(self) -> int: ...
    @property
    def stats(self) -> LedgerStats: ...


class MetricsSource(Protocol):
    """What a metrics scrape (metrics.render) reads: the caps' totals and the ledger's
    counters, at the moment of the scrape."""

    @property
    def caps(self) -> TotalsSource: ...
    @property
    def ledger(self) -> LedgerCounts: ...
