"""Settling a dead run's lapsed leases from its ledger: what the ledger says it spent
(closed calls as charged, calls open at its death at their worst case), and the
refusals that keep a wrong ledger or a live run from giving a slice back."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket.errors import InputError
from docket.fleet.amounts import Amounts, Caps
from docket.fleet.dead import LedgerFacts, Refuse, Settle, decide, read_facts
from docket.fleet.settle import ledger_spend
from docket.fleet.store import FleetStore
from docket.ledger.writer import open_ledger
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
        store.settle_dead("b", "live", Amounts(nusd=10))
    with pytest.raises(InputError, match="no lapsed lease"):
        store.settle_dead("b", "someone-else", Amounts(nusd=10))
    store.exchange("b", got.grant.lease_id, Amounts(nusd=300), Amounts(), run_id="live",
                   host="h", lease_seconds=0.001)  # fmt: skip
    store.status("b")  # folds the expired lease
    with pytest.raises(InputError, match="accounts for less than run live reported"):
        store.settle_dead("b", "live", Amounts(nusd=299))
    done = store.settle_dead("b", "live", Amounts(nusd=450))
    assert done.more == Amounts(nusd=150) and done.lapsed == Amounts(nusd=700)
    s = store.status("b")
    assert s["spent"]["nusd"] == 450 and s["lapsed"]["nusd"] == 0 and s["leased"]["nusd"] == 0


# ------------------------------------------------------------ a dead run, found by a live one

FACTS_OK = LedgerFacts(
    run_id="dead", budget="b", lines=12, head_at_pin="a" * 64, spent=Amounts(nusd=500)
)


def test_decide_settles_only_a_final_ledger_of_that_run_that_carries_its_pin():
    pin = (10, "a" * 64)
    assert decide("dead", "b", pin, FACTS_OK) == Settle(Amounts(nusd=500))
    refusals = {
        "held by pid 41": replace(FACTS_OK, holder=41),
        "not a docket ledger": replace(FACTS_OK, problem="x: not a docket ledger"),
        "run other's, not dead's": replace(FACTS_OK, run_id="other"),
        "budget c, not b": replace(FACTS_OK, budget="c"),
        "truncated": replace(FACTS_OK, lines=9),
        "rewritten": replace(FACTS_OK, head_at_pin="b" * 64),
    }
    for why, facts in refusals.items():
        got = decide("dead", "b", pin, facts)
        assert isinstance(got, Refuse) and why in got.reason, (why, got)
    assert isinstance(decide("dead", "b", None, FACTS_OK), Refuse)  # no pin: never


@given(
    holder=st.none() | st.integers(1, 9),
    problem=st.none() | st.just("bad"),
    run_id=st.sampled_from(["dead", "other", None]),
    budget=st.sampled_from(["b", "c", None]),
    lines=st.integers(0, 20),
    head=st.sampled_from(["a" * 64, "b" * 64, None]),
    pin=st.none() | st.tuples(st.integers(0, 20), st.sampled_from(["a" * 64, "b" * 64])),
)
def test_decide_settles_exactly_when_every_fact_holds(
    holder, problem, run_id, budget, lines, head, pin
):
    facts = LedgerFacts(holder, problem, run_id, budget, lines, head, Amounts(nusd=7))
    got = decide("dead", "b", pin, facts)
    holds = (
        holder is None
        and problem is None
        and run_id == "dead"
        and budget == "b"
        and pin is not None
        and lines >= pin[0]
        and head == pin[1]
    )
    assert isinstance(got, Settle) == holds


async def write_ledger(path, run_id="dead", budget="b", cost=10650):
    """A run's ledger on disk: session.start under [fleet], then one closed call and
    one open; the pin (count, head) after the closed call."""
    async with open_ledger(path) as ledger:
        await ledger.append(
            "session.start", run_id=run_id,
            fleet={"budget": budget, "database": {"host": None, "port": None, "dbname": None}},
        )  # fmt: skip
        await ledger.append("model.request", **request_fields("a"))
        await ledger.append(
            "model.response", call_id="a", cost_nusd=cost,
            usage={"input_tokens": 7, "output_tokens": 16},
        )  # fmt: skip
        pin = (ledger.count, ledger.head)
        assert read_facts(str(path.parent), pin[0], PRICES, deadline=far()).holder == os.getpid()
        await ledger.append("model.request", **request_fields("b"))
    return pin


def request_fields(call_id):
    return {k: v for k, v in request(call_id).items() if k != "type"}


def far():
    return time.monotonic() + 30


async def test_read_facts_reads_a_final_ledger_and_its_pin(tmp_path):
    path = tmp_path / "dead" / "ledger.jsonl"
    path.parent.mkdir()
    pin = await write_ledger(path)
    facts = read_facts(str(path.parent), pin[0], PRICES, deadline=far())
    worst_b = 100 * MINI.max_input_nusd_per_token + 16 * MINI.output_nusd_per_token
    assert facts.holder is None and facts.problem is None
    assert (facts.run_id, facts.budget, facts.lines) == ("dead", "b", 4)
    assert facts.spent.nusd == 10650 + worst_b and facts.head_at_pin == pin[1]
    assert decide("dead", "b", pin, facts) == Settle(facts.spent)


async def test_a_ledger_rewritten_before_its_pin_is_refused(tmp_path):
    real, forged = tmp_path / "real" / "ledger.jsonl", tmp_path / "forged" / "ledger.jsonl"
    real.parent.mkdir()
    forged.parent.mkdir()
    pin = await write_ledger(real)
    # The same run, its closed call charged less: a chain that holds, rebuilt whole.
    await write_ledger(forged, cost=1)
    os.replace(forged, real)
    facts = read_facts(str(real.parent), pin[0], PRICES, deadline=far())
    got = decide("dead", "b", pin, facts)
    assert isinstance(got, Refuse) and "rewritten" in got.reason
    # Cut back to before the pin: truncated.
    lines = real.read_bytes().splitlines(keepends=True)
    real.write_bytes(b"".join(lines[:2]))
    got = decide("dead", "b", pin, read_facts(str(real.parent), pin[0], PRICES, deadline=far()))
    assert isinstance(got, Refuse) and "truncated" in got.reason


async def test_what_is_not_a_final_ledger_is_refused_with_its_reason(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "ledger.jsonl"
    pin = await write_ledger(path)
    assert (
        "over the 100 read to settle"
        in read_facts(str(folder), pin[0], PRICES, deadline=far(), max_bytes=100).problem
    )
    assert "not an absolute path" in read_facts("run", pin[0], PRICES, deadline=far()).problem
    path.write_bytes(os.urandom(4096))
    assert "not a docket ledger" in read_facts(str(folder), pin[0], PRICES, deadline=far()).problem
    path.unlink()
    os.mkfifo(path)  # a reader that would block forever
    assert "not a regular file" in read_facts(str(folder), pin[0], PRICES, deadline=far()).problem
    other = tmp_path / "nolock"
    other.mkdir()
    (other / "ledger.jsonl").write_bytes(b'{"v":1}\n')
    assert "no lock file" in read_facts(str(other), 0, PRICES, deadline=far()).problem
