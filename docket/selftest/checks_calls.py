"""Checks of a model call's way through the boundary: recorded, authenticated, keyed,
refused when malformed, its secrets kept out of the record and away from the agent,
and the agent's other traffic held to the egress rule."""

from __future__ import annotations

import base64
from functools import partial
from pathlib import Path

import httpx
import trio

from docket.guards.redact import MARKER
from docket.selftest.rig import (
    REAL_KEY,
    TOKEN,
    boundary_rig,
    chat,
    error_type,
    of_type,
    read_ledger,
)
from docket.selftest.runner import Registry, expect
from docket.selftest.upstream import Upstream

calls = Registry("calls")


@calls.check("record", "a call is forwarded, answered, and on disk as request + response")
async def record(folder: Path) -> str:
    async with boundary_rig(folder) as rig:
        r = await rig.call()
        expect(r.status_code == 200, f"the call got {r.status_code}, not 200")
    events = read_ledger(rig.ledger_path)
    requests, responses = of_type(events, "model.request"), of_type(events, "model.response")
    expect(len(requests) == len(responses) == 1, "not one model.request and one model.response")
    expect(requests[0]["seq"] < responses[0]["seq"], "the response was recorded before its request")
    usage = responses[0].get("usage") or {}
    expect(usage.get("output_tokens") == 12, f"usage not recorded as the upstream gave it: {usage}")
    expect(responses[0].get("cost_nusd", 0) > 0, "the call was not priced")
    return f"{len(events)} events, chain intact, {usage['input_tokens']}+12 tokens priced"


@calls.check("auth", "a call without the run token is refused 401 and never forwarded")
async def auth(folder: Path) -> str:
    async with boundary_rig(folder) as rig:
        r = await rig.call(headers={"authorization": "Bearer not-the-run-token"})
        forwarded = len(rig.upstream.seen)
    expect(r.status_code == 401, f"a wrong token got {r.status_code}, not 401")
    expect(error_type(r) == "docket_unauthorized", f"error type {error_type(r)}")
    expect(forwarded == 0, f"the upstream saw {forwarded} calls")
    denied = of_type(read_ledger(rig.ledger_path), "policy.denied")
    expect([e["rule"] for e in denied] == ["auth"], "the refusal was not recorded with rule auth")
    return "401 docket_unauthorized, recorded (rule auth), upstream untouched"


@calls.check("key-swap", "the upstream gets the provider key, the agent only ever the run token")
async def key_swap(folder: Path) -> str:
    async with boundary_rig(folder) as rig:
        r = await rig.call()
        seen = [s.authorization for s in rig.upstream.seen]
    expect(r.status_code == 200, f"the call got {r.status_code}")
    expect(seen == [f"Bearer {REAL_KEY}".encode()], "the upstream did not get the real key alone")
    expect(TOKEN.encode() not in b"".join(s.body for s in rig.upstream.seen), "token went upstream")
    return "upstream saw Bearer sk-selftest-…, never the run token"


@calls.check("bad-request", "a malformed body is refused 400 without reserving or forwarding")
async def bad_request(folder: Path) -> str:
    async with boundary_rig(folder) as rig:
        r = await rig.http.post(
            "/openai/v1/chat/completions",
            content=b'{"model": "gpt-4o-mini", "messages": [',
            headers={"content-type": "application/json"},
        )
        forwarded = len(rig.upstream.seen)
    expect(r.status_code == 400, f"a truncated JSON body got {r.status_code}, not 400")
    expect(error_type(r) == "docket_bad_request", f"error type {error_type(r)}")
    expect(forwarded == 0, f"the upstream saw {forwarded} calls")
    denied = of_type(read_ledger(rig.ledger_path), "policy.denied")
    expect([e["rule"] for e in denied] == ["bad_request"], "not recorded with rule bad_request")
    return "400 docket_bad_request, recorded, upstream untouched"


@calls.check(
    "redaction", "keys in bodies and an upstream's echo never reach the ledger or the agent"
)
async def redaction(folder: Path) -> str:
    planted = f"my key is {REAL_KEY}, the token {TOKEN}, b64 {_b64(REAL_KEY)}"
    upstream = Upstream(echo_key=True)
    policy = {"ledger": {"record_bodies": True}}
    async with boundary_rig(folder, policy, upstream=upstream) as rig:
        r = await rig.call(chat(content=planted))
    expect(r.status_code == 200, f"the call got {r.status_code}")
    expect(REAL_KEY not in r.text, "the upstream's echo of the key reached the agent")
    raw = rig.ledger_path.read_bytes()
    events = read_ledger(rig.ledger_path)
    bodies = [k for e in events for k in e if k.endswith("_body")]
    expect("request_body" in bodies and "response_body" in bodies, f"bodies not recorded: {bodies}")
    expect(MARKER in raw.decode(), "no redaction marker in the recorded bodies")
    for name, secret in (
        ("the key", REAL_KEY),
        ("the run token", TOKEN),
        ("the key in base64", _b64(REAL_KEY)),
    ):
        expect(secret.encode() not in raw, f"{name} is in the ledger's bytes")
    return "key, token and base64 key absent from the ledger bytes and the agent's answer"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@calls.check(
    "egress", "the agent's proxy traffic to a host not allowed is refused 403, nothing connects"
)
async def egress(folder: Path) -> str:
    accepted = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with boundary_rig(folder) as rig:
            proxy = rig.url.replace("http://", f"http://docket:{TOKEN}@")
            async with httpx.AsyncClient(proxy=proxy, timeout=5.0) as http:
                r = await http.get(f"http://127.0.0.1:{port}/exfiltrate")
        nursery.cancel_scope.cancel()
    expect(r.status_code == 403, f"the proxy answered {r.status_code}, not 403")
    expect(error_type(r) == "docket_egress_denied", f"error type {error_type(r)}")
    expect(accepted == 0, f"the listener not allowed got {accepted} connections")
    denied = of_type(read_ledger(rig.ledger_path), "net.denied")
    expect(
        len(denied) == 1 and denied[0]["port"] == port, "the refusal was not recorded (net.denied)"
    )
    return f"403 docket_egress_denied for 127.0.0.1:{port}, net.denied recorded, 0 connections"


@calls.check("stream", "a streamed answer is relayed frame by frame and its usage recorded")
async def stream(folder: Path) -> str:
    upstream = Upstream(token_delay=0.03)  # 12 frames: ~0.36 s from first to last
    body = {**chat(), "stream": True, "stream_options": {"include_usage": True}}
    arrivals: list[float] = []
    async with boundary_rig(folder, upstream=upstream) as rig:
        started = trio.current_time()
        async with rig.http.stream("POST", "/openai/v1/chat/completions", json=body) as r:
            status = r.status_code
            async for chunk in r.aiter_bytes():
                if chunk:
                    arrivals.append(trio.current_time() - started)
    expect(status == 200, f"the stream got {status}")
    expect(len(arrivals) >= 4, f"the answer came in {len(arrivals)} pieces, not frame by frame")
    expect(arrivals[-1] - arrivals[0] >= 0.2, "the frames were held back and sent at once")
    events = read_ledger(rig.ledger_path)
    (request,) = of_type(events, "model.request")
    (response,) = of_type(events, "model.response")
    expect(request.get("stream") is True, "model.request does not say stream")
    usage = response.get("usage") or {}
    expect(usage.get("output_tokens") == 12, f"the stream's usage was not recorded: {usage}")
    return f"{len(arrivals)} pieces over {arrivals[-1] - arrivals[0]:.2f} s, usage 12 output tokens"


@calls.check("metrics", "/docket/metrics agrees with the ledger: calls, refusals, events")
async def metrics(folder: Path) -> str:
    from prometheus_client.parser import text_string_to_metric_families

    async with boundary_rig(folder) as rig:
        for _ in range(2):
            expect((await rig.call()).status_code == 200, "a call failed")
        await rig.call(headers={"authorization": "Bearer wrong"})
        text = (await rig.http.get("/docket/metrics")).text
        durable = rig.ledger.count
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name.removesuffix("_total")
            samples[key] = samples.get(key, 0) + sample.value
    calls_seen = samples.get("docket_model_calls")
    events_seen = samples.get("docket_ledger_events")
    expect(calls_seen == 2, f"docket_model_calls says {calls_seen}, the ledger 2")
    expect(events_seen == durable, f"docket_ledger_events says {events_seen}, the ledger {durable}")
    refusals = samples.get("docket_refusals")
    expect(refusals == 1, f"docket_refusals says {refusals}, the ledger 1 (the wrong token)")
    return f"2 calls, {durable} events and the refusal counted alike"
