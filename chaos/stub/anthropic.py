"""The Anthropic wire shapes: message objects, the message event stream, errors, models.

Pure functions from an Exchange and a Reply to bytes; server.py does the I/O.
A stream is `event:`/`data:` frames: message_start (usage with input_tokens),
content_block_start, ping, content_block_delta per token, content_block_stop,
message_delta (stop_reason and the cumulative usage.output_tokens), message_stop.
Errors are {"type": "error", "error": {"type", "message"}, "request_id"}.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from chaos.stub.common import (
    Exchange,
    Reply,
    StubRequestError,
    count_tokens,
    dumps,
    optional_positive_int,
    text_bytes,
)

KIND = "anthropic"
MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def route(method: str, path: str) -> str:
    path = path.rstrip("/")
    if path == "/v1/messages" and method == "POST":
        return "call"
    if path == "/v1/models" and method == "GET":
        return "models"
    name = path.removeprefix("/v1/models/")
    if name != path and method == "GET":
        if name not in MODELS:
            raise StubRequestError(404, f"model: {name}")
        return f"models/{name}"
    raise StubRequestError(404, "Not found")


def api_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"x-api-key" and value.strip():
            return value.strip()
    for name, value in headers:  # an OAuth-style bearer token is accepted too
        if name == b"authorization" and value.lower().startswith(b"bearer ") and value[7:].strip():
            return value[7:].strip()
    return None


def missing_key_error() -> StubRequestError:
    return StubRequestError(401, "x-api-key header is required")


def parse(body: bytes, endpoint: str = "call") -> Exchange:  # one call endpoint
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise StubRequestError(400, "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise StubRequestError(400, "The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise StubRequestError(400, "model: Field required", param="model")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise StubRequestError(400, "messages: Field required", param="messages")
    max_tokens = optional_positive_int(data, "max_tokens")
    if max_tokens is None:
        raise StubRequestError(400, "max_tokens: Field required", param="max_tokens")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise StubRequestError(400, "stream: Input should be a valid boolean", param="stream")
    prompt = text_bytes(data.get("system")) + sum(
        text_bytes(m.get("content")) for m in messages if isinstance(m, dict)
    )
    return Exchange(
        model=model, stream=bool(stream), input_tokens=count_tokens(prompt), max_tokens=max_tokens
    )


def ident(seq: int) -> str:
    return f"msg_stub{seq:016d}"


def request_id(seq: int) -> str:
    return f"req_stub{seq:016d}"


def _stop_reason(reply: Reply) -> str:
    return "max_tokens" if reply.truncated else "end_turn"


def _usage(ex: Exchange, output_tokens: int) -> dict:
    return {
        "input_tokens": ex.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _message(ex: Exchange, seq: int, content: list, stop: str | None, output_tokens: int) -> dict:
    return {
        "id": ident(seq),
        "type": "message",
        "role": "assistant",
        "model": ex.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _usage(ex, output_tokens),
    }


def whole(ex: Exchange, reply: Reply, seq: int, created: int) -> bytes:
    content = [{"type": "text", "text": reply.text}]
    return dumps(_message(ex, seq, content, _stop_reason(reply), reply.output_tokens))


def _event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def frames(ex: Exchange, reply: Reply, seq: int, created: int) -> Iterator[tuple[bytes, bool]]:
    """The SSE frames of a streamed answer, each with whether it carries a token."""
    start = _message(ex, seq, [], None, min(1, reply.output_tokens))
    yield _event("message_start", {"type": "message_start", "message": start}), False
    block = {"type": "text", "text": ""}
    yield (
        _event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        False,
    )
    yield _event("ping", {"type": "ping"}), False
    for token in reply.tokens:
        delta = {"type": "text_delta", "text": token}
        yield (
            _event(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            ),
            True,
        )
    yield _event("content_block_stop", {"type": "content_block_stop", "index": 0}), False
    stop = {"stop_reason": _stop_reason(reply), "stop_sequence": None}
    usage = {"output_tokens": reply.output_tokens}
    yield _event("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}), False
    yield _event("message_stop", {"type": "message_stop"}), False


def error(status: int, message: str, *, param: str | None = None, seq: int = 0) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return dumps(
        {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": request_id(seq),
        }
    )


def models(created: int, name: str | None = None) -> bytes:
    """The models list, or one model (`models.retrieve`) when `name` is given."""

    def one(name: str) -> dict:
        return {
            "type": "model",
            "id": name,
            "display_name": name,
            "created_at": "2025-01-01T00:00:00Z",
        }

    if name is not None:
        return dumps(one(name))
    data = [one(name) for name in MODELS]
    return dumps({"data": data, "has_more": False, "first_id": MODELS[0], "last_id": MODELS[-1]})


def response_headers(seq: int, *, streaming: bool) -> list[tuple[bytes, bytes]]:
    kind = b"text/event-stream; charset=utf-8" if streaming else b"application/json"
    return [(b"content-type", kind), (b"request-id", request_id(seq).encode())]


OVERLOADED_STATUS = 529


def injected_error(kind: str, status: int | None, *, seq: int = 0) -> tuple[int, bytes]:
    """The status and body of an injected upstream error, in Anthropic's shape."""
    if kind == "rate_limited":
        message = "This request would exceed your account's rate limit. Please try again later."
        return 429, error(429, message, seq=seq)
    if kind == "overloaded":
        return OVERLOADED_STATUS, error(OVERLOADED_STATUS, "Overloaded", seq=seq)
    if kind == "status" and status is not None:
        return status, error(status, f"Injected upstream error {status} (Docket stub).", seq=seq)
    raise ValueError(f"no injected error {kind!r} with status {status!r}")
