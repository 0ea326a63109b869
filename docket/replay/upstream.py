"""The replay upstream: a local server that answers each request from the recording.

Served by docket.http.server on 127.0.0.1 (an ephemeral port); the replay's
boundary forwards `/<provider>/<path>` here (its base URLs are pointed at
`http://127.0.0.1:PORT/<provider>`). Each request is matched (match.Matcher) and
answered with the recorded answer: its status, a content-type (the recorder keeps
JSON and event-stream bodies only, so the type is known from the body's kind), the
recorded Retry-After, and the body; a stream event by event, as fast as possible or
(`pace="recorded"`) at the recorded pace. The recorder keeps a call's time to its
first byte and its whole duration, not each event's time, so the recorded pace is
the first byte at ttfb_ms and the events spread evenly over the rest of duration_ms.
A recorded call that got no answer (a transport failure) is served as a dropped
connection; a recorded cut stream is served cut.

Each answer carries the replay's mark (docket.boundary.replayed), read by the
boundary, which never relays it.

A request that is not a model call (a models list, GET) was recorded without its
answer's body, so it is answered with the same error as a miss, counted apart, and
never ends the run.

On a miss: `fail` answers a provider-shaped error and asks the run to stop (the
command exits 1 with the diff); `error` answers that error and goes on; `forward`
sends the request to the provider's real base URL, and its answer, marked
`forwarded`, is recorded by the boundary as any forwarded call is (with its cost) and
`replay_forwarded: true`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import trio

from docket.boundary import providers
from docket.boundary.forward import relay_headers
from docket.boundary.replayed import miss_header, replay_header
from docket.http.client import UpstreamError, UpstreamPool
from docket.http.server import Listening, serve
from docket.http.server_exchange import Request, Responder
from docket.replay.faults import AnswerFaults, Damage, cut_events
from docket.replay.match import Answer, Hit, Matcher, Miss, RecordedCall

MAX_REQUEST_BYTES = 64 << 20
_MISS_MESSAGE_CHARS = 2000


@dataclass
class ReplayUpstream:
    matcher: Matcher
    run_id: str  # the recorded run's
    key: str  # the mark's secret (docket.boundary.replayed)
    kinds: Mapping[str, str]  # provider name -> wire format ("openai", "anthropic")
    on_miss: str = "fail"
    pace: str = "fast"
    # on_miss="forward": each provider's real base URL
    real_base_urls: Mapping[str, str] = field(default_factory=dict)
    stop: Callable[[str], None] | None = None  # asks the supervised run to end (fail)
    # docket chaos --replay: the seeded faults' decision per request (faults.py)
    faults: AnswerFaults | None = None
    requests: int = 0  # every request that arrived: the faults' `call` ordinal is this, from 1
    faulted: int = 0  # answers a fault replaced or broke (their recorded calls left unused)
    misses: list[Miss] = field(default_factory=list)
    forwarded: int = 0
    forward_errors: list[str] = field(default_factory=list)
    not_model_calls: list[str] = field(default_factory=list)  # e.g. GET /openai/v1/models
    url: str | None = None
    _pools: dict[str, UpstreamPool] = field(default_factory=dict)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                listening: Listening = await nursery.start(serve, self.handle)
                self.url = listening.url
                task_status.started(listening.url)
        finally:
            with trio.CancelScope(shield=True):
                for pool in self._pools.values():
                    await pool.aclose()

    async def handle(self, request: Request, respond: Responder) -> None:
        name, _, rest = request.path.lstrip("/").partition("/")
        self.requests += 1
        call_ordinal = self.requests  # counted as the stub counts: every request, from 1
        body = await request.read_body(MAX_REQUEST_BYTES)
        if request.method != "POST":
            # Not a model call (a models list: provider.call events keep no body), so
            # nothing to serve it from; neither a match nor a divergence, but counted.
            self.not_model_calls.append(f"{request.method} /{name}/{rest}")
            await self._error(
                name, "docket replay serves model calls only; this was not recorded", respond
            )
            return
        found = self.matcher.match(name, rest, body)
        if isinstance(found, Hit):
            damage = await self._damage(call_ordinal, name, found.call)
            if not damage.faithful:
                # Not the recorded answer: the same request asked again (a retry) gets it.
                self.matcher.release(found.call)
                self.faulted += 1
            await self._answer(found.call, respond, damage)
            return
        self.misses.append(found)
        if self.on_miss == "forward" and name in self.real_base_urls:
            await self._forward(name, request, body, respond)
            return
        if self.on_miss == "fail" and self.stop is not None and len(self.misses) == 1:
            self.stop(f"replay diverged: request {self.matcher.matched + self.matcher.missed}")
        await self._miss_answer(name, found, respond)

    async def _damage(self, call_ordinal: int, name: str, call: RecordedCall) -> Damage:
        """The faults' decision for this answer: only a recorded success is broken, as
        the stub breaks only an answer it would give (an error or a dropped connection
        recorded is served as recorded)."""
        status = call.answer.status
        if self.faults is None or status is None or not 200 <= status < 300:
            return Damage()
        return await self.faults(call_ordinal, name, self.kinds.get(name, "openai"), call)

    async def _answer(
        self, call: RecordedCall, respond: Responder, damage: Damage | None = None
    ) -> None:
        answer = call.answer
        damage = damage or Damage()
        if answer.status is None:
            await respond.abort()  # recorded: no answer came
            return
        mark = (
            replay_header(self.key, self.run_id, call.seq, call.line_sha256)
            if damage.faithful
            else miss_header(self.key, "fault")
        )
        if damage.error is not None:
            await self._wait(answer.ttfb_ms, damage.first_byte_delay)
            status, error_body = damage.error
            headers = [(b"content-type", b"application/json"), mark]
            if damage.retry_after is not None:
                headers.append((b"retry-after", damage.retry_after.encode("latin-1", "replace")))
            await respond.simple(status, headers, error_body)
            return
        headers = [
            (b"content-type", b"text/event-stream" if answer.stream else b"application/json"),
            mark,
        ]
        if answer.retry_after is not None:
            headers.append((b"retry-after", answer.retry_after.encode("latin-1", "replace")))
        text = answer.body if damage.body is None else damage.body
        if not answer.stream:
            await self._wait(answer.ttfb_ms, damage.first_byte_delay)
            await self._send_whole(answer.status, headers, text.encode("utf-8"), damage, respond)
            return
        served = answer if damage.body is None else dataclasses.replace(answer, body=text)
        events = [e.encode("utf-8") for e in served.events()]
        gap = damage.token_delay or self._gap(answer, len(events))
        await self._wait(answer.ttfb_ms, damage.first_byte_delay)
        pieces, injected_cut = cut_events(events, damage)
        await respond.start(answer.status, headers, body=pieces[0] if pieces else b"")
        for piece in pieces[1:]:
            if gap:
                await trio.sleep(gap)
            await respond.send(piece)
        if injected_cut:
            await respond.abort()
            return
        if answer.complete:
            await respond.end()
        else:
            await respond.abort()  # recorded cut: served cut

    async def _send_whole(
        self, status: int, headers: list, body: bytes, damage: Damage, respond: Responder
    ) -> None:
        limit = damage.truncate_bytes
        if limit is not None and limit < len(body):
            # the whole length promised, the connection closed short of it (as the stub does)
            headers.append((b"content-length", str(len(body)).encode()))
            await respond.start(status, headers, body=body[:limit])
            await respond.abort()
            return
        await respond.simple(status, headers, body)

    async def _wait(self, ms: int | None, injected: float = 0.0) -> None:
        wait = injected + (ms / 1000 if self.pace == "recorded" and ms else 0.0)
        if wait > 0:
            await trio.sleep(wait)

    def _gap(self, answer: Answer, events: int) -> float:
        if self.pace != "recorded" or events < 2 or answer.duration_ms is None:
            return 0.0
        rest = answer.duration_ms - (answer.ttfb_ms or 0)
        return max(rest, 0) / 1000 / (events - 1)

    async def _miss_answer(self, name: str, miss: Miss, respond: Responder) -> None:
        message = f"docket replay: no recorded answer for this request: {miss.describe()}"
        await self._error(name, message, respond)

    async def _error(self, name: str, message: str, respond: Responder) -> None:
        provider = providers.by_kind(self.kinds.get(name, "openai"))
        answer = providers.refusal(provider, "docket_replay_miss", message[:_MISS_MESSAGE_CHARS])
        headers = [(k, v) for k, v in answer.headers if k != b"content-length"]
        await respond.simple(answer.status, [*headers, miss_header(self.key)], answer.body)

    async def _forward(self, name: str, request: Request, body: bytes, respond: Responder) -> None:
        """The request to the provider's real base URL, its answer relayed unmarked."""
        base = urlsplit(self.real_base_urls[name])
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = UpstreamPool(f"{base.scheme}://{base.netloc}")
        rest = request.path.lstrip("/").partition("/")[2]
        target = f"{base.path.rstrip('/')}/{rest}" + (f"?{request.query}" if request.query else "")
        headers = [(k, v) for k, v in request.headers if k not in (b"host", b"content-length")]
        self.forwarded += 1
        try:
            async with pool.request("POST", target, headers, body) as resp:
                head = [*relay_headers(resp.headers), miss_header(self.key, "forwarded")]
                await respond.start(resp.status, head)
                async for chunk in resp.body():
                    await respond.send(chunk)
                await respond.end()
        except UpstreamError as exc:
            # Said in the command's summary; the boundary records the cut as a transport error.
            self.forward_errors.append(f"{name}: {exc}")
            await respond.abort()


def miss_report(miss: Miss) -> str:
    """The first divergence, for the command's output: the request against the nearest."""
    shown = {
        "provider": miss.provider,
        "path": miss.path,
        "reason": miss.reason,
        "nearest": None
        if miss.nearest is None
        else {
            "index": miss.nearest.index,
            "request_seq": miss.nearest.request_seq,
            "provider": miss.nearest.provider,
            "path": miss.nearest.path,
        },
        "diff": miss.diff,
    }
    return json.dumps(shown, ensure_ascii=False, indent=2)
