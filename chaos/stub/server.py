"""A stub model provider (OpenAI- or Anthropic-shaped) on docket.http.server.

    stub = Stub(StubConfig(kind="openai", latency=0.05))
    listening = await nursery.start(stub.serve)      # listening.url

Each request that reaches the provider API is logged (in memory, bounded, and
optionally to a JSONL file) before it is answered, with its credential reduced
to a fingerprint, so a harness can tell what the dependency really saw and with
which key. The log is also served: GET /_stub/log[?since=SEQ] (JSON lines) and
POST /_stub/reset.

What the stub does to a request is a Behaviour, chosen per request by a
pluggable function of the Arrival (its ordinal, model, stream flag...). Only
latency exists now; upstream faults (statuses with Retry-After, malformed or
truncated bodies, streams cut after N events, missing usage) are meant to be
added as Behaviour fields acted on in `_answer`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import trio

from chaos.stub import anthropic, openai
from chaos.stub.common import Exchange, StubRequestError, make_reply
from docket.clock import Clock, rfc3339
from docket.http.server import BodyTooLarge, Listening, Request, Responder, serve

PROVIDERS: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic}
MiB = 1024 * 1024


@dataclass(frozen=True)
class Behaviour:
    """What the stub does to one request (seconds). Faults join here later."""

    first_byte_delay: float = 0.0  # before the status line of any answer
    token_delay: float = 0.0  # between two streamed tokens


@dataclass(frozen=True)
class Arrival:
    """The facts a Behaviour is chosen from. `ordinal` counts logged requests from 0."""

    ordinal: int
    kind: str
    method: str
    path: str
    model: str | None
    stream: bool
    body_bytes: int


Chooser = Callable[[Arrival], Behaviour]


def steady(behaviour: Behaviour) -> Chooser:
    """The same behaviour for every request."""
    return lambda arrival: behaviour


@dataclass(frozen=True)
class StubConfig:
    kind: str = "openai"
    latency: float = 0.0  # the default behaviour's first_byte_delay
    token_delay: float = 0.0  # the default behaviour's token_delay
    reply_tokens: int = 16  # output tokens when max_tokens does not cut the reply
    require_key: bool = True  # answer 401, as the provider does, when no key is sent
    log_capacity: int = 10_000  # entries kept in memory (the oldest go first)
    max_body_bytes: int = 32 * MiB

    def __post_init__(self) -> None:
        if self.kind not in PROVIDERS:
            raise ValueError(f"unknown stub kind {self.kind!r} (have {', '.join(PROVIDERS)})")


SECRET_HEADERS = frozenset(
    {b"authorization", b"proxy-authorization", b"x-api-key", b"api-key", b"cookie"}
)


def fingerprint(secret: bytes | str) -> str:
    """What the log keeps of a credential: enough to tell keys apart, not to use one."""
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:12]


def _redact(name: bytes, value: bytes) -> str:
    if name not in SECRET_HEADERS:
        return value.decode("latin-1")
    scheme, _, credential = value.partition(b" ")
    if credential and scheme.lower() in (b"bearer", b"basic"):
        return f"{scheme.decode('latin-1')} {fingerprint(credential.strip())}"
    return fingerprint(value)


class RequestLog:
    """Every request received, in arrival order: a bounded deque, and a JSONL file
    (one line per request, written when it arrives) if a path is given."""

    def __init__(self, capacity: int = 10_000, path: str | os.PathLike | None = None) -> None:
        self._entries: deque[dict] = deque(maxlen=capacity)
        self._file = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115 - lives as long as the log

    def record(self, entry: dict) -> None:
        self._entries.append(entry)
        if self._file is not None:
            self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self._file.flush()

    def entries(self, since: int = 0) -> list[dict]:
        return [e for e in self._entries if e["seq"] >= since]

    def reset(self) -> int:
        """Forget the entries in memory (the file keeps them); returns how many."""
        count = len(self._entries)
        self._entries.clear()
        return count

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Stub:
    """One stub provider: its shapes, its request log, its behaviour chooser."""

    def __init__(
        self,
        config: StubConfig | None = None,
        *,
        choose: Chooser | None = None,
        log: RequestLog | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config or StubConfig()
        self.provider = PROVIDERS[self.config.kind]
        self.choose = choose or steady(
            Behaviour(first_byte_delay=self.config.latency, token_delay=self.config.token_delay)
        )
        self.log = log or RequestLog(self.config.log_capacity)
        self.clock = clock or Clock()
        self._started_mono = self.clock.mono()
        self._next_seq = 0

    async def serve(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; `await nursery.start(stub.serve)` gives the Listening."""
        await serve(self.handle, host=host, port=port, task_status=task_status)

    async def handle(self, request: Request, respond: Responder) -> None:
        if request.path.startswith("/_stub/"):
            await self._control(request, respond)
            return
        seq = self._next_seq
        self._next_seq += 1
        try:
            body = await request.read_body(self.config.max_body_bytes)
        except BodyTooLarge as exc:
            self._record(seq, request, None, None)
            await self._error(respond, seq, StubRequestError(413, str(exc)))
            return
        exchange: Exchange | None = None
        problem: StubRequestError | None = None
        endpoint = None
        try:
            endpoint = self.provider.route(request.method, request.path)
            if self.config.require_key and self.provider.api_key(request.headers) is None:
                raise self.provider.missing_key_error()
            if endpoint == "call":
                exchange = self.provider.parse(body)
        except StubRequestError as exc:
            problem = exc
        self._record(seq, request, body, exchange)
        behaviour = self.choose(
            Arrival(
                ordinal=seq,
                kind=self.config.kind,
                method=request.method,
                path=request.path,
                model=exchange.model if exchange else None,
                stream=exchange.stream if exchange else False,
                body_bytes=len(body),
            )
        )
        await self._answer(respond, seq, behaviour, endpoint, exchange, problem)

    async def _answer(
        self,
        respond: Responder,
        seq: int,
        behaviour: Behaviour,
        endpoint: str | None,
        exchange: Exchange | None,
        problem: StubRequestError | None,
    ) -> None:
        if behaviour.first_byte_delay > 0:
            await trio.sleep(behaviour.first_byte_delay)
        if problem is not None:
            await self._error(respond, seq, problem)
            return
        created = int(self.clock.wall())
        provider = self.provider
        if endpoint == "models":
            headers = provider.response_headers(seq, streaming=False)
            await respond.simple(200, headers, provider.models(created))
            return
        assert exchange is not None
        reply = make_reply(self.config.reply_tokens, exchange.max_tokens)
        if not exchange.stream:
            headers = provider.response_headers(seq, streaming=False)
            await respond.simple(200, headers, provider.whole(exchange, reply, seq, created))
            return
        headers = provider.response_headers(seq, streaming=True)
        headers.append((b"cache-control", b"no-cache"))
        await respond.start(200, headers)
        tokens_sent = 0
        for frame, is_token in provider.frames(exchange, reply, seq, created):
            if is_token:
                if tokens_sent and behaviour.token_delay > 0:
                    await trio.sleep(behaviour.token_delay)
                tokens_sent += 1
            await respond.send(frame)
        await respond.end()

    async def _error(self, respond: Responder, seq: int, problem: StubRequestError) -> None:
        body = self.provider.error(problem.status, problem.message, param=problem.param, seq=seq)
        headers = self.provider.response_headers(seq, streaming=False)
        await respond.simple(problem.status, headers, body)

    def _record(
        self, seq: int, request: Request, body: bytes | None, exchange: Exchange | None
    ) -> None:
        key = self.provider.api_key(request.headers)
        self.log.record(
            {
                "seq": seq,
                "ts": rfc3339(self.clock.wall()),
                "mono_ms": round((self.clock.mono() - self._started_mono) * 1000, 3),
                "kind": self.config.kind,
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "headers": [
                    [name.decode("latin-1"), _redact(name, v)] for name, v in request.headers
                ],
                "key": fingerprint(key) if key is not None else None,
                "body_bytes": len(body) if body is not None else None,
                "body_sha256": hashlib.sha256(body).hexdigest() if body is not None else None,
                "model": exchange.model if exchange else None,
                "stream": exchange.stream if exchange else None,
            }
        )

    async def _control(self, request: Request, respond: Responder) -> None:
        """The harness's door: read or clear the request log."""
        json_headers = [(b"content-type", b"application/json")]
        if request.path == "/_stub/log" and request.method == "GET":
            since = 0
            for pair in request.query.split("&"):
                name, _, value = pair.partition("=")
                if name == "since":
                    if not value.isdigit():
                        await respond.simple(400, json_headers, b'{"error":"since: not a number"}')
                        return
                    since = int(value)
            lines = [json.dumps(e, separators=(",", ":")) + "\n" for e in self.log.entries(since)]
            body = "".join(lines).encode("utf-8")
            await respond.simple(200, [(b"content-type", b"application/x-ndjson")], body)
            return
        if request.path == "/_stub/reset" and request.method == "POST":
            cleared = self.log.reset()
            await respond.simple(200, json_headers, json.dumps({"cleared": cleared}).encode())
            return
        message = f"no stub control endpoint {request.method} {request.path}"
        await respond.simple(404, json_headers, json.dumps({"error": message}).encode())
