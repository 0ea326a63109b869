"""Intake: a model call from its arrival until forward.ModelCall takes it.

Admission first (admission.admit asks; each rule's learner in docket/boundary/rules/
learns its fact), then one of: a refusal answered and recorded (`answer_refusal`,
the one place a refusal is), a models list relayed (non_model.py), a cache hit
served, or the model.request recorded and the call handed to ModelCall. Whatever
raises on the way is answered in the provider's shape and recorded.
"""

from __future__ import annotations

import itertools
import logging
import secrets

from docket.boundary import admission, providers
from docket.boundary.admission import RULES, Admitted, Ask, admit
from docket.boundary.cache import Lookup
from docket.boundary.calls import Admitting
from docket.boundary.forward import (
    ModelCall,
    closing_bound,
    forwarded_fields,
    recorded_body,
    request_digest,
)
from docket.boundary.guarded import Passage
from docket.boundary.non_model import non_model_endpoint, relay_non_model
from docket.boundary.ports import IntakeHost
from docket.boundary.providers import Provider, RequestFacts
from docket.boundary.providers.client_marks import client_marks
from docket.boundary.routes import Route
from docket.boundary.rules import caps as caps_rule
from docket.boundary.rules import request as request_rule
from docket.boundary.rules.base import Refusal
from docket.cache.store import Hit
from docket.guards.caps import Decision
from docket.guards.redact import sanitize_url
from docket.http.server_errors import ClientGone
from docket.http.server_exchange import HeaderPairs, Request, Responder
from docket.ledger.limits import EvidenceLost, LedgerFull

log = logging.getLogger("docket.boundary")


class Intake:
    """Takes each model call of one boundary (its `host`) through admission."""

    __slots__ = ("host", "_call_ids", "_call_prefix")

    def __init__(self, host: IntakeHost) -> None:
        self.host = host
        self._call_ids = itertools.count(1)
        self._call_prefix = secrets.token_hex(3)  # call ids unique across runs at a glance

    async def answer_refusal(
        self,
        respond: Responder,
        provider: Provider,
        refusal: Refusal,
        request_headers: HeaderPairs | None = None,
    ) -> None:
        """The one place a refusal is recorded and answered: its event (unless the
        ledger is what failed), then the answer in the provider's shape. An answer
        whose event could not be written says so. Given the request's headers, the
        event carries the client's attempt marker and ids as a model.request would
        (docs/clients.md): a refused attempt is still the client's attempt."""
        message = refusal.message
        recorded = False
        if refusal.event is not None:
            marks = (
                client_marks(request_headers, self.host.scrub).as_fields()
                if request_headers is not None
                else {}
            )
            try:
                await self.host.recorder.record(
                    refusal.event,
                    rule=refusal.rule,
                    provider=refusal.provider,
                    model=refusal.model or "",
                    error_type=refusal.error_type,
                    **refusal.fields,
                    **marks,
                )
                recorded = True
            except (LedgerFull, EvidenceLost):
                # Said in the answer; a full ledger is also on readiness and in the receipt.
                message = f"{message} (the refusal itself could not be recorded)"
        if not recorded:  # counted for session.end, so the receipt still tells it
            self.host.recorder.refusal_unrecorded(refusal.event, refusal.rule)
        if refusal.shed:
            self.host.metrics.load_shed(refusal.provider)
        answer = providers.refusal(
            provider,
            refusal.error_type,
            message,
            extra=dict(refusal.extra) if refusal.extra else None,
            retry_after_s=refusal.retry_after_s,
            status=refusal.status,
        )
        self.host.metrics.refused(refusal.provider, refusal.error_type)
        # An unread body: say the connection closes, or a keep-alive client sends its
        # next request into a closing socket.
        close = refusal.close
        headers = [*answer.headers, (b"connection", b"close")] if close else answer.headers
        await respond.simple(answer.status, headers, answer.body)

    async def model_call(
        self, route: Route, rest: str, request: Request, respond: Responder
    ) -> None:
        """One call to a provider. Whatever raises on its way is answered in the
        provider's shape (500 docket_internal_error) and recorded: a call with a
        model.request is closed by ModelCall (model.error internal_error); one
        without is a policy.denied with rule internal_error, its reservation
        released (it never left). The boundary goes on serving."""
        call = Admitting(route, rest, request, self.host.guards.now())
        try:
            await self._model_call(call, rest, respond)
        except Exception as exc:
            if _only(exc, ClientGone):
                raise  # the client left: nobody to answer (the call is closed as client_abort)
            await self._internal_error(call, respond, exc)

    async def _internal_error(self, call: Admitting, respond: Responder, exc: Exception) -> None:
        route = call.route
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.error("model call to %s failed inside the boundary: %s", route.name, what)
        message = "the boundary failed on this call (internal error); it was recorded"
        if call.opened:
            # ModelCall has closed the call (model.error, internal_error): answer only.
            if respond.started:
                await respond.abort()  # a started answer must not look complete
                return
            answer = providers.refusal(route.provider, "docket_internal_error", message)
            headers = [*answer.headers, (b"connection", b"close")]
            await respond.simple(answer.status, headers, answer.body)
            return
        held = call.reservation
        if held is not None and self.host.caps.outstanding(held):
            self.host.caps.cancel(held)  # never forwarded
        model = call.facts.model
        refusal = admission.internal_error(route.name, model, self.host.scrub(what)[:300])
        await self.answer_refusal(respond, route.provider, refusal)

    async def _model_call(self, call: Admitting, rest: str, respond: Responder) -> None:
        """Learn the call's facts in the order admission.admit asks for them, then
        answer its refusal or forward it. Whatever a refused call took (a
        reservation, a breaker ticket, a bulkhead slot) is given back first."""
        route, request, facts = call.route, call.request, call.facts
        listing = non_model_endpoint(request.method, "/" + rest)
        try:
            step = admit(facts)
            while isinstance(step, Ask):
                learn = RULES[step.at].learn
                assert learn is not None  # a rule without a learner reads a fact learned before
                await learn(self.host, call)
                parsed = facts[request_rule.FACT]
                if listing is not None and isinstance(parsed, RequestFacts):
                    break  # authorised and readable: a models list or lookup, relayed below
                step = admit(facts, step.at)
        except BaseException:
            self._give_back(call)
            raise
        if isinstance(step, Ask):  # the loop stopped early: a models list or lookup, so
            # relayed and recorded as provider.call: no spend, no reservation, nothing held.
            assert listing is not None
            await relay_non_model(
                self.host, route, rest, request, respond, listing, self.answer_refusal
            )
            return
        if isinstance(step, Refusal):
            self._give_back(call)
            await self.answer_refusal(respond, route.provider, step, request.headers)
            return
        hold = call.hold
        assert hold is not None  # admitted: the guards were asked
        try:
            lookup = None
            if self.host.cache is not None:
                found = await self.host.cache.consult(
                    route.name,
                    route.target(rest, request.query),
                    endpoint=step.request.endpoint,
                    model=step.request.model,
                    choices=step.request.choices,
                    payload=step.request.payload,
                    body=step.body,
                    now=self.host.clock.mono(),
                    kind=route.provider.KIND,
                    headers=request.headers,
                )
                await self.host.record_cache_problems()
                if isinstance(found, Hit):
                    await self._serve_hit(call, respond, step, found)
                    return
                lookup = found
            passage = hold.pass_through(step.attempt)
            await self._forward(call, rest, respond, step, passage, lookup)
        finally:
            hold.leave()

    async def _serve_hit(
        self, call: Admitting, respond: Responder, admitted: Admitted, hit: Hit
    ) -> None:
        """Answer from the cache: nothing is forwarded, so the reservation is
        cancelled (a hit spends nothing) and the breaker hears nothing (the ticket is
        abandoned by hold.leave). The cache.hit event is durable before the answer."""
        route, facts, entry = call.route, admitted.request, hit.entry
        self.host.caps.cancel(admitted.reservation)
        try:
            await self.host.recorder.record(
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
            refusal = admission.ledger_full(route.name, facts.model, full.reason, str(full))
            await self.answer_refusal(respond, route.provider, refusal)
            return
        except EvidenceLost:
            refusal = admission.evidence_lost(route.name, facts.model)
            await self.answer_refusal(respond, route.provider, refusal)
            return
        call.opened = True  # recorded: an error from here on is answered, not recorded again
        self.host.metrics.cache_outcome(route.name, "hit", entry.cost_nusd)
        headers = [*entry.headers, (b"x-docket-cache", b"hit")]
        if entry.stream:
            await respond.start(entry.status, headers, body=entry.body)
            await respond.end()
        else:
            await respond.simple(entry.status, headers, entry.body)

    def _give_back(self, call: Admitting) -> None:
        """A call that will not be forwarded: release its reservation (never charged:
        it never left) and leave the guards."""
        decision = call.facts[caps_rule.FACT]
        if isinstance(decision, Decision):
            held = decision.reservation
            if held is not None and self.host.caps.outstanding(held):
                self.host.caps.cancel(held)
        if call.hold is not None:
            call.hold.leave()

    async def _forward(
        self,
        admitting: Admitting,
        rest: str,
        respond: Responder,
        admitted: Admitted,
        passage: Passage,
        lookup: Lookup | None = None,
    ) -> None:
        """Record the model.request, then hand the call to ModelCall."""
        route, request = admitting.route, admitting.request
        facts, body, reservation = admitted.request, admitted.body, admitted.reservation
        call_id = f"{self._call_prefix}-{next(self._call_ids)}"
        body_fields = (
            recorded_body("request", body, self.host.redactor)
            if self.host.policy.ledger.record_bodies
            else {}
        )
        # Made before the model.request is written, so that nothing can fail between
        # that write and the call's own closing machinery.
        call = ModelCall(self.host, route, facts, reservation, body, call_id, None, passage)
        cache_fields: dict[str, object] = {}
        if lookup is not None:
            call.cache, call.lookup = self.host.cache, lookup
            if lookup.refusal is None:
                cache_fields["cache"] = "miss"  # looked up, not found: forwarded
        try:
            self.host.probe("request.record")
            # Refused unless the ledger can also hold this call's closing event. Not
            # cancellable (see record_opening), without a shielded scope's cost.
            _, slot = await self.host.recorder.record_opening(
                "model.request",
                closing_bytes=closing_bound(call_id, route.name, facts.model),
                call_id=call_id,
                provider=route.name,
                base_url=route.base_url,
                model=facts.model,
                endpoint=facts.endpoint,
                stream=facts.stream,
                request_bytes=len(body),
                request_sha256=request_digest(body),
                **forwarded_fields(call.forwarded),
                max_output_tokens=facts.output_tokens_bound,
                url=sanitize_url(route.target(rest, request.query)),
                **client_marks(request.headers, self.host.scrub).as_fields(),  # docs/clients.md
                **cache_fields,
                **body_fields,
            )
        except LedgerFull as full:
            self.host.caps.cancel(reservation)
            refusal = admission.ledger_full(route.name, facts.model, full.reason, str(full))
            await self.answer_refusal(respond, route.provider, refusal)
            return
        except EvidenceLost:
            self.host.caps.cancel(reservation)
            refusal = admission.evidence_lost(route.name, facts.model)
            await self.answer_refusal(respond, route.provider, refusal)
            return
        call.slot, admitting.opened = slot, True
        call.record.started = self.host.clock.mono()  # its duration counts from here
        try:
            await call.run(route.target(rest, request.query), request.headers, respond)
        finally:
            # ModelCall writes one closing event whatever happens; should it fail to
            # (a bug, raised meanwhile), the room it held goes back to the ledger.
            self.host.recorder.ledger.release(slot)


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """exc is a `kind`, or a group (from a nursery) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[1] is None
    return isinstance(exc, kind)
