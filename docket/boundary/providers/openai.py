"""The OpenAI adapter: chat completions, legacy completions, Responses, embeddings.

Shapes follow the OpenAI API reference and the openai SDK's types: usage is
`prompt_tokens`/`completion_tokens` (cached counts inside
`prompt_tokens_details`, a subset of the prompt) on chat, completions and
embeddings, and `input_tokens`/`output_tokens` (`input_tokens_details`) on
Responses. A streamed chat or completion carries usage only when the request
sets `stream_options.include_usage`, in a last chunk whose `choices` is empty;
a Responses stream always carries it in its terminal `response.completed`,
`response.incomplete` or `response.failed` event, so nothing is injected there.
"""

from __future__ import annotations

import re
from typing import Any

from docket.boundary.providers.base import (
    ProviderError,
    RequestFacts,
    StreamTracker,
    Usage,
    check_error_args,
    choice_count,
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

KIND = "openai"

# POST path -> (endpoint name, the fields that declare the output limit, in precedence).
_ENDPOINTS = {
    "/v1/chat/completions": ("chat.completions", ("max_completion_tokens", "max_tokens")),
    "/v1/completions": ("completions", ("max_tokens",)),
    "/v1/responses": ("responses", ("max_output_tokens",)),
    "/v1/embeddings": ("embeddings", ()),
}
_USAGE_CHUNK_ENDPOINTS = frozenset({"chat.completions", "completions"})
_RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

# Cheap prefilters on a chunk's data, confirmed by decoding the JSON. Inside a JSON
# string every quote is escaped, so these cannot match text the model wrote.
_USAGE_OBJECT = re.compile(r'"usage"\s*:\s*\{')
_ERROR_OBJECT = re.compile(r'"error"\s*:\s*\{')


def credential(api_key: str) -> tuple[bytes, bytes]:
    return (b"authorization", b"Bearer " + api_key.encode("latin-1"))


def request_facts(
    path: str, headers: Headers, body: bytes, *, method: str = "POST"
) -> RequestFacts:
    route = _ENDPOINTS.get(path) if method == "POST" else None
    if route is None:
        return RequestFacts(KIND, "other", None, False, None)
    endpoint, limit_fields = route
    require_identity_encoding(headers)
    payload = parse_json_object(body, "request body")
    model = require_model(payload, path)
    stream = stream_flag(payload) if endpoint != "embeddings" else False
    limit = token_limit(payload, *limit_fields)
    choices = 1
    if endpoint == "chat.completions":
        choices = choice_count(payload, "n")
    elif endpoint == "completions":
        choices = max(choice_count(payload, "n"), choice_count(payload, "best_of"))
    return RequestFacts(KIND, endpoint, model, stream, limit, choices, payload=payload)


def prepare(facts: RequestFacts, body: bytes) -> tuple[bytes, bool]:
    if not (facts.stream and facts.endpoint in _USAGE_CHUNK_ENDPOINTS and facts.payload):
        return body, False
    options = facts.payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, False
    payload = dict(facts.payload)
    payload["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return encode_json(payload), True


def usage_from_object(endpoint: str, obj: object) -> Usage | None:
    """Usage from a decoded response body (or a Responses `response` object)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    if endpoint == "responses":
        details = usage.get("input_tokens_details")
        return _usage(usage.get("input_tokens"), usage.get("output_tokens"), details)
    details = usage.get("prompt_tokens_details")
    if endpoint == "embeddings":
        # An embedding has no output tokens: zero is the fact, not a missing count.
        return _usage(usage.get("prompt_tokens"), 0, details)
    return _usage(usage.get("prompt_tokens"), usage.get("completion_tokens"), details)


def _usage(input_tokens: object, output_tokens: object, details: object) -> Usage:
    cached = written = 0
    if isinstance(details, dict):
        cached = count(details.get("cached_tokens")) or 0
        written = count(details.get("cache_write_tokens")) or 0
    return Usage(count(input_tokens), count(output_tokens), cached, True, written)


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
    code = error.get("code")
    return ProviderError(
        _str_or_none(error.get("type")),
        message if isinstance(message, str) else "",
        None if code is None else str(code),
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def error_body(
    status: int, error_type: str, message: str, extra: dict[str, Any] | None = None
) -> bytes:
    """`{"error": {"message", "type", "param", "code", ...extra}}`, as the openai SDK reads it."""
    extra = check_error_args(status, error_type, extra)
    error = {
        "message": message,
        "type": error_type,
        "param": extra.pop("param", None),
        "code": extra.pop("code", None),
    }
    error.update(extra)
    return encode_json({"error": error})


class ChatStreamTracker(StreamTracker):
    """Chat completions and legacy completions: `data:` chunks, then `data: [DONE]`."""

    def observe(self, event: SSEEvent) -> bool:
        data = event.data
        if data == "[DONE]":
            self.finished = True
            return False
        if _USAGE_OBJECT.search(data):
            obj = self.decode(event)
            if obj is None:
                return False
            usage = usage_from_object("chat.completions", obj)
            if usage is not None:
                self.usage = usage
                # Only a chunk that carries nothing else is ours to remove.
                return not obj.get("choices")
            return False
        if _ERROR_OBJECT.search(data):
            obj = self.decode(event)
            if obj is not None:
                self.error = error_from_object(obj) or self.error
        return False


class ResponsesStreamTracker(StreamTracker):
    """Responses API: named semantic events, ending with a terminal response.* event."""

    def observe(self, event: SSEEvent) -> bool:
        name = event.event
        if name is None:
            # Data-only streams from compatible servers: the type is inside the JSON.
            if '"response.' not in event.data and '"error"' not in event.data:
                return False
            obj = self.decode(event)
            name = obj.get("type") if obj else None
        elif name in _RESPONSES_TERMINAL or name == "error":
            obj = self.decode(event)
        else:
            return False
        if obj is None:
            return False
        if name in _RESPONSES_TERMINAL:
            self.finished = True
            response = obj.get("response")
            usage = usage_from_object("responses", response)
            if usage is not None:
                self.usage = usage
            if name == "response.failed":
                self.error = _response_failure(response)
        elif name == "error":
            message = obj.get("message")
            self.error = ProviderError(
                _str_or_none(obj.get("code")) or "error",
                message if isinstance(message, str) else "",
                _str_or_none(obj.get("code")),
            )
        return False


def _response_failure(response: object) -> ProviderError:
    error = response.get("error") if isinstance(response, dict) else None
    if not isinstance(error, dict):
        return ProviderError("response.failed", "the response failed without an error object")
    message = error.get("message")
    code = _str_or_none(error.get("code"))
    kind = _str_or_none(error.get("type")) or code or "response.failed"
    return ProviderError(kind, message if isinstance(message, str) else "", code)


def stream_tracker(
    facts: RequestFacts, *, strip_usage_chunk: bool, max_event_bytes: int
) -> StreamTracker:
    if facts.endpoint == "responses":
        if strip_usage_chunk:
            raise ValueError("a Responses stream has no usage chunk to strip")
        return ResponsesStreamTracker(max_event_bytes=max_event_bytes)
    return ChatStreamTracker(strip_usage_chunk=strip_usage_chunk, max_event_bytes=max_event_bytes)
