"""The stub providers: wire shapes, deterministic usage, the request log, latency,
the official SDKs against them, and the `docket stub` command. Bounded in time."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import trio
from helpers import LazyModule
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.stub import anthropic as anthropic_shape
from chaos.stub import openai as openai_shape
from chaos.stub.common import StubRequestError, make_reply
from chaos.stub.server import Arrival, Behaviour, RequestLog, Stub, StubConfig, fingerprint
from docket.http.client import UpstreamPool

anthropic_sdk = LazyModule("anthropic")
openai_sdk = LazyModule("openai")

DEADLINE = 15
KEY = "sk-test-key-0001"


def openai_headers(key: str = KEY):
    return [("authorization", f"Bearer {key}"), ("content-type", "application/json")]


def anthropic_headers(key: str = KEY):
    return [
        ("x-api-key", key),
        ("anthropic-version", "2023-06-01"),
        ("content-type", "application/json"),
    ]


def sse_frames(raw: bytes) -> list[dict]:
    """Each frame as {"event": name or None, "data": text}."""
    frames = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        frame = {"event": None, "data": None}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            frame[name] = value
        frames.append(frame)
    return frames


async def call(pool, path, headers, payload):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    async with pool.request("POST", path, headers, body) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def start_stub(nursery, **config):
    stub = Stub(StubConfig(**config))
    listening = await nursery.start(stub.serve)
    return stub, listening, UpstreamPool(listening.url)


MESSAGES = [
    {"role": "system", "content": "Be brief."},  # 9 bytes
    {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},  # 12 bytes
]


async def test_openai_completion_shape_and_usage():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, _, pool = await start_stub(nursery, kind="openai", reply_tokens=7)
            payload = {"model": "gpt-4o-mini", "messages": MESSAGES}
            status, headers, raw = await call(
                pool, "/v1/chat/completions", openai_headers(), payload
            )
            assert status == 200
            assert headers[b"content-type"] == b"application/json"
            body = json.loads(raw)
            assert body["object"] == "chat.completion"
            assert body["id"].startswith("chatcmpl-")
            assert body["model"] == "gpt-4o-mini"
            (choice,) = body["choices"]
            assert choice["index"] == 0 and choice["finish_reason"] == "stop"
            assert choice["message"]["role"] == "assistant"
            assert choice["message"]["content"] == make_reply(7, None).text
            assert body["usage"]["prompt_tokens"] == math.ceil(21 / 4)
            assert body["usage"]["completion_tokens"] == 7
            assert body["usage"]["total_tokens"] == 6 + 7
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            # max_tokens cuts the reply, and says so
            payload["max_tokens"] = 3
            _, _, raw = await call(pool, "/v1/chat/completions", openai_headers(), payload)
            cut = json.loads(raw)
            assert cut["usage"]["completion_tokens"] == 3
            assert cut["choices"][0]["finish_reason"] == "length"
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("include_usage", [True, False])
async def test_openai_stream_shape(include_usage):
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, _, pool = await start_stub(nursery, kind="openai", reply_tokens=5)
            payload = {"model": "gpt-4o", "messages": MESSAGES, "stream": True}
            if include_usage:
                payload["stream_options"] = {"include_usage": True}
            status, headers, raw = await call(
                pool, "/v1/chat/completions", openai_headers(), payload
            )
            assert status == 200
            assert headers[b"content-type"].startswith(b"text/event-stream")
            frames = sse_frames(raw)
            assert frames[-1]["data"] == "[DONE]"
            chunks = [json.loads(f["data"]) for f in frames[:-1]]
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert len({c["id"] for c in chunks}) == 1
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            text = "".join(
                c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
            )
            assert text == make_reply(5, None).text
            finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            assert [c["choices"][0]["finish_reason"] for c in finishing] == ["stop"]
            if include_usage:
                *rest, last = chunks
                assert last["choices"] == []
                assert last["usage"] == {
                    "prompt_tokens": 6,
                    "completion_tokens": 5,
                    "total_tokens": 11,
                    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                    "completion_tokens_details": {
                        "reasoning_tokens": 0,
                        "audio_tokens": 0,
                        "accepted_prediction_tokens": 0,
                        "rejected_prediction_tokens": 0,
                    },
                }
                assert all(c["usage"] is None for c in rest)
            else:
                assert all("usage" not in c for c in chunks)
            nursery.cancel_scope.cancel()


async def test_anthropic_message_shape_and_usage():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, _, pool = await start_stub(nursery, kind="anthropic", reply_tokens=6)
            payload = {
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "What is 2+2?"}],
            }
            status, headers, raw = await call(pool, "/v1/messages", anthropic_headers(), payload)
            assert status == 200
            assert headers[b"request-id"].startswith(b"req_")
            body = json.loads(raw)
            assert body["type"] == "message" and body["role"] == "assistant"
            assert body["id"].startswith("msg_")
            assert body["content"] == [{"type": "text", "text": make_reply(6, None).text}]
            assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
            assert body["usage"]["input_tokens"] == math.ceil(21 / 4)
            assert body["usage"]["output_tokens"] == 6
            payload["max_tokens"] = 2
            _, _, raw = await call(pool, "/v1/messages", anthropic_headers(), payload)
            cut = json.loads(raw)
            assert (cut["stop_reason"], cut["usage"]["output_tokens"]) == ("max_tokens", 2)
            nursery.cancel_scope.cancel()


async def test_anthropic_event_stream_shape():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, _, pool = await start_stub(nursery, kind="anthropic", reply_tokens=4)
            payload = {
                "model": "claude-haiku-4-5",
                "max_tokens": 50,
                "stream": True,
                "messages": [{"role": "user", "content": "abcdefgh"}],
            }
            status, headers, raw = await call(pool, "/v1/messages", anthropic_headers(), payload)
            assert status == 200
            frames = sse_frames(raw)
            names = [f["event"] for f in frames]
            assert names == [
                "message_start",
                "content_block_start",
                "ping",
                *["content_block_delta"] * 4,
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
            data = [json.loads(f["data"]) for f in frames]
            assert all(d["type"] == name for d, name in zip(data, names, strict=True))
            start = data[0]["message"]
            assert start["content"] == [] and start["stop_reason"] is None
            assert start["usage"]["input_tokens"] == 2
            deltas = [d["delta"]["text"] for d in data if d["type"] == "content_block_delta"]
            assert "".join(deltas) == make_reply(4, None).text
            message_delta = data[-2]
            assert message_delta["delta"]["stop_reason"] == "end_turn"
            assert message_delta["usage"]["output_tokens"] == 4
            nursery.cancel_scope.cancel()


async def test_error_shapes():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            _, _, oa = await start_stub(nursery, kind="openai")
            _, _, an = await start_stub(nursery, kind="anthropic")
            good_openai = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

            status, _, raw = await call(oa, "/v1/chat/completions", openai_headers(), b"{nope")
            error = json.loads(raw)["error"]
            assert status == 400 and error["type"] == "invalid_request_error"
            assert set(error) == {"message", "type", "param", "code"}

            status, _, raw = await call(oa, "/v1/chat/completions", [], good_openai)
            assert status == 401 and "API key" in json.loads(raw)["error"]["message"]

            status, _, raw = await call(oa, "/v1/nothing", openai_headers(), good_openai)
            assert status == 404 and json.loads(raw)["error"]["message"].startswith("Invalid URL")

            no_max = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            status, _, raw = await call(an, "/v1/messages", anthropic_headers(), no_max)
            body = json.loads(raw)
            assert status == 400 and body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
            assert "max_tokens" in body["error"]["message"]
            assert body["request_id"].startswith("req_")

            status, _, raw = await call(an, "/v1/messages", [], {**no_max, "max_tokens": 5})
            assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error"

            status, _, raw = await call(an, "/v1/other", anthropic_headers(), no_max)
            assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
            nursery.cancel_scope.cancel()


async def test_models_endpoints():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            for kind, headers in (("openai", openai_headers()), ("anthropic", anthropic_headers())):
                _, _, pool = await start_stub(nursery, kind=kind)
                async with pool.request("GET", "/v1/models", headers) as resp:
                    body = json.loads(await resp.read())
                assert resp.status == 200
                assert [m["id"] for m in body["data"]]
            nursery.cancel_scope.cancel()


async def test_request_log_in_memory_over_http_and_on_disk(tmp_path):
    log_file = tmp_path / "stub.jsonl"
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub = Stub(StubConfig(kind="openai"), log=RequestLog(100, log_file))
            listening = await nursery.start(stub.serve)
            pool = UpstreamPool(listening.url)
            bodies = []
            for i, stream in enumerate((False, True)):
                payload = {"model": f"gpt-{i}", "messages": [{"role": "user", "content": "hi"}]}
                payload["stream"] = stream
                bodies.append(json.dumps(payload).encode())
                await call(pool, "/v1/chat/completions", openai_headers(f"key-{i}"), bodies[-1])

            entries = stub.log.entries()
            assert [e["seq"] for e in entries] == [0, 1]
            for i, entry in enumerate(entries):
                assert entry["method"] == "POST" and entry["path"] == "/v1/chat/completions"
                assert entry["model"] == f"gpt-{i}" and entry["stream"] is bool(i)
                assert entry["body_bytes"] == len(bodies[i])
                assert entry["body_sha256"] == hashlib.sha256(bodies[i]).hexdigest()
                assert entry["key"] == fingerprint(f"key-{i}") != fingerprint("key-9")
                headers = dict(entry["headers"])
                assert headers["authorization"] == f"Bearer {fingerprint(f'key-{i}')}"
                assert f"key-{i}" not in json.dumps(entry)  # the key itself is never kept

            async with pool.request("GET", "/_stub/log") as resp:
                served = [json.loads(line) for line in (await resp.read()).splitlines()]
            assert served == entries
            async with pool.request("GET", "/_stub/log?since=1") as resp:
                assert [json.loads(x)["seq"] for x in (await resp.read()).splitlines()] == [1]

            on_disk = [json.loads(line) for line in log_file.read_text().splitlines()]
            assert on_disk == entries

            async with pool.request("POST", "/_stub/reset") as resp:
                assert json.loads(await resp.read()) == {"cleared": 2}
            assert stub.log.entries() == []
            assert len(log_file.read_text().splitlines()) == 2  # the file keeps its history
            nursery.cancel_scope.cancel()
    stub.log.close()


async def test_a_request_is_on_file_before_its_answer_starts(tmp_path):
    log_file = tmp_path / "stub.jsonl"
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub = Stub(StubConfig(kind="openai", token_delay=0.05), log=RequestLog(10, log_file))
            listening = await nursery.start(stub.serve)
            pool = UpstreamPool(listening.url)
            payload = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            body = json.dumps(payload).encode()
            async with pool.request("POST", "/v1/chat/completions", openai_headers(), body) as r:
                # the answer has only begun (tokens follow 50 ms apart): the line is there
                assert r.status == 200
                (line,) = log_file.read_text().splitlines()
                assert json.loads(line)["body_sha256"] == hashlib.sha256(body).hexdigest()
                await r.read()
            nursery.cancel_scope.cancel()
    stub.log.close()


async def test_a_request_whose_body_never_arrives_is_logged_as_incomplete(tmp_path):
    log_file = tmp_path / "stub.jsonl"
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub = Stub(StubConfig(kind="openai"), log=RequestLog(10, log_file))
            listening = await nursery.start(stub.serve)
            stream = await trio.open_tcp_stream("127.0.0.1", listening.port)
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: stub\r\n"
                b"authorization: Bearer " + KEY.encode() + b"\r\n"
                b"content-type: application/json\r\ncontent-length: 100\r\n\r\n"
            )
            await stream.send_all(head + b'{"model":')  # 9 of the 100 bytes promised
            await stream.aclose()  # the caller goes away mid-body
            while not stub.log.entries():
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    stub.log.close()
    (entry,) = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert entry["path"] == "/v1/chat/completions" and entry["key"] == fingerprint(KEY)
    assert entry["body_bytes"] is None
    assert "closed the connection during the request body" in entry["incomplete"]


async def test_request_log_is_bounded():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, _, pool = await start_stub(nursery, kind="openai", log_capacity=3)
            payload = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            for _ in range(5):
                await call(pool, "/v1/chat/completions", openai_headers(), payload)
            assert [e["seq"] for e in stub.log.entries()] == [2, 3, 4]
            nursery.cancel_scope.cancel()


async def test_latency_before_first_byte_and_between_tokens():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            _, _, pool = await start_stub(
                nursery, kind="openai", latency=0.2, token_delay=0.05, reply_tokens=4
            )
            payload = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            sent = trio.current_time()
            body = json.dumps(payload).encode()
            async with pool.request("POST", "/v1/chat/completions", openai_headers(), body) as resp:
                head_at = trio.current_time()
                token_times = []
                buffer = b""
                async for chunk in resp.body():
                    buffer += chunk
                    while b"\n\n" in buffer:
                        frame, buffer = buffer.split(b"\n\n", 1)
                        if b'"content":"' in frame and b'"content":""' not in frame:
                            token_times.append(trio.current_time())
            assert head_at - sent >= 0.19
            assert len(token_times) == 4
            gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
            assert all(gap >= 0.045 for gap in gaps), gaps
            nursery.cancel_scope.cancel()


async def test_behaviour_is_chosen_per_request_from_its_arrival():
    arrivals: list[Arrival] = []

    def choose(arrival: Arrival) -> Behaviour:
        arrivals.append(arrival)
        return Behaviour(first_byte_delay=0.3 if arrival.ordinal == 1 else 0.0)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub = Stub(StubConfig(kind="anthropic"), choose=choose)
            listening = await nursery.start(stub.serve)
            pool = UpstreamPool(listening.url)
            payload = {
                "model": "c",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "x"}],
            }
            durations = []
            for _ in range(3):
                started = trio.current_time()
                await call(pool, "/v1/messages", anthropic_headers(), payload)
                durations.append(trio.current_time() - started)
            assert [a.ordinal for a in arrivals] == [0, 1, 2]
            assert arrivals[0].model == "c" and arrivals[0].path == "/v1/messages"
            assert durations[1] >= 0.29 and durations[0] < 0.29 and durations[2] < 0.29
            nursery.cancel_scope.cancel()


# -- the official SDKs, run under trio (they use anyio, which supports it) --


async def test_openai_sdk_against_the_stub():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, listening, _ = await start_stub(nursery, kind="openai", reply_tokens=5)
            client = openai_sdk.AsyncOpenAI(
                base_url=listening.url + "/v1", api_key="x", max_retries=0
            )
            messages = [{"role": "user", "content": "sixteen bytes!!!"}]
            done = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
            assert done.choices[0].message.content == make_reply(5, None).text
            assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (4, 5)

            stream = await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=3,
            )
            pieces, usage = [], None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.usage:
                    usage = chunk.usage
            assert "".join(pieces) == make_reply(3, None).text
            assert (usage.prompt_tokens, usage.completion_tokens) == (4, 3)
            await client.close()
            assert [e["key"] for e in stub.log.entries()] == [fingerprint("x")] * 2
            nursery.cancel_scope.cancel()


async def test_anthropic_sdk_against_the_stub():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stub, listening, _ = await start_stub(nursery, kind="anthropic", reply_tokens=5)
            client = anthropic_sdk.AsyncAnthropic(
                base_url=listening.url, api_key="x", max_retries=0
            )
            messages = [{"role": "user", "content": "eight b!"}]
            done = await client.messages.create(model="claude-x", max_tokens=100, messages=messages)
            assert done.content[0].text == make_reply(5, None).text
            assert (done.usage.input_tokens, done.usage.output_tokens) == (2, 5)

            async with client.messages.stream(
                model="claude-x", max_tokens=2, messages=messages
            ) as stream:
                text = "".join([piece async for piece in stream.text_stream])
                final = await stream.get_final_message()
            assert text == make_reply(2, None).text
            assert final.stop_reason == "max_tokens"
            assert (final.usage.input_tokens, final.usage.output_tokens) == (2, 2)
            await client.close()
            assert [e["stream"] for e in stub.log.entries()] == [False, True]
            nursery.cancel_scope.cancel()


# -- deterministic usage, property-tested on the pure shapes --

texts = st.text(max_size=200)


@settings(deadline=None)
@given(contents=st.lists(texts, min_size=1, max_size=5), max_tokens=st.none() | st.integers(1, 40))
def test_openai_usage_is_a_function_of_the_request(contents, max_tokens):
    payload = {"model": "m", "messages": [{"role": "user", "content": c} for c in contents]}
    if max_tokens is not None:
        payload["max_completion_tokens"] = max_tokens
    body = json.dumps(payload).encode()
    exchange = openai_shape.parse(body)
    text_bytes = sum(len(c.encode()) for c in contents)
    assert exchange.input_tokens == math.ceil(text_bytes / 4) <= len(body)
    reply = make_reply(16, exchange.max_tokens)
    assert reply.output_tokens == (16 if max_tokens is None else min(16, max_tokens))
    whole = json.loads(openai_shape.whole(exchange, reply, 0, 0))
    assert whole["usage"]["completion_tokens"] == reply.output_tokens


@settings(deadline=None)
@given(
    system=texts, contents=st.lists(texts, min_size=1, max_size=5), max_tokens=st.integers(1, 40)
)
def test_anthropic_usage_is_a_function_of_the_request(system, contents, max_tokens):
    payload = {
        "model": "c",
        "max_tokens": max_tokens,
        "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": c}]} for c in contents],
    }
    body = json.dumps(payload, ensure_ascii=False).encode()
    exchange = anthropic_shape.parse(body)
    text_bytes = len(system.encode()) + sum(len(c.encode()) for c in contents)
    assert exchange.input_tokens == math.ceil(text_bytes / 4) <= len(body)
    reply = make_reply(16, exchange.max_tokens)
    frames = [f for f, _ in anthropic_shape.frames(exchange, reply, 0, 0)]
    delta = json.loads(sse_frames(frames[-2])[0]["data"])
    assert delta["usage"]["output_tokens"] == min(16, max_tokens)


def test_invalid_requests_are_refused_with_the_parameter_named():
    for body, param in (
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": [{"content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"content": "x"}], "stream": "yes"}', "stream"),
    ):
        with pytest.raises(StubRequestError) as caught:
            openai_shape.parse(body)
        assert (caught.value.status, caught.value.param) == (400, param)


# -- the command --


async def test_docket_stub_command_serves_until_sigterm():
    with trio.fail_after(DEADLINE):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "docket", "stub", "--kind", "anthropic", "--latency", "10ms"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1024)
                assert chunk, "the stub exited before it said where it listens"
                line += chunk
            text = line.decode().strip()
            assert text.startswith("stub anthropic listening on http://127.0.0.1:")
            pool = UpstreamPool(text.rsplit(" ", 1)[1])
            payload = {
                "model": "c",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "x"}],
            }
            status, _, raw = await call(pool, "/v1/messages", anthropic_headers(), payload)
            assert status == 200 and json.loads(raw)["usage"]["output_tokens"] == 2
            await pool.aclose()
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--latency", "fast"], "--latency 'fast': not a duration"),
        (["--token-delay=-5ms"], "--token-delay '-5ms': not a duration"),
        (["--port", "70000"], "--port 70000: not a port number"),
        (["--log", "/nonexistent-dir/x.jsonl"], "--log /nonexistent-dir/x.jsonl: cannot append"),
    ],
)
def test_docket_stub_bad_arguments_are_one_line_and_exit_2(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "docket", "stub", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"docket: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_stub_config_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown stub kind"):
        StubConfig(kind="gemini")
