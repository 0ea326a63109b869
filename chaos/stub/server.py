"""A stub model provider (OpenAI- or Anthropic-shaped) on docket.http.server.

    stub = Stub(StubConfig(kind="openai", latency=0.05))
    listening = await nursery.start(stub.serve)      # listening.url

Each request that reaches the provider API is logged (in memory, bounded, and
optionally to a JSONL file) before it is answered, with its credential reduced
to a fingerprint, so a harness can tell what the dependency really saw and with
which key. The file's line is written and flushed to the OS before the first
byte of the answer, so a caller that has an answer finds its request on file,
even if this process is killed the next instant; a request whose head arrived
but whose body did not is logged too, with `incomplete` saying why. The log is also served: GET /_stub/log[?since=SEQ] (JSON lines) and
POST /_stub/reset.

What the stub does to a request is a Behaviour, chosen per request by a
pluggable function of the Arrival (its ordinal, model, stream flag...): delays,
an injected error status (with Retry-After), a malformed or truncated body, a
stream cut after N events, an answer without usage. chaos.faults.upstream builds
the chooser from a fault schedule; each Behaviour names the faults it performs
(`injected`), and the log entry of the request carries them. A harness that
keeps the evidence of faults elsewhere (the chaos engine: in the run's ledger)
passes `record_fault`, awaited for each of them before the answer starts, so
the record of a fault always precedes its effect.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType

import trio

from chaos.stub import anthropic, openai
from chaos.stub.common import (
    MALFORMED_EVENT,
    Exchange,
    StubRequestError,
    frame_without_usage,
    make_reply,
    without_usage,
)
from docket.clock import Clock, rfc3339
from docket.http.server import Listening, serve
from docket.http.server_errors import BodyTooLarge, ClientGone, RequestError
from docket.http.server_exchange import Request, Responder

PROVIDERS: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic}
MiB = 1024 * 1024


@dataclass(frozen=True)
class Behaviour:
    """What the stub does to one request (delays in seconds).

    At most one of `error` and the body faults (`malformed_json`,
    `truncate_bytes`, `cut_after_events`) is meant to be set; `_answer` checks
    them in that order. `injected` is the `fault.injected` fields of every fault
    this behaviour performs, recorded in the request log.
    """

    first_byte_delay: float = 0.0  # before the status line of any answer
    token_delay: float = 0.0  # between two streamed tokens
    error: str | None = None  # "status", "rate_limited" or "overloaded"
    status: int | None = None  # the code, for error="status"
    retry_after: str | None = None  # the Retry-After header value, when sent
    malformed_json: bool = False  # 200 whose body (or first stream event) is not JSON
    truncate_bytes: int | None = None  # close the connection after this many body bytes
    cut_after_events: int | None = None  # close a stream after this many events
    omit_usage: bool = False  # an answer (whole or streamed) without usage
    injected: tuple[dict, ...] = ()


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


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class RequestLog:
    """Every request received, in arrival order: a bounded deque, and a JSONL file
    (one line per request, written when it arrives) if a path is given."""

    def __init__(self, capacity: int = 10_000, path: str | os.PathLike | None = None) -> None:
        self._entries: deque[dict] = deque(maxlen=capacity)
        self._file = (
            # Owner only, like the run's ledger: the log holds the requests' bodies.
            open(path, "a", encoding="utf-8", opener=_owner_only)  # noqa: SIM115 - lives as long as the log
            if path is not None
            else None
        )

    def record(self, entry: dict) -> None:
        self.keep(entry)
        self.write(entry)

    def keep(self, entry: dict) -> None:
        """In memory only: readable at once (a chooser may look at it)."""
        self._entries.append(entry)

    def write(self, entry: dict) -> None:
        """To the file only, once the entry is final."""
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
        record_fault: Callable[[dict], Awaitable[object]] | None = None,
    ) -> None:
        self.config = config or StubConfig()
        self.provider = PROVIDERS[self.config.kind]
        self.choose = choose or steady(
            Behaviour(first_byte_delay=self.config.latency, token_delay=self.config.token_delay)
        )
        self.log = log or RequestLog(self.config.log_capacity)
        self.record_fault = record_fault
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
            self.log.record(self._entry(seq, request, None, None) | {"incomplete": str(exc)})
            await self._error(respond, seq, StubRequestError(413, str(exc)))
            return
        except (RequestError, ClientGone) as exc:
            # The head arrived, the body did not (the caller went away or stalled):
            # the dependency did see this request, so the log says so.
            self.log.record(self._entry(seq, request, None, None) | {"incomplete": str(exc)})
            raise
        exchange: Exchange | None = None
        problem: StubRequestError | None = None
        endpoint = None
        try:
            endpoint = self.provider.route(request.method, request.path)
            if self.config.require_key and self.provider.api_key(request.headers) is None:
                raise self.provider.missing_key_error()
            if endpoint.startswith("call"):
                exchange = self.provider.parse(body, endpoint)
        except StubRequestError as exc:
            problem = exc
        # kept before the behaviour is chosen (a chooser may read it), written to the
        # file with the faults the answer carries, all before it is answered
        entry = self._entry(seq, request, body, exchange)
        self.log.keep(entry)
        try:
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
            entry["faults"] = list(behaviour.injected)
        finally:
            self.log.write(entry)  # a chooser that fails still leaves the request on file
        if self.record_fault is not None:
            for fields in behaviour.injected:
                await self.record_fault(fields)
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
        if behaviour.error is not None:
            await self._injected_error(respond, seq, behaviour)
            return
        created = int(self.clock.wall())
        provider = self.provider
        if endpoint is not None and endpoint.startswith("models"):  # "models/<id>": one
            headers = provider.response_headers(seq, streaming=False)
            name = endpoint.partition("/")[2] or None
            await respond.simple(200, headers, provider.models(created, name))
            return
        assert exchange is not None
        reply = make_reply(self.config.reply_tokens, exchange.max_tokens)
        if not exchange.stream:
            body = provider.whole(exchange, reply, seq, created)
            if behaviour.omit_usage:
                body = without_usage(body)
            await self._send_whole(respond, seq, behaviour, body)
            return
        frames = list(provider.frames(exchange, reply, seq, created))
        if behaviour.omit_usage:
            frames = [(f, t) for f, t in ((frame_without_usage(f), t) for f, t in frames) if f]
        if behaviour.malformed_json:
            frames[0] = (MALFORMED_EVENT, frames[0][1])
        headers = provider.response_headers(seq, streaming=True)
        headers.append((b"cache-control", b"no-cache"))
        await respond.start(200, headers)
        tokens_sent = sent_bytes = 0
        for events_sent, (frame, is_token) in enumerate(frames):
            if behaviour.cut_after_events is not None and events_sent >= behaviour.cut_after_events:
                await respond.abort()
                return
            if is_token:
                if tokens_sent and behaviour.token_delay > 0:
                    await trio.sleep(behaviour.token_delay)
                tokens_sent += 1
            limit = behaviour.truncate_bytes
            if limit is not None and sent_bytes + len(frame) >= limit:
                await respond.send(frame[: limit - sent_bytes])
                await respond.abort()
                return
            await respond.send(frame)
            sent_bytes += len(frame)
        await respond.end()

    async def _send_whole(
        self, respond: Responder, seq: int, behaviour: Behaviour, body: bytes
    ) -> None:
        headers = self.provider.response_headers(seq, streaming=False)
        if behaviour.malformed_json:
            # cut mid-object: a complete HTTP answer whose JSON does not parse
            await respond.simple(200, headers, body[: len(body) // 2])
            return
        limit = behaviour.truncate_bytes
        if limit is not None and limit < len(body):
            # the whole length is promised, then the connection closes short of it
            headers.append((b"content-length", str(len(body)).encode()))
            await respond.start(200, headers, body=body[:limit])
            await respond.abort()
            return
        await respond.simple(200, headers, body)

    async def _injected_error(self, respond: Responder, seq: int, behaviour: Behaviour) -> None:
        provider = self.provider
        status, body = provider.injected_error(behaviour.error, behaviour.status, seq=seq)
        headers = provider.response_headers(seq, streaming=False)
        if behaviour.retry_after is not None:
            headers.append((b"retry-after", behaviour.retry_after.encode("latin-1")))
        await respond.simple(status, headers, body)

    async def _error(self, respond: Responder, seq: int, problem: StubRequestError) -> None:
        body = self.provider.error(problem.status, problem.message, param=problem.param, seq=seq)
        headers = self.provider.response_headers(seq, streaming=False)
        await respond.simple(problem.status, headers, body)

    def _entry(
        self, seq: int, request: Request, body: bytes | None, exchange: Exchange | None
    ) -> dict:
        key = self.provider.api_key(request.headers)
        return {
            "seq": seq,
            "ts": rfc3339(self.clock.wall()),
            "mono_ms": round((self.clock.mono() - self._started_mono) * 1000, 3),
            "kind": self.config.kind,
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": [[name.decode("latin-1"), _redact(name, v)] for name, v in request.headers],
            "key": fingerprint(key) if key is not None else None,
            "body_bytes": len(body) if body is not None else None,
            "body_sha256": hashlib.sha256(body).hexdigest() if body is not None else None,
            "model": exchange.model if exchange else None,
            "stream": exchange.stream if exchange else None,
            "faults": [],
        }

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
