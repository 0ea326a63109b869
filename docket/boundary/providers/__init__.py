"""Provider adapters: what the boundary must understand of OpenAI and Anthropic traffic.

Sans-IO and cheap enough for the hot path. The boundary, for one call:

    provider = by_kind(policy_kind)                 # once, when the route is made
    facts = request_facts(provider, path, headers, body)   # BadRequest -> refusal(...)
    body, strip = prepare(provider, facts, body)
    token, headers = swap_auth(provider, headers, api_key=..., upstream_host=...,
                               content_length=len(body))
    ... forward ...
    usage_from_body(provider, facts.endpoint, response_body)    # or, streamed:
    tracker = stream_tracker(provider, facts, strip_usage_chunk=strip)
    send(tracker.feed(chunk)) ...; send(tracker.flush()); tracker.usage / .finished / .error
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from docket.boundary.providers import anthropic, openai
from docket.boundary.providers.base import (
    DEFAULT_MAX_EVENT_BYTES,
    DOCKET_ERRORS,
    BadRequest,
    ProviderError,
    RefusalKind,
    RequestFacts,
    StreamTracker,
    Usage,
    loads,
)
from docket.boundary.providers.headers import (
    Headers,
    outgoing_headers,
    presented_token,
    token_matches,
)
from docket.boundary.providers.interface import Provider
from docket.boundary.providers.sse import SSEEvent, SSEParser

__all__ = [
    "DOCKET_ERRORS",
    "KINDS",
    "PROVIDERS",
    "Provider",
    "by_kind",
    "BadRequest",
    "ProviderError",
    "ErrorAnswer",
    "RefusalKind",
    "RequestFacts",
    "SSEEvent",
    "SSEParser",
    "StreamTracker",
    "Usage",
    "error_body",
    "error_from_body",
    "prepare",
    "Forwarded",
    "forwarded",
    "changed_paths",
    "refusal",
    "request_facts",
    "stream_tracker",
    "swap_auth",
    "token_matches",
    "usage_from_body",
]

# The providers, by the policy's `kind`: each module implements interface.Provider (mypy
# checks it here). A kind string is looked up once, when a route is made (by_kind); from
# there on the call holds the Provider itself.
PROVIDERS: dict[str, Provider] = {openai.KIND: openai, anthropic.KIND: anthropic}
KINDS = tuple(PROVIDERS)


def by_kind(kind: str) -> Provider:
    try:
        return PROVIDERS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r}; expected one of {KINDS}") from None


def request_facts(
    provider: Provider, path: str, headers: Headers, body: bytes, *, method: str = "POST"
) -> RequestFacts:
    """Model, stream flag, declared output limit and endpoint of one request.

    `path` is what follows the provider prefix ("/v1/chat/completions"); a query
    string and one trailing slash are ignored. Raises BadRequest when a model
    endpoint gets a body that is not a JSON object, lacks a model, or declares a
    stream flag or token limit of the wrong type.
    """
    path = path.partition("?")[0]
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return provider.request_facts(path, headers, body, method=method)


def prepare(provider: Provider, facts: RequestFacts, body: bytes) -> tuple[bytes, bool]:
    """The body to forward, and whether the stream's usage chunk must be hidden from the client.

    The body is re-encoded only when changed: an OpenAI streamed chat or
    completion that did not ask for usage is made to, so usage is always recorded.
    """
    return provider.prepare(facts, body)


class Forwarded(NamedTuple):
    """What goes upstream for one call: decided once, before its model.request is
    written, so that the bytes the ledger names are the bytes sent."""

    body: bytes
    strip_usage: bool  # hide the usage chunk the client did not ask for
    changes: tuple[str, ...]  # paths whose values differ from the agent's body; () if unchanged


RE_ENCODED = "(re-encoded)"  # the bytes differ, no value does (whitespace, order, escapes)


def forwarded(provider: Provider, facts: RequestFacts, body: bytes) -> Forwarded:
    """prepare(), and what it changed: JSON paths such as `stream_options.include_usage`."""
    new, strip = prepare(provider, facts, body)
    if new is body or new == body:
        return Forwarded(body, strip, ())
    changes = changed_paths(facts.payload, loads(new))
    return Forwarded(new, strip, tuple(changes) or (RE_ENCODED,))


def changed_paths(before: object, after: object, path: str = "") -> list[str]:
    """The dotted paths where two decoded JSON values differ (true is not 1 here)."""
    if type(before) is dict and type(after) is dict:
        out: list[str] = []
        for key in sorted(before.keys() | after.keys()):
            where = f"{path}.{key}" if path else key
            if key not in before or key not in after:
                missing = after.get(key) if key not in before else before.get(key)
                # A whole object added or removed: name its leaves (or it, if it has none).
                leaves = changed_paths({}, missing, where) if type(missing) is dict else []
                out += leaves or [where]
            else:
                out += changed_paths(before[key], after[key], where)
        return out
    same = type(before) is type(after) and before == after
    return [] if same else [path or "(root)"]


def swap_auth(
    provider: Provider,
    headers: Headers,
    *,
    api_key: str,
    upstream_host: str,
    content_length: int | None,
) -> tuple[str | None, Headers]:
    """(the token the client presented or None, the headers to send upstream).

    The client's credentials are dropped and the real key inserted in the
    provider's own header; see headers.outgoing_headers for everything else removed.
    """
    return presented_token(headers), upstream_headers(
        provider,
        headers,
        api_key=api_key,
        upstream_host=upstream_host,
        content_length=content_length,
    )


def upstream_headers(
    provider: Provider,
    headers: Headers,
    *,
    api_key: str,
    upstream_host: str,
    content_length: int | None,
) -> Headers:
    """swap_auth's headers alone, for a caller that has already checked the token."""
    return outgoing_headers(
        headers,
        credential=provider.credential(api_key),
        upstream_host=upstream_host,
        content_length=content_length,
    )


def usage_from_body(provider: Provider, endpoint: str, body: bytes) -> Usage | None:
    """Usage of a non-streamed response, or None when the body carries none."""
    return provider.usage_from_body(endpoint, body)


def stream_tracker(
    provider: Provider,
    facts: RequestFacts,
    *,
    strip_usage_chunk: bool = False,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> StreamTracker:
    """A tracker for the streamed response to this request."""
    return provider.stream_tracker(
        facts, strip_usage_chunk=strip_usage_chunk, max_event_bytes=max_event_bytes
    )


def error_body(
    provider: Provider,
    status: int,
    error_type: str,
    message: str,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """An error body in the provider's own shape. `extra` fields (such as the rule
    that refused: {"cap": "max_usd"}) go inside the error object; for OpenAI,
    extra "param" and "code" fill those standard fields."""
    return provider.error_body(status, error_type, message, extra)


def error_from_body(provider: Provider, body: bytes) -> ProviderError | None:
    """The error an upstream error response carries, if its body has the provider's shape."""
    try:
        obj = loads(body)
    except ValueError:
        return None
    return provider.error_from_object(obj)


class ErrorAnswer(NamedTuple):
    """A docket_* refusal, ready for the boundary to send."""

    status: int
    headers: Headers
    body: bytes


def refusal(
    provider: Provider,
    error_type: str,
    message: str,
    *,
    extra: dict[str, Any] | None = None,
    retry_after_s: float | None = None,
    status: int | None = None,
) -> ErrorAnswer:
    """A complete answer for a docket_* refusal: status from DOCKET_ERRORS (or `status`,
    a 4xx or 5xx of the caller's, such as 408 for a request that stalled), JSON body,
    Content-Length, Retry-After when given (whole seconds, rounded up), and `x-should-retry: false` when no
    retry can succeed."""
    spec = DOCKET_ERRORS.get(error_type)
    if spec is None:
        raise ValueError(f"unknown docket error type {error_type!r}")
    status = spec.status if status is None else status
    body = error_body(provider, status, error_type, message, extra)
    headers: Headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(max(0, math.ceil(retry_after_s))).encode("ascii")))
    if not spec.retryable:
        headers.append((b"x-should-retry", b"false"))
    return ErrorAnswer(status, headers, body)
