"""What both stub providers share: the parsed request, the reply, token counts.

Pure: the provider modules turn these into wire bytes and server.py moves them.
Counts are deterministic so a test can predict every usage figure exactly:
input tokens are ceil(UTF-8 bytes of the prompt's text / 4), which can never
exceed the request body's size, and output tokens are the reply's length, cut
to the max_tokens the request declared.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# A reply is these tokens, cycled; one token is one streamed delta.
VOCABULARY = (
    "This",
    " is",
    " a",
    " deterministic",
    " reply",
    " from",
    " the",
    " Docket",
    " stub",
    ".",
)


class StubRequestError(Exception):
    """A request the real provider would refuse; answered in its error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Exchange:
    """The facts of one valid model call that shape the answer."""

    model: str
    stream: bool
    input_tokens: int
    max_tokens: int | None
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    endpoint: str = "call"  # the route: "call" (chat, messages) or an openai_extra one
    inputs: tuple[str, ...] = ()  # embeddings: the texts
    encoding: str = "float"  # embeddings: "float" or "base64"
    dimensions: int = 0  # embeddings: the vectors' length


@dataclass(frozen=True)
class Reply:
    tokens: tuple[str, ...]
    truncated: bool  # cut short by max_tokens

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def output_tokens(self) -> int:
        return len(self.tokens)


def count_tokens(text_bytes: int) -> int:
    return math.ceil(text_bytes / 4)


def make_reply(reply_tokens: int, max_tokens: int | None) -> Reply:
    n = reply_tokens if max_tokens is None else min(reply_tokens, max_tokens)
    size = len(VOCABULARY)
    # Each round after the first starts with a space, so rounds read as sentences.
    tokens = tuple((" " if i and i % size == 0 else "") + VOCABULARY[i % size] for i in range(n))
    return Reply(tokens=tokens, truncated=n < reply_tokens)


def text_bytes(content: object) -> int:
    """UTF-8 bytes of the text in a message content: a string, or a list of
    blocks whose `text` (and, for tool results, nested `content`) we count."""
    if isinstance(content, str):
        return len(content.encode("utf-8"))
    if isinstance(content, list):
        total = 0
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    total += len(block["text"].encode("utf-8"))
                if "content" in block:
                    total += text_bytes(block["content"])
            elif isinstance(block, str):
                total += len(block.encode("utf-8"))
        return total
    return 0


def optional_positive_int(body: dict, *names: str) -> int | None:
    """The first of `names` present in body, which must be an integer >= 1."""
    for name in names:
        if name in body and body[name] is not None:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StubRequestError(400, f"{name}: must be an integer >= 1", param=name)
            return value
    return None


# ---------------------------------------------------------------- injected body faults

# A stream event whose data is not JSON (upstream:malformed_json on a stream).
MALFORMED_EVENT = b'data: {"id": "malformed", "choices": [\n\n'


def dumps(value: object) -> bytes:
    """Compact JSON, as the providers send it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _strip_usage(data: dict) -> dict:
    data.pop("usage", None)
    message = data.get("message")
    if isinstance(message, dict):
        message.pop("usage", None)  # Anthropic's message_start carries it here
    return data


def without_usage(body: bytes) -> bytes:
    """A whole answer with its usage removed (upstream:missing_usage)."""
    return dumps(_strip_usage(json.loads(body)))


def frame_without_usage(frame: bytes) -> bytes:
    """A stream event with its usage removed; b"" for an event that carried only
    usage (OpenAI's last chunk, `"choices": []`), which is then not sent."""
    head, sep, rest = frame.partition(b"data: ")
    payload = rest.rstrip(b"\n")
    if not sep or not payload.startswith(b"{"):
        return frame  # `data: [DONE]` and anything without a JSON object
    data = json.loads(payload)
    if data.get("choices") == [] and "usage" in data:
        return b""
    return head + sep + dumps(_strip_usage(data)) + b"\n\n"
