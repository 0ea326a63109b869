"""The fleet budget's Done-when, with real processes: `docket run` boundaries, each
hammered by the reference agent's concurrent callers, against one global cap in a
real PostgreSQL. What the receipts say was spent never passes the cap, and when
demand exceeds it at least 90% of it is used; a boundary SIGKILLed mid-run loses
its lease to expiry while the others go on; two budgets in one database do not
touch. The suite runs a short version; `nox -s fleet` runs the long ones (slow)."""

from __future__ import annotations

import signal

import pytest
import trio
from fleet_runs import RunResult, run_argv, run_env, write_policy

from docket.cli import main as cli_main
from docket.fleet.amounts import Caps
from docket.fleet.store import FleetStore
from docket.receipts.verify import verify

NANO = 10**9


async def fleet_of_runs(tmp_path, stub, dsn, *, budget, runs, calls, concurrency, slice_usd):
    policy = write_policy(tmp_path / f"{budget}.toml", stub.url, dsn, budget, slice_usd=slice_usd)
    results: dict[str, RunResult] = {}

    async def one(name: str) -> None:
        folder = tmp_path / name
        argv = run_argv(policy, folder, calls=calls, concurrency=concurrency)
        done = await trio.run_process(argv, env=run_env(), capture_stderr=True, check=False)
        results[name] = RunResult(folder, done.returncode, done.stderr.decode(errors="replace"))

    async with trio.open_nursery() as nursery:
        for i in range(runs):
            nursery.start_soon(one, f"{budget}-{i}")
    return list(results.values())


def judged(results, store, budget, cap_nusd, reported_by_others=0):
    for r in results:
        assert r.returncode == 0, r.stderr
        assert verify(r.folder / "receipt.json").ok
    spent = sum(r.spent_nusd() for r in results)
    status = store.status(budget)
    assert spent <= cap_nusd, f"spent {spent} of a cap of {cap_nusd}"
    # every run reported every charge
    assert status["spent"]["nusd"] == spent + reported_by_others
    assert status["leased"]["nusd"] == 0 and status["leases"] == []  # all given back
    return spent


async def four_boundaries(tmp_path, stub_server, dsn, *, calls, concurrency, cap_usd):
    store = FleetStore(dsn)
    cap = int(cap_usd * NANO)
    store.set_budget("shared", Caps(nusd=cap))
    async with stub_server("openai") as stub:
        results = await fleet_of_runs(
            tmp_path, stub, dsn, budget="shared", runs=4, calls=calls,
            concurrency=concurrency, slice_usd=round(cap_usd / 10, 9),
        )  # fmt: skip
        forwarded = len(stub.log)
    spent = judged(results, store, "shared", cap)
    refused = sum(len(r.events("policy.denied")) for r in results)
    served = sum(len(r.events("model.response")) for r in results)
    assert served == forwarded and refused > 0  # demand exceeded the cap
    assert spent >= 0.9 * cap, f"only {spent / cap:.1%} of the cap used"
    print(f"four boundaries: spent {spent} nusd of {cap} ({spent / cap:.1%}), {refused} refused")
    return spent, cap


async def test_four_boundaries_never_pass_one_cap(tmp_path, stub_server, fleet_dsn):
    # ~11.4 µUSD a call: a cap of $0.0006 is ~52 calls, demand 4 x 24 = 96.
    with trio.fail_after(120):
        await four_boundaries(
            tmp_path, stub_server, fleet_dsn, calls=24, concurrency=3, cap_usd=0.0006
        )


@pytest.mark.slow
async def test_four_boundaries_many_callers_never_pass_one_cap(tmp_path, stub_server, fleet_dsn):
    with trio.fail_after(600):
        await four_boundaries(
            tmp_path, stub_server, fleet_dsn, calls=300, concurrency=8, cap_usd=0.006
        )


@pytest.mark.slow
async def test_a_killed_boundarys_lease_lapses_and_its_ledger_gives_its_slice_back(
    tmp_path, stub_server, fleet_dsn
):
    store = FleetStore(fleet_dsn)
    cap = int(0.004 * NANO)
    store.set_budget("k", Caps(nusd=cap))
    with trio.fail_after(300):
        async with stub_server("openai", latency=0.02) as stub:
            policy = write_policy(
                tmp_path / "k.toml", stub.url, fleet_dsn, "k", slice_usd=0.0004, lease_seconds=3
            )
            victim = await trio.lowlevel.open_process(
                run_argv(policy, tmp_path / "victim", calls=10_000, concurrency=2), env=run_env()
            )
            try:
                while not (tmp_path / "victim" / "ledger.jsonl").exists() or not [
                    lease for lease in store.status("k")["leases"]
                ]:
                    await trio.sleep(0.05)
                await trio.sleep(0.5)  # it is spending
                victim.send_signal(signal.SIGKILL)
            finally:
                await victim.wait()
            (held,) = store.status("k")["leases"]
            while store.status("k")["lapsed"]["nusd"] == 0:  # expiry, server time
                await trio.sleep(0.2)
            # The lease lapsed whole: what the victim had not reported may have been
            # spent, so no one else may spend it.
            lapsed = store.status("k")
            assert lapsed["lapsed"]["nusd"] == held["held"]["nusd"] > 0
            # Its ledger says what it spent (each call open at its death at its worst
            # case): settled from it, the rest of its slice returns to the others.
            assert (
                cli_main(
                    [
                        "fleet",
                        "--dsn",
                        fleet_dsn,
                        "settle",
                        "k",
                        "--ledger",
                        str(tmp_path / "victim"),
                    ]
                )
                == 0
            )
            settled = store.status("k")
            victim = RunResult(tmp_path / "victim", -signal.SIGKILL, "")
            victim_closed = sum(e["cost_nusd"] for e in victim.events("model.response"))
            victim_charged = settled["spent"]["nusd"]
            assert settled["lapsed"]["nusd"] == 0 and settled["leased"]["nusd"] == 0
            assert victim_closed <= victim_charged <= held["used"]["nusd"] + held["held"]["nusd"]
            others = await fleet_of_runs(
                tmp_path, stub, fleet_dsn, budget="k", runs=3, calls=200, concurrency=3,
                slice_usd=0.0004,
            )  # fmt: skip
    others_spent = judged(others, store, "k", cap, reported_by_others=victim_charged)
    assert victim_closed + others_spent <= victim_charged + others_spent <= cap
    left_to_them = cap - victim_charged
    assert others_spent >= 0.9 * left_to_them
    print(
        f"killed boundary: its ledger shows {victim_closed} nusd in closed calls, "
        f"{victim_charged} charged with its calls in flight at their worst case "
        f"({held['used']['nusd']} reported before it died); its lease of "
        f"{held['held']['nusd']} lapsed, then was settled from its ledger; the others spent "
        f"{others_spent} of the {left_to_them} left to them; cap {cap}"
    )


@pytest.mark.slow
async def test_two_budgets_in_one_database_do_not_touch(tmp_path, stub_server, fleet_dsn):
    store = FleetStore(fleet_dsn)
    store.set_budget("a", Caps(nusd=int(0.0006 * NANO)))
    store.set_budget("b", Caps(nusd=int(0.0012 * NANO)))
    with trio.fail_after(300):
        async with stub_server("openai") as stub, trio.open_nursery() as nursery:
            got: dict[str, list[RunResult]] = {}

            async def budget(name: str, cap_usd: float) -> None:
                got[name] = await fleet_of_runs(
                    tmp_path, stub, fleet_dsn, budget=name, runs=2, calls=80, concurrency=3,
                    slice_usd=round(cap_usd / 10, 9),
                )  # fmt: skip

            nursery.start_soon(budget, "a", 0.0006)
            nursery.start_soon(budget, "b", 0.0012)
    for name, cap in (("a", 0.0006), ("b", 0.0012)):
        spent = judged(got[name], store, name, int(cap * NANO))
        assert spent >= 0.9 * cap * NANO
