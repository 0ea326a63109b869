"""Checks of the caps: reservations under concurrency, deny, kill, and a model whose
cost cannot be bounded."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from docket.pricing import default_price_table
from docket.selftest.rig import boundary_rig, chat, error_type, of_type, read_ledger
from docket.selftest.runner import Registry, expect
from docket.selftest.upstream import Upstream

caps = Registry("caps")

REFUSED = (
    403,
    429,
)  # 403: past the cap; 429 (+ Retry-After): would fit once calls in flight settle


def _cap_refusals(events: list[dict], cap: str) -> list[dict]:
    return [e for e in events if e["type"] == "policy.denied" and e.get("rule") == f"caps.{cap}"]


@caps.check(
    "caps-reserve", "16 calls at once: only what the cap covers at worst case goes upstream"
)
async def reserve(folder: Path) -> str:
    max_usd, max_tokens = 0.002, 1000
    upstream = Upstream(delay=0.2)  # holds each reservation while the others arrive
    answers: list[httpx.Response] = []
    async with boundary_rig(folder, {"caps": {"max_usd": max_usd}}, upstream=upstream) as rig:

        async def caller() -> None:
            answers.append(await rig.call(chat(max_tokens=max_tokens)))

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(caller)
    price = default_price_table().lookup("gpt-4o-mini")
    expect(price is not None, "gpt-4o-mini is not in the price table")
    assert price is not None  # for the type checker; expect() has just said so
    worst_nusd = price.cost_nusd(0, max_tokens, 0, cached_is_subset=True)
    fits = int(max_usd * 1e9 // worst_nusd)
    events = read_ledger(rig.ledger_path)
    spent = sum(e["cost_nusd"] for e in of_type(events, "model.response"))
    refused = [r for r in answers if r.status_code != 200]
    expect(0 < upstream.peak <= fits, f"{upstream.peak} calls in flight; the cap covers {fits}")
    expect(spent <= max_usd * 1e9, f"spent {spent} nUSD past the cap")
    expect(len(refused) >= 16 - fits, f"only {len(refused)} of 16 refused")
    expect(all(r.status_code in REFUSED for r in refused), "a refusal that is not 403/429")
    expect(all((error_type(r) or "").startswith("docket_") for r in refused), "an untyped refusal")
    recorded = _cap_refusals(events, "max_usd")
    expect(len(recorded) == len(refused), f"{len(refused)} refused, {len(recorded)} recorded")
    return (
        f"peak {upstream.peak} in flight (cap covers {fits}), {len(refused)} refused, spend ≤ cap"
    )


@caps.check("caps-deny", "on_breach = deny: the call past the cap is refused, the run goes on")
async def deny(folder: Path) -> str:
    policy = {"caps": {"max_model_calls": 2, "on_breach": "deny"}}
    async with boundary_rig(folder, policy) as rig:
        statuses = [(await rig.call()).status_code for _ in range(4)]
        health = await rig.http.get("/docket/healthz")
        forwarded, stops = len(rig.upstream.seen), list(rig.stops)
    expect(statuses == [200, 200, 403, 403], f"statuses {statuses}")
    expect(forwarded == 2, f"the upstream saw {forwarded} calls past a cap of 2")
    expect(stops == [], f"deny asked to stop the run: {stops}")
    expect(health.status_code == 200, "the boundary stopped serving")
    events = read_ledger(rig.ledger_path)
    expect(len(of_type(events, "cap.exceeded")) >= 1, "no cap.exceeded event")
    expect(len(_cap_refusals(events, "max_model_calls")) == 2, "refusals not recorded")
    return "2 forwarded, then 403 ×2 recorded; no stop asked, still serving"


@caps.check("caps-kill", "on_breach = kill: the breach asks the supervisor to stop, exit 42")
async def kill(folder: Path) -> str:
    policy = {"caps": {"max_model_calls": 1, "on_breach": "kill"}}
    async with boundary_rig(folder, policy) as rig:
        statuses = [(await rig.call()).status_code for _ in range(3)]
        forwarded, stops = len(rig.upstream.seen), list(rig.stops)
    expect(statuses[0] == 200 and statuses[1:] == [403, 403], f"statuses {statuses}")
    expect(forwarded == 1, f"the upstream saw {forwarded} calls past a cap of 1")
    expect(stops, "no stop was asked for")
    expect({(s.exit_status, s.cap) for s in stops} == {(42, "max_model_calls")}, f"stops {stops}")
    exceeded = of_type(read_ledger(rig.ledger_path), "cap.exceeded")
    expect(len(exceeded) == 1, f"{len(exceeded)} cap.exceeded events")
    return "1 forwarded, breach recorded, stop asked: exit 42 (cap max_model_calls)"


@caps.check("unpriced", "with max_usd set, a model not in the price table is refused unforwarded")
async def unpriced(folder: Path) -> str:
    async with boundary_rig(folder, {"caps": {"max_usd": 1.0}}) as rig:
        r = await rig.call(chat(model="selftest-model-not-in-any-table"))
        forwarded = len(rig.upstream.seen)
    expect(r.status_code in REFUSED and error_type(r), f"got {r.status_code} {error_type(r)}")
    expect(forwarded == 0, "the unpriced call was forwarded")
    denied = of_type(read_ledger(rig.ledger_path), "policy.denied")
    expect(len(denied) == 1, "the refusal was not recorded")
    return f"{r.status_code} {error_type(r)} (rule {denied[0]['rule']}), upstream untouched"
