"""Every model.request gets exactly one closing event, whatever raises.

An exception anywhere between a call's model.request and its answer closes the
call as model.error reason internal_error (charged its reservation), the agent
gets a 5xx in the provider's shape, and the boundary keeps serving. Read back
from the bytes on disk.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from docket.run.hooks import CALL_POINTS

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


# ---------------------------------------------------------------- a probe at every await point

DENIED_BEFORE_REQUEST = ("request.read", "caps.record", "guards.enter", "request.record")
CLOSED_BEFORE = ("close.after", "relay.answer", "relay.end")  # the closing event is written


class Boom(RuntimeError):
    pass


def probe_at(point: str, fired: list[str]):
    """A call_probe that raises at `point` the first time a call passes it. (A probe
    that raised at close.write every time would be a ledger that never takes the
    closing event: the evidence path's concern, not this one's.)"""

    def probe(at: str) -> None:
        if at == point and not fired:
            fired.append(at)
            raise Boom(f"probe at {at}")

    return probe


def stream_of(point: str) -> bool:
    return point.startswith(("relay.start", "relay.send", "relay.end"))


@pytest.mark.parametrize("point", CALL_POINTS)
async def test_a_raise_at_each_await_point_still_closes_the_call(point, stub_server, boundary_rig):
    fired: list[str] = []
    stream = stream_of(point)
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", token_delay=0.01, reply_tokens=4) as up,
            boundary_rig({"openai": up}) as rig,
            rig.client() as http,
        ):
            rig.boundary.call_probe = probe_at(point, fired)
            try:
                hit = await http.post(CHAT, json=chat(max_tokens=10, stream=stream))
                hit_status, hit_body = hit.status_code, hit.content
            except httpx.HTTPError as exc:  # a started stream is cut, not ended cleanly
                hit_status, hit_body = None, repr(exc).encode()
            rig.boundary.call_probe = None
            after = await http.post(CHAT, json=chat(max_tokens=10))  # still serving
            totals = rig.boundary.caps.totals()
        events = rig.events()
    assert fired == [point]
    assert after.status_code == 200
    assert totals.in_flight == 0 and totals.reserved_nusd == 0  # nothing left held
    assert_each_call_closed_once(events)
    first_call = [e for e in events if e["type"] in ("model.request", "policy.denied")][0]
    if point in DENIED_BEFORE_REQUEST:
        # Nothing was forwarded: a refusal with its reason, the reservation released.
        assert first_call["type"] == "policy.denied"
        assert first_call["rule"] == "internal_error"
        assert first_call["error_type"] == "docket_internal_error"
        assert "Boom: probe at" in first_call["detail"]
        assert len(events) == 3  # denied, then the next call's request and response
    else:
        calls = calls_of(events)
        assert len(calls) == 2
        request, close = calls[first_call["call_id"]]
        if point in CLOSED_BEFORE:
            assert close["type"] == "model.response"  # written before the probe raised
        else:
            assert close["type"] == "model.error" and close["reason"] == "internal_error"
            assert close["detail"] == f"Boom: probe at {point}"
            assert close["cost_nusd"] > 0  # charged its reservation: it may have left
    if hit_status is not None and not (stream and point in ("relay.send", "relay.end")):
        assert hit_status == 500, hit_body
        error = json.loads(hit_body)["error"]
        assert error["type"] == "docket_internal_error"
    elif hit_status is not None:
        # A stream already started: cut, so the client never sees a clean end.
        assert b"[DONE]" not in hit_body
