"""/docket/readyz names what is wrong: the breaker when the provider is down, the
ledger when the evidence path is; /docket/healthz never asks a dependency."""

from __future__ import annotations

import socket

import trio
from prometheus_client.parser import text_string_to_metric_families

DEADLINE = 15
CHAT = "/openai/v1/chat/completions"
CHAT_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_readiness_names_the_breaker_when_the_provider_is_down(boundary_rig):
    down = ("openai", f"http://127.0.0.1:{closed_port()}")
    policy = {"resilience": {"breaker_threshold": 2, "breaker_cooldown_seconds": 60}}
    with trio.fail_after(DEADLINE):
        async with boundary_rig({"openai": down}, policy) as rig, rig.client() as http:
            ready_before = await http.get("/docket/readyz")
            for _ in range(2):
                r = await http.post(CHAT, json=CHAT_BODY)
                assert r.json()["error"]["type"] == "docket_upstream_unreachable"
            not_ready = await http.get("/docket/readyz")
            health = await http.get("/docket/healthz")
            refused = await http.post(CHAT, json=CHAT_BODY)
            scraped = (await http.get("/docket/metrics")).text
    assert ready_before.status_code == 200 and ready_before.json()["problems"] == []
    assert health.status_code == 200 and health.json() == {"status": "alive"}
    assert not_ready.status_code == 503
    (problem,) = not_ready.json()["problems"]
    assert problem.startswith("breaker for openai is open (probe in ")
    assert "ledger" not in problem
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "docket_breaker_open"
    events = rig.events()
    assert [e["reason"] for e in events if e["type"] == "model.error"] == ["connect", "connect"]
    assert [e["to"] for e in events if e["type"] == "breaker.state"] == ["open"]
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    (state,) = families["docket_breaker_state"].samples
    assert state.labels == {"upstream": "openai"} and state.value == 2


async def test_readiness_names_the_ledger_when_the_volume_is_short(stub_server, boundary_rig):
    starved = {"ledger": {"min_free_bytes": 2**60}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, starved) as rig,
            rig.client() as http,
        ):
            not_ready = await http.get("/docket/readyz")
    assert not_ready.status_code == 503
    (problem,) = not_ready.json()["problems"]
    assert problem.startswith("ledger volume: ") and "min_free_bytes" in problem
    assert "breaker" not in problem
