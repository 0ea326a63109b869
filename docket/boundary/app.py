"""The boundary: the local HTTP endpoint an agent's SDK is pointed at.

Routes: `/<provider>/...` is a model call (intake.Intake: admission, then
forward.ModelCall); `/docket/...` are the boundary's own endpoints (ops.py); a
request in proxy form is the agent's HTTP(S)_PROXY traffic (proxy.py). The
Boundary builds its rooms and holds what they share: the policy, the guards, the
caps, the routes, the metrics and the recorder (the one way to the ledger, and the
one place a full ledger or lost evidence stops the run: recorder.py). Where a
newcomer adds a rule, a provider or an endpoint: docs/adr/0011-boundary-rooms.md.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import trio

from docket.boundary import admission, providers
from docket.boundary.cache import ResponseCache
from docket.boundary.fleet_caps import FleetCapsGuard
from docket.boundary.guarded import Guards
from docket.boundary.intake import Intake
from docket.boundary.metrics import Metrics
from docket.boundary.ops import OpsEndpoints
from docket.boundary.proxy import handle_proxy, is_proxy_request
from docket.boundary.recorder import Recorder
from docket.boundary.routes import ROUTE_NAME, UNKNOWN_ROUTE, make_route
from docket.boundary.stop import StopRequest
from docket.clock import Clock
from docket.fleet.lease import FleetLease
from docket.guards.caps import CapsGuard, Decision, Settlement
from docket.guards.redact import Redactor
from docket.guards.scrub import relay_keys
from docket.http.server import ServerStats, serve
from docket.http.server_connection import ServerConfig
from docket.http.server_exchange import Request, Responder
from docket.http.server_pressure import Episode
from docket.ledger.limits import LedgerFull
from docket.ledger.writer import Ledger
from docket.policy import Policy
from docket.pricing import PriceTable, default_price_table

# Descriptors kept out of max_connections for the ledger, its lock, the process's
# own files and the pools' spare connections (Boundary.max_connections).
FD_HEADROOM = 32

log = logging.getLogger("docket.boundary")


class Boundary:
    def __init__(
        self,
        policy: Policy,
        ledger: Ledger,
        *,
        token: str,
        clock: Clock,
        stop: Callable[[StopRequest], None],
        prices: PriceTable | None = None,
        env: Mapping[str, str] | None = None,
        call_probe: Callable[[str], object] | None = None,
        replay_key: str | None = None,
        fleet: FleetLease | None = None,
    ) -> None:
        self.policy = policy
        self.token = token
        self.clock = clock
        self._stop = stop
        self.server_stats: ServerStats | None = None  # the HTTP server's, once serving
        self.url: str | None = None  # http://127.0.0.1:PORT, once serving
        self.prices = prices or default_price_table()
        # [fleet]: the caps' reservations are drawn from a slice of a shared budget too.
        self.fleet = fleet
        self.caps = (
            CapsGuard(policy.caps, self.prices)
            if fleet is None
            else FleetCapsGuard(policy.caps, self.prices, fleet)
        )
        self.guards = Guards(policy.resilience, policy.providers)
        self.metrics = Metrics(self.guards)
        ledger.on_sync = self.metrics.fsync_done  # the ledger's one listener: its fsync times
        # Off unless [cache] enabled: then admitted calls are looked up (docs/cache.md).
        cache_policy = policy.cache
        self.cache = (
            ResponseCache(cache_policy, self.metrics.cache_outcome)
            if cache_policy is not None and cache_policy.enabled
            else None
        )
        env = os.environ if env is None else env
        self.routes = {
            name: make_route(
                p,
                connect_timeout=policy.boundary.connect_timeout,
                read_timeout=policy.boundary.upstream_timeout,
                env=env,
                max_connections=self.guards.pool_size,
            )
            for name, p in policy.providers.items()
        }
        for route in self.routes.values():
            route.replay_key = replay_key  # docket replay: every route goes to its upstream
        # A harness's probe at each await point of a model call (hooks.CALL_POINTS).
        self.call_probe = call_probe  # RunHooks.call_probe, or None
        # Never written into the ledger, whatever text or encoding they turn up in:
        # every event the boundary records passes self.redactor (see record).
        secrets = [token, *(route.api_key for route in self.routes.values())]
        if fleet is not None:
            secrets.append(fleet.store.dsn)  # it may carry a password (dsn_env)
        self.redactor = Redactor(secrets)
        # The boundary's one way to the ledger: it also decides what a full ledger or
        # lost evidence does to the run (stop it), for every caller.
        self.recorder = Recorder(ledger, self.redactor, stop)
        # Never relayed to the agent either, whatever an upstream echoes (forward.py).
        self.relay_keys = relay_keys(route.api_key for route in self.routes.values())
        if fleet is not None:
            fleet.record = self.record
        self.intake = Intake(self)  # model calls
        self.ops = OpsEndpoints(self)  # /docket/...

    @property
    def ledger(self) -> Ledger:
        return self.recorder.ledger

    def scrub(self, text: str) -> str:
        """`text` with every secret the boundary holds, in any form, replaced by the marker."""
        return self.redactor.scrub(text)

    @functools.cached_property
    def max_connections(self) -> int:
        """The policy's max_connections, lowered to fit the open-file limit: each agent
        connection may hold an upstream one too, and the ledger, its lock and the
        process's own files need some (FD_HEADROOM). docket run raises the soft limit
        to the hard one first, so this bites only where the hard limit is low."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return self.policy.boundary.max_connections
        return min(self.policy.boundary.max_connections, max(8, (soft - FD_HEADROOM) // 2))

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the base URL (http://127.0.0.1:PORT)."""
        try:
            async with trio.open_nursery() as nursery:
                listening = await nursery.start(
                    functools.partial(
                        serve,
                        self.handle,
                        host=self.policy.boundary.host,
                        port=self.policy.boundary.port,
                        # Malformed HTTP the server refuses itself is answered in the
                        # provider's shape too: an agent's SDK parses only that.
                        config=ServerConfig(
                            error_shape=self.error_shape,
                            max_connections=self.max_connections,
                            head_timeout=self.policy.boundary.request_head_timeout,
                        ),
                    )
                )
                self.server_stats = listening.stats
                self.url = listening.url
                nursery.start_soon(self._report_pressure, listening.stats)
                if self.fleet is not None:
                    nursery.start_soon(self.fleet.run)
                task_status.started(listening.url)
        finally:
            if self.fleet is not None:
                with trio.CancelScope(shield=True):  # bounded: the store's timeout
                    await self.fleet.close()
            if self.server_stats is not None:
                with trio.CancelScope(shield=True):
                    # An episode still under way at the end is on record too.
                    await self._record_pressure(self.server_stats.pressure.due(0.0, all=True))
            with trio.CancelScope(shield=True):
                for route in self.routes.values():
                    await route.pool.aclose()

    async def _report_pressure(self, stats: ServerStats) -> None:
        """One connection.pressure event per episode of connection pressure (over the
        cap, heads past their deadline, accept() out of descriptors), with its count:
        never one per connection, which would let any local process fill the ledger."""
        while True:
            end = stats.pressure.next_end()
            if end is None:
                stats.pressure_noted = trio.Event()  # set by the next episode's first note
                await stats.pressure_noted.wait()
                continue
            await trio.sleep_until(end)
            await self._record_pressure(stats.pressure.due(trio.current_time()))

    async def _record_pressure(self, episodes: Iterable[Episode]) -> None:
        for episode in episodes:
            fields = episode.as_fields()
            if episode.kind in ("over_cap", "idle_closed"):
                fields["max_connections"] = self.max_connections
            elif episode.kind == "head_timeout":
                fields["request_head_timeout"] = self.policy.boundary.request_head_timeout
            await self.record("connection.pressure", **fields)

    def error_shape(
        self, status: int, code: str, message: str, target: bytes | None
    ) -> tuple[bytes, bytes]:
        """The body of an answer the HTTP server makes itself (malformed HTTP, an invalid
        Host, a stalled or oversized request: docket.http.server), in the shape of the
        provider the target names: a configured route's, else OpenAI's (what
        most SDKs and a request too broken to name a route get). Not recorded: no
        request was parsed, and an event per malformed request would let any local
        process fill the ledger."""
        provider: providers.Provider = providers.openai
        if target is not None:
            path = target.partition(b"?")[0].decode("latin-1")
            if path.startswith(("http://", "https://")):
                path = urlsplit(path).path
            route = self.routes.get(path.lstrip("/").partition("/")[0])
            if route is not None:
                provider = route.provider
        error_type = "docket_bad_request" if status < 500 else "docket_internal_error"
        body = providers.error_body(
            provider, status, error_type, self.scrub(message), {"code": code}
        )
        return b"application/json", body

    # ------------------------------------------------------------------ recording

    async def record(self, type: str, **fields: object) -> int | None:
        """Append an event through the recorder (redacted; a refused write has asked
        the run to stop before it raises)."""
        return await self.recorder.record(type, **fields)

    async def cap_events(self, outcome: Settlement | Decision) -> None:
        for event in outcome.events:
            try:
                await self.record(event.type, **event.fields())
            except LedgerFull:
                break  # the recorder has stopped the run: nothing more can be recorded
        if outcome.stop_run:
            cap = self.caps.stopped_by
            self.stop(f"cap {cap} breached (on_breach = kill)", cap)

    def note_fault(self) -> None:
        """A chaos fault is about to take effect: no answer in flight now is stored."""
        if self.cache is not None:
            self.cache.note_fault()

    def stop(self, reason: str, cap: str | None, exit_status: int = 42) -> None:
        self._stop(StopRequest(reason, cap=cap, exit_status=exit_status))

    def probe(self, point: str) -> None:
        """A harness's probe at an await point of a model call (hooks.CALL_POINTS)."""
        if self.call_probe is not None:
            self.call_probe(point)

    async def record_cache_problems(self) -> None:
        """Each shared-store problem met since the last call, as a cache.refused event
        (said on stderr already): the run goes on without the store for that call."""
        if self.cache is None:
            return
        for text in self.cache.take_problems():
            await self.record("cache.refused", problem=text)

    # ------------------------------------------------------------------ routing

    async def handle(self, request: Request, respond: Responder) -> None:
        assert self.url is not None  # set before the server hands it a request
        if is_proxy_request(request.method, request.target, self.url):
            await handle_proxy(self, request, respond)  # the agent's HTTP(S)_PROXY traffic
            return
        path = request.path
        if path.startswith(("http://", "https://")):
            # Absolute form (RFC 9112 3.2.2), as a client configured for a proxy sends
            # it: only the path counts; the authority, userinfo and all, is dropped.
            path = urlsplit(path).path or "/"
        if path.startswith("/docket/"):
            await self.ops.serve(request, respond, path)
            return
        name, _, rest = path.lstrip("/").partition("/")
        route = self.routes.get(name)
        if route is None:
            shown = repr(name) if ROUTE_NAME.match(name) else "at this path"
            refusal = admission.route_unknown(
                shown,
                ", ".join(self.routes),
                UNKNOWN_ROUTE,
                body_complete=request.body_complete,
            )
            await self.intake.answer_refusal(respond, providers.openai, refusal)
            return
        await self.intake.model_call(route, rest, request, respond)
