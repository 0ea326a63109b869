"""Checks of the resilience guards in front of an upstream: the circuit breaker's
whole cycle, the rate limiter's 429, the bulkhead's shedding, a caller's deadline."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from docket.selftest.rig import boundary_rig, error_type, of_type, read_ledger
from docket.selftest.runner import Registry, expect
from docket.selftest.upstream import Upstream

guards = Registry("guards")


@guards.check("breaker", "failures open the breaker; refusals 503 + Retry-After; a probe closes it")
async def breaker(folder: Path) -> str:
    upstream = Upstream(failing=503)
    policy = {"resilience": {"breaker_threshold": 2, "breaker_cooldown_seconds": 0.2}}
    async with boundary_rig(folder, policy, upstream=upstream) as rig:
        for _ in range(2):
            r = await rig.call()
            expect(
                r.status_code == 503 and error_type(r) == "server_error", "not the upstream's 503"
            )
        refused = await rig.call()
        expect(error_type(refused) == "docket_breaker_open", f"3rd call: {error_type(refused)}")
        expect(refused.status_code == 503, f"an open breaker answered {refused.status_code}")
        retry_after = refused.headers.get("retry-after")
        expect(retry_after is not None and int(retry_after) >= 1, "no Retry-After on the refusal")
        expect(
            len(upstream.seen) == 2, f"the open breaker let a call through ({len(upstream.seen)})"
        )
        upstream.failing = None
        await trio.sleep(0.25)  # the cooldown, then a half-open probe
        probe = await rig.call()
        expect(probe.status_code == 200, f"the half-open probe got {probe.status_code}")
        after = await rig.call()
        expect(after.status_code == 200, "the breaker did not close after a good probe")
    changes = [(e["from"], e["to"]) for e in of_type(read_ledger(rig.ledger_path), "breaker.state")]
    cycle = [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    expect(changes == cycle, f"breaker.state events {changes}")
    return "closed → open → half_open → closed, each a breaker.state event; Retry-After " + str(
        retry_after
    )


@guards.check("limiter", "calls past the rate are refused 429 with Retry-After, never forwarded")
async def limiter(folder: Path) -> str:
    policy = {"resilience": {"max_calls_per_second": 2}}
    async with boundary_rig(folder, policy) as rig:
        answers = [await rig.call() for _ in range(5)]
        forwarded = len(rig.upstream.seen)
    statuses = [r.status_code for r in answers]
    limited = [r for r in answers if r.status_code == 429]
    expect(statuses[:2] == [200, 200], f"the burst of 2 was not admitted: {statuses}")
    expect(len(limited) >= 2, f"no 429 past the rate: {statuses}")
    expect(all(error_type(r) == "docket_rate_limited" for r in limited), "429 without its type")
    expect(all(r.headers.get("retry-after") == "1" for r in limited), "429 without Retry-After: 1")
    expect(forwarded == statuses.count(200), "a refused call reached the upstream")
    recorded = of_type(read_ledger(rig.ledger_path), "x-docket.rate-limited")
    expect(len(recorded) == len(limited), f"{len(limited)} refusals, {len(recorded)} recorded")
    return f"{statuses.count(200)} admitted, {len(limited)} × 429 Retry-After: 1, all recorded"


@guards.check("bulkhead", "past its slots and queue, calls are shed 503 at once, never queued")
async def bulkhead(folder: Path) -> str:
    upstream = Upstream(delay=0.4)
    policy = {"resilience": {"max_concurrent_upstream": 1, "max_queue": 1}}
    answers: list[httpx.Response] = []
    async with boundary_rig(folder, policy, upstream=upstream) as rig:

        async def caller() -> None:
            answers.append(await rig.call())

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(caller)
    shed = [r for r in answers if error_type(r) == "docket_load_shed"]
    ok = [r for r in answers if r.status_code == 200]
    expect(upstream.peak == 1, f"{upstream.peak} calls were upstream at once (1 slot)")
    expect(len(ok) == 2, f"{len(ok)} calls got through (1 slot + 1 queued)")
    expect(len(shed) == 4 and all(r.status_code == 503 for r in shed), "not 4 shed with 503")
    expect(all("retry-after" in r.headers for r in shed), "a shed call has no Retry-After")
    recorded = of_type(read_ledger(rig.ledger_path), "load.shed")
    expect(len(recorded) == 4, f"{len(recorded)} load.shed events for 4 sheds")
    return "1 in flight, 1 queued, 4 shed 503 + Retry-After, 4 load.shed events"


@guards.check("deadline", "a caller's spent deadline is answered 504 without forwarding")
async def deadline(folder: Path) -> str:
    async with boundary_rig(folder) as rig:
        spent = await rig.call(headers={"x-docket-deadline-ms": "0"})
        fine = await rig.call(headers={"x-docket-deadline-ms": "5000"})
        forwarded = rig.upstream.seen
    expect(spent.status_code == 504, f"a spent deadline got {spent.status_code}, not 504")
    expect(error_type(spent) == "docket_upstream_timeout", f"error type {error_type(spent)}")
    expect(fine.status_code == 200, f"a 5 s deadline got {fine.status_code}")
    expect(len(forwarded) == 1, f"the upstream saw {len(forwarded)} calls, not 1")
    expect(b"x-docket-deadline" not in forwarded[0].body, "the deadline leaked upstream")
    denied = of_type(read_ledger(rig.ledger_path), "policy.denied")
    expect([e["rule"] for e in denied] == ["deadline"], "the refusal was not recorded")
    return "504 docket_upstream_timeout for 0 ms, recorded; 5 s deadline forwarded"
