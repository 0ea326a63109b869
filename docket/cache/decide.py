"""Pure decisions: may a request be answered from the cache, may an answer be stored.

A stored answer is served only to a request whose bytes are identical (same
SHA-256), on the same route and path. Identical bytes are not enough when the
answer was drawn at random: a request with a temperature other than an explicit
0 (absent means the provider's default, 1), asking for several choices (`n`,
`best_of`) or offering tools is never served, nor stored, unless the policy
names its model under [cache.serve_anyway]: replaying one sample as if it were a
fresh draw, or a tool call whose side effects the agent expects to cause again,
is the cache answering a request it should never have (docs/resilience.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from docket.cache.config import CachePolicy

GENERATING = frozenset({"chat.completions", "responses", "completions", "messages"})
CACHEABLE_ENDPOINTS = GENERATING | {"embeddings"}

# Every reason an answer is not stored, in the order they are checked (the first wins).
REQUEST_REASONS = ("endpoint", "model_not_listed", "temperature", "n", "tools")
ANSWER_REASONS = ("not_2xx", "incomplete", "usage_missing", "fault_injected", "too_large")
# A shared store (scope = NAME) that could not be read mid-run: forwarded, not stored.
STORE_REASONS = ("store_unreadable",)
REASONS = REQUEST_REASONS + ANSWER_REASONS + STORE_REASONS

# Per provider kind, the request headers the provider reads to choose or shape its
# answer (docs/cache.md says why for each): the same body under another of these is
# another question, so they are part of the key. Every other header the agent sends
# (user-agent, x-stainless-*, idempotency-key, traceparent...) does not change the
# answer. A header whose name holds "tenant" is part of the key for every kind: the
# gateways that speak these APIs route tenants by one (x-tenant-id).
SHAPING_HEADERS: Mapping[str, frozenset[bytes]] = {
    "openai": frozenset({b"openai-organization", b"openai-project", b"openai-beta"}),
    "anthropic": frozenset({b"anthropic-version", b"anthropic-beta"}),
}


def shaping_headers(kind: str, headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The key's digest of the request headers that shape the answer: "" when the
    request carries none of them; else the SHA-256 of each such header, its name
    lowercased, in the order sent (a repeated header's order can matter)."""
    named = SHAPING_HEADERS.get(kind, frozenset())
    picked = []
    for name, value in headers:
        low = bytes(name).lower()
        if low in named or b"tenant" in low:
            picked.append(low + b":" + bytes(value).strip())
    if not picked:
        return ""
    return hashlib.sha256(b"\n".join(picked)).hexdigest()


@dataclass(frozen=True, slots=True)
class Keep:
    """Keep the answer in the store."""


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str  # one of REASONS


@dataclass(frozen=True, slots=True)
class Answer:
    """What is known of an answer when its call closes."""

    status: int | None  # None: no answer came
    complete: bool  # the whole body, or a stream to the provider's end with no error event
    usage_missing: bool  # a success whose usage could not be read (charged the worst case)
    faulted: bool  # a chaos fault was recorded while the call was in flight
    size: int  # the entry it would make (store.Entry.size)


def request_refusal(
    endpoint: str,
    model: str | None,
    choices: int,
    payload: Mapping[str, object] | None,
    policy: CachePolicy,
) -> str | None:
    """None if this request may be served from the cache (and its answer stored);
    else the reason it may not, one of REQUEST_REASONS."""
    if endpoint not in CACHEABLE_ENDPOINTS:
        return "endpoint"
    if policy.models and model not in policy.models:
        return "model_not_listed"
    if endpoint not in GENERATING:
        return None  # embeddings: the same input, the same vector
    allowed = policy.serve_anyway.get(model or "", ())
    body = payload or {}
    temperature = body.get("temperature")
    greedy = type(temperature) in (int, float) and temperature == 0
    if not greedy and "temperature" not in allowed:
        return "temperature"
    if choices > 1 and "n" not in allowed:
        return "n"
    if _offers_tools(body) and "tools" not in allowed:
        return "tools"
    return None


def _offers_tools(body: Mapping[str, object]) -> bool:
    return any(bool(body.get(name)) for name in ("tools", "functions"))


def storable(request_reason: str | None, answer: Answer, max_bytes: int) -> Keep | Refuse:
    """Store only a whole, unfaulted 200 with its usage, to a request that may be
    served (another 2xx is no model's answer: 204 has no body to replay)."""
    if request_reason is not None:
        return Refuse(request_reason)
    if answer.status != 200:
        return Refuse("not_2xx")
    if not answer.complete:
        return Refuse("incomplete")
    if answer.usage_missing:
        return Refuse("usage_missing")
    if answer.faulted:
        return Refuse("fault_injected")
    if answer.size > max_bytes:
        return Refuse("too_large")
    return Keep()
