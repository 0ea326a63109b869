"""The Anthropic adapter: the Messages API (and its token counter).

Shapes follow the Messages API reference and the anthropic SDK's types: usage
is `input_tokens`/`output_tokens`, with `cache_read_input_tokens` and
`cache_creation_input_tokens` counted apart from (on top of) `input_tokens`.
A stream opens with `message_start` (whose message carries the usage so far),
reports cumulative usage in each `message_delta` (the latest value holds, never
a sum), and ends with `message_stop`; an `error` event may arrive instead. The
anthropic SDK ignores events without an `event:` name, so the tracker does too.
"""

from __future__ import annotations

from typing import Any

from docket.boundary.providers.base import (
    ProviderError,
    RequestFacts,
    StreamTracker,
    Usage,
    check_error_args,
    count,
    encode_json,
    loads,
    parse_json_object,
    require_identity_encoding,
    require_model,
    stream_flag,
    token_limit,
)
from docket.boundary.providers.headers import Headers
from docket.boundary.providers.sse import SSEEvent

KIND = "anthropic"

_ENDPOINTS = {
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages.count_tokens",
}
_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
_SPLIT_FIELDS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")


def credential(api_key: str) -> tuple[bytes, bytes]:
    return (b"x-api-key", api_key.encode("latin-1"))


def request_facts(
    path: str, headers: Headers, body: bytes, *, method: str = "POST"
) -> RequestFacts:
    endpoint = _ENDPOINTS.get(path) if method == "POST" else None
    if endpoint is None:
        return RequestFacts(KIND, "other", None, False, None)
    require_identity_encoding(headers)
    payload = parse_json_object(body, "request body")
    model = require_model(payload, path)
    if endpoint == "messages.count_tokens":
        return RequestFacts(KIND, endpoint, model, False, None, payload=payload)
    limit = token_limit(payload, "max_tokens")
    return RequestFacts(KIND, endpoint, model, stream_flag(payload), limit, payload=payload)


def prepare(facts: RequestFacts, body: bytes) -> tuple[bytes, bool]:
    # Every Anthropic stream reports usage: nothing to ask for, nothing to strip.
    return body, False


def usage_from_fields(fields: dict[str, Any]) -> Usage:
    return Usage(
        count(fields.get("input_tokens")),
        count(fields.get("output_tokens")),
        count(fields.get("cache_read_input_tokens")) or 0,
        False,
        count(fields.get("cache_creation_input_tokens")) or 0,
        _one_hour_writes(fields.get("cache_creation")),
    )


def _one_hour_writes(split: object) -> int | None:
    """The 1h part of the cache writes, when the usage splits them by lifetime."""
    if not isinstance(split, dict):
        return None
    return count(split.get("ephemeral_1h_input_tokens"))


def usage_from_object(endpoint: str, obj: object) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    # The token counter answers with a bare input_tokens and no usage: it is free.
    usage = obj.get("usage")
    return usage_from_fields(usage) if isinstance(usage, dict) else None


def usage_from_body(endpoint: str, body: bytes) -> Usage | None:
    try:
        return usage_from_object(endpoint, loads(body))
    except ValueError:
        return None


def error_from_object(obj: object) -> ProviderError | None:
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    kind = error.get("type")
    return ProviderError(
        kind if isinstance(kind, str) else None, message if isinstance(message, str) else ""
    )


def error_body(
    status: int, error_type: str, message: str, extra: dict[str, Any] | None = None
) -> bytes:
    """`{"type": "error", "error": {"type", "message", ...extra}}`, as the anthropic SDK reads it."""
    extra = check_error_args(status, error_type, extra)
    return encode_json(
        {"type": "error", "error": {"type": error_type, "message": message, **extra}}
    )


class MessagesStreamTracker(StreamTracker):
    def __init__(self, *, max_event_bytes: int) -> None:
        super().__init__(max_event_bytes=max_event_bytes)
        self._usage_fields: dict[str, Any] = {}

    def observe(self, event: SSEEvent) -> bool:
        name = event.event
        if name == "message_delta":
            obj = self.decode(event)
            if obj is not None:
                self._merge(obj.get("usage"))
        elif name == "message_start":
            obj = self.decode(event)
            message = obj.get("message") if obj is not None else None
            if isinstance(message, dict):
                self._merge(message.get("usage"))
        elif name == "message_stop":
            self.finished = True
        elif name == "error":
            obj = self.decode(event)
            if obj is not None:
                self.error = error_from_object(obj) or ProviderError(
                    None, "an error event without an error object"
                )
        return False

    def _merge(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        for name in _USAGE_FIELDS:
            value = count(usage.get(name))
            if value is not None:
                self._usage_fields[name] = value
        split = usage.get("cache_creation")
        if isinstance(split, dict):
            kept = self._usage_fields.setdefault("cache_creation", {})
            for name in _SPLIT_FIELDS:
                value = count(split.get(name))
                if value is not None:
                    kept[name] = value
        if self._usage_fields:
            self.usage = usage_from_fields(self._usage_fields)


def stream_tracker(
    facts: RequestFacts, *, strip_usage_chunk: bool, max_event_bytes: int
) -> StreamTracker:
    if strip_usage_chunk:
        raise ValueError("an Anthropic stream has no usage chunk to strip")
    return MessagesStreamTracker(max_event_bytes=max_event_bytes)
