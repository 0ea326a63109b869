"""Upstream faults performed by the stub: each kind over a real socket on 127.0.0.1,
checked on the wire (raw bytes) and in the stub's request log; precedence and
determinism of the plan. Bounded in time."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
import trio
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.schedule import FaultSchedule
from chaos.faults.upstream import chooser, plan
from chaos.stub.server import Arrival, RequestLog, Stub, StubConfig

DEADLINE = 10
KEY = "sk-test-key-0001"
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


class Answer:
    """One raw HTTP/1.1 answer read to EOF: status, headers, body, and whether its
    framing completed (content-length met, or the terminating chunk seen)."""

    def __init__(self, raw: bytes, first_byte_after: float) -> None:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        self.first_byte_after = first_byte_after
        if "content-length" in self.headers:
            self.body = rest
            self.complete = len(rest) == int(self.headers["content-length"])
            return
        body, self.complete = b"", False
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                self.complete = True
                break
            body, rest = body + rest[:size], rest[size + 2 :]
        self.body = body

    def json(self):
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The data of each SSE event."""
        blocks = [b for b in self.body.decode().split("\n\n") if b]
        return [line[6:] for b in blocks for line in b.split("\n") if line.startswith("data: ")]


async def call(url: str, kind: str, *, stream: bool = False, **extra) -> Answer:
    """A model call over a raw socket, read until the server closes it."""
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    payload["max_tokens"] = 64
    payload.update(extra)
    body = json.dumps(payload).encode()
    auth = f"authorization: Bearer {KEY}" if kind == "openai" else f"x-api-key: {KEY}"
    head = (
        f"POST {PATHS[kind]} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    parts = urlsplit(url)
    sent_at = trio.current_time()
    stream_ = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with stream_:
        await stream_.send_all(head.encode() + body)
        raw, first = b"", None
        while chunk := await stream_.receive_some(65536):
            first = first if first is not None else trio.current_time() - sent_at
            raw += chunk
    return Answer(raw, first if first is not None else -1.0)


def faults_in_log(upstream) -> list[tuple[int, str]]:
    return [(e["ordinal"], e["fault"]) for entry in upstream.log for e in entry["faults"]]


def schedule(*texts: str, seed: int = 7) -> FaultSchedule:
    return FaultSchedule.parse(seed, texts)


async def test_status_with_retry_after_seconds(stub_server):
    plan_ = schedule("upstream:status(503, retry_after=2500ms)@call 2")
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=chooser(plan_)) as up:
            first = await call(up.url, "openai")
            second = await call(up.url, "openai")
    assert first.status == 200 and "retry-after" not in first.headers
    assert second.status == 503 and second.headers["retry-after"] == "3"  # rounded up
    assert second.json()["error"]["type"] == "server_error"
    assert faults_in_log(up) == [(2, "upstream:status(503, retry_after=2500ms)@call 2")]


async def test_status_with_retry_after_http_date(stub_server):
    text = 'upstream:status(500, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")@call 1'
    with trio.fail_after(DEADLINE):
        async with stub_server("anthropic", choose=chooser(schedule(text))) as up:
            answer = await call(up.url, "anthropic")
    assert answer.status == 500
    assert answer.headers["retry-after"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    assert answer.json()["error"]["type"] == "api_error"
    assert [e["fault"] for e in up.log[0]["faults"]] == [text]


async def test_rate_limited_in_each_provider_shape(stub_server):
    plan_ = schedule("upstream:rate_limited(retry_after=1s)")
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=chooser(plan_)) as oa:
            o = await call(oa.url, "openai")
        async with stub_server("anthropic", choose=chooser(plan_)) as an:
            a = await call(an.url, "anthropic")
    assert (o.status, o.headers["retry-after"], a.status, a.headers["retry-after"]) == (
        429,
        "1",
        429,
        "1",
    )
    assert o.json() == {
        "error": {
            "message": o.json()["error"]["message"],
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert a.json()["type"] == "error" and a.json()["error"]["type"] == "rate_limit_error"
    assert a.json()["request_id"] == a.headers["request-id"]
    assert (
        faults_in_log(oa)
        == faults_in_log(an)
        == [(1, "upstream:rate_limited(retry_after=1s)@always")]
    )


async def test_overloaded_is_529_for_anthropic_and_503_for_openai(stub_server):
    plan_ = schedule("upstream:overloaded")
    with trio.fail_after(DEADLINE):
        async with stub_server("anthropic", choose=chooser(plan_)) as an:
            a = await call(an.url, "anthropic")
        async with stub_server("openai", choose=chooser(plan_)) as oa:
            o = await call(oa.url, "openai")
    assert a.status == 529 and a.json()["error"] == {
        "type": "overloaded_error",
        "message": "Overloaded",
    }
    assert "retry-after" not in a.headers
    assert o.status == 503 and o.json()["error"]["type"] == "server_error"
    assert faults_in_log(an) == faults_in_log(oa) == [(1, "upstream:overloaded@always")]


async def test_malformed_json_whole_and_streamed(stub_server):
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=chooser(schedule("upstream:malformed_json"))) as up:
            whole = await call(up.url, "openai")
            streamed = await call(up.url, "openai", stream=True)
    assert whole.status == 200 and whole.complete
    with pytest.raises(json.JSONDecodeError):
        json.loads(whole.body)
    events = streamed.events()
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[0])
    assert events[-1] == "[DONE]" and streamed.complete
    assert [o for o, _ in faults_in_log(up)] == [1, 2]


async def test_truncate_bytes_promises_a_length_and_closes_short(stub_server):
    with trio.fail_after(DEADLINE):
        choose = chooser(schedule("upstream:truncate(after=20B)@call 1"))
        async with stub_server("anthropic", choose=choose) as up:
            cut = await call(up.url, "anthropic")
            whole = await call(up.url, "anthropic")
    assert cut.status == 200 and len(cut.body) == 20 and not cut.complete
    assert int(cut.headers["content-length"]) == len(whole.body) > 20
    assert whole.body.startswith(cut.body) and whole.complete
    assert faults_in_log(up) == [(1, "upstream:truncate(after=20B)@call 1")]


async def test_truncate_events_on_a_stream(stub_server):
    with trio.fail_after(DEADLINE):
        async with stub_server(
            "openai", choose=chooser(schedule("upstream:truncate(after=2)"))
        ) as up:
            answer = await call(up.url, "openai", stream=True)
    assert answer.status == 200 and not answer.complete
    assert len(answer.events()) == 2 and "[DONE]" not in answer.events()


async def test_cut_stream_after_n_events_and_not_on_whole_answers(stub_server):
    with trio.fail_after(DEADLINE):
        choose = chooser(schedule("upstream:cut_stream(after=3)"))
        async with stub_server("anthropic", choose=choose) as up:
            cut = await call(up.url, "anthropic", stream=True)
            whole = await call(up.url, "anthropic")
    assert cut.status == 200 and not cut.complete
    kinds = [json.loads(e)["type"] for e in cut.events()]
    assert kinds == ["message_start", "content_block_start", "ping"]
    assert whole.complete and whole.json()["type"] == "message"
    # performed on the stream only: the whole answer's log entry names no fault
    assert faults_in_log(up) == [(1, "upstream:cut_stream(after=3)@always")]
    assert up.log[1]["faults"] == []


async def test_slow_first_byte(stub_server):
    choose = chooser(schedule("upstream:slow_first_byte(400ms)@call 1"))
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=choose) as up:
            slow = await call(up.url, "openai")
            fast = await call(up.url, "openai")
    assert slow.status == fast.status == 200
    assert slow.first_byte_after >= 0.4 > fast.first_byte_after
    assert faults_in_log(up) == [(1, "upstream:slow_first_byte(400ms)@call 1")]


async def test_slow_tokens_spaces_the_streamed_tokens(stub_server):
    choose = chooser(schedule("upstream:slow_tokens(150ms)"))
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=choose, reply_tokens=4) as up:
            started = trio.current_time()
            answer = await call(up.url, "openai", stream=True)
            took = trio.current_time() - started
    tokens = [json.loads(e)["choices"][0]["delta"].get("content") for e in answer.events()[:-1]]
    assert [t for t in tokens if t] == ["This", " is", " a", " deterministic"]
    assert took >= 3 * 0.15  # three gaps between four tokens
    assert faults_in_log(up) == [(1, "upstream:slow_tokens(150ms)@always")]


async def test_latency_with_jitter(stub_server):
    text = "upstream:latency(300ms, jitter=200ms)@call 1"
    plan_ = schedule(text)
    expected = 0.3 + 0.2 * plan_.draw(0, 1, "jitter")
    with trio.fail_after(DEADLINE):
        async with stub_server("anthropic", choose=chooser(plan_)) as up:
            answer = await call(up.url, "anthropic")
    assert answer.status == 200 and answer.first_byte_after >= expected
    assert faults_in_log(up) == [(1, text)]


async def test_missing_usage_whole_and_streamed(stub_server):
    choose = chooser(schedule("upstream:missing_usage"))
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=choose) as oa:
            whole = await call(oa.url, "openai")
            streamed = await call(
                oa.url, "openai", stream=True, stream_options={"include_usage": True}
            )
        async with stub_server("anthropic", choose=choose) as an:
            a_stream = await call(an.url, "anthropic", stream=True)
    assert whole.json()["choices"][0]["message"]["content"] and "usage" not in whole.json()
    chunks = [json.loads(e) for e in streamed.events()[:-1]]
    assert chunks and all("usage" not in c and c["choices"] for c in chunks)
    messages = [json.loads(e) for e in a_stream.events()]
    assert messages[0]["type"] == "message_start" and "usage" not in messages[0]["message"]
    assert all("usage" not in m for m in messages) and messages[-1]["type"] == "message_stop"
    assert len(faults_in_log(oa)) == 2 and len(faults_in_log(an)) == 1


async def test_injections_reach_the_callback_and_the_served_log(stub_server):
    seen: list[dict] = []
    plan_ = schedule("upstream:status(502)@call 2", seed=99)
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", choose=chooser(plan_, on_inject=seen.append)) as up:
            await call(up.url, "openai")
            await call(up.url, "openai")
            parts = urlsplit(up.url)
            conn = await trio.open_tcp_stream(parts.hostname, parts.port)
            async with conn:
                await conn.send_all(
                    b"GET /_stub/log HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                )
                raw = b""
                while chunk := await conn.receive_some(65536):
                    raw += chunk
    event = {
        "fault": "upstream:status(502)@call 2",
        "seed": 99,
        "ordinal": 2,
        "counter": "call",
        "target": "upstream",
        "kind": "status",
    }
    assert seen == [event]
    served = [json.loads(x) for x in Answer(raw, 0).body.splitlines()]
    assert [e["faults"] for e in served] == [[], [event]]


async def test_same_seed_same_faulted_ordinals_across_runs(stub_server):
    texts = ("upstream:status(500)@30%", "upstream:missing_usage@call 3.. & 25%")
    runs = []
    with trio.fail_after(DEADLINE):
        for _ in range(2):
            async with stub_server("openai", choose=chooser(schedule(*texts, seed=2024))) as up:
                for _ in range(12):
                    await call(up.url, "openai")
            runs.append(faults_in_log(up))
    assert runs[0] == runs[1]
    resolved = schedule(*texts, seed=2024).resolve(12)
    # missing_usage is not performed on a call answered with the error status
    errored = {o for o, t in resolved if t == texts[0]}
    assert runs[0] == [(o, t) for o, t in resolved if t == texts[0] or o not in errored]
    assert runs[0]  # 12 calls at 30% fired at least once for this seed


# ---------------------------------------------------------------- the pure plan


def arrival(ordinal: int = 0, *, stream: bool = True, model: str | None = "m") -> Arrival:
    return Arrival(ordinal, "openai", "POST", "/v1/chat/completions", model, stream, 10)


def test_error_beats_body_faults_and_delays_combine():
    plan_ = schedule(
        "upstream:latency(100ms)",
        "upstream:missing_usage",
        "upstream:rate_limited",
        "upstream:status(500)",
        "upstream:slow_first_byte(50ms)",
        "upstream:truncate(after=1)",
    )
    b = plan(plan_, arrival())
    assert (b.error, b.status, b.first_byte_delay) == ("rate_limited", None, pytest.approx(0.15))
    assert not b.omit_usage and b.truncate_bytes is None and b.cut_after_events is None
    kinds = [e["kind"] for e in b.injected]
    assert kinds == ["latency", "rate_limited", "slow_first_byte"]


def test_first_body_fault_wins_and_missing_usage_combines():
    plan_ = schedule(
        "upstream:cut_stream(after=4)", "upstream:malformed_json", "upstream:missing_usage"
    )
    b = plan(plan_, arrival())
    assert (b.cut_after_events, b.malformed_json, b.omit_usage) == (4, False, True)
    whole = plan(plan_, arrival(stream=False))  # cut_stream does not apply: malformed wins
    assert (whole.cut_after_events, whole.malformed_json) == (None, True)
    assert [e["kind"] for e in whole.injected] == ["malformed_json", "missing_usage"]


def test_no_fault_on_a_request_that_is_not_a_model_call():
    assert plan(schedule("upstream:status(500)"), arrival(model=None)).injected == ()


def test_timed_fault_needs_elapsed():
    with pytest.raises(ValueError, match="time-triggered"):
        chooser(schedule("upstream:overloaded@t 1s.."))
    timed = chooser(schedule("upstream:overloaded@t 1s.."), elapsed=lambda: 2.0)
    assert timed(arrival()).error == "overloaded"


KINDS = (
    "upstream:status(503)",
    "upstream:rate_limited",
    "upstream:overloaded",
    "upstream:malformed_json",
    "upstream:truncate(after=2)",
    "upstream:cut_stream(after=1)",
    "upstream:slow_first_byte(10ms)",
    "upstream:slow_tokens(10ms)",
    "upstream:latency(10ms, jitter=5ms)",
    "upstream:missing_usage",
)


@settings(max_examples=io_examples(), deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    chosen=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6, unique=True),
    percent=st.integers(1, 100),
    ordinal=st.integers(0, 500),
    stream=st.booleans(),
)
def test_plan_is_a_pure_function_and_keeps_its_precedence(seed, chosen, percent, ordinal, stream):
    plan_ = schedule(*(f"{k}@{percent}%" for k in chosen), seed=seed)
    first = plan(plan_, arrival(ordinal, stream=stream))
    assert first == plan(plan_, arrival(ordinal, stream=stream))
    firing = {f.text for f in plan_.faults if plan_.decide(f, ordinal + 1)}
    kinds = [e["kind"] for e in first.injected]
    assert {e["fault"] for e in first.injected} <= firing
    assert all(e["ordinal"] == ordinal + 1 for e in first.injected)
    assert sum(k in ("status", "rate_limited", "overloaded") for k in kinds) <= 1
    assert sum(k in ("malformed_json", "truncate", "cut_stream") for k in kinds) <= 1
    if first.error is not None:
        assert not ({"malformed_json", "truncate", "cut_stream", "missing_usage"} & set(kinds))
    assert stream or not ({"cut_stream", "slow_tokens"} & set(kinds))


async def test_the_log_file_on_disk_names_the_injection(tmp_path):
    path = tmp_path / "stub.jsonl"
    log = RequestLog(path=path)
    stub = Stub(
        StubConfig(kind="openai"), choose=chooser(schedule("upstream:overloaded@call 2")), log=log
    )
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(stub.serve)
            assert (await call(listening.url, "openai")).status == 200
            assert (await call(listening.url, "openai")).status == 503
            nursery.cancel_scope.cancel()
    log.close()
    lines = [json.loads(x) for x in path.read_bytes().splitlines()]
    assert [[e["fault"] for e in x["faults"]] for x in lines] == [
        [],
        ["upstream:overloaded@call 2"],
    ]
