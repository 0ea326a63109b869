"""Settling a dead run's lapsed leases from its ledger: what the ledger says it spent
(closed calls as charged, calls open at its death at their worst case), and the
refusals that keep a wrong ledger or a live run from giving a slice back."""

from __future__ import annotations

import pytest

from docket.errors import InputError
from docket.fleet.amounts import Amounts, Caps
from docket.fleet.settle import ledger_spend
from docket.fleet.store import FleetStore
from docket.pricing import default_price_table

PRICES = default_price_table()
MINI = PRICES.lookup("gpt-4o-mini")


def request(call_id: str, size: int = 100, out: int | None = 16) -> dict:
    return {"type": "model.request", "call_id": call_id, "model": "gpt-4o-mini",
            "request_bytes": size, "max_output_tokens": out}  # fmt: skip


def test_closed_calls_as_charged_and_open_ones_at_their_worst_case():
    events = [
        {"type": "session.start", "run_id": "run-1"},
        request("a"),
        {
            "type": "model.response",
            "call_id": "a",
            "cost_nusd": 10650,
            "usage": {"input_tokens": 7, "output_tokens": 16},
        },  # fmt: skip
        request("b"),
        {"type": "model.error", "call_id": "b", "cost_nusd": 500, "usage": None},
        request("c", size=200, out=None),  # in flight at the death, no declared max
    ]
    run_id, spent = ledger_spend(events, PRICES)
    worst_c = 200 * MINI.max_input_nusd_per_token + 32768 * MINI.output_nusd_per_token
    assert run_id == "run-1"
    assert spent == Amounts(10650 + 500 + worst_c, 23 + 116 + 200 + 32768, 3)


def test_settle_refuses_a_live_run_a_run_without_lapse_and_a_ledger_that_says_too_little(
    fleet_dsn,
):
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=10**6))
    got = store.exchange("b", None, Amounts(), Amounts(nusd=1000), run_id="live", host="h",
                         lease_seconds=30)  # fmt: skip
    with pytest.raises(InputError, match="still holds an active lease"):
        store.settle_lapsed("b", "live", Amounts(nusd=10))
    with pytest.raises(InputError, match="no lapsed lease"):
        store.settle_lapsed("b", "someone-else", Amounts(nusd=10))
    store.exchange("b", got.grant.lease_id, Amounts(nusd=300), Amounts(), run_id="live",
                   host="h", lease_seconds=0.001)  # fmt: skip
    store.status("b")  # folds the expired lease
    with pytest.raises(InputError, match="accounts for less than run live reported"):
        store.settle_lapsed("b", "live", Amounts(nusd=299))
    done = store.settle_lapsed("b", "live", Amounts(nusd=450))
    assert done["more"] == Amounts(nusd=150) and done["lapsed"] == Amounts(nusd=700)
    s = store.status("b")
    assert s["spent"]["nusd"] == 450 and s["lapsed"]["nusd"] == 0 and s["leased"]["nusd"] == 0
