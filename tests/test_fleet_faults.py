"""The fleet budget's database behind the fault proxy (chaos.toxiproxy, the embedded
Toxiproxy): a black hole, latency past the timeout, connections reset. The slice held
keeps serving, then calls are refused 503 in bounded time (never a hang past the
exchange's timeout), nothing is spent past the cap, and the run recovers once the
database answers again."""

from __future__ import annotations

import time
from functools import partial

import pytest
import toxiproxy
import trio
from test_fleet_boundary import BODY, CHAT, lease_for

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


async def db_faults(fault, postgres_cluster, fleet_dsn, stub_server, boundary_rig):
    cap = 2_000_000
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=cap))
    dbname = fleet_dsn.rsplit("dbname=", 1)[1]
    client = toxiproxy.Toxiproxy()
    timings, answers = [], []
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_toxiproxy, port=0))
        client.update_api_consumer("127.0.0.1", server.listening.port)
        upstream = f"127.0.0.1:{postgres_cluster.port}"
        proxy = await call(client.create, upstream=upstream, name="pg", listen="127.0.0.1:0")
        port = int(proxy.listen.rpartition(":")[2])
        dsn = f"host=127.0.0.1 port={port} user=docket dbname={dbname}"
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
        nursery.cancel_scope.cancel()
    served_under_fault = sum(r.status_code == 200 for r in answers)
    refused = answers[-1]
    assert refused.status_code == 503, [r.status_code for r in answers]
    assert refused.json()["error"]["type"] == "docket_fleet_unavailable"
    assert "the database:" in refused.json()["error"]["message"]
    assert max(timings) < CALL_BOUND_S, timings
    spent = sum(e["cost_nusd"] for e in rig.events("model.response"))
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
