"""The selftest's own upstream: a few lines of OpenAI-shaped chat completions.

docket/ never imports the chaos harness (its stubs live in chaos/stub), so the
selftest answers its boundary's calls itself, on a real socket on 127.0.0.1,
through the same docket.http.server the boundary uses. It answers every POST
with a chat.completion (or, asked to stream, a chat.completion.chunk event stream
ending in a usage chunk) whose usage counts the request's bytes (one token per
four, as a tokenizer roughly would), or with the status it is set to fail
with; it can hold each answer back, and it remembers what it saw (arrival
times, the Authorization header, the bodies) and the most calls it held at
once, which is what the checks judge the boundary by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import trio

from docket.http.server import Request, Responder

OUTPUT_TOKENS = 12
MAX_BODY = 1 << 20


@dataclass
class Seen:
    at: float  # trio's clock when the request arrived
    authorization: bytes
    body: bytes


@dataclass
class Upstream:
    """Answers 200 with a chat.completion, or `failing` (a status) when set;
    each answer `delay` seconds after the request arrived."""

    failing: int | None = None
    delay: float = 0.0
    token_delay: float = 0.0  # between a stream's frames
    # Put the Authorization header it got into its reply, as a leaky upstream might.
    echo_key: bool = False
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0

    async def __call__(self, request: Request, respond: Responder) -> None:
        body = await request.read_body(MAX_BODY)
        self.seen.append(Seen(trio.current_time(), request.header(b"authorization") or b"", body))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.delay:
                await trio.sleep(self.delay)
            if self.failing is None and _asks_to_stream(body):
                await self.stream(body, respond)
                return
            status, answer = self.answer(body, self.seen[-1].authorization)
        finally:
            self.in_flight -= 1
        await respond.simple(status, [(b"content-type", b"application/json")], answer)

    async def stream(self, body: bytes, respond: Responder) -> None:
        """A chat.completion.chunk event stream, one token a frame, `token_delay` apart,
        then the usage chunk (stream_options.include_usage) and [DONE]."""
        model = _model(body)
        await respond.start(200, [(b"content-type", b"text/event-stream")])
        for n in range(OUTPUT_TOKENS):
            delta = {"content": "ok "} if n else {"role": "assistant", "content": "ok "}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            await respond.send(
                _frame(
                    {
                        "object": "chat.completion.chunk",
                        "model": model,
                        "choices": [choice],
                        "usage": None,
                    }
                )
            )
            await trio.sleep(self.token_delay)
        prompt = max(1, len(body) // 4)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": prompt + OUTPUT_TOKENS,
        }
        await respond.send(
            _frame(
                {"object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage}
            )
        )
        await respond.send(b"data: [DONE]\n\n")
        await respond.end()

    def answer(self, body: bytes, authorization: bytes) -> tuple[int, bytes]:
        if self.failing is not None:
            error = {"message": "the selftest's upstream is failing", "type": "server_error"}
            return self.failing, json.dumps({"error": error}).encode()
        model = _model(body)
        prompt = max(1, len(body) // 4)
        text = "ok " * OUTPUT_TOKENS
        if self.echo_key:
            text += authorization.decode("latin-1")
        reply = {
            "id": f"chatcmpl-selftest{len(self.seen):06d}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": prompt + OUTPUT_TOKENS,
            },
        }
        return 200, json.dumps(reply).encode()


def _model(body: bytes) -> str:
    try:
        return str(json.loads(body).get("model", "gpt-4o-mini"))
    except (ValueError, AttributeError):
        return "gpt-4o-mini"  # the boundary checked the body; any reply will do


def _asks_to_stream(body: bytes) -> bool:
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return False


def _frame(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
