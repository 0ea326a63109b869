"""Issue 11 section 2: every model.request gets exactly one closing event, whatever raises.

An exception anywhere between a call's model.request and its answer closes the
call as model.error reason internal_error (charged its reservation), the agent
gets a 5xx in the provider's shape, and the boundary keeps serving. Read back
from the bytes on disk.
"""

from __future__ import annotations

import json

import trio

CHAT = "/openai/v1/chat/completions"
DEADLINE = 20


def chat(**extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], **extra}


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def calls_of(events: list[dict]) -> dict[str, list[dict]]:
    """call_id -> its model.request and closing events, in seq order."""
    calls: dict[str, list[dict]] = {}
    for e in events:
        if e["type"] in ("model.request", "model.response", "model.error"):
            calls.setdefault(e["call_id"], []).append(e)
    return calls


def assert_each_call_closed_once(events: list[dict]) -> None:
    for call_id, seen in calls_of(events).items():
        types = [e["type"] for e in seen]
        assert types[0] == "model.request" and len(types) == 2, (call_id, types)


async def test_an_answer_nested_500_deep_still_closes_the_call(upstream_server, boundary_rig):
    """The reproduction: record_bodies, an upstream answering JSON nested 500 deep."""
    deep = nested(500)

    async def upstream(request, respond):
        await request.read_body(limit=1 << 20)
        await respond.simple(200, [(b"content-type", b"application/json")], deep)

    with trio.fail_after(DEADLINE):
        async with (
            upstream_server(upstream, "openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"record_bodies": True}}) as rig,
            rig.client() as http,
        ):
            answers = [await http.post(CHAT, json=chat(max_tokens=10)) for _ in range(3)]
            health = await http.get("/docket/healthz")
        events = rig.events()
    assert health.status_code == 200  # the boundary keeps serving
    assert_each_call_closed_once(events)
    closes = [e for e in events if e["type"] in ("model.response", "model.error")]
    assert len(closes) == 3
    for answer, close in zip(answers, closes, strict=True):
        # Either the body is recorded without recursion (secrets' part) and the call
        # is answered, or recording failed and the call closed as internal_error.
        if close["type"] == "model.error":
            assert close["reason"] == "internal_error"
            assert close["cost_nusd"] > 0  # charged its reservation
            assert 500 <= answer.status_code < 600
            assert json.loads(answer.content)["error"]["type"] == "docket_internal_error"
        else:
            assert answer.status_code == 200
