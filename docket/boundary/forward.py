"""One model call through the boundary: check, record, forward, relay, settle, record.

The order is the product's promise. `model.request` is durable before a byte
goes upstream; `model.response` or `model.error` is durable before the agent
receives the end of the answer (the last chunk is held back until then). The
boundary never retries, deduplicates or falls back: one request in, at most one
request out, and the ledger says which.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from docket.boundary import providers
from docket.http import client as upstream
from docket.http.server import ClientGone

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
    }
)
MAX_RESPONSE_BYTES = 64 << 20  # a non-streamed answer larger than this is a protocol error


@dataclass
class CallRecord:
    """What one call has done so far; turned into the closing event's fields."""

    call_id: str
    provider: str
    model: str | None
    started: float  # monotonic seconds
    status: int | None = None
    ttfb: float | None = None
    bytes: int = 0
    usage: providers.Usage | None = None
    extra: dict = field(default_factory=dict)


def usage_fields(usage: providers.Usage | None) -> dict:
    """Known counts only: a count the provider did not report is absent, never zero."""
    if usage is None:
        return {}
    out = {}
    for name in ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens"):
        value = getattr(usage, name)
        if value is not None:
            out[name] = value
    if usage.cache_write_1h_tokens is not None:
        out["cache_write_1h_tokens"] = usage.cache_write_1h_tokens
    return out


def relay_headers(headers) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS]


def error_reason(exc: upstream.UpstreamError) -> str:
    """The model.error reason for a transport failure (the vocabulary is in DESIGN.md §3)."""
    if isinstance(exc, upstream.ConnectTimeout | upstream.ConnectError):
        return "connect"
    if isinstance(exc, upstream.ReadTimeout | upstream.WriteTimeout):
        return "timeout"
    if isinstance(exc, upstream.ConnectionReset):
        return "reset"
    if isinstance(exc, upstream.PoolTimeout):
        return "pool_timeout"
    return "protocol"


class ModelCall:
    """The forwarding half of one call, after the guards have let it through.

    `boundary` supplies the ledger, the caps guard, the clock and the pools;
    this object owns one request's bytes and its closing event.
    """

    def __init__(self, boundary, route, facts, reservation, request_body: bytes, call_id: str):
        self.b = boundary
        self.route = route
        self.facts = facts
        self.reservation = reservation
        self.body = request_body
        self.record = CallRecord(call_id, route.name, facts.model, boundary.clock.mono())

    # ------------------------------------------------------------------ the exchange

    async def run(self, target: str, headers, respond) -> None:
        body, strip = providers.prepare(self.facts, self.body)
        _, out_headers = providers.swap_auth(
            self.route.kind,
            headers,
            api_key=self.route.api_key,
            upstream_host=self.route.host_header,
            content_length=len(body),
        )
        pool = self.route.pool
        try:
            async with pool.request(
                "POST" if self.body else "GET", target, out_headers, body
            ) as resp:
                self.record.status = resp.status
                self.record.ttfb = self.b.clock.mono()
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

    async def _relay_whole(self, resp, respond) -> None:
        data = await resp.read(limit=MAX_RESPONSE_BYTES)
        self.record.bytes = len(data)
        headers = relay_headers(resp.headers)
        if 200 <= resp.status < 300:
            self.record.usage = providers.usage_from_body(
                self.route.kind, self.facts.endpoint, data
            )
            await self._close_ok()
        else:
            error = providers.error_from_body(self.route.kind, data)
            if error is not None:
                self.record.extra["upstream_error"] = {
                    "type": error.type,
                    "message": error.message[:200],
                }
            retry_after = resp.header(b"retry-after")
            if retry_after is not None:
                self.record.extra["retry_after"] = retry_after.decode("latin-1")[:64]
            # A provider bills nothing for an error answer it gave before any output.
            await self._close_error("upstream_status", charge="zero")
        await respond.simple(resp.status, headers, data)

    async def _relay_stream(self, resp, respond, strip: bool) -> None:
        tracker = providers.stream_tracker(self.facts, strip_usage_chunk=strip)
        await respond.start(resp.status, relay_headers(resp.headers))
        held = b""
        try:
            async for chunk in resp.body():
                self.record.bytes += len(chunk)
                out = tracker.feed(chunk)
                if tracker.finished:
                    held += out  # the end of the answer waits for its event to be durable
                elif out:
                    await respond.send(out)
            held += tracker.flush()
        except ClientGone:
            self.record.usage = tracker.usage
            await self._close_error("client_abort", charge="usage_or_reservation")
            return
        except upstream.UpstreamError as exc:
            self.record.usage = tracker.usage
            await self._close_error(
                error_reason(exc), charge="usage_or_reservation", detail=str(exc)
            )
            await respond.abort()  # the agent must see a cut stream, not a clean end
            return
        self.record.usage = tracker.usage
        self.record.extra["events"] = tracker.events
        if tracker.error is not None:
            self.record.extra["upstream_error"] = {
                "type": tracker.error.type,
                "message": tracker.error.message[:200],
            }
        if tracker.finished and tracker.error is None:
            await self._close_ok()
        else:
            reason = "upstream_error_event" if tracker.error is not None else "stream_cut"
            await self._close_error(reason, charge="usage_or_reservation")
        try:
            if held:
                await respond.send(held)
            if tracker.finished:
                await respond.end()
            else:
                await respond.abort()
        except ClientGone:
            return  # already recorded; the agent left after the last event was written

    async def _transport_failed(self, exc: upstream.UpstreamError, respond) -> None:
        reason = error_reason(exc)
        never_left = reason in ("connect", "pool_timeout")
        await self._close_error(
            reason, charge="nothing" if never_left else "usage_or_reservation", detail=str(exc)
        )
        if respond.started:
            await respond.abort()
            return
        kind = "docket_upstream_timeout" if reason == "timeout" else "docket_upstream_unreachable"
        answer = providers.refusal(
            self.route.kind, kind, f"upstream {self.route.name}: {reason}: {exc}"
        )
        await respond.simple(answer.status, answer.headers, answer.body)

    # ------------------------------------------------------------------ closing events

    def _timing(self) -> dict:
        now = self.b.clock.mono()
        out = {"duration_ms": int((now - self.record.started) * 1000), "bytes": self.record.bytes}
        if self.record.ttfb is not None:
            out["ttfb_ms"] = int((self.record.ttfb - self.record.started) * 1000)
        return out

    async def _close_ok(self) -> None:
        r = self.record
        usage, priced_usage = r.usage, None
        if usage is not None:
            try:
                priced_usage = usage.priced()
            except ValueError:
                priced_usage = None
        if priced_usage is None:
            # A success without usable usage: charge the worst case, say so.
            outcome = self.b.caps.fail(self.reservation)
            fields = {"usage_missing": True}
        else:
            outcome = self.b.caps.settle(self.reservation, priced_usage)
            fields = {}
        price = self.reservation.price
        await self.b.record(
            "model.response",
            call_id=r.call_id,
            provider=r.provider,
            model=r.model or "",
            status=r.status,
            usage=usage_fields(usage),
            cost_nusd=outcome.charged_nusd,
            priced=price is not None,
            **({"unit_prices": price.as_strings()} if price is not None else {}),
            **self._timing(),
            **fields,
            **r.extra,
        )
        await self.b.cap_events(outcome)
        self.b.metrics.call_finished(r.provider, "ok", self._timing()["duration_ms"] / 1000)

    async def _close_error(self, reason: str, *, charge: str, detail: str | None = None) -> None:
        r = self.record
        if charge == "nothing":
            self.b.caps.cancel(self.reservation)
            charged = 0
            outcome = None
        elif charge == "zero":
            outcome = self.b.caps.settle(self.reservation, _nothing_used())
            charged = outcome.charged_nusd
        else:
            priced = None
            if r.usage is not None:
                try:
                    priced = r.usage.priced()
                except ValueError:
                    priced = None
            outcome = (
                self.b.caps.settle(self.reservation, priced)
                if priced is not None
                else self.b.caps.fail(self.reservation)
            )
            charged = outcome.charged_nusd
        fields = {"detail": detail[:300]} if detail else {}
        await self.b.record(
            "model.error",
            call_id=r.call_id,
            provider=r.provider,
            model=r.model or "",
            reason=reason,
            status=r.status,
            usage=usage_fields(r.usage),
            cost_nusd=charged,
            **self._timing(),
            **fields,
            **r.extra,
        )
        if outcome is not None:
            await self.b.cap_events(outcome)
        self.b.metrics.call_finished(r.provider, reason, self._timing()["duration_ms"] / 1000)


def _nothing_used():
    from docket.pricing import Usage

    return Usage(0, 0)


def request_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
