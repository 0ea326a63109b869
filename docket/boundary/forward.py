"""One model call through the boundary: check, record, forward, relay, settle, record.

The order is the product's promise. `model.request` is durable before a byte
goes upstream; `model.response` or `model.error` is durable before the agent
receives the end of the answer (the last chunk is held back until then). The
boundary never retries, deduplicates or falls back: one request in, at most one
request out, and the ledger says which.

Every call that got a `model.request` gets exactly one closing event, however
it ends: answered, failed upstream, abandoned by the client (watched for while
the upstream works), or cancelled because the run is stopping. No ledger
ceiling refuses it: the model.request was admitted only with room held for it
(see closing.py's CLOSING_FIXED_BYTES).

Whatever raises on the way (a bug, a body too odd to record, a harness's
probe), the call is still closed: as model.error reason internal_error, charged
its reservation, without the bodies (recording them may be what failed). The
caps are charged once: a close that failed after charging is not charged again.
`boundary.call_probe`, when set (docket.run.hooks.RunHooks.call_probe), is called
with the name of each await point on the way (hooks.CALL_POINTS) and may raise.

Split at its seams: closing.py (the call's record, usage fields and
closing_bound, importable from here too) and bodies.py (recorded bodies:
recorded_body, RECORDED_BODY_BYTES and the redaction of credential-named members).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import trio

from docket.boundary import bodies, providers
from docket.boundary.bodies import recorded_body
from docket.boundary.cache import Lookup, ResponseCache
from docket.boundary.closing import CLOSING_FIXED_BYTES as CLOSING_FIXED_BYTES
from docket.boundary.closing import RESPONSE_BODY_FIELDS, CallRecord, usage_fields
from docket.boundary.closing import closing_bound as closing_bound
from docket.boundary.guarded import Passage, record_changes
from docket.boundary.ports import CallHost, Upstream
from docket.boundary.providers.base import StreamTracker
from docket.boundary.replayed import REPLAY_HEADER, replay_mark
from docket.cache.decide import Keep
from docket.guards.caps import Reservation, Settlement
from docket.guards.scrub import Scrubber, joined_texts_scrubbed
from docket.http import client as upstream
from docket.http.client import UpstreamPool, UpstreamResponse
from docket.http.server_errors import ClientGone
from docket.http.server_exchange import Responder
from docket.ledger.limits import EvidenceLost
from docket.ledger.pending import ClosingSlot
from docket.pricing import Usage

# Response headers that describe one hop, not the answer: never relayed.
_HOP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"content-length",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
        # Not a hop header, but never the agent's either: a replay's mark (replayed.py).
        REPLAY_HEADER,
    }
)
HeaderList = list[tuple[bytes, bytes]]  # a request's headers as parsed (names lower-cased)
MAX_RESPONSE_BYTES = 64 << 20  # a non-streamed answer larger than this is a protocol error
_CUT_ERROR_TEXT = 200


def relay_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS]


def error_reason(exc: upstream.UpstreamError) -> str:
    """The model.error reason for a transport failure (the vocabulary is docket/ledger/chain.py's EVENT_TYPES)."""
    if isinstance(exc, upstream.ConnectTimeout | upstream.ConnectError):
        return "connect"
    if isinstance(exc, upstream.ReadTimeout | upstream.WriteTimeout):
        return "timeout"
    if isinstance(exc, upstream.ConnectionReset):
        return "reset"
    if isinstance(exc, upstream.PoolTimeout):
        return "pool_timeout"
    return "protocol"


class _Relayed(NamedTuple):
    now: bytes  # to the client at once
    held: bytes  # until the closing event is durable


class ModelCall:
    """The forwarding half of one call, after the guards have let it through.

    `boundary` supplies (ports.CallHost) the ledger's closing events, the caps
    guard, the clock and the secrets to keep out of the record and the relay; the
    route its pool and key; this object owns one request's bytes and its closing
    event.
    """

    def __init__(
        self,
        boundary: CallHost,
        route: Upstream,
        facts: providers.RequestFacts,
        reservation: Reservation,
        request_body: bytes,
        call_id: str,
        slot: ClosingSlot | None,
        passage: Passage | None = None,
    ) -> None:
        self.b = boundary
        self.route = route
        self.facts = facts
        self.reservation = reservation
        self.slot = slot  # the ledger's room for the closing event, held by the model.request
        # The guards' pass (guarded.Passage): the breaker hears how the call ended, and
        # the attempt's deadline (from the caller's budget) bounds the exchange.
        self.passage = passage
        self._attempt: trio.CancelScope | None = None
        self.body = request_body
        # What goes upstream, decided here, once (prepare is pure): the model.request
        # names these bytes' digest when they differ from the agent's, and _exchange
        # sends exactly them.
        self.forwarded = providers.forwarded(self.route.provider, facts, request_body)
        self.record = CallRecord(call_id, route.name, facts.model, boundary.clock.mono())
        self.closed = False  # the closing event's write has begun (it is then finished)
        self._outcome: Settlement | None = (
            None  # the caps' outcome, once charged (a close is charged once)
        )
        self._charged = 0
        self.unrecorded: tuple[str, str] | None = (
            None  # evidence lost: the closing event is not durable
        )
        self.client_left = False
        self._keep_body = boundary.policy.ledger.record_bodies
        self._response_body = (
            bytearray()
        )  # what the upstream sent, up to bodies.RECORDED_BODY_BYTES
        self._response_cut = False
        # The provider keys come out of every byte relayed to the agent (guards/scrub.py).
        self._scrub = Scrubber(boundary.relay_keys)
        # With [cache] on (boundary/cache.py): the cache, and this call's lookup there,
        # whose capture keeps the bytes relayed, for the store decision at the close.
        self.cache: ResponseCache | None = None
        self.lookup: Lookup | None = None
        self.closed_seq: int | None = None  # the closing event's seq, once durable
        # A `docket replay` answer (replayed.py): its origin or "miss" (then it costs
        # zero), or "forwarded" (a miss sent on to the real provider: charged as any call).
        self.replayed: dict[str, object] | str | None = None

    # ------------------------------------------------------------------ the exchange

    async def run(self, target: str, headers: HeaderList, respond: Responder) -> None:
        """Forward, relay and close, watching the client meanwhile: a client that
        leaves cancels the upstream exchange, and the call is closed as client_abort."""
        try:
            with trio.CancelScope() as exchange:
                respond.cancel_on_disconnect(exchange)
                try:
                    await self._exchange(target, headers, respond)
                finally:
                    respond.cancel_on_disconnect(None)
            self.client_left = exchange.cancelled_caught  # only the client's leaving cancels it
        except BaseException as exc:
            if not self.closed:
                why = "internal_error"
                if _only(exc, trio.Cancelled):
                    why = "cancelled"  # the run is stopping
                elif _only(exc, ClientGone):
                    why = "client_abort"
                with trio.CancelScope(shield=True):
                    await self._close_unfinished(why, exc)
            raise
        if not self.closed:  # the client left (else: a bug, said as such)
            with trio.CancelScope(shield=True):
                why = "client_abort" if self.client_left else "internal_error"
                await self._close_unfinished(why, None)

    async def _close_unfinished(self, why: str, exc: BaseException | None) -> None:
        """Close a call that something interrupted before its closing event. An
        internal error is closed without the bodies (recording them may be what
        raised); should closing fail before its write, the call is closed once more
        as internal_error, bare. A failure in the write itself is not retried: the
        event may be on disk, and a second one would close the call twice."""
        detail = None if exc is None else _describe(exc)
        try:
            await self._close_error(
                why, charge="reservation", detail=detail, bodies=why != "internal_error"
            )
        except Exception as again:
            if self.closed:
                raise
            detail = "; ".join(filter(None, (detail, f"closing it: {_describe(again)}")))
            await self._close_error(
                "internal_error", charge="reservation", detail=detail, bodies=False
            )

    async def _exchange(self, target: str, headers: HeaderList, respond: Responder) -> None:
        _probe(self.b, "call.forward")
        body, strip = self.forwarded.body, self.forwarded.strip_usage
        out_headers = providers.upstream_headers(  # the token was checked on arrival
            self.route.provider,
            headers,
            api_key=self.route.api_key,
            upstream_host=self.route.host_header,
            content_length=len(body),
        )
        pool = self.route.pool
        # The whole attempt (connect, send, answer, body or stream) ends at the caller's
        # deadline or at upstream_total_timeout, whichever is sooner: the pool's read
        # timeout bounds only the gap between bytes, so a trickle would go on forever.
        # Cancelling the scope closes the upstream connection, stopping the work.
        caller_cut = math.inf if self.passage is None else self.passage.attempt.cut
        total_s = self.b.policy.boundary.upstream_total_timeout
        total_cut = trio.current_time() + total_s
        with trio.CancelScope(deadline=min(caller_cut, total_cut)) as self._attempt:
            await self._attempt_once(pool, target, out_headers, body, respond, strip)
        if self._attempt.cancelled_caught and not self.closed:
            if caller_cut <= total_cut:
                await self._deadline_passed(respond)
            else:
                self.record.extra["total_timeout_s"] = total_s
                detail = f"the upstream call ran past upstream_total_timeout ({total_s:g} s)"
                await self._cut(respond, f"{detail}; cut there")

    async def _attempt_once(
        self,
        pool: UpstreamPool,
        target: str,
        out_headers: list[tuple[bytes, bytes]],
        body: bytes,
        respond: Responder,
        strip: bool,
    ) -> None:
        try:
            # Waiting for a free connection is bounded too (by the connect timeout), so
            # without a bulkhead no call queues unrecorded: it ends as pool_timeout.
            _probe(self.b, "upstream.request")
            async with pool.request(
                "POST", target, out_headers, body, wait_timeout=pool.connect_timeout
            ) as resp:
                self.record.status = resp.status
                self.record.ttfb = self.b.clock.mono()
                self._note_replay(resp.headers)
                streamed = (
                    resp.status == 200
                    and self.facts.stream
                    and (resp.header(b"content-type") or b"").startswith(b"text/event-stream")
                )
                if streamed:
                    await self._relay_stream(resp, respond, strip)
                else:
                    await self._relay_whole(resp, respond)
        except upstream.UpstreamError as exc:
            await self._transport_failed(exc, respond)

    async def _relay_whole(self, resp: UpstreamResponse, respond: Responder) -> None:
        _probe(self.b, "upstream.read")
        data = await resp.read(limit=MAX_RESPONSE_BYTES)
        self.record.bytes = len(data)
        self._keep(data)
        headers = self._scrub.headers(relay_headers(resp.headers))
        relayed = self._scrub.whole(data)
        if self.lookup is not None:
            self.lookup.capture.head(resp.status, headers)
            self.lookup.capture.add(relayed)
        if 200 <= resp.status < 300:
            self.record.usage = providers.usage_from_body(
                self.route.provider, self.facts.endpoint, data
            )
            await self._close_ok()
        else:
            error = providers.error_from_body(self.route.provider, data)
            if error is not None:
                self.record.extra["upstream_error"] = self._error_fields(error)
            retry_after = resp.header(b"retry-after")
            if retry_after is not None:
                self.record.extra["retry_after"] = self.b.scrub(retry_after.decode("latin-1"))[:64]
            # A provider bills nothing for an error answer it gave before any output.
            await self._close_error("upstream_status", charge="zero")
        if self.unrecorded is not None:
            await self._refuse_unrecorded(respond)
            return
        _probe(self.b, "relay.answer")
        await respond.simple(resp.status, headers, relayed)

    async def _relay_stream(self, resp: UpstreamResponse, respond: Responder, strip: bool) -> None:
        tracker = providers.stream_tracker(self.route.provider, self.facts, strip_usage_chunk=strip)
        held = b""
        try:
            # What one read brought goes out in one write, the head with the chunks that
            # came with it: a write per upstream chunk cost a syscall and a trip through
            # the scheduler each, and that burst of CPU delayed the client reading the head.
            batches = resp.body_batches()
            first = self._relay_batch(batches.ready(), tracker)
            held += first.held
            head = self._scrub.headers(relay_headers(resp.headers))
            self._scrub.events()  # a key split across the stream's text deltas too
            _probe(self.b, "relay.start")
            capture = None if self.lookup is None else self.lookup.capture
            start = self._scrub.feed(first.now)
            if capture is not None:
                capture.head(resp.status, head, streamed=True)
                capture.add(start)
            await respond.start(resp.status, head, body=start)
            async for chunks in batches:
                batch = self._relay_batch(chunks, tracker)
                held += batch.held
                now = self._scrub.feed(batch.now)
                if capture is not None:
                    capture.add(now)
                if now:
                    _probe(self.b, "relay.send")
                    await respond.send(now)
            held += tracker.flush()
            # The end: what the scrubber held back goes with it, before the closing
            # event, so the event counts every key taken out.
            held = self._scrub.feed(held) + self._scrub.flush()
            if capture is not None:
                capture.add(held)
        except ClientGone:
            self._note_stream(tracker)
            await self._close_error("client_abort", charge="reservation")
            return
        except upstream.UpstreamError as exc:
            self._note_stream(tracker)
            await self._close_error(error_reason(exc), charge="reservation", detail=str(exc))
            await respond.abort()  # the agent must see a cut stream, not a clean end
            return
        self._note_stream(tracker)
        if tracker.finished and tracker.error is None:
            await self._close_ok()
        else:
            reason = "upstream_error_event" if tracker.error is not None else "stream_cut"
            # Usage is final only once the provider's end-of-stream marker came.
            await self._close_error(reason, charge="usage" if tracker.finished else "reservation")
        try:
            if self.unrecorded is not None:
                await respond.abort()  # the end could not be recorded, so it is not delivered
                return
            _probe(self.b, "relay.end")
            if held:
                await respond.send(held)
            if tracker.finished:
                await respond.end()
            else:
                await respond.abort()
        except ClientGone:
            return  # already recorded; the agent left after the last event was written

    @property
    def replayed_free(self) -> bool:
        """Served by the replay upstream from the record (or its miss error): nothing bought."""
        return isinstance(self.replayed, dict) or self.replayed in ("miss", "fault")

    def _note_replay(self, headers: list[tuple[bytes, bytes]]) -> None:
        """On a route to `docket replay`'s upstream, what its mark says (replayed.py)."""
        self.replayed = replay_mark(headers, self.route.replay_key)
        if isinstance(self.replayed, dict):
            self.record.extra["replayed_from"] = self.replayed
        elif self.replayed == "miss":
            self.record.extra["replay_miss"] = True
        elif self.replayed == "forwarded":
            self.record.extra["replay_forwarded"] = True
        elif self.replayed == "fault":
            self.record.extra["replay_fault"] = True

    def _relay_batch(self, chunks: list[bytes], tracker: StreamTracker) -> _Relayed:
        """Feed chunks that arrived together to the tracker: what to send now, and what
        to hold (from the provider's end-of-stream marker on, the answer's end waits
        for its event to be durable)."""
        now: list[bytes] = []
        held = b""
        for chunk in chunks:
            self.record.bytes += len(chunk)
            self._keep(chunk)
            out = tracker.feed(chunk)
            if tracker.finished:
                held += out
            elif out:
                now.append(out)
        return _Relayed(b"".join(now), held)

    def _note_stream(self, tracker: StreamTracker) -> None:
        self.record.usage = tracker.usage
        self.record.extra["events"] = tracker.events
        if tracker.error is not None:
            self.record.extra["upstream_error"] = self._error_fields(tracker.error)
        if tracker.problem is not None:
            self.record.extra["stream_problem"] = self.b.scrub(tracker.problem)[:200]

    async def _transport_failed(self, exc: upstream.UpstreamError, respond: Responder) -> None:
        reason = error_reason(exc)
        never_left = reason in ("connect", "pool_timeout")
        await self._close_error(
            reason, charge="nothing" if never_left else "reservation", detail=str(exc)
        )
        if respond.started:
            await respond.abort()
            return
        if self.unrecorded is not None:
            await self._refuse_unrecorded(respond)
            return
        kind = "docket_upstream_timeout" if reason == "timeout" else "docket_upstream_unreachable"
        answer = providers.refusal(
            self.route.provider, kind, f"upstream {self.route.name}: {reason}: {exc}"
        )
        await respond.simple(answer.status, answer.headers, answer.body)

    async def _deadline_passed(self, respond: Responder) -> None:
        """The caller's deadline cut the attempt: a timeout, like any other, for the
        record and the breaker. Bytes may have left, so the reservation is charged."""
        # Only a passage with a deadline arms the attempt's cancel scope.
        assert self.passage is not None and self.passage.attempt.budget_s is not None
        budget = self.passage.attempt.budget_s
        self.record.extra["deadline_ms"] = self.passage.attempt.deadline_ms
        detail = f"the caller's deadline left {budget * 1000:.0f} ms for the upstream; cut there"
        await self._cut(respond, detail)

    async def _cut(self, respond: Responder, detail: str) -> None:
        """Close a call whose attempt was cut (a deadline, the total timeout) as a
        timeout, charged its reservation (bytes may have left), and answer the agent."""
        await self._close_error("timeout", charge="reservation", detail=detail)
        if respond.started:
            await respond.abort()  # a stream cut at the deadline must not look complete
            return
        if self.unrecorded is not None:
            await self._refuse_unrecorded(respond)
            return
        answer = providers.refusal(
            self.route.provider,
            "docket_upstream_timeout",
            f"upstream {self.route.name}: timeout: {detail}",
        )
        await respond.simple(answer.status, answer.headers, answer.body)

    async def _refuse_unrecorded(self, respond: Responder) -> None:
        assert self.unrecorded is not None  # called only once it is set
        error_type, message = self.unrecorded
        answer = providers.refusal(self.route.provider, error_type, message)
        await respond.simple(answer.status, answer.headers, answer.body)

    # ------------------------------------------------------------------ closing events

    def _timing(self) -> dict[str, Any]:
        now = self.b.clock.mono()
        out = {"duration_ms": int((now - self.record.started) * 1000), "bytes": self.record.bytes}
        if self.record.ttfb is not None:
            out["ttfb_ms"] = int((self.record.ttfb - self.record.started) * 1000)
        return out

    def _error_fields(self, error: providers.ProviderError) -> dict[str, Any]:
        # Scrubbed, then cut: a cut first could leave part of a secret the scrub misses.
        kind = error.type if error.type is None else self.b.scrub(error.type)[:_CUT_ERROR_TEXT]
        return {"type": kind, "message": self.b.scrub(error.message)[:_CUT_ERROR_TEXT]}

    async def _close_ok(self) -> None:
        self._disarm()
        r = self.record
        body = self._body_fields()  # first: if recording the body fails, nothing is charged yet
        usage, priced_usage = r.usage, None
        if usage is not None:
            try:
                priced_usage = usage.priced()
            except ValueError:
                priced_usage = None
        fields: dict[str, Any] = {}
        if self.replayed_free:
            # A replayed answer was bought in the recorded run, not in this one.
            outcome = self._charge(self.b.caps.settle, _nothing_used())
        elif priced_usage is None:
            # A success without usable usage: charge the worst case, say so.
            outcome = self._charge(self.b.caps.fail)
            fields["usage_missing"] = True
        else:
            outcome = self._charge(self.b.caps.settle, priced_usage)
        decision = None
        if self.cache is not None and self.lookup is not None:
            decision, cache_fields = self.cache.decide(
                self.lookup, complete=True, usage_missing=priced_usage is None
            )
            fields.update(cache_fields)
        price = self.reservation.price
        timing = self._timing()
        # A closing event, once started, is finished: record_closing cannot be cancelled.
        await self._write_close(
            "model.response",
            call_id=r.call_id,
            provider=r.provider,
            model=r.model or "",
            status=r.status,
            usage=usage_fields(usage),
            cost_nusd=outcome.charged_nusd,
            priced=price is not None,
            **({"unit_prices": price.as_strings()} if price is not None else {}),
            **timing,
            **fields,
            **r.extra,
            **body,
        )
        if isinstance(decision, Keep) and self.closed_seq is not None and self.unrecorded is None:
            assert self.cache is not None and self.lookup is not None
            await self.cache.keep(
                self.lookup,
                seq=self.closed_seq,
                cost_nusd=outcome.charged_nusd,
                model=r.model or "",
                now=self.b.clock.mono(),
            )
            await self.b.record_cache_problems()  # a put the store refused: on the record
        await self._after_close(outcome, None)
        self.b.metrics.call_finished(r.provider, "ok", timing["duration_ms"] / 1000)

    async def _close_error(
        self, reason: str, *, charge: str, detail: str | None = None, bodies: bool = True
    ) -> None:
        """Record the call's failure. `charge`: "nothing" (the request never left),
        "zero" (the provider answered an error before any output), "usage" (the
        final usage if it is known, else the reservation) or "reservation" (what is
        known is not final: a cut stream may have been billed for more). Without
        `bodies`, the response body is left out (an internal error's last resort)."""
        self._disarm()
        r = self.record
        fields: dict[str, Any] = {"detail": self.b.scrub(detail)[:300]} if detail else {}
        body = self._body_fields() if bodies else {}
        if self.replayed_free and charge != "nothing":
            charge = "zero"  # a replayed answer costs nothing (replayed.py)
        if not self.b.caps.outstanding(self.reservation):
            # An earlier close charged the call, then failed before its event: not twice.
            outcome, charged = self._outcome, self._charged
        elif charge == "nothing":
            self.b.caps.cancel(self.reservation)
            outcome, charged = None, 0
        elif charge == "zero":
            outcome = self._charge(self.b.caps.settle, _nothing_used())
            charged = outcome.charged_nusd
        else:
            priced = None
            if charge == "usage" and r.usage is not None:
                try:
                    priced = r.usage.priced()
                except ValueError:
                    priced = None
            if priced is not None:
                outcome = self._charge(self.b.caps.settle, priced)
            else:
                outcome = self._charge(self.b.caps.fail)
                if r.usage is not None:
                    fields["usage_final"] = False  # what is known, not what was billed
            charged = outcome.charged_nusd
        if self.cache is not None and self.lookup is not None:
            fields.update(self.cache.decide(self.lookup, complete=False, usage_missing=False)[1])
        timing = self._timing()
        await self._write_close(
            "model.error",
            call_id=r.call_id,
            provider=r.provider,
            model=r.model or "",
            reason=reason,
            status=r.status,
            usage=usage_fields(r.usage),
            cost_nusd=charged,
            **timing,
            **fields,
            **r.extra,
            **body,
        )
        await self._after_close(outcome, reason)
        self.b.metrics.call_finished(r.provider, reason, timing["duration_ms"] / 1000)

    def _charge(self, how: Callable[..., Settlement], *args: Usage) -> Settlement:
        """Settle or fail the reservation, remembering the outcome: a close that fails
        after this is closed again without a second charge."""
        outcome = self._outcome = how(self.reservation, *args)
        self._charged = outcome.charged_nusd
        return outcome

    def _disarm(self) -> None:
        """The call is closing: the deadline no longer applies, so an answer that is
        recorded is also delivered."""
        if self._attempt is not None:
            self._attempt.deadline = math.inf

    async def _after_close(self, outcome: Settlement | None, reason: str | None) -> None:
        """After the closing event: record the caps' events, tell the breaker how the
        call ended and record any transition that caused. Shielded like the closing
        event, when there is anything to write (most calls have nothing, and an
        empty shield would still cost a cancel scope)."""
        _probe(self.b, "close.after")
        changes = () if self.passage is None else self.passage.report(reason, self.record.status)
        caps = outcome if outcome is not None and (outcome.events or outcome.stop_run) else None
        if caps is None and not changes:
            return
        with trio.CancelScope(shield=True):
            if caps is not None:
                await self.b.cap_events(caps)
            try:
                await record_changes(self.b.recorder, changes)
            except EvidenceLost:
                # record() has already asked the run to stop for the lost evidence; the
                # transition goes with everything else the ledger can no longer take.
                return

    async def _write_close(self, type: str, **fields: object) -> None:
        """Append the closing event into the room its model.request held: no ceiling
        refuses it (the response body is left out when the file has no room for it).
        If evidence is lost under fail_fast_evidence, the run stops and the agent does
        not get the end of an answer the ledger does not hold."""
        _probe(self.b, "close.write")
        if self._scrub.count:
            fields["key_scrubbed"] = self._scrub.count  # keys taken out of the agent's copy
            # ...and in which forms (raw, percent, json, base64, hex): guards/forms.py
            fields["key_scrubbed_forms"] = dict(sorted(self._scrub.kinds.items()))
        self.closed = True  # from here on the event is written once, or not at all
        assert self.slot is not None  # set once the model.request is written, before run()
        try:
            self.closed_seq = await self.b.recorder.record_closing(
                self.slot, type, optional=RESPONSE_BODY_FIELDS, **fields
            )
        except EvidenceLost:
            self.unrecorded = (
                "docket_evidence_lost",
                "the answer could not be recorded and fail_fast_evidence is set: the run is stopping",
            )

    # ------------------------------------------------------------------ bodies

    def _keep(self, chunk: bytes) -> None:
        if not self._keep_body:
            return
        room = bodies.RECORDED_BODY_BYTES - len(self._response_body)
        if len(chunk) > room:
            self._response_cut = True
        self._response_body += chunk[: max(room, 0)]

    def _body_fields(self) -> dict[str, Any]:
        if not self._keep_body or self.record.status is None:
            return {}  # no answer came
        # A secret split across a stream's text deltas is joined up first (what the
        # agent's copy loses, the record loses too); the redactor does the rest.
        kept, found = joined_texts_scrubbed(self.b.redactor.forms, bytes(self._response_body))
        fields = recorded_body("response", kept, self.b.redactor, cut=self._response_cut)
        if found and "response_body" in fields:
            fields["response_body_redacted"] = True
        return fields


def _probe(boundary: CallHost, point: str) -> None:
    """A harness's probe at a named await point of the call (hooks.CALL_POINTS)."""
    if boundary.call_probe is not None:
        boundary.call_probe(point)


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """exc is a `kind`, or a group (from a nursery) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[1] is None
    return isinstance(exc, kind)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _nothing_used() -> Usage:
    return Usage(0, 0)


def request_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def forwarded_fields(forwarded: providers.Forwarded) -> dict[str, Any]:
    """The model.request's record of bytes sent upstream that are not the agent's
    (spec section 5): their digest and what changed; nothing when they are the agent's.
    A check comparing the upstream's bytes with the ledger reads forwarded_sha256,
    else request_sha256."""
    if not forwarded.changes:
        return {}
    return {
        "forwarded_sha256": request_digest(forwarded.body),
        "forwarded_changes": list(forwarded.changes),
    }
