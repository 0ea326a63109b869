"""The OpenAI wire shapes: chat.completion, chat.completion.chunk SSE, errors, models.

Pure functions from an Exchange and a Reply to bytes; server.py does the I/O.
Shapes follow the API reference: a stream is `data: {chunk}` frames ending with
`data: [DONE]`; with stream_options.include_usage every chunk carries
`"usage": null` and one last chunk has `"choices": []` and the usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from chaos.stub import openai_extra
from chaos.stub.common import (
    Exchange,
    Reply,
    StubRequestError,
    count_tokens,
    dumps,
    optional_positive_int,
    text_bytes,
)

KIND = "openai"
MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini")
FINGERPRINT = "fp_docket_stub"
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}


_CALLS = {
    "/v1/chat/completions": "call",
    "/v1/responses": openai_extra.RESPONSES,
    "/v1/embeddings": openai_extra.EMBEDDINGS,
}


def route(method: str, path: str) -> str:
    """Which endpoint: a model call ("call", "call:responses", "call:embeddings") or
    "models"; StubRequestError(404) otherwise."""
    path = path.rstrip("/")
    if path in _CALLS and method == "POST":
        return _CALLS[path]
    if path == "/v1/models" and method == "GET":
        return "models"
    name = path.removeprefix("/v1/models/")
    if name != path and method == "GET":
        if name not in MODELS:
            raise StubRequestError(404, f"The model '{name}' does not exist")
        return f"models/{name}"
    raise StubRequestError(404, f"Invalid URL ({method} {path})")


def api_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"authorization" and value.lower().startswith(b"bearer ") and value[7:].strip():
            return value[7:].strip()
    return None


def missing_key_error() -> StubRequestError:
    return StubRequestError(
        401,
        "You didn't provide an API key. You need to provide your API key in an "
        "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
    )


def parse(body: bytes, endpoint: str = "call") -> Exchange:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise StubRequestError(
            400, "We could not parse the JSON body of your request. (HINT: not valid JSON.)"
        ) from None
    if not isinstance(data, dict):
        raise StubRequestError(400, "The request body must be a JSON object.")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise StubRequestError(400, "you must provide a model parameter", param="model")
    if endpoint == openai_extra.RESPONSES:
        return openai_extra.parse_responses(data, model)
    if endpoint == openai_extra.EMBEDDINGS:
        return openai_extra.parse_embeddings(data, model)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise StubRequestError(
            400, "'messages' must be a non-empty array of messages", param="messages"
        )
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise StubRequestError(400, "'stream' must be a boolean", param="stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise StubRequestError(400, "'stream_options' must be an object", param="stream_options")
    prompt = sum(text_bytes(m.get("content")) for m in messages if isinstance(m, dict))
    return Exchange(
        model=model,
        stream=bool(stream),
        input_tokens=count_tokens(prompt),
        max_tokens=optional_positive_int(data, "max_completion_tokens", "max_tokens"),
        include_usage=bool(stream) and options.get("include_usage") is True,
    )


def ident(seq: int) -> str:
    return f"chatcmpl-stub{seq:012d}"


def usage(ex: Exchange, reply: Reply) -> dict:
    return {
        "prompt_tokens": ex.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": ex.input_tokens + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _finish_reason(reply: Reply) -> str:
    return "length" if reply.truncated else "stop"


def whole(ex: Exchange, reply: Reply, seq: int, created: int) -> bytes:
    """The body of a non-streamed answer: one chat.completion object (or a Response,
    or embeddings, for those endpoints)."""
    if ex.endpoint == openai_extra.RESPONSES:
        return openai_extra.whole_response(ex, reply, seq, created)
    if ex.endpoint == openai_extra.EMBEDDINGS:
        return openai_extra.embeddings(ex)
    return dumps(
        {
            "id": ident(seq),
            "object": "chat.completion",
            "created": created,
            "model": ex.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": reply.text,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": _finish_reason(reply),
                }
            ],
            "usage": usage(ex, reply),
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }
    )


def frames(ex: Exchange, reply: Reply, seq: int, created: int) -> Iterator[tuple[bytes, bool]]:
    """The SSE frames of a streamed answer, each with whether it carries a token."""
    if ex.endpoint == openai_extra.RESPONSES:
        yield from openai_extra.response_frames(ex, reply, seq, created)
        return

    def chunk(choices: list, *, usage_value: object = None) -> bytes:
        body: dict = {
            "id": ident(seq),
            "object": "chat.completion.chunk",
            "created": created,
            "model": ex.model,
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }
        if ex.include_usage:
            body["usage"] = usage_value
        return b"data: " + dumps(body) + b"\n\n"

    def choice(delta: dict, finish: str | None = None) -> list:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    yield chunk(choice({"role": "assistant", "content": "", "refusal": None})), False
    for token in reply.tokens:
        yield chunk(choice({"content": token})), True
    yield chunk(choice({}, _finish_reason(reply))), False
    if ex.include_usage:
        yield chunk([], usage_value=usage(ex, reply)), False
    yield b"data: [DONE]\n\n", False


def error(
    status: int, message: str, *, param: str | None = None, seq: int = 0, code: str | None = None
) -> bytes:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def _model(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "docket-stub"}


def models(created: int, name: str | None = None) -> bytes:
    """The models list, or one model (`models.retrieve`) when `name` is given."""
    if name is not None:
        return dumps(_model(name, created))
    return dumps(
        {
            "object": "list",
            "data": [_model(name, created) for name in MODELS],
        }
    )


def response_headers(seq: int, *, streaming: bool) -> list[tuple[bytes, bytes]]:
    kind = b"text/event-stream; charset=utf-8" if streaming else b"application/json"
    return [(b"content-type", kind), (b"x-request-id", f"req_stub{seq:012d}".encode())]


# OpenAI has no 529: an overloaded server answers 503 with a server_error
# ("The server is overloaded or not ready yet."), which its SDK retries.
OVERLOADED_STATUS = 503


def injected_error(kind: str, status: int | None, *, seq: int = 0) -> tuple[int, bytes]:
    """The status and body of an injected upstream error, in OpenAI's shape."""
    if kind == "rate_limited":
        # a rate limit is typed by what ran out ("requests" or "tokens")
        message = (
            "Rate limit reached for requests per min (RPM) on the Docket stub. "
            "Please try again later."
        )
        body = {
            "message": message,
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
        return 429, dumps({"error": body})
    if kind == "overloaded":
        message = "The server is overloaded or not ready yet."
        return OVERLOADED_STATUS, error(OVERLOADED_STATUS, message, seq=seq)
    if kind == "status" and status is not None:
        return status, error(status, f"Injected upstream error {status} (Docket stub).", seq=seq)
    raise ValueError(f"no injected error {kind!r} with status {status!r}")
