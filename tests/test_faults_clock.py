"""The clock fault family: a clock the hook steps or pauses, and the ledger's clamp holding."""

from __future__ import annotations

import trio
from helpers import io_examples, read_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.clock import ChaosClock, effect
from chaos.faults.grammar import parse_fault
from chaos.faults.schedule import FaultSchedule
from chaos.faults.triggers import EventTriggers
from docket.clock import rfc3339
from docket.ledger.writer import open_ledger


class Source:
    """A hand-moved time source for the ChaosClock (real time, as the fault sees it)."""

    def __init__(self, mono: float = 100.0, wall: float = 1_800_000_000.0) -> None:
        self.mono, self.wall = mono, wall

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def chaos_clock() -> tuple[ChaosClock, Source]:
    source = Source()
    return ChaosClock(lambda: source.mono, lambda: source.wall), source


def test_effects():
    assert effect(parse_fault("clock:step(-30s)@seq 3")) == ("step", -30.0)
    assert effect(parse_fault("clock:step(1500ms)")) == ("step", 1.5)
    assert effect(parse_fault("clock:pause(2s)@t 1s")) == ("pause", 2.0)


def test_a_step_moves_both_readings_and_back_is_clamped_for_mono():
    clock, source = chaos_clock()
    assert (clock.mono(), clock.wall()) == (100.0, 1_800_000_000.0)
    clock.apply(parse_fault("clock:step(30s)"))
    assert (clock.mono(), clock.wall()) == (130.0, 1_800_000_030.0)
    clock.apply(parse_fault("clock:step(-60s)"))
    assert clock.wall() == 1_799_999_970.0  # the wall clock does go back
    assert clock.mono() == 130.0  # the monotonic reading does not
    source.tick(40)
    assert clock.mono() == 130.0  # real time is still catching up (100 + 40 - 30 = 110)
    source.tick(25)
    assert clock.mono() == 135.0


def test_a_pause_freezes_the_readings_then_jumps_to_real_time():
    clock, source = chaos_clock()
    clock.apply(parse_fault("clock:pause(2s)"))
    source.tick(1.5)
    assert (clock.mono(), clock.wall()) == (100.0, 1_800_000_000.0)
    source.tick(0.5)
    assert (clock.mono(), clock.wall()) == (102.0, 1_800_000_002.0)


@settings(max_examples=io_examples(), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["step", "pause", "tick"]), st.integers(-120_000, 120_000)),
        max_size=30,
    )
)
def test_mono_never_decreases_whatever_the_faults(moves):
    clock, source = chaos_clock()
    last = clock.mono()
    for kind, ms in moves:
        if kind == "tick":
            source.tick(abs(ms) / 1000)
        elif kind == "step" and ms:
            clock.apply(parse_fault(f"clock:step({ms}ms)"))
        elif kind == "pause" and ms:
            clock.apply(parse_fault(f"clock:pause({abs(ms)}ms)"))
        now = clock.mono()
        assert now >= last
        last = now


def test_triggers_fire_on_seq_and_call_and_skip_their_own_records():
    schedule = FaultSchedule.parse(
        5, ["clock:step(1s)@seq 2", "clock:step(2s)@call 2", "clock:pause(1s)@t 3s"]
    )
    triggers = EventTriggers(schedule, list(schedule.faults), once=False)
    assert [(t, f.text) for t, f in triggers.timers()] == [(3.0, "clock:pause(1s)@t 3s")]
    fired = []
    events = [
        {"seq": 0, "type": "session.start"},
        {"seq": 1, "type": "model.request"},
        {"seq": 2, "type": "fault.injected", "target": "clock"},  # its own record: not asked
        {"seq": 3, "type": "model.request"},
        {"seq": 4, "type": "model.response"},
    ]
    for event in events:
        fired += [(f.text, n) for f, n in triggers.on_event(event, 0.0)]
    assert fired == [("clock:step(2s)@call 2", 2)]
    upstream_record = {"seq": 2, "type": "fault.injected", "target": "upstream"}
    again = EventTriggers(schedule, list(schedule.faults), once=False)
    assert [(f.text, n) for f, n in again.on_event(upstream_record, 0.0)] == [
        ("clock:step(1s)@seq 2", 2)
    ]


async def test_the_ledger_on_disk_shows_the_steps_and_its_clamp(tmp_path):
    clock, source = chaos_clock()
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path, clock=clock) as ledger:
            await ledger.append("model.request", call_id="a")
            source.tick(1)
            clock.apply(parse_fault("clock:step(30s)"))
            await ledger.append("model.request", call_id="b")
            clock.apply(parse_fault("clock:step(-60s)"))
            source.tick(1)
            await ledger.append("model.request", call_id="c")
            source.tick(40)
            await ledger.append("model.request", call_id="d")
    events = read_chain(path)
    monos = [e["mono_ms"] for e in events]
    assert monos == sorted(monos)
    assert monos[1] - monos[0] == 31_000  # the forward step shows
    assert monos[2] == monos[1]  # the step back is clamped: flat, never down
    # The wall clock (ts, for readers) does step back, as the fault says.
    base = 1_800_000_000
    assert [e["ts"] for e in events] == [rfc3339(base + d) for d in (0, 31, -28, 12)]
