"""What a fleet budget costs: added latency per call, and slices drawn per second.

Two parts in one run, against one PostgreSQL cluster of the benchmark's own (started
as chaos/fleet/postgres.py starts it for the tests and the fleet scenario; the run says so and stops when
PostgreSQL or psycopg is missing):

- Added latency. Two boundaries in this process, side by side: one holds a local
  cap (max_usd), the other draws each call's reservation from a slice of a fleet
  budget. One client alternates a call through each (the order flips every pair)
  to the same stub provider, so drift on this noisy machine hits both alike. Added
  = fleet's percentile minus the local cap's; the ratio is fleet's over the local
  cap's. The budget is sized so the slice must be topped up during the run (cap /
  20 a slice); the exchanges the fleet boundary made are counted from its ledger,
  with what a call was charged, so the run says how many calls one slice and one
  exchange covered.
- Slices drawn per second (benchmarks/_fleet_rate.py): 1 client, 16 clients on one
  budget (its row lock makes them take turns), 16 clients on 16 budgets, each
  client doing a boundary's exchange (FleetStore.exchange: report the lease's whole
  use, ask for half a slice again; one call in autocommit on the connection the
  store keeps, as a boundary's does) for a fixed window, in rounds that rotate the
  order. The same shapes again with a new connection per exchange (as `docket fleet`
  does, and boundaries did before they kept one): what a connection's setup costs.
  Clients are processes, as boundaries are; 16 threads of one process (a boundary
  runs its exchange in a worker thread) are measured beside them on one budget, on
  both paths, so the choice is checked in every run (KEPT_WHY says what it showed).

`calls_per_slice` turns slices into calls: at the default slice (cap / 20) a slice
covers cap / 20 / (a call's charge) calls, and an exchange in steady state refills
the part of a slice spent below low_water (half of it by default).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import trio

from benchmarks import _fleet_rate as rate
from chaos.fleet.postgres import fresh_database, postgres_bin, running_cluster

CHAT = "/openai/v1/chat/completions"
TOKEN = "docket-bench-run-token"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 16}

SHAPES = {
    "1_client": rate.Shape("1_client", 1, 1),
    "16_clients_one_budget": rate.Shape("16_clients_one_budget", 16, 1),
    "16_clients_16_budgets": rate.Shape("16_clients_16_budgets", 16, 16),
}
CLIENTS_AS, OTHER = "processes", "threads"
COMPARED = "16_clients_one_budget"  # measured with threads too, beside the processes
KEPT_WHY = (
    "processes: 16 boundaries are 16 processes, and with a new connection per exchange "
    "(boundaries' path until they kept one) 16 threads of one process drew fewer exchanges on one budget "
    "in four runs of five on 2026-12-02 (threads over processes x0.67, x0.76, x0.81, "
    "x0.82; x1.27 once): psycopg's connect runs Python in the client, under one GIL. On a "
    "kept connection neither led (x0.70 to x2.97 over six runs), 16 busy interpreters "
    "there also taking CPU from PostgreSQL on the same 2 cores, which boundaries on other "
    "machines would not. Both are in every run (threads_16_clients_one_budget, each path)."
)
# An agent's call, to turn exchanges into calls: its tokens in and out, priced from
# docket's own table, under the docs' example budget (docs/fleet.md: --max-usd 50).
TYPICAL_CALL = {"input_tokens": 2000, "output_tokens": 500}
TYPICAL_MODELS = ("gpt-4o", "gpt-4o-mini")
EXAMPLE_CAP_USD = 50


def run(quick: bool) -> dict:
    bindir = postgres_bin()
    if bindir is None:
        raise SystemExit("bench fleet: PostgreSQL is not installed (no initdb)")
    try:
        import psycopg  # noqa: F401  (the fleet extra)
    except ImportError:
        raise SystemExit(
            "bench fleet: psycopg is not installed (pip install 'docket[fleet]')"
        ) from None
    calls = 200 if quick else 2000
    window_s, rounds = (1.5, 1) if quick else (4.0, 3)
    with running_cluster(bindir) as cluster:
        dsn = fresh_database(cluster)
        with tempfile.TemporaryDirectory(prefix="docket-bench-fleet-") as folder:
            latency = trio.run(_measure, dsn, calls, Path(folder))
        exchanges = _exchanges(dsn, window_s, rounds)
    per_slice = _calls_per_slice(latency.pop("ledger"), exchanges)
    return {
        "latency": latency,
        "exchanges": exchanges,
        "calls_per_slice": per_slice,
        "summary": _summary(latency, exchanges, per_slice),
    }


def _exchanges(dsn: str, window_s: float, rounds: int) -> dict:
    """Every shape on both paths, in `rounds` rounds whose order rotates."""
    plan = [(path, name, CLIENTS_AS) for path in ("per_exchange", "kept") for name in SHAPES]
    plan += [(path, COMPARED, OTHER) for path in ("per_exchange", "kept")]
    got: dict[tuple[str, str, str], list[dict]] = {key: [] for key in plan}
    for r in range(rounds):
        shift = r * len(plan) // max(1, rounds)
        for path, name, mode in plan[shift:] + plan[:shift]:
            got[(path, name, mode)] += rate.measure(
                dsn, SHAPES[name], window_s, mode, kept=path == "kept"
            )
    out: dict = {
        "clients_as": CLIENTS_AS,
        "why": KEPT_WHY,
        "window_s": window_s,
        "rounds": rounds,
        "lease_seconds": rate.LEASE_S,
        "timeout_s": rate.TIMEOUT_S,
    }
    for path in ("per_exchange", "kept"):
        shapes = {}
        for (p, name, mode), results in got.items():
            if p == path:
                key = name if mode == CLIENTS_AS else f"{OTHER}_{name}"
                shapes[key] = rate.summarise(SHAPES[name], window_s * rounds, results)
        shapes["ratios"] = _ratios(shapes)
        out[path] = shapes
    out["per_exchange"]["what"] = (
        "the same fleet_exchange call on a new connection each time (as `docket fleet` does, "
        "and boundaries did before they kept one): a connection's setup and a new backend's "
        "first call besides"
    )
    out["kept"]["what"] = (
        "FleetStore.exchange as a boundary calls it: one fleet_exchange call in autocommit "
        "on the connection its store keeps"
    )
    return out


def _ratios(shapes: dict) -> dict:
    def rate_of(name: str) -> float:
        return shapes[name]["exchanges_per_s"]

    return {
        "16_clients_one_budget_over_16_budgets": _ratio(
            rate_of("16_clients_one_budget"), rate_of("16_clients_16_budgets")
        ),
        "16_clients_one_budget_over_1_client": _ratio(
            rate_of("16_clients_one_budget"), rate_of("1_client")
        ),
        f"{OTHER}_over_{CLIENTS_AS}_one_budget": _ratio(
            rate_of(f"{OTHER}_{COMPARED}"), rate_of(COMPARED)
        ),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _calls_per_slice(ledger: dict, exchanges: dict) -> dict:
    """How many calls a slice, and an exchange, cover: as measured in the latency run,
    and for a typical agent call at the docs' example budget."""
    from docket.fleet.escrow import DEFAULT_SLICES
    from docket.policy import FleetPolicy
    from docket.pricing import default_price_table

    low_water = FleetPolicy().low_water
    refill = 1 - low_water  # what a steady-state exchange tops up, as a share of a slice
    shared_rate = exchanges["kept"][COMPARED]["exchanges_per_s"]  # a boundary's path
    slice_nusd = ledger["cap_nusd"] // DEFAULT_SLICES
    charge = ledger["charged_nusd"] / ledger["calls"]
    measured = {
        "cap_nusd": ledger["cap_nusd"],
        "slice_nusd": slice_nusd,
        "charged_per_call_nusd": round(charge, 1),
        "calls_per_slice": round(slice_nusd / charge, 1),
        "calls": ledger["calls"],
        "exchanges": ledger["exchanges"],
        "calls_per_exchange": round(ledger["calls"] / ledger["exchanges"], 1),
        "calls_per_exchange_expected": round(slice_nusd * refill / charge, 1),
    }
    table = default_price_table()
    typical = {}
    for model in TYPICAL_MODELS:
        price = table.lookup(model)
        assert price is not None, model  # docket's own table prices both
        cost = price.cost_nusd(**TYPICAL_CALL, cached_is_subset=True)
        example_slice = EXAMPLE_CAP_USD * 10**9 // DEFAULT_SLICES
        per_exchange = example_slice * refill / cost
        typical[model] = {
            **TYPICAL_CALL,
            "cost_nusd": cost,
            "cap_usd": EXAMPLE_CAP_USD,
            "slice_nusd": example_slice,
            "calls_per_slice": round(example_slice / cost, 1),
            "calls_per_exchange": round(per_exchange, 1),
            "fleet_calls_per_s_at_16_clients_one_budget": round(shared_rate * per_exchange),
        }
    return {
        "default_slice": f"cap / {DEFAULT_SLICES}",
        "low_water": low_water,
        "formula": (
            f"calls/s across the fleet <= exchanges/s x cap x (1 - low_water) / "
            f"({DEFAULT_SLICES} x a call's charge); renewals add one exchange per "
            "boundary per lease_seconds / 2"
        ),
        "measured_in_latency_run": measured,
        "typical_call": typical,
    }


def _summary(latency: dict, exchanges: dict, per_slice: dict) -> dict:
    p, k = exchanges["per_exchange"], exchanges["kept"]

    def line(shapes: dict, name: str) -> str:
        s = shapes[name]
        lat = s["latency_ms"]
        return (
            f"{s['exchanges_per_s']:.1f}/s ({s['per_client_per_s']['mean']:.1f} per client), "
            f"p50 {lat.get('p50', 0):.3f} ms, p99 {lat.get('p99', 0):.3f} ms"
        )

    added, ratio = latency["added_ms"], latency["ratio"]
    typical = per_slice["typical_call"]["gpt-4o"]
    measured = per_slice["measured_in_latency_run"]
    return {
        "added p50 (fleet - local cap)": f"{added['p50_ms']:+.3f} ms "
        f"({latency['fleet']['p50_ms']:.3f} vs {latency['local_cap']['p50_ms']:.3f}, "
        f"x{ratio['p50']:.3f})",
        "added p99": f"{added['p99_ms']:+.3f} ms "
        f"({latency['fleet']['p99_ms']:.3f} vs {latency['local_cap']['p99_ms']:.3f}, "
        f"x{ratio['p99']:.3f})",
        "exchanges over the latency run": f"{measured['exchanges']} for {measured['calls']} "
        f"calls ({measured['calls_per_exchange']:.1f} calls each)",
        "slices/s, 1 client": line(k, "1_client"),
        "slices/s, 16 clients, one budget": line(k, "16_clients_one_budget"),
        "slices/s, 16 clients, 16 budgets": line(k, "16_clients_16_budgets"),
        f"slices/s, 16 {OTHER}, one budget": line(k, f"{OTHER}_{COMPARED}"),
        "new connection each, 1 client": line(p, "1_client"),
        "new connection each, 16 clients, one budget": line(p, "16_clients_one_budget"),
        "new connection each, 16 clients, 16 budgets": line(p, "16_clients_16_budgets"),
        "one budget / 16 budgets": f"x{k['ratios']['16_clients_one_budget_over_16_budgets']} "
        f"(new connection each x{p['ratios']['16_clients_one_budget_over_16_budgets']})",
        "gpt-4o call (2000 in, 500 out) at a $50 cap": f"{typical['calls_per_slice']:.0f} "
        f"calls a slice, {typical['calls_per_exchange']:.0f} an exchange: "
        f"{typical['fleet_calls_per_s_at_16_clients_one_budget']} calls/s at 16 clients",
    }


async def _measure(dsn: str, calls: int, folder: Path) -> dict:
    from chaos.stub.server import Stub, StubConfig
    from docket.boundary.app import Boundary
    from docket.clock import Clock
    from docket.fleet.amounts import Caps
    from docket.fleet.lease import fleet_lease
    from docket.fleet.store import FleetStore
    from docket.ledger.writer import open_ledger
    from docket.policy import policy_from_dict

    per_call_nusd = 11_400  # above what the stub's answer costs (9,750: 1 token in, 16 out)
    cap_nusd = per_call_nusd * calls * 2  # demand stays under it: nothing is refused
    FleetStore(dsn).set_budget("bench", Caps(nusd=cap_nusd))
    stub = Stub(StubConfig(kind="openai"))
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
    ledger = _ledger_facts(folder / "fleet.jsonl", cap_nusd)
    p = {name: _percentiles(ts) for name, ts in times.items()}
    added = {k: round(p["fleet"][k] - p["local"][k], 3) for k in ("p50_ms", "p99_ms")}
    ratio = {k.removesuffix("_ms"): _ratio(p["fleet"][k], p["local"][k]) for k in added}
    return {
        "calls_each": calls,
        "local_cap": p["local"],
        "fleet": p["fleet"],
        "added_ms": added,
        "ratio": ratio,  # fleet's percentile over the local cap's
        "fleet_lease_events": ledger["lease_events"],
        "ledger": ledger,
    }


def _ledger_facts(path: Path, cap_nusd: int) -> dict:
    """From the fleet boundary's ledger: its calls, what they were charged, its exchanges
    with the budget (fleet.lease drawn or renewed; the give-back at the end is not one)."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    leases = [e for e in events if e["type"] == "fleet.lease"]
    responses = [e for e in events if e["type"] == "model.response"]
    return {
        "cap_nusd": cap_nusd,
        "calls": len(responses),  # the warm-up call too: it drew from the slice
        "charged_nusd": sum(e["cost_nusd"] for e in responses),
        "exchanges": sum(1 for e in leases if e["change"] in ("drawn", "renewed")),
        "lease_events": len(leases),
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
