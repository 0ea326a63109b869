"""The fleet budget's database behind the fault proxy (chaos.toxiproxy, the embedded
Toxiproxy): a black hole, latency past the timeout, connections reset. The slice held
keeps serving, then calls are refused 503 in bounded time (never a hang past the
exchange's timeout), nothing is spent past the cap, and the run recovers once the
database answers again. Then the same faults, latency under the timeout and a restart
of the server against `docket run` boundaries (chaos.fleet): every outage on the
record in the ledgers, every receipt verifies, the database and the receipts agree."""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from functools import partial

import pytest
import toxiproxy
import trio
from test_fleet_boundary import BODY, CHAT, charged, lease_for

from chaos.faults.grammar import parse_fault
from chaos.fleet.judge import between, judge, of_type
from chaos.fleet.runner import run_fleet
from chaos.fleet.scenario import FleetScenario, Window
from chaos.toxiproxy import serve_toxiproxy
from docket.fleet.amounts import Caps
from docket.fleet.store import FleetStore

DEADLINE = 60
TIMEOUT_S = 1.0
# the longest a call may wait on the database: the exchange's timeout, its abandon
# margin (lease.py), and scheduling on this shared machine
CALL_BOUND_S = TIMEOUT_S + 0.5 + 1.5

TOXICS = {
    "black_hole": {"type": "timeout", "attributes": {"timeout": 0}},
    "latency": {"type": "latency", "attributes": {"latency": 3000}},
    "reset": {"type": "reset_peer", "attributes": {"timeout": 0}},
}


async def call(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), abandon_on_cancel=True)


@asynccontextmanager
async def database_behind_proxy(postgres_cluster, fleet_dsn):
    """The test cluster behind the embedded fault proxy: its proxy, and a DSN through it."""
    dbname = fleet_dsn.rsplit("dbname=", 1)[1]
    client = toxiproxy.Toxiproxy()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_toxiproxy, port=0))
        client.update_api_consumer("127.0.0.1", server.listening.port)
        upstream = f"127.0.0.1:{postgres_cluster.port}"
        proxy = await call(client.create, upstream=upstream, name="pg", listen="127.0.0.1:0")
        port = int(proxy.listen.rpartition(":")[2])
        yield proxy, f"host=127.0.0.1 port={port} user=docket dbname={dbname}"
        nursery.cancel_scope.cancel()


async def db_faults(fault, postgres_cluster, fleet_dsn, stub_server, boundary_rig):
    cap = 2_000_000
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=cap))
    timings, answers = [], []
    async with database_behind_proxy(postgres_cluster, fleet_dsn) as (proxy, dsn):
        policy = {
            "fleet": {
                "budget": "b", "dsn": dsn, "timeout": TIMEOUT_S, "lease_seconds": 4,
                "slice_usd": 0.0001,  # ~3 calls' worst case: the slice runs out under the fault
            }
        }  # fmt: skip
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy, fleet=lease_for(policy)) as rig,
            rig.client() as http,
        ):
            assert (await http.post(CHAT, json=BODY)).status_code == 200  # a slice is held
            await call(proxy.add_toxic, name="fault", **TOXICS[fault])
            for _ in range(12):
                start = time.monotonic()
                r = await http.post(CHAT, json=BODY)
                timings.append(time.monotonic() - start)
                answers.append(r)
                if r.status_code == 503:
                    break
            await call(proxy.destroy_toxic, "fault")
            recovered = trio.current_time() + 20
            while (await http.post(CHAT, json=BODY)).status_code != 200:
                assert trio.current_time() < recovered, "never recovered"
                await trio.sleep(0.2)
    served_under_fault = sum(r.status_code == 200 for r in answers)
    refused = answers[-1]
    assert refused.status_code == 503, [r.status_code for r in answers]
    assert refused.json()["error"]["type"] == "docket_fleet_unavailable"
    assert "the database:" in refused.json()["error"]["message"]
    assert max(timings) < CALL_BOUND_S, timings
    spent = charged(rig)
    status = store.status("b")
    assert spent <= cap and status["spent"]["nusd"] + status["lapsed"]["nusd"] >= spent
    assert rig.events("fleet.store")
    return served_under_fault


async def test_a_black_holed_database_fails_closed_in_bounded_time(
    postgres_cluster, fleet_dsn, stub_server, boundary_rig
):
    with trio.fail_after(DEADLINE):
        served = await db_faults(
            "black_hole", postgres_cluster, fleet_dsn, stub_server, boundary_rig
        )
    assert served >= 1  # the slice already leased kept serving


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["latency", "reset"])
async def test_a_slow_or_resetting_database_fails_closed_in_bounded_time(
    fault, postgres_cluster, fleet_dsn, stub_server, boundary_rig
):
    with trio.fail_after(DEADLINE):
        await db_faults(fault, postgres_cluster, fleet_dsn, stub_server, boundary_rig)


# ------------------------------------------------ `docket run` boundaries (chaos.fleet)
#
# The same database faults against real boundaries: `docket run` processes whose
# reference agents spend the budget while the harness (chaos.fleet.runner) strikes the
# database behind the embedded fault proxy, judged from the ledgers, the receipts
# (`docket verify`) and the database (chaos.fleet.judge). A [fleet] timeout of 3 s: an
# exchange is five round trips, so 500 ms of latency makes it 2.5 s, still in time.


def fleet_scenario(*windows: Window, boundaries: int = 1, duration: float = 7.0):
    return FleetScenario(
        boundaries=boundaries, callers=3, cap_usd=0.01, slice_usd=0.0003, lease_seconds=10,
        timeout=3.0, call_deadline=9.0, stub_latency=0.05, duration=duration,
        timeline=windows, source="tests/test_fleet_faults.py",
    )  # fmt: skip


def window(name: str, at: float, length: float, fault: str, expect: str) -> Window:
    return Window(name, at, length, None if fault == "restart" else parse_fault(fault), expect)


async def judged_run(tmp_path, postgres_cluster, scenario, bound_s: float):
    with trio.fail_after(bound_s):
        evidence = await run_fleet(scenario, tmp_path / "run", postgres_cluster)
    verdict = judge(evidence)
    assert all(c.held for c in verdict.checks), verdict.lines()
    # Read back from disk, not from the harness: each receipt against its own ledger.
    spent = 0
    for i in range(scenario.boundaries):
        folder = tmp_path / "run" / f"boundary-{i}"
        receipt = json.loads((folder / "receipt.json").read_text())
        events = [json.loads(x) for x in (folder / "ledger.jsonl").read_text().splitlines()]
        stored = [e for e in events if e["type"] == "fleet.store"]
        assert receipt["fleet"]["store_failures"] == len(stored)
        assert receipt["fleet"]["ended"] == "returned"
        spent += receipt["totals"]["cost_nusd"]
    assert spent <= evidence.status["spent"]["nusd"] <= round(scenario.cap_usd * 10**9)
    return evidence, verdict


async def test_a_database_slow_by_500ms_keeps_serving_in_time(tmp_path, postgres_cluster):
    scenario = fleet_scenario(
        window("slow", 0.5, 3.0, "net:latency(500ms)", "served"), duration=5.0
    )
    evidence, verdict = await judged_run(tmp_path, postgres_cluster, scenario, 40)
    (slow,) = evidence.windows
    events = evidence.boundaries[0].events
    # no exchange failed and no call was refused: the slow database answered in time,
    # and a slice was drawn while it was slow
    assert not [e for e in events if e["type"] in ("fleet.store", "policy.denied")]
    drawn = between(of_type(events, "fleet.lease"), slow.started, slow.ended + 3.0)
    assert drawn and verdict.figures["windows"]["slow"]["served"] > 0


async def test_a_black_hole_that_lifts_is_on_the_record_and_the_run_recovers(
    tmp_path, postgres_cluster
):
    # an exchange the black hole meets fails at most timeout + 0.5 s later: by 5.5 s
    scenario = fleet_scenario(window("hole", 0.5, 1.5, "net:timeout(0)", "outage"), duration=6.0)
    evidence, verdict = await judged_run(tmp_path, postgres_cluster, scenario, 40)
    assert verdict.figures["windows"]["hole"]["store_failures"] >= 1
    (hole,) = evidence.windows
    events = evidence.boundaries[0].events
    served_after = between(of_type(events, "model.response"), hole.ended, hole.ended + 60)
    assert served_after  # recovered: calls served again once the database answered


async def test_a_database_restart_mid_run_is_an_outage_on_the_record(tmp_path, postgres_cluster):
    scenario = fleet_scenario(window("restart", 1.0, 1.0, "restart", "outage"), duration=5.0)
    evidence, verdict = await judged_run(tmp_path, postgres_cluster, scenario, 60)
    assert verdict.figures["windows"]["restart"]["store_failures"] >= 1


@pytest.mark.slow
async def test_a_ten_second_black_hole_outlasting_the_lease(tmp_path, postgres_cluster):
    scenario = fleet_scenario(
        window("hole", 1.0, 10.0, "net:timeout(0)", "outage"), boundaries=2, duration=18.0
    )
    evidence, verdict = await judged_run(tmp_path, postgres_cluster, scenario, 120)
    lost = [
        e
        for b in evidence.boundaries
        for e in of_type(b.events, "fleet.lease")
        if e.get("change") == "lost"
    ]
    assert lost  # the 10 s lease ran out during the 10 s black hole, and was settled after
    print(f"ten-second black hole: {json.dumps(verdict.figures)}")


@pytest.mark.slow
async def test_a_database_restart_under_four_boundaries(tmp_path, postgres_cluster):
    scenario = fleet_scenario(
        window("restart", 2.0, 1.0, "restart", "outage"), boundaries=4, duration=10.0
    )
    _, verdict = await judged_run(tmp_path, postgres_cluster, scenario, 120)
    print(f"restart under four boundaries: {json.dumps(verdict.figures)}")


async def test_a_report_committed_but_unanswered_is_counted_once(
    postgres_cluster, fleet_dsn, stub_server, boundary_rig
):
    """Found by the partition scenario: a connection cut between the server's COMMIT and
    its answer, so the boundary sends the exchange again. A report is the lease's whole
    use (schema.fleet_report), so the repeat adds nothing. Made certain here: 1 s on
    every answer holds the call's answer back, the server's own view (pg_stat_activity,
    read directly) says when it has committed, and the connection is cut in that second."""
    import psycopg

    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=2_000_000))

    def committed_unanswered() -> bool:
        # An exchange is one function call in autocommit: its backend idle after it,
        # within the last 600 ms, has committed while its answer (1 s late) is still
        # on its way back.
        with psycopg.connect(fleet_dsn, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'docket-fleet' "
                "AND state = 'idle' AND query LIKE %s "
                "AND now() - state_change < interval '600 milliseconds'",
                ("SELECT * FROM fleet_exchange(%",),
            ).fetchall()
        return bool(rows)

    with trio.fail_after(DEADLINE):
        async with database_behind_proxy(postgres_cluster, fleet_dsn) as (proxy, dsn):
            policy = {
                "fleet": {"budget": "b", "dsn": dsn, "timeout": 3, "lease_seconds": 10,
                          "slice_usd": 0.0001}
            }  # fmt: skip
            async with (
                stub_server("openai") as up,
                boundary_rig({"openai": up}, policy, fleet=lease_for(policy)) as rig,
                rig.client() as http,
            ):
                assert (await http.post(CHAT, json=BODY)).status_code == 200
                await call(proxy.add_toxic, name="slow", **TOXICS["latency"] | {
                    "attributes": {"latency": 1000}
                })  # fmt: skip
                async with trio.open_nursery() as callers:

                    async def keep_calling() -> None:
                        while True:
                            await http.post(CHAT, json=BODY)
                            await trio.sleep(0.05)

                    callers.start_soon(keep_calling)
                    while not await call(committed_unanswered):
                        await trio.sleep(0.02)
                    # the proxy taken down closes its connections, the one waiting for
                    # its COMMIT's answer among them (a toxic added now would act only
                    # on bytes not yet on their way)
                    await call(proxy.disable)
                    while not rig.events("fleet.store"):
                        await trio.sleep(0.02)
                    await call(proxy.destroy_toxic, "slow")
                    await call(proxy.enable)
                    # the next exchange that succeeds reports again
                    failed_at = rig.events("fleet.store")[0]["seq"]
                    while not [
                        e for e in rig.events("fleet.lease")
                        if e["seq"] > failed_at and e.get("reported_nusd")
                    ]:  # fmt: skip
                        await trio.sleep(0.05)
                    callers.cancel_scope.cancel()
    status = store.status("b")
    assert status["leased"]["nusd"] == 0
    assert status["spent"]["nusd"] == charged(rig)
