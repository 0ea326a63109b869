"""The boundary: the local HTTP endpoint an agent's SDK is pointed at.

Routes: `/<provider>/...` forwards a model call to that provider (the guards
first, then forward.ModelCall); `/docket/...` are the boundary's own endpoints
(healthz, readyz, metrics, agent/backoff). Every refusal is answered in the
provider's own error shape with a docket_* type and recorded with the rule that
refused it, in one place (Boundary.answer_refusal). Which rule refuses a call is
decided by admission.admit, a pure function of the facts this module learns for
it (docs/adr/0010-admission.md).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import re
import resource
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from docket.boundary import admission, providers
from docket.boundary.admission import Admitted, Ask, CallFacts, Refusal, admit
from docket.boundary.cache import Lookup, ResponseCache
from docket.boundary.forward import (
    ModelCall,
    closing_bound,
    forwarded_fields,
    recorded_body,
    request_digest,
)
from docket.boundary.guarded import Guards, Hold, Passage, record_changes
from docket.boundary.metrics import Metrics
from docket.boundary.non_model import non_model_endpoint, relay_non_model
from docket.boundary.providers.client_marks import client_marks
from docket.boundary.proxy import handle_proxy, is_proxy_request
from docket.boundary.stop import StopRequest
from docket.cache.store import Hit
from docket.errors import EXIT_EVIDENCE_LOST
from docket.guards.caps import CapsGuard, Decision, Reservation
from docket.guards.deadline import BadDeadline, caller_budget
from docket.guards.redact import Redactor, sanitize_url
from docket.guards.scrub import relay_keys
from docket.http.client import UpstreamPool
from docket.http.server import ServerStats, serve
from docket.http.server_connection import ServerConfig
from docket.http.server_errors import BodyTooLarge, ClientGone, RequestError
from docket.ledger.limits import EvidenceLost, LedgerFull

MAX_REQUEST_BYTES = 32 << 20
# What a path's first segment must look like to be named in a route refusal's
# record; anything else (a URL's userinfo, a key pasted into a base URL) is not copied.
_ROUTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
UNKNOWN_ROUTE = "(none)"  # the provider label of a refusal for an unknown route
MAX_REPORTED = 2**53 - 1  # the largest integer an agent's report may carry (exact in JSON)
# Descriptors kept out of max_connections for the ledger, its lock, the process's
# own files and the pools' spare connections (Boundary.max_connections).
FD_HEADROOM = 32

log = logging.getLogger("docket.boundary")


class _CallState:
    """How far one model call got, for the answer to an unexpected error: the
    reservation it holds and whether its model.request is written (the call is then
    ModelCall's to close)."""

    __slots__ = ("model", "opened", "reservation")

    def __init__(self) -> None:
        self.model: str | None = None
        self.reservation: Reservation | None = None
        self.opened = False


class _Learning:
    """One call while admission learns its facts: the facts, and what the guards
    hand it (the Hold, once the resilience guards are asked)."""

    __slots__ = ("route", "request", "facts", "arrived", "state", "hold")

    def __init__(
        self, route: Route, request, facts: CallFacts, arrived: float, state: _CallState
    ) -> None:
        self.route = route
        self.request = request
        self.facts = facts
        self.arrived = arrived  # a caller's deadline counts from here
        self.state = state
        self.hold: Hold | None = None


@dataclass
class Route:
    """One configured provider: where `/<name>/...` goes and with which key."""

    name: str
    kind: str
    api_key: str
    pool: UpstreamPool
    host_header: str
    path_prefix: str

    def target(self, rest: str, query: str) -> str:
        return f"{self.path_prefix}/{rest}" + (f"?{query}" if query else "")


def make_route(
    provider, *, connect_timeout: float, read_timeout: float, env, max_connections: int | None
) -> Route:
    """`max_connections`: the bulkhead's slots when it has one (one limit, not two),
    else the pool's own default."""
    parts = urlsplit(provider.base_url)
    default_port = 443 if parts.scheme == "https" else 80
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # urlsplit drops an IPv6 address's brackets; the Host header keeps them
    host_header = host if (parts.port or default_port) == default_port else f"{host}:{parts.port}"
    origin = f"{parts.scheme}://{parts.netloc}"
    if max_connections is None:
        pool = UpstreamPool(origin, connect_timeout=connect_timeout, read_timeout=read_timeout)
    else:
        pool = UpstreamPool(
            origin,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_connections=max_connections,
        )
    return Route(
        name=provider.name,
        kind=provider.kind,
        api_key=env.get(provider.key_env, ""),
        pool=pool,
        host_header=host_header,
        path_prefix=parts.path.rstrip("/"),
    )


class Boundary:
    def __init__(self, policy, ledger, *, token: str, clock, stop, prices=None, env=None) -> None:
        from docket.pricing import default_price_table

        self.policy = policy
        self.ledger = ledger
        self.token = token
        self.clock = clock
        self._stop = stop
        self.server_stats: ServerStats | None = None  # the HTTP server's, once serving
        self._stop_request = StopRequest
        self.prices = prices or default_price_table()
        self.caps = CapsGuard(policy.caps, self.prices)
        self.guards = Guards(policy.resilience, policy.providers)
        self.metrics = Metrics()
        self.metrics.guards = self.guards
        ledger.on_sync = self.metrics.fsync_done
        # Off unless [cache] enabled: then admitted calls are looked up (docs/cache.md).
        cache_policy = getattr(policy, "cache", None)
        self.cache = (
            ResponseCache(cache_policy, self.metrics.cache_outcome)
            if cache_policy is not None and cache_policy.enabled
            else None
        )
        if self.cache is not None:
            self.metrics.cache_store = self.cache.store
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
        # A harness's probe at each await point of a model call (hooks.CALL_POINTS).
        self.call_probe: Callable[[str], object] | None = None  # RunHooks.call_probe
        self._call_ids = itertools.count(1)
        self._call_prefix = secrets.token_hex(3)
        # Never written into the ledger, whatever text or encoding they turn up in:
        # every event the boundary records passes self.redactor (see record).
        self.redactor = Redactor([token, *(route.api_key for route in self.routes.values())])
        # Never relayed to the agent either, whatever an upstream echoes (forward.py).
        self.relay_keys = relay_keys(route.api_key for route in self.routes.values())

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

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
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
                task_status.started(listening.url)
        finally:
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

    async def _record_pressure(self, episodes) -> None:
        for episode in episodes:
            fields = episode.as_fields()
            if episode.kind in ("over_cap", "idle_closed"):
                fields["max_connections"] = self.max_connections
            elif episode.kind == "head_timeout":
                fields["request_head_timeout"] = self.policy.boundary.request_head_timeout
            await self.record("connection.pressure", **fields)

    def error_shape(self, status: int, code: str, message: str, target: bytes | None):
        """The body of an answer the HTTP server makes itself (malformed HTTP, an invalid
        Host, a stalled or oversized request: docket.http.server), in the shape of the
        provider the target names: a configured route's kind, else OpenAI's (what
        most SDKs and a request too broken to name a route get). Not recorded: no
        request was parsed, and an event per malformed request would let any local
        process fill the ledger."""
        kind = "openai"
        if target is not None:
            path = target.partition(b"?")[0].decode("latin-1")
            if path.startswith(("http://", "https://")):
                path = urlsplit(path).path
            route = self.routes.get(path.lstrip("/").partition("/")[0])
            if route is not None:
                kind = route.kind
        error_type = "docket_bad_request" if status < 500 else "docket_internal_error"
        body = providers.error_body(kind, status, error_type, self.scrub(message), {"code": code})
        return b"application/json", body

    # ------------------------------------------------------------------ recording

    async def record(self, type: str, **fields) -> int | None:
        """Append an event. Losing evidence under fail_fast_evidence stops the run.

        This and its two siblings are the boundary's only way to the ledger, and each
        passes the fields through self.redactor first: no known secret, in any form,
        reaches an event, whichever caller built it from whichever bytes."""
        try:
            return await self.ledger.append(type, **self.redactor.fields(fields))
        except EvidenceLost:
            self._evidence_lost()
            raise

    async def record_opening(self, type: str, *, closing_bytes: int, **fields):
        """`record` for an event that holds room for its closing event: (seq, slot).
        Not cancellable (a cancellation is delivered after it): once a model.request
        is on its way to disk, a stopping run must not leave it without its slot."""
        try:
            return await self.ledger.append_opening(
                type, closing_bytes=closing_bytes, shield=True, **self.redactor.fields(fields)
            )
        except EvidenceLost:
            self._evidence_lost()
            raise

    async def record_closing(self, slot, type: str, *, optional=(), **fields) -> int | None:
        """`record` for the event that closes `slot`: no ceiling refuses it. Not
        cancellable, like record_opening: a closing event, once started, is finished."""
        try:
            return await self.ledger.append_closing(
                slot, type, optional=optional, shield=True, **self.redactor.fields(fields)
            )
        except EvidenceLost:
            self._evidence_lost()
            raise

    def _evidence_lost(self) -> None:
        # Plain try/except in the three callers, not a @contextmanager: they are on
        # every call's path, twice, and the generator machinery showed in profiles.
        self.stop("evidence could not be written (fail_fast_evidence)", None, EXIT_EVIDENCE_LOST)

    async def cap_events(self, outcome) -> None:
        for event in outcome.events:
            try:
                await self.record(event.type, **event.fields())
            except LedgerFull as full:
                # The ledger cannot take a cap event: the run cannot go on being recorded.
                self.stop(f"ledger full ({full.reason})", full.reason)
                break
        if outcome.stop_run:
            cap = self.caps.stopped_by
            self.stop(f"cap {cap} breached (on_breach = kill)", cap)

    def note_fault(self) -> None:
        """A chaos fault is about to take effect: no answer in flight now is stored."""
        if self.cache is not None:
            self.cache.note_fault()

    def stop(self, reason: str, cap: str | None, exit_status: int = 42) -> None:
        self._stop(self._stop_request(reason, cap=cap, exit_status=exit_status))

    async def answer_refusal(
        self, respond, kind: str, refusal: Refusal, request_headers=None
    ) -> None:
        """The one place a refusal is recorded and answered: its event (unless the
        ledger is what failed), then the answer in the provider's shape. An answer
        whose event could not be written says so. Given the request's headers, the
        event carries the client's attempt marker and ids as a model.request would
        (docs/clients.md): a refused attempt is still the client's attempt."""
        message = refusal.message
        if refusal.event is not None:
            marks = (
                client_marks(request_headers, self.scrub).as_fields()
                if request_headers is not None
                else {}
            )
            try:
                await self.record(
                    refusal.event,
                    rule=refusal.rule,
                    provider=refusal.provider,
                    model=refusal.model or "",
                    error_type=refusal.error_type,
                    **refusal.fields,
                    **marks,
                )
            except (LedgerFull, EvidenceLost):
                # Said in the answer; a full ledger is also on readiness and in the receipt.
                message = f"{message} (the refusal itself could not be recorded)"
        if refusal.shed:
            self.metrics.load_shed(refusal.provider)
        answer = providers.refusal(
            kind,
            refusal.error_type,
            message,
            extra=dict(refusal.extra) if refusal.extra else None,
            retry_after_s=refusal.retry_after_s,
            status=refusal.status,
        )
        self.metrics.refused(refusal.provider, refusal.error_type)
        # An unread body: say the connection closes, or a keep-alive client sends its
        # next request into a closing socket.
        close = refusal.close
        headers = [*answer.headers, (b"connection", b"close")] if close else answer.headers
        await respond.simple(answer.status, headers, answer.body)

    # ------------------------------------------------------------------ routing

    async def handle(self, request, respond) -> None:
        if is_proxy_request(request.method, request.target, self.url):
            await handle_proxy(self, request, respond)  # the agent's HTTP(S)_PROXY traffic
            return
        path = request.path
        if path.startswith(("http://", "https://")):
            # Absolute form (RFC 9112 3.2.2), as a client configured for a proxy sends
            # it: only the path counts; the authority, userinfo and all, is dropped.
            path = urlsplit(path).path or "/"
        if path.startswith("/docket/"):
            await self.ops(request, respond, path)
            return
        name, _, rest = path.lstrip("/").partition("/")
        route = self.routes.get(name)
        if route is None:
            shown = repr(name) if _ROUTE_NAME.match(name) else "at this path"
            refusal = admission.route_unknown(
                shown,
                ", ".join(self.routes),
                UNKNOWN_ROUTE,
                body_complete=request.body_complete,
            )
            await self.answer_refusal(respond, "openai", refusal)
            return
        await self.model_call(route, rest, request, respond)

    async def model_call(self, route: Route, rest: str, request, respond) -> None:
        """One call to a provider. Whatever raises on its way is answered in the
        provider's shape (500 docket_internal_error) and recorded: a call with a
        model.request is closed by ModelCall (model.error internal_error); one
        without is a policy.denied with rule internal_error, its reservation
        released (it never left). The boundary goes on serving."""
        state = _CallState()
        try:
            await self._model_call(route, rest, request, respond, state)
        except Exception as exc:
            if _only(exc, ClientGone):
                raise  # the client left: nobody to answer (the call is closed as client_abort)
            await self._internal_error(route, request, respond, state, exc)

    async def _internal_error(self, route, request, respond, state, exc) -> None:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.error("model call to %s failed inside the boundary: %s", route.name, what)
        message = "the boundary failed on this call (internal error); it was recorded"
        if state.opened:
            # ModelCall has closed the call (model.error, internal_error): answer only.
            if respond.started:
                await respond.abort()  # a started answer must not look complete
                return
            answer = providers.refusal(route.kind, "docket_internal_error", message)
            headers = [*answer.headers, (b"connection", b"close")]
            await respond.simple(answer.status, headers, answer.body)
            return
        if self.caps.outstanding(state.reservation):
            self.caps.cancel(state.reservation)  # never forwarded
        refusal = admission.internal_error(route.name, state.model, self.scrub(what)[:300])
        await self.answer_refusal(respond, route.kind, refusal)

    async def _model_call(
        self, route: Route, rest: str, request, respond, state: _CallState
    ) -> None:
        """Learn the call's facts in the order admission.admit asks for them, then
        answer its refusal or forward it. Whatever a refused call took (a
        reservation, a breaker ticket, a bulkhead slot) is given back first."""
        facts = CallFacts(route.name, request.method, rest, request.body_complete)
        call = _Learning(route, request, facts, self.guards.now(), state)
        listing = non_model_endpoint(request.method, "/" + rest)
        try:
            step = admit(facts)
            while isinstance(step, Ask):
                await self._learners[step.rule](self, call)
                if listing is not None and isinstance(facts.request, providers.RequestFacts):
                    break  # authorised and readable: a models list or lookup, relayed below
                step = admit(facts, step.at)
        except BaseException:
            self._give_back(call)
            raise
        if isinstance(step, Ask):  # the loop stopped early: a models list or lookup, so
            # relayed and recorded as provider.call: no spend, no reservation, nothing held.
            assert listing is not None
            await relay_non_model(self, route, rest, request, respond, listing)
            return
        if isinstance(step, Refusal):
            self._give_back(call)
            await self.answer_refusal(respond, route.kind, step, request.headers)
            return
        hold = call.hold
        assert hold is not None  # admitted: the guards were asked
        try:
            lookup = None
            if self.cache is not None:
                found = await self.cache.consult(
                    route.name,
                    route.target(rest, request.query),
                    endpoint=step.request.endpoint,
                    model=step.request.model,
                    choices=step.request.choices,
                    payload=step.request.payload,
                    body=step.body,
                    now=self.clock.mono(),
                    kind=route.kind,
                    headers=request.headers,
                )
                await self.record_cache_problems()
                if isinstance(found, Hit):
                    await self._serve_hit(route, respond, step, found, state)
                    return
                lookup = found
            passage = hold.pass_through(step.attempt)
            await self._forward(route, rest, request, respond, step, passage, state, lookup)
        finally:
            hold.leave()

    async def record_cache_problems(self) -> None:
        """Each shared-store problem met since the last call, as a cache.refused event
        (said on stderr already): the run goes on without the store for that call."""
        if self.cache is None:
            return
        for text in self.cache.take_problems():
            await self.record("cache.refused", problem=text)

    async def _serve_hit(
        self, route: Route, respond, admitted: Admitted, hit: Hit, state: _CallState
    ) -> None:
        """Answer from the cache: nothing is forwarded, so the reservation is
        cancelled (a hit spends nothing) and the breaker hears nothing (the ticket is
        abandoned by hold.leave). The cache.hit event is durable before the answer."""
        facts, entry = admitted.request, hit.entry
        self.caps.cancel(admitted.reservation)
        try:
            await self.record(
                "cache.hit",
                provider=route.name,
                model=facts.model,
                endpoint=facts.endpoint,
                stream=entry.stream,
                request_sha256=entry.key.request_sha256,
                body_sha256=entry.body_sha256,  # what is served, as its origin recorded it
                replays_seq=entry.seq,
                **({"replays_run": entry.run_id} if entry.run_id else {}),
                age_ms=int(hit.age_s * 1000),
                hits=hit.hits,
                saved_nusd=entry.cost_nusd,
            )
        except LedgerFull as full:
            self.stop(f"ledger full ({full.reason})", full.reason)
            refusal = admission.ledger_full(route.name, facts.model, full.reason, str(full))
            await self.answer_refusal(respond, route.kind, refusal)
            return
        except EvidenceLost:
            refusal = admission.evidence_lost(route.name, facts.model)
            await self.answer_refusal(respond, route.kind, refusal)
            return
        state.opened = True  # recorded: an error from here on is answered, not recorded again
        self.metrics.cache_outcome(route.name, "hit", entry.cost_nusd)
        headers = [*entry.headers, (b"x-docket-cache", b"hit")]
        if entry.stream:
            await respond.start(entry.status, headers, body=entry.body)
            await respond.end()
        else:
            await respond.simple(entry.status, headers, entry.body)

    def _give_back(self, call: _Learning) -> None:
        """A call that will not be forwarded: release its reservation (never charged:
        it never left) and leave the guards."""
        decision = call.facts.caps
        if isinstance(decision, Decision):
            held = decision.reservation
            if held is not None and self.caps.outstanding(held):
                self.caps.cancel(held)
        if call.hold is not None:
            call.hold.leave()

    # One method per fact admit() may ask for (admission.RULES, less endpoint, which
    # reads the parsed request). Each does the I/O or takes what the guard hands out;
    # none decides.

    async def _learn_auth(self, call: _Learning) -> None:
        call.facts.auth = providers.token_matches(
            providers.presented_token(call.request.headers), self.token
        )

    async def _learn_body(self, call: _Learning) -> None:
        try:
            self._probe("request.read")
            call.facts.body = await call.request.read_body(limit=MAX_REQUEST_BYTES)
        except BodyTooLarge as exc:
            call.facts.body = admission.BodyProblem(
                True, f"request body over {MAX_REQUEST_BYTES} bytes", exc.code, exc.status
            )
        except RequestError as exc:
            # A chunk size not in hex, a chunk longer than its size, a body that stops
            # arriving. Nothing was reserved or forwarded.
            call.facts.body = admission.BodyProblem(
                False, self.scrub(str(exc)), exc.code, exc.status
            )

    async def _learn_request(self, call: _Learning) -> None:
        body = call.facts.body
        assert isinstance(body, bytes)
        request = call.request
        try:
            path = "/" + call.facts.path
            call.facts.request = providers.request_facts(
                call.route.kind, path, request.headers, body, method=request.method
            )
        except providers.BadRequest as exc:
            # Scrubbed: the message may quote the body (a member's name or value).
            call.facts.request = admission.Unparsed(
                self.scrub(str(exc)),
                None if exc.param is None else self.scrub(exc.param),
                None if exc.code is None else self.scrub(exc.code),
            )

    async def _learn_budget(self, call: _Learning) -> None:
        try:
            call.facts.budget = caller_budget(call.request.headers, call.arrived)
        except BadDeadline as exc:
            call.facts.budget = admission.BadBudget(str(exc))

    async def _learn_caps(self, call: _Learning) -> None:
        facts = call.facts
        request, body = facts.request, facts.body
        assert isinstance(request, providers.RequestFacts) and isinstance(body, bytes)
        call.state.model = request.model
        decision = self.caps.reserve(
            model=request.model or "",
            request_bytes=len(body),
            max_output_tokens=request.output_tokens_bound,
        )
        facts.caps, call.state.reservation = decision, decision.reservation
        # Shielded, like the model.request: once a reservation is held or an event is
        # on its way to disk, a stopping run must not leave it half done.
        try:
            self._probe("caps.record")
            if decision.events or decision.stop_run:  # else there is nothing to write
                with trio.CancelScope(shield=True):
                    await self.cap_events(decision)
        except EvidenceLost:
            facts.evidence_lost = True

    async def _learn_deadline(self, call: _Learning) -> None:
        # The resilience guards (DESIGN.md §5): deadline, limiter, breaker, bulkhead.
        self._probe("guards.enter")
        budget = call.facts.budget
        assert not isinstance(budget, admission.BadBudget | admission._Unknown)
        call.hold = self.guards.hold(call.route.name, budget)
        call.facts.deadline = call.hold.deadline()

    async def _learn_limiter(self, call: _Learning) -> None:
        assert call.hold is not None
        call.facts.limiter = call.hold.limiter()

    async def _learn_breaker(self, call: _Learning) -> None:
        assert call.hold is not None
        verdict = call.facts.breaker = call.hold.breaker()
        if verdict.events:  # open -> half-open, for a probe
            try:
                with trio.CancelScope(shield=True):
                    await record_changes(self, verdict.events)
            except EvidenceLost:
                call.facts.evidence_lost = True

    async def _learn_bulkhead(self, call: _Learning) -> None:
        assert call.hold is not None
        call.facts.bulkhead = await call.hold.bulkhead()

    async def _learn_attempt(self, call: _Learning) -> None:
        assert call.hold is not None
        call.facts.attempt = call.hold.attempt()

    _learners: dict[str, Callable[[Boundary, _Learning], Awaitable[None]]] = {
        "auth": _learn_auth,
        "body": _learn_body,
        "request": _learn_request,
        "budget": _learn_budget,
        "caps": _learn_caps,
        "deadline": _learn_deadline,
        "limiter": _learn_limiter,
        "breaker": _learn_breaker,
        "bulkhead": _learn_bulkhead,
        "attempt": _learn_attempt,
    }

    def _probe(self, point: str) -> None:
        if self.call_probe is not None:
            self.call_probe(point)

    async def _forward(
        self,
        route: Route,
        rest: str,
        request,
        respond,
        admitted: Admitted,
        passage: Passage,
        state: _CallState,
        lookup: Lookup | None = None,
    ) -> None:
        """Record the model.request, then hand the call to ModelCall."""
        facts, body, reservation = admitted.request, admitted.body, admitted.reservation
        call_id = f"{self._call_prefix}-{next(self._call_ids)}"
        body_fields = (
            recorded_body("request", body, self.redactor)
            if self.policy.ledger.record_bodies
            else {}
        )
        # Made before the model.request is written, so that nothing can fail between
        # that write and the call's own closing machinery.
        call = ModelCall(self, route, facts, reservation, body, call_id, None, passage)
        cache_fields: dict[str, object] = {}
        if lookup is not None:
            call.cache, call.lookup = self.cache, lookup
            if lookup.refusal is None:
                cache_fields["cache"] = "miss"  # looked up, not found: forwarded
        try:
            self._probe("request.record")
            # Refused unless the ledger can also hold this call's closing event. Not
            # cancellable (see record_opening), without a shielded scope's cost.
            _, slot = await self.record_opening(
                "model.request",
                closing_bytes=closing_bound(call_id, route.name, facts.model),
                call_id=call_id,
                provider=route.name,
                model=facts.model,
                endpoint=facts.endpoint,
                stream=facts.stream,
                request_bytes=len(body),
                request_sha256=request_digest(body),
                **forwarded_fields(call.forwarded),
                max_output_tokens=facts.output_tokens_bound,
                url=sanitize_url(route.target(rest, request.query)),
                **client_marks(request.headers, self.scrub).as_fields(),  # docs/clients.md
                **cache_fields,
                **body_fields,
            )
        except LedgerFull as full:
            self.caps.cancel(reservation)
            self.stop(f"ledger full ({full.reason})", full.reason)
            refusal = admission.ledger_full(route.name, facts.model, full.reason, str(full))
            await self.answer_refusal(respond, route.kind, refusal)
            return
        except EvidenceLost:
            self.caps.cancel(reservation)
            refusal = admission.evidence_lost(route.name, facts.model)
            await self.answer_refusal(respond, route.kind, refusal)
            return
        call.slot, state.opened = slot, True
        call.record.started = self.clock.mono()  # a call's duration counts from here, as before
        try:
            await call.run(route.target(rest, request.query), request.headers, respond)
        finally:
            # ModelCall writes one closing event whatever happens; should it fail to
            # (a bug, raised meanwhile), the room it held goes back to the ledger.
            self.ledger.release(slot)

    # ------------------------------------------------------------------ /docket/...

    async def ops(self, request, respond, path: str) -> None:
        if path == "/docket/healthz":
            await _json(respond, 200, {"status": "alive"})
        elif path == "/docket/readyz":
            problems = self.readiness_problems()
            await _json(
                respond, 503 if problems else 200, {"ready": not problems, "problems": problems}
            )
        elif path == "/docket/metrics":
            body = self.metrics.render(self).encode()
            await respond.simple(200, [(b"content-type", b"text/plain; version=0.0.4")], body)
        elif path == "/docket/agent/backoff" and request.method == "POST":
            await self.agent_backoff(request, respond)
        else:
            await _json(respond, 404, {"error": f"no such endpoint {path}"})

    def readiness_problems(self) -> list[str]:
        """What makes the boundary unready: each breaker that is not closed (the
        provider is the problem), then the ledger (the evidence path is)."""
        problems = self.guards.ready_problems()
        if self.server_stats is not None and self.server_stats.accept_failing is not None:
            problems.append(f"accepting connections: {self.server_stats.accept_failing}")
        stats = self.ledger.stats
        if not stats.ledger_complete:
            problems.append(
                f"ledger: {stats.unwritten_events} events unwritten since seq {stats.first_failing_seq}"
            )
        try:
            vfs = os.statvfs(os.path.dirname(os.path.abspath(self.ledger.path)))
            free = vfs.f_bavail * vfs.f_frsize
            if free < self.policy.ledger.min_free_bytes:
                problems.append(
                    f"ledger volume: {free} bytes free, below min_free_bytes "
                    f"{self.policy.ledger.min_free_bytes}"
                )
        except OSError as exc:
            problems.append(f"ledger volume: cannot stat ({exc.strerror})")
        short = self.ledger.reserve_problem
        if short is not None:
            problems.append(f"ledger volume: the disk reserve cannot be kept ({short})")
        try:
            self.ledger.check_room("model.request", 512, closing_bytes=closing_bound("", "", None))
        except (LedgerFull, EvidenceLost) as exc:
            problems.append(f"ledger: {exc}")
        return problems

    async def agent_backoff(self, request, respond) -> None:
        if not providers.token_matches(providers.presented_token(request.headers), self.token):
            await _json(respond, 401, {"error": "the run's token is required"})
            return
        try:
            fields = backoff_fields(await request.read_body(limit=4096))
        except ValueError as exc:
            await _json(respond, 400, {"error": f"bad backoff report: {exc}"})
            return
        try:
            await self.record("agent.backoff", **fields)
        except LedgerFull as full:
            self.stop(f"ledger full ({full.reason})", full.reason)
            await _json(respond, 503, {"error": str(full)})
            return
        except EvidenceLost:
            await _json(respond, 503, {"error": "the ledger could not be written"})
            return
        await _json(respond, 200, {"recorded": True})


def backoff_fields(body: bytes) -> dict:
    """An agent's backoff report ({"attempt", "wait_s", "retry_after"?, "status"?}) as
    event fields; ValueError naming what is wrong. Only finite, non-negative numbers
    are taken: the ledger's JSON has no NaN, and a negative wait is not a wait."""
    try:
        report = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(report, dict):
        raise ValueError("expected a JSON object")

    def number(name: str, *, required: bool, integer: bool = False):
        value = report.get(name)
        if value is None:
            if required:
                raise ValueError(f'"{name}" is required')
            return None
        if type(value) is int:
            ok = 0 <= value <= MAX_REPORTED
        else:
            ok = not integer and type(value) is float and math.isfinite(value) and value >= 0
        if not ok:
            kind = "a whole number" if integer else "a number"
            raise ValueError(f'"{name}" must be {kind} >= 0, got {value!r}')
        return value if integer else float(value)

    status = number("status", required=False, integer=True)
    if status is not None and not 100 <= status <= 599:
        raise ValueError(f'"status" must be an HTTP status, got {status}')
    return {
        "attempt": number("attempt", required=True, integer=True),
        "wait_s": number("wait_s", required=True),
        "retry_after": number("retry_after", required=False),
        "status": status,
    }


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """exc is a `kind`, or a group (from a nursery) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[1] is None
    return isinstance(exc, kind)


async def _json(respond, status: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    await respond.simple(status, [(b"content-type", b"application/json")], body)
