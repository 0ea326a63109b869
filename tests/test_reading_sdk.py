"""explain on the official openai SDK's own retries, recorded through a real boundary.

The SDK retries a 503 itself (the boundary never does). With its default backoff
(0.5 s, doubling) that is no storm; told by the upstream to come back in 1 ms,
twelve retries land within milliseconds: a storm. Where the boundary records the
SDK's attempt markers (`client_attempt`, from x-stainless-retry-count), explain
says it counted by them.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio
from conftest import TOKEN
from helpers import LazyModule

from chaos.stub.server import Behaviour, steady
from docket.reading.explain import explain_ledger
from docket.reading.thresholds import DEFAULTS

openai = LazyModule("openai")

DEADLINE = 30
QUESTION: list[dict] = [{"role": "user", "content": "sixteen bytes!!!"}]
NO_BREAKER = {"resilience": {"breaker_threshold": 1000}}  # every attempt reaches the stub


async def _sdk_calls(rig, calls: int, retries: int) -> None:
    client = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=TOKEN, max_retries=retries)
    try:
        for _ in range(calls):
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="gpt-4o-mini", messages=QUESTION, max_tokens=5
                )
    finally:
        await client.close()


async def test_the_sdks_backed_off_retries_are_no_storm(stub_server, boundary_rig):
    failing = steady(Behaviour(error="status", status=503))
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", choose=failing) as up,
            boundary_rig({"openai": up}, NO_BREAKER) as rig,
        ):
            await _sdk_calls(rig, calls=2, retries=2)
    report = explain_ledger(rig.ledger_path)
    assert report["model_calls"] == 6  # 2 logical calls, 3 attempts each
    requests = [e for e in rig.events() if e["type"] == "model.request"]
    names = {f["pattern"] for f in report["findings"]}
    # No storm; but the SDK keeps no retry budget: its four retries of two calls are
    # over 0.1 x 2 + 3 (named only when the SDK marked its attempts)
    marked = all("client_attempt" in r for r in requests)
    assert names == ({"retry-budget"} if marked else set())
    # Not one of its four retries was immediate. At a threshold of 1, timing alone
    # counts one re-call: the second logical call, sent at once after the first gave
    # up; the SDK's attempt marker (0: a first attempt) tells it apart.
    eager = dataclasses.replace(DEFAULTS, retry_min_recalls=1)
    found = [
        f
        for f in explain_ledger(rig.ledger_path, eager)["findings"]
        if f["pattern"] == "retry-storm"
    ]
    if marked:
        assert found == []
    else:
        (storm,) = found
        assert storm["evidence"]["immediate_recalls"] == 1
        assert storm["evidence"]["seq"] == f"{requests[3]['seq'] - 1}..{requests[3]['seq']}"


async def test_retries_told_to_come_back_at_once_are_a_storm(stub_server, boundary_rig):
    failing = steady(Behaviour(error="status", status=503, retry_after="0.001"))
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai", choose=failing) as up,
            boundary_rig({"openai": up}, NO_BREAKER) as rig,
        ):
            await _sdk_calls(rig, calls=1, retries=12)
    report = explain_ledger(rig.ledger_path)
    assert report["model_calls"] == 13
    (storm,) = [f for f in report["findings"] if f["pattern"] == "retry-storm"]
    evidence = storm["evidence"]
    assert evidence["immediate_recalls"] == 12
    assert evidence["answered"] == {"model.error": 12}
    requests = [e for e in rig.events() if e["type"] == "model.request"]
    marked = all("client_attempt" in r for r in requests)
    # With the SDK's markers on model.request, every re-call is counted by them.
    assert evidence["marked_by_client"] == (12 if marked else 0)
