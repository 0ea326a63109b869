"""The replay upstream and the boundary's reading of its mark, in process: real sockets
on 127.0.0.1, a real boundary and ledger (the boundary_rig), no subprocess.

What is proven here: a recorded answer reaches the agent byte for byte (whole, and a
stream event by event); the closing event names its origin (replayed_from) and costs
zero; the mark never reaches the agent; and a mark with the wrong key, or on a route
docket replay did not set up, is dropped unread: the call is an ordinary, charged one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import trio
from conftest import Upstream
from helpers import serving

from docket.boundary.replayed import REPLAY_HEADER, replay_header
from docket.http.server_exchange import Request, Responder
from docket.replay.match import Matcher, recorded_calls
from docket.replay.upstream import ReplayUpstream

KEY = "0123456789abcdef0123456789abcdef"
RUN = "20261202T100000Z-0a1b2c3d"
DEADLINE = 20
WHOLE = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
STREAMED = WHOLE | {"stream": True, "stream_options": {"include_usage": True}}
WHOLE_ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "recorded"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)
CHUNK = (
    '{"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[%s],"usage":%s}'
)
STREAM_ANSWER = (
    "data: " + CHUNK % ('{"index":0,"delta":{"content":"rec"}}', "null") + "\n\n"
    "data: " + CHUNK % ('{"index":0,"delta":{"content":"orded"}}', "null") + "\n\n"
    "data: " + CHUNK % ("", '{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}') + "\n\n"
    "data: [DONE]\n\n"
)


def recording() -> list:
    pairs = []
    for seq, (body, answer, stream) in enumerate(
        [(WHOLE, WHOLE_ANSWER, False), (STREAMED, STREAM_ANSWER, True)]
    ):
        data = json.dumps(body).encode()
        request = {
            "seq": 2 * seq + 1,
            "type": "model.request",
            "call_id": f"c{seq}",
            "provider": "openai",
            "base_url": "https://api.openai.example",
            "url": "https://api.openai.example/v1/chat/completions",
            "request_sha256": hashlib.sha256(data).hexdigest(),
            "request_body": data.decode(),
        }
        close = {
            "seq": 2 * seq + 2,
            "type": "model.response",
            "call_id": f"c{seq}",
            "status": 200,
            "response_body": answer,
        } | ({"events": 4} if stream else {})
        pairs += [(request, f"{2 * seq + 1:064x}"), (close, f"{2 * seq + 2:064x}")]
    return recorded_calls(pairs)


async def test_recorded_answers_reach_the_agent_marked_and_free(boundary_rig):
    replay = ReplayUpstream(Matcher(recording()), run_id=RUN, key=KEY, kinds={"openai": "openai"})
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig:
            rig.boundary.routes["openai"].replay_key = KEY
            async with rig.client() as client:
                whole = await client.post("/openai/v1/chat/completions", content=json.dumps(WHOLE))
                async with client.stream(
                    "POST", "/openai/v1/chat/completions", content=json.dumps(STREAMED)
                ) as streamed:
                    pieces = [piece async for piece in streamed.aiter_text()]
    assert whole.status_code == 200 and whole.text == WHOLE_ANSWER
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert "".join(pieces) == STREAM_ANSWER
    for answer in (whole, streamed):
        assert REPLAY_HEADER.decode() not in answer.headers  # the mark is never the agent's
    closes = rig.events("model.response")
    assert [c["replayed_from"] for c in closes] == [
        {"run_id": RUN, "seq": 2, "line_sha256": f"{2:064x}"},
        {"run_id": RUN, "seq": 4, "line_sha256": f"{4:064x}"},
    ]
    assert [c["cost_nusd"] for c in closes] == [0, 0]
    assert [c["usage"]["output_tokens"] for c in closes] == [1, 2]  # what the record says
    assert replay.matcher.matched == 2 and not replay.misses


async def test_a_forged_mark_is_dropped_unread_and_the_call_charged(boundary_rig, upstream_server):
    """An upstream that is not the replay's (or does not hold its key) cannot make a
    call look replayed: the mark is stripped, nothing is recorded, the call costs."""

    async def forger(request: Request, respond: Responder) -> None:
        await request.read_body()
        guessed = replay_header("f" * 32, RUN, 2, "0" * 64)
        await respond.simple(
            200, [(b"content-type", b"application/json"), guessed], WHOLE_ANSWER.encode()
        )

    with trio.fail_after(DEADLINE):
        async with upstream_server(forger, "openai") as up:
            for key in (KEY, None):  # a replay route with another key; an ordinary route
                async with boundary_rig({"openai": up}) as rig:
                    rig.boundary.routes["openai"].replay_key = key
                    async with rig.client() as client:
                        answer = await client.post(
                            "/openai/v1/chat/completions", content=json.dumps(WHOLE)
                        )
                assert answer.status_code == 200
                assert REPLAY_HEADER.decode() not in answer.headers
                (close,) = rig.events("model.response")
                assert "replayed_from" not in close and close["cost_nusd"] > 0, key


async def test_on_miss_forward_goes_to_the_real_provider_and_is_charged(stub_server, boundary_rig):
    """A request with no recorded answer, under --on-miss forward: the real provider (a
    stub) answers, the boundary records an ordinary call, with its cost."""
    async with stub_server("openai", reply_tokens=2) as real:
        replay = ReplayUpstream(
            Matcher(recording()),
            run_id=RUN,
            key=KEY,
            kinds={"openai": "openai"},
            on_miss="forward",
            real_base_urls={"openai": real.url},
        )
        at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
        asked = WHOLE | {"messages": [{"role": "user", "content": "not recorded"}]}
        with trio.fail_after(DEADLINE):
            async with at_replay as up, boundary_rig({"openai": up}) as rig:
                rig.boundary.routes["openai"].replay_key = KEY
                async with rig.client() as client:
                    answer = await client.post("/openai/v1/chat/completions", json=asked)
        upstream_saw = [e["model"] for e in real.log]
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    assert upstream_saw == ["gpt-4o-mini"]  # it reached the real provider
    (close,) = rig.events("model.response")
    assert "replayed_from" not in close and "replay_miss" not in close and close["cost_nusd"] > 0
    assert close["replay_forwarded"] is True  # on the record as the real provider's answer
    assert replay.forwarded == 1 and len(replay.misses) == 1


async def test_pace_recorded_keeps_the_recorded_first_byte_and_duration(boundary_rig):
    """--pace recorded: the first byte at the recorded ttfb_ms, the events spread over the
    rest of duration_ms (the recorder keeps no time per event)."""
    calls = recording()
    streamed = calls[1]
    paced = dataclasses.replace(
        streamed, answer=dataclasses.replace(streamed.answer, ttfb_ms=150, duration_ms=450)
    )
    replay = ReplayUpstream(
        Matcher([paced]), run_id=RUN, key=KEY, kinds={"openai": "openai"}, pace="recorded"
    )
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig, rig.client() as client:
            began = trio.current_time()
            async with client.stream(
                "POST", "/openai/v1/chat/completions", content=json.dumps(STREAMED)
            ) as answer:
                first = None
                async for _ in answer.aiter_raw():
                    first = first if first is not None else trio.current_time() - began
                took = trio.current_time() - began
    assert first is not None and first >= 0.15  # no sooner than recorded
    assert took >= 0.45


async def test_a_models_list_is_answered_an_error_without_ending_the_replay(boundary_rig):
    """provider.call events keep no body: a models list cannot be served, and is not a
    divergence either (under --on-miss fail the run goes on)."""
    stopped: list[str] = []
    replay = ReplayUpstream(
        Matcher(recording()), run_id=RUN, key=KEY, kinds={"openai": "openai"}, stop=stopped.append
    )
    at_replay = serving(replay.serve, lambda url, _: Upstream(f"{url}/openai", "openai"))
    with trio.fail_after(DEADLINE):
        async with at_replay as up, boundary_rig({"openai": up}) as rig, rig.client() as client:
            listed = await client.get("/openai/v1/models")
            whole = await client.post("/openai/v1/chat/completions", content=json.dumps(WHOLE))
    assert listed.status_code == 400 and listed.json()["error"]["type"] == "docket_replay_miss"
    assert whole.text == WHOLE_ANSWER
    assert (
        stopped == []
        and replay.misses == []
        and replay.not_model_calls == ["GET /openai/v1/models"]
    )
