"""What the boundary's parts use of the Boundary: small typed Protocols.

forward.ModelCall, guarded.record_changes, proxy.handle_proxy and metrics.render
are each given the Boundary, but each depends only on the Protocol named here,
so a reader (and mypy) sees what one part can reach, and a test can hand it a
small stand-in. app.Boundary satisfies all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Protocol

from docket.boundary.providers import Provider
from docket.boundary.recorder import Recorder
from docket.clock import Clock
from docket.guards.caps import CapsGuard, Decision, Settlement, Totals
from docket.guards.redact import Redactor
from docket.http.client import UpstreamPool
from docket.policy import Policy

if TYPE_CHECKING:  # guarded.py's Hold is what the learners take; it needs none of this
    from docket.boundary.cache import ResponseCache
    from docket.boundary.guarded import Guards
    from docket.fleet.lease import FleetLease
    from docket.http.server import ServerStats


class CallMetrics(Protocol):
    def call_finished(self, provider: str, outcome: str, seconds: float) -> None: ...


class Upstream(Protocol):
    """What a call uses of its route (routes.Route): where it goes, and with which key."""

    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def api_key(self) -> str: ...
    @property
    def host_header(self) -> str: ...
    @property
    def pool(self) -> UpstreamPool: ...
    @property
    def replay_key(self) -> str | None: ...  # docket replay's key for this route (replayed.py)


class CallHost(Protocol):
    """What one forwarded call (forward.ModelCall) uses: the caps to settle, the
    clock to time it, the secrets to keep out of its record and its relay, and the
    recorder for its closing event."""

    @property
    def recorder(self) -> Recorder: ...

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

    async def cap_events(self, outcome: Settlement | Decision) -> None: ...

    async def record_cache_problems(self) -> None: ...


class ProxyHost(Protocol):
    """What the forward proxy (proxy.handle_proxy) uses: the token it checks, the
    policy's egress rule and timeouts, the recorder (and the ledger's room for a
    net.connect through it)."""

    @property
    def recorder(self) -> Recorder: ...

    @property
    def token(self) -> str: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def clock(self) -> Clock: ...
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


class CacheEntries(Protocol):
    """The response cache, as a scrape reads it: how many answers its store holds."""

    @property
    def store(self) -> Sized: ...


class MetricsSource(Protocol):
    """What a metrics scrape (metrics.render) reads: the caps' totals, the ledger's
    counters and the response cache's size (None: no cache), at the moment of the scrape."""

    @property
    def caps(self) -> TotalsSource: ...
    @property
    def ledger(self) -> LedgerCounts: ...
    @property
    def cache(self) -> CacheEntries | None: ...


class AdmissionHost(Protocol):
    """What an admission rule's learner (docket/boundary/rules/) uses of the boundary:
    the token it checks, the scrubber for messages that quote the request, the harness's
    probe, the caps and resilience guards it asks, and the recorder for their events."""

    @property
    def token(self) -> str: ...
    @property
    def caps(self) -> CapsGuard: ...
    @property
    def fleet(self) -> FleetLease | None: ...  # [fleet]: the budget shared by many runs
    @property
    def guards(self) -> Guards: ...
    @property
    def recorder(self) -> Recorder: ...

    def scrub(self, text: str) -> str: ...

    def probe(self, point: str) -> None: ...

    async def cap_events(self, outcome: Settlement | Decision) -> None: ...


class IntakeMetrics(CallMetrics, Protocol):
    def refused(self, provider: str, error_type: str) -> None: ...
    def load_shed(self, upstream: str) -> None: ...
    def cache_outcome(self, provider: str, outcome: str, saved_nusd: int = ...) -> None: ...


class IntakeHost(CallHost, AdmissionHost, Protocol):
    """What intake.Intake uses: everything a forwarded call and a rule's learner use,
    the response cache (None when off) and the metrics of refusals and cache hits."""

    @property
    def metrics(self) -> IntakeMetrics: ...
    @property
    def cache(self) -> ResponseCache | None: ...


class MetricsText(Protocol):
    def render(self, boundary: MetricsSource) -> str: ...


class OpsHost(MetricsSource, Protocol):
    """What the `/docket/...` endpoints (ops.OpsEndpoints) read: readiness from the
    guards, the server and the ledger; the metrics text; the token that guards the
    backoff report, and the recorder it is written through."""

    @property
    def token(self) -> str: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def guards(self) -> Guards: ...
    @property
    def server_stats(self) -> ServerStats | None: ...
    @property
    def recorder(self) -> Recorder: ...
    @property
    def metrics(self) -> MetricsText: ...
