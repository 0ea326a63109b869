"""OpenAI's Responses API and embeddings, in the stub: the request facts and the wire shapes.

Shapes follow the API reference and the openai SDK's types. A Response is
`{"object": "response", "status": "completed", "output": [message], "usage":
{"input_tokens", "output_tokens", ...}}`; its stream is `event:`/`data:` frames
(response.created, output item and content part added, one
response.output_text.delta per token, the matching done events, and
response.completed carrying the whole response with its usage; a reply cut by
max_output_tokens ends in response.incomplete). Embeddings answer `{"object":
"list", "data": [{"object": "embedding", "index", "embedding"}], "usage":
{"prompt_tokens", "total_tokens"}}`, each vector as floats, or as base64 of
little-endian float32 when `encoding_format` is "base64" (the openai SDK's default).
"""

from __future__ import annotations

import base64
import hashlib
import struct
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

RESPONSES = "call:responses"
EMBEDDINGS = "call:embeddings"
DIMENSIONS = 8  # short vectors: the stub's answers stay small; `dimensions` may ask fewer
MAX_INPUTS = 2048  # the API's own limit on inputs per embeddings request


def parse_responses(data: dict, model: str) -> Exchange:
    source = data.get("input")
    if not isinstance(source, str | list) or not source:
        raise StubRequestError(400, "Missing required parameter: 'input'.", param="input")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise StubRequestError(400, "'stream' must be a boolean", param="stream")
    prompt = text_bytes(source) + text_bytes(data.get("instructions"))
    return Exchange(
        model=model,
        stream=bool(stream),
        input_tokens=count_tokens(prompt),
        max_tokens=optional_positive_int(data, "max_output_tokens"),
        endpoint=RESPONSES,
    )


def parse_embeddings(data: dict, model: str) -> Exchange:
    source = data.get("input")
    if isinstance(source, str):
        texts = [source]
    elif isinstance(source, list) and source and all(isinstance(t, str) for t in source):
        texts = source
    else:
        raise StubRequestError(
            400, "'input' must be a string or a non-empty array of strings", param="input"
        )
    if len(texts) > MAX_INPUTS:
        raise StubRequestError(400, f"'input' may hold at most {MAX_INPUTS} items", param="input")
    encoding = data.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise StubRequestError(
            400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    dims = optional_positive_int(data, "dimensions") or DIMENSIONS
    return Exchange(
        model=model,
        stream=False,
        input_tokens=sum(count_tokens(len(t.encode("utf-8"))) for t in texts),
        max_tokens=None,
        endpoint=EMBEDDINGS,
        inputs=tuple(texts),
        encoding=encoding,
        dimensions=min(dims, DIMENSIONS),
    )


# ---------------------------------------------------------------- Responses


def _response(ex: Exchange, reply: Reply, seq: int, created: int, *, done: bool) -> dict:
    finished = "incomplete" if reply.truncated else "completed"
    message = {
        "type": "message",
        "id": f"msg_stub{seq:012d}",
        "status": "completed" if done else "in_progress",
        "role": "assistant",
        "content": [{"type": "output_text", "text": reply.text, "annotations": []}] if done else [],
    }
    return {
        "id": f"resp_stub{seq:012d}",
        "object": "response",
        "created_at": created,
        "status": finished if done else "in_progress",
        "model": ex.model,
        "output": [message] if done else [],
        "incomplete_details": {"reason": "max_output_tokens"} if done and reply.truncated else None,
        "error": None,
        "instructions": None,
        "max_output_tokens": ex.max_tokens,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": {
            "input_tokens": ex.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": ex.input_tokens + reply.output_tokens,
        }
        if done
        else None,
    }


def whole_response(ex: Exchange, reply: Reply, seq: int, created: int) -> bytes:
    return dumps(_response(ex, reply, seq, created, done=True))


def response_frames(
    ex: Exchange, reply: Reply, seq: int, created: int
) -> Iterator[tuple[bytes, bool]]:
    counter = iter(range(1_000_000))
    item_id = f"msg_stub{seq:012d}"
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: object) -> bytes:
        data = {"type": kind, "sequence_number": next(counter), **fields}
        return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    started = _response(ex, reply, seq, created, done=False)
    finished = _response(ex, reply, seq, created, done=True)
    item = dict(finished["output"][0], status="in_progress", content=[])
    part = {"type": "output_text", "text": "", "annotations": []}
    yield event("response.created", response=started), False
    yield event("response.in_progress", response=started), False
    yield event("response.output_item.added", output_index=0, item=item), False
    yield event("response.content_part.added", part=part, **where), False
    for token in reply.tokens:
        yield event("response.output_text.delta", delta=token, logprobs=[], **where), True
    yield event("response.output_text.done", text=reply.text, logprobs=[], **where), False
    done_part = dict(part, text=reply.text)
    yield event("response.content_part.done", part=done_part, **where), False
    yield event("response.output_item.done", output_index=0, item=finished["output"][0]), False
    terminal = "response.incomplete" if reply.truncated else "response.completed"
    yield event(terminal, response=finished), False


# ---------------------------------------------------------------- embeddings


def _vector(text: str, dimensions: int) -> list[float]:
    # Deterministic per text: the same input always embeds the same way. Multiples of
    # 1/128 are exact in float32, so the base64 and float forms decode to equal vectors.
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [(b - 128) / 128 for b in digest[:dimensions]]


def embeddings(ex: Exchange) -> bytes:
    data = []
    for index, text in enumerate(ex.inputs):
        vector = _vector(text, ex.dimensions)
        value: object = vector
        if ex.encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": value})
    usage = {"prompt_tokens": ex.input_tokens, "total_tokens": ex.input_tokens}
    return dumps({"object": "list", "data": data, "model": ex.model, "usage": usage})
