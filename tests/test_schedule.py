"""The seeded schedule: decisions are a pure function of (seed, fault, ordinal)."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.grammar import parse_fault
from chaos.faults.schedule import FaultSchedule

TEXTS = (
    "upstream:status(503, retry_after=2s)@20%",
    "upstream:latency(2s, jitter=500ms)@call 5.. & 50%",
    "ledger:enospc@seq 40..42",
    "process:sigkill(supervisor)@seq 25",
    "net:reset_peer@5%",
    "clock:step(-30s)@t 2s",
)
ORDINAL_FAULTS = range(5)  # the indexes of TEXTS without a @t condition


def _decisions(schedule: FaultSchedule, pairs) -> dict:
    return {(i, n): schedule.decide(i, n) for i, n in pairs}


def test_same_seed_gives_the_same_decisions_in_any_order_of_asking():
    pairs = [(i, n) for i in ORDINAL_FAULTS for n in range(1, 400)]
    forward = _decisions(FaultSchedule.parse(11, TEXTS), pairs)
    shuffled = pairs[:]
    random.Random(3).shuffle(shuffled)
    fresh = FaultSchedule.parse(11, TEXTS)
    _decisions(fresh, shuffled[:100])  # asking other questions first changes nothing
    assert _decisions(fresh, shuffled) == forward
    assert any(forward.values()) and not all(forward.values())


def test_different_seeds_give_different_schedules():
    one = FaultSchedule.parse(1, TEXTS).resolve(1000)
    two = FaultSchedule.parse(2, TEXTS).resolve(1000)
    assert one != two


def test_a_decision_is_keyed_by_the_faults_text_not_its_place():
    a = FaultSchedule.parse(5, ["net:reset_peer@5%", "upstream:overloaded@20%"])
    b = FaultSchedule.parse(5, ["upstream:overloaded@20%"])
    assert [a.decide(1, n) for n in range(1, 300)] == [b.decide(0, n) for n in range(1, 300)]
    fault = parse_fault("upstream:overloaded@20%")
    assert [a.decide(fault, n) for n in range(1, 300)] == [b.decide(0, n) for n in range(1, 300)]


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_twenty_percent_fires_on_about_a_fifth_of_ten_thousand_ordinals(seed):
    schedule = FaultSchedule.parse(seed, ["upstream:overloaded@20%"])
    fired = sum(schedule.decide(0, n) for n in range(1, 10_001))
    # binomial sd is 0.004 over 10,000; 0.015 is almost four of them
    assert abs(fired / 10_000 - 0.2) < 0.015, fired


def test_zero_and_hundred_percent_are_never_and_always():
    schedule = FaultSchedule.parse(9, ["upstream:overloaded@0%", "upstream:overloaded@100%"])
    assert not any(schedule.decide(0, n) for n in range(1, 2000))
    assert all(schedule.decide(1, n) for n in range(1, 2000))


def test_the_decision_follows_the_documented_construction():
    """spec/fault-grammar.md: BLAKE2b-64 keyed by the seed's 8 big-endian bytes."""
    seed, text = 424242, "upstream:status(503)@call 3.. & 37.5%"
    schedule = FaultSchedule.parse(seed, [text])
    for ordinal in range(3, 200):
        digest = hashlib.blake2b(
            f"decide\0{text}\0{ordinal}".encode(), key=seed.to_bytes(8, "big"), digest_size=8
        ).digest()
        expected = int.from_bytes(digest, "big") / 2**64 < 0.375
        assert schedule.decide(0, ordinal) == expected
    assert not schedule.decide(0, 2)


def test_a_committed_vector_pins_the_schedule_across_versions():
    # Seeds are published in receipts and game-day reports; this list must not change.
    schedule = FaultSchedule.parse(7, ["upstream:status(503, retry_after=2s)@20%"])
    assert [o for o, _ in schedule.resolve(50)] == [4, 12, 14, 25, 26, 32, 47]


def test_ranges_and_combinations():
    schedule = FaultSchedule.parse(3, TEXTS)
    assert [n for n in range(0, 100) if schedule.decide(2, n)] == [40, 41, 42]
    assert [n for n in range(0, 100) if schedule.decide(3, n)] == [25]
    combined = [n for n in range(1, 2000) if schedule.decide(1, n)]
    assert combined and min(combined) >= 5
    assert 0.4 < len(combined) / (2000 - 5) < 0.6


def test_time_conditions_need_the_elapsed_time_and_use_half_open_windows():
    schedule = FaultSchedule.parse(3, ["net:timeout(0)@t 1s..4s", "clock:step(-30s)@t 2s"])
    with pytest.raises(ValueError, match="elapsed_s"):
        schedule.decide(0, 1)
    window = [schedule.decide(0, 1, elapsed_s=s) for s in (0.999, 1.0, 3.999, 4.0)]
    assert window == [False, True, True, False]
    instant = [schedule.decide(1, 1, elapsed_s=s) for s in (1.999, 2.0, 60.0)]
    assert instant == [False, True, True]


def test_draw_is_pure_in_range_and_apart_from_the_decision():
    schedule = FaultSchedule.parse(21, ["upstream:latency(2s, jitter=500ms)@50%"])
    draws = [schedule.draw(0, n) for n in range(1, 5001)]
    assert draws == [
        FaultSchedule.parse(21, [schedule.faults[0].text]).draw(0, n) for n in range(1, 5001)
    ]
    assert all(0.0 <= d < 1.0 for d in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02
    # the jitter drawn for a call says nothing about whether the call was chosen
    chosen = [d for n, d in enumerate(draws, 1) if schedule.decide(0, n)]
    assert abs(sum(chosen) / len(chosen) - 0.5) < 0.03


def test_resolve_is_stable_sorted_and_agrees_with_decide():
    schedule = FaultSchedule.parse(13, TEXTS)
    resolved = schedule.resolve(300)
    assert resolved == FaultSchedule.parse(13, TEXTS).resolve(300)
    texts = {f.text: f for f in schedule.faults}
    brute = set()
    for index in ORDINAL_FAULTS:
        fault = schedule.faults[index]
        first = 1 if fault.counter == "call" else 0
        brute |= {(n, fault.text) for n in range(first, 301) if schedule.decide(index, n)}
    assert set(resolved) == brute and len(resolved) == len(brute)
    keys = [(texts[t].counter, o, TEXTS.index(t)) for o, t in resolved]
    assert keys == sorted(keys)
    assert "clock:step(-30s)@t 2s" not in {t for _, t in resolved}
    assert schedule.timed_faults() == ["clock:step(-30s)@t 2s"]


def test_describe_and_receipt_entry_state_the_seed_and_the_plan():
    schedule = FaultSchedule.parse(13, TEXTS)
    printed = schedule.describe(60)
    assert printed.splitlines()[0] == "fault schedule: seed 13, 6 fault(s)"
    assert "  seq 25: process:sigkill(supervisor)@seq 25" in printed.splitlines()
    assert "timed (not reproducible at the same ordinals): clock:step(-30s)@t 2s" in printed
    entry = schedule.receipt_entry(60)
    assert entry["seed"] == 13 and entry["faults"] == list(TEXTS)
    assert [(r["ordinal"], r["fault"]) for r in entry["resolved"]] == schedule.resolve(60)
    assert {"counter": "seq", "ordinal": 41, "fault": TEXTS[2]} in entry["resolved"]


def test_injection_event_carries_text_seed_and_ordinal():
    schedule = FaultSchedule.parse(99, TEXTS)
    assert schedule.injection_event(2, 41) == {
        "fault": "ledger:enospc@seq 40..42",
        "seed": 99,
        "ordinal": 41,
        "counter": "seq",
        "target": "ledger",
        "kind": "enospc",
    }
    assert schedule.injection_event(schedule.faults[0], 3)["fault"] == TEXTS[0]


@pytest.mark.parametrize("seed", [-1, 2**64, "7", 1.5])
def test_a_seed_outside_eight_bytes_is_refused(seed):
    with pytest.raises(ValueError, match="seed"):
        FaultSchedule.parse(seed, TEXTS)


def test_bad_ordinals_indexes_and_repeated_faults_are_refused():
    schedule = FaultSchedule.parse(1, TEXTS)
    with pytest.raises(ValueError, match="call ordinals are integers from 1"):
        schedule.decide(0, 0)
    with pytest.raises(ValueError, match="seq ordinals"):
        schedule.decide(2, -1)
    with pytest.raises(ValueError, match="no fault 6"):
        schedule.decide(6, 1)
    with pytest.raises(ValueError, match="listed twice"):
        FaultSchedule.parse(1, ["net:down@5%", "net:down(  )@5%"])


@settings(deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    first=st.integers(1, 500),
    span=st.integers(0, 50),
    ordinal=st.integers(1, 700),
)
def test_an_ordinal_range_fires_exactly_inside_it(seed, first, span, ordinal):
    schedule = FaultSchedule.parse(seed, [f"upstream:overloaded@call {first}..{first + span}"])
    assert schedule.decide(0, ordinal) == (first <= ordinal <= first + span)
