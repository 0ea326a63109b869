"""Pairing a ledger's events into calls, for the explain patterns.

A model.request opens a call (by call_id); its model.response or model.error
closes it with what it cost. Only calls in flight are held, so memory is
bounded by concurrency, not by the run's length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Attempts the boundary answered itself without forwarding: transient refusals that
# tell the caller to come back (Retry-After), and refusals that never will pass.
TRANSIENT_REFUSALS = frozenset({"x-docket.rate-limited", "x-docket.breaker-open", "load.shed"})
POLICY_REFUSALS = frozenset({"policy.denied", "net.denied"})
REFUSALS = TRANSIENT_REFUSALS | POLICY_REFUSALS


def _int(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def _str(value: object) -> str:
    return value if type(value) is str else ""


@dataclass
class Call:
    """One forwarded call, from its model.request to its closing event."""

    seq: int
    mono_ms: int
    provider: str
    model: str
    endpoint: str
    request_bytes: int
    request_sha256: str
    client_attempt: int | None  # the client's own attempt number (0 = first), when it sent one
    end_seq: int | None = None
    end_mono_ms: int | None = None
    ok: bool = False  # closed by a model.response with a 2xx status
    status: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_nusd: int = 0
    input_price: str | None = None  # USD per million input tokens, as the response stated
    marks: dict = field(default_factory=dict)  # what patterns noted about this call


def client_attempt(event: dict) -> int | None:
    """The client's attempt marker on an event (A2's `client_attempt`), if it carries one."""
    value = event.get("client_attempt")
    return value if type(value) is int and value >= 0 else None


def open_call(event: dict) -> Call:
    return Call(
        seq=event["seq"],
        mono_ms=event["mono_ms"],
        provider=_str(event.get("provider")),
        model=_str(event.get("model")),
        endpoint=_str(event.get("endpoint")),
        request_bytes=_int(event.get("request_bytes")),
        request_sha256=_str(event.get("request_sha256")),
        client_attempt=client_attempt(event),
    )


def close_call(call: Call, event: dict) -> None:
    """Fill in what the closing event says (the tally has checked its types already)."""
    call.end_seq, call.end_mono_ms = event["seq"], event["mono_ms"]
    status = event.get("status")
    call.status = status if type(status) is int else None
    call.ok = event["type"] == "model.response" and (call.status is None or call.status < 400)
    usage = event.get("usage") or {}
    call.input_tokens = _int(usage.get("input_tokens"))
    call.output_tokens = _int(usage.get("output_tokens"))
    call.cached_tokens = _int(usage.get("cached_tokens"))
    call.cost_nusd = _int(event.get("cost_nusd"))
    prices = event.get("unit_prices")
    if isinstance(prices, dict) and type(prices.get("input")) is str:
        call.input_price = prices["input"]
    if not call.model:
        call.model = _str(event.get("model"))
