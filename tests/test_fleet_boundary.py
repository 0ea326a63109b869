"""A boundary under a fleet budget, over real sockets and a real PostgreSQL: calls
draw from the leased slice, the budget's end refuses in the provider's shape (503,
Retry-After), an unreachable database fails closed, and the lease is given back."""

from __future__ import annotations

import socket

import trio
from conftest import TOKEN

from docket.fleet.amounts import Caps
from docket.fleet.lease import fleet_lease
from docket.fleet.store import FleetStore
from docket.policy import policy_from_dict

DEADLINE = 30
CHAT = "/openai/v1/chat/completions"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 20}


def charged(rig) -> int:
    """What the run's ledger charged, as the receipt's tally counts it: model.response
    and model.error. A forwarded call whose usage is unknown (one cut as the run ends,
    say) is charged its whole reservation on a model.error, and the fleet is told the
    same; summing the responses alone came 24,750 short of the budget's 102,750 once
    (a suite run, 2026-12-03), as such a call would."""
    return sum(
        e["cost_nusd"] for e in rig.events() if e["type"] in ("model.response", "model.error")
    )


def fleet_policy(dsn: str, **fleet) -> dict:
    return {"fleet": {"budget": "b", "dsn": dsn, "lease_seconds": 10, "timeout": 1, **fleet}}


def lease_for(policy: dict):
    resolved = policy_from_dict(policy)
    lease = fleet_lease(resolved, {}, "run-test")
    assert lease is not None
    return lease


async def test_calls_draw_from_the_slice_until_the_budget_is_spent(
    fleet_dsn, stub_server, boundary_rig
):
    store = FleetStore(fleet_dsn)
    # A call here reserves ~21 µUSD (its bytes at the dearest input price, 20 output
    # tokens) and costs ~11: a cap of 100 µUSD in slices of 30 covers a handful.
    store.set_budget("b", Caps(nusd=100_000))
    policy = fleet_policy(fleet_dsn, slice_usd=0.00003)
    lease = lease_for(policy)
    answers = []
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy, fleet=lease) as rig,
            rig.client() as http,
        ):
            for _ in range(30):
                r = await http.post(CHAT, json=BODY)
                answers.append(r)
                if r.status_code != 200:
                    break
    served = [r for r in answers if r.status_code == 200]
    refused = answers[-1]
    assert 3 <= len(served) < 30
    assert refused.status_code == 503 and float(refused.headers["retry-after"]) > 0
    assert refused.json()["error"]["type"] == "docket_fleet_unavailable"
    spent = charged(rig)
    status = store.status("b")
    assert spent <= 100_000 and status["spent"]["nusd"] == spent  # every call reported
    assert status["leased"]["nusd"] == 0 and status["leases"] == []  # given back at the end
    (denied,) = rig.events("policy.denied")
    assert denied["rule"].startswith("fleet.") and "fleet budget 'b'" in denied["reason"]
    changes = [e["change"] for e in rig.events("fleet.lease")]
    assert changes[0] == "drawn" and changes[-1] == "returned"


async def test_an_unreachable_database_fails_closed_with_its_reason(stub_server, boundary_rig):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = fleet_policy(f"host=127.0.0.1 port={port} user=docket dbname=x")
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy, fleet=lease_for(policy)) as rig,
            rig.client() as http,
        ):
            r = await http.post(CHAT, json=BODY)
            assert up.log == []  # never forwarded
    assert r.status_code == 503 and "retry-after" in r.headers
    error = r.json()["error"]
    assert error["type"] == "docket_fleet_unavailable" and error["code"] == "no_lease"
    assert "the database:" in error["message"]
    assert rig.events("fleet.store") and "reason" in rig.events("fleet.store")[0]
    assert TOKEN not in str(rig.events())


async def test_two_budgets_in_one_database_do_not_touch(fleet_dsn, stub_server, boundary_rig):
    store = FleetStore(fleet_dsn)
    store.set_budget("a", Caps(nusd=10**9))
    store.set_budget("b", Caps(nusd=10**9))
    policy = {"fleet": {**fleet_policy(fleet_dsn)["fleet"], "budget": "a"}}
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy, fleet=lease_for(policy)) as rig,
            rig.client() as http,
        ):
            for _ in range(3):
                r = await http.post(CHAT, json=BODY)
                assert r.status_code == 200, r.text
    spent = charged(rig)
    assert store.status("a")["spent"]["nusd"] == spent > 0
    b = store.status("b")
    assert b["spent"]["nusd"] == b["leased"]["nusd"] == 0 and b["leases"] == []


async def test_a_budget_missing_from_the_database_refuses_with_its_name(
    fleet_dsn, stub_server, boundary_rig
):
    policy = fleet_policy(fleet_dsn)  # budget "b", never set
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, policy, fleet=lease_for(policy)) as rig,
            rig.client() as http,
        ):
            r = await http.post(CHAT, json=BODY)
    assert r.status_code == 503 and "no fleet budget 'b'" in r.json()["error"]["message"]
    assert "no fleet budget 'b'" in rig.events("fleet.store")[0]["reason"]
