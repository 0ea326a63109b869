"""What a fleet budget adds to a call: p50 and p99 with [fleet] against a local cap.

Two boundaries in this process, side by side in one run: one holds a local cap
(max_usd), the other draws each call's reservation from a slice of a fleet budget
in a real PostgreSQL (a cluster of its own, tests/postgres_server.py; the run says
so and stops when PostgreSQL or psycopg is missing). One client alternates a call
through each (the order flips every pair) to the same stub provider, so drift on
this noisy machine hits both alike. Added = fleet's percentile minus the local
cap's. The fleet budget is sized so the slice must be topped up during the run
(cap / 20 a slice), and the exchanges the fleet boundary made are counted from
its ledger: most calls draw from the slice in memory, a few wait on the database.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from benchmarks._harness import ROOT

CHAT = "/openai/v1/chat/completions"
TOKEN = "docket-bench-run-token"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 16}


def run(quick: bool) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres_server import fresh_database, postgres_bin, running_cluster

    bindir = postgres_bin()
    if bindir is None:
        raise SystemExit("bench fleet: PostgreSQL is not installed (no initdb)")
    calls = 200 if quick else 2000
    with running_cluster(bindir) as cluster:
        dsn = fresh_database(cluster)
        return trio.run(_measure, dsn, calls)


async def _measure(dsn: str, calls: int) -> dict:
    from chaos.stub.server import Stub, StubConfig
    from docket.boundary.app import Boundary
    from docket.clock import Clock
    from docket.fleet.amounts import Caps
    from docket.fleet.lease import fleet_lease
    from docket.fleet.store import FleetStore
    from docket.ledger.writer import open_ledger
    from docket.policy import policy_from_dict

    per_call_nusd = 11_400  # what the stub's answer costs (gpt-4o-mini, 16 tokens out)
    cap_nusd = per_call_nusd * calls * 2  # demand stays under it: nothing is refused
    FleetStore(dsn).set_budget("bench", Caps(nusd=cap_nusd))
    stub = Stub(StubConfig(kind="openai"))
    folder = Path(tempfile.mkdtemp(prefix="docket-bench-fleet-"))
    times: dict[str, list[float]] = {"local": [], "fleet": []}
    async with trio.open_nursery() as nursery:
        stub_url = (await nursery.start(stub.serve)).url
        providers = {"openai": {"kind": "openai", "base_url": stub_url, "key_env": "K"}}
        local = policy_from_dict({"providers": providers, "caps": {"max_usd": 1000}})
        fleet = policy_from_dict(
            {"providers": providers, "fleet": {"budget": "bench", "dsn": dsn, "timeout": 2}}
        )
        lease = fleet_lease(fleet, {}, "bench-run")
        ledgers = {}
        for name, policy in (("local", local), ("fleet", fleet)):
            ledgers[name] = await nursery.start(
                _ledger, open_ledger, folder / f"{name}.jsonl", policy
            )
        async with trio.open_nursery() as serving:  # stopped before the ledgers close
            urls = {}
            for name, policy, share in (("local", local, None), ("fleet", fleet, lease)):
                boundary = Boundary(
                    policy, ledgers[name], token=TOKEN, clock=Clock(), stop=print,
                    env={"K": "k"}, fleet=share,
                )  # fmt: skip
                urls[name] = await serving.start(boundary.serve)
            await _alternate(urls, times, calls)
            serving.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    fleet_events = [
        line
        for line in (folder / "fleet.jsonl").read_text().splitlines()
        if '"fleet.lease"' in line
    ]
    p = {name: _percentiles(ts) for name, ts in times.items()}
    added = {k: round(p["fleet"][k] - p["local"][k], 3) for k in ("p50_ms", "p99_ms")}
    return {
        "calls_each": calls,
        "local_cap": p["local"],
        "fleet": p["fleet"],
        "added_ms": added,
        "fleet_lease_events": len(fleet_events),
        "summary": {
            "added p50 (fleet - local cap)": f"{added['p50_ms']:+.3f} ms "
            f"({p['fleet']['p50_ms']:.3f} vs {p['local']['p50_ms']:.3f})",
            "added p99": f"{added['p99_ms']:+.3f} ms",
            "lease events over the run": len(fleet_events),
        },
    }


async def _alternate(urls: dict, times: dict, calls: int) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=urls["local"], headers=headers) as a,
        httpx.AsyncClient(base_url=urls["fleet"], headers=headers) as b,
    ):
        clients = {"local": a, "fleet": b}
        for name in clients:  # warm: connections, the first lease
            r = await clients[name].post(CHAT, json=BODY)
            assert r.status_code == 200, (name, r.text)
        for i in range(calls):
            order = ("local", "fleet") if i % 2 == 0 else ("fleet", "local")
            for name in order:
                start = time.perf_counter()
                r = await clients[name].post(CHAT, json=BODY)
                times[name].append(time.perf_counter() - start)
                assert r.status_code == 200, r.text


async def _ledger(open_ledger, path, policy, task_status=trio.TASK_STATUS_IGNORED):
    from docket.clock import Clock

    async with open_ledger(path, limits=policy.ledger_limits(), clock=Clock()) as ledger:
        task_status.started(ledger)
        await trio.sleep_forever()


def _percentiles(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }
