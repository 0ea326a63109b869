"""The pure half of one model call: the body the agent sends, and what an answer means.

A complete answer is classified from its status, body and Retry-After header; a
streamed one is fed to an SseDecoder chunk by chunk as it arrives. Either way the
result is an Outcome (ok, refused, or error with its reason), decided from bytes
alone, so it is tested without a socket; docket.agent.modes does the sending.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from docket.agent.config import AgentConfig

POLICY_DENIED = "docket_policy_denied"
MAX_SSE_LINE = 1024 * 1024  # a stream that never sends a newline is broken, not long


def request_body(config: AgentConfig, n: int, *, stream: bool) -> dict:
    """The call's JSON body; `n` makes each call of a run distinct (a retry reuses it)."""
    body: dict = {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "messages": [{"role": "user", "content": f"Say hello. This is call {n}."}],
    }
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if stream:
        body["stream"] = True
        if config.provider == "openai":
            body["stream_options"] = {"include_usage": True}
    return body


@dataclass(frozen=True)
class Outcome:
    """What one HTTP attempt came to: ok, refused (an HTTP error answer) or error."""

    kind: str  # "ok" | "refused" | "error"
    status: int | None = None
    error_type: str | None = None  # error.type of a refusal's body, when it has one
    retry_after: str | None = None  # the raw header; parsing is the policy's business
    reason: str | None = None  # why an error is one: "ConnectError", "malformed_body", ...
    detail: str | None = None  # the first line a human needs to see

    @property
    def answered(self) -> bool:
        """The server answered with an HTTP status (the call reached it)."""
        return self.status is not None

    @property
    def policy_denied(self) -> bool:
        return self.kind == "refused" and self.error_type == POLICY_DENIED


def _error_type(body: bytes) -> str | None:
    # OpenAI: {"error": {"type": ...}}; Anthropic: {"type": "error", "error": {"type": ...}}.
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def classify(provider: str, status: int, body: bytes, retry_after: str | None) -> Outcome:
    """A complete non-streamed answer: ok only if it is a 2xx with the provider's shape."""
    if status >= 400:
        return Outcome("refused", status, _error_type(body), retry_after)
    if not 200 <= status < 300:
        return Outcome("error", status, reason=f"unexpected_status_{status}")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Outcome("error", status, reason="malformed_body", detail="body is not JSON")
    key = "choices" if provider == "openai" else "content"
    if not (isinstance(doc, dict) and isinstance(doc.get(key), list)):
        return Outcome("error", status, reason="malformed_body", detail=f"no {key!r} list")
    return Outcome("ok", status)


class SseDecoder:
    """Server-sent events from bytes as they arrive; knows when a provider's stream is done.

    OpenAI ends a stream with `data: [DONE]`, Anthropic with `event: message_stop`;
    a stream that closes before that was truncated, whatever it carried.
    """

    def __init__(self, provider: str):
        self.provider = provider
        self.events = 0
        self.done = False
        self.error_type: str | None = None
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_SSE_LINE:
            raise ValueError(f"an event-stream line longer than {MAX_SSE_LINE} bytes")
        for raw in lines:
            self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))

    def _line(self, line: str) -> None:
        if line == "":
            if self._data or self._event:
                self._dispatch(self._event, "\n".join(self._data))
            self._event, self._data = "", []
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)

    def _dispatch(self, event: str, data: str) -> None:
        self.events += 1
        terminal = data == "[DONE]" if self.provider == "openai" else event == "message_stop"
        if terminal:
            self.done = True
        elif event == "error" or '"error"' in data:
            kind = _error_type(data.encode())
            if kind is not None or event == "error":
                self.error_type = self.error_type or kind or "unknown"

    def outcome(self, status: int) -> Outcome:
        """What the stream came to once the connection has closed."""
        if self.error_type is not None:
            return Outcome("error", status, reason="stream_error", detail=self.error_type)
        if not self.done:
            return Outcome(
                "error", status, reason="truncated_stream", detail=f"after {self.events} events"
            )
        return Outcome("ok", status)
